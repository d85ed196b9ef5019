"""The one reduction of every policy loss, and the decorator that builds a full loss from it.

A policy loss is written as its per-token term::

    xxx_loss(*, logprob, logprob_old, advantages, response_mask, <hyper>) -> TokenLoss

and `@policy_loss(name, paper, confidence=..., source=...)` turns it into the registered
full loss::

    fn(*, <the same arguments>, logprob_sampler=None, is_level="token", is_mode="truncate",
       is_threshold=2.0, is_threshold_lower=None, loss_agg_mode=..., num_tokens_global=None,
       num_seqs_global=None, norm_constant=None, sample_weight=None, policy_version=None,
       train_version=None, max_staleness=None) -> LossOutput

which is `reduce_policy_loss(xxx_loss(...), ...)`. Conventions shared by every loss:

* Gradients flow only through `logprob` (the current policy). `logprob_old`, `advantages`,
  `logprob_sampler` and `sample_weight` are stop-gradient.
* Entries outside `response_mask` are replaced by zeros *before* any arithmetic, so NaN or
  inf padding can neither reach the loss nor poison a gradient; they contribute exact zeros.
* Token log-ratios δ = logprob − logprob_old are clamped to [−20, 20] before `exp`
  (verl `compute_policy_loss_vanilla`), unless the loss's docstring says otherwise.
* `reduce_policy_loss` multiplies the per-token loss ℓ[B,T] by the importance weights
  (when `logprob_sampler` is given) and the per-sample weights, then aggregates it with
  `aggregate_loss`. Global counts make a sum over
  micro-batches equal the full-batch loss, except for batch-coupled losses
  (`PolicyLossSpec.batch_coupled`).
* `loss_agg_mode`, `is_level` and `is_mode` are static (they pick code paths); every
  numeric hyperparameter may be a traced array.

Metrics are float32 scalars computed on stop-gradient values over the *local* batch and the
valid tokens of `response_mask` (before any rejection, without sample weights):
`approx_kl` (mean of logprob_old − logprob, verl's `ppo_kl`), `ratio_mean/max/min` of the
token ratio exp(δ), the `is_*` metrics of `importance_correction` with a sampler, plus the
loss's own entries.
"""
from __future__ import annotations

import inspect
import textwrap
from typing import Any, Callable, Iterable, NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.losses.aggregation import (F32, LOG_CLAMP, aggregate_loss, check_agg_mode,
                                       exp_extrema, token_count, token_means)
from credit.losses.importance import check_importance_args, importance_correction
from credit.registry import register_policy_loss

__all__ = ["TokenLoss", "LossOutput", "reduce_policy_loss", "policy_loss"]

Array = jax.Array
POLICY_NEEDS = ("logprob", "logprob_old", "advantages", "response_mask")
STATIC_ARGNAMES = ("loss_agg_mode", "is_level", "is_mode")


class TokenLoss(NamedTuple):
  """What a per-token policy loss returns.

  Attributes:
    loss: [B,T] float32 per-token loss ℓ, 0 outside `response_mask`.
    metrics: name -> [B,T] array (reported as its masked token mean; bools give
      fractions) or scalar (reported as it is).
  """
  loss: Array
  metrics: dict[str, Array]


class LossOutput(NamedTuple):
  """A scalar loss and its diagnostics (float32 scalars)."""
  loss: Array
  metrics: dict[str, Array]


def reduce_policy_loss(token_loss: TokenLoss, *, logprob: ArrayLike, logprob_old: ArrayLike,
                       response_mask: ArrayLike, logprob_sampler: ArrayLike | None = None,
                       is_level: str = "token", is_mode: str = "truncate",
                       is_threshold: ArrayLike = 2.0,
                       is_threshold_lower: ArrayLike | None = None,
                       loss_agg_mode: str = "token-mean",
                       num_tokens_global: ArrayLike | None = None,
                       num_seqs_global: ArrayLike | None = None,
                       norm_constant: ArrayLike | None = None,
                       sample_weight: ArrayLike | None = None,
                       policy_version: ArrayLike | None = None,
                       train_version: ArrayLike | None = None,
                       max_staleness: ArrayLike | None = None) -> LossOutput:
  """Importance correction, per-sample weights, aggregation and metrics of a policy loss.

  .. math::
    L = agg(ℓ · w^{IS} · w^{sample}, M')

  with w^{IS} the stop-gradient `importance_correction` weights (1 without a sampler) and
  M' the response mask less the tokens it rejects (``mask`` mode: rejected tokens leave
  the denominators, as in verl's rollout rejection sampling; with global counts the
  caller's counts are used as given) and less the rows older than `max_staleness`.

  Args:
    token_loss: the per-token term, `TokenLoss(loss [B,T], metrics)`.
    logprob, logprob_old: [B,T] float32 (for the common ratio metrics and the correction).
    response_mask: [B,T] bool.
    logprob_sampler: optional [B,T] log-probs reported by the sampler; enables
      `importance_correction` with `is_level` ("token" | "sequence" | "geometric",
      static), `is_mode` ("truncate" | "mask", static), `is_threshold` (C) and
      `is_threshold_lower`.
    loss_agg_mode: aggregation mode (`AGG_MODES`, see `aggregate_loss`), static.
    num_tokens_global, num_seqs_global, norm_constant: see `aggregate_loss`.
    sample_weight: optional [B] float32 per-sample weight (stop-gradient) multiplying each
      row's per-token loss. A row of weight 0 contributes 0 but stays in the counts
      (token-mean's N, the seq-mean modes' B'): weights rescale rows, they do not drop
      them (to drop a row, remove it from `response_mask`). Metrics are unweighted.
    policy_version, train_version, max_staleness: the row-level staleness bound (issue 16,
      ASearcher / AReaL's "drop samples older than the bound", applied per row inside the
      loss). With `max_staleness` = η (not None), rows whose parameters are more than η
      versions older than the ones being trained, train_version − policy_version > η, leave
      M' like rejected tokens (out of the local denominators; callers' global counts as
      given). `policy_version` [B] int: the version that sampled each row (the contract
      field); `train_version`: [] or [B] int, the version being trained (the runner passes
      its RL step). Both are needed when `max_staleness` is set; metric `stale_row_frac`
      (fraction of non-empty rows dropped). Inferred (the released code bounds staleness
      by capping rollouts in flight, not per row).

  Returns:
    `LossOutput(loss, metrics)`: float32 scalar loss; metrics `approx_kl`,
    `ratio_mean/max/min`, the `is_*` metrics with a sampler, and `token_loss.metrics`
    ([B,T] entries as masked token means over `response_mask`, scalars as they are).

  Raises:
    UnknownNameError: unknown `loss_agg_mode`, `is_level` or `is_mode`.
  """
  check_agg_mode(loss_agg_mode)
  check_importance_args(is_level, is_mode)
  m_BT = jnp.asarray(response_mask).astype(bool)
  loss_BT = jnp.asarray(token_loss.loss, F32)
  chex.assert_rank([logprob, logprob_old, m_BT, loss_BT], 2)
  chex.assert_equal_shape([logprob, logprob_old, m_BT, loss_BT])
  lp = jnp.where(m_BT, jax.lax.stop_gradient(jnp.asarray(logprob, F32)), 0.0)
  lp_old = jnp.where(m_BT, jax.lax.stop_gradient(jnp.asarray(logprob_old, F32)), 0.0)
  d = jnp.clip(lp - lp_old, -LOG_CLAMP, LOG_CLAMP)
  token = {"approx_kl": -d, "ratio_mean": jnp.exp(d)}
  token.update({k: v for k, v in token_loss.metrics.items() if jnp.ndim(v) == 2})
  scalars = {k: jax.lax.stop_gradient(v) for k, v in token_loss.metrics.items()
             if jnp.ndim(v) != 2}
  mask_BT = m_BT
  is_metrics = {}
  if logprob_sampler is not None:
    chex.assert_equal_shape([logprob_sampler, m_BT])
    ic = importance_correction(logprob_old=lp_old, logprob_sampler=logprob_sampler,
                               response_mask=m_BT, level=is_level, mode=is_mode,
                               threshold=is_threshold, threshold_lower=is_threshold_lower)
    loss_BT = loss_BT * ic.weights
    mask_BT, is_metrics = ic.mask, ic.metrics
  if sample_weight is not None:
    w_B = jax.lax.stop_gradient(jnp.asarray(sample_weight, F32))
    chex.assert_shape(w_B, m_BT.shape[:1])
    w_B = jnp.where(jnp.any(m_BT, axis=-1), w_B, 0.0)  # empty rows: any weight is harmless
    loss_BT = loss_BT * w_B[:, None]
  stale_metrics = {}
  if max_staleness is not None:
    keep_B, stale_metrics = staleness_mask(m_BT, policy_version, train_version, max_staleness)
    mask_BT = mask_BT & keep_B[:, None]
  # Metrics are over the valid tokens of `response_mask` (before any rejection).
  metrics = {**token_means(m_BT, token_count(m_BT), token), **scalars,
             **exp_extrema(m_BT, {"ratio": d}), **is_metrics, **stale_metrics}
  loss = aggregate_loss(loss_BT, mask_BT, loss_agg_mode, num_tokens_global=num_tokens_global,
                        num_seqs_global=num_seqs_global, norm_constant=norm_constant)
  return LossOutput(loss, metrics)


def staleness_mask(response_mask: ArrayLike, policy_version: ArrayLike | None,
                   train_version: ArrayLike | None, max_staleness: ArrayLike
                   ) -> tuple[Array, dict[str, Array]]:
  """([B] bool rows within the bound, {"stale_row_frac": fraction of non-empty rows
  outside it}): keep row b iff train_version − policy_version[b] ≤ max_staleness."""
  if policy_version is None or train_version is None:
    raise ValueError("max_staleness needs policy_version ([B] int, the version that sampled "
                     "each row) and train_version (the version being trained)")
  if (isinstance(max_staleness, (int, float)) and not isinstance(max_staleness, bool)
      and max_staleness < 0):
    raise ValueError(f"max_staleness must be >= 0 (versions), got {max_staleness}")
  m_BT = jnp.asarray(response_mask).astype(bool)
  pv_B = jnp.asarray(policy_version)
  chex.assert_shape(pv_B, m_BT.shape[:1])
  if not jnp.issubdtype(pv_B.dtype, jnp.integer):
    raise ValueError(f"policy_version must be an integer array, got {pv_B.dtype}")
  lag_B = jnp.broadcast_to(jnp.asarray(train_version), pv_B.shape) - pv_B
  keep_B = lag_B <= jnp.asarray(max_staleness)
  rows_B = jnp.any(m_BT, axis=-1)
  frac = jnp.sum(rows_B & ~keep_B, dtype=F32) / jnp.maximum(jnp.sum(rows_B, dtype=F32), 1.0)
  return keep_B, {"stale_row_frac": frac}


# The data arguments the per-token term and the reduction share.
_SHARED = ("token_loss", "logprob", "logprob_old", "response_mask")
_REDUCTION_PARAMS = tuple(p for k, p in inspect.signature(reduce_policy_loss).parameters.items()
                          if k not in _SHARED)
REDUCTION_ARGNAMES = tuple(p.name for p in _REDUCTION_PARAMS)


def _reduction_doc() -> str:
  """The Args entries of `reduce_policy_loss` after `response_mask`."""
  doc = inspect.cleandoc(reduce_policy_loss.__doc__)
  args = doc.split("\nArgs:\n", 1)[1].split("\n\n", 1)[0]
  return args[args.index("  logprob_sampler:"):]


_REDUCTION_DOC = _reduction_doc()


def _full_doc(name: str, token_fn: Callable, loss_agg_mode: str) -> str:
  doc = inspect.cleandoc(token_fn.__doc__ or "")
  head, _, rest = doc.partition("\nReturns:\n")
  head = head.rstrip()
  returns, _, tail = rest.partition("\n\n")  # the Returns block, then e.g. an Example
  reduction = _REDUCTION_DOC.replace(
      "`aggregate_loss`), static.", f'`aggregate_loss`), static;\n    default "{loss_agg_mode}".')
  if "\nArgs:\n" not in head:
    head += "\n\nArgs:"
  returns = textwrap.dedent(returns).strip()
  return (f"{head}\n{reduction}\n\n"
          f"Returns:\n"
          f"  LossOutput(loss, metrics): `{token_fn.__name__}` reduced by `reduce_policy_loss`; "
          "metrics\n  approx_kl, ratio_mean/max/min, is_* (with a sampler) and the per-token "
          "term's\n  (token means of [B,T] entries). Per-token term:\n"
          f"{textwrap.indent(returns, '  ')}\n\n"
          + (f"{tail.strip()}\n\n" if tail.strip() else "")
          + f"Registered as policy loss {name!r}.")


def _full_loss(name: str, token_fn: Callable, loss_agg_mode: str) -> Callable[..., LossOutput]:
  """`token_fn` followed by `reduce_policy_loss`, with the combined keyword signature."""
  sig = inspect.signature(token_fn)
  params = list(sig.parameters.values())
  bad = [p.name for p in params if p.kind is not p.KEYWORD_ONLY]
  missing = [k for k in POLICY_NEEDS if k not in sig.parameters]
  clash = [p.name for p in params if p.name in REDUCTION_ARGNAMES]
  if bad or missing or clash:
    raise TypeError(f"policy loss {name!r}: {token_fn.__qualname__} must take keyword-only "
                    f"arguments including {list(POLICY_NEEDS)} and none of the reduction's "
                    f"{list(REDUCTION_ARGNAMES)} (not keyword-only: {bad}; missing: "
                    f"{missing}; reduction names: {clash})")
  reduce_params = [p.replace(default=loss_agg_mode) if p.name == "loss_agg_mode" else p
                   for p in _REDUCTION_PARAMS]
  defaults = {p.name: p.default for p in reduce_params}

  def fn(**kwargs: Any) -> LossOutput:
    red = {k: kwargs.pop(k, v) for k, v in defaults.items()}
    check_agg_mode(red["loss_agg_mode"])  # fail before any work
    check_importance_args(red["is_level"], red["is_mode"])
    out = token_fn(**kwargs)
    return reduce_policy_loss(out, logprob=kwargs["logprob"], logprob_old=kwargs["logprob_old"],
                              response_mask=kwargs["response_mask"], **red)

  fn.__signature__ = sig.replace(parameters=params + reduce_params,
                                 return_annotation="LossOutput")
  fn.__name__ = fn.__qualname__ = name
  fn.__module__ = token_fn.__module__
  fn.__doc__ = _full_doc(name, token_fn, loss_agg_mode)
  return fn


def policy_loss(name: str, paper: str, *, confidence: str | None = None,
                source: str | None = None, static_argnames: Iterable[str] = (),
                batch_coupled: bool = False, loss_agg_mode: str = "token-mean"):
  """Decorator: registers the full loss built from a per-token function.

  The decorated function `xxx_loss(*, logprob, logprob_old, advantages, response_mask,
  <hyper>) -> TokenLoss` is returned unchanged; the registry entry `name` gets
  `fn = xxx_loss` then `reduce_policy_loss` (signature: the per-token arguments plus the
  reduction's; docstring: the per-token one plus the reduction arguments) and
  `token_fn = xxx_loss`.

  Args:
    name: registry key.
    paper: citation (title, arXiv id where one exists).
    confidence: required; one of `credit.registry.CONFIDENCE_TAGS`.
    source: required; what was read (see `credit.registry.register_policy_loss`).
    static_argnames: the loss's own static hyperparameters (added to `loss_agg_mode`,
      `is_level`, `is_mode`).
    batch_coupled: the per-token value depends on statistics of the whole (micro-)batch.
    loss_agg_mode: the full loss's default aggregation.
  """
  check_agg_mode(loss_agg_mode)

  def deco(token_fn):
    full = _full_loss(name, token_fn, loss_agg_mode)
    register_policy_loss(name, needs=POLICY_NEEDS, paper=paper, confidence=confidence,
                         source=source, static_argnames=STATIC_ARGNAMES + tuple(static_argnames),
                         batch_coupled=batch_coupled, token_fn=token_fn)(full)
    return token_fn

  return deco
