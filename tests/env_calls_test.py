"""Concurrent, time-limited, isolated environment steps (credit/envs/calls.py and the engine).

`call_all` keeps results in call order, bounds its concurrency, and turns a raise or a hang into
an error; the multi-turn engine turns a tool that raises, hangs or returns something malformed
into an error observation and a flagged row while every other row plays exactly as it would
have with well-behaved tools.
"""
from __future__ import annotations

import functools
import threading
import time
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from credit.envs.calls import call_all
from credit.envs.rollout import (ERROR_OBSERVATION, TIMEOUT_OBSERVATION, TOOL_ERROR, TOOL_OK,
                                 TOOL_TIMEOUT, MultiTurnSampler, TurnLayout)
from credit.tasks import CharTokenizer
from tests.tiny_decoder import scaled_tiny_decoder

TOK = CharTokenizer()
LAYOUT = TurnLayout(prompt_width=8, max_turns=3, max_action_tokens=5, max_observation_tokens=20)


# --- call_all ------------------------------------------------------------------------------

def test_results_in_call_order_whatever_finishes_first():
  delays = [0.05, 0.0, 0.03, 0.01]
  out = call_all([functools.partial(lambda d, i: (time.sleep(d), i)[1], d, i)
                  for i, d in enumerate(delays)], max_workers=4, timeout_s=5.0)
  assert [o.value for o in out] == [0, 1, 2, 3]
  assert all(o.error is None and not o.timed_out for o in out)


def test_concurrency_is_bounded():
  lock, running, peak = threading.Lock(), [0], [0]

  def fn():
    with lock:
      running[0] += 1
      peak[0] = max(peak[0], running[0])
    time.sleep(0.02)
    with lock:
      running[0] -= 1

  call_all([fn] * 12, max_workers=3, timeout_s=5.0)
  assert peak[0] == 3


def test_raise_and_hang_are_isolated():
  stop = threading.Event()
  t0 = time.perf_counter()
  out = call_all([lambda: stop.wait(30), lambda: 7, lambda: {}["x"]], max_workers=2,
                 timeout_s=0.3)
  wall = time.perf_counter() - t0
  stop.set()
  assert out[0].timed_out and out[0].error == "timed out after 0.3 s" and out[0].value is None
  assert out[1].value == 7 and out[1].error is None
  assert out[2].error == "KeyError: 'x'" and not out[2].timed_out
  assert wall < 2.0  # the hung call is abandoned, not waited for


def test_timeout_counts_from_a_calls_start_not_its_queueing():
  # One worker, three 0.1 s calls, 0.25 s each: all finish although the last ends at 0.3 s.
  out = call_all([lambda: time.sleep(0.1)] * 3, max_workers=1, timeout_s=0.25)
  assert [o.error for o in out] == [None] * 3


def test_bad_arguments_are_refused():
  with pytest.raises(ValueError, match="max_workers"):
    call_all([lambda: 1], max_workers=0)
  with pytest.raises(ValueError, match="timeout_s"):
    call_all([lambda: 1], timeout_s=0)


# --- the engine --------------------------------------------------------------------------

class GoodEnv:
  """Done after 3 turns; observation "ok" + the turn; reward 1 per turn; outcome = row % 2."""

  def __init__(self, i, delay=0.0):
    self.i, self.k, self.delay = i, 0, delay

  def reset(self):
    self.k = 0
    return f"q{self.i}?"

  def step(self, action):
    del action
    time.sleep(self.delay)
    self.k += 1
    return SimpleNamespace(observation=f"ok{self.k}", done=self.k >= 3, reward=1.0,
                           progress=self.k / 3, role=0)

  def outcome(self):
    return float(self.i % 2)


class RaisingEnv(GoodEnv):
  def step(self, action):
    if self.k == 0:
      self.k += 1
      raise RuntimeError("search backend down")
    return super().step(action)


class HangingEnv(GoodEnv):
  release = threading.Event()

  def step(self, action):
    HangingEnv.release.wait(60)
    return super().step(action)


class MalformedEnv(GoodEnv):
  def __init__(self, i, bad):
    super().__init__(i)
    self.bad = bad

  def step(self, action):
    res = super().step(action)
    return self.bad(res) if self.k == 1 else res


MALFORMED = {
    "not_a_result": lambda r: "ok",
    "observation_not_str": lambda r: SimpleNamespace(**{**vars(r), "observation": 3}),
    "nan_reward": lambda r: SimpleNamespace(**{**vars(r), "reward": float("nan")}),
    "unencodable": lambda r: SimpleNamespace(**{**vars(r), "observation": "OK ☃"}),
}


@functools.lru_cache(maxsize=None)
def _model():
  return scaled_tiny_decoder(TOK.vocab_size)


def _play(envs, **kw):
  ms = MultiTurnSampler(_model(), tokenizer=TOK, layout=LAYOUT, **kw)
  return ms(_model(), envs, key=jax.random.key(0))


def _same_rows(a, b, rows):
  for name in ("tokens", "response_mask", "obs_mask", "turn_id", "logprob_sampler",
               "step_reward", "turn_progress", "step_mask", "reward"):
    np.testing.assert_array_equal(getattr(a, name)[rows], getattr(b, name)[rows], err_msg=name)


@pytest.fixture(scope="module")
def clean():
  return _play([GoodEnv(i) for i in range(6)])


def test_concurrent_steps_match_serial_steps(clean):
  # Steps that finish in scrambled order (row 0 slowest) give the serial run's rollouts.
  envs = [GoodEnv(i, delay=0.01 * (6 - i)) for i in range(6)]
  out = _play(envs, max_concurrent_steps=6)
  _same_rows(out, clean, slice(None))
  serial = _play([GoodEnv(i) for i in range(6)], max_concurrent_steps=1, step_timeout_s=None)
  _same_rows(serial, clean, slice(None))
  assert (clean.tool_status == TOOL_OK).all()
  assert clean.timings["tool_errors"] == clean.timings["tool_timeouts"] == 0


def test_a_raising_tool_gives_an_error_observation_and_the_episode_goes_on(clean):
  envs = [GoodEnv(i) for i in range(6)]
  envs[2] = RaisingEnv(2)
  out = _play(envs)
  assert out.tool_status[2].tolist() == [TOOL_ERROR, TOOL_OK, TOOL_OK]
  assert out.timings["tool_errors"] == 1 and out.timings["tool_timeouts"] == 0
  t = out.trajectories[2]
  assert t.observations[0] == ERROR_OBSERVATION
  assert "RuntimeError: search backend down" in t.results[0].info["tool_error"]
  assert out.step_reward[2, 0] == 0.0 and out.step_mask[2].all()  # it played all 3 turns
  obs = out.tokens[2][out.obs_mask[2]]
  assert TOK.decode(obs).startswith(ERROR_OBSERVATION)
  _same_rows(out, clean, [0, 1, 3, 4, 5])


def test_a_hanging_tool_times_out_and_ends_only_its_episode(clean):
  envs = [GoodEnv(i) for i in range(6)]
  envs[4] = HangingEnv(4)
  t0 = time.perf_counter()
  out = _play(envs, step_timeout_s=0.5)
  HangingEnv.release.set()
  assert time.perf_counter() - t0 < 30
  assert out.tool_status[4].tolist() == [TOOL_TIMEOUT, TOOL_OK, TOOL_OK]
  assert out.timings["tool_timeouts"] == 1
  assert out.step_mask[4].tolist() == [True, False, False]  # ended at the timed-out turn
  assert out.reward[4] == 0.0 and not out.obs_mask[4].any()
  assert out.trajectories[4].results[0].observation == TIMEOUT_OBSERVATION
  _same_rows(out, clean, [0, 1, 2, 3, 5])


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_a_malformed_result_is_a_flagged_error(clean, kind):
  envs = [GoodEnv(i) for i in range(6)]
  envs[1] = MalformedEnv(1, MALFORMED[kind])
  out = _play(envs)
  assert out.tool_status[1, 0] == TOOL_ERROR and out.timings["tool_errors"] == 1
  assert out.trajectories[1].observations[0] == ERROR_OBSERVATION
  assert out.trajectories[1].results[0].info["tool_error"]
  assert out.step_mask[1].all()
  _same_rows(out, clean, [0, 2, 3, 4, 5])


def test_environments_that_must_not_run_concurrently_run_in_row_order():
  order = []

  class Serial(GoodEnv):
    parallel_steps = False

    def step(self, action):
      order.append((self.k, self.i, threading.current_thread() is threading.main_thread()))
      return super().step(action)

  _play([Serial(i) for i in range(4)])
  assert [(k, i) for k, i, _ in order] == [(k, i) for k in range(3) for i in range(4)]
  assert all(main for *_, main in order)


def test_bad_engine_options_are_refused():
  with pytest.raises(ValueError, match="max_concurrent_steps"):
    MultiTurnSampler(_model(), tokenizer=TOK, layout=LAYOUT, max_concurrent_steps=0)
  with pytest.raises(ValueError, match="step_timeout_s"):
    MultiTurnSampler(_model(), tokenizer=TOK, layout=LAYOUT, step_timeout_s=-1.0)
