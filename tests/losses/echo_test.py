"""Tests of credit.losses.observation_ce_loss (ECHO, token_and_implicit.md §20)."""
import doctest

import chex
import hypothesis.extra.numpy as hnp
import jax
import numpy as np
import pytest
from absl.testing import parameterized
from hypothesis import given, strategies as st

from credit import losses
from credit.losses import echo

B, T = 5, 4


def np_obs_ce(lp, obs, mode):
  ce = np.where(obs, -lp.astype(np.float64), 0.0)
  if not obs.any():
    return 0.0
  if mode == "token-mean":
    return ce.sum() / obs.sum()
  rows = [ce[i].sum() / obs[i].sum() for i in range(len(obs)) if obs[i].any()]
  return sum(rows) / len(rows)


def test_exported_and_doctest():
  assert losses.observation_ce_loss is echo.observation_ce_loss
  assert set(losses.OBS_CE_MODES) == {"seq-mean", "token-mean"}
  res = doctest.testmod(echo, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example():
  # Per-token CE [[0.5, 1.0], [0.2]] -> seq-mean (0.75 + 0.2)/2 = 0.475, token-mean 1.7/3.
  lp = -np.array([[0.5, 1.0], [0.2, np.nan]], np.float32)
  obs = np.array([[True, True], [True, False]])
  seq = losses.observation_ce_loss(logprob=lp, obs_mask=obs)
  tok = losses.observation_ce_loss(logprob=lp, obs_mask=obs, mode="token-mean", coef=2.0)
  np.testing.assert_allclose(seq.loss, 0.475, atol=1e-6)
  np.testing.assert_allclose(tok.loss, 2.0 * 1.7 / 3, atol=1e-6)
  np.testing.assert_allclose(tok.metrics["obs_ce_agg"], 1.7 / 3, atol=1e-6)
  np.testing.assert_allclose(seq.metrics["obs_ce"], 1.7 / 3, atol=1e-6)
  assert float(seq.metrics["obs_tokens"]) == 3.0 and float(seq.metrics["obs_seqs"]) == 2.0


@pytest.mark.parametrize("mode", echo.OBS_CE_MODES)
@given(hnp.arrays(np.float32, (B, T), elements=st.floats(-8, 0, width=32)),
       hnp.arrays(np.bool_, (B, T)))
def test_matches_numpy(mode, lp, obs):
  out = losses.observation_ce_loss(logprob=lp, obs_mask=obs, mode=mode, coef=0.5)
  np.testing.assert_allclose(out.loss, 0.5 * np_obs_ce(lp, obs, mode), rtol=1e-5, atol=1e-6)
  assert float(out.metrics["obs_tokens"]) == obs.sum()


@pytest.mark.parametrize("mode", echo.OBS_CE_MODES)
def test_gradient_only_through_observation_positions(mode):
  rng = np.random.default_rng(0)
  obs = rng.random((B, T)) > 0.5
  obs[0] = False
  lp = np.where(obs, rng.uniform(-3, 0, (B, T)), np.nan).astype(np.float32)  # NaN elsewhere
  g = np.asarray(jax.grad(lambda x: losses.observation_ce_loss(
      logprob=x, obs_mask=obs, mode=mode).loss)(lp))
  assert np.all(np.isfinite(g))
  assert np.all(g[~obs] == 0.0) and np.all(g[obs] < 0.0)
  if mode == "token-mean":
    np.testing.assert_allclose(g[obs], -1.0 / obs.sum(), rtol=1e-6)
  else:
    rows = obs.any(1).sum()
    want = -1.0 / (rows * np.maximum(obs.sum(1, keepdims=True), 1))
    np.testing.assert_allclose(g[obs], np.broadcast_to(want, (B, T))[obs], rtol=1e-6)


@pytest.mark.parametrize("mode", echo.OBS_CE_MODES)
def test_no_observation_tokens_give_exact_zero(mode):
  lp = np.full((B, T), np.nan, np.float32)
  obs = np.zeros((B, T), bool)
  f = lambda x: losses.observation_ce_loss(logprob=x, obs_mask=obs, mode=mode)
  out = f(lp)
  assert float(out.loss) == 0.0 and float(out.metrics["obs_tokens"]) == 0.0
  assert all(float(v) == 0.0 for v in out.metrics.values())
  assert np.all(np.asarray(jax.grad(lambda x: f(x).loss)(lp)) == 0.0)


def test_micro_batches_sum_to_the_batch_with_global_counts():
  rng = np.random.default_rng(2)
  lp = rng.uniform(-3, 0, (B + 1, T)).astype(np.float32)
  obs = rng.random((B + 1, T)) > 0.4
  for mode in echo.OBS_CE_MODES:
    full = losses.observation_ce_loss(logprob=lp, obs_mask=obs, mode=mode).loss
    kw = dict(num_tokens_global=float(obs.sum()), num_seqs_global=float(obs.any(1).sum()))
    parts = sum(float(losses.observation_ce_loss(logprob=lp[s], obs_mask=obs[s], mode=mode,
                                                  **kw).loss)
                for s in (slice(0, 3), slice(3, None)))
    np.testing.assert_allclose(parts, float(full), rtol=1e-6, err_msg=mode)


def test_bad_arguments():
  with pytest.raises(ValueError, match="mode"):
    losses.observation_ce_loss(logprob=np.zeros((2, 2)), obs_mask=np.ones((2, 2), bool),
                               mode="seq-mean-token-mean")
  with pytest.raises(AssertionError):
    losses.observation_ce_loss(logprob=np.zeros((2, 3)), obs_mask=np.ones((2, 2), bool))


class JitTest(parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*echo.OBS_CE_MODES)
  def test_jit_equals_eager(self, mode):
    rng = np.random.default_rng(3)
    lp = rng.uniform(-3, 0, (B, T)).astype(np.float32)
    obs = rng.random((B, T)) > 0.5
    f = self.variant(lambda x, m, c: losses.observation_ce_loss(logprob=x, obs_mask=m, coef=c,
                                                                mode=mode))
    out = f(lp, obs, 0.3)
    np.testing.assert_allclose(out.loss, 0.3 * np_obs_ce(lp, obs, mode), rtol=1e-5)
    assert set(out.metrics) == {"obs_ce", "obs_ce_agg", "obs_tokens", "obs_seqs"}
