"""Pass@k-style group advantages: best-vs-second (verl) and the analytic Pass@k form."""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice, check_int
from credit.ops.baselines import apply_singleton
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["grpo_passk_advantages"]

_PAPER = ("Pass@k Training for Adaptively Balancing Exploration and Exploitation of Large "
          "Reasoning Models, arXiv 2508.10751 (analytic); verl grpo_passk after arXiv 2503.19595")
_METHODS = ("best_vs_second", "analytic")


@register_estimator("grpo_passk", needs=("reward", "group_id", "response_mask"), paper=_PAPER,
                    static_argnames=("num_groups", "group_size", "method", "k", "scale",
                                     "singleton"))
def grpo_passk_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                          num_groups: int, group_size: int | None = None,
                          method: Literal["best_vs_second", "analytic"] = "best_vs_second",
                          k: int = 4, scale: bool = True, eps: float = 1e-6,
                          singleton: Literal["zero", "raw"] = "zero") -> Array:
  """Pass@k-style group advantages (two published forms).

  Confidence: code-verified (verl `compute_grpo_passk_outcome_advantage` for
  "best_vs_second"; RUCAIBox/Passk_Training `code/passk_adv.py` for "analytic").

  `method="best_vs_second"` (verl `compute_grpo_passk_outcome_advantage`, after
  arXiv 2503.19595): only the best response of a group is credited,

  .. math::
    a_i = (R_i − max_{j≠i} R_j)_+ / (σ_g + ε)     (σ-division iff `scale`)

  i.e. r_max − r_second for the unique arg-max and 0 for every other row (a
  tie at the top gives 0 to all, as in verl, without picking an index).

  `method="analytic"` (Pass@k Training, arXiv 2508.10751, §3.3 analytic
  advantage): with n responses of which c are correct (R_i > 0),

  .. math::
    ρ = 1 − C(n−c, k)/C(n, k),   σ = sqrt(ρ(1−ρ))
    A_pos = (1 − ρ)/(σ + ε),     A_neg = (1 − ρ − C(n−c−1, k−1)/C(n−1, k−1))/(σ + ε)

  Ratios of binomials are evaluated as products of k static factors; k > n is
  read as k = n (pass@n). Deviation: the reference code maps only rewards
  exactly 1/0; here correct means R > 0 (binary 0/1 or ±1 rewards agree).
  `scale` is unused by "analytic". Singletons give 0 (verl raises).

  Args/Returns: as `grpo_advantages`; `method`, `k` (a Python int >= 1) and `scale`
  are static.
  """
  check_choice("grpo_passk_advantages", "method", method, _METHODS)
  check_choice("grpo_passk_advantages", "singleton", singleton, ops.SINGLETONS)
  check_int("grpo_passk_advantages", "k", k)
  reward_B, gid_B, mask_BT, valid_B = ops.group_rows(
      "grpo_passk_advantages", reward, group_id, num_groups, group_size,
      response_mask=response_mask)
  n_B = ops.group_count_rows(gid_B, valid_B, num_groups, group_size)
  if method == "best_vs_second":
    gmax_B = ops.group_reduce_rows(reward_B, gid_B, valid_B, num_groups, group_size, "max")
    at_max = valid_B & (reward_B == gmax_B)
    n_at_max = ops.group_reduce_rows(at_max.astype(jnp.float32), gid_B, valid_B, num_groups,
                                     group_size, "sum")
    below = jnp.where(reward_B < gmax_B, reward_B, -jnp.inf)
    second_B = ops.group_reduce_rows(below, gid_B, valid_B, num_groups, group_size, "max")
    unique_best = at_max & (n_at_max == 1) & (n_B > 1)
    gap_B = jnp.where(unique_best, gmax_B - jnp.where(unique_best, second_B, gmax_B), 0.0)
    if scale:
      std_B = ops.group_moments_rows(reward_B, gid_B, valid_B, num_groups, group_size).std
      gap_B = gap_B / (std_B + eps)
    adv_B = gap_B
  else:
    correct_B = valid_B & (reward_B > 0)
    c_B = ops.group_reduce_rows(correct_B.astype(jnp.float32), gid_B, valid_B, num_groups,
                                group_size, "sum")
    miss = jnp.ones_like(n_B)   # C(n−c, k)/C(n, k)
    miss1 = jnp.ones_like(n_B)  # C(n−c−1, k−1)/C(n−1, k−1)
    for i in range(k):
      miss = miss * jnp.where(i < n_B, jnp.maximum(n_B - c_B - i, 0.0)
                              / jnp.maximum(n_B - i, 1.0), 1.0)
      if i < k - 1:
        miss1 = miss1 * jnp.where(i < n_B - 1, jnp.maximum(n_B - c_B - 1.0 - i, 0.0)
                                  / jnp.maximum(n_B - 1.0 - i, 1.0), 1.0)
    rho = 1.0 - miss
    sigma = ops.safe_sqrt(rho * (1.0 - rho))
    adv_B = jnp.where(correct_B, (1.0 - rho) / (sigma + eps),
                      (1.0 - rho - miss1) / (sigma + eps))
  adv_B = apply_singleton(adv_B, reward_B, n_B, singleton)
  return ops.broadcast_to_tokens(jnp.where(valid_B, adv_B, 0.0), mask_BT)
