"""SCRL (credit/advantages/shaping/scrl.py)."""
from __future__ import annotations

import numpy as np
import pytest

from credit.advantages.shaping import scrl_advantages
from tests.advantages.outcome._harness import Case, fixed_batch, reference_test, valid_groups
from tests.advantages.shaping._harness_a import jcall, z_items

FIELDS = ("sub_rewards", "sub_mask", "span_id", "group_id", "response_mask")


def ref_scrl(b, eps=1e-6, fill="next", singleton="zero"):
  valid, _ = valid_groups(b)
  r = b["sub_rewards"].astype(np.float64)
  ok = b["sub_mask"].astype(bool) & valid[:, None]
  J = r.shape[1]
  a = np.stack([z_items(r[:, j], b["group_id"], ok[:, j], eps, singleton) for j in range(J)], 1)
  mask, sid = b["response_mask"], b["span_id"]
  out = np.zeros(mask.shape)
  for i in range(mask.shape[0]):
    spans = [t for t in range(mask.shape[1]) if mask[i, t] and 0 <= sid[i, t] < J]
    for t in range(mask.shape[1]):
      if not mask[i, t]:
        continue
      if t in spans:
        out[i, t] = a[i, sid[i, t]]
      elif fill == "next" and spans:
        later = [s for s in spans if s > t]
        src = later[0] if later else spans[-1]
        out[i, t] = a[i, sid[i, src]]
  return (out,)


CASES = [
    Case("scrl", "scrl", FIELDS, ref_scrl),
    Case("scrl_zero_raw", "scrl", FIELDS, ref_scrl, (("fill", "zero"), ("singleton", "raw"))),
]

test_matches_numpy_reference = reference_test(CASES)


# Worked example: 3 rollouts, J=2, r=[[1,1],[1,0],[0,0]]. Tokens: reasoning, span 0, reasoning,
# span 1, trailing text.
SPAN = np.array([[-1, 0, -1, 1, -1]] * 3, np.int32)
R = np.array([[1., 1.], [1., 0.], [0., 0.]], np.float32)
A0 = np.array([0.577349, 0.577349, -1.154699])
A1 = np.array([1.154699, -0.577349, -0.577349])


def _call(**kw):
  args = dict(sub_rewards=R, sub_mask=np.ones((3, 2), bool), span_id=SPAN,
              group_id=np.zeros(3, np.int32), response_mask=np.ones((3, 5), bool),
              num_groups=1)
  args.update(kw)
  return np.asarray(jcall(scrl_advantages, **args))


def test_worked_example():
  a = _call()
  np.testing.assert_allclose(a, np.stack([A0, A0, A1, A1, A1], 1), atol=1e-5)
  a = _call(fill="zero")
  np.testing.assert_allclose(a, np.stack([0 * A0, A0, 0 * A0, A1, 0 * A0], 1), atol=1e-5)


def test_unanswered_subproblem_is_excluded_and_zero():
  sm = np.ones((3, 2), bool)
  sm[2, 1] = False                 # row 2 did not answer subproblem 1
  a = _call(sub_mask=sm, fill="zero")
  # Subproblem 1 over rows 0, 1 only: r = [1, 0] -> ±0.707107; row 2's span gets 0.
  np.testing.assert_allclose(a[:, 3], [0.707106, -0.707106, 0.0], atol=1e-5)
  np.testing.assert_allclose(a[:, 1], A0, atol=1e-5)


def test_row_without_spans_and_out_of_range_span_ids():
  span = SPAN.copy()
  span[0] = -1                     # no answer span in row 0: all zeros, whatever the fill
  span[1, 3] = 7                   # span id >= J: outside every span
  a = _call(span_id=span)
  assert np.all(a[0] == 0.0)
  np.testing.assert_allclose(a[1], [A0[1], A0[1], A0[1], A0[1], A0[1]], atol=1e-5)


def test_bad_arguments_raise():
  with pytest.raises(ValueError, match="fill"):
    _call(fill="prev")
  b = fixed_batch()
  with pytest.raises(ValueError, match="num_groups"):
    scrl_advantages(**{f: b[f] for f in FIELDS}, num_groups=0)


def test_fill_without_int32_keys_is_the_same(monkeypatch):
  """The [B,T] fill used where the pos·J + span keys would overflow int32 gives the same."""
  from credit.advantages.shaping import scrl
  rng = np.random.default_rng(3)
  span = rng.integers(-1, 3, (3, 9)).astype(np.int32)
  mask = np.arange(9)[None] < np.array([[9], [4], [7]])
  kw = dict(span_id=span, response_mask=mask, sub_rewards=rng.normal(size=(3, 2)).astype(np.float32))
  args = dict(sub_mask=np.ones((3, 2), bool), group_id=np.zeros(3, np.int32), num_groups=1, **kw)
  fast = np.asarray(scrl_advantages(**args))   # eager: each call traces the module afresh
  monkeypatch.setattr(scrl, "_INT32_KEYS", 1)
  np.testing.assert_array_equal(np.asarray(scrl_advantages(**args)), fast)
  np.testing.assert_allclose(_call(**kw), fast, rtol=1e-6, atol=1e-6)
