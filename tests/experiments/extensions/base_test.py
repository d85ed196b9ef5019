"""The extension protocol (`experiments/extensions`): the table, `enabled`, stage placement,
and that the runner's loop and update name no extension."""
import importlib
import os
import re

import pytest

from experiments import extensions, producers, train
from experiments.extensions import base

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def _config(recipe="grpo_arithmetic", **kw):
  c = importlib.import_module(f"experiments.configs.{recipe}").get_config("tiny")
  for k, v in kw.items():
    c[k] = v
  return c


def test_table_is_fixed_unique_and_complete():
  names = [e.name for e in extensions.EXTENSIONS]
  assert names == ["jolt", "subagents", "group_filter", "critical", "estimator_loss", "amft",
                   "context_management"]
  assert extensions.get("jolt") is extensions.EXTENSIONS[0]
  with pytest.raises(KeyError, match="known"):
    extensions.get("nope")
  for ext in extensions.EXTENSIONS:
    assert isinstance(ext, extensions.Extension) and ext.doc, ext.name
    assert callable(ext.on) and callable(ext.check) and callable(ext.build), ext.name


@pytest.mark.parametrize("recipe,on", [
    ("grpo_arithmetic", []),
    ("jolt_arithmetic", ["jolt"]),
    ("spd_rag_multidoc", ["subagents"]),
    ("cso_chain", ["critical"]),
    ("int_chain", ["critical"]),
    ("verifree_chain", ["estimator_loss"]),
])
def test_enabled_follows_the_config(recipe, on):
  assert [e.name for e in extensions.enabled(_config(recipe))] == on


def test_enabled_by_switches_in_table_order():
  c = _config()
  c.amft.enabled = True
  c.group_filter.drop_uniform = True
  c.estimator = "vimpo"  # a registered loss term, weight by default
  assert [e.name for e in extensions.enabled(c)] == ["group_filter", "estimator_loss", "amft"]
  c.estimator_loss_coef = 0.0
  assert [e.name for e in extensions.enabled(c)] == ["group_filter", "amft"]


def test_every_check_passes_on_a_plain_config():
  for ext in extensions.EXTENSIONS:
    ext.check(_config())


def _stage(name, wanted):
  return producers.Stage(name, name, frozenset(wanted), lambda state, batch, ctx: {})


def test_place_after_the_stage_that_makes_a_field_or_at_the_end():
  stages = [_stage("rollout", {"tokens"}), _stage("verifier", {"reward"}), _stage("ref", {})]
  new = _stage("new", set())
  got = extensions.place(stages, extensions.Placed(new, after="reward"), "x")
  assert [s.name for s in got] == ["rollout", "verifier", "new", "ref"]
  got = extensions.place(stages, extensions.Placed(new), "x")
  assert [s.name for s in got] == ["rollout", "verifier", "ref", "new"]
  with pytest.raises(extensions.SetupError, match="x needs the step's step_reward"):
    extensions.place(stages, extensions.Placed(new, after="step_reward"), "x")


def test_an_extension_is_one_record():
  """A new extension: a name, a switch, and what it adds (here one own-pass loss term)."""
  term = train.LossTerm("zero", lambda params, mb: (0.0, {}), rows=None)
  ext = extensions.Extension(name="demo", on=lambda c: True,
                             build=lambda s, m: extensions.Built(terms=(term,)))
  built = ext.build(None, None)
  assert built.terms == (term,) and built.rows is None and built.skip is None
  assert ext.row_sets(_config()) == () and ext.check_run is None
  assert base.Built().controller is None


# Words that name a method or an extension; the loop and the update are generic.
_METHOD_WORDS = ("jolt", "subagent", "amft", "critical", "group_filter", "cso", "prime",
                 "dapo", "spd_rag", "verifree", "jepo", "vimpo", "propa", "teacher role")


@pytest.mark.parametrize("module", ["experiments/loop.py", "experiments/train.py"])
def test_loop_and_update_name_no_extension(module):
  with open(os.path.join(ROOT, module), encoding="utf-8") as f:
    source = f.read().lower()
  found = {w: [i + 1 for i, line in enumerate(source.splitlines())
               if re.search(rf"\b{re.escape(w)}", line)] for w in _METHOD_WORDS}
  assert not {w: lines for w, lines in found.items() if lines}, module
  names = [e.name for e in extensions.EXTENSIONS]
  assert not [n for n in names if re.search(rf"\b{n}\b", source)], module
