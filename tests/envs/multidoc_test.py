"""`multidoc` (credit/envs/multidoc.py): the search demonstrator and the grounded outcome."""
import numpy as np
import pytest

from credit.envs.base import run_episode
from credit.tasks import get_task

KW = dict(min_hops=1, max_hops=2, num_docs=3, num_distractors=2, extra_turns=2)


def _examples(task, n=40):
  return task.generate(np.random.default_rng(3), n)


def test_search_demonstrator_reads_until_the_chain_is_revealed():
  task = get_task("multidoc", demonstrator="search", grounded=True, **KW)
  misses, orders = 0, set()
  for ex in _examples(task):
    world, _, where = task.documents(ex["world_seed"])
    turns = task.demonstration_turns(ex, rng=np.random.default_rng(ex["world_seed"]))
    reads = [int(t[len("read("):-1]) - 1 for t in turns[:-1]]
    assert turns[-1] == f"answer({world.answer})" and len(set(reads)) == len(reads)
    gold = set(where.values())
    assert gold <= set(reads) and reads[-1] in gold  # stops at the read that completes it
    misses += len(reads) > len(gold)
    orders.add(reads[0])
    ep = run_episode(task.make_env(ex), turns)
    assert ep.outcome == 1.0 and ep.results[-1].info["grounded"]
  assert misses > 5 and orders == {0, 1, 2}  # reads after misses; any document first
  # Without a generator the draw is a function of the example.
  ex = _examples(task, 1)[0]
  assert task.demonstration_turns(ex) == task.demonstration_turns(ex)


def test_gold_demonstrator_is_unchanged():
  task = get_task("multidoc", **KW)
  for ex in _examples(task, 10):
    world, _, where = task.documents(ex["world_seed"])
    assert task.demonstration_turns(ex) == [f"read({where[i] + 1})"
                                            for i in range(len(world.chain))] + [
                                                f"answer({world.answer})"]


@pytest.mark.parametrize("grounded", [False, True])
def test_a_guessed_name_scores_only_when_not_grounded(grounded):
  task = get_task("multidoc", grounded=grounded, **KW)
  ex = next(e for e in _examples(task) if e["hops"] == 1)
  world, _, where = task.documents(ex["world_seed"])
  other = next(d for d in range(3) if d != where[0])
  ep = run_episode(task.make_env(ex), [f"read({other + 1})", f"answer({world.answer})"])
  info = ep.results[-1].info
  assert info["exact"] and not info["grounded"]
  assert ep.outcome == float(not grounded)
  ep = run_episode(task.make_env(ex), [f"read({where[0] + 1})", f"answer({world.answer})"])
  assert ep.outcome == 1.0 and ep.results[-1].info["grounded"]


def test_bad_options_are_refused():
  with pytest.raises(ValueError, match="demonstrator"):
    get_task("multidoc", demonstrator="oracle")
  with pytest.raises(ValueError, match="extra_turns"):  # 4 docs, 2 hops: 4 turns < 5
    get_task("multidoc", min_hops=1, max_hops=2, num_docs=4, extra_turns=1,
             demonstrator="search")
  with pytest.raises(ValueError, match="gold demonstrator"):
    get_task("multidoc_agents", demonstrator="search", **KW)


def test_settled_progress_ends_at_the_outcome():
  task = get_task("multidoc", settle_progress=True, grounded=True, **KW)
  ex = next(e for e in _examples(task) if e["hops"] == 2)
  world, _, where = task.documents(ex["world_seed"])
  other = next(d for d in range(3) if d not in where.values())
  right = run_episode(task.make_env(ex), [f"read({where[0] + 1})", f"read({other + 1})",
                                          f"read({where[1] + 1})", f"answer({world.answer})"])
  assert [r.progress for r in right.results] == [1 / 3, 1 / 3, 2 / 3, 1.0]
  wrong = run_episode(task.make_env(ex), [f"read({where[0] + 1})", "answer(zzz)"])
  assert [r.progress for r in wrong.results] == [1 / 3, 0.0] and wrong.outcome == 0.0
  # No answer by the turn limit (5): the last read settles to 0.
  env = task.make_env(ex)
  out = run_episode(env, [f"read({where[0] + 1})"] * 5)
  assert [r.progress for r in out.results] == [1 / 3] * 4 + [0.0] and env.progress == 0.0
  plain = run_episode(get_task("multidoc", **KW).make_env(ex), [f"read({where[0] + 1})",
                                                                "answer(zzz)"])
  assert [r.progress for r in plain.results] == [0.5, 0.5]


def test_scan_demonstrator_reads_in_order():
  task = get_task("multidoc", demonstrator="scan", **KW)
  for ex in _examples(task, 20):
    world, _, where = task.documents(ex["world_seed"])
    last = max(where.values())
    assert task.demonstration_turns(ex, rng=np.random.default_rng(0)) == [
        f"read({d + 1})" for d in range(last + 1)] + [f"answer({world.answer})"]
