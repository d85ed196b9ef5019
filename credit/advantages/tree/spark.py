"""SPARK: generative-PRM step verdicts aggregated into the reward, format-gated, then GRPO."""
from __future__ import annotations

from typing import Any, Literal

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice
from credit.contract import ContractError, validate_fields
from credit.ops._cast import as_f32
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["spark_advantages", "spark_rewards", "validate_spark_inputs", "AGGREGATIONS"]

_PAPER = ("SPARK: Stepwise Process-Aware Rewards for Reference-Free Reinforcement Learning "
          "(Rahman et al.), arXiv 2512.03244")
AGGREGATIONS = ("min", "mean", "last")


def spark_rewards(*, step_reward: ArrayLike, step_mask: ArrayLike, format_ok: ArrayLike,
                  aggregation: Literal["min", "mean", "last"] = "min",
                  format_penalty: ArrayLike = 0.0) -> Array:
  """R_b = agg_k verdict_{b,k} over the valid steps, or `format_penalty` on a format failure.

  A row with no valid step is a format failure. Returns [B] float32 (see `spark_advantages`).

  >>> import numpy as np
  >>> kw = dict(step_reward=np.array([[1., 1., 0.]]), step_mask=np.ones((1, 3), bool),
  ...           format_ok=np.array([True]))
  >>> [round(float(spark_rewards(aggregation=a, **kw)[0]), 6) for a in ("min", "mean", "last")]
  [0.0, 0.666667, 0.0]
  """
  check_choice("spark_rewards", "aggregation", aggregation, AGGREGATIONS)
  v_BK = as_f32(step_reward)
  ok_BK = jnp.asarray(step_mask)
  fmt_B = jnp.asarray(format_ok)
  chex.assert_rank([v_BK, ok_BK, fmt_B], [2, 2, 1])
  chex.assert_equal_shape([v_BK, ok_BK])
  chex.assert_equal_shape_prefix([v_BK, fmt_B], 1)
  ok_BK, fmt_B = ok_BK.astype(bool), fmt_B.astype(bool)
  v_BK = jnp.where(ok_BK, v_BK, 0.0)
  n_B = jnp.sum(ok_BK.astype(jnp.float32), axis=1)
  if aggregation == "min":
    agg_B = jnp.min(jnp.where(ok_BK, v_BK, jnp.inf), axis=1)
  elif aggregation == "mean":
    agg_B = jnp.sum(v_BK, axis=1) / jnp.maximum(n_B, 1.0)
  else:
    K = v_BK.shape[1]
    last = jnp.max(jnp.where(ok_BK, jnp.arange(K)[None, :], -1), axis=1)
    agg_B = jnp.take_along_axis(v_BK, jnp.clip(last, 0, K - 1)[:, None], axis=1)[:, 0]
  good_B = fmt_B & (n_B > 0)
  return jnp.where(good_B, agg_B, jnp.asarray(format_penalty, jnp.float32))


@register_estimator(
    "spark", needs=("step_reward", "step_mask", "format_ok", "group_id", "response_mask"),
    paper=_PAPER, static_argnames=("num_groups", "group_size", "aggregation", "singleton"),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def spark_advantages(*, step_reward: ArrayLike, step_mask: ArrayLike, format_ok: ArrayLike,
                     group_id: ArrayLike | None, response_mask: ArrayLike, num_groups: int,
                     group_size: int | None = None,
                     aggregation: Literal["min", "mean", "last"] = "min",
                     format_penalty: ArrayLike = 0.0, eps: ArrayLike = 1e-6,
                     singleton: Literal["zero", "raw"] = "zero") -> Array:
  """SPARK: GRPO on the format-gated aggregate of a generative PRM's step verdicts.

  A generative PRM judges each step of a response; its verdicts v[b,k] ∈ {0, 1} (1 = a
  correct step) are the reward, and format checks block reward hacking::

    R_b = agg over the valid steps of v[b,k]   if format_ok_b and the row has a valid step
    R_b = format_penalty                       otherwise
    A[b,t] = GRPO(R)_b · M[b,t]

  `aggregation`: "min" (one wrong step fails the solution), "mean" (the fraction of
  correct steps), "last" (the final step's verdict). Soft scores in [0, 1] also work. The
  `reward` field is not used (SPARK is reference-free).

  Paper: "SPARK: Stepwise Process-Aware Rewards for Reference-Free Reinforcement
  Learning", arXiv 2512.03244. The aggregations and the penalty are this library's reading
  of the abstract.

  Args:
    step_reward: [B,K] float step verdicts (read where `step_mask`).
    step_mask: [B,K] bool, the parsed steps.
    format_ok: [B] bool, the response passed the format checks.
    group_id: [B] int prompt group; unused when `group_size` is set.
    response_mask: [B,T] bool policy tokens.
    num_groups: static number of groups.
    group_size: static G of the contiguous fast path.
    aggregation: static, "min" | "mean" | "last".
    format_penalty: the reward of a format failure (0, or −1).
    eps: ε on the GRPO std.
    singleton: "zero" | "raw".

  Returns:
    [B,T] float32 advantages, zero outside `response_mask`.

  Example:
    >>> import numpy as np
    >>> a = spark_advantages(step_reward=np.array([[1., 1.], [1., 0.]]),
    ...     step_mask=np.ones((2, 2), bool), format_ok=np.array([True, True]),
    ...     group_id=np.zeros(2, np.int32), response_mask=np.ones((2, 1), bool), num_groups=1)
    >>> np.round(np.asarray(a[:, 0], np.float64), 5).tolist()
    [0.70711, -0.70711]
  """
  check_choice("spark_advantages", "aggregation", aggregation, AGGREGATIONS)
  r_B = spark_rewards(step_reward=step_reward, step_mask=step_mask, format_ok=format_ok,
                      aggregation=aggregation, format_penalty=format_penalty)
  return ops.grpo_token_advantages("spark_advantages", reward=r_B, group_id=group_id,
                                   response_mask=response_mask, num_groups=num_groups,
                                   group_size=group_size, eps=eps, singleton=singleton)


def validate_spark_inputs(*, num_groups: int | None = None, binary: bool = True,
                          **fields: Any) -> None:
  """Eager checks before tracing: contract shapes/dtypes, finite verdicts under `step_mask`,
  a non-empty `response_mask`, and (with `binary`) verdicts in {0, 1}."""
  validate_fields(fields, num_groups=num_groups, where="spark")
  if binary:
    v = np.asarray(fields["step_reward"])[np.asarray(fields["step_mask"]).astype(bool)]
    if not np.all((v == 0) | (v == 1)):
      raise ContractError("spark: `step_reward` must hold verdicts in {0, 1} under "
                          "`step_mask` (pass binary=False for soft scores)")
