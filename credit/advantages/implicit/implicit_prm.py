"""Implicit PRM step rewards and solution scores (a reward producer; no registry key).

The implicit PRM of "Free Process Rewards without Process Labels" (Yuan et al., arXiv
2412.01981) is trained with `credit.losses.prm_*_loss`; this module reads process rewards
off it. Its per-step rewards [B,K] (with `step_mask`) fill the contract's `step_reward`, so
any turn/step-level estimator can consume them; the solution score ranks best-of-N samples.
"""
from __future__ import annotations

from typing import Literal, NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice, check_int

Array = jax.Array

__all__ = ["ImplicitStepRewards", "implicit_prm_step_rewards", "implicit_prm_score"]

_AGGREGATIONS = ("min", "sum")
_VALUES = ("step", "cumulative")


class ImplicitStepRewards(NamedTuple):
  """step_reward: [B,K] r_k; step_value: [B,K] q at the end of step k (running sum of r);
  step_mask: [B,K] bool, steps with at least one valid token. Zero where the mask is 0."""
  step_reward: Array
  step_value: Array
  step_mask: Array


def implicit_prm_step_rewards(*, logprob_prm: ArrayLike, logprob_ref: ArrayLike | None,
                              response_mask: ArrayLike, step_id: ArrayLike, num_steps: int,
                              coef: ArrayLike = 0.001) -> ImplicitStepRewards:
  """Per-step implicit process rewards r_k = c Σ_{t ∈ step k} (log π_φ − log π_ref)(y_t).

  ::

    r_k = c Σ_{t: step_id_t = k, valid} (log π_φ(y_t) − log π_ref(y_t)),   q_k = Σ_{j ≤ k} r_j

  The released evaluation of ImplicitPRM (PRIME-RL/ImplicitPRM `eval/prm_eval_utils.py`)
  uses c = 0.001, not the training β = 0.05; `logprob_ref=None` is the reference-free
  variant. Difference from that code: steps are given by `step_id`, so tokens outside every
  step count for none (the code's cumulative sum gives tokens between two step ends to the
  later step); a step with no valid token has r = 0 and `step_mask` False.

  Args:
    logprob_prm: [B,T] float PRM log-prob of the sampled tokens.
    logprob_ref: [B,T] float reference log-probs, or None (reference-free).
    response_mask: [B,T] bool.
    step_id: [B,T] int step of each token in [0, num_steps), −1 outside.
    num_steps: static K.
    coef: c.

  Returns:
    `ImplicitStepRewards` of [B,K] arrays.
  """
  check_int("implicit_prm_step_rewards", "num_steps", num_steps)
  mask = jnp.asarray(response_mask)
  prm = jnp.asarray(logprob_prm, jnp.float32)
  sid = jnp.asarray(step_id)
  arrays = [mask, prm, sid]
  if logprob_ref is not None:
    arrays.append(jnp.asarray(logprob_ref, jnp.float32))
  chex.assert_rank(arrays, 2)
  chex.assert_equal_shape(arrays)
  chex.assert_type(sid, int)
  mask = mask.astype(bool)
  lr = prm if logprob_ref is None else prm - arrays[3]
  lr = jnp.where(mask, lr, 0.0)
  r_BK = jnp.asarray(coef, jnp.float32) * ops.turn_reduce(lr, sid, num_steps, mask)
  ok_BK = ops.turn_reduce(lr, sid, num_steps, mask, reduce="count") > 0
  r_BK = jnp.where(ok_BK, r_BK, 0.0)
  q_BK = jnp.where(ok_BK, jnp.cumsum(r_BK, axis=-1), 0.0)
  return ImplicitStepRewards(step_reward=r_BK, step_value=q_BK, step_mask=ok_BK)


def implicit_prm_score(*, logprob_prm: ArrayLike, logprob_ref: ArrayLike | None,
                       response_mask: ArrayLike, step_id: ArrayLike, num_steps: int,
                       coef: ArrayLike = 0.001,
                       aggregation: Literal["min", "sum"] = "min",
                       value: Literal["step", "cumulative"] = "step") -> Array:
  """Solution score of the implicit PRM: min or sum over steps (best-of-N ranking).

  `value="step"` aggregates r_k, `"cumulative"` aggregates q_k (its "min" is the lowest
  running value), as ImplicitPRM's `manipulate_rewards` does. Rows without a valid step
  score 0.

  Args:
    logprob_prm: [B,T] float PRM log-prob of the sampled tokens.
    logprob_ref: [B,T] float reference log-probs, or None.
    response_mask: [B,T] bool.
    step_id: [B,T] int step of each token, −1 outside.
    num_steps: static K.
    coef: c.
    aggregation: static, "min" | "sum".
    value: static, "step" | "cumulative".

  Returns:
    [B] float32 scores.
  """
  check_choice("implicit_prm_score", "aggregation", aggregation, _AGGREGATIONS)
  check_choice("implicit_prm_score", "value", value, _VALUES)
  out = implicit_prm_step_rewards(logprob_prm=logprob_prm, logprob_ref=logprob_ref,
                                  response_mask=response_mask, step_id=step_id,
                                  num_steps=num_steps, coef=coef)
  x_BK = out.step_reward if value == "step" else out.step_value
  ok_BK = out.step_mask
  if aggregation == "sum":
    return jnp.sum(jnp.where(ok_BK, x_BK, 0.0), axis=-1)
  low_B = jnp.min(jnp.where(ok_BK, x_BK, jnp.inf), axis=-1)
  return jnp.where(jnp.any(ok_BK, axis=-1), low_B, 0.0)
