"""Trees in the runner: the tree_rollout / slate_rollout / step_completions producers on one step's
batch, their refusals, and a controlled check that branching at the pivotal position credits it.

The recipes themselves (cbpo_chain, slate_chain, tp_grpo_chain) run end to end in
tests/experiments/runner_test.py (`:tiny`)."""
import numpy as np
import pytest

import credit
from credit import tasks as tasks_lib
from credit import trees
from credit.tasks import CharTokenizer
from experiments import loop, producers
from tests.experiments.producers_test import _one_step_batch, tiny


def _host(batch, *names):
  return [np.asarray(batch[n]) for n in names]


def test_tree_rollout_batch(tmp_path):
  c = tiny("cbpo_chain")
  run, rs, ctx, batch = _one_step_batch(c, str(tmp_path))
  tokens, own, parent, prefix, reward, gid = _host(
      batch, "tokens", "response_mask", "parent_id", "prefix_len", "reward", "group_id")
  N, G = c.prompts_per_step, c.group_size
  assert tokens.shape[0] == producers.rollout_rows(c) == N * (G + 2 * 2)
  path = batch["host"]["response_mask"]
  for b in np.flatnonzero(parent >= 0):
    a, p = parent[b], prefix[b]
    np.testing.assert_array_equal(tokens[b, :p], tokens[a, :p])
    assert not own[b, :p].any() and own[b, p] and gid[b] == gid[a]
    assert (path[b] & ~own[b]).sum() == (path[a][:p]).sum()
  # The reward is the verifier's on each row's whole path, not on its own tokens only.
  texts = tasks_lib.decode_responses(CharTokenizer(), tokens, path)
  rows = [tasks_lib.as_example({k: ctx.examples[k][g] for k in ctx.examples}) for g in gid]
  np.testing.assert_array_equal(reward, tasks_lib.verify_batch(run.data.task, rows, texts))
  assert {"tree_points", "tree_branch_tokens", "rollout_tokens_per_s"} <= set(ctx.metrics)


def test_step_completions_give_each_step_its_value(tmp_path):
  c = tiny("tp_grpo_chain")
  run, rs, ctx, batch = _one_step_batch(c, str(tmp_path))
  value, mask, start, reward, step = _host(batch, "step_value", "step_mask", "start_value",
                                           "reward", "step_id")
  K = c.max_steps
  assert value.shape == mask.shape == (reward.shape[0], K)
  n = np.minimum(np.where(step.max(1) >= 0, step.max(1) + 1, 0), K)
  np.testing.assert_array_equal(mask, np.arange(K)[None] < n[:, None])
  has = n > 0
  np.testing.assert_array_equal(value[has, n[has] - 1], reward[has])  # the last step: R itself
  assert np.all(value[~mask] == 0.0) and set(np.unique(value)) <= {0.0, 1.0}
  gid = np.asarray(batch["group_id"])
  for g in np.unique(gid):
    assert len(set(start[gid == g])) == 1  # one greedy response per prompt


def test_slate_rollout_batch(tmp_path):
  c = tiny("slate_chain")
  run, rs, ctx, batch = _one_step_batch(c, str(tmp_path))
  own, parent, prefix, reward = _host(batch, "response_mask", "parent_id", "prefix_len", "reward")
  k, S, N = c.slate.candidates, c.slate.max_steps, c.prompts_per_step
  assert own.shape[0] == N * k * S
  np.testing.assert_array_equal(parent[:N * k], -1)
  for node in range(N * S):
    sl = slice(node * k, node * k + k)
    assert len(set(parent[sl])) == 1 and len(set(prefix[sl])) == 1
  assert np.all(reward[~own.any(1)] == 0.0) and np.all(np.abs(reward) <= 2.1 + 1e-6)
  assert {"slate_path_accuracy", "slate_path_steps"} <= set(ctx.metrics)


@pytest.mark.parametrize("recipe,change,match", [
    ("cbpo_chain", {"estimator": "verifree"}, "cannot run on tree rollouts"),
    ("cbpo_chain", {"tree.criterion": "random"}, "tree.criterion"),
    ("cbpo_chain", {"tree.points": 0}, "points"),
    ("cbpo_chain", {"task": "copy_digit", "task_kwargs": {}, "tree.criterion": "first_error"},
     "flag_chars"),
    ("slate_chain", {"task": "arithmetic", "task_kwargs": {}}, "judge_step"),
    ("slate_chain", {"tree.branches": 2}, "each selects its own rollout.*keep one of them"),
    ("grpo_arithmetic", {"estimator": "cbpo"}, "tree.branches > 0"),
])
def test_tree_setups_are_refused_before_any_work(recipe, change, match):
  c = tiny(recipe)
  for k, v in change.items():
    sub, _, key = k.rpartition(".")
    (c[sub] if sub else c)[key] = v
  with pytest.raises(producers.SetupError, match=match):
    loop.check_method(c)


def test_branching_at_the_pivot_credits_the_pivotal_segment():
  # Pivotal task: "3:4=" wants '5' at response index 3. Root 0 is wrong at the pivot; it is
  # branched at the pivot (two continuations, one right) and after it (index 5: the outcome
  # is already decided, both continuations wrong). CBPO gives the pivot node's segments all
  # of the non-root credit; the late node's segments get none.
  task = tasks_lib.get_task("pivotal")
  ex = {"prompt": "3:4=", "pivot_position": 3, "pivot_value": 5}
  tok = CharTokenizer()
  prompt = tok.encode("3:4=")
  P = len(prompt)
  texts = ["abc7efgh", "abc5efgh", "abc5wxyz", "abc2wxyz", "abc7ezzz", "abc7eqqq"]
  parent = np.array([-1, -1, 0, 0, 0, 0], np.int32)
  prefix = np.array([0, 0, P + 3, P + 3, P + 5, P + 5], np.int32)
  T = P + 9
  tokens = np.zeros((6, T), np.int32)
  own = np.zeros((6, T), bool)
  for b, text in enumerate(texts):
    ids = prompt + tok.encode(text)
    tokens[b, :len(ids)] = ids
    own[b, max(prefix[b], P):len(ids)] = True
  reward = np.array([task.verify(ex, t) for t in texts], np.float32)
  np.testing.assert_array_equal(reward, [0, 1, 1, 0, 0, 0])
  adv = np.asarray(credit.get_estimator("cbpo").fn(
      reward=reward, group_id=np.zeros(6, np.int32), response_mask=own, parent_id=parent,
      prefix_len=prefix, num_groups=1))
  pivot = P + 3
  assert adv[0, pivot] != 0 and adv[2, pivot] > 0 and adv[3, pivot] < 0
  # Root 0 after the late branch point, and the late branches: no spread, no credit.
  np.testing.assert_array_equal(adv[0, P + 5:], 0.0)
  np.testing.assert_array_equal(adv[4:], 0.0)
  branched = np.zeros_like(own)
  branched[0, pivot:] = True
  branched[2:] = own[2:]
  mags = np.abs(adv[branched & own])
  assert mags.max() == np.abs(adv[[0, 2, 3], pivot]).max()
  # The tree laid out by credit.trees' conventions is consistent.
  trees.tree_depth(parent)


def test_first_error_scores_mark_the_first_wrong_token():
  # 12+34-5= "46,41=41": right; "46,40=40": wrong from the 5th character; "45,..." from the 2nd.
  task, tok = tasks_lib.get_task("chain"), CharTokenizer()
  prompt = tok.encode("12+34-5=")
  P, T = len(prompt), len(prompt) + 10
  texts = ["46,41=41", "46,40=40", "45,40=40"]
  tokens = np.zeros((3, T), np.int32)
  path = np.zeros((3, T), bool)
  for b, text in enumerate(texts):
    ids = prompt + tok.encode(text) + [tok.eos_id]
    tokens[b, :len(ids)] = ids
    path[b, P:len(ids)] = True
  tree = trees.TreeRollout(tokens, path, path, np.arange(T)[None] < P, np.zeros((3, T)),
                           np.zeros((3, T)), np.zeros(3, np.int32), np.full(3, -1, np.int32),
                           np.zeros(3, np.int32), np.zeros(3, np.int32))
  got = producers.first_error_scores(tok, task, {"prompt": ["12+34-5="], "answer": ["41"]}, tree)
  assert got.sum() == 2 and got[0].sum() == 0
  assert got[1, P + 4] == 1.0 and got[2, P + 1] == 1.0
