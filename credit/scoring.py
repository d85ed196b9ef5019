"""Memory-bounded per-token log-probs, entropies and top-k of a language model.

Scoring a batch the obvious way, ``log_softmax(hidden @ W)[tokens]``, materialises the float32
logits ``[B,T,V]``: at T=32k, V=152k that is 20 GB per sequence. Everything here instead walks
over the sequence in chunks of ``chunk_size`` positions (``jax.lax.scan``), and optionally over
the vocabulary in chunks of ``vocab_chunk_size`` columns with an online log-sum-exp, so the
largest live float32 array is ``[B, chunk_size, vocab_chunk_size or V]`` in the forward pass
and ``[B, chunk_size, min(vocab_chunk_size or V, BACKWARD_VOCAB_BLOCK)]`` in the backward pass
(plus the float32 [D,V] gradient accumulator of the unembedding, which is the output buffer).

Measured (benchmarks/scoring.py, 2-core CPU, B=4, T=1024, V=151,936, D=896, default chunk):
memory one call allocates beyond its inputs 6.9% (fwd) / 7.4% (fwd+bwd) of the full-logits
version, measured RSS growth 6.1% / 8.0%, time 0.50× / 0.65×.

The backward pass is a hand-written ``jax.custom_vjp``: the forward keeps only the per-position
log-normaliser and entropy ([B,T]); the backward recomputes each chunk's logits once and forms
the logit gradient in closed form (with p = softmax(z), ℓ = log p, H = −Σ p ℓ):

    ∂ℓ_y/∂z_v = 1[v = y] − p_v,          ∂H/∂z_v = −p_v (ℓ_v + H),

so for output cotangents g_ℓ (one per requested id) and g_H,
``ḡ_z = Σ_k g_ℓk 1[v = y_k] − p_v (Σ_k g_ℓk + g_H (ℓ_v + H))``, and with z = h·W/τ:
``h̄ = ḡ_z Wᵀ/τ``, ``W̄ = Σ_chunks hᵀ ḡ_z/τ`` (accumulated in float32), ``τ̄ = −Σ ḡ_z z/τ``.
Gradients are exact (same math as autodiff of the naive expression, different rounding order).
Symbolic zeros are honoured: an unused entropy costs nothing in the backward, and an
unembedding that is not differentiated (frozen head, LoRA, a teacher) skips its matmul.

The same chunked-logits idea is the one of Liger-Kernel's fused linear cross-entropy and of
"Cut Your Losses in Large-Vocabulary Language Models" (Wijmans et al., arXiv:2411.09009); here it
is pure JAX (no custom kernels), and returns per-token quantities instead of a reduced loss.

Model-level helpers (`score_tokens`, `score_with_context`) follow the rollout contract: the
returned ``logprob[:, t]`` is the log-prob of ``tokens[:, t]`` given the valid tokens before it.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero
from jax.typing import ArrayLike

from credit._scoring_core import (NEG_INIT, Static, chunk_logits, from_chunks, inv_temperature,
                                  make_cfg, resolve_chunk, to_chunks, topk_buckets, vocab_chunk)
# Public names of the chunking, importable from here as before.
from credit._scoring_core import (DEFAULT_CHUNK_SIZE, ROWS_PER_CHUNK,  # noqa: F401
                                  auto_chunk_size)

Array = jax.Array

# Vocabulary block of the backward pass when no vocab_chunk_size is given (see _core_bwd).
BACKWARD_VOCAB_BLOCK = 32768


class TokenScores(NamedTuple):
  """Per-token scores. ``entropy`` is None when not requested."""
  logprob: Array  # [B,T] (or [B,T,K]) float32
  entropy: Array | None  # [B,T] float32


class TopK(NamedTuple):
  """Top-k tokens per position, sorted by decreasing probability."""
  ids: Array  # [B,T,K] int32
  logprob: Array  # [B,T,K] float32


# --------------------------------------------------------------------------
# Core: per-chunk forward / backward.
# --------------------------------------------------------------------------


def _chunk_fwd(h, w_DV, tok_BcK, inv_tau, cfg):
  """One sequence chunk -> (lse [B,c], target logits [B,c,K], entropy [B,c])."""
  v, cv, nv = cfg.v, cfg.cv, cfg.nv
  if nv == 1:
    z = chunk_logits(h, w_DV, inv_tau, cfg.precision)
    m = jnp.max(z, axis=-1, keepdims=True)
    lse = m + jnp.log(jnp.sum(jnp.exp(z - m), axis=-1, keepdims=True))
    # H = −Σ p ℓ with ℓ = z − lse. Written as its own reduction over z (not reusing z − m or
    # e^{z−m}) so that XLA fuses each pass into one loop and holds only z: [B,c,V] once.
    lp = z - lse
    ent = -jnp.sum(jnp.exp(lp) * lp, axis=-1)
    lse = lse[..., 0]
    tgt = jnp.take_along_axis(z, tok_BcK, axis=-1)
    return lse, tgt, ent

  b, c = h.shape[:2]
  k = tok_BcK.shape[-1]

  def body(carry, i):
    m, s, wsum, tgt = carry
    w, start, valid = vocab_chunk(w_DV, i, cv, v, nv)
    z = chunk_logits(h, w, inv_tau, cfg.precision)
    z = jnp.where(valid, z, -jnp.inf)
    m_new = jnp.maximum(m, jnp.max(z, axis=-1))
    alpha = jnp.exp(m - m_new)
    d = z - m_new[..., None]
    e = jnp.exp(d)
    ed = jnp.where(valid, e * d, 0.0)
    # Online update of s = Σ exp(z − m) and wsum = Σ exp(z − m)(z − m) under the new max.
    wsum = alpha * (wsum + s * (m - m_new)) + jnp.sum(ed, axis=-1)
    s = alpha * s + jnp.sum(e, axis=-1)
    local = tok_BcK - start
    hit = (tok_BcK >= i * cv) & (local < cv)
    got = jnp.take_along_axis(z, jnp.clip(local, 0, cv - 1), axis=-1)
    tgt = tgt + jnp.where(hit, got, 0.0)
    return (m_new, s, wsum, tgt), None

  init = (jnp.full((b, c), NEG_INIT, jnp.float32), jnp.zeros((b, c), jnp.float32),
          jnp.zeros((b, c), jnp.float32), jnp.zeros((b, c, k), jnp.float32))
  (m, s, wsum, tgt), _ = jax.lax.scan(body, init, jnp.arange(nv))
  lse = m + jnp.log(s)
  ent = jnp.log(s) - wsum / s
  return lse, tgt, ent


def _chunk_logit_grad(z, start, valid, tok, lse, ent, g_lp, g_ent, cv):
  """ḡ_z for one [B,c,cv] block of (tempered) logits z; ids start..start+cv."""
  lp = z - lse[..., None]
  p = jnp.exp(lp)
  coef = None
  if g_lp is not None:
    coef = jnp.sum(g_lp, axis=-1)[..., None]
  if g_ent is not None:
    t = g_ent[..., None] * (lp + ent[..., None])
    coef = t if coef is None else coef + t
  gz = -p * coef
  if g_lp is not None:
    ids = (start + jnp.arange(cv))[None, None, :]
    for j in range(tok.shape[-1]):  # K is static and small; the sum fuses elementwise.
      gz = gz + jnp.where(ids == tok[..., j:j + 1], g_lp[..., j:j + 1], 0.0)
  if valid is not None:
    gz = jnp.where(valid, gz, 0.0)
  return gz


def _chunk_bwd(h, w_DV, tok, lse, ent, g_lp, g_ent, inv_tau, cfg):
  """One sequence chunk -> (h̄ [B,c,D] f32, W̄ [D,V] f32 or None, Σ ḡ_z·z)."""
  v, cv, nv = cfg.v, cfg.cv, cfg.nv
  cdt = jnp.promote_types(h.dtype, w_DV.dtype)

  def block(i, dh, dw, dtz):
    w, start, valid = vocab_chunk(w_DV, i, cv, v, nv)
    z = chunk_logits(h, w, inv_tau, cfg.precision)
    gz = _chunk_logit_grad(z, start, valid, tok, lse, ent, g_lp, g_ent, cv)
    if cfg.need_tau:
      dtz = dtz + jnp.sum(gz * z)
    # Fold the 1/τ of z = h·W/τ into ḡ_z here, so the W̄ accumulator is returned as is (XLA
    # can then use the loop buffer as the output: no second [D,V] float32 array).
    gzc = (gz if inv_tau is None else gz * inv_tau).astype(cdt)
    if cfg.need_h:
      dh = dh + jnp.einsum("bcv,dv->bcd", gzc, w, preferred_element_type=jnp.float32,
                           precision=cfg.precision)
    if cfg.need_w:
      dw_blk = jnp.einsum("bcd,bcv->dv", h, gzc, preferred_element_type=jnp.float32,
                          precision=cfg.precision)
      if nv == 1:
        dw = dw + dw_blk
      else:
        old = jax.lax.dynamic_slice_in_dim(dw, start, cv, axis=1)
        dw = jax.lax.dynamic_update_slice_in_dim(dw, old + dw_blk, start, axis=1)
    return dh, dw, dtz

  return block


def _core_fwd_impl(cfg, h_BTD, w_DV, tok_BTK, inv_tau):
  t = h_BTD.shape[1]
  h_n = to_chunks(h_BTD, cfg.c, cfg.n)
  tok_n = to_chunks(tok_BTK, cfg.c, cfg.n)

  def step(_, xs):
    h, tok = xs
    lse, tgt, ent = _chunk_fwd(h, w_DV, tok, inv_tau, cfg)
    return None, (lse, tgt - lse[..., None], ent)

  _, (lse, lp, ent) = jax.lax.scan(step, None, (h_n, tok_n))
  return from_chunks(lse, t), from_chunks(lp, t), from_chunks(ent, t)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _core(cfg, h_BTD, w_DV, tok_BTK, inv_tau):
  _, lp, ent = _core_fwd_impl(cfg, h_BTD, w_DV, tok_BTK, inv_tau)
  return lp, ent


def _core_fwd(cfg, h_BTD, w_DV, tok_BTK, inv_tau):
  need = Static(h=h_BTD.perturbed, w=w_DV.perturbed,
                tau=inv_tau is not None and inv_tau.perturbed)
  h_BTD, w_DV, tok_BTK = h_BTD.value, w_DV.value, tok_BTK.value
  inv_tau = None if inv_tau is None else inv_tau.value
  lse, lp, ent = _core_fwd_impl(cfg, h_BTD, w_DV, tok_BTK, inv_tau)
  return (lp, ent), (h_BTD, w_DV, tok_BTK, inv_tau, lse, ent, need)


def _core_bwd(cfg, res, cts):
  h_BTD, w_DV, tok_BTK, inv_tau, lse, ent, need = res
  g_lp, g_ent = cts
  g_lp = None if isinstance(g_lp, SymbolicZero) else g_lp
  g_ent = None if isinstance(g_ent, SymbolicZero) else g_ent
  b, t, d = h_BTD.shape
  tok_ct = np.zeros(tok_BTK.shape, jax.dtypes.float0)
  if (g_lp is None and g_ent is None) or not (need.h or need.w or need.tau):
    return (jnp.zeros_like(h_BTD), jnp.zeros_like(w_DV), tok_ct,
            None if inv_tau is None else jnp.zeros_like(inv_tau))
  bcfg = dict(cfg.__dict__, need_h=need.h, need_w=need.w, need_tau=need.tau)
  if cfg.nv == 1 and need.w and cfg.v > BACKWARD_VOCAB_BLOCK:
    # W̄ += hᵀ ḡ_z over the whole vocabulary would allocate a [D,V] f32 product per chunk
    # (XLA cannot accumulate a dot in place on CPU); vocabulary blocks keep it [D,block].
    bcfg["cv"], bcfg["nv"] = resolve_chunk(cfg.v, BACKWARD_VOCAB_BLOCK)
  bcfg = Static(**bcfg)
  c, n = cfg.c, cfg.n
  xs = dict(h=to_chunks(h_BTD, c, n), tok=to_chunks(tok_BTK, c, n),
            lse=to_chunks(lse, c, n), ent=to_chunks(ent, c, n))
  if g_lp is not None:
    xs["g_lp"] = to_chunks(g_lp.astype(jnp.float32), c, n)  # padded rows get zero cotangent
  if g_ent is not None:
    xs["g_ent"] = to_chunks(g_ent.astype(jnp.float32), c, n)

  def step(carry, x):
    dw, dtz = carry
    block = _chunk_bwd(x["h"], w_DV, x["tok"], x["lse"], x["ent"], x.get("g_lp"),
                       x.get("g_ent"), inv_tau, bcfg)
    dh = jnp.zeros(x["h"].shape, jnp.float32) if bcfg.need_h else None
    if bcfg.nv == 1:
      dh, dw, dtz = block(0, dh, dw, dtz)
    else:
      def vbody(vc, i):
        return block(i, *vc), None
      (dh, dw, dtz), _ = jax.lax.scan(vbody, (dh, dw, dtz), jnp.arange(bcfg.nv))
    if dh is not None:
      dh = dh.astype(h_BTD.dtype)
    return (dw, dtz), dh

  dw0 = jnp.zeros(w_DV.shape, jnp.float32) if need.w else None
  (dw, dtz), dh_n = jax.lax.scan(step, (dw0, jnp.zeros((), jnp.float32)), xs)
  dh = from_chunks(dh_n, t) if need.h else jnp.zeros_like(h_BTD)
  dw = dw.astype(w_DV.dtype) if need.w else jnp.zeros_like(w_DV)
  # z = inv_tau·(h W): ∂L/∂inv_tau = Σ ḡ_z (h W) = Σ ḡ_z z / inv_tau.
  if inv_tau is None:
    dinv = None
  else:
    dinv = (dtz / inv_tau).astype(inv_tau.dtype) if need.tau else jnp.zeros_like(inv_tau)
  return dh, dw, tok_ct, dinv


_core.defvjp(_core_fwd, _core_bwd, symbolic_zeros=True)


# --------------------------------------------------------------------------
# Public core API.
# --------------------------------------------------------------------------


def token_logprobs_and_entropy(
    hidden_BTD: ArrayLike,
    unembed_DV: ArrayLike,
    tokens_BT: ArrayLike,
    *,
    chunk_size: int | None = DEFAULT_CHUNK_SIZE,
    vocab_chunk_size: int | None = None,
    temperature: ArrayLike = 1.0,
    return_entropy: bool = True,
    precision: Any = None,
) -> TokenScores:
  """log π(tokens | h) and the entropy of π at every position, without [B,T,V] logits.

  With tempered logits z = h·W/τ and π = softmax(z):

      logprob[b,t] = z[b,t,y] − logsumexp_v z[b,t,v],   y = tokens[b,t]
      entropy[b,t] = −Σ_v π_v log π_v

  computed over chunks of `chunk_size` positions (a `lax.scan`; T is zero-padded up to a
  multiple and the padding dropped) and, if `vocab_chunk_size` is set, over vocabulary chunks
  with an online log-sum-exp (Milakov & Gimelshein, "Online normalizer calculation for
  softmax", arXiv:1805.02867; the entropy uses the same rescaling on Σ e^{z−m}(z−m)). The
  backward pass is the closed form in the module docstring (custom VJP): peak float32 memory is
  O(B·chunk_size·(vocab_chunk_size or V)) forward and backward, plus one float32 [D,V]
  accumulator for W̄ when W is differentiated. Gradients flow to hidden, unembedding and
  temperature; they are exact (not an estimator).

  Which id is scored is purely the caller's alignment: this function scores ``tokens[b,t]``
  against ``hidden[b,t]`` (no shift). `score_tokens` does the next-token shift.

  Args:
    hidden_BTD: [B,T,D] final hidden states (any float dtype; bf16 inputs give f32 accumulation).
    unembed_DV: [D,V] unembedding, logits = hidden @ unembed.
    tokens_BT: [B,T] int ids to score; or [B,T,K] to score K ids per position (e.g. a teacher's
      top-k set), in which case logprob is [B,T,K].
    chunk_size: positions per chunk (static), or None for `auto_chunk_size(B, T)` (about
      ROWS_PER_CHUNK = 256 rows of B·chunk_size). The float32 working set is about
      B·chunk_size·V·4 bytes forward and 2·B·chunk_size·min(V, 32768)·4 backward. Chunks keep
      the batch axis whole (positions are chunked, rows are not), so a batch sharded over a mesh
      stays sharded inside every chunk and B here is the global batch.
    vocab_chunk_size: columns per vocabulary chunk (static), or None for the whole vocabulary.
    temperature: τ > 0 (may be a traced scalar; it receives a gradient).
    return_entropy: if False, `entropy` is None (its gradient work is skipped either way when
      unused).
    precision: passed to the logit matmuls (e.g. `jax.lax.Precision.HIGHEST` on TPU).

  Returns:
    TokenScores(logprob [B,T] (or [B,T,K]) float32, entropy [B,T] float32 or None).

  Example:
    >>> h = jnp.ones((1, 3, 4)); w = jnp.zeros((4, 10)); y = jnp.array([[0, 1, 2]])
    >>> s = token_logprobs_and_entropy(h, w, y, chunk_size=2)
    >>> bool(jnp.allclose(s.logprob, -jnp.log(10.0)))
    True
  """
  hidden_BTD = jnp.asarray(hidden_BTD)
  unembed_DV = jnp.asarray(unembed_DV)
  tokens = jnp.asarray(tokens_BT)
  chex.assert_rank(hidden_BTD, 3)
  chex.assert_rank(unembed_DV, 2)
  chex.assert_rank(tokens, {2, 3})
  chex.assert_type(tokens, int)
  b, t, d = hidden_BTD.shape
  chex.assert_shape(unembed_DV, (d, None))
  chex.assert_equal_shape_prefix([hidden_BTD, tokens], 2)
  squeeze = tokens.ndim == 2
  tok_BTK = (tokens[..., None] if squeeze else tokens).astype(jnp.int32)
  cfg = make_cfg(b, t, unembed_DV.shape[1], chunk_size, vocab_chunk_size, precision)
  lp, ent = _core(cfg, hidden_BTD, unembed_DV, tok_BTK, inv_temperature(temperature))
  if squeeze:
    lp = lp[..., 0]
  return TokenScores(lp, ent if return_entropy else None)


def token_logprobs(hidden_BTD: ArrayLike, unembed_DV: ArrayLike, tokens_BT: ArrayLike,
                   **kwargs) -> Array:
  """Just the log-probs of `token_logprobs_and_entropy` (same arguments)."""
  return token_logprobs_and_entropy(hidden_BTD, unembed_DV, tokens_BT, return_entropy=False,
                                    **kwargs).logprob


def _frozen_inputs(hidden_BTD, unembed_DV, temperature, chunk_size, vocab_chunk_size,
                   precision) -> tuple[Array, Array, Array | None, Static]:
  """Checked, stop-gradient inputs of a no-gradient chunked pass: (h, W, 1/τ or None, cfg)."""
  hidden_BTD = jax.lax.stop_gradient(jnp.asarray(hidden_BTD))
  unembed_DV = jax.lax.stop_gradient(jnp.asarray(unembed_DV))
  chex.assert_rank(hidden_BTD, 3)
  chex.assert_rank(unembed_DV, 2)
  b, t, d = hidden_BTD.shape
  chex.assert_shape(unembed_DV, (d, None))
  cfg = make_cfg(b, t, unembed_DV.shape[1], chunk_size, vocab_chunk_size, precision)
  inv_tau = inv_temperature(temperature)
  return hidden_BTD, unembed_DV, (None if inv_tau is None else jax.lax.stop_gradient(inv_tau)), cfg


def token_topk(
    hidden_BTD: ArrayLike,
    unembed_DV: ArrayLike,
    k: int,
    *,
    chunk_size: int | None = DEFAULT_CHUNK_SIZE,
    vocab_chunk_size: int | None = None,
    temperature: ArrayLike = 1.0,
    precision: Any = None,
) -> TopK:
  """The k most probable ids and their (full-softmax) log-probs at every position.

  Chunked like `token_logprobs_and_entropy`; with vocabulary chunks, each chunk's top-k is merged
  with the running top-k (exact). Log-probs are normalised over the whole vocabulary:
  ``logprob = z_id − logsumexp(z)``. Outputs are under `stop_gradient` (a teacher's / reference
  distribution); to differentiate a student's log-probs on these ids pass ``ids`` as the
  [B,T,K] tokens of `token_logprobs_and_entropy`. Ties are broken toward the lower id.

  Args:
    hidden_BTD: [B,T,D]; unembed_DV: [D,V]; k: static, 1 <= k <= V.
    chunk_size, vocab_chunk_size, temperature, precision: as in `token_logprobs_and_entropy`.

  Returns:
    TopK(ids [B,T,k] int32, logprob [B,T,k] float32), sorted by decreasing log-prob.
  """
  hidden_BTD, unembed_DV, inv_tau, cfg = _frozen_inputs(
      hidden_BTD, unembed_DV, temperature, chunk_size, vocab_chunk_size, precision)
  t, v = hidden_BTD.shape[1], unembed_DV.shape[1]
  if not 1 <= k <= v:
    raise ValueError(f"k must be in [1, V={v}], got {k}")
  if cfg.nv > 1 and cfg.cv < k:
    raise ValueError(f"vocab_chunk_size ({cfg.cv}) must be >= k ({k})")

  def chunk(_, h):
    if cfg.nv == 1:
      z = chunk_logits(h, unembed_DV, inv_tau, precision)
      vals, ids = jax.lax.top_k(z, k)
      lse = jax.nn.logsumexp(z, axis=-1)
      return None, (ids.astype(jnp.int32), vals - lse[..., None])

    def body(carry, i):
      m, s, top_v, top_i = carry
      w, start, valid = vocab_chunk(unembed_DV, i, cfg.cv, v, cfg.nv)
      z = jnp.where(valid, chunk_logits(h, w, inv_tau, precision), -jnp.inf)
      m_new = jnp.maximum(m, jnp.max(z, axis=-1))
      s = jnp.exp(m - m_new) * s + jnp.sum(jnp.exp(z - m_new[..., None]), axis=-1)
      cv_, ci = jax.lax.top_k(z, k)
      # Running entries come from earlier chunks (lower ids): listing them first keeps ties
      # resolved toward the lower id, as lax.top_k does on the full row.
      all_v = jnp.concatenate([top_v, cv_], axis=-1)
      all_i = jnp.concatenate([top_i, (ci + start).astype(jnp.int32)], axis=-1)
      top_v, sel = jax.lax.top_k(all_v, k)
      top_i = jnp.take_along_axis(all_i, sel, axis=-1)
      return (m_new, s, top_v, top_i), None

    bb, c = h.shape[:2]
    init = (jnp.full((bb, c), NEG_INIT, jnp.float32), jnp.zeros((bb, c), jnp.float32),
            jnp.full((bb, c, k), -jnp.inf, jnp.float32), jnp.zeros((bb, c, k), jnp.int32))
    (m, s, top_v, top_i), _ = jax.lax.scan(body, init, jnp.arange(cfg.nv))
    return None, (top_i, top_v - (m + jnp.log(s))[..., None])

  _, (ids_n, lp_n) = jax.lax.scan(chunk, None, to_chunks(hidden_BTD, cfg.c, cfg.n))
  return TopK(from_chunks(ids_n, t), from_chunks(lp_n, t))


def token_sum_pi_squared(
    hidden_BTD: ArrayLike,
    unembed_DV: ArrayLike,
    *,
    chunk_size: int | None = DEFAULT_CHUNK_SIZE,
    vocab_chunk_size: int | None = None,
    temperature: ArrayLike = 1.0,
    precision: Any = None,
) -> Array:
  """Σ_v π(v)² at every position (the collision probability of π = softmax(h·W/τ)), no gradient.

  The behaviour-policy statistic of the Optimal Token Baseline (arXiv 2602.07078; verl computes
  it from the full logits as ``exp(logsumexp(2z) − 2·logsumexp(z))``). Chunked like
  `token_logprobs_and_entropy`; with vocabulary chunks an online pass keeps the running maximum
  m, s = Σ e^{z−m} and s₂ = Σ e^{2(z−m)} (rescaled by α and α² when m grows), and
  Σπ² = s₂ / s². The output is under `stop_gradient` (it weights a baseline; it is not a loss).

  Returns:
    [B,T] float32 in [1/V, 1].
  """
  hidden_BTD, unembed_DV, inv_tau, cfg = _frozen_inputs(
      hidden_BTD, unembed_DV, temperature, chunk_size, vocab_chunk_size, precision)
  t, v = hidden_BTD.shape[1], unembed_DV.shape[1]

  def chunk(_, h):
    if cfg.nv == 1:
      z = chunk_logits(h, unembed_DV, inv_tau, precision)
      lse = jax.nn.logsumexp(z, axis=-1, keepdims=True)
      return None, jnp.sum(jnp.exp(2.0 * (z - lse)), axis=-1)

    def body(carry, i):
      m, s1, s2 = carry
      w, _, valid = vocab_chunk(unembed_DV, i, cfg.cv, v, cfg.nv)
      z = jnp.where(valid, chunk_logits(h, w, inv_tau, precision), -jnp.inf)
      m_new = jnp.maximum(m, jnp.max(z, axis=-1))
      alpha = jnp.exp(m - m_new)
      e = jnp.exp(z - m_new[..., None])
      return (m_new, alpha * s1 + jnp.sum(e, axis=-1),
              alpha * alpha * s2 + jnp.sum(e * e, axis=-1)), None

    bb, c = h.shape[:2]
    init = (jnp.full((bb, c), NEG_INIT, jnp.float32), jnp.zeros((bb, c), jnp.float32),
            jnp.zeros((bb, c), jnp.float32))
    (_, s1, s2), _ = jax.lax.scan(body, init, jnp.arange(cfg.nv))
    return None, s2 / (s1 * s1)

  _, out_n = jax.lax.scan(chunk, None, to_chunks(hidden_BTD, cfg.c, cfg.n))
  return from_chunks(out_n, t)


# --------------------------------------------------------------------------
# Model-level scoring (rollout contract alignment).
# --------------------------------------------------------------------------


def next_token_hidden(hidden_BTD: ArrayLike,
                      mask_BT: ArrayLike | None = None) -> tuple[Array, Array]:
  """The hidden state that predicts each token, and where such a prediction exists.

  ``h_pred[:, t] = hidden[:, t']`` with t' the last valid position before t (t − 1 without a
  mask); ``valid[:, t]`` is ``mask[t]`` and "some t' exists" (False at position 0 and at the
  first real token of a left-padded row). Rows where `valid` is False hold an arbitrary
  (finite) hidden state.

  Returns:
    (h_pred [B,T,D] same dtype, valid [B,T] bool).
  """
  hidden_BTD = jnp.asarray(hidden_BTD)
  chex.assert_rank(hidden_BTD, 3)
  b, t = hidden_BTD.shape[:2]
  if mask_BT is None:
    h_pred = jnp.concatenate([hidden_BTD[:, :1], hidden_BTD[:, :-1]], axis=1)
    return h_pred, jnp.broadcast_to(jnp.arange(t) >= 1, (b, t))
  mask_BT = jnp.asarray(mask_BT).astype(jnp.bool_)
  chex.assert_shape(mask_BT, (b, t))
  idx_T = jnp.arange(t, dtype=jnp.int32)
  last_BT = jax.lax.cummax(jnp.where(mask_BT, idx_T[None, :], -1), axis=1)
  prev_BT = jnp.concatenate([jnp.full((b, 1), -1, jnp.int32), last_BT[:, :-1]], axis=1)
  h_pred = jnp.take_along_axis(hidden_BTD, jnp.maximum(prev_BT, 0)[..., None], axis=1)
  return h_pred, mask_BT & (prev_BT >= 0)


def score_hidden(
    hidden_BTD: ArrayLike,
    unembed_DV: ArrayLike,
    tokens_BT: ArrayLike,
    mask_BT: ArrayLike | None = None,
    **kwargs,
) -> TokenScores:
  """Next-token scores from hidden states: ``logprob[:, t] = log π(tokens[:, t] | h[:, t'])``.

  t' is the last valid position before t (t − 1 without a mask; see `next_token_hidden`).
  Entries with no valid predecessor (position 0, the first real token of a left-padded row) or
  with ``mask[t]`` False are exactly 0, in logprob and entropy. ``entropy[:, t]`` is the entropy
  of the same predictive distribution (the one ``tokens[:, t]`` was drawn from). Keyword
  arguments go to `token_logprobs_and_entropy`.
  """
  tokens_BT = jnp.asarray(tokens_BT)
  chex.assert_rank(tokens_BT, 2)
  h_pred, valid_BT = next_token_hidden(hidden_BTD, mask_BT)
  chex.assert_equal_shape_prefix([h_pred, tokens_BT], 2)
  # Invalid rows score token 0 (any id works); their outputs are replaced by exact zeros and
  # receive zero cotangent.
  tok_BT = jnp.where(valid_BT, tokens_BT, 0)
  out = token_logprobs_and_entropy(h_pred, unembed_DV, tok_BT, **kwargs)
  lp = jnp.where(valid_BT, out.logprob, 0.0)
  ent = None if out.entropy is None else jnp.where(valid_BT, out.entropy, 0.0)
  return TokenScores(lp, ent)


def sum_pi_squared_hidden(hidden_BTD: ArrayLike, unembed_DV: ArrayLike,
                          mask_BT: ArrayLike | None = None, **kwargs) -> Array:
  """Next-token Σπ² from hidden states, aligned (and zeroed) exactly like `score_hidden`.

  Keyword arguments go to `token_sum_pi_squared`. Lets a caller that already has the hidden
  states (for `score_hidden`) get Σπ² without running the model again.
  """
  h_pred, valid_BT = next_token_hidden(hidden_BTD, mask_BT)
  return jnp.where(valid_BT, token_sum_pi_squared(h_pred, unembed_DV, **kwargs), 0.0)


def model_hidden(model: Any, tokens_BT: ArrayLike, mask_BT: ArrayLike | None = None,
                 positions: ArrayLike | None = None) -> tuple[Array, Array, Array | None]:
  """One model pass for scoring: (hidden [B,T,D], unembedding [D,V] in its dtype, bool mask)."""
  tokens_BT = jnp.asarray(tokens_BT)
  chex.assert_rank(tokens_BT, 2)
  if mask_BT is not None:
    mask_BT = jnp.asarray(mask_BT).astype(jnp.bool_)
    chex.assert_equal_shape([tokens_BT, mask_BT])
  hidden_BTD = model.hidden_states(tokens_BT, positions, mask_BT=mask_BT)
  return hidden_BTD, model.unembedding().astype(hidden_BTD.dtype), mask_BT


def score_tokens(
    model: Any,
    tokens_BT: ArrayLike,
    mask_BT: ArrayLike | None = None,
    *,
    positions: ArrayLike | None = None,
    chunk_size: int | None = DEFAULT_CHUNK_SIZE,
    vocab_chunk_size: int | None = None,
    temperature: ArrayLike = 1.0,
    return_entropy: bool = True,
    precision: Any = None,
) -> TokenScores:
  """Per-token log-probs (and entropies) of `tokens_BT` under `model`, rollout-aligned.

  ``logprob[:, t] = log π(tokens[:, t] | valid tokens[:, <t])`` — the same [B,T] layout as the
  rollout contract's ``logprob`` / ``logprob_old`` / ``logprob_ref`` / ``logprob_teacher`` (the
  log-prob of each sampled token, stored at that token's position). Position 0, and any
  position whose token is masked out or has no valid token before it (left padding), get
  exactly 0. ``entropy[:, t]`` is the entropy of the distribution that produced ``tokens[:, t]``
  (0 at the same places). The model runs once (`model.hidden_states`); logits are formed only
  chunk by chunk against `model.unembedding()` (see `token_logprobs_and_entropy`), so neither
  the forward nor the backward pass holds [B,T,V] float32 logits. Differentiable w.r.t. the
  model parameters (use inside `nnx.grad` / `nnx.value_and_grad`).

  A reference or teacher is scored by passing that model. To score under a different prefix,
  see `score_with_context`.

  Args:
    model: a `credit.models.Decoder` (anything with ``hidden_states(tokens, positions,
      mask_BT=)`` and ``unembedding()``).
    tokens_BT: [B,T] int ids.
    mask_BT: [B,T] bool real (non-pad) tokens; None = all valid.
    positions: optional [B,T] RoPE positions (default: the model's ``cumsum(mask) − 1``).
    chunk_size, vocab_chunk_size, temperature, return_entropy, precision: see
      `token_logprobs_and_entropy`. τ ≠ 1 scores the tempered distribution a sampler with that
      temperature draws from.

  Returns:
    TokenScores(logprob [B,T] float32, entropy [B,T] float32 or None).
  """
  hidden_BTD, unembed_DV, mask_BT = model_hidden(model, tokens_BT, mask_BT, positions)
  return score_hidden(hidden_BTD, unembed_DV, tokens_BT, mask_BT, chunk_size=chunk_size,
                      vocab_chunk_size=vocab_chunk_size, temperature=temperature,
                      return_entropy=return_entropy, precision=precision)


def score_sum_pi_squared(
    model: Any,
    tokens_BT: ArrayLike,
    mask_BT: ArrayLike | None = None,
    *,
    positions: ArrayLike | None = None,
    chunk_size: int | None = DEFAULT_CHUNK_SIZE,
    vocab_chunk_size: int | None = None,
    temperature: ArrayLike = 1.0,
    precision: Any = None,
) -> Array:
  """Σ_v π(v)² of the distribution that produced each token, aligned like `score_tokens`.

  ``out[:, t]`` belongs to the prediction of ``tokens[:, t]`` from the valid tokens before it
  (the contract field ``sum_pi_squared``); 0 where `score_tokens` gives 0. No gradient.
  To get it together with the log-probs from one model pass, call `model_hidden` once and then
  `score_hidden` and `sum_pi_squared_hidden`.
  """
  hidden_BTD, unembed_DV, mask_BT = model_hidden(model, tokens_BT, mask_BT, positions)
  return sum_pi_squared_hidden(hidden_BTD, unembed_DV, mask_BT, chunk_size=chunk_size,
                               vocab_chunk_size=vocab_chunk_size, temperature=temperature,
                               precision=precision)


def concat_context(context_tokens: ArrayLike, context_mask: ArrayLike | None,
                   tokens: ArrayLike, mask: ArrayLike | None) -> tuple[Array, Array, int]:
  """(concat(context, tokens) [B,C+T], concatenated bool mask, C); None masks = all valid."""
  context_tokens = jnp.asarray(context_tokens)
  tokens = jnp.asarray(tokens)
  chex.assert_rank([context_tokens, tokens], 2)
  chex.assert_equal_shape_prefix([context_tokens, tokens], 1)
  b, c = context_tokens.shape
  t = tokens.shape[1]
  cmask = (jnp.ones((b, c), jnp.bool_) if context_mask is None
           else jnp.asarray(context_mask).astype(jnp.bool_))
  tmask = jnp.ones((b, t), jnp.bool_) if mask is None else jnp.asarray(mask).astype(jnp.bool_)
  chex.assert_shape(cmask, (b, c))
  chex.assert_shape(tmask, (b, t))
  full_tok = jnp.concatenate([context_tokens.astype(tokens.dtype), tokens], axis=1)
  return full_tok, jnp.concatenate([cmask, tmask], axis=1), c


def score_with_context(
    model: Any,
    context_tokens: ArrayLike,
    context_mask: ArrayLike | None,
    tokens: ArrayLike,
    mask: ArrayLike | None = None,
    **kwargs,
) -> TokenScores:
  """Scores `tokens` [B,T] under `model` with `context_tokens` [B,C] prepended.

  The model sees ``concat(context, tokens)`` (masks concatenated; RoPE positions
  ``cumsum(mask) − 1`` so padding between context and tokens is skipped), and the result is the
  [B,T] slice belonging to `tokens`: ``logprob[:, t] = log π(tokens[:, t] | valid context,
  valid tokens[:, <t])``. Unlike `score_tokens`, ``tokens[:, 0]`` gets a real log-prob when the
  context has a valid token. Used for privileged-context teachers (self-distillation with a
  hint or hindsight block) and re-scoring a response under an edited prompt: pass ``context``
  = the other prompt and ``tokens`` = the response (plus its mask), or ``context`` = an extra
  prefix and ``tokens`` = the whole original sequence. Keyword arguments go to `score_tokens`.

  Returns:
    TokenScores with [B,T] logprob and entropy aligned to `tokens`.
  """
  full_tok, full_mask, c = concat_context(context_tokens, context_mask, tokens, mask)
  out = score_tokens(model, full_tok, full_mask, **kwargs)
  ent = None if out.entropy is None else out.entropy[:, c:]
  return TokenScores(out.logprob[:, c:], ent)


# --------------------------------------------------------------------------
# Teacher distributions and the student's log-probs on them (distillation).
# --------------------------------------------------------------------------


class TeacherScores(NamedTuple):
  """A teacher's scores of a student's tokens, aligned like `score_tokens`.

  logprob: [B,T] float32 log-prob of each sampled token (0 where `score_tokens` gives 0).
  topk_logprob: [B,T,k+1] float32 — the k most probable ids' full-softmax log-probs, then
    the tail bucket log(max(1 − Σ_k p, 1e-8)) (the contract's `teacher_topk_logprob`); 0 at
    invalid positions. None when k = 0.
  topk_ids: [B,T,k+1] int32 — their ids, −1 for the tail and at invalid positions. None
    when k = 0.
  """
  logprob: Array
  topk_logprob: Array | None
  topk_ids: Array | None


def _with_tail(logprob_BTK: Array, valid_BT: Array) -> Array:
  """K full-softmax log-probs -> K+1 buckets (tail last), 0 at invalid positions."""
  return jnp.where(valid_BT[..., None], topk_buckets(logprob_BTK, tail="bucket"), 0.0)


def teacher_scores_hidden(hidden_BTD: ArrayLike, unembed_DV: ArrayLike, tokens_BT: ArrayLike,
                          mask_BT: ArrayLike | None = None, *, top_k: int = 0,
                          **kwargs) -> TeacherScores:
  """A teacher's next-token scores from its hidden states, without gradient.

  ``logprob[:, t]`` is `score_hidden`'s (the teacher's log-prob of the student's token t);
  with ``top_k = k > 0`` also the teacher's k most probable ids at each position and their
  log-probs (`token_topk`, exact under vocabulary chunks) plus one tail bucket holding the
  rest of the mass, so that the k+1 entries sum to one (up to the 1e-8 floor of an empty
  tail). Chunked like `token_logprobs_and_entropy`: no [B,T,V] array is formed.

  Args:
    hidden_BTD, unembed_DV, tokens_BT, mask_BT: as in `score_hidden`.
    top_k: static k (0: log-probs only).
    **kwargs: chunk_size, vocab_chunk_size, temperature, precision.

  Returns:
    TeacherScores.
  """
  hidden_BTD = jax.lax.stop_gradient(jnp.asarray(hidden_BTD))
  unembed_DV = jax.lax.stop_gradient(jnp.asarray(unembed_DV))
  lp = score_hidden(hidden_BTD, unembed_DV, tokens_BT, mask_BT, return_entropy=False,
                    **kwargs).logprob
  if not top_k:
    return TeacherScores(lp, None, None)
  h_pred, valid_BT = next_token_hidden(hidden_BTD, mask_BT)
  top = token_topk(h_pred, unembed_DV, top_k, **kwargs)
  ids = jnp.concatenate([top.ids, jnp.full(top.ids.shape[:2] + (1,), -1, jnp.int32)], axis=-1)
  return TeacherScores(lp, _with_tail(top.logprob, valid_BT),
                       jnp.where(valid_BT[..., None], ids, -1))


def candidate_scores_hidden(hidden_BTD: ArrayLike, unembed_DV: ArrayLike, tokens_BT: ArrayLike,
                            mask_BT: ArrayLike | None, candidate_ids_BTk: ArrayLike,
                            **kwargs) -> tuple[TokenScores, Array]:
  """The student's scores of its tokens and of a teacher's top-k ids, from one chunked pass.

  Returns (`score_hidden`'s TokenScores, [B,T,k] log-probs of the candidates): the sampled
  token and the first k−1 candidate ids (`teacher_topk_ids` without its tail entry, −1
  entries scored as id 0) are scored together as k ids per position by
  `token_logprobs_and_entropy`; the candidates' full-softmax log-probs then get the same
  tail bucket as the teacher's (`teacher_scores_hidden`), so the two [B,T,k] arrays are
  distributions over the same buckets. Differentiable (exact gradients through the chunked
  custom VJP); 0 at invalid positions.

  Args:
    hidden_BTD, unembed_DV, tokens_BT, mask_BT: as in `score_hidden`.
    candidate_ids_BTk: [B,T,k] int, the teacher's ids with the tail entry last.
    **kwargs: chunk_size, vocab_chunk_size, temperature, return_entropy, precision.
  """
  tokens_BT = jnp.asarray(tokens_BT)
  ids = jnp.asarray(candidate_ids_BTk)
  chex.assert_rank(ids, 3)
  chex.assert_equal_shape_prefix([tokens_BT, ids], 2)
  h_pred, valid_BT = next_token_hidden(hidden_BTD, mask_BT)
  tok = jnp.where(valid_BT, tokens_BT, 0)[..., None]
  cand = jnp.where(ids[..., :-1] >= 0, ids[..., :-1], 0)
  out = token_logprobs_and_entropy(h_pred, unembed_DV,
                                   jnp.concatenate([tok, cand], axis=-1).astype(jnp.int32),
                                   **kwargs)
  lp = jnp.where(valid_BT, out.logprob[..., 0], 0.0)
  ent = None if out.entropy is None else jnp.where(valid_BT, out.entropy, 0.0)
  return TokenScores(lp, ent), _with_tail(out.logprob[..., 1:], valid_BT)
