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
                    optional_needs={"format_ok": "format_gate"},
                    confidence="inferred",
                    source=_PAPER + ", abstract")
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

  A reasoning reward model scores each atomic thought of a response; their mean is mixed
  with the outcome under a weight that decays over training, so the dense signal guides
  early training and the outcome dominates later::

    λ     = λ0 · clip(1 − train_step / total_steps, 0, 1)     (λ0 when total_steps is None)
    ATR_i = Σ_s m_{i,s} score_{i,s} / Σ_s m_{i,s}              (0 with no thoughts)
    R_i   = λ ATR_i + (1 − λ) o_i                              (r_fail if format_ok_i is false)
    A     = GRPO(R)                                            (unbiased σ, ε on σ)

  Paper: "Atom-Searcher: Enhancing Agentic Deep Research via Fine-Grained Atomic Thought
  Reward", arXiv 2508.12800. The paper states a linear decay of the thought-reward weight
  and an F1 outcome; λ0 = 0.5, the decay to 0 at `total_steps` and r_fail = −1 (the format
  penalty of DeepResearcher, on which it builds) are this library's choices.

  Args:
    reward: [B] outcome o (the final answer's F1 in deep research).
    step_reward: [B,K] float score of each atomic thought.
    step_mask: [B,K] bool, thoughts present.
    group_id: [B] int group ids (unused with `group_size`).
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    format_ok: optional [B] bool, the response follows the output format.
    lambda0: λ0, the thought-reward weight at step 0.
    train_step: current training step (may be traced; the runner passes its RL step).
    total_steps: step at which λ reaches 0 (may be traced), or None: constant λ0.
    format_gate: static; require `format_ok` (a `format_ok` given anyway is applied too).
    r_fail: reward of a format-invalid row.
    eps: added to σ.
    singleton: static "zero" | "raw".

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = atom_searcher_advantages(
    ...     reward=np.array([1., 0.]), step_reward=np.array([[1., .5], [.5, .5]]),
    ...     step_mask=np.ones((2, 2), bool), group_id=np.zeros(2, np.int32),
    ...     response_mask=np.ones((2, 2), bool), num_groups=1)   # R = [0.875, 0.25]
    >>> np.round(np.asarray(a[:, 0], np.float64), 4).tolist()
    [0.7071, -0.7071]
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
