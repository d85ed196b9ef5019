"""Tests of the multi-turn layout helpers of credit.ops.turns: `turn_layout`, `previous_valid`,
`row_grpo` (shared by the turn estimators, TP-GRPO and PBSD)."""
import chex
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized
from hypothesis import given, strategies as st

from credit import ops

B, K, T = 5, 4, 7

floats = st.floats(-100, 100, allow_nan=False, width=32)


def np_previous_valid(x, valid, x0):
  out = np.zeros_like(x)
  for b in range(x.shape[0]):
    prev = x0[b]
    for k in range(x.shape[1]):
      out[b, k] = prev
      if valid[b, k]:
        prev = x[b, k]
  return out


def tp_grpo_former_previous(x_BK, valid_BK, x0_B):
  """TP-GRPO's former private copy of the helper, kept here to show the two are one."""
  b, k = x_BK.shape
  idx = jnp.where(valid_BK, jnp.arange(1, k + 1, dtype=jnp.int32)[None, :], 0)
  seen = jax.lax.cummax(idx, axis=1)
  prev = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), seen[:, :-1]], axis=1)
  return jnp.take_along_axis(jnp.concatenate([x0_B[:, None], x_BK], axis=1), prev, axis=1)


class PreviousValidTest(parameterized.TestCase):

  def test_worked_example(self):
    x = jnp.array([[1., 2., 3., 4.]])
    valid = jnp.array([[True, False, True, True]])
    got = ops.previous_valid(x, valid, jnp.array([9.]))
    np.testing.assert_array_equal(np.asarray(got), [[9., 1., 1., 3.]])

  @given(hnp.arrays(np.float32, (B, K), elements=floats),
         hnp.arrays(bool, (B, K)), hnp.arrays(np.float32, (B,), elements=floats))
  def test_equals_numpy_loop_and_tp_grpo_former_copy_bitwise(self, x, valid, x0):
    got = np.asarray(ops.previous_valid(jnp.asarray(x), jnp.asarray(valid), jnp.asarray(x0)))
    np.testing.assert_array_equal(got, np_previous_valid(x, valid, x0))
    former = tp_grpo_former_previous(jnp.asarray(x), jnp.asarray(valid), jnp.asarray(x0))
    assert got.tobytes() == np.asarray(former).tobytes()

  @chex.variants(with_jit=True, without_jit=True)
  def test_jit_equals_eager(self):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(B, K)).astype(np.float32)
    valid = rng.random((B, K)) < 0.6
    fn = self.variant(ops.previous_valid)
    np.testing.assert_array_equal(np.asarray(fn(x, valid, np.zeros(B, np.float32))),
                                  np_previous_valid(x, valid, np.zeros(B, np.float32)))


class TurnLayoutTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_worked_example(self):
    tid = np.array([[0, 0, 1, 1, 2, -1, -1], [0, 1, -1, -1, -1, -1, -1],
                    [-1] * T, [0, 0, 0, 1, 1, 2, 3], [0, -1, 2, -1, -1, -1, -1]], np.int32)
    mask = tid >= 0
    step = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 0, 1, 0]],
                    bool)
    m, row, valid, last, t = self.variant(ops.turn_layout)(mask, step, tid)
    np.testing.assert_array_equal(np.asarray(m), mask)
    np.testing.assert_array_equal(np.asarray(row), [True, True, False, True, True])
    np.testing.assert_array_equal(np.asarray(valid), step & np.asarray(row)[:, None])
    np.testing.assert_array_equal(np.asarray(last), [[0, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0],
                                                     [0, 0, 0, 1], [0, 0, 1, 0]])
    np.testing.assert_array_equal(np.asarray(t), tid)

  def test_shape_mismatch_is_refused(self):
    with self.assertRaises(AssertionError):
      ops.turn_layout(np.ones((2, 3), bool), np.ones((3, 2), bool), np.zeros((2, 3), np.int32))


class RowGrpoTest(parameterized.TestCase):

  @parameterized.parameters(0, 1)
  def test_equals_group_z_score(self, ddof):
    r = np.array([1., 0., 0., 1., 2., 0.], np.float32)
    row = np.array([True, True, True, True, True, False])
    gid = np.array([0, 0, 0, 0, 1, 1], np.int32)
    got = np.asarray(ops.row_grpo(r, row, gid, 2, ddof=ddof, eps=1e-6))
    x = r[:4].astype(np.float64)
    want = (x - x.mean()) / (x.std(ddof=ddof) + 1e-6)
    np.testing.assert_allclose(got[:4], want, rtol=1e-5)
    np.testing.assert_array_equal(got[4:], [0., 0.])   # a lone row, an invalid row
    raw = np.asarray(ops.row_grpo(r, row, gid, 2, ddof=ddof, singleton="raw"))
    assert raw[4] == 2.0 and raw[5] == 0.0
