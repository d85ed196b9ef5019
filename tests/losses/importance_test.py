"""Tests of credit.losses.importance (TIS / MIS) and of its use by every policy loss."""
import math

import hypothesis.extra.numpy as hnp
import jax
import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

from credit import losses
from credit.registry import UnknownNameError
from tests.losses.helpers import B, NAMES, T, fn_of, make_batch, run


def np_importance(old, smp, m, level, mode, C, lo):
  log_r = np.where(m, old.astype(np.float64) - smp, 0.0)
  if level == "token":
    raw = log_r
  elif level == "sequence":
    raw = np.repeat(log_r.sum(1, keepdims=True), log_r.shape[1], 1)
  else:
    raw = np.repeat(log_r.sum(1, keepdims=True) / np.maximum(m.sum(1, keepdims=True), 1),
                    log_r.shape[1], 1)
  w = np.exp(np.clip(raw, -20, 20))
  if mode == "truncate":
    return np.where(m, np.minimum(w, C), 0.0), m, raw
  keep = m & (w <= C) & (w >= (lo or 0.0))
  return np.where(keep, w, 0.0), keep, raw


_ic_jit = jax.jit(losses.importance_correction, static_argnames=("level", "mode"))


@given(hnp.arrays(np.float32, (B, T), elements=st.floats(-1, 1, width=32)),
       st.sampled_from(["token", "sequence", "geometric"]), st.sampled_from(["truncate", "mask"]),
       st.sampled_from([None, 0.5]))
def test_importance_correction_matches_numpy(noise, level, mode, lo):
  b = make_batch(18)
  smp = b["logprob_old"] + noise
  w, keep, raw = np_importance(b["logprob_old"], smp, b["response_mask"], level, mode, 2.0, lo)
  bounds = [math.log(2.0)] + ([math.log(lo)] if lo else [])
  assume(all(np.all(np.abs(raw - x) > 1e-4) for x in bounds))  # no float32 coin flips
  out = _ic_jit(logprob_old=b["logprob_old"], logprob_sampler=smp,
                response_mask=b["response_mask"], level=level, mode=mode, threshold=2.0,
                threshold_lower=lo)
  np.testing.assert_allclose(out.weights, w, rtol=1e-4, atol=1e-6)
  np.testing.assert_array_equal(out.mask, keep)
  m = b["response_mask"]
  np.testing.assert_allclose(out.metrics.get("is_frac_rejected", 0.0),
                             (m & ~keep).sum() / m.sum(), rtol=1e-6)
  assert ("is_frac_rejected" in out.metrics) == (mode == "mask")
  np.testing.assert_allclose(out.metrics["is_weight_mean"], w[m].mean(), rtol=1e-4)
  assert all(np.isfinite(v) for v in out.metrics.values())


def test_unknown_level_and_mode_raise_listing_the_known_ones():
  b = make_batch()
  kw = dict(logprob_old=b["logprob_old"], logprob_sampler=b["logprob_old"],
            response_mask=b["response_mask"])
  with pytest.raises(UnknownNameError, match="importance level.*geometric"):
    losses.importance_correction(**kw, level="tok")
  with pytest.raises(UnknownNameError, match="importance mode.*truncate"):
    losses.importance_correction(**kw, mode="clip")
  # The full losses check them even without a sampler, before any work.
  with pytest.raises(UnknownNameError, match="importance level"):
    fn_of("ppo_clip")(**b, logprob_sampler=b["logprob_old"], is_level="tok")
  with pytest.raises(UnknownNameError, match="importance mode"):
    fn_of("gspo")(**b, is_mode="clip")


@pytest.mark.parametrize("name", NAMES)
def test_losses_scale_by_truncated_importance_weights(name):
  # Constant weights w (truncate mode, no rejection): the loss scales by w below the
  # threshold C=2 and by C above it, in any aggregation; sampler == old changes nothing.
  b = make_batch(19)
  # decoupled_ppo defaults to AReaL's mask mode at a cap of 5: asked for the same truncation.
  hp, static = ({"is_threshold": 2.0}, {"is_mode": "truncate"}) if name == "decoupled_ppo" \
      else (None, {})
  base, _, g_base = run(name, b, hp, **static)
  for w, want in [(1.0, 1.0), (0.7, 0.7), (5.0, 2.0)]:
    smp = b["logprob_old"] - np.float32(math.log(w))
    loss, metrics, g = run(name, {**b, "logprob_sampler": smp}, hp, **static)
    np.testing.assert_allclose(loss, want * base, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g["logprob"], want * g_base["logprob"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(metrics["is_weight_mean"], want, rtol=1e-5)
    np.testing.assert_array_equal(g["logprob_sampler"], 0.0)


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "gmpo", "vespo"])
def test_sequence_mask_rejection_equals_dropping_rows(name):
  # Rows whose sequence ratio exceeds C are rejected: the loss (default aggregation, with
  # its denominators) equals the loss of the batch without those rows. The rejection is
  # shared code (`reduce_policy_loss`); token-mean, seq-mean-token-mean and row-level
  # losses cover it.
  b = make_batch(23)
  bad = np.zeros(B, bool)
  bad[[1, 4]] = True
  smp = b["logprob_old"] - np.where(bad[:, None], 0.5, 0.0).astype(np.float32)
  loss, metrics, _ = run(name, {**b, "logprob_sampler": smp}, {"is_threshold": 1.2},
                         is_level="sequence", is_mode="mask")
  kept, _, _ = run(name, {**b, "response_mask": b["response_mask"] & ~bad[:, None]})
  np.testing.assert_allclose(loss, kept, rtol=1e-5, atol=1e-6)
  m = b["response_mask"]
  np.testing.assert_allclose(metrics["is_frac_rejected"], m[bad].sum() / m.sum(), rtol=1e-6)
