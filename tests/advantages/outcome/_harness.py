"""Shared pieces of the outcome-estimator tests (tests/advantages/outcome/<name>_test.py).

Batches (every field any outcome estimator takes, plus a DCPO state), the `Case` table
type, a runner that jits once per (case, group path), the hypothesis batch strategy, the
two checks every method file runs (numpy reference on hypothesis batches, segment path ==
fast path), and the float64 numpy building blocks the per-method references are written
from (loops over the formulas, not over the code).

Fixed shapes N=4 groups x G=4 samples, T=6 tokens (B=16), so each (case, group path)
compiles once. Registry-wide properties (jit == eager, masking == slicing, padding,
permutation, degenerate inputs, gradients, sharding) live in tests/registry_common_test.py.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

from credit import registry
from credit.advantages.outcome.dcpo import DCPOState
from tests.contract_fields import (B, G, N, NUM_PROMPTS, T, contiguous_ids, make_fields,
                                   mixed_layout)

__all__ = ["B", "G", "N", "NUM_PROMPTS", "T", "BASE", "ONE_GROUP", "Case", "assert_close",
           "batches", "bt", "reference_test", "check_reference", "contiguous_ids",
           "fixed_batch", "grpo_rows", "make_batch", "row0", "run", "token_x", "valid_groups",
           "whiten_np"]

BASE = ("reward", "group_id", "response_mask")
# One group of four rows of three tokens (the worked examples).
ONE_GROUP = dict(group_id=np.zeros(4, np.int32), response_mask=np.ones((4, 3), bool),
                 num_groups=1)


# --------------------------------------------------------------------------
# Batches.
# --------------------------------------------------------------------------


def make_batch(reward, lengths, group_id, seed=0, holes=False) -> dict:
  """Every contract field (tests/contract_fields.py) plus a random DCPO `state`."""
  b = make_fields(seed, reward=np.asarray(reward, np.float32), lengths=lengths,
                  group_id=group_id, holes=holes)
  rng = np.random.default_rng(seed + 1)
  b["state"] = DCPOState(count=rng.integers(0, 4, NUM_PROMPTS).astype(np.int32),
                         mean=rng.uniform(-1, 1, NUM_PROMPTS).astype(np.float32),
                         std=rng.uniform(0, 1, NUM_PROMPTS).astype(np.float32))
  return b


def fixed_batch(seed=3, contiguous=False, holes=False) -> dict:
  """A mixed batch (`tests.contract_fields.mixed_layout`) plus a DCPO state."""
  reward, lengths, gid = mixed_layout(seed, contiguous)
  return make_batch(reward, lengths, gid, seed, holes=holes)


# Rewards from a few exact values or floats in [-3, 3]; magnitudes below 1e-6 are read as 0,
# since float32 squares of differences ~1e-19 underflow (DCPO, which adds no ε to σ, then
# sees σ = 0 where float64 does not).
_reward_values = st.one_of(
    st.sampled_from([0.0, 1.0, 0.5, -1.0]),
    st.floats(-3, 3, allow_nan=False, allow_subnormal=False, width=32).map(
        lambda x: 0.0 if abs(x) < 1e-6 else x))


@st.composite
def batches(draw, contiguous: bool, holes: bool = False):
  """Structure (rewards, all-equal groups, lengths incl. 0, id order) from hypothesis;
  continuous fields from a drawn seed."""
  reward = draw(st.lists(_reward_values, min_size=B, max_size=B))
  if draw(st.booleans()):  # make some groups all-equal
    for g in draw(st.lists(st.integers(0, N - 1), max_size=2)):
      reward[g * G:(g + 1) * G] = [reward[g * G]] * G
  lengths = draw(st.lists(st.integers(0, T), min_size=B, max_size=B))
  gid = contiguous_ids()
  if not contiguous:
    gid = gid[np.asarray(draw(st.permutations(list(range(B)))))]
  seed = draw(st.integers(0, 2**31 - 1))
  return make_batch(reward, lengths, gid, seed, holes=holes)


# --------------------------------------------------------------------------
# Cases and the runner.
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
  """An estimator with one static configuration, how to feed it, and its numpy reference.

  ref(batch, **kwargs, **ref_kwargs) returns the expected output leaves (advantages
  first, then returns / the DCPO state fields).
  """
  id: str
  name: str
  fields: tuple[str, ...]
  ref: Callable[..., tuple]
  kwargs: tuple = ()              # hyperparameters for the estimator (hashable items)
  ref_kwargs: tuple = ()          # extra reference-only options
  group: bool = True              # takes num_groups / group_size
  holes: bool = False             # hypothesis batches with observation tokens

  def __str__(self) -> str:       # the pytest id
    return self.id

  def data(self, b: dict) -> dict:
    return {f: b[f] for f in self.fields}

  def hyper(self, group_size: int | None = None) -> dict:
    kw = dict(self.kwargs)
    if "weights" in kw:
      kw["weights"] = np.asarray(kw["weights"], np.float32)
    if self.group:
      kw.update(num_groups=N, group_size=group_size)
    return kw

  def reference(self, b: dict) -> tuple:
    return self.ref(b, **dict(self.kwargs), **dict(self.ref_kwargs))


@functools.lru_cache(maxsize=None)
def _jitted(case: Case, group_size: int | None):
  fn = registry.get_estimator(case.name).fn
  kw = case.hyper(group_size)
  return jax.jit(lambda data: fn(**data, **kw))


def run(case: Case, b: dict, group_size: int | None = None, jit: bool = True) -> tuple:
  """The estimator's output leaves as numpy arrays (jitted once per case and path)."""
  data = case.data(b)
  if jit:
    out = _jitted(case, group_size)(data)
  else:
    out = registry.get_estimator(case.name).fn(**data, **case.hyper(group_size))
  return tuple(np.asarray(x) for x in jax.tree.leaves(out))


def assert_close(got: tuple, want: tuple, rtol=1e-5, atol=1e-5):
  assert len(got) == len(want)
  for g_, w_ in zip(got, want):
    np.testing.assert_allclose(np.asarray(g_, np.float64), np.asarray(w_, np.float64),
                               rtol=rtol, atol=atol)


def check_reference(case: Case, data) -> None:
  """Estimator == numpy reference on hypothesis batches: segment path with permuted ids,
  and (group estimators) the contiguous fast path."""
  b = data.draw(batches(contiguous=False, holes=case.holes))
  assert_close(run(case, b), case.reference(b), rtol=2e-4, atol=2e-4)
  if case.group:
    bc = data.draw(batches(contiguous=True, holes=case.holes))
    assert_close(run(case, bc, group_size=G), case.reference(bc), rtol=2e-4, atol=2e-4)


def reference_test(cases: list[Case]):
  """The per-method test against the numpy reference, parametrized over `cases`.

  In a test module: `test_matches_numpy_reference = reference_test(CASES)`. The fast path
  is compared with the reference too (`check_reference`), so both paths agree with it.
  """

  @pytest.mark.parametrize("case", cases, ids=str)
  @hypothesis.given(data=st.data())
  def test_matches_numpy_reference(case, data):
    check_reference(case, data)

  return test_matches_numpy_reference


def row0(adv) -> np.ndarray:
  """The first token's advantage of every row."""
  return np.asarray(adv)[:, 0]


# --------------------------------------------------------------------------
# Numpy building blocks (float64 loops, straight from the formulas).
# --------------------------------------------------------------------------


def valid_groups(b: dict, num_groups: int = N):
  """(valid rows [B] bool, lists of the valid rows of each group)."""
  gid, mask = b["group_id"], b["response_mask"]
  valid = mask.any(1) & (gid >= 0) & (gid < num_groups)
  groups: dict[int, list[int]] = {}
  for i in range(len(gid)):
    if valid[i]:
      groups.setdefault(int(gid[i]), []).append(i)
  return valid, list(groups.values())


def whiten_np(x, mask):
  """verl masked_whiten: unbiased variance over the valid entries, eps 1e-8."""
  v = x[mask]
  if v.size < 2:
    return np.zeros_like(x)
  return np.where(mask, (x - v.mean()) / np.sqrt(v.var(ddof=1) + 1e-8), 0.0)


def grpo_rows(b, r, scale="group", eps=1e-6, singleton="zero"):
  """GRPO per-row advantage of values `r` ([B]) for scale group | batch | none."""
  valid, groups = valid_groups(b)
  out = np.zeros(len(r))
  sd_b = r[valid].std(ddof=1) if valid.sum() > 1 else 0.0
  for rows in groups:
    x = r[rows]
    if len(rows) == 1:
      out[rows] = x if singleton == "raw" else 0.0
      continue
    c = x - x.mean()
    if scale == "group":
      c = c / (x.std(ddof=1) + eps)
    elif scale == "batch":
      c = c / (sd_b + eps)
    out[rows] = c
  return out


def bt(rows, b):
  """Per-row values broadcast to the response tokens."""
  return rows[:, None] * b["response_mask"]


def token_x(b, with_tr=False, kl_coef=0.0):
  """Per-token rewards: outcome on the last valid token (+ dense) − kl_coef·(old − ref)."""
  mask = b["response_mask"]
  x = np.zeros(mask.shape)
  for i in range(mask.shape[0]):
    idx = np.nonzero(mask[i])[0]
    if idx.size:
      x[i, idx[-1]] += b["reward"][i]
  if with_tr:
    x += np.where(mask, b["token_reward"], 0.0)
  if kl_coef:
    x -= kl_coef * np.where(mask, b["logprob_old"].astype(np.float64) - b["logprob_ref"], 0.0)
  return x
