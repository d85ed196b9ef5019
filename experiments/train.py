"""Pure step functions of the runner: optimiser, SFT warm-up, advantages, RL update.

Everything here is a function of arrays and pytrees; `experiments/loop.py` owns
the Python loop, files and logging. Each factory resolves configuration in
Python and returns a function the caller jits, so no string is compared inside
a traced body.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

import credit
from credit import ops
from credit.losses import entropy_bonus, kl_loss, observation_ce_loss
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
  controller: Any = None    # a loss-mix controller's state (`Controller`), if any


def make_optimizer(*, learning_rate: float, total_steps: int, warmup_steps: int,
                   weight_decay: float, grad_clip: float,
                   trainable: Any | None = None,
                   master_dtype: str | None = None) -> optax.GradientTransformation:
  """AdamW with global-norm clipping and linear warm-up + cosine decay to 10%.

  `trainable` is an optional pytree of bools matching the params (LoRA: only
  adapters train); frozen leaves get zero updates and no optimiser moments.
  `master_dtype` ("float32"; None: off): parameters stored in a narrower float dtype
  (bfloat16) get a master copy in this dtype, and the clipping, the Adam moments and the
  update run in it (`with_master_copy`); without it they follow the parameters' dtype.
  """
  sched = optax.warmup_cosine_decay_schedule(
      init_value=0.0 if warmup_steps else learning_rate, peak_value=learning_rate,
      warmup_steps=warmup_steps, decay_steps=max(total_steps, warmup_steps + 1),
      end_value=0.1 * learning_rate)
  tx = optax.chain(optax.clip_by_global_norm(grad_clip),
                   optax.adamw(sched, weight_decay=weight_decay))
  if master_dtype is not None:
    tx = with_master_copy(tx, dtype=master_dtype)
  if trainable is not None:
    tx = optax.multi_transform({True: tx, False: optax.set_to_zero()},
                               jax.tree.map(bool, trainable))
  return tx


class MasterState(NamedTuple):
  """`with_master_copy`'s state: `master` holds the wide copy of each narrow float parameter
  (`optax.MaskedNode` at the others), `inner` the wrapped optimiser's state (over the wide
  copies, so its moments are wide too)."""
  master: Any
  inner: Any


def _masked(x) -> bool:
  return isinstance(x, optax.MaskedNode)


def with_master_copy(tx: optax.GradientTransformation,
                     dtype: str = "float32") -> optax.GradientTransformation:
  """`tx` run in `dtype` for parameters stored narrower (mixed-precision training).

  Each floating-point parameter narrower than `dtype` (bfloat16 under float32) gets a master
  copy w in `dtype`, kept in the state. An update casts the gradient to `dtype`, runs `tx` on
  w (so clipping and the Adam moments are in `dtype`), sets w ← w + u, and returns the update
  `w − p` in `dtype`, which `optax.apply_updates` adds to the stored p in `dtype` before
  rounding: the new parameter is w rounded to its storage dtype. Steps far below the storage
  dtype's spacing accumulate in w instead of being rounded away (lr·1 < 2⁻⁸ never moves a
  bfloat16 weight of 1 on its own). Parameters already in `dtype` (or wider) and masked
  leaves (LoRA's frozen base) keep no copy and get `tx`'s update unchanged.

  Args:
    tx: the optimiser to wrap.
    dtype: the master dtype, "float32".

  Returns:
    A `GradientTransformation` whose state is a `MasterState`.
  """
  wide = jnp.dtype(dtype)

  def narrow(p) -> bool:
    return (hasattr(p, "dtype") and jnp.issubdtype(p.dtype, jnp.floating)
            and jnp.finfo(p.dtype).bits < jnp.finfo(wide).bits)

  def widened(params, master):
    return jax.tree.map(lambda m, p: p if _masked(m) else m, master, params, is_leaf=_masked)

  def init(params):
    master = jax.tree.map(lambda p: p.astype(wide) if narrow(p) else optax.MaskedNode(),
                          params)
    return MasterState(master, tx.init(widened(params, master)))

  def update(grads, state, params=None):
    if params is None:
      raise ValueError("with_master_copy needs the params in update(grads, state, params)")
    full = widened(params, state.master)
    g = jax.tree.map(lambda x, p: x.astype(wide) if narrow(p) else x, grads, params)
    updates, inner = tx.update(g, state.inner, full)
    new = optax.apply_updates(full, updates)
    master = jax.tree.map(lambda m, n: m if _masked(m) else n, state.master, new,
                          is_leaf=_masked)
    out = jax.tree.map(lambda m, u, n, p: u if _masked(m) else n - p.astype(wide),
                       state.master, updates, new, params, is_leaf=_masked)
    return out, MasterState(master, inner)

  return optax.GradientTransformation(init, update)


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
  own loss term (`spec.trained_loss.targets`, e.g. a value loss's `value_target` [B]).
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
# RL update: weighted loss terms over row sets, PPO epochs over minibatches.
# --------------------------------------------------------------------------

MAIN = "main"  # the row set of the step's own rollout in the update batch


def aggregation_kwargs(loss_spec: credit.PolicyLossSpec,
                       loss_kwargs: Mapping[str, Any]) -> dict[str, Any]:
  """The policy loss's aggregation arguments (its default mode unless `loss_kwargs` sets one),
  so that the KL and entropy terms are reduced like the policy loss."""
  default = inspect.signature(loss_spec.fn).parameters.get("loss_agg_mode")
  agg = {"loss_agg_mode": default.default if default is not None else "token-mean"}
  agg.update({k: v for k, v in loss_kwargs.items() if k in AGGREGATION_ARGS})
  return agg


@dataclasses.dataclass(frozen=True)
class LossTerm:
  """One weighted term w·ℓ of the RL objective.

  A term either shares the model pass of a row set (`rows` names it):
  `fn(scores, rows) -> (ℓ, metrics)`, with `rows` that set's minibatch and `scores` the pass's
  {"model", "logprob" [B,T], "entropy" [B,T] (None unless a term of the set `needs` it),
  "logprob_topk" [B,T,k] (None unless needed)}, all with gradient; or it makes its own passes
  (`rows=None`): `fn(params, minibatch) -> (ℓ, metrics)`, minibatch = {part: arrays}, every
  row set's minibatch and every whole part of the update batch.

  name: a label (errors; the key of an own-pass term's loss for a `Controller`).
  weight: a number; an own-pass term's may also be `weight(minibatch) -> []`, read from the
    batch (a schedule that arrives as arrays does not recompile).
  needs: scores the term reads besides logprob ("entropy", "logprob_topk").
  whole_groups: its statistics are per prompt group, so its row set's minibatches must keep
    whole groups (`RowSet.group_size`).
  """
  name: str
  fn: Callable
  weight: float | Callable = 1.0
  rows: str | None = MAIN
  needs: frozenset = frozenset()
  whole_groups: bool = False


@dataclasses.dataclass(frozen=True)
class RowSet:
  """Rows the update trains on (the step's rollout, a second role's rows), under its own key
  of the update batch: shuffled into the minibatches apart from the other sets, scored by one
  model pass, its terms summed into its loss L_r, which enters the objective as w_r·L_r.

  weight: w_r, a number or `weight(minibatch) -> []` (as `LossTerm.weight`).
  group_size: G of its contiguous prompt groups, used when a term of the set has
    `whole_groups` (each epoch then shuffles whole groups); None: no such layout.
  metric_prefix: put before its terms' metric names ("" keeps them).
  loss_metric: the name of a metric holding its unweighted L_r, or None.
  """
  name: str
  weight: float | Callable = 1.0
  group_size: int | None = None
  metric_prefix: str = ""
  loss_metric: str | None = None


class ControlStep(NamedTuple):
  """What a `Controller.step` returns: the gradient the optimiser applies, the loss it is the
  gradient of, the controller's next state and its metrics (scalars)."""
  grads: Any
  loss: jax.Array
  state: Any
  metrics: dict


@dataclasses.dataclass(frozen=True)
class Controller:
  """A controller of the loss mix, in place of the fixed weights: one optimiser step per RL
  step on the whole batch, along `step(params, state, batch, losses) -> ControlStep`, where
  `losses` = {name: params -> scalar} holds every row set's loss L_r and every own-pass
  term's ℓ (unweighted), `batch` the whole update batch and `state` its own (`init`, kept in
  `TrainState.controller`)."""
  init: Any
  step: Callable


def policy_terms(*, loss_spec: credit.PolicyLossSpec, loss_fields: tuple[str, ...],
                 loss_kwargs: Mapping[str, Any], kl_coef: float, kl_kind: str,
                 entropy_coef: float, obs_ce_coef: float = 0.0, obs_ce_mode: str = "seq-mean",
                 rows: str = MAIN) -> list[LossTerm]:
  """The base terms of a row set's loss, in order:

  * the policy loss `loss_spec.fn` with exactly the contract fields `loss_fields` (those in
    `UPDATE_FIELDS` from the set's own model pass, entropy without gradient; the rest from
    the minibatch), metric `pg_loss`;
  * `kl_coef`·`credit.losses.kl_loss` against `logprob_ref` (metric `kl_loss`) and
    `credit.losses.entropy_bonus` with coefficient `entropy_coef` (when it is non-zero or the
    policy loss reads the entropy), both aggregated like the policy loss
    (`aggregation_kwargs`);
  * ECHO's `obs_ce_coef`·cross-entropy on the observation tokens
    (`credit.losses.observation_ce_loss` over `obs_mask`, reduced by `obs_ce_mode`).
  """
  agg = aggregation_kwargs(loss_spec, loss_kwargs)
  pass_needs = frozenset(loss_fields) & {"entropy", "logprob_topk"}

  def policy(scores, mb):
    own = {"logprob": scores["logprob"], "entropy": jax.lax.stop_gradient(scores["entropy"]),
           "logprob_topk": scores["logprob_topk"]}
    version = {"train_version": mb["train_version"]} if "train_version" in mb else {}
    out = loss_spec.fn(**{f: own[f] if f in UPDATE_FIELDS else mb[f] for f in loss_fields},
                       **version, **loss_kwargs)
    return out.loss, dict(out.metrics, pg_loss=out.loss)

  def kl(scores, mb):
    out = kl_loss(logprob=scores["logprob"], logprob_ref=mb["logprob_ref"],
                  response_mask=mb["response_mask"], kind=kl_kind, **agg)
    return out.loss, dict(out.metrics, kl_loss=out.loss)

  def entropy(scores, mb):
    out = entropy_bonus(entropy=scores["entropy"], response_mask=mb["response_mask"],
                        coef=entropy_coef, **agg)
    return out.loss, out.metrics

  def observations(scores, mb):
    out = observation_ce_loss(logprob=scores["logprob"], obs_mask=mb["obs_mask"],
                              coef=obs_ce_coef, mode=obs_ce_mode)
    return out.loss, out.metrics

  terms = [LossTerm(f"policy loss {loss_spec.name!r}", policy, rows=rows, needs=pass_needs,
                    whole_groups=loss_spec.whole_groups)]
  if kl_coef:
    terms.append(LossTerm("KL term", kl, weight=kl_coef, rows=rows))
  if entropy_coef or "entropy" in loss_fields:
    terms.append(LossTerm("entropy bonus", entropy, rows=rows, needs=frozenset({"entropy"})))
  if obs_ce_coef:
    terms.append(LossTerm("observation cross-entropy", observations, rows=rows))
  return terms


def _is_one(weight) -> bool:
  return isinstance(weight, (int, float)) and not isinstance(weight, bool) and weight == 1.0


def _add(total, weight, loss):
  """total + weight·loss; a weight of 1 multiplies nothing, an empty total adds nothing."""
  term = loss if _is_one(weight) else weight * loss
  return term if total is None else total + term


def row_set_loss(graphdef, rest, terms: Sequence[LossTerm],
                 chunk_size: int | None, temperature: float = 1.0) -> Callable:
  """loss(params, rows) -> (L, metrics): one model pass over `rows` (tokens, attn_mask; with a
  term that needs `logprob_topk`, the sampled tokens and `rows["teacher_topk_ids"]` in one
  chunked pass), then L = Σ_t w_t·ℓ_t over `terms` in order (each `fn(scores, rows)`), their
  metrics merged. Scores are taken at the sampling `temperature` (softmax(z/τ)), the
  distribution the rows were drawn from, so that π_θ / π_old is 1 before the first step."""
  need = frozenset().union(*(t.needs for t in terms))
  need_entropy, need_topk = "entropy" in need, "logprob_topk" in need
  for t in terms:
    if callable(t.weight):
      raise ValueError(f"{t.name}: a term on a row set's model pass takes a number as weight")

  def loss_fn(params, mb):
    model = merge_model(graphdef, params, rest)
    if need_topk:  # the sampled token and the teacher's top-k ids in one chunked pass
      hidden, unembed, mask = model_hidden(model, mb["tokens"], mb["attn_mask"])
      (logprob, entropy), logprob_topk = candidate_scores_hidden(
          hidden, unembed, mb["tokens"], mask, mb["teacher_topk_ids"], chunk_size=chunk_size,
          return_entropy=need_entropy, temperature=temperature)
    else:
      logprob, entropy = score_tokens(model, mb["tokens"], mb["attn_mask"],
                                      chunk_size=chunk_size, return_entropy=need_entropy,
                                      temperature=temperature)
      logprob_topk = None
    scores = {"model": model, "logprob": logprob, "entropy": entropy,
              "logprob_topk": logprob_topk}
    total, metrics = None, {}
    for t in terms:
      loss, m = t.fn(scores, mb)
      total = _add(total, t.weight, loss)
      metrics.update(m)
    return total, metrics

  return loss_fn


def make_rl_loss(graphdef, rest, *, loss_spec: credit.PolicyLossSpec,
                 loss_fields: tuple[str, ...], loss_kwargs: Mapping[str, Any], kl_coef: float,
                 kl_kind: str, entropy_coef: float, chunk_size: int | None,
                 obs_ce_coef: float = 0.0, obs_ce_mode: str = "seq-mean",
                 extra_terms: Sequence[LossTerm] = ()) -> Callable:
  """loss_fn(params, minibatch) -> (loss, metrics) of one row set: `row_set_loss` over
  `policy_terms(...)` followed by `extra_terms` (terms on the same model pass)."""
  terms = policy_terms(loss_spec=loss_spec, loss_fields=loss_fields, loss_kwargs=loss_kwargs,
                       kl_coef=kl_coef, kl_kind=kl_kind, entropy_coef=entropy_coef,
                       obs_ce_coef=obs_ce_coef, obs_ce_mode=obs_ce_mode)
  return row_set_loss(graphdef, rest, terms + [dataclasses.replace(t, rows=MAIN)
                                               for t in extra_terms], chunk_size)


def _weight(weight, mb):
  return weight(mb) if callable(weight) else weight


def make_update(graphdef, rest, tx: optax.GradientTransformation, *,
                row_sets: Sequence[RowSet], terms: Sequence[LossTerm], ppo_epochs: int,
                num_minibatches: int, chunk_size: int | None,
                controller: Controller | None = None, temperature: float = 1.0) -> Callable:
  """Returns update(state, batch) -> (state, metrics): the RL update of a weighted objective

      L(θ) = Σ_r w_r · L_r(θ; minibatch_r) + Σ_t w_t · ℓ_t(θ; minibatch),
      L_r = Σ_{t on r} w_t · ℓ_t(θ; minibatch_r),

  over the row sets `row_sets` (`RowSet`; their terms share the set's model pass) and the
  own-pass terms of `terms` (`LossTerm` with `rows=None`). `batch` = {row set name: [B_r,...]
  arrays (tokens, attn_mask and the fields its terms read)} plus whole parts (any other key:
  passed unshuffled to every step). A row set holding `policy_version` also gets
  `train_version` (the state's step: the staleness bound's reference).

  Each of `ppo_epochs` epochs shuffles every row set with a key folded from the state's key
  and step, then the epoch (`epoch_permutation`; with several sets, also each set's index in
  name order), and takes `num_minibatches` optimiser steps, step m on the m-th slice of every
  set. Metrics (averaged over the steps): `loss`, `grad_norm`, every term's metrics (a row
  set's under its `metric_prefix`) and each row set's `loss_metric`.

  With `controller` (`Controller`) the weights are the controller's: one step on the whole
  batch (ppo_epochs = num_minibatches = 1), the state's `controller` updated. Row sets are
  scored at the sampling `temperature` (`row_set_loss`); own-pass terms score themselves.

  Raises ValueError, before tracing, for a term with `whole_groups` on a row set without
  `group_size` when num_minibatches > 1, and for unknown or repeated row set names.
  """
  names = [r.name for r in row_sets]
  if not names or len(set(names)) != len(names):
    raise ValueError(f"row set names must be unique and at least one: {names}")
  unknown = sorted({t.rows for t in terms if t.rows is not None} - set(names))
  if unknown:
    raise ValueError(f"terms on row sets {unknown}, which are not among {sorted(names)}")
  group_sizes = {}
  for r in row_sets:
    whole = [t for t in terms if t.rows == r.name and t.whole_groups]
    if whole and num_minibatches > 1 and r.group_size is None:
      raise ValueError(
          f"{whole[0].name} needs whole prompt groups in every minibatch (its statistics are "
          f"per group) but num_minibatches={num_minibatches} and row set {r.name!r} has no "
          "group_size: pass group_size (rows of one group contiguous) or use "
          "num_minibatches=1")
    group_sizes[r.name] = r.group_size if whole else None
  if controller is not None and (ppo_epochs != 1 or num_minibatches != 1):
    raise ValueError("a controller takes one step on the whole batch: ppo_epochs and "
                     f"num_minibatches must be 1 (got {ppo_epochs}, {num_minibatches})")
  per_set = {r.name: row_set_loss(graphdef, rest, [t for t in terms if t.rows == r.name],
                                  chunk_size, temperature) for r in row_sets}
  own = [t for t in terms if t.rows is None]
  ordered = sorted(row_sets, key=lambda r: r.name)

  def loss_fn(params, mb):
    total, metrics = None, {}
    for r in ordered:
      loss, m = per_set[r.name](params, mb[r.name])
      total = _add(total, _weight(r.weight, mb), loss)
      metrics.update({r.metric_prefix + k: v for k, v in m.items()})
      if r.loss_metric:
        metrics[r.loss_metric] = loss
    for t in own:
      loss, m = t.fn(params, mb)
      total = _add(total, _weight(t.weight, mb), loss)
      metrics.update(m)
    return total, metrics

  def versioned(batch, step):
    batch = dict(batch)
    for n in names:  # the staleness bound's reference: the version trained
      if "policy_version" in batch[n]:
        batch[n] = dict(batch[n], train_version=jnp.full_like(batch[n]["policy_version"], step))
    return batch

  if controller is not None:
    def controlled(state: TrainState, batch):
      batch = versioned(batch, state.step)
      losses = {n: functools.partial(lambda p, n: per_set[n](p, batch[n])[0], n=n)
                for n in names}
      losses.update({t.name: functools.partial(lambda p, t: t.fn(p, batch)[0], t=t)
                     for t in own})
      out = controller.step(state.params, state.controller, batch, losses)
      updates, opt_state = tx.update(out.grads, state.opt_state, state.params)
      params = optax.apply_updates(state.params, updates)
      metrics = dict(out.metrics, loss=out.loss, grad_norm=optax.tree.norm(out.grads))
      return state.replace(params=params, opt_state=opt_state, step=state.step + 1,
                           controller=out.state), metrics

    return controlled

  sgd = make_row_sets_sgd(loss_fn, tx, epochs=ppo_epochs, num_minibatches=num_minibatches,
                          group_sizes=group_sizes)

  def update(state: TrainState, batch):
    key = jax.random.fold_in(jax.random.wrap_key_data(state.key), state.step)
    params, opt_state, metrics = sgd(state.params, state.opt_state,
                                     versioned(batch, state.step), key)
    return state.replace(params=params, opt_state=opt_state, step=state.step + 1), metrics

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


def make_row_sets_sgd(loss_fn: Callable, tx: optax.GradientTransformation, *, epochs: int,
                      num_minibatches: int, group_sizes: Mapping[str, int | None]) -> Callable:
  """`make_minibatch_sgd` over a batch of row sets: sgd(params, opt_state, batch, key) with
  batch = {set name: [B_set,...] arrays} (the sets, the keys of `group_sizes`, may differ in
  rows and width) plus whole parts (any other key).

  Each epoch shuffles every set's rows with its own key (`epoch_permutation`): the epoch's
  key itself when there is one set, so that a one-set update shuffles as
  `make_minibatch_sgd` does, else the epoch's key folded with the set's index in name order;
  `group_sizes[set]` (None: rows one by one) keeps whole groups together. Optimiser step m
  calls `loss_fn(params, {set: its m-th minibatch, part: the whole part})`, so every step sees
  every set. Metrics, `loss` and `grad_norm` are averaged over the steps.
  """
  names = sorted(group_sizes)

  def sgd(params, opt_state, batch, key):
    whole = {k: v for k, v in batch.items() if k not in group_sizes}

    def shuffle(epoch_key):  # every optimiser step gets a slice of every row set
      keys = ([epoch_key] if len(names) == 1 else
              [jax.random.fold_in(epoch_key, i) for i in range(len(names))])
      return {n: _minibatches(batch[n], k, num_minibatches, group_sizes[n])
              for n, k in zip(names, keys)}

    if not whole:
      return _epochs_of_minibatches(loss_fn, tx, params, opt_state, key, epochs, shuffle)
    return _epochs_of_minibatches(lambda p, mb, parts: loss_fn(p, dict(mb, **parts)), tx,
                                  params, opt_state, key, epochs, shuffle, whole)

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
                sum_pi_squared: bool = False, entropy: bool = True,
                temperature: float = 1.0) -> Callable:
  """score(params, tokens, attn_mask) -> (logprob [B,T], entropy [B,T]) without gradients; with
  `sum_pi_squared`, (logprob, entropy, Σπ² [B,T]) from the same model pass; with
  `entropy=False` the entropy is not computed (None in its place). All under softmax(z/τ),
  τ = `temperature` (1: the raw model)."""

  def score(params, tokens, attn_mask):
    model = merge_model(graphdef, params, rest)
    hidden, unembed, mask = model_hidden(model, tokens, attn_mask)
    out = score_hidden(hidden, unembed, tokens, mask, chunk_size=chunk_size,
                       return_entropy=entropy, temperature=temperature)
    if not sum_pi_squared:
      return out
    return (*out, sum_pi_squared_hidden(hidden, unembed, mask, chunk_size=chunk_size,
                                        temperature=temperature))

  return score
