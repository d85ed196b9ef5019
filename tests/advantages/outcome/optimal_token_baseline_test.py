"""Optimal Token Baseline (credit/advantages/outcome/optimal_token_baseline.py)."""
from __future__ import annotations

import numpy as np
import pytest

from credit.advantages.outcome import optimal_token_baseline_advantages as otb
from tests.advantages.outcome._harness import (BASE, Case, G, N, fixed_batch, reference_test,
                                               token_x, valid_groups)


def ref_otb(b, align="position", handle_zero_tail=True, eps=1e-8, singleton="zero",
            with_tr=False, with_is=False):
  mask = b["response_mask"]
  _, groups = valid_groups(b)
  x = token_x(b, with_tr)
  g_ret = np.zeros(mask.shape)
  for i in range(mask.shape[0]):
    run = 0.0
    for t in reversed(range(mask.shape[1])):
      if mask[i, t]:
        run += x[i, t]
        g_ret[i, t] = run
  w = 1 - 2 * np.exp(b["logprob_old"].astype(np.float64)) + b["sum_pi_squared"]
  if with_is:
    w = w * b["is_weights"].astype(np.float64) ** 2
  cw = np.cumsum(np.where(mask, w, 0.0), axis=1)
  adv = np.zeros(mask.shape)
  for rows in groups:
    if len(rows) == 1:
      if singleton == "raw":
        adv[rows[0]] = g_ret[rows[0]]
      continue
    cols = {i: (list(range(mask.shape[1])) if align == "position"
                else list(np.nonzero(mask[i])[0])) for i in rows}
    for key in range(mask.shape[1]):
      members = []
      for i in rows:
        if key < len(cols[i]) and mask[i, cols[i][key]]:
          members.append((i, cols[i][key]))
      if not members:
        continue
      num = sum(g_ret[i, t] * cw[i, t] for i, t in members)
      den = sum(cw[i, t] for i, t in members) + eps
      base = 0.0 if (handle_zero_tail and len(members) == 1) else num / den
      for i, t in members:
        adv[i, t] = g_ret[i, t] - base
  return (adv,)


OTB = BASE + ("logprob_old", "sum_pi_squared")
CASES = [
    Case("optimal_token_baseline", "optimal_token_baseline", OTB, ref_otb),
    Case("otb_holes", "optimal_token_baseline", OTB, ref_otb, holes=True),
    Case("otb_tir", "optimal_token_baseline", OTB + ("token_reward", "is_weights"), ref_otb,
         (("align", "valid_index"), ("handle_zero_tail", False), ("singleton", "raw")),
         (("with_tr", True), ("with_is", True)), holes=True),
    Case("otb_tir_tail", "optimal_token_baseline", OTB, ref_otb, (("align", "valid_index"),),
         holes=True),
]


test_matches_numpy_reference = reference_test(CASES)


def _hand(mask, reward, **kw):
  nb, nt = mask.shape
  return np.asarray(otb(reward=np.asarray(reward, np.float32), group_id=np.zeros(nb, np.int32),
                        response_mask=mask, logprob_old=np.full((nb, nt), np.log(0.5), np.float32),
                        sum_pi_squared=np.full((nb, nt), 0.5, np.float32), num_groups=1,
                        eps=0.0, **kw))


def test_hand_example():
  # One group of two rows, lengths 2 and 3, rewards 1 and 0, π = 1/2, Σπ² = 1/2 -> w = 1/2,
  # W = [.5, 1, 1.5]: t = 0, 1 baselines (1·W)/(2W) = 0.5; at t = 2 only row 1 is valid, so
  # zero tail: A = G = 0.
  a = _hand(np.array([[1, 1, 0], [1, 1, 1]], bool), [1., 0.])
  np.testing.assert_allclose(a, [[0.5, 0.5, 0], [-0.5, -0.5, 0]], atol=1e-6)


def test_zero_tail_with_observation_tokens_inside_a_response():
  # Row 0 = [1, 1, 0, 0] (2 tokens), row 1 = [1, 0, 1, 1] (3 tokens, an observation token at
  # t = 1). Column 1 has only row 0, columns 2-3 only row 1: each is alone there, so
  # A = G (baseline 0). verl's rule would zero row 1's baseline from position 2 (row 0's
  # token count) and leave row 0 alone at t = 1 with its own return as baseline (A = 0).
  a = _hand(np.array([[1, 1, 0, 0], [1, 0, 1, 1]], bool), [1., 3.])
  # t = 0: both rows, equal W -> baseline (1 + 3)/2 = 2.
  np.testing.assert_allclose(a, [[-1.0, 1.0, 0, 0], [1.0, 0, 3.0, 3.0]], atol=1e-6)
  a = _hand(np.array([[1, 1, 0, 0], [1, 0, 1, 1]], bool), [1., 3.], handle_zero_tail=False)
  np.testing.assert_allclose(a, [[-1.0, 0.0, 0, 0], [1.0, 0, 0.0, 0.0]], atol=1e-6)


def test_alignments_agree_on_right_padded_batches():
  b = fixed_batch(seed=29, contiguous=True)
  kw = dict(reward=b["reward"], group_id=b["group_id"], response_mask=b["response_mask"],
            logprob_old=b["logprob_old"], sum_pi_squared=b["sum_pi_squared"], num_groups=N)
  pos = otb(**kw)
  vi = otb(**kw, align="valid_index")
  vi_fast = otb(**kw, align="valid_index", group_size=G)
  np.testing.assert_allclose(np.asarray(vi), np.asarray(pos), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(vi_fast), np.asarray(pos), rtol=1e-5, atol=1e-6)


def test_bad_align_raises():
  b = fixed_batch()
  with pytest.raises(ValueError, match="align 'column'"):
    otb(reward=b["reward"], group_id=b["group_id"], response_mask=b["response_mask"],
        logprob_old=b["logprob_old"], sum_pi_squared=b["sum_pi_squared"], num_groups=N,
        align="column")
