"""Float64 loop references of the step-level distillation estimators (SOD, SSPO, PCSD, PBSD,
VERPO) and a batch generator carrying every field they read.

Written from the formulas (see each method's docs page), independently of the JAX code.
Shapes are fixed (N=2 groups x
G=4 samples, T=7 tokens, K=3 turns) so each static configuration compiles once.
"""
from __future__ import annotations

import functools
import math

import jax
import numpy as np

from tests.advantages.token._ref import ref_grpo

N, G, T, K = 2, 4, 7, 3
B = N * G
EPS = 1e-6
FLOOR = -20.0


def make_batch(seed, *, contiguous=True, equal_group=True, holes=True, extreme=True):
  """Rewards (group 0 all equal), holey masks, an empty row, step/turn ids, log-probs with
  some teacher == student tokens and some teacher log-probs of −inf / −1e9."""
  rng = np.random.default_rng(seed)
  reward = rng.choice([0.0, 1.0], B).astype(np.float32)
  if equal_group:
    reward[:G] = 1.0
  lengths = rng.integers(1, T + 1, B)
  lengths[B - 1] = 0
  mask = np.arange(T)[None, :] < lengths[:, None]
  if holes:
    mask &= rng.random((B, T)) > 0.3
  inc = rng.random((B, T)) < 0.4
  step_id = np.where(mask, np.cumsum(inc, axis=1), -1).astype(np.int32)  # ids may exceed S
  turn_id = np.where(mask | (rng.random((B, T)) < 0.5),
                     np.minimum(np.arange(T) // 3, K - 1), -1).astype(np.int32)
  step_mask = np.stack([(turn_id == k).any(1) for k in range(K)], 1)
  lp_old = rng.uniform(-4.0, -0.01, (B, T)).astype(np.float32)
  lp_t = rng.uniform(-4.0, -0.01, (B, T)).astype(np.float32)
  lp_t = np.where(rng.random((B, T)) < 0.25, lp_old, lp_t).astype(np.float32)
  lp_alt = rng.uniform(-4.0, -0.01, (B, T)).astype(np.float32)
  if extreme:
    lp_t[0, 0], lp_t[5, 1] = -np.inf, -1e9
  gid = np.arange(B, dtype=np.int32) // G
  if not contiguous:
    gid = gid[rng.permutation(B)]
  return dict(reward=reward, group_id=gid, response_mask=mask, logprob_old=lp_old,
              logprob_teacher=lp_t, logprob_alt=lp_alt, step_id=step_id, turn_id=turn_id,
              step_mask=step_mask)


STATIC = ("num_groups", "group_size", "mode", "num_steps", "num_turns", "window", "ddof",
          "group_std", "use_alt_reference", "scale")


def call(fn, **kw):
  """fn(**kw) under jit, static arguments bound (one compile instead of eager dispatch)."""
  static = {k: kw.pop(k) for k in STATIC if k in kw}
  out = jax.jit(functools.partial(fn, **static))(**kw)
  return jax.tree.map(np.asarray, out)


def pick(b, *names):
  return {n: b[n] for n in names}


def _lp(b, name, i, t):
  return max(float(b[name][i, t]), FLOOR)


def _valid(b, i):
  return [t for t in range(b["response_mask"].shape[1]) if b["response_mask"][i, t]]


def _adv(b, group_size=None, group_std="unbiased", num_groups=N):
  return ref_grpo(b["reward"], b["group_id"], b["response_mask"], num_groups=num_groups,
                  group_size=group_size, group_std=group_std)


def ref_sod(b, *, mode="stepwise", num_steps=16, alpha=1.0, delta=0.2, gamma=1.0,
            beta_min=0.0, beta_max=0.1, group_std="unbiased", group_size=None, eps=EPS):
  adv = _adv(b, group_size, group_std)
  out = np.zeros(b["response_mask"].shape)
  for i in range(out.shape[0]):
    ts = _valid(b, i)
    if not ts:
      continue
    diff = {t: _lp(b, "logprob_teacher", i, t) - _lp(b, "logprob_old", i, t) for t in ts}
    if mode == "gated":
      beta = beta_min + (beta_max - beta_min) / (1.0 + math.exp(gamma * adv[i]))
      for t in ts:
        out[i, t] = adv[i] + beta * diff[t]
      continue
    step, k = {}, -1
    for t in ts:                       # runs of consecutive valid tokens
      if t == 0 or t - 1 not in diff:
        k += 1
      step[t] = min(k, num_steps - 1)
    d = {}
    for s in set(step.values()):
      vals = [abs(diff[t]) for t in ts if step[t] == s]
      d[s] = sum(vals) / len(vals)
    for t in ts:
      w = min((d[0] + eps) / (d[step[t]] + eps), 1.0 + delta)
      out[i, t] = adv[i] + alpha * w * diff[t]
  return out


def ref_sspo(b, *, num_steps=16, success_threshold=1.0, omega_min=0.0, omega_max=3.0,
             group_std="unbiased", group_size=None):
  adv = _adv(b, group_size, group_std)
  out = np.zeros(b["response_mask"].shape)
  for i in range(out.shape[0]):
    ts = _valid(b, i)
    if not ts:
      continue
    step = {t: min(int(b["step_id"][i, t]), num_steps - 1) for t in ts
            if b["step_id"][i, t] >= 0}
    d = {}
    for s in set(step.values()):
      vals = [abs(_lp(b, "logprob_teacher", i, t) - _lp(b, "logprob_old", i, t))
              for t in step if step[t] == s]
      d[s] = sum(vals) / len(vals)
    total = sum(d.values())
    for t in ts:
      if b["reward"][i] >= success_threshold or t not in step:
        w = 1.0
      else:
        w = len(d) * d[step[t]] / total if total > 0 else 1.0
        w = min(max(w, omega_min), omega_max)
      out[i, t] = adv[i] * w
  return out


def ref_pcsd_parts(b, i, *, window=3, decay=0.5, eta=1.0, kappa=5.0, tau=0.0):
  """{t: (s, P, P̃, w)} of row i."""
  ts = _valid(b, i)
  s = {t: _lp(b, "logprob_teacher", i, t) - _lp(b, "logprob_old", i, t) for t in ts}
  sid = b["step_id"][i]

  def linked(t):          # t continues the run of t − 1 inside one step
    return t - 1 in s and sid[t] >= 0 and sid[t] == sid[t - 1]

  res, prev_p = {}, None
  for t in ts:
    run = 1
    while run < window and linked(t - run + 1):
      run += 1
    num = sum(decay ** j * s[t - j] for j in range(run))
    den = sum(decay ** j for j in range(run))
    p = num / den
    delta = p - prev_p if linked(t) else 0.0
    pt = p - eta * max(0.0, -delta)
    w = 1.0 / (1.0 + math.exp(-kappa * (pt - tau)))
    res[t] = (s[t], p, pt, w)
    prev_p = p
  return res


def ref_pcsd(b, *, beta=1.0, group_std="unbiased", group_size=None, **kw):
  adv = _adv(b, group_size, group_std)
  out = np.zeros(b["response_mask"].shape)
  for i in range(out.shape[0]):
    for t, (s, _, _, w) in ref_pcsd_parts(b, i, **kw).items():
      out[i, t] = adv[i] + beta * w * s
  return out


def ref_pbsd_evidence(b):
  """[B,K] e of the valid turns (0 elsewhere) and the [B,K] validity of the cells."""
  mask = b["response_mask"]
  e = np.zeros((B, K))
  for i in range(B):
    for t in _valid(b, i):
      k = int(b["turn_id"][i, t])
      if 0 <= k < K:
        e[i, k] += _lp(b, "logprob_teacher", i, t) - _lp(b, "logprob_old", i, t)
  row = mask.any(1) & (b["group_id"] >= 0) & (b["group_id"] < N)
  return e, b["step_mask"].astype(bool) & row[:, None]


def ref_pbsd(b, *, lam=0.5, mode="additive", ddof=0, group_std="unbiased", eps=EPS):
  adv = _adv(b, None, group_std)
  e, valid = ref_pbsd_evidence(b)
  et = np.zeros_like(e)
  for g in range(N):
    cells = [(i, k) for i in range(B) for k in range(K)
             if valid[i, k] and b["group_id"][i] == g]
    if len(cells) < 2:
      continue
    vals = np.array([e[c] for c in cells])
    mu = vals.mean()
    sd = math.sqrt(((vals - mu) ** 2).sum() / (len(vals) - ddof))
    for c in cells:
      et[c] = (e[c] - mu) / (sd + eps)
  out = np.zeros(b["response_mask"].shape)
  for i in range(B):
    for t in _valid(b, i):
      k = int(b["turn_id"][i, t])
      x = et[i, k] if 0 <= k < K else 0.0
      out[i, t] = adv[i] + lam * x if mode == "additive" else adv[i] * (1 + lam * math.tanh(x))
  return out


def ref_verpo(b, *, use_alt_reference=False, rho=0.2, lambda_fisher=1.0, gamma0=0.0,
              gamma1=1.0, group_std="unbiased", group_size=None):
  adv = _adv(b, group_size, group_std)
  out = np.zeros(b["response_mask"].shape)
  for i in range(out.shape[0]):
    ts = _valid(b, i)
    if not ts:
      continue
    ls = {t: _lp(b, "logprob_old", i, t) for t in ts}
    le = {t: _lp(b, "logprob_teacher", i, t) for t in ts}
    l0 = {t: _lp(b, "logprob_alt", i, t) for t in ts} if use_alt_reference else ls
    e = {t: le[t] - l0[t] for t in ts}
    acc = [t for t in ts if adv[i] != 0 and np.sign(e[t]) == np.sign(adv[i])]
    k = max(1, math.floor(np.float32(rho) * np.float32(len(ts))))
    kept = set(sorted(acc, key=lambda t: (-abs(np.float32(e[t])), t))[:k])
    for t in ts:
      corr = 0.0
      if t in kept:
        p = math.exp(ls[t])
        s = min(1.0, abs(adv[i]) * abs(e[t]) / (lambda_fisher * p * (1 - p) + 1e-6))
        corr = s * e[t]
      out[i, t] = adv[i] + gamma0 * (l0[t] - ls[t]) + gamma1 * corr
  return out
