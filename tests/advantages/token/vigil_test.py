"""VIGIL blind-confidence penalty (credit/advantages/token/vigil.py)."""
from __future__ import annotations

import chex
import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

from credit.advantages.token import blind_confidence_penalty, vigil_advantages
from tests.advantages.outcome._harness import Case, reference_test, valid_groups
from tests.advantages.shaping._behaviour_ref import check_properties, z_rows
from tests.advantages.shaping._harness_a import jcall

FIELDS = ("reward", "group_id", "response_mask", "logprob_old", "logprob_alt")


def ref_vigil(b, blind_coef=0.1, confidence_threshold=0.5, gain_margin=0.1, scale="group"):
  valid, groups = valid_groups(b)
  r = b["reward"].astype(np.float64)
  out = np.zeros(len(r))
  for rows in groups:
    for i, a in z_rows(r, rows, scale == "group").items():
      out[i] = a
  mask = b["response_mask"]
  full = np.where(mask, b["logprob_old"], 0.0).astype(np.float64)
  blind = np.where(mask, b["logprob_alt"], 0.0).astype(np.float64)
  ig = np.where(mask, full - blind, 0.0)
  pen = np.zeros_like(ig)
  for i, t in zip(*np.nonzero(mask)):
    if np.exp(blind[i, t]) >= confidence_threshold:
      pen[i, t] = max(0.0, gain_margin - ig[i, t])
  adv = np.where(mask, out[:, None] - blind_coef * pen, 0.0)
  return adv, pen, ig


CASES = [
    Case("vigil", "vigil", FIELDS, ref_vigil),
    Case("vigil_strict", "vigil", FIELDS, ref_vigil,
         (("blind_coef", 0.5), ("confidence_threshold", 0.05), ("gain_margin", 0.5),
          ("scale", "none"))),
]

test_matches_numpy_reference = reference_test(CASES)

FULL = np.log(np.array([[0.9, 0.9], [0.9, 0.3]], np.float32))
BLIND = np.log(np.array([[0.2, 0.2], [0.9, 0.8]], np.float32))


def test_worked_example():
  # GRPO of R = [1, 0]: [0.7071, −0.7071]. Row 0 is not confident blind (0.2 < 0.5): no
  # penalty. Row 1: token 0 confident blind with IG = 0 -> pen 0.1; token 1 confident blind
  # with IG = log(0.3/0.8) = −0.9808 -> pen 1.0808. A = GRPO − 0.1·pen.
  out = jcall(vigil_advantages, reward=np.array([1., 0], np.float32),
              group_id=np.zeros(2, np.int32), response_mask=np.ones((2, 2), bool),
              logprob_old=FULL, logprob_alt=BLIND, num_groups=1)
  np.testing.assert_allclose(out.penalty, [[0, 0], [0.1, 1.080829]], atol=1e-5)
  np.testing.assert_allclose(out.advantages, [[0.707106, 0.707106], [-0.717106, -0.815189]],
                             atol=1e-5)


def test_no_penalty_when_the_evidence_informs_every_token():
  # Full-context log-probs 0.2 > δ above the blind ones everywhere: GRPO exactly.
  b = dict(reward=np.array([1., 0, 0, 1], np.float32), group_id=np.zeros(4, np.int32),
           response_mask=np.ones((4, 3), bool), num_groups=1)
  blind = np.full((4, 3), np.log(0.6), np.float32)
  out = jcall(vigil_advantages, logprob_old=blind + 0.2, logprob_alt=blind, **b)
  want = jcall(vigil_advantages, logprob_old=blind, logprob_alt=blind, blind_coef=0.0, **b)
  np.testing.assert_allclose(out.advantages, want.advantages, atol=1e-6)
  assert np.all(np.asarray(out.penalty) == 0)


def test_gradient_flows_through_the_gain_not_the_gate():
  g = jax.grad(lambda lp: jnp.sum(blind_confidence_penalty(
      response_mask=np.ones((1, 2), bool), logprob_old=lp, logprob_alt=BLIND[1:])[0]))(
          jnp.asarray(FULL[1:]))
  np.testing.assert_allclose(g, [[-1.0, -1.0]])


@hypothesis.settings(max_examples=10, deadline=None)
@hypothesis.given(data=st.data())
def test_properties(data):
  def call(b, jit):
    kw = {f: b[f] for f in FIELDS}
    out = jcall(vigil_advantages, num_groups=4, **kw) if jit else vigil_advantages(
        num_groups=4, **kw)
    return tuple(np.asarray(x) for x in out)
  check_properties(data, call)


class JitTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_jit_equals_eager_on_the_worked_example(self):
    fn = self.variant(lambda r, lp, alt: vigil_advantages(
        reward=r, group_id=jnp.zeros(2, jnp.int32), response_mask=jnp.ones((2, 2), bool),
        logprob_old=lp, logprob_alt=alt, num_groups=1).advantages)
    np.testing.assert_allclose(fn(jnp.array([1., 0]), FULL, BLIND),
                               [[0.707106, 0.707106], [-0.717106, -0.815189]], atol=1e-5)


def test_bad_scale_is_refused():
  with pytest.raises(ValueError, match="scale"):
    vigil_advantages(reward=np.zeros(2), group_id=np.zeros(2, np.int32),
                     response_mask=np.ones((2, 2), bool), logprob_old=FULL, logprob_alt=BLIND,
                     num_groups=1, scale="rows")
