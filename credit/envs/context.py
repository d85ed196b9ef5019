"""Long episodes under a context budget: the oldest observations dropped, the row = the final context.

`ContextSampler` is a `credit.envs.rollout.MultiTurnSampler` whose token budget
(`TurnLayout.max_total_tokens`, the actions and observations after the prompt) bounds the
*context*, not the episode. An episode plays on past it for up to `max_turns` turns:

1. Turns are played as usual until the room left after an action is less than one whole
   observation and one whole action (W_o + W_a; `MultiTurnSampler.context_reserve`). The
   episode's environment has answered that action; its observation is pending.
2. Compaction: the episode's context is rebuilt as prompt, every action (the tokens the
   policy drew), every observation, then the pending one, with the oldest observations
   replaced by `placeholder` (through the tokenizer's turn template, so a chat template keeps
   its tool-role tokens) until the context takes at most `compact_to` of the budget. The
   newest `keep_last` observations (the pending one included) are never replaced.
3. The compacted context is prefilled again and the episode continues from it
   (`MultiTurnSampler.continue_episodes`; all compacted rows of a call are continued in one
   batch, padded to B rows so the programs compile once). Back to 1 until the environment
   says done, `max_turns` turns have been played, or nothing is left to drop (the episode
   then ends `truncated`, as without context management).

Which context the training row holds. A token can only be scored under one context in a row
that the rollout contract's masks describe (one `attn_mask` per key, causal attention), but an
episode whose context was rewritten sampled its early and late actions under different
contexts. Two sound layouts exist: keep every token and hide a dropped observation from the
queries after its drop only (a per-query attention mask, which the scorer does not take), or
make the row the final context. This module does the second, so the contract is unchanged and
every scorer (the loss's, `logprob_old`, the reference) recomputes exactly what the sampler
drew:

* the row is the last compaction's context (prompt, earlier actions, kept observations and
  placeholders, all in `prompt_mask`: context, no gradient) followed by the turns played
  since (actions in `response_mask` with `turn_id`, observations in `obs_mask`);
* actions sampled before the last compaction saw observations the row no longer holds, so
  they are not trained; the per-turn arrays (`step_reward`, `turn_progress`, `turn_role`,
  `step_mask`, `tool_status`) still describe every turn of the episode, and `reward` is the
  environment's outcome of the whole episode;
* an episode that never reached the budget is exactly `MultiTurnSampler`'s.

The cost is the gradient of the compacted episodes' early turns; what is bought is a training
row bounded by the budget whatever the number of turns, with log-probs that equal the
sampler's (tested). Deviation from ASearcher (Gao et al., "Beyond Ten Turns: Unlocking
Long-Horizon Agentic Search with Large-Scale Asynchronous RL", arXiv 2508.07976): its
agents keep their whole history (up to 128 turns) or have an LLM summarise it; here a fixed
placeholder stands in for a dropped observation (the sliding-window form of context
management), because the context has to stay within a small model's budget.

Timings (`MultiTurnOutput.timings`) add `compactions` (re-prefills) and
`dropped_observations`; `trajectories` hold every turn's action and observation as first
shown (the pending observation of a compaction included).

>>> ms = ContextSampler(model, tokenizer=tok, layout=TurnLayout(24, 32, 24, 96, 768))  # doctest: +SKIP
>>> out = ms(nnx.state(model), envs, key=jax.random.key(0))                            # doctest: +SKIP
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np
from flax import nnx

from credit.envs.base import StepResult
from credit.envs.rollout import (ERROR_OBSERVATION, TOOL_OK, TOOL_TIMEOUT, MultiTurnOutput,
                                 MultiTurnSampler, Trajectory)

__all__ = ["PLACEHOLDER", "ContextSampler"]

# What a dropped observation becomes (characters every built-in tokenizer has).
PLACEHOLDER = "(dropped)"


class _Finished:
  """A padding row's environment: its episode ends at its first step."""

  def step(self, action: str) -> StepResult:
    del action
    return StepResult("", True, 0.0, 0.0, 0, {})

  def outcome(self) -> float:
    return 0.0


class ContextSampler(MultiTurnSampler):
  """A `MultiTurnSampler` whose token budget bounds the context (module docstring).

  Args (besides `MultiTurnSampler`'s):
    keep_last: the newest observations never dropped (>= 1).
    compact_to: a compaction leaves the context at most this share of the budget (0, 1].
    placeholder: the text a dropped observation is replaced by ("" = removed).
  """

  def __init__(self, model, *, keep_last: int = 1, compact_to: float = 0.5,
               placeholder: str = PLACEHOLDER, **kwargs):
    super().__init__(model, **kwargs)
    lay = self.layout
    if keep_last < 1:
      raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    if not 0.0 < compact_to <= 1.0:
      raise ValueError(f"compact_to must be in (0, 1], got {compact_to}")
    if lay.budget < 2 * lay.max_action_tokens + lay.max_observation_tokens:
      raise ValueError(f"the context budget ({lay.budget} tokens) must hold two actions and an "
                       f"observation ({2 * lay.max_action_tokens + lay.max_observation_tokens});"
                       " raise max_new_tokens")
    self.keep_last, self.compact_to, self.placeholder = keep_last, compact_to, placeholder
    self.context_reserve = lay.max_action_tokens + lay.max_observation_tokens

  # -- the row's blocks --------------------------------------------------------

  def _blocks(self, out: MultiTurnOutput, b: int, start: int, first_turn: int) -> list:
    """Row b's turns after column `start` as [(kind, ids, turn)]: kind "action" or "obs", an
    observation carrying the turn of the action before it."""
    n = int(out.lengths[b])
    blocks: list = []
    turn = first_turn - 1
    for j in range(start, n):
      kind = "action" if out.response_mask[b, j] else ("obs" if out.obs_mask[b, j] else None)
      if kind is None:
        raise AssertionError(f"row {b}: column {j} after the context is neither action nor "
                             "observation")
      if kind == "action":
        t = int(out.turn_id[b, j])
        if not blocks or blocks[-1][0] != "action" or blocks[-1][2] != t:
          blocks.append(["action", [], t])
          turn = t
      elif not blocks or blocks[-1][0] != "obs":
        blocks.append(["obs", [], turn])
      blocks[-1][1].append(int(out.tokens[b, j]))
    return blocks

  def _compact(self, prompt_ids: list[int], blocks: list) -> tuple[list[int], int] | None:
    """The compacted context (ids) and how many observations were dropped; None when even
    with every droppable observation dropped the context leaves no room for a turn."""
    lay = self.layout
    place = (self.turns.observation_ids(self.placeholder, lay.max_observation_tokens)
             if self.placeholder else [])
    size = lambda bl: sum(len(x[1]) for x in bl)
    obs = [i for i, x in enumerate(blocks) if x[0] == "obs" and not x[3]]
    droppable = obs[:max(0, len(obs) - self.keep_last)]
    target = int(self.compact_to * lay.budget)
    dropped = 0
    for i in droppable:
      if size(blocks) <= target:
        break
      if len(blocks[i][1]) > len(place):
        blocks[i][1], blocks[i][3] = list(place), True
        dropped += 1
    if size(blocks) + self.context_reserve > lay.budget:
      return None
    return prompt_ids + [t for x in blocks for t in x[1]], dropped

  # -- one call ----------------------------------------------------------------

  def __call__(self, model_state, envs: Sequence[Any], *, key: jax.Array,
               group_id: Sequence[int] | None = None, temperature: float = 1.0,
               top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
               refresh: Callable[[int], Any] | None = None,
               keep_snapshots: bool = False) -> MultiTurnOutput:
    if keep_snapshots:
      raise ValueError("ContextSampler does not keep snapshots (a compacted episode's saved "
                       "states would not match its row); use MultiTurnSampler")
    sample_kw = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    latest = [model_state]  # the newest parameters any turn has used (asynchronous RL)

    def track(turn: int):
      newer = refresh(turn)
      if newer is not None:
        latest[0] = newer
      return newer

    out = super().__call__(model_state, envs, key=key, group_id=group_id,
                           refresh=None if refresh is None else track, **sample_kw)
    B, K = len(envs), self.layout.max_turns
    arrays = {k: np.array(getattr(out, k)) for k in (
        "tokens", "prompt_mask", "response_mask", "obs_mask", "turn_id", "logprob_sampler",
        "logprob_raw", "step_reward", "turn_progress", "turn_role", "step_mask", "reward",
        "lengths", "truncated", "tool_status")}
    trajs = list(out.trajectories)
    timings = dict(out.timings, compactions=0, dropped_observations=0)
    # Per row: the prompt's ids and the blocks of every turn (obs blocks: [kind, ids, turn,
    # dropped]) as they now stand in the context.
    ctx_prompt = [out.tokens[b, :int(out.prompt_mask[b].sum())].tolist() for b in range(B)]
    ctx_blocks = [[x + [False] if x[0] == "obs" else x
                   for x in self._blocks(out, b, len(ctx_prompt[b]), 0)] for b in range(B)]
    seg = 0
    while True:
      rows, prefixes, turns_done = [], [], []
      for b in range(B):
        res = trajs[b].results[-1] if trajs[b].results else None
        turns = len(trajs[b].actions)
        if (not arrays["truncated"][b] or res is None or res.done or turns >= K
            or (arrays["tool_status"][b] == TOOL_TIMEOUT).any()):
          continue
        text = res.observation
        try:  # the pending observation, whole (the tokenizer's template around it)
          ids = self.turns.observation_ids(text, self.layout.max_observation_tokens)
        except ValueError:
          text = ERROR_OBSERVATION
          ids = self.turns.observation_ids(text, self.layout.max_observation_tokens)
        blocks = ctx_blocks[b] + [["obs", list(ids), turns - 1, False]]
        compacted = self._compact(ctx_prompt[b], blocks)
        if compacted is None:
          continue
        ctx_blocks[b] = blocks
        trajs[b] = trajs[b]._replace(
            observations=trajs[b].observations + [self.turns.observation_text(ids)])
        prefix, n_dropped = compacted
        timings["dropped_observations"] += n_dropped
        rows.append(b)
        prefixes.append(np.asarray(prefix, np.int32))
        turns_done.append(turns)
      if not rows:
        break
      seg += 1
      timings["compactions"] += len(rows)
      if refresh is not None:  # asynchronous RL: the newest parameters for the continuation
        track(min(turns_done))
      model_state = latest[0]
      if isinstance(model_state, nnx.Module):
        model_state = nnx.state(model_state)
      pad = B - len(rows)  # B rows every time: one compiled program per shape
      cont = self.continue_episodes(
          model_state, [envs[b] for b in rows] + [_Finished() for _ in range(pad)],
          prefixes + [prefixes[0]] * pad, turns_done + [turns_done[0]] * pad,
          [len(ctx_prompt[b]) for b in rows] + [len(ctx_prompt[rows[0]])] * pad,
          key=jax.random.fold_in(key, 7919 + seg), prompts=[trajs[b].prompt for b in rows]
          + [""] * pad, **sample_kw)
      for name in ("device_s", "env_s", "action_tokens", "observation_tokens", "tool_errors",
                   "tool_timeouts"):
        timings[name] += cont.timings[name]
      for r, b in enumerate(rows):
        # The context now: the compacted blocks, then the turns played since.
        ctx_blocks[b] = ctx_blocks[b] + [
            x + [False] if x[0] == "obs" else x
            for x in self._blocks(cont, r, len(prefixes[r]), turns_done[r])]
        for k in ("tokens", "prompt_mask", "response_mask", "obs_mask", "turn_id",
                  "logprob_sampler", "logprob_raw", "lengths", "truncated", "reward"):
          arrays[k][b] = getattr(cont, k)[r]
        played = cont.step_mask[r]
        for k in ("step_reward", "turn_progress", "turn_role", "step_mask", "tool_status"):
          arrays[k][b] = np.where(played, getattr(cont, k)[r], arrays[k][b])
        t = cont.trajectories[r]
        trajs[b] = Trajectory(trajs[b].prompt, trajs[b].actions + t.actions,
                              trajs[b].observations + t.observations,
                              trajs[b].results + t.results, t.outcome, t.truncated)
    return MultiTurnOutput(
        **{k: arrays[k] for k in ("tokens", "prompt_mask", "response_mask", "obs_mask",
                                  "turn_id", "logprob_sampler", "logprob_raw", "step_reward",
                                  "turn_progress", "turn_role", "step_mask", "reward",
                                  "lengths", "truncated")},
        group_id=out.group_id, trajectories=trajs, timings=timings, snapshots=None,
        tool_status=arrays["tool_status"])
