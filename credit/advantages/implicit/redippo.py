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
          "for Mathematical Reasoning, https://github.com/cii030/ReDiPPO")
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
  """ReDiPPO's token weights from the gap between the two critics (spec §24, ours).

  .. math::
    d_t = |V^{ref}_t − V^{std}_t|,    w_t = clip(1 + β·d_t / (mean_M d + 1e-8), w_min, w_max)

  mean_M is the mean over every valid token of the batch (not per row). Where the critics
  agree everywhere (d ≡ 0) every weight is exactly 1.

  Args:
    values: [B,T] standard critic values V^std (masked positions ignored, even NaN).
    values_ref: [B,T] reference-guided critic values V^ref.
    response_mask: [B,T] bool.
    beta, w_min, w_max: β and the clip range (0.5, 0, 3: the spec's, the paper's unknown);
      may be traced.

  Returns:
    [B,T] float32 weights, 0 outside the mask.

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
                    optional_needs={"logprob_old": "kl_coef", "logprob_ref": "kl_coef"})
def redippo_advantages(*, reward: ArrayLike, values: ArrayLike, values_ref: ArrayLike,
                       response_mask: ArrayLike, logprob_old: ArrayLike | None = None,
                       logprob_ref: ArrayLike | None = None,
                       token_reward: ArrayLike | None = None, gamma: float = 1.0,
                       lam: float = 0.95, kl_coef: float = 0.0, beta: ArrayLike = 0.5,
                       w_min: ArrayLike = 0.0, w_max: ArrayLike = 3.0,
                       whiten: str = "before") -> RedippoOutput:
  """ReDiPPO: GAE with the reference-guided critic, reweighted by the critics' disagreement.

  Paper: "ReDiPPO: Reference-Guided Value Calibration and Discrepancy-Aware Token
  Reweighting for Mathematical Reasoning" (no arXiv id located; code announced at
  https://github.com/cii030/ReDiPPO). Spec: `shared/methods/outcome_and_clipping.md` §24
  (GAE as §5).

  Confidence: inferred (from the abstract). The repository cii030/ReDiPPO could not be
  read here (not in the code index and no snapshot obtainable), and no paper text with
  equations was found, so the formulas below are the spec's proposal, not the authors'
  equations. What the abstract states: a critic that sees the reference
  answer as a training-time privileged signal gives the values; a standard critic is kept;
  their token-level discrepancy marks hard reasoning states and reweights the token
  advantages inside PPO. Ours: which critic drives GAE (the reference-guided one), the
  normalised affine weight and its clip, where whitening sits, and every default.

  .. math::
    Â, returns = GAE_{γ,λ}(r, V^{ref})                      (`gae_advantages`, §5)
    d_t = |V^{ref}_t − V^{std}_t|
    w_t = clip(1 + β·d_t / (mean_M d + 1e-8), w_min, w_max)  (`redippo_weights`)
    A_t = w_t·whiten_M(Â)_t   ("before", default)
        = whiten_M(w·Â)_t     ("after")
        = w_t·Â_t             ("none")

  Regress both critics on `returns` (e.g. `credit.losses.value_loss`, once with `values`,
  once with `values_ref`). With d ≡ 0 (the critics agree) w = 1 and the result is
  `gae_advantages(values=values_ref, whiten=whiten != "none")` exactly. The mean of d is
  over all valid tokens of the batch, so the weights (like whitening) are batch-coupled.

  Args:
    reward: [B] outcome rewards.
    values: [B,T] standard critic values V^std (contract `values`).
    values_ref: [B,T] reference-guided critic values V^ref (contract `values_ref`).
    response_mask: [B,T] bool.
    logprob_old, logprob_ref, token_reward, kl_coef: KL-in-reward and dense rewards, as
      `gae_advantages`.
    gamma, lam: GAE discount and λ (1, 0.95: spec); may be traced.
    beta, w_min, w_max: weight strength and clip range (0.5, 0, 3: spec); may be traced.
    whiten: static; "before" (whiten Â over valid tokens, then weight), "after" (weight,
      then whiten) or "none".

  Returns:
    RedippoOutput(advantages [B,T], returns [B,T], weights [B,T]); zero outside the mask.

  Example (r = [0, 0, 1], V^ref = [.5, .9, .1], V^std = [.5, .6, .2]): Â = [0.45225, 0.055,
  0.9], d = [0, 0.3, 0.1], w = [1, 2.125, 1.375]:

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
