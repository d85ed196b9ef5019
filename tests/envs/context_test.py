"""Context management of long episodes (credit/envs/context.py): the training row is the final
context, and its recomputed log-probs equal the sampler's."""
from __future__ import annotations

import functools
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from credit.envs.context import PLACEHOLDER, ContextSampler
from credit.envs.rollout import MultiTurnSampler, TurnLayout
from credit.tasks import CharTokenizer
from tests.tiny_decoder import scaled_tiny_decoder

TOK = CharTokenizer()
PLACEHOLDER_ = "."  # shorter than the test's observations
# 12 turns of at most 4 + 12 tokens in a context of 96: an episode longer than ~5 turns compacts.
LAYOUT = TurnLayout(prompt_width=8, max_turns=12, max_action_tokens=4, max_observation_tokens=12,
                    max_total_tokens=96)


def _model():
  return scaled_tiny_decoder(TOK.vocab_size)


class LongEnv:
  """Episode i: done after 1 + 2·i turns (uneven lengths); observations of 12 characters."""

  def __init__(self, i):
    self.i, self.k = i, 0

  def reset(self):
    return f"q{self.i}?"

  def step(self, action):
    del action
    self.k += 1
    done = self.k >= 1 + 2 * self.i
    obs = "" if done else f"o{self.k % 10}abcdefghij"
    return SimpleNamespace(observation=obs, done=done, reward=0.0, progress=self.k / 12, role=0)

  def outcome(self):
    return float(self.k)


@functools.lru_cache(maxsize=None)
def _run():
  ms = ContextSampler(_model(), tokenizer=TOK, layout=LAYOUT, keep_last=1, compact_to=0.5,
                      placeholder=PLACEHOLDER_)
  envs = [LongEnv(i) for i in range(6)]
  out = ms(_model(), envs, key=jax.random.key(0), group_id=np.arange(6) // 3)
  return out, envs


def test_long_episodes_play_past_the_budget_in_a_bounded_row():
  out, envs = _run()
  assert out.timings["compactions"] > 0 and out.timings["dropped_observations"] > 0
  assert out.tokens.shape[1] == LAYOUT.output_width
  turns = out.step_mask.sum(1)
  # every episode ran to its environment's end (or K), not to the budget
  np.testing.assert_array_equal(turns, [min(1 + 2 * i, 12) for i in range(6)])
  np.testing.assert_array_equal(out.reward, [e.k for e in envs])
  for b, t in enumerate(out.trajectories):
    assert len(t.actions) == turns[b] and len(t.results) == turns[b]
  masks = (out.prompt_mask, out.response_mask, out.obs_mask)
  assert not any((masks[i] & masks[j]).any() for i in range(3) for j in range(i + 1, 3))
  valid = np.arange(out.tokens.shape[1])[None] < out.lengths[:, None]
  np.testing.assert_array_equal(masks[0] | masks[1] | masks[2], valid)
  # a compacted row holds the placeholder in its context; only its last turns are trained
  long_row = 5
  ctx = TOK.decode(out.tokens[long_row][out.prompt_mask[long_row]].tolist())
  assert PLACEHOLDER_ in ctx and PLACEHOLDER not in ctx
  trained = set(out.turn_id[long_row][out.response_mask[long_row]].tolist())
  assert trained and min(trained) > 0 and max(trained) == turns[long_row] - 1


def test_recomputed_logprobs_equal_the_samplers():
  """One uncached forward pass over each final row (attention on its valid tokens, as the
  loss's scorer) gives the log-probs the sampler recorded for every trained token."""
  out, _ = _run()
  gd, st = nnx.split(_model())
  valid = out.prompt_mask | out.response_mask | out.obs_mask
  logits = jax.jit(lambda s, t, m: nnx.merge(gd, s)(t, mask_BT=m)[0])(
      st, jnp.asarray(out.tokens), jnp.asarray(valid))
  lp = np.asarray(jax.nn.log_softmax(logits, -1))
  want = np.zeros(out.tokens.shape, np.float32)
  want[:, 1:] = np.take_along_axis(lp[:, :-1], out.tokens[:, 1:, None], -1)[..., 0]
  want = np.where(out.response_mask, want, 0.0)
  np.testing.assert_allclose(out.logprob_sampler, want, atol=2e-5)


def test_episodes_within_the_budget_are_the_plain_samplers():
  out, _ = _run()
  plain = MultiTurnSampler(_model(), tokenizer=TOK, layout=LAYOUT)(
      _model(), [LongEnv(i) for i in range(6)], key=jax.random.key(0),
      group_id=np.arange(6) // 3)
  for b in (0, 1):  # 1 and 3 turns: no compaction
    np.testing.assert_array_equal(out.tokens[b], plain.tokens[b])
    np.testing.assert_array_equal(out.response_mask[b], plain.response_mask[b])


def test_refuses_a_budget_without_room_for_a_turn():
  with pytest.raises(ValueError, match="budget"):
    ContextSampler(_model(), tokenizer=TOK, layout=TurnLayout(8, 12, 4, 12, 16))


def test_continuations_use_the_newest_parameters():
  """Asynchronous RL: parameters taken between turns stay in use for the continuations (never
  back to older ones), so the behaviour log-probs are those of the newest parameters."""
  model = _model()
  gd, st = nnx.split(model)
  newer = jax.tree.map(lambda x: x * 1.5 if x.ndim >= 2 else x, st)
  calls = []

  def refresh(k):
    calls.append(k)
    return newer if k == 2 else None  # once, during the first segment

  ms = ContextSampler(model, tokenizer=TOK, layout=LAYOUT, placeholder=PLACEHOLDER_)
  out = ms(st, [LongEnv(5)], key=jax.random.key(0), refresh=refresh)
  assert out.timings["compactions"] >= 1 and max(calls) > 2
  valid = out.prompt_mask | out.response_mask | out.obs_mask
  logits = nnx.merge(gd, newer)(jnp.asarray(out.tokens), mask_BT=jnp.asarray(valid))[0]
  lp = np.asarray(jax.nn.log_softmax(logits, -1))
  want = np.zeros(out.tokens.shape, np.float32)
  want[:, 1:] = np.take_along_axis(lp[:, :-1], out.tokens[:, 1:, None], -1)[..., 0]
  np.testing.assert_allclose(out.logprob_sampler, np.where(out.response_mask, want, 0.0),
                             atol=2e-5)
