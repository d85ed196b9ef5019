"""TP-GRPO (credit/advantages/tree/tp_grpo.py).

The numpy reference follows the authors' per-step loop (`my_train_flux_fast_with_op3.py`,
"Process Reward Computation") with the flags of `common_op3.sh`.
"""
from __future__ import annotations

import functools

import hypothesis
import hypothesis.strategies as st
import jax
import numpy as np
import pytest

from credit import registry
from credit.advantages.tree import tp_grpo

FIELDS = ("reward", "step_value", "start_value", "step_mask", "step_id", "group_id",
          "response_mask")
NG, G, K, T = 2, 3, 4, 9
B = NG * G
SETTINGS = dict(max_examples=6, deadline=None)


def make_batch(seed, gaps=False):
  rng = np.random.default_rng(seed)
  levels = np.array([0.0, 0.25, 0.5, 0.75, 1.0], np.float32)
  n_steps = rng.integers(1, K + 1, B)
  step_mask = np.arange(K)[None, :] < n_steps[:, None]
  if gaps:
    step_mask &= rng.random((B, K)) > 0.2
  sid = np.full((B, T), -1, np.int32)
  mask = np.zeros((B, T), bool)
  for b in range(B):
    for k in np.flatnonzero(step_mask[b]):
      sid[b, 1 + 2 * k:3 + 2 * k] = k
  mask = sid >= 0
  return {"reward": rng.choice(levels, B), "step_value": rng.choice(levels, (B, K)),
          "start_value": rng.choice(levels, B), "step_mask": step_mask, "step_id": sid,
          "group_id": rng.permutation(np.repeat(np.arange(NG, dtype=np.int32), G)),
          "response_mask": mask}


def ref_rho(b, mode="increment_main", eta=1.0, first_step_bonus=True, consistency=True,
            balance=True, drop_original=True):
  """Per row: the code's loop over the valid steps (in order); batch-wide balancing."""
  R, V, V0 = (b[k].astype(np.float64) for k in ("reward", "step_value", "start_value"))
  valid = b["step_mask"] & b["response_mask"].any(1)[:, None]
  nb = len(R)
  ind = np.zeros(valid.shape, bool)
  d_all = np.zeros(valid.shape)
  vprev_all = np.zeros(valid.shape)
  for i in range(nb):
    ks = np.flatnonzero(valid[i])
    seq = [V0[i]] + [V[i, k] for k in ks]
    delta = R[i] - V0[i]
    d = [seq[j + 1] - seq[j] for j in range(len(ks))]
    s = [np.sign(x) * np.sign(delta) for x in d]
    for j, k in enumerate(ks):
      d_all[i, k], vprev_all[i, k] = d[j], seq[j]
      cons = np.sign(d[j]) * np.sign(R[i] - seq[j + 1]) > 0
      if j == 0:
        ind[i, k] = first_step_bonus and (cons if consistency else s[0] > 0)
      else:
        ind[i, k] = s[j - 1] < 0 and s[j] > 0 and (cons or not consistency)
  delta = (R - V0)[:, None] * np.ones(valid.shape)
  cand = delta if mode == "increment_main" else d_all
  if balance:
    flat = [(i * valid.shape[1] + k, cand[i, k]) for i, k in zip(*np.nonzero(ind))]
    pos = [(f, c) for f, c in flat if c > 0]
    neg = [(f, c) for f, c in flat if c < 0]
    if pos and neg:
      keep = min(len(pos), len(neg))
      top = lambda lst: [f for f, c in sorted(lst, key=lambda fc: (-abs(fc[1]), fc[0]))[:keep]]
      ind = np.zeros(valid.size, bool)
      ind[top(pos) + top(neg)] = True
      ind = ind.reshape(valid.shape)
  if mode == "increment_main":
    main, bonus = d_all, eta * (R[:, None] - vprev_all)
  else:
    main, bonus = delta, eta * d_all
  bb = np.where(ind, bonus, 0.0)
  rho = np.where(drop_original & (bb != 0), bb, main + bb)
  return np.where(valid, rho, 0.0), ind & valid


def ref_tp_grpo(b, eps=1e-4, rho=None, **kw):
  rho = ref_rho(b, **kw)[0] if rho is None else rho
  valid = b["step_mask"] & b["response_mask"].any(1)[:, None]
  g = b["group_id"]
  adv = np.zeros(rho.shape)
  for gg in np.unique(g):
    for k in range(rho.shape[1]):
      sel = (g == gg) & valid[:, k]
      if sel.sum() > 1:
        x = rho[sel, k]
        adv[sel, k] = (x - x.mean()) / (x.std() + eps)
  sid = b["step_id"]
  out = np.where(b["response_mask"] & (sid >= 0),
                 np.take_along_axis(adv, np.clip(sid, 0, rho.shape[1] - 1), 1), 0.0)
  return out


@functools.lru_cache(maxsize=None)
def jitted(**kw):
  return jax.jit(functools.partial(tp_grpo.tp_grpo_advantages, num_groups=NG, **kw))


def run(b, **kw):
  return np.asarray(jitted(**kw)(**{k: b[k] for k in FIELDS}), np.float64)


RHO = jax.jit(tp_grpo.tp_grpo_step_rewards, static_argnames=(
    "mode", "first_step_bonus", "consistency", "balance", "drop_original",
    "propagate_bonus_to_future_steps"))


def test_registered():
  spec = registry.get_estimator("tp_grpo")
  assert spec.family == "tree" and spec.confidence == "code-verified"
  assert spec.needs == set(FIELDS)



def test_spec_example():
  # V = [0.5, 0.4, 0.6, 0.7], R = 0.7: d = [−0.1, 0.2, 0.1], s = [−1, 1, 1], turning point
  # at k = 2 only; L = [0.2, 0.3, 0.1] → ρ = [−0.1, 0.3, 0.1].
  rho, tp = RHO(reward=np.array([0.7]), step_value=np.array([[0.4, 0.6, 0.7]]),
                start_value=np.array([0.5]), valid_BK=np.ones((1, 3), bool))
  np.testing.assert_allclose(np.asarray(rho), [[-0.1, 0.3, 0.1]], atol=1e-6)
  assert np.asarray(tp).tolist() == [[False, True, False]]
  # global_main: ρ = η·d at the turning point, Δ = 0.2 elsewhere.
  rho, _ = RHO(reward=np.array([0.7]), step_value=np.array([[0.4, 0.6, 0.7]]),
               start_value=np.array([0.5]), valid_BK=np.ones((1, 3), bool), mode="global_main")
  np.testing.assert_allclose(np.asarray(rho), [[0.2, 0.2, 0.2]], atol=1e-6)


def test_first_step_rule_and_single_step():
  # One step: V0 = 0.2, V1 = 0.6, R = 1 → d = 0.4, R − V1 > 0: consistent → L = 0.8.
  rho, tp = RHO(reward=np.array([1.0, 0.0]), step_value=np.array([[0.6], [0.6]]),
                start_value=np.array([0.2, 0.2]), valid_BK=np.ones((2, 1), bool),
                balance=False)
  assert np.asarray(tp).tolist() == [[True], [False]]   # row 1: R − V1 < 0 disagrees
  np.testing.assert_allclose(np.asarray(rho), [[0.8], [0.4]], atol=1e-6)
  rho, tp = RHO(reward=np.array([1.0]), step_value=np.array([[0.6]]),
                start_value=np.array([0.2]), valid_BK=np.ones((1, 1), bool),
                first_step_bonus=False)
  assert not np.asarray(tp).any()


def test_zero_increment_is_never_a_turning_point_and_drop_only_nonzero():
  # Row 0: d = [−0.2, 0, 0.5], Δ = 0.5 → s = [−1, 0, 1]: s_2 = 0 blocks k = 3 as well.
  v = np.array([[0.3, 0.3, 0.8]])
  rho, tp = RHO(reward=np.array([1.0]), step_value=v, start_value=np.array([0.5]),
                valid_BK=np.ones((1, 3), bool), balance=False)
  assert not np.asarray(tp).any()
  np.testing.assert_allclose(np.asarray(rho), [[-0.2, 0.0, 0.5]], atol=1e-6)
  # Without the consistency filter: V = [1.2, 1.0, 1.3], V0 = 0, R = 1. k = 1 (s = +1) takes
  # R − V0 = 1; k = 3 (s: −1 → +1) is a turning point with R − V_2 = 0: d_3 = 0.3 is kept.
  b = {"reward": np.array([1.0]), "step_value": np.array([[1.2, 1.0, 1.3]]),
       "start_value": np.array([0.0]), "step_mask": np.ones((1, 3), bool),
       "response_mask": np.ones((1, 1), bool)}
  rho, tp = RHO(reward=b["reward"], step_value=b["step_value"], start_value=b["start_value"],
                valid_BK=b["step_mask"], consistency=False, balance=False)
  assert np.asarray(tp).tolist() == [[True, False, True]]
  np.testing.assert_allclose(np.asarray(rho), [[1.0, -0.2, 0.3]], atol=1e-6)
  want, want_tp = ref_rho(b, consistency=False, balance=False)
  np.testing.assert_allclose(np.asarray(rho), want, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(tp), want_tp)


def test_balancing_ranks_by_delta_global_with_index_ties():
  # Three turning points at k = 1 with Δ > 0 (|Δ| = 0.5, 0.5, 0.3) and one with Δ < 0: keep one
  # of each sign, the positive one with the largest |Δ| and the lowest flat index (row 0).
  r = np.array([1.0, 1.0, 0.8, 0.0])
  v0 = np.array([0.5, 0.5, 0.5, 0.5])
  v1 = np.array([[0.9], [0.6], [0.6], [0.2]])
  rho, tp = RHO(reward=r, step_value=v1, start_value=v0, valid_BK=np.ones((4, 1), bool))
  assert np.asarray(tp)[:, 0].tolist() == [True, False, False, True]
  np.testing.assert_allclose(np.asarray(rho)[:, 0], [0.5, 0.1, 0.1, -0.5], atol=1e-6)
  b = {"reward": r, "step_value": v1, "start_value": v0, "step_mask": np.ones((4, 1), bool),
       "response_mask": np.ones((4, 1), bool)}
  np.testing.assert_allclose(np.asarray(rho), ref_rho(b)[0], atol=1e-6)
  # All turning points of one sign: no balancing.
  rho, tp = RHO(reward=r[:3], step_value=v1[:3], start_value=v0[:3],
                valid_BK=np.ones((3, 1), bool))
  assert np.asarray(tp).all()


@pytest.mark.parametrize("kw", [{}, {"mode": "global_main", "eta": 0.5},
                                {"consistency": False, "drop_original": False},
                                {"balance": False, "first_step_bonus": False}])
@hypothesis.settings(**SETTINGS)
@hypothesis.given(seed=st.integers(0, 10_000))
def test_matches_numpy_reference(kw, seed):
  b = make_batch(seed, gaps=seed % 2 == 1)
  np.testing.assert_allclose(run(b, **kw), ref_tp_grpo(b, **kw), rtol=1e-4, atol=1e-4)


@hypothesis.settings(**SETTINGS)
@hypothesis.given(seed=st.integers(0, 10_000))
def test_masking_padding_and_degenerate(seed):
  b = make_batch(seed)
  want = run(b)
  drop = np.zeros(B, bool)
  drop[np.random.default_rng(seed).choice(B, 2, replace=False)] = True
  masked = run(dict(b, response_mask=b["response_mask"] & ~drop[:, None]))
  assert np.all(masked[drop] == 0)
  np.testing.assert_allclose(masked[~drop], ref_tp_grpo({k: v[~drop] for k, v in b.items()}),
                             rtol=1e-4, atol=1e-4)
  pad = {k: (np.concatenate([v, np.full((B, 2), -1 if k == "step_id" else False, v.dtype)], 1)
             if k in ("step_id", "response_mask") else v) for k, v in b.items()}
  got = run(pad)
  np.testing.assert_allclose(got[:, :T], want, rtol=1e-6, atol=1e-6)
  assert np.all(got[:, T:] == 0)
  flat = run(dict(b, step_value=np.zeros((B, K), np.float32), start_value=np.zeros(B,
                                                                                 np.float32)))
  assert np.all(np.isfinite(flat)) and np.all(flat == 0)   # no increments at all


def test_jit_equals_eager():
  # The whole estimator's jit == eager is in tests/registry_common_test.py; here the step
  # rewards (their eager ops are already compiled by the doctest).
  b = make_batch(4, gaps=True)
  kw = dict(reward=b["reward"], step_value=b["step_value"], start_value=b["start_value"],
            valid_BK=b["step_mask"])
  for got, want in zip(tp_grpo.tp_grpo_step_rewards(**kw), RHO(**kw)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match="mode"):
    tp_grpo.tp_grpo_advantages(**b, num_groups=NG, mode="local")


# --------------------------------------------------------------------------
# propagate_bonus_to_future_steps: the code's two passes, transcribed.
# --------------------------------------------------------------------------


def code_propagated_rho(b, mode="increment_main", eta=1.0, drop_original=True, **kw):
  """The code's propagation block and second pass, over each row's valid steps, on the
  (balanced) turning points of `ref_rho`."""
  _, ind = ref_rho(b, mode=mode, eta=eta, drop_original=drop_original, **kw)
  R, V, V0 = (b[k].astype(np.float64) for k in ("reward", "step_value", "start_value"))
  valid = b["step_mask"] & b["response_mask"].any(1)[:, None]
  rho = np.zeros(valid.shape)
  for i in range(len(R)):
    ks = np.flatnonzero(valid[i])
    seq = [V0[i]] + [V[i, k] for k in ks]        # reward_sequence
    L = [R[i] - seq[t] for t in range(len(ks))]  # sde_reward − reward_sequence[t]
    indicator = [ind[i, k] for k in ks]
    bonus = [0.0] * len(ks)
    neg_times, neg_on = 0, False
    for t in reversed(range(len(ks))):
      if indicator[t] and L[t] < 0:
        neg_on, neg_times = True, neg_times + 1
        bonus[t] += neg_times * L[t]
      elif neg_on:
        bonus[t] += neg_times * L[t]
    pos_times, pos_on = 0, False
    for t in range(len(ks)):
      if indicator[t] and L[t] > 0:
        pos_on, pos_times = True, pos_times + 1
        bonus[t] += pos_times * L[t]
      elif pos_on:
        bonus[t] += pos_times * L[t]
    delta = R[i] - V0[i]
    for t, k in enumerate(ks):
      d_t = seq[t + 1] - seq[t]
      main = delta if mode == "global_main" else d_t
      bt = eta * bonus[t]
      if drop_original and bt != 0:
        main = 0.0
      rho[i, k] = main + bt
  return rho


def test_propagation_worked_example():
  # Row 0 (R = 0.7, V0 = 0.5, V = [0.4, 0.6, 0.65]): a rising turning point at k = 2 with
  # L = [0.2, 0.3, 0.1] carries L_k to itself and the later step: ρ = [−0.1, 0.3, 0.1]
  # (without propagation k = 3 keeps d_3 = 0.05). Row 1 (R = 0.2, V0 = 0.5, V = [0.6, 0.3,
  # 0.2]): a falling one at k = 2 (L_2 = −0.4) carries L_k to itself and the earlier step:
  # ρ = [L_1 = −0.3, −0.4, d_3 = −0.1] (without: [d_1 = 0.1, −0.4, −0.1]).
  kw = dict(reward=np.array([0.7, 0.2]), step_value=np.array([[0.4, 0.6, 0.65], [0.6, 0.3, 0.2]]),
            start_value=np.array([0.5, 0.5]), valid_BK=np.ones((2, 3), bool))
  rho, tp = RHO(**kw, propagate_bonus_to_future_steps=True)
  assert np.asarray(tp).tolist() == [[False, True, False], [False, True, False]]
  np.testing.assert_allclose(np.asarray(rho), [[-0.1, 0.3, 0.1], [-0.3, -0.4, -0.1]], atol=1e-6)
  rho, _ = RHO(**kw)
  np.testing.assert_allclose(np.asarray(rho), [[-0.1, 0.3, 0.05], [0.1, -0.4, -0.1]], atol=1e-6)
  b = {"reward": kw["reward"], "step_value": kw["step_value"], "start_value": kw["start_value"],
       "step_mask": kw["valid_BK"], "response_mask": np.ones((2, 1), bool)}
  np.testing.assert_allclose(code_propagated_rho(b), [[-0.1, 0.3, 0.1], [-0.3, -0.4, -0.1]],
                             atol=1e-12)


@pytest.mark.parametrize("kw", [{}, {"mode": "global_main", "eta": 0.5},
                                {"consistency": False, "drop_original": False},
                                {"balance": False}])
@hypothesis.settings(**SETTINGS)
@hypothesis.given(seed=st.integers(0, 10_000))
def test_propagation_matches_the_code(kw, seed):
  b = make_batch(seed, gaps=seed % 2 == 1)
  valid = b["step_mask"] & b["response_mask"].any(1)[:, None]
  want = code_propagated_rho(b, **kw)
  rho, _ = RHO(reward=b["reward"], step_value=b["step_value"], start_value=b["start_value"],
               valid_BK=valid, propagate_bonus_to_future_steps=True, **kw)
  np.testing.assert_allclose(np.asarray(rho), want, atol=1e-5)
  got = run(b, propagate_bonus_to_future_steps=True, **kw)
  np.testing.assert_allclose(got, ref_tp_grpo(b, rho=want), rtol=1e-4, atol=1e-4)
