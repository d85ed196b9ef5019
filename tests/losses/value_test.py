"""Tests of credit.losses.value_loss."""
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, strategies as st

from credit import losses
from tests.losses.helpers import B, T, make_batch

_value_loss_jit = jax.jit(lambda v, vo, r, m: losses.value_loss(
    values=v, values_old=vo, returns=r, response_mask=m))


@given(hnp.arrays(np.float32, (B, T), elements=st.floats(-3, 3, width=32)),
       hnp.arrays(np.float32, (B, T), elements=st.floats(-3, 3, width=32)),
       hnp.arrays(np.float32, (B, T), elements=st.floats(-3, 3, width=32)))
def test_value_loss_matches_numpy(v, v_old, ret):
  m = make_batch(22)["response_mask"]
  got = _value_loss_jit(v, v_old, ret, m)
  l = np.zeros((B, T))
  for i in range(B):
    for t in range(T):
      vc = min(max(v[i, t], v_old[i, t] - 0.5), v_old[i, t] + 0.5)
      l[i, t] = max((float(v[i, t]) - ret[i, t]) ** 2, (vc - ret[i, t]) ** 2)
  np.testing.assert_allclose(got.loss, 0.5 * l[m].mean(), rtol=1e-5, atol=1e-5)


def test_value_loss_example_gradients_and_unclipped():
  # V=2, V_old=1, R=0, c=0.5: clipped 1.5 -> max(4, 2.25) = 4 -> 0.5·4 = 2; dL/dV = V − R.
  one = jnp.ones((1, 1))
  f = lambda v, vo, r: losses.value_loss(values=v, values_old=vo, returns=r,
                                         response_mask=one > 0).loss
  np.testing.assert_allclose(f(2 * one, one, 0 * one), 2.0)
  gv, gvo, gr = jax.grad(f, argnums=(0, 1, 2))(2 * one, one, 0 * one)
  np.testing.assert_allclose(gv, [[2.0]])
  np.testing.assert_array_equal(gvo, 0.0)
  np.testing.assert_array_equal(gr, 0.0)
  # V=0.2, V_old=1, R=0.5: clip(V) = 0.5 hits R exactly; max(0.09, 0) = 0.09 -> 0.045.
  np.testing.assert_allclose(f(0.2 * one, one, 0.5 * one), 0.045, atol=1e-7)
  unc = losses.value_loss(values=2 * one, values_old=one, returns=0 * one,
                          response_mask=one > 0, clip_range_value=None)
  np.testing.assert_allclose(unc.loss, 2.0)


def test_value_loss_follows_the_aggregation_mode():
  b = make_batch(24)
  m = b["response_mask"]
  v, ret = b["logprob"], b["logprob_old"]
  for mode in losses.AGG_MODES:
    got = losses.value_loss(values=v, values_old=v, returns=ret, response_mask=m,
                            loss_agg_mode=mode, norm_constant=5.0)
    want = 0.5 * losses.aggregate_loss(np.square(v - ret), m, mode, norm_constant=5.0)
    np.testing.assert_allclose(got.loss, want, rtol=1e-6, err_msg=mode)
