"""DCPO smooth advantage standardisation (SAS): a stateful, per-prompt z-score mix."""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_int
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["DCPOState", "DCPOOutput", "dcpo_init_state", "dcpo_advantages"]

_PAPER = "DCPO: Dynamic Clipping Policy Optimization, arXiv 2509.02333"


class DCPOState(NamedTuple):
  """Per-prompt cumulative reward statistics, indexed by a stable prompt slot [P].

  count: int32 number of steps the prompt has been sampled before;
  mean, std: cumulative (pooled) mean and std of its rewards.
  """
  count: Array
  mean: Array
  std: Array


class DCPOOutput(NamedTuple):
  """`advantages` [B,T] and the updated per-prompt `state`."""
  advantages: Array
  state: DCPOState


def dcpo_init_state(num_prompts: int) -> DCPOState:
  """Empty DCPO statistics for `num_prompts` prompt slots."""
  check_int("dcpo_init_state", "num_prompts", num_prompts)
  return DCPOState(count=jnp.zeros((num_prompts,), jnp.int32),
                   mean=jnp.zeros((num_prompts,), jnp.float32),
                   std=jnp.zeros((num_prompts,), jnp.float32))


@register_estimator("dcpo", needs=("reward", "group_id", "response_mask", "prompt_id"),
                    paper=_PAPER, static_argnames=("num_groups", "group_size", "scale"),
                    returns_output=True, init_state=dcpo_init_state,
                    confidence="code-verified",
                    source=(_PAPER + "; code: elysiameik-afk/dcpomol core_algos.py get_mean_std, "
                            "compute_dcpo_outcome_advantage (a verl fork with the DCPO "
                            "code)"))
def dcpo_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                    prompt_id: ArrayLike, state: DCPOState, num_groups: int,
                    group_size: int | None = None, old_stats_ratio: float = 1.0,
                    scale: bool = True) -> DCPOOutput:
  """DCPO smooth advantage standardisation (SAS), with the updated prompt statistics.

  Each prompt keeps running statistics of its rewards over training. For a prompt seen n
  times before (state count n, mean μ_p, std σ_p, both scaled by `old_stats_ratio`), a
  current group mean μ_new and unbiased std σ_new, and i = n + 1::

    μ  = (n μ_p + μ_new) / (n + 1)
    σ² = [n σ_p² + σ_new² + n/(n+1) (μ_new − μ_p)²] / (n + 1)
    A_new = (R − μ_new) / σ_new,      A_tot = (R − μ) / σ       (0 where the std is 0)
    SA_new = (i−1)/i A_new + 1/i A_tot,   SA_tot = 1/i A_new + (i−1)/i A_tot
    a = SA_new if abs(SA_new) < abs(SA_tot) else SA_tot

  n = 0 gives the plain z-score (no ε). The new state is (n + 1, μ, σ) at every prompt
  slot in the batch; other slots keep theirs. `scale=False` drops the std divisions.

  Paper: "DCPO: Dynamic Clipping Policy Optimization", arXiv 2509.02333, §3.2.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int32 group ids (unused with `group_size`).
    response_mask: [B,T] bool.
    prompt_id: [B] int32 slot in `state` of each row's prompt: stable across steps,
      constant within a group, distinct between the groups of one batch.
    state: `DCPOState` with [P] arrays (`dcpo_init_state(P)` to start).
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    old_stats_ratio: scales μ_p and σ_p (the code's `user_old_mean_ratio`).
    scale: static; divide by the stds.

  Returns:
    DCPOOutput(advantages [B,T], state DCPOState [P]).

  Example:
    >>> import numpy as np
    >>> kw = dict(group_id=np.zeros(4, np.int32), response_mask=np.ones((4, 2), bool),
    ...           prompt_id=np.zeros(4, np.int32), num_groups=1)
    >>> out = dcpo_advantages(reward=np.array([1., 0, 0, 1]), state=dcpo_init_state(1), **kw)
    >>> out = dcpo_advantages(reward=np.array([1., 1, 1, 0]), state=out.state, **kw)
    >>> np.round(np.asarray(out.advantages[:, 0], np.float64), 4).tolist()
    [0.5882, 0.5882, 0.5882, -1.3137]
  """
  reward_B, gid_B, mask_BT, valid_B = ops.group_rows(
      "dcpo_advantages", reward, group_id, num_groups, group_size, response_mask=response_mask)
  pid_B = jnp.asarray(prompt_id)
  chex.assert_rank(pid_B, 1)
  chex.assert_type(pid_B, int)
  chex.assert_equal_shape([pid_B, reward_B])
  count_P = jnp.asarray(state.count)
  mean_P = jnp.asarray(state.mean, jnp.float32)
  std_P = jnp.asarray(state.std, jnp.float32)
  chex.assert_rank([count_P, mean_P, std_P], 1)
  chex.assert_equal_shape([count_P, mean_P, std_P])
  P = count_P.shape[0]
  pid_B = pid_B.astype(jnp.int32)
  ok_B = valid_B & (pid_B >= 0) & (pid_B < P)

  ratio = jnp.asarray(old_stats_ratio, jnp.float32)
  n_B = jnp.where(ok_B, ops.gather_groups(count_P, pid_B), 0).astype(jnp.float32)
  mu_p = ops.gather_groups(mean_P, pid_B) * ratio
  sd_p = ops.gather_groups(std_P, pid_B) * ratio
  mom = ops.group_moments_rows(reward_B, gid_B, valid_B, num_groups, group_size)
  cen_B = ops.group_normalize(reward_B, gid_B, num_groups, valid=valid_B, scale=False,
                              singleton="zero", group_size=group_size)   # R − μ_new
  dmu = mom.mean - mu_p
  frac = n_B / (n_B + 1.0)
  mu_tot = mu_p + dmu / (n_B + 1.0)
  var_tot = (n_B * sd_p * sd_p + mom.std * mom.std + frac * dmu * dmu) / (n_B + 1.0)
  sd_tot = ops.safe_sqrt(var_tot)
  dev_tot = cen_B + frac * dmu                                         # R − μ
  if scale:
    a_new = ops.safe_div(cen_B, mom.std)
    a_tot = ops.safe_div(dev_tot, sd_tot)
  else:
    a_new, a_tot = cen_B, dev_tot
  i_B = n_B + 1.0
  sa_new = (i_B - 1.0) / i_B * a_new + a_tot / i_B
  sa_tot = a_new / i_B + (i_B - 1.0) / i_B * a_tot
  adv_B = jnp.where(jnp.abs(sa_new) < jnp.abs(sa_tot), sa_new, sa_tot)
  adv_B = jnp.where(valid_B, adv_B, 0.0)

  idx_B = jnp.where(ok_B, pid_B, P)
  new_state = DCPOState(
      count=count_P.at[idx_B].set((n_B + 1.0).astype(count_P.dtype), mode="drop"),
      mean=mean_P.at[idx_B].set(mu_tot, mode="drop"),
      std=std_P.at[idx_B].set(sd_tot, mode="drop"))
  return DCPOOutput(advantages=ops.broadcast_to_tokens(adv_B, mask_BT), state=new_state)
