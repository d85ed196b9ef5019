"""Tests for credit.models decoder, config and sharding."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from credit.models import (DEFAULT_RULES, Decoder, KVCache, ModelConfig, cache_sharding,
                           default_positions, init_cache, logical_to_mesh_axes,
                           logical_to_mesh_sharding, rope_inv_freq, shard_model, tiny_config)
from credit.models import decoder as decoder_module

LLAMA3_SCALING = (("factor", 8.0), ("low_freq_factor", 1.0), ("high_freq_factor", 4.0),
                  ("original_max_position_embeddings", 64))
CONFIGS = {
    "llama3": tiny_config("llama", rope_theta=500000.0, rope_scaling=LLAMA3_SCALING),
    "qwen2": tiny_config("qwen2"),
    "qwen3_tied": tiny_config("qwen3", tie_embeddings=True),
}
B, P, G = 3, 6, 5        # batch, prompt buffer, generated tokens
PROMPT_LENS = (6, 4, 1)  # left padding 0, 2, 5


def _random_model(cfg, seed=0, std=0.3):
  """Decoder whose every parameter (norms, biases too) is random, so layout bugs cannot hide
  behind 0s and 1s. Built abstractly and filled from numpy: no per-shape eager compiles."""
  model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
  rng = np.random.RandomState(seed)
  for _, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    x = (std * rng.standard_normal(var.shape)).astype(np.float32)
    var.set_value(jnp.asarray(x, var.dtype))
  return model


def _model(name, **overrides):
  return _random_model(CONFIGS[name].replace(**overrides))


def _batch(seed=0):
  rng = np.random.RandomState(seed)
  tokens = rng.randint(0, 128, (B, P + G)).astype(np.int32)
  mask = np.ones((B, P + G), bool)
  for b, n in enumerate(PROMPT_LENS):
    mask[b, :P - n] = False
    tokens[b, :P - n] = 0
  return jnp.asarray(tokens), jnp.asarray(mask)


def _call(model, tokens, mask, cache=None, positions=None, return_hidden=False):
  return model(tokens, positions, mask_BT=mask, cache=cache, return_hidden=return_hidden)


# One jitted entry point for all tests (eager NNX dispatch is ~10x slower on 2 cores).
_jit_call = nnx.jit(_call, static_argnames="return_hidden")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_cached_decode_matches_full_forward(name):
  """Prefill a left-padded prompt, then decode one token at a time == one full pass."""
  model = _model(name)
  tokens, mask = _batch()
  full, none = _jit_call(model, tokens, mask)
  assert none is None and full.dtype == jnp.float32
  chex.assert_shape(full, (B, P + G, 128))

  cache = model.init_cache(B, P + G + 3)
  pre, cache = _jit_call(model, tokens[:, :P], mask[:, :P], cache)
  steps = [pre]
  for t in range(P, P + G):
    step, cache = _jit_call(model, tokens[:, t:t + 1], mask[:, t:t + 1], cache)
    steps.append(step)
  cached = jnp.concatenate(steps, axis=1)
  m = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(cached)[m], np.asarray(full)[m], atol=2e-5, rtol=1e-5)
  assert int(cache.index) == P + G
  np.testing.assert_array_equal(np.asarray(cache.valid[:, :P + G]), m)
  assert not np.asarray(cache.valid[:, P + G:]).any()
  assert np.isfinite(np.asarray(cached)).all()  # pad queries stay finite too


def test_cache_read_sizes():
  assert decoder_module.cache_read_sizes(1, 300) == (64, 128, 256, 300)
  assert decoder_module.cache_read_sizes(100, 300) == (128, 256, 300)
  assert decoder_module.cache_read_sizes(1, 64) == (64,)
  assert decoder_module.cache_read_sizes(1, 10) == (10,)
  assert decoder_module.cache_read_sizes(5, 33, block=4) == (8, 16, 32, 33)


@pytest.fixture
def small_read_block(monkeypatch):
  """Cached attention reads 4, 8, 16, ... slots, so that short sequences cross several sizes.
  (The tests using it jit functions of their own: a trace made under the default is not reused.)"""
  monkeypatch.setattr(decoder_module, "CACHE_READ_BLOCK", 4)


def _poison_unread(cache, t):
  """NaN in every slot that a call writing t tokens at cache.index does not read."""
  sizes = decoder_module.cache_read_sizes(t, cache.size, 4)
  read = min(n for n in sizes if n >= int(cache.index) + t)
  k, v = np.array(cache.k), np.array(cache.v)  # numpy: no eager compile per slice
  k[:, :, :, read:] = np.nan
  v[:, :, :, :, read:] = np.nan
  return cache.replace(k=jnp.asarray(k), v=jnp.asarray(v))


def test_decode_reads_only_the_filled_slots(small_read_block):
  """Caches of 1x and 3x the needed slots give the full pass's logits (ragged left padding, a
  row that feeds a pad mid-sequence, prefill in two chunks) and never read past the filled length
  rounded up to a read size: NaN there changes nothing."""
  model = _model("qwen3_tied")
  tokens, mask = _batch(5)
  mask = mask.at[1, P + 2].set(False)  # row 1 feeds a pad at one decode step
  call = nnx.jit(lambda m, t, k, c: m(t, mask_BT=k, cache=c))
  full, _ = call(model, tokens, mask, None)
  m = np.asarray(mask)
  got = {}
  for size in (P + G, 3 * (P + G)):
    cache = model.init_cache(B, size)
    pieces = []
    for lo, hi in [(0, 3), (3, P)] + [(t, t + 1) for t in range(P, P + G)]:
      poisoned, _ = call(model, tokens[:, lo:hi], mask[:, lo:hi], _poison_unread(cache, hi - lo))
      out, cache = call(model, tokens[:, lo:hi], mask[:, lo:hi], cache)
      np.testing.assert_array_equal(np.asarray(poisoned), np.asarray(out))
      pieces.append(out)
    got[size] = np.asarray(jnp.concatenate(pieces, axis=1))
    np.testing.assert_allclose(got[size][m], np.asarray(full)[m], atol=2e-5, rtol=1e-5)
    assert int(cache.index) == P + G and not np.asarray(cache.valid[:, P + G:]).any()
  np.testing.assert_allclose(got[P + G][m], got[3 * (P + G)][m], atol=2e-6, rtol=1e-6)


def test_sharded_decode_equals_unsharded(small_read_block):
  """Prefill and decode steps that cross read sizes, on a (data, fsdp, tensor) = (2, 2, 2) mesh
  with the cache sharded by `cache_sharding`, give the unsharded logits."""
  mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)
  model = _model("qwen2")
  tokens, mask = _batch(6)
  tokens = jnp.concatenate([tokens, tokens[:1]], axis=0)  # B=4 divides data*fsdp
  mask = jnp.concatenate([mask, mask[:1]], axis=0)
  call = nnx.jit(lambda m, t, k, c: m(t, mask_BT=k, cache=c))

  def run(cache):
    pieces = []
    for lo, hi in [(0, P)] + [(t, t + 1) for t in range(P, P + G)]:
      out, cache = call(model, tokens[:, lo:hi], mask[:, lo:hi], cache)
      pieces.append(out)
    return np.asarray(jnp.concatenate(pieces, axis=1))

  ref = run(model.init_cache(4, 2 * (P + G)))
  shard_model(model, mesh)
  cache = model.init_cache(4, 2 * (P + G))
  with jax.set_mesh(mesh):
    got = run(jax.device_put(cache, cache_sharding(cache, mesh)))
  m = np.asarray(mask)
  np.testing.assert_allclose(got[m], ref[m], atol=2e-5, rtol=1e-5)


def test_cache_chunked_prefill_and_explicit_positions():
  """Two prefill chunks with explicit positions == default positions == full pass (eager)."""
  model = _model("qwen3_tied")
  tokens, mask = _batch(1)
  full, _ = _jit_call(model, tokens, mask)
  pos = default_positions(mask)
  np.testing.assert_array_equal(
      np.asarray(pos), np.maximum(np.cumsum(np.asarray(mask), axis=1) - 1, 0))
  cache = init_cache(model.config, B, P + G)
  a, cache = _jit_call(model, tokens[:, :4], mask[:, :4], cache, pos[:, :4])
  b, cache = _jit_call(model, tokens[:, 4:], mask[:, 4:], cache, pos[:, 4:])
  m = np.asarray(mask)
  got = np.asarray(jnp.concatenate([a, b], axis=1))
  np.testing.assert_allclose(got[m], np.asarray(full)[m], atol=2e-5, rtol=1e-5)


def test_padding_invariance_and_rope_shift():
  """A left-padded row equals the same prompt unpadded; shifting all positions changes nothing."""
  model = _model("llama3")
  tokens, mask = _batch(2)
  full, _ = _jit_call(model, tokens, mask)
  n = P - PROMPT_LENS[2]
  alone, _ = _jit_call(model, tokens[2:, n:], None)
  np.testing.assert_allclose(np.asarray(full[2, n:]), np.asarray(alone[0]), atol=2e-5, rtol=1e-5)
  # Pad tokens' ids do not leak into real positions.
  noisy = jnp.where(mask, tokens, jnp.asarray(np.random.RandomState(9).randint(0, 128, mask.shape)))
  other, _ = _jit_call(model, noisy.astype(jnp.int32), mask)
  m = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(other)[m], np.asarray(full)[m], atol=1e-6, rtol=1e-6)
  # RoPE scores depend on position differences only.
  pos = default_positions(mask)
  shifted, _ = _jit_call(model, tokens, mask, None, pos + 7)
  m = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(shifted)[m], np.asarray(full)[m], atol=5e-5, rtol=1e-4)
  # ... but the model does use positions.
  doubled, _ = _jit_call(model, tokens, mask, None, pos * 2)
  assert np.abs(np.asarray(doubled - full)[m]).max() > 1e-3


@pytest.mark.parametrize("name", ["llama3", "qwen3_tied"])
def test_hidden_states_times_unembedding_is_logits(name):
  model = _model(name)
  tokens, mask = _batch()
  logits, _ = _jit_call(model, tokens, mask)
  hidden = nnx.jit(lambda m, t, k: m.hidden_states(t, mask_BT=k))(model, tokens, mask)
  hidden2, _ = _jit_call(model, tokens, mask, return_hidden=True)
  chex.assert_shape(hidden, (B, P + G, 64))
  np.testing.assert_array_equal(np.asarray(hidden), np.asarray(hidden2))
  w = model.unembedding()
  chex.assert_shape(w, (64, 128))
  if model.config.tie_embeddings:
    np.testing.assert_array_equal(np.asarray(w), np.asarray(model.embed_tokens.embedding[...]).T)
    assert model.lm_head is None
  np.testing.assert_allclose(np.asarray(hidden @ w), np.asarray(logits), atol=1e-5, rtol=1e-5)


def test_bfloat16_params_and_compute():
  """bf16 model: f32 logits, finite, close to the f32 model holding the same (rounded) weights."""
  m32 = _model("qwen2")
  m16 = _random_model(m32.config.replace(param_dtype="bfloat16", dtype="bfloat16"))
  params16 = nnx.state(m16, nnx.Param)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params16))
  rounded = jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(m32, nnx.Param))
  nnx.update(m16, rounded)
  nnx.update(m32, jax.tree.map(lambda x: x.astype(jnp.float32), rounded))
  tokens, mask = _batch()
  l32, _ = _jit_call(m32, tokens, mask)
  l16, _ = _jit_call(m16, tokens, mask)
  assert l16.dtype == jnp.float32
  assert _jit_call(m16, tokens, mask, return_hidden=True)[0].dtype == jnp.bfloat16
  m = np.asarray(mask)
  err = np.abs(np.asarray(l16 - l32))[m]
  assert np.isfinite(err).all()
  assert err.max() < 0.1 * np.abs(np.asarray(l32)[m]).max(), err.max()
  # cached decode in bf16 agrees with the bf16 full pass to bf16 precision
  cache = m16.init_cache(B, P + G)
  assert cache.k.dtype == jnp.bfloat16
  pre, cache = _jit_call(m16, tokens[:, :P], mask[:, :P], cache)
  nxt, cache = _jit_call(m16, tokens[:, P:P + 1], mask[:, P:P + 1], cache)
  np.testing.assert_allclose(np.asarray(nxt[:, 0]), np.asarray(l16[:, P]), atol=0.1)


def test_rope_inv_freq():
  cfg = CONFIGS["llama3"]
  base = rope_inv_freq(cfg.replace(rope_scaling=None))
  h = cfg.head_dim
  np.testing.assert_allclose(base, [cfg.rope_theta ** (-2 * i / h) for i in range(h // 2)],
                             rtol=1e-6)
  scaled = rope_inv_freq(cfg)
  sc = dict(LLAMA3_SCALING)
  ctx = sc["original_max_position_embeddings"]
  for f, s in zip(base, scaled):  # numpy loop reference of the Llama 3.1 rule
    wl = 2 * np.pi / f
    if wl < ctx / sc["high_freq_factor"]:
      want = f
    elif wl > ctx / sc["low_freq_factor"]:
      want = f / sc["factor"]
    else:
      a = (ctx / wl - sc["low_freq_factor"]) / (sc["high_freq_factor"] - sc["low_freq_factor"])
      want = (1 - a) * f / sc["factor"] + a * f
    np.testing.assert_allclose(s, want, rtol=1e-6)
  wl = 2 * np.pi / base  # all three regimes are exercised
  assert (wl < ctx / 4).any() and (wl > ctx).any() and ((wl > ctx / 4) & (wl < ctx)).any()


def test_config_validation_and_hashable():
  cfg = CONFIGS["llama3"]
  assert hash(cfg) == hash(cfg.replace())
  jax.jit(lambda x, c: x * c.num_layers, static_argnums=1)(1.0, cfg)
  with pytest.raises(ValueError, match="family"):
    tiny_config("gpt2")
  with pytest.raises(ValueError, match="num_kv_heads"):
    tiny_config(num_kv_heads=3)
  with pytest.raises(ValueError, match="dtype"):
    tiny_config(dtype="float16")
  c = ModelConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=2,
                  num_kv_heads=1, head_dim=4, eos_token_id=[3, 4],
                  rope_scaling=dict(LLAMA3_SCALING))
  assert c.eos_token_ids == (3, 4) and isinstance(c.rope_scaling, tuple)
  hash(c)


def test_init_and_logical_axes():
  """Decoder's own init (jitted): N(0, 0.02) kernels, zero biases, unit norms, bf16 storage; every
  parameter names one logical axis per dimension, all known to DEFAULT_RULES."""
  cfg = CONFIGS["qwen2"].replace(param_dtype="bfloat16", qk_norm=True)
  model = nnx.jit(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))()
  attn = model.layers[0].self_attn
  assert float(jnp.std(attn.q_proj.kernel[...].astype(jnp.float32))) == pytest.approx(0.02, 0.1)
  assert not np.asarray(attn.k_proj.bias[...], np.float32).any()
  assert (np.asarray(attn.q_norm.weight[...], np.float32) == 1).all()
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    axes = var.get_metadata().get("out_sharding")
    assert axes is not None and len(axes) == var.ndim, path
    assert all(a in dict(DEFAULT_RULES) for a in axes), (path, axes)


def test_logical_to_mesh_axes_rules():
  mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)
  P = jax.sharding.PartitionSpec
  assert logical_to_mesh_axes(("embed", "q_heads", "head_dim"), mesh) == P("fsdp", "tensor", None)
  assert logical_to_mesh_axes(("batch", None), mesh) == P(("data", "fsdp"), None)
  # not divisible: 1 kv head cannot split over tensor=2 -> replicated
  assert logical_to_mesh_axes(("embed", "kv_heads"), mesh, shape=(64, 1)) == P("fsdp", None)
  # batch of 2 over data*fsdp=4 -> keeps data only
  assert logical_to_mesh_axes(("batch",), mesh, shape=(2,)) == P("data")
  # a mesh axis shards one dimension only; axes missing from the mesh are dropped
  rules = (("a", "tensor"), ("b", "tensor"), ("c", "pipeline"))
  assert logical_to_mesh_axes(("a", "b", "c"), mesh, rules) == P("tensor", None, None)


def test_sharded_model_equals_unsharded():
  mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)
  model = _model("qwen2")
  tokens, mask = _batch()
  tokens = jnp.concatenate([tokens, tokens[:1]], axis=0)  # B=4 divides data*fsdp
  mask = jnp.concatenate([mask, mask[:1]], axis=0)
  ref, _ = _jit_call(model, tokens, mask)
  shardings = logical_to_mesh_sharding(model, mesh)
  shard_model(model, mesh)
  q = model.layers[0].self_attn.q_proj.kernel[...]
  assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
  assert q.sharding == shardings["layers"][0]["self_attn"]["q_proj"]["kernel"].get_value()
  cache = model.init_cache(4, P + G)
  cache = jax.device_put(cache, cache_sharding(cache, mesh))
  with jax.set_mesh(mesh):
    got, _ = _jit_call(model, tokens, mask)
    pre, cache = _jit_call(model, tokens[:, :P], mask[:, :P], cache)
  np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=1e-5, rtol=1e-5)
  m = np.asarray(mask[:, :P])
  np.testing.assert_allclose(np.asarray(pre)[m], np.asarray(ref[:, :P])[m], atol=2e-5, rtol=1e-5)
  assert isinstance(cache, KVCache)


def test_kv_cache_overflow_is_an_error_outside_jit():
  """An eager write past the cache end raises instead of clamping onto the last slots."""
  model = _model("qwen2")
  tokens, mask = _batch(3)
  cache = model.init_cache(B, P + 1)
  _, cache = model(tokens[:, :P], mask_BT=mask[:, :P], cache=cache)
  _, cache = model(tokens[:, P:P + 1], mask_BT=mask[:, P:P + 1], cache=cache)  # exactly full
  assert int(cache.index) == P + 1
  with pytest.raises(ValueError, match="KV cache overflow: index 7 \\+ 1"):
    model(tokens[:, P + 1:P + 2], mask_BT=mask[:, P + 1:P + 2], cache=cache)
  with pytest.raises(ValueError, match="do not fit a KV cache of 3 slots"):
    model(tokens[:, :4], mask_BT=mask[:, :4], cache=model.init_cache(B, 3))


def test_remat_keeps_values_and_gradients_and_cuts_saved_activations():
  """config.remat recomputes blocks in the backward: same loss and grads, smaller residuals;
  the "projections" policy keeps the weight matmuls' outputs: between the two."""
  tokens, mask = _batch(4)
  cfg = CONFIGS["llama3"].replace(num_layers=3)

  def loss(model):
    logits, _ = model(tokens, mask_BT=mask)
    return jnp.sum(jnp.where(mask[..., None], jax.nn.log_softmax(logits), 0.0)[..., :8])

  grads, temp_bytes, saved = {}, {}, {}
  for remat in (False, True, "projections"):
    model = _random_model(cfg.replace(remat=bool(remat), remat_policy=(
        remat if isinstance(remat, str) else "full")), seed=5)
    graphdef, params = nnx.split(model)

    def pure_loss(p, graphdef=graphdef):
      return loss(nnx.merge(graphdef, p))

    fn = jax.jit(jax.value_and_grad(pure_loss))
    val, g = fn(params)
    grads[remat] = (float(val), jax.tree.leaves(g))
    temp_bytes[remat] = fn.lower(params).compile().memory_analysis().temp_size_in_bytes
    _, vjp = jax.vjp(pure_loss, params)  # its leaves: what the forward keeps for the backward
    saved[remat] = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(vjp))
  for kind in (True, "projections"):
    np.testing.assert_allclose(grads[kind][0], grads[False][0], rtol=1e-6)
    # Gradients reach ~60 here: a near-cancelling entry carries float32 summation-order noise
    # on the scale of its leaf (measured up to 1.1e-5 absolute), so atol is relative to it.
    for a, b in zip(grads[kind][1], grads[False][1]):
      b = np.asarray(b)
      np.testing.assert_allclose(np.asarray(a), b, rtol=2e-5, atol=1e-6 * np.abs(b).max() + 1e-6)
  assert temp_bytes[True] < temp_bytes[False], temp_bytes
  assert saved[True] < saved["projections"] < saved[False], saved  # residual bytes
  with pytest.raises(ValueError, match="remat_policy='some'; expected one of"):
    cfg.replace(remat_policy="some")
