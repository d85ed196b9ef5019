"""SERENE: per-prompt alternation of novelty-search exploration and reward exploitation."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit._checks import check_int
from credit.advantages.shaping import _behaviour
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["SereneState", "SereneOutput", "serene_init_state", "serene_advantages"]

_PAPER = ("Sparse Reward Exploration via Novelty Search and Emitters (SERENE), GECCO 2021, "
          "arXiv 2102.03140")
_SOURCE = (_PAPER + "; also: Learning in Sparse Rewards settings through Quality-Diversity "
           "algorithms (G. Paolo, PhD thesis), arXiv preprint; code: GPaolo/SERENE@d875deeb "
           "core/searcher.py (chunk_step: a novelty-search chunk, then an emitter chunk once a "
           "reward was found), core/evolvers/emitter_evolver.py@83bc38a3 (init_emitters: "
           "reward > 0), core/evolvers/utils.py (calculate_novelties)")


class SereneState(NamedTuple):
  """Per-prompt archives and schedule, indexed by a stable prompt slot [P].

  archive, inserted: the novelty archive (`credit.advantages.shaping._behaviour.ArchiveState`);
  found: int32, nonzero once a response to the prompt earned a reward above the threshold;
  visits: int32, the number of steps the prompt was sampled in.
  """
  archive: Array
  inserted: Array
  found: Array
  visits: Array


class SereneOutput(NamedTuple):
  """`advantages` [B,T], the updated `state`, each row's `novelty` [B], and `exploit` [B]
  (1.0 where the row's prompt was in its exploitation phase, else 0.0)."""
  advantages: Array
  state: SereneState
  novelty: Array
  exploit: Array


def serene_init_state(num_prompts: int) -> SereneState:
  """Empty archives (32 descriptors of dimension 64), nothing found, no visits, for
  `num_prompts` prompt slots."""
  check_int("serene_init_state", "num_prompts", num_prompts)
  arch = _behaviour.archive_init_state(num_prompts)
  zeros = jnp.zeros((num_prompts,), jnp.int32)
  return SereneState(archive=arch.archive, inserted=arch.inserted, found=zeros, visits=zeros)


@register_estimator("serene",
                    needs=("reward", "group_id", "response_mask", "tokens", "prompt_id"),
                    paper=_PAPER, static_argnames=("num_groups", "group_size", "scale",
                                                   "archive_add"),
                    returns_output=True, init_state=serene_init_state,
                    confidence="inferred", source=_SOURCE)
def serene_advantages(*, reward: ArrayLike, group_id: ArrayLike, response_mask: ArrayLike,
                      tokens: ArrayLike, prompt_id: ArrayLike, state: SereneState,
                      num_groups: int, group_size: int | None = None,
                      reward_threshold: float = 0.0, num_neighbors: int = 15,
                      archive_add: int = 1, scale: bool = True,
                      eps: float = 1e-6) -> SereneOutput:
  """SERENE's alternation of exploration (novelty search) and exploitation (reward), per prompt.

  SERENE separates exploring the search space from exploiting the reward: a meta-scheduler
  alternates a budget chunk of novelty search (which ignores the reward) with a chunk of
  emitters, local reward optimisers started from every solution that earned a reward. Read
  per prompt, with one chunk per visit of the prompt::

    exploit_p = found_p ∧ (visits_p odd)                  (state before this step)
    A_i = z_g(R)_i            if exploit_p                 (GRPO on the reward: the emitters)
    A_i = z_g(n)_i            otherwise                    (novelty search)
    found_p ← found_p ∨ ∃ i of p: R_i > τ ;   visits_p ← visits_p + 1

  z_g is the group z-score ((x − mean_g x)/(std_g x + ε)) and n_i the novelty of the
  response: the mean distance of its behaviour descriptor to its k nearest neighbours among
  the other responses of its group and the prompt's archive (as `novelty_search`, whose
  archive update, the `archive_add` most novel responses of each group, runs in both
  phases). A prompt without a rewarded response keeps exploring; one with a reward
  alternates. A group of one valid row gets 0.

  Paper: "Sparse Reward Exploration via Novelty Search and Emitters" (SERENE), GECCO 2021,
  arXiv 2102.03140; part of "Learning in Sparse Rewards settings through Quality-Diversity
  algorithms" (G. Paolo's thesis). Schedule and novelty follow the SERENE code
  (GPaolo/SERENE, `Searcher.chunk_step`, `init_emitters`, `calculate_novelties`).

  What differs from the paper: SERENE evolves robot controller genomes with a learned or
  hand-made descriptor of the final observation; emitters are populations mutated around a
  rewarding genome, chosen by improvement and novelty, stopped on stagnation, with a
  reward archive. Here the policy gradient over a prompt's sampled responses is both the
  novelty search and the emitter, the descriptor is the hashed token-frequency vector (the
  learned image descriptors need an image model), the budget chunks become alternate visits
  of a prompt, and the emitters' selection, stagnation stop and reward archive are left out
  (a prompt that has found a reward alternates from then on).

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int32 group ids (unused with `group_size`).
    response_mask: [B,T] bool policy tokens.
    tokens: [B,T] int32 tokens; only those under `response_mask` enter the descriptors.
    prompt_id: [B] int32 slot in `state` of each row's prompt: stable across steps, constant
      within a group, distinct between the groups of one batch (rows outside [0, P) explore
      and update nothing).
    state: `SereneState` ([P,A,D] archive and [P] counters; `serene_init_state(P)`).
    num_groups: static number of groups.
    group_size: static G for contiguous groups (the same numbers as the segment path).
    reward_threshold: τ; a reward above it counts as found (the code's reward > 0).
    num_neighbors: k of the k-nearest-neighbour novelty (the code's default 15).
    archive_add: static number of responses per group added to the archive (at most the
      archive size).
    scale: static; divide by the group std (z-score) or only centre.
    eps: added to the group std.

  Returns:
    SereneOutput(advantages [B,T], state SereneState, novelty [B], exploit [B]).

  Example:
    >>> import numpy as np
    >>> kw = dict(group_id=np.zeros(3, np.int32), response_mask=np.ones((3, 2), bool),
    ...           prompt_id=np.zeros(3, np.int32), num_groups=1, num_neighbors=1,
    ...           tokens=np.array([[1, 1], [1, 2], [3, 3]], np.int32))
    >>> out = serene_advantages(reward=np.array([1., 0, 0]), state=serene_init_state(1), **kw)
    >>> np.round(np.asarray(out.advantages[:, 0], np.float64), 4).tolist()   # explores
    [-0.5773, -0.5773, 1.1547]
    >>> out = serene_advantages(reward=np.array([1., 0, 0]), state=out.state, **kw)
    >>> np.round(np.asarray(out.advantages[:, 0], np.float64), 4).tolist()   # exploits
    [1.1547, -0.5773, -0.5773]
  """
  arch = _behaviour.ArchiveState(archive=state.archive, inserted=state.inserted)
  core = _behaviour.novelty_scores("serene_advantages", reward=reward, group_id=group_id,
                                   response_mask=response_mask, tokens=tokens,
                                   prompt_id=prompt_id, state=arch, num_groups=num_groups,
                                   group_size=group_size, num_neighbors=num_neighbors,
                                   archive_add=archive_add)
  found_P = jnp.asarray(state.found)
  visits_P = jnp.asarray(state.visits)
  p = found_P.shape[0]
  pid_B = jnp.asarray(prompt_id).astype(jnp.int32)
  ok_B = core.valid & (pid_B >= 0) & (pid_B < p)
  safe = jnp.clip(pid_B, 0, p - 1)
  exploit_B = ok_B & (found_P[safe] > 0) & (jnp.mod(visits_P[safe], 2) == 1)
  reward_B = jnp.where(core.valid, jnp.asarray(reward, jnp.float32), 0.0)
  norm = lambda x: ops.group_normalize(x, core.gid, num_groups, valid=core.valid, scale=scale,
                                       eps=eps, group_size=group_size)
  adv_B = jnp.where(exploit_B, norm(reward_B), norm(core.novelty))
  hit_B = (ok_B & (reward_B > jnp.asarray(reward_threshold, jnp.float32))).astype(
      found_P.dtype)
  idx_B = jnp.where(ok_B, pid_B, p)
  new_found = found_P.at[idx_B].max(hit_B, mode="drop")
  new_visits = visits_P.at[idx_B].max(visits_P[safe] + 1, mode="drop")
  new_state = SereneState(archive=core.state.archive, inserted=core.state.inserted,
                          found=new_found, visits=new_visits)
  return SereneOutput(advantages=ops.broadcast_to_tokens(adv_B, core.mask), state=new_state,
                      novelty=core.novelty, exploit=exploit_B.astype(jnp.float32))
