"""Tool phase of a multi-turn turn: environment steps one after another against concurrent ones.

B episodes (default 64) whose environment step is a tool call that sleeps `--tool_ms` (default
50 ms, a search request or a short code run). Measured, all in the same run:

  tool phase   `credit.envs.calls.call_all` on the B steps of one turn, as the engine calls it:
               serial (1 worker) and with 16 and B workers (B: the engine's default bound, 64);
  engine       `MultiTurnSampler` (the random character-vocabulary policy of the built-in
               recipes, K turns) with `max_concurrent_steps` = 1, 16 and B: the host seconds
               per turn spent in the environments (`timings["env_s"] / K`) and the whole call.

With B workers a turn's tool phase should take about one call's time, not B of them.
Best and median of `--repeats` runs; the first engine call (compile) is excluded.

  python benchmarks/tools.py [--batch 64] [--tool_ms 50] [--turns 2] [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import jax
from flax import nnx

from credit.envs.calls import call_all
from credit.envs.rollout import MultiTurnSampler, TurnLayout
from credit.models import Decoder
from credit.models.config import tiny_config
from credit.tasks import CharTokenizer

TOK = CharTokenizer()


class SleepyEnv:
  """A tool call of `seconds` per step; done after `turns` turns."""

  def __init__(self, seconds: float, turns: int):
    self.seconds, self.turns, self.k = seconds, turns, 0

  def reset(self):
    self.k = 0
    return "find it?"

  def step(self, action):
    del action
    time.sleep(self.seconds)
    self.k += 1
    return SimpleNamespace(observation="found: it", done=self.k >= self.turns, reward=0.0,
                           progress=0.0, role=0)

  def outcome(self):
    return 0.0


def _stats(fn, repeats: int) -> tuple[float, float]:
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return min(times), statistics.median(times)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--tool_ms", type=float, default=50.0)
  p.add_argument("--turns", type=int, default=2)
  p.add_argument("--repeats", type=int, default=3)
  a = p.parse_args(argv)
  B, sec = a.batch, a.tool_ms / 1000
  workers = sorted({1, 16, B})
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}; B={B} episodes, tool call "
        f"{a.tool_ms:g} ms, K={a.turns} turns, best/median of {a.repeats}\n")

  print("tool phase of one turn (call_all over the B steps)")
  print(f"{'workers':>8} {'best ms':>9} {'median ms':>10} {'x one call':>11} {'serial/this':>12}")
  rows = {}
  for w in workers:
    envs = [SleepyEnv(sec, 10**9) for _ in range(B)]
    for e in envs:
      e.reset()
    fns = [lambda e=e: e.step("go()") for e in envs]
    rows[w] = _stats(lambda fns=fns, w=w: call_all(fns, max_workers=w, timeout_s=60.0),
                     a.repeats)
  for w in workers:
    best, med = rows[w]
    print(f"{w:>8} {best * 1e3:>9.1f} {med * 1e3:>10.1f} {best / sec:>11.2f} "
          f"{rows[1][0] / best:>12.1f}")

  cfg = tiny_config(vocab_size=TOK.vocab_size, hidden_size=128, num_layers=2)
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  state = nnx.state(model)
  layout = TurnLayout(prompt_width=12, max_turns=a.turns, max_action_tokens=8,
                      max_observation_tokens=12)
  print(f"\nengine: MultiTurnSampler, B={B} episodes of {a.turns} turns")
  print(f"{'max_concurrent_steps':>21} {'env ms/turn':>12} {'x one call':>11} "
        f"{'call s (best)':>14} {'serial/this (env)':>18}")
  eng = {}
  for w in workers:
    ms = MultiTurnSampler(model, tokenizer=TOK, layout=layout, max_concurrent_steps=w)
    run = lambda ms=ms: ms(state, [SleepyEnv(sec, a.turns) for _ in range(B)],
                           key=jax.random.key(0))
    run()  # compile
    env_turn, calls = [], []
    for _ in range(a.repeats):
      t0 = time.perf_counter()
      out = run()
      calls.append(time.perf_counter() - t0)
      env_turn.append(out.timings["env_s"] / a.turns)
    eng[w] = (min(env_turn), min(calls))
  for w in workers:
    env, call = eng[w]
    print(f"{w:>21} {env * 1e3:>12.1f} {env / sec:>11.2f} {call:>14.2f} "
          f"{eng[1][0] / env:>18.1f}")


if __name__ == "__main__":
  main()
