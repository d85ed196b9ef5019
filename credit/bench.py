"""Ground truth for credit assignment: exact token advantages on bifurcation tasks, and the
metrics that score an estimator's advantages against them.

Motivation: the survey "From Reasoning to Agentic: Credit Assignment in Reinforcement Learning
for Large Language Models" (C. Zhang, arXiv:2604.09459; ../shared/seeds) asks for a benchmark
protocol with controlled bifurcation tasks, where the decisions that matter are known; no
paper scores estimators side by side on whether their credit lands there.
`benchmarks/credit_bench.py` does, with these functions.

**True advantages.** A bifurcation task (`credit/tasks/bifurcation.py`, `pivotal`) tells which
response positions decide the reward (`pivot_positions(example)`) and the last position that
can still change it (`decided_at(example)` = d: `verify(r) == verify(r[:d+1])` whenever
`len(r) > d`). Under the sampling policy π (the distribution the sampler draws from: the same
temperature, top-k, top-p and min-p), for a sampled response y with reward r and s_t the state
before response token t:

  V(s_t) = P(reward = 1 | prompt, y_<t),   Q(s_t, y_t) = V(s_{t+1}),   A_t = Q(s_t, y_t) − V(s_t)

  t > d:  A_t = 0 (the reward is already fixed);
  t = d:  V(s_d) = Σ_a π(a | s_d) · R(y_<d · a), exact from one forward pass (R: the verifier
          on the text ended by `a`; a stop token ends the response), and Q = r, so A_d = r − V(s_d);
  t < d:  V(s_t) = E_{y'_t..y'_{d−1} ~ π}[ W ], W = the exact last step above at the sampled
          prefix (Rao-Blackwellised: an expectation over the decisive token instead of a 0/1
          reward), or R(text) when the continuation stops before d. Monte-Carlo with
          `num_rollouts` continuations per prefix, all batched in one sampler call; `stderr` is
          their standard error. Q(s_t, y_t) = V(s_{t+1}) (exact when t + 1 = d; r when y_t
          stops the response).
  `exact=True` enumerates every continuation instead (small cases; refused past
  `max_enumeration` sequences) — the Monte-Carlo mode is tested against it.

**Metrics** (`credit_metrics`, over response tokens): `corr` (Pearson, 0 when either side is
constant), `pivot_mass` = Σ|Â| on pivotal tokens / Σ|Â| (with `chance` = the pivotal share of
tokens and `pivot_mass_true` = the same for the true advantages), `sign_acc` = balanced sign
accuracy at pivotal tokens with |A| > eps (mean over the classes A > 0 and A < 0 of the share
where Â has the same sign; Â = 0 counts 1/2; so a constant estimator scores exactly 0.5; NaN
— undefined, left out of averages — when the batch lacks one of the two classes),
`zero_tokens` and `zero_groups` (|Â| <= eps everywhere in the group). Learning curves:
`steps_to_threshold`, `auc`, and `bootstrap_ci` over seeds.
"""
from __future__ import annotations

import functools
from typing import Any, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from credit.sampling import processed_logprobs, sampling_params


class TrueAdvantages(NamedTuple):
  """Per token [B,T] (0 / False outside the response).

  Attributes:
    value: float32 V(s_t), the success probability before token t (the reward after d).
    advantage: float32 A_t = V(s_{t+1}) − V(s_t) (0 after d).
    stderr: float32 Monte-Carlo standard error of A_t (0 where exact: at and after d, and in
      `exact` mode).
    pivot_mask: bool, the response tokens at the example's `pivot_positions`.
    decided_mask: bool, the response token at `decided_at` (where A_t = r − Σ_a π(a)·R is
      exact); no token when the response ended before it.
  """
  value: np.ndarray
  advantage: np.ndarray
  stderr: np.ndarray
  pivot_mask: np.ndarray
  decided_mask: np.ndarray


def _check_task(task: Any) -> None:
  missing = [m for m in ("verify", "pivot_positions", "decided_at") if not hasattr(task, m)]
  if missing:
    raise TypeError(f"task {getattr(task, 'name', task)!r} has no {missing}: true advantages "
                    "need a bifurcation task (credit/tasks/bifurcation.py, pivotal)")


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _next_logprobs(graphdef, state, params, tokens_BT, mask_BT, last_B):
  """[B,V] log π(· | row) at column `last_B` of left-aligned rows: the processed (tempered,
  filtered) distribution the sampler draws from. One compiled program per graph and shape,
  shared by every `true_advantages` call."""
  model = nnx.merge(graphdef, state)
  logits_BTV, _ = model(tokens_BT, mask_BT=mask_BT)
  at_BV = jnp.take_along_axis(logits_BTV, last_B[:, None, None], axis=1)[:, 0]
  return processed_logprobs(at_BV, params)


class _Policy:
  """π(· | prefix) under the sampling parameters, for batches of token rows."""

  def __init__(self, graphdef, model_state, params, chunk_rows: int):
    self.graphdef, self.state, self.params, self.chunk = graphdef, model_state, params, chunk_rows

  def __call__(self, rows: Sequence[Sequence[int]], pad_id: int) -> np.ndarray:
    """[len(rows), V] log π(a | row) for each row (its last token is the newest)."""
    if not rows:
      return np.zeros((0, 0), np.float32)
    width = max(len(r) for r in rows)
    width = 1 << max(3, (width - 1).bit_length())  # few distinct shapes, few compiles
    out = []
    for s in range(0, len(rows), self.chunk):
      part = rows[s:s + self.chunk]
      n = 64  # rows padded to 64 · 4^k: few shapes, each compiled once per process
      while n < len(part):
        n *= 4
      n = min(n, self.chunk)
      toks = np.full((n, width), pad_id, np.int32)
      mask = np.zeros((n, width), bool)
      last = np.zeros(n, np.int32)
      for i, r in enumerate(part):
        toks[i, :len(r)], mask[i, :len(r)], last[i] = r, True, len(r) - 1
      mask[len(part):, 0] = True  # filler rows: one real token, never read
      lp = _next_logprobs(self.graphdef, self.state, self.params, toks, mask, last)
      out.append(np.asarray(lp)[:len(part)])
    return np.concatenate(out)


def _split_rows(tokens, response_mask, prompt_mask):
  """Per row: (prompt ids, response ids, response columns)."""
  out = []
  for b in range(tokens.shape[0]):
    cols = np.flatnonzero(response_mask[b])
    if cols.size and np.any(np.diff(cols) != 1):
      raise ValueError(f"row {b}: the response must be contiguous (single-turn rollouts)")
    prompt = tokens[b][prompt_mask[b]].tolist()
    out.append((prompt, tokens[b, cols].tolist(), cols))
  return out


def true_advantages(sampler, model_state, *, task: Any, tokenizer: Any,
                    examples: Sequence[Mapping[str, Any]], tokens: np.ndarray,
                    response_mask: np.ndarray, prompt_mask: np.ndarray, key: jax.Array,
                    num_rollouts: int = 32, temperature: float = 1.0, top_k: int = 0,
                    top_p: float = 1.0, min_p: float = 0.0, exact: bool = False,
                    max_enumeration: int = 200_000, chunk_rows: int = 1024) -> TrueAdvantages:
  """The true advantage of every sampled response token (module docstring).

  Args:
    sampler: the `credit.sampling.Sampler` of the policy (its stop tokens end responses).
    model_state: the policy's `nnx.State` (graph from `sampler.graphdef`).
    task: a bifurcation task (`verify`, `pivot_positions`, `decided_at`).
    tokenizer: the character tokenizer the rows were encoded with (`decode`, `pad_id`).
    examples: [B] the example of each row.
    tokens, response_mask, prompt_mask: [B,T] a single-turn rollout batch (prompt then a
      contiguous response; `SampleOutput` / the runner's host arrays).
    key: PRNG key of the Monte-Carlo continuations.
    num_rollouts: continuations per prefix (Monte-Carlo mode).
    temperature, top_k, top_p, min_p: the sampling parameters of the rollouts (π is the
      processed distribution the sampler draws from, `credit.sampling.processed_logprobs`;
      `min_new_tokens` is not supported).
    exact: enumerate every continuation instead of sampling.
    max_enumeration: the most sequences `exact` may expand.
    chunk_rows: rows per forward pass.

  Returns:
    `TrueAdvantages`, [B,T] numpy arrays.

  Raises:
    TypeError: the task has no ground-truth interface.
    ValueError: shapes, masks selecting no response token, non-contiguous responses, a
      response cut before its decision, a bad rollout count or sampling parameter, or an
      enumeration over `max_enumeration`.

  Note: continuations run to `decided_at` whatever the rollout's `max_new_tokens` was, so the
  rollouts need a budget above `decided_at` (the bench gives every task `max_response_chars + 2`
  tokens); a response cut by its budget before `decided_at` (no stop token) is refused.
  """
  _check_task(task)
  tokens, response_mask = np.asarray(tokens), np.asarray(response_mask, bool)
  prompt_mask = np.asarray(prompt_mask, bool)
  if tokens.ndim != 2 or tokens.shape != response_mask.shape or tokens.shape != prompt_mask.shape:
    raise ValueError(f"tokens {tokens.shape}, response_mask {response_mask.shape} and "
                     f"prompt_mask {prompt_mask.shape} must be the same [B,T]")
  B, T = tokens.shape
  if len(examples) != B:
    raise ValueError(f"{len(examples)} examples for {B} rows")
  if not response_mask.any():
    raise ValueError("response_mask selects no token")
  if np.any(response_mask & prompt_mask):
    raise ValueError("response_mask and prompt_mask overlap")
  if num_rollouts < 1:
    raise ValueError(f"num_rollouts={num_rollouts} must be >= 1")
  if chunk_rows < 1:
    raise ValueError(f"chunk_rows={chunk_rows} must be >= 1")
  stops = set(int(s) for s in sampler.stop_tokens)
  pad = int(tokenizer.pad_id)
  V = int(sampler.vocab_size)
  pieces = [tokenizer.decode([a]) if a not in stops else None for a in range(V)]
  sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
  params = sampling_params(**sampling, vocab_size=V)  # raises on bad values, before tracing
  policy = _Policy(sampler.graphdef, model_state, params, chunk_rows)
  rows = _split_rows(tokens, response_mask, prompt_mask)

  def text(resp: Sequence[int]) -> str:
    return tokenizer.decode(list(resp))

  rewards_by_text: dict[tuple[int, str], np.ndarray] = {}

  def candidate_rewards(b: int, base: str) -> np.ndarray:
    """[V] R(base · a) for every token a (a stop token: R(base)); cached per example and text."""
    ex = examples[b]
    k = (id(ex), base)
    if k not in rewards_by_text:
      r_stop = task.verify(ex, base)
      rewards_by_text[k] = np.asarray(
          [r_stop if p is None else task.verify(ex, base + p) for p in pieces], np.float64)
    return rewards_by_text[k]

  def last_step(b_prefix: Sequence[tuple[int, list[int]]]) -> np.ndarray:
    """Σ_a π(a | prompt·resp) R(resp·a) for (row, resp) pairs, resp of length decided_at."""
    if not b_prefix:
      return np.zeros(0)
    lp = policy([rows[b][0] + resp for b, resp in b_prefix], pad)
    rew = np.stack([candidate_rewards(b, text(resp)) for b, resp in b_prefix])
    return np.sum(np.exp(lp.astype(np.float64)) * rew, axis=1)

  decided = [int(task.decided_at(examples[b])) for b in range(B)]
  for b in range(B):
    resp = rows[b][1]
    if resp and len(resp) <= decided[b] and resp[-1] not in stops:
      raise ValueError(f"row {b}: the response was cut at {len(resp)} tokens without a stop "
                       f"token, before the decision at index {decided[b]}; sample with "
                       "max_new_tokens > decided_at (the values assume no budget before it)")
  reward = np.asarray([task.verify(examples[b], text(rows[b][1])) for b in range(B)])
  value = np.zeros((B, T), np.float32)
  adv = np.zeros((B, T), np.float32)
  err = np.zeros((B, T), np.float32)
  pivot = np.zeros((B, T), bool)
  decided_mask = np.zeros((B, T), bool)

  # V(s_d) of every row that reached d: exact.
  at_d = [b for b in range(B) if len(rows[b][1]) > decided[b]]
  v_d = dict(zip(at_d, last_step([(b, rows[b][1][:decided[b]]) for b in at_d])))
  # V(s_t), t < min(d, L): Monte-Carlo (or enumerated).
  need = [(b, t) for b in range(B) for t in range(min(decided[b], len(rows[b][1])))]
  if exact:
    v_mc = _enumerate(need, rows, decided, policy, pad, stops, last_step, text, examples, task,
                      max_enumeration)
    e_mc = {k: 0.0 for k in need}
  else:
    v_mc, e_mc = _monte_carlo(need, rows, decided, sampler, model_state, key, num_rollouts,
                              sampling, last_step, text, examples, task, stops, pad)
  for b in range(B):
    prompt, resp, cols = rows[b]
    for p in task.pivot_positions(examples[b]):
      if p < len(cols):
        pivot[b, cols[p]] = True
    for t in range(len(resp)):
      c = cols[t]
      if t > decided[b]:
        value[b, c] = reward[b]
        continue
      if t == decided[b]:
        value[b, c], adv[b, c] = v_d[b], reward[b] - v_d[b]
        decided_mask[b, c] = True
        continue
      v = v_mc[(b, t)]
      if t + 1 == len(resp):              # the last sampled token (a stop, or the budget)
        q, qe = reward[b], 0.0
      elif t + 1 == decided[b]:
        q, qe = v_d[b], 0.0
      else:
        q, qe = v_mc[(b, t + 1)], e_mc[(b, t + 1)]
      value[b, c], adv[b, c] = v, q - v
      err[b, c] = np.sqrt(e_mc[(b, t)] ** 2 + qe ** 2)
  return TrueAdvantages(value, adv, err, pivot, decided_mask)


def _monte_carlo(need, rows, decided, sampler, model_state, key, R, sampling, last_step,
                 text, examples, task, stops, pad):
  """{(b, t): mean W}, {(b, t): standard error} from R continuations of each prefix."""
  if not need:
    return {}, {}
  P = max(len(rows[b][0]) + t for b, t in need)
  D = max(decided[b] - t for b, t in need)
  # One sampler shape per task: pad the prefix count to a power of two.
  n = 1 << max(0, (len(need) - 1).bit_length())
  toks = np.full((n, P), pad, np.int32)
  mask = np.zeros((n, P), bool)
  for i, (b, t) in enumerate(need):
    row = rows[b][0] + rows[b][1][:t]
    toks[i, :len(row)], mask[i, :len(row)] = row, True
  toks[len(need):], mask[len(need):] = toks[0], mask[0]  # filler rows (never read)
  out = sampler(model_state, prompt_tokens=toks, prompt_mask=mask, key=key, max_new_tokens=D,
                num_samples=R, **sampling)
  o_tok = np.asarray(out.tokens)
  o_resp = np.asarray(out.response_mask)
  w = np.zeros((len(need), R))
  finish = []   # continuations that reach d: (index, row, response prefix of length d)
  for i, (b, t) in enumerate(need):
    for j in range(R):
      k = i * R + j
      new = o_tok[k][o_resp[k]].tolist()
      resp = rows[b][1][:t] + new
      stop_at = next((m for m, a in enumerate(resp) if a in stops), None)
      d = decided[b]
      if stop_at is not None and stop_at < d:    # ended before the decision
        w[i, j] = task.verify(examples[b], text(resp[:stop_at + 1]))
      elif len(resp) >= d:
        finish.append((i, j, b, resp[:d]))
      else:  # the sampler's budget is d - t, so this cannot happen
        raise AssertionError("continuation shorter than the decision point")
  vals = last_step([(b, r) for _, _, b, r in finish])
  for (i, j, _, _), v in zip(finish, vals):
    w[i, j] = v
  mean = w.mean(axis=1)
  se = w.std(axis=1, ddof=1) / np.sqrt(R) if R > 1 else np.zeros(len(need))
  return ({k: float(m) for k, m in zip(need, mean)}, {k: float(s) for k, s in zip(need, se)})


def _enumerate(need, rows, decided, policy, pad, stops, last_step, text, examples, task,
               limit):
  """{(b, t): V(s_t)} by expanding every continuation up to the decision point."""
  out = {}
  for b, t in need:
    d = decided[b]
    frontier = [(rows[b][1][:t], 1.0)]
    total, value = 0, 0.0
    while frontier:
      depth = len(frontier[0][0])
      if depth == d:
        vals = last_step([(b, r) for r, _ in frontier])
        value += float(np.dot(vals, [p for _, p in frontier]))
        break
      lp = policy([rows[b][0] + r for r, _ in frontier], pad)
      nxt = []
      for (r, p), row_lp in zip(frontier, lp):
        probs = np.exp(row_lp)
        for a in range(lp.shape[1]):
          if probs[a] == 0.0:
            continue
          if a in stops:
            value += p * probs[a] * task.verify(examples[b], text(r + [a]))
          else:
            nxt.append((r + [a], p * probs[a]))
      total += len(nxt)
      if total > limit:
        raise ValueError(f"exact enumeration needs more than max_enumeration={limit} "
                         f"sequences (row {b}, depth {depth + 1} of {d}); use Monte-Carlo")
      frontier = nxt
    out[(b, t)] = value
  return out


# --------------------------------------------------------------------------
# Metrics.
# --------------------------------------------------------------------------


def _check_metric_inputs(est, true, response_mask, pivot_mask, group_id):
  est, true = np.asarray(est, np.float64), np.asarray(true, np.float64)
  resp, piv = np.asarray(response_mask, bool), np.asarray(pivot_mask, bool)
  gid = np.asarray(group_id)
  if est.ndim != 2 or not est.shape == true.shape == resp.shape == piv.shape:
    raise ValueError(f"est {est.shape}, true {true.shape}, response_mask {resp.shape} and "
                     f"pivot_mask {piv.shape} must be the same [B,T]")
  if gid.shape != (est.shape[0],):
    raise ValueError(f"group_id {gid.shape} must be [B={est.shape[0]}]")
  if not resp.any():
    raise ValueError("response_mask selects no token")
  if not (np.all(np.isfinite(est[resp])) and np.all(np.isfinite(true[resp]))):
    raise ValueError("advantages must be finite on response tokens")
  return est, true, resp, piv & resp, gid


def _corr(x: np.ndarray, y: np.ndarray) -> float:
  x, y = x - x.mean(), y - y.mean()
  den = np.sqrt(np.sum(x * x) * np.sum(y * y))
  return float(np.clip(np.sum(x * y) / den, -1.0, 1.0)) if den > 0 else 0.0


def _mass(a: np.ndarray, resp: np.ndarray, piv: np.ndarray) -> float:
  tot = np.sum(np.abs(a[resp]))
  return float(np.sum(np.abs(a[piv])) / tot) if tot > 0 else 0.0


def credit_metrics(est, true, response_mask, pivot_mask, group_id, *,
                   eps: float = 1e-6) -> dict[str, float]:
  """How well an estimator's advantages Â place credit, against the true advantages A.

  Over the response tokens R (pivotal tokens P = R ∩ pivot_mask):
    corr = Pearson(Â|R, A|R), 0 when either side is constant;
    pivot_mass = Σ_P |Â| / Σ_R |Â| (0 when Â = 0 on R), pivot_mass_true the same for A,
      chance = |P| / |R| (what an estimator spreading |Â| evenly scores);
    sign_acc = ½ Σ_{s ∈ {+1, −1}} mean_{P, sign A = s, |A| > eps} [sign Â = s] (Â within eps of
      0 counts ½); NaN when a class is empty;
    zero_tokens = share of R with |Â| <= eps; zero_groups = share of groups (with response
      tokens) where every response token has |Â| <= eps.

  Args:
    est, true: [B,T] float advantages Â and A (finite on response tokens; anything elsewhere).
    response_mask, pivot_mask: [B,T] bool.
    group_id: [B] int group of each row.
    eps: the zero threshold.

  Returns:
    {name: float} with corr, pivot_mass, pivot_mass_true, chance, sign_acc, zero_tokens,
    zero_groups.
  """
  est, true, resp, piv, gid = _check_metric_inputs(est, true, response_mask, pivot_mask,
                                                   group_id)
  e, t = est[resp], true[resp]
  accs = []
  for sign in (1.0, -1.0):
    sel = piv & (np.sign(true) == sign) & (np.abs(true) > eps)
    if sel.any():
      s = np.sign(np.where(np.abs(est[sel]) > eps, est[sel], 0.0))
      accs.append(float(np.mean(np.where(s == 0, 0.5, (s == sign).astype(np.float64)))))
  zero = np.abs(est) <= eps
  groups = [g for g in np.unique(gid) if resp[gid == g].any()]
  zero_groups = [bool(np.all(zero[gid == g][resp[gid == g]])) for g in groups]
  return {
      "corr": _corr(e, t),
      "pivot_mass": _mass(est, resp, piv),
      "pivot_mass_true": _mass(true, resp, piv),
      "chance": float(piv.sum() / resp.sum()),
      "sign_acc": float(np.mean(accs)) if len(accs) == 2 else float("nan"),
      "zero_tokens": float(np.mean(zero[resp])),
      "zero_groups": float(np.mean(zero_groups)) if zero_groups else 0.0,
  }


def aggregate(per_batch: Sequence[Mapping[str, float]]) -> dict[str, tuple[float, float]]:
  """{metric: (mean, std)} over resampled batches (the variance across batches).

  NaN entries (`sign_acc` on a batch without both sign classes) are left out; a metric that is
  NaN on every batch gives (NaN, NaN).
  """
  if not per_batch:
    raise ValueError("no metric dicts to aggregate")
  keys = list(per_batch[0])
  if any(set(m) != set(keys) for m in per_batch):
    raise ValueError(f"metric dicts have different keys: {[sorted(m) for m in per_batch]}")
  out = {}
  for k in keys:
    v = np.asarray([m[k] for m in per_batch], np.float64)
    v = v[~np.isnan(v)]
    out[k] = (float(v.mean()), float(v.std())) if v.size else (float("nan"), float("nan"))
  return out


def steps_to_threshold(steps: Sequence[float], values: Sequence[float],
                       threshold: float) -> float | None:
  """The first step whose value reaches `threshold` (None: never)."""
  steps, values = np.asarray(steps, np.float64), np.asarray(values, np.float64)
  if steps.shape != values.shape or steps.ndim != 1 or not steps.size:
    raise ValueError(f"steps {steps.shape} and values {values.shape} must be the same [n>0]")
  hit = np.flatnonzero(values >= threshold)
  return float(steps[hit[0]]) if hit.size else None


def auc(steps: Sequence[float], values: Sequence[float]) -> float:
  """Trapezoid area under values(step) divided by the step span (the curve's mean level; in
  [0, 1] for values in [0, 1]); one point: its value."""
  steps, values = np.asarray(steps, np.float64), np.asarray(values, np.float64)
  if steps.shape != values.shape or steps.ndim != 1 or not steps.size:
    raise ValueError(f"steps {steps.shape} and values {values.shape} must be the same [n>0]")
  if np.any(np.diff(steps) <= 0):
    raise ValueError("steps must increase")
  if steps.size == 1:
    return float(values[0])
  area = np.sum((values[1:] + values[:-1]) * np.diff(steps)) / 2.0
  return float(area / (steps[-1] - steps[0]))


def bootstrap_ci(samples: Sequence[float], num_resamples: int = 1000, level: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
  """Percentile bootstrap interval of the mean of `samples` (deterministic for a seed)."""
  x = np.asarray(samples, np.float64)
  if x.ndim != 1 or not x.size or not np.all(np.isfinite(x)):
    raise ValueError(f"samples must be a non-empty finite 1-D array, got {x}")
  if not 0.0 < level < 1.0:
    raise ValueError(f"level={level} must be in (0, 1)")
  if num_resamples < 1:
    raise ValueError(f"num_resamples={num_resamples} must be >= 1")
  rng = np.random.default_rng(seed)
  means = x[rng.integers(0, x.size, size=(num_resamples, x.size))].mean(axis=1)
  lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
  return float(min(lo, x.mean())), float(max(hi, x.mean()))
