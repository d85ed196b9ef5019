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

Tunix (PyPI `google-tunix`) is optional: without it its rows print "skipped: google-tunix not
installed". It cannot share this project's environment (it pins safetensors < 0.8, which the
transformers version pinned here does not accept); install it into a separate environment with
this project's jax/flax/numpy versions (docs/performance.md gives the commands).

Also prints our prefill time alone, so decode tokens/s can be read off, and per call the
median number of voluntary context switches of the process (thread hand-offs, each of which
can wait for the scheduler on a loaded machine). `--breakdown` profiles one decode loop of ours
and one of Tunix (`jax.profiler`, XLA:CPU's per-op events) and prints the time per step in each
kind of op (weight matmuls, attention, KV-cache writes and copies, the sampling head over the
vocabulary, the rest), classified from the loops' optimized HLO. For comparable CPU and wall
times on a shared machine, pin the process and XLA to one core:
`taskset -c 1 env XLA_FLAGS="--xla_cpu_multi_thread_eigen=false" python benchmarks/sampling.py`.

  python benchmarks/sampling.py [--repeats 5] [--batch 16] [--new 64] [--modes greedy sampled]
                                [--torch-threads 1 2] [--breakdown]
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import resource
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
  """(best wall, median wall, best process CPU seconds, median voluntary context switches)
  over `repeats` calls. A voluntary switch is a thread of the process going to sleep to wait
  (for another thread's result, or for work in XLA's thread pool): under CPU contention each
  one can cost a scheduling delay that shows in wall time and not in CPU time."""
  walls, cpus, switches = [], [], []
  for _ in range(repeats):
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    walls.append(time.perf_counter() - t0)
    cpus.append(time.process_time() - c0)
    switches.append(resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - r0)
  return min(walls), statistics.median(walls), min(cpus), statistics.median(switches)


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

  def prefilled(mode):  # Tunix's jitted prefill from a prepared state
    calls[0] += 1
    smp.eos_ids = jnp.array([EOS])
    kw = kwargs(mode)
    state = smp.init_sample_state(
        jnp.asarray(prompts), total_sampling_steps=P + new, include_logits=False,
        forbidden_token_ids=(EOS,), temperature=kw.get("temperature", 0.0),
        top_p=kw.get("top_p"), top_k=kw.get("top_k"), seed=jax.random.PRNGKey(calls[0]),
        beam_size=None)
    return smp._compiled_prefill_fn(smp._flattened_transformer_state, state, None, echo=False)

  def decode(state):  # Tunix's jitted decode loop (donates its state)
    return smp._compiled_decode_fn(smp._flattened_transformer_state, state)

  def programs(mode):  # the jitted prefill + decode loop alone, from a prepared state
    state = decode(prefilled(mode))
    return np.asarray(jax.block_until_ready(state.token_buffer))[:, P:]

  def run(mode):
    toks = public(mode)   # compile + warm-up
    assert toks.shape == (B, new), toks.shape
    rows = [("Tunix Sampler.__call__", *time_runs(lambda: public(mode), repeats))]
    programs(mode)
    rows.append(("Tunix jitted prefill+decode only",
                 *time_runs(lambda: programs(mode), repeats)))
    return rows, toks

  def loop(mode):
    """(prepare a prefilled state, decode loop, its optimized HLO text) for `step_breakdown`."""
    prep = lambda: jax.block_until_ready(prefilled(mode))
    hlo = jax.jit(smp._decode_fn, donate_argnums=1).lower(
        smp._flattened_transformer_state, prep()).compile().as_text()
    return prep, decode, hlo

  run.loop = loop
  return run


# What each compiled op of a decode step is, from its optimized HLO: the einsum (op name) of a
# dot, and for other ops whether they touch [B,V] arrays or the KV cache.
_DOT_KINDS = (("unembedding matmul", ("BTD,DV->BTV",)),
              ("MLP matmuls", ("BTD,DF->BTF", "BTF,FD->BTD", "feed_forward/")),
              ("q/k/v/o projections", ("DNH->", "DKH->", "NHD->")),
              ("attention (scores, weighted sum)", ("BKGTS", "BTKGH", "BHGTS", "BTHGD")))
_BREAKDOWN_ORDER = [k for k, _ in _DOT_KINDS] + [
    "sampling / log-probs ([B,V] ops)", "KV cache writes and copies",
    "other ops (norms, RoPE, softmax, masks, loop state)"]


def _op_kinds(hlo: str, vocab: int, cache_dims: tuple[int, int]) -> dict[str, str]:
  """Instruction name -> category, for every instruction of every computation of `hlo`."""
  params = {}  # computation name -> its parameter list text
  for m in re.finditer(r"^(?:ENTRY )?%([\w.\-]+) \((.*?)\) -> ", hlo, re.M):
    params[m.group(1)] = m.group(2)
  kinds = {}
  for m in re.finditer(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*)$", hlo, re.M):
    name, rest = m.groups()
    op = re.search(r'op_name="([^"]*)"', rest)
    op = op.group(1) if op else ""
    calls = re.search(r"calls=%([\w.\-]+)", rest)
    shapes = rest.split(" metadata=")[0] + (params.get(calls.group(1), "") if calls else "")
    kind = None
    if "dot_general" in op:
      kind = next((k for k, keys in _DOT_KINDS if any(x in op for x in keys)), None)
    if kind is None:
      slots, head = cache_dims
      if re.search(rf"\b{vocab}\b", shapes):
        kind = "sampling / log-probs ([B,V] ops)"
      elif re.search(rf"\b{slots}\b", shapes) and re.search(rf"\b{head}\b", shapes) and (
          "dynamic-update-slice" in rest or "dynamic_update_slice" in op or "copy" in name
          or "transpose" in name or "slice" in name):
        kind = "KV cache writes and copies"
      else:
        kind = "other ops (norms, RoPE, softmax, masks, loop state)"
    kinds[name] = kind
  return kinds


def step_breakdown(prep, decode, hlo: str, *, steps: int, vocab: int, cache_dims, calls: int = 3
                   ) -> dict[str, float]:
  """Per decode step, milliseconds of wall time in each category of op, from a `jax.profiler`
  trace of `calls` runs of the compiled decode loop (XLA:CPU records one event per executed
  op; control flow ops are not counted, their contents are)."""
  kinds = _op_kinds(hlo, vocab, cache_dims)
  states = [prep() for _ in range(calls)]
  with tempfile.TemporaryDirectory() as tmp:
    with jax.profiler.trace(tmp, create_perfetto_trace=True):
      for st in states:
        jax.block_until_ready(decode(st))
    with gzip.open(glob.glob(os.path.join(tmp, "**", "*.json.gz"), recursive=True)[0]) as f:
      trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  per = collections.Counter()
  for e in events:
    name = e.get("name", "")
    if (e.get("ph") == "X" and name in kinds
        and not name.startswith(("while", "cond", "conditional", "call"))):
      per[kinds[name]] += e["dur"]
  return {k: per[k] / (calls * steps) / 1e3 for k in _BREAKDOWN_ORDER}


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
  ap.add_argument("--breakdown", action="store_true",
                  help="also profile one decode loop of ours and of Tunix and print the time "
                       "per step in each kind of op (step_breakdown)")
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

    # Prefill alone and the decode loop alone (the same building blocks as the sampler's
    # program), to split prefill from decode and to profile the decode loop.
    params = sampling.sampling_params(stop_tokens=(EOS,), min_new_tokens=N, vocab_size=VOCAB,
                                      **kw)

    def prefill_state(st, toks_, msk, key):
      m = nnx.merge(graphdef, st)
      return sampling.prefill(m, prompt_tokens=toks_, prompt_mask=msk, key=key, max_new_tokens=N,
                              max_new_B=jnp.full((B,), N, jnp.int32), params=params, pad_id=PAD)
    prefill_only = jax.jit(lambda *a: prefill_state(*a).tokens_BL)
    pre = lambda: jax.block_until_ready(prefill_only(state, prompts, mask, jax.random.key(0)))
    pre()
    pre_best = time_runs(pre, args.repeats)[0]

    breakdown = {}
    if args.breakdown:
      prefill_jit = jax.jit(prefill_state)
      decode_jit = jax.jit(
          lambda st, s: sampling.decode(nnx.merge(graphdef, st), s, params, max_new_tokens=N),
          donate_argnums=1)
      prep = lambda: jax.block_until_ready(
          prefill_jit(state, prompts, mask, jax.random.key(calls[0])))
      dec = lambda s: decode_jit(state, s)
      hlo = decode_jit.lower(state, prep()).compile().as_text()
      jax.block_until_ready(dec(prep()))
      cache_dims = (P + N, config.head_dim)
      breakdown["credit"] = step_breakdown(prep, dec, hlo, steps=N - 1, vocab=VOCAB,
                                           cache_dims=cache_dims)
      if tunix_run is not None:
        tprep, tdec, thlo = tunix_run.loop(mode)
        jax.block_until_ready(tdec(tprep()))
        # Tunix's loop runs `new` steps (its prefill's draw is step 0 of the buffer).
        breakdown["Tunix"] = step_breakdown(tprep, tdec, thlo, steps=N, vocab=VOCAB,
                                            cache_dims=cache_dims)

    agree = {}
    if tunix_run is None:
      rows.append(("Tunix", None, None, None, None))
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

    aff = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    print(f"\n[{mode}] B={B} prompt={P} new={N} {kw}; jax {jax.__version__} on "
          f"{jax.devices()[0].platform}, torch {torch.__version__}; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; cores allowed {aff}, nice "
          f"{os.nice(0)}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    print(f"{'sampler':36s} {'best s':>8s} {'median s':>9s} {'cpu s':>7s} {'tok/s best':>11s} "
          f"{'tok/s med':>10s} {'ours x':>7s} {'csw/call':>9s}")
    ob, om, oc, _ = rows[0][1:]
    for name, b, m, c, sw in rows:
      if b is None:
        print(f"{name:36s} skipped: google-tunix not installed")
        continue
      print(f"{name:36s} {b:8.3f} {m:9.3f} {c:7.3f} {toks / b:11.0f} {toks / m:10.0f} "
            f"{b / ob:7.2f} {sw:9.0f}")
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
    if breakdown:
      names = list(breakdown)
      print("decode step by kind of op (ms per step, wall time under jax.profiler):")
      print(f"  {'':52s}" + "".join(f"{n:>10s}" for n in names))
      for k in _BREAKDOWN_ORDER:
        print(f"  {k:52s}" + "".join(f"{breakdown[n][k]:10.3f}" for n in names))
      print(f"  {'sum of ops':52s}" + "".join(f"{sum(breakdown[n].values()):10.3f}"
                                          for n in names))
  print(f"\nload average {load0:.1f} (start) -> {os.getloadavg()[0]:.1f} (end)")
  for mode, peer, rb, rm, rc in summary:
    print(f"summary [{mode}] credit/{peer}: {rb:.2f}x best wall, {rm:.2f}x median wall, "
          f"{rc:.2f}x CPU time")


if __name__ == "__main__":
  main()
