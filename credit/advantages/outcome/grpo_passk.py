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
                                     "singleton"),
                    confidence="code-verified",
                    source=(_PAPER + "; code: volcengine/verl@b178a3c "
                            "verl/trainer/ppo/core_algos.py "
                            "compute_grpo_passk_outcome_advantage; code: "
                            "RUCAIBox/Passk_Training code/passk_adv.py"))
def grpo_passk_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                          num_groups: int, group_size: int | None = None,
                          method: Literal["best_vs_second", "analytic"] = "best_vs_second",
                          k: int = 4, scale: bool = True, eps: float = 1e-6,
                          singleton: Literal["zero", "raw"] = "zero") -> Array:
  """Pass@k-style group advantages, in two published forms.

  `method="best_vs_second"` credits only the unique best response of a group::

    a_i = (R_i − max_{j≠i} R_j)_+ / (σ_g + ε)        (σ-division iff `scale`)

  so a tie at the top gives 0 to all. `method="analytic"` is Pass@k Training's analytic
  advantage: with n responses of which c are correct (R > 0)::

    ρ = 1 − C(n−c, k) / C(n, k),   σ = sqrt(ρ(1 − ρ))
    A_correct = (1 − ρ) / (σ + ε)
    A_wrong   = (1 − ρ − C(n−c−1, k−1) / C(n−1, k−1)) / (σ + ε)

  Papers: "Pass@k Training for Adaptively Balancing Exploration and Exploitation of Large
  Reasoning Models", arXiv 2508.10751, §3.3 ("analytic"); the best-vs-second form is
  verl's `grpo_passk`, after arXiv 2503.19595. Differences: "correct" means R > 0 (the
  authors' code maps only rewards exactly 1 and 0); k > n is read as k = n; a one-row
  group gives 0 (verl raises).

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int32 group ids (unused with `group_size`).
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    method: static, "best_vs_second" | "analytic".
    k: static Python int >= 1 (the k of pass@k; "analytic" only).
    scale: static bool ("best_vs_second" only).
    eps: added to the std.
    singleton: "zero" | "raw".

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> kw = dict(reward=np.array([1., 0, 0, 0]), group_id=np.zeros(4, np.int32),
    ...           response_mask=np.ones((4, 2), bool), num_groups=1)
    >>> np.round(np.asarray(grpo_passk_advantages(**kw)[:, 0], np.float64), 4).tolist()
    [2.0, 0.0, 0.0, 0.0]
    >>> a = grpo_passk_advantages(**kw, method="analytic", k=2)
    >>> np.round(np.asarray(a[:, 0], np.float64), 4).tolist()
    [1.0, -0.3333, -0.3333, -0.3333]
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
