"""The shape of the import graph: no circles, and estimators that import only what lies below them.

The graph is built statically (`ast`, nothing is imported) over every module under `credit/`
and `experiments/`. An edge A -> B is any `import` or `from ... import` in A, at module level or
inside a function alike, that names B: `from x import y` points at the submodule `x.y` when
there is one and at `x` otherwise; `import x.y.z` points at the longest prefix that is a module
of the repository; relative imports are resolved. A package's `__init__` importing its own
submodules gives edges like any other module. Two kinds of dependency are not edges: the
implicit import of a parent package (`import a.b` runs `a/__init__` first; counting it would put
every package that re-exports its submodules in a circle with them) and imports the code makes
by name at run time (`importlib.import_module`: the family packages load their methods so).
Standard-library and third-party imports are not part of the graph.

Estimator modules (every module under `credit/advantages/<family>/` other than the package
`__init__`, private `_*.py` modules included) follow one rule. From the library they import
only

  * `credit.ops` and its submodules, `credit.registry`, `credit.contract`: the layers below
    every estimator;
  * `credit._checks` (eager argument checks) and `credit.trees` (the tree layout the tree
    estimators and the runner share);
  * the private modules `_*.py` of their own family.

They never import another estimator module (of their own family or another), another family's
private module, or anything above them (losses, sampling, scoring, models, envs, tasks,
experiments). Code two estimators share moves down: to the family's `_common.py` (or another
`_*.py` named after what it holds) when one family uses it, to `credit.ops` / `credit.trees` when
several do. A method that is another method under another name (SEED is OPID's computation) is
a thin entry over a private module of the family, like the method it repeats.
"""
from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("credit", "experiments")


def _module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(ROOT).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts = parts[:-1]
  return ".".join(parts)


def _files() -> dict[str, pathlib.Path]:
  return {_module_name(p): p for top in PACKAGES for p in sorted((ROOT / top).rglob("*.py"))}


FILES = _files()


def _nearest_module(name: str) -> str | None:
  while name and name not in FILES:
    name = name.rpartition(".")[0]
  return name or None


def _resolve(module: str | None, level: int, importer: str) -> str:
  """The absolute name `from <level dots><module> import ...` refers to inside `importer`."""
  if not level:
    return module or ""
  base = importer.split(".")
  if FILES[importer].name != "__init__.py":
    base = base[:-1]                      # a module's package
  base = base[:len(base) - (level - 1)]
  return ".".join(base + ([module] if module else []))


def _is_type_checking_block(node: ast.AST) -> bool:
  test = getattr(node, "test", None)
  return isinstance(node, ast.If) and (
      (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
      or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _import_nodes(tree: ast.AST):
  """Every Import / ImportFrom node, skipping `if TYPE_CHECKING:` blocks (never run)."""
  stack = [tree]
  while stack:
    node = stack.pop()
    if _is_type_checking_block(node):
      stack.extend(node.orelse)
      continue
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      yield node
    stack.extend(ast.iter_child_nodes(node))


def imports_of(name: str) -> set[str]:
  """The repository modules `name` imports (module-level and function-level)."""
  out = set()
  for node in _import_nodes(ast.parse(FILES[name].read_text(encoding="utf-8"))):
    if isinstance(node, ast.Import):
      targets = [_nearest_module(a.name) for a in node.names]
    else:
      base = _resolve(node.module, node.level, name)
      targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in FILES else _nearest_module(base)
                 for a in node.names]
    out.update(t for t in targets if t and t != name)
  return out


def import_graph() -> dict[str, set[str]]:
  return {name: imports_of(name) for name in FILES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """One concrete circle (a -> ... -> a) per strongly connected component with one."""
  index, low, on_stack, stack, comps = {}, {}, set(), [], []
  counter = 0
  for root in sorted(graph):
    if root in index:
      continue
    work = [(root, iter(sorted(graph[root])))]
    index[root] = low[root] = counter
    counter += 1
    stack.append(root)
    on_stack.add(root)
    while work:
      v, children = work[-1]
      for w in children:
        if w not in index:
          index[w] = low[w] = counter
          counter += 1
          stack.append(w)
          on_stack.add(w)
          work.append((w, iter(sorted(graph[w]))))
          break
        if w in on_stack:
          low[v] = min(low[v], index[w])
      else:
        work.pop()
        if work:
          low[work[-1][0]] = min(low[work[-1][0]], low[v])
        if low[v] == index[v]:
          comp = set()
          while True:
            w = stack.pop()
            on_stack.discard(w)
            comp.add(w)
            if w == v:
              break
          if len(comp) > 1:
            comps.append(comp)
  return [_one_circle(graph, comp) for comp in comps]


def _one_circle(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
  """A shortest circle through the first module of a strongly connected component."""
  start = min(comp)
  parent, frontier = {start: None}, [start]
  while frontier:
    nxt = []
    for v in frontier:
      for w in sorted(graph[v] & comp):
        if w == start:
          path = [v]
          while parent[path[-1]] is not None:
            path.append(parent[path[-1]])
          return [start] + path[::-1][1:] + [start]
        if w not in parent:
          parent[w] = v
          nxt.append(w)
    frontier = nxt
  raise AssertionError(f"no circle in {sorted(comp)}")


def _describe(circles: list[list[str]]) -> str:
  return "import circles:\n" + "\n".join("  " + " -> ".join(c) for c in circles)


def _circles_touching(prefix: str) -> list[list[str]]:
  return [c for c in cycles(import_graph()) if any(m.split(".")[0] == prefix for m in c)]


def test_the_graph_sees_function_level_and_relative_imports():
  graph = import_graph()
  assert len(graph) > 200
  assert "credit.trees" in graph["experiments.loop"]          # a function-level import
  assert "credit.ops.turns" in graph["credit.ops"]            # a package importing its modules
  assert "credit.ops.masked" in graph["credit.ops.turns"]     # `from credit.ops.masked import`


def test_finds_a_circle():
  graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": {"e"}}
  assert sorted(cycles(graph)) == [["a", "b", "c", "a"], ["e", "e2", "e"]]


def test_credit_imports_have_no_circles():
  circles = _circles_touching("credit")
  assert not circles, _describe(circles)


def test_experiments_imports_have_no_circles():
  circles = _circles_touching("experiments")
  assert not circles, _describe(circles)


# --------------------------------------------------------------------------------------------
# Estimator modules import only what lies below them.
# --------------------------------------------------------------------------------------------

BELOW_ESTIMATORS = ("credit.registry", "credit.contract", "credit._checks", "credit.trees")


def estimator_modules() -> list[str]:
  return sorted(n for n in FILES if n.startswith("credit.advantages.") and n.count(".") == 3)


def _allowed(importer: str, target: str) -> bool:
  family = importer.split(".")[2]
  return (not target.startswith("credit") or target == "credit.ops"
          or target.startswith("credit.ops.") or target in BELOW_ESTIMATORS
          or target.startswith(f"credit.advantages.{family}._"))


def test_estimator_modules_import_only_the_layers_below_and_their_family_helpers():
  modules = estimator_modules()
  assert len(modules) > 90 and "credit.advantages.turn.igpo" in modules
  bad = sorted(f"{m} imports {t}" for m in modules for t in imports_of(m) if not _allowed(m, t))
  assert not bad, "estimator modules importing outside the rule (tests/imports_test.py):\n" + (
      "\n".join(bad))


def test_the_rule_refuses_other_estimators_and_other_families_helpers():
  m = "credit.advantages.tree.propa"
  assert _allowed(m, "credit.ops.turns") and _allowed(m, "credit.trees")
  assert _allowed(m, "credit.advantages.tree._common") and _allowed(m, "numpy")
  assert not _allowed(m, "credit.advantages.tree.prorag")
  assert not _allowed(m, "credit.advantages.token._redistribute")
  assert not _allowed(m, "credit.scoring") and not _allowed(m, "credit")


# --------------------------------------------------------------------------------------------
# Helpers that moved down stay importable from where they were, and nothing here uses the old
# places.
# --------------------------------------------------------------------------------------------

MOVED = {  # (old module, name) -> (new module, name)
    ("credit.advantages.turn.igpo", "turn_layout"): ("credit.ops.turns", "turn_layout"),
    ("credit.advantages.turn.igpo", "previous_valid"): ("credit.ops.turns", "previous_valid"),
    ("credit.advantages.turn.igpo", "information_gains"):
        ("credit.advantages.turn._common", "information_gains"),
    ("credit.advantages.turn.igpo", "igpo_turn_rewards"):
        ("credit.advantages.turn._common", "igpo_turn_rewards"),
    ("credit.advantages.turn.procredit", "row_grpo"): ("credit.ops.turns", "row_grpo"),
    ("credit.advantages.tree.cbpo", "validate_tree"): ("credit.trees", "validate_tree"),
    ("credit.advantages.tree.cbpo", "tree_rows"): ("credit.trees", "tree_layout"),
    ("credit.advantages.tree.cbpo", "TreeRows"): ("credit.trees", "TreeRows"),
    ("credit.advantages.tree.cbpo", "sibling_matrix"): ("credit.trees", "sibling_matrix"),
    ("credit.advantages.tree.cbpo", "first_of_node"): ("credit.trees", "first_of_node"),
    ("credit.advantages.tree.cbpo", "segment_starts"): ("credit.trees", "segment_starts"),
    ("credit.advantages.tree.prorag", "prorag_outcome"):
        ("credit.advantages.tree._common", "prorag_outcome"),
    ("credit.advantages.tree.prorag", "pooled_zscore"):
        ("credit.advantages.tree._common", "pooled_zscore"),
    ("credit.advantages.tree.prorag", "check_steps"):
        ("credit.advantages.tree._common", "check_steps"),
    ("credit.advantages.tree.treerl", "tree_leaf_values"):
        ("credit.advantages.tree._common", "tree_leaf_values"),
    ("credit.advantages.outcome.gae", "GAEOutput"): ("credit.ops.baselines", "GAEOutput"),
    ("credit.advantages.distill.opid", "opid_teacher_term"):
        ("credit.advantages.distill._skills", "opid_teacher_term"),
    ("credit.advantages.distill.opid", "opid_gigpo_step_advantages"):
        ("credit.advantages.distill._skills", "opid_gigpo_step_advantages"),
    ("credit.scoring", "auto_chunk_size"): ("credit._scoring_core", "auto_chunk_size"),
    ("credit.scoring", "ROWS_PER_CHUNK"): ("credit._scoring_core", "ROWS_PER_CHUNK"),
    ("credit.scoring", "DEFAULT_CHUNK_SIZE"): ("credit._scoring_core", "DEFAULT_CHUNK_SIZE"),
    ("credit.divergences", "topk_buckets"): ("credit._scoring_core", "topk_buckets"),
    ("credit.divergences", "TAIL_FLOOR"): ("credit._scoring_core", "TAIL_FLOOR"),
}
# Names whose old home is also their public home (re-exported on purpose, imported from there).
STILL_PUBLIC_THERE = {("credit.scoring", "auto_chunk_size"), ("credit.scoring", "ROWS_PER_CHUNK"),
                      ("credit.scoring", "DEFAULT_CHUNK_SIZE"),
                      ("credit.divergences", "topk_buckets"), ("credit.divergences", "TAIL_FLOOR")}


@pytest.mark.parametrize("old,new", sorted(MOVED.items()), ids=lambda x: ".".join(x))
def test_moved_names_stay_importable_from_their_old_place(old, new):
  got = getattr(importlib.import_module(old[0]), old[1])
  assert got is getattr(importlib.import_module(new[0]), new[1])


def test_nothing_in_the_repository_imports_a_moved_name_from_its_old_place():
  old = {k for k in MOVED if k not in STILL_PUBLIC_THERE}
  old_modules = {m for m, _ in old}
  found = []
  for top in ("credit", "experiments", "tests", "benchmarks"):
    for path in sorted((ROOT / top).rglob("*.py")):
      if path.resolve() == pathlib.Path(__file__).resolve():
        continue
      for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module in old_modules:
          found += [f"{path.relative_to(ROOT)}: from {node.module} import {a.name}"
                    for a in node.names if (node.module, a.name) in old]
  assert not found, "import these from their new module (tests/imports_test.py MOVED):\n" + (
      "\n".join(found))
