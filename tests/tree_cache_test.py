"""Tree branches continued from their parent's KV cache (`Sampler(keep_cache=True)`, `parent=`)
draw what branches that prefill their prefix draw: token for token at temperature 0 and at
temperature 1 with a fixed key, log-probs to float32 rounding; only the prefix's last token
goes through the model again."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from credit import sampling, trees
from tests.sampling_test import _model, _prompts, _sampler, _state

MAX_NEW = 10


def _grow(temperature, reuse, criterion="surprisal", depth=2, score_fn=None):
  tokens, mask = _prompts(1)
  kw = dict(max_new_tokens=MAX_NEW, temperature=temperature)
  out = _sampler()(_state(), prompt_tokens=tokens, prompt_mask=mask, key=jax.random.key(1),
                   num_samples=3, keep_cache=reuse, **kw)
  out, kept = out if reuse else (out, None)
  h = jax.tree.map(np.asarray, out._asdict())
  B = h["tokens"].shape[0]
  roots = trees.TreeRollout(
      tokens=h["tokens"], response_mask=h["response_mask"], path_mask=h["response_mask"],
      prompt_mask=h["prompt_mask"], logprob_sampler=h["logprob_sampler"],
      logprob_raw=h["logprob_raw"], group_id=h["group_id"], parent_id=np.full(B, -1, np.int32),
      prefix_len=np.zeros(B, np.int32), depth=np.zeros(B, np.int32))
  calls = []

  def sample_fn(prefix, pmask, budget, key, parent=None):
    calls.append(parent)
    more = {} if parent is None else dict(parent=parent[0], parent_rows=parent[1],
                                          keep_cache=True)
    return _sampler()(_state(), prompt_tokens=prefix, prompt_mask=pmask, key=key,
                      num_samples=2, max_new_tokens_per_row=budget, **kw, **more)

  tree, stats = trees.grow_tree(roots, sample_fn, num_groups=4, branches=2, points=2,
                                depth=depth, decay=1.0, criterion=criterion, score_fn=score_fn,
                                max_new_tokens=MAX_NEW, key=jax.random.key(7), cache=kept)
  assert all((p is not None) == reuse for p in calls)
  return tree, stats


def _assert_same_tree(a, b):
  for f in ("tokens", "response_mask", "path_mask", "prompt_mask", "parent_id", "prefix_len",
            "depth", "group_id"):
    np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
  for f in ("logprob_sampler", "logprob_raw"):
    np.testing.assert_allclose(getattr(a, f), getattr(b, f), atol=2e-5, rtol=1e-5, err_msg=f)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_branches_from_the_parents_cache_draw_what_a_prefill_draws(temperature):
  a, st = _grow(temperature, reuse=False)
  b, _ = _grow(temperature, reuse=True)
  assert (a.depth == 2).any() and (a.parent_id >= 0).sum() > 8  # two rounds of branches
  _assert_same_tree(a, b)


def test_points_without_candidates_restart_from_the_previous_call():
  # Group 0 never has a candidate: its points sample fresh roots from the prompt, which the
  # reusing path takes from the previous call's rows of that group (depth 2: a branch call).
  def score_fn(tree):
    return np.where(tree.group_id[:, None] == 0, 0.0, 1.0) * tree.response_mask
  a, _ = _grow(1.0, reuse=False, criterion="given", score_fn=score_fn)
  b, _ = _grow(1.0, reuse=True, criterion="given", score_fn=score_fn)
  fresh = (a.group_id == 0) & (a.parent_id < 0)
  assert fresh.sum() > 3  # the roots plus fresh rows in both rounds
  _assert_same_tree(a, b)


def test_parent_cache_holds_what_a_prefill_computes():
  # The copied slots equal a fresh prefill's keys/values of the same prefix (float rounding),
  # in the same slots; the fed last token fills the last one.
  tokens, mask = _prompts(2)
  model = _model()
  params = sampling.sampling_params(temperature=1.0)
  P, W = tokens.shape[1], MAX_NEW
  state = sampling.prefill(model, prompt_tokens=tokens, prompt_mask=mask, key=jax.random.key(0),
                           max_new_tokens=W, max_new_B=np.full(4, W, np.int32), params=params)
  state = sampling.decode(model, state, params, max_new_tokens=W)
  kept = sampling.row_cache(state)
  out = jax.tree.map(np.asarray, sampling.to_output(state, jnp.arange(4)))
  rows = np.array([0, 2, 2, 3])
  p = out.prompt_lengths[rows] + np.array([3, 1, 4, 2])  # prompt and some response tokens
  Q = P + W
  cols = np.arange(Q)[None] < p[:, None]
  prefix = np.where(cols, out.tokens[rows], 0).astype(np.int32)
  fresh = sampling.prefill(model, prompt_tokens=prefix, prompt_mask=cols, key=jax.random.key(1),
                           max_new_tokens=W, max_new_B=np.full(4, W, np.int32), params=params)
  cont = sampling.prefill_from_parent(
      model, parent=kept, parent_rows=rows, prompt_tokens=prefix, prompt_mask=cols,
      key=jax.random.key(1), max_new_tokens=W, max_new_B=np.full(4, W, np.int32), params=params)
  np.testing.assert_array_equal(cont.cache.valid, fresh.cache.valid)
  assert int(cont.cache.index) == int(fresh.cache.index) == Q
  valid = np.asarray(fresh.cache.valid)  # (a prefill also writes its pad slots, unread)
  k_c, k_f = (np.moveaxis(np.asarray(c.k), 3, 2) for c in (cont.cache, fresh.cache))
  v_c, v_f = (np.moveaxis(np.asarray(c.v), 4, 2) for c in (cont.cache, fresh.cache))
  np.testing.assert_allclose(k_c[:, valid], k_f[:, valid], atol=1e-5)
  np.testing.assert_allclose(v_c[:, valid], v_f[:, valid], atol=1e-5)
  assert not np.asarray(cont.cache.k)[:, ~valid[:, None, :].repeat(k_c.shape[3], 1)].any()
  np.testing.assert_array_equal(cont.tokens_BL, fresh.tokens_BL)
  np.testing.assert_allclose(cont.logprob_raw_BL, fresh.logprob_raw_BL, atol=1e-5)


def test_continuation_errors():
  tokens, mask = _prompts(1)
  s = _sampler()
  out, kept = s(_state(), prompt_tokens=tokens, prompt_mask=mask, key=jax.random.key(0),
                max_new_tokens=4, keep_cache=True)
  pre = np.asarray(out.tokens)
  pm = np.arange(pre.shape[1])[None] < 3
  pm = np.repeat(pm, 4, 0)
  kw = dict(prompt_tokens=pre, key=jax.random.key(0), max_new_tokens=4, parent=kept)
  with pytest.raises(ValueError, match="parent_rows is required"):
    s(_state(), prompt_mask=pm, **kw)
  with pytest.raises(ValueError, match="parent_rows must be rows"):
    s(_state(), prompt_mask=pm, parent_rows=np.array([0, 1, 2, 9]), **kw)
  with pytest.raises(ValueError, match="right-padded prefix"):
    s(_state(), prompt_mask=pm[:, ::-1], parent_rows=np.arange(4), **kw)
  with pytest.raises(ValueError, match="must be the RowCache"):
    s(_state(), prompt_mask=pm, parent_rows=np.arange(4), **{**kw, "parent": kept.cache})


def test_logo_continuations_from_the_episodes_cache_draw_what_a_prefill_draws():
  # LoGo's L continuations of a saved state: copied from the episodes' kept cache (the saved
  # prefix is the episode's compacted columns, spread over its turn blocks in the buffer) or
  # prefilled again: the same draws.
  from credit.envs.branching import local_rollouts
  from tests.experiments.logo_runner_test import B, L, P, HistoryEnv, _model, _sampler
  eps = _sampler()(_model(), [HistoryEnv(i) for i in range(B)], key=jax.random.key(0),
                   group_id=np.arange(B) // 3, keep_snapshots=True, keep_cache=True)
  assert eps.kept is not None
  run = functools.partial(local_rollouts, _sampler(), _model(), make_env=HistoryEnv,
                          num_parents=P, local_size=L, key=jax.random.key(1))
  a, b = run(episodes=eps._replace(kept=None)), run(episodes=eps)
  assert b.num_local == P * L
  for f in ("tokens", "prompt_mask", "response_mask", "obs_mask", "turn_id", "reward",
            "step_mask"):
    np.testing.assert_array_equal(getattr(a.out, f), getattr(b.out, f), err_msg=f)
  for f in ("logprob_sampler", "logprob_raw"):
    np.testing.assert_allclose(getattr(a.out, f), getattr(b.out, f), atol=2e-5, err_msg=f)
  # The copied cache is really read: zeroed keys/values change the draws' log-probs.
  kept = eps.kept.replace(cache=jax.tree.map(jnp.zeros_like, eps.kept.cache))
  c = run(episodes=eps._replace(kept=kept))
  assert not np.allclose(c.out.logprob_raw, b.out.logprob_raw, atol=1e-3)
