"""SCAPO: semifactual stability shrinks the advantage of unstable tokens, annealed over steps."""
from __future__ import annotations

from typing import Literal, NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice, check_int
from credit.advantages.token._redistribute import redistribute
from credit.ops.baselines import GROUP_STDS, sequence_advantage
from credit.registry import register_estimator

Array = jax.Array
_UNROLL_INTERVENTIONS = 8  # up to this many interventions, the mean is unrolled adds

__all__ = ["SCAPOState", "SCAPOOutput", "scapo_init_state", "scapo_stability",
           "scapo_advantages"]

_PAPER = ("SCAPO: semifactual-stability advantage shaping, arXiv preprint (authors' code "
          "announced at https://github.com/DtYXs/SCAPO)")


class SCAPOState(NamedTuple):
  """step: int32 scalar, the number of batches the estimator has seen (drives the anneal)."""
  step: Array


class SCAPOOutput(NamedTuple):
  """`advantages` [B,T] and the updated `state` (step + 1)."""
  advantages: Array
  state: SCAPOState


def scapo_init_state(num_prompts: int = 1) -> SCAPOState:
  """Step 0. `num_prompts` is accepted for the registry's stateful interface and unused."""
  check_int("scapo_init_state", "num_prompts", num_prompts)
  return SCAPOState(step=jnp.zeros((), jnp.int32))


def scapo_stability(*, response_mask: ArrayLike, logprob_old: ArrayLike,
                    logprob_interventions: ArrayLike, eps: ArrayLike = 1e-6) -> Array:
  """Token stability u ∈ [0,1] under M prompt interventions (1 = stable; no gradient).

  ::

    d_t = mean_m abs(exp(ℓ⁽ᵐ⁾_t) − exp(ℓ_t)),      u_t = 1 − (d_t − min d) / (max d − min d + ε)

  min and max run over the valid tokens of the same response; a response whose drift is
  constant (or one token long) gets u = 1 everywhere.

  Args:
    response_mask: [B,T] bool.
    logprob_old: [B,T] float behaviour-policy log-prob of the sampled token.
    logprob_interventions: [B,T,M] float the same under M answer-preserving interventions.
    eps: added to the drift range.

  Returns:
    [B,T] float32 stabilities, 0 outside the mask.
  """
  mask_BT = jnp.asarray(response_mask)
  lp_BT = jnp.asarray(logprob_old, jnp.float32)
  sf_BTM = jnp.asarray(logprob_interventions, jnp.float32)
  chex.assert_rank([mask_BT, lp_BT, sf_BTM], [2, 2, 3])
  chex.assert_equal_shape([mask_BT, lp_BT])
  chex.assert_equal_shape_prefix([sf_BTM, mask_BT], 2)
  mask_BT = mask_BT.astype(bool)
  p_BT = jnp.exp(jnp.where(mask_BT, lp_BT, 0.0))
  p_BTM = jnp.exp(jnp.where(mask_BT[..., None], sf_BTM, 0.0))
  num_m = sf_BTM.shape[-1]
  if num_m <= _UNROLL_INTERVENTIONS:  # adds in one fused pass (XLA CPU would first copy
    total_BT = jnp.abs(p_BTM[..., 0] - p_BT)  # the [B,T,M] |differences| for its reduction)
    for m in range(1, num_m):
      total_BT = total_BT + jnp.abs(p_BTM[..., m] - p_BT)
    drift_BT = total_BT / num_m
  else:
    drift_BT = jnp.mean(jnp.abs(p_BTM - p_BT[..., None]), axis=-1)
  any_B = jnp.any(mask_BT, axis=-1)
  lo_B = jnp.where(any_B, jnp.min(jnp.where(mask_BT, drift_BT, jnp.inf), axis=-1), 0.0)
  hi_B = jnp.where(any_B, jnp.max(jnp.where(mask_BT, drift_BT, -jnp.inf), axis=-1), 0.0)
  rel_BT = (drift_BT - lo_B[:, None]) / (hi_B - lo_B + jnp.asarray(eps, jnp.float32))[:, None]
  u_BT = 1.0 - jnp.clip(rel_BT, 0.0, 1.0)
  return jax.lax.stop_gradient(jnp.where(mask_BT, u_BT, 0.0))


@register_estimator(
    "scapo", needs=("reward", "group_id", "response_mask", "logprob_old",
                    "logprob_interventions"),
    paper=_PAPER, static_argnames=("num_groups", "group_size", "group_std"),
    returns_output=True, init_state=scapo_init_state,
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def scapo_advantages(*, reward: ArrayLike, group_id: ArrayLike | None,
                     response_mask: ArrayLike, logprob_old: ArrayLike,
                     logprob_interventions: ArrayLike, state: SCAPOState, num_groups: int,
                     group_size: int | None = None, shrink: ArrayLike = 0.5,
                     anneal_steps: ArrayLike = 100.0,
                     group_std: Literal["unbiased", "population", "none"] = "unbiased",
                     eps: ArrayLike = 1e-6) -> SCAPOOutput:
  """SCAPO: shrink (never enlarge) the advantage of tokens that drift under semifactual prompts.

  Each response is re-scored under answer-preserving ("semifactual") prompt rewrites;
  tokens whose probability drifts are called unstable and lose part of the GRPO advantage
  Â_b, early in training only::

    u[b,t] = scapo_stability(ℓ, ℓ⁽¹ ⁻ ᴹ⁾) ∈ [0, 1]         (1 = stable)
    λ(k)   = λ₀ · max(0, 1 − k / S)
    A[b,t] = Â_b · (1 − λ(k) (1 − u[b,t]))

  with k the estimator's step counter (`state.step`, one per call). The factor lies in
  [1 − λ₀, 1]: abs(A) ≤ abs(Â), the sign is kept, and there is no renormalisation.
  λ₀ = 0, k ≥ S, or constant drift give GRPO.

  Paper: "SCAPO: semifactual-stability advantage shaping" (arXiv preprint). The abstract
  gives the idea but no equation or defaults: the formula, λ₀ = 0.5 and S = 100 are this
  library's reading of it.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int group ids (unused, may be None, with `group_size`).
    response_mask: [B,T] bool, the policy's tokens.
    logprob_old: [B,T] float behaviour-policy log-prob of the sampled token.
    logprob_interventions: [B,T,M] float log-probs of the same tokens under M ≥ 1
      answer-preserving prompt interventions.
    state: `SCAPOState` (from `scapo_init_state`).
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    shrink: λ₀ ∈ [0,1].
    anneal_steps: S (≤ 0: no shrinking).
    group_std: static, "unbiased" | "population" | "none".
    eps: added to the group std and to the drift range.

  Returns:
    SCAPOOutput(advantages [B,T] float32 zero outside the mask, state with step + 1).

  Example:
    >>> import numpy as np
    >>> out = scapo_advantages(
    ...     reward=np.array([1., 0.]), group_id=np.zeros(2, np.int32),
    ...     response_mask=np.ones((2, 2), bool), logprob_old=np.zeros((2, 2), np.float32),
    ...     logprob_interventions=np.log(np.array([[[1., 1.], [.5, .5]]] * 2, np.float32)),
    ...     state=scapo_init_state(), num_groups=1, group_std="population")
    >>> np.round(np.asarray(out.advantages, np.float64), 3).tolist(), int(out.state.step)
    ([[1.0, 0.5], [-1.0, -0.5]], 1)
  """
  check_choice("scapo_advantages", "group_std", group_std, GROUP_STDS)
  rows = ops.group_rows("scapo_advantages", reward, group_id, num_groups, group_size,
                        response_mask=response_mask)
  adv_B = sequence_advantage(rows.values, rows.group_id, rows.valid, num_groups=num_groups,
                             group_size=group_size, group_std=group_std, eps=eps)
  u_BT = scapo_stability(response_mask=rows.mask, logprob_old=logprob_old,
                         logprob_interventions=logprob_interventions, eps=eps)
  step = jnp.asarray(state.step)
  chex.assert_rank(step, 0)
  total = jnp.asarray(anneal_steps, jnp.float32)
  frac = jnp.where(total > 0, step.astype(jnp.float32) / jnp.where(total > 0, total, 1.0), 1.0)
  lam = jnp.asarray(shrink, jnp.float32) * jnp.maximum(1.0 - frac, 0.0)
  w_BT = jnp.where(rows.mask, 1.0 - lam * (1.0 - u_BT), 0.0)
  adv_BT = redistribute(adv_B, jax.lax.stop_gradient(w_BT), rows.mask, renormalize=False)
  return SCAPOOutput(advantages=adv_BT, state=SCAPOState(step=step + 1))
