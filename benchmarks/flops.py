"""Model FLOPs utilisation of scoring and of a train step, against this machine's matmul peak.

    python benchmarks/flops.py [--size tiny|small|qwen05] [--B 8] [--T 256] [--repeats 5]
                               [--chunk-size 0] [--peak-n 4096]

1. Peak: the FLOP/s of one large float32 matmul (n × n @ n × n, 2n³ FLOPs), median of
   `--repeats` calls, measured in this run (it is the roofline the others are divided by).
2. Scoring: `credit.scoring.score_tokens` (log-prob and entropy of every token, chunked
   logits) on B × T tokens of a randomly initialised `credit.models.Decoder`.
3. Train step: value_and_grad of the mean token log-prob loss through `score_tokens`, plus an
   optax AdamW update (nnx.Optimizer), jitted as one function.

Model FLOPs (PaLM, Chowdhery et al., arXiv:2204.02311, Appendix B): with N the number of
parameters that take part in matmuls (attention q/k/v/o, MLP, and the D × V unembedding —
not the embedding gather, norms or biases), L layers, H query heads of width Dh, context T:

    forward     2·N + 4·L·H·Dh·T   FLOPs per token
    train step  6·N + 12·L·H·Dh·T  FLOPs per token

The attention term counts the full T × T score and value matmuls (what the decoder computes,
causal mask applied after), as PaLM does. Work the implementation adds beyond these counts is
not credited: the chunked scorer recomputes each logit chunk in the backward pass (2·D·V more
per token), the softmax/norm/rotary elementwise work, and the optimizer update.
Utilisation = model FLOPs / (wall time · measured peak).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from credit import scoring  # noqa: E402
from credit.models import Decoder, ModelConfig  # noqa: E402

SIZES = {
    # name: (V, D, F, L, H, Hkv, Dh)
    "tiny": (4096, 128, 512, 2, 4, 2, 32),
    "small": (32000, 512, 1536, 4, 8, 2, 64),
    "qwen05": (151936, 896, 4864, 24, 14, 2, 64),  # Qwen2.5-0.5B shapes (slow on CPU)
}


def _median_time(fn, args, repeats):
  jax.block_until_ready(fn(*args))  # compile + warm-up
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def matmul_peak(n: int, repeats: int) -> float:
  """FLOP/s of an n×n by n×n float32 matmul."""
  k1, k2 = jax.random.split(jax.random.PRNGKey(0))
  a = jax.random.normal(k1, (n, n), jnp.float32)
  b = jax.random.normal(k2, (n, n), jnp.float32)
  return 2 * n**3 / _median_time(jax.jit(jnp.matmul), (a, b), repeats)


def matmul_params(c: ModelConfig) -> int:
  """N: parameters used in matmuls (q, k, v, o, gate, up, down per layer; unembedding)."""
  d, h, kv, dh, f = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size
  per_layer = d * h * dh + 2 * d * kv * dh + h * dh * d + 3 * d * f
  return c.num_layers * per_layer + d * c.vocab_size


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--size", default="small", choices=sorted(SIZES))
  p.add_argument("--B", type=int, default=8)
  p.add_argument("--T", type=int, default=256)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--chunk-size", type=int, default=0, help="0 = auto (chunk_size=None)")
  p.add_argument("--peak-n", type=int, default=4096)
  args = p.parse_args()

  v, d, f, l, h, kv, dh = SIZES[args.size]
  cfg = ModelConfig(vocab_size=v, hidden_size=d, intermediate_size=f, num_layers=l, num_heads=h,
                    num_kv_heads=kv, head_dim=dh, family="qwen2", qkv_bias=True)
  b, t = args.B, args.T
  n_tok = b * t
  n_mm = matmul_params(cfg)
  fwd_flops = n_tok * (2 * n_mm + 4 * l * h * dh * t)
  train_flops = n_tok * (6 * n_mm + 12 * l * h * dh * t)
  print(f"devices={jax.devices()} cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f}")
  print(f"model {args.size}: V={v} D={d} F={f} L={l} H={h}/{kv} Dh={dh}  N(matmul)={n_mm/1e6:.1f}M"
        f"  tokens/step={b}x{t}={n_tok}  chunk={args.chunk_size}")

  peak = matmul_peak(args.peak_n, args.repeats)
  print(f"matmul peak ({args.peak_n}^3 f32): {peak/1e9:.1f} GFLOP/s")

  model = Decoder(cfg, rngs=nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.PRNGKey(1), (b, t), 0, v)
  mask = jnp.ones((b, t), jnp.bool_)

  @nnx.jit
  def score(model, tokens, mask):
    return scoring.score_tokens(model, tokens, mask, chunk_size=args.chunk_size or None)

  optimizer = nnx.Optimizer(model, optax.adamw(1e-4), wrt=nnx.Param)

  @nnx.jit
  def train_step(model, optimizer, tokens, mask):
    def loss_fn(model):
      out = scoring.score_tokens(model, tokens, mask, chunk_size=args.chunk_size or None,
                                 return_entropy=False)
      return -jnp.sum(out.logprob) / n_tok
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  t_score = _median_time(score, (model, tokens, mask), args.repeats)
  t_train = _median_time(train_step, (model, optimizer, tokens, mask), args.repeats)
  peak_after = matmul_peak(args.peak_n, args.repeats)
  print(f"matmul peak re-measured after: {peak_after/1e9:.1f} GFLOP/s (load "
        f"{os.getloadavg()[0]:.1f}); utilisation below uses the mean of both")
  peak = 0.5 * (peak + peak_after)

  print(f"\n{'':<12}{'model GFLOP':>12}{'ms':>10}{'GFLOP/s':>10}{'util':>8}{'tokens/s':>10}")
  for name, flops, sec in (("score fwd", fwd_flops, t_score), ("train step", train_flops, t_train)):
    print(f"{name:<12}{flops/1e9:>12.2f}{sec*1e3:>10.1f}{flops/sec/1e9:>10.1f}"
          f"{flops/sec/peak:>8.1%}{n_tok/sec:>10.0f}")


if __name__ == "__main__":
  main()
