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
                    paper=_PAPER, static_argnames=("num_groups",))
def oprl_advantages(*, logprob_prm: ArrayLike, logprob_old: ArrayLike, reward: ArrayLike,
                    step_mask: ArrayLike, turn_id: ArrayLike, group_id: ArrayLike,
                    response_mask: ArrayLike, num_groups: int, beta: ArrayLike = 0.05,
                    step_coef: ArrayLike = 1.0, eps: float = 1e-6) -> Array:
  """OPRL step + episode advantage (a step is a turn).

  Confidence: inferred (abstract; spec token_and_implicit.md §19, example reproduced; no
  released code: the Tongyi-ConvAI CharacterRL-iStar README has none). Third-party summaries
  of arXiv 2509.19199 agree on r = β log π_φ(a_t)/π_old(a_t) and the trajectory-DPO PRM
  objective; the step/episode combination weights are ours.

  .. math::
    r_{b,k} = β Σ_{t ∈ turn k} (log π_φ(y_t) − log π_old(y_t))
    A^S_{b,k} = (r_{b,k} − μ_g^r)/(σ_g^r + eps)     (all valid turns of the group, population σ)
    A^E_b = (R_b − μ_g)/(σ_g + eps)                  (population σ, as the spec's example)
    A_{b,k} = A^E_b + α·A^S_{b,k}

  `logprob_prm` is the implicit PRM's log-prob of the sampled tokens, `logprob_old` the
  policy snapshot that generated the rollouts (the PRM's reference). Observation tokens
  (outside `response_mask`) never enter the sums. Policy tokens outside any turn get A^E only.
  Groups with fewer than two turns / rows give 0 for that part.

  In the runner, `logprob_prm` comes from producer `implicit_prm_old`: a copy of the policy
  trained each step with `oprl_prm_loss`'s objective on every (success, failure) pair of a
  prompt group, against `logprob_old` (`experiments/learners.py` `prm_pair_dpo_loss`,
  `c.prm.objective=auto`). Until 2026-12-06 it got PRIME's learner instead (cross-entropy on
  the outcome labels, against the frozen reference): on the credit bench's `pivotal`, with
  ~90% of the labels 0, that PRM came to score the policy's new samples positive
  (`prm_accuracy` → 0), and since A^S is z-scored within every group, all-failure groups
  included, the policy chased it: held-out accuracy 0.39 → 0.00 in 150 steps. With the
  trajectory-DPO PRM against π_old: 0.30 / 0.36 / 0.36 at steps 50 / 100 / 150 (GRPO 0.38).

  Args:
    logprob_prm, logprob_old: [B,T] log-probs; reward: [B]; step_mask: [B,K] bool;
    turn_id: [B,T] int (−1 outside turns); group_id: [B]; num_groups: static;
    response_mask: [B,T] bool.
    beta: β of the implicit reward (0.05; the z-score makes A^S almost invariant to it).
    step_coef: α (1).
    eps: added to the std.

  Returns:
    [B,T] float32, 0 outside `response_mask`.
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

  Confidence: inferred (spec token_and_implicit.md §19).

  .. math::
    L = −mean_p log σ(β[Σ_t ℓ_{w_p,t} − Σ_t ℓ_{l_p,t}]),  ℓ = log π_φ − log π_old on policy tokens

  Args:
    logprob_prm: [B,T] PRM log-probs (the trained model; gradients flow here).
    logprob_old: [B,T] reference log-probs (treated as constants).
    response_mask: [B,T] bool policy tokens (observations excluded).
    pairs: [P,2] int rows (preferred, rejected), e.g. a success and a failure of one prompt.
    pair_mask: optional [P] bool, pairs that count (padding pairs off).
    beta: β (0.05).

  Returns:
    scalar float32 loss (0 when no pair counts).

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
