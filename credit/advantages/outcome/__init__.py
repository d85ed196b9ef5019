"""Outcome-level and group-relative advantage estimators.

One module per method, named after its registry key (`reinforce_pp.py` also registers
`reinforce_pp_baseline`; `dapo.py` also holds the DAPO filter and overlong penalty);
every public module here is imported, and its estimators registered, when the package is
imported (`credit/_discover.py`). Helpers shared by several methods are in `_common.py`;
generic array primitives in `credit.ops`.

Every estimator turns rollout fields (a scalar outcome `reward [B]` per response, group
ids, masks and, for a few, per-token arrays) into token advantages `[B,T]` (or a small
NamedTuple when it also returns value targets or state). Each registration records what
the implementation was checked against (`EstimatorSpec.confidence`, `.source`); each
method's page under `docs/methods/` has the full derivation and measured results.

Conventions shared by all group estimators:

* `num_groups` (static int) is the number of segments of the general path; with
  `group_size=G` (static) the batch is read as contiguous groups `[N,G]` (fast path,
  `group_id` is then ignored). Both paths give the same numbers.
* A row is *valid* when its `response_mask` selects at least one token (and, on the
  segment path, its group id lies in `[0, num_groups)`); see `credit.ops.group_rows`.
  Invalid rows get exact zeros and take no part in any group or batch statistic, so
  masking a row out equals slicing it away. (verl never sees empty rows; this is our
  choice.)
* `singleton="zero"` (default) gives 0 to a group with one valid member; `"raw"`
  reproduces verl (μ=0, σ=1 for singletons: the advantage is the raw reward, scaled where
  the estimator scales).
* Statistics are computed shifted (`ops.group_normalize` pivots, two-pass batch moments)
  so rewards like [1000, 1000, 1000, 1000.01] keep their differences.
* Masked and degenerate entries are exact zeros, never NaN, also in gradients.

Static hyperparameters (strings, ints that pick code paths) are validated in Python and
raise `ValueError` listing the valid choices.
"""
from credit._discover import import_methods

__all__ = import_methods(__name__, __path__, globals())
