"""A2TGPO estimator (credit/advantages/turn/a2tgpo.py)."""
from __future__ import annotations

import numpy as np
import pytest

from credit import registry
from credit.advantages.turn import a2tgpo
from tests.advantages.turn._ref import index_keys, pooled_keys, returns, scatter, zscore_cells
from tests.advantages.turn.igpo_test import batch, np_layout, np_prev
from tests.contract_fields import N

EXAMPLE = dict(reward=np.array([1.0, 0.0]),
               gold_logprob_turns=np.array([[.2, .15, 0.], [.4, 0., 0.]]),
               gold_logprob_prompt=np.zeros(2), step_mask=np.array([[1, 1, 1], [1, 1, 0]], bool),
               turn_id=np.array([[0, 1, 2], [0, 1, -1]], np.int32),
               group_id=np.zeros(2, np.int32), response_mask=np.array([[1, 1, 1], [1, 1, 0]], bool))


def ref_i_hat(b):
  row, valid, last = np_layout(b)
  g = np.where(valid, b["gold_logprob_turns"], 0.0).astype(np.float64)
  ig = np.where(valid & ~last, g - np_prev(g, valid, b["gold_logprob_prompt"]), 0.0)
  K = valid.shape[1]
  return zscore_cells(ig, valid & ~last, index_keys(b["group_id"], K), ddof=0), valid & ~last


def ref_a2tgpo(b, gamma=1.0, sqrt_n=True):
  row, valid, last = np_layout(b)
  i_hat, _ = ref_i_hat(b)
  out = zscore_cells(np.where(last, b["reward"][:, None], 0.0), last,
                     pooled_keys(b["group_id"], valid.shape[1]), ddof=0)
  return scatter(returns(i_hat + out, valid, gamma, sqrt_n), b["turn_id"], b["response_mask"])


def test_registered():
  spec = registry.get_estimator("a2tgpo")
  assert spec.family == "turn" and spec.confidence == "inferred"


def test_spec_example():
  # IG₀ = [0.2, −0.05], IG₁ = [0.4], outcome [1, 0] → A₀ = [0, 0.7071, 1], A₁ = [0, −1].
  a = np.asarray(a2tgpo.a2tgpo_advantages(num_groups=1, **EXAMPLE))
  np.testing.assert_allclose(a, [[0.0, 0.7071, 1.0], [0.0, -1.0, 0.0]], atol=1e-3)
  fields = {k: v for k, v in EXAMPLE.items() if k != "reward"}
  i_hat, cells, _ = a2tgpo.a2tgpo_normalized_gains(num_groups=1, **fields)
  eps = np.asarray(a2tgpo.a2tgpo_clip_range(i_hat, cells, EXAMPLE["turn_id"]))
  # ε₀ = [0.1238, 0.2] on turns 1–2 (+ 0.2 on the outcome turn), ε₁ = [0.2762, 0.2].
  np.testing.assert_allclose(eps, [[0.1238, 0.2, 0.2], [0.2762, 0.2, 0.2]], atol=1e-4)


@pytest.mark.parametrize("seed", (0, 3))
@pytest.mark.parametrize("kw", [{}, {"gamma": 0.8, "sqrt_n": False}])
def test_matches_numpy_reference(seed, kw):
  b = batch(seed)
  spec = registry.get_estimator("a2tgpo")
  got = a2tgpo.a2tgpo_advantages(**{n: b[n] for n in spec.needs}, num_groups=N, **kw)
  np.testing.assert_allclose(np.asarray(got), ref_a2tgpo(b, **kw), rtol=1e-4, atol=1e-5)


def test_clip_range_matches_reference():
  b = batch(3)
  i_hat, cells = ref_i_hat(b)
  fields = {n: b[n] for n in ("gold_logprob_turns", "gold_logprob_prompt", "step_mask",
                              "turn_id", "group_id", "response_mask")}
  got_i, got_c, _ = a2tgpo.a2tgpo_normalized_gains(num_groups=N, **fields)
  np.testing.assert_allclose(np.asarray(got_i), i_hat, rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(got_c), cells)
  eps = np.asarray(a2tgpo.a2tgpo_clip_range(got_i, got_c, b["turn_id"], lam=0.7, delta=0.3))
  mult = np.where(cells, np.clip(1 + 0.7 * np.tanh(i_hat), 0.7, 1.3), 1.0)
  want = 0.2 * np.where(b["turn_id"] >= 0, scatter(mult, b["turn_id"], b["turn_id"] >= 0), 1.0)
  np.testing.assert_allclose(eps, want, rtol=1e-5)
