"""Tests for credit.sampling: cached decode vs full forwards, logits processing, layout, stops."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from credit import contract
from credit import sampling
from credit.models import Decoder, tiny_config

V = 128
PAD = 0


@functools.lru_cache(maxsize=None)
def _model():
  """Tiny Qwen3-style decoder (D=64, 2 layers, V=128), weights scaled so logits are peaked
  (std ~1.5, top-2 gap ~0.3) and depend on the context: argmax flips from float noise are
  then impossible in practice."""
  model = Decoder(tiny_config("qwen3", vocab_size=V), rngs=nnx.Rngs(0))
  params = nnx.state(model, nnx.Param)
  nnx.update(model, jax.tree.map(lambda x: x * 3.0 if x.ndim >= 2 else x, params))
  model.lm_head.kernel[...] = model.lm_head.kernel[...] * 3.0
  return model


@functools.lru_cache(maxsize=None)
def _sampler():
  return sampling.Sampler(_model(), pad_id=PAD, stop_tokens=())


@functools.lru_cache(maxsize=None)
def _forward():
  """Full (uncached) forward, jitted once per shape: logits [B,T,V]."""
  graphdef, state = nnx.split(_model())
  fn = jax.jit(lambda st, t, m: nnx.merge(graphdef, st)(t, mask_BT=m)[0])
  return lambda tokens, mask: np.asarray(fn(state, jnp.asarray(tokens), jnp.asarray(mask)))


def _state():
  return nnx.state(_model())


def _prompts(seed=0, n=4, p=8, lengths=(8, 3, 5, 1)):
  """Left-padded [n,p] prompts with the given valid lengths, ids in [1, V)."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, V, size=(n, p)).astype(np.int32)
  mask = np.arange(p)[None, :] >= (p - np.asarray(lengths))[:, None]
  return np.where(mask, tokens, PAD).astype(np.int32), mask


def _valid_rows(tokens, mask):
  return [list(tokens[b][mask[b]]) for b in range(tokens.shape[0])]


# --------------------------------------------------------------------------
# Model equivalences.
# --------------------------------------------------------------------------


def test_cached_decode_logprobs_match_full_forward():
  """logprob_raw (log softmax of the cached prefill/decode logits at the sampled token) equals the
  same quantity from one full uncached forward over the right-padded output; logprob_sampler
  equals the processed distribution of those full-forward logits."""
  tokens, mask = _prompts()
  kw = dict(temperature=0.8, top_k=20, top_p=0.9)
  out = _sampler()(_state(), prompt_tokens=tokens, prompt_mask=mask, key=jax.random.key(1),
                   max_new_tokens=8, **kw)
  full_mask = np.asarray(out.prompt_mask | out.response_mask)
  logits_BTV = _forward()(out.tokens, full_mask)
  resp = np.asarray(out.response_mask)
  B, T = resp.shape
  b_idx, t_idx = np.nonzero(resp)
  prev_logits = logits_BTV[b_idx, t_idx - 1]  # logits predicting token t
  tok = np.asarray(out.tokens)[b_idx, t_idx]
  raw = np.asarray(jax.nn.log_softmax(prev_logits, axis=-1))[np.arange(len(tok)), tok]
  np.testing.assert_allclose(np.asarray(out.logprob_raw)[b_idx, t_idx], raw, atol=2e-4)
  params = sampling.sampling_params(**kw)
  proc = np.asarray(sampling.processed_logprobs(prev_logits, params))[np.arange(len(tok)), tok]
  assert np.all(np.isfinite(proc))  # every sampled token survives the filters
  np.testing.assert_allclose(np.asarray(out.logprob_sampler)[b_idx, t_idx], proc, atol=2e-4)
  # Outside the response the log-probs are exact zeros.
  assert np.all(np.asarray(out.logprob_raw)[~resp] == 0)
  assert np.all(np.asarray(out.logprob_sampler)[~resp] == 0)
  assert np.all(np.asarray(out.response_mask).sum(-1) == 8)
  # Prompt copied in order, right-padded layout.
  assert _valid_rows(np.asarray(out.tokens), np.asarray(out.prompt_mask)) == \
      _valid_rows(tokens, mask)
  np.testing.assert_array_equal(out.lengths, mask.sum(-1) + 8)
  np.testing.assert_array_equal(out.tokens[full_mask == 0], PAD)


def test_greedy_equals_stepwise_argmax_of_full_forwards():
  tokens, mask = _prompts(seed=1)
  n_new = 8
  out = _sampler()(_state(), prompt_tokens=tokens, prompt_mask=mask, key=jax.random.key(0),
                   max_new_tokens=n_new, temperature=0.0)
  # Reference: right-padded buffer, full forward each step, argmax at the last valid position.
  B, P = tokens.shape
  buf = np.zeros((B, P + n_new), np.int32)
  lens = mask.sum(-1)
  for b in range(B):
    buf[b, :lens[b]] = tokens[b][mask[b]]
  for _ in range(n_new):
    valid = np.arange(P + n_new)[None, :] < lens[:, None]
    logits = _forward()(buf, valid)
    nxt = logits[np.arange(B), lens - 1].argmax(-1)
    buf[np.arange(B), lens] = nxt
    lens = lens + 1
  np.testing.assert_array_equal(np.asarray(out.tokens), buf)
  np.testing.assert_array_equal(out.logprob_sampler, 0.0)


# --------------------------------------------------------------------------
# Logits processing.
# --------------------------------------------------------------------------

_LOGITS = np.array([2.0, 1.6, 1.1, 0.7, 0.2, -0.4, -1.0, -2.5], np.float32)

_CONFIGS = [
    dict(temperature=1.0),
    dict(temperature=0.5),
    dict(temperature=2.0, top_k=3),
    dict(top_p=0.8),
    dict(temperature=1.5, top_k=6, top_p=0.7),
    dict(min_p=0.3),
    dict(temperature=0.7, top_k=7, top_p=0.95, min_p=0.1),
]


def _reference_probs(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
  """HF transformers' warper order and rules (Temperature -> TopK -> TopP -> MinP), in numpy."""
  s = logits.astype(np.float64) / temperature
  if top_k:
    kth = np.sort(s)[::-1][top_k - 1]
    s = np.where(s < kth, -np.inf, s)
  if top_p < 1.0:
    order = np.argsort(s, kind="stable")  # ascending, as HF
    p = np.exp(s[order] - s.max())
    p /= p.sum()
    remove = np.cumsum(p) <= 1 - top_p
    remove[-1] = False
    s = s.copy()
    s[order[remove]] = -np.inf
  if min_p > 0:
    p = np.exp(s - s.max())
    p /= p.sum()
    s = np.where(p < min_p * p.max(), -np.inf, s)
  p = np.exp(s - s.max())
  return p / p.sum()


# Jitted once here: op-by-op, each configuration's processing costs ~0.7 s of dispatch.
_processed_logprobs = jax.jit(sampling.processed_logprobs)


@pytest.mark.parametrize("cfg", _CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_processing_matches_reference_and_samples_it(cfg):
  expected = _reference_probs(_LOGITS, **cfg)
  params = sampling.sampling_params(**cfg)
  lp = np.asarray(_processed_logprobs(_LOGITS[None], params))[0]
  np.testing.assert_allclose(np.exp(lp), expected, atol=1e-6)
  n = 40_000
  keys = jax.random.split(jax.random.key(7), n)
  tok, lps = jax.jit(sampling.sample_logits)(keys, jnp.broadcast_to(_LOGITS, (n, 8)), params)
  tok, lps = np.asarray(tok), np.asarray(lps)
  freq = np.bincount(tok, minlength=8) / n
  assert np.all(freq[expected == 0] == 0), (freq, expected)
  kept = expected > 0
  z = np.abs(freq[kept] - expected[kept]) / np.sqrt(expected[kept] * (1 - expected[kept]) / n
                                                    + 1e-12)
  assert z.max() < 4.5, (freq, expected)
  np.testing.assert_allclose(lps, np.log(expected[tok]), atol=1e-5)


def test_processing_matches_transformers_warpers():
  """Same logits through transformers' own warpers, in generate's order."""
  torch = pytest.importorskip("torch")
  lp_mod = pytest.importorskip("transformers.generation.logits_process")
  rng = np.random.default_rng(0)
  logits = (2.0 * rng.standard_normal((3, 50))).astype(np.float32)
  for cfg in _CONFIGS:
    warpers = []
    t = cfg.get("temperature", 1.0)
    if t != 1.0:
      warpers.append(lp_mod.TemperatureLogitsWarper(t))
    if cfg.get("top_k", 0):
      warpers.append(lp_mod.TopKLogitsWarper(cfg["top_k"]))
    if cfg.get("top_p", 1.0) < 1.0:
      warpers.append(lp_mod.TopPLogitsWarper(cfg["top_p"]))
    if cfg.get("min_p", 0.0) > 0:
      warpers.append(lp_mod.MinPLogitsWarper(cfg["min_p"]))
    scores = torch.tensor(logits)
    for w in warpers:
      scores = w(None, scores)
    hf = torch.softmax(scores, -1).numpy()
    ours = np.exp(np.asarray(_processed_logprobs(logits, sampling.sampling_params(**cfg))))
    np.testing.assert_allclose(ours, hf, atol=1e-6, err_msg=str(cfg))


def test_nucleus_without_top_k_matches_sorted_reference():
  """The sort-free top-p path (bisection threshold) keeps exactly the tokens of the sorted rule
  on a larger vocabulary, for several top_p values passed as traced arrays (one compile)."""
  rng = np.random.default_rng(1)
  logits = (1.5 * rng.standard_normal((8, 500))).astype(np.float32)
  f = jax.jit(lambda x, p: sampling.processed_logprobs(x, sampling.sampling_params(top_p=p)))
  for top_p in (0.05, 0.3, 0.5, 0.9, 0.99, 1.0):
    got = np.isfinite(np.asarray(f(logits, jnp.float32(top_p))))
    want = np.stack([_reference_probs(row, top_p=top_p) > 0 for row in logits])
    np.testing.assert_array_equal(got, want, err_msg=f"top_p={top_p}")


def test_traced_temperature_zero_is_greedy_and_top_k_one_is_greedy():
  logits = jnp.asarray(np.random.default_rng(3).standard_normal((5, 8)), jnp.float32)
  keys = jax.random.split(jax.random.key(0), 5)
  argmax = np.asarray(jnp.argmax(logits, -1))
  f = jax.jit(sampling.sample_logits)
  tok, lp = f(keys, logits, sampling.sampling_params(temperature=jnp.float32(0.0)))
  np.testing.assert_array_equal(tok, argmax)
  np.testing.assert_array_equal(lp, 0.0)
  tok, lp = f(keys, logits, sampling.sampling_params(top_k=1))
  np.testing.assert_array_equal(tok, argmax)
  np.testing.assert_array_equal(lp, 0.0)


# --------------------------------------------------------------------------
# Layout, randomness, stops, limits.
# --------------------------------------------------------------------------


def test_padding_and_buffer_width_do_not_change_samples():
  """The same prompts with 5 more columns of left padding (and one row right-padded instead)
  sample the same tokens for the same key."""
  tokens, mask = _prompts(seed=2)
  wide_t = np.concatenate([np.full((4, 5), PAD, np.int32), tokens], 1)
  wide_m = np.concatenate([np.zeros((4, 5), bool), mask], 1)
  # Row 1: right-padded instead of left-padded.
  n1 = mask[1].sum()
  wide_t[1] = PAD
  wide_m[1] = False
  wide_t[1, :n1] = tokens[1][mask[1]]
  wide_m[1, :n1] = True
  kw = dict(key=jax.random.key(3), max_new_tokens=8, temperature=1.0)
  a = _sampler()(_state(), prompt_tokens=tokens, prompt_mask=mask, **kw)
  b = _sampler()(_state(), prompt_tokens=wide_t, prompt_mask=wide_m, **kw)
  ra = _valid_rows(np.asarray(a.tokens), np.asarray(a.response_mask))
  rb = _valid_rows(np.asarray(b.tokens), np.asarray(b.response_mask))
  assert ra == rb
  np.testing.assert_allclose(a.logprob_raw[a.response_mask], b.logprob_raw[b.response_mask],
                             atol=2e-4)
  np.testing.assert_array_equal(a.lengths, b.lengths)


def test_determinism_groups_and_keys():
  tokens, mask = _prompts(seed=3)
  kw = dict(prompt_tokens=tokens, prompt_mask=mask, max_new_tokens=8, num_samples=3,
            temperature=1.0)
  a = _sampler()(_state(), key=jax.random.key(5), **kw)
  b = _sampler()(_state(), key=jax.random.key(5), **kw)
  c = _sampler()(_state(), key=jax.random.key(6), **kw)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  assert not np.array_equal(a.tokens, c.tokens)
  np.testing.assert_array_equal(a.group_id, np.repeat(np.arange(4), 3))
  toks = np.asarray(a.tokens).reshape(4, 3, -1)
  pm = np.asarray(a.prompt_mask).reshape(4, 3, -1)
  for n in range(4):
    assert np.all(toks[n][pm[n]].reshape(3, -1) == toks[n, 0][pm[n, 0]])  # same prefix
    resp = [tuple(r) for r in toks[n][~pm[n]].reshape(3, -1)]
    assert len(set(resp)) == 3  # samples of a group differ
  contract.validate_rollout(a.rollout(), num_groups=4)


def test_stop_tokens_end_rows_and_min_new_tokens():
  tokens, mask = _prompts(seed=4)
  stop = tuple(range(0, V, 4))  # a quarter of the vocabulary: rows stop after a few tokens
  out = _sampler()(_state(), prompt_tokens=tokens, prompt_mask=mask, key=jax.random.key(2),
                   max_new_tokens=12, num_samples=4, temperature=1.0, stop_tokens=stop)
  resp_lens = []
  for b in range(16):
    r = np.asarray(out.tokens[b])[np.asarray(out.response_mask[b])]
    is_stop = np.isin(r, stop)
    assert not is_stop[:-1].any()  # nothing after the first stop token
    assert bool(out.finished[b]) == bool(is_stop[-1])  # stop token included, row finished
    assert is_stop[-1] or len(r) == 12
    np.testing.assert_array_equal(np.nonzero(out.response_mask[b])[0],
                                  np.arange(out.prompt_lengths[b], out.lengths[b]))
    resp_lens.append(len(r))
  assert out.finished.sum() >= 12 and min(resp_lens) < 4  # the stop set is actually hit early
  assert np.all(out.tokens[~(out.prompt_mask | out.response_mask)] == PAD)
  # min_new_tokens blocks stops before 5 tokens (same compiled program: numbers are traced).
  out2 = _sampler()(_state(), prompt_tokens=tokens, prompt_mask=mask, key=jax.random.key(2),
                    max_new_tokens=12, num_samples=4, temperature=1.0, stop_tokens=stop,
                    min_new_tokens=5)
  lens2 = np.asarray(out2.lengths - out2.prompt_lengths)
  assert lens2.min() >= 5
  for b in range(16):
    r = np.asarray(out2.tokens[b])[np.asarray(out2.response_mask[b])]
    assert not np.isin(r[:4], stop).any()


def test_per_row_limits_and_prefix_continuation_equals_one_go():
  tokens, mask = _prompts(seed=5)
  lim = np.array([8, 0, 3, 5], np.int32)
  out = _sampler()(_state(), prompt_tokens=tokens, prompt_mask=mask, key=jax.random.key(0),
                   max_new_tokens=8, temperature=0.0, max_new_tokens_per_row=lim)
  np.testing.assert_array_equal(out.lengths - out.prompt_lengths, lim)
  assert not out.finished.any()
  # Greedy in one go (8 tokens) == greedy 3 tokens, then continue that right-padded output.
  full = _sampler()(_state(), prompt_tokens=tokens, prompt_mask=mask, key=jax.random.key(0),
                    max_new_tokens=8, temperature=0.0)
  part = _sampler()(_state(), prompt_tokens=tokens, prompt_mask=mask, key=jax.random.key(0),
                    max_new_tokens=8, temperature=0.0, max_new_tokens_per_row=np.full(4, 3))
  prefix_mask = np.asarray(part.prompt_mask | part.response_mask)
  cont = _sampler()(_state(), prompt_tokens=np.asarray(part.tokens), prompt_mask=prefix_mask,
                    key=jax.random.key(9), max_new_tokens=5, temperature=0.0)
  np.testing.assert_array_equal(
      np.asarray(cont.tokens)[:, :full.tokens.shape[1]], np.asarray(full.tokens))
  np.testing.assert_array_equal(cont.lengths, full.lengths)


def test_multi_turn_append_observation_and_continue():
  """Append environment tokens to a rollout and continue: the new prompt is exactly
  old prompt + old response + observation, in order."""
  tokens, mask = _prompts(seed=6)
  first = _sampler()(_state(), prompt_tokens=tokens, prompt_mask=mask, key=jax.random.key(0),
                     max_new_tokens=8, temperature=1.0)
  obs = np.array([[7, 8]] * 4, np.int32)
  t1 = np.asarray(first.tokens)
  m1 = np.asarray(first.prompt_mask | first.response_mask)
  t2 = np.concatenate([t1, np.zeros((4, 2), np.int32)], 1)
  m2 = np.concatenate([m1, np.zeros((4, 2), bool)], 1)
  lens = m1.sum(-1)
  t2[np.arange(4)[:, None], lens[:, None] + np.arange(2)] = obs
  m2[np.arange(4)[:, None], lens[:, None] + np.arange(2)] = True
  second = _sampler()(_state(), prompt_tokens=t2, prompt_mask=m2, key=jax.random.key(1),
                      max_new_tokens=3, temperature=1.0)
  got = _valid_rows(np.asarray(second.tokens), np.asarray(second.prompt_mask))
  want = [list(t1[b][m1[b]]) + [7, 8] for b in range(4)]
  assert got == want
  assert np.all(np.asarray(second.response_mask).sum(-1) == 3)
  # logprob_raw of the continuation == full forward over the whole multi-turn sequence.
  full_mask = np.asarray(second.prompt_mask | second.response_mask)
  logits = _forward()(second.tokens, full_mask)
  b_idx, t_idx = np.nonzero(np.asarray(second.response_mask))
  tok = np.asarray(second.tokens)[b_idx, t_idx]
  ref = np.asarray(jax.nn.log_softmax(logits[b_idx, t_idx - 1], -1))[np.arange(len(tok)), tok]
  np.testing.assert_allclose(np.asarray(second.logprob_raw)[b_idx, t_idx], ref, atol=2e-4)


def test_numbers_do_not_recompile():
  """Temperature, top_p, min_new_tokens, stop ids, per-row limits and the key are traced: one
  compiled program serves all these calls."""
  s = _sampler()
  tokens, mask = _prompts(seed=7)
  before = s._jitted._cache_size()
  for i, (t, p, stop) in enumerate([(1.0, 0.9, (3,)), (0.7, 0.5, (4,)), (1.3, 0.99, (5,))]):
    s(_state(), prompt_tokens=tokens, prompt_mask=mask, key=jax.random.key(i), max_new_tokens=8,
      temperature=t, top_k=5, top_p=p, stop_tokens=stop, min_new_tokens=i,
      max_new_tokens_per_row=None if i == 0 else np.full(4, 4 - i))
  assert s._jitted._cache_size() - before <= 1


# --------------------------------------------------------------------------
# Eager validation.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,arg", [
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-1), "top_k"),
    (dict(top_k=2.5), "top_k"),
    (dict(temperature=-0.1), "temperature"),
    (dict(min_p=1.5), "min_p"),
    (dict(stop_tokens=(V,)), "stop_tokens"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(num_samples=0), "num_samples"),
    (dict(max_new_tokens_per_row=np.array([1, 2, 9, 1])), "max_new_tokens_per_row"),
    (dict(max_new_tokens_per_row=np.array([1, 2])), "max_new_tokens_per_row"),
    (dict(prompt_tokens=np.full((4, 8), V, np.int32)), "prompt_tokens"),
    (dict(prompt_tokens=np.full((4, 8), -1, np.int32)), "prompt_tokens"),
    (dict(prompt_mask=np.zeros((4, 8), bool)), "prompt_mask"),
    (dict(prompt_mask=np.ones((4, 7), bool)), "prompt_mask"),
])
def test_validation_errors_name_the_argument(kwargs, arg):
  tokens, mask = _prompts()
  call = dict(prompt_tokens=tokens, prompt_mask=mask, key=jax.random.key(0), max_new_tokens=8)
  call.update(kwargs)
  if "prompt_tokens" in kwargs:
    call["prompt_mask"] = np.ones((4, 8), bool)
  with pytest.raises(ValueError, match=arg):
    _sampler()(_state(), **call)


def test_validation_max_length():
  s = sampling.Sampler(_model(), pad_id=PAD, max_length=12)
  tokens, mask = _prompts()
  with pytest.raises(ValueError, match="max_new_tokens"):
    s(_state(), prompt_tokens=tokens, prompt_mask=mask, key=jax.random.key(0), max_new_tokens=5)
  long_t = np.ones((1, 13), np.int32)
  with pytest.raises(ValueError, match="prompt_tokens"):
    s(_state(), prompt_tokens=long_t, key=jax.random.key(0), max_new_tokens=1)
  with pytest.raises(ValueError, match="top_p"):
    sampling.sample(_model(), prompt_tokens=tokens, prompt_mask=mask, key=jax.random.key(0),
                    max_new_tokens=2, top_p=2.0)


def test_sample_under_caller_jit_with_traced_numbers():
  """`sample` is pure: jitted by the caller with traced prompts and a traced temperature of 0
  (greedy through `jnp.where`) it reproduces the Sampler's static greedy path."""
  tokens, mask = _prompts(seed=1)
  graphdef, state = nnx.split(_model())

  @jax.jit
  def run(st, t, m, temperature):
    return sampling.sample(nnx.merge(graphdef, st), prompt_tokens=t, prompt_mask=m,
                           key=jax.random.key(0), max_new_tokens=5, temperature=temperature,
                           top_k=4, pad_id=PAD)

  got = run(state, tokens, mask, jnp.float32(0.0))
  # Eager and jitted logits processing agree draw for draw.
  logits = jnp.asarray(np.random.default_rng(0).standard_normal((6, 20)), jnp.float32)
  keys = jax.random.split(jax.random.key(2), 6)
  params = sampling.sampling_params(temperature=0.8, top_k=7, top_p=0.9, min_p=0.05)
  eager = sampling.sample_logits(keys, logits, params)
  jitted = jax.jit(sampling.sample_logits)(keys, logits, params)
  np.testing.assert_array_equal(eager[0], jitted[0])
  np.testing.assert_allclose(eager[1], jitted[1], atol=1e-6)
  want = _sampler()(_state(), prompt_tokens=tokens, prompt_mask=mask, key=jax.random.key(3),
                    max_new_tokens=5, temperature=0.0)
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_array_equal(got.logprob_sampler, 0.0)
  np.testing.assert_allclose(got.logprob_raw, want.logprob_raw, atol=1e-5)


@pytest.mark.parametrize("v,k,block", [(32000, 10, 64), (5000, 7, 16), (4099, 3, 32), (100, 10, 64)])
def test_top_k_exact_equals_lax_top_k_with_ties_and_padding(v, k, block):
  """Block preselection returns exactly lax.top_k's values and ids (ties: lower id first),
  also with a partial last block, heavy ties and −∞ entries (filtered tokens)."""
  rng = np.random.default_rng(v + k)
  cases = [rng.standard_normal((5, v)).astype(np.float32),
           np.round(rng.standard_normal((5, v)) * 2).astype(np.float32),  # many equal values
           np.zeros((2, v), np.float32)]                                  # all tied
  x = rng.standard_normal((3, v)).astype(np.float32)
  x[:, : v - 2] = -np.inf  # only two finite entries: the rest of the top-k are −∞ ties
  cases.append(x)
  fn = jax.jit(lambda z: sampling.top_k_exact(z, k, block))
  for z in cases:
    want_v, want_i = jax.lax.top_k(jnp.asarray(z), k)
    got_v, got_i = fn(jnp.asarray(z))
    np.testing.assert_array_equal(np.asarray(got_i), np.asarray(want_i))
    np.testing.assert_array_equal(np.asarray(got_v), np.asarray(want_v))
