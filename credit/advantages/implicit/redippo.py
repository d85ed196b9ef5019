"""ReDiPPO: GAE on a reference-guided critic, tokens reweighted by its disagreement with a standard critic."""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["RedippoOutput", "redippo_advantages", "redippo_weights"]

_PAPER = ("ReDiPPO: Reference-Guided Value Calibration and Discrepancy-Aware Token Reweighting "
          "for Mathematical Reasoning (authors' code announced at "
          "https://github.com/cii030/ReDiPPO)")
WHITEN_MODES = ("before", "after", "none")
_EPS = 1e-8


class RedippoOutput(NamedTuple):
  """`advantages` [B,T] (weighted, whitened per `whiten`), value targets `returns` [B,T] for
  both critics, and the token weights `weights` [B,T]; all zero outside the mask."""
  advantages: Array
  returns: Array
  weights: Array


def redippo_weights(*, values: ArrayLike, values_ref: ArrayLike, response_mask: ArrayLike,
                    beta: ArrayLike = 0.5, w_min: ArrayLike = 0.0,
                    w_max: ArrayLike = 3.0) -> Array:
  """ReDiPPO's token weights from the gap between the two critics.

  ::

    d_t = abs(V^ref_t − V^std_t),    w_t = clip(1 + β d_t / (mean d + 1e-8), w_min, w_max)

  The mean runs over every valid token of the batch (not per row). Where the critics
  agree everywhere every weight is exactly 1.

  Args:
    values: [B,T] standard critic values V^std (masked positions ignored, even NaN).
    values_ref: [B,T] reference-guided critic values V^ref.
    response_mask: [B,T] bool.
    beta: β (may be traced).
    w_min: lower clip of the weights.
    w_max: upper clip of the weights.

  Returns:
    [B,T] float32 weights, 0 outside the mask.

  Example:
    >>> import numpy as np
    >>> w = redippo_weights(values=np.array([[.5, .6, .2]]), values_ref=np.array([[.5, .9, .1]]),
    ...                     response_mask=np.ones((1, 3), bool))
    >>> np.round(np.asarray(w, np.float64), 4).tolist()
    [[1.0, 2.125, 1.375]]
  """
  v_BT = jnp.asarray(values, jnp.float32)
  vr_BT = jnp.asarray(values_ref, jnp.float32)
  mask_BT = jnp.asarray(response_mask)
  chex.assert_rank([v_BT, vr_BT, mask_BT], 2)
  chex.assert_equal_shape([v_BT, vr_BT, mask_BT])
  mask_BT = mask_BT.astype(bool)
  # `where` before the subtraction: NaN padding never reaches d (nor its gradient).
  d_BT = jnp.abs(jnp.where(mask_BT, vr_BT, 0.0) - jnp.where(mask_BT, v_BT, 0.0))
  scale = ops.masked_mean(d_BT, mask_BT) + _EPS
  w_BT = jnp.clip(1.0 + jnp.asarray(beta, jnp.float32) * d_BT / scale,
                  jnp.asarray(w_min, jnp.float32), jnp.asarray(w_max, jnp.float32))
  return jnp.where(mask_BT, w_BT, 0.0)


@register_estimator("redippo", needs=("reward", "values", "values_ref", "response_mask"),
                    paper=_PAPER, static_argnames=("whiten",), returns_output=True,
                    optional_needs={"logprob_old": "kl_coef", "logprob_ref": "kl_coef"},
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def redippo_advantages(*, reward: ArrayLike, values: ArrayLike, values_ref: ArrayLike,
                       response_mask: ArrayLike, logprob_old: ArrayLike | None = None,
                       logprob_ref: ArrayLike | None = None,
                       token_reward: ArrayLike | None = None, gamma: float = 1.0,
                       lam: float = 0.95, kl_coef: float = 0.0, beta: ArrayLike = 0.5,
                       w_min: ArrayLike = 0.0, w_max: ArrayLike = 3.0,
                       whiten: str = "before") -> RedippoOutput:
  """ReDiPPO: GAE with the reference-guided critic, reweighted by the critics' disagreement.

  A critic that sees the reference answer (a training-time privileged signal) gives the
  values; a standard critic is kept beside it, and where the two disagree the token is a
  hard reasoning state whose advantage is enlarged::

    Â, returns = GAE_{γ,λ}(r, V^ref)                       (`gae_advantages`)
    w_t = `redippo_weights`(V^std, V^ref)
    A_t = w_t · whiten(Â)_t   ("before", default)
        = whiten(w · Â)_t     ("after")
        = w_t · Â_t           ("none")

  Regress both critics on `returns` (e.g. `credit.losses.value_loss` once with `values`,
  once with `values_ref`). When the critics agree the result is `gae_advantages` on
  `values_ref`. The weights, like the whitening, use statistics of the whole batch.

  Paper: "ReDiPPO: Reference-Guided Value Calibration and Discrepancy-Aware Token
  Reweighting for Mathematical Reasoning". The abstract names the two critics and the
  discrepancy reweighting but gives no equation: which critic drives GAE, the clipped
  affine weight, the place of the whitening and every default are this library's.

  Args:
    reward: [B] outcome rewards.
    values: [B,T] standard critic values V^std.
    values_ref: [B,T] reference-guided critic values V^ref.
    response_mask: [B,T] bool.
    logprob_old: optional [B,T] behaviour log-probs (KL-in-reward, with `logprob_ref`).
    logprob_ref: optional [B,T] reference log-probs.
    token_reward: optional [B,T] dense rewards.
    kl_coef: β of the KL-in-reward term.
    gamma: GAE discount (may be traced).
    lam: GAE λ (may be traced).
    beta: weight strength (may be traced).
    w_min: lower clip of the weights.
    w_max: upper clip of the weights.
    whiten: static, "before" | "after" | "none".

  Returns:
    RedippoOutput(advantages [B,T], returns [B,T], weights [B,T]); zero outside the mask.

  Example:
    >>> import numpy as np
    >>> out = redippo_advantages(reward=np.array([1.]), values=np.array([[.5, .6, .2]]),
    ...                          values_ref=np.array([[.5, .9, .1]]),
    ...                          response_mask=np.ones((1, 3), bool), whiten="none")
    >>> [np.round(np.asarray(x, np.float64), 4).tolist() for x in out]
    [[[0.4522, 0.1169, 1.2375]], [[0.9523, 0.955, 1.0]], [[1.0, 2.125, 1.375]]]
  """
  check_choice("redippo_advantages", "whiten", whiten, WHITEN_MODES)
  v_BT = jnp.asarray(values, jnp.float32)
  vr_BT = jnp.asarray(values_ref, jnp.float32)
  chex.assert_rank([v_BT, vr_BT], 2)
  chex.assert_equal_shape([v_BT, vr_BT])
  gae = ops.gae("redippo_advantages", reward=reward, values=vr_BT, response_mask=response_mask,
                logprob_old=logprob_old, logprob_ref=logprob_ref, token_reward=token_reward,
                gamma=gamma, lam=lam, kl_coef=kl_coef, whiten=whiten == "before")
  w_BT = redippo_weights(values=v_BT, values_ref=vr_BT, response_mask=response_mask,
                         beta=beta, w_min=w_min, w_max=w_max)
  adv_BT = w_BT * gae.advantages
  if whiten == "after":
    adv_BT = ops.masked_whiten(adv_BT, jnp.asarray(response_mask).astype(bool))
  return RedippoOutput(advantages=adv_BT, returns=gae.returns, weights=w_BT)
