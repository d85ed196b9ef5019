"""Cost of the distillation passes against the policy's own scoring pass, per RL step.

The default arithmetic recipes' shapes: B = 32 prompts x 8 samples, prompts of P = 9 tokens
(bos + "12+345=") and responses of R = 4, the student of `grpo_arithmetic.py` (width 128, 2
layers) and the teacher of `sft_teacher_arithmetic.py` (width 192, 3 layers), random weights.
Rows (forward only unless noted, no gradient):

  policy pass       the student scores its tokens: log-prob + entropy (`policy_pass`)
  teacher k=0       the frozen teacher's log-prob of each sampled token (`teacher_pass`)
  teacher k=16      the same plus its top-16 distribution with a tail bucket
  self-teacher      the student re-scores its tokens after a privileged context of C extra
                    prompt tokens (`self_teacher_pass`, `--config.teacher.context=answer`;
                    SIPO's alt-context passes cost the same each)
  update fwd+bwd    the policy loss's own pass with gradient (the update's main cost)
  update + top-16   the same pass also scoring the teacher's 16 ids (`topk_distill`)

Columns: median ms of --repeats calls after a compile, and the ratio to "policy pass" in the
same run.

With `--real`, the same rows at a real vocabulary: the student has Qwen3-0.6B's shapes and the
teacher Qwen3-1.7B's (`credit.models.preset`: V = 151,936, widths 1024 and 2048, tied
embeddings), each cut to `--layers` blocks (the unembedding, which a real vocabulary makes the
largest matmul of a short sequence, is whole), B = `--batch` rows of P = R = 16 tokens.

  python benchmarks/teacher.py [--batch 256] [--context 24] [--repeats 5]
  python benchmarks/teacher.py --real [--batch 16] [--layers 2] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
from flax import nnx

from credit import scoring
from credit import parallel
from credit.models import Decoder, preset
from credit.models.config import tiny_config
from credit.tasks import CharTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import timed  # noqa: E402

P, R = 9, 4


def model(width: int, layers: int, heads: int) -> Decoder:
  cfg = tiny_config("qwen3", vocab_size=CharTokenizer().vocab_size, hidden_size=width,
                    intermediate_size=4 * width, num_layers=layers, num_heads=heads,
                    num_kv_heads=2, head_dim=32)
  return Decoder(cfg, rngs=nnx.Rngs(0))


def real_models(layers: int) -> tuple[Decoder, Decoder]:
  """Student and teacher of Qwen3-0.6B's and Qwen3-1.7B's shapes, `layers` blocks each,
  initialised by one jitted program each (eager init of a 151,936-row table is slow)."""
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from experiments.producers.base import init_policy
  mesh = parallel.make_mesh("data=1")
  return tuple(init_policy(preset(name, num_layers=layers), mesh, seed)
               for seed, name in enumerate(("qwen3-0.6b", "qwen3-1.7b")))


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--batch", type=int, default=0, help="rows (default 256; --real: 16)")
  ap.add_argument("--context", type=int, default=24)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--real", action="store_true",
                  help="Qwen3-0.6B student, Qwen3-1.7B teacher, V = 151,936")
  ap.add_argument("--layers", type=int, default=2, help="--real: blocks of each model")
  a = ap.parse_args()
  global P, R
  if a.real:
    P, R = 16, 16
    student, teacher = real_models(a.layers)
    V = student.config.vocab_size
    batch = a.batch or 16
    shapes = (f"student Qwen3-0.6B shapes, teacher Qwen3-1.7B shapes, {a.layers} blocks each")
  else:
    V = CharTokenizer().vocab_size
    batch = a.batch or 256
    student, teacher = model(128, 2, 4), model(192, 3, 6)
    shapes = "student 128x2, teacher 192x3"
  key = jax.random.PRNGKey(0)
  tokens = jax.random.randint(key, (batch, P + R), 3, V)
  mask = jnp.ones(tokens.shape, bool)
  ctx_tokens = jax.random.randint(key, (batch, P + a.context + R), 3, V)
  ctx_mask = jnp.ones(ctx_tokens.shape, bool)
  s_def, s_par = nnx.split(student)
  t_def, t_par = nnx.split(teacher)

  def hidden(graphdef, params, toks, m):
    return scoring.model_hidden(nnx.merge(graphdef, params), toks, m)

  @jax.jit
  def policy_pass(params, toks, m):
    h, w, m = hidden(s_def, params, toks, m)
    return scoring.score_hidden(h, w, toks, m)

  def teacher_pass(k):
    @jax.jit
    def run(params, toks, m):
      h, w, m = hidden(t_def, params, toks, m)
      return scoring.teacher_scores_hidden(h, w, toks, m, top_k=k)
    return run

  @jax.jit
  def self_teacher(params, toks, m):
    h, w, m = hidden(s_def, params, toks, m)
    return scoring.teacher_scores_hidden(h, w, toks, m).logprob


  def update(with_topk):
    def loss(params):
      h, w, m = hidden(s_def, params, tokens, mask)
      if with_topk:
        (lp, _), cand = scoring.candidate_scores_hidden(h, w, tokens, m, ids)
        return jnp.sum(lp) + jnp.sum(cand)
      return jnp.sum(scoring.score_hidden(h, w, tokens, m).logprob)
    return jax.jit(jax.grad(loss))

  teacher0, teacher16 = teacher_pass(0), teacher_pass(16)
  ids = teacher16(t_par, tokens, mask).topk_ids
  rows = [
      ("policy pass", lambda: policy_pass(s_par, tokens, mask)),
      ("teacher k=0", lambda: teacher0(t_par, tokens, mask)),
      ("teacher k=16", lambda: teacher16(t_par, tokens, mask)),
      (f"self-teacher (+{a.context} prompt tokens)",
       lambda: self_teacher(s_par, ctx_tokens, ctx_mask)),
      ("update fwd+bwd", lambda f=update(False): f(s_par)),
      ("update + top-16", lambda f=update(True): f(s_par)),
  ]
  print(f"B={batch}, P={P}, R={R}, V={V}; {shapes}; {jax.devices()[0].platform}, "
        f"load {os.getloadavg()[0]:.1f}")
  print(f"{'pass':38s} {'ms':>8s} {'x policy':>9s}")
  base = None
  for name, fn in rows:
    _, med = timed(fn, a.repeats)
    base = base or med
    print(f"{name:38s} {1e3 * med:8.2f} {med / base:9.2f}")


if __name__ == "__main__":
  main()
