"""OPRL (iStar): implicit-PRM turn rewards from a trajectory-DPO PRM + episode GRPO advantage."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["oprl_advantages", "oprl_prm_loss"]

_PAPER = ("Online Process Reward Learning for Agentic Reinforcement Learning (OPRL / iStar), "
          "arXiv 2509.19199")


@register_estimator("oprl", needs=("logprob_prm", "logprob_old", "reward", "step_mask",
                                   "turn_id", "group_id", "response_mask"),
                    paper=_PAPER, static_argnames=("num_groups",),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def oprl_advantages(*, logprob_prm: ArrayLike, logprob_old: ArrayLike, reward: ArrayLike,
                    step_mask: ArrayLike, turn_id: ArrayLike, group_id: ArrayLike,
                    response_mask: ArrayLike, num_groups: int, beta: ArrayLike = 0.05,
                    step_coef: ArrayLike = 1.0, eps: float = 1e-6) -> Array:
  """OPRL step + episode advantage (a step is a turn).

  An implicit PRM, trained online with trajectory-level DPO on (success, failure) pairs,
  gives each turn the sum of its log-ratio to the rollout policy::

    r[b,k]   = β Σ_{t ∈ turn k} (log π_φ(y_t) − log π_old(y_t))
    A_S[b,k] = (r[b,k] − μ_g^r) / (σ_g^r + eps)      (all valid turns of the group)
    A_E[b]   = (R_b − μ_g) / (σ_g + eps)
    A[b,k]   = A_E[b] + α A_S[b,k]

  with population stds. Observation tokens never enter the sums; policy tokens outside any
  turn get A_E only; groups with fewer than two turns or rows give 0 for that part. In the
  runner `logprob_prm` comes from producer `implicit_prm_old`, a PRM trained with
  `oprl_prm_loss`'s objective against `logprob_old`.

  Paper: "Online Process Reward Learning for Agentic Reinforcement Learning" (OPRL /
  iStar), arXiv 2509.19199. The implicit reward and the PRM objective follow the paper;
  the step / episode combination and α = 1 are this library's.

  Args:
    logprob_prm: [B,T] implicit PRM log-probs of the sampled tokens.
    logprob_old: [B,T] log-probs of the policy that generated the rollouts.
    reward: [B] outcome.
    step_mask: [B,K] bool.
    turn_id: [B,T] int (−1 outside turns).
    group_id: [B] int prompt group.
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    beta: β of the implicit reward (the z-score makes A_S nearly invariant to it).
    step_coef: α.
    eps: added to the std.

  Returns:
    [B,T] float32, 0 outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> tid = np.array([[0, 0, 1, 1]] * 2, np.int32)
    >>> a = oprl_advantages(logprob_prm=np.array([[-.5, -.5, -1., -1.], [-1., -1., -.5, -.5]]),
    ...     logprob_old=np.full((2, 4), -1.), reward=np.array([1., 0.]),
    ...     step_mask=np.ones((2, 2), bool), turn_id=tid, group_id=np.zeros(2, np.int32),
    ...     response_mask=np.ones((2, 4), bool), num_groups=1)
    >>> (np.round(np.asarray(a, np.float64), 4) + 0.0).tolist()
    [[2.0, 2.0, 0.0, 0.0], [-2.0, -2.0, 0.0, 0.0]]
  """
  rows = ops.group_rows("oprl_advantages", reward, group_id, num_groups,
                        response_mask=response_mask)
  mask_BT = rows.mask
  lp, lr = jnp.asarray(logprob_prm, jnp.float32), jnp.asarray(logprob_old, jnp.float32)
  tid = jnp.asarray(turn_id, jnp.int32)
  chex.assert_equal_shape([lp, lr, tid, mask_BT])
  valid_BK = jnp.asarray(step_mask, bool) & rows.valid[:, None]
  K = valid_BK.shape[1]
  ratio_BT = jnp.where(mask_BT, lp - lr, 0.0)
  r_BK = beta * ops.turn_reduce(ratio_BT, tid, K, mask=mask_BT)
  step_BK = ops.turn_normalize(r_BK, valid_BK, rows.group_id, num_groups, ddof=0, eps=eps)
  ep_B = ops.turn_normalize(rows.values[:, None], rows.valid[:, None], rows.group_id,
                            num_groups, ddof=0, eps=eps)[:, 0]
  adv_BT = ops.broadcast_to_tokens(ep_B, mask_BT) + step_coef * ops.turn_broadcast(
      step_BK, tid, mask_BT)
  return jnp.where(mask_BT, adv_BT, 0.0)


def oprl_prm_loss(*, logprob_prm: ArrayLike, logprob_old: ArrayLike, response_mask: ArrayLike,
                  pairs: ArrayLike, pair_mask: ArrayLike | None = None,
                  beta: ArrayLike = 0.05) -> Array:
  """Trajectory-level DPO loss of the implicit PRM (OPRL).

  ::

    L = −mean_p log σ(β [Σ_t ℓ[w_p,t] − Σ_t ℓ[l_p,t]]),   ℓ = log π_φ − log π_old on policy tokens

  Args:
    logprob_prm: [B,T] PRM log-probs (the trained model; gradients flow here).
    logprob_old: [B,T] reference log-probs (treated as constants).
    response_mask: [B,T] bool policy tokens (observations excluded).
    pairs: [P,2] int rows (preferred, rejected), e.g. a success and a failure of one prompt.
    pair_mask: optional [P] bool, pairs that count (padding pairs off).
    beta: β.

  Returns:
    scalar float32 loss (0 when no pair counts).

  Example:
    >>> import numpy as np
    >>> round(float(oprl_prm_loss(logprob_prm=np.array([[2., -1.], [.5, 1.5]]),
    ...     logprob_old=np.zeros((2, 2)), response_mask=np.ones((2, 2), bool),
    ...     pairs=np.array([[0, 1]]))), 5)
    0.71846
  """
  mask = jnp.asarray(response_mask, bool)
  lp = jnp.asarray(logprob_prm, jnp.float32)
  lr = jax.lax.stop_gradient(jnp.asarray(logprob_old, jnp.float32))
  chex.assert_equal_shape([lp, lr, mask])
  pairs = jnp.asarray(pairs, jnp.int32)
  chex.assert_rank(pairs, 2)
  seq_B = jnp.sum(jnp.where(mask, lp - lr, 0.0), axis=1)
  margin = beta * (seq_B[pairs[:, 0]] - seq_B[pairs[:, 1]])
  w = jnp.ones(pairs.shape[:1]) if pair_mask is None else jnp.asarray(pair_mask, jnp.float32)
  return -jnp.sum(w * jax.nn.log_sigmoid(margin)) / jnp.maximum(jnp.sum(w), 1.0)
