"""ABSeeker (ABC): clue-anchored step scores as GRPO turn rewards (ABC-GRPO) and SFT weights."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["abseeker_advantages", "abseeker_sft_weights"]

_PAPER = ("ABSeeker: Training Long-Horizon Search Agents via Answer-Backtracked Credit "
          "Assignment (seed abstract, no arXiv id in the seed), "
          "https://huggingface.co/papers?q=ABSeeker")


@register_estimator("abseeker", needs=("reward", "step_reward", "step_mask", "turn_id",
                                       "group_id", "response_mask"),
                    paper=_PAPER, static_argnames=("num_groups",))
def abseeker_advantages(*, reward: ArrayLike, step_reward: ArrayLike, step_mask: ArrayLike,
                        turn_id: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                        num_groups: int, outcome_coef: ArrayLike = 1.0,
                        eps: float = 1e-6) -> Array:
  """ABC-GRPO: step scores (plus the outcome on the last step) as group-normalised rewards.

  Confidence: inferred (seed abstract; spec distill_and_structure.md B14, "choice").

  .. math::
    ρ_{b,k} = c_{b,k} + w·R_b·[k = last valid turn of b]
    A_{b,k} = (ρ_{b,k} − μ_g^ρ)/(σ_g^ρ + eps)

  `c` = `step_reward` is the clue-anchored step score in [0,1] (a judge compares each search
  step with the clues recovered backward from the gold answer); μ, σ pool every valid turn of
  every row of the prompt group (unbiased std; fewer than two turns → 0). Useful steps of
  failed trajectories keep positive credit (intended by the paper). w = `outcome_coef`.

  Measured on the credit bench's `pivotal` (2026-12-06, an exact judge, one turn per
  character): each step is z-scored on its own (no returns), and the outcome goes to the
  last step, here the stop token, not the answer. In a mixed group a right row's stop token
  gets +2.9 and its right digit +0.2, a wrong digit −2.5 (hence pivot mass 0.49); in an
  all-right group the right digit is pushed down (−0.4). The policy learns to stop early
  (length 7 → 3.4, held-out accuracy 0.39 → 0.17 after 750 steps, one seed); with
  `outcome_coef=0` length holds and it reaches 0.31. The formula is the spec's choice from
  the abstract; it assumes the last step is the answer.

  Args:
    reward: [B] outcome R; step_reward: [B,K] step score; step_mask: [B,K] bool.
    turn_id: [B,T] int (−1 outside turns); group_id: [B]; num_groups: static.
    response_mask: [B,T] bool.
    outcome_coef: weight w of the outcome added to the last step (1).
    eps: added to the std.

  Returns:
    [B,T] float32; tokens of turn k get A_{b,k}, 0 elsewhere.
  """
  rows = ops.group_rows("abseeker_advantages", reward, group_id, num_groups,
                        response_mask=response_mask)
  c_BK = jnp.asarray(step_reward, jnp.float32)
  valid_BK = jnp.asarray(step_mask, bool) & rows.valid[:, None]
  tid = jnp.asarray(turn_id, jnp.int32)
  chex.assert_equal_shape([c_BK, valid_BK])
  chex.assert_equal_shape([tid, rows.mask])
  last_BK = valid_BK & (ops.turn_counts(valid_BK) == 1.0)
  rho_BK = jnp.where(valid_BK, c_BK, 0.0) + outcome_coef * jnp.where(
      last_BK, rows.values[:, None], 0.0)
  adv_BK = ops.turn_normalize(rho_BK, valid_BK, rows.group_id, num_groups, ddof=1, eps=eps)
  return ops.turn_broadcast(adv_BK, tid, rows.mask)


def abseeker_sft_weights(*, step_reward: ArrayLike, step_mask: ArrayLike, turn_id: ArrayLike,
                         response_mask: ArrayLike) -> Array:
  """ABC-SFT per-token NLL weights: each turn's score over the row's mean score (mean 1).

  Confidence: inferred (spec distill_and_structure.md B14: `w_{b,k} = c_{b,k} / mean_k c_b`).

  A row whose valid scores are all 0 (or that has no valid turn) gets weight 1 on every
  policy token (plain SFT); policy tokens outside any turn also get 1.

  Args:
    step_reward: [B,K] step scores c ≥ 0; step_mask: [B,K] bool; turn_id: [B,T] int;
    response_mask: [B,T] bool.

  Returns:
    [B,T] float32 weights, 0 outside `response_mask`.

  >>> import numpy as np
  >>> w = abseeker_sft_weights(step_reward=np.array([[1., 0., .5]]),
  ...     step_mask=np.ones((1, 3), bool), turn_id=np.array([[0, 1, 2]]),
  ...     response_mask=np.ones((1, 3), bool))
  >>> [round(float(v), 4) for v in w[0]]
  [2.0, 0.0, 1.0]
  """
  mask_BT = jnp.asarray(response_mask, bool)
  c_BK = jnp.asarray(step_reward, jnp.float32)
  valid_BK = jnp.asarray(step_mask, bool) & jnp.any(mask_BT, axis=1)[:, None]
  chex.assert_equal_shape([c_BK, valid_BK])
  c_BK = jnp.where(valid_BK, c_BK, 0.0)
  n_B = jnp.sum(valid_BK, axis=1).astype(jnp.float32)
  mean_B = jnp.sum(c_BK, axis=1) / jnp.maximum(n_B, 1.0)
  ok_B = mean_B > 0
  w_BK = jnp.where(ok_B[:, None], c_BK / jnp.where(ok_B, mean_B, 1.0)[:, None], 1.0)
  tid = jnp.asarray(turn_id, jnp.int32)
  in_turn = (tid >= 0) & (tid < c_BK.shape[1])
  w_BT = jnp.where(in_turn, ops.turn_broadcast(w_BK, tid), 1.0)
  return jnp.where(mask_BT, w_BT, 0.0)
