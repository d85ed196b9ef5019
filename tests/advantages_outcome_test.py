"""Tests for credit.advantages.outcome (every registered outcome-family estimator).

Fixed shapes N=4 groups x G=4 samples, T=6 tokens (B=16, divisible by the 8 fake
devices), so each (estimator, static config) compiles once. Numpy loop
references below are written from the formulas (float64), not from the code.
"""
from __future__ import annotations

import dataclasses
import doctest
import functools
import math
from typing import Any, Callable

import chex
import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from credit import ops, registry
from credit.advantages import outcome as oc

N, G, T = 4, 4, 6
B = N * G
NUM_PROMPTS = N + 3
EXPECTED = {"dapo", "dcpo", "dr_grpo", "gae", "gdpo", "gpg", "grpo", "grpo_passk", "opo",
            "optimal_token_baseline", "reinforce_pp", "reinforce_pp_baseline", "remax", "rloo"}


# --------------------------------------------------------------------------
# Batches.
# --------------------------------------------------------------------------


def make_batch(reward, lengths, group_id, seed=0, holes=False):
  """All fields any estimator here may need, as float32/int32/bool numpy arrays."""
  rng = np.random.default_rng(seed)
  reward = np.asarray(reward, np.float32)
  lengths = np.asarray(lengths)
  nb = reward.shape[0]
  mask = np.arange(T)[None, :] < lengths[:, None]
  if holes:  # multi-turn style: observation tokens inside the response
    mask = mask & (rng.random((nb, T)) > 0.3)
  gid = np.asarray(group_id, np.int32)
  state = oc.DCPOState(count=rng.integers(0, 4, NUM_PROMPTS).astype(np.int32),
                       mean=rng.uniform(-1, 1, NUM_PROMPTS).astype(np.float32),
                       std=rng.uniform(0, 1, NUM_PROMPTS).astype(np.float32))
  return dict(
      reward=reward, group_id=gid, response_mask=mask,
      logprob_old=rng.uniform(-4, 0, (nb, T)).astype(np.float32),
      logprob_ref=rng.uniform(-4, 0, (nb, T)).astype(np.float32),
      values=rng.uniform(-1, 1, (nb, T)).astype(np.float32),
      token_reward=rng.uniform(-0.5, 0.5, (nb, T)).astype(np.float32),
      reward_baseline=rng.uniform(-1, 1, nb).astype(np.float32),
      reward_components=np.stack([reward, rng.choice([0., 1.], nb)], 1).astype(np.float32),
      sum_pi_squared=rng.uniform(0.05, 1, (nb, T)).astype(np.float32),
      is_weights=rng.uniform(0.5, 1.5, (nb, T)).astype(np.float32),
      prompt_id=((gid * 5 + 2) % NUM_PROMPTS).astype(np.int32),
      state=state)


def contiguous_ids(nb=B):
  return np.arange(nb, dtype=np.int32) // G


# --------------------------------------------------------------------------
# Numpy references (float64 loops, straight from the formulas).
# --------------------------------------------------------------------------


def _valid_groups(b, num_groups=N):
  gid, mask = b["group_id"], b["response_mask"]
  valid = mask.any(1) & (gid >= 0) & (gid < num_groups)
  groups: dict[int, list[int]] = {}
  for i in range(len(gid)):
    if valid[i]:
      groups.setdefault(int(gid[i]), []).append(i)
  return valid, list(groups.values())


def _whiten_np(x, mask):
  v = x[mask]
  if v.size < 2:
    return np.zeros_like(x)
  return np.where(mask, (x - v.mean()) / np.sqrt(v.var(ddof=1) + 1e-8), 0.0)


def _grpo_rows(b, r, scale="group", eps=1e-6, singleton="zero"):
  valid, groups = _valid_groups(b)
  out = np.zeros(len(r))
  sd_b = r[valid].std(ddof=1) if valid.sum() > 1 else 0.0
  for rows in groups:
    x = r[rows]
    if len(rows) == 1:
      out[rows] = x if singleton == "raw" else 0.0
      continue
    c = x - x.mean()
    if scale == "group":
      c = c / (x.std(ddof=1) + eps)
    elif scale == "batch":
      c = c / (sd_b + eps)
    out[rows] = c
  return out


def _bt(rows, b):
  return rows[:, None] * b["response_mask"]


def ref_grpo(b, scale="group", eps=1e-6, singleton="zero"):
  return (_bt(_grpo_rows(b, b["reward"].astype(np.float64), scale, eps, singleton), b),)


def ref_dr_grpo(b, singleton="zero"):
  return ref_grpo(b, "none", 0.0, singleton)


def ref_rloo(b, singleton="zero"):
  r = b["reward"].astype(np.float64)
  _, groups = _valid_groups(b)
  out = np.zeros(len(r))
  for rows in groups:
    n = len(rows)
    if n == 1:
      out[rows] = r[rows] if singleton == "raw" else 0.0
    else:
      out[rows] = [r[i] - (r[rows].sum() - r[i]) / (n - 1) for i in rows]
  return (_bt(out, b),)


def _token_x(b, with_tr=False, kl_coef=0.0):
  mask = b["response_mask"]
  x = np.zeros(mask.shape)
  for i in range(mask.shape[0]):
    idx = np.nonzero(mask[i])[0]
    if idx.size:
      x[i, idx[-1]] += b["reward"][i]
  if with_tr:
    x += np.where(mask, b["token_reward"], 0.0)
  if kl_coef:
    x -= kl_coef * np.where(mask, b["logprob_old"].astype(np.float64) - b["logprob_ref"], 0.0)
  return x


def ref_reinforce_pp(b, gamma=1.0, kl_coef=0.0, with_tr=False, whiten=True):
  mask = b["response_mask"]
  x = _token_x(b, with_tr, kl_coef)
  ret = np.zeros(mask.shape)
  for i in range(mask.shape[0]):
    run = 0.0
    for t in reversed(range(mask.shape[1])):
      if mask[i, t]:
        run = x[i, t] + gamma * run
        ret[i, t] = run
  return (_whiten_np(ret, mask) if whiten else ret,)


def ref_reinforce_pp_baseline(b, singleton="zero"):
  s = _grpo_rows(b, b["reward"].astype(np.float64), "none", 0.0, singleton)
  valid, _ = _valid_groups(b)
  m = b["response_mask"] & valid[:, None]
  return (_whiten_np(s[:, None] * np.ones((1, m.shape[1])), m),)


def ref_remax(b):
  return (_bt(b["reward"].astype(np.float64) - b["reward_baseline"], b),)


def ref_opo(b, singleton="zero"):
  r = b["reward"].astype(np.float64)
  length = b["response_mask"].sum(1).astype(np.float64)
  _, groups = _valid_groups(b)
  out = np.zeros(len(r))
  for rows in groups:
    if len(rows) == 1:
      out[rows] = r[rows] if singleton == "raw" else 0.0
    else:
      out[rows] = r[rows] - (length[rows] * r[rows]).sum() / length[rows].sum()
  return (_bt(out, b),)


def ref_gpg(b, alpha="valid_fraction", scale=False, eps=1e-6, singleton="zero"):
  r = b["reward"].astype(np.float64)
  valid, groups = _valid_groups(b)
  nv = valid.sum()
  if alpha == "valid_fraction":
    m = sum(len(rows) for rows in groups if np.all(r[rows] == r[rows][0]))
    a = nv / max(nv - m, 1)
  elif alpha == "nonzero_reward":
    a = nv / max((valid & (r != 0)).sum(), 1)
  else:
    a = 1.0
  out = np.zeros(len(r))
  for rows in groups:
    x = r[rows]
    if len(rows) == 1:
      out[rows] = a * x if singleton == "raw" else 0.0
      continue
    c = x - x.mean()
    if scale:
      c = c / (x.std(ddof=1) + eps)
    out[rows] = a * c
  return (_bt(out, b),)


def _comb(n, k):
  if k == 0:
    return 1
  if n < 0 or k < 0 or k > n:
    return 0
  return math.comb(n, k)


def ref_grpo_passk(b, method="best_vs_second", k=4, scale=True, eps=1e-6):
  r = b["reward"].astype(np.float64)
  _, groups = _valid_groups(b)
  out = np.zeros(len(r))
  for rows in groups:
    n = len(rows)
    if n < 2:
      continue
    x = r[rows]
    if method == "best_vs_second":
      top = np.nonzero(x == x.max())[0]
      if top.size == 1:
        gap = x.max() - x[x < x.max()].max()
        out[rows[top[0]]] = gap / (x.std(ddof=1) + eps) if scale else gap
    else:
      c = int((x > 0).sum())
      ke = min(k, n)
      rho = 1 - _comb(n - c, ke) / _comb(n, ke)
      sig = math.sqrt(max(rho * (1 - rho), 0.0))
      pos = (1 - rho) / (sig + eps)
      neg = (1 - rho - _comb(n - c - 1, ke - 1) / _comb(n - 1, ke - 1)) / (sig + eps)
      out[rows] = np.where(x > 0, pos, neg)
  return (_bt(out, b),)


def ref_gdpo(b, weights=None, batch_norm="token", eps=1e-6, singleton="zero"):
  comps = b["reward_components"].astype(np.float64)
  w = np.ones(comps.shape[1]) if weights is None else np.asarray(weights, np.float64)
  s = sum(w[k] * _grpo_rows(b, comps[:, k], "group", eps, singleton)
          for k in range(comps.shape[1]))
  valid, _ = _valid_groups(b)
  m = b["response_mask"] & valid[:, None]
  if batch_norm == "token":
    return (_whiten_np(s[:, None] * np.ones((1, m.shape[1])), m),)
  if batch_norm == "sequence" and valid.any():
    sv = s[valid]
    sd = sv.std(ddof=1) if sv.size > 1 else 0.0
    s = np.where(valid, (s - sv.mean()) / (sd + eps), 0.0)
  return (_bt(s, b),)


def ref_gae(b, gamma=1.0, lam=1.0, kl_coef=0.0, with_tr=False, whiten=True):
  mask = b["response_mask"]
  v = b["values"].astype(np.float64)
  x = _token_x(b, with_tr, kl_coef)
  adv = np.zeros(mask.shape)
  for i in range(mask.shape[0]):
    nextv, last = 0.0, 0.0
    for t in reversed(range(mask.shape[1])):
      if mask[i, t]:
        delta = x[i, t] + gamma * nextv - v[i, t]
        last = delta + gamma * lam * last
        nextv = v[i, t]
        adv[i, t] = last
  returns = np.where(mask, adv + v, 0.0)
  return (_whiten_np(adv, mask) if whiten else adv, returns)


def ref_otb(b, align="position", handle_zero_tail=True, eps=1e-8, singleton="zero",
            with_tr=False, with_is=False):
  mask = b["response_mask"]
  valid, groups = _valid_groups(b)
  x = _token_x(b, with_tr)
  g_ret = np.zeros(mask.shape)
  for i in range(mask.shape[0]):
    run = 0.0
    for t in reversed(range(mask.shape[1])):
      if mask[i, t]:
        run += x[i, t]
        g_ret[i, t] = run
  w = 1 - 2 * np.exp(b["logprob_old"].astype(np.float64)) + b["sum_pi_squared"]
  if with_is:
    w = w * b["is_weights"].astype(np.float64) ** 2
  cw = np.cumsum(np.where(mask, w, 0.0), axis=1)
  adv = np.zeros(mask.shape)
  for rows in groups:
    if len(rows) == 1:
      if singleton == "raw":
        adv[rows[0]] = g_ret[rows[0]]
      continue
    cols = {i: (list(range(mask.shape[1])) if align == "position"
                else list(np.nonzero(mask[i])[0])) for i in rows}
    for key in range(mask.shape[1]):
      members = []
      for i in rows:
        if key < len(cols[i]) and mask[i, cols[i][key]]:
          members.append((i, cols[i][key]))
      if not members:
        continue
      num = sum(g_ret[i, t] * cw[i, t] for i, t in members)
      den = sum(cw[i, t] for i, t in members) + eps
      base = 0.0 if (handle_zero_tail and len(members) == 1) else num / den
      for i, t in members:
        adv[i, t] = g_ret[i, t] - base
  return (adv,)


def _overlong_np(length, max_length, cache, f):
  return np.clip(-(length - (max_length - cache)) / cache * f, -f, 0.0)


def ref_dapo(b, max_length=None, cache_length=4096, penalty_factor=1.0, eps=1e-6,
             singleton="zero"):
  r = b["reward"].astype(np.float64)
  if max_length is not None:
    r = r + _overlong_np(b["response_mask"].sum(1), max_length, cache_length, penalty_factor)
  return (_bt(_grpo_rows(b, r, "group", eps, singleton), b),)


def ref_dcpo(b, old_stats_ratio=1.0, scale=True):
  r = b["reward"].astype(np.float64)
  st0 = b["state"]
  count = np.asarray(st0.count).astype(np.int64).copy()
  mean = np.asarray(st0.mean).astype(np.float64).copy()
  std = np.asarray(st0.std).astype(np.float64).copy()
  _, groups = _valid_groups(b)
  out = np.zeros(len(r))
  for rows in groups:
    pid = int(b["prompt_id"][rows[0]])
    n, mp, sp = count[pid], mean[pid] * old_stats_ratio, std[pid] * old_stats_ratio
    x = r[rows]
    mu_new, sd_new = x.mean(), (x.std(ddof=1) if len(rows) > 1 else 0.0)
    if n == 0:
      mu, sd = mu_new, sd_new
    else:
      mu = (n * mp + mu_new) / (n + 1)
      sd = math.sqrt((n * sp**2 + sd_new**2 + n / (n + 1) * (mu_new - mp) ** 2) / (n + 1))
    if scale:
      a_new = (x - mu_new) / sd_new if sd_new > 0 else np.zeros_like(x)
      a_tot = (x - mu) / sd if sd > 0 else np.zeros_like(x)
    else:
      a_new, a_tot = x - mu_new, x - mu
    i = n + 1
    s1 = (i - 1) / i * a_new + a_tot / i
    s2 = a_new / i + (i - 1) / i * a_tot
    out[rows] = np.where(np.abs(s1) < np.abs(s2), s1, s2)
    count[pid], mean[pid], std[pid] = n + 1, mu, sd
  return (_bt(out, b), count, mean, std)


# --------------------------------------------------------------------------
# Cases: estimator + static config + how to feed it + reference.
# --------------------------------------------------------------------------

BASE = ("reward", "group_id", "response_mask")


@dataclasses.dataclass(frozen=True)
class Case:
  id: str
  name: str
  fields: tuple[str, ...]
  ref: Callable[..., tuple]
  kwargs: tuple = ()              # hyperparameters for the estimator (hashable items)
  ref_kwargs: tuple = ()          # extra reference-only options
  group: bool = True

  def hyper(self) -> dict:
    return dict(self.kwargs)

  def data(self, b: dict) -> dict:
    return {f: b[f] for f in self.fields}

  def reference(self, b: dict) -> tuple:
    return self.ref(b, **dict(self.kwargs), **dict(self.ref_kwargs))


def _strip(kw: tuple, drop: tuple) -> tuple:
  return tuple((k, v) for k, v in kw if k not in drop)


CASES = [
    Case("grpo", "grpo", BASE, ref_grpo),
    Case("grpo_batch", "grpo", BASE, ref_grpo, (("scale", "batch"),)),
    Case("grpo_none_raw", "grpo", BASE, ref_grpo, (("scale", "none"), ("singleton", "raw"))),
    Case("dr_grpo", "dr_grpo", BASE, ref_dr_grpo),
    Case("rloo", "rloo", BASE, ref_rloo),
    Case("rloo_raw", "rloo", BASE, ref_rloo, (("singleton", "raw"),)),
    Case("reinforce_pp", "reinforce_pp", ("reward", "response_mask"), ref_reinforce_pp,
         group=False),
    Case("reinforce_pp_gamma", "reinforce_pp", ("reward", "response_mask"), ref_reinforce_pp,
         (("gamma", 0.9),), group=False),
    Case("reinforce_pp_kl", "reinforce_pp",
         ("reward", "response_mask", "logprob_old", "logprob_ref", "token_reward"),
         ref_reinforce_pp, (("gamma", 0.95), ("kl_coef", 0.1)), (("with_tr", True),),
         group=False),
    Case("reinforce_pp_baseline", "reinforce_pp_baseline", BASE, ref_reinforce_pp_baseline),
    Case("remax", "remax", ("reward", "reward_baseline", "response_mask"), ref_remax,
         group=False),
    Case("opo", "opo", BASE, ref_opo),
    Case("gpg", "gpg", BASE, ref_gpg),
    Case("gpg_verl", "gpg", BASE, ref_gpg,
         (("alpha", "nonzero_reward"), ("scale", True), ("singleton", "raw"))),
    Case("grpo_passk", "grpo_passk", BASE, ref_grpo_passk),
    Case("grpo_passk_analytic", "grpo_passk", BASE, ref_grpo_passk,
         (("method", "analytic"), ("k", 2))),
    Case("gdpo", "gdpo", ("reward_components", "group_id", "response_mask"), ref_gdpo),
    Case("gdpo_seq", "gdpo", ("reward_components", "group_id", "response_mask"), ref_gdpo,
         (("batch_norm", "sequence"), ("weights", (0.3, 0.7)))),
    Case("gae", "gae", ("reward", "values", "response_mask"), ref_gae,
         (("gamma", 0.99), ("lam", 0.95)), group=False),
    Case("gae_telescoped", "gae", ("reward", "values", "response_mask"), ref_gae, group=False),
    Case("gae_telescoped_kl", "gae",
         ("reward", "values", "response_mask", "logprob_old", "logprob_ref", "token_reward"),
         ref_gae, (("kl_coef", 0.05),), (("with_tr", True),), group=False),
    Case("gae_kl_raw", "gae",
         ("reward", "values", "response_mask", "logprob_old", "logprob_ref", "token_reward"),
         ref_gae, (("lam", 0.9), ("kl_coef", 0.05), ("whiten", False)), (("with_tr", True),),
         group=False),
    Case("optimal_token_baseline", "optimal_token_baseline",
         BASE + ("logprob_old", "sum_pi_squared"), ref_otb),
    Case("otb_tir", "optimal_token_baseline",
         BASE + ("logprob_old", "sum_pi_squared", "token_reward", "is_weights"), ref_otb,
         (("align", "valid_index"), ("handle_zero_tail", False), ("singleton", "raw")),
         (("with_tr", True), ("with_is", True))),
    Case("dapo", "dapo", BASE, ref_dapo),
    Case("dapo_overlong", "dapo", BASE, ref_dapo,
         (("max_length", 5), ("cache_length", 3), ("penalty_factor", 0.5))),
    Case("dcpo", "dcpo", BASE + ("prompt_id", "state"), ref_dcpo),
    Case("dcpo_ratio_noscale", "dcpo", BASE + ("prompt_id", "state"), ref_dcpo,
         (("old_stats_ratio", 0.8), ("scale", False))),
]
CASE_BY_ID = {c.id: c for c in CASES}
DEFAULT = {name: next(c for c in CASES if c.name == name) for name in EXPECTED}
GROUP_NAMES = sorted(n for n in EXPECTED if DEFAULT[n].group)


def _to_tuple(out) -> tuple:
  """Estimator output -> tuple of arrays comparable with a reference."""
  if isinstance(out, oc.DCPOOutput):
    return (out.advantages, out.state.count, out.state.mean, out.state.std)
  if isinstance(out, oc.GAEOutput):
    return (out.advantages, out.returns)
  return (out,)


def _hyper(case: Case, group_size: int | None, num_groups: int = N) -> dict:
  kw = case.hyper()
  if "weights" in kw:
    kw["weights"] = np.asarray(kw["weights"], np.float32)
  if case.group:
    kw.update(num_groups=num_groups, group_size=group_size)
  return kw


@functools.lru_cache(maxsize=None)
def _jitted(case_id: str, group_size: int | None):
  case = CASE_BY_ID[case_id]
  fn = registry.get_estimator(case.name).fn
  kw = _hyper(case, group_size)
  return jax.jit(lambda data: fn(**data, **kw))


def run(case: Case, b: dict, group_size: int | None = None, jit: bool = True,
        num_groups: int = N) -> tuple:
  """Calls the estimator jitted (cached per case and path; new shapes retrace) or eagerly."""
  data = case.data(b)
  if jit and num_groups == N:
    out = _jitted(case.id, group_size)(data)
  else:
    out = registry.get_estimator(case.name).fn(**data, **_hyper(case, group_size, num_groups))
  return tuple(np.asarray(x) for x in _to_tuple(out))


def assert_close(got: tuple, want: tuple, rtol=1e-5, atol=1e-5):
  assert len(got) == len(want)
  for g_, w_ in zip(got, want):
    np.testing.assert_allclose(np.asarray(g_, np.float64), np.asarray(w_, np.float64),
                               rtol=rtol, atol=atol)


# --------------------------------------------------------------------------
# Hypothesis strategy: structure from hypothesis, continuous fields from a seed.
# --------------------------------------------------------------------------

_reward_values = st.one_of(st.sampled_from([0.0, 1.0, 0.5, -1.0]),
                           st.floats(-3, 3, allow_nan=False, allow_subnormal=False, width=32))


@st.composite
def batches(draw, contiguous: bool, holes: bool = False):
  reward = draw(st.lists(_reward_values, min_size=B, max_size=B))
  if draw(st.booleans()):  # make some groups all-equal
    for g in draw(st.lists(st.integers(0, N - 1), max_size=2)):
      reward[g * G:(g + 1) * G] = [reward[g * G]] * G
  lengths = draw(st.lists(st.integers(0, T), min_size=B, max_size=B))
  gid = contiguous_ids()
  if not contiguous:
    gid = gid[np.asarray(draw(st.permutations(list(range(B)))))]
  seed = draw(st.integers(0, 2**31 - 1))
  return make_batch(reward, lengths, gid, seed, holes=holes)


# --------------------------------------------------------------------------
# Registry.
# --------------------------------------------------------------------------


def test_registry_lists_every_outcome_estimator():
  assert set(registry.list_estimators("outcome")) == EXPECTED
  for name in EXPECTED:
    spec = registry.get_estimator(name)
    assert "arXiv" in spec.paper
    assert spec.fn.__doc__ and "arXiv" in spec.fn.__doc__
    if DEFAULT[name].group:
      assert {"num_groups", "group_size"} <= set(spec.static_argnames), name
  assert registry.get_estimator("dcpo").stateful
  assert registry.get_estimator("dcpo").returns_output
  assert registry.get_estimator("gae").returns_output


def test_every_estimator_has_a_case():
  assert {c.name for c in CASES} == set(registry.list_estimators("outcome"))


def test_doctests():
  res = doctest.testmod(oc, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted >= 5 and res.failed == 0


# --------------------------------------------------------------------------
# Worked examples from shared/methods/outcome_and_clipping.md.
# --------------------------------------------------------------------------

ONE_GROUP = dict(group_id=np.zeros(4, np.int32), response_mask=np.ones((4, 3), bool),
                 num_groups=1)


def _row(adv):
  return np.asarray(adv)[:, 0]


def test_spec_grpo_drgrpo_rloo():
  r = np.array([1., 0, 0, 1], np.float32)
  np.testing.assert_allclose(_row(oc.grpo_advantages(reward=r, **ONE_GROUP)),
                             [0.866024, -0.866024, -0.866024, 0.866024], atol=1e-5)
  np.testing.assert_allclose(_row(oc.dr_grpo_advantages(reward=r, **ONE_GROUP)),
                             [0.5, -0.5, -0.5, 0.5], atol=1e-6)
  np.testing.assert_allclose(_row(oc.rloo_advantages(reward=r, **ONE_GROUP)),
                             [0.666667, -0.666667, -0.666667, 0.666667], atol=1e-5)


def test_spec_reinforce_pp():
  m = np.array([[1, 1, 0], [1, 1, 1]], bool)
  a = oc.reinforce_pp_advantages(reward=np.array([1., 0.], np.float32), response_mask=m)
  np.testing.assert_allclose(np.asarray(a), [[1.095445, 1.095445, 0], [-0.730297] * 3],
                             atol=1e-5)
  assert np.asarray(a)[0, 2] == 0.0


def test_spec_gae():
  out = oc.gae_advantages(reward=np.array([1.], np.float32),
                          values=np.array([[0.5, 0.6, 0.8]], np.float32),
                          response_mask=np.ones((1, 3), bool), gamma=1.0, lam=0.95,
                          whiten=False)
  np.testing.assert_allclose(np.asarray(out.advantages), [[0.4705, 0.39, 0.2]], atol=1e-6)
  np.testing.assert_allclose(np.asarray(out.returns), [[0.9705, 0.99, 1.0]], atol=1e-6)


def test_gae_skips_observation_tokens():
  # An observation token (mask 0) between the two policy tokens carries V and Â through.
  out = oc.gae_advantages(reward=np.array([1.], np.float32),
                          values=np.array([[0.5, 99., 0.8]], np.float32),
                          response_mask=np.array([[1, 0, 1]], bool), lam=0.5, whiten=False)
  # δ_2 = 1 − 0.8 = 0.2; δ_0 = 0 + 0.8 − 0.5 = 0.3; Â_0 = 0.3 + 0.5·0.2 = 0.4.
  np.testing.assert_allclose(np.asarray(out.advantages), [[0.4, 0.0, 0.2]], atol=1e-6)


def test_spec_dapo_overlong_and_keep():
  pen = oc.dapo_overlong_penalty(np.array([16000, 18432, 20480]), 20480, 4096, 1.0)
  np.testing.assert_allclose(np.asarray(pen), [0.0, -0.5, -1.0], atol=1e-7)
  keep = oc.dapo_keep_mask(np.array([1., 1, 1, 1, 1, 0, 1, 0]), np.array([0] * 4 + [1] * 4),
                           num_groups=2)
  assert np.asarray(keep).tolist() == [False] * 4 + [True] * 4
  keep_fast = oc.dapo_keep_mask(np.array([1., 1, 1, 1, 1, 0, 1, 0]), None, 2, group_size=4)
  assert np.asarray(keep_fast).tolist() == np.asarray(keep).tolist()
  # A singleton group and rows outside `valid` are never kept.
  keep2 = oc.dapo_keep_mask(np.array([1., 0, 1]), np.array([0, 0, 1]), 2,
                            valid=np.array([True, False, True]))
  assert np.asarray(keep2).tolist() == [False, False, False]


@pytest.mark.parametrize("rewards,n,expected,new_mean,new_std", [
    ([1, 1, 1, 1], 2, [0.235702] * 4, 0.666667, 0.471405),
    ([1, 0, 0, 0], 2, [1.257033, -0.603702, -0.603702, -0.603702], 0.416667, 0.513701),
    ([1, 0, 0, 0], 0, [1.5, -0.5, -0.5, -0.5], 0.25, 0.5),
])
def test_spec_dcpo_sas(rewards, n, expected, new_mean, new_std):
  state = oc.dcpo_init_state(3)
  state = state._replace(count=state.count.at[1].set(n), mean=state.mean.at[1].set(0.5),
                         std=state.std.at[1].set(0.5))
  out = oc.dcpo_advantages(reward=np.array(rewards, np.float32), prompt_id=np.ones(4, np.int32),
                           state=state, **ONE_GROUP)
  np.testing.assert_allclose(_row(out.advantages), expected, atol=1e-5)
  assert np.asarray(out.state.count).tolist() == [0, n + 1, 0]
  np.testing.assert_allclose(np.asarray(out.state.mean), [0, new_mean, 0], atol=1e-5)
  np.testing.assert_allclose(np.asarray(out.state.std), [0, new_std, 0], atol=1e-5)


def test_hand_examples_other_estimators():
  r = np.array([1., 0, 0.5, 0], np.float32)
  std = np.std([1, 0, 0.5, 0], ddof=1)
  np.testing.assert_allclose(_row(oc.grpo_passk_advantages(reward=r, **ONE_GROUP)),
                             [0.5 / (std + 1e-6), 0, 0, 0], rtol=1e-5)
  # Pass@k analytic, n=4, c=2, k=2: ρ=5/6, σ=√5/6 → ±(1/6)/σ = ±0.447214.
  a = oc.grpo_passk_advantages(reward=np.array([1., 0, 1, 0], np.float32), method="analytic",
                               k=2, **ONE_GROUP)
  np.testing.assert_allclose(_row(a), [0.447213, -0.447213, 0.447213, -0.447213], atol=1e-5)
  # OPO: lengths 1 and 3, rewards 1 and 0 → b = 0.25.
  a = oc.opo_advantages(reward=np.array([1., 0.], np.float32), group_id=np.zeros(2, np.int32),
                        response_mask=np.array([[1, 0, 0], [1, 1, 1]], bool), num_groups=1)
  np.testing.assert_allclose(np.asarray(a), [[0.75, 0, 0], [-0.25] * 3], atol=1e-6)
  # GPG: one informative and one all-equal group, B=8, M=4 → α=2.
  a = oc.gpg_advantages(reward=np.array([1., 0, 0, 1, 1, 1, 1, 1], np.float32),
                        group_id=np.repeat(np.arange(2), 4).astype(np.int32),
                        response_mask=np.ones((8, 2), bool), num_groups=2)
  np.testing.assert_allclose(_row(a), [1., -1, -1, 1, 0, 0, 0, 0], atol=1e-6)
  # ReMax.
  a = oc.remax_advantages(reward=np.array([1., 0.], np.float32),
                          reward_baseline=np.array([0.5, 0.5], np.float32),
                          response_mask=np.array([[1, 1], [1, 0]], bool))
  np.testing.assert_allclose(np.asarray(a), [[0.5, 0.5], [-0.5, 0]], atol=1e-7)
  # GDPO: z-scores [.866,-.866,-.866,.866] + [.866,.866,-.866,-.866] = s, then whitened over
  # the 12 valid tokens (3 per row): var = 3·Σs²/(12−1).
  comps = np.array([[1., 1], [0, 1], [0, 0], [1, 0]], np.float32)
  a = _row(oc.gdpo_advantages(reward_components=comps, **ONE_GROUP))
  s = np.array([0.866024 * 2, 0, -0.866024 * 2, 0])
  np.testing.assert_allclose(a, s / np.sqrt(3 * np.sum(s**2) / 11 + 1e-8), atol=1e-5)


def test_otb_hand_example():
  # One group of two rows, lengths 2 and 3, rewards 1 and 0, π = 1/2, Σπ² = 1/2 → w = 1/2.
  m = np.array([[1, 1, 0], [1, 1, 1]], bool)
  lp = np.full((2, 3), np.log(0.5), np.float32)
  sp = np.full((2, 3), 0.5, np.float32)
  a = oc.optimal_token_baseline_advantages(
      reward=np.array([1., 0.], np.float32), group_id=np.zeros(2, np.int32), response_mask=m,
      logprob_old=lp, sum_pi_squared=sp, num_groups=1, eps=0.0)
  # W = [.5, 1, 1.5]: t=0,1 baselines (1·W)/(2W) = 0.5; t=2 only row 1 → zero tail, A = G = 0.
  np.testing.assert_allclose(np.asarray(a), [[0.5, 0.5, 0], [-0.5, -0.5, 0]], atol=1e-6)


# --------------------------------------------------------------------------
# Numpy references on hypothesis batches, both group paths.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("case_id", [c.id for c in CASES])
@hypothesis.given(data=st.data())
def test_matches_numpy_reference(case_id, data):
  case = CASE_BY_ID[case_id]
  b = data.draw(batches(contiguous=False, holes=case_id == "otb_tir"))
  assert_close(run(case, b), case.reference(b), rtol=2e-4, atol=2e-4)
  if case.group:
    bc = data.draw(batches(contiguous=True, holes=case_id == "otb_tir"))
    assert_close(run(case, bc, group_size=G), case.reference(bc), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("case_id", [c.id for c in CASES if c.group])
@hypothesis.settings(max_examples=10)
@hypothesis.given(b=batches(contiguous=True))
def test_segment_path_equals_fast_path(case_id, b):
  case = CASE_BY_ID[case_id]
  assert_close(run(case, b, group_size=None), run(case, b, group_size=G), rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------
# Properties, one case per registered name.
# --------------------------------------------------------------------------


def _fixed_batch(seed=3, contiguous=False, holes=False):
  rng = np.random.default_rng(seed)
  reward = rng.choice([0., 1., 0.5, 2.], B)
  reward[:G] = 1.0                      # an all-equal group
  lengths = rng.integers(1, T + 1, B)
  lengths[5] = 0                        # a fully masked row
  gid = contiguous_ids()
  if not contiguous:
    gid = gid[rng.permutation(B)]
  return make_batch(reward, lengths, gid, seed, holes=holes)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_jit_equals_eager(name):
  case = DEFAULT[name]
  b = _fixed_batch()
  assert_close(run(case, b, jit=True), run(case, b, jit=False), rtol=1e-6, atol=1e-6)
  if case.group:
    bc = _fixed_batch(contiguous=True)
    assert_close(run(case, bc, G, jit=True), run(case, bc, G, jit=False), rtol=1e-6, atol=1e-6)


def _slice_batch(b: dict, keep: np.ndarray) -> dict:
  out = {}
  for k, v in b.items():
    out[k] = v if k == "state" else v[keep]
  return out


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_masked_rows_equal_sliced_rows(name):
  case = DEFAULT[name]
  b = _fixed_batch(seed=5)
  drop = np.zeros(B, bool)
  drop[[1, 6, 11, 12]] = True
  bm = dict(b, response_mask=b["response_mask"] & ~drop[:, None])
  masked = run(case, bm)
  sliced = run(case, _slice_batch(b, ~drop))
  assert np.all(masked[0][drop] == 0.0)
  got = tuple(x[~drop] if x.shape[:1] == (B,) and x.ndim == 2 else x for x in masked)
  assert_close(got, sliced, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_padding_invariance(name):
  case = DEFAULT[name]
  b = _fixed_batch(seed=7)
  pad = 3
  bp = {}
  for k, v in b.items():
    if isinstance(v, np.ndarray) and v.ndim == 2 and v.shape[1] == T:
      fill = False if v.dtype == bool else np.nan   # garbage under the mask must not leak
      bp[k] = np.concatenate([v, np.full((B, pad), fill, v.dtype)], axis=1)
    else:
      bp[k] = v
  ref = run(case, b)
  padded = run(case, bp)
  for r_, p_ in zip(ref, padded):
    if p_.ndim == 2 and p_.shape[1] == T + pad:
      assert np.all(p_[:, T:] == 0.0)
      p_ = p_[:, :T]
    np.testing.assert_allclose(p_, r_, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_permutation_equivariance(name):
  case = DEFAULT[name]
  rng = np.random.default_rng(11)
  # Segment path: rows move with their group ids.
  b = _fixed_batch(seed=9)
  perm = rng.permutation(B)
  pb = {k: (v if k == "state" else v[perm]) for k, v in b.items()}
  out, pout = run(case, b), run(case, pb)
  for o, p_ in zip(out, pout):
    np.testing.assert_allclose(p_, o[perm] if o.shape[:1] == (B,) else o, rtol=1e-5, atol=1e-6)
  # Fast path: permutation inside each contiguous group.
  if case.group:
    bc = _fixed_batch(seed=9, contiguous=True)
    perm = np.concatenate([g * G + rng.permutation(G) for g in range(N)])
    pb = {k: (v if k == "state" else v[perm]) for k, v in bc.items()}
    out, pout = run(case, bc, G), run(case, pb, G)
    for o, p_ in zip(out, pout):
      np.testing.assert_allclose(p_, o[perm] if o.shape[:1] == (B,) else o, rtol=1e-5,
                                 atol=1e-6)


# Estimators whose advantage is exactly 0 when every reward of a group is equal.
ZERO_ON_EQUAL = ["grpo", "dr_grpo", "rloo", "opo", "gpg", "grpo_passk", "gdpo", "dapo",
                 "reinforce_pp_baseline", "dcpo"]


@pytest.mark.parametrize("name", ZERO_ON_EQUAL)
def test_all_equal_group_gives_exact_zero(name):
  case = DEFAULT[name]
  b = _fixed_batch(seed=13)
  b["reward"] = np.full(B, 0.7, np.float32)
  b["reward_components"] = np.full((B, 2), 0.3, np.float32)
  b["state"] = oc.dcpo_init_state(NUM_PROMPTS)
  for gs in (None, G) if case.group else (None,):
    bb = b if gs is None else dict(b, group_id=contiguous_ids())
    adv = run(case, bb, gs)[0]
    assert np.all(adv == 0.0), (name, adv)


# Group estimators whose singleton rows are exactly 0 (batch-whitened ones shift them by the
# batch mean; DCPO mixes in the prompt's history).
SINGLETON_ZERO = ["grpo", "dr_grpo", "rloo", "opo", "gpg", "grpo_passk", "dapo",
                  "optimal_token_baseline"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_degenerate_inputs_finite(name):
  case = DEFAULT[name]
  # Group 0 all equal, group 1 a singleton (three rows masked), group 2 normal, row 15 empty.
  b = _fixed_batch(seed=17, contiguous=True)
  b["reward"][:G] = 2.0
  b["response_mask"][G + 1:2 * G] = False
  b["response_mask"][B - 1] = False
  outs = run(case, b)
  for x in outs:
    assert np.all(np.isfinite(x))
  adv = outs[0]
  assert np.all(adv[~b["response_mask"]] == 0.0)
  if name in SINGLETON_ZERO:
    assert np.all(adv[G] == 0.0)
  # Nothing valid at all: every output is an exact zero.
  be = dict(b, response_mask=np.zeros_like(b["response_mask"]))
  outs = run(case, be)
  assert np.all(outs[0] == 0.0)
  for x in outs:
    assert np.all(np.isfinite(x))


# --------------------------------------------------------------------------
# Precision: nearly equal rewards (no cancellation).
# --------------------------------------------------------------------------


@pytest.mark.parametrize("pattern", [(1.0, 1.0, 1.0, 1.0 + 1e-6),
                                     (1000.0, 1000.0, 1000.0, 1000.01)])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_large_and_close_rewards_match_float64(name, pattern):
  case = DEFAULT[name]
  reward = np.tile(np.asarray(pattern, np.float32), N)     # float32 inputs ...
  lengths = np.tile([T, T - 1, T, T - 2], N)
  b = make_batch(reward, lengths, contiguous_ids(), seed=19)
  b["reward_components"] = np.stack([reward, reward[::-1]], 1)
  b["reward_baseline"] = np.full(B, pattern[0], np.float32)
  b["state"] = oc.dcpo_init_state(NUM_PROMPTS)
  want = case.reference(b)                                  # ... float64 arithmetic
  for gs in (None, G) if case.group else (None,):
    got = run(case, b, gs)
    for g_, w_ in zip(got, want):
      scale = max(np.abs(w_).max(), 1e-30)
      np.testing.assert_allclose(g_, w_, rtol=1e-4, atol=1e-5 * scale)


# --------------------------------------------------------------------------
# Gradients.
# --------------------------------------------------------------------------

FLOAT_FIELDS = ("reward", "values", "logprob_old", "logprob_ref", "token_reward",
                "reward_baseline", "reward_components", "sum_pi_squared", "is_weights")


@pytest.mark.parametrize("case_id", [c.id for c in CASES])
def test_gradients_finite_and_zero_under_mask(case_id):
  case = CASE_BY_ID[case_id]
  b = _fixed_batch(seed=21, contiguous=True)
  b["reward"][:G] = 1.0
  b["response_mask"][G + 1:2 * G] = False           # singleton group
  b["reward_components"][:G] = 0.5
  data = case.data(b)
  floats = {k: v for k, v in data.items() if k in FLOAT_FIELDS}
  rest = {k: v for k, v in data.items() if k not in FLOAT_FIELDS}
  fn = registry.get_estimator(case.name).fn
  kw = _hyper(case, None)
  w = np.random.default_rng(0).normal(size=(B, T)).astype(np.float32)

  def loss(fl):
    return jnp.sum(_to_tuple(fn(**fl, **rest, **kw))[0] * w)

  grads = jax.jit(jax.grad(loss))(floats)
  mask = b["response_mask"]
  for k, g_ in grads.items():
    g_ = np.asarray(g_)
    assert np.all(np.isfinite(g_)), k
    if g_.ndim == 2 and g_.shape == (B, T):
      assert np.all(g_[~mask] == 0.0), k


# --------------------------------------------------------------------------
# Sharding: 8 fake CPU devices, batch sharded on 'data'.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sharded_equals_unsharded(name):
  devices = jax.devices()
  assert len(devices) == 8
  mesh = Mesh(np.asarray(devices), ("data",))
  case = DEFAULT[name]
  b = _fixed_batch(seed=23)
  data = case.data(b)

  def shard(x):
    if isinstance(x, np.ndarray) and x.ndim >= 1 and x.shape[0] == B:
      spec = P("data", *([None] * (x.ndim - 1)))
    else:
      spec = P()
    return jax.device_put(x, NamedSharding(mesh, spec))

  sharded = jax.tree.map(shard, data)
  fn = registry.get_estimator(case.name).fn
  kw = _hyper(case, None)
  out = jax.jit(lambda d: fn(**d, **kw))(sharded)
  got = tuple(np.asarray(x) for x in _to_tuple(out))
  assert_close(got, run(case, b), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------
# Specific behaviours.
# --------------------------------------------------------------------------


def test_reinforce_pp_closed_form_equals_scan():
  b = _fixed_batch(seed=25, holes=True)
  zero_tr = np.zeros((B, T), np.float32)   # forces the generic scan path
  for gamma in (1.0, 0.9):
    fast = oc.reinforce_pp_advantages(reward=b["reward"], response_mask=b["response_mask"],
                                      gamma=gamma)
    scan = oc.reinforce_pp_advantages(reward=b["reward"], response_mask=b["response_mask"],
                                      token_reward=zero_tr, gamma=gamma)
    np.testing.assert_allclose(np.asarray(fast), np.asarray(scan), rtol=1e-5, atol=1e-6)
  # A traced gamma takes the closed form γ^(tokens after t); at γ=1 it equals the O(B) path.
  traced = jax.jit(lambda g: oc.reinforce_pp_advantages(
      reward=b["reward"], response_mask=b["response_mask"], gamma=g))(jnp.float32(1.0))
  python_one = oc.reinforce_pp_advantages(reward=b["reward"], response_mask=b["response_mask"])
  np.testing.assert_allclose(np.asarray(traced), np.asarray(python_one), rtol=1e-5, atol=1e-6)


def test_static_one_fast_paths_equal_general_paths():
  # Python 1.0 takes the telescoped / reverse-cumsum paths; a traced 1.0 the scans.
  b = _fixed_batch(seed=26, holes=True)
  kw = dict(reward=b["reward"], values=b["values"], response_mask=b["response_mask"],
            logprob_old=b["logprob_old"], logprob_ref=b["logprob_ref"],
            token_reward=b["token_reward"], kl_coef=0.1)
  one = jnp.float32(1.0)
  fast = oc.gae_advantages(**kw)
  slow = jax.jit(lambda g, l: oc.gae_advantages(**kw, gamma=g, lam=l))(one, one)
  for f_, s_ in zip(fast, slow):
    np.testing.assert_allclose(np.asarray(f_), np.asarray(s_), rtol=1e-5, atol=1e-5)
  kw.pop("values")
  fast = oc.reinforce_pp_advantages(**kw)
  slow = jax.jit(lambda g: oc.reinforce_pp_advantages(**kw, gamma=g))(one)
  np.testing.assert_allclose(np.asarray(fast), np.asarray(slow), rtol=1e-5, atol=1e-5)


def test_blocked_forward_cumsum():
  x = np.random.default_rng(1).uniform(-1, 1, (3, 48)).astype(np.float32)
  got = jax.jit(oc._cumsum_last)(x)          # T % 16 == 0: the blocked path
  np.testing.assert_allclose(np.asarray(got), np.cumsum(x.astype(np.float64), 1), atol=1e-5)
  got = jax.jit(oc._cumsum_last)(x[:, :40])  # fallback
  np.testing.assert_allclose(np.asarray(got), np.cumsum(x[:, :40].astype(np.float64), 1),
                             atol=1e-5)


@pytest.mark.parametrize("name", ["grpo", "gae", "dcpo"])
def test_no_retrace_for_new_values(name):
  case = DEFAULT[name]
  fn = chex.assert_max_traces(registry.get_estimator(name).fn, n=1)
  kw = _hyper(case, None)
  jitted = jax.jit(lambda d: fn(**d, **kw))
  for seed in (1, 2):
    jax.block_until_ready(jitted(case.data(_fixed_batch(seed=seed))))
  chex.clear_trace_counter()


def test_weighted_whiten_equals_ops_masked_whiten():
  b = _fixed_batch(seed=27)
  x = b["reward"]
  m = b["response_mask"]
  want = ops.masked_whiten(ops.broadcast_to_tokens(x, m), m)
  got = ops.broadcast_to_tokens(oc._weighted_whiten(jnp.asarray(x), ops.sequence_lengths(m)), m)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_otb_alignments_agree_on_right_padded_batches():
  b = _fixed_batch(seed=29, contiguous=True)
  kw = dict(reward=b["reward"], group_id=b["group_id"], response_mask=b["response_mask"],
            logprob_old=b["logprob_old"], sum_pi_squared=b["sum_pi_squared"], num_groups=N)
  pos = oc.optimal_token_baseline_advantages(**kw)
  vi = oc.optimal_token_baseline_advantages(**kw, align="valid_index")
  vi_fast = oc.optimal_token_baseline_advantages(**kw, align="valid_index", group_size=G)
  np.testing.assert_allclose(np.asarray(vi), np.asarray(pos), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(vi_fast), np.asarray(pos), rtol=1e-5, atol=1e-6)


def test_dcpo_state_threads_over_steps():
  case = DEFAULT["dcpo"]
  b1 = _fixed_batch(seed=31)
  b1["state"] = oc.dcpo_init_state(NUM_PROMPTS)
  out1 = run(case, b1)
  ref1 = case.reference(b1)
  assert_close(out1, ref1, rtol=1e-5, atol=1e-5)
  b2 = _fixed_batch(seed=32)
  b2["state"] = oc.DCPOState(*(np.asarray(x) for x in out1[1:]))
  assert_close(run(case, b2), case.reference(b2), rtol=1e-5, atol=1e-5)
  # Second appearance of an all-equal group: (1/i)·A_tot, not 0.
  b3 = dict(b2, reward=np.full(B, 0.25, np.float32))
  adv = run(case, b3)[0]
  assert np.any(adv != 0.0)


def test_dapo_overlong_shaping_changes_ranking():
  r = np.array([1., 1., 1., 1.], np.float32)
  m = np.arange(T)[None, :] < np.array([2, 3, 5, 6])[:, None]
  a = oc.dapo_advantages(reward=r, group_id=np.zeros(4, np.int32), response_mask=m,
                         num_groups=1, max_length=6, cache_length=4)
  # Penalties [0, −0.25, −0.75, −1]: shorter answers get the positive advantage.
  assert np.all(np.diff(np.asarray(a)[:, 0]) < 0)


@pytest.mark.parametrize("fn,kwargs,match", [
    (oc.grpo_advantages, dict(scale="batchwise"),
     r"scale must be one of \['group', 'batch', 'none'\]"),
    (oc.grpo_advantages, dict(singleton="drop"), r"singleton must be one of \['zero', 'raw'\]"),
    (oc.grpo_advantages, dict(group_size=3), r"not a multiple of group_size=3"),
    (oc.grpo_advantages, dict(num_groups=0), r"num_groups must be a Python int"),
    (oc.gpg_advantages, dict(alpha="paper"), r"alpha must be one of"),
    (oc.grpo_passk_advantages, dict(method="topk"), r"method must be one of"),
    (oc.grpo_passk_advantages, dict(k=0), r"k must be a Python int >= 1"),
    (oc.gdpo_advantages, dict(batch_norm="batch"), r"batch_norm must be one of"),
    (oc.optimal_token_baseline_advantages, dict(align="column"), r"align must be one of"),
])
def test_bad_static_args_raise(fn, kwargs, match):
  b = _fixed_batch()
  data = dict(reward=b["reward"], group_id=b["group_id"], response_mask=b["response_mask"],
              num_groups=N)
  if fn is oc.gdpo_advantages:
    data["reward_components"] = b["reward_components"]
    del data["reward"]
  if fn is oc.optimal_token_baseline_advantages:
    data.update(logprob_old=b["logprob_old"], sum_pi_squared=b["sum_pi_squared"])
  data.update(kwargs)
  with pytest.raises(ValueError, match=match):
    fn(**data)


def test_kl_without_logprobs_raises():
  b = _fixed_batch()
  with pytest.raises(ValueError, match="needs logprob_old and logprob_ref"):
    oc.reinforce_pp_advantages(reward=b["reward"], response_mask=b["response_mask"], kl_coef=0.1)
  with pytest.raises(ValueError, match="pass both"):
    oc.gae_advantages(reward=b["reward"], values=b["values"], response_mask=b["response_mask"],
                      logprob_old=b["logprob_old"])
  with pytest.raises(ValueError, match="cache_length"):
    oc.dapo_overlong_penalty(np.array([1.0]), 10, 0)


def test_shape_mismatch_raises():
  b = _fixed_batch()
  with pytest.raises(AssertionError):
    oc.grpo_advantages(reward=b["reward"][:-1], group_id=b["group_id"],
                       response_mask=b["response_mask"], num_groups=N)
