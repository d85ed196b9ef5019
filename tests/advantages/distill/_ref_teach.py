"""Float64 loop references (numpy) of the OPD / SCOPE / DiffGate / HyperEyes / JOLT / SOLID
estimators (credit/advantages/distill/), written from the formulas (HyperEyes from the
authors' code), and a batch generator.

Shapes are fixed (N=3 groups x G=4 samples, T=5) so that each static configuration compiles
once per test module.
"""
from __future__ import annotations

import math

import numpy as np

N, G, T = 3, 4, 5
B = N * G
EPS = 1e-6
FLOOR = -20.0


def batch(seed: int, *, contiguous: bool = False) -> dict:
  """A batch with masked tokens (holes and empty rows), an all-equal group (group 0),
  out-of-range group ids (segment path), -inf / -1e9 teacher log-probs, NaN answers and
  NaN garbage under the mask."""
  rng = np.random.default_rng(seed)
  reward = rng.choice([0.0, 1.0, 0.5, -1.0], B).astype(np.float32)
  lengths = rng.integers(0, T + 1, B)
  lengths[1] = 0
  mask = np.arange(T)[None, :] < lengths[:, None]
  mask &= rng.random((B, T)) > 0.2
  gid = np.arange(B, dtype=np.int32) // G
  if not contiguous:
    gid = gid[rng.permutation(B)]
    gid[rng.integers(0, B)] = -1
    gid[:G] = 0
  reward[gid == 0] = 1.0 if seed % 2 else 0.0      # an all-equal group
  lp = lambda: rng.uniform(-4.0, -0.01, (B, T)).astype(np.float32)
  old, teacher, alt = lp(), lp(), lp()
  teacher[rng.random((B, T)) < 0.1] = -np.inf
  teacher[rng.random((B, T)) < 0.1] = -1e9
  teacher = np.where(rng.random((B, T)) < 0.2, old, teacher).astype(np.float32)
  for x in (old, teacher, alt):
    x[~mask & (rng.random((B, T)) < 0.3)] = np.nan
  answer = rng.choice([3.0, 3.0000001, 7.0, 12.0, np.nan], B).astype(np.float32)
  return dict(reward=reward, group_id=gid, response_mask=mask, logprob_old=old,
              logprob_teacher=teacher, logprob_alt=alt, answer_value=answer)


def pick(b: dict, *names: str) -> dict:
  return {k: b[k] for k in names}


def _gid(b, group_size):
  return (np.arange(B) // group_size if group_size is not None else b["group_id"])


def row_valid(b, group_size=None, num_groups=N):
  gid = _gid(b, group_size)
  return np.array([bool(b["response_mask"][i].any())
                   and (group_size is not None or 0 <= gid[i] < num_groups)
                   for i in range(B)])


def grpo(values, b, valid, group_size=None, eps=EPS, ddof=1):
  """(R − μ_g)/(σ_g + ε) over the valid rows; 0 for invalid rows and groups of one."""
  gid = _gid(b, group_size)
  out = np.zeros(B)
  for i in range(B):
    if not valid[i]:
      continue
    xs = [float(values[j]) for j in range(B) if valid[j] and gid[j] == gid[i]]
    n = len(xs)
    if n < 2:
      continue
    mu = sum(xs) / n
    sd = math.sqrt(sum((x - mu) ** 2 for x in xs) / (n - ddof))
    out[i] = (float(values[i]) - mu) / (sd + eps)
  return out


def gap(b, i, t, teacher="logprob_teacher", student="logprob_old"):
  return max(float(b[teacher][i, t]), FLOOR) - float(b[student][i, t])


def tokens(b, i):
  return [t for t in range(T) if b["response_mask"][i, t]]


def ref_opd(b, kl_coef=1.0, outcome_coef=0.0, group_size=None):
  out = np.zeros((B, T))
  adv = grpo(b["reward"], b, row_valid(b, group_size), group_size) if outcome_coef else None
  for i in range(B):
    for t in tokens(b, i):
      out[i, t] = kl_coef * gap(b, i, t) + (outcome_coef * adv[i] if outcome_coef else 0.0)
  return out


def ref_jolt_teacher(b, kl_coef=0.05, group_size=None):
  valid = row_valid(b, group_size)
  adv = grpo(b["reward"], b, valid, group_size)
  out = np.zeros((B, T))
  for i in range(B):
    if not valid[i]:
      continue
    for t in tokens(b, i):
      kl = float(b["logprob_old"][i, t]) - max(float(b["logprob_alt"][i, t]), FLOOR)
      out[i, t] = adv[i] - kl_coef * kl
  return out


def ref_scope_weights(b, success_threshold=1.0, temperature=1.0, group_size=None):
  valid = row_valid(b, group_size)
  gid = _gid(b, group_size)
  correct = b["reward"] >= success_threshold
  x = np.zeros(B)
  for i in range(B):
    ts = tokens(b, i)
    if not ts:
      continue
    if correct[i]:    # x = PPLˢ
      raw = math.exp(-sum(float(b["logprob_old"][i, t]) for t in ts) / len(ts))
    else:             # x = 1 / PPLᵀ
      ppl_t = math.exp(-sum(max(float(b["logprob_teacher"][i, t]), FLOOR) for t in ts)
                       / len(ts))
      raw = 1.0 / ppl_t
    x[i] = raw ** (1.0 / temperature)
  w = np.zeros(B)
  for i in range(B):
    if valid[i]:
      peers = [x[j] for j in range(B) if valid[j] and gid[j] == gid[i]
               and correct[j] == correct[i]]
      w[i] = x[i] / (sum(peers) / len(peers))
  return w


def ref_scope(b, mle_coef=1.0, success_threshold=1.0, temperature=1.0, group_size=None):
  w = ref_scope_weights(b, success_threshold, temperature, group_size)
  out = np.zeros((B, T))
  for i in range(B):
    for t in tokens(b, i):
      out[i, t] = (mle_coef * w[i] if b["reward"][i] >= success_threshold
                   else w[i] * gap(b, i, t))
  return out


def ref_diffgate(b, coef=1.0, bound=1.0, success_threshold=1.0, group_size=None):
  valid = row_valid(b, group_size)
  gid = _gid(b, group_size)
  adv = grpo(b["reward"], b, valid, group_size)
  fail = b["reward"] < success_threshold
  out = np.zeros((B, T))
  for i in range(B):
    if not valid[i]:
      continue
    members = [j for j in range(B) if valid[j] and gid[j] == gid[i]]
    d = sum(fail[j] for j in members) / len(members)
    for t in tokens(b, i):
      bounded = bound * math.tanh(gap(b, i, t) / bound)
      out[i, t] = adv[i] + coef * d * fail[i] * bounded
  return out


def ref_hypereyes(b, form="code", kl_coef=None, group_size=None):
  """The code's post_process_rewards (anomalies ≤ −99 out, std denominator max(n−1,1),
  ≤1 valid → 0) then adv −= β·(ℓˢ − ℓᵀ) on rows with reward ≤ 0."""
  r = b["reward"].astype(np.float64)
  valid = row_valid(b, group_size) & (r > -99.0)
  gid = _gid(b, group_size)
  adv = np.zeros(B)
  for i in range(B):
    if not valid[i]:
      continue
    xs = [r[j] for j in range(B) if valid[j] and gid[j] == gid[i]]
    if len(xs) <= 1:
      continue
    mu = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mu) ** 2 for x in xs) / max(len(xs) - 1, 1))
    adv[i] = (r[i] - mu) / (sd + EPS)
  beta = kl_coef if kl_coef is not None else (0.05 if form == "code" else 1.0)
  fail = r <= 0.0 if form == "code" else r < 1.0
  out = np.zeros((B, T))
  for i in range(B):
    if not valid[i]:
      continue
    for t in tokens(b, i):
      out[i, t] = adv[i] - (beta * (-gap(b, i, t)) if fail[i] else 0.0)
  return out


def ref_solid_labels(b, tol=1e-6, min_support=2, group_size=None):
  valid = row_valid(b, group_size)
  gid = _gid(b, group_size)
  o = b["answer_value"].astype(np.float64)
  ok = valid & np.isfinite(o)
  o32 = b["answer_value"]
  adj = lambda i, j: (ok[i] and ok[j] and gid[i] == gid[j]
                      and abs(float(o32[i]) - float(o32[j]))
                      <= np.float32(tol) * max(1.0, abs(float(o32[j]))))
  support = np.array([sum(adj(i, j) for j in range(B)) for i in range(B)], float)
  label, majority = np.zeros(B), np.zeros(B, bool)
  for g in set(gid[valid].tolist()):
    members = [i for i in range(B) if valid[i] and gid[i] == g]
    answered = [i for i in members if ok[i]]
    if not answered:
      continue
    rep = max(answered, key=lambda i: (support[i], -i))
    if support[rep] < min_support:
      continue
    if any(support[j] == support[rep] and not adj(rep, j) for j in answered):
      continue  # two clusters tied for the most support: no majority
    for i in members:
      majority[i] = True
      label[i] = float(adj(rep, i))
  return label, support, majority


def ref_solid(b, coef=1.0, tol=1e-6, min_support=2, group_size=None):
  label, _, majority = ref_solid_labels(b, tol, min_support, group_size)
  valid = row_valid(b, group_size)
  adv = grpo(label, b, valid, group_size)
  out = np.zeros((B, T))
  for i in range(B):
    if not valid[i]:
      continue
    for t in tokens(b, i):
      out[i, t] = adv[i] + coef * majority[i] * (1.0 - label[i]) * gap(b, i, t)
  return out
