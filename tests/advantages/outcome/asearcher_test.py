"""ASearcher (credit/advantages/outcome/asearcher.py): hand-worked examples, the reward
transform, the numpy reference (batch and per-group, token-weighted, population std) and
argument checks."""
from __future__ import annotations

import numpy as np
import pytest

from credit import get_estimator
from credit.advantages.outcome import asearcher_advantages
from tests.advantages.outcome._harness import Case, N, fixed_batch, reference_test, row0

# 4 rows with rewards 0, 1, 1, 0 and lengths 2, 3, 1, 2 (T = 3); groups {0, 1} and {2, 3}.
HAND = dict(reward=np.array([0.0, 1.0, 1.0, 0.0], np.float32),
            response_mask=np.arange(3)[None, :] < np.array([2, 3, 1, 2])[:, None])
HAND_GID = np.array([0, 0, 1, 1], np.int32)


def test_hand_example_batch_norm():
  # r' = clip((r − 0.5)·10, ±20) = [−5, 5, 5, −5], over 8 tokens (weights 2, 3, 1, 2):
  # μ = (−10 + 15 + 5 − 10)/8 = 0; σ² = 25·8/8 = 25 → A = ±5/(5 + 1e-5) = ±0.999998.
  a = np.asarray(asearcher_advantages(**HAND))
  np.testing.assert_allclose(row0(a), [-0.999998, 0.999998, 0.999998, -0.999998], atol=1e-6)
  np.testing.assert_array_equal(a[~HAND["response_mask"]], 0.0)
  assert np.all(a == a[:, :1] * HAND["response_mask"])  # constant along each response
  # Rewards 1, 0, 0, 0: r' = [5, −5, −5, −5]; μ = (10 − 15 − 5 − 10)/8 = −2.5;
  # r' − μ = [7.5, −2.5, −2.5, −2.5]; σ² = (2·56.25 + 6·6.25)/8 = 18.75, σ = 4.330127;
  # A = [1.732047, −0.577349].
  a = asearcher_advantages(**dict(HAND, reward=np.array([1.0, 0, 0, 0], np.float32)))
  np.testing.assert_allclose(row0(a), [1.732047, -0.577349, -0.577349, -0.577349], atol=1e-5)
  # Mean only (std_norm=False): r' − μ.
  a = asearcher_advantages(**dict(HAND, reward=np.array([1.0, 0, 0, 0], np.float32)),
                           std_norm=False)
  np.testing.assert_allclose(row0(a), [7.5, -2.5, -2.5, -2.5], atol=1e-5)
  # No normalisation: r' itself.
  a = asearcher_advantages(**HAND, adv_norm=False)
  np.testing.assert_allclose(row0(a), [-5.0, 5.0, 5.0, -5.0])


def test_hand_example_group_norm():
  # Group 0: rows (r' −5, 2 tokens), (5, 3 tokens): μ = 5/5 = 1, centred [−6, 4],
  #   σ² = (2·36 + 3·16)/5 = 24, σ = 4.898979 → [−1.224742, 0.816495].
  # Group 1: rows (5, 1 token), (−5, 2 tokens): μ = −5/3, centred [20/3, −10/3],
  #   σ² = (400/9 + 2·100/9)/3 = 200/9, σ = 4.714045 → [√2, −1/√2] = [1.414211, −0.707106].
  for kw in (dict(group_id=HAND_GID, num_groups=2), dict(num_groups=2, group_size=2)):
    a = asearcher_advantages(**HAND, group_adv_norm=True, **kw)
    np.testing.assert_allclose(row0(a), [-1.224742, 0.816495, 1.414211, -0.707106], atol=1e-5)
  # Unbiased σ over the tokens: group 0 σ² = 120/4 = 30 → [−6, 4]/5.477226.
  a = asearcher_advantages(**HAND, group_adv_norm=True, std_unbiased=True, group_id=HAND_GID,
                           num_groups=2)
  np.testing.assert_allclose(row0(a)[:2], [-1.095445, 0.730297], atol=1e-5)


def test_reward_transform_and_partial_groups():
  # r = 3 → 25 → clipped at 20; r = −5 → −55 → −20; custom bias/scale/clip.
  m = np.ones((2, 1), bool)
  a = asearcher_advantages(reward=np.array([3.0, -5.0], np.float32), response_mask=m,
                           adv_norm=False)
  np.testing.assert_allclose(row0(a), [20.0, -20.0])
  a = asearcher_advantages(reward=np.array([3.0, -5.0], np.float32), response_mask=m,
                           adv_norm=False, reward_bias=0.0, reward_scaling=2.0, reward_clip=8.0)
  np.testing.assert_allclose(row0(a), [6.0, -8.0])
  # Group 1 holds one row only (an incomplete group of an async batch): exact zeros, and
  # group 0 is as if group 1 were absent. The default needs no group ids at all.
  gid = np.array([0, 0, 1, 7], np.int32)   # id 7: outside [0, num_groups) -> ignored row
  a = np.asarray(asearcher_advantages(**HAND, group_adv_norm=True, group_id=gid,
                                      num_groups=2))
  np.testing.assert_allclose(row0(a), [-1.224742, 0.816495, 0.0, 0.0], atol=1e-5)
  assert "group_id" not in get_estimator("asearcher").needs
  assert "group_id" in get_estimator("asearcher").needs_for({"group_adv_norm": True})


def test_all_equal_rewards_give_zeros():
  b = fixed_batch()
  for kw in ({}, {"group_adv_norm": True, "group_id": b["group_id"], "num_groups": N},
             {"std_unbiased": True, "eps": 0.0}):
    a = np.asarray(asearcher_advantages(reward=np.full(len(b["reward"]), 0.7, np.float32),
                                        response_mask=b["response_mask"], **kw))
    assert np.all(a == 0.0), kw


@pytest.mark.parametrize("kw,match", [
    ({"reward_scaling": 0.0}, "reward_scaling"), ({"reward_clip": -1.0}, "reward_clip"),
    ({"eps": -1e-5}, "eps"), ({"group_adv_norm": True}, "num_groups"),
    ({"group_adv_norm": True, "num_groups": 2}, "group_id")])
def test_bad_hyperparameters_raise(kw, match):
  with pytest.raises(ValueError, match=match):
    asearcher_advantages(**HAND, **kw)


# --------------------------------------------------------------------------
# numpy reference (float64 loops over the tokens, from the formulas).
# --------------------------------------------------------------------------


def ref_asearcher(b, reward_bias=-0.5, reward_scaling=10.0, reward_clip=20.0, adv_norm=True,
                  group_adv_norm=False, std_norm=True, std_unbiased=False, eps=1e-5):
  m = b["response_mask"]
  r = np.clip((b["reward"].astype(np.float64) + reward_bias) * reward_scaling,
              -reward_clip, reward_clip)
  x = np.where(m, r[:, None], 0.0)
  if not (adv_norm or group_adv_norm):
    return (x,)
  out = np.zeros(m.shape)
  if group_adv_norm:
    gid = b["group_id"]
    pools = [(gid == g)[:, None] & m for g in range(N)]
  else:
    pools = [m]
  for sel in pools:
    n = sel.sum()
    if n == 0:
      continue
    mu = x[sel].mean()
    c = np.where(sel, x - mu, 0.0)
    if std_norm:
      den = n - 1 if std_unbiased else n
      sd = np.sqrt(np.sum(c[sel] ** 2) / den) if den > 0 else 1.0
      c = c / (sd + eps)
    out = np.where(sel, c, out)
  return (out,)


FIELDS = ("reward", "response_mask")
CASES = [
    Case("asearcher", "asearcher", FIELDS, ref_asearcher, group=False, holes=True),
    Case("asearcher_group", "asearcher", FIELDS + ("group_id",), ref_asearcher,
         (("group_adv_norm", True),)),
    Case("asearcher_unbiased", "asearcher", FIELDS, ref_asearcher,
         (("std_unbiased", True), ("reward_scaling", 3.0), ("reward_bias", 0.0)), group=False),
]

test_matches_numpy_reference = reference_test(CASES)
