"""The outcome family as a package: its registry entries, one test file per method module,
and the docstring examples of every module."""
from __future__ import annotations

import doctest
import importlib
import os
import pkgutil

import pytest

import credit.advantages.outcome as outcome
from credit import registry

EXPECTED = {"asearcher", "dapo", "dcpo", "dr_grpo", "gae", "gdpo", "gpg", "grpo", "grpo_passk", "opo",
            "optimal_token_baseline", "reinforce_pp", "reinforce_pp_baseline", "remax", "rloo"}
MODULES = sorted(m.name for m in pkgutil.iter_modules(outcome.__path__)
                 if not m.name.startswith("_"))


def test_registry_lists_every_outcome_estimator():
  assert set(registry.list_estimators("outcome")) == EXPECTED
  for name in EXPECTED:
    spec = registry.get_estimator(name)
    if "group_id" in spec.needs:
      assert {"num_groups", "group_size"} <= set(spec.static_argnames), name
  assert registry.get_estimator("gae").returns_output


@pytest.mark.parametrize("module", MODULES)
def test_every_module_has_a_test_file(module):
  here = os.path.dirname(__file__)
  assert os.path.exists(os.path.join(here, f"{module}_test.py")), module


@pytest.mark.parametrize("module", MODULES)
def test_doctests(module):
  mod = importlib.import_module(f"credit.advantages.outcome.{module}")
  res = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.failed == 0
