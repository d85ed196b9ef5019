"""JOLT's two roles of one policy in the runner (`--config.jolt.teacher_samples=G_T`).

JOLT (`credit.advantages.distill.jolt`, inferred from the abstract) trains one model in two
roles:

* the student role (the plain prompt): the loop's own rollout, re-scored by the self-teacher
  pass (`teacher.context`, the privileged text after `teacher.prefix`, before the prompt):
  ℓ_{S|S} = `logprob_old`, ℓ_{T|S} = `logprob_teacher`; estimator `jolt`,
  A^S = ℓ_{T|S} − ℓ_{S|S} (+ ρ·GRPO);
* the teacher role (this module): G_T responses per prompt sampled by the same parameters
  AFTER the privileged prompt, verified by the task, scored in their own context
  (ℓ_{T|T} = `logprob_old`) and re-scored with the privileged text removed (ℓ_{S|T} =
  `logprob_alt`, the student role's view of the same tokens); estimator `jolt_teacher`,
  A^T = GRPO(r^T) − β·(ℓ_{T|T} − ℓ_{S|T}).

Both roles' rows go into one update (`train.make_update` with a second row set, `ROLE`):
L = L_S + w·L_T, each the configured policy loss over its own rows, prompt layout and old
log-probs; one gradient, one optimiser step per minibatch. Cross-role log-probs are batch
constants (stop-gradient).

The teacher role is a producer stage with no contract field (its rows are a second batch,
not columns of the student's): it runs after the student's producers and leaves its update
batch in the step's batch under `EXTRA` and its metrics (`jolt_teacher_*`, `jolt_kl_*`) in
`ctx.metrics`;
`update_batch` puts it into the update batch next to the student's rows (`EXTENSION`'s rows).
The teacher role's rows are laid out with the privileged prompt left-padded to a fixed width W
and the response from column W (`left_align_prompts`; the sampler returns prompt-then-response
rows, right-padded), so that the student-context re-score can cut every row at W.

The paper gives no equations (see the estimators' docstrings); its "two estimator calls, one
combined loss" is built as follows, each a
choice of ours: the roles' losses are summed with weight `jolt.loss_coef` = 1 on the teacher
role; every minibatch holds a slice of both roles (each shuffled on its own, whole groups
kept for group-coupled losses); the teacher role samples with the current parameters (also
under `teacher.lag`, which only lags the student role's target ℓ_{T|S}); G_T defaults to the
student's G in the recipe; a KL-to-reference term (`kl_coef`) applies to both roles, each on
its own layout; the teacher role follows `logprob_old_source` (recomputed or the sampler's).
"""
from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

import credit
from credit import parallel
from credit import tasks as tasks_lib
from experiments import producers, train
from experiments.extensions.base import Built, Extension, Placed, Step

SetupError = producers.SetupError

EXTRA = "jolt_teacher"          # batch key (runner field) of the teacher role's update batch
ROWS = "jolt_teacher_rows"      # batch key of all its fields (device arrays)
HOST = "jolt_teacher_host"      # batch key of its host copies (tokens, masks, texts)
STUDENT_ESTIMATOR = "jolt"
TEACHER_ESTIMATOR = "jolt_teacher"
ROLE = "teacher"                # the teacher role's row set in the update batch
# The fields the teacher role's rows have (besides the update's own logprob / entropy).
TEACHER_ROLE_FIELDS = frozenset({"tokens", "response_mask", "group_id", "prompt_id", "reward",
                                 "logprob_old", "logprob_sampler", "logprob_alt", "logprob_ref",
                                 "advantages", "obs_mask", "turn_id"})
# Sampling key of the teacher role: folded into the step key (the student's rollout folds 0).
_KEY_FOLD = 0x6A01


def on(c: ml_collections.ConfigDict) -> bool:
  """JOLT's teacher role is on (`c.jolt.teacher_samples > 0`)."""
  return int(c.jolt.teacher_samples) > 0


def check(c: ml_collections.ConfigDict) -> None:
  """SetupError, before any file is written, for a JOLT setting the runner cannot run, with
  the reason."""
  j = c.jolt
  if c.estimator == TEACHER_ESTIMATOR:
    raise SetupError(f"estimator {c.estimator!r} is JOLT's teacher role, run by the JOLT step "
                     f"on the teacher role's own rows (estimator {STUDENT_ESTIMATOR!r}, "
                     "jolt.teacher_samples > 0, teacher.context). On ordinary rows its "
                     "logprob_alt is the score under a context the policy never sampled in, "
                     "2-7 nats below logprob_old, so it only pushes tokens down (on pivotal: "
                     "every response the stop token by step 30)")
  if int(j.teacher_samples) < 0:
    raise SetupError(f"jolt.teacher_samples={j.teacher_samples} must be >= 0 (0 = off)")
  if not 0.0 <= float(j.sft_privileged) <= 1.0:
    raise SetupError(f"jolt.sft_privileged={j.sft_privileged} is a fraction in [0, 1]")
  if not on(c):
    if float(j.sft_privileged):
      raise SetupError("jolt.sft_privileged: the privileged warm-up is part of JOLT; set "
                       "jolt.teacher_samples > 0 (and teacher.context)")
    return
  what = f"jolt.teacher_samples={j.teacher_samples}"
  if c.estimator != STUDENT_ESTIMATOR:
    raise SetupError(f"{what}: the student role's rows take estimator {STUDENT_ESTIMATOR!r} "
                     f"(OPD toward the teacher role), not {c.estimator!r}")
  if c.teacher.init_from:
    raise SetupError(f"{what}: JOLT is self-teaching — the teacher role is the policy itself "
                     "under the privileged context, trained with it — so a frozen "
                     f"teacher.init_from model ({c.teacher.init_from!r}) has no place; unset it "
                     "and set teacher.context")
  if not c.teacher.context:
    raise SetupError(f"{what}: set teacher.context (answer | hint | ...): the privileged "
                     "context the teacher role samples after (teacher.prefix) and the student "
                     "role is re-scored under")
  if producers.is_multi_turn(c):
    raise SetupError(f"{what}: single-turn tasks only — the teacher role samples one response "
                     "after the privileged prompt; privileged multi-turn episodes (the context "
                     "in every turn's prompt, observations re-scored without it) are not built")
  if producers.rollout_kind(c) in ("tree", "slate"):
    raise SetupError(f"{what}: tree and step-level sampling (tree.branches, slate.candidates) "
                     "are not built for the teacher role, whose rows are G_T contiguous samples "
                     "per prompt; set them to 0")
  if c.async_rollouts:
    raise SetupError(f"{what}: the teacher role is sampled in the trainer's step with the "
                     "current parameters, which asynchronous rollout workers do not do; set "
                     "async_rollouts=False")
  if c.amft.enabled:
    raise SetupError(f"{what}: AMFT's update (an SFT/RL balance of one batch) would replace the "
                     "two roles' combined update; disable amft")
  if c.get("critical") is not None and c.critical.enabled:
    raise SetupError(f"{what}: critical (CSO / InT) adds its own objective to the one-role "
                     "update; the two-role update does not carry it; use one of them")
  if c.obs_ce_coef:
    raise SetupError(f"{what}: obs_ce_coef needs observation tokens, which single-turn rows do "
                     "not have")
  if float(j.loss_coef) < 0:
    raise SetupError(f"jolt.loss_coef={j.loss_coef} must be >= 0")
  loss = credit.get_policy_loss(c.policy_loss)
  need = (set(loss.needs) - train.UPDATE_FIELDS) | ({"logprob_sampler"}
                                                    if c.importance_correction else set())
  if "logprob_topk" in loss.needs:
    need.add("teacher_topk_ids")
  missing = sorted(need - TEACHER_ROLE_FIELDS)
  if missing:
    raise SetupError(f"{what}: policy loss {c.policy_loss!r} needs {missing} on every row, which "
                     f"the teacher role's rows do not have (they have "
                     f"{sorted(TEACHER_ROLE_FIELDS)})")
  try:
    credit.get_estimator(TEACHER_ESTIMATOR).split_arguments(
        dict(j.estimator_kwargs), num_groups=c.prompts_per_step,
        group_size=int(j.teacher_samples))
  except ValueError as e:
    raise SetupError(f"jolt.estimator_kwargs: {e}") from None


def sft_prompter(c: ml_collections.ConfigDict, data) -> Any:
  """`privileged(examples, demos) -> (prompts, demos, width)` of JOLT's privileged warm-up,
  else None.

  With `c.jolt.sft_privileged` = q > 0 (and the teacher role on), each supervised
  demonstration is shown after the privileged prompt (`producers.privileged_prompt`) with
  probability q, and then answers correctly (`task.demonstration(example, None)`: a
  demonstrator who reads the context), so that the model learns to read it, as a pretrained
  LLM reads a hint; the other rows keep the plain prompt and the task's demonstrator. Every
  row is laid at the privileged prompts' width W. The draws use their own generator (seeded
  by `c.seed`): the examples and plain demonstrations are the plain warm-up's.
  """
  q = float(c.jolt.sft_privileged)
  if not on(c) or q <= 0:
    return None
  tok, task, kind = data.tokenizer, data.task, c.teacher.context
  width = producers.prompt_width(
      tok, (producers.privileged_prompt(c, task, e, kind) for e in data.train),
      f"a prompt with its teacher context {c.teacher.prefix!r}")
  rng = np.random.default_rng([c.seed, _KEY_FOLD])

  def privileged(examples: list[dict], demos: list[str]) -> tuple[list[str], list[str], int]:
    pick = rng.random(len(examples)) < q
    prompts = [producers.privileged_prompt(c, task, e, kind) if p else e["prompt"]
               for e, p in zip(examples, pick)]
    demos = [task.demonstration(e, None) if p else d for e, d, p in zip(examples, demos, pick)]
    return prompts, demos, width

  return privileged


def check_rows(c: ml_collections.ConfigDict, *, data: Any = None, batch_divisor: int) -> None:
  """The teacher role's N·G_T rows split into the update's minibatches on the mesh."""
  del data
  if not on(c):
    return
  rows = c.prompts_per_step * int(c.jolt.teacher_samples)
  if rows % (c.num_minibatches * batch_divisor):
    raise SetupError(f"the teacher role's prompts_per_step*jolt.teacher_samples={rows} rows "
                     f"must be divisible by num_minibatches ({c.num_minibatches}) x the mesh's "
                     f"batch-parallel size ({batch_divisor})")


def student_context_layout(plain_tokens, plain_mask, tokens, attn_mask, width: int):
  """(tokens [B,P+T−W], attn [B,P+T−W]): the teacher role's responses (columns [W, T) of its
  rows, after the privileged prompt of width W) laid after the plain prompts [B,P] instead,
  as the student role sees them."""
  return (jnp.concatenate([plain_tokens, tokens[:, width:]], axis=1),
          jnp.concatenate([plain_mask, attn_mask[:, width:]], axis=1))


def left_align_prompts(host: Mapping[str, np.ndarray], width: int) -> dict[str, np.ndarray]:
  """The sampler's rows (prompt at [0, L_b), response after it, right-padded) shifted right by
  W − L_b, so that every prompt ends at column W (left padding) and every response starts
  there: the layout `student_context_layout` cuts at a fixed column. Positions are
  cumsum(mask) − 1, so the scores of a row do not change. Every [B,T] array of `host` is
  shifted alike; what wraps round from the end is padding (responses hold at most T − W
  tokens).

  >>> h = left_align_prompts({"prompt_mask": np.array([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], bool),
  ...                         "tokens": np.array([[5, 6, 7, 0, 0], [5, 6, 8, 9, 0]])}, 3)
  >>> h["tokens"].tolist(), h["prompt_mask"].astype(int).tolist()
  ([[0, 5, 6, 7, 0], [5, 6, 8, 9, 0]], [[0, 1, 1, 0, 0], [1, 1, 1, 0, 0]])
  """
  L_B = host["prompt_mask"].sum(1)
  T = host["prompt_mask"].shape[1]
  idx_BT = (np.arange(T)[None, :] - (width - L_B)[:, None]) % T
  return {k: np.take_along_axis(v, idx_BT, axis=1) for k, v in host.items()}


def _role_stats(adv_BT, kl_BT, mask_BT) -> dict:
  """Mean advantage, mean |advantage| and mean per-token log-ratio over the role's tokens."""
  n = jnp.maximum(jnp.sum(mask_BT), 1)
  m = mask_BT.astype(jnp.float32)
  return {"adv_mean": jnp.sum(adv_BT * m) / n, "adv_abs_mean": jnp.sum(jnp.abs(adv_BT) * m) / n,
          "kl": jnp.sum(kl_BT * m) / n}


def build_stage(s: producers.Setup, update_fields: tuple[str, ...]) -> producers.Stage:
  """The teacher role's stage (setup time: prompt width, jitted passes).

  Per step: G_T samples per prompt after `producers.privileged_prompt` (the self-teacher
  pass's prompt) by the current parameters, the task's verifier, ℓ_{T|T} (recomputed, or the
  sampler's with `logprob_old_source=sampler`), ℓ_{S|T} on `student_context_layout`, the
  frozen reference's log-probs when the update has a KL term, `jolt_teacher` advantages. It
  returns no contract field; see the module docstring for where its outputs go.
  """
  c, tok, task, mesh = s.c, s.data.tokenizer, s.data.task, s.mesh
  N, G_T, P = s.num_groups, int(c.jolt.teacher_samples), s.data.max_prompt_len
  kind = c.teacher.context
  width = producers.prompt_width(
      tok, (producers.privileged_prompt(c, task, e, kind) for e in s.data.train),
      f"a prompt with its teacher context {c.teacher.prefix!r}")
  est = credit.get_estimator(TEACHER_ESTIMATOR)
  est_fields, est_static = est.split_arguments(dict(c.jolt.estimator_kwargs), num_groups=N,
                                               group_size=G_T)
  adv_fn = jax.jit(train.make_advantage_fn(est, est_static))
  score = s.scorer(entropy=False)
  group_id = np.repeat(np.arange(N, dtype=np.int32), G_T)
  wanted = tuple(f for f in update_fields if f not in ("tokens", "advantages"))
  recompute = c.logprob_old_source != "sampler"

  @jax.jit
  def own_context(params, tokens, attn, response_mask):
    logprob, _ = score(params, tokens, attn)
    return jnp.where(response_mask, logprob, 0.0)

  @jax.jit
  def student_context(params, plain_tokens, plain_mask, tokens, attn, response_mask):
    seq, seq_attn = student_context_layout(plain_tokens, plain_mask, tokens, attn, width)
    logprob, _ = score(params, seq, seq_attn)
    return jnp.where(response_mask, jnp.pad(logprob[:, P:], ((0, 0), (width, 0))), 0.0)

  stats = jax.jit(_role_stats)

  def produce(state, batch, ctx: producers.StepContext) -> dict:
    examples = producers.examples_rows(ctx.examples)
    prompts = [producers.privileged_prompt(c, task, e, kind) for e in examples]
    toks, pmask = tasks_lib.encode_prompts(tok, prompts, width)
    out = s.sampler(s.model_state(state.params), prompt_tokens=toks, prompt_mask=pmask,
                    key=jax.random.fold_in(ctx.key, _KEY_FOLD), max_new_tokens=c.max_new_tokens,
                    num_samples=G_T, temperature=c.temperature, top_k=c.top_k, top_p=c.top_p)
    host = left_align_prompts(parallel.to_host({
        "tokens": out.tokens, "response_mask": out.response_mask, "prompt_mask": out.prompt_mask,
        "logprob_sampler": out.logprob_sampler, "logprob_raw": out.logprob_raw}), width)
    resp = host["response_mask"]
    texts, reward = producers.verify_rows(
        s, ctx.examples, host["tokens"], resp, group_id)
    teacher_host = dict(host, texts=texts, reward=np.asarray(reward), group_id=group_id)
    attn = parallel.shard_batch(host["prompt_mask"] | resp, mesh)
    rows = parallel.shard_batch({
        "tokens": host["tokens"], "response_mask": resp, "group_id": group_id,
        "prompt_id": np.repeat(np.asarray(ctx.examples["index"], np.int32), G_T),
        "reward": np.asarray(reward, np.float32), "obs_mask": np.zeros_like(resp),
        "turn_id": np.where(resp, 0, -1).astype(np.int32),
        "logprob_sampler": host["logprob_sampler"],
        "logprob_raw": np.where(resp, host["logprob_raw"], 0.0).astype(np.float32)}, mesh)
    raw = rows.pop("logprob_raw")
    rows["logprob_old"] = (own_context(state.params, rows["tokens"], attn, rows["response_mask"])
                           if recompute else raw)
    plain_toks, plain_mask = parallel.shard_batch(
        (np.repeat(ctx.prompt_tokens, G_T, axis=0), np.repeat(ctx.prompt_mask, G_T, axis=0)),
        mesh)
    rows["logprob_alt"] = student_context(state.params, plain_toks, plain_mask, rows["tokens"],
                                          attn, rows["response_mask"])
    if "logprob_ref" in wanted:  # the update's KL term, on the teacher role's own layout
      rows["logprob_ref"], _ = score(ctx.ref_params, rows["tokens"], attn)
    adv, _, _ = adv_fn({f: rows[f] for f in est_fields}, None)
    rows["advantages"] = adv
    teacher_batch = dict({f: rows[f] for f in update_fields}, attn_mask=attn)
    t = stats(adv, rows["logprob_old"] - rows["logprob_alt"], rows["response_mask"])
    # The student role's gap ℓ_{S|S} − ℓ_{T|S} on its own samples (k1 of KL(π_S ‖ π_T)).
    k1 = stats(jnp.zeros_like(batch["logprob_old"]),
               batch["logprob_old"] - batch["logprob_teacher"], batch["response_mask"])["kl"]
    r = np.asarray(reward, np.float64)
    ctx.metrics.update({
        "jolt_teacher_reward_mean": float(r.mean()),
        "jolt_teacher_accuracy": float(np.mean(r >= 1.0)),
        "jolt_teacher_response_length": float(resp.sum(-1).mean()),
        "jolt_teacher_adv_mean": float(t["adv_mean"]),
        "jolt_teacher_adv_abs_mean": float(t["adv_abs_mean"]),
        # k1 of KL(π_T ‖ π_S) on the teacher role's samples: what β penalises.
        "jolt_kl_teacher_student": float(t["kl"]),
        "jolt_kl_student_teacher": float(k1)})
    return {HOST: teacher_host, ROWS: rows, EXTRA: teacher_batch}

  return producers.Stage("jolt_teacher_role", "jolt_teacher", frozenset(), produce)


def update_batch(parts: dict, step: Step, *, num_groups: int) -> dict:
  """`parts` (the update batch, the student role's rows under `train.MAIN`) with the teacher
  role's under `ROLE`, after the student role's advantage metrics (`jolt_student_adv_*`) are
  added to `ctx.metrics`; with `step.validate` the teacher role's rows are checked against
  `credit.CONTRACT` first."""
  batch, ctx = step.batch, step.ctx
  teacher = batch[EXTRA]
  if step.validate:
    host = parallel.to_host({k: v for k, v in teacher.items() if k in credit.CONTRACT})
    credit.validate_fields(host, num_groups=num_groups, where="JOLT teacher-role batch")
  m = _role_stats(batch["advantages"], jnp.zeros_like(batch["advantages"]),
                  batch["response_mask"])
  ctx.metrics.update(jolt_student_adv_mean=float(m["adv_mean"]),
                     jolt_student_adv_abs_mean=float(m["adv_abs_mean"]))
  return dict(parts, **{ROLE: teacher})


def row_sets(c: ml_collections.ConfigDict) -> tuple[train.RowSet, ...]:
  """The teacher role's rows: weight `c.jolt.loss_coef`, metrics prefixed `jolt_teacher_`,
  loss `loss_teacher`, groups of G_T (for whole-group losses)."""
  if not on(c):
    return ()
  return (train.RowSet(ROLE, weight=float(c.jolt.loss_coef),
                       group_size=int(c.jolt.teacher_samples), metric_prefix="jolt_teacher_",
                       loss_metric="loss_teacher"),)


def build(s: producers.Setup, method: Any) -> Built:
  """The teacher role's stage after the student's producers; its rows join the update."""
  n = s.c.prompts_per_step
  return Built(stages=(Placed(build_stage(s, method.update_fields)),),
               rows=lambda parts, step: update_batch(parts, step, num_groups=n))


EXTENSION = Extension(
    name="jolt", on=on, check=check, check_run=check_rows, row_sets=row_sets,
    main_role="student", build=build, sft_prompts=sft_prompter,
    doc="JOLT's teacher role: G_T samples per prompt after the privileged context, trained "
        "with the student role's rows in one update (L = L_S + w·L_T)")
