"""VeRPO (unit tests): difficulty-weighted partial credit from unit tests, then GRPO.

Not the distillation estimator `verpo` (credit/advantages/distill/verpo.py).
"""
from __future__ import annotations

from typing import Literal, NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_choice, check_int
from credit.ops.baselines import grpo_scalar
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["VeRPOTestsState", "VeRPOTestsOutput", "verpo_tests_init_state",
           "verpo_tests_advantages"]

_PAPER = ("VeRPO: dense reward from difficulty-weighted unit tests combined with the global "
          "outcome, arXiv preprint")
_DIFFICULTY = ("group", "ema")
_SCALES = ("group", "batch", "none")
# Test columns a state holds by default (`verpo_tests_init_state(P, num_tests=...)`).
DEFAULT_NUM_TESTS = 32


class VeRPOTestsState(NamedTuple):
  """Cross-step pass rates per prompt slot and unit test.

  rate: [P,U_max] float32 EMA of the group pass rate of each test.
  seen: [P,U_max] bool, the test has had a valid result for the prompt before.
  """
  rate: Array
  seen: Array


class VeRPOTestsOutput(NamedTuple):
  """`advantages` [B,T] and the updated `state` (None when none was given)."""
  advantages: Array
  state: VeRPOTestsState | None


def verpo_tests_init_state(num_prompts: int,
                           num_tests: int = DEFAULT_NUM_TESTS) -> VeRPOTestsState:
  """Empty pass-rate statistics for `num_prompts` prompt slots and up to `num_tests` tests."""
  check_int("verpo_tests_init_state", "num_prompts", num_prompts)
  check_int("verpo_tests_init_state", "num_tests", num_tests)
  return VeRPOTestsState(rate=jnp.zeros((num_prompts, num_tests), jnp.float32),
                         seen=jnp.zeros((num_prompts, num_tests), bool))


@register_estimator("verpo_tests", needs=("test_pass", "test_mask", "group_id",
                                          "response_mask", "prompt_id"),
                    paper=_PAPER,
                    static_argnames=("num_groups", "group_size", "difficulty", "scale",
                                     "singleton"),
                    returns_output=True, init_state=verpo_tests_init_state,
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def verpo_tests_advantages(*, test_pass: ArrayLike, test_mask: ArrayLike,
                           group_id: ArrayLike, response_mask: ArrayLike,
                           prompt_id: ArrayLike | None = None,
                           state: VeRPOTestsState | None = None, num_groups: int,
                           group_size: int | None = None, alpha: float = 0.5,
                           decay: float = 0.9,
                           difficulty: Literal["group", "ema"] = "group",
                           scale: Literal["group", "batch", "none"] = "group",
                           eps: float = 1e-6,
                           singleton: Literal["zero", "raw"] = "zero") -> VeRPOTestsOutput:
  """VeRPO: difficulty-weighted fraction of passed unit tests, blended under the outcome.

  Passing a test that most of the group fails is worth more than passing an easy one::

    π_{g,u} = mean_{i ∈ g} pass_{i,u}       (difficulty="group"; "ema": the prompt's EMA)
    w_{i,u} = (1 − π_{g,u}) / Σ_{u'} (1 − π_{g,u'})      (uniform when the sum is 0)
    d_i     = Σ_u w_{i,u} pass_{i,u},     o_i = Π_u pass_{i,u}
    R_i     = o_i + (1 − o_i) α d_i
    A_i     = (R_i − μ_g)/(σ_g + ε) ("group") | (R_i − μ_g)/(σ_B + ε) ("batch") | R_i − μ_g ("none")

  over the row's valid tests; a row with no valid test gets R = 0. `scale="none"` keeps
  the partial-credit differences of an all-failing group at their size instead of blowing
  them up to unit scale. The optional state keeps each prompt's EMA of the pass rates
  (`verpo_tests_init_state(P, num_tests)`); it is updated whenever it is given.

  Paper: VeRPO (difficulty-weighted unit tests as dense reward, arXiv preprint). The
  abstract describes the weighting; the formula above, α and the EMA are this library's.

  Args:
    test_pass: [B,U] float 1 when the response passes test u, 0 when it fails.
    test_mask: [B,U] bool tests the prompt has.
    group_id: [B] int group ids (unused with `group_size`).
    response_mask: [B,T] bool.
    prompt_id: [B] int slot of each row's prompt in `state` (needed with a state).
    state: `VeRPOTestsState` [P,U_max], or None.
    num_groups: static number of groups.
    group_size: static G for contiguous groups.
    alpha: weight α of the partial credit (< 1 keeps a failed row below a passing one).
    decay: EMA decay of the pass rates in the state.
    difficulty: static "group" | "ema" (needs the state).
    scale: static "group" | "batch" | "none".
    eps: added to σ.
    singleton: static "zero" | "raw".

  Returns:
    VeRPOTestsOutput(advantages [B,T] float32, state VeRPOTestsState or None).

  Example:
    >>> import numpy as np
    >>> p = np.array([[1., 1, 1], [1, 1, 0], [1, 0, 0], [0, 0, 0]])
    >>> out = verpo_tests_advantages(test_pass=p, test_mask=np.ones((4, 3), bool),
    ...                              group_id=np.zeros(4, np.int32),
    ...                              response_mask=np.ones((4, 2), bool), num_groups=1)
    >>> np.round(np.asarray(out.advantages[:, 0], np.float64), 4).tolist()
    [1.4606, -0.1826, -0.5477, -0.7303]
  """
  fn = "verpo_tests_advantages"
  check_choice(fn, "difficulty", difficulty, _DIFFICULTY)
  check_choice(fn, "scale", scale, _SCALES)
  check_choice(fn, "singleton", singleton, ops.SINGLETONS)
  if difficulty == "ema" and state is None:
    raise ValueError(f"{fn}: difficulty='ema' needs a state (verpo_tests_init_state)")
  if state is not None and prompt_id is None:
    raise ValueError(f"{fn}: a state needs prompt_id")
  pass_BU = jnp.asarray(test_pass, jnp.float32)
  tm_BU = jnp.asarray(test_mask).astype(bool)
  chex.assert_rank([pass_BU, tm_BU], 2)
  chex.assert_equal_shape([pass_BU, tm_BU])
  _, gid_B, mask_BT, valid_B = ops.group_rows(fn, pass_BU[:, 0], group_id, num_groups,
                                              group_size, response_mask=response_mask)
  U = pass_BU.shape[1]
  ok_BU = tm_BU & valid_B[:, None]
  pass_BU = jnp.where(ok_BU, pass_BU, 0.0)
  okf_BU = ok_BU.astype(jnp.float32)

  # Group pass rate of every test, gathered to the rows, and its valid count.
  # Reduced over the valid rows, so that every valid row reads its group's values (also a
  # row without test u: rows of one prompt write the same state entry).
  def group_rate(p_B, ok_B):
    n_B = ops.group_reduce_rows(ok_B.astype(jnp.float32), gid_B, valid_B, num_groups,
                                group_size, "sum")
    s_B = ops.group_reduce_rows(p_B, gid_B, valid_B, num_groups, group_size, "sum")
    return ops.safe_div(s_B, n_B), jnp.where(valid_B, n_B, 0.0)

  rate_BU, count_BU = jax.vmap(group_rate, in_axes=(1, 1), out_axes=1)(pass_BU, ok_BU)

  new_state = None
  if state is not None:
    pid_B = jnp.asarray(prompt_id)
    chex.assert_rank(pid_B, 1)
    chex.assert_type(pid_B, int)
    chex.assert_equal_shape([pid_B, gid_B])
    old_PU = jnp.asarray(state.rate, jnp.float32)
    seen_PU = jnp.asarray(state.seen).astype(bool)
    chex.assert_rank([old_PU, seen_PU], 2)
    chex.assert_equal_shape([old_PU, seen_PU])
    P, U_max = old_PU.shape
    if U > U_max:
      raise ValueError(f"{fn}: {U} tests but the state holds num_tests={U_max}; build it with "
                       f"verpo_tests_init_state(num_prompts, num_tests>={U})")
    pid_B = pid_B.astype(jnp.int32)
    in_B = valid_B & (pid_B >= 0) & (pid_B < P)
    safe_B = jnp.clip(pid_B, 0, P - 1)
    old_BU = old_PU[safe_B, :U]
    seen_BU = seen_PU[safe_B, :U]
    has_BU = in_B[:, None] & (count_BU > 0)
    ema_BU = jnp.where(seen_BU, decay * old_BU + (1.0 - decay) * rate_BU, rate_BU)
    ema_BU = jnp.where(has_BU, ema_BU, old_BU)
    idx_B = jnp.where(in_B, pid_B, P)
    new_state = VeRPOTestsState(
        rate=old_PU.at[idx_B, :U].set(ema_BU, mode="drop"),
        seen=seen_PU.at[idx_B, :U].set(seen_BU | has_BU, mode="drop"))
    if difficulty == "ema":
      rate_BU = jnp.where(in_B[:, None] & (seen_BU | has_BU), ema_BU, rate_BU)

  hard_BU = (1.0 - rate_BU) * okf_BU
  n_tests_B = jnp.sum(okf_BU, axis=1)
  hard_B = jnp.sum(hard_BU, axis=1)
  w_BU = jnp.where((hard_B > 0)[:, None], ops.safe_div(hard_BU, hard_B[:, None]),
                   ops.safe_div(okf_BU, n_tests_B[:, None]))
  dense_B = jnp.sum(w_BU * pass_BU, axis=1)
  outcome_B = jnp.prod(jnp.where(ok_BU, pass_BU, 1.0), axis=1)
  outcome_B = jnp.where(n_tests_B > 0, outcome_B, 0.0)
  reward_B = outcome_B + (1.0 - outcome_B) * alpha * dense_B
  adv_B = grpo_scalar(reward_B, gid_B, valid_B, num_groups, group_size, scale, eps, singleton)
  adv_B = jnp.where(valid_B, adv_B, 0.0)
  return VeRPOTestsOutput(advantages=ops.broadcast_to_tokens(adv_B, mask_BT), state=new_state)
