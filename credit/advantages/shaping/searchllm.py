"""SearchLLM: gated aggregation of constraint and objective scores, then GRPO."""
from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["searchllm_advantages"]

_PAPER = "Aligning Large Language Models with Searcher Preferences (SearchLLM), arXiv 2603.10473"
_MODES = ("hard", "soft")


def _check_weights(fn: str, weights, num_obj: int):
  """[Co] weights normalised to sum 1 (uniform when None); concrete ones are checked."""
  if weights is None:
    return jnp.full((num_obj,), 1.0 / num_obj, jnp.float32)
  w = jnp.asarray(weights, jnp.float32)
  chex.assert_shape(w, (num_obj,))
  if not isinstance(w, jax.core.Tracer):
    wn = np.asarray(w)
    if np.any(wn < 0) or not wn.sum() > 0:
      raise ValueError(f"{fn}: weights must be >= 0 with a positive sum, got {wn.tolist()}")
  return ops.safe_div(w, jnp.sum(w))


@register_estimator("searchllm", needs=("reward_components", "group_id", "response_mask"),
                    paper=_PAPER,
                    static_argnames=("num_groups", "group_size", "num_gates", "mode",
                                     "singleton"),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def searchllm_advantages(*, reward_components: ArrayLike, group_id: ArrayLike,
                         response_mask: ArrayLike, num_groups: int,
                         group_size: int | None = None, num_gates: int = 1,
                         thresholds: ArrayLike = 1.0, weights: ArrayLike | None = None,
                         r_fail: float = 0.0, mode: Literal["hard", "soft"] = "hard",
                         eps: float = 1e-6,
                         singleton: Literal["zero", "raw"] = "zero") -> Array:
  """SearchLLM: constraint scores gate the weighted objective score; GRPO on the result.

  The first `num_gates` columns of `reward_components` are bottom-line constraints
  (factual grounding, basic quality, format), the rest behaviour objectives (robustness,
  user-need alignment)::

    s_i    = Σ_c w_c obj_{i,c}                         (w ≥ 0, normalised to Σ w = 1)
    hard:  pass_i = Π_c 1[gate_{i,c} ≥ τ_c],   R_i = pass_i s_i + (1 − pass_i) r_fail
    soft:  R_i = (min_c gate_{i,c}) s_i                (gates in [0, 1])
    A = GRPO(R)

  With `num_gates=0` every row passes. A group failing the gates everywhere has equal
  rewards and zero advantages (pair with a DAPO filter).

  Paper: "Aligning Large Language Models with Searcher Preferences", arXiv 2603.10473
  (its Gated Aggregation Strategy). The thresholds, r_fail and the soft variant are this
  library's.

  Args:
    reward_components: [B,R] float scores, gates first.
    group_id: [B] int group ids (unused with `group_size`).
    response_mask: [B,T] bool.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    num_gates: static number of gate columns, 0 ≤ num_gates < R.
    thresholds: τ, scalar or [num_gates] (hard mode).
    weights: [R − num_gates] objective weights (default uniform).
    r_fail: reward of a row failing a gate (hard mode).
    mode: static "hard" | "soft".
    eps: added to σ.
    singleton: static "zero" | "raw".

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> c = np.array([[1., .8], [0., .9], [1., .4], [1., .8]])   # gate, objective
    >>> a = searchllm_advantages(reward_components=c, group_id=np.zeros(4, np.int32),
    ...                          response_mask=np.ones((4, 2), bool), num_groups=1)
    >>> np.round(np.asarray(a[:, 0], np.float64), 4).tolist()   # R = [.8, 0, .4, .8]
    [0.7833, -1.3056, -0.2611, 0.7833]
  """
  fn = "searchllm_advantages"
  check_choice(fn, "mode", mode, _MODES)
  check_choice(fn, "singleton", singleton, ops.SINGLETONS)
  comps_BR = jnp.asarray(reward_components, jnp.float32)
  chex.assert_rank(comps_BR, 2)
  num_comp = comps_BR.shape[1]
  if (not isinstance(num_gates, int) or isinstance(num_gates, bool)
      or not 0 <= num_gates < num_comp):
    raise ValueError(f"{fn}: num_gates must be a Python int in [0, {num_comp}) (the "
                     f"reward_components columns before the objectives), got {num_gates!r}")
  _, gid_B, mask_BT, valid_B = ops.group_rows(fn, comps_BR[:, 0], group_id, num_groups,
                                              group_size, response_mask=response_mask)
  gate_BC = comps_BR[:, :num_gates]
  obj_BO = comps_BR[:, num_gates:]
  w_O = _check_weights(fn, weights, num_comp - num_gates)
  s_B = jnp.sum(obj_BO * w_O[None, :], axis=1)
  if mode == "hard":
    tau = jnp.asarray(thresholds, jnp.float32)
    if tau.ndim:
      chex.assert_shape(tau, (num_gates,))
    tau_C = jnp.broadcast_to(tau, (num_gates,))
    pass_B = jnp.all(gate_BC >= tau_C[None, :], axis=1)
    R_B = jnp.where(pass_B, s_B, r_fail)
  else:
    gmin_B = jnp.min(gate_BC, axis=1) if num_gates else jnp.ones_like(s_B)
    R_B = gmin_B * s_B
  R_B = jnp.where(valid_B, R_B, 0.0)
  adv_B = ops.group_normalize(R_B, gid_B, num_groups, valid=valid_B, eps=eps,
                              singleton=singleton, group_size=group_size)
  return ops.broadcast_to_tokens(adv_B, mask_BT)
