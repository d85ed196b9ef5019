"""Tests for the DGPO estimator (credit/advantages/token/dgpo.py).

Fixed shapes N=4 groups x G=4 samples,
T=6 tokens (tests/advantages/token/_ref.py), so each static configuration compiles once
(tests/advantages/token/_harness.py). The numpy loop reference is written from the
formulas (float64), not from the code. Generic registry-wide properties
(jit == eager, masking == slicing, padding, permutation, degenerate inputs, sharding) live
in the common estimator tests and are not repeated here.
"""
from __future__ import annotations

import doctest
import math

import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

from credit import registry
from credit.advantages.token import dgpo as dg
from tests.advantages.token._harness import (Case, assert_budget_kept, assert_reduces_to_grpo,
                                             assert_sign_kept, grpo_of, reference_test)
from tests.advantages.token._ref import B, EPS, G, N, T

# The worked example: one response of L = 4 tokens.
PI = np.array([0.9, 0.3, 0.6, 0.05])
PI_REF = np.array([0.9, 0.6, 0.3, 0.05])
H = np.array([0.1, 1.2, 0.8, 2.0])
SPEC_D = [0.0, 0.0515, 0.0515, 0.0]
SPEC_G = [0.0976, 1.1707, 0.7805, 1.9512]
SPEC_S = [0.0, 0.0603, 0.0402, 0.0]
SPEC_W = [0.5, 1.7, 1.3, 0.5]

# Vocabulary size for the paper's gate H/log|V| (required by the default gate="log_vocab").
V = 50
ROW_MEAN = dict(gate="row_mean")   # the row-mean gate (ours), used by the worked example

# Configurations compared with the reference (static and hyperparameter kwargs).
CONFIGS = {
    "softmax": dict(vocab_size=V),
    "softmax_vocab": dict(vocab_size=1000, temperature=0.25, gate_power=2.0),
    "softmax_row_mean": dict(ROW_MEAN),
    "softmax_hellinger": dict(exact_hellinger=True, temperature=1.0, vocab_size=V),
    "linear": dict(weighting="linear", **ROW_MEAN),
    "linear_population": dict(weighting="linear", alpha=0.8, group_std="population",
                              **ROW_MEAN),
    "linear_nogate_fast": dict(weighting="linear", gate_power=0.0, group_size=G, vocab_size=V),
    "softmax_fast_population": dict(group_std="population", group_size=G, vocab_size=V),
}


# --------------------------------------------------------------------------
# Numpy float64 reference, one loop per row and token.
# --------------------------------------------------------------------------


def ref_dgpo(reward, group_id, mask, lp_old, lp_ref, entropy, *, num_groups,
             group_size=None, weighting="softmax", temperature=0.5, alpha=0.5,
             gate_power=1.0, vocab_size=None, gate="log_vocab", group_std="unbiased", eps=EPS,
             hellinger=None, return_parts=False):
  reward = np.asarray(reward, np.float64)
  nb, nt = mask.shape
  gid = (np.arange(nb) // group_size if group_size is not None
         else np.asarray(group_id))
  valid = [bool(mask[b].any()) and (group_size is not None or 0 <= gid[b] < num_groups)
           for b in range(nb)]
  adv = np.zeros(nb)
  for b in range(nb):
    if not valid[b]:
      continue
    members = [reward[j] for j in range(nb) if valid[j] and gid[j] == gid[b]]
    n = len(members)
    if n < 2:
      continue
    mu = sum(members) / n
    ss = sum((x - mu) ** 2 for x in members)
    sigma = math.sqrt(ss / (n - 1 if group_std == "unbiased" else n))
    adv[b] = (reward[b] - mu) / (sigma + eps)
  out = np.zeros((nb, nt))
  weights = np.zeros((nb, nt))
  parts = {}
  for b in range(nb):
    ts = [t for t in range(nt) if mask[b, t]]
    if not ts:
      continue
    d, g = {}, {}
    for t in ts:
      if hellinger is None:
        d[t] = (math.sqrt(math.exp(lp_old[b, t])) - math.sqrt(math.exp(lp_ref[b, t]))) ** 2
      else:
        d[t] = min(max(float(hellinger[b, t]), 0.0), 1.0)
    ent = {t: max(float(entropy[b, t]), 0.0) for t in ts}
    mean_h = sum(ent.values()) / len(ts)
    for t in ts:
      if gate == "row_mean":
        g[t] = ent[t] / (mean_h + eps)
      else:
        g[t] = min(ent[t] / math.log(vocab_size), 1.0)
    s = {t: d[t] * g[t] ** gate_power for t in ts}
    L = len(ts)
    if weighting == "softmax":
      z = sum(math.exp(s[t] / temperature) for t in ts)
      w = {t: L * math.exp(s[t] / temperature) / z for t in ts}
    else:
      tot = sum(s.values())
      w = {t: (1 - alpha) + alpha * (L * s[t] + eps) / (tot + eps) for t in ts}
    for t in ts:
      weights[b, t] = w[t]
      out[b, t] = adv[b] * w[t]
    parts[b] = dict(d=[d[t] for t in ts], g=[g[t] for t in ts], s=[s[t] for t in ts])
  if return_parts:
    return out, weights, adv, parts
  return out


# --------------------------------------------------------------------------
# Batches.
# --------------------------------------------------------------------------


@st.composite
def batches(draw, contiguous=False):
  seed = draw(st.integers(0, 2**31 - 1))
  rng = np.random.default_rng(seed)
  reward = np.array(draw(st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, -1.0]),
                                  min_size=B, max_size=B)), np.float32)
  lengths = np.array(draw(st.lists(st.integers(0, T), min_size=B, max_size=B)))
  mask = np.arange(T)[None, :] < lengths[:, None]
  if draw(st.booleans()):  # holes: observation tokens inside the response
    mask &= rng.random((B, T)) > 0.3
  if contiguous:
    gid = np.arange(B, dtype=np.int32) // G
  else:
    gid = np.array(draw(st.lists(st.integers(-1, N), min_size=B, max_size=B)), np.int32)
  lp_old = rng.uniform(-4, 0, (B, T)).astype(np.float32)
  lp_ref = rng.uniform(-4, 0, (B, T)).astype(np.float32)
  if draw(st.booleans()):  # some tokens identical to the reference
    same = rng.random((B, T)) < 0.4
    lp_ref = np.where(same, lp_old, lp_ref)
  entropy = rng.uniform(0, 3, (B, T)).astype(np.float32)
  entropy = np.where(rng.random((B, T)) < 0.2, 0.0, entropy).astype(np.float32)
  hellinger = rng.uniform(0, 1, (B, T)).astype(np.float32)
  return dict(reward=reward, group_id=gid, response_mask=mask, logprob_old=lp_old,
              logprob_ref=lp_ref, entropy=entropy, hellinger_ref=hellinger)


FIELDS = ("reward", "group_id", "response_mask", "logprob_old", "logprob_ref", "entropy")


def _data(b):
  return {k: v for k, v in b.items() if k != "hellinger_ref"}


def ref_case(b, *, exact_hellinger=False, **cfg):
  hel = b["hellinger_ref"] if exact_hellinger else None
  return ref_dgpo(b["reward"], b["group_id"], b["response_mask"], b["logprob_old"],
                  b["logprob_ref"], b["entropy"], num_groups=N, hellinger=hel, **cfg)


CASES = [Case(name, dg.dgpo_advantages,
              FIELDS + (("hellinger_ref",) if cfg.get("exact_hellinger") else ()), ref_case,
              tuple(sorted(cfg.items())), batches=batches)
         for name, cfg in sorted(CONFIGS.items())]


def example_row():
  return dict(logprob_old=np.log(PI)[None].astype(np.float32),
              logprob_ref=np.log(PI_REF)[None].astype(np.float32),
              entropy=H[None].astype(np.float32), response_mask=np.ones((1, 4), bool))


# --------------------------------------------------------------------------
# Registration and docs.
# --------------------------------------------------------------------------


def test_registered_in_token_family():
  spec = registry.get_estimator("dgpo")
  assert spec.family == "token"
  assert spec.confidence == "paper-equation"
  assert spec.fn is dg.dgpo_advantages
  assert spec.needs == set(FIELDS)
  assert {"num_groups", "group_size", "weighting", "group_std",
          "vocab_size", "gate"} <= set(spec.static_argnames)
  assert "dgpo" in registry.list_estimators("token")
  assert "2605.03327" in spec.paper


def test_doctests():
  res = doctest.testmod(dg, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


# --------------------------------------------------------------------------
# The worked example.
# --------------------------------------------------------------------------


def test_reference_reproduces_spec_intermediates():
  row = example_row()
  _, w, _, parts = ref_dgpo(np.zeros(1), np.zeros(1, np.int64), row["response_mask"],
                            np.log(PI)[None], np.log(PI_REF)[None], H[None], num_groups=1,
                            weighting="linear", return_parts=True, **ROW_MEAN)
  np.testing.assert_allclose(parts[0]["d"], SPEC_D, atol=1e-3)
  np.testing.assert_allclose(parts[0]["g"], SPEC_G, atol=1e-3)
  np.testing.assert_allclose(parts[0]["s"], SPEC_S, atol=1e-3)
  np.testing.assert_allclose(w[0], SPEC_W, atol=1e-3)


def test_spec_example_linear_weights():
  w = dg.dgpo_weights(weighting="linear", **ROW_MEAN, **example_row())
  np.testing.assert_allclose(np.asarray(w[0]), SPEC_W, atol=1e-3)
  np.testing.assert_allclose(float(jnp.sum(w)), 4.0, rtol=1e-6)


@pytest.mark.parametrize("group_size", [None, 2])
def test_spec_example_advantages_plus_minus_w(group_size):
  # Two responses with rewards 1 and 0: population-std GRPO gives Â = ±1 (up to ε).
  row = example_row()
  kw = {k: np.concatenate([v, v]) for k, v in row.items()}
  a = dg.dgpo_advantages(reward=np.array([1.0, 0.0]), group_id=np.zeros(2, np.int32),
                         num_groups=1, group_size=group_size, weighting="linear",
                         group_std="population", **ROW_MEAN, **kw)
  np.testing.assert_allclose(np.asarray(a), [SPEC_W, [-x for x in SPEC_W]], atol=1e-3)


def test_spec_example_softmax_weights():
  # Softmax with the row-mean gate: w = 4·softmax(s/0.5), s = SPEC_S (hand-checked:
  # exp(2s) = [1, 1.1282, 1.0837, 1], sum 4.2119).
  w = dg.dgpo_weights(**ROW_MEAN, **example_row())
  np.testing.assert_allclose(np.asarray(w[0]), [0.9497, 1.0714, 1.0292, 0.9497], atol=1e-3)
  # The default, the paper's gate H/log|V| (tiny-dgpo), with V = 8: s = d·H/log 8 =
  # [0, 0.0297, 0.0198, 0] (d from SPEC_D), w = 4·softmax(s/0.5).
  w = dg.dgpo_weights(vocab_size=8, **example_row())
  z = np.exp(2 * np.array([0.0, 0.0515 * 1.2, 0.0515 * 0.8, 0.0]) / math.log(8))
  np.testing.assert_allclose(np.asarray(w[0]), 4 * z / z.sum(), atol=1e-3)


# --------------------------------------------------------------------------
# Reference comparison on generated batches.
# --------------------------------------------------------------------------


test_matches_numpy_reference = reference_test(CASES, max_examples=15)


@hypothesis.settings(max_examples=10)
@hypothesis.given(b=batches(contiguous=True))
def test_segment_path_equals_fast_path(b):
  seg = np.asarray(dg.dgpo_advantages(num_groups=N, vocab_size=V, **_data(b)))
  fast = np.asarray(dg.dgpo_advantages(num_groups=N, group_size=G, vocab_size=V, **_data(b)))
  np.testing.assert_allclose(seg, fast, rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------
# Reductions to GRPO, budget and sign.
# --------------------------------------------------------------------------


@hypothesis.settings(max_examples=10)
@hypothesis.given(b=batches())
def test_reduces_to_grpo(b):
  # α = 0: uniform weights.
  outs = [dg.dgpo_advantages(num_groups=N, weighting="linear", alpha=0.0, vocab_size=V,
                             **_data(b))]
  # Policy equal to the reference (step 0): d = 0, both weightings.
  same = dict(_data(b), logprob_ref=b["logprob_old"])
  outs += [dg.dgpo_advantages(num_groups=N, weighting=weighting, vocab_size=V, **same)
           for weighting in ("softmax", "linear")]
  # Zero entropy everywhere: g = 0, both gates.
  cold = dict(_data(b), entropy=np.zeros((B, T), np.float32))
  outs += [dg.dgpo_advantages(num_groups=N, **kw, **cold)
           for kw in (dict(ROW_MEAN), dict(weighting="linear", **ROW_MEAN), dict(vocab_size=100))]
  assert_reduces_to_grpo(outs, grpo_of(b), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("weighting", ["softmax", "linear"])
@hypothesis.settings(max_examples=10)
@hypothesis.given(b=batches())
def test_budget_and_sign_kept(weighting, b):
  a = np.asarray(dg.dgpo_advantages(num_groups=N, weighting=weighting, vocab_size=V,
                                    **_data(b)), np.float64)
  grpo = grpo_of(b)
  assert_budget_kept(a, grpo, rtol=1e-5, atol=1e-5)
  assert_sign_kept(a, grpo)
  mask = b["response_mask"]
  lengths = mask.sum(-1)
  w = np.asarray(dg.dgpo_weights(weighting=weighting, vocab_size=V, **{
      k: b[k] for k in ("response_mask", "logprob_old", "logprob_ref", "entropy")}))
  assert np.all(w[mask] > 0) and np.all(w[~mask] == 0)
  np.testing.assert_allclose(w.sum(-1), lengths, rtol=1e-5)


# --------------------------------------------------------------------------
# Edge cases and options.
# --------------------------------------------------------------------------


def test_all_equal_singleton_and_empty_rows_give_exact_zero():
  rng = np.random.default_rng(0)
  reward = np.array([1., 1., 1., 1., 0., 2., 3., 4.], np.float32)
  gid = np.array([0, 0, 0, 0, 1, 2, 2, 3], np.int32)  # group 1 and 3: singletons
  mask = np.ones((8, T), bool)
  mask[6] = False  # fully masked row: group 2 becomes a singleton too
  kw = dict(reward=reward, group_id=gid, response_mask=mask,
            logprob_old=rng.uniform(-3, 0, (8, T)).astype(np.float32),
            logprob_ref=rng.uniform(-3, 0, (8, T)).astype(np.float32),
            entropy=rng.uniform(0, 2, (8, T)).astype(np.float32))
  for weighting in ("softmax", "linear"):
    a = np.asarray(dg.dgpo_advantages(num_groups=4, weighting=weighting, vocab_size=V, **kw))
    assert np.all(a == 0.0)


def test_nan_outside_mask_is_ignored():
  rng = np.random.default_rng(1)
  mask = np.arange(T)[None, :] < rng.integers(0, T + 1, B)[:, None]
  clean = dict(reward=rng.choice([0., 1.], B).astype(np.float32),
               group_id=(np.arange(B) // G).astype(np.int32), response_mask=mask,
               logprob_old=rng.uniform(-3, 0, (B, T)).astype(np.float32),
               logprob_ref=rng.uniform(-3, 0, (B, T)).astype(np.float32),
               entropy=rng.uniform(0, 2, (B, T)).astype(np.float32),
               hellinger_ref=rng.uniform(0, 1, (B, T)).astype(np.float32))
  dirty = dict(clean)
  for k in ("logprob_old", "logprob_ref", "entropy", "hellinger_ref"):
    dirty[k] = np.where(mask, clean[k], np.nan).astype(np.float32)
  for weighting in ("softmax", "linear"):
    a = dg.dgpo_advantages(num_groups=N, weighting=weighting, vocab_size=V, **clean)
    d = dg.dgpo_advantages(num_groups=N, weighting=weighting, vocab_size=V, **dirty)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(d))
    assert np.all(np.isfinite(np.asarray(d)))


def test_weights_carry_no_gradient_and_reward_gradient_is_finite():
  rng = np.random.default_rng(2)
  mask = np.ones((B, T), bool)
  mask[3] = False
  kw = dict(group_id=(np.arange(B) // G).astype(np.int32), response_mask=mask,
            entropy=rng.uniform(0, 2, (B, T)).astype(np.float32))
  reward = jnp.asarray(np.array([1., 1., 1., 1.] + [0., 1.] * 6, np.float32))
  lp_old = jnp.asarray(rng.uniform(-3, 0, (B, T)).astype(np.float32))
  lp_ref = jnp.asarray(rng.uniform(-3, 0, (B, T)).astype(np.float32))
  cot = jnp.asarray(rng.normal(size=(B, T)).astype(np.float32))

  def f(reward, lp_old, lp_ref):
    a = dg.dgpo_advantages(reward=reward, logprob_old=lp_old, logprob_ref=lp_ref,
                           num_groups=N, vocab_size=V, **kw)
    return jnp.sum(a * cot)

  g_r, g_old, g_ref = jax.grad(f, argnums=(0, 1, 2))(reward, lp_old, lp_ref)
  assert np.all(np.isfinite(np.asarray(g_r)))
  assert np.all(np.asarray(g_old) == 0) and np.all(np.asarray(g_ref) == 0)


def test_hellinger_option():
  row = example_row()
  proxy = np.square(np.sqrt(PI) - np.sqrt(PI_REF))[None].astype(np.float32)
  for weighting in ("softmax", "linear"):
    w0 = dg.dgpo_weights(weighting=weighting, vocab_size=V, **row)
    w1 = dg.dgpo_weights(weighting=weighting, vocab_size=V, hellinger=proxy, **row)
    np.testing.assert_allclose(np.asarray(w1), np.asarray(w0), rtol=1e-5)
  # Values outside [0,1] are clipped.
  w2 = dg.dgpo_weights(hellinger=np.array([[-1., 0.3, 5., 0.]], np.float32), vocab_size=V, **row)
  w3 = dg.dgpo_weights(hellinger=np.array([[0., 0.3, 1., 0.]], np.float32), vocab_size=V, **row)
  np.testing.assert_array_equal(np.asarray(w2), np.asarray(w3))


def test_higher_gated_deviation_gets_more_credit():
  # Same deviation at tokens 1 and 2; token 1 has the higher entropy -> larger weight;
  # token 3 deviates but with zero entropy (confident) -> no extra credit.
  row = dict(logprob_old=np.log([[0.9, 0.3, 0.3, 0.3]]).astype(np.float32),
             logprob_ref=np.log([[0.9, 0.6, 0.6, 0.6]]).astype(np.float32),
             entropy=np.array([[1.0, 2.0, 1.0, 0.0]], np.float32),
             response_mask=np.ones((1, 4), bool))
  for weighting in ("softmax", "linear"):
    w = np.asarray(dg.dgpo_weights(weighting=weighting, vocab_size=V, **row))[0]
    assert w[1] > w[2] > w[0]
    np.testing.assert_allclose(w[3], w[0], rtol=1e-6)


@pytest.mark.parametrize("kwargs,match", [
    (dict(weighting="exp"), "weighting"),
    (dict(group_std="sample"), "group_std"),
    (dict(vocab_size=None), "vocab_size"),        # the default gate needs it
    (dict(vocab_size=None, weighting="linear"), "vocab_size"),
    (dict(vocab_size=1), "vocab_size"),
    (dict(gate="vocab"), "gate"),
    (dict(group_size=3), "multiple"),
    (dict(group_id=None), "group_id"),
    (dict(num_groups=0), "num_groups"),
])
def test_bad_static_args_raise(kwargs, match):
  rng = np.random.default_rng(3)
  base = dict(reward=np.zeros(B, np.float32), group_id=np.zeros(B, np.int32),
              response_mask=np.ones((B, T), bool),
              logprob_old=rng.uniform(-3, 0, (B, T)).astype(np.float32),
              logprob_ref=rng.uniform(-3, 0, (B, T)).astype(np.float32),
              entropy=np.ones((B, T), np.float32), num_groups=N, vocab_size=V)
  base.update(kwargs)
  with pytest.raises(ValueError, match=match):
    dg.dgpo_advantages(**base)
  if match not in ("gate", "vocab_size"):
    return
  with pytest.raises(ValueError, match=match):   # dgpo_weights checks the same, eagerly
    dg.dgpo_weights(**{k: v for k, v in base.items()
                       if k not in ("reward", "group_id", "num_groups", "group_size",
                                    "group_std")})


def test_shape_mismatch_raises():
  with pytest.raises(AssertionError):
    dg.dgpo_advantages(reward=np.zeros(B, np.float32), group_id=np.zeros(B, np.int32),
                       response_mask=np.ones((B, T), bool),
                       logprob_old=np.zeros((B, T), np.float32),
                       logprob_ref=np.zeros((B, T + 1), np.float32),
                       entropy=np.ones((B, T), np.float32), num_groups=N, vocab_size=V)


def test_exact_hellinger_needs_the_field():
  """exact_hellinger=True switches the runner's `hellinger_ref` on (registry needs) and is
  refused without it, before tracing."""
  spec = registry.get_estimator("dgpo")
  assert "hellinger_ref" in spec.needs_for({"exact_hellinger": True})
  assert "hellinger_ref" not in spec.needs_for({})
  row = example_row()
  with pytest.raises(ValueError, match="exact_hellinger=True needs `hellinger_ref`"):
    dg.dgpo_advantages(reward=np.array([1.]), group_id=np.zeros(1, np.int32), num_groups=1,
                       vocab_size=V, exact_hellinger=True, **row)
