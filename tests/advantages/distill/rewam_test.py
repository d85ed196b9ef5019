"""ReWAM self-distillation and stopping targets (credit/advantages/distill/rewam.py)."""
from __future__ import annotations

import chex
import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

from credit.advantages.distill import rewam_advantages, rewam_stop_targets
from tests.advantages.outcome._harness import Case, reference_test, valid_groups
from tests.advantages.shaping._behaviour_ref import check_properties, z_rows
from tests.advantages.shaping._harness_a import jcall

FIELDS = ("reward", "group_id", "response_mask", "logprob_old", "logprob_alt")


def ref_rewam(b, teacher_coef=0.1, teacher_clip=1.0, scale="group"):
  valid, groups = valid_groups(b)
  r = b["reward"].astype(np.float64)
  out = np.zeros(len(r))
  for rows in groups:
    for i, a in z_rows(r, rows, scale == "group").items():
      out[i] = a
  on = b["response_mask"] & valid[:, None]
  gap = np.where(on, b["logprob_alt"].astype(np.float64) - b["logprob_old"], 0.0)
  teach = np.clip(gap, -teacher_clip, teacher_clip)
  adv = np.where(b["response_mask"], out[:, None] + teacher_coef * teach, 0.0)
  return adv, teach


CASES = [
    Case("rewam", "rewam", FIELDS, ref_rewam),
    Case("rewam_wide", "rewam", FIELDS, ref_rewam,
         (("teacher_coef", 1.0), ("teacher_clip", 0.5), ("scale", "none"))),
]

test_matches_numpy_reference = reference_test(CASES)

STUDENT = np.log(np.array([[0.5, 0.5], [0.5, 0.5]], np.float32))
TEACHER = np.log(np.array([[0.9, 0.5], [0.5, 0.1]], np.float32))


def test_worked_example():
  # GRPO of R = [1, 0]: ±0.7071. Teacher log-ratios: log(0.9/0.5) = 0.5878, 0, 0, and
  # log(0.1/0.5) = −1.609, clipped to −1. A = GRPO + 0.1·s.
  out = jcall(rewam_advantages, reward=np.array([1., 0], np.float32),
              group_id=np.zeros(2, np.int32), response_mask=np.ones((2, 2), bool),
              logprob_old=STUDENT, logprob_alt=TEACHER, num_groups=1)
  np.testing.assert_allclose(out.teacher, [[0.587787, 0], [0, -1]], atol=1e-5)
  np.testing.assert_allclose(out.advantages, [[0.765886, 0.707107], [-0.707107, -0.807107]],
                             atol=1e-5)


def test_teacher_term_has_no_gradient():
  g = jax.grad(lambda lp: jnp.sum(rewam_advantages(
      reward=jnp.array([1., 0]), group_id=jnp.zeros(2, jnp.int32),
      response_mask=jnp.ones((2, 2), bool), logprob_old=STUDENT, logprob_alt=lp,
      num_groups=1).advantages))(jnp.asarray(TEACHER))
  assert np.all(np.asarray(g) == 0)


def test_stop_targets_worked_example_and_reference():
  v = np.array([[0.2, 0.6, 0.6, 0.5], [0.1, 0.3, 0.35, 0.0]], np.float32)
  m = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], bool)
  np.testing.assert_array_equal(rewam_stop_targets(step_value=v, step_mask=m),
                                [[0, 1, 1, 1], [0, 0, 1, 0]])
  np.testing.assert_array_equal(rewam_stop_targets(step_value=v, step_mask=m, tolerance=0.1),
                                [[0, 1, 1, 1], [0, 1, 1, 0]])
  rng = np.random.default_rng(0)
  v, m = rng.random((8, 5)).astype(np.float32), rng.random((8, 5)) > 0.3
  got = np.asarray(rewam_stop_targets(step_value=v, step_mask=m, tolerance=0.05))
  for b in range(8):
    for k in range(5):
      later = [v[b, j] for j in range(k + 1, 5) if m[b, j]]
      want = m[b, k] and (not later or v[b, k] >= max(later) - np.float32(0.05))
      assert got[b, k] == float(want)


@hypothesis.settings(max_examples=10, deadline=None)
@hypothesis.given(data=st.data())
def test_properties(data):
  def call(b, jit):
    kw = {f: b[f] for f in FIELDS}
    out = jcall(rewam_advantages, num_groups=4, **kw) if jit else rewam_advantages(
        num_groups=4, **kw)
    return tuple(np.asarray(x) for x in out)
  check_properties(data, call)


class JitTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_jit_equals_eager_on_the_worked_example(self):
    fn = self.variant(lambda r, s, t: rewam_advantages(
        reward=r, group_id=jnp.zeros(2, jnp.int32), response_mask=jnp.ones((2, 2), bool),
        logprob_old=s, logprob_alt=t, num_groups=1).advantages)
    np.testing.assert_allclose(fn(jnp.array([1., 0]), STUDENT, TEACHER),
                               [[0.765886, 0.707107], [-0.707107, -0.807107]], atol=1e-5)
