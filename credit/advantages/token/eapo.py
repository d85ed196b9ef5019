"""EAPO: the GRPO sequence advantage redistributed by token entropy and the advantage's sign."""
from __future__ import annotations

import math
from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.advantages.token._redistribute import redistribute, signed_weights
from credit.ops.baselines import GROUP_STDS, sequence_advantage
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["eapo_advantages", "eapo_entropy_scores", "eapo_kappa"]

_PAPER = ("Surprising Success, Repeated Failure: Entropy-Guided Credit Assignment for "
          "Exploration in LLM Reasoning (Yeo, Kang, Lee, Park, Baek, Hwang), arXiv 2609.33781 "
          "(EAPO, Entropic Advantage Policy Optimization; code github.com/wgcyeo/EAPO)")
_NORMS = ("batch_quantile", "row_zscore_tanh")
_WEIGHTINGS = ("exp", "linear")
# Denominator guard of the code's min-max (`normalize_token_entropies`).
_QUANTILE_EPS = 1e-8


def eapo_entropy_scores(*, response_mask: ArrayLike, entropy: ArrayLike,
                        norm: Literal["batch_quantile", "row_zscore_tanh"] = "batch_quantile",
                        quantiles: tuple[float, float] = (0.10, 0.90),
                        eps: ArrayLike = 1e-6) -> Array:
  """EAPO's normalised token entropy h[b,t] (no gradient), 0 outside the mask.

  `norm="batch_quantile"` (the authors' code) is a robust min-max over the batch::

    h[b,t] = clip((H[b,t] − q_lo) / (q_hi − q_lo + 1e-8), 0, 1)

  with q_lo, q_hi the linearly interpolated quantiles `quantiles` of the entropy over every
  valid token of the batch (one pool, so a row's scores depend on the other rows),
  computed by a radix select (`ops.masked_quantiles`) rather than a sort.
  `norm="row_zscore_tanh"` is tanh((H − μ_b)/(σ_b + ε)) with the row's mean and
  (population) std.

  Args:
    response_mask: [B,T] bool.
    entropy: [B,T] float policy entropy.
    norm: static, "batch_quantile" | "row_zscore_tanh".
    quantiles: static (q_lo, q_hi), 0 ≤ q_lo < q_hi ≤ 1.
    eps: added to σ_b ("row_zscore_tanh").

  Returns:
    [B,T] float32 scores, 0 outside the mask.

  Example:
    >>> import numpy as np
    >>> h = eapo_entropy_scores(response_mask=np.ones((1, 4), bool),
    ...                         entropy=np.array([[0.2, 1.5, 0.4, 0.9]], np.float32))
    >>> np.round(np.asarray(h, np.float64), 4).tolist()
    [[0.0, 1.0, 0.1321, 0.6038]]
  """
  check_choice("eapo_entropy_scores", "norm", norm, _NORMS)
  q_lo, q_hi = (float(q) for q in quantiles)
  if not 0.0 <= q_lo < q_hi <= 1.0:
    raise ValueError(f"eapo_entropy_scores: quantiles must satisfy 0 <= q_lo < q_hi <= 1, "
                     f"got {tuple(quantiles)}")
  mask_BT = jnp.asarray(response_mask)
  ent_BT = jnp.asarray(entropy, jnp.float32)
  chex.assert_rank([mask_BT, ent_BT], 2)
  chex.assert_equal_shape([mask_BT, ent_BT])
  mask_BT = mask_BT.astype(bool)
  ent_BT = jnp.where(mask_BT, ent_BT, 0.0)
  if norm == "batch_quantile":
    lo, hi = ops.masked_quantiles(ent_BT, mask_BT, (q_lo, q_hi))
    s_BT = jnp.clip((ent_BT - lo) / (hi - lo + _QUANTILE_EPS), 0.0, 1.0)
  else:
    mean_B = ops.masked_mean(ent_BT, mask_BT, axis=-1)
    dev_BT = jnp.where(mask_BT, ent_BT - mean_B[:, None], 0.0)
    var_B = ops.masked_mean(jnp.square(dev_BT), mask_BT, axis=-1)
    z_BT = dev_BT / (ops.safe_sqrt(var_B) + jnp.asarray(eps, jnp.float32))[:, None]
    s_BT = jnp.tanh(z_BT)
  return jax.lax.stop_gradient(jnp.where(mask_BT, s_BT, 0.0))


def eapo_kappa(kappa: ArrayLike, step: ArrayLike, decay_steps: int = 0) -> Array:
  """The code's optional linear κ decay: κ · (1 − min(step/decay_steps, 1)).

  `decay_steps` 0 (the code's default) keeps κ constant. The estimator is stateless: a
  caller that wants the decay evaluates this once per rollout batch, as the code does, and
  passes the result as `kappa`.

  Example:
    >>> float(eapo_kappa(2.0, step=50, decay_steps=200))
    1.5
  """
  kappa = jnp.asarray(kappa, jnp.float32)
  if decay_steps <= 0:
    return kappa
  frac = jnp.minimum(jnp.asarray(step, jnp.float32) / float(decay_steps), 1.0)
  return kappa * (1.0 - frac)


def _exp_weights(adv_B: Array, s_BT: Array, mask_BT: Array, kappa, renormalize: bool) -> Array:
  """w = exp(κ sign(Â) s) on valid tokens; shifted by the row max first when renormalising
  (the shift cancels in the mean-1 normalisation, as in the code)."""
  z_BT = jnp.asarray(kappa, jnp.float32) * jnp.sign(adv_B)[:, None] * s_BT
  z_BT = jnp.where(mask_BT, z_BT, 0.0)
  if renormalize:
    zmax_B = jnp.max(jnp.where(mask_BT, z_BT, -jnp.inf), axis=-1)
    z_BT = z_BT - jnp.where(jnp.any(mask_BT, axis=-1), zmax_B, 0.0)[:, None]
  return jnp.where(mask_BT, jnp.exp(z_BT), 0.0)


@register_estimator(
    "eapo", needs=("reward", "group_id", "response_mask", "entropy"), paper=_PAPER,
    static_argnames=("num_groups", "group_size", "group_std", "renormalize", "weighting",
                     "entropy_norm", "entropy_quantiles"),
                    confidence="code-verified",
                    source=(_PAPER + "; code: wgcyeo/EAPO src/trainers/eapo_trainer.py "
                            "(normalize_token_entropies, eapo_token_advantages), "
                            "src/training_args_default.py"))
def eapo_advantages(*, reward: ArrayLike, group_id: ArrayLike | None, response_mask: ArrayLike,
                    entropy: ArrayLike, num_groups: int, group_size: int | None = None,
                    kappa: ArrayLike = math.log(4.0), alpha: ArrayLike = 0.5,
                    weighting: Literal["exp", "linear"] = "exp",
                    entropy_norm: Literal["batch_quantile", "row_zscore_tanh"] = "batch_quantile",
                    entropy_quantiles: tuple[float, float] = (0.10, 0.90),
                    renormalize: bool = True,
                    group_std: Literal["unbiased", "population", "none"] = "unbiased",
                    eps: ArrayLike = 1e-6) -> Array:
  """EAPO: the GRPO sequence advantage reweighted by exp(κ · sign(Â) · normalised entropy).

  In a success (Â > 0) high-entropy "forking" tokens get more credit; in a failure
  (Â < 0) confident low-entropy tokens get more blame. With h the batch-normalised entropy
  (`eapo_entropy_scores`)::

    r[b,t] = exp(κ · sign(Â_b) · h[b,t])
    w[b,t] = r[b,t] / mean_t r[b,t]       (`renormalize=True`)
    A[b,t] = Â_b · w[b,t]

  κ = log 4 bounds the credit ratio of two tokens of a response by 4. w > 0 keeps the
  verifier's sign, Σ_t A = L_b Â_b, Â = 0 gives w = 1, and the weights carry no gradient.

  Paper: "Surprising Success, Repeated Failure: Entropy-Guided Credit Assignment for
  Exploration in LLM Reasoning" (EAPO), arXiv 2609.33781. As the authors' code, the
  entropy is the behaviour policy's and the quantiles pool the whole batch; its κ decay
  schedule is `eapo_kappa` (pass its value as `kappa`). `weighting="linear"` and
  `entropy_norm="row_zscore_tanh"` are alternatives of this library's.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int group ids (unused, may be None, with `group_size`).
    response_mask: [B,T] bool, the policy's tokens.
    entropy: [B,T] float behaviour-policy entropy at each position.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    kappa: κ ≥ 0 of "exp" (log 4; 0 is GRPO).
    alpha: α of "linear": w = max(1 + α sign(Â) s, 0) (keep ≤ 1).
    weighting: static, "exp" (code) | "linear".
    entropy_norm: static, "batch_quantile" (code) | "row_zscore_tanh".
    entropy_quantiles: static (q_lo, q_hi) of "batch_quantile", (0.1, 0.9).
    renormalize: static, mean weight 1 per response (code); False uses w as is.
    group_std: static, "unbiased" | "population" | "none".
    eps: added to the group std and to the entropy std of "row_zscore_tanh".

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> h = np.tile(np.array([[0.2, 1.5, 0.4, 0.9]], np.float32), (2, 1))
    >>> a = eapo_advantages(reward=np.array([1., 0.]), group_id=np.zeros(2, np.int32),
    ...                     response_mask=np.ones((2, 4), bool), entropy=h, num_groups=1,
    ...                     group_std="population")
    >>> np.round(np.asarray(a, np.float64), 4).tolist()
    [[0.4792, 1.9168, 0.5931, 1.0109], [-1.5798, -0.3949, -1.2764, -0.7489]]
  """
  check_choice("eapo_advantages", "group_std", group_std, GROUP_STDS)
  check_choice("eapo_advantages", "weighting", weighting, _WEIGHTINGS)
  rows = ops.group_rows("eapo_advantages", reward, group_id, num_groups, group_size,
                        response_mask=response_mask)
  adv_B = sequence_advantage(rows.values, rows.group_id, rows.valid, num_groups=num_groups,
                             group_size=group_size, group_std=group_std, eps=eps)
  mask_BT = rows.mask & rows.valid[:, None]
  s_BT = eapo_entropy_scores(response_mask=mask_BT, entropy=entropy, norm=entropy_norm,
                             quantiles=entropy_quantiles, eps=eps)
  if weighting == "exp":
    w_BT = _exp_weights(adv_B, s_BT, mask_BT, kappa, renormalize)
  else:
    w_BT = signed_weights(adv_B, s_BT, mask_BT, alpha=alpha)
  return redistribute(adv_B, jax.lax.stop_gradient(w_BT), mask_BT, renormalize=renormalize)
