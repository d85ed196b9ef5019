"""Tests of credit.losses.aggregation: every mode against numpy, masking, global counts."""
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st

from credit import losses
from credit.registry import UnknownNameError
from tests.losses.helpers import B, T, make_batch, np_aggregate


def test_unknown_mode_lists_the_modes_and_norm_modes_need_a_constant():
  with pytest.raises(UnknownNameError, match="Known: .*seq-mean-token-mean.*token-sum"):
    losses.aggregate_loss(jnp.ones((2, 3)), jnp.ones((2, 3), bool), "mean")
  with pytest.raises(ValueError, match="norm_constant"):
    losses.aggregate_loss(jnp.ones((2, 3)), jnp.ones((2, 3), bool), "seq-mean-token-sum-norm")


def test_dr_grpo_aggregation_example():
  # Worked example: losses all 1 on lengths 2 and 4, C=8, B=2: (2+4)/(2·8)=0.375; verl: 6/8=0.75.
  l = jnp.ones((2, 5))
  m = jnp.array([[1, 1, 0, 0, 0], [1, 1, 1, 1, 0]], bool)
  got = losses.aggregate_loss(l, m, "seq-mean-token-sum-norm-batch", norm_constant=8.0)
  np.testing.assert_allclose(got, 0.375, atol=1e-6)
  got = losses.aggregate_loss(l, m, "seq-mean-token-sum-norm", norm_constant=8.0)
  np.testing.assert_allclose(got, 0.75, atol=1e-6)
  # C is a constant: a wider padded T and an extra empty row do not leak into it.
  l2 = jnp.ones((3, 9))
  m2 = jnp.zeros((3, 9), bool).at[:2, :5].set(m)
  np.testing.assert_allclose(
      losses.aggregate_loss(l2, m2, "seq-mean-token-sum-norm", norm_constant=8.0), 0.75)
  np.testing.assert_allclose(
      losses.aggregate_loss(l2, m2, "seq-mean-token-sum-norm-batch", norm_constant=8.0), 0.375)


@given(hnp.arrays(np.float32, (B, T), elements=st.floats(-10, 10, width=32)),
       hnp.arrays(np.bool_, (B, T)), st.sampled_from(losses.AGG_MODES))
def test_aggregate_matches_numpy(l, m, mode):
  got = losses.aggregate_loss(l, m, mode, norm_constant=7.0)
  np.testing.assert_allclose(got, np_aggregate(l, m, mode, C=7.0), rtol=1e-5, atol=1e-5)


def test_aggregate_ignores_nan_outside_mask_and_empty_is_zero():
  l = jnp.array([[1.0, jnp.nan], [jnp.inf, 2.0]])
  m = jnp.array([[True, False], [False, True]])
  for mode in losses.AGG_MODES:
    assert np.isfinite(losses.aggregate_loss(l, m, mode, norm_constant=4.0))
    assert losses.aggregate_loss(l, jnp.zeros_like(m), mode, norm_constant=4.0) == 0.0
    g = jax.grad(lambda x: losses.aggregate_loss(x, m, mode, norm_constant=4.0))(l)
    assert np.all(np.isfinite(g)) and g[0, 1] == 0 and g[1, 0] == 0


@pytest.mark.parametrize("mode", losses.AGG_MODES)
def test_aggregate_microbatches_sum_to_full(mode):
  rng = np.random.default_rng(1)
  l = rng.normal(size=(B, T)).astype(np.float32)
  m = make_batch(2)["response_mask"]
  f = lambda x, mm, **kw: losses.aggregate_loss(x, mm, mode, norm_constant=9.0, **kw)
  full, g_full = jax.value_and_grad(f)(l, m)
  kw = dict(num_tokens_global=m.sum(), num_seqs_global=m.any(1).sum())
  parts = [jax.value_and_grad(f)(l[i:i + 2], m[i:i + 2], **kw) for i in range(0, B, 2)]
  np.testing.assert_allclose(sum(p[0] for p in parts), full, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.concatenate([p[1] for p in parts]), g_full, rtol=1e-5,
                             atol=1e-7)
