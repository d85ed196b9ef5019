"""PPR ReNorm: process scores calibrated by the outcome (p + o − 1), group-normalised per step."""
from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["ppr_renorm_advantages"]

_PAPER = ("Hybrid Reward Normalization for Process-supervised Non-verifiable Agentic Tasks "
          "(PPR / ReNorm), arXiv 2509.25598")


@register_estimator("ppr_renorm", needs=("step_reward", "step_mask", "reward", "step_id",
                                         "group_id", "response_mask"),
                    paper=_PAPER, static_argnames=("num_groups", "step_returns", "singleton"),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def ppr_renorm_advantages(*, step_reward: ArrayLike, step_mask: ArrayLike, reward: ArrayLike,
                          step_id: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                          num_groups: int, step_returns: bool = False, eps: float = 1e-6,
                          singleton: Literal["zero", "raw"] = "zero") -> Array:
  """PPR ReNorm: process scores calibrated by the outcome (p + o − 1), z-scored over the group's steps.

  ::

    r̃_{i,s} = p_{i,s} + o_i − 1                   (in [−1, 1] for p, o in [0, 1])
    Â_{i,s} = (r̃_{i,s} − μ_g) / (σ_g + ε)         (over every valid step of group g)
    A[i,t]  = Â_{i,s(t)}   or, with `step_returns`, Σ_{s' ≥ s(t)} Â_{i,s'}

  A step of a failed trajectory can never earn a net positive r̃. Rows without any valid
  step fall back to the GRPO z-score of the outcome; tokens of a row with steps that lie
  outside every step get 0; fewer than two valid steps in a group give 0.

  Paper: "Hybrid Reward Normalization for Process-supervised Non-verifiable Agentic
  Tasks", arXiv 2509.25598. The abstract describes normalising the process rewards with the
  outcome; the formula above is this library's reading of it.

  Args:
    step_reward: [B,K] PRM scores p in [0, 1].
    step_mask: [B,K] bool valid steps.
    reward: [B] outcome o in {0, 1}.
    step_id: [B,T] int step of each token (−1 outside).
    group_id: [B] int group ids.
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    step_returns: static; accumulate the step values backwards before scattering them.
    eps: added to σ.
    singleton: the fallback's one-row groups ("zero" | "raw").

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = ppr_renorm_advantages(
    ...     step_reward=np.array([[1., .5], [.5, 0.]]), step_mask=np.ones((2, 2), bool),
    ...     reward=np.array([1., 0.]), step_id=np.array([[0, 0, 1, 1]] * 2, np.int32),
    ...     group_id=np.zeros(2, np.int32), response_mask=np.ones((2, 4), bool), num_groups=1)
    >>> np.round(np.asarray(a, np.float64), 4).tolist()   # r̃ = [[1, .5], [−.5, −1]]
    [[1.0954, 1.0954, 0.5477, 0.5477], [-0.5477, -0.5477, -1.0954, -1.0954]]
  """
  fn = "ppr_renorm_advantages"
  check_choice(fn, "singleton", singleton, ops.SINGLETONS)
  o_B, gid_B, m_BT, valid_B = ops.group_rows(fn, reward, group_id, num_groups,
                                             response_mask=response_mask)
  p_BK = jnp.asarray(step_reward, jnp.float32)
  sid = jnp.asarray(step_id)
  chex.assert_rank([p_BK, sid], 2)
  chex.assert_type(sid, int)
  chex.assert_equal_shape([sid, m_BT])
  chex.assert_equal_shape_prefix([p_BK, o_B], 1)
  sid = sid.astype(jnp.int32)
  K = p_BK.shape[1]
  has_tok = ops.turn_reduce(jnp.zeros(m_BT.shape), sid, K, m_BT, reduce="count") > 0
  v_BK = jnp.asarray(step_mask).astype(bool) & has_tok & valid_B[:, None]
  chex.assert_equal_shape([v_BK, p_BK])
  r_BK = jnp.where(v_BK, p_BK + o_B[:, None] - 1.0, 0.0)
  a_BK = ops.turn_normalize(r_BK, v_BK, gid_B, num_groups, by="pooled", ddof=1, eps=eps,
                            min_count=2, small="zero")
  if step_returns:
    a_BK = ops.turn_returns(a_BK, v_BK)
  step_BT = ops.turn_broadcast(a_BK, sid, m_BT)
  out_B = ops.group_normalize(o_B, gid_B, num_groups, valid=valid_B, eps=eps,
                              singleton=singleton)
  stepless_B = valid_B & ~jnp.any(v_BK, axis=1)
  return jnp.where(stepless_B[:, None], ops.broadcast_to_tokens(out_B, m_BT),
                   jnp.where(valid_B[:, None], step_BT, 0.0))
