"""Trained field producers: models the run trains next to the policy.

A producer row with an `init` (experiments/producers/) *learns*: it keeps its own parameters
and optimiser state (a `LearnerState` pytree) in `RunState.learners[name]`, initialised from
the policy after the warm-up, checkpointed with the run and restored exactly on resume. Its
per-step function reads and replaces `ctx.learners[name]`; an `after` hook runs once the
estimator has made the advantages and value targets (a critic regresses on them). What it
learns is reported in the step's metrics under its own prefix (`prm_*`, `critic_*`,
`critic_ref_*`), and its time under its phase (`time_prm`, `time_critic`).

Built in:

* **implicit PRM** (`implicit_prm`, field `logprob_prm`; PRIME, arXiv 2502.01456): a copy
  π_φ of the policy, trained each step on the outcome labels with an implicit-PRM objective
  of `credit.losses.prm` on β·Σ_t log π_φ/π_ref (cross-entropy by default, as PRIME; KTO and
  vanilla KTO as in ImplicitPRM). Its reference π_ref is the run's frozen initial policy
  (`logprob_ref`): PRIME initialises both the PRM and the reference from the SFT policy.
  `c.prm.order = "update_first"` updates the PRM on the batch and then scores it (the
  released code's default `update=before`, "double forward"), "score_first" scores first.
  OPRL's (`implicit_prm_old`): the same learner, its implicit reward against the behaviour
  policy (`logprob_old`, what OPRL reads), trained with trajectory DPO on the (success,
  failure) pairs of each prompt group (`prm_pair_dpo_loss`; `c.prm.objective = "auto"`).
* **critics** (`critic` → `values`, `reference_critic` → `values_ref`): a copy of the
  policy's decoder trunk with a scalar value head (initialised to 0, so V starts at 0),
  trained with PPO's clipped value loss (`credit.losses.value_loss`, c_v =
  `c.critic.clip_range_value`) on the estimator's `returns` (GAE, ReDiPPO); an estimator
  without value targets gets the Monte-Carlo return (the outcome on every response token,
  γ = 1). ReDiPPO's reference-guided critic reads the response after
  `c.critic.ref_context` (the gold answer filled in) ⊕ prompt.

Values follow the contract's alignment: `values[:, t]` is the critic's estimate for the
state *before* response token t (the hidden state of position t−1), as `logprob[:, t]` is
the log-prob of token t given the tokens before it.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

import credit
from credit import losses, ops, parallel
from credit.losses import prm as prm_losses
from credit.scoring import score_tokens
from experiments import train
from experiments.producers.base import (Producer, register, Setup, SetupError, StepContext,
                                        prompt_width, response_starts, to_rollout)
from experiments.producers.rescoring import response_layout



def prm_pair_dpo_loss(*, logprob_prm, logprob_ref, response_mask, reward, group_id,
                      beta=0.05) -> losses.LossOutput:
  """Trajectory DPO of the implicit PRM on every (better, worse) pair of a prompt group:
  rows i, j of one group with reward_i > reward_j (OPRL / iStar's PRM objective; ImplicitPRM
  `DPOLoss`), through `prm_dpo_loss`. The pairs are those of the rows given (the PRM's
  minibatches keep whole groups); a batch whose groups all share one reward has none and
  gives loss 0."""
  r = jnp.asarray(reward, jnp.float32)
  g = jnp.asarray(group_id, jnp.int32)
  B = r.shape[0]
  i, j = jnp.meshgrid(jnp.arange(B), jnp.arange(B), indexing="ij")
  pair = (g[:, None] == g[None, :]) & (r[:, None] > r[None, :])
  return prm_losses.prm_dpo_loss(logprob_prm=logprob_prm, logprob_ref=logprob_ref,
                                 response_mask=response_mask, chosen_index=i.reshape(-1),
                                 rejected_index=j.reshape(-1), pair_mask=pair.reshape(-1),
                                 beta=beta)


PRM_OBJECTIVES = {"ce": prm_losses.prm_ce_loss, "kto": prm_losses.prm_kto_loss,
                  "vanilla_kto": prm_losses.prm_vanilla_kto_loss, "dpo": prm_pair_dpo_loss}
# c.prm.objective = "auto": the objective of the estimator's paper (OPRL trains its PRM with
# trajectory DPO on success/failure pairs); any other estimator: PRIME's cross-entropy.
PRM_AUTO_OBJECTIVE = {"oprl": "dpo"}


def prm_objective(c) -> str:
  """The PRM objective the run trains with (`c.prm.objective`, "auto" resolved)."""
  o = c.prm.objective
  return PRM_AUTO_OBJECTIVE.get(c.estimator, "ce") if o == "auto" else o


def prm_reference(c) -> str:
  """The field the PRM's implicit reward β Σ log π_φ/π_ref is taken against in training: the
  one the estimator reads it against (PRIME: `logprob_ref`, the frozen reference; OPRL:
  `logprob_old`, the behaviour policy), so the trained and the read rewards are the same."""
  try:
    needs = credit.get_estimator(c.estimator).needs
  except (KeyError, ValueError):
    return "logprob_ref"
  return "logprob_ref" if "logprob_ref" in needs or "logprob_old" not in needs else "logprob_old"


PRM_ORDERS = ("update_first", "score_first")


class LearnerState(struct.PyTreeNode):
  """A trained producer's state: its parameters, optimiser state and updates taken."""
  params: Any
  opt_state: Any
  step: jax.Array  # [] int32


def _copy(tree):
  return jax.tree.map(jnp.copy, tree)


class _Trainer:
  """A learner's optimiser, shardings and jitted minibatch SGD (built once per run)."""

  def __init__(self, s: "Setup", cfg, loss_fn: Callable, *, epochs: int, num_minibatches: int,
               group_size: int | None = None):
    self.tx = train.make_optimizer(learning_rate=cfg.learning_rate, total_steps=s.c.steps,
                                   warmup_steps=cfg.warmup_steps, weight_decay=0.0,
                                   grad_clip=cfg.grad_clip)
    self.mesh = s.mesh
    self.loss_fn = loss_fn
    self.sgd = train.make_minibatch_sgd(loss_fn, self.tx, epochs=epochs,
                                        num_minibatches=num_minibatches, group_size=group_size)
    self._step = None

  def init(self, params) -> LearnerState:
    rep = parallel.replicated(self.mesh)
    p_sh, o_sh = train.state_shardings(self.tx, params, jax.eval_shape(self.tx.init, params),
                                       self.mesh)
    params = jax.device_put(params, p_sh)
    return LearnerState(params=params, opt_state=jax.jit(self.tx.init, out_shardings=o_sh)(params),
                        step=jax.device_put(jnp.zeros((), jnp.int32), rep))

  def update(self, learner: LearnerState, batch: Mapping[str, Any], key) -> tuple:
    """(learner, metrics) after the minibatch SGD on `batch`."""
    if self._step is None:
      rep = parallel.replicated(self.mesh)
      p_sh, o_sh = train.state_shardings(self.tx, learner.params, learner.opt_state, self.mesh)
      sh = LearnerState(params=p_sh, opt_state=o_sh, step=rep)

      def step(learner, batch, key):
        params, opt_state, metrics = self.sgd(learner.params, learner.opt_state, batch,
                                              jax.random.fold_in(key, learner.step))
        return learner.replace(params=params, opt_state=opt_state, step=learner.step + 1), metrics

      self._step = jax.jit(step, out_shardings=(sh, rep), donate_argnums=(0,))
    return self._step(learner, dict(batch), key)


def _prefixed(prefix: str, metrics: Mapping[str, Any]) -> dict[str, Any]:
  return {(k if k.startswith(prefix) else prefix + k): v for k, v in metrics.items()}


# --------------------------------------------------------------------------
# Implicit PRM (PRIME).
# --------------------------------------------------------------------------


def check_prm_config(c) -> None:
  if c.prm.objective != "auto" and c.prm.objective not in PRM_OBJECTIVES:
    raise SetupError(f"prm.objective={c.prm.objective!r}; valid: auto, "
                     f"{', '.join(sorted(PRM_OBJECTIVES))}")
  if c.prm.order not in PRM_ORDERS:
    raise SetupError(f"prm.order={c.prm.order!r}; valid: {list(PRM_ORDERS)}")
  B = c.prompts_per_step * c.group_size
  if B % c.prm.num_minibatches:
    raise SetupError(f"prm.num_minibatches={c.prm.num_minibatches} must divide the batch "
                     f"({B} rows)")
  if prm_objective(c) == "dpo" and c.prompts_per_step % c.prm.num_minibatches:
    raise SetupError(f"prm.objective=dpo pairs rows of one prompt group, so its minibatches "
                     f"keep whole groups: prm.num_minibatches={c.prm.num_minibatches} must "
                     f"divide prompts_per_step={c.prompts_per_step}")


def _prm_trainer(s: "Setup") -> _Trainer:
  cfg = s.c.prm
  check_prm_config(s.c)
  pairs = prm_objective(s.c) == "dpo"
  objective = PRM_OBJECTIVES[prm_objective(s.c)]

  def loss_fn(params, mb):
    model = train.merge_model(s.graphdef, params, s.rest)
    logprob, _ = score_tokens(model, mb["tokens"], mb["attn_mask"], chunk_size=s.chunk_size,
                              return_entropy=False)
    extra = {"group_id": mb["group_id"]} if pairs else {}
    out = objective(logprob_prm=logprob, logprob_ref=mb["logprob_ref"],
                    response_mask=mb["response_mask"], reward=mb["reward"], beta=cfg.beta,
                    **extra)
    return out.loss, out.metrics

  return _Trainer(s, cfg, loss_fn, epochs=cfg.epochs, num_minibatches=cfg.num_minibatches,
                  group_size=s.group_size if pairs else None)


def init_prm(s: "Setup", policy_params) -> LearnerState:
  """π_φ starts as a copy of the policy (after its warm-up), with a fresh optimiser."""
  return _prm_trainer(s).init(_copy(policy_params))


def build_prm(s: "Setup", wanted: frozenset):
  trainer = _prm_trainer(s)
  score = s.scorer(entropy=False)
  before = s.c.prm.order == "update_first"
  ref_field, pairs = prm_reference(s.c), prm_objective(s.c) == "dpo"
  # Its learner's name: the producer's (`experiments/producers/`), one per reference.
  name = "implicit_prm" if ref_field == "logprob_ref" else "implicit_prm_old"

  def produce(state, batch, ctx: "StepContext") -> dict:
    learner = ctx.learners[name]
    data = {"tokens": batch["tokens"], "attn_mask": batch["attn_mask"],
            "response_mask": batch["response_mask"], "reward": batch["reward"],
            "logprob_ref": batch[ref_field]}
    if pairs:
      data["group_id"] = batch["group_id"]
    key = jax.random.fold_in(ctx.key, 11)
    # No row left (a group filter dropped every group): no PRM step either, since its
    # optimiser would still move on momentum alone.
    learns = bool(np.asarray(batch["host"]["response_mask"]).any())
    if before and learns:
      learner, metrics = trainer.update(learner, data, key)
    logprob, _ = score(learner.params, batch["tokens"], batch["attn_mask"])
    out = {"logprob_prm": jnp.where(batch["response_mask"], logprob, 0.0)}
    if not before and learns:
      learner, metrics = trainer.update(learner, data, key)
    ctx.learners[name] = learner
    if learns:
      ctx.metrics.update(_prefixed("prm_", metrics))
    return out

  return produce, None  # it learns inside the step (before or after scoring)


# --------------------------------------------------------------------------
# Critics (PPO-GAE, ReDiPPO).
# --------------------------------------------------------------------------


def critic_values(graphdef, rest, params, tokens, attn_mask) -> jax.Array:
  """[B,T] float32 values of a critic (`params = {"trunk": decoder params, "head": {w, b}}`):
  V before token t = w·h_{t−1} + b on the trunk's final hidden state (0 at position 0)."""
  model = train.merge_model(graphdef, params["trunk"], rest)
  hidden = model.hidden_states(tokens, mask_BT=attn_mask).astype(jnp.float32)
  head = params["head"]
  v_BT = hidden @ head["w"] + head["b"]
  return jnp.pad(v_BT[:, :-1], ((0, 0), (1, 0)))


def _critic_trainer(s: "Setup", prefix_width: int | None) -> _Trainer:
  """The critic's trainer; `prefix_width` (the reference critic) re-lays rows after another
  prompt of that width, else the rollout rows are used as they are."""
  cfg = s.c.critic

  def loss_fn(params, mb):
    v = critic_values(s.graphdef, s.rest, params, mb["tokens"], mb["attn_mask"])
    if prefix_width is not None:
      v = to_rollout(v, mb["start"], prefix_width, mb["response_mask"].shape[1], 0.0)
    out = losses.value_loss(values=v, values_old=mb["values_old"], returns=mb["returns"],
                            response_mask=mb["response_mask"],
                            clip_range_value=cfg.clip_range_value)
    return out.loss, out.metrics

  return _Trainer(s, cfg, loss_fn, epochs=cfg.epochs, num_minibatches=cfg.num_minibatches)


def check_critic_config(c) -> None:
  B = c.prompts_per_step * c.group_size
  if B % c.critic.num_minibatches:
    raise SetupError(f"critic.num_minibatches={c.critic.num_minibatches} must divide the batch "
                     f"({B} rows)")


def init_critic(s: "Setup", policy_params) -> LearnerState:
  """The policy's trunk (after its warm-up) with a zero value head, and a fresh optimiser."""
  head = {"w": jnp.zeros((_hidden_size(s, policy_params),), jnp.float32),
          "b": jnp.zeros((), jnp.float32)}
  params = {"trunk": _copy(policy_params), "head": head}
  return _critic_trainer(s, None).init(params)


def _hidden_size(s: "Setup", policy_params) -> int:
  """The width D of the policy's final hidden state (the value head's input)."""
  def hidden(params):
    model = train.merge_model(s.graphdef, params, s.rest)
    return model.hidden_states(jnp.zeros((1, 1), jnp.int32))
  return int(jax.eval_shape(hidden, policy_params).shape[-1])


def _make_critic_producer(name: str, field: str, relay: Callable | None):
  """A critic producer: `relay(s) -> (width, layout)` re-lays the rows after another prompt
  (the reference critic), None scores the rollout rows."""

  def build(s: "Setup", wanted: frozenset):
    width, layout = relay(s) if relay else (None, None)
    trainer = _critic_trainer(s, width)
    @jax.jit
    def values(params, tokens, attn_mask, response_mask, start):
      v = critic_values(s.graphdef, s.rest, params, tokens, attn_mask)
      if width is not None:
        v = to_rollout(v, start, width, response_mask.shape[1], 0.0)
      return jnp.where(response_mask, v, 0.0)

    pending = {}  # this step's rows and values, from produce to after

    def produce(state, batch, ctx: "StepContext") -> dict:
      start = response_starts(batch)
      if layout is None:
        tokens, attn = batch["tokens"], batch["attn_mask"]
      else:
        tokens, attn = layout(ctx, batch, start)
      start = parallel.shard_batch(start, s.mesh)
      v = values(ctx.learners[name].params, tokens, attn, batch["response_mask"], start)
      pending.update(tokens=tokens, attn_mask=attn, values_old=v,
                     response_mask=batch["response_mask"], start=start)
      return {field: v}

    def after(batch, targets, ctx: "StepContext") -> None:
      data = dict(pending)
      pending.clear()
      returns = targets.get("returns")
      if returns is None:  # Monte-Carlo return of the outcome (γ = 1)
        returns = ops.broadcast_to_tokens(batch["reward"], data["response_mask"])
      data["returns"] = returns
      learner, metrics = trainer.update(ctx.learners[name], data,
                                        jax.random.fold_in(ctx.key, 13))
      ctx.learners[name] = learner
      ctx.metrics.update(_prefixed(f"{name}_", metrics))

    return produce, after

  return build


def _reference_layout(s: "Setup"):
  """(width, layout) for the reference-guided critic: `c.critic.ref_context` with the gold
  answer filled in, before each prompt."""
  from credit import tasks as tasks_lib
  template = s.c.critic.ref_context
  if "{answer}" not in template:
    raise SetupError(f"critic.ref_context={template!r} has no {{answer}} field")

  def prompt(example) -> str:
    e = tasks_lib.as_example(example)
    return template.format(answer=e["answer"]) + e["prompt"]

  width = prompt_width(s.data.tokenizer, (prompt(e) for e in s.data.train),
                                  "critic.ref_context before a prompt")
  lay = response_layout(s, width)

  def layout(ctx, batch, start):
    n = len(ctx.examples["prompt"])
    prompts = [prompt({k: ctx.examples[k][i] for k in ctx.examples}) for i in range(n)]
    return lay(prompts, batch, start=start)

  return width, layout


def reference_context_ok(c) -> bool:
  """The reference critic's context is a template the run's tokenizer can encode (checked for
  the character tokenizer here; a checkpoint's tokenizer when the producer is built)."""
  from credit import tasks as tasks_lib
  template = c.critic.get("ref_context")
  if not isinstance(template, str) or "{answer}" not in template:
    return False
  if c.get("init_from"):
    return True
  try:
    tasks_lib.CharTokenizer().encode(template.format(answer="0"))
  except ValueError:
    return False
  return True


# The trained producers' declarations: the two implicit PRMs share one build and differ in the
# reference their reward reads; the two critics differ in the context the rows are read after.
for _name, _reference, _doc in (
    ("implicit_prm", "logprob_ref",
     "PRIME's online implicit PRM: a copy of the policy trained each step on the outcome "
     "labels (c.prm: objective, beta, update before or after scoring), its implicit reward "
     "against the frozen reference"),
    ("implicit_prm_old", "logprob_old",
     "OPRL's online implicit PRM: the same learner, its implicit reward against the behaviour "
     "policy, trained by default with trajectory DPO on the (success, failure) pairs of each "
     "prompt group (c.prm.objective=auto)")):
  register(Producer(
      _name, ("logprob_prm",), ("tokens", "response_mask", "reward", "group_id", _reference),
      build_prm, "prm", _doc, init=init_prm, check=check_prm_config,
      when=lambda c, r=_reference: prm_reference(c) == r, module=__name__,
      off_doc="the estimator reads logprob_prm against another reference: "
              + ("implicit_prm_old" if _reference == "logprob_ref" else "implicit_prm")))
register(Producer(
    "critic", ("values",), ("tokens", "response_mask", "reward"),
    _make_critic_producer("critic", "values", None), "critic",
    "a value head on a copy of the policy's trunk, regressed on the estimator's returns with "
    "the clipped value loss (c.critic)", init=init_critic, check=check_critic_config,
    module=__name__))
register(Producer(
    "critic_ref", ("values_ref",), ("tokens", "response_mask", "reward"),
    _make_critic_producer("critic_ref", "values_ref", _reference_layout), "critic",
    "ReDiPPO's reference-guided critic: the same, reading the response after "
    "c.critic.ref_context (gold answer filled in) ⊕ prompt", init=init_critic,
    check=check_critic_config, when=reference_context_ok, module=__name__,
    off_doc="critic.ref_context must hold {answer} and be encodable by the run's tokenizer"))
