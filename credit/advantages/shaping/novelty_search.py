"""Novelty search for sparse rewards: a novelty bonus against a per-prompt archive of behaviours."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.advantages.shaping import _behaviour
from credit.advantages.shaping._behaviour import ArchiveState
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["NoveltyOutput", "novelty_init_state", "novelty_search_advantages"]

_PAPER = ("Learning in Sparse Rewards settings through Quality-Diversity algorithms "
          "(G. Paolo, PhD thesis; novelty search, TAXONS, SERENE, STAX), arXiv preprint")
_SOURCE = (_PAPER + "; code: GPaolo/SERENE@d875deeb core/evolvers/utils.py "
           "(calculate_novelties, novelty: mean distance to the k nearest neighbours of the "
           "reference set), core/evolvers/emitter_evolver.py@83bc38a3 (get_novelty_ref_set, "
           "update_archive with the 'best' selection operator)")


class NoveltyOutput(NamedTuple):
  """`advantages` [B,T], the updated archive `state`, and each row's `novelty` [B]."""
  advantages: Array
  state: ArchiveState
  novelty: Array


def novelty_init_state(num_prompts: int) -> ArchiveState:
  """Empty archives (32 descriptors of dimension 64) for `num_prompts` prompt slots; call
  `credit.advantages.shaping._behaviour.archive_init_state` for other sizes."""
  return _behaviour.archive_init_state(num_prompts)


@register_estimator("novelty_search",
                    needs=("reward", "group_id", "response_mask", "tokens", "prompt_id"),
                    paper=_PAPER, static_argnames=("num_groups", "group_size", "scale",
                                                   "archive_add"),
                    returns_output=True, init_state=novelty_init_state,
                    confidence="inferred", source=_SOURCE)
def novelty_search_advantages(*, reward: ArrayLike, group_id: ArrayLike,
                              response_mask: ArrayLike, tokens: ArrayLike,
                              prompt_id: ArrayLike, state: ArchiveState, num_groups: int,
                              group_size: int | None = None, novelty_coef: float = 1.0,
                              num_neighbors: int = 15, archive_add: int = 1,
                              scale: bool = True, eps: float = 1e-6) -> NoveltyOutput:
  """Novelty search's novelty as a reward bonus, group-normalised, with a per-prompt archive.

  Novelty search rewards behaviour that differs from what has been seen: the novelty of a
  response is the mean distance of its behaviour descriptor φ to its k nearest neighbours in
  the reference set (the other responses of its group and the archive of earlier responses
  to the same prompt). With a sparse reward this gives a gradient where every response
  fails. Per row i of prompt p::

    ρ_i = {φ_j : j in i's group, j ≠ i} ∪ archive_p        (reference set)
    n_i = mean of the k smallest ‖φ_i − φ‖₂ over φ ∈ ρ_i   (fewer if |ρ_i| < k; 0 if empty)
    R'_i = R_i + β n_i
    A_i = (R'_i − mean_g R') / (std_g R' + ε)              (GRPO on the shaped reward)

  Then the `archive_add` most novel responses of each group (the code's "best" selection,
  ties broken by descriptor content) enter the prompt's archive, a ring buffer of A
  entries: the state holds, per prompt slot, the archive [P,A,D] and the count of
  insertions. φ is the response's token-frequency vector hashed into D buckets (D is the
  state's last dimension). A group of one valid row gets 0.

  Paper: "Learning in Sparse Rewards settings through Quality-Diversity algorithms"
  (G. Paolo's thesis: novelty search, TAXONS, SERENE); the novelty and archive rules follow
  the SERENE code (GPaolo/SERENE, `calculate_novelties`, `update_archive`).

  What differs from the thesis: novelty search there evolves a population of controller
  genomes for robots, with descriptors of the final observation (learned by an autoencoder
  in TAXONS, or a signature transform of the trajectory); the genomes, mutation and
  selection are replaced here by the policy gradient over a prompt's sampled responses, and
  the learned image descriptors (which need an image model) by hashed token frequencies.
  Pure novelty search ignores the reward; the shaped reward R + β·n is the
  quality-diversity form (β = 0 gives GRPO, with the archive still updated). The archive
  is per prompt and bounded (the code's is global and grows); the "random" selection
  operator is left out (it needs a key).

  Args:
    reward: [B] float outcome rewards.
    group_id: [B] int32 group ids (unused with `group_size`).
    response_mask: [B,T] bool policy tokens.
    tokens: [B,T] int32 tokens; only those under `response_mask` enter the descriptors.
    prompt_id: [B] int32 slot in `state` of each row's prompt: stable across steps,
      constant within a group, distinct between the groups of one batch (rows outside
      [0, P) use no archive and insert nothing).
    state: `ArchiveState` ([P,A,D] archive, [P] insertions; `novelty_init_state(P)`).
    num_groups: static number of groups.
    group_size: static G for contiguous groups (the same numbers as the segment path).
    novelty_coef: β, the weight of the novelty bonus.
    num_neighbors: k of the k-nearest-neighbour novelty (the code's default 15).
    archive_add: static number of responses per group added to the archive (the code's
      λ); at most the archive size.
    scale: static; divide by the group std of the shaped reward (GRPO) or not.
    eps: added to the group std.

  Returns:
    NoveltyOutput(advantages [B,T], state ArchiveState, novelty [B]).

  Example:
    >>> import numpy as np
    >>> state = novelty_init_state(1)
    >>> kw = dict(group_id=np.zeros(3, np.int32), response_mask=np.ones((3, 2), bool),
    ...           prompt_id=np.zeros(3, np.int32), num_groups=1, num_neighbors=1)
    >>> tokens = np.array([[1, 1], [1, 2], [3, 3]], np.int32)
    >>> out = novelty_search_advantages(reward=np.zeros(3), tokens=tokens, state=state, **kw)
    >>> np.round(np.asarray(out.novelty, np.float64), 4).tolist()
    [0.7071, 0.7071, 1.2247]
    >>> np.round(np.asarray(out.advantages[:, 0], np.float64), 4).tolist()
    [-0.5773, -0.5773, 1.1547]
    >>> int(out.state.inserted[0])
    1
  """
  core = _behaviour.novelty_scores("novelty_search_advantages", reward=reward, group_id=group_id,
                        response_mask=response_mask, tokens=tokens, prompt_id=prompt_id,
                        state=state, num_groups=num_groups, group_size=group_size,
                        num_neighbors=num_neighbors, archive_add=archive_add)
  reward_B = jnp.where(core.valid, jnp.asarray(reward, jnp.float32), 0.0)
  shaped_B = reward_B + jnp.asarray(novelty_coef, jnp.float32) * core.novelty
  adv_B = ops.group_normalize(shaped_B, core.gid, num_groups, valid=core.valid, scale=scale,
                              eps=eps, group_size=group_size)
  return NoveltyOutput(advantages=ops.broadcast_to_tokens(adv_B, core.mask),
                       state=core.state, novelty=core.novelty)
