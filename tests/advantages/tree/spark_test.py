"""SPARK (credit/advantages/tree/spark.py).

Registry-wide properties (jit, masking, padding, permutations, degenerate batches) also run in
tests/registry_common_test.py.
"""
from __future__ import annotations

import functools

import hypothesis
import hypothesis.strategies as st
import jax
import numpy as np
import pytest

from credit import registry
from credit.advantages import grpo_advantages
from credit.advantages.tree import spark
from credit.contract import ContractError

N, G, T, K = 2, 4, 5, 4
B = N * G
FIELDS = ("step_reward", "step_mask", "format_ok", "group_id", "response_mask")


@functools.lru_cache(maxsize=None)
def jitted(aggregation="min", group_size=None):
  return jax.jit(functools.partial(spark.spark_advantages, num_groups=N,
                                   group_size=group_size, aggregation=aggregation))


def make_batch(seed, contiguous=True):
  rng = np.random.default_rng(seed)
  gid = np.arange(B, dtype=np.int32) // G
  if not contiguous:
    gid = gid[rng.permutation(B)]
  return dict(step_reward=rng.choice([0.0, 1.0], (B, K)).astype(np.float32),
              step_mask=rng.random((B, K)) < 0.7, format_ok=rng.random(B) < 0.8,
              group_id=gid,
              response_mask=np.arange(T)[None, :] < rng.integers(0, T + 1, B)[:, None])


def ref_rewards(b, aggregation, penalty=0.0):
  out = np.zeros(B)
  for i in range(B):
    v = b["step_reward"][i][b["step_mask"][i]]
    if not b["format_ok"][i] or len(v) == 0:
      out[i] = penalty
    else:
      out[i] = {"min": v.min(), "mean": v.mean(), "last": v[-1]}[aggregation]
  return out


def ref_grpo(r, b, eps=1e-6):
  m = b["response_mask"]
  valid = m.any(1)
  a = np.zeros(B)
  for g in np.unique(b["group_id"]):
    rows = np.flatnonzero((b["group_id"] == g) & valid)
    if len(rows) >= 2:
      x = r[rows]
      a[rows] = (x - x.mean()) / (x.std(ddof=1) + eps)
  return np.where(m, a[:, None], 0.0)


def test_registered():
  spec = registry.get_estimator("spark")
  assert spec.family == "tree" and spec.confidence == "inferred"
  assert spec.needs == set(FIELDS)



def test_spec_example():
  kw = dict(step_reward=np.array([[1.0, 1.0, 0.0]]), step_mask=np.ones((1, 3), bool),
            format_ok=np.array([True]))
  got = [float(spark.spark_rewards(aggregation=a, **kw)[0]) for a in ("min", "mean", "last")]
  np.testing.assert_allclose(got, [0.0, 0.666667, 0.0], atol=1e-5)
  # Format failure and zero parsed steps both give the penalty.
  r = spark.spark_rewards(step_reward=np.ones((3, 2)), step_mask=np.array([[1, 1], [0, 0],
                          [1, 0]], bool), format_ok=np.array([False, True, True]),
                          format_penalty=-1.0)
  np.testing.assert_allclose(np.asarray(r), [-1.0, -1.0, 1.0])


@pytest.mark.parametrize("aggregation", spark.AGGREGATIONS)
@hypothesis.settings(max_examples=8)
@hypothesis.given(seed=st.integers(0, 10_000), contiguous=st.booleans())
def test_matches_numpy_reference(aggregation, seed, contiguous):
  b = make_batch(seed, contiguous)
  r = ref_rewards(b, aggregation)
  got = np.asarray(spark.spark_rewards(**{k: b[k] for k in FIELDS[:3]},
                                       aggregation=aggregation))
  np.testing.assert_allclose(got, r, atol=1e-6)
  np.testing.assert_allclose(np.asarray(jitted(aggregation)(**b)), ref_grpo(r, b),
                             rtol=1e-5, atol=1e-6)


@hypothesis.settings(max_examples=6)
@hypothesis.given(seed=st.integers(0, 10_000))
def test_is_grpo_on_the_spark_reward(seed):
  b = make_batch(seed)
  r = spark.spark_rewards(**{k: b[k] for k in FIELDS[:3]}, format_penalty=-1.0)
  want = grpo_advantages(reward=r, group_id=b["group_id"], response_mask=b["response_mask"],
                         num_groups=N)
  got = spark.spark_advantages(**b, num_groups=N, format_penalty=-1.0)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(jitted("min", G)(**b)), np.asarray(jitted()(**b)),
                             rtol=1e-6, atol=1e-6)


@hypothesis.settings(max_examples=6)
@hypothesis.given(seed=st.integers(0, 10_000), drop=st.integers(0, B - 1))
def test_masking_padding_permutation(seed, drop):
  b = make_batch(seed, contiguous=False)
  want = np.asarray(jitted()(**b))
  keep = np.arange(B) != drop
  masked = np.asarray(jitted()(**dict(b, response_mask=b["response_mask"] & keep[:, None])))
  sliced = jitted()(**{k: v[keep] for k, v in b.items()})
  assert np.all(masked[drop] == 0)
  np.testing.assert_allclose(masked[keep], np.asarray(sliced), rtol=1e-5, atol=1e-6)
  pad = dict(b, response_mask=np.pad(b["response_mask"], ((0, 0), (0, 2))),
             step_reward=np.where(b["step_mask"], b["step_reward"], np.nan))
  got = np.asarray(jitted()(**pad))
  np.testing.assert_allclose(got[:, :T], want, atol=1e-6)
  assert np.all(got[:, T:] == 0)
  perm = np.random.default_rng(seed).permutation(B)
  np.testing.assert_allclose(np.asarray(jitted()(**{k: v[perm] for k, v in b.items()})),
                             want[perm], rtol=1e-5, atol=1e-6)


def test_degenerate_and_validation():
  b = make_batch(0)
  bad_fmt = dict(b, format_ok=np.zeros(B, bool))           # every row gets the penalty: 0
  assert np.all(np.asarray(jitted()(**bad_fmt)) == 0)
  g = jax.grad(lambda v: jitted("mean")(**dict(b, step_reward=v)).sum())(b["step_reward"])
  assert np.all(np.isfinite(np.asarray(g)))
  with pytest.raises(ValueError, match="aggregation"):
    spark.spark_advantages(**b, num_groups=N, aggregation="max")
  spark.validate_spark_inputs(**b, num_groups=N)
  soft = dict(b, step_reward=np.full((B, K), 0.5, np.float32))
  with pytest.raises(ContractError, match="verdicts"):
    spark.validate_spark_inputs(**soft, num_groups=N)
  spark.validate_spark_inputs(**soft, num_groups=N, binary=False)
  with pytest.raises(ContractError, match="format_ok"):
    spark.validate_spark_inputs(**dict(b, format_ok=np.ones((B, 2), bool)), num_groups=N)
