"""Tests for the EAPO estimator (credit/advantages/token/eapo.py).

Source: the authors' code wgcyeo/EAPO `src/trainers/eapo_trainer.py` (arXiv 2609.33781).
The numpy reference is written from the
formulas (float64 loops, numpy's linear quantiles). Registry-wide properties (jit == eager, masking, padding,
permutation, degenerate groups, sharding) live in tests/registry_common_test.py.
"""
from __future__ import annotations

import doctest
import functools
import math

import hypothesis
import jax
import numpy as np
import pytest
from hypothesis import strategies as st

from credit import registry
from credit.advantages.token import eapo as ea
from tests.ops_select_test import ref_quantiles as _sort_based_quantiles
from tests.advantages.token._harness import (assert_budget_kept, assert_reduces_to_grpo,
                                             assert_sign_kept, grpo_of, reference_test, run,
                                             table)
from tests.advantages.token._ref import (EPS, G, N, T, B, batches, pick, ref_grpo,
                                         valid_tokens)

H = np.array([0.2, 1.5, 0.4, 0.9])
# Worked examples, computed with numpy from the code's formula (wgcyeo/EAPO
# `normalize_token_entropies` + `eapo_token_advantages`; see the module docstring):
#   h = clip((H − q10)/(q90 − q10 + 1e-8), 0, 1), w = 4^{sign(Â) h} / mean_t 4^{sign(Â) h}.
# One row as the whole pool: q10 = 0.26, q90 = 1.32 (the numbers of the source check).
SPEC_H_ONE_ROW = [0.0, 1.0, 0.1321, 0.6038]
# Two rows with the same entropies (Â = ±1): the pool holds every value twice, so
# q10 = 0.2, q90 = 1.5 and h = [0, 1, 0.2/1.3, 0.7/1.3].
SPEC_POS = [0.4792, 1.9168, 0.5931, 1.0109]
SPEC_NEG = [-1.5798, -0.3949, -1.2764, -0.7489]
# The earlier linear design (weighting="linear", entropy_norm="row_zscore_tanh", α = 0.5).
SPEC_Z = [-1.0945, 1.4926, -0.6965, 0.2985]
LINEAR_POS = [0.6167, 1.4905, 0.7175, 1.1754]
LINEAR_NEG = [-1.3640, -0.5343, -1.2683, -0.8335]
LINEAR = dict(weighting="linear", entropy_norm="row_zscore_tanh")

CONFIGS = {
    "default": dict(),
    "kappa_quantiles": dict(kappa=2.0, entropy_quantiles=(0.25, 0.75), group_std="population"),
    "exp_no_renorm": dict(renormalize=False, kappa=0.7),
    "exp_tanh_fast": dict(entropy_norm="row_zscore_tanh", group_std="none", group_size=G),
    "linear": dict(LINEAR),
    "linear_population_alpha": dict(LINEAR, group_std="population", alpha=0.9),
    "linear_no_renorm": dict(LINEAR, renormalize=False, alpha=0.3),
    "linear_quantile_fast": dict(weighting="linear", group_std="none", group_size=G),
}
FIELDS = ("reward", "group_id", "response_mask", "entropy")


def _valid_rows(b, group_size):
  mask = b["response_mask"]
  gid = np.arange(B) // group_size if group_size is not None else b["group_id"]
  return [bool(mask[i].any()) and (group_size is not None or 0 <= gid[i] < N)
          for i in range(mask.shape[0])]


def ref_eapo(b, *, group_size=None, kappa=math.log(4.0), alpha=0.5, weighting="exp",
             entropy_norm="batch_quantile", entropy_quantiles=(0.1, 0.9), renormalize=True,
             group_std="unbiased", eps=EPS):
  mask = b["response_mask"]
  adv = ref_grpo(b["reward"], b["group_id"], mask, group_size=group_size, group_std=group_std)
  valid = _valid_rows(b, group_size)
  pool = [float(b["entropy"][i, t]) for i in range(mask.shape[0]) if valid[i]
          for t in valid_tokens(mask, i)]
  if pool:
    q_lo, q_hi = np.quantile(np.array(pool), entropy_quantiles)  # numpy "linear"
  out = np.zeros(mask.shape)
  for i in range(mask.shape[0]):
    ts = valid_tokens(mask, i)
    if not ts or not valid[i]:
      continue
    h = [float(b["entropy"][i, t]) for t in ts]
    if entropy_norm == "batch_quantile":
      s = [min(max((x - q_lo) / (q_hi - q_lo + 1e-8), 0.0), 1.0) for x in h]
    else:
      mu = sum(h) / len(h)
      sd = math.sqrt(sum((x - mu) ** 2 for x in h) / len(h))
      s = [math.tanh((x - mu) / (sd + eps)) for x in h]
    sgn = float(np.sign(adv[i]))
    if weighting == "exp":
      w = [math.exp(kappa * sgn * x) for x in s]
    else:
      w = [max(1 + alpha * sgn * x, 0.0) for x in s]
    if renormalize:
      w = [len(ts) * x / sum(w) for x in w]
    for t, x in zip(ts, w):
      out[i, t] = adv[i] * x
  return out


CASES = table(ea.eapo_advantages, FIELDS, ref_eapo, CONFIGS)
CASE = {c.id: c for c in CASES}
test_matches_numpy_reference = reference_test(CASES, max_examples=12)


def test_registered_in_token_family():
  spec = registry.get_estimator("eapo")
  assert spec.family == "token" and spec.confidence == "code-verified"
  assert spec.fn is ea.eapo_advantages
  assert spec.needs == set(FIELDS)
  assert "2609.33781" in spec.paper and "Yeo" in spec.paper


def test_doctests():
  res = doctest.testmod(ea, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example():
  mask = np.ones((2, 4), bool)
  ent = np.tile(H.astype(np.float32), (2, 1))
  h = ea.eapo_entropy_scores(response_mask=mask[:1], entropy=ent[:1])
  np.testing.assert_allclose(np.asarray(h)[0], SPEC_H_ONE_ROW, atol=1e-4)
  # Two rows with rewards 1, 0 and the population std: Â = ±1.
  kw = dict(reward=np.array([1.0, 0.0]), group_id=np.zeros(2, np.int32), response_mask=mask,
            entropy=ent, num_groups=1, group_std="population")
  a = np.asarray(ea.eapo_advantages(**kw))
  np.testing.assert_allclose(a, [SPEC_POS, SPEC_NEG], atol=1e-4)
  np.testing.assert_allclose(a.sum(-1), [4.0, -4.0], atol=1e-4)
  # Raw credit ratio within a response is at most e^κ = 4.
  assert a[0].max() / a[0].min() <= 4.0 + 1e-5
  # The earlier linear design, kept as options.
  z = np.arctanh(np.asarray(ea.eapo_entropy_scores(response_mask=mask[:1], entropy=ent[:1],
                                                   norm="row_zscore_tanh")))
  np.testing.assert_allclose(z[0], SPEC_Z, atol=1e-3)
  lin = ea.eapo_advantages(**kw, **LINEAR)
  np.testing.assert_allclose(np.asarray(lin), [LINEAR_POS, LINEAR_NEG], atol=1e-3)


def test_kappa_schedule():
  assert float(ea.eapo_kappa(math.log(4.0), step=10)) == pytest.approx(math.log(4.0))
  assert float(ea.eapo_kappa(2.0, step=25, decay_steps=100)) == pytest.approx(1.5)
  assert float(ea.eapo_kappa(2.0, step=500, decay_steps=100)) == 0.0


@hypothesis.settings(max_examples=8, deadline=None)
@hypothesis.given(b=batches())
def test_reduces_to_grpo_and_keeps_sign_and_budget(b):
  grpo = grpo_of(b)
  kw = pick(b, *FIELDS)
  assert_reduces_to_grpo([ea.eapo_advantages(num_groups=N, **off, **kw)
                          for off in (dict(kappa=0.0), dict(LINEAR, alpha=0.0))],
                         grpo, rtol=1e-6, atol=1e-7)
  flat = dict(kw, entropy=np.full((B, T), 1.3, np.float32))
  assert_reduces_to_grpo([ea.eapo_advantages(num_groups=N, **extra, **flat)
                          for extra in (dict(), LINEAR)], grpo, rtol=1e-5, atol=1e-6)
  a = np.asarray(ea.eapo_advantages(num_groups=N, **kw), np.float64)
  assert_sign_kept(a, grpo)
  assert_budget_kept(a, grpo)


def test_scores_are_batch_coupled():
  # The quantiles are one statistic of the pool: adding a row changes another row's scores
  # (the code's behaviour), unlike the per-response z-score.
  ent = np.array([[0.2, 1.5, 0.4, 0.9], [3.0, 0.0, 2.0, 1.0]], np.float32)
  m = np.ones((2, 4), bool)
  both = np.asarray(ea.eapo_entropy_scores(response_mask=m, entropy=ent))
  one = np.asarray(ea.eapo_entropy_scores(response_mask=m[:1], entropy=ent[:1]))
  assert not np.allclose(both[0], one[0])
  both = np.asarray(ea.eapo_entropy_scores(response_mask=m, entropy=ent, norm="row_zscore_tanh"))
  one = np.asarray(ea.eapo_entropy_scores(response_mask=m[:1], entropy=ent[:1],
                                          norm="row_zscore_tanh"))
  np.testing.assert_allclose(both[0], one[0], rtol=1e-6)


def test_polarity():
  # Success: the highest-entropy token gets the most credit; failure: the lowest the most blame.
  ent = np.tile(np.array([0.1, 2.0, 0.5], np.float32), (2, 1))
  a = np.asarray(ea.eapo_advantages(reward=np.array([1.0, 0.0]),
                                    group_id=np.zeros(2, np.int32),
                                    response_mask=np.ones((2, 3), bool), entropy=ent,
                                    num_groups=1))
  assert np.argmax(a[0]) == 1 and np.argmin(a[1]) == 0


@pytest.mark.parametrize("kwargs,match", [
    (dict(group_std="sample"), "group_std"),
    (dict(weighting="softmax"), "weighting"),
    (dict(entropy_norm="batch_zscore"), "norm"),
    (dict(entropy_quantiles=(0.9, 0.1)), "quantiles"),
    (dict(group_size=3), "multiple"),
    (dict(group_id=None), "group_id"),
    (dict(num_groups=0), "num_groups"),
])
def test_bad_static_args_raise(kwargs, match):
  base = dict(reward=np.zeros(B, np.float32), group_id=np.zeros(B, np.int32),
              response_mask=np.ones((B, T), bool), entropy=np.ones((B, T), np.float32),
              num_groups=N)
  base.update(kwargs)
  with pytest.raises(ValueError, match=match):
    ea.eapo_advantages(**base)


def test_shape_mismatch_raises():
  with pytest.raises(AssertionError):
    ea.eapo_advantages(reward=np.zeros(B, np.float32), group_id=np.zeros(B, np.int32),
                       response_mask=np.ones((B, T), bool),
                       entropy=np.ones((B, T + 1), np.float32), num_groups=N)




# Entropies with ties, ±0, negative values and large magnitudes (not physical, but the
# quantiles must not care).
_ENTROPY_POOL = np.array([0.0, -0.0, 0.5, 0.5, 1.0, -1.0, 2.0, 3e38, -3e38, 1e30], np.float32)


@functools.lru_cache(maxsize=None)
def _jitted_quantiles(q, sort_based):
  fn = _sort_based_quantiles if sort_based else ea.ops.masked_quantiles
  return jax.jit(functools.partial(fn, quantiles=q))


@functools.lru_cache(maxsize=None)
def _jitted_sort_based_eapo(name):
  """EAPO with the former sort-based quantiles, traced (once, cached) under the patch."""
  fn = jax.jit(functools.partial(ea.eapo_advantages, num_groups=N, **CONFIGS[name]))

  def call(**kw):
    with pytest.MonkeyPatch.context() as mp:
      mp.setattr(ea.ops, "masked_quantiles", _sort_based_quantiles)
      return fn(**kw)
  return call


@pytest.mark.parametrize("name", ["default", "kappa_quantiles", "linear_quantile_fast"])
@hypothesis.settings(max_examples=5, deadline=None)
@hypothesis.given(data=st.data())
def test_equals_the_sort_based_quantiles_exactly(name, data):
  cfg = CONFIGS[name]
  b = data.draw(batches(contiguous=cfg.get("group_size") is not None))
  rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
  ent = np.where(rng.random((B, T)) < data.draw(st.sampled_from([0.3, 1.0])),
                 rng.choice(_ENTROPY_POOL, (B, T)), b["entropy"]).astype(np.float32)
  mask = b["response_mask"]
  if data.draw(st.booleans()):   # a single valid token in the batch
    mask = np.zeros_like(mask)
    mask[rng.integers(B), rng.integers(T)] = True
  kw = dict(pick(b, *FIELDS), entropy=ent, response_mask=mask)
  q = cfg.get("entropy_quantiles", (0.1, 0.9))
  got_q = _jitted_quantiles(q, False)(ent, mask)
  want_q = _jitted_quantiles(q, True)(ent, mask)
  np.testing.assert_array_equal(np.asarray(got_q), np.asarray(want_q))
  (got,) = run(CASE[name], kw)
  want = np.asarray(_jitted_sort_based_eapo(name)(**kw))
  np.testing.assert_array_equal(got, want)
