"""PCSD: persistent-consistency weights on a self-distillation term added to GRPO."""
from __future__ import annotations

from typing import Literal, NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit._checks import check_int
from credit.advantages.distill._steps import clean_logprobs, grpo_rows, shift_right
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["pcsd_advantages", "pcsd_persistence", "PcsdPersistence"]

_PAPER = "PCSD: persistent-consistency self-distillation, arXiv preprint"


class PcsdPersistence(NamedTuple):
  """Per-token persistence quantities, each [B,T] float32, 0 outside the mask.

  support: s_t = ℓᵀ − ℓˢ.  aggregate: P_t.  modulated: P̃_t.  weight: w_t = σ(κ(P̃_t − τ)).
  """
  support: Array
  aggregate: Array
  modulated: Array
  weight: Array


def pcsd_persistence(*, response_mask: ArrayLike, logprob_old: ArrayLike,
                     logprob_teacher: ArrayLike, step_id: ArrayLike, window: int = 3,
                     decay: ArrayLike = 0.5, eta: ArrayLike = 1.0, kappa: ArrayLike = 5.0,
                     tau: ArrayLike = 0.0) -> PcsdPersistence:
  """Windowed, decayed teacher support P, its trend-modulated P̃ and the weight w (no gradient).

  A window runs back over consecutive valid tokens of the same step only (a masked token
  or a change of `step_id` starts a new window); see `pcsd_advantages` for the math.

  Args:
    response_mask: [B,T] bool.
    logprob_old: [B,T] float student log-probs.
    logprob_teacher: [B,T] float self-teacher log-probs.
    step_id: [B,T] int step of each token, −1 outside steps.
    window: static W ≥ 1.
    decay: λ.
    eta: η.
    kappa: κ.
    tau: τ.

  Returns:
    `PcsdPersistence`.

  Example:
    >>> import numpy as np
    >>> out = pcsd_persistence(response_mask=np.ones((1, 5), bool), logprob_old=np.zeros((1, 5)),
    ...     logprob_teacher=np.array([[0.4, 0.2, -0.1, -0.3, 0.5]]),
    ...     step_id=np.zeros((1, 5), np.int32))
    >>> for x in out[1:]:
    ...   print(np.round(np.asarray(x[0], np.float64), 6).tolist())
    [0.4, 0.266667, 0.057143, -0.171429, 0.185714]
    [0.4, 0.133333, -0.152381, -0.4, 0.185714]
    [0.880797, 0.660756, 0.318233, 0.119203, 0.716785]
  """
  check_int("pcsd_persistence", "window", window)
  # Log-probs are ≤ 0; the doctest's teacher values above 0 stand for the support s directly.
  mask_BT, ls_BT, lt_BT = clean_logprobs(response_mask, logprob_old, logprob_teacher)
  sid_BT = jnp.asarray(step_id)
  chex.assert_type(sid_BT, int)
  chex.assert_equal_shape([sid_BT, mask_BT])
  sid_BT = jnp.where(mask_BT, sid_BT.astype(jnp.int32), -1)
  s_BT = lt_BT - ls_BT
  # link[t]: token t continues the window of token t−1 (both valid, same step ≥ 0).
  link_BT = (mask_BT & shift_right(mask_BT, 1, False)
             & (sid_BT == shift_right(sid_BT, 1, -1)) & (sid_BT >= 0))
  decay = jnp.asarray(decay, jnp.float32)
  num_BT, den_BT, inside_BT = s_BT, mask_BT.astype(jnp.float32), mask_BT
  for j in range(1, window):
    inside_BT = inside_BT & shift_right(link_BT, j - 1, False)
    coef = decay ** j
    num_BT = num_BT + jnp.where(inside_BT, coef * shift_right(s_BT, j, 0.0), 0.0)
    den_BT = den_BT + jnp.where(inside_BT, coef, 0.0)
  p_BT = jnp.where(mask_BT, num_BT / jnp.maximum(den_BT, 1e-30), 0.0)
  trend_BT = jnp.where(link_BT, p_BT - shift_right(p_BT, 1, 0.0), 0.0)
  pt_BT = p_BT - jnp.asarray(eta, jnp.float32) * jnp.maximum(-trend_BT, 0.0)
  w_BT = jax.nn.sigmoid(jnp.asarray(kappa, jnp.float32) * (pt_BT - jnp.asarray(tau, jnp.float32)))
  out = PcsdPersistence(support=s_BT, aggregate=p_BT, modulated=jnp.where(mask_BT, pt_BT, 0.0),
                        weight=jnp.where(mask_BT, w_BT, 0.0))
  return jax.tree.map(jax.lax.stop_gradient, out)


@register_estimator(
    "pcsd", needs=("reward", "group_id", "response_mask", "logprob_old", "logprob_teacher",
                   "step_id"),
    paper=_PAPER, static_argnames=("num_groups", "group_size", "window", "group_std"),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def pcsd_advantages(*, reward: ArrayLike, group_id: ArrayLike | None, response_mask: ArrayLike,
                    logprob_old: ArrayLike, logprob_teacher: ArrayLike, step_id: ArrayLike,
                    num_groups: int, group_size: int | None = None, beta: ArrayLike = 1.0,
                    window: int = 3, decay: ArrayLike = 0.5, eta: ArrayLike = 1.0,
                    kappa: ArrayLike = 5.0, tau: ArrayLike = 0.0,
                    group_std: Literal["unbiased", "population", "none"] = "unbiased",
                    eps: ArrayLike = 1e-6) -> Array:
  """PCSD: GRPO plus teacher support weighted by how persistently the teacher supports it.

  Each token's self-distillation term counts only where a privileged self-teacher's
  support persists over a local window; declining support is down-weighted and a sigmoid
  gates the result::

    s_t = ℓᵀ_t − ℓˢ_t,    W_t = min(W, consecutive valid tokens of step(t) ending at t)
    P_t = Σ_{j<W_t} λ^j s_{t−j} / Σ_{j<W_t} λ^j,    Δ_t = P_t − P_{t−1}   (0 at a window start)
    P̃_t = P_t − η max(0, −Δ_t),    w_t = σ(κ (P̃_t − τ))
    A[b,t] = Â_b + β w_t s_t

  with ℓˢ = `logprob_old` and ℓᵀ = `logprob_teacher` (the policy under a privileged
  context). Windows never cross a step boundary or a masked token. Teacher == student gives
  GRPO. The output carries no gradient.

  Paper: "PCSD: persistent-consistency self-distillation" (arXiv preprint). The abstract
  gives the idea but no equation: this advantage form and W = 3, λ = 0.5, η = 1, κ = 5,
  τ = 0, β = 1 are this library's (the paper's term is an auxiliary loss).

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int group ids (unused, may be None, with `group_size`).
    response_mask: [B,T] bool, the policy's tokens.
    logprob_old: [B,T] float student log-prob of the sampled token.
    logprob_teacher: [B,T] float self-teacher (privileged context) log-prob of it.
    step_id: [B,T] int step of each token, −1 outside steps.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    beta: β, coefficient of the weighted support.
    window: static W.
    decay: λ.
    eta: η.
    kappa: κ.
    tau: τ.
    group_std: static, "unbiased" | "population" | "none".
    eps: added to the group std.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = pcsd_advantages(reward=np.array([1.0, 0.0]), group_id=np.zeros(2, np.int32),
    ...     response_mask=np.ones((2, 2), bool), logprob_old=np.full((2, 2), -1.0),
    ...     logprob_teacher=np.array([[-0.6, -0.8]] * 2), step_id=np.zeros((2, 2), np.int32),
    ...     num_groups=1, group_std="none")          # Â = ±0.5, s = [0.4, 0.2]
    >>> np.round(np.asarray(a, np.float64), 4).tolist()
    [[0.8523, 0.6322], [-0.1477, -0.3678]]
  """
  rows, adv_B = grpo_rows("pcsd_advantages", reward, group_id, response_mask, num_groups,
                          group_size, group_std, eps)
  per = pcsd_persistence(response_mask=rows.mask, logprob_old=logprob_old,
                         logprob_teacher=logprob_teacher, step_id=step_id, window=window,
                         decay=decay, eta=eta, kappa=kappa, tau=tau)
  out_BT = adv_B[:, None] + jnp.asarray(beta, jnp.float32) * per.weight * per.support
  return jax.lax.stop_gradient(jnp.where(rows.mask, out_BT, 0.0))
