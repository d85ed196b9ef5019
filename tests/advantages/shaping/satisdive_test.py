"""SatisDive satisficing group advantage (credit/advantages/shaping/satisdive.py)."""
from __future__ import annotations

import chex
import hypothesis
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

from credit.advantages.shaping import satisdive_advantages
from credit.advantages.shaping.satisdive import group_reward_cutoff
from tests.advantages.outcome._harness import Case, bt, reference_test, row0, valid_groups
from tests.advantages.shaping._behaviour_ref import (check_properties, descriptors, z_rows)
from tests.advantages.shaping._harness_a import jcall, one_group

FIELDS = ("reward", "group_id", "response_mask", "tokens")


def ref_satisdive(b, cutoff_quantile=0.5, diversity_coef=1.0, scale=True, eps=1e-6):
  valid, groups = valid_groups(b)
  r = b["reward"].astype(np.float64)
  phi = descriptors(b["tokens"], b["response_mask"])
  adv = np.zeros(len(r))
  for rows in groups:
    c = np.quantile(r[rows], cutoff_quantile)
    sat_r = {i: min(r[i], c) for i in rows}
    a_r = z_rows(sat_r, rows, scale, eps)
    sat = [i for i in rows if r[i] >= c]
    d = {i: (np.mean([np.linalg.norm(phi[i] - phi[j]) for j in sat if j != i])
             if len(sat) > 1 else 0.0) for i in sat}
    dm = np.mean(list(d.values())) if sat else 0.0
    for i in rows:
      adv[i] = a_r[i] + (diversity_coef * (d[i] - dm) if i in d else 0.0)
  return (bt(adv, b),)


CASES = [
    Case("satisdive", "satisdive", FIELDS, ref_satisdive),
    Case("satisdive_q0_unscaled", "satisdive", FIELDS, ref_satisdive,
         (("cutoff_quantile", 0.0), ("scale", False), ("diversity_coef", 0.5))),
    Case("satisdive_q075", "satisdive", FIELDS, ref_satisdive, (("cutoff_quantile", 0.75),)),
]

test_matches_numpy_reference = reference_test(CASES)

TOKENS = np.array([[5, 5], [5, 6], [7, 7], [8, 8]], np.int32)


def test_worked_example():
  # R = [0, 1, 1, 1], median cutoff c = 1: R̃ = R, A^R = [-1.5, .5, .5, .5] (σ = 0.5).
  # Rows 1-3 are satisfied; ‖φ1−φ2‖ = ‖φ1−φ3‖ = √1.5, ‖φ2−φ3‖ = √2, so d = [1.2247,
  # 1.3195, 1.3195], centred [−0.0632, 0.0316, 0.0316].
  a = row0(jcall(satisdive_advantages, reward=np.array([0., 1, 1, 1], np.float32),
                 tokens=TOKENS, **one_group(4, 2)))
  np.testing.assert_allclose(a, [-1.5, 0.436843, 0.531577, 0.531577], atol=1e-5)


def test_limits_pure_grpo_and_pure_diversity():
  r = np.array([0., 1, 2, 3], np.float32)
  z = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
  # q = 1: only the best row is satisfied (no pair), the cutoff is the max: GRPO.
  a = row0(jcall(satisdive_advantages, reward=r, tokens=TOKENS, cutoff_quantile=1.0,
                 **one_group(4, 2)))
  np.testing.assert_allclose(a, z, atol=1e-5)
  # q = 0: the cutoff is the min, R̃ is constant, every row satisfied: diversity alone.
  a = row0(jcall(satisdive_advantages, reward=r, tokens=TOKENS, cutoff_quantile=0.0,
                 **one_group(4, 2)))
  np.testing.assert_allclose(a, row0(jcall(satisdive_advantages, reward=np.zeros(4, np.float32),
                                           tokens=TOKENS, **one_group(4, 2))), atol=1e-6)
  assert abs(a.sum()) < 1e-5 and np.abs(a).max() > 0.01


def test_binary_reward_keeps_its_reward_term_only_from_half_right():
  """A 0/1 reward in a group of 8: the median cutoff is above 0 only with >= 4 right, so with
  fewer the reward term is 0 (λ = 0 leaves nothing); `cutoff_quantile=1` keeps GRPO's."""
  tokens = (np.arange(16, dtype=np.int32).reshape(8, 2) * 3) % 11
  for k in range(9):
    r = (np.arange(8) < k).astype(np.float32)
    a = row0(jcall(satisdive_advantages, reward=r, tokens=tokens, diversity_coef=0.0,
                   **one_group(8, 2)))
    assert (np.abs(a).max() > 0.1) == (4 <= k < 8), k
    a = row0(jcall(satisdive_advantages, reward=r, tokens=tokens, diversity_coef=0.0,
                   cutoff_quantile=1.0, **one_group(8, 2)))
    z = (r - r.mean()) / (r.std(ddof=1) + 1e-6) if 0 < k < 8 else np.zeros(8)
    np.testing.assert_allclose(a, z, atol=1e-5)


def test_cutoff_interpolates_like_numpy():
  rng = np.random.default_rng(0)
  r = rng.normal(size=12).astype(np.float32)
  gid = np.repeat(np.arange(3), 4)[rng.permutation(12)].astype(np.int32)
  valid = rng.random(12) > 0.2
  for q in (0.0, 0.3, 0.5, 1.0):
    got = np.asarray(group_reward_cutoff(jnp.asarray(r), jnp.asarray(gid), jnp.asarray(valid),
                                         3, q))
    for i in np.flatnonzero(valid):
      np.testing.assert_allclose(got[i], np.quantile(r[valid & (gid == gid[i])], q), atol=1e-6)
    assert np.all(got[~valid] == 0)


@hypothesis.settings(max_examples=10, deadline=None)
@hypothesis.given(data=st.data())
def test_properties(data):
  def call(b, jit):
    kw = dict(reward=b["reward"], group_id=b["group_id"], response_mask=b["response_mask"],
              tokens=b["tokens"], num_groups=4)
    return (np.asarray(jcall(satisdive_advantages, **kw) if jit
                       else satisdive_advantages(**kw)),)
  check_properties(data, call)


class JitTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_jit_equals_eager_on_the_worked_example(self):
    fn = self.variant(lambda r, t: satisdive_advantages(
        reward=r, tokens=t, group_id=jnp.zeros(4, jnp.int32),
        response_mask=jnp.ones((4, 2), bool), num_groups=1))
    a = np.asarray(fn(jnp.array([0., 1, 1, 1]), jnp.asarray(TOKENS)))[:, 0]
    np.testing.assert_allclose(a, [-1.5, 0.436843, 0.531577, 0.531577], atol=1e-5)


def test_bad_arguments_are_refused():
  with pytest.raises(ValueError, match="num_groups"):
    satisdive_advantages(reward=np.zeros(4), tokens=TOKENS, group_id=np.zeros(4, np.int32),
                         response_mask=np.ones((4, 2), bool), num_groups=0)
