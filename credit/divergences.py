"""Per-position divergences between a student's and a teacher's next-token distributions.

Notation: at each position the student distribution is ``p_S = softmax(z_S)`` and the teacher
distribution ``p_T = softmax(z_T)`` over the same vocabulary (shared tokenizer). Kinds:

  "forward_kl"  KL(p_T ‖ p_S) = Σ_v p_T (log p_T − log p_S)   (mode covering; SFT-like distillation)
  "reverse_kl"  KL(p_S ‖ p_T) = Σ_v p_S (log p_S − log p_T)   (mode seeking; on-policy
                distillation: MiniLLM, Gu et al. arXiv:2306.08543; Thinking Machines "On-Policy
                Distillation")
  "js"          generalised Jensen–Shannon of GKD (Agarwal et al., "On-Policy Distillation of
                Language Models: Learning from Self-Generated Mistakes", arXiv:2306.13649):
                JSD_β = β KL(p_T ‖ M) + (1 − β) KL(p_S ‖ M),  M = β p_T + (1 − β) p_S.
                β = 0.5 (default) is the symmetric JS divergence, 0 ≤ JSD ≤ log 2. (Verified
                against Liger-Kernel's `LigerJSD` docstring, which uses the same form with P the
                teacher; TRL's `generalized_jsd_loss` likewise weights the teacher term by β.)
  "hellinger"   squared Hellinger distance H² = ½ Σ_v (√p_S − √p_T)² = 1 − Σ_v √(p_S p_T),
                in [0, 1] (the ½-normalised convention). `squared=False` returns H = √H².
  "tv"          total variation ½ Σ_v |p_S − p_T|, in [0, 1].

Every kind is evaluated as a sum of finite pointwise terms computed from log-probs (e.g.
Hellinger as ½(e^{ℓ_S/2} − e^{ℓ_T/2})², not 1 − Σ√(pq), which cancels catastrophically when the
distributions agree), so p → 0 entries contribute exact zeros and gradients stay finite.

Gradients flow to the student side only by default (``stop_teacher_gradient=True``): the teacher
is a target. The chunked `token_divergence` never holds [B,T,V] float32 logits: it walks over
positions (and optionally vocabulary chunks, with an online log-sum-exp pass followed by a
summation pass) inside `jax.lax.scan`, with each chunk under `jax.checkpoint`, so its backward
pass recomputes one chunk's logits at a time.
"""
from __future__ import annotations

from typing import Any, Callable, Literal

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops, scoring
from credit._checks import lookup
from credit._scoring_core import (NEG_INIT, Static, chunk_logits, from_chunks, inv_temperature,
                                  make_cfg, to_chunks, vocab_chunk)
# The top-k buckets, importable from here as before.
from credit._scoring_core import TAIL_FLOOR, TailMode, topk_buckets  # noqa: F401

Array = jax.Array
DivergenceKind = Literal["forward_kl", "reverse_kl", "js", "hellinger", "tv"]


# --------------------------------------------------------------------------
# Pointwise terms: each returns per-entry terms whose sum over the last axis is the divergence.
# --------------------------------------------------------------------------


def _forward_kl_terms(lp_s, lp_t, beta):
  del beta
  return jnp.exp(lp_t) * (lp_t - lp_s)


def _reverse_kl_terms(lp_s, lp_t, beta):
  del beta
  return jnp.exp(lp_s) * (lp_s - lp_t)


def _js_terms(lp_s, lp_t, beta):
  beta = jnp.asarray(beta, jnp.float32)
  # log M = log(β p_T + (1 − β) p_S); β ∈ {0, 1} gives log 0 = −inf in one branch, which
  # logaddexp handles (and the matching term is multiplied by 0 below via jnp.where).
  log_b = jnp.log(jnp.where(beta > 0, beta, 1.0))
  log_1mb = jnp.log(jnp.where(beta < 1, 1.0 - beta, 1.0))
  lm = jnp.logaddexp(jnp.where(beta > 0, log_b + lp_t, -jnp.inf),
                     jnp.where(beta < 1, log_1mb + lp_s, -jnp.inf))
  t_term = jnp.where(beta > 0, beta * jnp.exp(lp_t) * (lp_t - lm), 0.0)
  s_term = jnp.where(beta < 1, (1.0 - beta) * jnp.exp(lp_s) * (lp_s - lm), 0.0)
  return t_term + s_term


def _hellinger_terms(lp_s, lp_t, beta):
  del beta
  return 0.5 * jnp.square(jnp.exp(0.5 * lp_s) - jnp.exp(0.5 * lp_t))


def _tv_terms(lp_s, lp_t, beta):
  del beta
  return 0.5 * jnp.abs(jnp.exp(lp_s) - jnp.exp(lp_t))


_TERMS: dict[str, Callable[..., Array]] = {
    "forward_kl": _forward_kl_terms,
    "reverse_kl": _reverse_kl_terms,
    "js": _js_terms,
    "hellinger": _hellinger_terms,
    "tv": _tv_terms,
}


def _resolve(kind: str, squared: bool) -> tuple[Callable[..., Array], Callable[[Array], Array]]:
  terms = lookup(_TERMS, kind, "divergence kind")
  finish = ops.safe_sqrt if (kind == "hellinger" and not squared) else (lambda x: x)
  return terms, finish


def list_divergences() -> list[str]:
  """Names accepted as ``kind``."""
  return sorted(_TERMS)


def _zero_masked(d: Array, mask: ArrayLike | None) -> Array:
  if mask is None:
    return d
  mask = jnp.asarray(mask).astype(jnp.bool_)
  chex.assert_equal_shape([d, mask])
  return jnp.where(mask, d, 0.0)


# --------------------------------------------------------------------------
# Divergences of explicit distributions (logits or log-probs on the last axis).
# --------------------------------------------------------------------------


def divergence_from_logprobs(
    logprob_student: ArrayLike,
    logprob_teacher: ArrayLike,
    *,
    kind: DivergenceKind = "reverse_kl",
    beta: ArrayLike = 0.5,
    squared: bool = True,
    stop_teacher_gradient: bool = True,
    mask: ArrayLike | None = None,
) -> Array:
  """Divergence between two normalised distributions given as log-probs on the last axis.

  See the module docstring for the kinds. Both inputs must be normalised (logsumexp = 0 over
  the last axis); entries may be −inf (probability 0) only where the formula does not divide by
  them (e.g. a teacher −inf under "reverse_kl" where the student has mass gives +inf, as it
  should).

  Args:
    logprob_student: [..., V] float.
    logprob_teacher: [..., V] float, same shape.
    kind: "forward_kl" | "reverse_kl" | "js" | "hellinger" | "tv" (static).
    beta: the JSD_β weight of the teacher (only for "js").
    squared: Hellinger only: True gives H² (default), False gives H.
    stop_teacher_gradient: no gradient to the teacher log-probs (default).
    mask: optional [...] bool; masked positions give exactly 0.

  Returns:
    [...] float32 divergence per position.

  Example:
    >>> p = jnp.log(jnp.array([0.6, 0.3, 0.1])); q = jnp.log(jnp.array([0.5, 0.4, 0.1]))
    >>> round(float(divergence_from_logprobs(p, q, kind="reverse_kl")), 6)
    0.023088
  """
  terms, finish = _resolve(kind, squared)
  lp_s = jnp.asarray(logprob_student, jnp.float32)
  lp_t = jnp.asarray(logprob_teacher, jnp.float32)
  chex.assert_equal_shape([lp_s, lp_t])
  if stop_teacher_gradient:
    lp_t = jax.lax.stop_gradient(lp_t)
  return _zero_masked(finish(jnp.sum(terms(lp_s, lp_t, beta), axis=-1)), mask)


def divergence_from_logits(
    student_logits: ArrayLike,
    teacher_logits: ArrayLike,
    *,
    kind: DivergenceKind = "reverse_kl",
    beta: ArrayLike = 0.5,
    squared: bool = True,
    temperature: ArrayLike = 1.0,
    teacher_temperature: ArrayLike | None = None,
    stop_teacher_gradient: bool = True,
    mask: ArrayLike | None = None,
) -> Array:
  """`divergence_from_logprobs` of ``log_softmax(logits / τ)`` on both sides ([..., V] each).

  This materialises whatever logits it is given: use it on a chunk (or at small V); use
  `token_divergence` for whole sequences. `teacher_temperature` defaults to `temperature`.
  """
  zs = jnp.asarray(student_logits, jnp.float32)
  zt = jnp.asarray(teacher_logits, jnp.float32)
  chex.assert_equal_shape([zs, zt])
  tt = temperature if teacher_temperature is None else teacher_temperature
  lp_s = jax.nn.log_softmax(zs / jnp.asarray(temperature, jnp.float32), axis=-1)
  lp_t = jax.nn.log_softmax(zt / jnp.asarray(tt, jnp.float32), axis=-1)
  return divergence_from_logprobs(lp_s, lp_t, kind=kind, beta=beta, squared=squared,
                                  stop_teacher_gradient=stop_teacher_gradient, mask=mask)


# --------------------------------------------------------------------------
# Chunked divergence from hidden states + unembeddings.
# --------------------------------------------------------------------------


def _online_lse(h, w_DV, inv_tau, cfg):
  """log Σ_v exp(z_v) over vocabulary chunks (online max/sum)."""
  b, c = h.shape[:2]

  @jax.checkpoint
  def body(carry, i):
    m, s = carry
    w, _, valid = vocab_chunk(w_DV, i, cfg.cv, cfg.v, cfg.nv)
    z = jnp.where(valid, chunk_logits(h, w, inv_tau, cfg.precision), -jnp.inf)
    m_new = jnp.maximum(m, jnp.max(z, axis=-1))
    s = jnp.exp(m - m_new) * s + jnp.sum(jnp.exp(z - m_new[..., None]), axis=-1)
    return (m_new, s), None

  init = (jnp.full((b, c), NEG_INIT, jnp.float32), jnp.zeros((b, c), jnp.float32))
  (m, s), _ = jax.lax.scan(body, init, jnp.arange(cfg.nv))
  return m + jnp.log(s)


def _chunk_divergence(hs, ht, ws, wt, inv_s, inv_t, beta, terms, cfg):
  """Σ_v terms over one [B,c] block of positions -> [B,c]."""
  if cfg.nv == 1:
    lp_s = jax.nn.log_softmax(chunk_logits(hs, ws, inv_s, cfg.precision), axis=-1)
    lp_t = jax.nn.log_softmax(chunk_logits(ht, wt, inv_t, cfg.precision), axis=-1)
    if cfg.stop_teacher:
      lp_t = jax.lax.stop_gradient(lp_t)
    return jnp.sum(terms(lp_s, lp_t, beta), axis=-1)

  lse_s = _online_lse(hs, ws, inv_s, cfg)
  lse_t = _online_lse(ht, wt, inv_t, cfg)

  @jax.checkpoint
  def body(acc, i):
    w_s, _, valid = vocab_chunk(ws, i, cfg.cv, cfg.v, cfg.nv)
    w_t, _, _ = vocab_chunk(wt, i, cfg.cv, cfg.v, cfg.nv)
    lp_s = chunk_logits(hs, w_s, inv_s, cfg.precision) - lse_s[..., None]
    lp_t = chunk_logits(ht, w_t, inv_t, cfg.precision) - lse_t[..., None]
    if cfg.stop_teacher:
      lp_t = jax.lax.stop_gradient(lp_t)
    return acc + jnp.sum(jnp.where(valid, terms(lp_s, lp_t, beta), 0.0), axis=-1), None

  acc, _ = jax.lax.scan(body, jnp.zeros(hs.shape[:2], jnp.float32), jnp.arange(cfg.nv))
  return acc


def token_divergence(
    student_hidden_BTD: ArrayLike,
    student_unembed_DV: ArrayLike,
    teacher_hidden_BTD: ArrayLike,
    teacher_unembed_DV: ArrayLike,
    *,
    kind: DivergenceKind = "reverse_kl",
    beta: ArrayLike = 0.5,
    squared: bool = True,
    mask_BT: ArrayLike | None = None,
    chunk_size: int | None = scoring.DEFAULT_CHUNK_SIZE,
    vocab_chunk_size: int | None = None,
    temperature: ArrayLike = 1.0,
    teacher_temperature: ArrayLike | None = None,
    stop_teacher_gradient: bool = True,
    precision: Any = None,
) -> Array:
  """Per-position D(p_S, p_T) with p = softmax(h·W/τ), never holding [B,T,V] float32 logits.

  Position t compares ``softmax(student_hidden[:, t] @ Ws)`` with
  ``softmax(teacher_hidden[:, t] @ Wt)`` (no shift: feed `scoring.next_token_hidden` outputs,
  or use `model_divergence`, for rollout alignment). The two models may differ in width D but
  must share V. Chunked over positions (`chunk_size`; T is padded) and optionally over the
  vocabulary (`vocab_chunk_size`: one online log-sum-exp pass per side, then a summation pass —
  about 1.5× the matmuls of the unchunked-vocabulary path). Each chunk runs under
  `jax.checkpoint`, so the backward pass holds O(B·chunk_size·(vocab_chunk_size or V)) float32
  too. Gradients reach the student hidden and unembedding (and the teacher's when
  `stop_teacher_gradient=False`).

  Args:
    student_hidden_BTD: [B,T,Ds]; student_unembed_DV: [Ds,V].
    teacher_hidden_BTD: [B,T,Dt]; teacher_unembed_DV: [Dt,V].
    kind, beta, squared: see the module docstring and `divergence_from_logprobs`.
    mask_BT: optional [B,T] bool; masked positions give exactly 0.
    chunk_size, vocab_chunk_size, precision: as in `scoring.token_logprobs_and_entropy`.
    temperature: student τ; teacher_temperature: teacher τ (default: the student's).
    stop_teacher_gradient: no gradient to the teacher side (default).

  Returns:
    [B,T] float32.
  """
  terms, finish = _resolve(kind, squared)
  hs = jnp.asarray(student_hidden_BTD)
  ht = jnp.asarray(teacher_hidden_BTD)
  ws = jnp.asarray(student_unembed_DV)
  wt = jnp.asarray(teacher_unembed_DV)
  chex.assert_rank([hs, ht, ws, wt], [3, 3, 2, 2])
  chex.assert_equal_shape_prefix([hs, ht], 2)
  chex.assert_equal_shape_suffix([ws, wt], 1)
  chex.assert_shape(ws, (hs.shape[2], None))
  chex.assert_shape(wt, (ht.shape[2], None))
  if stop_teacher_gradient:
    ht, wt = jax.lax.stop_gradient(ht), jax.lax.stop_gradient(wt)
  b, t = hs.shape[:2]
  base = make_cfg(b, t, ws.shape[1], chunk_size, vocab_chunk_size, precision)
  cfg = Static(**base.__dict__, stop_teacher=stop_teacher_gradient)
  inv_s = inv_temperature(temperature)
  inv_t = inv_temperature(temperature if teacher_temperature is None
                                   else teacher_temperature)
  beta = jnp.asarray(beta, jnp.float32)

  @jax.checkpoint
  def chunk(xs):
    h_s, h_t = xs
    return _chunk_divergence(h_s, h_t, ws, wt, inv_s, inv_t, beta, terms, cfg)

  d_n = jax.lax.map(chunk, (to_chunks(hs, cfg.c, cfg.n), to_chunks(ht, cfg.c, cfg.n)))
  return _zero_masked(finish(from_chunks(d_n, t)), mask_BT)


def model_divergence(
    student: Any,
    teacher: Any,
    tokens_BT: ArrayLike,
    mask_BT: ArrayLike | None = None,
    *,
    teacher_context: ArrayLike | None = None,
    teacher_context_mask: ArrayLike | None = None,
    **kwargs,
) -> Array:
  """Per-token divergence between two models' next-token distributions, rollout-aligned.

  ``out[:, t] = D(π_S(· | tokens[:, <t]), π_T(· | [teacher_context,] tokens[:, <t]))``: the
  divergence of the distributions from which ``tokens[:, t]`` was drawn, laid out like
  `scoring.score_tokens`'s logprob (0 at position 0, at masked tokens and where the student has
  no valid prefix). With `teacher_context` [B,C] the teacher sees it prepended (privileged
  context / self-distillation: pass the same model twice). Keyword arguments go to
  `token_divergence` (kind, beta, chunk sizes, temperatures, ...).

  Returns:
    [B,T] float32.
  """
  tokens_BT = jnp.asarray(tokens_BT)
  chex.assert_rank(tokens_BT, 2)
  if mask_BT is not None:
    mask_BT = jnp.asarray(mask_BT).astype(jnp.bool_)
  hs = student.hidden_states(tokens_BT, None, mask_BT=mask_BT)
  hs_pred, valid_BT = scoring.next_token_hidden(hs, mask_BT)
  if teacher_context is None:
    ht = teacher.hidden_states(tokens_BT, None, mask_BT=mask_BT)
    ht_pred, _ = scoring.next_token_hidden(ht, mask_BT)
  else:
    full_tok, full_mask, c = scoring.concat_context(teacher_context, teacher_context_mask,
                                                    tokens_BT, mask_BT)
    ht = teacher.hidden_states(full_tok, None, mask_BT=full_mask)
    ht_pred, _ = scoring.next_token_hidden(ht, full_mask)
    ht_pred = ht_pred[:, c:]
  ws = student.unembedding().astype(hs.dtype)
  wt = teacher.unembedding().astype(ht.dtype)
  return token_divergence(hs_pred, ws, ht_pred, wt, mask_BT=valid_BT, **kwargs)


# --------------------------------------------------------------------------
# Top-k variants.
# --------------------------------------------------------------------------


def topk_divergence(
    *,
    logprob_student: ArrayLike,
    logprob_teacher: ArrayLike,
    kind: DivergenceKind = "reverse_kl",
    tail: TailMode = "bucket",
    beta: ArrayLike = 0.5,
    squared: bool = True,
    stop_teacher_gradient: bool = True,
    mask: ArrayLike | None = None,
) -> Array:
  """Divergence restricted to a set of K ids per position (e.g. the teacher's top-k).

  Inputs are *full-softmax* log-probs of the same K ids under each model: typically
  ``ids, logprob_teacher = scoring.token_topk(teacher_h, Wt, K)`` and, differentiably,
  ``logprob_student = scoring.token_logprobs(student_h, Ws, ids)`` ([B,T,K]). Both are mapped
  to buckets by `topk_buckets` (``tail="bucket"``: K ids + one tail bucket holding the rest of
  the mass, floored at TAIL_FLOOR = 1e-8 — the convention of
  methods/distill_and_structure.md, a standard approximation; ``tail="renormalize"``: both
  renormalised over the K ids) and compared with `divergence_from_logprobs`. With the tail
  bucket, and K = V, the result equals the full divergence; for K < V it is the divergence of
  the coarsened distributions, a lower bound of the full one for every f-divergence here (data
  processing inequality).

  Args:
    logprob_student: [..., K] float (differentiable).
    logprob_teacher: [..., K] float.
    kind, beta, squared, stop_teacher_gradient, mask: as in `divergence_from_logprobs`.
    tail: "bucket" (default) or "renormalize" (static).

  Returns:
    [...] float32.

  Example (methods/distill_and_structure.md A1, no tail mass):
    >>> s = jnp.log(jnp.array([0.6, 0.3, 0.1])); t = jnp.log(jnp.array([0.5, 0.4, 0.1]))
    >>> round(float(topk_divergence(logprob_student=s, logprob_teacher=t,
    ...                             tail="renormalize")), 6)
    0.023088
  """
  lp_s = jnp.asarray(logprob_student, jnp.float32)
  lp_t = jnp.asarray(logprob_teacher, jnp.float32)
  chex.assert_equal_shape([lp_s, lp_t])
  return divergence_from_logprobs(topk_buckets(lp_s, tail=tail), topk_buckets(lp_t, tail=tail),
                                  kind=kind, beta=beta, squared=squared,
                                  stop_teacher_gradient=stop_teacher_gradient, mask=mask)
