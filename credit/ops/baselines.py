"""Advantages against the two standard baselines, which many estimators start from.

The group baseline: GRPO's z-score of each row's outcome within its prompt group, in the
conventions the families use (`grpo_scalar`: scale by the group std, the batch std, or not
at all; `sequence_advantage`: the unbiased, population or no std), and its token broadcast
(`grpo_token_advantages`). The critic baseline: GAE over the valid tokens (`gae`).

Estimators that are defined on top of GRPO or GAE (CoSearch, DIDPO, SPARK, ReDiPPO, PiCA,
the token and distillation families) call these instead of another estimator's module; the
registered `grpo_advantages` and `gae_advantages` are thin entries over them.
"""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit._checks import check_choice
from credit.ops.groups import (SINGLETONS, group_count_rows, group_moments_rows,
                               group_normalize, group_rows)
from credit.ops.masked import masked_var, masked_whiten, safe_sqrt
from credit.ops.returns import (broadcast_to_tokens, discounted_reverse_cumsum,
                                next_valid_value, outcome_to_token_rewards, rows_form_one_run)

Array = jax.Array

__all__ = ["GROUP_SCALES", "GROUP_STDS", "GAEOutput", "apply_singleton", "gae", "grpo_scalar",
           "grpo_token_advantages", "is_one", "sequence_advantage", "token_rewards"]

GROUP_SCALES = ("group", "batch", "none")
GROUP_STDS = ("unbiased", "population", "none")


def is_one(x) -> bool:
  """True for a Python number equal to 1 (a static fact; traced values are never 'one')."""
  return isinstance(x, (int, float)) and not isinstance(x, bool) and x == 1


# --------------------------------------------------------------------------------------------
# The group baseline (GRPO).
# --------------------------------------------------------------------------------------------


def apply_singleton(adv_B: Array, raw_B: Array, count_B: Array, singleton: str) -> Array:
  """Rows of one-member groups get `raw_B` ("raw", verl) or 0 ("zero")."""
  return jnp.where(count_B == 1, raw_B if singleton == "raw" else 0.0, adv_B)


def grpo_scalar(reward_B: Array, gid_B: Array, valid_B: Array, num_groups: int,
                group_size: int | None, scale: str, eps, singleton: str) -> Array:
  """Per-row GRPO advantage [B] for `scale` in {"group", "batch", "none"}
  (GRPO, Dr.GRPO, DAPO and each GDPO component)."""
  if scale in ("group", "none"):
    return group_normalize(reward_B, gid_B, num_groups, valid=valid_B,
                           scale=scale == "group", eps=eps, singleton=singleton,
                           group_size=group_size)
  cen_B = group_normalize(reward_B, gid_B, num_groups, valid=valid_B, scale=False,
                          singleton="zero", group_size=group_size)
  std_b = safe_sqrt(masked_var(reward_B, valid_B))
  adv_B = cen_B / (std_b + eps)
  if singleton == "raw":
    count_B = group_count_rows(gid_B, valid_B, num_groups, group_size)
    adv_B = jnp.where(valid_B & (count_B == 1), reward_B, adv_B)
  return adv_B


def grpo_token_advantages(fn: str, *, reward: ArrayLike, group_id: ArrayLike,
                          response_mask: ArrayLike, num_groups: int,
                          group_size: int | None = None, scale: str = "group",
                          eps: float = 1e-6, singleton: str = "zero") -> Array:
  """GRPO's advantage `grpo_scalar` broadcast to the response tokens, [B,T] float32.

  The body of the registered `grpo_advantages`; `fn` names the caller in error messages.
  Rows with no response token (or a group id out of range) get 0 and take no part in the
  statistics (`group_rows`).
  """
  check_choice(fn, "scale", scale, GROUP_SCALES)
  check_choice(fn, "singleton", singleton, SINGLETONS)
  reward_B, gid_B, mask_BT, valid_B = group_rows(
      fn, reward, group_id, num_groups, group_size, response_mask=response_mask)
  adv_B = grpo_scalar(reward_B, gid_B, valid_B, num_groups, group_size, scale, eps, singleton)
  return broadcast_to_tokens(jnp.where(valid_B, adv_B, 0.0), mask_BT)


def sequence_advantage(reward_B: ArrayLike, group_id_B: ArrayLike, valid_B: ArrayLike, *,
                       num_groups: int, group_size: int | None,
                       group_std: str = "unbiased", eps: ArrayLike = 1e-6,
                       singleton: str = "zero") -> Array:
  """GRPO sequence advantage Â_b = (R_b − μ_g)/(σ_g + ε) of the valid rows ([B] float32).

  `group_std` (static): "unbiased" σ (ddof 1, verl / torch.std), "population" σ (ddof 0), or
  "none" (no division: R − μ_g, Dr.GRPO / verl `norm_adv_by_std_in_grpo=False`). All-equal
  groups give exact 0 (ε is added to σ, not to the variance). Invalid rows (see
  `group_rows`) give 0 and take no part in the statistics. A group with one valid row
  gives 0 (`singleton="zero"`), or its raw reward R_b (`singleton="raw"`: verl's μ = 0,
  σ = 1 for a lone sample). Callers check `group_std`/`singleton` eagerly.
  """
  reward_B = jnp.asarray(reward_B, jnp.float32)
  valid_B = jnp.asarray(valid_B, bool)
  if group_std != "population":  # the library's GRPO normalisation (group_normalize)
    return group_normalize(reward_B, group_id_B, num_groups, valid=valid_B,
                           scale=group_std == "unbiased", eps=eps, singleton=singleton,
                           group_size=group_size)
  cen_B = group_normalize(reward_B, group_id_B, num_groups, valid=valid_B, scale=False,
                          group_size=group_size)
  mom = group_moments_rows(reward_B, group_id_B, valid_B, num_groups, group_size)
  # σ_pop = σ · √((n − 1)/n) from the unbiased σ of the group.
  std_B = mom.std * safe_sqrt(jnp.maximum(mom.count - 1.0, 0.0)
                              / jnp.maximum(mom.count, 1.0))
  adv_B = cen_B / (std_B + jnp.asarray(eps, jnp.float32))
  adv_B = jnp.where(mom.count == 1, reward_B if singleton == "raw" else 0.0, adv_B)
  return jnp.where(valid_B, adv_B, 0.0)


# --------------------------------------------------------------------------------------------
# The critic baseline (GAE).
# --------------------------------------------------------------------------------------------


class GAEOutput(NamedTuple):
  """`advantages` [B,T] (whitened unless asked otherwise) and value targets `returns` [B,T]."""
  advantages: Array
  returns: Array


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
  x_BT = outcome_to_token_rewards(reward_B, mask_BT)
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


def _next_value_at_valid(values_BT: Array, mask_BT: Array) -> Array:
  """`next_valid_value(values_BT, mask_BT)` at the valid positions (elsewhere unspecified;
  `values_BT` is 0 outside the mask). When the valid positions of every row form one run (a
  response without observation holes), the next valid position after a valid t is t+1 or
  none, so a shift gives it without the cummin and gather (a `lax.cond` on the batch)."""
  shift = lambda v, m: jnp.pad(v[:, 1:], ((0, 0), (0, 1)))
  return jax.lax.cond(rows_form_one_run(mask_BT), shift, next_valid_value, values_BT, mask_BT)


def gae(fn: str, *, reward: ArrayLike, values: ArrayLike, response_mask: ArrayLike,
        logprob_old: ArrayLike | None = None, logprob_ref: ArrayLike | None = None,
        token_reward: ArrayLike | None = None, gamma: float = 1.0, lam: float = 1.0,
        kl_coef: float = 0.0, whiten: bool = True) -> GAEOutput:
  """GAE over the valid tokens of each row (the body of the registered `gae_advantages`).

  .. math::
    δ_t = r_t + γ·V_{next valid} − V_t,    Â_t = δ_t + γλ·Â_{next valid}
    returns_t = Â_t + V_t,                  A = masked_whiten(Â, M)

  r_t = `token_rewards` (outcome on the last valid token, dense rewards, KL-in-reward).
  Masked positions pass V_next and the running Â through (`next_valid_value`,
  `discounted_reverse_cumsum`); for Python `gamma == lam == 1` the sum telescopes to
  Â_t = G_t − V_t and no scan is run. With Python-float γ and λ the discount γλ stays a
  Python float, so long rows without observation holes take the block products of
  `discounted_reverse_cumsum`. `fn` names the caller in error messages.

  Returns:
    GAEOutput(advantages [B,T], returns [B,T]); both zero outside the mask.
  """
  reward_B = jnp.asarray(reward, jnp.float32)
  values_BT = jnp.asarray(values, jnp.float32)
  mask_BT = jnp.asarray(response_mask)
  chex.assert_rank([reward_B, values_BT, mask_BT], [1, 2, 2])
  chex.assert_equal_shape([values_BT, mask_BT])
  chex.assert_equal_shape_prefix([reward_B, mask_BT], 1)
  mask_BT = mask_BT.astype(bool)
  x_BT = token_rewards(fn, reward_B, mask_BT, logprob_old, logprob_ref, token_reward, kl_coef)
  values_BT = jnp.where(mask_BT, values_BT, 0.0)
  if is_one(gamma) and is_one(lam):
    # γ = λ = 1 (verl's default): the TD errors telescope, Â_t = G_t − V_t exactly.
    if x_BT is None:   # outcome only: G_t = R on every valid token
      returns_BT = broadcast_to_tokens(reward_B, mask_BT)
    else:
      returns_BT = discounted_reverse_cumsum(x_BT, mask_BT, 1.0)
    adv_BT = jnp.where(mask_BT, returns_BT - values_BT, 0.0)
  else:
    if x_BT is None:
      x_BT = outcome_to_token_rewards(reward_B, mask_BT)
    g = jnp.asarray(gamma, jnp.float32)
    delta_BT = x_BT + g * _next_value_at_valid(values_BT, mask_BT) - values_BT
    if isinstance(gamma, (int, float)) and isinstance(lam, (int, float)):
      gl = float(gamma) * float(lam)
    else:
      gl = g * jnp.asarray(lam, jnp.float32)
    adv_BT = discounted_reverse_cumsum(delta_BT, mask_BT, gl)
    returns_BT = jnp.where(mask_BT, adv_BT + values_BT, 0.0)
  if whiten:
    adv_BT = masked_whiten(adv_BT, mask_BT)
  return GAEOutput(advantages=adv_BT, returns=returns_BT)
