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

  `norm="batch_quantile"` (the authors' code, `normalize_token_entropies` in
  wgcyeo/EAPO `src/trainers/eapo_trainer.py`): a robust min-max over the batch,

  .. math::
    h_{b,t} = clip((H_{b,t} − q_lo)/(q_hi − q_lo + 1e-8), 0, 1)  ∈ [0,1]

  with q_lo, q_hi the linear-interpolation quantiles `quantiles` (10%, 90%) of the entropy
  over every valid token of the batch (one pool, so a row's scores depend on the other
  rows; the code gathers the pool across processes), computed by a radix select
  (`ops.masked_quantiles`) instead of a sort, with the same result. `norm="row_zscore_tanh"` (our earlier
  design, kept as an option): s = tanh((H − μ_b)/(σ_b + ε)) ∈ (−1,1) with μ_b, σ_b
  (population) over the valid tokens of row b.

  Args:
    response_mask: [B,T] bool.
    entropy: [B,T] float policy entropy.
    norm: static, "batch_quantile" | "row_zscore_tanh".
    quantiles: static (q_lo, q_hi) of "batch_quantile", 0 ≤ q_lo < q_hi ≤ 1.
    eps: added to σ_b ("row_zscore_tanh").

  Returns:
    [B,T] float32 scores, 0 outside the mask.

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
  """The code's optional linear κ decay: κ · (1 − min(step/decay_steps, 1)); `decay_steps`
  0 (the code's default, `eapo_kappa_decay_steps`) keeps κ constant.

  The estimator is stateless: a caller that wants the decay evaluates this once per rollout
  batch (as the code does) and passes the result as `kappa`.

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
                     "entropy_norm", "entropy_quantiles"))
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

  Paper: "Surprising Success, Repeated Failure: Entropy-Guided Credit Assignment for
  Exploration in LLM Reasoning" (Yeo, Kang, Lee, Park, Baek, Hwang; KAIST), arXiv
  2609.33781 — EAPO, *Entropic* Advantage Policy Optimization.

  Confidence: code-verified, against the authors' code wgcyeo/EAPO
  `src/trainers/eapo_trainer.py` (`normalize_token_entropies`, `eapo_token_advantages`,
  `EAPOTrainer._generate_and_score_completions`) and `src/training_args_default.py`
  (defaults); a paper review quotes the same equation (its Proposition 1: the weight is the
  solution of a KL-to-uniform regularised problem). Until 2026-10 this module cited a
  different paper (arXiv 2604.11056, He et al., "Entropy-Aware Policy Optimization") and
  used a linear form of our own; that form is kept as options (below).

  .. math::
    h_{b,t} = clip((H_{b,t} − q_10)/(q_90 − q_10 + 1e-8), 0, 1)   (quantiles over the batch)
    r_{b,t} = exp(κ · sign(Â_b) · h_{b,t})
    w_{b,t} = r_{b,t} / mean_{valid t} r_{b,t}                      (`renormalize=True`)
    A_{b,t} = Â_b · w_{b,t}

  κ = log 4 bounds the raw credit ratio between two tokens of a response by 4. In a
  success (Â > 0) high-entropy ("forking") tokens get more credit; in a failure (Â < 0)
  confident low-entropy tokens get more blame. w > 0, so every token keeps the verifier's
  sign, and Σ_t A_{b,t} = L_b Â_b (the response keeps its credit). Â = 0 gives w = 1.
  Weights carry no gradient.

  Notes against the code:
    * The entropy quantiles are one statistic of the whole batch passed in (the code
      gathers them over all processes of a rollout batch), so a row's weights depend on
      the other rows. Rows outside `response_mask` or outside [0, num_groups) take no part.
    * H is the rollout (behaviour) policy's entropy, computed once per batch, as in the
      code (weights stay fixed across the PPO epochs of a batch).
    * The code's κ schedule (`eapo_kappa_decay_steps`, off by default) needs the training
      step; this estimator is stateless, so pass `eapo_kappa(kappa, step, decay_steps)`.
    * Â_b: the code uses TRL GRPO with `scale_rewards="group"` (unbiased group std, our
      default); TRL's ε is 1e-4, ours 1e-6 (`eps`). Its loss is DAPO's token mean with
      ε_low 0.2 / ε_high 0.28 and no KL; G = 8.

  Options: `weighting="linear"` (ours, earlier): w = max(1 + α sign(Â) s, 0), α = `alpha`;
  `entropy_norm="row_zscore_tanh"` (ours, earlier): s = tanh of the per-response entropy
  z-score (see `eapo_entropy_scores`). The earlier default is `weighting="linear",
  entropy_norm="row_zscore_tanh"`. Reductions: κ = 0 (or α = 0 for "linear"), an entropy
  that is constant over the batch, or a one-token response give GRPO. Singleton groups,
  all-equal groups, fully masked rows and out-of-range group ids give exact zeros.

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int group of each row in [0, num_groups); unused (may be None) when
      `group_size` is set.
    response_mask: [B,T] bool, the policy's tokens.
    entropy: [B,T] float behaviour-policy entropy at each position.
    num_groups: static number of groups (segment path).
    group_size: static G for contiguous groups (fast [N,G] path).
    kappa: κ ≥ 0 of "exp" (log 4, the code's default; 0 = GRPO).
    alpha: α of "linear" (keep ≤ 1 so w ≥ 0).
    weighting: static, "exp" (code) | "linear" (ours).
    entropy_norm: static, "batch_quantile" (code) | "row_zscore_tanh" (ours).
    entropy_quantiles: static (q_lo, q_hi) of "batch_quantile" ((0.1, 0.9), the code's).
    renormalize: static, mean weight 1 per response (code); False uses w as is.
    group_std: static, "unbiased" | "population" | "none" (no std division).
    eps: added to the group std and to the entropy std of "row_zscore_tanh".

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

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
