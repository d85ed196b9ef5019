"""Multi-turn rollout tokens/s: `credit.envs.MultiTurnSampler` against single-turn sampling and
against re-prefilling the whole history every turn.

One random model (the character vocabulary, hidden 128, 2 layers: the size of the built-in
recipes' policies), B episodes of K turns of scripted environments: each action is exactly W_a
tokens (eos blocked until then), each observation W_o tokens. Compared, all on the same model:

  multi-turn   `MultiTurnSampler`: one prefill, then per turn a decode loop and one chunked
               feed of the observation; the KV cache is kept across turns;
  single-turn  `credit.sampling.Sampler` drawing the same number of policy tokens in one go
               (the speed of light for the policy tokens: no observations, no host round trips);
  re-prefill   what an engine without a persistent cache does: each turn re-encodes prompt +
               history with a fresh prefill (`Sampler` on the growing prefix), then decodes.

Tokens/s counts policy + observation tokens (what the episode holds) for the multi-turn rows,
policy tokens for single-turn. Compile runs are excluded. The three engines run interleaved,
`--repeats` rounds (a change of machine load hits them alike); the table gives best and median
wall time, the median process CPU time and tokens per CPU second, and prints the load average.
`--one-core` pins the process to one core before XLA starts, so that CPU time is the
single-thread work whatever the load (on a loaded machine XLA's second thread mostly waits).

`--phases` also times the parts of a multi-turn rollout, over `--repeats` more rollouts: each of
the sampler's compiled programs (prefill, a turn's decode loop with its catch-up feed, an
observation feed with the next turn's first draw; each call waited for), the environments'
steps, the observations' tokenisation and the rest of the host's work (decoding actions,
bookkeeping, device-to-host copies, the final compaction). A single-turn call is timed after
each of those rollouts, so the two compare at the same load. It also prints how many times
each program was compiled (once each: the turn index is data).

  python benchmarks/multiturn.py [--batch 32] [--turns 4] [--action 16] [--obs 16] [--repeats 3]
                                 [--one-core] [--phases]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from credit.envs.rollout import MultiTurnSampler, TurnLayout
from credit.models import Decoder
from credit.models.config import tiny_config
from credit.sampling import Sampler
from credit.tasks import CharTokenizer

TOK = CharTokenizer()


class _Timed:
  """Wraps a callable and adds up the wall and process CPU time of its calls; with `block`, each
  call waits for its result's arrays (so a jitted program's time is its own)."""

  def __init__(self, fn, block: bool):
    self.fn, self.block = fn, block
    self.wall = self.cpu = 0.0
    self.calls = 0

  def __call__(self, *args, **kwargs):
    w0, c0 = time.perf_counter(), time.process_time()
    out = self.fn(*args, **kwargs)
    if self.block:
      out = jax.block_until_ready(out)
    self.wall += time.perf_counter() - w0
    self.cpu += time.process_time() - c0
    self.calls += 1
    return out


def phases(ms: MultiTurnSampler, run, repeats: int, single
           ) -> tuple[list[tuple[str, float, float, float]], float, float]:
  """(phase, calls per rollout, wall s per rollout, CPU s per rollout) of `run()`, a multi-turn
  rollout with `ms`, over `repeats` rollouts (the phases add up to the whole), and the mean wall
  and CPU seconds of `single()` (the single-turn program) timed between them."""
  parts = [("prefill + turn 0's first draw", "_start", True),
           ("decode loops + catch-up feeds", "_run_turn", True),
           ("observation feeds + first draws", "_observe", True),
           ("environment steps", "_step_envs", False),
           ("observation tokenisation", "_encode_observations", False)]
  saved = {attr: getattr(ms, attr) for _, attr, _ in parts}
  timers = {attr: _Timed(fn, block) for (_, attr, block), fn in
            zip(parts, saved.values())}
  for attr, t in timers.items():
    setattr(ms, attr, t)
  wall = cpu = wall1 = cpu1 = 0.0
  try:
    for _ in range(repeats):
      w0, c0 = time.perf_counter(), time.process_time()
      jax.block_until_ready(run())
      wall += time.perf_counter() - w0
      cpu += time.process_time() - c0
      w0, c0 = time.perf_counter(), time.process_time()
      jax.block_until_ready(single())
      wall1 += time.perf_counter() - w0
      cpu1 += time.process_time() - c0
  finally:
    for attr, fn in saved.items():
      setattr(ms, attr, fn)
  rows = [(name, timers[attr].calls / repeats, timers[attr].wall / repeats,
           timers[attr].cpu / repeats) for name, attr, _ in parts]
  rows.append(("other host work (actions, bookkeeping, transfers, compaction)", 1,
               wall / repeats - sum(r[2] for r in rows), cpu / repeats - sum(r[3] for r in rows)))
  rows.append(("whole rollout", 1, wall / repeats, cpu / repeats))
  return rows, wall1 / repeats, cpu1 / repeats


class FixedEnv:
  """Observation of exactly `n_obs` characters after every turn; done after `turns` turns."""

  def __init__(self, turns: int, n_obs: int):
    self.turns, self.n_obs, self.k = turns, n_obs, 0

  def reset(self):
    self.k = 0
    return "what is it?"

  def step(self, action):
    self.k += 1
    done = self.k >= self.turns
    return SimpleNamespace(observation="" if done else ("obs " * 8)[:self.n_obs], done=done,
                           reward=0.0, progress=0.0, role=0)

  def outcome(self):
    return 0.0


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--turns", type=int, default=4)
  ap.add_argument("--action", type=int, default=16)
  ap.add_argument("--obs", type=int, default=16)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--one-core", action="store_true",
                  help="pin the process to one core (see the module docstring)")
  ap.add_argument("--phases", action="store_true",
                  help="also time the parts of a rollout (see the module docstring)")
  a = ap.parse_args()
  if a.one_core and hasattr(os, "sched_setaffinity"):  # before XLA's thread pool starts
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
  B, K, W_a, W_o = a.batch, a.turns, a.action, a.obs
  cfg = tiny_config("qwen3", vocab_size=TOK.vocab_size, hidden_size=128,
                    intermediate_size=384, num_layers=2, head_dim=32)
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  state = nnx.state(model)
  P = 16
  lay = TurnLayout(prompt_width=P, max_turns=K, max_action_tokens=W_a,
                   max_observation_tokens=W_o)
  # Actions of exactly W_a tokens: no stop token, a turn ends at its budget.
  ms = MultiTurnSampler(model, tokenizer=TOK, layout=lay, stop_tokens=())
  key = jax.random.key(0)
  out = ms(state, [FixedEnv(K, W_o) for _ in range(B)], key=key)
  n_multi = int(out.response_mask.sum() + out.obs_mask.sum())
  n_policy = int(out.response_mask.sum())

  def multi():
    return ms(state, [FixedEnv(K, W_o) for _ in range(B)], key=key).tokens

  sampler = Sampler(model, pad_id=TOK.pad_id, stop_tokens=())
  prompt = np.full((B, P), TOK.pad_id, np.int32)
  ids = TOK.encode("what is it?", add_bos=True)
  prompt[:, P - len(ids):] = ids
  pmask = prompt != TOK.pad_id

  def single():
    o = sampler(state, prompt_tokens=prompt, prompt_mask=pmask, key=key,
                max_new_tokens=K * W_a)
    return o.tokens

  obs_ids = np.asarray(TOK.encode(("obs " * 8)[:W_o]), np.int32)

  def reprefill():
    toks, mask = prompt, pmask
    for k in range(K):
      o = sampler(state, prompt_tokens=toks, prompt_mask=mask, key=jax.random.fold_in(key, k),
                  max_new_tokens=W_a)
      t = np.asarray(o.tokens)
      m = np.asarray(o.prompt_mask | o.response_mask)
      if k < K - 1:
        toks = np.concatenate([t, np.broadcast_to(obs_ids, (B, W_o))], 1)
        mask = np.concatenate([m, np.ones((B, W_o), bool)], 1)
    return toks

  n_re = B * (K * W_a + (K - 1) * W_o)
  engines = [("multi-turn (cache kept)", n_multi, multi),
             ("single-turn, policy tokens only", B * K * W_a, single),
             ("re-prefill each turn", n_re, reprefill)]
  wall = {name: [] for name, _, _ in engines}
  cpu = {name: [] for name, _, _ in engines}
  for _, _, fn in engines:  # compiles
    jax.block_until_ready(fn())
  for _ in range(a.repeats):
    for name, _, fn in engines:
      w0, c0 = time.perf_counter(), time.process_time()
      jax.block_until_ready(fn())
      wall[name].append(time.perf_counter() - w0)
      cpu[name].append(time.process_time() - c0)
  load = os.getloadavg()
  print(f"B={B} K={K} W_a={W_a} W_o={W_o}; jax {jax.__version__}, "
        f"{jax.devices()[0].platform}{', one core' if a.one_core else ''}; load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {a.repeats} interleaved rounds")
  print("| engine | tokens | best s | median s | tokens/s (best) | vs multi-turn | CPU s (median) "
        "| tokens/CPU s | vs multi-turn (CPU) |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
  name0 = engines[0][0]
  base = n_multi / min(wall[name0])
  base_cpu = n_multi / statistics.median(cpu[name0])
  for name, n, _ in engines:
    best, med, c = min(wall[name]), statistics.median(wall[name]), statistics.median(cpu[name])
    print(f"| {name} | {n} | {best:.3f} | {med:.3f} | {n / best:,.0f} | "
          f"{(n / best) / base:.2f}x | {c:.3f} | {n / c:,.0f} | {(n / c) / base_cpu:.2f}x |")
  print(f"(multi-turn drew {n_policy} policy tokens of {B * K * W_a} possible)")
  if a.phases:
    rows, w1, c1 = phases(ms, multi, a.repeats, single)
    total_w, total_c = rows[-1][2], rows[-1][3]
    print(f"\nmulti-turn rollout by phase (mean of {a.repeats} rollouts):")
    print("| phase | calls | wall ms | share | CPU ms | share |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, n, w, c in rows:
      print(f"| {name} | {n:g} | {w * 1e3:.1f} | {w / total_w:.0%} | {c * 1e3:.1f} | "
            f"{c / total_c:.0%} |")
    print(f"single-turn, one program (prefill + {K * W_a - 1} decode steps), timed between "
          f"those rollouts: wall {w1 * 1e3:.1f} ms, CPU {c1 * 1e3:.1f} ms")
    compiles = {name: fn._cache_size() for name, fn in
                (("prefill", ms._start), ("turn", ms._run_turn), ("observe", ms._observe),
                 ("single-turn", sampler._jitted))}
    print(f"compiled programs (cache entries): {compiles}")


if __name__ == "__main__":
  main()
