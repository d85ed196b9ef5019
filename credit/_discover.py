"""Method packages import their modules themselves: adding a method is adding a file.

`import_methods` imports every public module of a family package (names not starting with
"_"), in name order, which registers their estimators; the package then re-exports each
module's `__all__`, so `credit.advantages.outcome.grpo_advantages` and
`credit.advantages.grpo_advantages` work without anyone listing names by hand.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Iterable, MutableMapping


def import_methods(package: str, path: Iterable[str],
                   namespace: MutableMapping[str, Any]) -> list[str]:
  """Imports the public modules of `package`; returns the names they export.

  Args:
    package: the family package's `__name__`.
    path: its `__path__`.
    namespace: its `globals()`; exported names are added to it.
  """
  exported: list[str] = []
  for info in sorted(pkgutil.iter_modules(list(path)), key=lambda m: m.name):
    if info.name.startswith("_"):
      continue
    module = importlib.import_module(f"{package}.{info.name}")
    namespace[info.name] = module
    for name in getattr(module, "__all__", ()):
      if name in namespace and namespace[name] is not getattr(module, name):
        raise ImportError(f"{package}: {name!r} is exported by two modules")
      namespace[name] = getattr(module, name)
      exported.append(name)
  return exported
