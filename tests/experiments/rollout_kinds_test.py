"""The rollout kind is one config key (`c.rollout`), looked up in `producers.ROLLOUT_KINDS`."""
import importlib

import pytest

from experiments import loop, producers


def tiny(recipe="grpo_arithmetic", **overrides):
  c = importlib.import_module(f"experiments.configs.{recipe}").get_config("tiny")
  c.mesh = "data=1"
  for k, v in overrides.items():
    sub, _, key = k.rpartition(".")
    (c[sub] if sub else c)[key] = v
  return c


@pytest.mark.parametrize("recipe,kind,root", [
    ("grpo_arithmetic", "plain", "rollout"),
    ("cbpo_chain", "tree", "tree_rollout"),
    ("slate_chain", "slate", "slate_rollout"),
    ("igpo_lookup", "env", "env_rollout"),
    ("logo_lookup", "logo", "logo_rollout"),
])
def test_auto_picks_each_recipes_kind_and_its_producer_is_the_plans_root(recipe, kind, root):
  c = tiny(recipe)
  assert c.rollout == "auto" and producers.rollout_kind(c) == kind
  assert loop.check_method(c).plan[0].producer.name == root
  c.rollout = kind  # the same, spelled out
  assert loop.check_method(c).plan[0].producer.name == root
  assert producers.ROLLOUT_KINDS[kind].producer == root


def test_rows_follow_the_kind():
  c = tiny("cbpo_chain")
  assert producers.rollout_rows(c) > c.prompts_per_step * c.group_size
  assert producers.tree_batch(c)
  g = tiny()
  assert producers.rollout_rows(g) == g.prompts_per_step * g.group_size
  assert not producers.tree_batch(g)


@pytest.mark.parametrize("recipe,change,match", [
    ("grpo_arithmetic", {"rollout": "tre"}, r"rollout='tre' is not a rollout kind; did you "
                                            r"mean 'tree'\?"),
    ("grpo_arithmetic", {"rollout": "tree"}, r"rollout='tree' needs tree.branches > 0"),
    ("grpo_arithmetic", {"rollout": "env"}, r"rollout='env' needs a multi-turn task"),
    ("cbpo_chain", {"rollout": "plain"}, r"tree.branches > 0 selects 'tree' rollouts but "
                                         r"rollout='plain'"),
    ("igpo_lookup", {"tree.branches": 2}, r"tree.branches > 0 selects 'tree' rollouts, which "
                                          r"need a single-turn task"),
])
def test_inconsistent_kinds_are_refused_at_setup(recipe, change, match):
  with pytest.raises(producers.SetupError, match=match):
    loop.check_method(tiny(recipe, **change))
