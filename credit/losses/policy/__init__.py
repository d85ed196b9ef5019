"""Policy losses, one module per method (a registry key's per-token term is `<key>_loss`).

Each module defines a per-token function `<key>_loss(*, logprob, logprob_old, advantages,
response_mask, <hyper>) -> TokenLoss` decorated with `credit.losses.policy_loss`, which
registers the full loss (the per-token term, then `reduce_policy_loss`). Every public
module here is imported, and its `__all__` re-exported, automatically.
"""
from credit._discover import import_methods

__all__ = import_methods(__name__, __path__, globals())
