"""Local re-rollouts from saved intermediate states of episodes (Memory-R2's LoGo-GRPO groups).

Memory-R2 (arXiv 2605.21768, https://github.com/ahmedehabb/Memory-R2) compares full episodes
of a prompt (global groups) and, to compare continuations fairly, several continuations
re-rolled from one saved intermediate state (local groups); see
`credit.advantages.turn.logo` and its docs page. This module makes the
local rows in the multi-turn engine:

1. the B episodes are played with `MultiTurnSampler(..., keep_snapshots=True)`, which keeps
   each environment's `snapshot()` after every turn that did not end its episode;
2. `choose_branch_points` picks, deterministically from a seed, P distinct episodes that took
   at least 2 turns and, for each, a turn boundary k >= 1 (uniform over those whose turn k
   has a token): the state after its first k turns, where the episode was still running;
3. `local_rollouts` restores L fresh environments of the episode's example to that snapshot
   and plays L continuations (`MultiTurnSampler.continue_episodes`: the prefix — prompt,
   turns < k and their observations, token for token as the episode had them — is the
   context, once for the L siblings, whose rows share its cache: copied from the episodes'
   kept cache when they were played with `keep_cache=True`, else prefilled again; then
   turns k, k+1, ... are sampled to the end of the episode).

The batch is the B episodes followed by P·L local rows (static: `num_parents` × `local_size`),
siblings of one parent contiguous. Row fields: `parent_id` −1 for an episode, the parent
episode's row index for its local rows (the id of the saved state); `prefix_len` 0 for an
episode, the prefix's length for a local row (the column where it departs; a `credit.trees`
layout: parents first, same prompt group); `group_id` the parent's prompt group; the local
rows' loss tokens are their own continuation only (`response_mask`; the prefix is in
`prompt_mask`, context, never trained twice); `reward` their own verified outcome. When fewer
than P episodes have a boundary (episodes of one turn), the remaining slots are padding rows:
the first episode's prompt, no response token, parent_id −1, reward 0 — invalid rows that
every estimator zeroes and no group statistic counts.

The local-group structure (siblings re-rolled from one saved state, their own outcomes, the
parent's prompt group, local rows outside the global statistics) follows the paper's abstract
and the authors' local normalisation. Ours, not from the paper or its code (neither says how
Memory-R2 picks the states): the choice
of states (uniform over episodes with a boundary, then uniform over their boundaries), P and
L, the padding rows, and the prefix's cache taken once per saved state from the first
rollout's cache (or prefilled again; either way the continuation's log-probs equal one forward
pass over the whole row, tested).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from credit.envs.rollout import MultiTurnOutput, MultiTurnSampler, Trajectory

Array = jax.Array

__all__ = ["LocalRollouts", "choose_branch_points", "local_rollouts", "turn_tokens"]


class LocalRollouts(NamedTuple):
  """B episodes and their P·L local rows (B' = B + P·L rows).

  Attributes:
    out: the rows as a `MultiTurnOutput` (episodes first; `snapshots` None).
    parent_id: [B'] int32, −1 for an episode (and a padding row), else the row index of the
      parent episode.
    prefix_len: [B'] int32, 0 for an episode, else the length of the shared prefix.
    branch_turn: [B'] int32, the turn k a local row starts at (−1 for an episode).
    parents: [P] int, the parent row of each slot (−1: a padding slot).
    num_local: real local rows (P·L less the padding).
  """
  out: MultiTurnOutput
  parent_id: np.ndarray
  prefix_len: np.ndarray
  branch_turn: np.ndarray
  parents: np.ndarray
  num_local: int


def choose_branch_points(has_turn: np.ndarray, num_parents: int, seed: int
                         ) -> tuple[np.ndarray, np.ndarray]:
  """P parent rows and their boundaries k, deterministic from `seed`.

  `has_turn[b, k]` [B,K] bool (`turn_tokens`): turn k of episode b took place with at least
  one action token (`turn_id` of the episode holds k). Boundary k >= 1 of row b is valid
  when its turn k is: the episode was still running after its first k turns, and the prefix
  ends where turn k's first token stands. A row is eligible when it has a valid boundary; parents are
  distinct eligible rows drawn without replacement (sorted), each with a boundary uniform
  over its valid ones. Slots beyond the eligible rows get parent −1 and k −1.

  Returns:
    (rows [P] int64, turns [P] int64).
  """
  tt = np.asarray(has_turn, bool)
  if tt.ndim != 2:
    raise ValueError(f"has_turn must be [B,K], got shape {tt.shape}")
  if num_parents < 1:
    raise ValueError(f"num_parents must be >= 1, got {num_parents}")
  ok = tt.copy()
  ok[:, 0] = False  # k >= 1: the prefix holds at least one turn
  eligible = np.flatnonzero(ok.any(1))
  rng = np.random.default_rng(seed)
  m = min(num_parents, eligible.size)
  rows = np.full(num_parents, -1, np.int64)
  turns = np.full(num_parents, -1, np.int64)
  if m:
    rows[:m] = np.sort(rng.choice(eligible, size=m, replace=False))
    for i in range(m):
      valid = np.flatnonzero(ok[rows[i]])
      turns[i] = valid[rng.integers(valid.size)]
  return rows, turns


def turn_tokens(turn_id: np.ndarray, num_turns: int) -> np.ndarray:
  """[B,K] bool: turn k of row b has at least one token in `turn_id` [B,T]."""
  tid = np.asarray(turn_id)
  return (tid[:, :, None] == np.arange(num_turns)[None, None]).any(1)


def _concat(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  return np.concatenate([a, b.astype(a.dtype)], axis=0)


def local_rollouts(sampler: MultiTurnSampler, model_state, episodes: MultiTurnOutput,
                   make_env: Callable[[int], Any], *, num_parents: int, local_size: int,
                   key: Array, temperature: float = 1.0, top_k: int = 0,
                   top_p: float = 1.0) -> LocalRollouts:
  """Adds `num_parents` × `local_size` re-rollouts from saved states to B episodes.

  Args:
    sampler: the `MultiTurnSampler` that played `episodes`.
    model_state: the policy's state (the same parameters as the episodes', for on-policy
      local groups).
    episodes: B episodes from `sampler(..., keep_snapshots=True)`.
    make_env: `make_env(b)` -> a fresh environment of row b's example (reset here, then
      restored to the saved state).
    num_parents: P, saved states re-rolled per call (static: the batch has B + P·L rows).
    local_size: L >= 1 continuations of each.
    key: PRNG key; the choice of states and the continuations' sampling derive from it.

  Returns:
    `LocalRollouts`.
  """
  if episodes.snapshots is None:
    raise ValueError("local_rollouts needs the episodes' snapshots: play them with "
                     "keep_snapshots=True")
  if local_size < 1:
    raise ValueError(f"local_size must be >= 1, got {local_size}")
  B, T = episodes.tokens.shape
  K = episodes.step_mask.shape[1]
  seed = int(jax.random.randint(jax.random.fold_in(key, 0), (), 0, np.iinfo(np.int32).max))
  parents, turns = choose_branch_points(turn_tokens(episodes.turn_id, K), num_parents,
                                        seed)
  slot_rows = np.repeat(parents, local_size)      # [P·L] the parent row of each local row
  slot_turns = np.repeat(turns, local_size)
  live = np.flatnonzero(slot_rows >= 0)
  R = int(live.size)
  PL = num_parents * local_size

  # Rows of the continuation call: the real local rows.
  envs, prefixes, first, plen, prompts = [], [], [], [], []
  for i in live:
    b, k = int(slot_rows[i]), int(slot_turns[i])
    col = int(np.flatnonzero(episodes.turn_id[b] == k)[0])  # first token of turn k
    env = make_env(b)
    env.reset()
    env.restore(episodes.snapshots[b][k - 1])
    envs.append(env)
    prefixes.append(episodes.tokens[b, :col])
    first.append(k)
    plen.append(int(episodes.prompt_mask[b].sum()))
    prompts.append(episodes.trajectories[b].prompt)
  cont = None
  if R:
    # From the episodes' kept cache when they were played with keep_cache=True.
    parent = None if episodes.kept is None else (episodes.kept, slot_rows[live])
    cont = sampler.continue_episodes(
        model_state, envs, prefixes, first, plen, key=jax.random.fold_in(key, 1),
        group_id=episodes.group_id[slot_rows[live]], temperature=temperature, top_k=top_k,
        top_p=top_p, prompts=prompts, parent=parent)

  # The P·L local rows: continuations where a slot is real, padding rows elsewhere.
  pad = episodes.tokens[0] * episodes.prompt_mask[0] + sampler.pad_id * ~episodes.prompt_mask[0]
  loc = {
      "tokens": np.tile(pad.astype(np.int32), (PL, 1)),
      "prompt_mask": np.tile(episodes.prompt_mask[0], (PL, 1)),
      "response_mask": np.zeros((PL, T), bool), "obs_mask": np.zeros((PL, T), bool),
      "turn_id": np.full((PL, T), -1, np.int32),
      "logprob_sampler": np.zeros((PL, T), np.float32),
      "logprob_raw": np.zeros((PL, T), np.float32),
      "group_id": np.full(PL, episodes.group_id[0], np.int32),
      "step_reward": np.zeros((PL, K), np.float32), "turn_progress": np.zeros((PL, K), np.float32),
      "turn_role": np.zeros((PL, K), np.int32), "step_mask": np.zeros((PL, K), bool),
      "reward": np.zeros(PL, np.float32),
      "lengths": np.full(PL, int(episodes.prompt_mask[0].sum()), np.int32),
      "truncated": np.zeros(PL, bool), "tool_status": np.zeros((PL, K), np.int8)}
  trajs = [Trajectory(episodes.trajectories[0].prompt, [], [], [], 0.0, False)] * PL
  if cont is not None:
    for name in loc:
      loc[name][live] = getattr(cont, name)
    for j, i in enumerate(live):
      b, k = int(slot_rows[i]), int(slot_turns[i])
      p, c = episodes.trajectories[b], cont.trajectories[j]
      trajs[i] = Trajectory(p.prompt, p.actions[:k] + c.actions,
                            p.observations[:k] + c.observations, p.results[:k] + c.results,
                            c.outcome, c.truncated)
  merged = {name: _concat(getattr(episodes, name), loc[name]) for name in loc}
  timings = dict(episodes.timings)
  if cont is not None:
    for name, v in cont.timings.items():
      timings[name] = timings.get(name, 0) + v
  out = MultiTurnOutput(**merged, trajectories=list(episodes.trajectories) + trajs,
                        timings=timings, snapshots=None)
  parent_id = np.concatenate([np.full(B, -1, np.int32), slot_rows.astype(np.int32)])
  prefix_len = np.zeros(B + PL, np.int32)
  prefix_len[B + live] = [len(p) for p in prefixes]
  branch_turn = np.concatenate([np.full(B, -1, np.int32), slot_turns.astype(np.int32)])
  return LocalRollouts(out, parent_id, prefix_len, branch_turn, parents, R)
