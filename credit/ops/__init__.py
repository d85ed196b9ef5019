"""Masked, group, return and turn primitives shared by every estimator and loss.

Everything here is a pure function of arrays, safe under `jit`, `vmap` and sharding.
Masked and degenerate entries give exact zeros, never NaN: divisions are guarded with
`jnp.maximum(count, 1)` and the unused branch of every `jnp.where` is finite.

Modules, all re-exported here (`credit.ops.masked_mean` etc.):
  masked   masked sum/mean/var, whitening (per token, or per row weighted by length),
           safe sqrt/div;
  groups   group statistics on the [N,G] fast path and the segment path, and the
           row-level preamble and reductions of group estimators (`group_rows`, ...);
  returns  sequence <-> token placement, returns over time that skip masked positions;
  turns    per-turn reductions and broadcasts, the layout of a multi-turn batch
           (`turn_layout`, `previous_valid`);
  select   exact order statistics, quantiles and k-smallest masks without a sort
           (radix select on the float's order-preserving key);
  baselines  advantages against the group baseline (GRPO's z-score in its conventions) and
           the critic baseline (GAE), which estimators of several families build on.

Numerical note: group and batch statistics are computed *shifted*: values are first
moved by a per-group pivot (the group maximum) or by a first-pass mean, so that rewards
such as [1000, 1000, 1000, 1000.01] keep their differences in float32 instead of
cancelling in a raw sum.
"""
from credit.ops import baselines, groups, masked, returns, select, turns
from credit.ops.baselines import (GROUP_SCALES, GROUP_STDS, GAEOutput, apply_singleton, gae,
                                  grpo_scalar, grpo_token_advantages, is_one,
                                  sequence_advantage, token_rewards)
from credit.ops.groups import (SINGLETONS, GroupMoments, GroupRows, SingletonPolicy,
                               gather_groups, group_count_rows, group_moments,
                               group_moments_dense, group_moments_rows, group_normalize,
                               group_reduce_rows, group_rows, group_sum)
from credit.ops.masked import (masked_mean, masked_sum, masked_var, masked_whiten, safe_div,
                               safe_sqrt, weighted_whiten)
from credit.ops.returns import (FAST_RECURRENCE_MIN_T, RECURRENCE_BLOCK, broadcast_to_tokens,
                                discounted_reverse_cumsum, discounted_suffix_sum, rows_form_one_run,
                                last_token_mask, next_valid_value,
                                outcome_to_token_rewards, prefix_sum,
                                sequence_lengths)
from credit.ops.select import (masked_order_statistics, masked_quantiles, row_smallest_k,
                               row_smallest_k_mask, smallest_k_mask)
from credit.ops.turns import (TURN_NORMS, previous_valid, row_grpo, turn_broadcast, turn_counts,
                               turn_edges, turn_layout, turn_normalize, turn_reduce,
                               turn_returns, turn_segments)

__all__ = (masked.__all__ + groups.__all__ + returns.__all__ + turns.__all__
           + select.__all__ + baselines.__all__)
