"""Float64 loop references of the SIPO and OPID/SEED estimators, and a batch strategy.

Written from the formulas (and, for OPID, from the behaviour of jinyangwu/OPID
`gigpo/core_gigpo.py`), not from the JAX
code. Shapes are fixed (N=4 groups x G=4 samples, T=6) so each configuration compiles once.
"""
from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from tests.advantages.token._ref import ref_grpo, valid_tokens

N, G, T = 4, 4, 6
B = N * G
EPS = 1e-6


def _rows(b, group_size, num_groups=N):
  mask = b["response_mask"]
  nb = mask.shape[0]
  gid = (np.arange(nb) // group_size if group_size is not None else np.asarray(b["group_id"]))
  valid = [bool(mask[i].any()) and (group_size is not None or 0 <= gid[i] < num_groups)
           for i in range(nb)]
  return gid, valid


def ref_sipo(b, *, beta=1.0, kappa=1.0, success_threshold=1.0, contrast="group_mistake",
             group_std="unbiased", group_size=None):
  mask = b["response_mask"]
  reward = np.asarray(b["reward"], np.float64)
  adv = ref_grpo(reward, b["group_id"], mask, group_size=group_size, group_std=group_std)
  gid, valid = _rows(b, group_size)
  out = np.zeros(mask.shape)
  for i in range(mask.shape[0]):
    if not valid[i]:
      continue
    if contrast == "always":
      has = True
    else:
      has = any(valid[j] and gid[j] == gid[i] and reward[j] < success_threshold
                for j in range(mask.shape[0]))
    for t in valid_tokens(mask, i):
      d = float(b["logprob_alt_pos"][i, t]) - float(b["logprob_alt_neg"][i, t])
      d = 0.0 if math.isnan(d) else min(max(d, -kappa), kappa)
      out[i, t] = adv[i] + (beta * d if has else 0.0)
  return out


def _teacher(b, key, ok, normalize, clip, eps):
  """{(i, t): ℓ_key − ℓˢ} on valid tokens, optionally standardised over rows with a skill."""
  d = {(i, t): float(b[key][i, t]) - float(b["logprob_old"][i, t])
       for i in range(ok.shape[0]) for t in valid_tokens(ok, i)}
  if normalize:
    rows = {i for (i, _), v in d.items() if v != 0.0}
    act = [v for (i, _), v in d.items() if i in rows]
    if act:
      m = sum(act) / len(act)
      s = math.sqrt(sum((v - m) ** 2 for v in act) / len(act))
      d = {k: ((v - m) / (s + eps) if s > eps else v - m) if k[0] in rows else v
           for k, v in d.items()}
  if clip is not None:
    d = {k: min(max(v, -clip), clip) for k, v in d.items()}
  return d


def ref_opid(b, *, mode="mean_std_norm", episode_weight=0.001, step_weight=0.001,
             singleton="raw", normalize_teacher=False, clip_teacher=None, failed_only=False,
             success_threshold=1.0, group_size=None, step=False, eps=EPS):
  """OPID/SEED as the code computes it on one row per trajectory (rows == trajectories)."""
  mask = b["response_mask"]
  reward = np.asarray(b["reward"], np.float64)
  gid, valid = _rows(b, group_size)
  nb = mask.shape[0]
  adv = np.zeros(nb)
  for i in range(nb):
    if not valid[i]:
      continue
    members = [reward[j] for j in range(nb) if valid[j] and gid[j] == gid[i]]
    n = len(members)
    if n == 1:  # code: μ = 0, σ = 1
      mu, sd = (0.0, 1.0) if singleton == "raw" else (reward[i], 1.0)
    else:
      mu = sum(members) / n
      sd = math.sqrt(sum((x - mu) ** 2 for x in members) / (n - 1))
    adv[i] = (reward[i] - mu) / (sd + eps) if mode == "mean_std_norm" else reward[i] - mu
  ok = mask & np.array(valid)[:, None]
  te = _teacher(b, "logprob_alt", ok, normalize_teacher, clip_teacher, eps)
  ts = _teacher(b, "logprob_teacher", ok, normalize_teacher, clip_teacher, eps) if step else {}
  out = np.zeros(mask.shape)
  for (i, t), v in te.items():
    teach = episode_weight * v + step_weight * ts.get((i, t), 0.0)
    if failed_only and reward[i] >= success_threshold:
      teach = 0.0
    out[i, t] = adv[i] + teach
  return out


@st.composite
def batches(draw, contiguous=False):
  """Rewards (some all-equal groups), a holey mask, group ids (some out of range), and the
  log-prob fields of both methods; some rows carry no skill (ℓ_alt = ℓˢ)."""
  rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
  reward = rng.choice(np.array([0.0, 0.5, 1.0], np.float32), B)
  if draw(st.booleans()):
    reward[:G] = 1.0  # an all-correct group: no mistake to pair
  if draw(st.booleans()):
    reward[G:2 * G] = 0.0  # an all-fail group
  lengths = rng.integers(0, T + 1, B)
  mask = np.arange(T)[None, :] < lengths[:, None]
  if draw(st.booleans()):
    mask &= rng.random((B, T)) > 0.3
  gid = (np.arange(B, dtype=np.int32) // G if contiguous
         else rng.integers(-1, N + 1, B).astype(np.int32))
  lp = lambda: rng.uniform(-4, 0, (B, T)).astype(np.float32)
  lp_old = lp()
  no_skill = rng.random(B) < 0.3
  lp_alt = np.where(no_skill[:, None], lp_old, lp())
  lp_teacher = np.where(~no_skill[:, None], lp_old, lp())  # step-priority: exclusive
  return dict(reward=reward, group_id=gid, response_mask=mask, logprob_old=lp_old,
              logprob_alt=lp_alt, logprob_teacher=lp_teacher, logprob_alt_pos=lp(),
              logprob_alt_neg=lp())


def pick(b, *names):
  return {n: b[n] for n in names}
