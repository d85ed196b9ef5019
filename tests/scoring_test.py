"""Tests for credit.scoring: chunked log-probs / entropy / top-k vs full-logits references."""
import functools

import chex
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from flax import nnx

from credit import scoring
from credit.models import Decoder, tiny_config

B, T, V, D = 2, 16, 1000, 32


def _inputs(seed=0, scale=0.5):
  k = jax.random.split(jax.random.PRNGKey(seed), 5)
  h = jax.random.normal(k[0], (B, T, D))
  w = jax.random.normal(k[1], (D, V)) * scale
  y = jax.random.randint(k[2], (B, T), 0, V)
  g_lp = jax.random.normal(k[3], (B, T))
  g_ent = jax.random.normal(k[4], (B, T))
  return h, w, y, g_lp, g_ent


def _naive(h, w, y, tau=1.0):
  """Full-logits reference: log_softmax(h W / τ) gathered, and −Σ p log p."""
  lp = jax.nn.log_softmax(jnp.einsum("btd,dv->btv", h, w) / tau, axis=-1)
  return (jnp.take_along_axis(lp, y[..., None], axis=-1)[..., 0],
          -jnp.sum(jnp.exp(lp) * lp, axis=-1))


def _np_reference(h, w, y, tau=1.0):
  """Plain numpy float64 loop."""
  h, w, y = np.asarray(h, np.float64), np.asarray(w, np.float64), np.asarray(y)
  lp_out = np.zeros(y.shape)
  ent_out = np.zeros(y.shape)
  for b in range(y.shape[0]):
    for t in range(y.shape[1]):
      z = h[b, t] @ w / tau
      z = z - z.max()
      lp = z - np.log(np.exp(z).sum())
      lp_out[b, t] = lp[y[b, t]]
      ent_out[b, t] = -(np.exp(lp) * lp).sum()
  return lp_out, ent_out


def _weighted(fn, g_lp, g_ent):
  def loss(h, w, tau):
    lp, ent = fn(h, w, tau)
    return jnp.sum(lp * g_lp) + jnp.sum(ent * g_ent)
  return loss


@jax.jit
def _naive_and_grad(h, w, y, tau, g_lp, g_ent):
  """The full-logits reference and the gradient of its weighted sum, as one program shared by
  every test with the standard shapes (an eager reference compiles each primitive anew)."""
  ref = lambda h, w, tau: _naive(h, w, y, tau)
  return ref(h, w, tau), jax.grad(_weighted(ref, g_lp, g_ent), argnums=(0, 1, 2))(h, w, tau)


def _rel_err(a, b):
  return float(jnp.max(jnp.abs(a - b)) / jnp.maximum(jnp.max(jnp.abs(b)), 1e-12))


class TokenLogprobsTest(parameterized.TestCase):

  def test_matches_numpy_loop(self):
    h, w, y, _, _ = _inputs()
    out = scoring.token_logprobs_and_entropy(h, w, y, chunk_size=5, temperature=0.7)
    lp, ent = _np_reference(h, w, y, tau=0.7)
    np.testing.assert_allclose(out.logprob, lp, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(out.entropy, ent, atol=2e-5, rtol=1e-5)

  @parameterized.parameters(
      (4, None),     # divides T
      (5, None),     # remainder (T padded to 20)
      (16, None),    # one chunk
      (64, None),    # chunk larger than T
      (5, 300),      # vocab chunks with a shifted last chunk (1000 = 3·300 + 100)
      (3, 128),      # both remainders
      (8, 250),      # vocab chunks dividing V
  )
  def test_value_and_gradient_match_naive(self, chunk, vchunk):
    h, w, y, g_lp, g_ent = _inputs()
    tau = 0.7
    fn = lambda h, w, tau: tuple(scoring.token_logprobs_and_entropy(
        h, w, y, chunk_size=chunk, vocab_chunk_size=vchunk, temperature=tau))
    out = jax.jit(fn)(h, w, tau)
    want, want_g = _naive_and_grad(h, w, y, tau, g_lp, g_ent)
    np.testing.assert_allclose(out[0], want[0], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(out[1], want[1], atol=1e-5, rtol=1e-5)
    grads = jax.jit(jax.grad(_weighted(fn, g_lp, g_ent), argnums=(0, 1, 2)))(h, w, tau)
    for got, exp, name in zip(grads, want_g, ("hidden", "unembed", "temperature")):
      self.assertLess(_rel_err(got, exp), 2e-5, msg=name)

  @parameterized.parameters(None, 300)
  def test_partial_gradients(self, vchunk):
    """Unused entropy / frozen unembedding take the symbolic-zero paths; still exact."""
    h, w, y, g_lp, g_ent = _inputs(1)
    kw = dict(chunk_size=5, vocab_chunk_size=vchunk)
    # Log-prob only, gradient w.r.t. hidden only (W not perturbed, entropy cotangent zero).
    got = jax.jit(jax.grad(lambda h: jnp.sum(scoring.token_logprobs(h, w, y, **kw) * g_lp)))(h)
    _, (want, _, _) = _naive_and_grad(h, w, y, 1.0, g_lp, jnp.zeros_like(g_ent))
    self.assertLess(_rel_err(got, want), 2e-5)
    # Entropy only, gradient w.r.t. W only.
    got = jax.jit(jax.grad(lambda w: jnp.sum(
        scoring.token_logprobs_and_entropy(h, w, y, **kw).entropy * g_ent)))(w)
    _, (_, want, _) = _naive_and_grad(h, w, y, 1.0, jnp.zeros_like(g_lp), g_ent)
    self.assertLess(_rel_err(got, want), 2e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_jit_and_eager_agree(self):
    h, w, y, _, _ = _inputs(2)
    fn = self.variant(functools.partial(scoring.token_logprobs_and_entropy, chunk_size=6,
                                        vocab_chunk_size=400))
    out = fn(h, w, y)
    want = _naive(h, w, y)
    np.testing.assert_allclose(out.logprob, want[0], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(out.entropy, want[1], atol=1e-5, rtol=1e-5)

  def test_return_entropy_false(self):
    h, w, y, _, _ = _inputs()
    out = scoring.token_logprobs_and_entropy(h, w, y, chunk_size=8, return_entropy=False)
    self.assertIsNone(out.entropy)
    np.testing.assert_allclose(out.logprob, _naive(h, w, y)[0], atol=1e-5, rtol=1e-5)

  def test_k_ids_per_position(self):
    """[B,T,K] ids: log-probs of several ids per position, value and gradient."""
    h, w, _, _, _ = _inputs(3)
    ids = jax.random.randint(jax.random.PRNGKey(9), (B, T, 4), 0, V)
    g = jax.random.normal(jax.random.PRNGKey(8), (B, T, 4))

    def naive_k(h, w):
      lp = jax.nn.log_softmax(jnp.einsum("btd,dv->btv", h, w), axis=-1)
      return jnp.take_along_axis(lp, ids, axis=-1)

    for vchunk in (None, 300):
      fn = lambda h, w: scoring.token_logprobs(h, w, ids, chunk_size=5, vocab_chunk_size=vchunk)
      np.testing.assert_allclose(jax.jit(fn)(h, w), naive_k(h, w), atol=1e-5, rtol=1e-5)
      got = jax.jit(jax.grad(lambda h, w: jnp.sum(fn(h, w) * g), argnums=(0, 1)))(h, w)
      want = jax.jit(jax.grad(lambda h, w: jnp.sum(naive_k(h, w) * g), argnums=(0, 1)))(h, w)
      for a, b in zip(got, want):
        self.assertLess(_rel_err(a, b), 2e-5)

  def test_bfloat16_inputs(self):
    h, w, y, _, _ = _inputs(4)
    hb, wb = h.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    out = jax.jit(functools.partial(scoring.token_logprobs_and_entropy, chunk_size=5))(hb, wb, y)
    self.assertEqual(out.logprob.dtype, jnp.float32)
    want = jax.jit(_naive)(hb.astype(jnp.float32), wb.astype(jnp.float32), y)
    np.testing.assert_allclose(out.logprob, want[0], atol=1e-4, rtol=1e-4)
    gh, gw = jax.jit(jax.grad(
        lambda h, w: jnp.sum(scoring.token_logprobs(h, w, y, chunk_size=5)),
        argnums=(0, 1)))(hb, wb)
    self.assertEqual((gh.dtype, gw.dtype), (jnp.bfloat16, jnp.bfloat16))
    self.assertTrue(bool(jnp.all(jnp.isfinite(gh.astype(jnp.float32)))))

  @hypothesis.given(scale=st.floats(0.01, 30.0), seed=st.integers(0, 2**16))
  @hypothesis.settings(max_examples=10)
  def test_bounds_and_normalisation(self, scale, seed):
    """logprob ≤ 0, 0 ≤ entropy ≤ log V, Σ_v p(v) = 1 (all V ids scored at once)."""
    h, w, _, _, _ = _inputs(seed, scale=scale)
    ids = jnp.broadcast_to(jnp.arange(V, dtype=jnp.int32), (B, T, V))
    out = _score_all_ids(h, w, ids)
    self.assertTrue(bool(jnp.all(out.logprob <= 1e-5)))
    self.assertTrue(bool(jnp.all(out.entropy >= -1e-5)))
    self.assertTrue(bool(jnp.all(out.entropy <= np.log(V) + 1e-4)))
    np.testing.assert_allclose(jnp.sum(jnp.exp(out.logprob), axis=-1), 1.0, atol=1e-4)


class ShardingTest(parameterized.TestCase):

  def test_sharded_equals_unsharded(self):
    """Batch on 'data', vocabulary on 'tensor' (8 fake CPU devices): same values and grads."""
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((2, 4), ("data", "tensor"), axis_types=(AxisType.Auto,) * 2)
    h, w, y, g_lp, g_ent = _inputs(6)
    fn = lambda h, w: tuple(scoring.token_logprobs_and_entropy(h, w, y, chunk_size=5))
    step = jax.jit(lambda h, w: (fn(h, w), jax.grad(_weighted(
        lambda h, w, tau: fn(h, w), g_lp, g_ent), argnums=(0, 1))(h, w, 1.0)))
    want = step(h, w)
    hs = jax.device_put(h, NamedSharding(mesh, P("data", None, None)))
    ws = jax.device_put(w, NamedSharding(mesh, P(None, "tensor")))
    got = step(hs, ws)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(a, b, atol=2e-5, rtol=2e-5)


@jax.jit
def _score_all_ids(h, w, ids):
  return scoring.token_logprobs_and_entropy(h[:, :3], w, ids[:, :3], chunk_size=2,
                                            vocab_chunk_size=300)


@functools.partial(jax.jit, static_argnames="k")
def _naive_top_k(h, w, tau, k):
  return jax.lax.top_k(jax.nn.log_softmax(jnp.einsum("btd,dv->btv", h, w) / tau, axis=-1), k)


class TopKTest(parameterized.TestCase):

  @parameterized.parameters((5, None), (4, 128), (16, 999))
  def test_matches_lax_top_k(self, chunk, vchunk):
    h, w, _, _, _ = _inputs(5)
    out = jax.jit(functools.partial(scoring.token_topk, k=7, chunk_size=chunk,
                                    vocab_chunk_size=vchunk, temperature=1.5))(h, w)
    vals, ids = _naive_top_k(h, w, 1.5, 7)
    np.testing.assert_array_equal(out.ids, ids)
    np.testing.assert_allclose(out.logprob, vals, atol=1e-5, rtol=1e-5)

  def test_ties_and_validation(self):
    h = jnp.zeros((1, 2, 3))
    w = jnp.zeros((3, 10))
    out = scoring.token_topk(h, w, 3, chunk_size=1, vocab_chunk_size=4)
    np.testing.assert_array_equal(out.ids, np.broadcast_to([0, 1, 2], (1, 2, 3)))
    np.testing.assert_allclose(out.logprob, -np.log(10.0), rtol=1e-6)
    with pytest.raises(ValueError):
      scoring.token_topk(h, w, 11)
    with pytest.raises(ValueError):
      scoring.token_topk(h, w, 5, vocab_chunk_size=4)


class NextTokenAlignmentTest(parameterized.TestCase):

  def test_previous_valid_position_numpy(self):
    rng = np.random.default_rng(0)
    mask = rng.random((4, 12)) < 0.6
    mask[0] = False
    mask[1, :5] = False  # left padding
    h = jnp.asarray(rng.normal(size=(4, 12, 3)), jnp.float32)
    h_pred, valid = scoring.next_token_hidden(h, mask)
    for b in range(4):
      for t in range(12):
        prev = [s for s in range(t) if mask[b, s]]
        self.assertEqual(bool(valid[b, t]), bool(mask[b, t]) and bool(prev))
        if valid[b, t]:
          np.testing.assert_array_equal(h_pred[b, t], h[b, prev[-1]])

  def test_no_mask_is_shift(self):
    h = jnp.arange(2 * 5 * 1, dtype=jnp.float32).reshape(2, 5, 1)
    h_pred, valid = scoring.next_token_hidden(h)
    np.testing.assert_array_equal(h_pred[:, 1:], h[:, :-1])
    np.testing.assert_array_equal(valid, np.broadcast_to([False] + [True] * 4, (2, 5)))


def _tiny_model(seed=0, **kw):
  cfg = tiny_config("qwen2", **kw)
  model = Decoder(cfg, rngs=nnx.Rngs(seed))
  # Random (not identity) norm scales so alignment bugs cannot hide.
  for path, var in nnx.iter_graph(model):
    del path
    if isinstance(var, nnx.Param) and var[...].ndim == 1:
      var[...] = 1.0 + 0.3 * jax.random.normal(jax.random.PRNGKey(seed + 7), var[...].shape)
  return model


def _naive_model_scores(model, tokens, mask):
  """Full [B,T,V] logits from the model's own __call__, log_softmax, gather, shift."""
  logits, _ = model(tokens, mask_BT=mask)
  lp = jax.nn.log_softmax(logits, axis=-1)
  tok_lp = jnp.take_along_axis(lp[:, :-1], tokens[:, 1:, None], axis=-1)[..., 0]
  ent = -jnp.sum(jnp.exp(lp[:, :-1]) * lp[:, :-1], axis=-1)
  pad = jnp.zeros((tokens.shape[0], 1))
  return jnp.concatenate([pad, tok_lp], axis=1), jnp.concatenate([pad, ent], axis=1)


_naive_model_scores_jit = nnx.jit(_naive_model_scores)


@functools.partial(nnx.jit, static_argnames=("chunk_size", "vocab_chunk_size"))
def _score(model, tokens, mask, chunk_size=4, vocab_chunk_size=None):
  return scoring.score_tokens(model, tokens, mask, chunk_size=chunk_size,
                              vocab_chunk_size=vocab_chunk_size)


class ScoreTokensTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model = _tiny_model()
    cls.v = cls.model.config.vocab_size
    cls.tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 11), 0, cls.v)
    cls.all_valid = jnp.ones((3, 11), jnp.bool_)

  def test_equals_full_logits_no_mask(self):
    out = _score(self.model, self.tokens, None)
    lp, ent = _naive_model_scores_jit(self.model, self.tokens, None)
    np.testing.assert_allclose(out.logprob, lp, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(out.entropy, ent, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(out.logprob[:, 0], 0.0)
    # An all-True mask is the same as no mask.
    out2 = _score(self.model, self.tokens, self.all_valid)
    np.testing.assert_allclose(out2.logprob, out.logprob, atol=1e-6)

  def test_right_padding_and_gradients(self):
    mask = jnp.arange(11)[None, :] < jnp.array([[11], [7], [3]])
    valid = mask & (jnp.arange(11) >= 1)[None, :]
    g = jax.random.normal(jax.random.PRNGKey(2), (3, 11))

    def loss_chunked(model):
      out = scoring.score_tokens(model, self.tokens, mask, chunk_size=3, vocab_chunk_size=50)
      return jnp.sum(out.logprob * g) + 0.1 * jnp.sum(out.entropy), out

    def loss_naive(model):
      lp, ent = _naive_model_scores(model, self.tokens, mask)
      return jnp.sum(jnp.where(valid, lp, 0.0) * g) + 0.1 * jnp.sum(jnp.where(valid, ent, 0.0))

    (v1, out), g1 = nnx.jit(nnx.value_and_grad(loss_chunked, has_aux=True))(self.model)
    v2, g2 = nnx.jit(nnx.value_and_grad(loss_naive))(self.model)
    lp, _ = _naive_model_scores_jit(self.model, self.tokens, mask)
    np.testing.assert_allclose(out.logprob, jnp.where(valid, lp, 0.0), atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(out.entropy)[~np.asarray(valid)], 0.0)
    np.testing.assert_allclose(v1, v2, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
      self.assertLess(_rel_err(a, b), 1e-4)

  def test_left_padding_matches_right_padding(self):
    """A left-padded row scores its real tokens exactly like the same tokens right-padded."""
    n_pad = jnp.array([3, 0, 5])
    right_mask = jnp.arange(11)[None, :] < (11 - n_pad)[:, None]
    left_mask = jnp.arange(11)[None, :] >= n_pad[:, None]
    idx = (jnp.arange(11)[None, :] - n_pad[:, None]) % 11
    left_tokens = jnp.take_along_axis(self.tokens, idx, axis=1)  # real tokens moved right
    a = _score(self.model, left_tokens, left_mask)
    b = _score(self.model, self.tokens, right_mask)
    for r in range(3):
      k = int(11 - n_pad[r])
      np.testing.assert_allclose(a.logprob[r, 11 - k:], b.logprob[r, :k], atol=1e-5)
      np.testing.assert_allclose(a.entropy[r, 11 - k:], b.entropy[r, :k], atol=1e-5)
      np.testing.assert_array_equal(a.logprob[r, :11 - k + 1], 0.0)

  def test_score_with_context_equals_concatenation(self):
    ctx = jax.random.randint(jax.random.PRNGKey(3), (3, 5), 0, self.v)
    ctx_mask = jnp.arange(5)[None, :] >= jnp.array([[0], [2], [5]])  # left-padded; row 2 empty
    mask = jnp.arange(11)[None, :] < jnp.array([[11], [9], [6]])
    got = nnx.jit(functools.partial(scoring.score_with_context, chunk_size=4))(
        self.model, ctx, ctx_mask, self.tokens, mask)
    full_tok = jnp.concatenate([ctx, self.tokens], axis=1)
    full_mask = jnp.concatenate([ctx_mask, mask], axis=1)
    full = _score(self.model, full_tok, full_mask)
    np.testing.assert_allclose(got.logprob, full.logprob[:, 5:], atol=1e-6)
    np.testing.assert_allclose(got.entropy, full.entropy[:, 5:], atol=1e-6)
    # Naive reference on the concatenation (row 0: no padding anywhere).
    lp, _ = _naive_model_scores_jit(self.model, full_tok, full_mask)
    np.testing.assert_allclose(got.logprob[0], lp[0, 5:], atol=1e-5)
    # The first token is scored given the context; without a valid context it gets 0.
    self.assertTrue(bool(jnp.all(got.logprob[:2, 0] < 0)))
    self.assertEqual(float(got.logprob[2, 0]), 0.0)
    # The context-free row equals plain scoring of the tokens.
    plain = _score(self.model, self.tokens, mask)
    np.testing.assert_allclose(got.logprob[2], plain.logprob[2], atol=1e-5)

  def test_other_model_is_reference(self):
    """Scoring under a different model (reference / teacher) uses that model's weights."""
    ref_model = _tiny_model(seed=5, tie_embeddings=True)
    a = _score(ref_model, self.tokens, None)
    lp, _ = _naive_model_scores_jit(ref_model, self.tokens, None)
    np.testing.assert_allclose(a.logprob, lp, atol=1e-5, rtol=1e-5)
    b = _score(self.model, self.tokens, None)
    self.assertGreater(float(jnp.max(jnp.abs(a.logprob - b.logprob))), 1e-3)


@jax.jit
def _naive_sum_pi_squared(h, w, tau):
  """Σπ² from the full softmax, and verl's exp(lse(2z) − 2 lse(z))."""
  p = jax.nn.softmax(jnp.einsum("btd,dv->btv", h, w) / tau, axis=-1)
  z = jnp.einsum("btd,dv->btv", h, w) / tau
  return (jnp.sum(p * p, axis=-1),
          jnp.exp(jax.nn.logsumexp(2 * z, -1) - 2 * jax.nn.logsumexp(z, -1)))


class SumPiSquaredTest(parameterized.TestCase):

  @parameterized.parameters((None, None, 1.0), (5, 300, 1.0), (7, 1000, 0.7), (4, None, 1.3))
  def test_matches_full_softmax(self, chunk, vchunk, tau):
    """Σπ² of softmax(hW/τ), chunked (and online over vocabulary chunks, the last one
    overlapping), equals the full-softmax value and exp(lse(2z) − 2 lse(z))."""
    h, w, _, _, _ = _inputs(5, scale=1.5)
    got = jax.jit(lambda h, w: scoring.token_sum_pi_squared(
        h, w, chunk_size=chunk, vocab_chunk_size=vchunk, temperature=tau))(h, w)
    full, verl = _naive_sum_pi_squared(h, w, tau)
    np.testing.assert_allclose(got, full, rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(got, verl, rtol=2e-5, atol=1e-7)
    assert float(jnp.min(got)) >= 1.0 / V - 1e-7 and float(jnp.max(got)) <= 1.0 + 1e-6

  def test_no_gradient_and_model_alignment(self):
    h, w, _, _, _ = _inputs(6)
    g = jax.jit(jax.grad(lambda w: jnp.sum(scoring.token_sum_pi_squared(h, w))))(w)
    assert not np.asarray(g).any()
    model = Decoder(tiny_config("qwen3"), rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.PRNGKey(3), (2, 9), 0, 128)
    mask = jnp.array([[0, 0, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 0, 0, 0]], bool)

    @nnx.jit
    def run(model, tokens, mask):
      got = scoring.score_sum_pi_squared(model, tokens, mask)
      logits, _ = model(tokens, mask_BT=mask)
      p = jax.nn.softmax(logits, axis=-1)
      want_BT = jnp.sum(p * p, axis=-1)  # prediction made at t−1 for token t
      return got, want_BT, scoring.score_tokens(model, tokens, mask).logprob

    got, want_BT, lp = run(model, tokens, mask)
    m = np.asarray(lp != 0)
    assert m.sum() == 6 + 5  # each row's first real token has no prediction
    want = np.zeros((2, 9))
    want[:, 1:] = np.asarray(want_BT)[:, :-1]
    np.testing.assert_allclose(np.asarray(got)[m], want[m], rtol=1e-5)
    assert not np.asarray(got)[~m].any()


class MemoryTest(parameterized.TestCase):
  """Compiled fwd+bwd temp memory stays far below one [B,T,V] float32 array."""

  def test_chunked_fwd_bwd_memory(self):
    b, t, v, d = 2, 512, 32000, 64
    h = jax.ShapeDtypeStruct((b, t, d), jnp.float32)
    w = jax.ShapeDtypeStruct((d, v), jnp.float32)
    y = jax.ShapeDtypeStruct((b, t), jnp.int32)
    btv4 = b * t * v * 4

    def compiled_temp(fn):
      def loss(h, w, y):
        lp, ent = fn(h, w, y)
        return jnp.sum(lp) + 0.1 * jnp.sum(ent)
      grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
      return grad.lower(h, w, y).compile().memory_analysis().temp_size_in_bytes

    naive = compiled_temp(_naive)
    chunked = compiled_temp(lambda h, w, y: tuple(
        scoring.token_logprobs_and_entropy(h, w, y, chunk_size=32)))
    vchunked = compiled_temp(lambda h, w, y: tuple(
        scoring.token_logprobs_and_entropy(h, w, y, chunk_size=64, vocab_chunk_size=4096)))
    self.assertGreater(naive, btv4)
    self.assertLess(chunked, btv4 / 4)
    self.assertLess(vchunked, btv4 / 10)

  def test_auto_chunk_bounds_forward_memory_whatever_the_batch(self):
    """chunk_size=None keeps ~ROWS_PER_CHUNK rows per chunk: the forward's temp memory stays
    near ROWS_PER_CHUNK·V·4 bytes for a batch of 2 or of 64 rows."""
    self.assertEqual(scoring.auto_chunk_size(4, 1024), 64)
    self.assertEqual(scoring.auto_chunk_size(1024, 1024), 1)
    self.assertEqual(scoring.auto_chunk_size(1, 10), 10)
    v, d, t = 32000, 32, 512
    rows_bytes = scoring.ROWS_PER_CHUNK * v * 4
    for b in (2, 64):
      args = (jax.ShapeDtypeStruct((b, t, d), jnp.float32),
              jax.ShapeDtypeStruct((d, v), jnp.float32), jax.ShapeDtypeStruct((b, t), jnp.int32))
      fwd = jax.jit(lambda h, w, y: tuple(scoring.token_logprobs_and_entropy(h, w, y)))
      temp = fwd.lower(*args).compile().memory_analysis().temp_size_in_bytes
      self.assertLess(temp, 1.5 * rows_bytes, msg=f"b={b}")
      self.assertLess(temp, b * t * v * 4 / 3, msg=f"b={b}")

  def test_auto_chunk_equals_explicit(self):
    h, w, y, _, _ = _inputs(3)
    auto = scoring.token_logprobs_and_entropy(h, w, y)
    want = _naive(h, w, y)
    np.testing.assert_allclose(auto.logprob, want[0], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(auto.entropy, want[1], atol=1e-5, rtol=1e-5)


if __name__ == "__main__":
  from absl.testing import absltest
  absltest.main()


# --------------------------------------------------------------------------
# Teacher top-k scores and the student's scores of the teacher's ids (distillation).
# --------------------------------------------------------------------------


def _full_next_token_logprobs(h, w, mask):
  """[B,T,V] log-softmax of the hidden state that predicts each token (naive reference)."""
  h_pred, valid = scoring.next_token_hidden(h, mask)
  return jax.nn.log_softmax(jnp.einsum("btd,dv->btv", h_pred, w), -1), valid


def test_teacher_topk_with_tail_matches_full_vocabulary_and_sums_to_one():
  h, w, y, _, _ = _inputs(3, scale=1.0)
  mask = jnp.arange(T)[None, :] >= jnp.array([[0], [3]])  # row 1 left-padded
  k = 5

  @jax.jit
  def run(h, w, y, mask):
    out = scoring.teacher_scores_hidden(h, w, y, mask, top_k=k, chunk_size=4,
                                        vocab_chunk_size=256)
    full, valid = _full_next_token_logprobs(h, w, mask)
    want_lp = jnp.where(valid, jnp.take_along_axis(full, y[..., None], -1)[..., 0], 0.0)
    return out, valid, want_lp, jax.lax.top_k(full, k)

  out, valid, want_lp, (vals, ids) = run(h, w, y, mask)
  np.testing.assert_allclose(out.logprob, want_lp, atol=1e-5)
  v = np.asarray(valid)
  np.testing.assert_array_equal(np.asarray(out.topk_ids)[v][:, :k], np.asarray(ids)[v])
  np.testing.assert_allclose(np.asarray(out.topk_logprob)[v][:, :k], np.asarray(vals)[v],
                             atol=1e-5)
  tail = np.log1p(-np.exp(np.asarray(vals, np.float64)).sum(-1))
  # log(1 − Σp) amplifies the float32 rounding of the top-k log-probs when the tail is small.
  np.testing.assert_allclose(np.asarray(out.topk_logprob)[v][:, k], tail[v], rtol=2e-4)
  np.testing.assert_allclose(np.exp(np.asarray(out.topk_logprob, np.float64)[v]).sum(-1), 1.0,
                             atol=1e-5)
  assert np.all(np.asarray(out.topk_ids)[v][:, k] == -1)
  assert np.all(np.asarray(out.topk_ids)[~v] == -1) and np.all(
      np.asarray(out.topk_logprob)[~v] == 0.0)


def test_student_candidate_scores_equal_full_vocabulary_in_value_and_gradient():
  h, w, y, g_lp, _ = _inputs(4)
  mask = jnp.ones((B, T), bool)
  k = 4
  teacher = scoring.teacher_scores_hidden(h * 0.7, w, y, mask, top_k=k, chunk_size=8)
  g_top = jax.random.normal(jax.random.PRNGKey(9), (B, T, k + 1))

  def chunked(h, w):
    (lp, ent), cand = scoring.candidate_scores_hidden(h, w, y, mask, teacher.topk_ids,
                                                      chunk_size=4)
    return jnp.sum(lp * g_lp) + jnp.sum(cand * g_top), (lp, ent, cand)

  def naive(h, w):
    full, valid = _full_next_token_logprobs(h, w, mask)
    lp = jnp.where(valid, jnp.take_along_axis(full, y[..., None], -1)[..., 0], 0.0)
    ids = jnp.maximum(teacher.topk_ids[..., :k], 0)
    top = jnp.take_along_axis(full, ids, -1)
    tail = jnp.log(jnp.maximum(1.0 - jnp.exp(top).sum(-1, keepdims=True), 1e-8))
    cand = jnp.where(valid[..., None], jnp.concatenate([top, tail], -1), 0.0)
    return jnp.sum(lp * g_lp) + jnp.sum(cand * g_top), (lp, cand)

  (_, (lp, ent, cand)), g = jax.jit(jax.value_and_grad(chunked, argnums=(0, 1), has_aux=True))(
      h, w)
  (_, (lp_n, cand_n)), g_n = jax.jit(jax.value_and_grad(naive, argnums=(0, 1), has_aux=True))(
      h, w)
  np.testing.assert_allclose(lp, lp_n, atol=1e-5)
  np.testing.assert_allclose(cand, cand_n, atol=1e-5)
  assert ent.shape == (B, T)
  for a, b in zip(g, g_n):
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
