"""SIOP: turn rewards from the change of log-support of the rollout's answer cluster."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.ops._cast import as_f32
from credit.ops.masked import safe_sqrt
from credit.ops.turns import (previous_valid, turn_broadcast, turn_layout, turn_normalize,
                               turn_returns)
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["siop_advantages", "siop_advantages_from_rewards", "siop_turn_rewards",
           "siop_cluster_weights"]

_PAPER = ("Self-Induced Outcome Potential: Turn-Level Credit Assignment for Agents without "
          "Verifiers (SIOP), arXiv preprint")


def siop_cluster_weights(*, cluster_id: ArrayLike, evidence: ArrayLike, group_id: ArrayLike,
                         num_groups: int, num_clusters: int, eta: ArrayLike = 1.0,
                         evidence_mask: ArrayLike | None = None) -> Array:
  """Reliability-aware weight q_b of each rollout's answer cluster, [B] float32.

  .. math::
    m_c = |c| / #answered,   e_c = mean_{b ∈ c, s_b} evidence_b   (0 when no b ∈ c has s_b)
    q_c = softmax_c(log(m_c + 1e-12) + η e_c)   (group with ≥ 2 clusters; else q_c = m_c)

  s_b marks the rows with at least one scored observation: as in the code
  (`siop_cluster_pass`), a cluster's evidence averages only those rows, and a cluster
  without any gets e_c = 0. The cluster's size m_c still counts every answered row.

  Args:
    cluster_id: [B] int, the rollout's cluster inside its group, in [0, num_clusters);
      −1 (or out of range) = no parsable answer → q = 0, and not counted in #answered.
    evidence: [B] the rollout's mean NLI entailment score (tool observations ⇒ its
      cluster's reference); e_c averages it over the cluster.
    group_id, num_groups: prompt group of each row; static group count.
    num_clusters: static bound on the clusters of one group (e.g. the group size).
    eta: η (training script 1.0; the function default of the code is 0).
    evidence_mask: optional [B] bool s_b, the rows with at least one scored observation.
      None (default): the rows whose evidence is finite and non-zero, which reproduces
      the code when evidence is 0 for a row without observations (as the code stores
      it) — a row whose scores average exactly 0 then also leaves the mean. Pass
      all-True to average over every answered row.
  """
  cid = jnp.asarray(cluster_id, jnp.int32)
  gid = jnp.asarray(group_id, jnp.int32)
  ev = as_f32(evidence)
  chex.assert_rank([cid, gid, ev], 1)
  if evidence_mask is None:
    scored = jnp.isfinite(ev) & (ev != 0)
  else:
    scored = jnp.asarray(evidence_mask, bool)
    chex.assert_equal_shape([scored, ev])
  ev = jnp.where(scored & jnp.isfinite(ev), ev, 0.0)
  C = num_clusters
  ok = (cid >= 0) & (cid < C) & (gid >= 0) & (gid < num_groups)
  n = num_groups * C
  seg = jnp.where(ok, gid * C + cid, n)
  cnt = jax.ops.segment_sum(ok.astype(jnp.float32), seg, n + 1)[:n].reshape(num_groups, C)
  esum = jax.ops.segment_sum(jnp.where(ok, ev, 0.0), seg, n + 1)[:n].reshape(num_groups, C)
  ecnt = jax.ops.segment_sum((ok & scored).astype(jnp.float32), seg,
                             n + 1)[:n].reshape(num_groups, C)
  present = cnt > 0
  m = cnt / jnp.maximum(jnp.sum(cnt, axis=1, keepdims=True), 1.0)
  e = esum / jnp.maximum(ecnt, 1.0)
  logit = jnp.where(present, jnp.log(m + 1e-12) + eta * e, -jnp.inf)
  soft = jax.nn.softmax(jnp.where(present, logit, -1e30), axis=1)
  multi = jnp.sum(present, axis=1, keepdims=True) >= 2
  q_GC = jnp.where(present, jnp.where(multi, soft, m), 0.0).reshape(-1)
  return jnp.where(ok, q_GC[jnp.clip(seg, 0, n - 1)], 0.0)


def siop_turn_rewards(*, cluster_weight: ArrayLike, support: ArrayLike, step_mask: ArrayLike,
                      lam: ArrayLike = 0.5, eps: float = 1e-8) -> Array:
  """SIOP turn rewards [B,K] from cluster weights q [B] and supports p̂ [B,K+1].

  .. math::
    r_{b,k} = q_b (log(p̂_{b,k} + ε) − log(p̂_{b,k−1} + ε)),  r_{b,K_b} += (1 − λ) q_b
    single-turn rows: r_{b,1} = (1 − λ) q_b

  p̂_{b,0} is the support from the prompt alone, p̂_{b,k} after turn k (column k); invalid
  turns (`step_mask` False) get 0 and are skipped. As in the code
  (`compute_siop_process_rewards`), a gain is 0 where p̂_{b,k} or the previous support is
  not finite (NaN marks a support that could not be scored) or where it is itself not
  finite, and the final turn's bonus (1 − λ) q_b is added after that, so it survives.
  """
  q_B = as_f32(cluster_weight)
  p = as_f32(support)
  valid = jnp.asarray(step_mask, bool)
  chex.assert_rank([q_B, p, valid], [1, 2, 2])
  chex.assert_equal_shape_prefix([q_B, p, valid], 1)
  chex.assert_axis_dimension(p, 1, valid.shape[1] + 1)
  row = jnp.any(valid, axis=1)
  fin_BK = jnp.isfinite(p[:, 1:])
  fin0_B = jnp.isfinite(p[:, 0])
  lp_BK = jnp.log(jnp.where(valid & fin_BK, jnp.maximum(p[:, 1:], 0.0), 1.0) + eps)
  lp0_B = jnp.log(jnp.where(row & fin0_B, jnp.maximum(p[:, 0], 0.0), 1.0) + eps)
  gain = q_B[:, None] * (lp_BK - previous_valid(lp_BK, valid, lp0_B))
  fin_prev = previous_valid(fin_BK, valid, fin0_B)
  n_B = jnp.sum(valid, axis=1)
  keep = (n_B >= 2)[:, None] & fin_BK & fin_prev & jnp.isfinite(gain)
  gain = jnp.where(keep, gain, 0.0)
  last = valid & (jax.lax.cumsum(valid.astype(jnp.int32), axis=1, reverse=True) == 1)
  r = gain + jnp.where(last, (1.0 - lam) * q_B[:, None], 0.0)
  return jnp.where(valid & jnp.isfinite(r), r, 0.0)


def siop_advantages_from_rewards(*, turn_rewards: ArrayLike, step_mask: ArrayLike,
                                 turn_id: ArrayLike, group_id: ArrayLike,
                                 response_mask: ArrayLike, num_groups: int,
                                 gamma: ArrayLike = 1.0, eps: float = 1e-6) -> Array:
  """SIOP's normalisation and accumulation of turn rewards [B,K] -> token advantages [B,T].

  r̂ = (r − μ_g)/(σ_g + eps) over all valid turn cells of the group (unbiased σ; fewer than
  2 cells → 0; σ < eps → σ = 1, as the code), then A_k = Σ_{k' ≥ k} γ^{k'−k} r̂_{k'}.
  """
  mask_BT, _, valid, _, tid = turn_layout(response_mask, step_mask, turn_id)
  r = jnp.where(valid, as_f32(turn_rewards), 0.0)
  cen = turn_normalize(r, valid, group_id, num_groups, by="pooled", scale=False, min_count=2)
  # Unbiased std of the pool from the centred cells; σ < eps → 1.
  gid = jnp.asarray(group_id, jnp.int32)
  okg = (gid >= 0) & (gid < num_groups)
  seg = jnp.where(okg, gid, num_groups)
  cnt = jax.ops.segment_sum(jnp.sum(valid, 1).astype(jnp.float32), seg, num_groups + 1)
  ss = jax.ops.segment_sum(jnp.sum(cen * cen, 1), seg, num_groups + 1)
  std = safe_sqrt(ss / jnp.maximum(cnt - 1.0, 1.0))
  std = jnp.where(std < eps, 1.0, std)[seg]
  r_hat = jnp.where(valid, cen / (std[:, None] + eps), 0.0)
  return turn_broadcast(turn_returns(r_hat, valid, gamma), tid, mask_BT)


@register_estimator(
    "siop", needs=("gold_logprob_turns", "gold_logprob_prompt", "step_mask", "turn_id",
                   "group_id", "response_mask"),
    paper=_PAPER, static_argnames=("num_groups",),
                    confidence="code-verified",
                    source=(_PAPER + "; code: dl-m9/SIOP verl/utils/siop/siop_process_reward.py "
                            "(compute_siop_process_rewards, siop_cluster_pass), "
                            "verl/trainer/ppo/core_algos.py (compute_siop_turn_level_advantage), "
                            "train_siop.sh"))
def siop_advantages(*, gold_logprob_turns: ArrayLike, gold_logprob_prompt: ArrayLike,
                    step_mask: ArrayLike, turn_id: ArrayLike, group_id: ArrayLike,
                    response_mask: ArrayLike, num_groups: int, lam: ArrayLike = 0.5,
                    gamma: ArrayLike = 1.0, eps: float = 1e-6, log_eps: float = 1e-8) -> Array:
  """SIOP turn advantage, supervised limit (the gold answer as the cluster's reference, q = 1).

  A turn is credited with the change it made to the log-support of the rollout's answer::

    p̂[b,k] = exp(g[b,k]),   r[b,k] = q_b (log(p̂[b,k] + ε) − log(p̂[b,k−1] + ε))
    r[b,K_b] += (1 − λ) q_b                  (single-turn rows: r = (1 − λ) q_b)
    r̂ = (r − μ_g) / (σ_g + eps)             (all valid turn cells of group g, unbiased σ)
    A[b,k] = Σ_{k' ≥ k} γ^{k'−k} r̂[b,k']

  with g the mean gold-answer log-prob after each turn (`gold_logprob_prompt` for k = 0).
  Fewer than 2 cells give 0; σ < eps counts as 1. The rollout's outcome is not used. The
  verifier-free method clusters answers outside the library; then `siop_cluster_weights`
  gives q, `siop_turn_rewards` the rewards and `siop_advantages_from_rewards` the
  advantages. The method is built for a few agent turns: with very many turns the pooled
  normalisation acts as a length penalty (see the method's page).

  Paper: "Self-Induced Outcome Potential: Turn-Level Credit Assignment for Agents without
  Verifiers" (arXiv preprint). Defaults are the authors' training script's (λ = 0.5, three
  references); turns come from `turn_id` / `step_mask` (the code: runs of the response
  mask).

  Args:
    gold_logprob_turns: [B,K] mean gold log-probs after each turn; a non-finite value is
      a support that is skipped (the gains into and out of it are 0).
    gold_logprob_prompt: [B] the same after the prompt alone.
    step_mask: [B,K] bool.
    turn_id: [B,T] int (−1 outside turns).
    group_id: [B] int prompt group.
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    lam: λ; the terminal bonus is (1 − λ) q.
    gamma: turn discount.
    eps: std floor of the normalisation.
    log_eps: ε inside the log.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask` and outside turns.

  Example:
    >>> import numpy as np
    >>> tid = np.array([[0, 0, 1, 1]] * 2, np.int32)
    >>> a = siop_advantages(gold_logprob_turns=np.log(np.array([[.2, .6], [.2, .1]])),
    ...     gold_logprob_prompt=np.log(np.array([.1, .1])), step_mask=np.ones((2, 2), bool),
    ...     turn_id=tid, group_id=np.zeros(2, np.int32), response_mask=np.ones((2, 4), bool),
    ...     num_groups=1)
    >>> np.round(np.asarray(a, np.float64), 4).tolist()
    [[1.2247, 1.2247, 1.2313, 1.2313], [-1.2247, -1.2247, -1.2182, -1.2182]]
  """
  _, row, valid, _, _ = turn_layout(response_mask, step_mask, turn_id)
  g_BK = jnp.where(valid, as_f32(gold_logprob_turns), 0.0)
  g0_B = jnp.where(row, as_f32(gold_logprob_prompt), 0.0)
  g = jnp.concatenate([g0_B[:, None], g_BK], 1)
  # A non-finite mean log-prob is skipped by the code (no support): NaN here.
  support = jnp.where(jnp.isfinite(g), jnp.exp(jnp.minimum(g, 0.0)), jnp.nan)
  r = siop_turn_rewards(cluster_weight=row.astype(jnp.float32), support=support,
                        step_mask=valid, lam=lam, eps=log_eps)
  return siop_advantages_from_rewards(turn_rewards=r, step_mask=step_mask, turn_id=turn_id,
                                      group_id=group_id, response_mask=response_mask,
                                      num_groups=num_groups, gamma=gamma, eps=eps)
