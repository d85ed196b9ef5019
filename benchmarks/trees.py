"""Tree rollout tokens/s: branch sampling (`credit.trees.grow_tree`) against independent sampling
of the same number of rows, and the shared-prefix prefill against repeated prefixes.

One random model (the character vocabulary, hidden 128, 2 layers: the size of the built-in
recipes' policies), N prompts of P characters. Compared, all on the same model and sampler:

  independent   `Sampler` drawing N·(G + k·Σ M_d) rows of up to W new tokens in one call (what a
                flat GRPO step with that many samples costs);
  tree          G roots per prompt, then D rounds of M_d branch points per prompt with k
                continuations each (surprisal criterion: no extra scoring pass), prefixes
                prefilled once (`share_prefix`); the same number of rows, fewer new tokens
                (a branch only samples the part after its branch point);
  tree+entropy  the same, choosing points by the policy's entropy (one scoring pass per round,
                the runner's default criterion);
  prefill       G samples per prompt with and without `share_prefix` (one prefill per prompt
                and its KV cache repeated, vs G prefills).

Tokens/s counts the tokens each method sampled (a tree row's own tokens only); a tree gives
more comparisons per sampled token, so the last column compares wall time per row.

  python benchmarks/trees.py [--prompts 16] [--group 4] [--branches 2] [--points 2] [--depth 2]
                             [--prompt-len 64] [--new 32] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import sys

import jax
import numpy as np
from flax import nnx

from credit import scoring, trees
from credit.models import Decoder
from credit.models.config import tiny_config
from credit.sampling import Sampler
from credit.tasks import CharTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import timed  # noqa: E402

TOK = CharTokenizer()


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--prompts", type=int, default=16)
  ap.add_argument("--group", type=int, default=4)
  ap.add_argument("--branches", type=int, default=2)
  ap.add_argument("--points", type=int, default=2)
  ap.add_argument("--depth", type=int, default=2)
  ap.add_argument("--prompt-len", type=int, default=64)
  ap.add_argument("--new", type=int, default=32)
  ap.add_argument("--repeats", type=int, default=3)
  a = ap.parse_args()
  cfg = tiny_config("qwen3", vocab_size=TOK.vocab_size)
  cfg = cfg.replace(hidden_size=128, intermediate_size=256, num_layers=2, head_dim=32)
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  state = nnx.state(model)
  sampler = Sampler(model, pad_id=TOK.pad_id, stop_tokens=())  # full-length rows: fair counts
  N, G, k, W = a.prompts, a.group, a.branches, a.new
  rng = np.random.default_rng(0)
  prompts = rng.integers(3, TOK.vocab_size, (N, a.prompt_len)).astype(np.int32)
  mask = np.ones_like(prompts, bool)
  rows = trees.tree_rows(N, G, k, a.points, a.depth)
  key = jax.random.key(0)

  def roots():
    out = sampler(state, prompt_tokens=prompts, prompt_mask=mask, key=key, max_new_tokens=W,
                  num_samples=G, share_prefix=True)
    h = jax.tree.map(np.asarray, out._asdict())
    B = h["tokens"].shape[0]
    return trees.TreeRollout(h["tokens"], h["response_mask"], h["response_mask"],
                             h["prompt_mask"], h["logprob_sampler"], h["logprob_raw"],
                             h["group_id"], np.full(B, -1, np.int32), np.zeros(B, np.int32),
                             np.zeros(B, np.int32))

  def sample_fn(prefix, pmask, budget, key):
    return sampler(state, prompt_tokens=prefix, prompt_mask=pmask, key=key, max_new_tokens=W,
                   num_samples=k, max_new_tokens_per_row=budget, share_prefix=True)

  graphdef, params = nnx.split(model)
  score = jax.jit(lambda p, t, m: scoring.score_tokens(nnx.merge(graphdef, p), t, m).entropy)

  def grow(criterion):
    fn = None if criterion == "surprisal" else (
        lambda t: np.asarray(score(params, t.tokens, t.prompt_mask | t.path_mask)))
    return trees.grow_tree(roots(), sample_fn, num_groups=N, branches=k, points=a.points,
                           depth=a.depth, criterion=criterion, score_fn=fn,
                           max_new_tokens=W, key=key)[0]

  def independent(share=False, n=rows // N):
    return sampler(state, prompt_tokens=prompts, prompt_mask=mask, key=key, max_new_tokens=W,
                   num_samples=n, share_prefix=share)

  results = []
  for name, fn, count in [
      ("independent", independent, lambda: rows * W),
      ("tree", lambda: grow("surprisal"), None),
      ("tree+entropy", lambda: grow("entropy"), None)]:
    best, med = timed(fn, a.repeats)
    n_tok = count() if count else int(grow("surprisal").response_mask.sum())
    results.append((name, rows, n_tok, best, med))
  base = results[0][3]
  print(f"N={N} prompts x (G={G} roots + k={k} x M={trees.budgets(a.points, a.depth, 0.5)} "
        f"branch points) = {rows} rows; prompt {a.prompt_len}, up to {W} new tokens; "
        f"{jax.devices()[0].platform}")
  print(f"{'method':14s} {'rows':>5s} {'tokens':>7s} {'best s':>8s} {'median s':>9s} "
        f"{'tok/s':>9s} {'time vs independent':>20s}")
  for name, r, n_tok, best, med in results:
    print(f"{name:14s} {r:5d} {n_tok:7d} {best:8.3f} {med:9.3f} {n_tok / best:9.0f} "
          f"{best / base:20.2f}x")
  # Shared prefill: G rows per prompt, one prefill each.
  rep = [timed(lambda s=s: independent(share=s, n=G), a.repeats)[0] for s in (False, True)]
  print(f"\nprefill of {N} prompts x {G} samples: repeated {rep[0]:.3f} s, shared {rep[1]:.3f} s "
        f"({rep[0] / rep[1]:.2f}x)")


if __name__ == "__main__":
  main()
