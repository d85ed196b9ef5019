"""Ground truth for credit assignment: exact token advantages on bifurcation tasks, and the
metrics that score an estimator's advantages against them.

Motivation: the survey "From Reasoning to Agentic: Credit Assignment in Reinforcement Learning
for Large Language Models" (C. Zhang, arXiv:2604.09459) asks for a benchmark
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

**Multi-turn** (`true_turn_advantages`): on a pivotal-turn task (`credit/envs/pivot_turn.py`:
`pivot_turns(example)`, and `decided_at_turn(example)` = (k_d, i_d), the decisive token i_d of
turn k_d's action) the same definitions hold over episodes that interleave policy turns with
environment observations: V(s_t) before each policy token (s_t holds every earlier action and
observation), exact at the decisive token, Monte-Carlo before it — continuations finish the
turn, the environment (replayed from the rollout's actions) answers, the next turns follow, one
sampler call per turn for every continuation at once — and 0 after it. Observation tokens get
no advantage. Per turn: `turn_value` (the success probability after the turn prefix) and
`turn_advantage` (the change over the turn).

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
  tokens, response_mask, prompt_mask = _check_rollout(tokens, response_mask, prompt_mask,
                                                      examples, num_rollouts, chunk_rows)
  B, T = tokens.shape
  stops = set(int(s) for s in sampler.stop_tokens)
  pad = int(tokenizer.pad_id)
  V = int(sampler.vocab_size)
  pieces = [tokenizer.decode([a]) if a not in stops else None for a in range(V)]
  sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
  params = sampling_params(**sampling, vocab_size=V)  # raises on bad values, before tracing
  policy = _Policy(sampler.graphdef, model_state, params, chunk_rows)
  rows = _split_rows(tokens, response_mask, prompt_mask)
  last_step = _LastStep(task, tokenizer, examples, policy, rows, pieces, pad)
  text = last_step.text
  decided = [int(task.decided_at(examples[b])) for b in range(B)]
  _check_decisions_reached(rows, decided, stops)
  reward = np.asarray([task.verify(examples[b], text(rows[b][1])) for b in range(B)])

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
  return _token_values(task, examples, rows, decided, reward, v_d, v_mc, e_mc, T)


def _check_rollout(tokens, response_mask, prompt_mask, examples, num_rollouts: int,
                   chunk_rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """A single-turn rollout batch as numpy arrays, after the shape, mask and count checks."""
  tokens, response_mask = np.asarray(tokens), np.asarray(response_mask, bool)
  prompt_mask = np.asarray(prompt_mask, bool)
  if tokens.ndim != 2 or tokens.shape != response_mask.shape or tokens.shape != prompt_mask.shape:
    raise ValueError(f"tokens {tokens.shape}, response_mask {response_mask.shape} and "
                     f"prompt_mask {prompt_mask.shape} must be the same [B,T]")
  B = tokens.shape[0]
  if len(examples) != B:
    raise ValueError(f"{len(examples)} examples for {B} rows")
  if not response_mask.any():
    raise ValueError("response_mask selects no token")
  if np.any(response_mask & prompt_mask):
    raise ValueError("response_mask and prompt_mask overlap")
  _check_counts(num_rollouts, chunk_rows)
  return tokens, response_mask, prompt_mask


def _check_counts(num_rollouts: int, chunk_rows: int) -> None:
  if num_rollouts < 1:
    raise ValueError(f"num_rollouts={num_rollouts} must be >= 1")
  if chunk_rows < 1:
    raise ValueError(f"chunk_rows={chunk_rows} must be >= 1")


def _check_decisions_reached(rows, decided: Sequence[int], stops: set[int]) -> None:
  """Refuses a response its budget cut before its decision (no stop token)."""
  for b, (_, resp, _) in enumerate(rows):
    if resp and len(resp) <= decided[b] and resp[-1] not in stops:
      raise ValueError(f"row {b}: the response was cut at {len(resp)} tokens without a stop "
                       f"token, before the decision at index {decided[b]}; sample with "
                       "max_new_tokens > decided_at (the values assume no budget before it)")


class _LastStep:
  """The exact value at the decisive token: Σ_a π(a | prompt·resp) R(resp·a), for (row, resp)
  pairs with resp of length decided_at (R: the verifier; a stop token a ends the text)."""

  def __init__(self, task, tokenizer, examples, policy: _Policy, rows, pieces, pad: int):
    self.task, self.tokenizer, self.examples = task, tokenizer, examples
    self.policy, self.rows, self.pieces, self.pad = policy, rows, pieces, pad
    self.rewards_by_text: dict[tuple[int, str], np.ndarray] = {}

  def text(self, resp: Sequence[int]) -> str:
    return self.tokenizer.decode(list(resp))

  def candidate_rewards(self, b: int, base: str) -> np.ndarray:
    """[V] R(base · a) for every token a (a stop token: R(base)); cached per example and text."""
    ex = self.examples[b]
    k = (id(ex), base)
    if k not in self.rewards_by_text:
      r_stop = self.task.verify(ex, base)
      self.rewards_by_text[k] = np.asarray(
          [r_stop if p is None else self.task.verify(ex, base + p) for p in self.pieces],
          np.float64)
    return self.rewards_by_text[k]

  def __call__(self, b_prefix: Sequence[tuple[int, list[int]]]) -> np.ndarray:
    if not b_prefix:
      return np.zeros(0)
    lp = self.policy([self.rows[b][0] + resp for b, resp in b_prefix], self.pad)
    rew = np.stack([self.candidate_rewards(b, self.text(resp)) for b, resp in b_prefix])
    return np.sum(np.exp(lp.astype(np.float64)) * rew, axis=1)


def _token_values(task, examples, rows, decided, reward, v_d, v_mc, e_mc,
                  T: int) -> TrueAdvantages:
  """Lays the values out on the response tokens: V and A = Q − V before the decision, exact
  at it, the reward after it; the standard errors of both ends of A."""
  B = len(rows)
  value = np.zeros((B, T), np.float32)
  adv = np.zeros((B, T), np.float32)
  err = np.zeros((B, T), np.float32)
  pivot = np.zeros((B, T), bool)
  decided_mask = np.zeros((B, T), bool)
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
  piv = piv & resp  # P = R ∩ pivot_mask (a tree row's path may hold a pivot it does not own)
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


def turn_means(adv, response_mask, turn_id, num_turns: int) -> tuple[np.ndarray, np.ndarray]:
  """([B,K] mean of `adv` over each turn's policy tokens, [B,K] bool: the turn has one).

  The turn-level reading of token advantages: a turn-level estimator broadcasts one value to
  every token of a turn, and the mean recovers it.
  """
  adv = np.asarray(adv, np.float64)
  resp, tid = np.asarray(response_mask, bool), np.asarray(turn_id)
  if adv.ndim != 2 or adv.shape != resp.shape or adv.shape != tid.shape:
    raise ValueError(f"adv {adv.shape}, response_mask {resp.shape} and turn_id {tid.shape} "
                     "must be the same [B,T]")
  onehot = resp[:, :, None] & (tid[:, :, None] == np.arange(num_turns)[None, None, :])
  count = onehot.sum(1)
  total = np.einsum("bt,btk->bk", np.where(resp, adv, 0.0), onehot)
  return np.where(count > 0, total / np.maximum(count, 1), 0.0), count > 0


def turn_credit_metrics(est, truth: TurnTrueAdvantages, response_mask, turn_id, group_id, *,
                        eps: float = 1e-6) -> dict[str, float]:
  """`credit_metrics` at the turn level, as `turn_<name>`: the estimator's per-turn means
  (`turn_means`) against the true turn advantages, over the turns that were played, the
  pivotal turns as the pivot set."""
  K = truth.turn_advantage.shape[1]
  est_k, played = turn_means(est, response_mask, turn_id, K)
  m = credit_metrics(est_k, truth.turn_advantage, played, truth.pivot_turn_mask, group_id,
                     eps=eps)
  return {f"turn_{k}": v for k, v in m.items()}


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


# --------------------------------------------------------------------------
# Multi-turn: true advantages on a pivotal-turn task.
# --------------------------------------------------------------------------


class TurnTrueAdvantages(NamedTuple):
  """True advantages of a multi-turn rollout batch (`true_turn_advantages`).

  Per token [B,T] (0 / False outside the policy's tokens; observation tokens get 0):
    value, advantage, stderr, pivot_mask, decided_mask: as `TrueAdvantages`, over the policy
      tokens in episode order; `pivot_mask` marks every policy token of the pivotal turns,
      `decided_mask` the decisive token (`decided_at_turn`).
  Per turn [B,K] (0 / False where the turn was not played):
    turn_value: V before the turn's first token (the success probability after the turn
      prefix: prompt, the earlier turns and their observations).
    turn_advantage: V after the turn (before the next turn's first token; the reward after the
      last) minus `turn_value` — the sum of the turn's token advantages.
    turn_stderr: its Monte-Carlo standard error.
    pivot_turn_mask: bool, the turns of `pivot_turns`.
  """
  value: np.ndarray
  advantage: np.ndarray
  stderr: np.ndarray
  pivot_mask: np.ndarray
  decided_mask: np.ndarray
  turn_value: np.ndarray
  turn_advantage: np.ndarray
  turn_stderr: np.ndarray
  pivot_turn_mask: np.ndarray


class _Item(NamedTuple):
  """A partial episode: context ids (prompt, earlier actions and observations), the
  environment's snapshot before turn `k`, the action texts of turns < k, the tokens of turn k
  drawn so far."""
  b: int
  ctx: tuple
  snap: Any
  texts: tuple
  k: int
  partial: tuple


def _check_turn_task(task: Any) -> None:
  missing = [m for m in ("make_env", "pivot_turns", "decided_at_turn") if not hasattr(task, m)]
  if missing:
    raise TypeError(f"task {getattr(task, 'name', task)!r} has no {missing}: multi-turn true "
                    "advantages need a pivotal-turn task (credit/envs/pivot_turn.py)")


def _split_episodes(tokens, response_mask, obs_mask, prompt_mask, turn_id):
  """Per row: (prompt ids, [(turn k, action ids, action columns, observation ids after it)])."""
  out = []
  B, T = tokens.shape
  for b in range(B):
    prompt = tokens[b][prompt_mask[b]].tolist()
    turns = []
    ks = sorted(set(turn_id[b][response_mask[b]].tolist()))
    if ks != list(range(len(ks))):
      raise ValueError(f"row {b}: turn ids {ks} are not 0..n-1")
    for k in ks:
      cols = np.flatnonzero(response_mask[b] & (turn_id[b] == k))
      if np.any(np.diff(cols) != 1):
        raise ValueError(f"row {b}: turn {k}'s policy tokens are not contiguous")
      nxt = np.flatnonzero(response_mask[b] & (turn_id[b] == k + 1))
      end = nxt[0] if nxt.size else T
      obs_cols = np.flatnonzero(obs_mask[b, cols[-1] + 1:end]) + cols[-1] + 1
      turns.append((k, tokens[b, cols].tolist(), cols, tokens[b, obs_cols].tolist()))
    out.append((prompt, turns))
  return out


def true_turn_advantages(sampler, model_state, *, task: Any, tokenizer: Any,
                         examples: Sequence[Mapping[str, Any]], tokens: np.ndarray,
                         response_mask: np.ndarray, obs_mask: np.ndarray,
                         prompt_mask: np.ndarray, turn_id: np.ndarray, layout: Any,
                         key: jax.Array, limits: Any = None, num_rollouts: int = 32,
                         temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                         min_p: float = 0.0, exact: bool = False,
                         max_enumeration: int = 200_000, chunk_rows: int = 1024
                         ) -> TurnTrueAdvantages:
  """The true advantage of every policy token of multi-turn episodes, and of every turn.

  The single-turn definitions (module docstring) carried over to episodes that interleave
  policy turns with environment observations (`credit.envs.rollout.MultiTurnSampler`). With
  s_t the state before policy token t (the prompt, every earlier action and observation):

    V(s_t) = P(reward = 1 | s_t) under π and the (deterministic) environment,
    A_t = V(s_{t+1}) − V(s_t), where s_{t+1} includes the observation when y_t ends a turn.

  A pivotal-turn task (`credit.envs.pivot_turn`) names its decisive token (k_d, i_d) =
  `decided_at_turn(example)`: character i_d of turn k_d's action; the outcome is known once
  turn k_d is played and equals that of the turn cut after i_d. So

    after (k_d, i_d):  A_t = 0 (V = r);
    at (k_d, i_d):     V = Σ_a π(a | s) · R(a), R(a) the outcome after the environment plays
                       turn k_d's action text ended by a — exact, one forward pass; A = r − V;
    before it:         V = E[W] over continuations: the policy finishes the current turn (a
                       stop token or `max_action_tokens` ends it), the environment answers,
                       the next turns follow, until the decisive token, where W is the exact
                       last step above (Rao-Blackwellised), or the outcome when the episode
                       ends first (the environment says done, or K turns). Monte-Carlo with
                       `num_rollouts` continuations per prefix, all prefixes advanced together
                       one turn per sampler call (per-row budgets, so one compiled program per
                       shape); `stderr` is the standard error. Q(s_t, y_t) = V(s_{t+1}).
  `exact=True` enumerates every continuation token by token instead (small cases, e.g. under
  top-k; refused past `max_enumeration` sequences) — the Monte-Carlo mode is tested against it.
  Per turn: `turn_value[b, k]` = V at the turn's first token (the success probability after
  the turn prefix), `turn_advantage[b, k]` = V after the turn − V before it.

  Continuations replay the rollout's actions in a fresh environment of each row
  (`task.make_env(example, limits)`; the replayed observations must equal the rollout's) and
  encode observations as the rollout engine does (cut to `max_observation_tokens`); the
  episode's token budget must not cut episodes (`layout.budget` = K · (W_a + W_o)). Tokens that
  decode to no character (pad, bos) are read as the text they decode to, as the environment
  reads them.

  Args:
    sampler: a `credit.sampling.Sampler` of the policy (its stop tokens end turns).
    model_state: the policy's `nnx.State`.
    task: a pivotal-turn task (`make_env`, `pivot_turns`, `decided_at_turn`).
    tokenizer: the character tokenizer of the rollout (`encode`, `decode`, `pad_id`).
    examples: [B] the example of each row.
    tokens, response_mask, obs_mask, prompt_mask, turn_id: [B,T] a multi-turn rollout batch
      (`MultiTurnOutput` / the runner's env_rollout host arrays).
    layout: the rollout's `credit.envs.rollout.TurnLayout`.
    key: PRNG key of the Monte-Carlo continuations.
    limits: the environments' `credit.envs.Limits` (None: the task's defaults).
    num_rollouts, temperature, top_k, top_p, min_p, exact, max_enumeration, chunk_rows: as
      `true_advantages`.

  Returns:
    `TurnTrueAdvantages` of numpy arrays ([B,T] per token, [B,K] per turn, K =
    `layout.max_turns`).

  Raises:
    TypeError: the task has no pivotal-turn interface.
    ValueError: shapes, overlapping or empty masks, turns that are not contiguous, a budget
      that can cut episodes, an environment that does not replay the rollout, a bad rollout
      count or sampling parameter, or an enumeration over `max_enumeration`.
  """
  _check_turn_task(task)
  tokens, response_mask, obs_mask, prompt_mask, turn_id = _check_turn_rollout(
      tokens, response_mask, obs_mask, prompt_mask, turn_id, examples, layout, num_rollouts,
      chunk_rows)
  B, T = tokens.shape
  stops = set(int(s) for s in sampler.stop_tokens)
  pad, V = int(tokenizer.pad_id), int(sampler.vocab_size)
  sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
  params = sampling_params(**sampling, vocab_size=V)  # raises on bad values, before tracing
  policy = _Policy(sampler.graphdef, model_state, params, chunk_rows)
  episodes = _split_episodes(tokens, response_mask, obs_mask, prompt_mask, turn_id)
  envs = [task.make_env(examples[b], limits) for b in range(B)]
  decided = [tuple(int(x) for x in task.decided_at_turn(examples[b])) for b in range(B)]
  cont = _Continuations(envs, tokenizer, policy, decided, stops, pad, V, layout)
  starts, reward = cont.replay(episodes)
  order, need, items0, decide_items = _turn_prefixes(episodes, starts, decided)
  bs = list(decide_items)
  v_d = dict(zip(bs, cont.last_step([decide_items[b] for b in bs])))
  if exact:
    v_mc = _enumerate_turns(items0, policy, pad, cont.advance, cont.last_step,
                            cont.at_decision, max_enumeration)
    e_mc = np.zeros(len(items0))
  else:
    v_mc, e_mc = _monte_carlo_turns(items0, sampler, model_state, key, num_rollouts, sampling,
                                    cont.advance, cont.last_step, stops, pad, cont.W_a,
                                    decided)
  vals = dict(zip(need, v_mc))
  errs = dict(zip(need, e_mc))
  return _turn_token_values(task, examples, order, reward, decided, v_d, vals, errs, T,
                            layout.max_turns)


def _check_turn_rollout(tokens, response_mask, obs_mask, prompt_mask, turn_id, examples,
                        layout: Any, num_rollouts: int, chunk_rows: int):
  """A multi-turn rollout batch as numpy arrays (tokens, response_mask, obs_mask,
  prompt_mask, turn_id), after the shape, mask, budget and count checks."""
  tokens = np.asarray(tokens)
  response_mask, obs_mask = np.asarray(response_mask, bool), np.asarray(obs_mask, bool)
  prompt_mask, turn_id = np.asarray(prompt_mask, bool), np.asarray(turn_id)
  if tokens.ndim != 2 or any(x.shape != tokens.shape for x in (response_mask, obs_mask,
                                                                prompt_mask, turn_id)):
    raise ValueError(f"tokens {tokens.shape}, response_mask {response_mask.shape}, obs_mask "
                     f"{obs_mask.shape}, prompt_mask {prompt_mask.shape} and turn_id "
                     f"{turn_id.shape} must be the same [B,T]")
  B = tokens.shape[0]
  K = layout.max_turns
  if len(examples) != B:
    raise ValueError(f"{len(examples)} examples for {B} rows")
  if not response_mask.any():
    raise ValueError("response_mask selects no token")
  if np.any(response_mask & prompt_mask) or np.any(response_mask & obs_mask) or np.any(
      obs_mask & prompt_mask):
    raise ValueError("response_mask, obs_mask and prompt_mask overlap")
  if layout.budget < K * layout.turn_width:
    raise ValueError(f"the episode budget {layout.budget} can cut episodes (K·(W_a+W_o) = "
                     f"{K * layout.turn_width}); the continuations assume it never does")
  _check_counts(num_rollouts, chunk_rows)
  return tokens, response_mask, obs_mask, prompt_mask, turn_id


class _Continuations:
  """Partial episodes (`_Item`s) played on against a fresh environment of each row.

  `replay` checks the rollout against the environments and returns the state before every
  turn; `advance` takes a continuation one batch of tokens further (through the environment's
  answer when the turn ends); `last_step` is the exact value at the decisive token,
  Σ_a π(a | item) R(a), with the outcomes R cached per row, earlier actions and turn prefix.
  """

  def __init__(self, envs, tokenizer, policy: _Policy, decided, stops: set[int], pad: int,
               V: int, layout: Any):
    self.envs, self.tokenizer, self.policy, self.decided = envs, tokenizer, policy, decided
    self.stops, self.pad, self.V = stops, pad, V
    self.K, self.W_a = layout.max_turns, layout.max_action_tokens
    self.W_o = layout.max_observation_tokens
    self.cand_cache: dict = {}

  def play(self, b: int, snap: Any, text: str):
    env = self.envs[b]
    env.restore(snap)
    res = env.step(text)
    return res, env.snapshot(), float(env.outcome()), bool(env.done)

  def replay(self, episodes) -> tuple[list, np.ndarray]:
    """Replays each row's actions: (starts, reward), starts[b][k] = (snapshot before turn k,
    action texts of turns < k); refuses observations that differ from the rollout's."""
    tok, K, W_o = self.tokenizer, self.K, self.W_o
    starts = []
    reward = np.zeros(len(episodes))
    for b, (_, turns) in enumerate(episodes):
      env = self.envs[b]
      env.reset()
      snaps, texts = [], ()
      for k, ids, _, obs in turns:
        snaps.append((env.snapshot(), texts))
        text = tok.decode(ids)
        res, _, _, done = self.play(b, env.snapshot(), text)
        texts += (text,)
        want = [] if (done or k == K - 1) else list(tok.encode(res.observation))[:W_o]
        if list(obs) != want:
          raise ValueError(f"row {b}, turn {k}: the environment replays observation {want} "
                           f"but the rollout has {list(obs)} (other limits or layout?)")
      starts.append(snaps)
      reward[b] = env.outcome()
    return starts, reward

  def at_decision(self, it: _Item) -> bool:
    kd, i_d = self.decided[it.b]
    return it.k == kd and len(it.partial) == i_d < self.W_a  # (a decision past W_a never comes)

  def advance(self, it: _Item, new: Sequence[int]):
    """The item after `new` tokens of its turn: ("decide", item) at the decisive token,
    ("end", W) when the episode's outcome is known, else ("go", item)."""
    partial = it.partial + tuple(int(a) for a in new)
    it = it._replace(partial=partial)
    stopped = any(int(a) in self.stops for a in new)
    if not stopped and self.at_decision(it):
      return "decide", it
    if not (stopped or len(partial) >= self.W_a):
      return "go", it  # mid-turn
    text = self.tokenizer.decode(list(partial))
    res, snap, outcome, done = self.play(it.b, it.snap, text)
    if done or it.k >= self.decided[it.b][0] or it.k == self.K - 1:
      return "end", outcome
    obs = tuple(self.tokenizer.encode(res.observation))[:self.W_o]
    if not obs:
      raise ValueError(f"row {it.b}: an empty observation for a continuing episode")
    it = _Item(it.b, it.ctx + partial + obs, snap, it.texts + (text,), it.k + 1, ())
    return ("decide", it) if self.at_decision(it) else ("go", it)

  def last_step(self, items: Sequence[_Item]) -> np.ndarray:
    """Σ_a π(a | item) R(a) for items at their decisive token."""
    if not items:
      return np.zeros(0)
    lp = self.policy([list(it.ctx + it.partial) for it in items], self.pad)
    rew = []
    for it in items:
      ck = (it.b, it.texts, it.partial)
      if ck not in self.cand_cache:
        self.cand_cache[ck] = np.asarray(
            [self.play(it.b, it.snap, self.tokenizer.decode(list(it.partial) + [a]))[2]
             for a in range(self.V)], np.float64)
      rew.append(self.cand_cache[ck])
    return np.sum(np.exp(lp.astype(np.float64)) * np.stack(rew), axis=1)


def _turn_prefixes(episodes, starts, decided):
  """The policy tokens of each row in episode order and the prefixes that need a value.

  Returns (order, need, items, decide_items): order[b] = [(turn k, index i in the turn,
  column)]; need = [(b, position in order[b])] of the tokens before the decisive one and
  items their `_Item`s (same order); decide_items[b] = the item at the decisive token.
  """
  order = []
  need, items0 = [], []
  decide_items = {}
  for b, (prompt, turns) in enumerate(episodes):
    row, ctx = [], tuple(prompt)
    kd, i_d = decided[b]
    for k, ids, cols, obs in turns:
      snap, texts = starts[b][k]
      for i, c in enumerate(cols):
        row.append((k, i, int(c)))
        it = _Item(b, ctx, snap, texts, k, tuple(ids[:i]))
        if (k, i) < (kd, i_d):
          need.append((b, len(row) - 1))
          items0.append(it)
        elif (k, i) == (kd, i_d):
          decide_items[b] = it
      ctx = ctx + tuple(ids) + tuple(obs)
    order.append(row)
  return order, need, items0, decide_items


def _turn_token_values(task, examples, order, reward, decided, v_d, vals, errs, T: int,
                       K: int) -> TurnTrueAdvantages:
  """Lays the values out per policy token (V, A = V_next − V, standard errors) and per turn
  (V before the turn, its change over the turn)."""
  B = len(order)
  value = np.zeros((B, T), np.float32)
  adv = np.zeros((B, T), np.float32)
  err = np.zeros((B, T), np.float32)
  pivot = np.zeros((B, T), bool)
  decided_mask = np.zeros((B, T), bool)
  turn_value = np.zeros((B, K), np.float32)
  turn_adv = np.zeros((B, K), np.float32)
  turn_err = np.zeros((B, K), np.float32)
  pivot_turn = np.zeros((B, K), bool)
  for b in range(B):
    row, r, kd_id = order[b], reward[b], decided[b]
    pivots = set(int(p) for p in task.pivot_turns(examples[b]))
    for p in pivots:
      if 0 <= p < K:
        pivot_turn[b, p] = True
    v_row, e_row = [], []
    for idx, (k, i, c) in enumerate(row):
      pivot[b, c] = k in pivots
      if (k, i) > kd_id:
        v, e = r, 0.0
      elif (k, i) == kd_id:
        v, e = v_d[b], 0.0
        decided_mask[b, c] = True
      else:
        v, e = vals[(b, idx)], errs[(b, idx)]
      v_row.append(v)
      e_row.append(e)
    v_row.append(r)   # after the last token: the reward
    e_row.append(0.0)
    for idx, (k, i, c) in enumerate(row):
      value[b, c] = v_row[idx]
      adv[b, c] = v_row[idx + 1] - v_row[idx]
      err[b, c] = np.sqrt(e_row[idx] ** 2 + e_row[idx + 1] ** 2)
    firsts = [idx for idx, (k, i, _) in enumerate(row) if i == 0] + [len(row)]
    for j in range(len(firsts) - 1):
      k = row[firsts[j]][0]
      s, nx = firsts[j], firsts[j + 1]
      turn_value[b, k] = v_row[s]
      turn_adv[b, k] = v_row[nx] - v_row[s]
      turn_err[b, k] = np.sqrt(e_row[s] ** 2 + e_row[nx] ** 2)
  return TurnTrueAdvantages(value, adv, err, pivot, decided_mask, turn_value, turn_adv,
                            turn_err, pivot_turn)


def _monte_carlo_turns(items, sampler, model_state, key, R, sampling, advance, last_step,
                       stops, pad, W_a, decided):
  """[n] mean W, [n] standard errors from R continuations of each item, advanced one turn per
  sampler call (every active continuation in one call; per-row token budgets)."""
  n = len(items)
  if not n:
    return np.zeros(0), np.zeros(0)
  w = np.zeros((n, R))
  active = [(i, j, it) for i, it in enumerate(items) for j in range(R)]
  finish = []
  rnd = 0
  while active:
    # Rows and the widest context padded to powers of two: few shapes, few compiles.
    rows = 1 << max(3, (len(active) - 1).bit_length())
    width = 1 << max(3, (max(len(it.ctx) + len(it.partial) for _, _, it in active) - 1
                         ).bit_length())
    toks = np.full((rows, width), pad, np.int32)
    mask = np.zeros((rows, width), bool)
    budget = np.ones(rows, np.int32)
    for r, (_, _, it) in enumerate(active):
      row = it.ctx + it.partial
      toks[r, :len(row)], mask[r, :len(row)] = row, True
      kd, i_d = decided[it.b]
      budget[r] = min(i_d if it.k == kd else W_a, W_a) - len(it.partial)
    toks[len(active):, 0], mask[len(active):, 0] = toks[0, 0], True  # filler rows
    out = sampler(model_state, prompt_tokens=toks, prompt_mask=mask,
                  key=jax.random.fold_in(key, rnd), max_new_tokens=W_a,
                  max_new_tokens_per_row=budget, **sampling)
    o_tok, o_resp = np.asarray(out.tokens), np.asarray(out.response_mask)
    nxt = []
    for r, (i, j, it) in enumerate(active):
      new = o_tok[r][o_resp[r]].tolist()
      cut = next((m + 1 for m, a in enumerate(new) if a in stops), len(new))
      status, x = advance(it, new[:cut])
      if status == "end":
        w[i, j] = x
      elif status == "decide":
        finish.append((i, j, x))
      else:
        nxt.append((i, j, x))
    active = nxt
    rnd += 1
  vals = last_step([it for _, _, it in finish])
  for (i, j, _), v in zip(finish, vals):
    w[i, j] = v
  se = w.std(axis=1, ddof=1) / np.sqrt(R) if R > 1 else np.zeros(n)
  return w.mean(axis=1), se


def _enumerate_turns(items, policy, pad, advance, last_step, at_decision, limit):
  """[n] V of each item by expanding every continuation token by token."""
  out = np.zeros(len(items))
  for n, it0 in enumerate(items):
    frontier, total, value = [(it0, 1.0)], 0, 0.0
    while frontier:
      here = [(it, p) for it, p in frontier if at_decision(it)]
      rest = [(it, p) for it, p in frontier if not at_decision(it)]
      if here:
        value += float(np.dot(last_step([it for it, _ in here]), [p for _, p in here]))
      if not rest:
        break
      lp = policy([list(it.ctx + it.partial) for it, _ in rest], pad)
      nxt = []
      for (it, p), row_lp in zip(rest, lp):
        probs = np.exp(row_lp.astype(np.float64))
        for a in np.flatnonzero(probs > 0.0):
          status, x = advance(it, [int(a)])
          if status == "end":
            value += p * probs[a] * x
          else:
            nxt.append((x, p * probs[a]))
      total += len(nxt)
      if total > limit:
        raise ValueError(f"exact enumeration needs more than max_enumeration={limit} "
                         f"sequences (row {it0.b}); use Monte-Carlo")
      frontier = nxt
    out[n] = value
  return out
