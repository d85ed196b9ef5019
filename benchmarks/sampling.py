"""Generated tokens/s: credit.sampling.Sampler vs transformers `generate` (PyTorch, CPU).

Both run the SAME random Qwen3 checkpoint (hidden 256, 4 layers, 4 heads, 2 kv heads, head dim 64,
MLP 1024, vocab 32000), written with transformers' `save_pretrained` and loaded with
`credit.models.from_pretrained`, and sample the same way: batch 16, prompt 16, exactly 64 new
tokens (the eos id is blocked by min_new_tokens=64 on both sides), temperature 0.9, top-k 10,
top-p 0.95. Compile/warm-up runs are excluded; each side is timed over `--repeats` runs (best and
median). transformers runs with 1 and 2 torch threads (under CPU contention 1 thread is often faster);
the ratio, measured in the same process run, is against its better setting.

  python benchmarks/sampling.py [--repeats 5] [--batch 16] [--new 64]

Also prints our prefill time alone, so decode tokens/s can be read off.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from credit import sampling  # noqa: E402

try:
  from credit.models import from_pretrained  # noqa: E402
except ImportError:  # not re-exported yet
  from credit.models.hf_io import from_pretrained  # noqa: E402

EOS = 2
PAD = 0


def build_checkpoint(path: str, seed: int = 0):
  import torch
  import transformers
  torch.manual_seed(seed)
  cfg = transformers.Qwen3Config(
      vocab_size=32000, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
      tie_word_embeddings=False, eos_token_id=EOS, pad_token_id=PAD, bos_token_id=1)
  model = transformers.Qwen3ForCausalLM(cfg).eval()
  with torch.no_grad():  # randomise norms too, so nothing hides behind ones
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + 0.1 * torch.randn_like(p))
  model.save_pretrained(path)
  return model


def time_runs(fn, repeats):
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return min(times), statistics.median(times)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--batch", type=int, default=16)
  ap.add_argument("--prompt", type=int, default=16)
  ap.add_argument("--new", type=int, default=64)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--torch-threads", type=int, nargs="+", default=[1, 2])
  args = ap.parse_args()
  import torch
  B, P, N = args.batch, args.prompt, args.new
  kw = dict(temperature=0.9, top_k=10, top_p=0.95)
  rng = np.random.default_rng(0)
  prompts = rng.integers(3, 32000, size=(B, P)).astype(np.int32)
  mask = np.ones((B, P), bool)

  with tempfile.TemporaryDirectory() as tmp:
    hf_model = build_checkpoint(tmp)
    model, config = from_pretrained(tmp)

  # --- ours ---
  sampler = sampling.Sampler(model, pad_id=PAD, stop_tokens=(EOS,))
  state = nnx.state(model)
  calls = [0]

  def ours():
    calls[0] += 1
    out = sampler(state, prompt_tokens=prompts, prompt_mask=mask, key=jax.random.key(calls[0]),
                  max_new_tokens=N, min_new_tokens=N, **kw)
    jax.block_until_ready(out.tokens)
    return out

  t0 = time.perf_counter()
  out = ours()
  compile_s = time.perf_counter() - t0
  assert int(out.response_mask.sum()) == B * N
  ours_best, ours_med = time_runs(ours, args.repeats)

  # Prefill alone (same jitted building block), to split prefill vs decode.
  graphdef, _ = nnx.split(model)
  params = sampling.sampling_params(stop_tokens=(EOS,), min_new_tokens=N, vocab_size=32000, **kw)

  @jax.jit
  def prefill_only(st, toks, msk, key):
    m = nnx.merge(graphdef, st)
    s = sampling.prefill(m, prompt_tokens=toks, prompt_mask=msk, key=key, max_new_tokens=N,
                         max_new_B=jnp.full((B,), N, jnp.int32), params=params, pad_id=PAD)
    return s.tokens_BL
  pre = lambda: jax.block_until_ready(prefill_only(state, prompts, mask, jax.random.key(0)))
  pre()
  pre_best, _ = time_runs(pre, args.repeats)

  # --- transformers ---
  ids = torch.tensor(prompts, dtype=torch.long)
  am = torch.ones_like(ids)

  def hf():
    with torch.no_grad():
      o = hf_model.generate(ids, attention_mask=am, do_sample=True, max_new_tokens=N,
                            min_new_tokens=N, pad_token_id=PAD, eos_token_id=EOS, **kw)
    assert o.shape == (B, P + N)
    return o

  toks = B * N
  rows = [("credit Sampler (jax, jit)", ours_best, ours_med)]
  hf_times = []
  for threads in args.torch_threads:  # torch under CPU contention can prefer fewer threads
    torch.set_num_threads(threads)
    hf()
    hf_best_t, hf_med_t = time_runs(hf, args.repeats)
    rows.append((f"transformers generate (torch, {threads} thr)", hf_best_t, hf_med_t))
    hf_times.append((hf_best_t, hf_med_t))
  hf_best = min(t[0] for t in hf_times)
  hf_med = min(t[1] for t in hf_times)
  print(f"\nB={B} prompt={P} new={N} {kw}; jax {jax.__version__} on {jax.devices()[0].platform}, "
        f"torch {torch.__version__}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
  print(f"{'sampler':34s} {'best s':>8s} {'median s':>9s} {'tok/s (best)':>13s} {'tok/s (med)':>12s}")
  for name, b, m in rows:
    print(f"{name:34s} {b:8.3f} {m:9.3f} {toks / b:13.0f} {toks / m:12.0f}")
  print(f"ratio credit/transformers (vs transformers' better thread setting): "
        f"best {hf_best / ours_best:.2f}x, median {hf_med / ours_med:.2f}x")
  print(f"ours: first call incl. compile {compile_s:.2f} s; prefill alone {pre_best * 1e3:.1f} ms; "
        f"decode ≈ {(ours_best - pre_best) * 1e3 / (N - 1):.2f} ms/step "
        f"({B * (N - 1) / (ours_best - pre_best):.0f} tok/s)")


if __name__ == "__main__":
  main()
