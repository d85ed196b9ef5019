"""OPSA: fixed negative advantages on the batch's lowest-probability tokens, scaled by entropy."""
from __future__ import annotations

from typing import Literal, NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["OPSAOutput", "opsa_advantages", "opsa_select"]

_PAPER = ('"Does On-Policy Distillation Really Distill? From Noisy Teacher to '
          'Self-Improvement" (OPSA, On-Policy Self-Adaptation; Ding, Zhang), arXiv 2608.31046; '
          "code github.com/DripNowhy/On-Policy-Self-Adaptation")
_MODES = ("entropy", "fixed")
# floor(f·N) guard: f·N computed in float32 may land just below an integer (0.3·10).
_FLOOR_TOL = 1e-4


class OPSAOutput(NamedTuple):
  """`advantages` [B,T] float32 (0 off the selected tokens) and `loss_mask` [B,T] bool, the
  selected tokens: the code drops every other token from the policy loss (numerator and
  denominator of its token mean)."""
  advantages: Array
  loss_mask: Array


def opsa_select(*, response_mask: ArrayLike, logprob_old: ArrayLike,
                token_fraction: ArrayLike = 0.2) -> Array:
  """The K = max(1, ⌊f·N⌋) valid tokens of the batch with the lowest log-prob ([B,T] bool).

  N counts the valid tokens of the whole batch (one pool); an empty batch selects nothing.
  Ties are broken by a stable sort on the flattened [B,T] index (row-major), an
  unspecified point in the code. Computed without a sort (`ops.smallest_k_mask`, a radix
  select on the log-prob's bits), with the same result. No gradient.

  Args:
    response_mask: [B,T] bool.
    logprob_old: [B,T] float sampled-token log-probs of the behaviour policy.
    token_fraction: f ∈ (0,1] (may be traced).

  Returns:
    [B,T] bool selection, False outside `response_mask`.

  >>> import numpy as np
  >>> s = opsa_select(response_mask=np.array([[1, 0, 1], [1, 1, 0]], bool),
  ...                 logprob_old=np.array([[-10., -9., -8.], [-7., -6., 0.]], np.float32),
  ...                 token_fraction=0.5)
  >>> np.asarray(s).tolist()
  [[True, False, True], [False, False, False]]
  """
  mask_BT = jnp.asarray(response_mask)
  lp_BT = jnp.asarray(logprob_old, jnp.float32)
  chex.assert_rank([mask_BT, lp_BT], 2)
  chex.assert_equal_shape([mask_BT, lp_BT])
  mask_BT = mask_BT.astype(bool)
  # Masked tokens enter as +inf (not as absent), so a valid +inf/NaN log-prob ties with
  # them by flat index exactly as in a stable argsort of the whole [B,T] key.
  key_BT = jax.lax.stop_gradient(jnp.where(mask_BT, lp_BT, jnp.inf))
  n = jnp.sum(mask_BT.astype(jnp.int32))
  frac = jnp.asarray(token_fraction, jnp.float32)
  k = jnp.floor(frac * n.astype(jnp.float32) + _FLOOR_TOL).astype(jnp.int32)
  k = jnp.where(n > 0, jnp.maximum(k, 1), 0)
  return ops.smallest_k_mask(key_BT, k) & mask_BT


@register_estimator(
    "opsa", needs=("response_mask", "entropy", "logprob_old"), paper=_PAPER,
    static_argnames=("mode",), returns_output=True)
def opsa_advantages(*, response_mask: ArrayLike, entropy: ArrayLike, logprob_old: ArrayLike,
                    token_fraction: ArrayLike = 0.2, adv_min: ArrayLike = -1.0,
                    adv_max: ArrayLike = -0.5, fixed_advantage: ArrayLike = -0.5,
                    mode: Literal["entropy", "fixed"] = "entropy") -> OPSAOutput:
  """OPSA: push down the batch's lowest-probability sampled tokens, harder where uncertain.

  Paper: "Does On-Policy Distillation Really Distill? From Noisy Teacher to
  Self-Improvement" (Yi Ding, Ruqi Zhang; Purdue), arXiv 2608.31046, §3.2 and §4.2:
  on-policy distillation gains come mostly from pushing down sampled low-probability
  tokens, so OPSA drops the teacher (and the reward) and gives those tokens a fixed
  negative advantage whose size grows with the entropy.

  Confidence: code-verified, against the authors' code DripNowhy/On-Policy-Self-Adaptation
  (a modified slime): the unit tests of `compute_opsa` (`slime/tests/test_opsa.py`,
  `test_opsa_loss_mask.py`), the launcher `slime/examples/opsa/run_opsa.sh`, its README and
  `README_zh.md` (method section); the implementation file
  `slime/backends/megatron_utils/opsa.py` itself was not retrievable. A paper digest
  quotes the same equations (A_dyn = −½ − (H − H_min)/(2(H_max − H_min))). Until 2026-10
  this module held our own guess from the abstract (A = −c·H/mean H on every token, an
  optional GRPO term); it was removed.

  .. math::
    N = #valid tokens in the batch,   K = max(1, ⌊f · N⌋)
    S = the K valid tokens with the lowest log π_old(y_t)          (`opsa_select`)
    r_t = (H_t − min_S H)/(max_S H − min_S H)    (r = 1 when all of S share one entropy)
    A_t = A_max + (A_min − A_max) · r_t  on S,   A_t = 0 and loss_mask_t = 0 elsewhere

  with f = 0.2, A_min = −1, A_max = −0.5, so A ∈ [−1, −0.5] on S. `mode="fixed"` is the
  paper's ablation: A = `fixed_advantage` (−0.5; the paper also tries +0.2) on S, no
  entropy (the `entropy` input is then unused). The code trains with PPO clip 0.2/0.2, no
  KL, no entropy bonus, no advantage normalisation, one sample per prompt.

  The loss: the code removes the tokens outside S from the policy loss — from the
  numerator and the denominator of its token mean. An advantage alone cannot express that:
  zeros outside S still count in the denominator of a token-mean loss. `loss_mask` returns
  S for a loss that takes it; the runner's policy loss currently averages over all
  `response_mask` tokens, so its loss is the code's scaled by |S| / N ≈ f (a constant
  learning-rate factor under token-mean aggregation; a per-row factor under sequence-mean
  aggregation). This difference is known and not hidden here.

  Measured on the credit bench (`pivotal`, a 2-layer policy, runner defaults, 2026-12-06):
  OPSA has no signal of correctness, and on short near-deterministic responses the batch's
  lowest-probability 20% are the answer's own tokens, not a noisy tail. Pushing them down
  moves their mass to the other tokens, the early stop token among them, and nothing pushes
  back: from the bench's warm-up (held-out greedy accuracy 0.39) to 0.00 by step 50 with every
  response the stop token alone (length 7 → 1); from the 600-step teacher (1.00, every sample
  right) to 0.17 by step 50 (length 7 → 2-3). The paper's regime is long reasoning by a strong
  model, where the low-probability tail is noise; there is no such tail here.

  Notes against the code: the code's log-probs are the actor's recomputed ones
  (`use_rollout_logprobs=False`), i.e. the behaviour policy before the update —
  `logprob_old` here; so is the entropy. The code's pool is the local batch of one
  data-parallel rank; here it is the whole batch given (under jit sharding, the global
  batch), so with DP > 1 the selection differs. ⌊f·N⌋ carries a 1e-4 tolerance against
  float32 round-off. Advantages and mask carry no gradient.

  Args:
    response_mask: [B,T] bool, the policy's tokens.
    entropy: [B,T] float behaviour-policy entropy at each position ("entropy" mode).
    logprob_old: [B,T] float behaviour-policy log-prob of the sampled token (selection).
    token_fraction: f ∈ (0,1], the fraction of valid tokens selected (0.2).
    adv_min: A_min, the advantage of the highest-entropy selected token (−1.0).
    adv_max: A_max, the advantage of the lowest-entropy selected token (−0.5).
    fixed_advantage: the advantage of every selected token in "fixed" mode (−0.5).
    mode: static, "entropy" (code default) | "fixed" (ablation).

  Returns:
    `OPSAOutput(advantages [B,T] float32, loss_mask [B,T] bool)`, zero / False outside
    the selected tokens.

  >>> import numpy as np
  >>> out = opsa_advantages(response_mask=np.array([[1, 0, 1], [1, 1, 0]], bool),
  ...                       logprob_old=np.array([[-10., -9., -8.], [-7., -6., 0.]], np.float32),
  ...                       entropy=np.array([[2., 99., 4.], [3., 1., 0.]], np.float32),
  ...                       token_fraction=0.5)
  >>> np.asarray(out.advantages).tolist(), np.asarray(out.loss_mask).tolist()
  ([[-0.5, 0.0, -1.0], [0.0, 0.0, 0.0]], [[True, False, True], [False, False, False]])
  """
  check_choice("opsa_advantages", "mode", mode, _MODES)
  for name, v in (("token_fraction", token_fraction), ("adv_min", adv_min),
                  ("adv_max", adv_max), ("fixed_advantage", fixed_advantage)):
    if isinstance(v, (int, float)):   # eager checks on Python numbers (traced values pass)
      if name == "token_fraction" and not 0.0 < v <= 1.0:
        raise ValueError(f"opsa_advantages: token_fraction must lie in (0, 1], got {v}")
      if name == "fixed_advantage" and v == 0.0:
        raise ValueError("opsa_advantages: fixed_advantage must be non-zero")
  if (isinstance(adv_min, (int, float)) and isinstance(adv_max, (int, float))
      and adv_min > adv_max):
    raise ValueError(f"opsa_advantages: adv_min={adv_min} must be <= adv_max={adv_max}")
  mask_BT = jnp.asarray(response_mask)
  ent_BT = jnp.asarray(entropy, jnp.float32)
  chex.assert_rank([mask_BT, ent_BT], 2)
  chex.assert_equal_shape([mask_BT, ent_BT])
  sel_BT = opsa_select(response_mask=mask_BT, logprob_old=logprob_old,
                       token_fraction=token_fraction)
  if mode == "entropy":
    ent_BT = jnp.where(sel_BT, ent_BT, 0.0)
    h_min = jnp.min(jnp.where(sel_BT, ent_BT, jnp.inf))
    h_max = jnp.max(jnp.where(sel_BT, ent_BT, -jnp.inf))
    span = h_max - h_min
    ok = jnp.isfinite(span) & (span > 0)
    r_BT = jnp.where(ok, (ent_BT - jnp.where(ok, h_min, 0.0)) / jnp.where(ok, span, 1.0), 1.0)
    a_min = jnp.asarray(adv_min, jnp.float32)
    a_max = jnp.asarray(adv_max, jnp.float32)
    adv_BT = a_max + (a_min - a_max) * r_BT
  else:
    adv_BT = jnp.broadcast_to(jnp.asarray(fixed_advantage, jnp.float32), sel_BT.shape)
  adv_BT = jax.lax.stop_gradient(jnp.where(sel_BT, adv_BT, 0.0))
  return OPSAOutput(advantages=adv_BT, loss_mask=sel_BT)
