"""SLATE's step objective: one clipped ratio per candidate step, averaged over candidates,
then steps, then prompts."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.advantages.tree.slate import slate_node_ids
from credit.losses.aggregation import F32
from credit.losses.policy._common import policy_inputs, seq_len, seq_mean, seq_ratio_metrics
from credit.losses.policy.a2tgpo import dense_group_ids
from credit.losses.reduction import POLICY_NEEDS, STATIC_ARGNAMES, TokenLoss, _full_loss
from credit.registry import register_policy_loss

__all__ = ["slate_step_loss"]

Array = jax.Array

_NAME = "slate_step"
_PAPER = ("Truncated Step-Level Sampling with Process Rewards for Retrieval-Augmented "
          "Reasoning (SLATE), arXiv preprint; code "
          "https://github.com/algoprog/SLATE")
_TREE_FIELDS = ("parent_id", "prefix_len", "group_id")


def _step_weights(m_BT: Array, parent_id, prefix_len, group_id) -> Array:
  """[B] 1/(k_node · S_prompt · P) on non-empty rows, 0 elsewhere (see `slate_step_loss`)."""
  B = m_BT.shape[0]
  valid = jnp.any(m_BT, axis=1)
  par = jnp.full((B,), -1, jnp.int32) if parent_id is None else jnp.asarray(parent_id, jnp.int32)
  pre = jnp.zeros((B,), jnp.int32) if prefix_len is None else jnp.asarray(prefix_len, jnp.int32)
  gid = jnp.zeros((B,), jnp.int32) if group_id is None else jnp.asarray(group_id, jnp.int32)
  chex.assert_shape([par, pre, gid], (B,))
  dg = dense_group_ids(gid, valid)                       # prompt of each row, in [0, B)
  node = slate_node_ids(par, pre, dg)                    # [0, B) children, B + prompt roots
  node = jnp.where(valid, node, 2 * B)                   # invalid rows: their own bucket
  idx = jnp.arange(B, dtype=jnp.int32)
  k = jax.ops.segment_sum(valid.astype(F32), node, 2 * B + 1)[node]
  first = jax.ops.segment_min(jnp.where(valid, idx, B), node, 2 * B + 1)[node] == idx
  steps_g = jax.ops.segment_sum((valid & first).astype(F32), dg, B)
  prompts = jnp.sum(steps_g > 0, dtype=F32)
  w = 1.0 / (jnp.maximum(k, 1.0) * jnp.maximum(steps_g[dg], 1.0) * jnp.maximum(prompts, 1.0))
  return jnp.where(valid, w, 0.0)


def slate_step_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
                    response_mask: ArrayLike, parent_id: ArrayLike | None = None,
                    prefix_len: ArrayLike | None = None, group_id: ArrayLike | None = None,
                    clip_eps: ArrayLike = 0.2) -> TokenLoss:
  """SLATE's step objective (Eq. 7): a candidate step's ratio is exp of its mean token
  log-ratio, PPO-clipped, averaged over the k candidates, then the steps, then the prompts.

  .. math::
    ρ_j = exp((1/|o_j|) Σ_t δ_{j,t}),   J_j = min(ρ_j A_j, clip(ρ_j, 1 − ε, 1 + ε) A_j)
    J = (1/P) Σ_x (1/S_x) Σ_{steps s of x} (1/k_s) Σ_{j ∈ s} J_j,   L = −J

  Each row is one candidate step j, as `credit.trees.step_rollout` lays them out (the k
  candidates of a step share (parent_id, prefix_len); first-step candidates are the roots
  of their prompt group), and A_j is the row's step advantage (`slate_advantages`; the mean
  of `advantages` over the row's tokens). S_x counts the steps (candidate sets) of prompt
  x, P the prompts with a non-empty row. With n_j the row's length, the per-token term is −J_j·w_j/n_j with w_j =
  1/(k_s S_x P), so the default ``token-sum`` aggregation gives L, and the gradient of a
  token is −w_j·A_j·ρ_j/n_j while unclipped (the whole step is clipped or not).

  Paper: "Truncated Step-Level Sampling with Process Rewards for Retrieval-Augmented
  Reasoning" (SLATE), Eq. 7; the code's `slate/training/step_level_algos.py`
  `aggregate_step_objectives` (which returns J, to be maximised: here its negative is
  minimised). The β·KL term of Eq. 7 is the runner's KL term (`kl_coef`, k3, β = 0.001 in
  `configs/slate.yaml`), not part of this loss. Deviations: token log-ratios are clamped to
  ±20 before the mean (the code does not clamp); no dual clip (neither has one).

  Without the tree fields every row is a root: the steps are the prompt groups (one step
  per prompt, S_x = 1), or one set of all rows without `group_id`; then the loss is
  GSPO's sequence-ratio objective with ε = 0.2 averaged per prompt. The weights depend on
  the whole batch (P and the step counts), so the loss is registered batch-coupled and
  with whole groups: a minibatch is averaged over its own prompts.

  Args:
    logprob, logprob_old, advantages: [B,T] float32; response_mask: [B,T] bool, the
      candidate's own step tokens.
    parent_id, prefix_len: optional [B] int, the tree layout (see `slate_advantages`).
    group_id: optional [B] int, the prompt of each row (any int32 values).
    clip_eps: ε of the step ratio's clip (0.2).

  Returns:
    TokenLoss; metrics `clipfrac` (token share of clipped steps), `step_weight_sum` (Σ_j
    w_j: the number of steps' worth of weight, 1 on a well-formed batch) and
    `seq_ratio_mean/max/min` over non-empty rows.
  """
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  w_B = jax.lax.stop_gradient(_step_weights(x.mask, parent_id, prefix_len, group_id))
  log_r_B = seq_mean(x.delta, x.mask)
  r_B = jnp.exp(log_r_B)
  a_B = seq_mean(x.adv, x.mask)
  s1 = r_B * a_B
  s2 = jnp.clip(r_B, 1.0 - clip_eps, 1.0 + clip_eps) * a_B
  obj_B = jnp.minimum(s1, s2)
  per_tok_B = -w_B * obj_B / jnp.maximum(seq_len(x.mask), 1.0)
  loss_BT = jnp.where(x.mask, per_tok_B[:, None], 0.0)
  clipped_BT = jnp.broadcast_to((s2 < s1)[:, None], x.mask.shape)
  return TokenLoss(loss_BT, {"clipfrac": clipped_BT, "step_weight_sum": jnp.sum(w_B),
                             **seq_ratio_metrics(log_r_B, x.mask)})


# Registered by hand (not with `policy_loss`): the loss takes the tree fields beyond
# `POLICY_NEEDS`; the full loss is the per-token term + the shared reduction.
register_policy_loss(_NAME, needs=POLICY_NEEDS + _TREE_FIELDS, paper=_PAPER,
                     confidence="code-verified",
                     source=(_PAPER + "; code: algoprog/SLATE "
                             "slate/training/step_level_algos.py aggregate_step_objectives"),
                     static_argnames=STATIC_ARGNAMES, batch_coupled=True, whole_groups=True,
                     token_fn=slate_step_loss)(_full_loss(_NAME, slate_step_loss, "token-sum"))
