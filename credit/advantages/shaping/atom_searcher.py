"""Atom-Searcher: atomic-thought reward mixed with the outcome on a decaying schedule; GRPO."""
from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["atom_searcher_advantages", "atom_searcher_weight"]

_PAPER = ("Atom-Searcher: Enhancing Agentic Deep Research via Fine-Grained Atomic Thought "
          "Reward, arXiv 2508.12800")


def atom_searcher_weight(step: ArrayLike, total_steps: ArrayLike | None,
                         lambda0: ArrayLike = 0.5) -> Array:
  """λ(step) = λ0 · clip(1 − step/total_steps, 0, 1); λ0 when `total_steps` is None."""
  lam0 = jnp.asarray(lambda0, jnp.float32)
  if total_steps is None:
    return lam0
  frac = ops.safe_div(jnp.asarray(step, jnp.float32), jnp.asarray(total_steps, jnp.float32))
  return lam0 * jnp.clip(1.0 - frac, 0.0, 1.0)


@register_estimator("atom_searcher", needs=("reward", "step_reward", "step_mask", "group_id",
                                            "response_mask"),
                    paper=_PAPER,
                    static_argnames=("num_groups", "group_size", "format_gate", "singleton"),
                    optional_needs={"format_ok": "format_gate"})
def atom_searcher_advantages(*, reward: ArrayLike, step_reward: ArrayLike,
                             step_mask: ArrayLike, group_id: ArrayLike,
                             response_mask: ArrayLike, num_groups: int,
                             group_size: int | None = None, format_ok: ArrayLike | None = None,
                             lambda0: float = 0.5, train_step: ArrayLike = 0,
                             total_steps: ArrayLike | None = None,
                             format_gate: bool = False, r_fail: float = -1.0,
                             eps: float = 1e-6,
                             singleton: Literal["zero", "raw"] = "zero") -> Array:
  """Atom-Searcher: λ(step)·(mean atomic-thought score) + (1 − λ(step))·outcome, then GRPO.

  Confidence: inferred from abstract (`shared/methods/outcome_and_clipping.md` §17; the
  authors' repository antgroup/Research-Venus holds a README, a demo and an inference
  notebook, no training code; the README and paper summaries say only that the ATR weight
  decays linearly as training proceeds and the outcome is F1, 2026-12). λ0 = 0.5, the
  linear decay to 0 at `total_steps` and r_fail = −1 (the format penalty of
  DeepResearcher, on which the paper builds) are recalled, not read from code.

  Paper: "Atom-Searcher: Enhancing Agentic Deep Research via Fine-Grained Atomic Thought
  Reward", arXiv 2508.12800.

  .. math::
    λ     = λ0 · clip(1 − train_step / total_steps, 0, 1)     (λ0 when total_steps is None)
    ATR_i = Σ_s m_{i,s} score_{i,s} / Σ_s m_{i,s}      (0 with no thoughts)
    R_i   = λ · ATR_i + (1 − λ) · o_i                  (r_fail where format_ok_i is false)
    A     = GRPO(R)     (unbiased σ, ε on σ)

  `train_step` and `total_steps` may be traced arrays (the runner passes its RL step as an
  array, so it does not recompile, and `total_steps` = its step count unless set). With `format_gate=True` (static; the registry then
  asks for `format_ok`) format-invalid rows get `r_fail` whatever their scores; a
  `format_ok` given without the switch is applied too.

  Args:
    reward: [B] outcome o (F1 of the final answer in deep research).
    step_reward: [B,K] float RRM score of each atomic thought.
    step_mask: [B,K] bool atomic thoughts present.
    group_id, response_mask, num_groups, group_size: as `grpo_advantages`.
    format_ok: optional [B] bool, the response follows the output format.
    lambda0: λ0, the process weight at step 0.
    train_step: current training step (scalar, may be traced; the runner passes its RL step).
    total_steps: step at which λ reaches 0 (scalar, may be traced), or None: constant λ0.
    format_gate: static; require `format_ok`.
    r_fail: reward of a format-invalid row.
    eps: added to σ. singleton: static "zero" | "raw".

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.
  """
  fn = "atom_searcher_advantages"
  check_choice(fn, "singleton", singleton, ops.SINGLETONS)
  if format_gate and format_ok is None:
    raise ValueError(f"{fn}: format_gate=True needs format_ok")
  if isinstance(total_steps, (int, float)) and not total_steps > 0:
    raise ValueError(f"{fn}: total_steps must be > 0 (or None), got {total_steps!r}")
  o_B, gid_B, mask_BT, valid_B = ops.group_rows(fn, reward, group_id, num_groups,
                                                group_size, response_mask=response_mask)
  score_BK = jnp.asarray(step_reward, jnp.float32)
  sm_BK = jnp.asarray(step_mask).astype(bool)
  chex.assert_rank([score_BK, sm_BK], 2)
  chex.assert_equal_shape([score_BK, sm_BK])
  chex.assert_equal_shape_prefix([score_BK, o_B], 1)
  chex.assert_rank(jnp.asarray(train_step), 0)
  atr_B = ops.masked_mean(score_BK, sm_BK, axis=1)  # 0 with no thoughts
  lam = atom_searcher_weight(train_step, total_steps, lambda0)
  R_B = lam * atr_B + (1.0 - lam) * o_B
  if format_ok is not None:
    fok_B = jnp.asarray(format_ok).astype(bool)
    chex.assert_shape(fok_B, o_B.shape)
    R_B = jnp.where(fok_B, R_B, r_fail)
  R_B = jnp.where(valid_B, R_B, 0.0)
  adv_B = ops.group_normalize(R_B, gid_B, num_groups, valid=valid_B, eps=eps,
                              singleton=singleton, group_size=group_size)
  return ops.broadcast_to_tokens(adv_B, mask_BT)
