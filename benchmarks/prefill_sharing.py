"""Prefill FLOPs and time saved by computing shared prefixes once, on the recipes that share them.

Rows that continue one prefix share its KV cache: the G samples of a prompt (every single-turn
recipe, `Sampler(share_prefix=True)`, the default), the G episodes of a prompt (multi-turn
recipes, `MultiTurnSampler` finds neighbouring rows with one prefix: `shared_run`), LoGo's L
continuations of one saved state (`continue_episodes`), a tree's k branches from one branch
point (`credit.trees`). With sharing the prefix goes through the model once and its cache is
copied to its k rows (`credit.sampling.prefill(share=k)`); without, each row prefills it.

For each recipe the shapes are the full recipe's (`get_config()`: prompts per step, group size,
the widest prompt of its data, the episode width for LoGo's prefixes, its model), the model is
randomly initialised, and the prefill program alone (the same jitted building block the
samplers run, cache allocation and first draw included) is compiled and timed both ways in
this run: `share=1` over all R·k rows (the baseline) and `share=k` over the R prefixes. FLOPs
are XLA's cost analysis of the compiled program; time is the best and median wall and process
CPU seconds over `--repeats` calls after the compile.

  python benchmarks/prefill_sharing.py [--recipes grpo_arithmetic igpo_lookup logo_lookup
                                        cbpo_chain] [--repeats 5]
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from credit import sampling
from credit.models import Decoder
from experiments import loop

RECIPES = ("grpo_arithmetic", "igpo_lookup", "logo_lookup", "cbpo_chain")


def prefix_cases(name: str) -> tuple:
  """(config, cases) of recipe `name`: per shared prefix of one step, (what, R prefixes, k rows
  each, prefix width, cache width)."""
  c = importlib.import_module(f"experiments.configs.{name}").get_config()
  data = loop.build_data(c)
  N, G = c.prompts_per_step, c.group_size
  if getattr(data.task, "multi_turn", False):
    lay = loop.turn_layout(c, data)
    cases = [("G episodes / prompt", N, G, lay.prompt_width, lay.buffer_width)]
    if c.logo.branch_rows > 0:  # continuations: the whole episode width is the prefix area
      T = lay.output_width
      cont = T + (c.max_turns - 1) * lay.turn_width
      cases.append(("LoGo L continuations / state", c.logo.branch_rows, c.logo.local_size, T,
                    cont))
    return c, cases
  P, W = data.max_prompt_len, c.max_new_tokens
  cases = [("G samples / prompt", N, G, P, P + W)]
  if c.tree.branches > 0:  # depth-1 points: prefixes of the tree's width (prompt + response)
    cases.append(("tree k branches / point", N * c.tree.points, c.tree.branches, P + W,
                  P + 2 * W))
  return c, cases


def measure(model, R: int, k: int, P: int, L: int, share: bool, repeats: int):
  """(GFLOPs, best s, median s, best CPU s) of prefilling R·k rows of width P in a cache of L."""
  graphdef, state = nnx.split(model)
  params = sampling.sampling_params(temperature=1.0, vocab_size=model.config.vocab_size)
  rows = R if share else R * k
  rng = np.random.default_rng(0)
  toks = jnp.asarray(rng.integers(3, model.config.vocab_size, (rows, P)), jnp.int32)
  mask = jnp.ones((rows, P), bool)

  def fn(st, toks, mask, key):
    s = sampling.prefill(nnx.merge(graphdef, st), prompt_tokens=toks, prompt_mask=mask, key=key,
                         max_new_tokens=L - P, max_new_B=jnp.full((R * k,), L - P, jnp.int32),
                         params=params, share=k if share else 1)
    return s.tokens_BL, s.cache

  compiled = jax.jit(fn).lower(state, toks, mask, jax.random.key(0)).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  flops = float(cost.get("flops", float("nan")))
  jax.block_until_ready(compiled(state, toks, mask, jax.random.key(0)))
  wall, cpu = [], []
  for i in range(repeats):
    t0, c0 = time.perf_counter(), time.process_time()
    jax.block_until_ready(compiled(state, toks, mask, jax.random.key(i)))
    wall.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
  return flops / 1e9, min(wall), statistics.median(wall), min(cpu)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--recipes", nargs="+", default=list(RECIPES))
  ap.add_argument("--repeats", type=int, default=5)
  a = ap.parse_args()
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
  head = (f"{'recipe':16s} {'shared prefix':30s} {'R':>4s} {'k':>3s} {'P':>4s} "
          f"{'GFLOP k=1':>10s} {'GFLOP shared':>12s} {'x':>5s} {'ms k=1':>8s} {'ms shared':>9s} "
          f"{'x':>5s} {'CPU ms k=1':>10s} {'CPU shared':>10s} {'x':>5s}")
  print(head)
  for name in a.recipes:
    c, cases = prefix_cases(name)
    model = Decoder(loop.build_model_config(c, loop.build_data(c).tokenizer), rngs=nnx.Rngs(0))
    for what, R, k, P, L in cases:
      f1, b1, m1, c1 = measure(model, R, k, P, L, False, a.repeats)
      fk, bk, mk, ck = measure(model, R, k, P, L, True, a.repeats)
      print(f"{name:16s} {what:30s} {R:4d} {k:3d} {P:4d} {f1:10.3f} {fk:12.3f} {f1 / fk:5.2f} "
            f"{b1 * 1e3:8.1f} {bk * 1e3:9.1f} {b1 / bk:5.2f} {c1 * 1e3:10.1f} {ck * 1e3:10.1f} "
            f"{c1 / ck:5.2f}   (median ms {m1 * 1e3:.1f} / {mk * 1e3:.1f})")


if __name__ == "__main__":
  main()
