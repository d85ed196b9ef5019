"""Token-level redistribution of a sequence advantage (entropy, divergence, sensitivity, flagged spans).

One module per method, named after its registry key; every public module here is imported
(and its estimators registered) when the package is imported — see `credit/_discover.py`.
"""
from credit._discover import import_methods

__all__ = import_methods(__name__, __path__, globals())
