"""Tests for credit.divergences: chunked vs full-logits vs numpy, properties, top-k buckets."""
import functools

import chex
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized
from flax import nnx

from credit import divergences, scoring
from credit.models import Decoder, tiny_config

B, T, V, DS, DT = 2, 16, 1000, 32, 24
KINDS = divergences.list_divergences()


def _np_divergence(p, q, kind, beta=0.5):
  """float64 numpy reference for one pair of distributions p = student, q = teacher."""
  p = np.asarray(p, np.float64)
  q = np.asarray(q, np.float64)

  def kl(a, b):
    nz = a > 0
    return float(np.sum(a[nz] * np.log(a[nz] / b[nz])))

  if kind == "forward_kl":
    return kl(q, p)
  if kind == "reverse_kl":
    return kl(p, q)
  if kind == "js":
    m = beta * q + (1 - beta) * p
    return beta * kl(q, m) + (1 - beta) * kl(p, m)
  if kind == "hellinger":
    return 0.5 * float(np.sum((np.sqrt(p) - np.sqrt(q)) ** 2))
  if kind == "tv":
    return 0.5 * float(np.sum(np.abs(p - q)))
  raise ValueError(kind)


def _softmax64(z):
  z = np.asarray(z, np.float64)
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _inputs(seed=0):
  k = jax.random.split(jax.random.PRNGKey(seed), 5)
  hs = jax.random.normal(k[0], (B, T, DS))
  ws = jax.random.normal(k[1], (DS, V)) * 0.4
  ht = jax.random.normal(k[2], (B, T, DT))
  wt = jax.random.normal(k[3], (DT, V)) * 0.4
  g = jax.random.normal(k[4], (B, T))
  return hs, ws, ht, wt, g


class WorkedExamplesTest(parameterized.TestCase):

  def test_methods_md_examples(self):
    # methods/distill_and_structure.md A1: reverse KL of p_s=[.6,.3,.1] vs p_t=[.5,.4,.1].
    s = jnp.log(jnp.array([0.6, 0.3, 0.1]))
    t = jnp.log(jnp.array([0.5, 0.4, 0.1]))
    self.assertAlmostEqual(
        float(divergences.divergence_from_logprobs(s, t, kind="reverse_kl")), 0.0230883, 6)
    # A11 (SD-Search): JSD of p=[.7,.2,.1], q=[.2,.5,.3] = 0.132918 (symmetric β = 0.5).
    p = jnp.log(jnp.array([0.7, 0.2, 0.1]))
    q = jnp.log(jnp.array([0.2, 0.5, 0.3]))
    self.assertAlmostEqual(float(divergences.divergence_from_logprobs(p, q, kind="js")),
                           0.132918, 6)
    self.assertAlmostEqual(float(divergences.divergence_from_logprobs(q, p, kind="js")),
                           0.132918, 6)

  def test_hellinger_conventions(self):
    p = jnp.log(jnp.array([1.0, 0.0]) + 1e-30)
    q = jnp.log(jnp.array([0.0, 1.0]) + 1e-30)
    self.assertAlmostEqual(float(divergences.divergence_from_logprobs(p, q, kind="hellinger")),
                           1.0, 6)
    p = jnp.log(jnp.array([0.5, 0.5]))
    q = jnp.log(jnp.array([0.9, 0.1]))
    h2 = 1 - (np.sqrt(0.45) + np.sqrt(0.05))
    self.assertAlmostEqual(float(divergences.divergence_from_logprobs(p, q, kind="hellinger")),
                           h2, 6)
    self.assertAlmostEqual(float(divergences.divergence_from_logprobs(
        p, q, kind="hellinger", squared=False)), np.sqrt(h2), 6)

  def test_unknown_kind(self):
    with self.assertRaises(ValueError):
      divergences.divergence_from_logprobs(jnp.zeros(3), jnp.zeros(3), kind="kl")


class FromLogitsTest(parameterized.TestCase):

  @hypothesis.given(scale=st.floats(0.05, 8.0), beta=st.floats(0.0, 1.0),
                    seed=st.integers(0, 2**16))
  @hypothesis.settings(max_examples=15)
  def test_matches_numpy_and_properties(self, scale, beta, seed):
    rng = np.random.default_rng(seed)
    zs = rng.normal(size=(4, 7)) * scale
    zt = rng.normal(size=(4, 7)) * scale
    got = _all_kinds(jnp.asarray(zs, jnp.float32), jnp.asarray(zt, jnp.float32), beta)
    same = _all_kinds(jnp.asarray(zs, jnp.float32), jnp.asarray(zs, jnp.float32), beta)
    swap = _all_kinds(jnp.asarray(zt, jnp.float32), jnp.asarray(zs, jnp.float32), beta)
    p, q = _softmax64(zs), _softmax64(zt)
    for kind in KINDS:
      want = [_np_divergence(p[i], q[i], kind, beta) for i in range(4)]
      np.testing.assert_allclose(got[kind], want, atol=1e-5, rtol=1e-4, err_msg=kind)
      np.testing.assert_allclose(same[kind], 0.0, atol=1e-6, err_msg=kind)  # D(p, p) = 0
      self.assertTrue(bool(jnp.all(got[kind] >= -1e-6)), kind)
    # Symmetric kinds; forward and reverse KL swap roles.
    for kind in ("hellinger", "tv"):
      np.testing.assert_allclose(got[kind], swap[kind], atol=1e-6)
    np.testing.assert_allclose(got["forward_kl"], swap["reverse_kl"], atol=1e-5, rtol=1e-5)
    self.assertTrue(bool(jnp.all(got["hellinger"] <= 1 + 1e-6)))
    self.assertTrue(bool(jnp.all(got["tv"] <= 1 + 1e-6)))

  @hypothesis.given(scale=st.floats(0.05, 30.0), seed=st.integers(0, 2**16))
  @hypothesis.settings(max_examples=15)
  def test_js_symmetric_and_bounded(self, scale, seed):
    rng = np.random.default_rng(seed)
    zs = jnp.asarray(rng.normal(size=(4, 7)) * scale, jnp.float32)
    zt = jnp.asarray(rng.normal(size=(4, 7)) * scale, jnp.float32)
    a = _all_kinds(zs, zt, 0.5)["js"]
    b = _all_kinds(zt, zs, 0.5)["js"]
    np.testing.assert_allclose(a, b, atol=1e-6)
    self.assertTrue(bool(jnp.all(a <= np.log(2) + 1e-6)))
    self.assertTrue(bool(jnp.all(a >= -1e-7)))

  def test_disjoint_support_js_is_log2(self):
    zs = jnp.array([[60.0, -60.0]])
    zt = jnp.array([[-60.0, 60.0]])
    got = divergences.divergence_from_logits(zs, zt, kind="js")
    np.testing.assert_allclose(got, np.log(2), rtol=1e-6)
    g = jax.grad(lambda z: jnp.sum(divergences.divergence_from_logits(z, zt, kind="js")))(zs)
    self.assertTrue(bool(jnp.all(jnp.isfinite(g))))

  def test_teacher_gets_no_gradient_by_default(self):
    zs = jnp.array([[0.3, -1.0, 2.0]])
    zt = jnp.array([[1.0, 0.5, -0.5]])
    for kind in KINDS:
      f = lambda a, b, stop: jnp.sum(divergences.divergence_from_logits(
          a, b, kind=kind, stop_teacher_gradient=stop))
      gs, gt = jax.grad(f, argnums=(0, 1))(zs, zt, True)
      np.testing.assert_array_equal(gt, 0.0)
      self.assertGreater(float(jnp.max(jnp.abs(gs))), 0.0)
      _, gt2 = jax.grad(f, argnums=(0, 1))(zs, zt, False)
      self.assertGreater(float(jnp.max(jnp.abs(gt2))), 0.0)


@jax.jit
def _all_kinds(zs, zt, beta):
  return {k: divergences.divergence_from_logits(zs, zt, kind=k, beta=beta) for k in KINDS}


class TokenDivergenceTest(parameterized.TestCase):

  @parameterized.parameters((5, None), (4, 300))
  def test_chunked_matches_full_logits(self, chunk, vchunk):
    hs, ws, ht, wt, g = _inputs()
    mask = jnp.arange(T)[None, :] < jnp.array([[T], [11]])
    got, got_g, want, want_g = _chunked_and_full(hs, ws, ht, wt, g, mask, chunk, vchunk)
    for kind in KINDS:
      np.testing.assert_allclose(got[kind], want[kind], atol=2e-5, rtol=1e-4, err_msg=kind)
      np.testing.assert_array_equal(np.asarray(got[kind])[1, 11:], 0.0)
      for a, b in zip(got_g[kind], want_g[kind]):
        err = float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
        self.assertLess(err, 1e-4, msg=kind)

  def test_numpy_reference_and_teacher_temperature(self):
    hs, ws, ht, wt, _ = _inputs(1)
    got = jax.jit(functools.partial(divergences.token_divergence, kind="forward_kl",
                                    chunk_size=6, temperature=0.7,
                                    teacher_temperature=1.6))(hs, ws, ht, wt)
    p = _softmax64(np.einsum("btd,dv->btv", hs, ws) / 0.7)
    q = _softmax64(np.einsum("btd,dv->btv", ht, wt) / 1.6)
    want = [[_np_divergence(p[b, t], q[b, t], "forward_kl") for t in range(T)] for b in range(B)]
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)

  @chex.variants(with_jit=True, without_jit=True)
  def test_jit_and_eager_agree(self):
    hs, ws, ht, wt, _ = _inputs(2)
    fn = self.variant(functools.partial(divergences.token_divergence, kind="js", chunk_size=7))
    want = divergences.divergence_from_logits(hs @ ws, ht @ wt, kind="js")
    np.testing.assert_allclose(fn(hs, ws, ht, wt), want, atol=2e-6)

  def test_fwd_bwd_memory(self):
    b, t, v, d = 2, 512, 32000, 64
    sds = jax.ShapeDtypeStruct
    args = (sds((b, t, d), jnp.float32), sds((d, v), jnp.float32),
            sds((b, t, d), jnp.float32), sds((d, v), jnp.float32))
    btv4 = b * t * v * 4

    def temp(fn):
      g = jax.jit(jax.grad(lambda a, b_, c, d_: jnp.sum(fn(a, b_, c, d_)), argnums=(0, 1)))
      return g.lower(*args).compile().memory_analysis().temp_size_in_bytes

    naive = temp(lambda hs, ws, ht, wt: divergences.divergence_from_logits(
        hs @ ws, ht @ wt, kind="reverse_kl"))
    chunked = temp(functools.partial(divergences.token_divergence, kind="reverse_kl",
                                     chunk_size=32))
    self.assertGreater(naive, btv4)
    self.assertLess(chunked, btv4 / 3)


@functools.partial(jax.jit, static_argnames=("chunk", "vchunk"))
def _chunked_and_full(hs, ws, ht, wt, g, mask, chunk, vchunk):
  """All kinds: chunked token_divergence vs divergence_from_logits on full logits."""
  got, got_g, want, want_g = {}, {}, {}, {}
  for kind in KINDS:
    beta = 0.3 if kind == "js" else 0.5
    f = lambda a, b, kind=kind, beta=beta: divergences.token_divergence(
        a, b, ht, wt, kind=kind, beta=beta, mask_BT=mask, chunk_size=chunk,
        vocab_chunk_size=vchunk, temperature=0.9)
    r = lambda a, b, kind=kind, beta=beta: divergences.divergence_from_logits(
        jnp.einsum("btd,dv->btv", a, b), jnp.einsum("btd,dv->btv", ht, wt), kind=kind,
        beta=beta, mask=mask, temperature=0.9)
    got[kind] = f(hs, ws)
    want[kind] = r(hs, ws)
    got_g[kind] = jax.grad(lambda a, b: jnp.sum(f(a, b) * g), argnums=(0, 1))(hs, ws)
    want_g[kind] = jax.grad(lambda a, b: jnp.sum(r(a, b) * g), argnums=(0, 1))(hs, ws)
  return got, got_g, want, want_g


class TopKDivergenceTest(parameterized.TestCase):

  def test_full_vocabulary_with_tail_equals_full_divergence(self):
    rng = np.random.default_rng(0)
    zs = jnp.asarray(rng.normal(size=(3, 9)), jnp.float32)
    zt = jnp.asarray(rng.normal(size=(3, 9)), jnp.float32)
    lp_s, lp_t = jax.nn.log_softmax(zs), jax.nn.log_softmax(zt)
    got = _topk_all(lp_s, lp_t)["bucket"]
    want = _all_kinds(zs, zt, 0.5)
    for kind in KINDS:
      np.testing.assert_allclose(got[kind], want[kind], atol=1e-6, err_msg=kind)

  @hypothesis.given(seed=st.integers(0, 2**16), k=st.integers(1, 6))
  @hypothesis.settings(max_examples=15)
  def test_buckets_numpy_and_lower_bound(self, seed, k):
    rng = np.random.default_rng(seed)
    zs = rng.normal(size=(2, 8)) * 2
    zt = rng.normal(size=(2, 8)) * 2
    p, q = _softmax64(zs), _softmax64(zt)
    ids = np.argsort(-q, axis=-1, kind="stable")[:, :k]  # teacher's top-k set
    ps = np.take_along_axis(p, ids, -1)
    qs = np.take_along_axis(q, ids, -1)
    got = _topk_all(jnp.asarray(np.log(ps), jnp.float32), jnp.asarray(np.log(qs), jnp.float32))
    for kind in KINDS:
      pb = np.concatenate([ps, np.maximum(1 - ps.sum(-1, keepdims=True), 1e-8)], -1)
      qb = np.concatenate([qs, np.maximum(1 - qs.sum(-1, keepdims=True), 1e-8)], -1)
      want = [_np_divergence(pb[i], qb[i], kind) for i in range(2)]
      np.testing.assert_allclose(got["bucket"][kind], want, atol=2e-5, rtol=1e-4, err_msg=kind)
      pr, qr = ps / ps.sum(-1, keepdims=True), qs / qs.sum(-1, keepdims=True)
      want_r = [_np_divergence(pr[i], qr[i], kind) for i in range(2)]
      np.testing.assert_allclose(got["renormalize"][kind], want_r, atol=2e-5, rtol=1e-4)
      full = [_np_divergence(p[i], q[i], kind) for i in range(2)]
      # Coarsening (K ids + tail) can only lose information: D(buckets) <= D(full).
      self.assertTrue(np.all(np.asarray(got["bucket"][kind]) <= np.asarray(full) + 1e-5), kind)

  def test_chunked_topk_pipeline_and_gradient(self):
    """token_topk (teacher) + token_logprobs on its ids (student) == full-logits buckets."""
    hs, ws, ht, wt, g = _inputs(3)
    k = 8

    # The teacher's arrays are jit arguments, not closed-over constants: XLA would otherwise
    # constant-fold the teacher's [B,T,V] top-k sort at compile time (~12 s per program).
    def pipeline(hs, ws, ht, wt):
      top = scoring.token_topk(ht, wt, k, chunk_size=5, vocab_chunk_size=300)
      lp_s = scoring.token_logprobs(hs, ws, top.ids, chunk_size=5, vocab_chunk_size=300)
      return divergences.topk_divergence(logprob_student=lp_s, logprob_teacher=top.logprob,
                                         kind="reverse_kl")

    def naive(hs, ws, ht, wt):
      lp_s = jax.nn.log_softmax(jnp.einsum("btd,dv->btv", hs, ws))
      lp_t = jax.nn.log_softmax(jnp.einsum("btd,dv->btv", ht, wt))
      vals, ids = jax.lax.top_k(lp_t, k)
      return divergences.topk_divergence(
          logprob_student=jnp.take_along_axis(lp_s, ids, -1), logprob_teacher=vals,
          kind="reverse_kl")

    @jax.jit
    def value_and_grads(hs, ws, ht, wt, g):
      # The gradient of sum(f * g) w.r.t. (hs, ws) is the VJP of f with cotangent g.
      out = {}
      for name, f in (("got", pipeline), ("want", naive)):
        val, vjp = jax.vjp(lambda a, b, f=f: f(a, b, ht, wt), hs, ws)
        out[name] = (val, vjp(g))
      return out

    out = value_and_grads(hs, ws, ht, wt, g)
    (got, got_g), (want, want_g) = out["got"], out["want"]
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)
    for a, b in zip(got_g, want_g):
      self.assertLess(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))), 1e-4)

  def test_all_mass_in_topk_is_finite(self):
    lp = jnp.log(jnp.array([[0.5, 0.5]]))
    lq = jnp.log(jnp.array([[0.9, 0.1]]))

    @jax.jit
    def values_and_grads(lp):
      out = {}
      for kind in KINDS:
        f = lambda a, kind=kind: jnp.sum(divergences.topk_divergence(
            logprob_student=a, logprob_teacher=lq, kind=kind))
        out[kind] = (f(lp), jax.grad(f)(lp))
      return out

    for kind, (val, grad) in values_and_grads(lp).items():
      self.assertTrue(bool(jnp.isfinite(val)), kind)
      self.assertTrue(bool(jnp.all(jnp.isfinite(grad))), kind)


@jax.jit
def _topk_all(lp_s, lp_t):
  return {tail: {kind: divergences.topk_divergence(logprob_student=lp_s, logprob_teacher=lp_t,
                                                   kind=kind, tail=tail) for kind in KINDS}
          for tail in ("bucket", "renormalize")}


class ModelDivergenceTest(parameterized.TestCase):

  def test_matches_full_logits_and_teacher_context(self):
    student = Decoder(tiny_config("llama"), rngs=nnx.Rngs(0))
    teacher = Decoder(tiny_config("llama"), rngs=nnx.Rngs(1))
    v = student.config.vocab_size
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 9), 0, v)
    mask = jnp.arange(9)[None, :] < jnp.array([[9], [6]])
    ctx = jax.random.randint(jax.random.PRNGKey(2), (2, 4), 0, v)

    # Inputs are jit arguments (not folded constants) and the full-logits references are
    # computed inside the same program instead of op by op.
    @nnx.jit
    def run(student, teacher, tokens, mask, ctx):
      plain = divergences.model_divergence(student, teacher, tokens, mask, kind="js",
                                           chunk_size=4)
      with_ctx = divergences.model_divergence(student, teacher, tokens, mask, kind="js",
                                              chunk_size=4, teacher_context=ctx)
      zs, _ = student(tokens, mask_BT=mask)
      zt, _ = teacher(tokens, mask_BT=mask)
      zt_ctx, _ = teacher(jnp.concatenate([ctx, tokens], 1),
                          mask_BT=jnp.concatenate([jnp.ones((2, 4), bool), mask], 1))
      # Position t compares the distributions that predict tokens[t] (logits at t − 1).
      want = divergences.divergence_from_logits(zs[:, :-1], zt[:, :-1], kind="js")
      want_ctx = divergences.divergence_from_logits(zs[:, :-1], zt_ctx[:, 4:-1], kind="js")
      return plain, with_ctx, want, want_ctx

    plain, with_ctx, want, want_ctx = run(student, teacher, tokens, mask, ctx)
    valid = np.asarray(mask) & (np.arange(9) >= 1)[None, :]
    want = np.where(valid, np.pad(np.asarray(want), ((0, 0), (1, 0))), 0.0)
    np.testing.assert_allclose(plain, want, atol=1e-5)
    want_ctx = np.where(valid, np.pad(np.asarray(want_ctx), ((0, 0), (1, 0))), 0.0)
    np.testing.assert_allclose(with_ctx, want_ctx, atol=1e-5)
    self.assertGreater(float(jnp.max(jnp.abs(with_ctx - plain))), 1e-4)


if __name__ == "__main__":
  from absl.testing import absltest
  absltest.main()
