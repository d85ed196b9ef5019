"""Pieces shared by several outcome estimators (not methods themselves)."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from credit import ops

Array = jax.Array


def is_one(x) -> bool:
  """True for a Python number equal to 1 (a static fact; traced values are never 'one')."""
  return isinstance(x, (int, float)) and not isinstance(x, bool) and x == 1


def apply_singleton(adv_B: Array, raw_B: Array, count_B: Array, singleton: str) -> Array:
  """Rows of one-member groups get `raw_B` ("raw", verl) or 0 ("zero")."""
  return jnp.where(count_B == 1, raw_B if singleton == "raw" else 0.0, adv_B)


def grpo_scalar(reward_B: Array, gid_B: Array, valid_B: Array, num_groups: int,
                group_size: int | None, scale: str, eps, singleton: str) -> Array:
  """Per-row GRPO advantage [B] for `scale` in {"group", "batch", "none"}
  (GRPO, Dr.GRPO, DAPO and each GDPO component)."""
  if scale in ("group", "none"):
    return ops.group_normalize(reward_B, gid_B, num_groups, valid=valid_B,
                               scale=scale == "group", eps=eps, singleton=singleton,
                               group_size=group_size)
  cen_B = ops.group_normalize(reward_B, gid_B, num_groups, valid=valid_B, scale=False,
                              singleton="zero", group_size=group_size)
  std_b = ops.safe_sqrt(ops.masked_var(reward_B, valid_B))
  adv_B = cen_B / (std_b + eps)
  if singleton == "raw":
    count_B = ops.group_count_rows(gid_B, valid_B, num_groups, group_size)
    adv_B = jnp.where(valid_B & (count_B == 1), reward_B, adv_B)
  return adv_B


def token_rewards(fn: str, reward_B: Array, mask_BT: Array, logprob_old, logprob_ref,
                  token_reward, kl_coef) -> Array | None:
  """Outcome at the last valid token (+ dense rewards) − kl_coef·(logprob_old − logprob_ref)
  (REINFORCE++ and GAE).

  Returns None when there is no per-token term (outcome only), so callers can take a
  closed form.
  """
  if (logprob_old is None) != (logprob_ref is None):
    raise ValueError(f"{fn}: pass both logprob_old and logprob_ref (KL-in-reward) or neither")
  if logprob_old is None and isinstance(kl_coef, (int, float)) and kl_coef != 0:
    raise ValueError(f"{fn}: kl_coef={kl_coef} needs logprob_old and logprob_ref")
  if logprob_old is None and token_reward is None:
    return None
  x_BT = ops.outcome_to_token_rewards(reward_B, mask_BT)
  if token_reward is not None:
    tr_BT = jnp.asarray(token_reward, jnp.float32)
    chex.assert_equal_shape([tr_BT, mask_BT])
    x_BT = x_BT + jnp.where(mask_BT, tr_BT, 0.0)
  if logprob_old is not None:
    lo_BT = jnp.asarray(logprob_old, jnp.float32)
    lr_BT = jnp.asarray(logprob_ref, jnp.float32)
    chex.assert_equal_shape([lo_BT, lr_BT, mask_BT])
    x_BT = x_BT - kl_coef * jnp.where(mask_BT, lo_BT - lr_BT, 0.0)
  return x_BT
