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

Tree branches (and LoGo's continuations, `MultiTurnSampler.continue_episodes`) can do better
than one prefill per prefix: their parent rows were sampled by an earlier call whose KV cache
is kept (`Sampler(keep_cache=True)`), so a branch copies its parent's keys/values up to the
branch point and only the prefix's last token goes through the model (for the logits of the
first draw; `credit.sampling.prefill_from_parent`). The column "from parent" times that
program (copy + one token, then the first draw) for the same R prefixes and k rows.

A second table runs a recipe's whole tree sampling (`credit.trees.grow_tree` after the roots,
the recipe's k, M, depth, widths and model; random prompts, temperature 1, surprisal points)
both ways in the same run, interleaved: every round prefilling its prefixes (shared by
siblings) vs every round continuing its parents' caches; both draw the same tokens (checked).

  python benchmarks/prefill_sharing.py [--recipes grpo_arithmetic igpo_lookup logo_lookup
                                        cbpo_chain propa_chain] [--repeats 5]
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

from credit import sampling, trees
from credit.models import Decoder
from experiments import loop

RECIPES = ("grpo_arithmetic", "igpo_lookup", "logo_lookup", "cbpo_chain", "propa_chain")


def prefix_cases(name: str) -> tuple:
  """(config, cases) of recipe `name`: per shared prefix of one step, (what, R prefixes, k rows
  each, prefix width, cache width, parent call's (rows, slots) or None)."""
  c = importlib.import_module(f"experiments.configs.{name}").get_config()
  data = loop.build_data(c)
  N, G = c.prompts_per_step, c.group_size
  if getattr(data.task, "multi_turn", False):
    lay = loop.turn_layout(c, data)
    cases = [("G episodes / prompt", N, G, lay.prompt_width, lay.buffer_width, None)]
    if c.logo.branch_rows > 0:  # continuations: the whole episode width is the prefix area
      T = lay.output_width
      cont = T + (c.max_turns - 1) * lay.turn_width
      cases.append(("LoGo L continuations / state", c.logo.branch_rows, c.logo.local_size, T,
                    cont, (N * G, lay.buffer_width)))
    return c, cases
  P, W = data.max_prompt_len, c.max_new_tokens
  cases = [("G samples / prompt", N, G, P, P + W, None)]
  if c.tree.branches > 0:  # depth-1 points: prefixes of the tree's width (prompt + response)
    cases.append(("tree k branches / point", N * c.tree.points, c.tree.branches, P + W,
                  P + 2 * W, (N * G, P + W)))
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


def _timed(compiled, args, repeats: int):
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  jax.block_until_ready(compiled(*args))
  wall, cpu = [], []
  for _ in range(repeats):
    t0, c0 = time.perf_counter(), time.process_time()
    jax.block_until_ready(compiled(*args))
    wall.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
  return float(cost.get("flops", float("nan"))) / 1e9, min(wall), statistics.median(wall), min(cpu)


def measure_parent(model, R: int, k: int, P: int, L: int, parent: tuple, repeats: int):
  """As `measure`, for R prefixes continued from a parent call's kept cache of `parent` =
  (rows, slots): the copy of each prefix's keys/values and its last token through the model
  (`sampling.prefill_from_parent`), then k rows each and the first draw."""
  graphdef, state = nnx.split(model)
  params = sampling.sampling_params(temperature=1.0, vocab_size=model.config.vocab_size)
  B0, S0 = parent
  rng = np.random.default_rng(0)
  start = rng.integers(0, S0 - P + 1, B0)[:, None] + np.arange(S0)[None]
  kept = sampling.RowCache(cache=model.init_cache(B0, S0), slot_BT=jnp.asarray(start, jnp.int32))
  rows = jnp.asarray(rng.integers(0, B0, R), jnp.int32)
  n = rng.integers(1, P + 1, R)
  toks = jnp.asarray(rng.integers(3, model.config.vocab_size, (R, P)), jnp.int32)
  mask = jnp.asarray(np.arange(P)[None] < n[:, None])

  def fn(st, kept, rows, toks, mask, key):
    s = sampling.prefill_from_parent(
        nnx.merge(graphdef, st), parent=kept, parent_rows=rows, prompt_tokens=toks,
        prompt_mask=mask, key=key, max_new_tokens=L - P,
        max_new_B=jnp.full((R * k,), L - P, jnp.int32), params=params, share=k)
    return s.tokens_BL, s.cache

  args = (state, kept, rows, toks, mask, jax.random.key(0))
  return _timed(jax.jit(fn).lower(*args).compile(), args, repeats)


def kept_mib(model, rows: int, slots: int) -> float:
  """MiB of a kept cache of `rows` x `slots` (keys and values, float32): the memory a parent
  call's cache holds while its continuations start from it."""
  m = model.config
  return 2 * m.num_layers * rows * m.num_kv_heads * slots * m.head_dim * 4 / 2 ** 20


def tree_sampling(name: str, repeats: int):
  """Best CPU s, best wall s of `grow_tree` after the roots, each round prefilling its prefixes
  vs continuing its parents' caches, on recipe `name`'s shapes; and whether the tokens agree."""
  c = importlib.import_module(f"experiments.configs.{name}").get_config()
  data = loop.build_data(c)
  model = Decoder(loop.build_model_config(c, data.tokenizer), rngs=nnx.Rngs(0))
  sampler = sampling.Sampler(model, pad_id=data.tokenizer.pad_id, stop_tokens=())
  state = nnx.state(model)
  N, G, P, W, t = c.prompts_per_step, c.group_size, data.max_prompt_len, c.max_new_tokens, c.tree
  rng = np.random.default_rng(0)
  toks = rng.integers(3, model.config.vocab_size, (N, P)).astype(np.int32)
  kw = dict(max_new_tokens=W, temperature=1.0)
  out, kept = sampler(state, prompt_tokens=toks, key=jax.random.key(0), num_samples=G,
                      keep_cache=True, **kw)
  h = jax.tree.map(np.asarray, out._asdict())
  B = h["tokens"].shape[0]
  roots = trees.TreeRollout(
      h["tokens"], h["response_mask"], h["response_mask"], h["prompt_mask"],
      h["logprob_sampler"], h["logprob_raw"], h["group_id"], np.full(B, -1, np.int32),
      np.zeros(B, np.int32), np.zeros(B, np.int32))

  def sample_fn(prefix, mask, budget, key, parent=None):
    more = {} if parent is None else dict(parent=parent[0], parent_rows=parent[1],
                                          keep_cache=True)
    return sampler(state, prompt_tokens=prefix, prompt_mask=mask, key=key,
                   num_samples=t.branches, max_new_tokens_per_row=budget, **kw, **more)

  def grow(reuse):
    return trees.grow_tree(roots, sample_fn, num_groups=N, branches=t.branches,
                           points=t.points, depth=t.depth, decay=t.depth_decay,
                           criterion="surprisal", max_new_tokens=W, key=jax.random.key(1),
                           cache=kept if reuse else None)[0]

  same = np.array_equal(grow(False).tokens, grow(True).tokens)  # also compiles both
  res = {False: ([], []), True: ([], [])}
  for _ in range(repeats):
    for reuse in (False, True):
      t0, c0 = time.perf_counter(), time.process_time()
      grow(reuse)
      res[reuse][0].append(time.process_time() - c0)
      res[reuse][1].append(time.perf_counter() - t0)
  return {r: (min(cpu), min(wall), statistics.median(cpu)) for r, (cpu, wall) in res.items()}, same


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
    for what, R, k, P, L, parent in cases:
      f1, b1, m1, c1 = measure(model, R, k, P, L, False, a.repeats)
      fk, bk, mk, ck = measure(model, R, k, P, L, True, a.repeats)
      print(f"{name:16s} {what:30s} {R:4d} {k:3d} {P:4d} {f1:10.3f} {fk:12.3f} {f1 / fk:5.2f} "
            f"{b1 * 1e3:8.1f} {bk * 1e3:9.1f} {b1 / bk:5.2f} {c1 * 1e3:10.1f} {ck * 1e3:10.1f} "
            f"{c1 / ck:5.2f}   (median ms {m1 * 1e3:.1f} / {mk * 1e3:.1f})")
      if parent is not None:
        fp, bp, mp, cp = measure_parent(model, R, k, P, L, parent, a.repeats)
        print(f"{'':16s} {'  ... from parent cache':30s} {R:4d} {k:3d} {P:4d} {f1:10.3f} "
              f"{fp:12.3f} {f1 / fp:5.2f} {b1 * 1e3:8.1f} {bp * 1e3:9.1f} {b1 / bp:5.2f} "
              f"{c1 * 1e3:10.1f} {cp * 1e3:10.1f} {c1 / cp:5.2f}   (median ms {m1 * 1e3:.1f} / "
              f"{mp * 1e3:.1f}; vs shared: {fk / fp:.1f}x GFLOP, {ck / cp:.2f}x CPU; the kept "
              f"parent cache: {kept_mib(model, *parent):.1f} MiB)")
  tree_recipes = [n for n in a.recipes if getattr(importlib.import_module(
      f"experiments.configs.{n}").get_config().tree, "branches", 0) > 0]
  if tree_recipes:
    print(f"\nWhole tree sampling after the roots (grow_tree), best of {a.repeats}, interleaved; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'recipe':16s} {'CPU s prefill':>13s} {'CPU s parent':>12s} {'x':>5s} "
          f"{'wall s prefill':>14s} {'wall s parent':>13s} {'x':>5s}  same tokens")
    for name in tree_recipes:
      r, same = tree_sampling(name, a.repeats)
      (c0, w0, _), (c1, w1, _) = r[False], r[True]
      print(f"{name:16s} {c0:13.3f} {c1:12.3f} {c0 / c1:5.2f} {w0:14.3f} {w1:13.3f} "
            f"{w0 / w1:5.2f}  {'yes' if same else 'NO'}   (median CPU s {r[False][2]:.3f} / "
            f"{r[True][2]:.3f})")


if __name__ == "__main__":
  main()
