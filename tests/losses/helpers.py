"""Shared inputs, numpy references and cached jitted programs of the loss tests."""
from __future__ import annotations

import functools
import inspect
import math

import hypothesis.extra.numpy as hnp
import jax
import numpy as np
from hypothesis import strategies as st

from credit.registry import get_policy_loss, list_policy_losses

B, T = 8, 6
# The losses defined in credit.losses.policy (a user's registered loss is not tested here).
NAMES = [n for n in list_policy_losses()
         if get_policy_loss(n).token_fn.__module__.startswith("credit.losses.policy.")]
ROW_LOCAL = [n for n in NAMES if not get_policy_loss(n).batch_coupled]
EXPECTED = {"ppo_clip", "dcpo", "gspo", "cispo", "sapo", "gmpo", "gpg", "clip_cov", "kl_cov",
            "dro", "luspo", "vespo", "dppo_tv", "dppo_kl"}


def fn_of(name):
  return get_policy_loss(name).fn


def default_mode(name):
  return inspect.signature(fn_of(name)).parameters["loss_agg_mode"].default


# --------------------------------------------------------------------------
# numpy float64 references (explicit loops).
# --------------------------------------------------------------------------


def np_aggregate(l, m, mode, C=None, nt=None, ns=None):
  l = np.where(m, l, 0.0).astype(np.float64)
  lens = m.sum(1)
  rows = max((lens > 0).sum(), 1) if ns is None else ns
  ntok = max(m.sum(), 1) if nt is None else nt
  if mode == "token-mean":
    return l.sum() / ntok
  if mode == "seq-mean-token-mean":
    return sum(l[i].sum() / max(lens[i], 1) for i in range(len(l))) / rows
  if mode == "seq-mean-token-sum":
    return l.sum() / rows
  if mode == "seq-mean-token-sum-norm":
    return l.sum() / C
  if mode == "seq-mean-token-sum-norm-batch":
    return l.sum() / (rows * C)
  if mode == "token-sum":
    return l.sum()
  raise ValueError(mode)


def _np_cov(lp, adv, m):
  a_mean = adv[m].mean() if m.any() else 0.0
  l_mean = lp[m].mean() if m.any() else 0.0
  return (adv - a_mean) * (lp - l_mean)


def _np_bucket_divergence(s, t, kind):
  """Divergence of two bucket distributions given as log-probs (1-D float64)."""
  p, q = np.exp(s), np.exp(t)
  if kind == "reverse_kl":
    return sum(p[j] * (s[j] - t[j]) for j in range(len(p)))
  mid = 0.5 * (p + q)
  return sum(0.5 * p[j] * math.log(p[j] / mid[j]) + 0.5 * q[j] * math.log(q[j] / mid[j])
             for j in range(len(p)))


def np_dppo_token_loss(kind, lp, old, adv, m, clip_low=None, clip_high=None, clip_ratio_c=20.0):
  """verl's `compute_policy_loss_dppo_tv` / `_kl` per-token loss in float64 numpy, written
  from the code (NaN from a log of a negative number compares false, as in torch).

  Returns (loss [B,T], valid [B,T] bool), or None when a float32 rounding decides whether
  a token is inside the trust region.
  """
  delta = {"tv": 0.15, "kl": 0.05}[kind]
  lo = delta if clip_low is None else clip_low
  hi = delta if clip_high is None else clip_high
  lp, old, adv = (np.where(m, a, 0.0).astype(np.float64) for a in (lp, old, adv))
  ratio = np.exp(np.clip(lp - old, -20.0, 20.0))
  trunc = np.minimum(ratio, clip_ratio_c)
  p, q = np.exp(lp), np.exp(old)
  if kind == "tv":
    valid = np.where(adv > 0, (p - q) <= hi, (p - q) >= -lo)
    near = (np.abs(p - q - hi) < 1e-5) | (np.abs(p - q + lo) < 1e-5)
  else:
    with np.errstate(invalid="ignore", divide="ignore"):
      bkl = q * (old - lp) + (1 - q) * np.log((1.0 - q + 1e-8) / (1.0 - p + 1e-8))
      valid = np.where(adv > 0, (bkl <= hi) | (p <= q), (bkl <= lo) | (p >= q))
      near = (np.abs(bkl - hi) < 1e-4) | (np.abs(bkl - lo) < 1e-4) | (
          (np.abs(lp - old) < 1e-5) & (lp != old)) | (np.abs(1.0 - p) < 1e-5)
  if np.any(m & near):
    return None
  return -adv * trunc * lp * valid, valid & m


def np_token_loss(name, lp, old, adv, m, extra=None, **hp):
  """Per-token loss [B,T] (float64) of every registered loss, written as plain loops.

  `extra`: the fields beyond the policy four (`with_needs`), for the distillation losses.
  """
  if name in ("topk_distill", "sd_search"):  # PPO clip + λ = 1 · a bucket divergence
    out = np_token_loss("ppo_clip", lp, old, adv, m)
    s = np.asarray(extra["logprob_topk"], np.float64)
    t = np.asarray(extra["teacher_topk_logprob"], np.float64)
    where = m if name == "topk_distill" else m & extra["query_mask"]
    kind = "reverse_kl" if name == "topk_distill" else "js"
    for i, j in zip(*np.nonzero(where)):
      out[i, j] += _np_bucket_divergence(s[i, j], t[i, j], kind)
    return out
  if name in ("dppo_tv", "dppo_kl"):
    out = np_dppo_token_loss(name[5:], lp, old, adv, m, **hp)
    return None if out is None else out[0]
  if name == "slate_step":  # no tree fields: one candidate set of all rows (SLATE's Eq. 7)
    lp, old, adv = (np.where(m, a, 0.0).astype(np.float64) for a in (lp, old, adv))
    lens = m.sum(1)
    rows = max((lens > 0).sum(), 1)
    out = np.zeros(lp.shape)
    for i in np.nonzero(lens)[0]:
      r = math.exp(np.clip(lp[i] - old[i], -20, 20)[m[i]].mean())
      a_i = adv[i][m[i]].mean()
      obj = min(r * a_i, min(max(r, 0.8), 1.2) * a_i)
      out[i, m[i]] = -obj / rows / lens[i]
    return out
  lp, old, adv = (np.where(m, a, 0.0).astype(np.float64) for a in (lp, old, adv))
  Bn, Tn = lp.shape
  d = np.clip(lp - old, -20, 20)
  r = np.exp(d)
  out = np.zeros((Bn, Tn))
  lens = m.sum(1)
  if name == "a2tgpo":  # without turn fields, A2TGPO's per-turn clip is PPO-clip's ε0 = 0.2
    name = "ppo_clip"
  if name == "decoupled_ppo":  # the per-token term: PPO clip, ε 0.4, no dual clip
    hp = dict({"clip_low": 0.4, "clip_high": 0.4, "clip_ratio_c": None}, **hp)
    name = "ppo_clip"
  if name in ("ppo_clip", "dcpo", "clip_cov"):
    eps_l, eps_h = hp.get("clip_low", 0.16 if name == "dcpo" else 0.2), hp.get(
        "clip_high", 0.2)
    c = hp.get("clip_ratio_c", {"ppo_clip": 3.0, "dcpo": 10.0, "clip_cov": None}[name])
    for i in range(Bn):
      for t in range(Tn):
        if name == "dcpo":
          q = max(math.exp(old[i, t]), 1e-30)
          lo = 0.5 + 0.5 * math.sqrt(max(1 - 4 * eps_l / q, 0.0))
          hi = min(0.5 + 0.5 * math.sqrt(1 + 4 * eps_h / q), max(c, 10.0))
        else:
          lo, hi = 1 - eps_l, 1 + eps_h
        a = adv[i, t]
        lc = max(-a * r[i, t], -a * min(max(r[i, t], lo), hi))
        out[i, t] = min(lc, -a * c) if (c is not None and a < 0) else lc
    if name == "clip_cov":
      clipped = np.zeros((Bn, Tn), bool)
      for i in range(Bn):
        for t in range(Tn):
          a = adv[i, t]
          clipped[i, t] = -a * min(max(r[i, t], 0.8), 1.2) > -a * r[i, t]
      cov = _np_cov(lp, adv, m)
      near = (np.abs(cov - 1.0) < 1e-3) | (np.abs(cov - 5.0) < 1e-3) | (
          np.abs(r - 0.8) < 1e-4) | (np.abs(r - 1.2) < 1e-4)
      if np.any(near & m):
        return None  # candidate status is decided by float32 rounding
      cand = m & ~clipped & (cov > 1.0) & (cov < 5.0)
      k = max(int(math.floor(2e-4 * m.sum())), 1)
      order = sorted(zip(*np.nonzero(cand)), key=lambda it: -cov[it])
      if len(order) > k and abs(cov[order[k - 1]] - cov[order[k]]) < 1e-3:
        return None
      for it in order[:k]:
        out[it] = 0.0
    return out
  if name == "kl_cov":
    cov = _np_cov(lp, adv, m)
    k = max(int(math.floor(2e-4 * m.sum())), 1)
    order = sorted(zip(*np.nonzero(m)), key=lambda it: -cov[it])
    if len(order) > k and abs(cov[order[k - 1]] - cov[order[k]]) < 1e-3:
      return None
    out = -adv * r
    for it in order[:k]:
      out[it] += abs(d[it])
    return out
  if name in ("gspo", "luspo"):
    for i in range(Bn):
      log_s = sum(d[i, t] for t in range(Tn) if m[i, t]) / max(lens[i], 1)
      s = math.exp(min(log_s, 10.0))
      for t in range(Tn):
        a = adv[i, t]
        out[i, t] = max(-a * s, -a * min(max(s, 1 - 3e-4), 1 + 4e-4))
        if name == "luspo":
          out[i, t] *= lens[i]
    return out
  if name == "gmpo":
    for i in range(Bn):
      acc, a_sum = 0.0, 0.0
      for t in range(Tn):
        if not m[i, t]:
          continue
        a = adv[i, t]
        dc = min(max(d[i, t], -0.4), 0.4)
        if a > 0:
          acc += min(d[i, t], dc)
        elif a < 0:
          acc += max(d[i, t], dc)
        a_sum += a
      n = max(lens[i], 1)
      out[i, :] = -(a_sum / n) * math.exp(acc / n)
    return out
  if name == "m2po":  # the code's kpo_clip_harmful_tokens + _solve_tau_from_sorted_delta2
    budget = hp.get("m2_budget", 0.04)
    harm = [d[i, t] ** 2 for i in range(Bn) for t in range(Tn) if m[i, t] and (
        (adv[i, t] > 0 and r[i, t] > 1 + 1e-12) or (adv[i, t] < 0 and r[i, t] < 1 - 1e-12))]
    lo, hi = 0.0, 1e5
    n = len(harm)
    if np.any(m & (np.abs(d) < 1e-5)) or (n and abs(sum(harm) / n - budget) < 1e-4):
      return None  # harmful or not, bounded or not: decided by float32 rounding
    if n and sum(harm) / n > budget + 1e-12:
      v = sorted(harm)
      csum = np.cumsum(v)
      f = [v[k] * (n - k - 1) + csum[k] - budget * n for k in range(n)]
      k = next(k for k in range(n) if f[k] >= -1e-12)
      if abs(f[k]) < 1e-4 or (k and abs(f[k - 1]) < 1e-4) or (k > 1 and v[k - 1] - v[k - 2] < 1e-5):
        return None  # the breakpoint is decided by float32 rounding
      tau = 0.0 if k == 0 else math.sqrt(max(v[k - 1] - 1e-12, 0.0))
      lo, hi = math.exp(-tau), math.exp(tau)
      if np.any(m & ((np.abs(r - lo) < 1e-4) | (np.abs(r - hi) < 1e-4))):
        return None
    for i in range(Bn):
      for t in range(Tn):
        a = adv[i, t]
        out[i, t] = max(-a * r[i, t], -a * min(max(r[i, t], lo), hi))
    return out
  if name == "vespo":
    for i in range(Bn):
      log_w = min(max(sum(d[i, t] for t in range(Tn) if m[i, t]), -20), 20)
      pos = sum(adv[i, t] for t in range(Tn) if m[i, t]) / max(lens[i], 1) >= 0
      k, lam = (2.0, 3.0) if pos else (3.0, 2.0)
      phi = math.exp(lam + k * log_w - lam * math.exp(log_w))
      for t in range(Tn):
        out[i, t] = -phi * adv[i, t] * lp[i, t]
    return out
  for i in range(Bn):
    for t in range(Tn):
      a, x = adv[i, t], lp[i, t]
      if name == "cispo":
        out[i, t] = -min(max(r[i, t], 0.0), 1.28) * a * x
      elif name == "gpg":
        out[i, t] = -a * x
      elif name == "dro":
        out[i, t] = -(a * x - 0.5 * d[i, t] ** 2)
      elif name == "sapo":
        tau = 1.0 if a > 0 else 1.05
        out[i, t] = -4.0 / tau / (1 + math.exp(-tau * (r[i, t] - 1))) * a
      else:
        raise KeyError(name)
  return out


# --------------------------------------------------------------------------
# Inputs and cached jitted programs (one compile per loss, shape and static config).
# --------------------------------------------------------------------------


def make_batch(seed=0, Bn=B, Tn=T, delta_scale=0.5):
  rng = np.random.default_rng(seed)
  old = -np.abs(rng.normal(size=(Bn, Tn))).astype(np.float32) - 0.05
  lp = (old + delta_scale * rng.normal(size=(Bn, Tn))).astype(np.float32)
  adv = np.repeat(rng.normal(size=(Bn, 1)), Tn, 1).astype(np.float32)
  lens = rng.integers(0, Tn + 1, size=Bn)
  lens[0] = Tn
  m = np.arange(Tn)[None, :] < lens[:, None]
  return dict(logprob=lp, logprob_old=old, advantages=adv, response_mask=m)


def one_row(lp, old, adv, mask=None):
  """A one-row batch from per-token lists and a scalar advantage."""
  lp = np.asarray(lp, np.float32).reshape(1, -1)
  return dict(logprob=lp, logprob_old=np.asarray(old, np.float32).reshape(1, -1),
              advantages=np.broadcast_to(np.float32(adv), lp.shape).copy(),
              response_mask=np.ones(lp.shape, bool) if mask is None else np.asarray(mask))


K_TOPK = 4  # teacher top-k buckets (3 ids + the tail) of the distillation losses' inputs
DISTILL = ("topk_distill", "sd_search")


def with_needs(name, batch):
  """`batch` plus the contract fields loss `name` reads beyond the policy four.

  Made deterministically from the batch's shape: normalised student and teacher bucket
  distributions [B,T,K_TOPK] and query tokens at every other position.
  """
  needs, out = get_policy_loss(name).needs, dict(batch)
  Bn, Tn = np.shape(batch["logprob"])
  rng = np.random.default_rng(1000 * Bn + Tn)
  for f in ("logprob_topk", "teacher_topk_logprob"):
    z = 1.5 * rng.normal(size=(Bn, Tn, K_TOPK))
    z -= np.log(np.exp(z).sum(-1, keepdims=True))
    if f in needs and f not in out:
      out[f] = z.astype(np.float32)
  if "query_mask" in needs and "query_mask" not in out:
    out["query_mask"] = np.broadcast_to(np.arange(Tn) % 2 == 0, (Bn, Tn)).copy()
  return out


DIFF = ("logprob", "logprob_old", "advantages", "logprob_topk", "teacher_topk_logprob")


@functools.lru_cache(maxsize=None)
def program(name, **static):
  """jit(value_and_grad) of a loss w.r.t. (logprob, logprob_old, advantages[, sampler]).

  Called as program(name, **static)(batch, hp) with `hp` a dict of traced hyperparameters;
  returns ((loss, metrics), grads dict).
  """
  fn = fn_of(name)

  def f(diff, rest, hp):
    return tuple(fn(**diff, **rest, **hp, **static))

  vg = jax.value_and_grad(f, has_aux=True)

  @jax.jit
  def run_(batch, hp):
    diff = {k: batch[k] for k in batch if k in DIFF or k == "logprob_sampler"}
    rest = {k: batch[k] for k in batch if k not in diff}
    return vg(diff, rest, hp)

  return lambda batch, hp=None: run_(batch, hp or {})


def run(name, batch, hp=None, **static):
  """Loss, metrics and gradients of loss `name` on `batch` (+ the fields `with_needs` adds)."""
  (loss, metrics), grads = program(name, **static)(with_needs(name, batch), hp)
  return loss, metrics, grads


batches = st.builds(
    lambda old, delta, adv_row, lens: dict(
        logprob_old=old, logprob=(old + delta).astype(np.float32),
        advantages=np.repeat(adv_row[:, None], T, 1), response_mask=np.arange(T)[None, :]
        < lens[:, None]),
    hnp.arrays(np.float32, (B, T), elements=st.floats(-6, -0.015625, width=32)),
    hnp.arrays(np.float32, (B, T), elements=st.floats(-1.5, 1.5, width=32)),
    hnp.arrays(np.float32, (B,), elements=st.floats(-2, 2, width=32)),
    hnp.arrays(np.int64, (B,), elements=st.integers(0, T)))
