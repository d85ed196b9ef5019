"""Loss aggregation and the masked statistics behind metrics.

Also home of the constants every loss module shares: `F32` (the dtype of every loss and
metric) and `LOG_CLAMP` (log-ratios are clamped to ±20 before `exp`, as in verl).
"""
from __future__ import annotations

from typing import Callable

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit._checks import lookup

__all__ = ["AGG_MODES", "aggregate_loss"]

Array = jax.Array
F32 = jnp.float32
LOG_CLAMP = 20.0


def _count(global_value: ArrayLike | None, local: Array) -> Array:
  n = local if global_value is None else jnp.asarray(global_value, F32)
  return jnp.maximum(n, 1.0)


def _need_norm(norm_constant, mode):
  if norm_constant is None:
    raise ValueError(f"loss_agg_mode={mode!r} needs `norm_constant` (a constant C such as the "
                     "maximum generation length L_max; it must not follow the padded T)")
  return jnp.asarray(norm_constant, F32)


def _nonempty_rows(m_BT):
  return jnp.sum(jnp.any(m_BT, axis=-1), dtype=F32)


def _agg_token_mean(l_BT, m_BT, nt, ns, c):
  return jnp.sum(l_BT) / _count(nt, jnp.sum(m_BT, dtype=F32))


def _agg_seq_mean_token_mean(l_BT, m_BT, nt, ns, c):
  len_B = jnp.sum(m_BT, axis=-1, dtype=F32)
  seq_B = jnp.sum(l_BT, axis=-1) / jnp.maximum(len_B, 1.0)
  return jnp.sum(seq_B) / _count(ns, _nonempty_rows(m_BT))


def _agg_seq_mean_token_sum(l_BT, m_BT, nt, ns, c):
  return jnp.sum(l_BT) / _count(ns, _nonempty_rows(m_BT))


def _agg_seq_mean_token_sum_norm(l_BT, m_BT, nt, ns, c):
  return jnp.sum(l_BT) / _need_norm(c, "seq-mean-token-sum-norm")


def _agg_seq_mean_token_sum_norm_batch(l_BT, m_BT, nt, ns, c):
  c = _need_norm(c, "seq-mean-token-sum-norm-batch")
  return jnp.sum(l_BT) / (_count(ns, _nonempty_rows(m_BT)) * c)


def _agg_token_sum(l_BT, m_BT, nt, ns, c):
  return jnp.sum(l_BT)


_AGGREGATORS: dict[str, Callable[..., Array]] = {
    "token-mean": _agg_token_mean,
    "seq-mean-token-mean": _agg_seq_mean_token_mean,
    "seq-mean-token-sum": _agg_seq_mean_token_sum,
    "seq-mean-token-sum-norm": _agg_seq_mean_token_sum_norm,
    "seq-mean-token-sum-norm-batch": _agg_seq_mean_token_sum_norm_batch,
    "token-sum": _agg_token_sum,
}
AGG_MODES = tuple(_AGGREGATORS)


def check_agg_mode(mode: str) -> None:
  """Raises `UnknownNameError` (listing `AGG_MODES`) for an unknown aggregation mode."""
  lookup(_AGGREGATORS, mode, "loss_agg_mode")


def aggregate_loss(loss_BT: ArrayLike, mask_BT: ArrayLike, mode: str = "token-mean", *,
                   num_tokens_global: ArrayLike | None = None,
                   num_seqs_global: ArrayLike | None = None,
                   norm_constant: ArrayLike | None = None) -> Array:
  """Reduces a per-token loss ℓ[B,T] to a scalar.

  With M the mask, L_i = Σ_t M[i,t] the length of row i, B' the number of rows with
  L_i > 0, N = ΣM:

  * ``token-mean``: Σ ℓM / N (DAPO token-level; verl default).
  * ``seq-mean-token-mean``: (1/B') Σ_i Σ_t ℓM / max(L_i, 1) (GRPO paper, GSPO).
  * ``seq-mean-token-sum``: (1/B') Σ ℓM.
  * ``seq-mean-token-sum-norm``: Σ ℓM / C with C a constant (Dr.GRPO as in verl before
    its global-batch rewrite). C never depends
    on B or T.
  * ``seq-mean-token-sum-norm-batch``: Σ ℓM / (B'·C), the Dr.GRPO paper's form
    (arXiv 2503.20783, "divide by batch"), also current verl's
    behaviour for ``seq-mean-token-sum-norm`` with `loss_scale_factor` = C.
  * ``token-sum``: Σ ℓM (DCPO's "only token mean" before its external scaling).

  Fully masked rows contribute 0 and are not counted in B'. Global counts: when a
  minibatch is split into micro-batches by rows, pass the minibatch's `num_tokens_global`
  (N) and `num_seqs_global` (B'); then Σ_micro aggregate_loss(micro) equals the
  minibatch loss, values and gradients (the per-row terms do not couple rows). Under a
  sharded `jit` over the whole batch nothing needs to be passed: sums are global.

  Args:
    loss_BT: [B,T] per-token loss; entries outside the mask are ignored (even NaN).
    mask_BT: [B,T] bool (or 0/1) mask of the tokens that count.
    mode: one of `AGG_MODES`; resolved by dict lookup before tracing.
    num_tokens_global: optional scalar N of the whole minibatch (token-mean).
    num_seqs_global: optional scalar B' of the whole minibatch (``seq-mean-*``).
    norm_constant: C for the ``-norm`` modes (required there), e.g. the maximum
      generation length L_max; keep it fixed through training.

  Returns:
    float32 scalar.

  Raises:
    UnknownNameError: unknown mode (a ValueError; the message lists the modes).
    ValueError: missing `norm_constant` for a ``-norm`` mode.

  >>> float(aggregate_loss(jnp.ones((2, 4)), jnp.array([[1, 1, 0, 0], [1, 1, 1, 1]], bool),
  ...                      "seq-mean-token-sum-norm", norm_constant=8.0))
  0.75
  """
  fn = lookup(_AGGREGATORS, mode, "loss_agg_mode")
  loss_BT = jnp.asarray(loss_BT, F32)
  mask_BT = jnp.asarray(mask_BT).astype(bool)
  chex.assert_rank([loss_BT, mask_BT], 2)
  chex.assert_equal_shape([loss_BT, mask_BT])
  return fn(jnp.where(mask_BT, loss_BT, 0.0), mask_BT, num_tokens_global, num_seqs_global,
            norm_constant)


# --------------------------------------------------------------------------
# Masked statistics used by metrics (all stop-gradient, exact 0 on empty masks).
# --------------------------------------------------------------------------


def token_count(m_BT: Array) -> Array:
  """max(Σ M, 1), float32: the denominator of token-mean metrics."""
  return jnp.maximum(jnp.sum(m_BT, dtype=F32), 1.0)


def masked_max(x: Array, m: Array) -> Array:
  return jnp.where(jnp.any(m), jnp.max(jnp.where(m, x, -jnp.inf)), 0.0)


def masked_min(x: Array, m: Array) -> Array:
  return jnp.where(jnp.any(m), jnp.min(jnp.where(m, x, jnp.inf)), 0.0)


def token_means(m_BT: Array, n: Array, named: dict[str, Array]) -> dict[str, Array]:
  """Masked means Σ M·x / n of several [B,T] arrays (bools count as 0/1), stop-gradient.

  One reduction per array: XLA:CPU materialises every reduction input anyway, and
  stacking the arrays first adds a copy of all of them (measured: 3x the traffic).
  """
  return {k: jnp.sum(jnp.where(m_BT, jax.lax.stop_gradient(v).astype(F32), 0.0)) / n
          for k, v in named.items()}


def exp_extrema(m_BT: Array, named: dict[str, Array]) -> dict[str, Array]:
  """{name_max: exp(max x), name_min: exp(min x)} over the mask for finite log-space [B,T]
  arrays; 0 when the mask is empty. Stop-gradient."""
  some = jnp.any(m_BT)
  out = {}
  for k, x in named.items():
    x = jax.lax.stop_gradient(x)
    out[k + "_max"] = jnp.where(some, jnp.exp(jnp.max(jnp.where(m_BT, x, -jnp.inf))), 0.0)
    out[k + "_min"] = jnp.where(some, jnp.exp(jnp.min(jnp.where(m_BT, x, jnp.inf))), 0.0)
  return out
