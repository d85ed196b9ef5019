"""OPSA: entropy-scaled fixed negative token advantages (on-policy distillation without a teacher)."""
from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.advantages.token._redistribute import GROUP_STDS, sequence_advantage
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["opsa_advantages"]

_PAPER = ('"Does On-Policy Distillation Really Distill? From Noisy Teacher to '
          'Self-Improvement" (OPSA), arXiv preprint (id not retrieved)')
_MODES = ("entropy", "constant")


@register_estimator(
    "opsa", needs=("response_mask", "entropy"), paper=_PAPER,
    static_argnames=("num_groups", "group_size", "mode", "group_std"),
    optional_needs={"reward": "outcome_coef", "group_id": "outcome_coef"})
def opsa_advantages(*, response_mask: ArrayLike, entropy: ArrayLike,
                    reward: ArrayLike | None = None, group_id: ArrayLike | None = None,
                    num_groups: int | None = None, group_size: int | None = None,
                    coef: ArrayLike = 1.0, outcome_coef: ArrayLike = 0.0,
                    mode: Literal["entropy", "constant"] = "entropy",
                    group_std: Literal["unbiased", "population", "none"] = "unbiased",
                    eps: ArrayLike = 1e-6) -> Array:
  """OPSA: a fixed negative advantage per token, growing with the position's entropy.

  Confidence: inferred (from the abstract; the formula is the spec's design,
  `shared/methods/token_and_implicit.md` §10). The abstract of "Does On-Policy
  Distillation Really Distill? From Noisy Teacher to Self-Improvement" argues that
  on-policy distillation gains come mostly from pushing down sampled low-probability
  tokens, and replaces the teacher's per-token advantage by a fixed negative one whose
  size depends on the entropy. No equations, arXiv id or code were found (pages, code and
  issues searches for the title and "OPSA", 2026); the related digests found concern other
  OPD analyses (arXiv 2605.11182, 2604.13016).

  .. math::
    A_{b,t} = −c · H_{b,t} / (mean_{valid (b,t) in the batch} H + ε) + λ_o · Â_b

  `mode="constant"` is the paper's ablation with one fixed negative constant, A = −c
  (entropy-independent). λ_o = `outcome_coef` adds the GRPO sequence advantage Â_b
  (`reward`, `group_id` then required). The advantage carries no gradient. Use it with a
  token policy-gradient loss (PPO clip allowed), as on-policy distillation does.

  Notes: on-policy, E[−c ∇log π] = 0, so the effect comes from finite samples (sampled
  tail tokens are pushed down; the mass goes to the others), not from the expectation.
  The normaliser is a batch statistic (one mean over every valid token), so a row's
  values depend on the rest of the batch; rows outside `response_mask` take no part in it.
  Negative entropies are clipped to 0; an all-zero entropy gives 0 (mode "entropy").

  Args:
    response_mask: [B,T] bool, the policy's tokens.
    entropy: [B,T] float policy entropy at each position.
    reward: optional [B] float outcome rewards (for the outcome term).
    group_id: optional [B] int group ids in [0, num_groups) (for the outcome term; unused
      when `group_size` is set).
    num_groups: static number of groups (needed with `reward`).
    group_size: static G for contiguous groups (fast [N,G] path).
    coef: c ≥ 0, the size of the negative advantage (1.0).
    outcome_coef: λ_o, weight of the GRPO term (0.0: none; needs `reward`).
    mode: static, "entropy" (spec) | "constant" (A = −c).
    group_std: static, std of the GRPO term: "unbiased" | "population" | "none".
    eps: added to the batch mean entropy and to the group std.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  >>> import numpy as np
  >>> h = np.array([[0.1, 1.0, 2.0], [0.5, 0.5, 0.0]], np.float32)
  >>> m = np.array([[1, 1, 1], [1, 1, 0]], bool)
  >>> np.round(np.asarray(opsa_advantages(response_mask=m, entropy=h), np.float64), 4).tolist()
  [[-0.122, -1.2195, -2.439], [-0.6098, -0.6098, 0.0]]
  """
  check_choice("opsa_advantages", "mode", mode, _MODES)
  check_choice("opsa_advantages", "group_std", group_std, GROUP_STDS)
  mask_BT = jnp.asarray(response_mask)
  ent_BT = jnp.asarray(entropy, jnp.float32)
  chex.assert_rank([mask_BT, ent_BT], 2)
  chex.assert_equal_shape([mask_BT, ent_BT])
  mask_BT = mask_BT.astype(bool)
  coef = jnp.asarray(coef, jnp.float32)
  if mode == "entropy":
    ent_BT = jnp.where(mask_BT, jnp.maximum(ent_BT, 0.0), 0.0)
    norm = ops.masked_mean(ent_BT, mask_BT) + jnp.asarray(eps, jnp.float32)
    adv_BT = -coef * ent_BT / norm
  else:
    adv_BT = jnp.broadcast_to(-coef, mask_BT.shape)
  if reward is not None:
    if num_groups is None:
      raise ValueError("opsa_advantages: num_groups is required with `reward` "
                       "(the outcome term is a group advantage)")
    rows = ops.group_rows("opsa_advantages", reward, group_id, num_groups, group_size,
                          response_mask=mask_BT)
    adv_B = sequence_advantage(rows.values, rows.group_id, rows.valid, num_groups=num_groups,
                               group_size=group_size, group_std=group_std, eps=eps)
    adv_BT = adv_BT + jnp.asarray(outcome_coef, jnp.float32) * adv_B[:, None]
  elif isinstance(outcome_coef, (int, float)) and outcome_coef != 0:
    raise ValueError("opsa_advantages: outcome_coef != 0 needs `reward` and `group_id`")
  return jax.lax.stop_gradient(jnp.where(mask_BT, adv_BT, 0.0))
