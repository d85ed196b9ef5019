"""C-GRPO / CaRR (credit/advantages/shaping/c_grpo.py)."""
from __future__ import annotations

import numpy as np
import pytest

from credit.advantages.shaping import c_grpo_advantages
from tests.advantages.outcome._harness import Case, reference_test, row0, valid_groups
from tests.advantages.shaping._harness_a import grpo_on, jcall, one_group

FIELDS = ("reward", "rubric", "rubric_mask", "group_id", "response_mask")


def shaped_reward(b, alpha=0.3, mode="positive", normalize_in_positive=False):
  valid, groups = valid_groups(b)
  o = b["reward"].astype(np.float64)
  m = b["rubric_mask"].astype(bool)
  rub = b["rubric"].astype(np.float64)
  r = np.array([rub[i, m[i]].mean() if m[i].any() else 0.0 for i in range(len(o))])
  rhat = r.copy()
  for rows in groups:
    mx = r[rows].max()
    if mx != 0:
      rhat[rows] = r[rows] / mx
  R = np.zeros(len(o))
  for i in range(len(o)):
    if mode == "positive":
      x = rhat[i] if normalize_in_positive else r[i]
      R[i] = o[i] if o[i] == 0 else (1 - alpha) * o[i] + alpha * x
    elif mode == "blend":
      R[i] = (1 - alpha) * o[i] + alpha * rhat[i]
    else:
      R[i] = o[i] if o[i] > 0 else alpha * rhat[i]
  return R


def ref_c_grpo(b, singleton="zero", **kw):
  return (grpo_on(b, shaped_reward(b, **kw), singleton=singleton),)


CASES = [
    Case("c_grpo", "c_grpo", FIELDS, ref_c_grpo),
    Case("c_grpo_pos_norm", "c_grpo", FIELDS, ref_c_grpo,
         (("normalize_in_positive", True), ("alpha", 0.5))),
    Case("c_grpo_negative", "c_grpo", FIELDS, ref_c_grpo,
         (("mode", "negative"), ("singleton", "raw"))),
]

test_matches_numpy_reference = reference_test(CASES)


def _call(o, rubric, rubric_mask=None, **kw):
  rubric = np.asarray(rubric, np.float32)
  if rubric_mask is None:
    rubric_mask = np.ones(rubric.shape, bool)
  return row0(jcall(c_grpo_advantages, reward=np.asarray(o, np.float32), rubric=rubric,
                                rubric_mask=rubric_mask, **one_group(len(o)), **kw))


def test_worked_example():
  # Worked example: o=[1,1,0,0], r=[0.5,1.0,0.75,0] -> R=[0.85,1,0,0]. r is a rubric fraction:
  # row 0 identifies 1 of 2 items, row 2 3 of 4 (the fourth column absent for rows 0, 1).
  rubric = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]]
  mask = np.array([[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]], bool)
  a = _call([1, 1, 0, 0], rubric, mask)
  np.testing.assert_allclose(a, [0.720864, 0.999908, -0.860386, -0.860386], atol=1e-5)


def test_positive_mode_blends_unnormalised_rubric_by_default():
  # Group max of r is 0.5: r̂ = [1, 0.4, ...]; the default blends r, the flag blends r̂.
  o, rub = [1, 1, 0, 0], [[0.5], [0.2], [0.5], [0.0]]
  R_code = np.array([0.7 + 0.15, 0.7 + 0.06, 0, 0])
  R_paper = np.array([0.7 + 0.3, 0.7 + 0.12, 0, 0])
  z = lambda R: (R - R.mean()) / (R.std(ddof=1) + 1e-6)
  np.testing.assert_allclose(_call(o, rub), z(R_code), atol=1e-5)
  np.testing.assert_allclose(_call(o, rub, normalize_in_positive=True), z(R_paper), atol=1e-5)
  # Blend: (1 − α)·o + α·r̂ with r̂ = [1, 0.4, 1, 0].
  np.testing.assert_allclose(_call(o, rub, mode="blend"),
                             z(np.array([1.0, 0.82, 0.3, 0.0])), atol=1e-5)
  # Negative mode: the wrong rows get α·r̂ = [0.3, 0]; no rubric items at all -> r = 0.
  np.testing.assert_allclose(_call(o, rub, mode="negative"), z(np.array([1, 1, 0.3, 0.])),
                             atol=1e-5)
  assert np.all(_call([0, 0, 0, 0], rub, np.zeros((4, 1), bool)) == 0.0)


def test_singleton_group_gives_zero_not_nan():
  a = _call([1.0], [[0.5]])
  assert np.all(a == 0.0)


def test_bad_mode_raises():
  with pytest.raises(ValueError, match="mode"):
    _call([1, 0], [[1.0], [0.0]], mode="positives")


def test_equal_shaped_rewards_give_exact_zeros_on_the_fast_path():
  # Found by hypothesis: two valid rows (o = 1.5, rubric means 0.5 from [0, 1] and
  # [1, 0.5, 0]) beside two empty rows of the same group. Under the suite's XLA flags the
  # fast path gave −0.119 to both (v − max v = 1 ulp, divided by σ + ε = 1e-6).
  rubric = np.zeros((16, 3), np.float32)
  rubric[:4] = [[0, .5, 1], [.5, .5, 1], [0, 1, 0], [1, .5, 0]]
  mask = np.zeros((16, 3), bool)
  mask[:, 0] = True
  mask[2, 1] = mask[3, 1] = mask[3, 2] = True
  resp = np.zeros((16, 6), bool)
  resp[2, 0] = resp[3, 0] = True
  reward = np.where(np.arange(16) < 4, 1.5, 0.0).astype(np.float32)
  a = jcall(c_grpo_advantages, reward=reward, rubric=rubric, rubric_mask=mask,
            group_id=np.repeat(np.arange(4), 4).astype(np.int32), response_mask=resp,
            num_groups=4, group_size=4)
  assert np.all(np.asarray(a) == 0.0)


def code_group_rewards(outcome, rubric_reward, ratio, normalize, only_negative, only_positive):
  """THUDM/CaRR `generate_and_rm_group`'s reward block for one group, transcribed."""
  out = []
  mx = max(rubric_reward)
  for o, r in zip(outcome, rubric_reward):
    rn = (r / mx if mx > 0 else r) if normalize else r
    if only_negative:
      out.append(o if o > 0 else ratio * rn)
    elif only_positive:
      out.append(o if o == 0 else (1 - ratio) * o + ratio * r)
    else:
      out.append((1 - ratio) * o + ratio * rn)
  return np.array(out)


@pytest.mark.parametrize("normalize", (True, False))
@pytest.mark.parametrize("mode", ("positive", "blend", "negative"))
@pytest.mark.parametrize("seed", (0, 1))
def test_normalize_rubric_reward_flag_follows_the_code(normalize, mode, seed):
  rng = np.random.default_rng(seed)
  o = rng.choice([0.0, 1.0], 6)
  o[:2] = [0.0, 1.0]
  rub = rng.uniform(0, 0.6, (6, 1)).astype(np.float32)
  R = code_group_rewards(o, rub[:, 0].astype(np.float64), 0.3, normalize, mode == "negative",
                         mode == "positive")
  want = (R - R.mean()) / (R.std(ddof=1) + 1e-6)
  got = _call(o, rub, mode=mode, normalize_rubric_reward=normalize)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
