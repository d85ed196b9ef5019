"""Pure step functions of the runner: optimiser, SFT warm-up, advantages, RL update.

Everything here is a function of arrays and pytrees; `experiments/loop.py` owns
the Python loop, files and logging. Each factory resolves configuration in
Python and returns a function the caller jits, so no string is compared inside
a traced body.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

import credit
from credit import ops
from credit.losses import (dpo_pair_logprobs, dpo_pair_loss, entropy_bonus,
                           intervention_sft_loss, kl_loss, observation_ce_loss)
from credit.scoring import (candidate_scores_hidden, model_hidden, score_hidden, score_tokens,
                            sum_pi_squared_hidden)

# Fields the RL update computes itself, from its own (differentiated) model pass; a loss
# that names them gets them from there, not from the batch.
UPDATE_FIELDS = frozenset({"logprob", "entropy", "logprob_topk"})
# Arguments of the policy loss's aggregation that the KL and entropy terms share.
AGGREGATION_ARGS = ("loss_agg_mode", "num_tokens_global", "num_seqs_global", "norm_constant")


class TrainState(struct.PyTreeNode):
  """Everything that changes during training; a pytree the caller can see and checkpoint."""
  step: jax.Array           # [] int32, RL steps completed
  params: Any               # nnx.State of the policy's parameters
  opt_state: Any            # optax state
  key: jax.Array            # raw PRNG key data, uint32[2]
  estimator_state: Any = None  # e.g. DCPO running statistics
  amft: Any = None          # AMFT's controller state (`make_amft_update`), when enabled


def make_optimizer(*, learning_rate: float, total_steps: int, warmup_steps: int,
                   weight_decay: float, grad_clip: float,
                   trainable: Any | None = None) -> optax.GradientTransformation:
  """AdamW with global-norm clipping and linear warm-up + cosine decay to 10%.

  `trainable` is an optional pytree of bools matching the params (LoRA: only
  adapters train); frozen leaves get zero updates and no optimiser moments.
  """
  sched = optax.warmup_cosine_decay_schedule(
      init_value=0.0 if warmup_steps else learning_rate, peak_value=learning_rate,
      warmup_steps=warmup_steps, decay_steps=max(total_steps, warmup_steps + 1),
      end_value=0.1 * learning_rate)
  tx = optax.chain(optax.clip_by_global_norm(grad_clip),
                   optax.adamw(sched, weight_decay=weight_decay))
  if trainable is not None:
    tx = optax.multi_transform({True: tx, False: optax.set_to_zero()},
                               jax.tree.map(bool, trainable))
  return tx


def state_shardings(tx: optax.GradientTransformation, params: Any, opt_state: Any, mesh) -> tuple:
  """(param shardings, optimiser-state shardings): moments follow their params, the rest replicated.

  Used as explicit `out_shardings` so that a step's outputs have exactly the
  shardings of its inputs and the next call hits the compilation cache.
  """
  from jax.sharding import NamedSharding, PartitionSpec as P
  rep = NamedSharding(mesh, P())

  def of(x):
    s = getattr(x, "sharding", None)
    return s if isinstance(s, NamedSharding) and s.mesh == mesh else rep

  # LoRA's optimiser (`optax.multi_transform` over the trainable mask) holds an empty
  # `optax.MaskedNode` in its moments at each frozen leaf: it stays as it is.
  masked = lambda x: isinstance(x, optax.MaskedNode)
  p_sh = jax.tree.map(of, params)
  o_sh = optax.tree_map_params(tx, lambda v, s: v if masked(v) else s, opt_state, p_sh,
                               transform_non_params=lambda _: rep, is_leaf=masked)
  return p_sh, o_sh


def split_model(model: nnx.Module):
  """(graphdef, params, rest) so params can be a jit argument and rest a constant."""
  return nnx.split(model, nnx.Param, ...)


def merge_model(graphdef, params, rest) -> nnx.Module:
  return nnx.merge(graphdef, params, rest)


# --------------------------------------------------------------------------
# Supervised warm-up.
# --------------------------------------------------------------------------


def sft_nll(graphdef, rest, chunk_size: int | None) -> Callable:
  """nll(params, batch) -> mean negative log-likelihood of the demonstration tokens
  (batch: tokens, attn_mask, response_mask; `make_sft_step`'s loss)."""

  def nll(params, batch):
    model = merge_model(graphdef, params, rest)
    logprob, _ = score_tokens(model, batch["tokens"], batch["attn_mask"],
                              chunk_size=chunk_size, return_entropy=False)
    return -ops.masked_mean(logprob, batch["response_mask"])

  return nll


def make_sft_step(graphdef, rest, tx: optax.GradientTransformation,
                  chunk_size: int | None) -> Callable:
  """Returns sft_step(params, opt_state, batch) -> (params, opt_state, metrics).

  batch: tokens [B,T] (prompt + demonstration, right-padded), attn_mask [B,T]
  (valid tokens), response_mask [B,T] (demonstration tokens: the NLL targets).
  """

  loss_fn = sft_nll(graphdef, rest, chunk_size)

  def sft_step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, {"sft_loss": loss, "grad_norm": optax.tree.norm(grads)}

  return sft_step


# --------------------------------------------------------------------------
# Advantages.
# --------------------------------------------------------------------------


def make_advantage_fn(spec: credit.EstimatorSpec, static: Mapping[str, Any]) -> Callable:
  """advantage_fn(arrays, estimator_state) -> (advantages [B,T], estimator_state, targets).

  `arrays` are the estimator's data arguments and `static` its hyperparameters and layout
  arguments (`spec.split_arguments`); the state is threaded only for a stateful estimator.
  `targets` holds the value targets `returns` [B,T] when the estimator's output has them
  (GAE, ReDiPPO: what a trained critic regresses on), and the targets of the estimator's
  own loss term (`spec.trained_loss.targets`, e.g. VIMPO's `value_target` [B]).
  """

  own = spec.trained_loss.targets if spec.trained_loss is not None else ()

  def advantage_fn(arrays, estimator_state):
    state_kw = {"state": estimator_state} if spec.stateful else {}
    out = spec.fn(**arrays, **state_kw, **static)
    targets = {"returns": out.returns} if hasattr(out, "returns") else {}
    targets.update({f: getattr(out, f) for f in own})  # its own loss term's per-row targets
    return (spec.advantages(out), (out.state if spec.stateful else estimator_state), targets)

  return advantage_fn


# --------------------------------------------------------------------------
# RL update: PPO epochs over minibatches, one jitted function.
# --------------------------------------------------------------------------


def aggregation_kwargs(loss_spec: credit.PolicyLossSpec,
                       loss_kwargs: Mapping[str, Any]) -> dict[str, Any]:
  """The policy loss's aggregation arguments (its default mode unless `loss_kwargs` sets one),
  so that the KL and entropy terms are reduced like the policy loss."""
  default = inspect.signature(loss_spec.fn).parameters.get("loss_agg_mode")
  agg = {"loss_agg_mode": default.default if default is not None else "token-mean"}
  agg.update({k: v for k, v in loss_kwargs.items() if k in AGGREGATION_ARGS})
  return agg


@dataclasses.dataclass(frozen=True)
class EstimatorLoss:
  """An estimator's own term in the RL objective (`credit.TrainedLoss` resolved for a run):
  coef · fn(**<the update's own scores>, **{f: minibatch[f] for f in inputs}, **kwargs),
  the scores being `logprob` (the sampled tokens) and / or `logprob_answer` (the reference
  answer, teacher-forced again on the minibatch's `answer_tokens`)."""
  fn: Callable
  inputs: tuple[str, ...]      # batch fields: contract fields and the estimator's targets
  kwargs: Mapping[str, Any]    # its hyperparameters
  coef: float
  scores: tuple[str, ...] = ("logprob",)
  score_inputs: tuple[str, ...] = ()  # batch fields the scores are computed from

  @property
  def batch_fields(self) -> tuple[str, ...]:
    """Every batch field the term reads."""
    return tuple(self.inputs) + tuple(self.score_inputs)


def answer_scores(model, mb: Mapping[str, jax.Array], chunk_size: int | None) -> jax.Array:
  """[B,A] log-probs of the reference answer's tokens under `model`: one pass over the
  minibatch's `answer_tokens` (prompt ⊕ response ⊕ answer), read at `answer_positions`."""
  logprob, _ = score_tokens(model, mb["answer_tokens"], mb["answer_attn_mask"],
                            chunk_size=chunk_size, return_entropy=False)
  return jnp.take_along_axis(logprob, mb["answer_positions"], axis=1)


def make_rl_loss(graphdef, rest, *, loss_spec: credit.PolicyLossSpec,
                 loss_fields: tuple[str, ...], loss_kwargs: Mapping[str, Any], kl_coef: float,
                 kl_kind: str, entropy_coef: float, chunk_size: int | None,
                 obs_ce_coef: float = 0.0, obs_ce_mode: str = "seq-mean",
                 estimator_loss: EstimatorLoss | None = None) -> Callable:
  """Returns loss_fn(params, minibatch) -> (loss, metrics) of the RL update.

  The loss is `loss_spec.fn` called with exactly the contract fields `loss_fields` (those
  in `UPDATE_FIELDS` from this function's own model pass, entropy without gradient; the
  rest from the minibatch), plus `kl_coef`·`credit.losses.kl_loss` against `logprob_ref`
  and `credit.losses.entropy_bonus` with coefficient `entropy_coef`, both aggregated like
  the policy loss (`aggregation_kwargs`), plus ECHO's `obs_ce_coef`·cross-entropy on the
  observation tokens (`credit.losses.observation_ce_loss` over `obs_mask`, reduced by
  `obs_ce_mode`; the same model pass scores every attended position), plus the estimator's
  own term `estimator_loss` (VIMPO's value loss; VeriFree's and JEPO's answer likelihood,
  for which a second pass scores the answer), on the minibatch's rows with this pass's
  log-probs, metric `estimator_loss`.
  """
  agg = aggregation_kwargs(loss_spec, loss_kwargs)
  need_entropy = bool(entropy_coef) or "entropy" in loss_fields
  need_topk = "logprob_topk" in loss_fields

  def loss_fn(params, mb):
    model = merge_model(graphdef, params, rest)
    if need_topk:  # the sampled token and the teacher's top-k ids in one chunked pass
      hidden, unembed, mask = model_hidden(model, mb["tokens"], mb["attn_mask"])
      (logprob, entropy), logprob_topk = candidate_scores_hidden(
          hidden, unembed, mb["tokens"], mask, mb["teacher_topk_ids"], chunk_size=chunk_size,
          return_entropy=need_entropy)
    else:
      logprob, entropy = score_tokens(model, mb["tokens"], mb["attn_mask"],
                                      chunk_size=chunk_size, return_entropy=need_entropy)
      logprob_topk = None
    own = {"logprob": logprob, "entropy": jax.lax.stop_gradient(entropy),
           "logprob_topk": logprob_topk}
    version = {"train_version": mb["train_version"]} if "train_version" in mb else {}
    out = loss_spec.fn(**{f: own[f] if f in UPDATE_FIELDS else mb[f] for f in loss_fields},
                       **version, **loss_kwargs)
    loss, metrics = out.loss, dict(out.metrics, pg_loss=out.loss)
    if kl_coef:
      kl = kl_loss(logprob=logprob, logprob_ref=mb["logprob_ref"],
                   response_mask=mb["response_mask"], kind=kl_kind, **agg)
      loss = loss + kl_coef * kl.loss
      metrics.update(kl.metrics, kl_loss=kl.loss)
    if need_entropy:
      bonus = entropy_bonus(entropy=entropy, response_mask=mb["response_mask"],
                            coef=entropy_coef, **agg)
      loss = loss + bonus.loss
      metrics.update(bonus.metrics)
    if obs_ce_coef:
      ce = observation_ce_loss(logprob=logprob, obs_mask=mb["obs_mask"], coef=obs_ce_coef,
                               mode=obs_ce_mode)
      loss = loss + ce.loss
      metrics.update(ce.metrics)
    if estimator_loss is not None:
      scores = {"logprob": logprob}
      if "logprob_answer" in estimator_loss.scores:
        scores["logprob_answer"] = answer_scores(model, mb, chunk_size)
      term = estimator_loss.fn(**{s: scores[s] for s in estimator_loss.scores},
                               **{f: mb[f] for f in estimator_loss.inputs},
                               **estimator_loss.kwargs)
      loss = loss + estimator_loss.coef * term
      metrics["estimator_loss"] = term
    return loss, metrics

  return loss_fn


def make_rl_update(graphdef, rest, tx: optax.GradientTransformation, *,
                   loss_spec: credit.PolicyLossSpec, loss_fields: tuple[str, ...],
                   loss_kwargs: Mapping[str, Any], kl_coef: float, kl_kind: str,
                   entropy_coef: float, ppo_epochs: int, num_minibatches: int,
                   chunk_size: int | None, obs_ce_coef: float = 0.0,
                   obs_ce_mode: str = "seq-mean", group_size: int | None = None,
                   aux: Callable | None = None,
                   estimator_loss: EstimatorLoss | None = None) -> Callable:
  """Returns update(state, batch) -> (state, metrics), the loss being `make_rl_loss`.

  batch holds [B,...] arrays: tokens, attn_mask, the batch fields of `loss_fields` (all but
  `UPDATE_FIELDS`), and logprob_ref when `kl_coef`. Each epoch shuffles rows with a key
  folded from the state key and step, and takes `num_minibatches` optimiser steps.

  A policy loss registered with `whole_groups` (per-group statistics, e.g. `a2tgpo`) gets
  group-aligned minibatches: `group_size` G says the batch is contiguous groups of G rows
  (N prompts x G samples) and each epoch shuffles whole groups (`epoch_permutation`).
  Without `group_size` such a loss is refused (ValueError, here, before tracing) unless
  `num_minibatches` is 1 (the one minibatch is the whole batch). Other losses ignore
  `group_size`: their rows are shuffled one by one.

  `aux` (e.g. `make_critical_loss`): a second objective on a batch of its own, passed as
  `batch[AUX_KEY]` (a dict with scalar `rl_weight` and `weight`); every minibatch step then
  descends rl_weight·L_RL(minibatch) + weight·aux(params, that batch), the aux batch whole.
  """
  if loss_spec.whole_groups and num_minibatches > 1 and group_size is None:
    raise ValueError(
        f"policy loss {loss_spec.name!r} needs whole prompt groups in every minibatch (its "
        f"statistics are per group) but num_minibatches={num_minibatches} and no group_size "
        "was given: pass group_size (rows of one group contiguous) or use num_minibatches=1")
  loss_fn = make_rl_loss(graphdef, rest, loss_spec=loss_spec, loss_fields=loss_fields,
                         loss_kwargs=loss_kwargs, kl_coef=kl_coef, kl_kind=kl_kind,
                         entropy_coef=entropy_coef, chunk_size=chunk_size,
                         obs_ce_coef=obs_ce_coef, obs_ce_mode=obs_ce_mode,
                         estimator_loss=estimator_loss)
  if aux is not None:
    rl_loss = loss_fn

    def loss_fn(params, mb, extra):  # pylint: disable=function-redefined
      loss, metrics = rl_loss(params, mb)
      a_loss, a_metrics = aux(params, extra)
      return extra["rl_weight"] * loss + extra["weight"] * a_loss, dict(metrics, **a_metrics)

  sgd = make_minibatch_sgd(loss_fn, tx, epochs=ppo_epochs, num_minibatches=num_minibatches,
                           group_size=group_size if loss_spec.whole_groups else None)

  def update(state: TrainState, batch: Mapping[str, jax.Array]):
    key = jax.random.fold_in(jax.random.wrap_key_data(state.key), state.step)
    if "policy_version" in batch:  # the staleness bound's reference: the version trained
      batch = dict(batch, train_version=jnp.full_like(batch["policy_version"], state.step))
    extra = None
    if aux is not None:
      batch = dict(batch)
      extra = batch.pop(AUX_KEY)
    params, opt_state, metrics = sgd(state.params, state.opt_state, batch, key, extra)
    return state.replace(params=params, opt_state=opt_state, step=state.step + 1), metrics

  return update


AUX_KEY = "critical_batch"  # the update input of a second objective (experiments/critical.py)


def make_critical_loss(graphdef, rest, *, objective: str, beta: float,
                       chunk_size: int | None) -> Callable:
  """aux(params, batch) -> (loss, metrics): the objective of `experiments/critical.py`'s batch.

  "dpo" (CSO): rows [0, M) chosen and [M, 2M) rejected steps after one shared context each;
  `credit.losses.dpo_pair_logprobs` over `step_mask` against the batch's `logprob_ref`, then
  `dpo_pair_loss` with β (pairs whose rows select no step token take no part). "sft" (InT):
  `credit.losses.intervention_sft_loss` over `loss_mask`.
  """
  def aux(params, batch):
    model = merge_model(graphdef, params, rest)
    logprob, _ = score_tokens(model, batch["tokens"], batch["attn_mask"], chunk_size=chunk_size,
                              return_entropy=False)
    if objective == "dpo":
      M = batch["tokens"].shape[0] // 2
      pairs = dpo_pair_logprobs(logprob=logprob, logprob_ref=batch["logprob_ref"],
                                token_mask=batch["step_mask"], chosen_row=jnp.arange(M),
                                rejected_row=M + jnp.arange(M))
      out = dpo_pair_loss(logprob_chosen=pairs.chosen, logprob_ref_chosen=pairs.ref_chosen,
                          logprob_rejected=pairs.rejected,
                          logprob_ref_rejected=pairs.ref_rejected, pair_mask=pairs.valid,
                          beta=beta)
    else:
      out = intervention_sft_loss(logprob=logprob, loss_mask=batch["loss_mask"])
    return out.loss, dict({f"critical_{k}": v for k, v in out.metrics.items()},
                          critical_loss=out.loss)

  return aux


class AmftState(struct.PyTreeNode):
  """AMFT's controller: the logit φ of μ = σ(φ), and the entropy target (NaN until the first
  RL step measures the policy's mean token entropy after the warm-up, as the authors' code)."""
  phi: jax.Array             # [] float32
  target_entropy: jax.Array  # [] float32


def make_amft_update(graphdef, rest, tx: optax.GradientTransformation, *,
                     rl_loss_fn: Callable, chunk_size: int | None, lr: float,
                     meta_lr: float, entropy_coef: float, val_at: str) -> Callable:
  """Returns update(state, batch, sft_batch, val_batch) -> (state, metrics): one AMFT step.

  `credit.losses.amft_step` on the whole rollout batch: the RL loss (`rl_loss_fn`, the
  configured estimator's advantages in the configured policy loss), the SFT loss on a batch
  of task demonstrations and a validation loss (the same NLL on correct demonstrations of
  held-apart train examples), at the look-ahead θ' = θ − η∇L(θ, μ) with η = `lr`; the
  controller's φ descends ∂L_val(θ')/∂φ plus `entropy_coef`·(H − H_target), H the policy's
  mean token entropy on the rollout batch (no gradient); the optimiser then applies
  (1 − μ)∇L_RL + μ∇L_SFT with the updated μ. One optimiser step per RL step (AMFT's
  single-stage update; ppo_epochs = num_minibatches = 1).
  """
  from credit.losses.amft import amft_step  # pylint: disable=g-import-not-at-top
  nll = sft_nll(graphdef, rest, chunk_size)

  def update(state: TrainState, batch, sft_batch, val_batch):
    model = merge_model(graphdef, state.params, rest)
    _, ent = score_tokens(model, batch["tokens"], batch["attn_mask"], chunk_size=chunk_size)
    h = jax.lax.stop_gradient(ops.masked_mean(ent, batch["response_mask"]))
    ctl = state.amft
    target = jnp.where(jnp.isnan(ctl.target_entropy), h, ctl.target_entropy)
    out = amft_step(lambda p: rl_loss_fn(p, batch)[0], lambda p: nll(p, sft_batch),
                    lambda p: nll(p, val_batch), state.params, ctl.phi, lr=lr,
                    meta_lr=meta_lr, entropy=h, target_entropy=target,
                    entropy_coef=entropy_coef, val_at=val_at)
    updates, opt_state = tx.update(out.grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {f"amft_{k}": v for k, v in out.metrics.items()}
    metrics.update(amft_mu=out.mu, loss=out.loss, grad_norm=optax.tree.norm(out.grads),
                   entropy=h)
    return state.replace(params=params, opt_state=opt_state, step=state.step + 1,
                         amft=AmftState(out.phi, target)), metrics

  return update


def epoch_permutation(key: jax.Array, num_rows: int, *, num_minibatches: int,
                      group_size: int | None = None) -> jax.Array:
  """[num_rows] int32: the row order of one shuffled epoch; minibatch m is its m-th slice of
  num_rows / num_minibatches rows.

  Default (`group_size=None`): the rows are shuffled individually,
  `jax.random.permutation(key, num_rows)`. With `group_size` G the batch is read as
  contiguous groups of G rows (row b in group b // G, the runner's layout of N prompts x G
  samples); the groups are shuffled and each keeps its rows together and in order, so every
  minibatch holds N / num_minibatches whole groups. Every row appears exactly once.

  Raises ValueError (from shapes alone, before anything runs) when the rows do not split
  into minibatches, or, with `group_size`, into groups of G or into minibatches of whole
  groups.
  """
  if num_minibatches < 1 or num_rows % num_minibatches:
    raise ValueError(f"num_minibatches={num_minibatches} must divide the batch's {num_rows} rows")
  if group_size is None:
    return jax.random.permutation(key, num_rows)
  num_groups = num_rows // group_size
  if num_rows % group_size or num_groups % num_minibatches:
    what = f"{num_groups} groups" if num_rows % group_size == 0 else "not a whole number"
    raise ValueError(f"group-aligned minibatches: num_minibatches={num_minibatches} must divide "
                     f"the number of groups ({num_rows} rows / group_size {group_size}: "
                     f"{what}) so that every minibatch holds whole groups")
  groups = jax.random.permutation(key, num_groups)
  return (groups[:, None] * group_size + jnp.arange(group_size)[None, :]).reshape(num_rows)


def make_minibatch_sgd(loss_fn: Callable, tx: optax.GradientTransformation, *, epochs: int,
                       num_minibatches: int, group_size: int | None = None) -> Callable:
  """Returns sgd(params, opt_state, batch, key) -> (params, opt_state, metrics).

  `epochs` passes over `batch` ([B,...] arrays); each pass shuffles the rows with a key
  folded from `key` and the epoch (`epoch_permutation`), and takes `num_minibatches`
  optimiser steps of `loss_fn(params, minibatch) -> (loss, metrics)`. Metrics (with `loss`
  and `grad_norm`) are averaged over all steps. Shared by the policy update and the trained
  field producers (critic, implicit PRM).

  `extra` (optional pytree): passed whole, unshuffled, as the third argument of every
  `loss_fn(params, minibatch, extra)` call (a second objective's own batch).

  `group_size` (static, default None: rows shuffled one by one): the batch holds contiguous
  groups of this many rows and each pass shuffles whole groups, so every minibatch holds
  whole groups (for losses with per-group statistics, `PolicyLossSpec.whole_groups`). A
  batch whose groups do not split evenly into `num_minibatches` raises ValueError when
  `sgd` is traced.
  """
  if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int)
                                 or group_size < 1):
    raise ValueError(f"group_size={group_size!r} must be a positive int or None")

  def sgd(params, opt_state, batch, key, extra=None):
    def shuffle(epoch_key):
      return _minibatches(batch, epoch_key, num_minibatches, group_size)

    return _epochs_of_minibatches(loss_fn, tx, params, opt_state, key, epochs, shuffle, extra)

  return sgd


def _minibatches(batch, key: jax.Array, num_minibatches: int, group_size: int | None):
  """`batch` ([B,...] arrays) shuffled by `epoch_permutation` and stacked into
  [num_minibatches, B / num_minibatches, ...]."""
  B = jax.tree.leaves(batch)[0].shape[0]
  perm = epoch_permutation(key, B, num_minibatches=num_minibatches, group_size=group_size)
  return jax.tree.map(
      lambda x: x[perm].reshape((num_minibatches, B // num_minibatches) + x.shape[1:]),
      dict(batch))


def _epochs_of_minibatches(loss_fn: Callable, tx: optax.GradientTransformation, params,
                           opt_state, key: jax.Array, epochs: int, shuffle: Callable,
                           extra=None):
  """The SGD loop both minibatch updates share: `epochs` scans over `shuffle(fold_in(key, e))`
  (stacked minibatches), one optimiser step of `loss_fn(params, mb[, extra])` each; metrics
  (with `loss` and `grad_norm`) averaged over all steps."""
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def epoch(carry, e):
    def step(carry, mb):
      p, o = carry
      (loss, metrics), g = grad_fn(p, mb) if extra is None else grad_fn(p, mb, extra)
      u, o = tx.update(g, o, p)
      return (optax.apply_updates(p, u), o), dict(metrics, loss=loss,
                                                   grad_norm=optax.tree.norm(g))

    return jax.lax.scan(step, carry, shuffle(jax.random.fold_in(key, e)))

  (params, opt_state), metrics = jax.lax.scan(epoch, (params, opt_state), jnp.arange(epochs))
  return params, opt_state, jax.tree.map(jnp.mean, metrics)


def make_scorer(graphdef, rest, chunk_size: int | None, *,
                sum_pi_squared: bool = False, entropy: bool = True) -> Callable:
  """score(params, tokens, attn_mask) -> (logprob [B,T], entropy [B,T]) without gradients; with
  `sum_pi_squared`, (logprob, entropy, Σπ² [B,T]) from the same model pass; with
  `entropy=False` the entropy is not computed (None in its place)."""

  def score(params, tokens, attn_mask):
    model = merge_model(graphdef, params, rest)
    hidden, unembed, mask = model_hidden(model, tokens, attn_mask)
    out = score_hidden(hidden, unembed, tokens, mask, chunk_size=chunk_size,
                       return_entropy=entropy)
    if not sum_pi_squared:
      return out
    return (*out, sum_pi_squared_hidden(hidden, unembed, mask, chunk_size=chunk_size))

  return score


# --------------------------------------------------------------------------
# Several roles of one policy in one update (JOLT: student and teacher role).
# --------------------------------------------------------------------------


def make_roles_minibatch_sgd(loss_fn: Callable, tx: optax.GradientTransformation, *,
                             epochs: int, num_minibatches: int,
                             group_sizes: Mapping[str, int | None]) -> Callable:
  """`make_minibatch_sgd` over a batch of roles: sgd(params, opt_state, batch, key) with
  batch = {role: [B_role,...] arrays}; the roles may differ in rows and width.

  Each epoch shuffles every role's rows with its own key (`epoch_permutation`, folded from
  the epoch and the role's index in sorted order; `group_sizes[role]` keeps whole groups
  together) and takes `num_minibatches` optimiser steps; step m gets the m-th slice of every
  role, {role: [B_role / num_minibatches, ...]}, so every optimiser step sees every role.
  `loss_fn(params, {role: minibatch}) -> (loss, metrics)`. Metrics, `loss` and `grad_norm`
  are averaged over the steps.
  """
  def sgd(params, opt_state, batch, key):
    roles = sorted(batch)

    def shuffle(epoch_key):  # every optimiser step gets a slice of every role
      return {role: _minibatches(batch[role], jax.random.fold_in(epoch_key, i),
                                 num_minibatches, group_sizes.get(role))
              for i, role in enumerate(roles)}

    return _epochs_of_minibatches(loss_fn, tx, params, opt_state, key, epochs, shuffle)

  return sgd


def make_roles_rl_update(graphdef, rest, tx: optax.GradientTransformation, *,
                         loss_spec: credit.PolicyLossSpec, loss_fields: tuple[str, ...],
                         loss_kwargs: Mapping[str, Any], kl_coef: float, kl_kind: str,
                         entropy_coef: float, ppo_epochs: int, num_minibatches: int,
                         chunk_size: int | None, role_weights: Mapping[str, float],
                         metric_prefixes: Mapping[str, str],
                         group_sizes: Mapping[str, int | None] | None = None) -> Callable:
  """Returns update(state, batch) -> (state, metrics) for a batch of several roles of the
  one policy, batch = {role: that role's update batch} (each as `make_rl_update`'s: tokens,
  attn_mask and the loss's batch fields, in the role's own prompt layout and old log-probs).

  The loss of a minibatch is the weighted sum of the roles' `make_rl_loss` losses, each
  aggregated over its own role's rows:

      L(θ) = Σ_r w_r · L_r(θ; minibatch_r),

  one gradient and one optimiser step for all roles (`make_roles_minibatch_sgd`). Every
  batch field (advantages, old and cross-role log-probs) is a constant of the update, so
  only each role's own re-scored `logprob` carries gradient. Metrics: `loss` (the sum),
  `grad_norm`, `loss_<role>` (its unweighted loss) and each role's loss metrics under
  `metric_prefixes[role]` (e.g. "" for the student role's, whose names stay those of a
  one-role run). `group_sizes[role]`: G of contiguous groups for a `whole_groups` loss.
  """
  if set(role_weights) != set(metric_prefixes):
    raise ValueError(f"roles differ: weights {sorted(role_weights)}, prefixes "
                     f"{sorted(metric_prefixes)}")
  group_sizes = dict(group_sizes or {})
  if loss_spec.whole_groups and num_minibatches > 1 and any(
      group_sizes.get(r) is None for r in role_weights):
    raise ValueError(f"policy loss {loss_spec.name!r} needs whole prompt groups in every "
                     "minibatch: pass group_sizes for every role or use num_minibatches=1")
  role_loss = make_rl_loss(graphdef, rest, loss_spec=loss_spec, loss_fields=loss_fields,
                           loss_kwargs=loss_kwargs, kl_coef=kl_coef, kl_kind=kl_kind,
                           entropy_coef=entropy_coef, chunk_size=chunk_size)
  roles = sorted(role_weights)

  def loss_fn(params, mb):
    total, metrics = 0.0, {}
    for role in roles:
      loss, m = role_loss(params, mb[role])
      total = total + role_weights[role] * loss
      metrics.update({metric_prefixes[role] + k: v for k, v in m.items()})
      metrics[f"loss_{role}"] = loss
    return total, metrics

  sgd = make_roles_minibatch_sgd(
      loss_fn, tx, epochs=ppo_epochs, num_minibatches=num_minibatches,
      group_sizes=group_sizes if loss_spec.whole_groups else {})

  def update(state: TrainState, batch: Mapping[str, Mapping[str, jax.Array]]):
    key = jax.random.fold_in(jax.random.wrap_key_data(state.key), state.step)
    params, opt_state, metrics = sgd(state.params, state.opt_state, batch, key)
    return state.replace(params=params, opt_state=opt_state, step=state.step + 1), metrics

  return update
