"""Sphinx extension: the generated parts of the credit docs, and a guard for docstrings.

At `builder-inited` it writes, under `docs/_generated/` (not checked in; rewritten only where
the text changed, so incremental builds stay incremental):

* `contract.md`: the rollout contract table, from `credit.CONTRACT`;
* `catalog/`: the method catalogue from the registry: an index, one page per family and one
  page per estimator and policy loss (facts from the registration, the docstring through
  autodoc, and `docs/methods/<name>.md` when that page exists);
* `recipes/`: one page per recipe in `experiments/configs/`, from its docstring and from what
  its `get_config()` changes against `common.base_config()`;
* `bench/`: the credit benchmark's result tables and plots from `benchmarks/results/`;
* `api/`: the API reference, one page per package, autodoc over its modules;
* `notebooks/`: copies of `notebooks/*.ipynb`, rendered as stored (never executed).

The guard (`autodoc-process-docstring`, after napoleon): each docstring is first parsed on
its own; one that would not parse cleanly as reStructuredText inside a directive (a stray
section underline, an unknown role, an unbalanced inline markup) is shown as a literal
block instead, so a docstring can never break the build, and `make docs` can treat every
warning as an error. `credit_docs_fallbacks` in the build log counts them.
"""
from __future__ import annotations

import dataclasses
import glob
import html
import importlib
import inspect
import io
import json
import os
import pkgutil
import re
import shutil
import textwrap

from docutils.core import publish_doctree
from sphinx.util import logging
from sphinx.util.docutils import sphinx_domains

LOG = logging.getLogger(__name__)
DOCS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(DOCS)
GEN = os.path.join(DOCS, "_generated")

FAMILY_TITLES = {
    "outcome": "Outcome: one advantage per sequence",
    "token": "Token: reweighting within a response",
    "implicit": "Implicit rewards and values",
    "turn": "Turn-level (multi-turn agents)",
    "distill": "Distillation and self-teachers",
    "tree": "Trees, branches and steps",
    "shaping": "Reward shaping",
}
# Packages of the API reference (the estimators and the policy losses have the catalogue).
API_PACKAGES = [
    ("credit", "The package: public names"),
    ("credit.contract", "Rollout contract"),
    ("credit.registry", "Registry"),
    ("credit.ops", "Ops: masked reductions, groups, returns, turns"),
    ("credit.losses", "Losses: reduction, KL, entropy, value"),
    ("credit.sampling", "Sampling"),
    ("credit.scoring", "Scoring"),
    ("credit.divergences", "Divergences"),
    ("credit.trees", "Trees"),
    ("credit.models", "Models"),
    ("credit.parallel", "Meshes and sharding"),
    ("credit.tasks", "Tasks"),
    ("credit.envs", "Environments"),
    ("credit.bench", "Credit benchmark helpers"),
    ("credit.catalog", "Catalog CLI"),
]
API_SKIP = ("credit.advantages", "credit.losses.policy")
# Method and recipe pages are reached from their family's or the recipes' table, not from the
# sidebar: with ~140 more entries in the navigation tree, the theme's per-page navigation made
# the build several times slower.
ORPHAN = "---\norphan: true\n---\n"
BENCH_DIR = os.path.join(ROOT, "benchmarks", "results", "credit_bench_full")
BENCH_TASKS = ["pivotal", "distractor", "delayed", "pivotal_and", "pivotal_or", "pivot_turn"]


# --------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------


class _Writer:
  """Writes files under GEN, only where the text changed; removes files no longer made."""

  def __init__(self):
    self.made = set()

  def text(self, rel: str, text: str) -> None:
    path = os.path.join(GEN, rel)
    self.made.add(os.path.normpath(path))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.exists(path):
      with open(path, encoding="utf-8") as f:
        if f.read() == text:
          return
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)

  def copy(self, src: str, rel: str) -> None:
    with open(src, "rb") as f:
      data = f.read()
    path = os.path.join(GEN, rel)
    self.made.add(os.path.normpath(path))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.exists(path):
      with open(path, "rb") as f:
        if f.read() == data:
          return
    with open(path, "wb") as f:
      f.write(data)

  def prune(self) -> None:
    for path in glob.glob(os.path.join(GEN, "**", "*"), recursive=True):
      if os.path.isfile(path) and os.path.normpath(path) not in self.made:
        os.remove(path)


def _md_cell(text) -> str:
  return " ".join(str(text).split()).replace("|", "\\|")


def _code(text) -> str:
  text = str(text)
  tick = "``" if "`" in text else "`"
  pad = " " if text.startswith("`") or text.endswith("`") else ""
  return f"{tick}{pad}{text}{pad}{tick}"


def _md_inline(text: str) -> str:
  """Docstring prose as Markdown inline text: code spans kept, stray markup escaped."""
  parts = re.split(r"(`[^`]*`)", text)
  esc = lambda t: re.sub(r"([*_\[\]<>|\\])", r"\\\1", t)
  return "".join(p if p.startswith("`") else esc(p) for p in parts)


def _fence(text: str, lang: str = "text") -> str:
  ticks = "```"
  while ticks in text:
    ticks += "`"
  return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}\n"


def _shift_headings(text: str, top: int = 2) -> str:
  """Markdown `text` with its headings moved so that the highest is level `top`."""
  levels = [len(m.group(1)) for m in re.finditer(r"^(#+) ", text, re.M)]
  if not levels:
    return text
  shift = top - min(levels)
  return re.sub(r"^(#+) ", lambda m: "#" * (len(m.group(1)) + shift) + " ", text, flags=re.M)


def _eval_rst(body: str) -> str:
  return "```{eval-rst}\n" + body.rstrip() + "\n```\n"


# --------------------------------------------------------------------------
# The rollout contract
# --------------------------------------------------------------------------


def _contract(w: _Writer) -> None:
  from credit.contract import CONTRACT
  dtypes = {"i": "int", "b": "bool", "f": "float"}
  lines = ["| field | shape | dtype | meaning |", "|---|---|---|---|"]
  for name, f in CONTRACT.items():
    shape = "[" + ",".join(f.shape) + "]"
    finite = "; finite where used" if f.finite else ""
    lines.append(f"| `{name}` | {shape} | {dtypes.get(f.dtype, f.dtype)} | "
                 f"{_md_cell(f.meaning)}{finite} |")
  w.text("contract_table.md", "\n".join(lines) + "\n")


def _producers(w: _Writer) -> None:
  from experiments import producers
  lines = ["| producer | provides | requires | phase | what it does |", "|---|---|---|---|---|"]
  for p in producers.table():
    fields = lambda fs: ", ".join(f"`{f}`" for f in fs) or "–"
    doc = _md_cell(p.doc)
    if getattr(p, "off_doc", ""):
      doc += f" (enabled by {_md_cell(p.off_doc)})"
    lines.append(f"| `{p.name}` | {fields(p.provides)} | {fields(p.requires)} | {p.phase} | "
                 f"{doc} |")
  w.text("producers_table.md", "\n".join(lines) + "\n")


# --------------------------------------------------------------------------
# The method catalogue
# --------------------------------------------------------------------------


def _rel_file(module: str) -> str:
  return module.replace(".", "/") + ".py"


def _defaults(fn, names) -> list[tuple[str, str]]:
  sig = inspect.signature(fn).parameters
  out = []
  for n in names:
    p = sig.get(n)
    if p is None:
      continue
    out.append((n, "required" if p.default is inspect.Parameter.empty else repr(p.default)))
  return out


def _method_page(name: str, kind: str, spec, facts: list[tuple[str, str]], fn,
                 no_index: bool) -> str:
  from credit import catalog
  title = f"`{name}`"
  out = [ORPHAN, f"({kind}-{name})=", f"# {title}", "", catalog.summary(fn) or "", ""]
  out += ["| | |", "|---|---|"]
  out += [f"| {k} | {v} |" for k, v in facts]
  hyper = _defaults(fn, getattr(spec, "hyperparameters", None) or [
      p for p in spec.params if p not in spec.needs])
  if hyper:
    out += ["", "Hyperparameters and their defaults (`--config.estimator_kwargs.<name>=...`)"
            if kind == "estimator" else
            "Hyperparameters and their defaults (`--config.loss_kwargs.<name>=...`)", ""]
    out += ["| name | default |", "|---|---|"]
    out += [f"| `{n}` | {_code(d)} |" for n, d in hyper]
  page = os.path.join(DOCS, "methods", f"{name}.md")
  if os.path.exists(page):
    rel = os.path.relpath(page, os.path.join(GEN, "catalog", "x"))
    out += ["", "## Notes, derivation and results", "",
            "```{include} " + rel.replace(os.sep, "/"), ":heading-offset: 2", "```"]
  target = f"{fn.__module__}.{fn.__qualname__}"
  opts = "   :no-index:\n" if no_index else ""
  out += ["", "## Reference", "", _eval_rst(f".. autofunction:: {target}\n{opts}")]
  return "\n".join(out) + "\n"


def _catalog(w: _Writer) -> dict:
  import credit  # noqa: F401  (registers every method)
  from credit import catalog, registry
  families = registry.list_families()
  seen = set()
  n_pages = 0
  index = ["# Method catalogue", "",
           "Every registered advantage estimator and policy loss, generated from the registry "
           "(`credit.list_estimators()`, `credit.get_estimator(name)`, "
           "`credit.list_policy_losses()`, `credit.get_policy_loss(name)`); "
           "`python -m credit.catalog` prints the same list in a terminal. Confidence says how "
           "an implementation was checked: *code-verified* against the authors' code or a "
           "reference implementation, *paper-equation* from the paper's equations, *inferred* "
           "from the paper's text where it gives no equation.", "",
           f"{sum(len(v) for v in families.values())} estimators in {len(families)} families "
           f"and {len(registry.list_policy_losses())} policy losses.", "",
           "| family | methods |", "|---|---|"]
  for fam, names in families.items():
    index.append(f"| [{FAMILY_TITLES.get(fam, fam)}]({fam}.md) | "
                 + ", ".join(f"[`{n}`]({fam}/{n}.md)" for n in names) + " |")
  index.append("| [Policy losses](losses.md) | " + ", ".join(
      f"[`{n}`](losses/{n}.md)" for n in registry.list_policy_losses()) + " |")
  index += ["", "```{toctree}", ":hidden:", ""] + list(families) + ["losses", "```"]
  w.text("catalog/index.md", "\n".join(index) + "\n")

  for fam, names in families.items():
    page = [f"# {FAMILY_TITLES.get(fam, fam)}", "",
            f"Estimators in `credit/advantages/{fam}/`, one module per method.", "",
            "| estimator | confidence | summary |", "|---|---|---|"]
    for name in names:
      s = registry.get_estimator(name)
      page.append(f"| [`{name}`]({fam}/{name}.md) | {s.confidence} | "
                  f"{_md_cell(catalog.summary(s.fn))} |")
      facts = [("family", fam), ("needs", catalog.needs_cell(s) or "–"),
               ("confidence", s.confidence), ("source", _md_cell(catalog.source_of(s))),
               ("file", f"`{_rel_file(s.module)}`"),
               ("function", f"`{s.fn.__module__}.{s.fn.__qualname__}`")]
      if s.stateful:
        facts.append(("state", "per-prompt state (`init_state`), threaded by the runner"))
      if s.trained_loss is not None:
        facts.append(("loss term", f"adds a trained loss term (default weight "
                                   f"{s.trained_loss.coef:g}; `--config.estimator_loss_coef`)"))
      no_index = id(s.fn) in seen
      seen.add(id(s.fn))
      w.text(f"catalog/{fam}/{name}.md", _method_page(name, "estimator", s, facts, s.fn,
                                                      no_index))
      n_pages += 1
    w.text(f"catalog/{fam}.md", "\n".join(page) + "\n")

  losses = registry.list_policy_losses()
  page = ["# Policy losses", "",
          "Per-token policy losses in `credit/losses/policy/`. Each registered loss is its "
          "per-token function followed by the one `credit.losses.reduce_policy_loss` "
          "(importance correction, per-sample weights, aggregation); choose one with "
          "`--config.policy_loss=<name>`.", "",
          "| policy loss | confidence | summary |", "|---|---|---|"]
  for name in losses:
    s = registry.get_policy_loss(name)
    page.append(f"| [`{name}`](losses/{name}.md) | {s.confidence} | "
                f"{_md_cell(catalog.summary(s.token_fn))} |")
    facts = [("family", "policy loss"), ("needs", ", ".join(f"`{n}`" for n in sorted(s.needs))),
             ("confidence", s.confidence), ("source", _md_cell(catalog.source_of(s))),
             ("file", f"`{_rel_file(s.module)}`"),
             ("per-token function", f"`{s.token_fn.__module__}.{s.token_fn.__qualname__}`")]
    if s.whole_groups:
      facts.append(("minibatches", "whole prompt groups (the loss reads group statistics)"))
    if s.batch_coupled:
      facts.append(("batch-coupled", "yes: micro-batch sums differ from the full batch"))
    no_index = id(s.token_fn) in seen
    seen.add(id(s.token_fn))
    w.text(f"catalog/losses/{name}.md", _method_page(name, "loss", s, facts, s.token_fn,
                                                    no_index))
    n_pages += 1
  w.text("catalog/losses.md", "\n".join(page) + "\n")
  return {"method_pages": n_pages}


# --------------------------------------------------------------------------
# Recipes
# --------------------------------------------------------------------------

def recipe_fields(doc: str) -> dict[str, str]:
  """The `Command:` block (its lines kept), `Time:` and `Score:` of a recipe docstring.

  `Command (note):` keeps its note under "Command note"; a field runs until a blank line, a
  line that starts another `Name:` field, or (for Time and Score) an unindented line.
  """
  out = {}
  lines = doc.splitlines()
  for i, line in enumerate(lines):
    m = re.match(r"^(Commands?|Time|Score)( \(([^)]*)\))?:\s*(.*)$", line)
    if not m:
      continue
    key = "Command" if m.group(1).startswith("Command") else m.group(1)
    if key in out:
      continue
    body = [m.group(4)] if m.group(4) else []
    for nxt in lines[i + 1:]:
      if not nxt.strip() or re.match(r"^[A-Z][\w ]*( \([^)]*\))?:", nxt):
        break
      if key != "Command" and not nxt.startswith(" "):
        break
      body.append(nxt.strip() if key != "Command" else nxt)
    if key == "Command":
      out[key] = textwrap.dedent("\n".join(body)).strip()
      if m.group(3):
        out["Command note"] = m.group(3)
    else:
      out[key] = " ".join(body).strip()
  return out


def _flat(d, prefix=""):
  for k, v in d.items():
    if isinstance(v, dict):
      yield from _flat(v, f"{prefix}{k}.")
    else:
      yield f"{prefix}{k}", v


def _recipes(w: _Writer) -> dict:
  from experiments.configs import common
  base = dict(_flat(common.base_config().to_dict()))
  paths = sorted(p for p in glob.glob(os.path.join(ROOT, "experiments", "configs", "*.py"))
                 if os.path.basename(p)[:-3] not in ("__init__", "common", "settings"))
  index = ["# Recipes", "",
           "One file per method and task in `experiments/configs/`; each `get_config(arg)` "
           "returns the run's `ml_collections.ConfigDict` and every recipe has a `:tiny` "
           "variant (two steps, used by the tests). Shared settings live in "
           "`experiments/configs/settings.py` and `common.py`. Generated from each recipe's "
           "docstring and config; time and score are what the docstring records.", "",
           "| recipe | time | score |", "|---|---|---|"]
  names = []
  for path in paths:
    name = os.path.basename(path)[:-3]
    mod = importlib.import_module(f"experiments.configs.{name}")
    doc = inspect.getdoc(mod) or ""
    fields = recipe_fields(doc)
    names.append(name)
    index.append(f"| [`{name}`]({name}.md) | {_md_cell(_md_inline(fields.get('Time', '–')))} | "
                 f"{_md_cell(_md_inline(fields.get('Score', '–')))} |")
    cfg = dict(_flat(mod.get_config().to_dict()))
    changed = [(k, v) for k, v in cfg.items() if k not in base or base[k] != v]
    title = doc.splitlines()[0] if doc else name
    page = [ORPHAN, f"# `{name}`", "", title, ""]
    if "Command" in fields:
      note = f" ({fields['Command note']})" if "Command note" in fields else ""
      page += [f"**Command**{_md_inline(note)}", "", _fence(fields["Command"], "bash")]
    page += [f"**Time:** {_md_inline(fields.get('Time', 'not recorded'))}", "",
             f"**Score:** {_md_inline(fields.get('Score', 'not recorded'))}", "",
             "## Settings", "",
             "What `get_config()` sets differently from `common.base_config()` "
             "(override any with `--config.<key>=<value>`):", "",
             "| key | value |", "|---|---|"]
    page += [f"| `{k}` | {_code(repr(v))} |" for k, v in changed]
    page += ["", "## The recipe's notes", "", _fence(doc)]
    w.text(f"recipes/{name}.md", "\n".join(page) + "\n")
  w.text("recipes/index.md", "\n".join(index) + "\n")
  return {"recipes": len(names)}


# --------------------------------------------------------------------------
# Credit benchmark results
# --------------------------------------------------------------------------


def _bench(w: _Writer) -> None:
  res = BENCH_DIR
  rel = "../../benchmarks/results/credit_bench_full"
  page = ["# Results", "",
          f"Generated from `benchmarks/results/credit_bench_full/` (the full run's "
          "`results.csv` and `learning.csv`, rebuilt by `python -m benchmarks.credit_bench "
          "--tables`). How the tasks and scores are defined: [the benchmark](../../benchmark/"
          "index.md).", ""]
  with open(os.path.join(res, "settings.json"), encoding="utf-8") as f:
    settings = json.load(f)
  page += ["## Settings of the full run", "", "| setting | value |", "|---|---|"]
  page += [f"| `{k}` | {_code(json.dumps(v))} |" for k, v in settings.items()]
  page += ["", "## Credit and learning, every estimator and task", "",
           "Each cell: correlation with the true advantages [95% interval] / pivot mass / "
           "balanced sign accuracy at the pivots / final held-out accuracy [95% interval] of "
           "the learning runs.", ""]
  with open(os.path.join(res, "summary.md"), encoding="utf-8") as f:
    page += [_shift_headings(f.read().strip(), 3), ""]
  page += ["", "## Learning curves", ""]
  for task in BENCH_TASKS:
    png = os.path.join(res, f"curves_{task}.png")
    if os.path.exists(png):
      w.copy(png, f"bench/curves_{task}.png")
      page += [f"### `{task}`", "", f"Full table: [learning on `{task}`](learning_{task}.md).",
               "", f"![held-out accuracy against RL steps on {task}](curves_{task}.png)", ""]
  w.text("bench/results.md", "\n".join(page) + "\n")

  for task in BENCH_TASKS:
    path = os.path.join(res, f"learning_{task}.md")
    if not os.path.exists(path):
      continue
    with open(path, encoding="utf-8") as f:
      table = _shift_headings(f.read().strip())
    page = [f"# Learning on `{task}`", "",
            f"From `{rel[6:]}/learning_{task}.md`: held-out greedy accuracy after the last RL "
            "step, area under the accuracy curve and steps to the threshold, mean over three "
            "seeds with bootstrap 95% intervals.", ""]
    if os.path.exists(os.path.join(res, f"curves_{task}.png")):
      page += [f"![held-out accuracy against RL steps on {task}](curves_{task}.png)", ""]
    page += [table, ""]
    w.text(f"bench/learning_{task}.md", "\n".join(page) + "\n")

  with open(os.path.join(res, "table.md"), encoding="utf-8") as f:
    table = f.read().strip()
  w.text("bench/credit_table.md", "# Credit table\n\nFrom `benchmarks/results/credit_bench_full/"
         "table.md`: the credit part of the full run, every estimator on every task.\n\n"
         + _shift_headings(table) + "\n")
  with open(os.path.join(res, "skipped.md"), encoding="utf-8") as f:
    table = f.read().strip()
  w.text("bench/skipped.md", "# Skipped estimators\n\nFrom `benchmarks/results/"
         "credit_bench_full/skipped.md`: estimators whose inputs a bifurcation task cannot "
         "give, with the runner's reason.\n\n" + _shift_headings(table) + "\n")
  extra = os.path.join(ROOT, "benchmarks", "results", "credit_and_or.md")
  if os.path.exists(extra):
    with open(extra, encoding="utf-8") as f:
      table = _shift_headings(f.read().strip())
    w.text("bench/credit_and_or.md", "# Several pivots: credit on `pivotal_and` and "
           "`pivotal_or`\n\nFrom `benchmarks/results/credit_and_or.md`.\n\n" + table + "\n")
  learning = [f"learning_{t}" for t in BENCH_TASKS
              if os.path.exists(os.path.join(res, f"learning_{t}.md"))]
  w.text("bench/index.md", "# Result tables\n\nGenerated from `benchmarks/results/`.\n\n"
         "```{toctree}\n\nresults\ncredit_table\n" + "\n".join(learning)
         + ("\ncredit_and_or" if os.path.exists(extra) else "") + "\nskipped\n```\n")


# --------------------------------------------------------------------------
# API reference
# --------------------------------------------------------------------------


def _modules(package: str) -> list[str]:
  mod = importlib.import_module(package)
  out = [package]
  if hasattr(mod, "__path__"):
    for info in pkgutil.walk_packages(mod.__path__, package + "."):
      name = info.name
      if any(part.startswith("_") for part in name.split(".")):
        continue
      if name.startswith(API_SKIP) or name.startswith("credit.tasks.credit_tasks"):
        continue
      out.append(name)
  return out


def _registered() -> set[str]:
  """`module.qualname` of every registered estimator and policy-loss function."""
  from credit import registry
  fns = [registry.get_estimator(n).fn for n in registry.list_estimators()]
  fns += [registry.get_policy_loss(n).token_fn for n in registry.list_policy_losses()]
  return {f"{f.__module__}.{f.__qualname__}" for f in fns}


def _api(w: _Writer) -> None:
  names = []
  registered = _registered()
  for package, title in API_PACKAGES:
    slug = package.replace(".", "_")
    names.append(slug)
    body = [f"# {title}", ""]
    if package == "credit":
      body += ["The names `credit` exports (`credit.__all__`); the functions themselves are "
               "documented on their modules' pages and, for estimators and policy losses, in "
               "the [method catalogue](../catalog/index.md).", "",
               _eval_rst(".. automodule:: credit\n   :no-members:\n")]
      w.text(f"api/{slug}.md", "\n".join(body) + "\n")
      continue
    if package == "credit.losses":
      body += ["The per-token policy losses (`credit.losses.policy`) are in the "
               "[method catalogue](../catalog/losses.md).", ""]
    mods = [package] if package in ("credit", "credit.catalog") else _modules(package)
    for i, m in enumerate(mods):
      own = sorted(r.rsplit(".", 1)[1] for r in registered if r.rsplit(".", 1)[0] == m)
      members = f"   :exclude-members: {', '.join(own)}\n" if own else ""
      if m == package and len(mods) > 1:  # a package re-exports its modules' names
        members = "   :no-members:\n"
      if i:
        body += [f"## `{m}`", ""]
      body.append(_eval_rst(f".. automodule:: {m}\n{members}"))
    w.text(f"api/{slug}.md", "\n".join(body) + "\n")
  w.text("api/index.md", "# API reference\n\nFrom the docstrings (Google style, through "
         "napoleon). Estimators and policy losses: the [method catalogue](../catalog/index.md)."
         "\n\n```{toctree}\n:maxdepth: 1\n\n" + "\n".join(names) + "\n```\n")


# --------------------------------------------------------------------------
# Notebooks
# --------------------------------------------------------------------------


def _notebooks(w: _Writer) -> None:
  names = []
  for path in sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb"))):
    name = os.path.basename(path)
    names.append(name[:-6])
    w.copy(path, f"notebooks/{name}")
  w.text("notebooks/index.md", "# Notebooks\n\nThe notebooks of `notebooks/`, shown as stored "
         "(the docs build does not execute them; the test suite runs each with nbmake). Each "
         "opens in Colab from its badge.\n\n```{toctree}\n:maxdepth: 1\n\n"
         + "\n".join(names) + "\n```\n")


# --------------------------------------------------------------------------
# Docstring guard
# --------------------------------------------------------------------------

_STATE = {"fallbacks": [], "checked": 0}


def _parses_cleanly(app, lines: list[str]) -> bool:
  """Whether `lines` parse as reST inside a directive body without any message."""
  text = ".. container::\n\n" + "\n".join(("   " + l) if l.strip() else "" for l in lines)
  stream = io.StringIO()
  settings = {"report_level": 1, "halt_level": 5, "warning_stream": stream,
              "env": app.env, "input_encoding": "unicode", "file_insertion_enabled": False,
              "raw_enabled": False, "_disable_config": True, "traceback": True}
  try:
    with sphinx_domains(app.env):
      doctree = publish_doctree(text, settings_overrides=settings)
  except Exception:  # noqa: BLE001  (anything that fails to parse falls back)
    return False
  from docutils import nodes
  msgs = [m for m in doctree.findall(nodes.system_message) if m["level"] >= 2]
  return not msgs and "ERROR" not in stream.getvalue() and "WARNING" not in stream.getvalue()


def _guard(app, what, name, obj, options, lines):
  _STATE["checked"] += 1
  if not lines or _parses_cleanly(app, lines):
    return
  raw = inspect.getdoc(obj) or "\n".join(lines)
  _STATE["fallbacks"].append(name)
  lines[:] = ["::", ""] + ["   " + l if l.strip() else "" for l in raw.splitlines()] + [""]


def _generate(app) -> None:
  import time
  t0 = time.perf_counter()
  w = _Writer()
  os.makedirs(GEN, exist_ok=True)
  _contract(w)
  _producers(w)
  counts = _catalog(w)
  counts.update(_recipes(w))
  _bench(w)
  _api(w)
  _notebooks(w)
  w.prune()
  LOG.info("credit_docs: generated %s in %.1f s", counts, time.perf_counter() - t0)


def _report(app, exc) -> None:
  if exc is None:
    LOG.info("credit_docs_fallbacks: %d of %d docstrings shown as literal text%s",
             len(_STATE["fallbacks"]), _STATE["checked"],
             (": " + ", ".join(_STATE["fallbacks"])) if _STATE["fallbacks"] else "")


def setup(app):
  app.connect("builder-inited", _generate)
  app.connect("autodoc-process-docstring", _guard, priority=900)
  app.connect("build-finished", _report)
  return {"version": "1", "parallel_read_safe": False, "parallel_write_safe": True}
