"""Advantage estimators: rollout fields in, token advantages [B,T] out.

One package per family (`credit.registry.FAMILIES`), one module per method named after its
registry key: `credit/advantages/<family>/<name>.py`. Importing this package imports every
family, which registers every estimator (`credit.get_estimator(name)` finds it) and exposes
the families as namespaces: `credit.advantages.outcome.grpo_advantages`, and every exported
name also directly as `credit.advantages.grpo_advantages`.
"""
import importlib as _importlib

from credit.registry import FAMILIES as _FAMILIES

__all__ = list(_FAMILIES)
for _family in _FAMILIES:
  _pkg = _importlib.import_module(f"{__name__}.{_family}")
  globals()[_family] = _pkg
  for _name in _pkg.__all__:
    globals()[_name] = getattr(_pkg, _name)
    __all__.append(_name)
