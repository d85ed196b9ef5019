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
  Ties go to the earlier flattened [B,T] index. Computed without a sort
  (`ops.smallest_k_mask`, a radix select on the log-prob's bits). No gradient.

  Args:
    response_mask: [B,T] bool.
    logprob_old: [B,T] float sampled-token log-probs of the behaviour policy.
    token_fraction: f ∈ (0,1] (may be traced).

  Returns:
    [B,T] bool selection, False outside `response_mask`.

  Example:
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
    static_argnames=("mode",), returns_output=True,
                    confidence="code-verified",
                    source=(_PAPER + "; code: DripNowhy/On-Policy-Self-Adaptation "
                            "slime/tests/test_opsa.py, slime/tests/test_opsa_loss_mask.py, "
                            "slime/examples/opsa/run_opsa.sh, README"))
def opsa_advantages(*, response_mask: ArrayLike, entropy: ArrayLike, logprob_old: ArrayLike,
                    token_fraction: ArrayLike = 0.2, adv_min: ArrayLike = -1.0,
                    adv_max: ArrayLike = -0.5, fixed_advantage: ArrayLike = -0.5,
                    mode: Literal["entropy", "fixed"] = "entropy") -> OPSAOutput:
  """OPSA: push down the batch's lowest-probability sampled tokens, harder where uncertain.

  On-policy distillation's gains come mostly from pushing down sampled low-probability
  tokens, so OPSA drops the teacher (and the reward) and gives those tokens a fixed negative
  advantage that grows with the entropy::

    K = max(1, ⌊f · N⌋),   S = the K valid tokens with the lowest log π_old   (`opsa_select`)
    r_t = (H_t − min_S H) / (max_S H − min_S H)     (1 when all of S share one entropy)
    A_t = A_max + (A_min − A_max) · r_t  on S;   A_t = 0 and loss_mask_t = False elsewhere

  with N the valid tokens of the batch, f = 0.2, A_min = −1, A_max = −0.5.
  `mode="fixed"` gives every selected token `fixed_advantage` (the paper's ablation).

  Paper: "Does On-Policy Distillation Really Distill? From Noisy Teacher to
  Self-Improvement" (OPSA), arXiv 2608.31046, §3.2 and §4.2.

  Difference: the authors' loss averages over S only. An advantage cannot express that, so
  `loss_mask` returns S; the runner's loss averages over all response tokens, which scales
  the loss by about f. The pool is the whole batch given, not one data-parallel rank's.
  OPSA has no signal of correctness: on short answers the lowest-probability tokens are
  the answer itself (see the method's page).

  Args:
    response_mask: [B,T] bool, the policy's tokens.
    entropy: [B,T] float behaviour-policy entropy ("entropy" mode).
    logprob_old: [B,T] float behaviour-policy log-prob of the sampled token.
    token_fraction: f ∈ (0,1].
    adv_min: A_min, the advantage of the highest-entropy selected token.
    adv_max: A_max, the advantage of the lowest-entropy selected token.
    fixed_advantage: the advantage of every selected token in "fixed" mode.
    mode: static, "entropy" | "fixed".

  Returns:
    OPSAOutput(advantages [B,T] float32, loss_mask [B,T] bool), zero / False outside the
    selected tokens.

  Example:
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
