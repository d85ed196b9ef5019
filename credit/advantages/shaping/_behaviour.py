"""Behaviour descriptors of responses and the distances between them (novelty, diversity).

Shared by the shaping methods that reward how a response differs from others: SatisDive's
diversity among the responses above a reward cutoff, novelty search's distance to an archive
of earlier responses (and SERENE, which alternates novelty search with reward exploitation).

A response's behaviour descriptor is the frequency vector of its policy tokens hashed into D
buckets (token id mod D): a bag-of-tokens summary, cheap to compute inside the update, that
depends only on the tokens under `response_mask` (padding and masked positions count for
nothing) and whose Euclidean distances lie in [0, √2].
"""
from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_int

Array = jax.Array

__all__ = ["ArchiveState", "archive_init_state", "token_descriptors", "pair_distances",
           "mean_nearest", "descriptor_key", "group_ranks", "archive_insert",
           "novelty_against_archive", "Novelty", "novelty_scores"]

# Defaults of the per-prompt archive (`archive_init_state`).
ARCHIVE_SIZE = 32
DESCRIPTOR_DIM = 64


class ArchiveState(NamedTuple):
  """Per-prompt archives of behaviour descriptors, indexed by a stable prompt slot [P].

  archive: [P,A,D] float32 descriptors (a ring buffer of A entries per prompt);
  inserted: [P] int32 descriptors ever inserted for the prompt (min(inserted, A) slots hold
    entries; the next one goes to slot inserted mod A).
  """
  archive: Array
  inserted: Array


def archive_init_state(num_prompts: int, archive_size: int = ARCHIVE_SIZE,
                       descriptor_dim: int = DESCRIPTOR_DIM) -> ArchiveState:
  """Empty archives of `archive_size` descriptors of dimension `descriptor_dim` for each of
  `num_prompts` prompt slots. The descriptor dimension of the estimators that read the state
  is taken from it."""
  for arg, v in (("num_prompts", num_prompts), ("archive_size", archive_size),
                 ("descriptor_dim", descriptor_dim)):
    check_int("archive_init_state", arg, v)
  return ArchiveState(
      archive=jnp.zeros((num_prompts, archive_size, descriptor_dim), jnp.float32),
      inserted=jnp.zeros((num_prompts,), jnp.int32))


def token_descriptors(tokens: ArrayLike, response_mask: ArrayLike, dim: int) -> Array:
  """Hashed token-frequency descriptors [B,D] of the responses.

  φ_b[d] = #{t : mask[b,t], tokens[b,t] mod D = d} / #{t : mask[b,t]} (0 for empty rows).
  A segment sum over B·D buckets, O(B·T) memory (no [B,T,D] one-hot).
  """
  tok_BT = jnp.asarray(tokens)
  mask_BT = jnp.asarray(response_mask, bool)
  chex.assert_rank([tok_BT, mask_BT], 2)
  chex.assert_equal_shape([tok_BT, mask_BT])
  chex.assert_type(tok_BT, int)
  check_int("token_descriptors", "dim", dim)
  b, t = mask_BT.shape
  bucket_BT = jnp.mod(jnp.where(mask_BT, tok_BT.astype(jnp.int32), 0), dim)
  flat = (jnp.arange(b, dtype=jnp.int32)[:, None] * dim + bucket_BT).reshape(-1)
  counts = jax.ops.segment_sum(mask_BT.reshape(-1).astype(jnp.float32), flat, b * dim)
  counts_BD = counts.reshape(b, dim)
  n_B = jnp.sum(mask_BT, axis=-1).astype(jnp.float32)
  return counts_BD / jnp.maximum(n_B, 1.0)[:, None]


def pair_distances(x_BD: Array, y_BRD: Array) -> Array:
  """Euclidean distances [B,R] between each x_b and the R descriptors y_b,r (`y` [B,R,D], or
  [1,R,D] for the same R descriptors for every row).

  Computed from differences (not ‖x‖² + ‖y‖² − 2x·y), so identical descriptors are exactly 0
  apart; the square root is taken where the sum is positive only (finite gradients)."""
  diff = x_BD[:, None, :] - y_BRD
  sq = jnp.sum(diff * diff, axis=-1)
  pos = sq > 0
  return jnp.where(pos, jnp.sqrt(jnp.where(pos, sq, 1.0)), 0.0)


def mean_nearest(dist_BR: Array, ok_BR: Array, k: ArrayLike) -> Array:
  """Mean of the k smallest allowed distances of each row [B] (fewer when fewer are allowed;
  0 when none is). Novelty search's novelty of a descriptor against its reference set."""
  n_B = jnp.sum(ok_BR, axis=-1)
  k_B = jnp.minimum(jnp.asarray(k, jnp.int32), n_B)
  # Sort-free: the k-th smallest v, then Σ of the entries below v plus its needed copies.
  v_B, below_B, _ = ops.row_smallest_k(dist_BR, k_B, ok_BR)
  total = (jnp.sum(jnp.where(ok_BR & (dist_BR < v_B[:, None]), dist_BR, 0.0), axis=-1)
           + (k_B - below_B).astype(jnp.float32) * v_B)
  return jnp.where(k_B > 0, total / jnp.maximum(k_B, 1).astype(jnp.float32), 0.0)


def descriptor_key(desc_BD: Array) -> Array:
  """A fixed projection of each descriptor [B], used to order rows whose scores tie by their
  content (never by their position in the batch)."""
  d = desc_BD.shape[-1]
  w = jnp.cos(jnp.arange(d, dtype=jnp.float32) * 1.618034 + 0.5)
  return desc_BD @ w


def group_ranks(score_B: Array, key_B: Array, group_id: Array, valid_B: Array) -> Array:
  """Rank [B] of each valid row in its group by `score` descending, ties by `key` descending,
  then by row index (rows tied on both are interchangeable for the callers). O(B²)."""
  same = (group_id[:, None] == group_id[None, :]) & valid_B[:, None] & valid_B[None, :]
  s_i, s_j = score_B[:, None], score_B[None, :]
  k_i, k_j = key_B[:, None], key_B[None, :]
  idx = jnp.arange(score_B.shape[0])
  ahead = (s_j > s_i) | ((s_j == s_i) & ((k_j > k_i) | ((k_j == k_i) & (idx[None, :]
                                                                         < idx[:, None]))))
  return jnp.sum(same & ahead, axis=-1).astype(jnp.int32)


def archive_insert(state: ArchiveState, desc_BD: Array, pid_B: Array, rank_B: Array,
                   count_B: Array, insert_B: Array, per_group: int) -> ArchiveState:
  """Writes the `per_group` best-ranked rows of each group into its prompt's ring buffer.

  Row b (with `insert_B`) of rank r < per_group goes to slot (inserted_p + r) mod A of its
  prompt p; inserted_p grows by min(per_group, count of the group's valid rows) once per
  prompt. Rows with an out-of-range slot write nothing.
  """
  archive_PAD = jnp.asarray(state.archive, jnp.float32)
  inserted_P = jnp.asarray(state.inserted)
  p, a = archive_PAD.shape[0], archive_PAD.shape[1]
  ok_B = insert_B & (pid_B >= 0) & (pid_B < p)
  take_B = ok_B & (rank_B < per_group)
  base_B = inserted_P[jnp.clip(pid_B, 0, p - 1)]
  slot_B = jnp.mod(base_B + rank_B, a)
  row_B = jnp.where(take_B, pid_B, p)
  new_archive = archive_PAD.at[row_B, slot_B].set(desc_BD, mode="drop")
  # One writer per prompt: the group's first-ranked row adds the group's insertions.
  grow_B = jnp.minimum(count_B, per_group).astype(inserted_P.dtype)
  lead_B = jnp.where(ok_B & (rank_B == 0), pid_B, p)
  new_inserted = inserted_P.at[lead_B].add(grow_B, mode="drop")
  return ArchiveState(archive=new_archive, inserted=new_inserted)


def novelty_against_archive(desc_BD: Array, group_id: Array, valid_B: Array, pid_B: Array,
                            state: ArchiveState, k: ArrayLike) -> Array:
  """Novelty [B] of each valid row: the mean distance to its k nearest neighbours among the
  other valid rows of its group and the filled entries of its prompt's archive (0 for
  invalid rows and rows with no neighbour)."""
  archive_PAD = jnp.asarray(state.archive, jnp.float32)
  inserted_P = jnp.asarray(state.inserted)
  chex.assert_rank(archive_PAD, 3)
  chex.assert_rank(inserted_P, 1)
  p, a, d = archive_PAD.shape
  chex.assert_shape(desc_BD, (None, d))
  b = desc_BD.shape[0]
  in_range = (pid_B >= 0) & (pid_B < p)
  safe = jnp.clip(pid_B, 0, p - 1)
  arch_BAD = archive_PAD[safe]
  filled_B = jnp.where(in_range, jnp.minimum(inserted_P[safe], a), 0)
  arch_ok_BA = jnp.arange(a)[None, :] < filled_B[:, None]
  peers = (group_id[:, None] == group_id[None, :]) & valid_B[None, :] & ~jnp.eye(b, dtype=bool)
  dist_BR = jnp.concatenate([
      pair_distances(desc_BD, desc_BD[None]),
      pair_distances(desc_BD, arch_BAD)], axis=-1)
  ok_BR = jnp.concatenate([peers, arch_ok_BA], axis=-1) & valid_B[:, None]
  return jnp.where(valid_B, mean_nearest(dist_BR, ok_BR, k), 0.0)


class Novelty(NamedTuple):
  """What `novelty_scores` returns: per-row validity, group ids, the [B,T] mask, the novelty
  [B] and the archive after this batch's insertions."""
  valid: Array
  gid: Array
  mask: Array
  novelty: Array
  state: ArchiveState


def novelty_scores(fn: str, *, reward: ArrayLike, group_id: ArrayLike,
                   response_mask: ArrayLike, tokens: ArrayLike, prompt_id: ArrayLike,
                   state: ArchiveState, num_groups: int, group_size: int | None,
                   num_neighbors: ArrayLike, archive_add: int) -> Novelty:
  """The shared core of novelty search and SERENE: the rows, each row's novelty [B] against
  its group and its prompt's archive, and the archive after the `archive_add` most novel
  rows of each group were inserted."""
  check_int(fn, "archive_add", archive_add, minimum=0)
  reward_B, gid_B, mask_BT, valid_B = ops.group_rows(
      fn, reward, group_id, num_groups, group_size, response_mask=response_mask)
  del reward_B
  tok_BT = jnp.asarray(tokens)
  chex.assert_equal_shape([tok_BT, mask_BT])
  pid_B = jnp.asarray(prompt_id)
  chex.assert_rank(pid_B, 1)
  chex.assert_type(pid_B, int)
  chex.assert_equal_shape_prefix([pid_B, mask_BT], 1)
  pid_B = pid_B.astype(jnp.int32)
  archive = jnp.asarray(state.archive)
  chex.assert_rank(archive, 3)
  if archive_add > archive.shape[1]:
    raise ValueError(f"{fn}: archive_add={archive_add} exceeds the archive size "
                     f"{archive.shape[1]} of `state`; use a larger archive or add fewer")
  desc_BD = token_descriptors(tok_BT, mask_BT, archive.shape[2])
  nov_B = novelty_against_archive(desc_BD, gid_B, valid_B, pid_B, state,
                                             num_neighbors)
  rank_B = group_ranks(nov_B, descriptor_key(desc_BD), gid_B, valid_B)
  count_B = ops.group_count_rows(gid_B, valid_B, num_groups, group_size)
  new_state = archive_insert(state, desc_BD, pid_B, rank_B,
                                        count_B.astype(jnp.int32), valid_B, archive_add)
  return Novelty(valid=valid_B, gid=gid_B, mask=mask_BT, novelty=nov_B, state=new_state)
