"""Shared pieces of the token-family tests: a float64 loop reference of the GRPO sequence
advantage and a hypothesis strategy for batches carrying every field these estimators read.

Shapes are fixed (N=4 groups x G=4 samples, T=6 tokens, M=2 interventions) so that each
static configuration compiles once per test module.
"""
from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

N, G, T, M = 4, 4, 6, 2
B = N * G
EPS = 1e-6


def ref_grpo(reward, group_id, mask, *, num_groups=N, group_size=None, group_std="unbiased",
             singleton="zero", eps=EPS):
  """Â_b per row (float64 loops); invalid rows, singletons ("zero") and equal groups give 0."""
  reward = np.asarray(reward, np.float64)
  nb = mask.shape[0]
  gid = (np.arange(nb) // group_size if group_size is not None else np.asarray(group_id))
  valid = [bool(mask[b].any()) and (group_size is not None or 0 <= gid[b] < num_groups)
           for b in range(nb)]
  adv = np.zeros(nb)
  for b in range(nb):
    if not valid[b]:
      continue
    members = [reward[j] for j in range(nb) if valid[j] and gid[j] == gid[b]]
    n = len(members)
    if n == 1:
      adv[b] = reward[b] if singleton == "raw" else 0.0
      continue
    mu = sum(members) / n
    if group_std == "none":
      adv[b] = reward[b] - mu
      continue
    ss = sum((x - mu) ** 2 for x in members)
    sigma = math.sqrt(ss / (n - 1 if group_std == "unbiased" else n))
    adv[b] = (reward[b] - mu) / (sigma + eps)
  return adv


def valid_tokens(mask, b):
  return [t for t in range(mask.shape[1]) if mask[b, t]]


@st.composite
def batches(draw, contiguous=False):
  """A batch with rewards, a holey mask, group ids (some out of range) and every token field."""
  rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
  reward = np.array(draw(st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, -1.0]),
                                  min_size=B, max_size=B)), np.float32)
  lengths = np.array(draw(st.lists(st.integers(0, T), min_size=B, max_size=B)))
  mask = np.arange(T)[None, :] < lengths[:, None]
  if draw(st.booleans()):  # holes: observation tokens inside the response
    mask &= rng.random((B, T)) > 0.3
  if contiguous:
    gid = np.arange(B, dtype=np.int32) // G
  else:
    gid = np.array(draw(st.lists(st.integers(-1, N), min_size=B, max_size=B)), np.int32)
  lp = lambda *shape: rng.uniform(-4, 0, shape).astype(np.float32)
  lp_old = lp(B, T)
  lp_pos, lp_neg = lp(B, T), lp(B, T)
  lp_int = lp(B, T, M)
  if draw(st.booleans()):  # some contexts change nothing
    same = rng.random((B, T)) < 0.4
    lp_pos = np.where(same, lp_old, lp_pos)
    lp_neg = np.where(same, lp_old, lp_neg)
    lp_int = np.where(same[..., None], lp_old[..., None], lp_int).astype(np.float32)
  entropy = rng.uniform(0, 3, (B, T)).astype(np.float32)
  entropy = np.where(rng.random((B, T)) < 0.2, 0.0, entropy).astype(np.float32)
  flags = rng.random((B, T)) < 0.3
  return dict(reward=reward, group_id=gid, response_mask=mask, logprob_old=lp_old,
              logprob_alt_pos=lp_pos, logprob_alt_neg=lp_neg,
              logprob_interventions=lp_int, entropy=entropy, flag_mask=flags)


def pick(b, *names):
  return {k: b[k] for k in names}
