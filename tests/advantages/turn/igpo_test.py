"""IGPO (credit/advantages/turn/igpo.py)."""
from __future__ import annotations

import numpy as np
import pytest

from credit import registry
from credit.advantages.turn import igpo
from tests.advantages.turn._ref import pooled_keys, returns, scatter, zscore_cells
from tests.contract_fields import N, make_fields

SEEDS = (0, 3)


# ---- numpy helpers shared by the turn tests of this package ----------------------------------

def np_layout(b):
  """(row [B], valid [B,K], last [B,K]) of a contract batch."""
  row = b["response_mask"].any(1)
  valid = b["step_mask"].astype(bool) & row[:, None]
  last = np.zeros_like(valid)
  for i in range(valid.shape[0]):
    ks = np.nonzero(valid[i])[0]
    if len(ks):
      last[i, ks[-1]] = True
  return row, valid, last


def np_prev(x, valid, x0):
  """x at the previous valid turn (x0 before the first)."""
  out = np.zeros(x.shape)
  for i in range(x.shape[0]):
    p = x0[i]
    for k in range(x.shape[1]):
      if valid[i, k]:
        out[i, k] = p
        p = x[i, k]
  return out


def batch(seed):
  return make_fields(seed, holes=seed % 2 == 1)


def ref_igpo(b, gain="log_prob_diff", norm="separate", gamma=1.0):
  row, valid, last = np_layout(b)
  g = np.where(valid, b["gold_logprob_turns"], 0.0).astype(np.float64)
  g0 = b["gold_logprob_prompt"].astype(np.float64)
  if gain == "prob_diff":
    g, g0 = np.exp(g), np.exp(g0)
  ig = np.where(valid & ~last, g - np_prev(g, valid, g0), 0.0)
  out = np.where(last, b["reward"][:, None], 0.0)
  keys = pooled_keys(b["group_id"], valid.shape[1])
  kw = dict(ddof=0, eps=1e-6, var_eps=1e-8)
  if norm == "joint":
    r = zscore_cells(ig + out, valid, keys, **kw)
  else:
    r = zscore_cells(ig, valid & ~last, keys, **kw) + zscore_cells(out, last, keys, **kw)
  return scatter(returns(r, valid, gamma), b["turn_id"], b["response_mask"])


def _call(b, **kw):
  spec = registry.get_estimator("igpo")
  return np.asarray(igpo.igpo_advantages(**{n: b[n] for n in spec.needs}, num_groups=N, **kw))


def test_registered():
  spec = registry.get_estimator("igpo")
  assert spec.family == "turn" and spec.confidence == "code-verified"


@pytest.mark.parametrize("norm,want0,want1", [
    ("joint", [0.5789, 0.8684, 1.8158], [-0.5789, -0.8158]),
    ("separate", [-0.1770, -0.2675, 1.0], [0.1770, -1.0]),
])
def test_spec_example(norm, want0, want1):
  # p = [0.1, 0.3, 0.25] (outcome 1) and [0.1, 0.5] (outcome 0), prob_diff, γ = 1.
  tid = np.array([[0, 1, 2, -1], [0, -1, 1, -1]], np.int32)
  a = igpo.igpo_advantages(
      reward=np.array([1.0, 0.0]), gold_logprob_turns=np.log([[.3, .25, .5], [.5, .9, .9]]),
      gold_logprob_prompt=np.log([.1, .1]), step_mask=np.array([[1, 1, 1], [1, 1, 0]], bool),
      turn_id=tid, group_id=np.zeros(2, np.int32), response_mask=tid >= 0, num_groups=1,
      gain="prob_diff", norm=norm)
  a = np.asarray(a)
  np.testing.assert_allclose(a[0, :3], want0, atol=1e-3)
  np.testing.assert_allclose(a[1, [0, 2]], want1, atol=1e-3)
  assert a[0, 3] == 0 and a[1, 1] == 0 and a[1, 3] == 0


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kw", [{}, {"norm": "joint", "gain": "prob_diff", "gamma": 0.9}])
def test_matches_numpy_reference(seed, kw):
  b = batch(seed)
  np.testing.assert_allclose(_call(b, **kw), ref_igpo(b, **kw), rtol=1e-4, atol=1e-5)


def test_turns_come_from_step_mask_not_values():
  # A gain of exactly 0 is still a turn (the code maps it to 1e-10 and detects turns by
  # non-zero values); separate pools: IG {0, .5, .5, 0} → ±1, outcomes {1, 0} → ±1.
  tid = np.array([[0, 1, 2]] * 2, np.int32)
  a = igpo.igpo_advantages(
      gold_logprob_turns=np.array([[-1., -.5, 0], [-.5, -.5, 0]]), reward=np.array([1.0, 0.0]),
      gold_logprob_prompt=np.array([-1.0, -1.0]), step_mask=np.ones((2, 3), bool), turn_id=tid,
      group_id=np.zeros(2, np.int32), response_mask=tid >= 0, num_groups=1)
  np.testing.assert_allclose(np.asarray(a), [[1, 2, 1], [-1, -2, -1]], atol=1e-4)


def test_bad_choice_raises():
  b = batch(0)
  with pytest.raises(ValueError, match="norm"):
    _call(b, norm="both")


def test_doctests_of_the_turn_modules():
  import doctest
  from credit.advantages.turn import a2tgpo, matchtir, procredit, trace
  for mod in (igpo, a2tgpo, trace, procredit, matchtir):
    res = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert res.attempted > 0 and res.failed == 0, mod.__name__


def test_the_turn_that_reveals_the_answer_gets_the_largest_turn_advantage():
  """A controlled lookup group: four 3-turn episodes (lookup, lookup, answer) of one prompt.
  In rows 0 and 1 the second lookup reveals the answer (the gold answer's log-prob jumps from
  about −4 to −0.3); in rows 2 and 3 no lookup reveals it. Rows 0 and 1 answer right. Within
  each revealing episode, the revealing turn has the largest IG turn reward, and its turn
  advantage is the largest of all non-final turns of the group."""
  tid = np.repeat(np.arange(3), 4)[None].repeat(4, 0)  # 3 turns of 4 tokens
  mask = np.ones_like(tid, bool)
  g0 = np.full(4, -4.0, np.float32)
  g = np.array([[-3.9, -0.3, -0.2],
                [-4.1, -0.4, -0.3],
                [-3.8, -3.7, -3.9],
                [-4.2, -4.0, -4.1]], np.float32)
  reward = np.array([1.0, 1.0, 0.0, 0.0], np.float32)
  kw = dict(reward=reward, gold_logprob_turns=g, gold_logprob_prompt=g0,
            step_mask=np.ones((4, 3), bool), turn_id=tid, response_mask=mask,
            group_id=np.zeros(4, np.int32), num_groups=1)
  for norm in ("separate", "joint"):
    adv = np.asarray(igpo.igpo_advantages(**kw, norm=norm))
    turn_adv = adv[:, ::4]  # one value per turn
    for row in (0, 1):
      assert np.argmax(turn_adv[row, :2]) == 1, (norm, turn_adv)
    assert turn_adv[:2, 1].min() > turn_adv[:, :2][[0, 1, 2, 2, 3, 3], [0, 0, 0, 1, 0, 1]].max()
