"""OPID's hindsight-skill re-scoring advantage, shared by OPID and SEED (not a method itself).

SEED registers OPID's computation under its own name (its policy writes the skills itself;
the advantage is the same), so both entries call `skill_advantages`; `opid.py` documents
the math, the layout and the defaults.
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice

Array = jax.Array

OPID_MODES = ("mean_std_norm", "mean_norm")
OPID_SINGLETONS = ("raw", "zero")


def _anchor_groups(group_id: Array, state_key: ArrayLike, valid_BK: Array) -> Array:
  """[B,K] int32 id in [0, B·K) shared by the valid cells with the same (group, state key)
  (GiGPO's step groups): the sorted position of the first such cell. One sort."""
  key = jnp.asarray(state_key, jnp.int32)
  chex.assert_equal_shape([key, valid_BK])
  B, K = key.shape
  g = jnp.broadcast_to(group_id[:, None], (B, K)).reshape(-1)
  k, ok = key.reshape(-1), valid_BK.reshape(-1)
  pos = jnp.arange(B * K, dtype=jnp.int32)
  order = jnp.lexsort((k, g, ~ok)).astype(jnp.int32)
  gs, ks, oks = g[order], k[order], ok[order]
  start = (pos == 0) | ~oks | (gs != jnp.roll(gs, 1)) | (ks != jnp.roll(ks, 1))
  first = jax.lax.cummax(jnp.where(start, pos, 0), axis=0)
  return jnp.zeros_like(pos).at[order].set(first).reshape(B, K)


def opid_gigpo_step_advantages(*, step_reward: ArrayLike, state_key: ArrayLike,
                               valid_BK: ArrayLike, group_id: ArrayLike,
                               scale: bool = True, gamma: ArrayLike = 0.95,
                               eps: ArrayLike = 1e-6) -> Array:
  """GiGPO's step-level advantage as OPID's code computes it, [B,K] float32.

  .. math::
    G_{b,k} = Σ_{k' ≥ k} γ^{k'−k} r_{b,k'}      (`compute_step_discounted_returns`)
    Ã_{b,k} = (G_{b,k} − μ_s) / (σ_s + ε)        (`step_norm_reward`; centred only
                                                   when `scale` is False)

  over the step group s of cell (b, k): the valid turns of one prompt group that start
  from the same state (`state_key`; GiGPO's anchor states, `build_step_group` with exact
  matching). σ is the unbiased std; a step group of one cell gets 0 (the code's μ is the
  value itself).

  Args:
    step_reward: [B,K] per-turn environment rewards r.
    state_key: [B,K] int key of the state each turn starts from.
    valid_BK: [B,K] bool, the turns that exist.
    group_id: [B] int prompt group.
    scale: divide by σ + ε ("mean_std_norm") or only centre ("mean_norm").
    gamma: γ of the returns (0.95 in OPID's scripts, `algorithm.gamma`).
    eps: ε.
  """
  valid = jnp.asarray(valid_BK, bool)
  gid = jnp.asarray(group_id, jnp.int32)
  ret = ops.turn_returns(jnp.where(valid, jnp.asarray(step_reward, jnp.float32), 0.0), valid,
                         gamma)
  B, K = valid.shape
  anchor = _anchor_groups(gid, state_key, valid)
  return ops.turn_normalize(ret, valid, jnp.zeros((B,), jnp.int32), 1, by="key", key=anchor,
                            num_keys=B * K, scale=scale, ddof=1, eps=eps, small="zero")


def opid_teacher_term(*, response_mask: ArrayLike, logprob_old: ArrayLike,
                      logprob_skill: ArrayLike, normalize: bool = False,
                      clip: ArrayLike | None = None, eps: ArrayLike = 1e-6) -> Array:
  """One skill teacher term T = stopgrad(ℓ_skill − ℓˢ)·M ([B,T] float32), as OPID's
  `compute_teacher_token_advantage`.

  A row whose skill log-probs equal `logprob_old` on every valid token has no skill
  (T = 0 there; this is how the loop encodes OPID's per-row skill masks). With `normalize`
  (static) the active tokens (valid tokens of rows with a skill) are standardised over the
  batch with the population std, (T − m)/(s + ε) when s > ε, else only centred (code); with
  `clip` (None: no clip) T is clipped to [−clip, clip] afterwards. A NaN difference (−inf
  in both contexts) counts as 0 (ours).
  """
  mask_BT = jnp.asarray(response_mask)
  lo_BT = jnp.asarray(logprob_old, jnp.float32)
  ls_BT = jnp.asarray(logprob_skill, jnp.float32)
  chex.assert_rank([mask_BT, lo_BT, ls_BT], 2)
  chex.assert_equal_shape([mask_BT, lo_BT, ls_BT])
  mask_BT = mask_BT.astype(bool)
  d_BT = jnp.where(mask_BT, ls_BT, 0.0) - jnp.where(mask_BT, lo_BT, 0.0)
  d_BT = jnp.where(mask_BT & ~jnp.isnan(d_BT), d_BT, 0.0)
  if normalize:
    active_BT = mask_BT & jnp.any(mask_BT & (d_BT != 0.0), axis=-1, keepdims=True)
    fin_BT = jnp.where(jnp.isfinite(d_BT), d_BT, 0.0)
    mean = ops.masked_mean(fin_BT, active_BT)
    std = ops.safe_sqrt(ops.masked_var(fin_BT, active_BT, unbiased=False))
    eps = jnp.asarray(eps, jnp.float32)
    scale = jnp.where(std > eps, std + eps, 1.0)
    d_BT = jnp.where(active_BT, (d_BT - mean) / scale, d_BT)
  if clip is not None:
    clip = jnp.asarray(clip, jnp.float32)
    d_BT = jnp.clip(d_BT, -clip, clip)
  return jax.lax.stop_gradient(d_BT)


def skill_advantages(fn: str, *, reward: ArrayLike, group_id: ArrayLike | None,
                     response_mask: ArrayLike, logprob_old: ArrayLike, logprob_alt: ArrayLike,
                     logprob_teacher: ArrayLike | None, num_groups: int, group_size: int | None,
                     mode: str, episode_weight: ArrayLike, step_weight: ArrayLike,
                     singleton: str, normalize_teacher: bool, clip_teacher: ArrayLike | None,
                     failed_only: bool, success_threshold: ArrayLike, eps: ArrayLike,
                     gigpo_step: bool, step_reward: ArrayLike | None,
                     state_key: ArrayLike | None, step_mask: ArrayLike | None,
                     turn_id: ArrayLike | None, gigpo_weight: ArrayLike,
                     gigpo_gamma: ArrayLike) -> Array:
  """`opid_advantages` (see its docstring); `fn` names the calling entry in error messages."""
  check_choice(fn, "mode", mode, OPID_MODES)
  check_choice(fn, "singleton", singleton, OPID_SINGLETONS)
  rows = ops.group_rows(fn, reward, group_id, num_groups, group_size,
                        response_mask=response_mask)
  eps = jnp.asarray(eps, jnp.float32)
  scaled = mode == "mean_std_norm"
  adv_B = ops.group_normalize(rows.values, rows.group_id, num_groups, valid=rows.valid,
                              scale=scaled, eps=eps, singleton="zero", group_size=group_size)
  if singleton == "raw":
    count_B = ops.group_count_rows(rows.group_id, rows.valid, num_groups, group_size)
    raw_B = rows.values / (1.0 + eps) if scaled else rows.values
    adv_B = jnp.where(rows.valid & (count_B == 1), raw_B, adv_B)
  ok_BT = rows.mask & rows.valid[:, None]
  teach = dict(response_mask=ok_BT, logprob_old=logprob_old, normalize=normalize_teacher,
               clip=clip_teacher, eps=eps)
  t_BT = jnp.asarray(episode_weight, jnp.float32) * opid_teacher_term(
      logprob_skill=logprob_alt, **teach)
  if logprob_teacher is not None:
    t_BT = t_BT + jnp.asarray(step_weight, jnp.float32) * opid_teacher_term(
        logprob_skill=logprob_teacher, **teach)
  if failed_only:
    failed_B = rows.values < jnp.asarray(success_threshold, jnp.float32)
    t_BT = jnp.where(failed_B[:, None], t_BT, 0.0)
  if gigpo_step:
    if any(f is None for f in (step_reward, state_key, step_mask, turn_id)):
      raise ValueError(f"{fn}: gigpo_step=True needs step_reward [B,K], state_key "
                       "[B,K], step_mask [B,K] and turn_id [B,T]")
    _, _, valid_BK, _, tid_BT = ops.turn_layout(ok_BT, step_mask, turn_id)
    step_BK = opid_gigpo_step_advantages(
        step_reward=step_reward, state_key=state_key, valid_BK=valid_BK,
        group_id=rows.group_id, scale=scaled, gamma=gigpo_gamma, eps=eps)
    t_BT = t_BT + jnp.asarray(gigpo_weight, jnp.float32) * ops.turn_broadcast(
        step_BK, tid_BT, ok_BT)
  return jax.lax.stop_gradient(jnp.where(ok_BT, adv_B[:, None] + t_BT, 0.0))
