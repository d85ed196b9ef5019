"""Shared pieces of the likelihood-reward tests: a float64 loop reference of the group
baselines and a hypothesis strategy for batches with answer and follow-up log-probs.

Fixed shapes (N=4 groups x G=4, T=6 response tokens, A=4 answer tokens, F=3 follow-ups) so
each static configuration compiles once per module.
"""
from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

N, G, T, A, F = 4, 4, 6, 4, 3
B = N * G


def valid_rows(mask, gid, num_groups=N, group_size=None, extra=None):
  nb = mask.shape[0]
  return [bool(mask[b].any()) and (group_size is not None or 0 <= gid[b] < num_groups)
          and (extra is None or bool(extra[b])) for b in range(nb)]


def ref_baseline(score, gid, valid, baseline, eps=1e-6):
  """Per-row advantage [B] (float64 loops): RLOO or GRPO (unbiased std); 0 for invalid
  rows and singletons."""
  nb = len(score)
  out = np.zeros(nb)
  for b in range(nb):
    if not valid[b]:
      continue
    members = [float(score[j]) for j in range(nb) if valid[j] and gid[j] == gid[b]]
    n = len(members)
    if n < 2:
      continue
    mu = sum(members) / n
    if baseline == "rloo":
      out[b] = float(score[b]) - (sum(members) - float(score[b])) / (n - 1)
    else:
      sd = math.sqrt(sum((x - mu) ** 2 for x in members) / (n - 1))
      out[b] = (float(score[b]) - mu) / (sd + eps)
  return out


def to_tokens(adv_B, mask):
  return np.where(mask, np.asarray(adv_B)[:, None], 0.0)


@st.composite
def batches(draw, contiguous=False):
  rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
  lengths = np.array(draw(st.lists(st.integers(0, T), min_size=B, max_size=B)))
  mask = np.arange(T)[None, :] < lengths[:, None]
  if contiguous:
    gid = np.arange(B, dtype=np.int32) // G
  else:
    gid = np.array(draw(st.lists(st.integers(-1, N), min_size=B, max_size=B)), np.int32)
  alen = rng.integers(0, A + 1, B)
  amask = np.arange(A)[None, :] < alen[:, None]
  scale = draw(st.sampled_from([0.3, 2.0]))
  lp = -np.abs(rng.normal(size=(B, A)) * scale).astype(np.float32)
  prior = -np.abs(rng.normal(size=(B, A)) * scale * 2).astype(np.float32)
  if draw(st.booleans()):       # some rows share their answer log-probs (ties)
    lp[1::3] = lp[0::3][: lp[1::3].shape[0]]
  follow = (-np.abs(rng.normal(size=(B, F))) * 2).astype(np.float32)
  return dict(group_id=gid, response_mask=mask, logprob_answer=lp, answer_mask=amask,
              logprob_answer_prior=prior, logprob_followup=follow)


def answer_rows(lp, amask):
  """[(list of valid answer log-probs)] per row."""
  return [[float(lp[b, j]) for j in range(lp.shape[1]) if amask[b, j]]
          for b in range(lp.shape[0])]
