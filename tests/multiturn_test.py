"""The multi-turn rollout engine (credit/envs/rollout.py) against the rollout contract.

A tiny random decoder plays scripted environments; everything is checked against what the
environments returned and against one uncached forward pass over the compacted trajectories.
"""
from __future__ import annotations

import functools
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import credit
from credit.envs.rollout import MultiTurnSampler, TurnLayout, encode_episode
from credit.tasks import CharTokenizer
from tests.tiny_decoder import scaled_tiny_decoder

TOK = CharTokenizer()
LAYOUT = TurnLayout(prompt_width=8, max_turns=4, max_action_tokens=6, max_observation_tokens=5,
                    max_total_tokens=34)


def _model():
  return scaled_tiny_decoder(TOK.vocab_size)


@functools.lru_cache(maxsize=None)
def _sampler():
  return MultiTurnSampler(_model(), tokenizer=TOK, layout=LAYOUT)


class ScriptEnv:
  """Episode i: done after 2 + i % 3 turns; observation i % 4 + 2 characters ("ok..."), the
  longest one cut by the engine; reward = the action's length, progress = turns / 4."""

  def __init__(self, i):
    self.i, self.k, self.seen = i, 0, []

  def reset(self):
    self.k = 0
    return f"q{self.i}?"

  def step(self, action):
    self.k += 1
    self.seen.append(action)
    done = self.k >= 2 + self.i % 3
    obs = "" if done else ("ok" + "xyz"[: self.i % 4] + "wvu")[: self.i % 4 + 2 + 3 * (self.i == 3)]
    return SimpleNamespace(observation=obs, done=done, reward=float(len(action)),
                           progress=self.k / 4, role=self.k % 2)

  def outcome(self):
    return float(self.i % 2)


def _run(n=6, key=0, temperature=1.0):
  envs = [ScriptEnv(i) for i in range(n)]
  out = _sampler()(_model(), envs, key=jax.random.key(key), group_id=np.arange(n) // 3,
                   temperature=temperature)
  return out, envs


@functools.lru_cache(maxsize=None)
def _out():
  return _run()


def test_arrays_follow_the_contract():
  out, envs = _out()
  B, T = out.tokens.shape
  assert T == LAYOUT.output_width
  credit.validate_rollout(out.rollout(), num_groups=2)
  masks = [out.prompt_mask, out.response_mask, out.obs_mask]
  assert not (masks[0] & masks[1]).any() and not (masks[1] & masks[2]).any()
  assert not (masks[0] & masks[2]).any()
  valid = np.arange(T)[None] < out.lengths[:, None]
  np.testing.assert_array_equal(masks[0] | masks[1] | masks[2], valid)
  assert (out.turn_id[~out.response_mask] == -1).all()
  for b in range(B):
    tid = out.turn_id[b][out.response_mask[b]]
    assert (np.diff(tid) >= 0).all() and tid[0] == 0
    n_turns = len(envs[b].seen)
    np.testing.assert_array_equal(np.unique(tid), np.arange(n_turns))
    np.testing.assert_array_equal(out.step_mask[b], np.arange(LAYOUT.max_turns) < n_turns)
    # per-turn arrays are what the environment reported
    np.testing.assert_allclose(out.step_reward[b, :n_turns], [len(a) for a in envs[b].seen])
    np.testing.assert_allclose(out.turn_progress[b, :n_turns], np.arange(1, n_turns + 1) / 4)
    assert out.reward[b] == b % 2
    # each action is what the environment received (decoded up to its stop token)
    for k, a in enumerate(envs[b].seen):
      ids = out.tokens[b][out.turn_id[b] == k]
      assert TOK.decode(ids.tolist()) == a
      assert len(ids) <= LAYOUT.max_action_tokens


def test_observation_tokens_are_exactly_the_environments():
  out, envs = _out()
  for b, traj in enumerate(out.trajectories):
    obs_ids = out.tokens[b][out.obs_mask[b]].tolist()
    want = []
    for o in traj.observations:
      want += TOK.encode(o)
    assert obs_ids == want
    # the observation runs sit between consecutive turns; cut at max_observation_tokens
    env = ScriptEnv(b)
    env.reset()
    full = [env.step(a).observation for a in envs[b].seen]
    assert traj.observations == [o[:LAYOUT.max_observation_tokens] for o in full if o]


def test_cached_rollout_equals_one_forward_pass():
  """Log-probs recorded while sampling turn by turn (cache reused across turns) equal those
  of one uncached forward pass over the concatenated trajectory."""
  out, _ = _out()
  gd, st = nnx.split(_model())
  valid = np.arange(out.tokens.shape[1])[None] < out.lengths[:, None]
  logits = jax.jit(lambda s, t, m: nnx.merge(gd, s)(t, mask_BT=m)[0])(
      st, jnp.asarray(out.tokens), jnp.asarray(valid))
  lp = np.asarray(jax.nn.log_softmax(logits, -1))
  want = np.zeros(out.tokens.shape, np.float32)
  want[:, 1:] = np.take_along_axis(lp[:, :-1], out.tokens[:, 1:, None], -1)[..., 0]
  want = np.where(out.response_mask, want, 0.0)
  np.testing.assert_allclose(out.logprob_raw, want, atol=2e-5)
  np.testing.assert_allclose(out.logprob_sampler, want, atol=2e-5)  # temperature 1


def test_same_key_same_episodes_and_greedy_is_key_free():
  a, _ = _out()
  b, _ = _run()
  np.testing.assert_array_equal(a.tokens, b.tokens)
  g1, _ = _run(key=1, temperature=0.0)
  g2, _ = _run(key=2, temperature=0.0)
  np.testing.assert_array_equal(g1.tokens, g2.tokens)


def test_refresh_switches_parameters_between_turns():
  """`refresh(k)` (asynchronous workers): returning None keeps the episodes as they were;
  returning other parameters at turn 1 leaves turn 0 alone and changes what follows."""
  base, _ = _out()
  calls = []
  same = _sampler()(_model(), [ScriptEnv(i) for i in range(6)], key=jax.random.key(0),
                    group_id=np.arange(6) // 3, refresh=calls.append)
  np.testing.assert_array_equal(same.tokens, base.tokens)
  assert calls == sorted(calls) and calls[0] == 1 and len(calls) >= 2
  other = jax.tree.map(lambda x: -x, nnx.state(_model(), nnx.Param))
  newer = nnx.merge_state(nnx.state(_model()), other)
  out = _sampler()(_model(), [ScriptEnv(i) for i in range(6)], key=jax.random.key(0),
                   group_id=np.arange(6) // 3, refresh=lambda k: newer if k == 1 else None)
  turn0 = base.turn_id == 0
  np.testing.assert_array_equal(np.where(turn0, out.tokens, 0), np.where(turn0, base.tokens, 0))
  np.testing.assert_array_equal(out.turn_id == 0, turn0)
  later = out.turn_id >= 1
  assert later.any()
  assert not np.allclose(out.logprob_sampler[later], base.logprob_sampler[later])


def test_token_budget_truncates_episodes():
  lay = TurnLayout(prompt_width=8, max_turns=4, max_action_tokens=6, max_observation_tokens=5,
                   max_total_tokens=9)
  ms = MultiTurnSampler(_model(), tokenizer=TOK, layout=lay)
  envs = [ScriptEnv(i) for i in range(6)]
  out = ms(_model(), envs, key=jax.random.key(0))
  used = out.response_mask.sum(1) + out.obs_mask.sum(1)
  assert (used <= 9).all()
  assert out.tokens.shape[1] == 8 + 9
  assert out.truncated.any()
  np.testing.assert_array_equal(used[out.truncated], 9)  # cut short exactly at the budget
  for b in np.flatnonzero(~out.truncated):  # the others ended by their environment
    assert len(out.trajectories[b].actions) == 2 + b % 3


def test_empty_observation_of_a_continuing_episode_is_a_flagged_tool_error():
  class Mute(ScriptEnv):
    def step(self, action):
      return SimpleNamespace(observation="", done=False, reward=0.0, progress=0.0, role=0)

  out = _sampler()(_model(), [Mute(i) for i in range(6)], key=jax.random.key(0))
  assert out.tool_status[:, 0].tolist() == [1] * 6  # TOOL_ERROR on every row's first turn
  assert out.timings["tool_errors"] >= 6
  res = out.trajectories[0].results[0]
  assert res.observation == "error: tool failed" and "empty observation" in res.info["tool_error"]


def test_encode_episode_layout():
  ep = encode_episode(TOK, LAYOUT, "q1?", ["ab", "c"], ["okx", "unused"])
  n = ep["prompt_mask"].sum()
  assert n == 4  # bos + 3
  np.testing.assert_array_equal(ep["turn_id"][ep["response_mask"]], [0, 0, 0, 1, 1])
  assert TOK.decode(ep["tokens"][ep["obs_mask"]].tolist()) == "okxunused"[:8]
  assert ep["tokens"][ep["response_mask"]].tolist() == (
      TOK.encode("ab") + [TOK.eos_id] + TOK.encode("c") + [TOK.eos_id])
