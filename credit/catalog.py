"""The method catalog: every registered estimator and policy loss, from the registry.

    python -m credit.catalog                    # name, family, confidence, one-line summary
    python -m credit.catalog --family turn      # one family ("loss" for the policy losses)
    python -m credit.catalog --wide             # markdown tables: needs, paper, file
    python -m credit.catalog --wide --write F   # replace F's <!-- catalog:start/end --> block

The compact default fits a 100-column terminal (`--width` changes it). Every column comes from
the registry: the family from the defining package, needs, confidence and source from the
registration, the summary from the first paragraph of the function's docstring. The
documentation's method catalogue (docs/) is built from the same functions.
"""
from __future__ import annotations

import argparse
import inspect
import re
import sys

from credit import registry

START, END = "<!-- catalog:start -->", "<!-- catalog:end -->"
LOSS_FAMILY = "loss"  # the family column and `--family` value of the policy losses
DEFAULT_WIDTH = 100


def _cell(text: str) -> str:
  return " ".join(str(text).split()).replace("|", "\\|")


def _module_path(module: str) -> str:
  return module.replace(".", "/") + ".py"


def summary(fn) -> str:
  """The first paragraph of `fn`'s docstring on one line ("" when it has none)."""
  doc = inspect.getdoc(fn) or ""
  return " ".join(doc.strip().split("\n\n")[0].split())


def source_of(spec) -> str:
  """What the method was written from, as registered (falls back to its paper)."""
  return getattr(spec, "source", "") or spec.paper


def rows(family: str | None = None) -> list[tuple[str, str, str, str]]:
  """(name, family, confidence, summary) for every estimator, then every policy loss.

  `family`: keep one estimator family, or `LOSS_FAMILY` for the policy losses only.
  """
  families = registry.list_families()
  known = list(families) + [LOSS_FAMILY]
  if family is not None and family not in known:
    raise ValueError(f"unknown family {family!r}; known: {', '.join(known)}")
  out = []
  for fam, names in families.items():
    if family in (None, fam):
      for name in names:
        s = registry.get_estimator(name)
        out.append((name, fam, s.confidence, summary(s.fn)))
  if family in (None, LOSS_FAMILY):
    for name in registry.list_policy_losses():
      s = registry.get_policy_loss(name)
      out.append((name, LOSS_FAMILY, s.confidence, summary(s.token_fn)))
  return out


def _clip(text: str, width: int) -> str:
  if len(text) <= width:
    return text
  cut = text[:max(width - 1, 0)]
  return (cut.rsplit(" ", 1)[0] if " " in cut[width // 2:] else cut) + "…"


def compact(family: str | None = None, width: int = DEFAULT_WIDTH) -> str:
  """Aligned plain-text columns; no line is longer than `width`."""
  table = rows(family)
  header = ("name", "family", "confidence", "summary")
  w = [max(len(r[i]) for r in table + [header]) for i in range(3)]
  lines = []
  for r in [header] + table:
    left = f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  "
    lines.append((left + _clip(r[3], width - len(left))).rstrip()[:width])
  n_est = sum(r[1] != LOSS_FAMILY for r in table)
  n_loss = len(table) - n_est
  lines.append(f"{n_est} estimators, {n_loss} policy losses. `--wide` for needs, papers and "
               "files."[:width])
  return "\n".join(lines)


def _needs(needs, optional=(), default_on=frozenset()) -> str:
  """The needs cell; `default_on`: optional fields whose switch is on by default."""
  out = ", ".join(f"`{n}`" for n in sorted(needs))
  if optional:
    out += "; optional " + ", ".join(
        f"`{f}` (with `{s}`, on by default)" if f in default_on else f"`{f}` (with `{s}`)"
        for f, s in optional)
  return out


def needs_cell(spec) -> str:
  """An estimator's needs, optional ones with the switch that turns them on."""
  return _needs(spec.needs, spec.optional_needs, spec.needs_for({}) - spec.needs)


def estimator_table(family: str | None = None) -> str:
  lines = ["| estimator | family | needs | paper | confidence | file |",
           "|---|---|---|---|---|---|"]
  for fam, names in registry.list_families().items():
    if family not in (None, fam):
      continue
    for name in names:
      s = registry.get_estimator(name)
      lines.append(f"| `{name}` | {fam} | {needs_cell(s)} | "
                   f"{_cell(s.paper)} | {s.confidence} | `{_module_path(s.module)}` |")
  return "\n".join(lines)


def loss_table() -> str:
  lines = ["| policy loss | per-token function | paper | confidence | file |",
           "|---|---|---|---|---|"]
  for name in registry.list_policy_losses():
    s = registry.get_policy_loss(name)
    lines.append(f"| `{name}` | `{s.token_fn.__name__}` | {_cell(s.paper)} | {s.confidence} | "
                 f"`{_module_path(s.module)}` |")
  return "\n".join(lines)


def markdown(family: str | None = None) -> str:
  """The wide tables with a one-line count (`family` as in `rows`)."""
  if family == LOSS_FAMILY:
    return loss_table()
  if family is not None:
    rows(family)  # validates the name
    return estimator_table(family)
  fams = registry.list_families()
  counts = ", ".join(f"{f} {len(n)}" for f, n in fams.items())
  n_est = sum(len(n) for n in fams.values())
  return (f"{n_est} estimators ({counts}) and {len(registry.list_policy_losses())} policy "
          f"losses. Generated by `python -m credit.catalog --wide`.\n\n"
          f"{estimator_table()}\n\n{loss_table()}")


def embed(text: str) -> str:
  """`text` with its catalog block replaced by the current wide tables."""
  pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
  if not pattern.search(text):
    raise ValueError(f"no {START} ... {END} block found")
  return pattern.sub(lambda _: f"{START}\n{markdown()}\n{END}", text)


def embedded(text: str) -> str | None:
  """The catalog block currently in `text` (without the markers), or None."""
  m = re.search(re.escape(START) + r"\n(.*?)\n" + re.escape(END), text, re.S)
  return m.group(1) if m else None


def main(argv=None) -> int:
  import credit  # noqa: F401  (imports every family: registers every method)
  p = argparse.ArgumentParser(prog="python -m credit.catalog",
                              description=__doc__.splitlines()[0])
  p.add_argument("--family", help="one estimator family, or 'loss' for the policy losses "
                 f"({', '.join(list(registry.FAMILIES) + [LOSS_FAMILY])})")
  p.add_argument("--wide", action="store_true",
                 help="markdown tables with needs, paper and file (the old output)")
  p.add_argument("--width", type=int, default=DEFAULT_WIDTH,
                 help=f"line width of the compact listing (default {DEFAULT_WIDTH})")
  p.add_argument("--write", metavar="FILE",
                 help="with --wide: replace the catalog block of FILE")
  args = p.parse_args(argv)
  try:
    if args.write:
      if not args.wide or args.family:
        p.error("--write takes --wide and no --family")
      with open(args.write, encoding="utf-8") as f:
        text = f.read()
      with open(args.write, "w", encoding="utf-8") as f:
        f.write(embed(text))
    elif args.wide:
      sys.stdout.write(markdown(args.family) + "\n")
    else:
      sys.stdout.write(compact(args.family, args.width) + "\n")
  except ValueError as e:
    p.exit(2, f"error: {e}\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
