"""HyperEyes TRACE: tool-cost bonus ranked against a per-prompt reference cost, then GRPO."""
from __future__ import annotations

from typing import Literal, NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice, check_int
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["TraceCostState", "TraceCostOutput", "trace_cost_init_state", "trace_cost_bonus",
           "trace_cost_advantages"]

_PAPER = ("HyperEyes (DeepExperience): TRACE tool-use reference-adaptive cost efficiency reward, "
          "https://github.com/DeepExperience/HyperEyes")


class TraceCostState(NamedTuple):
  """Per-prompt reference cost, indexed by a stable prompt slot [P].

  ref_tc: int32 tool-call rounds of the reference (−1 = no reference);
  ref_total: float32 total searches of the reference (−1 = no reference).
  """
  ref_tc: Array
  ref_total: Array


class TraceCostOutput(NamedTuple):
  """`advantages` [B,T], the updated `state`, and the shaped `reward` [B] (acc + bonus)."""
  advantages: Array
  state: TraceCostState
  reward: Array


def trace_cost_init_state(num_prompts: int) -> TraceCostState:
  """No reference for any of `num_prompts` prompt slots (−1)."""
  check_int("trace_cost_init_state", "num_prompts", num_prompts)
  return TraceCostState(ref_tc=jnp.full((num_prompts,), -1, jnp.int32),
                        ref_total=jnp.full((num_prompts,), -1.0, jnp.float32))


def _distinct_rank(seg_B: Array, tc_B: Array, total_B: Array, num_segments: int
                   ) -> tuple[Array, Array]:
  """Rank of each row's distinct key (tc, total) inside its segment, ascending, and the
  number M of distinct keys of the segment; rows of segment `num_segments` are ignored.

  One lexicographic sort on (segment, tc, total), then a cumulative count of "new key"
  positions (jit-friendly, O(B log B)).
  """
  order = jnp.lexsort((total_B, tc_B, seg_B))
  s, a, b = seg_B[order], tc_B[order], total_B[order]
  first = jnp.concatenate([jnp.ones((1,), bool), s[1:] != s[:-1]])
  new = first | jnp.concatenate([jnp.ones((1,), bool), (a[1:] != a[:-1]) | (b[1:] != b[:-1])])
  c = jnp.cumsum(new.astype(jnp.int32))
  start = jax.lax.cummax(jnp.where(first, c, 0), axis=0)
  rank_sorted = c - start
  rank_B = jnp.zeros_like(rank_sorted).at[order].set(rank_sorted)
  m_seg = jax.ops.segment_max(rank_B, seg_B, num_segments + 1)[:num_segments] + 1
  m_B = m_seg[jnp.clip(seg_B, 0, num_segments - 1)]
  return rank_B, m_B


def trace_cost_bonus(*, reward: ArrayLike, tool_calls: ArrayLike, tool_cost: ArrayLike,
                     ref_tc: ArrayLike, ref_total: ArrayLike, group_id: ArrayLike,
                     valid: ArrayLike, num_groups: int, good_range=(0.05, 0.20),
                     bad_range=(-0.10, -0.02), wrong_penalty: ArrayLike = -0.1,
                     overuse_factor: float = 1.5) -> Array:
  """TRACE's per-row bonus [B] given each row's reference (ref_tc, ref_total) [B].

  See `trace_cost_advantages` for the rules. Rows outside `valid` get 0 and take no part
  in any ranking. Returns the bonus rounded to 4 decimals (float32).
  """
  acc_B = jnp.asarray(reward, jnp.float32)
  tc_B = jnp.asarray(tool_calls).astype(jnp.int32)
  tot_B = jnp.asarray(tool_cost, jnp.float32)
  rtc_B = jnp.asarray(ref_tc).astype(jnp.int32)
  rtot_B = jnp.asarray(ref_total, jnp.float32)
  gid_B = jnp.asarray(group_id, jnp.int32)
  valid_B = jnp.asarray(valid, bool)
  failed = acc_B <= -0.5
  wrong = ~failed & (acc_B <= 0)
  correct = acc_B > 0
  # int(1.5·ref) truncates toward zero (−1 → −1), as Python's int() in the code.
  limit_B = jnp.trunc(overuse_factor * rtc_B.astype(jnp.float32))
  wrong_bonus = jnp.where((tc_B < rtc_B) | (tc_B.astype(jnp.float32) > limit_B),
                          jnp.asarray(wrong_penalty, jnp.float32), 0.0)
  ranked = valid_B & correct & (tc_B > 0)
  good = ranked & (tc_B <= rtc_B) & (tot_B <= rtot_B)
  seg_B = jnp.where(ranked, 2 * gid_B + jnp.where(good, 0, 1), 2 * num_groups)
  rank_B, m_B = _distinct_rank(seg_B, tc_B, tot_B, 2 * num_groups)
  lo = jnp.where(good, good_range[0], bad_range[0])
  hi = jnp.where(good, good_range[1], bad_range[1])
  frac = rank_B.astype(jnp.float32) / jnp.maximum(m_B - 1, 1).astype(jnp.float32)
  rank_bonus = jnp.where(m_B > 1, hi - (hi - lo) * frac, hi)
  bonus = jnp.where(wrong, wrong_bonus, jnp.where(ranked, rank_bonus, 0.0))
  bonus = jnp.where(valid_B, bonus, 0.0)
  return jnp.round(bonus, 4)


@register_estimator("trace_cost", needs=("reward", "tool_calls", "tool_cost", "group_id",
                                         "response_mask", "prompt_id"),
                    paper=_PAPER,
                    static_argnames=("num_groups", "group_size", "singleton", "update_ref",
                                     "init_missing_ref"),
                    returns_output=True, init_state=trace_cost_init_state,
                    confidence="code-verified",
                    source=(_PAPER + "; code: DeepExperience/HyperEyes "
                            "RL/relax-hypereyes/examples/HyperEyes/HyperEyes_reward_V1_2_w_dynamic_w_OPD_v0.py "
                            "(compute_group_bonus, BaselineCache._is_better, "
                            "_best_rollout_baseline, reward_func)"))
def trace_cost_advantages(*, reward: ArrayLike, tool_calls: ArrayLike, tool_cost: ArrayLike,
                          group_id: ArrayLike, response_mask: ArrayLike, prompt_id: ArrayLike,
                          state: TraceCostState, num_groups: int,
                          group_size: int | None = None, update_ref: bool = False,
                          init_missing_ref: bool = False, wrong_penalty: ArrayLike = -0.1,
                          eps: float = 1e-6,
                          singleton: Literal["zero", "raw"] = "zero") -> TraceCostOutput:
  """HyperEyes TRACE: accuracy plus a tool-cost bonus relative to a per-prompt reference, GRPO.

  Per row with accuracy `acc` (1 correct, 0 wrong, −0.5 unparseable), tool-call rounds tc
  and total searches tot, against its prompt's reference (ref_tc, ref_tot):

  * acc ≤ −0.5: bonus 0;
  * wrong: bonus −0.1 if tc < ref_tc or tc > int(1.5 ref_tc), else 0;
  * correct with tc = 0: bonus 0 (a possible guess);
  * correct with tc > 0: "good" when tc ≤ ref_tc and tot ≤ ref_tot, else "bad". Within each
    set of the group the distinct (tc, tot) are ranked ascending, r = 0..M−1, and
    bonus = hi − (hi − lo) r/(M − 1) (hi when M = 1), with (lo, hi) = (0.05, 0.20) for
    good and (−0.10, −0.02) for bad, rounded to 4 decimals.

  Then R = acc + bonus and A = GRPO(R). Without a reference every wrong answer gets −0.1
  and every correct tc > 0 is "bad". `update_ref` (off, as in the released reward
  function) replaces a prompt's reference by the group's cheapest correct row when it is
  cheaper; `init_missing_ref` also sets a missing one.

  Source: the TRACE reward of HyperEyes (DeepExperience/HyperEyes).

  Args:
    reward: [B] accuracy acc.
    tool_calls: [B] int tool-call rounds tc.
    tool_cost: [B] total searches tot.
    group_id: [B] int group ids (unused with `group_size`).
    response_mask: [B,T] bool.
    prompt_id: [B] int slot in `state` of each row's prompt (constant within a group;
      distinct between groups); out-of-range slots use no reference.
    state: `TraceCostState` [P] (`trace_cost_init_state(P)`: no references).
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    update_ref: static, see above.
    init_missing_ref: static, see above.
    wrong_penalty: the wrong-answer bonus.
    eps: added to σ.
    singleton: static "zero" | "raw".

  Returns:
    TraceCostOutput(advantages [B,T], state [P], reward [B] = acc + bonus, 0 on invalid rows).

  Example:
    >>> import numpy as np
    >>> st = trace_cost_init_state(1)._replace(ref_tc=np.array([2], np.int32),
    ...                                        ref_total=np.array([4.], np.float32))
    >>> out = trace_cost_advantages(
    ...     reward=np.array([1., 1., 0., 1.]), tool_calls=np.array([1, 3, 2, 2], np.int32),
    ...     tool_cost=np.array([2., 6., 4., 3.]), group_id=np.zeros(4, np.int32),
    ...     response_mask=np.ones((4, 2), bool), prompt_id=np.zeros(4, np.int32), state=st,
    ...     num_groups=1)
    >>> np.round(np.asarray(out.reward, np.float64), 4).tolist()
    [1.2, 0.98, 0.0, 1.05]
  """
  fn = "trace_cost_advantages"
  check_choice(fn, "singleton", singleton, ops.SINGLETONS)
  acc_B, gid_B, mask_BT, valid_B = ops.group_rows(fn, reward, group_id, num_groups, group_size,
                                                  response_mask=response_mask)
  tc_B = jnp.asarray(tool_calls)
  tot_B = jnp.asarray(tool_cost, jnp.float32)
  pid_B = jnp.asarray(prompt_id)
  chex.assert_rank([tc_B, tot_B, pid_B], 1)
  chex.assert_type([tc_B, pid_B], int)
  chex.assert_equal_shape([tc_B, tot_B, pid_B, acc_B])
  tc_B = tc_B.astype(jnp.int32)
  pid_B = pid_B.astype(jnp.int32)
  rtc_P = jnp.asarray(state.ref_tc)
  rtot_P = jnp.asarray(state.ref_total, jnp.float32)
  chex.assert_rank([rtc_P, rtot_P], 1)
  chex.assert_equal_shape([rtc_P, rtot_P])
  P = rtc_P.shape[0]
  ok_B = valid_B & (pid_B >= 0) & (pid_B < P)
  rtc_B = jnp.where(ok_B, ops.gather_groups(rtc_P, pid_B), -1).astype(jnp.int32)
  rtot_B = jnp.where(ok_B, ops.gather_groups(rtot_P, pid_B), -1.0)

  bonus_B = trace_cost_bonus(reward=acc_B, tool_calls=tc_B, tool_cost=tot_B, ref_tc=rtc_B,
                             ref_total=rtot_B, group_id=gid_B, valid=valid_B,
                             num_groups=num_groups, wrong_penalty=wrong_penalty)
  shaped_B = jnp.where(valid_B, jnp.where(acc_B <= -0.5, acc_B, acc_B + bonus_B), 0.0)
  adv_B = ops.group_normalize(shaped_B, gid_B, num_groups, valid=valid_B, eps=eps,
                              singleton=singleton, group_size=group_size)
  advantages = ops.broadcast_to_tokens(jnp.where(valid_B, adv_B, 0.0), mask_BT)

  new_state = TraceCostState(ref_tc=rtc_P, ref_total=rtot_P)
  if update_ref or init_missing_ref:
    cand = valid_B & (acc_B > 0) & (tc_B >= 1)
    big = jnp.iinfo(jnp.int32).max
    best_tc = ops.group_reduce_rows(jnp.where(cand, tc_B, big), gid_B, valid_B, num_groups,
                                    group_size, "min")
    at_best = cand & (tc_B == best_tc)
    best_tot = ops.group_reduce_rows(jnp.where(at_best, tot_B, jnp.inf), gid_B, valid_B,
                                     num_groups, group_size, "min")
    has_cand = ops.group_reduce_rows(cand.astype(jnp.float32), gid_B, valid_B, num_groups,
                                     group_size, "max") > 0
    has_ref = rtc_B >= 0
    better = (best_tc < rtc_B) | ((best_tc == rtc_B) & (best_tot < rtot_B))
    write = jnp.zeros_like(ok_B)
    if update_ref:
      write = write | (has_ref & better)
    if init_missing_ref:
      write = write | ~has_ref
    write = ok_B & has_cand & write
    idx_B = jnp.where(write, pid_B, P)
    new_state = TraceCostState(
        ref_tc=rtc_P.at[idx_B].set(best_tc.astype(rtc_P.dtype), mode="drop"),
        ref_total=rtot_P.at[idx_B].set(best_tot, mode="drop"))
  return TraceCostOutput(advantages=advantages, state=new_state, reward=shaped_B)
