"""Memory-R2 LoGo local re-rollouts (credit/envs/branching.py, the `logo_rollout` producer).

Engine level: a tiny random decoder plays environments whose observations depend on the whole
history, so a continuation that did not restart from its parent's saved state would show.
Runner level: one step of `logo_lookup:tiny` (its end-to-end `:tiny` run is one of the generic
recipe runs of tests/experiments/runner_test.py).
"""
from __future__ import annotations

import functools
from types import SimpleNamespace

import hypothesis
import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import credit
from credit.envs.branching import choose_branch_points, local_rollouts, turn_tokens
from credit.envs.rollout import MultiTurnSampler, TurnLayout
from credit import tasks as tasks_lib
from credit.tasks import CharTokenizer
from experiments import loop, producers
from tests.experiments.producers_test import _one_step_batch, tiny
from tests.tiny_decoder import scaled_tiny_decoder

TOK = CharTokenizer()
LAYOUT = TurnLayout(prompt_width=8, max_turns=4, max_action_tokens=6, max_observation_tokens=5,
                    max_total_tokens=34)
B, P, L = 6, 3, 3


def _model():
  return scaled_tiny_decoder(TOK.vocab_size)


@functools.lru_cache(maxsize=None)
def _sampler():
  return MultiTurnSampler(_model(), tokenizer=TOK, layout=LAYOUT)


class HistoryEnv:
  """Episode i ends after `turns(i)` turns; observation k holds k, the summed length of all
  actions so far and i; outcome: that sum's parity. The state is the tuple of actions."""

  def __init__(self, i, turns=lambda i: 2 + i % 3):
    self.i, self.turns, self.hist = i, turns, None

  def reset(self):
    self.hist = ()
    return f"q{self.i}?"

  def step(self, action):
    self.hist = self.hist + (action,)
    k = len(self.hist)
    done = k >= self.turns(self.i)
    obs = "" if done else f"o{k}{sum(map(len, self.hist)) % 10}{self.i}"
    return SimpleNamespace(observation=obs, done=done, reward=float(len(action)), progress=0.0,
                           role=0)

  def outcome(self):
    return float(sum(map(len, self.hist)) % 2)

  def snapshot(self):
    return self.hist

  def restore(self, snap):
    self.hist = snap


@functools.lru_cache(maxsize=None)
def _local():
  envs = [HistoryEnv(i) for i in range(B)]
  eps = _sampler()(_model(), envs, key=jax.random.key(0), group_id=np.arange(B) // 3,
                   keep_snapshots=True)
  lr = local_rollouts(_sampler(), _model(), eps, HistoryEnv, num_parents=P, local_size=L,
                      key=jax.random.key(1))
  return eps, lr


def test_episodes_are_unchanged_by_keeping_snapshots():
  eps, lr = _local()
  plain = _sampler()(_model(), [HistoryEnv(i) for i in range(B)], key=jax.random.key(0),
                     group_id=np.arange(B) // 3)
  np.testing.assert_array_equal(eps.tokens, plain.tokens)
  assert plain.snapshots is None
  for b in range(B):  # one snapshot after every turn that did not end the episode
    n = int(eps.step_mask[b].sum())
    assert len(eps.snapshots[b]) == n - (0 if eps.truncated[b] else 1)
    assert eps.snapshots[b][0] == (eps.trajectories[b].actions[0],)
  np.testing.assert_array_equal(lr.out.tokens[:B], eps.tokens)


def test_local_rows_continue_the_parents_saved_state():
  eps, lr = _local()
  out, K = lr.out, LAYOUT.max_turns
  assert out.tokens.shape == (B + P * L, LAYOUT.output_width)
  np.testing.assert_array_equal(lr.parent_id[:B], -1)
  np.testing.assert_array_equal(lr.prefix_len[:B], 0)
  assert lr.num_local == P * L  # every episode here takes >= 2 turns
  credit.validate_rollout(out.rollout(), num_groups=2)
  for s in range(P):
    rows = B + s * L + np.arange(L)
    a, k, p = lr.parent_id[rows[0]], lr.branch_turn[rows[0]], lr.prefix_len[rows[0]]
    assert (lr.parent_id[rows] == a).all() and (lr.branch_turn[rows] == k).all()
    assert 1 <= k < eps.step_mask[a].sum()
    assert p == np.flatnonzero(eps.turn_id[a] == k)[0]  # departs at turn k's first token
    for i in rows:
      assert out.group_id[i] == eps.group_id[a]
      np.testing.assert_array_equal(out.tokens[i, :p], eps.tokens[a, :p])  # the same prefix
      assert out.prompt_mask[i, :p].all() and not out.prompt_mask[i, p:].any()
      # Loss tokens (and observations) are the continuation's only.
      assert not out.response_mask[i, :p].any() and out.response_mask[i, p]
      assert not out.obs_mask[i, :p].any()
      assert out.turn_id[i][out.response_mask[i]].min() == k
      # A fresh environment replaying the prefix's actions, then the continuation's, answers
      # what the restored one did: same observations, same outcome.
      traj, env = out.trajectories[i], HistoryEnv(a)
      assert traj.actions[:k] == eps.trajectories[a].actions[:k]
      turns = np.arange(K)
      np.testing.assert_array_equal(out.step_mask[i], (turns >= k) & (turns < len(traj.actions)))
      env.reset()
      for act in traj.actions[:k]:
        env.step(act)
      want = []
      for j, act in enumerate(traj.actions[k:]):
        tid = out.turn_id[i] == k + j
        assert TOK.decode(out.tokens[i][tid].tolist()) == act
        res = env.step(act)
        if not res.done:
          want.append(res.observation[:LAYOUT.max_observation_tokens])
      assert traj.observations[k:] == want[:len(traj.observations) - k]
      obs = out.tokens[i][out.obs_mask[i]].tolist()
      assert obs == sum((TOK.encode(o) for o in traj.observations[k:]), [])
      assert out.reward[i] == env.outcome()
  # Siblings are separate draws (a random policy: some continuations differ).
  assert any(len({out.tokens[i].tobytes() for i in B + s * L + np.arange(L)}) > 1
             for s in range(P))


def test_local_logprobs_equal_one_forward_pass():
  """The re-prefilled prefix gives the continuation the same positions as the episode: the
  sampler's log-probs equal one uncached forward pass over the whole local row."""
  _, lr = _local()
  out = lr.out
  gd, state = nnx.split(_model())
  valid = np.arange(out.tokens.shape[1])[None] < out.lengths[:, None]
  logits = jax.jit(lambda s, t, m: nnx.merge(gd, s)(t, mask_BT=m)[0])(
      state, jnp.asarray(out.tokens), jnp.asarray(valid))
  lp = np.asarray(jax.nn.log_softmax(logits, -1))
  want = np.zeros(out.tokens.shape, np.float32)
  want[:, 1:] = np.take_along_axis(lp[:, :-1], out.tokens[:, 1:, None], -1)[..., 0]
  want = np.where(out.response_mask, want, 0.0)
  np.testing.assert_allclose(out.logprob_raw, want, atol=2e-5)


def test_no_saved_state_gives_padding_rows():
  """Episodes of one turn have no boundary: the P·L slots are padding rows (no loss token,
  parent −1, reward 0) that the estimator zeroes."""
  envs = [HistoryEnv(i, turns=lambda i: 1) for i in range(B)]
  eps = _sampler()(_model(), envs, key=jax.random.key(0), keep_snapshots=True)
  lr = local_rollouts(_sampler(), _model(), eps, lambda b: HistoryEnv(b, lambda i: 1),
                      num_parents=2, local_size=2, key=jax.random.key(1))
  assert lr.num_local == 0 and (lr.parents == -1).all()
  out = lr.out
  assert not out.response_mask[B:].any() and (out.reward[B:] == 0).all()
  np.testing.assert_array_equal(lr.parent_id, -1)


def test_choose_branch_points_by_hand():
  has = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]], bool)
  rows, turns = choose_branch_points(has, 3, seed=0)
  np.testing.assert_array_equal(rows, [0, 2, -1])
  assert turns[1] == 1 and turns[2] == -1 and turns[0] in (1, 2)
  seen = {int(choose_branch_points(has, 2, seed=s)[1][0]) for s in range(20)}
  assert seen == {1, 2}  # uniform over row 0's boundaries
  r2, t2 = choose_branch_points(has, 3, seed=0)
  np.testing.assert_array_equal(r2, rows)
  np.testing.assert_array_equal(t2, turns)
  tid = np.array([[-1, 0, 0, -1, 1, -1, 2, -1]])
  np.testing.assert_array_equal(turn_tokens(tid, 4), [[1, 1, 1, 0]])


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(hnp.arrays(np.int64, st.integers(1, 8), elements=st.integers(0, 4)),
                  st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_choose_branch_points_properties(n_turns, num, seed):
  has = np.arange(4)[None] < n_turns[:, None]
  rows, turns = choose_branch_points(has, num, seed)
  m = int(min(num, (n_turns >= 2).sum()))
  assert (rows[:m] >= 0).all() and (rows[m:] == -1).all() and (turns[m:] == -1).all()
  assert len(set(rows[:m].tolist())) == m and (np.diff(rows[:m]) > 0).all()
  assert ((turns[:m] >= 1) & (turns[:m] < n_turns[rows[:m]])).all()


def _logo_numpy(reward, gid, parent, resp, eps=1e-6):
  """LoGo-GRPO reference: roots z-scored within their prompt group, local rows within their
  parent's siblings; unbiased std; groups of one valid row give 0."""
  ok = resp.any(1)
  out = np.zeros(len(reward))
  for i in np.flatnonzero(ok):
    same = (parent == -1) & (gid == gid[i]) if parent[i] < 0 else (parent == parent[i])
    x = reward[same & ok].astype(np.float64)
    if len(x) >= 2:
      out[i] = (reward[i] - x.mean()) / (x.std(ddof=1) + eps)
  return out[:, None] * resp


def test_logo_rollout_batch(tmp_path):
  c = tiny("logo_lookup")
  run, rs, ctx, batch = _one_step_batch(c, str(tmp_path))
  h = {n: np.asarray(batch[n]) for n in ("tokens", "response_mask", "parent_id", "group_id",
                                         "reward")}
  h.update(obs_mask=batch["host"]["obs_mask"], prefix_len=batch["host"]["prefix_len"])
  N, G = c.prompts_per_step, c.group_size
  B0, PL = N * G, c.logo.branch_rows * c.logo.local_size
  assert h["tokens"].shape[0] == producers.rollout_rows(c) == B0 + PL
  np.testing.assert_array_equal(h["parent_id"][:B0], -1)
  assert ctx.metrics["logo_local_rows"] == PL
  trajs = batch["trajectories"]
  limits = producers.env_limits(c, run.data.tokenizer)
  for i in range(B0, B0 + PL):
    a, p = h["parent_id"][i], h["prefix_len"][i]
    assert 0 <= a < B0 and h["group_id"][i] == h["group_id"][a] == a // G
    np.testing.assert_array_equal(h["tokens"][i, :p], h["tokens"][a, :p])
    assert not h["response_mask"][i, :p].any() and not h["obs_mask"][i, :p].any()
    # Its reward: the task's environment replayed from scratch along the row's actions.
    g = int(h["group_id"][i])
    env = run.data.task.make_env(
        tasks_lib.as_example({k: ctx.examples[k][g] for k in ctx.examples}), limits)
    env.reset()
    for act in trajs[i].actions:
      if env.step(act).done:
        break
    assert h["reward"][i] == env.outcome()
  # The estimator on the produced batch (its rewards, and random 0/1 ones) equals numpy's.
  fields = {n: batch[n] for n in run.method.estimator_fields}
  rng = np.random.default_rng(0)
  for reward in (h["reward"], rng.integers(0, 2, h["reward"].shape).astype(np.float32)):
    adv, _, _ = run.adv_fn(dict(fields, reward=jnp.asarray(reward)), rs.train.estimator_state)
    want = _logo_numpy(reward, h["group_id"], h["parent_id"], h["response_mask"])
    np.testing.assert_allclose(np.asarray(adv), want, atol=1e-5)


@pytest.mark.parametrize("change, match", [
    ({"logo.branch_rows": 0}, "parent_id.*logo.branch_rows > 0"),
    ({"estimator": "grpo"}, "reads no parent_id"),
    ({"estimator": "cbpo"}, "tree estimator"),
    ({"logo.local_size": 1}, "local_size"),
    ({"logo.branch_rows": 17}, "exceeds"),
])
def test_logo_setups_are_refused_before_any_work(change, match):
  c = tiny("logo_lookup")
  for k, v in change.items():
    if "." in k:
      a, b = k.split(".")
      c[a][b] = v
    else:
      c[k] = v
  with pytest.raises(producers.SetupError, match=match):
    loop.check_method(c)
