"""Tests of credit.trees (branch sampling, tree layout) and the sampler's shared prefixes."""
import functools

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from credit import trees
from tests.sampling_test import _prompts, _sampler, _state

MAX_NEW = 10


def test_shared_prefix_samples_what_repeated_prefixes_sample():
  # One prefill per prompt, its cache repeated for the G rows: the same draws (same keys) as
  # G prefills of the repeated prompt, and the same log-probs up to float rounding.
  # (The shapes of `_roots`, so the shared program is compiled once for both.)
  tokens, mask = _prompts(3)
  kw = dict(prompt_tokens=tokens, prompt_mask=mask, key=jax.random.key(5),
            max_new_tokens=MAX_NEW, num_samples=3, temperature=1.0,
            max_new_tokens_per_row=np.array([MAX_NEW, 2, MAX_NEW, 4]))
  a = _sampler()(_state(), **kw)
  b = _sampler()(_state(), **kw, share_prefix=True)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.response_mask, b.response_mask)
  np.testing.assert_allclose(a.logprob_sampler, b.logprob_sampler, atol=1e-5)
  np.testing.assert_allclose(a.logprob_raw, b.logprob_raw, atol=1e-5)


def _roots(G=3, seed=1):
  tokens, mask = _prompts(seed)
  out = _sampler()(_state(), prompt_tokens=tokens, prompt_mask=mask, key=jax.random.key(seed),
                   max_new_tokens=MAX_NEW, num_samples=G, temperature=1.0, share_prefix=True)
  host = jax.tree.map(np.asarray, out._asdict())
  B = host["tokens"].shape[0]
  return trees.TreeRollout(
      tokens=host["tokens"], response_mask=host["response_mask"],
      path_mask=host["response_mask"], prompt_mask=host["prompt_mask"],
      logprob_sampler=host["logprob_sampler"], logprob_raw=host["logprob_raw"],
      group_id=host["group_id"], parent_id=np.full(B, -1, np.int32),
      prefix_len=np.zeros(B, np.int32), depth=np.zeros(B, np.int32)), host["prompt_lengths"]


def _sample_fn(prefix, mask, budget, key, k=2):
  return _sampler()(_state(), prompt_tokens=prefix, prompt_mask=mask, key=key,
                    max_new_tokens=MAX_NEW, num_samples=k, temperature=1.0,
                    max_new_tokens_per_row=budget, share_prefix=True)


@functools.lru_cache(maxsize=None)
def _tree(criterion="surprisal", depth=2):
  roots, plen = _roots()
  score_fn = None
  if criterion == "step":  # boundaries every 3 tokens of the response
    score_fn = lambda t: trees.step_starts(np.where(t.path_mask, (np.cumsum(t.path_mask, 1) - 1) // 3,
                                                    -1)).astype(np.float32)
  return trees.grow_tree(roots, functools.partial(_sample_fn, k=2), num_groups=4, branches=2,
                         points=2, depth=depth, decay=0.5, criterion=criterion,
                         score_fn=score_fn, max_new_tokens=MAX_NEW, key=jax.random.key(7)), plen


def test_tree_layout_copies_prefixes_and_credits_each_token_once():
  (tree, stats), plen = _tree()
  N, G, k = 4, 3, 2
  assert tree.tokens.shape[0] == trees.tree_rows(N, G, k, 2, 2, 0.5) == N * (G + k * (2 + 1))
  assert stats["points_found"] == [N * 2, N * 1]
  np.testing.assert_array_equal(trees.tree_depth(tree.parent_id), tree.depth)
  t = np.arange(tree.tokens.shape[1])
  for c in np.flatnonzero(tree.parent_id >= 0):
    a, p = tree.parent_id[c], tree.prefix_len[c]
    assert tree.depth[c] == tree.depth[a] + 1 and tree.group_id[c] == tree.group_id[a]
    np.testing.assert_array_equal(tree.tokens[c, :p], tree.tokens[a, :p])
    # Own tokens start at the branch point; the path is the parent's path before it.
    own = tree.response_mask[c]
    assert own[p] and not own[:p].any()
    np.testing.assert_array_equal(tree.path_mask[c], (tree.path_mask[a] & (t < p)) | own)
    np.testing.assert_array_equal(tree.prompt_mask[c], tree.prompt_mask[a])
    assert p > np.flatnonzero(tree.response_mask[a])[0]  # never at the parent's first token
    assert np.all(tree.logprob_sampler[c][~own] == 0.0) and np.all(tree.logprob_sampler[c][own] < 0)
  # Every path stays within its root's response budget.
  roots_plen = np.concatenate([plen, np.zeros(len(tree.depth) - len(plen), int)])
  for b in range(len(tree.depth)):
    r = b
    while tree.parent_id[r] >= 0:
      r = tree.parent_id[r]
    assert tree.path_mask[b].sum() <= MAX_NEW and (tree.prompt_mask[b].sum() == roots_plen[r])
  # Rows are rebuilt exactly from the segments they own; each segment is a row's own tokens.
  valid = tree.prompt_mask | tree.path_mask
  np.testing.assert_array_equal(np.where(valid, trees.rebuild_paths(tree), -1),
                                np.where(valid, tree.tokens, -1))
  owned = np.zeros_like(tree.response_mask)
  for segs in trees.path_segments(tree):
    for r, s, e in segs[1:]:
      owned[r, s:e] = True
  np.testing.assert_array_equal(owned[tree.parent_id >= 0], tree.response_mask[tree.parent_id >= 0])
  # Distinct tree tokens = the sum of own tokens (no prefix counted twice).
  distinct = {tuple(tree.tokens[b, :e]) for b in range(len(tree.depth))
              for e in np.flatnonzero(tree.response_mask[b]) + 1}
  assert len(distinct) <= tree.response_mask.sum()


def test_step_criterion_branches_at_step_starts():
  (tree, _), _ = _tree("step", depth=1)
  kids = np.flatnonzero(tree.parent_id >= 0)
  assert len(kids) == 4 * 2 * 2
  for c in kids:
    a, p = tree.parent_id[c], tree.prefix_len[c]
    resp_pos = np.cumsum(tree.path_mask[a])[p] - 1  # index of p within the response
    assert resp_pos % 3 == 0 and resp_pos > 0


def _np_choose(score, cand, gid, N, M, gp, gn):
  score = np.maximum(score.astype(np.float64), 0.0)
  cand = cand.copy()
  B, T = score.shape
  rows, pos, ok = np.zeros((N, M), int), np.zeros((N, M), int), np.zeros((N, M), bool)
  for m in range(M):
    picks = []
    for n in range(N):
      best, where = -1.0, None
      for b in range(B):
        for t in range(T):
          if gid[b] == n and cand[b, t] and score[b, t] > best + 1e-7:
            best, where = score[b, t], (b, t)
      if where is not None:
        rows[n, m], pos[n, m], ok[n, m] = where[0], where[1], True
        picks.append(where)
    for b, t_sel in picks:
      score[b] *= gp * (1 - gn ** np.abs(np.arange(T) - t_sel))
      cand[b, t_sel] = False
  return rows, pos, ok


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), M=st.integers(1, 3))
def test_choose_branch_points_matches_a_greedy_numpy_reference(seed, M):
  rng = np.random.default_rng(seed)
  B, T, N = 6, 7, 3
  score = rng.choice([0.0, 0.5, 1.0, 2.0, 3.0], (B, T)).astype(np.float32)
  cand = rng.random((B, T)) > 0.4
  cand[rng.integers(0, B)] = False
  gid = rng.permutation(np.arange(B) % N).astype(np.int32)
  got = [np.asarray(x) for x in trees.choose_branch_points(
      score, cand, gid, num_groups=N, num_points=M, gamma_path=0.5, gamma_node=0.5)]
  want = _np_choose(score, cand, gid, N, M, 0.5, 0.5)
  np.testing.assert_array_equal(got[2], want[2])
  for g, w in zip(got[:2], want[:2]):
    np.testing.assert_array_equal(np.where(want[2], g, 0), np.where(want[2], w, 0))


def test_decays_spread_the_points():
  # One row, flat scores: the second point is as far from the first as the row allows.
  score = np.ones((1, 9), np.float32)
  rows, pos, ok = trees.choose_branch_points(score, np.ones((1, 9), bool), np.zeros(1, np.int32),
                                             num_groups=1, num_points=2)
  assert ok.all() and int(pos[0, 0]) == 0 and int(pos[0, 1]) == 8


def test_budgets_and_errors():
  assert trees.budgets(4, 3, 0.5) == (4, 2, 1)
  assert trees.budgets(1, 3, 0.25) == (1, 1, 1)
  with pytest.raises(ValueError, match="decay"):
    trees.budgets(2, 2, 0.0)
  roots, _ = _roots()
  with pytest.raises(Exception, match="criterion.*entropy"):
    trees.grow_tree(roots, _sample_fn, num_groups=4, branches=2, points=1,
                    criterion="random", max_new_tokens=MAX_NEW, key=jax.random.key(0))
  with pytest.raises(ValueError, match="needs a score_fn"):
    trees.grow_tree(roots, _sample_fn, num_groups=4, branches=2, points=1,
                    criterion="entropy", max_new_tokens=MAX_NEW, key=jax.random.key(0))
  with pytest.raises(ValueError, match="earlier row"):
    trees.tree_depth(np.array([-1, 2, 0]))


# --------------------------------------------------------------------------
# SLATE's step-level sampling laid out as a tree.
# --------------------------------------------------------------------------

STOPS = (5, 9, 13, 17)  # "delimiters": a candidate step ends at one of them


def _step_sample_fn(prefix, mask, budget, key, k=3):
  return _sampler()(_state(), prompt_tokens=prefix, prompt_mask=mask, key=key,
                    max_new_tokens=MAX_NEW, num_samples=k, temperature=1.0, stop_tokens=STOPS,
                    max_new_tokens_per_row=budget, share_prefix=True)


def _judge(n, before, step, t):
  # Score: the parity of the step's first token; final: the step did not end at a stop id.
  return float(step[0] % 2) - 0.5 * len(before), int(step[-1]) not in STOPS


@functools.lru_cache(maxsize=None)
def _slate(eta=0.7):
  tokens, mask = _prompts(2)
  return trees.step_rollout(tokens, mask, _step_sample_fn, _judge, candidates=3, max_steps=3,
                            max_new_tokens=MAX_NEW, eta=eta, key=jax.random.key(3))


def test_step_rollout_layout():
  tree, score, st = _slate()
  N, k, S = 4, 3, 3
  assert tree.tokens.shape[0] == score.shape[0] == N * k * S
  np.testing.assert_array_equal(tree.depth, np.repeat(np.arange(S), N * k))
  assert np.all(tree.parent_id[:N * k] == -1) and np.all(tree.parent_id[N * k:] >= 0)
  for r in range(N * k * S):
    node = r // k
    sibs = range(node * k, node * k + k)
    assert all(tree.parent_id[s] == tree.parent_id[r] and tree.prefix_len[s] == tree.prefix_len[r]
               for s in sibs)
    own = tree.response_mask[r]
    if own.any():  # a step: tokens up to its last stop id (or the end of the response)
      steps = np.isin(tree.tokens[r][own], STOPS)
      assert not steps[:-1].any()
    else:
      assert score[r] == 0.0
    a = tree.parent_id[r]
    if a >= 0:
      p = tree.prefix_len[r]
      np.testing.assert_array_equal(tree.tokens[r, :p], tree.tokens[a, :p])
      assert not own[:p].any()
      # The parent is the candidate its node continued: its path ends where r starts.
      # (A path that filled the whole width W has its empty later rows depart at W − 1.)
      W = tree.tokens.shape[1]
      assert min((tree.prompt_mask[a] | tree.path_mask[a]).sum(), W - 1) == p
  # Each prompt's chosen path is the last chosen candidate's path.
  valid = tree.prompt_mask | tree.path_mask
  np.testing.assert_array_equal(np.where(valid, trees.rebuild_paths(tree), -1),
                                np.where(valid, tree.tokens, -1))
  assert np.all(st["path_steps"] >= 1) and np.all(st["path_steps"] <= S)


def test_step_rollout_greedy_choice_follows_the_best_candidate():
  tree, score, _ = _slate(eta=0.0)
  N, k = 4, 3
  for r in np.flatnonzero((tree.parent_id >= 0) & (tree.depth == 1)):
    a = tree.parent_id[r]
    node = a // k
    assert score[a] == score[node * k:node * k + k].max()


def test_node_normalize():
  np.testing.assert_allclose(trees.node_normalize(np.array([[2.0, 1, 0, -1, 2]])),
                             [[0.920357, 0.153393, -0.613572, -1.380536, 0.920357]], atol=1e-5)
  np.testing.assert_array_equal(trees.node_normalize(np.array([[1.0], [3.0]])), 0.0)
  np.testing.assert_array_equal(trees.node_normalize(np.ones((2, 3))), 0.0)
