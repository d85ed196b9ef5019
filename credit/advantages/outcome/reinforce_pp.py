"""REINFORCE++ (token returns whitened over the batch) and REINFORCE++-baseline.

Registers `reinforce_pp` and `reinforce_pp_baseline` (the variant for multi-sample
prompts: group-mean baseline, then batch whitening).
"""
from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.ops.baselines import is_one, token_rewards
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["reinforce_pp_advantages", "reinforce_pp_baseline_advantages"]

_PAPER = ("REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models, "
          "arXiv 2501.03262")


@register_estimator("reinforce_pp", needs=("reward", "response_mask"), paper=_PAPER,
                    static_argnames=("whiten",),
                    optional_needs={"logprob_old": "kl_coef", "logprob_ref": "kl_coef"})
def reinforce_pp_advantages(*, reward: ArrayLike, response_mask: ArrayLike,
                            logprob_old: ArrayLike | None = None,
                            logprob_ref: ArrayLike | None = None,
                            token_reward: ArrayLike | None = None, gamma: float = 1.0,
                            kl_coef: float = 0.0, whiten: bool = True) -> Array:
  """REINFORCE++: discounted token returns whitened over the whole batch.

  Confidence: code-verified (verl `compute_reinforce_plus_plus_outcome_advantage` and
  `torch_functional.masked_whiten`).

  Paper: "REINFORCE++", arXiv 2501.03262, §3 (token-level KL penalty in the
  reward, global advantage normalisation); `shared/methods/outcome_and_clipping.md` §4.

  .. math::
    r_t = R·1[t = last valid] + token_reward_t − β·(logprob_old_t − logprob_ref_t)
    G_t = r_t + γ·G_{next valid t'}      (masked positions skipped)
    A   = masked_whiten(G, M)            (mean/unbiased var over all valid tokens)

  Deviation: masked positions are skipped (`ops.discounted_reverse_cumsum`): they
  neither add to nor cut the running return, as GAE does over observation tokens (spec
  §5). verl (checked at commit b178a3c, 2026-01) resets the running return at *every*
  masked position, so a mid-response observation token cuts the return of the tokens
  before it. Identical for right-padded single-turn responses.
  `logprob_old`/`logprob_ref`/`token_reward` are optional (the registry lists
  `reward, response_mask` as needs and the two log-probs as optional needs switched on by
  `kl_coef`); the KL term needs both log-probs.

  With outcome reward only, the return has a closed form
  `G_t = R·γ^{(valid tokens after t)}` (one reverse cumsum instead of a scan),
  and for a Python `gamma == 1` it is the row constant R, whitened in O(B). With
  dense terms and a Python `gamma == 1` the return is a reverse cumsum.

  Args:
    reward: [B] outcome rewards.
    response_mask: [B,T] bool.
    logprob_old, logprob_ref: optional [B,T] behaviour/reference log-probs.
    token_reward: optional [B,T] dense rewards added before the return.
    gamma: discount (may be traced).
    kl_coef: β of the k1 KL-in-reward penalty.
    whiten: static; False returns the raw returns G.

  Returns:
    [B,T] float32 advantages, zero outside the mask.

  >>> import numpy as np
  >>> m = np.array([[1, 1, 0], [1, 1, 1]], bool)
  >>> a = reinforce_pp_advantages(reward=np.array([1., 0.]), response_mask=m)
  >>> np.round(np.asarray(a, np.float64), 4).tolist()
  [[1.0954, 1.0954, 0.0], [-0.7303, -0.7303, -0.7303]]
  """
  reward_B = jnp.asarray(reward, jnp.float32)
  mask_BT = jnp.asarray(response_mask)
  chex.assert_rank([reward_B, mask_BT], [1, 2])
  chex.assert_equal_shape_prefix([reward_B, mask_BT], 1)
  mask_BT = mask_BT.astype(bool)
  x_BT = token_rewards("reinforce_pp_advantages", reward_B, mask_BT, logprob_old, logprob_ref,
                       token_reward, kl_coef)
  if x_BT is None and is_one(gamma):
    len_B = ops.sequence_lengths(mask_BT)
    adv_B = ops.weighted_whiten(reward_B, len_B) if whiten else reward_B
    return ops.broadcast_to_tokens(adv_B, mask_BT)
  if x_BT is None:
    maskf_BT = mask_BT.astype(jnp.float32)
    after_BT = jax.lax.cumsum(maskf_BT, axis=1, reverse=True) - maskf_BT  # valid tokens after t
    g = jnp.asarray(gamma, jnp.float32)
    ret_BT = jnp.where(mask_BT, reward_B[:, None] * jnp.power(g, after_BT), 0.0)
  else:
    ret_BT = ops.discounted_reverse_cumsum(x_BT, mask_BT, gamma)
  return ops.masked_whiten(ret_BT, mask_BT) if whiten else ret_BT


@register_estimator("reinforce_pp_baseline", needs=("reward", "group_id", "response_mask"),
                    paper=_PAPER, static_argnames=("num_groups", "group_size", "singleton"))
def reinforce_pp_baseline_advantages(*, reward: ArrayLike, group_id: ArrayLike,
                                     response_mask: ArrayLike, num_groups: int,
                                     group_size: int | None = None,
                                     singleton: Literal["zero", "raw"] = "zero") -> Array:
  """REINFORCE++-baseline: group-mean baseline, then whitening over the batch tokens.

  Confidence: code-verified (verl
  `compute_reinforce_plus_plus_baseline_outcome_advantage`).

  Paper: "REINFORCE++", arXiv 2501.03262 (the "-baseline" variant for
  multi-sample prompts); `shared/methods/outcome_and_clipping.md` §4.

  .. math::
    s_i = R_i − μ_g,   A = masked_whiten(s_i · M, M)

  verl whitens the broadcast [B,T] tile, so a row weighs by its length; computed
  here as a length-weighted whitening on [B] (`ops.weighted_whiten`), identical in
  value. Singletons: verl keeps R_i (μ=0); here 0 unless `singleton="raw"`.

  Args/Returns: as `dr_grpo_advantages`.
  """
  check_choice("reinforce_pp_baseline_advantages", "singleton", singleton, ops.SINGLETONS)
  reward_B, gid_B, mask_BT, valid_B = ops.group_rows(
      "reinforce_pp_baseline_advantages", reward, group_id, num_groups, group_size,
      response_mask=response_mask)
  cen_B = ops.group_normalize(reward_B, gid_B, num_groups, valid=valid_B, scale=False,
                              singleton=singleton, group_size=group_size)
  len_B = jnp.where(valid_B, ops.sequence_lengths(mask_BT), 0.0)
  return ops.broadcast_to_tokens(ops.weighted_whiten(cen_B, len_B), mask_BT)
