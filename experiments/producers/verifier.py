"""A generative verifier trained by RL next to the policy (RL Tango, TIPS).

The verifier is a second policy: a copy of the warmed-up policy (same graph, tokenizer and
shardings, its own parameters and optimiser) that reads a policy response and writes its
judgement — one verdict per reasoning step, then a final verdict:

  verifier prompt  = policy prompt ⊕ response ⊕ `c.verifier.suffix` (";{steps}?", the step
                     count filled in, as the code's prompt states it);
  verifier output  = "yyn:n"  (step verdicts y/n, ":", final verdict y/n), then a stop token.

It is rewarded only for agreeing with the outcome, never with step labels (RL Tango, arXiv
2505.15034; TIPS):

  R_v = w_c·1[final == outcome correct] + w_f·format,

with the format score of the code's `verifier_format_reward` carried over to this compact
format: 0 unless the text is `<steps>:<final>`; then 1 − 0.8·[final not y/n] − 0.8·[no step
verdict] − 0.8·[step-verdict count ≠ the response's step count, when the response has the
task's format] − 0.4·[other characters among the step verdicts], clipped to [0, 1]. An
unparseable final verdict earns no correctness reward (the code's all-zero default).

Its verdicts become process rewards for the policy (the code's `extract_verification_result`):
step k of a response with S steps gets ±1/S (y / n) at its last token — `step_reward [B,K]`
with `step_mask [B,K]` — when the verifier wrote exactly S step verdicts, else the row has no
process reward (mask all False). `rl_tango` mixes them with the outcome advantage.

Training (the code's `_train_verifier`): each step the verifier writes `samples` verdicts per
response of the policy's batch; the first is the policy's process reward (the code's single
inference rollout) and all of them train it every `update_every` steps, after the policy's
update: GRPO advantages over each response's verdicts (`advantage="dr_grpo"`: no std,
TIPS), the PPO clipped loss with per-sample class-balance weights
(`credit.advantages.shaping.class_balance_weights`, EMA of the positive / negative outcome
counts, the code's `inverse` default), KL 0. Where the code spends a separate generator
rollout (one response per prompt) on each verifier step and alternates 3 generator steps
with 1 verifier step, this runner trains the verifier on the responses of the current policy
step.

Warm-up. The code starts the verifier from a base model that follows its format prompt; a
small model here cannot, so `sft_steps` supervised steps first teach the format on the
policy's own sampled responses, labelled by `sft_labels`: "outcome" (every verdict = the
outcome; no step label is ever seen, as RL Tango), "judge" (the task's step judge: process
supervision, a supervised-PRM baseline, not RL Tango) or "random" (format only). Then
`solo_steps` verifier-only RL steps (the code's `verifier_warmup_steps=40`). Both run once,
in the first RL step (their time is in that step's `time_verifier`), and are checkpointed.

Metrics (prefix `verifier_`): final_acc and balanced_acc of its inference verdicts against the
outcome, format (mean score), aligned (rows with one verdict per step), step_acc and
wrong_step_recall against the task's step judge where the task has one (how well its step
verdicts — trained on outcomes only — find the wrong steps), step_acc_outcome_copy (the
step_acc of a verifier that copies the outcome onto every step, on the same rows: the
baseline step_acc must beat to show step-level discrimination), and its update's reward,
loss, pos/neg class weights.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

import credit
from credit import parallel
from credit.advantages.outcome.grpo import grpo_advantages
from credit.advantages.shaping.rl_tango import (ClassBalanceState, class_balance_init,
                                                class_balance_weights)
from credit import tasks as tasks_lib
from experiments import train
from experiments.producers.base import (producer, Setup, SetupError, StepContext, examples_rows,
                                        is_multi_turn, step_splitter)
from experiments.producers.signals import judged_steps
from experiments.producers import learners


YES, NO, SEP = "y", "n", ":"
ADVANTAGES = {"grpo": "group", "dr_grpo": "none"}
BALANCE = ("inverse", "sqrt_inverse", "none")
SFT_LABELS = ("outcome", "judge", "random")
NAME = "gen_verifier"


class Verdict(NamedTuple):
  """A parsed verifier output: its step verdicts in order (True = right), its final verdict
  (None when it has none) and its format score in [0, 1]."""
  steps: tuple[bool, ...]
  final: bool | None
  format_score: float


def parse_verdict(text: str, num_steps: int, *, response_format_ok: bool = True) -> Verdict:
  """The verifier's text -> `Verdict` (the module docstring gives the format score's rule).

  >>> parse_verdict("yn:n", 2)
  Verdict(steps=(True, False), final=False, format_score=1.0)
  >>> parse_verdict("y:n", 2).format_score   # one verdict for two steps
  0.19999999999999996
  >>> parse_verdict("yn", 2)                 # no final verdict
  Verdict(steps=(), final=None, format_score=0.0)
  """
  body = text.strip()
  if body.count(SEP) != 1:
    return Verdict((), None, 0.0)
  head, tail = (part.strip() for part in body.split(SEP))
  final = {YES: True, NO: False}.get(tail)
  steps = tuple(ch == YES for ch in head if ch in (YES, NO))
  score = 1.0
  if final is None:
    score -= 0.8
  if not steps:
    score -= 0.8
  elif response_format_ok and len(steps) != num_steps:
    score -= 0.8
  if any(ch not in (YES, NO) for ch in head.replace(" ", "")):
    score -= 0.4
  return Verdict(steps, final, min(1.0, max(0.0, score)))


def verdict_text(steps: Sequence[bool], final: bool) -> str:
  """The well-formed output for these verdicts: `verdict_text([True, False], False) == "yn:n"`."""
  return "".join(YES if s else NO for s in steps) + SEP + (YES if final else NO)


def verifier_reward(verdict: Verdict, correct: bool, *, correctness_weight: float = 1.0,
                    format_weight: float = 0.8) -> float:
  """R_v = w_c·1[final == correct] + w_f·format (no correctness reward without a final)."""
  right = verdict.final is not None and verdict.final == bool(correct)
  return correctness_weight * float(right) + format_weight * verdict.format_score


def process_rewards(verdict: Verdict, num_steps: int) -> tuple[np.ndarray, bool]:
  """(values [S], ok): ±1/S per step when the verifier wrote exactly S > 0 step verdicts."""
  if num_steps <= 0 or len(verdict.steps) != num_steps:
    return np.zeros(max(num_steps, 0), np.float32), False
  signs = np.where(np.asarray(verdict.steps), 1.0, -1.0)
  return (signs / num_steps).astype(np.float32), True


class VerifierState(struct.PyTreeNode):
  """The verifier's trained state: parameters and optimiser (`learner`), the class-count EMAs
  (`balance`), and whether its warm-up (SFT, solo steps) has run (`ready`, bool [])."""
  learner: learners.LearnerState
  balance: ClassBalanceState
  ready: jax.Array


def check_config(c) -> None:
  v = c.verifier
  if v.advantage not in ADVANTAGES:
    raise SetupError(f"verifier.advantage={v.advantage!r}; valid: {sorted(ADVANTAGES)}")
  if v.balance not in BALANCE:
    raise SetupError(f"verifier.balance={v.balance!r}; valid: {list(BALANCE)}")
  if v.sft_labels not in SFT_LABELS:
    raise SetupError(f"verifier.sft_labels={v.sft_labels!r}; valid: {list(SFT_LABELS)}")
  if "{steps}" not in v.suffix:
    raise SetupError(f"verifier.suffix={v.suffix!r} has no {{steps}} field")
  for name in ("samples", "update_every", "epochs", "num_minibatches"):
    if int(v[name]) < 1:
      raise SetupError(f"verifier.{name}={v[name]} must be >= 1")
  if v.samples < 2 and v.advantage == "grpo":
    raise SetupError("verifier.samples must be >= 2: its GRPO group is the verdicts of one "
                     "response")
  B = c.prompts_per_step * c.group_size
  if (B * v.samples) % v.num_minibatches:
    raise SetupError(f"verifier.num_minibatches={v.num_minibatches} must divide its batch "
                     f"({B} responses x {v.samples} samples)")


def verifier_on(c) -> bool:
  return bool(c.verifier.enabled) and not is_multi_turn(c)


# --------------------------------------------------------------------------
# Building blocks (setup time).
# --------------------------------------------------------------------------


@dataclasses.dataclass
class _Parts:
  """What the produce / after functions share, built once per run."""
  s: Any
  trainer: learners._Trainer
  width: int           # verifier prompt columns
  max_new: int         # verifier output tokens (K verdicts, separator, final, stop)
  stop: frozenset
  split: Any           # step_splitter
  suffix_ids: dict     # step count -> token ids of the suffix

  def prompt_rows(self, tokens: np.ndarray, resp: np.ndarray, prompt_mask: np.ndarray,
                  counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Verifier prompts [B, width] and their mask, left-padded: each row's prompt and
    response token ids (the response's stop tokens dropped) and the suffix for its step
    count."""
    out = np.full((len(tokens), self.width), self.s.data.tokenizer.pad_id, np.int32)
    mask = np.zeros((len(tokens), self.width), bool)
    for b in range(len(tokens)):
      ids: list[int] = []
      for t, is_p, is_r in zip(tokens[b], prompt_mask[b], resp[b]):
        if is_p or (is_r and int(t) not in self.stop):
          ids.append(int(t))
      ids += self.suffix_ids[int(counts[b])]
      out[b, self.width - len(ids):] = ids
      mask[b, self.width - len(ids):] = True
    return out, mask

  def step_counts(self, tokens: np.ndarray, resp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(step_id [B,T] capped at K−1, steps per row [B]) of the policy's responses."""
    K = self.s.c.max_steps
    sid = np.minimum(self.split(tokens, resp), K - 1)
    counts = (sid.max(axis=1) + 1).astype(np.int32)  # ids are 0, 1, ... (−1 outside)
    return sid, counts


def _parts(s: "Setup") -> _Parts:
  c, v, tok = s.c, s.c.verifier, s.data.tokenizer
  check_config(c)
  suffix_ids = {n: list(tok.encode(v.suffix.format(steps=n))) for n in range(c.max_steps + 1)}
  longest = max(len(i) for i in suffix_ids.values())
  width = s.data.max_prompt_len + c.max_new_tokens + longest
  max_new = c.max_steps + 3
  stop = frozenset(getattr(tok, "stop_ids", None) or (tok.eos_id,))
  loss = credit.get_policy_loss("ppo_clip")
  loss_fn = train.make_rl_loss(
      s.graphdef, s.rest, loss_spec=loss,
      loss_fields=("logprob", "logprob_old", "advantages", "response_mask", "sample_weight"),
      loss_kwargs={"clip_low": v.clip_range, "clip_high": v.clip_range}, kl_coef=0.0,
      kl_kind="k3", entropy_coef=0.0, chunk_size=s.chunk_size)
  trainer = learners._Trainer(s, v, loss_fn, epochs=v.epochs, num_minibatches=v.num_minibatches)
  return _Parts(s, trainer, width, max_new, stop, step_splitter(s), suffix_ids)


def init(s: "Setup", policy_params) -> VerifierState:
  """A copy of the policy (after its warm-up) with a fresh optimiser; warm-up still to run."""
  rep = parallel.replicated(s.mesh)
  learner = _parts(s).trainer.init(jax.tree.map(jnp.copy, policy_params))
  return VerifierState(learner=learner, balance=jax.device_put(class_balance_init(), rep),
                       ready=jax.device_put(jnp.zeros((), bool), rep))


@functools.partial(jax.jit, static_argnames=("num_groups", "scale", "mode", "balance_on"))
def _advantages_and_weights(reward, correct, response_mask, balance, decay, *, num_groups,
                            scale, mode, balance_on):
  n = reward.shape[0] // num_groups
  gid = jnp.repeat(jnp.arange(num_groups, dtype=jnp.int32), n)
  adv = grpo_advantages(reward=reward, group_id=gid, response_mask=response_mask,
                        num_groups=num_groups, group_size=n, scale=scale)
  if balance_on:
    weight, balance = class_balance_weights(correct, balance, decay=decay, mode=mode)
  else:
    weight = jnp.ones_like(reward)
  return adv, weight, balance


# --------------------------------------------------------------------------
# The producer.
# --------------------------------------------------------------------------


class _Verifier:
  """The `gen_verifier` producer of one run: the build-time constants, and the steps of
  `produce` and `after` as methods (`build` returns the two bound methods)."""

  def __init__(self, s: Setup):
    self.s, self.p = s, _parts(s)
    self.pending = None
    self.c, self.v, self.tok, self.task = s.c, s.c.verifier, s.data.tokenizer, s.data.task
    self.K, self.n = self.c.max_steps, self.v.samples
    self.score = s.scorer(entropy=False, tempered=False)
    self.judge = getattr(self.task, "judge_step", None)
    self.fmt = getattr(self.task, "format_ok", None)

  def decode(self, tokens, resp):
    return [self.tok.decode([int(t) for t in row[m] if int(t) not in self.p.stop])
            for row, m in zip(tokens, resp)]

  def judge_steps(self, example, tokens_row, sid_row):
    """The task's step judge on each step of one response: True right, False wrong."""
    return [right for _, right in judged_steps(self.tok, self.task, example, tokens_row,
                                               sid_row, self.p.stop)]

  def judge_batch(self, vs: VerifierState, roll: dict, key) -> dict:
    """`n` verdicts of the verifier on every response of `roll` (host arrays: tokens,
    response_mask, prompt_mask, examples, correct), parsed and rewarded."""
    s, p, v, n, fmt = self.s, self.p, self.v, self.n, self.fmt
    tokens, resp = roll["tokens"], roll["response_mask"]
    sid, counts = p.step_counts(tokens, resp)
    texts = self.decode(tokens, resp)
    fmt_ok = [bool(fmt(e, t)) if fmt else True for e, t in zip(roll["examples"], texts)]
    prompts, vmask = p.prompt_rows(tokens, resp, roll["prompt_mask"], counts)
    out = s.sampler(s.model_state(vs.learner.params), prompt_tokens=prompts, prompt_mask=vmask,
                    key=key, max_new_tokens=p.max_new, num_samples=n, temperature=v.temperature)
    host = parallel.to_host({"tokens": out.tokens, "response_mask": out.response_mask,
                             "prompt_mask": out.prompt_mask})
    verdicts = [parse_verdict(t, int(counts[i // n]), response_format_ok=fmt_ok[i // n])
                for i, t in enumerate(self.decode(host["tokens"], host["response_mask"]))]
    reward = np.array([verifier_reward(d, bool(roll["correct"][i // n]),
                                       correctness_weight=v.correctness_weight,
                                       format_weight=v.format_weight)
                       for i, d in enumerate(verdicts)], np.float32)
    return dict(host, verdicts=verdicts, reward=reward, sid=sid, counts=counts)

  def update(self, vs: VerifierState, roll: dict, judged: dict, key) -> tuple:
    """One RL update of the verifier on its verdicts `judged`; (state, metrics)."""
    s, p, v, n = self.s, self.p, self.v, self.n
    labels = np.repeat(np.asarray(roll["correct"], bool), n)
    adv, weight, balance = _advantages_and_weights(
        judged["reward"], labels, judged["response_mask"], vs.balance, v.balance_decay,
        num_groups=len(roll["tokens"]), scale=ADVANTAGES[v.advantage],
        mode=v.balance if v.balance != "none" else "inverse", balance_on=v.balance != "none")
    data = parallel.shard_batch({  # row-sharded like the policy's batches (any mesh)
        "tokens": judged["tokens"], "response_mask": judged["response_mask"],
        "attn_mask": judged["prompt_mask"] | judged["response_mask"],
        "advantages": np.asarray(adv), "sample_weight": np.asarray(weight)}, s.mesh)
    old, _ = self.score(vs.learner.params, data["tokens"], data["attn_mask"])
    data["logprob_old"] = old
    learner, m = p.trainer.update(vs.learner, data, key)
    w = np.asarray(weight)
    metrics = {k: float(x) for k, x in jax.device_get(m).items()}
    metrics.update(reward_mean=float(judged["reward"].mean()),
                   format_train=float(np.mean([d.format_score for d in judged["verdicts"]])))
    if labels.any():
      metrics["pos_weight"] = float(w[labels].mean())
    if (~labels).any():
      metrics["neg_weight"] = float(w[~labels].mean())
    return vs.replace(learner=learner, balance=balance), metrics

  def policy_rollout(self, params, key) -> dict:
    """Fresh policy responses in the step's shape (N prompts x G) for the warm-up."""
    s, c, tok = self.s, self.c, self.tok
    idx = np.asarray(jax.random.randint(key, (s.num_groups,), 0, len(s.data.train)))
    rows = [tasks_lib.as_example(s.data.train[int(i)]) for i in idx]
    toks, pm = tasks_lib.encode_prompts(tok, [r["prompt"] for r in rows], s.data.max_prompt_len)
    out = s.sampler(s.model_state(params), prompt_tokens=toks, prompt_mask=pm,
                    key=jax.random.fold_in(key, 1), max_new_tokens=c.max_new_tokens,
                    num_samples=s.group_size, temperature=c.temperature, top_k=c.top_k,
                    top_p=c.top_p)
    roll = parallel.to_host({"tokens": out.tokens, "response_mask": out.response_mask,
                             "prompt_mask": out.prompt_mask})
    examples = [rows[b // s.group_size] for b in range(len(roll["tokens"]))]
    texts = self.decode(roll["tokens"], roll["response_mask"])
    return dict(roll, examples=examples,
                correct=np.array([self.task.verify(e, t) > 0.5 for e, t in zip(examples, texts)]))

  def sft_batch(self, roll: dict, rng: np.random.Generator) -> dict:
    """Verifier prompts ⊕ labelled verdicts (`sft_labels`) for the policy's responses."""
    p, v = self.p, self.v
    tokens, resp = roll["tokens"], roll["response_mask"]
    sid, counts = p.step_counts(tokens, resp)
    targets = []
    for b, (e, y) in enumerate(zip(roll["examples"], roll["correct"])):
      k = int(counts[b])
      if v.sft_labels == "outcome":
        steps, final = [bool(y)] * k, bool(y)
      elif v.sft_labels == "judge":
        steps, final = self.judge_steps(e, tokens[b], sid[b]), bool(y)
      else:
        steps, final = list(rng.random(k) < 0.5), bool(rng.random() < 0.5)
      targets.append(verdict_text(steps, final))
    prompts, vmask = p.prompt_rows(tokens, resp, roll["prompt_mask"], counts)
    return _append(self.tok, prompts, vmask, targets, p.max_new)

  def warm_up(self, vs: VerifierState, policy_params, key) -> tuple[VerifierState, dict]:
    """The format SFT (`sft_steps`) and the verifier-only RL steps (`solo_steps`)."""
    s, c, v = self.s, self.c, self.v
    metrics = {}
    if v.sft_steps:
      if v.sft_labels == "judge" and self.judge is None:
        raise SetupError(f"verifier.sft_labels='judge' needs a task with judge_step; "
                         f"{c.task!r} has none")
      tx = train.make_optimizer(learning_rate=v.sft_learning_rate, total_steps=v.sft_steps,
                                warmup_steps=min(10, v.sft_steps // 10), weight_decay=0.0,
                                grad_clip=v.grad_clip)
      step = jax.jit(train.make_sft_step(s.graphdef, s.rest, tx, s.chunk_size),
                     donate_argnums=(0, 1))
      params = jax.tree.map(jnp.copy, vs.learner.params)
      opt = tx.init(params)
      rng = np.random.default_rng(c.seed + 23)
      for i in range(v.sft_steps):
        batch = self.sft_batch(self.policy_rollout(policy_params, jax.random.fold_in(key, i)),
                               rng)
        params, opt, m = step(params, opt, parallel.shard_batch(batch, s.mesh))
      metrics["sft_loss"] = float(m["sft_loss"])
      vs = vs.replace(learner=self.p.trainer.init(params))
    for i in range(v.solo_steps):
      k = jax.random.fold_in(key, 100_000 + i)
      roll = self.policy_rollout(policy_params, k)
      vs, m = self.update(vs, roll, self.judge_batch(vs, roll, jax.random.fold_in(k, 2)),
                          jax.random.fold_in(k, 3))
      metrics.update({f"solo_{name}": x for name, x in m.items()})
    return vs.replace(ready=jnp.ones((), bool)), metrics

  def produce(self, state, batch, ctx: "StepContext") -> dict:
    s, K, n, judge = self.s, self.K, self.n, self.judge
    vs: VerifierState = ctx.learners[NAME]
    key = jax.random.fold_in(ctx.key, 17)
    if not bool(vs.ready):
      vs, m = self.warm_up(vs, state.params, jax.random.fold_in(key, 1))
      ctx.metrics.update(learners._prefixed("verifier_", m))
    rows = examples_rows(ctx.examples)
    roll = {k: batch["host"][k] for k in ("tokens", "response_mask", "prompt_mask")}
    roll["examples"] = [rows[g] for g in batch["host"]["group_id"]]
    roll["correct"] = np.asarray(parallel.to_host(batch["reward"])) > 0.5
    judged = self.judge_batch(vs, roll, jax.random.fold_in(key, 2))
    # The policy's process reward: each response's first verdict (the code's one inference
    # rollout); all n train the verifier in `after`.
    B, counts, sid = len(roll["tokens"]), judged["counts"], judged["sid"]
    reward, mask = np.zeros((B, K), np.float32), np.zeros((B, K), bool)
    agree, copy, wrong_found, wrong = [], [], 0, 0
    first = judged["verdicts"][::n]
    for b, d in enumerate(first):
      k = int(counts[b])
      values, ok = process_rewards(d, k)
      if not ok:
        continue
      reward[b, :k], mask[b, :k] = values, True
      if judge is not None:
        truth = self.judge_steps(roll["examples"][b], roll["tokens"][b], sid[b])
        agree += [t == said for t, said in zip(truth, d.steps)]
        copy += [t == bool(roll["correct"][b]) for t in truth]
        wrong += sum(not t for t in truth)
        wrong_found += sum(not t and not said for t, said in zip(truth, d.steps))
    y = roll["correct"]
    right = np.array([d.final is not None and d.final == t for d, t in zip(first, y)])
    rates = [right[cls].mean() for cls in (y, ~y) if cls.any()]
    metrics = {"final_acc": right.mean(), "balanced_acc": np.mean(rates),
               "says_correct": np.mean([d.final is True for d in first]),
               "aligned": mask.any(axis=1).mean(),
               "format": np.mean([d.format_score for d in first])}
    if agree:  # and the baseline of a verifier that copies the outcome onto every step
      metrics["step_acc"], metrics["step_acc_outcome_copy"] = np.mean(agree), np.mean(copy)
    if wrong:
      metrics["wrong_step_recall"] = wrong_found / wrong
    ctx.metrics.update({f"verifier_{k}": float(x) for k, x in metrics.items()})
    ctx.learners[NAME] = vs
    self.pending = (int(state.step), roll, judged)  # for `after`, once the update ran
    return parallel.shard_batch({"step_reward": reward, "step_mask": mask}, s.mesh)

  def after(self, batch, targets, ctx: "StepContext") -> None:
    (step, roll, judged), self.pending = self.pending, None
    if step % self.v.update_every:
      return
    vs, m = self.update(ctx.learners[NAME], roll, judged, jax.random.fold_in(ctx.key, 19))
    ctx.learners[NAME] = vs
    ctx.metrics.update(learners._prefixed("verifier_", m))


@producer(NAME,
          provides=("step_reward", "step_mask"),
          requires=("tokens", "response_mask", "reward"),
          phase="verifier",
          doc="a generative verifier trained by RL next to the policy (RL Tango, TIPS): it "
              "reads each response, writes step and final verdicts, is rewarded for agreeing "
              "with the outcome; its step verdicts (±1/S) are the process rewards (c.verifier)",
          when=verifier_on,
          init=init,
          check=check_config,
          off_doc="set enabled=True (single-turn tasks)")
def build(s: Setup, wanted: frozenset):
  """`(produce, after)` of the `gen_verifier` producer (step_reward, step_mask)."""
  run = _Verifier(s)
  return run.produce, run.after


def _append(tok, prompts: np.ndarray, pmask: np.ndarray, targets: list[str], max_new: int
            ) -> dict:
  """Left-padded prompts ⊕ target text ⊕ stop, right-padded to `max_new`: an SFT batch."""
  B, W = prompts.shape
  tokens = np.full((B, W + max_new), tok.pad_id, np.int32)
  resp = np.zeros((B, W + max_new), bool)
  tokens[:, :W] = prompts
  for b, text in enumerate(targets):
    ids = (list(tok.encode(text)) + [tok.eos_id])[:max_new]
    tokens[b, W:W + len(ids)] = ids
    resp[b, W:W + len(ids)] = True
  attn = np.concatenate([pmask, np.zeros((B, max_new), bool)], axis=1) | resp
  return {"tokens": tokens, "attn_mask": attn, "response_mask": resp}
