"""Tests for the PRIME estimator (credit/advantages/implicit/prime.py).

The numpy reference is a float64 loop written from the formulas (paper and code
conventions), not from the implementation. Registry-wide properties (jit == eager,
masking == slicing, padding, permutation, degenerate inputs, sharding) live in
tests/registry_common_test.py.
"""
from __future__ import annotations

import doctest
import functools
import itertools
import math

import hypothesis
import jax
import numpy as np
import pytest
from hypothesis import strategies as st

from credit import registry
from credit.advantages import rloo_advantages
from credit.advantages.implicit import prime as pr

N, G, T = 4, 4, 6
B = N * G

# The worked example: β = 0.05, one group of K = 3, row 1 has length 2.
Q = np.array([[0.2, -0.1, 0.3], [0.0, 0.1, 0.0], [-0.2, -0.2, 0.1]], np.float32)
MASK = np.array([[1, 1, 1], [1, 1, 0], [1, 1, 1]], bool)
R_O = np.array([1.0, 0.0, 1.0], np.float32)
SPEC_G = [[0.5238, 0.5125, 0.5162], [-0.9967, -0.9958, 0.0], [0.4713, 0.4858, 0.5004]]
SPEC_A = [[0.5717, 0.5555, 0.5609], [-1.6203, -1.6191, 0.0], [0.4960, 0.5171, 0.5381]]
PAPER = dict(process_scale="beta", process_baseline="leave_one_out")


# --------------------------------------------------------------------------
# Numpy float64 reference.
# --------------------------------------------------------------------------


def ref_prime(reward, group_id, mask, lp_prm, lp_ref, *, num_groups=N, group_size=None,
              beta=0.05, process_coef=1.0, gamma_process=1.0, gamma_outcome=1.0,
              granularity="token", process_scale="max_return",
              process_baseline="group_mean", whiten=True, eps=1e-8):
  nb, nt = mask.shape
  gid = np.arange(nb) // group_size if group_size is not None else np.asarray(group_id)
  valid = [bool(mask[b].any()) and (group_size is not None or 0 <= gid[b] < num_groups)
           for b in range(nb)]
  toks = {b: [t for t in range(nt) if mask[b, t]] if valid[b] else [] for b in range(nb)}
  s = np.zeros((nb, nt))
  for b in range(nb):
    q = {t: float(lp_prm[b, t]) - float(lp_ref[b, t]) for t in toks[b]}
    if granularity == "token":
      for t in toks[b]:
        s[b, t] = q[t]
    elif toks[b]:
      s[b, toks[b][-1]] = sum(q.values())
  if process_scale == "beta":
    s = beta * s
  else:
    big = 0.0
    for b in range(nb):
      for t in toks[b]:
        big = max(big, abs(sum(s[b, u] for u in toks[b] if u >= t)))
    s = s / (big + 1e-6)
  mean = [sum(s[b, t] for t in toks[b]) / len(toks[b]) if toks[b] else 0.0 for b in range(nb)]
  ret = np.zeros((nb, nt))
  used = np.zeros((nb, nt), bool)
  for b in range(nb):
    if not toks[b]:
      continue
    members = [j for j in range(nb) if valid[j] and gid[j] == gid[b]]
    k = len(members)
    if k < 2:
      continue
    if process_baseline == "group_mean":
      proc = {t: s[b, t] * k / (k - 1) - sum(mean[j] for j in members) / (k - 1)
              for t in toks[b]}
    else:
      base = sum(mean[j] for j in members if j != b) / (k - 1)
      proc = {t: s[b, t] - base for t in toks[b]}
    a_o = reward[b] - sum(reward[j] for j in members if j != b) / (k - 1)
    for i, t in enumerate(toks[b]):
      later = toks[b][i:]
      g = sum(gamma_process ** n * process_coef * proc[u] for n, u in enumerate(later))
      g += gamma_outcome ** (len(later) - 1) * a_o
      ret[b, t] = g
      used[b, t] = True
  if not whiten:
    return ret
  vals = ret[used]
  if vals.size < 2:
    return np.zeros_like(ret)
  mu = vals.mean()
  var = ((vals - mu) ** 2).sum() / (vals.size - 1)
  return np.where(used, (ret - mu) / math.sqrt(var + eps), 0.0)


# --------------------------------------------------------------------------
# Batches.
# --------------------------------------------------------------------------


@st.composite
def batches(draw, contiguous=False):
  seed = draw(st.integers(0, 2**31 - 1))
  rng = np.random.default_rng(seed)
  reward = np.array(draw(st.lists(st.sampled_from([0.0, 1.0, 0.5, -1.0]), min_size=B,
                                  max_size=B)), np.float32)
  lengths = np.array(draw(st.lists(st.integers(0, T), min_size=B, max_size=B)))
  mask = np.arange(T)[None, :] < lengths[:, None]
  if draw(st.booleans()):
    mask &= rng.random((B, T)) > 0.3
  if contiguous:
    gid = np.arange(B, dtype=np.int32) // G
  else:
    gid = np.array(draw(st.lists(st.integers(-1, N), min_size=B, max_size=B)), np.int32)
  lp_prm = rng.uniform(-4, 0, (B, T)).astype(np.float32)
  lp_ref = rng.uniform(-4, 0, (B, T)).astype(np.float32)
  return dict(reward=reward, group_id=gid, response_mask=mask, logprob_prm=lp_prm,
              logprob_ref=lp_ref)


CONFIGS = {
    "code": dict(),
    "paper": dict(PAPER),
    "code_whole_discounted": dict(granularity="whole", gamma_process=0.9, gamma_outcome=0.8),
    "paper_fast_nowhiten": dict(PAPER, group_size=G, whiten=False),
    "mixed": dict(process_scale="beta", beta=0.3, process_coef=0.5),
}
_STATIC = ("group_size", "granularity", "process_scale", "process_baseline", "whiten")


@functools.lru_cache(maxsize=None)
def jitted(name):
  cfg = CONFIGS[name]
  static = {k: v for k, v in cfg.items() if k in _STATIC}
  return jax.jit(functools.partial(pr.prime_advantages, num_groups=N, **static))


def run(name, b):
  hyper = {k: v for k, v in CONFIGS[name].items() if k not in _STATIC}
  return np.asarray(jitted(name)(**b, **hyper), np.float64)


# --------------------------------------------------------------------------
# Registration, docs and the worked example.
# --------------------------------------------------------------------------


def test_registered_in_implicit_family():
  spec = registry.get_estimator("prime")
  assert spec.family == "implicit" and spec.confidence == "code-verified"
  assert spec.fn is pr.prime_advantages
  assert spec.needs == {"reward", "group_id", "response_mask", "logprob_prm", "logprob_ref"}
  assert "2502.01456" in spec.paper
  assert {"granularity", "process_scale", "process_baseline", "whiten"} <= set(
      spec.static_argnames)


def test_doctests():
  res = doctest.testmod(pr, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


@pytest.mark.parametrize("group_size", [None, 3])
def test_spec_example_paper_convention(group_size):
  kw = dict(reward=R_O, group_id=np.zeros(3, np.int32), response_mask=MASK,
            logprob_prm=Q, logprob_ref=np.zeros_like(Q), num_groups=1,
            group_size=group_size, **PAPER)
  g = pr.prime_advantages(whiten=False, **kw)
  np.testing.assert_allclose(np.asarray(g), SPEC_G, atol=1e-3)
  a = pr.prime_advantages(**kw)
  np.testing.assert_allclose(np.asarray(a), SPEC_A, atol=1e-3)
  # The reference reproduces the worked example too.
  np.testing.assert_allclose(ref_prime(R_O, np.zeros(3), MASK, Q, np.zeros_like(Q),
                                       num_groups=1, **PAPER), SPEC_A, atol=1e-3)


def test_spec_example_code_convention_by_hand():
  # Raw q, normalised by max |reverse cumsum| = 0.4 (row 0 at t = 0) + 1e-6; baseline
  # K/(K−1)·s − Σ_j m_j/(K−1) with m = mean row scores.
  s = Q / (0.4 + 1e-6) * MASK
  m = np.array([s[i][MASK[i]].mean() for i in range(3)])
  proc = (s * 1.5 - m.sum() / 2) * MASK
  a_o = np.array([0.5, -1.0, 0.5])
  g = np.flip(np.cumsum(np.flip(proc, 1), 1), 1) * MASK + a_o[:, None] * MASK
  got = pr.prime_advantages(reward=R_O, group_id=np.zeros(3, np.int32), response_mask=MASK,
                            logprob_prm=Q, logprob_ref=np.zeros_like(Q), num_groups=1,
                            whiten=False)
  np.testing.assert_allclose(np.asarray(got), g, rtol=1e-5, atol=1e-6)
  # The two baselines differ by (s − m_i)/(K − 1) on every token (before the return).
  sc = pr.prime_token_scores(response_mask=MASK, logprob_prm=Q, logprob_ref=np.zeros_like(Q))
  np.testing.assert_allclose(np.asarray(sc), s, rtol=1e-6)


# --------------------------------------------------------------------------
# Reference comparison.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CONFIGS))
@hypothesis.settings(max_examples=12)
@hypothesis.given(data=st.data())
def test_matches_numpy_reference(name, data):
  cfg = CONFIGS[name]
  b = data.draw(batches(contiguous=cfg.get("group_size") is not None))
  want = ref_prime(b["reward"], b["group_id"], b["response_mask"], b["logprob_prm"],
                   b["logprob_ref"], **cfg)
  np.testing.assert_allclose(run(name, b), want, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------
# Reductions.
# --------------------------------------------------------------------------


@hypothesis.settings(max_examples=10)
@hypothesis.given(b=batches())
def test_zero_process_weight_is_rloo(b):
  rloo = np.asarray(rloo_advantages(reward=b["reward"], group_id=b["group_id"],
                                    response_mask=b["response_mask"], num_groups=N))
  for scale, baseline in itertools.product(("max_return", "beta"),
                                           ("group_mean", "leave_one_out")):
    kw = dict(num_groups=N, process_scale=scale, process_baseline=baseline, whiten=False)
    a = pr.prime_advantages(process_coef=0.0, **kw, **b)
    np.testing.assert_allclose(np.asarray(a), rloo, rtol=1e-6, atol=1e-6)
  # β = 0 under the paper's scale, with whitening: the whitened RLOO advantage.
  a = pr.prime_advantages(beta=0.0, num_groups=N, **PAPER, **b)
  np.testing.assert_allclose(np.asarray(a), ref_prime(b["reward"], b["group_id"],
                                                      b["response_mask"], b["logprob_prm"],
                                                      b["logprob_prm"], **PAPER),
                             rtol=1e-4, atol=1e-5)


@hypothesis.settings(max_examples=10)
@hypothesis.given(b=batches())
def test_prm_equal_to_reference_is_rloo(b):
  # log π_φ = log π_ref: q = 0, no process reward under any convention.
  same = dict(b, logprob_ref=b["logprob_prm"])
  rloo = np.asarray(rloo_advantages(reward=b["reward"], group_id=b["group_id"],
                                    response_mask=b["response_mask"], num_groups=N))
  a = pr.prime_advantages(num_groups=N, whiten=False, **same)
  np.testing.assert_allclose(np.asarray(a), rloo, rtol=1e-6, atol=1e-6)


def test_equal_outcomes_keep_process_credit_and_centre_it():
  rng = np.random.default_rng(0)
  mask = np.ones((G, T), bool)
  kw = dict(reward=np.ones(G, np.float32), group_id=np.zeros(G, np.int32),
            response_mask=mask, logprob_prm=rng.uniform(-3, 0, (G, T)).astype(np.float32),
            logprob_ref=rng.uniform(-3, 0, (G, T)).astype(np.float32), num_groups=1,
            whiten=False)
  for baseline in ("group_mean", "leave_one_out"):
    g = np.asarray(pr.prime_advantages(process_baseline=baseline, **kw))
    assert np.any(g != 0)
  # Code baseline: the per-token process rewards of the group sum to zero on average.
  s = np.asarray(pr.prime_token_scores(response_mask=mask, logprob_prm=kw["logprob_prm"],
                                       logprob_ref=kw["logprob_ref"]))
  proc = s * G / (G - 1) - s.mean(1).sum() / (G - 1)
  np.testing.assert_allclose(proc.mean(1).sum(), 0.0, atol=1e-6)


def test_max_return_bounds_the_process_return():
  rng = np.random.default_rng(1)
  s = np.asarray(pr.prime_token_scores(response_mask=np.ones((B, T), bool),
                                       logprob_prm=rng.uniform(-9, 0, (B, T)),
                                       logprob_ref=rng.uniform(-9, 0, (B, T))))
  rc = np.flip(np.cumsum(np.flip(s, 1), 1), 1)
  assert np.abs(rc).max() <= 1.0 and np.abs(rc).max() > 0.99


def test_singletons_and_nan_padding_give_zeros():
  rng = np.random.default_rng(2)
  mask = np.arange(T)[None, :] < np.array([6, 3, 0, 4, 5, 2, 1, 6])[:, None]
  gid = np.array([0, 0, 1, 1, 2, 3, 3, 3], np.int32)   # group 1: one valid row; group 2: one
  lp = rng.uniform(-3, 0, (8, T)).astype(np.float32)
  ref = rng.uniform(-3, 0, (8, T)).astype(np.float32)
  kw = dict(reward=rng.choice([0., 1.], 8).astype(np.float32), group_id=gid,
            response_mask=mask, num_groups=4)
  a = np.asarray(pr.prime_advantages(logprob_prm=lp, logprob_ref=ref, **kw))
  assert np.all(a[[2, 3, 4]] == 0.0) and np.all(a[~mask] == 0.0)
  nan_lp = np.where(mask, lp, np.nan).astype(np.float32)
  nan_ref = np.where(mask, ref, np.nan).astype(np.float32)
  d = np.asarray(pr.prime_advantages(logprob_prm=nan_lp, logprob_ref=nan_ref, **kw))
  np.testing.assert_array_equal(a, d)
  # Fewer than two valid tokens in the batch: zeros, not a crash.
  one = np.zeros((8, T), bool)
  one[0, 0] = True
  z = pr.prime_advantages(logprob_prm=lp, logprob_ref=ref, **dict(kw, response_mask=one))
  assert np.all(np.asarray(z) == 0.0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(granularity="step"), "granularity"),
    (dict(process_scale="batch_norm"), "process_scale"),
    (dict(process_baseline="paper"), "process_baseline"),
    (dict(whiten=1), "whiten"),
    (dict(group_size=3), "multiple"),
    (dict(num_groups=0), "num_groups"),
    (dict(group_id=None), "group_id"),
])
def test_bad_static_args_raise(kwargs, match):
  base = dict(reward=np.zeros(B, np.float32), group_id=np.zeros(B, np.int32),
              response_mask=np.ones((B, T), bool), logprob_prm=np.zeros((B, T), np.float32),
              logprob_ref=np.zeros((B, T), np.float32), num_groups=N)
  base.update(kwargs)
  with pytest.raises(ValueError, match=match):
    pr.prime_advantages(**base)


def test_shape_mismatch_raises():
  with pytest.raises(AssertionError):
    pr.prime_advantages(reward=np.zeros(B, np.float32), group_id=np.zeros(B, np.int32),
                        response_mask=np.ones((B, T), bool),
                        logprob_prm=np.zeros((B, T), np.float32),
                        logprob_ref=np.zeros((B, T + 1), np.float32), num_groups=N)


@pytest.mark.parametrize("granularity,scale,baseline", [
    ("token", "max_return", "group_mean"), ("whole", "beta", "leave_one_out"),
    ("token", "beta", "group_mean"), ("whole", "max_return", "leave_one_out")])
def test_one_cumsum_return_equals_the_scan(granularity, scale, baseline):
  """γ_p = 1 as a Python number takes the one-cumulative-sum path; as an array, the scan."""
  rng = np.random.default_rng(7)
  mask = rng.random((B, T)) < 0.8
  mask[3] = False
  kw = dict(reward=rng.choice([0.0, 1.0], B).astype(np.float32),
            group_id=np.repeat(np.arange(N), G).astype(np.int32), response_mask=mask,
            logprob_prm=rng.normal(size=(B, T)).astype(np.float32),
            logprob_ref=rng.normal(size=(B, T)).astype(np.float32), num_groups=N,
            granularity=granularity, process_scale=scale, process_baseline=baseline,
            process_coef=0.7, gamma_outcome=0.9)
  fast = np.asarray(pr.prime_advantages(gamma_process=1.0, **kw))
  scan = np.asarray(pr.prime_advantages(gamma_process=np.float32(1.0), **kw))
  np.testing.assert_allclose(fast, scan, rtol=1e-5, atol=1e-6)
  jitted = jax.jit(functools.partial(pr.prime_advantages, gamma_process=1.0,
                                     **{k: v for k, v in kw.items() if isinstance(v, str)},
                                     num_groups=N))
  arrays = {k: v for k, v in kw.items() if not isinstance(v, (str, int))}
  np.testing.assert_allclose(np.asarray(jitted(**arrays)), fast, rtol=1e-5, atol=1e-6)
