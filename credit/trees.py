"""Branch sampling: trees of rollouts grown from shared prefixes, laid out as padded arrays.

A tree batch is an ordinary rollout batch (DESIGN.md contract) with two more fields:

  parent_id [B] int32   the row a branch continues (−1: a root, an independent sample)
  prefix_len [B] int32  the column where the branch departs from its parent (0 for roots)

Every row holds a complete sequence: prompt, then the tokens of its root-to-row path. A branch
row c copies ``tokens[parent_id[c], :prefix_len[c]]`` and samples the rest itself, so each row
is a valid input to any scorer. `response_mask` is True only on the tokens a row sampled
itself: every token of the tree is a loss token in exactly one row, and a shared prefix is never
credited twice. `path_mask` is the whole response of the row's path (what a verifier reads).
The exact-prefix group ("node") of a branch point (a, p) is {a} ∪ {c : parent_id[c] = a,
prefix_len[c] = p}; siblings are contiguous rows. Estimators take parent_id / prefix_len and
stay pure functions over the padded arrays (`credit.advantages.tree`).

Growing a tree (`grow_tree`, one round per depth d = 1..D):
  1. candidates: the tokens each row of depth d−1 sampled itself, except its first (branching
     there gives a sibling of the row, not a branch of it);
  2. scores: token entropy (CBPO's choice), the sampled token's surprisal, step boundaries
     (`step_starts`), or any caller-given [B,T] score (e.g. 1 at the first wrong step);
  3. selection per prompt group, greedy under a budget of M_d = max(1, ⌊M·decay^{d−1}⌋)
     points: take the best candidate, then damp its row by γ_path (a path that already
     branched is less attractive, CBPO's path-level decay) and the positions near it by
     (1 − γ_node^{|t − t_sel|}) (node-level decay: no two points in one place);
  4. sampling: k continuations of each chosen prefix with the jitted sampler; each
     continuation's budget keeps its path within the root's response length. Given the
     roots' kept KV cache (`cache=`, `credit.sampling.RowCache`), a branch starts from a copy
     of its parent's cache cut at the branch point: nothing of the prefix is computed again
     except its last token (for the logits of the first draw), and each round keeps its own
     cache for the next. Without it, each prefix is run through the model once and its cache
     repeated for its k rows (`share_prefix`). Both draw the same tokens up to float rounding.

A point that finds no candidate (a group whose rows are all one token long) samples k fresh
roots of its prompt instead, so the batch keeps its static size ``N·G + N·k·Σ_d M_d``.

`step_rollout` lays out SLATE's step-level sampling the same way: per prompt, k candidate next
steps from the chosen path at every step, each a row owning only its step's tokens.

The traced side, shared by the tree estimators (CBPO, TreeRL, SLATE, PROPA) and the runner:
`validate_tree` (eager checks of a layout, before tracing), `tree_layout` (a tree batch after
the shared checks, a `TreeRows`), `sibling_matrix` and `first_of_node` (the rows of one
exact-prefix node; [B,B] comparisons, O(B²), fine for a few hundred rows) and
`segment_starts` (where a row's tokens change node).
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from credit import ops, parallel
from credit._checks import check_choice, check_int

Array = jax.Array

__all__ = ["TreeRollout", "BRANCH_CRITERIA", "budgets", "tree_rows", "branch_candidates",
           "step_starts", "choose_branch_points", "grow_tree", "path_segments",
           "rebuild_paths", "tree_depth", "node_normalize", "step_rollout",
           "validate_tree", "TreeRows", "tree_layout", "sibling_matrix", "first_of_node",
           "segment_starts"]

BRANCH_CRITERIA = ("entropy", "surprisal", "step", "given")


class TreeRollout(NamedTuple):
  """A tree of rollouts as host (numpy) arrays, B rows of width T.

  tokens [B,T] int32; response_mask [B,T] bool (tokens the row sampled itself); path_mask
  [B,T] bool (the response of the row's whole path); prompt_mask [B,T] bool;
  logprob_sampler, logprob_raw [B,T] f32 (the row's own tokens, 0 elsewhere); group_id,
  parent_id, prefix_len, depth [B] int32.
  """
  tokens: np.ndarray
  response_mask: np.ndarray
  path_mask: np.ndarray
  prompt_mask: np.ndarray
  logprob_sampler: np.ndarray
  logprob_raw: np.ndarray
  group_id: np.ndarray
  parent_id: np.ndarray
  prefix_len: np.ndarray
  depth: np.ndarray


def budgets(points: int, depth: int, decay: float) -> tuple[int, ...]:
  """Branch points per prompt group at depths 1..D: max(1, ⌊points·decay^{d−1}⌋)."""
  if points < 1 or depth < 1:
    raise ValueError(f"points={points} and depth={depth} must be >= 1")
  if not 0.0 < decay <= 1.0:
    raise ValueError(f"depth decay must be in (0, 1], got {decay}")
  return tuple(max(1, int(points * decay ** d)) for d in range(depth))


def tree_rows(num_groups: int, group_size: int, branches: int, points: int, depth: int = 1,
              decay: float = 0.5) -> int:
  """Rows of a tree batch: N·G roots plus N·k·Σ_d M_d branches."""
  return num_groups * (group_size + branches * sum(budgets(points, depth, decay)))


def branch_candidates(response_mask: np.ndarray) -> np.ndarray:
  """[B,T] bool: a row's own tokens after its first one (where a branch of it may depart)."""
  own = np.asarray(response_mask, bool)
  first = own & ~np.concatenate([np.zeros_like(own[:, :1]), own[:, :-1]], axis=1)
  return own & ~first


def step_starts(step_id: np.ndarray) -> np.ndarray:
  """[B,T] bool: the first token of every step after the first (step boundaries)."""
  s = np.asarray(step_id)
  prev = np.concatenate([np.full_like(s[:, :1], -1), s[:, :-1]], axis=1)
  return (s >= 0) & (prev >= 0) & (s != prev)


@functools.partial(jax.jit, static_argnames=("num_groups", "num_points"))
def choose_branch_points(score_BT: Array, candidate_BT: Array, group_id_B: Array, *,
                         num_groups: int, num_points: int, gamma_path: float = 0.5,
                         gamma_node: float = 0.5) -> tuple[Array, Array, Array]:
  """Greedy per-group selection of branch points under a budget (CBPO's decays).

  Repeats `num_points` times, in every prompt group at once: take the candidate with the
  largest score (ties: the lowest flat index), then multiply its row's scores by
  γ_path · (1 − γ_node^{|t − t_sel|}) (0 at the chosen position itself).

  Args:
    score_BT: [B,T] float, larger = better (entropy, surprisal, ...); negative scores are
      treated as 0 (still selectable).
    candidate_BT: [B,T] bool, where a branch may depart.
    group_id_B: [B] int prompt group of each row, in [0, num_groups).
    num_groups, num_points: static N and budget M per group.
    gamma_path, gamma_node: the decays.

  Returns:
    (row [N,M] int32, position [N,M] int32, ok [N,M] bool: a candidate was found).
  """
  B, T = score_BT.shape
  score = jnp.maximum(jnp.asarray(score_BT, jnp.float32), 0.0)
  cand = jnp.asarray(candidate_BT, bool)
  in_group_NB = jnp.asarray(group_id_B)[None, :] == jnp.arange(num_groups)[:, None]
  t_T = jnp.arange(T)

  def pick(carry, _):
    score, cand = carry
    eligible_NBT = in_group_NB[:, :, None] & cand[None]
    # −1 marks non-candidates, so a zero-score candidate still beats them.
    flat_N = jnp.where(eligible_NBT, score[None], -1.0).reshape(num_groups, B * T)
    best_N = jnp.argmax(flat_N, axis=1)
    ok_N = jnp.any(eligible_NBT.reshape(num_groups, -1), axis=1)
    row_N, pos_N = (best_N // T).astype(jnp.int32), (best_N % T).astype(jnp.int32)
    # Each row belongs to one group: scatter the groups' picks onto their rows.
    sel_B = jnp.full((B,), -1, jnp.int32).at[jnp.where(ok_N, row_N, B)].set(pos_N, mode="drop")
    hit_B = sel_B >= 0
    damp_BT = gamma_path * (1.0 - jnp.power(gamma_node, jnp.abs(t_T[None] - sel_B[:, None])))
    score = jnp.where(hit_B[:, None], score * damp_BT, score)
    cand = cand & ~(hit_B[:, None] & (t_T[None] == sel_B[:, None]))
    return (score, cand), (row_N, pos_N, ok_N)

  _, (rows, pos, ok) = jax.lax.scan(pick, (score, cand), None, length=num_points)
  return rows.T, pos.T, ok.T


def _concat(a: TreeRollout, b: TreeRollout) -> TreeRollout:
  return TreeRollout(*(np.concatenate([x, y], axis=0) for x, y in zip(a, b)))


def _host(x) -> np.ndarray:
  """A full host copy of `x`: a global array spread over several processes is gathered
  (`credit.parallel.to_host`); host arrays and single-process arrays are read as they are."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return parallel.to_host(x)
  return np.asarray(x)


def tree_depth(parent_id: np.ndarray) -> np.ndarray:
  """[B] depth of every row (roots 0), from `parent_id` (parents precede their branches)."""
  parent_id = np.asarray(parent_id)
  depth = np.zeros(parent_id.shape, np.int32)
  for b, a in enumerate(parent_id):
    if a >= 0:
      if a >= b:
        raise ValueError(f"row {b}: parent {a} must be an earlier row")
      depth[b] = depth[a] + 1
  return depth


def grow_tree(roots: TreeRollout, sample_fn: Callable, *, num_groups: int, branches: int,
              points: int, depth: int = 1, decay: float = 0.5, criterion: str = "entropy",
              score_fn: Callable | None = None, prompt_len: np.ndarray | None = None,
              max_new_tokens: int, gamma_path: float = 0.5, gamma_node: float = 0.5,
              key: Array, cache=None) -> tuple[TreeRollout, dict]:
  """Grows `roots` into a tree of depth `depth` (module docstring).

  Args:
    roots: the root rollouts (parent_id −1, prefix_len 0, depth 0).
    sample_fn: ``sample_fn(prefix_tokens [R,T], prefix_mask [R,T], max_new_per_row [R], key)
      -> SampleOutput`` with R·k rows (row r·k + j continues prefix r; `share_prefix`), of
      width >= the tree's T (columns past T must be padding).
    num_groups: N prompt groups (group ids in [0, N)).
    branches: k continuations per branch point. points: M, branch points per group at
      depth 1. depth: D rounds. decay: budget decay per depth.
    criterion: "entropy" | "surprisal" | "step" | "given" (scores from `score_fn`).
    score_fn: ``score_fn(tree) -> [B,T]`` scores of the current tree's rows: entropies for
      "entropy", step-start indicators (or weights) for "step", any score for "given" (for
      "step" and "given" only positions with a positive score are candidates); not used for
      "surprisal" (−logprob_sampler of each own token).
    prompt_len: [B_roots] valid prompt tokens per root (default: prompt_mask sums).
    max_new_tokens: the roots' response budget; a branch's path never exceeds it.
    gamma_path, gamma_node: selection decays (`choose_branch_points`).
    key: PRNG key.
    cache: the KV cache the roots were sampled with (opaque here; `Sampler(...,
      keep_cache=True)` returns it), its rows the roots' rows. Then every round calls
      ``sample_fn(prefix_tokens, prefix_mask, max_new_per_row, key, parent=(cache, rows))``,
      which continues prefix r from row rows[r] of `cache` (the previous round's call, or the
      roots) and returns ``(SampleOutput, its own kept cache)``:

        def sample_fn(prefix, mask, budget, key, parent):
          return sampler(state, prompt_tokens=prefix, prompt_mask=mask, key=key,
                         max_new_tokens=W, num_samples=k, max_new_tokens_per_row=budget,
                         parent=parent[0], parent_rows=parent[1], keep_cache=True)

      A point without a candidate (fresh roots: the prompt alone) continues the first row of
      its group in the previous call, whose output also begins with the prompt.

  Returns:
    (tree, stats): stats has, per depth, `points_found` and `new_tokens`.
  """
  check_choice("grow_tree", "criterion", criterion, BRANCH_CRITERIA)
  if criterion != "surprisal" and score_fn is None:
    raise ValueError(f"criterion {criterion!r} needs a score_fn")
  if branches < 1:
    raise ValueError(f"branches={branches} must be >= 1")
  tree = roots
  T = tree.tokens.shape[1]
  root_prompt_len = (np.asarray(roots.prompt_mask).sum(1) if prompt_len is None
                     else np.asarray(prompt_len))
  # Prompt length of every row's root: rows inherit it from their parent.
  plen = root_prompt_len.astype(np.int32)
  stats = {"points_found": [], "new_tokens": []}
  # With a kept cache: rows [offset, offset + n) of the tree are the rows of `cache`'s call.
  offset, n_cached = 0, roots.tokens.shape[0]
  for d, m in enumerate(budgets(points, depth, decay)):
    if criterion == "surprisal":
      score = np.where(tree.response_mask, -tree.logprob_sampler, 0.0)
    else:
      score = _host(score_fn(tree)).astype(np.float32)
    cand = branch_candidates(tree.response_mask) & (tree.depth == d)[:, None]
    if criterion in ("step", "given"):  # only where the score marks a point
      cand &= score > 0
    rows, pos, ok = (np.asarray(x) for x in choose_branch_points(
        score, cand, tree.group_id, num_groups=num_groups, num_points=m,
        gamma_path=gamma_path, gamma_node=gamma_node))
    rows, pos, ok = rows.reshape(-1), pos.reshape(-1), ok.reshape(-1)
    group = np.repeat(np.arange(num_groups, dtype=np.int32), m)
    # A point without a candidate samples fresh roots: any row of its group, from its prompt.
    first_row = np.array([np.flatnonzero(tree.group_id == g)[0] for g in group])
    rows = np.where(ok, rows, first_row)
    pos = np.where(ok, pos, plen[rows])
    t = np.arange(T)
    prefix_tok = np.where(t[None] < pos[:, None], tree.tokens[rows], 0).astype(np.int32)
    prefix_mask = t[None] < pos[:, None]
    budget = np.maximum(plen[rows] + max_new_tokens - pos, 0).astype(np.int32)
    if cache is None:
      out = sample_fn(prefix_tok, prefix_mask, budget, jax.random.fold_in(key, d))
    else:
      # Candidates (depth d) are rows of the previous call; a point without one continues
      # the prompt from its group's first row there.
      group_first = np.array([offset + np.flatnonzero(
          tree.group_id[offset:offset + n_cached] == g)[0] for g in group])
      src = np.where(ok, rows, group_first)
      if np.any((src < offset) | (src >= offset + n_cached)):
        raise AssertionError("a branch point's parent is not a row of the previous call")
      out, cache = sample_fn(prefix_tok, prefix_mask, budget, jax.random.fold_in(key, d),
                             parent=(cache, (src - offset).astype(np.int32)))
      offset, n_cached = tree.tokens.shape[0], len(rows) * branches
    out = jax.tree.map(_host, out)  # global arrays of several processes included
    R = len(rows) * branches
    width = np.asarray(out.tokens).shape[1]
    if width < T:
      raise ValueError(f"sample_fn returned width {width} < the tree's T = {T}")
    tok = np.asarray(out.tokens)
    if np.any(np.asarray(out.lengths) > T):
      raise ValueError("a branch ran past the tree's width T; the budgets must keep every "
                       "path within the roots' response length")
    own = np.asarray(out.response_mask)[:, :T]
    rep = lambda x: np.repeat(x, branches, axis=0)
    parent = np.where(rep(ok), rep(rows), -1).astype(np.int32)
    ok_r = rep(ok)
    path = np.where(ok_r[:, None], (rep(tree.path_mask[rows]) & (t[None] < rep(pos)[:, None]))
                    | own, own)
    child = TreeRollout(
        tokens=tok[:, :T].astype(np.int32), response_mask=own, path_mask=path,
        prompt_mask=np.asarray(out.prompt_mask)[:, :T] & ~path,
        logprob_sampler=np.asarray(out.logprob_sampler)[:, :T].astype(np.float32),
        logprob_raw=np.asarray(out.logprob_raw)[:, :T].astype(np.float32),
        group_id=rep(group).astype(np.int32), parent_id=parent,
        prefix_len=np.where(ok_r, rep(pos), 0).astype(np.int32),
        depth=np.where(ok_r, d + 1, 0).astype(np.int32))
    assert child.tokens.shape[0] == R
    tree = _concat(tree, child)
    plen = np.concatenate([plen, rep(plen[rows])])
    stats["points_found"].append(int(ok.sum()))
    stats["new_tokens"].append(int(own.sum()))
  return tree, stats


def path_segments(tree: TreeRollout) -> list[list[tuple[int, int, int]]]:
  """For every row, its path as (row, start, end) segments of own tokens, root first: the
  root's columns [0, end) (prompt and its own response), then each branch's own columns."""
  out = []
  for b in range(len(tree.parent_id)):
    chain = [b]
    while tree.parent_id[chain[-1]] >= 0:
      chain.append(int(tree.parent_id[chain[-1]]))
    chain.reverse()
    segs = []
    for i, r in enumerate(chain):
      start = 0 if i == 0 else int(tree.prefix_len[r])
      end = int(tree.prefix_len[chain[i + 1]]) if i + 1 < len(chain) else int(
          np.flatnonzero(tree.prompt_mask[r] | tree.path_mask[r]).max() + 1)
      segs.append((r, start, end))
    out.append(segs)
  return out


def rebuild_paths(tree: TreeRollout) -> np.ndarray:
  """[B,T] tokens of every root-to-row path assembled from the segments each row owns (own
  tokens only, plus the root's prompt); equals `tree.tokens` on prompt | path for a valid tree."""
  out = np.zeros_like(tree.tokens)
  for b, segs in enumerate(path_segments(tree)):
    for r, start, end in segs:
      out[b, start:end] = tree.tokens[r, start:end]
  return out


def _pick(rng: np.random.Generator, adv: np.ndarray, eta: float) -> int:
  """SLATE's continuation choice among one node's candidates: softmax(A/η), argmax if η ≤ 0."""
  if eta <= 0:
    return int(np.argmax(adv))
  z = adv / eta
  p = np.exp(z - z.max())
  return int(rng.choice(len(adv), p=p / p.sum()))


def node_normalize(reward_NK: np.ndarray, eps: float = 1e-6) -> np.ndarray:
  """(r − mean)/(std_{ddof=1} + eps) over each node's k candidates (rows of [N,k]); a node of
  one candidate gets 0 (the SLATE code divides by a NaN std there)."""
  r = np.asarray(reward_NK, np.float64)
  if r.shape[1] < 2:
    return np.zeros_like(r)
  return (r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + eps)


def step_rollout(prompt_tokens: np.ndarray, prompt_mask: np.ndarray, sample_fn: Callable,
                 judge_fn: Callable, *, candidates: int, max_steps: int, max_new_tokens: int,
                 eta: float = 0.7, key: Array) -> tuple[TreeRollout, np.ndarray, dict]:
  """SLATE's truncated step-level sampling, laid out as a tree batch.

  For each of N prompts and each step t = 0..S−1: sample k candidate next steps from the
  current prefix (one prefill, `share_prefix`; the sampler stops at a step delimiter), have
  `judge_fn` score each, normalise the k scores (`node_normalize`) and continue from one
  candidate drawn by softmax(A/η) (argmax for η ≤ 0) until a candidate ends the response.
  Every candidate is a row: its own tokens are the candidate step (the loss tokens); its
  parent is the candidate chosen at the previous step (−1 at t = 0), `prefix_len` where it
  departs; the k candidates of a step share their parent and prefix (an exact-prefix node).
  A prompt that finished early keeps sampling nothing: its later rows are empty (no
  tokens, score 0), so the batch has the static N·k·S rows.

  Args:
    prompt_tokens, prompt_mask: [N,P] prompts (padded anywhere).
    sample_fn: ``sample_fn(prefix [N,W], mask [N,W], budget [N], key) -> SampleOutput`` of N·k
      rows (row n·k + j: candidate j of prefix n), stopping at step delimiters and eos.
    judge_fn: ``judge_fn(n, steps_before, step, t) -> (score, final)`` for candidate token ids
      `step` of prompt n after the chosen steps `steps_before` (lists of id arrays); final:
      the candidate ends the response (an answer step or eos).
    candidates: k. max_steps: S. max_new_tokens: the response budget of a whole path.
    eta: the choice temperature. key: PRNG key.

  Returns:
    (tree, score [N·k·S], stats): stats has `path_steps` [N], `path_tokens` [N,W'] and
    `path_mask` [N,W'] of each prompt's chosen path.
  """
  prompt_tokens = np.asarray(prompt_tokens, np.int32)
  prompt_mask = np.asarray(prompt_mask, bool)
  N, P = prompt_tokens.shape
  k, W = candidates, P + max_new_tokens
  t_W = np.arange(W)
  plen = prompt_mask.sum(1)
  cur = np.zeros((N, W), np.int32)  # the chosen path, right-padded: prompt then steps
  for n in range(N):
    cur[n, :plen[n]] = prompt_tokens[n][prompt_mask[n]]
  cur_len, cur_path = plen.copy(), np.zeros((N, W), bool)
  done = np.zeros(N, bool)
  steps: list[list[np.ndarray]] = [[] for _ in range(N)]
  parent = np.full(N, -1, np.int32)
  rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel()[-1].item())
  parts, scores, path_steps = [], [], np.zeros(N, np.int32)
  for t in range(max_steps):
    budget = np.where(done, 0, plen + max_new_tokens - cur_len).astype(np.int32)
    out = sample_fn(cur, t_W[None] < cur_len[:, None], budget, jax.random.fold_in(key, t))
    out = jax.tree.map(_host, out)  # global arrays of several processes included
    if np.any(np.asarray(out.lengths) > W):
      raise ValueError("a candidate ran past the path budget")
    tok = np.asarray(out.tokens)[:, :W].astype(np.int32)
    own = np.asarray(out.response_mask)[:, :W]
    score = np.zeros(N * k, np.float32)
    final = np.ones(N * k, bool)
    for r in range(N * k):
      n = r // k
      if own[r].any():
        score[r], final[r] = judge_fn(n, steps[n], tok[r][own[r]], t)
    rep = lambda x: np.repeat(x, k, axis=0)
    base = t * N * k  # row index of this step's first candidate
    parts.append(TreeRollout(
        tokens=tok, response_mask=own, path_mask=rep(cur_path) | own,
        prompt_mask=rep(t_W[None] < plen[:, None]),
        logprob_sampler=np.asarray(out.logprob_sampler)[:, :W].astype(np.float32),
        logprob_raw=np.asarray(out.logprob_raw)[:, :W].astype(np.float32),
        group_id=rep(np.arange(N, dtype=np.int32)), parent_id=rep(parent),
        prefix_len=np.where(t == 0, 0, rep(np.minimum(cur_len, W - 1))).astype(np.int32),
        depth=np.full(N * k, t, np.int32)))
    scores.append(score)
    adv = node_normalize(score.reshape(N, k))
    for n in np.flatnonzero(~done):
      j = _pick(rng, adv[n], eta)
      r = n * k + j
      steps[n].append(tok[r][own[r]])
      cur[n], cur_path[n] = tok[r], cur_path[n] | own[r]
      cur_len[n] += int(own[r].sum())
      parent[n] = base + r
      path_steps[n] += 1
      done[n] = final[r] or cur_len[n] >= plen[n] + max_new_tokens
  tree = TreeRollout(*(np.concatenate(x, axis=0) for x in zip(*parts)))
  return tree, np.concatenate(scores), {"path_steps": path_steps, "path_tokens": cur,
                                         "path_mask": cur_path}


# --------------------------------------------------------------------------------------------
# Tree layout on the traced side (estimators) and its eager checks (runner).
# --------------------------------------------------------------------------------------------


def _concrete(*xs) -> bool:
  return all(not isinstance(x, jax.core.Tracer) for x in xs if x is not None)


def validate_tree(parent_id: ArrayLike, prefix_len: ArrayLike, group_id: ArrayLike | None = None,
                  *, num_tokens: int | None = None, where: str = "tree") -> None:
  """Eager checks of a tree layout (host arrays; call before tracing).

  Raises ValueError when: the arrays are not [B] integers; a parent index is outside [−1, B)
  or not smaller than the row's own index; a branch departs at a column outside
  [1, num_tokens) or not after its parent's own departure column (a branch of a branch departs
  inside the parent's own tokens); a root has a non-zero prefix_len; a branch has another
  prompt group than its parent.
  """
  par = np.asarray(parent_id)
  pre = np.asarray(prefix_len)
  if par.ndim != 1 or pre.shape != par.shape:
    raise ValueError(f"{where}: parent_id and prefix_len must both be [B], got {par.shape} and "
                     f"{pre.shape}")
  if par.dtype.kind not in "iu" or pre.dtype.kind not in "iu":
    raise ValueError(f"{where}: parent_id and prefix_len must be integers, got {par.dtype} and "
                     f"{pre.dtype}")
  rows = np.arange(par.shape[0])
  bad = (par < -1) | (par >= rows)
  if bad.any():
    i = int(np.flatnonzero(bad)[0])
    raise ValueError(f"{where}: parent_id[{i}] = {par[i]}; a branch continues an earlier row "
                     "(−1 <= parent_id[c] < c)")
  root = par < 0
  if np.any(pre[root] != 0):
    i = int(np.flatnonzero(root & (pre != 0))[0])
    raise ValueError(f"{where}: root row {i} has prefix_len {pre[i]} (roots depart at 0)")
  child = ~root
  hi = np.iinfo(np.int64).max if num_tokens is None else num_tokens
  p = pre[child]
  if np.any((p < 1) | (p >= hi)):
    i = int(np.flatnonzero(child & ((pre < 1) | (pre >= hi)))[0])
    raise ValueError(f"{where}: branch row {i} departs at prefix_len {pre[i]}, outside "
                     f"[1, {num_tokens if num_tokens is not None else 'T'})")
  parents = np.where(child, par, 0)
  later = child & (pre <= pre[parents]) & (par[parents] >= 0)
  if later.any():
    i = int(np.flatnonzero(later)[0])
    raise ValueError(f"{where}: branch row {i} departs at {pre[i]}, not after its parent row "
                     f"{par[i]}'s own departure at {pre[par[i]]}")
  if group_id is not None:
    gid = np.asarray(group_id)
    if gid.shape != par.shape:
      raise ValueError(f"{where}: group_id must be [B] like parent_id, got {gid.shape}")
    diff = child & (gid != gid[parents])
    if diff.any():
      i = int(np.flatnonzero(diff)[0])
      raise ValueError(f"{where}: branch row {i} is in group {gid[i]} but its parent row "
                       f"{par[i]} in group {gid[par[i]]}")


class TreeRows(NamedTuple):
  """A tree batch after the shared checks (`tree_layout`).

  reward: [B] float32, 0 on invalid rows. group_id: [B] int32. mask: [B,T] bool.
  valid: [B] bool, a non-empty response and a group id in [0, num_groups).
  parent: [B] int32, −1 for roots. prefix: [B] int32. child: [B] bool (parent >= 0).
  """
  reward: Array
  group_id: Array
  mask: Array
  valid: Array
  parent: Array
  prefix: Array
  child: Array


def tree_layout(fn: str, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                parent_id: ArrayLike, prefix_len: ArrayLike, num_groups: int) -> TreeRows:
  """Shape/type asserts, static checks, eager `validate_tree` (on concrete inputs) and the
  per-row validity of a tree batch."""
  check_int(fn, "num_groups", num_groups)
  if _concrete(parent_id, prefix_len, group_id, response_mask):
    validate_tree(parent_id, prefix_len, group_id, num_tokens=np.shape(response_mask)[-1],
                  where=fn)
  rows = ops.group_rows(fn, reward, group_id, num_groups, response_mask=response_mask)
  par = jnp.asarray(parent_id)
  pre = jnp.asarray(prefix_len)
  chex.assert_type([par, pre], int)
  chex.assert_equal_shape([par, pre, rows.values])
  par = par.astype(jnp.int32)
  return TreeRows(reward=jnp.where(rows.valid, rows.values, 0.0), group_id=rows.group_id,
                  mask=rows.mask, valid=rows.valid, parent=par,
                  prefix=pre.astype(jnp.int32), child=par >= 0)


def sibling_matrix(tree: TreeRows) -> Array:
  """[B,B] bool: rows c, c' are branches of the same node (same parent and prefix_len);
  True on the diagonal of branch rows, False for roots."""
  same = (tree.parent[:, None] == tree.parent[None, :]) & (
      tree.prefix[:, None] == tree.prefix[None, :])
  return same & tree.child[:, None] & tree.child[None, :]


def first_of_node(sib_BB: Array, valid_B: Array) -> Array:
  """[B] bool: the valid branch row of lowest index in its node (one writer per node)."""
  B = valid_B.shape[0]
  before = jnp.arange(B)[None, :] < jnp.arange(B)[:, None]
  return valid_B & ~jnp.any(sib_BB & valid_B[None, :] & before, axis=1)


def segment_starts(tree: TreeRows, has_B: Array, num_tokens: int) -> tuple[Array, Array]:
  """Branch points taken from each row and, per token, the last one at or before it.

  Args:
    tree: the batch.
    has_B: [B] bool, the branch rows whose node counts (e.g. the valid ones).
    num_tokens: T.

  Returns:
    (mark_BT, start_BT): mark[a, p] = a valid-looking branch departs from row a at column p;
    start[a, t] = the largest such p <= t, −1 before the first (the row's own segment).
  """
  B, T = tree.parent.shape[0], num_tokens
  ok = has_B & tree.child & (tree.prefix >= 0) & (tree.prefix < T)
  a = jnp.where(ok, tree.parent, B)               # out of range: dropped
  mark = jnp.zeros((B, T), bool).at[a, jnp.clip(tree.prefix, 0, T - 1)].set(True, mode="drop")
  pos = jnp.where(mark, jnp.arange(T, dtype=jnp.int32)[None, :], -1)
  return mark, jax.lax.cummax(pos, axis=1)
