"""MatchTIR (credit/advantages/turn/matchtir.py)."""
from __future__ import annotations

import numpy as np
import pytest

from credit import registry
from credit.advantages.turn import matchtir
from tests.advantages.turn._ref import index_keys, pooled_keys, returns, scatter, zscore_cells
from tests.advantages.turn.igpo_test import batch, np_layout
from tests.contract_fields import N


def ref_matchtir(b, discount=0.9, singleton="raw"):
  row, valid, _ = np_layout(b)
  row = row & valid.any(1)
  u = np.where(valid, b["step_reward"], 0.0).astype(np.float64)
  a_g = zscore_cells(u.sum(1)[:, None], row[:, None], pooled_keys(b["group_id"], 1), ddof=1,
                     small=singleton)[:, 0]
  a_s = zscore_cells(returns(u, valid, discount), valid,
                     index_keys(b["group_id"], valid.shape[1]), ddof=1, small=singleton)
  m = b["response_mask"]
  return np.where(m & row[:, None], 0.5 * (a_g[:, None] + scatter(a_s, b["turn_id"], m)), 0.0)


def test_similarity_example():
  gold = {"name": "f", "arguments": {"a": 1, "b": 2}}
  assert matchtir.tool_call_similarity({"name": "f", "arguments": {"a": 1, "b": 3}}, gold) == 0.75
  assert matchtir.tool_call_similarity({"name": "g", "arguments": {"a": 1, "b": 2}}, gold) == 0.0
  assert matchtir.tool_call_similarity({"name": "f", "arguments": {"a": 1, "b": 2}}, gold) == 1.0
  # keys {a, c} vs {a, b}: J = 1/3, one exact → (1 + 1/3 + 1)/4.
  np.testing.assert_allclose(
      matchtir.tool_call_similarity({"name": "f", "arguments": {"a": 1, "c": 2}}, gold), 7 / 12)


def test_similarity_code_conventions():
  # Names compare case-insensitively; predicted arguments may be a JSON string; gold
  # parameters under "parameters"; an empty predicted key list against gold keys gives J = 0.
  gold = {"name": "Search", "parameters": {"q": "x"}}
  assert matchtir.tool_call_similarity({"name": "search", "arguments": '{"q": "x"}'}, gold) == 1.0
  assert matchtir.tool_call_similarity({"name": "search", "arguments": "{}"}, gold) == 1 / 3


def test_match_turn_rewards():
  gold = [{"name": "f", "arguments": {"a": 1, "b": 2}}, {"name": "g", "arguments": {}}]
  pred = [[{"name": "f", "arguments": {"a": 1, "b": 3}}],
          [{"name": "g", "arguments": {}}, {"name": "f", "arguments": {"a": 1, "b": 2}}],
          []]
  km = matchtir.match_turn_rewards(pred, gold)
  # Greedy: (g,g)=1 and (f exact, f)=1 first; the 0.75 call is then unmatched.
  np.testing.assert_allclose(km, [0.0, 1.0, 0.0])
  km = matchtir.match_turn_rewards(pred, gold, unmatched_penalty=-0.5, answer_turn=2,
                                   answer_score=0.4)
  np.testing.assert_allclose(km, [-0.5, 1.0, 0.4])
  ot = matchtir.match_turn_rewards(pred, gold, method="ot")
  # Plan rows sum to 1/3 (three calls): rewards lie in [0, 1/3]; the exact calls score most.
  assert ot.shape == (3,) and ot[2] == 0 and np.all(ot[:2] > 0) and np.all(ot <= 1 / 3 + 1e-9)
  S = np.array([[0.75, 0.0], [0.0, 1.0], [1.0, 0.0]])
  plan = matchtir._sinkhorn(S, 0.1)
  np.testing.assert_allclose(plan.sum(1), 1 / 3, atol=1e-6)
  np.testing.assert_allclose(plan.sum(0), 1 / 2, atol=1e-6)
  np.testing.assert_allclose(ot[1], (plan[1] @ S[1] + plan[2] @ S[2]) / 2, atol=1e-9)


def test_spec_example():
  tid = np.array([[0, 1], [0, 1]], np.int32)
  a = matchtir.matchtir_advantages(
      step_reward=np.array([[0.75, 1.0], [0.0, 0.5]]), step_mask=np.ones((2, 2), bool),
      turn_id=tid, group_id=np.zeros(2, np.int32), response_mask=tid >= 0, num_groups=1)
  np.testing.assert_allclose(np.asarray(a), [[0.707106, 0.707105], [-0.707106, -0.707105]],
                             atol=1e-4)


@pytest.mark.parametrize("seed", (0, 3))
@pytest.mark.parametrize("kw", [{}, {"discount": 0.5, "singleton": "zero"}])
def test_matches_numpy_reference(seed, kw):
  b = batch(seed)
  spec = registry.get_estimator("matchtir")
  got = matchtir.matchtir_advantages(**{n: b[n] for n in spec.needs}, num_groups=N, **kw)
  np.testing.assert_allclose(np.asarray(got), ref_matchtir(b, **kw), rtol=1e-4, atol=1e-5)
