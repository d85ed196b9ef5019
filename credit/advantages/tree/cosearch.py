"""CoSearch: GRPO groups formed by clustering rows whose sub-query token sets overlap."""
from __future__ import annotations

from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_int
from credit.contract import ContractError, validate_fields
from credit.ops._cast import as_f32
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["cosearch_advantages", "cosearch_groups", "query_multihot", "CoSearchGroups",
           "CoSearchOutput", "validate_cosearch_inputs"]

_PAPER = ("CoSearch: Joint Training of Reasoning and Document Ranking via Reinforcement "
          "Learning for Agentic Search, arXiv preprint")
_GOLDEN = 0x9E3779B1  # Knuth's multiplicative hash constant (2^32 / golden ratio)


class CoSearchGroups(NamedTuple):
  """group_id: [B] int32 semantic group of each row (the smallest row index of its
  connected component; a row without query tokens is its own group). size: [B] float32
  number of valid rows in the row's group (0 for invalid rows)."""
  group_id: Array
  size: Array


class CoSearchOutput(NamedTuple):
  """advantages: [B,T] float32. metrics: {"singleton_fraction": fraction of the valid rows
  alone in their semantic group (they get 0), "num_semantic_groups": number of groups of
  valid rows}, float32 scalars."""
  advantages: Array
  metrics: dict[str, Array]


def query_multihot(tokens: ArrayLike, query_mask: ArrayLike, num_buckets: int) -> Array:
  """[B,H] 0/1 float32: bucket h is 1 when a query token of the row hashes to h.

  Hash: x = uint32(token)·0x9E3779B1, x ^= x >> 16, h = x mod H. Distinct tokens may share a
  bucket (then the Jaccard index is over buckets, slightly above the exact one).
  """
  check_int("query_multihot", "num_buckets", num_buckets)
  tok = jnp.asarray(tokens)
  q = jnp.asarray(query_mask).astype(bool)
  chex.assert_rank([tok, q], 2)
  chex.assert_equal_shape([tok, q])
  x = tok.astype(jnp.uint32) * jnp.uint32(_GOLDEN)
  x = x ^ (x >> jnp.uint32(16))
  h = (x % jnp.uint32(num_buckets)).astype(jnp.int32)
  rows = jnp.broadcast_to(jnp.arange(tok.shape[0])[:, None], tok.shape)
  out = jnp.zeros((tok.shape[0], num_buckets), jnp.float32)
  return out.at[rows, h].max(q.astype(jnp.float32))


def cosearch_groups(*, tokens: ArrayLike, query_mask: ArrayLike, group_id: ArrayLike,
                    valid: ArrayLike, tau: ArrayLike = 0.5,
                    num_buckets: int = 4096) -> CoSearchGroups:
  """Connected components of the graph "Jaccard(query sets) ≥ τ, same prompt group".

  Rows that are not `valid` or have no query token have no edge. Label propagation:
  ℓ ← min(ℓ, min_{neighbours} ℓ) then ℓ ← ℓ[ℓ], starting from ℓ_b = b, until no label
  changes (at most B−1 rounds): every row ends with the smallest row index of its component.
  O(B² H) for the Jaccard matrix, O(B²) per round of the propagation.
  """
  valid_B = jnp.asarray(valid).astype(bool)
  gid_B = jnp.asarray(group_id, jnp.int32)
  mh_BH = query_multihot(tokens, jnp.asarray(query_mask).astype(bool) & valid_B[:, None],
                         num_buckets)
  B = mh_BH.shape[0]
  inter = jnp.matmul(mh_BH, mh_BH.T, precision=jax.lax.Precision.HIGHEST)
  size_B = jnp.sum(mh_BH, axis=1)
  union = size_B[:, None] + size_B[None, :] - inter
  jac = inter / jnp.maximum(union, 1.0)
  has_q = size_B > 0
  adj = ((jac >= jnp.asarray(tau, jnp.float32)) & has_q[:, None] & has_q[None, :]
         & (gid_B[:, None] == gid_B[None, :]))
  adj = jax.lax.stop_gradient(adj)

  def body(carry):
    i, lab, _ = carry
    nb = jnp.min(jnp.where(adj, lab[None, :], B), axis=1)
    new = jnp.minimum(lab, nb)
    new = new[new]            # pointer jumping: a label is a row of the same component
    return i + 1, new, jnp.any(new != lab)

  # Until no label changes (the fixpoint of the B−1 rounds, reached after about the
  # components' diameter): each round is O(B²), so the loop costs rounds·B², not B³.
  start = jnp.arange(B, dtype=jnp.int32)
  _, lab, _ = jax.lax.while_loop(lambda c: c[2] & (c[0] < B - 1), body,
                                 (jnp.int32(0), start, jnp.asarray(B > 1)))
  same = (lab[:, None] == lab[None, :]) & valid_B[None, :]
  size = jnp.where(valid_B, jnp.sum(same.astype(jnp.float32), axis=1), 0.0)
  return CoSearchGroups(group_id=lab, size=size)


@register_estimator(
    "cosearch", needs=("tokens", "query_mask", "reward", "group_id", "response_mask"),
    paper=_PAPER, optional_needs={"reward_components": "rank_weight"},
    static_argnames=("num_groups", "num_buckets", "rank_column", "singleton"),
    returns_output=True,
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def cosearch_advantages(*, tokens: ArrayLike, query_mask: ArrayLike, reward: ArrayLike,
                        group_id: ArrayLike, response_mask: ArrayLike, num_groups: int,
                        tau: ArrayLike = 0.5, num_buckets: int = 4096,
                        rank_weight: ArrayLike = 0.0,
                        reward_components: ArrayLike | None = None, rank_column: int = 0,
                        eps: ArrayLike = 1e-6, singleton: str = "zero") -> CoSearchOutput:
  """CoSearch: GRPO inside semantic groups of rows with similar sub-queries.

  A ranker's inputs (sub-queries) differ across trajectories, so it has no natural GRPO
  groups; rows whose sub-query token sets overlap enough are clustered and each cluster is a
  group. A row is one ranker call; its sub-query is the set S_b of token ids under
  `query_mask`::

    J_ab = size(S_a ∩ S_b) / size(S_a ∪ S_b)          (on a hashed multi-hot [B,H])
    edge(a, b) iff J_ab ≥ τ and the same prompt group;  c_b = connected component of b
    R_b = α · rank_quality_b + (1 − α) · reward_b
    A[b,t] = GRPO(R; groups c)_b · M[b,t]

  One-row clusters (common) get 0, and `metrics["singleton_fraction"]` reports how many.
  Clusters never cross prompt groups. The ranking quality is read from column
  `rank_column` of `reward_components` when α ≠ 0. Grouping has no gradient.

  Paper: "CoSearch: Joint Training of Reasoning and Document Ranking via Reinforcement
  Learning for Agentic Search" (arXiv preprint). The abstract gives the clustering idea:
  the Jaccard threshold τ = 0.5, the hashing and α = 0 are this library's.

  Args:
    tokens: [B,T] int token ids.
    query_mask: [B,T] bool, the row's sub-query tokens (only those under `response_mask`
      count).
    reward: [B] float trajectory outcome.
    group_id: [B] int prompt group in [0, num_groups).
    response_mask: [B,T] bool policy tokens.
    num_groups: static number of prompt groups.
    tau: Jaccard threshold τ.
    num_buckets: static H of the hashed vocabulary.
    rank_weight: α.
    reward_components: [B,R] float, needed when α ≠ 0.
    rank_column: static column of `reward_components` holding the ranking quality.
    eps: ε on the GRPO std.
    singleton: "zero" | "raw".

  Returns:
    CoSearchOutput(advantages [B,T] float32, zero outside `response_mask`; metrics).

  Example:
    >>> import numpy as np
    >>> tok = np.array([[5, 6, 7], [5, 6, 8], [9, 10, 10]], np.int32)
    >>> out = cosearch_advantages(tokens=tok, query_mask=np.ones((3, 3), bool),
    ...     reward=np.array([0.8, 0.4, 0.3]), group_id=np.zeros(3, np.int32),
    ...     response_mask=np.ones((3, 3), bool), num_groups=1)
    >>> np.round(np.asarray(out.advantages[:, 0], np.float64), 4).tolist()
    [0.7071, -0.7071, 0.0]
    >>> round(float(out.metrics["singleton_fraction"]), 4)
    0.3333
  """
  check_int("cosearch_advantages", "num_buckets", num_buckets)
  reward_B, gid_B, mask_BT, valid_B = ops.group_rows(
      "cosearch_advantages", reward, group_id, num_groups, None, response_mask=response_mask)
  if reward_components is not None:
    rc = as_f32(reward_components)
    chex.assert_rank(rc, 2)
    if not 0 <= rank_column < rc.shape[1]:
      raise ValueError(f"cosearch_advantages: rank_column={rank_column} is not a column of "
                       f"reward_components (shape {rc.shape})")
    a = jnp.asarray(rank_weight, jnp.float32)
    reward_B = a * rc[:, rank_column] + (1.0 - a) * reward_B
  elif not (isinstance(rank_weight, (int, float)) and rank_weight == 0):
    raise ValueError("cosearch_advantages: rank_weight != 0 needs reward_components (the "
                     "ranking quality in column rank_column)")
  q_BT = jnp.asarray(query_mask).astype(bool)
  chex.assert_equal_shape([q_BT, mask_BT])
  groups = cosearch_groups(tokens=tokens, query_mask=q_BT & mask_BT, group_id=gid_B,
                           valid=valid_B, tau=tau, num_buckets=num_buckets)
  B = reward_B.shape[0]
  adv = ops.grpo_token_advantages("cosearch_advantages", reward=reward_B,
                                  group_id=groups.group_id, response_mask=mask_BT,
                                  num_groups=B, eps=eps, singleton=singleton)
  nv = jnp.sum(valid_B.astype(jnp.float32))
  alone = valid_B & (groups.size == 1.0)
  roots = valid_B & (groups.group_id == jnp.arange(B))
  metrics = {"singleton_fraction": jnp.sum(alone.astype(jnp.float32)) / jnp.maximum(nv, 1.0),
             "num_semantic_groups": jnp.sum(roots.astype(jnp.float32))}
  return CoSearchOutput(adv, metrics)


def validate_cosearch_inputs(*, num_groups: int | None = None, **fields: Any) -> None:
  """Eager checks before tracing: contract shapes/dtypes, finite rewards (and components),
  a non-empty `response_mask`, and non-negative token ids under `query_mask`."""
  validate_fields(fields, num_groups=num_groups, where="cosearch")
  tok = np.asarray(fields["tokens"])
  q = np.asarray(fields["query_mask"]).astype(bool)
  if (tok[q] < 0).any():
    raise ContractError("cosearch: `tokens` must be non-negative under `query_mask`")
