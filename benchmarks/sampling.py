"""Generated tokens/s: credit.sampling.Sampler vs Tunix's native sampler and transformers `generate`.

All three run the SAME random Qwen3 checkpoint (hidden 256, 4 layers, 4 heads, 2 kv heads, head
dim 64, MLP 1024, vocab 32000), written with transformers' `save_pretrained` and loaded by each
side's own loader (`credit.models.from_pretrained`, Tunix's
`tunix.models.qwen3.params.create_model_from_safe_tensors`, transformers' model object), and do
the same work: batch 16, prompt 16, exactly 64 new tokens per row (the eos id is blocked on every
side: `min_new_tokens=64` for ours and transformers, `forbidden_tokens=[eos]` for Tunix), float32.
Two modes (`--modes`): "greedy" (argmax; the tokens of the three are compared) and "sampled"
(temperature 0.9, top-k 10, top-p 0.95). Compile/warm-up runs are excluded; each side is timed
over `--repeats` runs (best and median wall time, and the best process CPU time, which counts
every thread; on a loaded machine compare CPU times). transformers runs with 1 and 2 torch threads (under CPU contention 1 thread is
often faster); its ratio is against its better setting. Tunix is timed twice: its public
`Sampler.__call__` (what a user calls: tokenising the prompts, prefill, decode loop, detokenising)
and its two jitted programs alone (prefill + decode loop from a prepared state, no host work).
Tunix's sampler takes strings, so prompts go in as space-separated ids through a small id
tokenizer whose cost is part of the first row only.

  python benchmarks/sampling.py [--repeats 5] [--batch 16] [--new 64] [--modes greedy sampled]

Tunix (PyPI `google-tunix`) is optional: without it its rows print "skipped: google-tunix not
installed". It cannot share this project's environment (it pins safetensors < 0.8, which the
transformers version pinned here does not accept); install it into a separate environment with
this project's jax/flax/numpy versions (docs/performance.md gives the commands).

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
from credit.models import from_pretrained  # noqa: E402

EOS = 2
PAD = 0
VOCAB = 32000
SAMPLED = dict(temperature=0.9, top_k=10, top_p=0.95)


def build_checkpoint(path: str, seed: int = 0):
  import torch
  import transformers
  torch.manual_seed(seed)
  cfg = transformers.Qwen3Config(
      vocab_size=VOCAB, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
      tie_word_embeddings=False, eos_token_id=EOS, pad_token_id=PAD, bos_token_id=1,
      # Qwen3's real θ; Tunix 0.1.7's Qwen3 applies RoPE with θ = 1e6 whatever its config says.
      rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})
  model = transformers.Qwen3ForCausalLM(cfg).eval()
  with torch.no_grad():  # randomise norms too, so nothing hides behind ones
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + 0.1 * torch.randn_like(p))
  model.save_pretrained(path)
  return model


def time_runs(fn, repeats):
  """(best wall, median wall, best process CPU) seconds over `repeats` calls."""
  walls, cpus = [], []
  for _ in range(repeats):
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    walls.append(time.perf_counter() - t0)
    cpus.append(time.process_time() - c0)
  return min(walls), statistics.median(walls), min(cpus)


class _IdTokenizer:
  """Tunix's sampler takes strings: prompts travel as space-separated token ids."""

  def encode(self, text, **_):
    return [int(t) for t in text.split()]

  def decode(self, ids, **_):
    return " ".join(str(int(i)) for i in ids)

  def bos_id(self):
    return 0   # falsy: Tunix prepends no BOS (our prompts have none either)

  def eos_id(self):
    return EOS

  def pad_id(self):
    return PAD


def tunix_side(path: str, prompts: np.ndarray, new: int, repeats: int):
  """Tunix's Qwen3 + native Sampler on the checkpoint at `path`, or None when not installed.

  Returns run(mode) -> (table rows, the [B,new] tokens of its first call).
  """
  try:
    from tunix.generate import sampler as tunix_sampler
    from tunix.models.qwen3 import model as tq_model
    from tunix.models.qwen3 import params as tq_params
  except ImportError:
    return None
  import json
  with open(os.path.join(path, "config.json")) as f:
    hf = json.load(f)
  rope = (hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta", 10000.0))
  cfg = tq_model.ModelConfig(
      num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"],
      embed_dim=hf["hidden_size"], hidden_dim=hf["intermediate_size"],
      num_heads=hf["num_attention_heads"], head_dim=hf["head_dim"],
      num_kv_heads=hf["num_key_value_heads"], rope_theta=rope, norm_eps=hf["rms_norm_eps"],
      use_tied_embedding=hf["tie_word_embeddings"])
  model = tq_params.create_model_from_safe_tensors(path, cfg, mesh=None)
  B, P = prompts.shape
  cache = tunix_sampler.CacheConfig(cache_size=P + new, num_layers=cfg.num_layers,
                                    num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim)
  smp = tunix_sampler.Sampler(model, _IdTokenizer(), cache)
  texts = [" ".join(str(int(t)) for t in row) for row in prompts]

  def kwargs(mode):
    kw = dict(max_generation_steps=new, max_prompt_length=P, eos_tokens=[EOS],
              forbidden_tokens=[EOS])
    if mode == "sampled":
      kw.update(temperature=SAMPLED["temperature"], top_p=SAMPLED["top_p"],
                top_k=SAMPLED["top_k"])
    return kw

  calls = [0]

  def public(mode):
    calls[0] += 1
    out = smp(texts, seed=calls[0], **kwargs(mode))
    return np.stack([np.asarray(t) for t in out.tokens])

  def programs(mode):  # the jitted prefill + decode loop alone, from a prepared state
    calls[0] += 1
    smp.eos_ids = jnp.array([EOS])
    kw = kwargs(mode)
    state = smp.init_sample_state(
        jnp.asarray(prompts), total_sampling_steps=P + new, include_logits=False,
        forbidden_token_ids=(EOS,), temperature=kw.get("temperature", 0.0),
        top_p=kw.get("top_p"), top_k=kw.get("top_k"), seed=jax.random.PRNGKey(calls[0]),
        beam_size=None)
    state = smp._compiled_prefill_fn(smp._flattened_transformer_state, state, None, echo=False)
    state = smp._compiled_decode_fn(smp._flattened_transformer_state, state)
    return np.asarray(jax.block_until_ready(state.token_buffer))[:, P:]

  def run(mode):
    toks = public(mode)   # compile + warm-up
    assert toks.shape == (B, new), toks.shape
    rows = [("Tunix Sampler.__call__", *time_runs(lambda: public(mode), repeats))]
    programs(mode)
    rows.append(("Tunix jitted prefill+decode only",
                 *time_runs(lambda: programs(mode), repeats)))
    return rows, toks

  return run


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--batch", type=int, default=16)
  ap.add_argument("--prompt", type=int, default=16)
  ap.add_argument("--new", type=int, default=64)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--modes", nargs="+", default=["greedy", "sampled"],
                  choices=["greedy", "sampled"])
  ap.add_argument("--torch-threads", type=int, nargs="*", default=[1, 2],
                  help="torch thread settings for transformers (none: skip transformers)")
  args = ap.parse_args()
  import torch
  B, P, N = args.batch, args.prompt, args.new
  rng = np.random.default_rng(0)
  prompts = rng.integers(3, VOCAB, size=(B, P)).astype(np.int32)
  mask = np.ones((B, P), bool)

  with tempfile.TemporaryDirectory() as tmp:
    hf_model = build_checkpoint(tmp)
    model, config = from_pretrained(tmp)
    tunix_run = tunix_side(tmp, prompts, N, args.repeats)

  sampler = sampling.Sampler(model, pad_id=PAD, stop_tokens=(EOS,))
  state = nnx.state(model)
  graphdef, _ = nnx.split(model)
  ids = torch.tensor(prompts, dtype=torch.long)
  am = torch.ones_like(ids)
  toks = B * N
  load0 = os.getloadavg()[0]
  summary = []

  for mode in args.modes:
    kw = dict(SAMPLED) if mode == "sampled" else dict(temperature=0.0)
    calls = [0]

    def ours():
      calls[0] += 1
      out = sampler(state, prompt_tokens=prompts, prompt_mask=mask,
                    key=jax.random.key(calls[0]), max_new_tokens=N, min_new_tokens=N, **kw)
      jax.block_until_ready(out.tokens)
      return out

    t0 = time.perf_counter()
    out = ours()
    compile_s = time.perf_counter() - t0
    assert int(out.response_mask.sum()) == B * N
    our_tokens = np.asarray(out.tokens)[:, P:P + N]
    rows = [("credit Sampler (jax, jit)", *time_runs(ours, args.repeats))]

    # Prefill alone (same jitted building block), to split prefill vs decode.
    params = sampling.sampling_params(stop_tokens=(EOS,), min_new_tokens=N, vocab_size=VOCAB,
                                      **kw)

    @jax.jit
    def prefill_only(st, toks_, msk, key):
      m = nnx.merge(graphdef, st)
      s = sampling.prefill(m, prompt_tokens=toks_, prompt_mask=msk, key=key, max_new_tokens=N,
                           max_new_B=jnp.full((B,), N, jnp.int32), params=params, pad_id=PAD)
      return s.tokens_BL
    pre = lambda: jax.block_until_ready(prefill_only(state, prompts, mask, jax.random.key(0)))
    pre()
    pre_best = time_runs(pre, args.repeats)[0]

    agree = {}
    if tunix_run is None:
      rows.append(("Tunix", None, None, None))
    else:
      trows, ttoks = tunix_run(mode)
      rows += trows
      agree["Tunix"] = float(np.mean(ttoks == our_tokens))

    def hf():
      gen = dict(do_sample=True, **SAMPLED) if mode == "sampled" else dict(do_sample=False)
      with torch.no_grad():
        o = hf_model.generate(ids, attention_mask=am, max_new_tokens=N, min_new_tokens=N,
                              pad_token_id=PAD, eos_token_id=EOS, **gen)
      assert o.shape == (B, P + N)
      return o

    hf_rows = []
    for threads in args.torch_threads:  # torch under CPU contention can prefer fewer threads
      torch.set_num_threads(threads)
      o = hf()
      hf_rows.append((f"transformers generate ({threads} thr)", *time_runs(hf, args.repeats)))
      agree["transformers"] = float(np.mean(o[:, P:].numpy() == our_tokens))
    rows += hf_rows

    print(f"\n[{mode}] B={B} prompt={P} new={N} {kw}; jax {jax.__version__} on "
          f"{jax.devices()[0].platform}, torch {torch.__version__}; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'sampler':36s} {'best s':>8s} {'median s':>9s} {'cpu s':>7s} {'tok/s best':>11s} "
          f"{'tok/s med':>10s} {'ours x':>7s}")
    ob, om, oc = rows[0][1:]
    for name, b, m, c in rows:
      if b is None:
        print(f"{name:36s} skipped: google-tunix not installed")
        continue
      print(f"{name:36s} {b:8.3f} {m:9.3f} {c:7.3f} {toks / b:11.0f} {toks / m:10.0f} "
            f"{b / ob:7.2f}")
    for peer, prefix in (("Tunix", "Tunix Sampler"), ("Tunix programs", "Tunix jitted"),
                         ("transformers", "transformers")):
      cand = [r for r in rows if r[0].startswith(prefix) and r[1] is not None]
      if cand:
        b = min(r[1] for r in cand)
        m = min(r[2] for r in cand)
        c = min(r[3] for r in cand)
        summary.append((mode, peer, b / ob, m / om, c / oc))
        print(f"ratio credit/{peer}: best {b / ob:.2f}x, median {m / om:.2f}x, "
              f"CPU time {c / oc:.2f}x")
    if mode == "greedy":
      for peer, frac in agree.items():
        print(f"greedy tokens equal to ours: {peer} {frac:.1%}")
    print(f"ours: first call incl. compile {compile_s:.2f} s; prefill alone {pre_best * 1e3:.1f} ms;"
          f" decode ≈ {(ob - pre_best) * 1e3 / (N - 1):.2f} ms/step "
          f"({B * (N - 1) / (ob - pre_best):.0f} tok/s)")
  print(f"\nload average {load0:.1f} (start) -> {os.getloadavg()[0]:.1f} (end)")
  for mode, peer, rb, rm, rc in summary:
    print(f"summary [{mode}] credit/{peer}: {rb:.2f}x best wall, {rm:.2f}x median wall, "
          f"{rc:.2f}x CPU time")


if __name__ == "__main__":
  main()
