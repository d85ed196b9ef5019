"""Multi-turn rollouts: the jitted KV-cache sampler driven turn by turn by host-side environments.

Every row b of the batch is one episode. Turn k: the policy samples an action (until a stop
token or the per-turn budget), the host decodes it to text, `env.step(text)` answers with an
observation, the observation's tokens are appended, and the next turn continues from the cache.
The cache is never recomputed: each token (prompt, action, observation) is fed through the model
once.

Buffer and cache layout (one column = one cache slot; all rows write the same slot at each step,
as in `credit.sampling`):

    [ prompt P | turn 0: action W_a | obs W_o | turn 1: action W_a | obs W_o | ... ]

with P the prompt width (prompts right-aligned in it, pads first), W_a = `max_action_tokens`,
W_o = `max_observation_tokens`.
A turn's unused action slots and an observation's unused slots stay invalid in the cache, so
attention skips them, and RoPE positions count only valid tokens (a row's position after its
prompt, actions and observations is exactly its length in the compacted trajectory). Hence the
log-probs of the actions equal a plain forward pass over the concatenated trajectory (tested).

Per turn, three jitted programs (compiled once, the turn index is data):

1. `decode` (`credit.sampling.decode`, with the turn's first column as `prompt_width`): draws the
   action tokens; a stop token ends the row's turn;
2. a catch-up feed: the token drawn at the loop's last step is written to the cache;
3. `observe`: the observation tokens [B, W_o] are fed as one chunk at the observation block, and
   the first token of the next turn is drawn from the last valid observation position.

Limits: `max_turns` (K), `max_action_tokens` per turn, `max_observation_tokens` per observation
(longer observations are truncated), `max_total_tokens` per episode (prompt excluded): the action
budget of a turn is what is left, an observation is cut to what is left, and an episode that has
used it all ends (`truncated`). An episode also ends when its environment says done or at K turns.

Output (`MultiTurnOutput`, right-padded to T = P + max_total_tokens in the rollout contract):
`response_mask` on the policy's tokens only (stop tokens included), `obs_mask` on observation
tokens, `turn_id` (turn of each policy token, −1 elsewhere), per-turn arrays [B,K] from the
environments (`step_reward`, `turn_progress`, `turn_role`, `step_mask` = the turn took place),
`reward` = the environment's outcome, `logprob_sampler`/`logprob_raw` on policy tokens.
Observation tokens never receive policy gradient: they are outside `response_mask`.

Saved states (Memory-R2's local re-rollouts, `credit.envs.branching`): with
`keep_snapshots=True` the sampler keeps each environment's `snapshot()` after every turn that
did not end its episode; `continue_episodes` plays episodes on from such a state, given the
episode's tokens up to there (the context, once for the neighbouring rows that continue the
same state: copied from the episodes' cache when they were played with `keep_cache=True`,
else prefilled again; then turns k, k+1, ... as above).
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from credit import parallel, sampling
from credit.contract import Rollout
from credit.envs.base import StepResult
from credit.envs.calls import Call, call_all
from credit.envs.chat import turn_template

Array = jax.Array

__all__ = ["MultiTurnOutput", "MultiTurnSampler", "TurnLayout", "Trajectory"]

# Column kinds of the internal buffer.
_PAD, _PROMPT, _ACTION, _OBS = 0, 1, 2, 3
# `MultiTurnOutput.tool_status` values: the turn's environment step went well, raised or gave a
# malformed result, or ran past its time limit.
TOOL_OK, TOOL_ERROR, TOOL_TIMEOUT = 0, 1, 2
# Observations shown to the policy after a failed step (characters every built-in tokenizer
# has); the details are in the turn's `info["tool_error"]`.
ERROR_OBSERVATION = "error: tool failed"
TIMEOUT_OBSERVATION = "error: tool timed out"


@dataclasses.dataclass(frozen=True)
class TurnLayout:
  """Static sizes of a multi-turn rollout (hashable: a jit static argument).

  Attributes:
    prompt_width: P, prompt columns (prompts are right-aligned into them).
    max_turns: K, policy turns per episode.
    max_action_tokens: W_a, tokens of one policy turn (stop token included).
    max_observation_tokens: W_o, tokens of one observation (longer ones are truncated).
    max_total_tokens: budget of actions + observations per episode (None: K·(W_a+W_o)).
  """
  prompt_width: int
  max_turns: int
  max_action_tokens: int
  max_observation_tokens: int
  max_total_tokens: int | None = None

  def __post_init__(self):
    for name in ("prompt_width", "max_turns", "max_action_tokens", "max_observation_tokens"):
      v = getattr(self, name)
      if not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"TurnLayout.{name} must be a positive int, got {v!r}")
    if self.max_total_tokens is not None and self.max_total_tokens < 1:
      raise ValueError(f"TurnLayout.max_total_tokens must be >= 1, got {self.max_total_tokens}")

  def device(self) -> "TurnLayout":
    """The layout the jitted programs see: the budget is enforced on the host, so runs that
    differ only in `max_total_tokens` share compiled programs."""
    return dataclasses.replace(self, max_total_tokens=None)

  @property
  def turn_width(self) -> int:
    return self.max_action_tokens + self.max_observation_tokens

  @property
  def buffer_width(self) -> int:
    """Columns (= cache slots) of the internal buffer."""
    return self.prompt_width + self.max_turns * self.turn_width

  @property
  def budget(self) -> int:
    full = self.max_turns * self.turn_width
    return full if self.max_total_tokens is None else min(self.max_total_tokens, full)

  @property
  def output_width(self) -> int:
    """T of the output arrays: prompt plus the episode budget."""
    return self.prompt_width + self.budget

  def action_column(self, k: int) -> int:
    return self.prompt_width + k * self.turn_width

  def observation_column(self, k: int) -> int:
    return self.action_column(k) + self.max_action_tokens


class Trajectory(NamedTuple):
  """Host-side record of one episode: the texts and what the environment reported per turn."""
  prompt: str
  actions: list
  observations: list
  results: list
  outcome: float
  truncated: bool


class MultiTurnOutput(NamedTuple):
  """Multi-turn rollouts in the rollout contract (numpy, right-padded to T).

  Attributes:
    tokens: [B,T] int32, prompt, then actions and observations interleaved, pads after.
    prompt_mask, response_mask, obs_mask: [B,T] bool: prompt, policy (action) and
      environment (observation) tokens; disjoint.
    turn_id: [B,T] int32, turn of each policy token, −1 elsewhere.
    group_id: [B] int32.
    logprob_sampler, logprob_raw: [B,T] f32 on policy tokens (0 elsewhere).
    step_reward, turn_progress: [B,K] f32, the environment's per-turn reward and progress.
    turn_role: [B,K] int32. step_mask: [B,K] bool, the turns that took place.
    reward: [B] f32, the environment's outcome.
    lengths: [B] int32, valid tokens of each row.
    truncated: [B] bool, the episode ended by the token budget (not by its environment or K).
    trajectories: per-row `Trajectory` texts and results.
    timings: seconds spent sampling on the device and stepping environments on the host,
      and the token counts.
    snapshots: with `keep_snapshots=True`, per row the environment's `snapshot()` after each
      turn that did not end the episode (`snapshots[b][k]`: the state after turns 0..k), the
      saved states `continue_episodes` re-rolls from; else None.
    tool_status: [B,K] int8, how turn k's environment step went: `TOOL_OK`, `TOOL_ERROR` (it
      raised, returned a malformed result or an observation the tokenizer cannot encode;
      the policy saw `ERROR_OBSERVATION` and the episode went on) or `TOOL_TIMEOUT` (it ran
      past `step_timeout_s`; the episode ended there, with reward 0). Counts in `timings`
      (`tool_errors`, `tool_timeouts`).
    kept: with `keep_cache=True`, the KV cache the episodes ended with and the cache slot of
      each output column (`credit.sampling.RowCache`, device arrays, rows padded for the
      mesh), from which `continue_episodes(parent=...)` continues saved states; else None.
  """
  tokens: np.ndarray
  prompt_mask: np.ndarray
  response_mask: np.ndarray
  obs_mask: np.ndarray
  turn_id: np.ndarray
  group_id: np.ndarray
  logprob_sampler: np.ndarray
  logprob_raw: np.ndarray
  step_reward: np.ndarray
  turn_progress: np.ndarray
  turn_role: np.ndarray
  step_mask: np.ndarray
  reward: np.ndarray
  lengths: np.ndarray
  truncated: np.ndarray
  trajectories: list
  timings: dict
  snapshots: list | None = None
  tool_status: np.ndarray | None = None
  kept: Any = None

  def rollout(self) -> Rollout:
    """The contract `Rollout` (extras: prompt_mask, logprob_raw)."""
    return Rollout(tokens=self.tokens, response_mask=self.response_mask, obs_mask=self.obs_mask,
                   turn_id=self.turn_id, group_id=self.group_id,
                   logprob_sampler=self.logprob_sampler, step_reward=self.step_reward,
                   step_mask=self.step_mask, turn_progress=self.turn_progress,
                   turn_role=self.turn_role, reward=self.reward,
                   extras={"prompt_mask": self.prompt_mask, "logprob_raw": self.logprob_raw})


# --------------------------------------------------------------------------
# Jitted pieces (model given as graphdef + state, so the caller's params are a pytree).
# --------------------------------------------------------------------------


def _turn_keys(key_B: Array, k: Array) -> Array:
  return jax.vmap(jax.random.fold_in, in_axes=(0, None))(key_B, k)


def _start(graphdef, model_state, prompt_tokens, prompt_mask, key, max_new_B, params, *,
           layout: TurnLayout, pad_id: int, cache_dtype, share: int = 1, mesh=None, rules=None):
  """Prefill of the prompts into a cache of `layout.buffer_width` slots; draws turn 0's token 0.
  With `share` = k, each of the B/k prompts is prefilled once for its k rows."""
  model = nnx.merge(graphdef, model_state)
  extra = layout.buffer_width - layout.prompt_width
  state = sampling.prefill(model, prompt_tokens=prompt_tokens, prompt_mask=prompt_mask,
                           key=key, max_new_tokens=extra, max_new_B=max_new_B, params=params,
                           pad_id=pad_id, cache_dtype=cache_dtype, share=share, mesh=mesh,
                           rules=rules)
  return state


def _start_from(graphdef, model_state, parent, parent_rows, prompt_tokens, prompt_mask, key,
                max_new_B, params, *, layout: TurnLayout, pad_id: int, share: int = 1, mesh=None,
                rules=None):
  """`_start` for prefixes already in an earlier call's cache (`parent`, a `RowCache`): their
  keys/values are copied, only each prefix's last token is fed (`prefill_from_parent`)."""
  model = nnx.merge(graphdef, model_state)
  return sampling.prefill_from_parent(
      model, parent=parent, parent_rows=parent_rows, prompt_tokens=prompt_tokens,
      prompt_mask=prompt_mask, key=key, max_new_tokens=layout.buffer_width - layout.prompt_width,
      max_new_B=max_new_B, params=params, pad_id=pad_id, share=share, mesh=mesh, rules=rules)


def _run_turn(graphdef, model_state, state: sampling.SamplingState, params, *,
              layout: TurnLayout, mesh=None, rules=None):
  """Decodes the rest of a turn, then feeds its last drawn token into the cache."""
  model = nnx.merge(graphdef, model_state)
  state = sampling.decode(model, state, params, max_new_tokens=layout.max_action_tokens,
                          mesh=mesh, rules=rules)
  # The loop drew `step` tokens and fed all but the last one; feed it (valid only for the rows
  # that really sampled it), so every action token is in the cache before the observation.
  _, cache = sampling.feed_last(model, state, return_hidden=True)
  return sampling.shard_rows(state.replace(cache=cache), mesh, rules)


def shared_run(tokens_BP: np.ndarray, mask_BP: np.ndarray) -> int:
  """The largest k such that every block of k consecutive rows holds one prefix (the same
  valid tokens at the same columns): G episodes of a prompt, L continuations of one saved
  state. 1 when no two neighbouring rows agree."""
  tok = np.where(mask_BP, tokens_BP, -1)
  same = (tok[1:] == tok[:-1]).all(1)
  starts = np.flatnonzero(np.concatenate([[True], ~same]))
  return int(np.gcd.reduce(np.diff(np.append(starts, tok.shape[0]))))


def _observe(graphdef, model_state, state: sampling.SamplingState, obs_BO, obs_mask_BO,
             active_B, max_new_B, turn, params, *, layout: TurnLayout, mesh=None, rules=None):
  """Feeds the observations of turn `turn` (one chunk at its observation block) and draws the
  first token of turn `turn + 1` from each row's last observation token."""
  model = nnx.merge(graphdef, model_state)
  B, O = obs_BO.shape
  obs_col = layout.prompt_width + turn * layout.turn_width + layout.max_action_tokens
  before_B = state.prompt_len_B + state.num_new_B  # valid tokens so far
  positions_BO = before_B[:, None] + jnp.maximum(jnp.cumsum(obs_mask_BO, axis=1) - 1, 0)
  cache = state.cache.replace(index=jnp.asarray(obs_col, jnp.int32))
  hidden_BOD, cache = model(obs_BO, positions_BO.astype(jnp.int32), mask_BT=obs_mask_BO,
                            cache=cache, return_hidden=True)
  n_obs_B = jnp.sum(obs_mask_BO, axis=1, dtype=jnp.int32)
  last_B = jnp.maximum(n_obs_B - 1, 0)
  h_BD = jnp.take_along_axis(hidden_BOD, last_B[:, None, None], axis=1)[:, 0]
  logits_BV = model.logits(h_BD[:, None])[:, 0]
  tokens_BL = jax.lax.dynamic_update_slice(
      state.tokens_BL, jnp.where(obs_mask_BO, obs_BO, state.pad_id).astype(jnp.int32),
      (0, obs_col))
  next_col = obs_col + layout.max_observation_tokens
  nxt = state.replace(
      step=jnp.zeros((), jnp.int32), tokens_BL=tokens_BL, cache=cache,
      done_B=~active_B | (max_new_B <= 0), finished_B=jnp.zeros((B,), bool),
      num_new_B=jnp.zeros((B,), jnp.int32), max_new_B=max_new_B,
      prompt_len_B=before_B + n_obs_B, key_B=_turn_keys(state.key_B, turn + 1),
      prompt_width=jnp.asarray(next_col, jnp.int32))
  return sampling.shard_rows(sampling._record(nxt, logits_BV, params), mesh, rules)


# --------------------------------------------------------------------------
# Host driver.
# --------------------------------------------------------------------------


class MultiTurnSampler:
  """Samples multi-turn episodes of B environments with one policy.

  >>> ms = MultiTurnSampler(model, tokenizer=tok, layout=TurnLayout(32, 3, 16, 16))  # doctest: +SKIP
  >>> out = ms(nnx.state(model), envs, key=jax.random.key(0), temperature=1.0)       # doctest: +SKIP

  `envs` is a sequence of B environments with `reset() -> str` and `step(action: str) ->` a
  result with `observation`, `done`, `reward`, `progress` and `role` (`credit.envs.base`), and
  `outcome() -> float`. Rows n·G..n·G+G−1 of a group share a prompt (`group_id`).

  `refresh(k)`, when given, is called before turn k ≥ 1 (after turn k−1's observations are
  known); a model state it returns replaces the current one from there on: the observation
  of turn k−1 and every later token are computed with it (AReaL's interruptible rollouts,
  at turn granularity). The cache of the earlier turns keeps what the older parameters
  computed; `logprob_sampler` records the distribution each token was actually drawn from,
  which is what a decoupled objective needs as the behaviour policy.

  `keep_snapshots=True` records the environments' snapshots after each continuing turn
  (`MultiTurnOutput.snapshots`; environments with `snapshot()`); `continue_episodes` re-rolls
  from them.

  Turns become tokens through the tokenizer's `credit.envs.chat.turn_template`: with a chat
  template, the prompt, each observation (in the template's tool role) and the generation
  prompt before every policy turn are the template's; the character tokenizer keeps the
  plain layout (bos + prompt, action + eos, observation text).

  The B environments of a turn are stepped concurrently (`credit.envs.calls.call_all`): at
  most `max_concurrent_steps` at a time, each allowed `step_timeout_s` seconds. A step that
  raises or returns a malformed result gives the policy `ERROR_OBSERVATION` and the episode
  goes on; one that runs past its time ends its episode (the environment is not called
  again); either way the row is flagged in `MultiTurnOutput.tool_status` and the run goes on.
  Results are laid out by row, so they do not depend on which step finished first.
  Environments with `parallel_steps = False` (e.g. ones that call the policy themselves) are
  stepped one after another in row order on the calling thread, with no time limit.

  On a mesh (`mesh`, or the one the parameters were placed on), the rows sit on the mesh's
  batch axes and every device decodes its own (padded with finished rows to an even split;
  `credit.sampling.Sampler`); only the tokens the environments read come to the host. A
  prefix held by k neighbouring rows (G episodes of a prompt, the continuations of one saved
  state) is prefilled once and its cache copied to the k rows (`shared_run`). Row b draws
  with its own key, so neither changes the tokens.
  """

  def __init__(self, model: nnx.Module, *, tokenizer, layout: TurnLayout,
               stop_tokens: Sequence[int] | None = None, pad_id: int | None = None,
               cache_dtype=None, max_concurrent_steps: int = 64,
               step_timeout_s: float | None = 60.0, mesh=None,
               rules: Sequence[tuple] | None = None):
    if max_concurrent_steps < 1:
      raise ValueError(f"max_concurrent_steps must be >= 1, got {max_concurrent_steps}")
    if step_timeout_s is not None and not step_timeout_s > 0:
      raise ValueError(f"step_timeout_s must be > 0 or None, got {step_timeout_s}")
    self.graphdef, _ = nnx.split(model)
    self.tokenizer = tokenizer
    self.turns = turn_template(tokenizer)
    self.max_concurrent_steps = max_concurrent_steps
    self.step_timeout_s = step_timeout_s
    self.layout = layout
    self.vocab_size = sampling._vocab_size(model)
    self.pad_id = int(tokenizer.pad_id if pad_id is None else pad_id)
    if stop_tokens is None:
      stop_tokens = (tokenizer.eos_id,)
    self.stop_tokens = tuple(int(s) for s in stop_tokens)  # () : a turn ends at its budget
    self.mesh, self.rules = mesh, (None if rules is None else tuple(rules))
    static = ("layout", "mesh", "rules")
    self._start = jax.jit(functools.partial(_start, self.graphdef),
                          static_argnames=static + ("pad_id", "cache_dtype", "share"))
    self._start_from = jax.jit(functools.partial(_start_from, self.graphdef),
                               static_argnames=static + ("pad_id", "share"))
    # The decode state (its KV cache above all) is donated: each turn updates it in place
    # instead of first copying the whole cache buffer.
    self._run_turn = jax.jit(functools.partial(_run_turn, self.graphdef), static_argnames=static,
                             donate_argnums=1)
    self._observe = jax.jit(functools.partial(_observe, self.graphdef), static_argnames=static,
                            donate_argnums=1)
    self.cache_dtype = cache_dtype

  # Room (tokens) a continuing episode must have left after its action for its observation to
  # be added; 0: observations are cut to the room left. `credit.envs.context` sets it.
  context_reserve = 0

  @staticmethod
  def _device_rows(x: np.ndarray, *, rows: int, mesh, first: bool = False) -> Array:
    """Host rows `x` padded to `rows` (copies of row 0 with `first`, else zeros / False) and
    placed on the device(s): row-sharded over the mesh's batch axes when there is a mesh."""
    x = np.asarray(x)
    if rows > x.shape[0]:
      fill = x[:1] if first else np.zeros_like(x[:1])
      x = np.concatenate([x, np.repeat(fill, rows - x.shape[0], 0)])
    return jnp.asarray(x) if mesh is None else parallel.shard_batch(x, mesh)

  # -- tokenisation -----------------------------------------------------------

  def _encode_prompts(self, prompts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    P = self.layout.prompt_width
    ids = []
    for p in prompts:
      row = self.turns.prompt_ids(p)
      if len(row) > P:
        raise ValueError(f"a prompt of {len(row)} tokens does not fit prompt_width={P}: {p!r}")
      ids.append(row)
    tokens = np.full((len(ids), P), self.pad_id, np.int32)
    mask = np.zeros((len(ids), P), bool)
    for b, row in enumerate(ids):
      if row:
        tokens[b, P - len(row):] = row
        mask[b, P - len(row):] = True
    return tokens, mask

  def _encode_observations(self, texts: Sequence[str | None], room_B: np.ndarray
                           ) -> tuple[np.ndarray, np.ndarray, list, list]:
    """The observation blocks [B, W_o] of a turn (each cut to its row's room), the kept ids,
    and the rows whose observation the tokenizer could not encode (they get
    `ERROR_OBSERVATION` instead)."""
    O = self.layout.max_observation_tokens
    B = len(texts)
    tokens = np.full((B, O), self.pad_id, np.int32)
    mask = np.zeros((B, O), bool)
    kept, unreadable = [], []
    for b, text in enumerate(texts):
      if text is None:
        kept.append(None)
        continue
      room = max(0, min(O, int(room_B[b])))
      try:
        ids = self.turns.observation_ids(text, room)
      except ValueError:  # a character the tokenizer lacks: the step's result is malformed
        unreadable.append(b)
        ids = self.turns.observation_ids(ERROR_OBSERVATION, room)
      tokens[b, :len(ids)] = ids
      mask[b, :len(ids)] = True
      kept.append(ids)
    return tokens, mask, kept, unreadable

  def _step_envs(self, envs: Sequence[Any], texts: Sequence[str]) -> list[Call]:
    """`env.step(text)` for each pair, concurrently (see the class docstring), each result
    checked (`_checked_result`)."""
    fns = [functools.partial(_checked_step, env, text) for env, text in zip(envs, texts)]
    if not all(getattr(env, "parallel_steps", True) for env in envs):
      return call_all(fns, max_workers=1, timeout_s=None)
    return call_all(fns, max_workers=self.max_concurrent_steps, timeout_s=self.step_timeout_s)

  # -- one call ----------------------------------------------------------------

  def __call__(self, model_state, envs: Sequence[Any], *, key: Array,
               group_id: Sequence[int] | None = None, temperature: float = 1.0,
               top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
               refresh: Callable[[int], Any] | None = None,
               keep_snapshots: bool = False, keep_cache: bool = False) -> MultiTurnOutput:
    lay = self.layout
    B = len(envs)
    if B == 0:
      raise ValueError("MultiTurnSampler needs at least one environment")
    t0 = time.perf_counter()
    prompts = [env.reset() for env in envs]
    t_env = time.perf_counter() - t0
    p_tok, p_mask = self._encode_prompts(prompts)
    return self._play(model_state, envs, prompts, p_tok, p_mask, lay, key=key,
                      group_id=group_id, sampling_kw=dict(temperature=temperature, top_k=top_k,
                                                          top_p=top_p, min_p=min_p),
                      budget_B=np.full(B, lay.budget, np.int64),
                      turns_B=np.full(B, lay.max_turns, np.int64), width=lay.output_width,
                      refresh=refresh, keep_snapshots=keep_snapshots, t_env=t_env,
                      keep_cache=keep_cache)

  def continue_episodes(self, model_state, envs: Sequence[Any], prefixes: Sequence[Any],
                        first_turn: Sequence[int], prompt_len: Sequence[int], *, key: Array,
                        group_id: Sequence[int] | None = None, temperature: float = 1.0,
                        top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                        prompts: Sequence[str] | None = None,
                        parent: tuple[Any, Sequence[int]] | None = None) -> MultiTurnOutput:
    """Plays R episodes on from saved intermediate states (Memory-R2's local re-rollouts).

    Row r: `envs[r]` has been restored to the state after its episode's first
    `first_turn[r]` >= 1 turns (e.g. `env.restore(out.snapshots[b][k - 1])`), and
    `prefixes[r]` holds the tokens of that episode up to there, as `__call__` returned them
    (compacted: prompt, actions and observations of turns < k, no pads), of which the first
    `prompt_len[r]` are the prompt. The prefix is fed again (one prefill of the whole prefix
    as the context, shared by neighbouring rows with the same prefix, `shared_run`), then
    turns k, k+1, ... are played
    as in `__call__` until the environment says done, turn K−1, or the episode's budget
    (`max_total_tokens`, counting the prefix's actions and observations) runs out. With the
    same parameters, the continuation is a draw from the policy's distribution given that
    prefix: RoPE positions count valid tokens, as in the first rollout.

    Returns a `MultiTurnOutput` of the same width T as `__call__`: tokens = prefix then the
    continuation; `prompt_mask` covers the whole prefix (context only: no policy or
    observation token of the prefix is in `response_mask` / `obs_mask`); `turn_id` and the
    [R,K] arrays use the episode's own turn indices (k, k+1, ...; the prefix's turns are
    not this row's: `step_mask` False there); `reward` = the environment's outcome.
    `trajectories` hold the continuation's texts only (prompt: `prompts[r]` or "").

    `parent=(out.kept, rows)`: the episodes were played with `keep_cache=True` (`out.kept`)
    and prefix r is row rows[r]'s first tokens; the prefix is then not fed again: its keys
    and values are copied from that cache and only its last token goes through the model
    (for the first draw; `credit.sampling.prefill_from_parent`), the same draws up to float
    rounding. The parameters must be the ones that played the episodes.
    """
    lay = self.layout
    R, K, T = len(envs), lay.max_turns, lay.output_width
    if R == 0:
      raise ValueError("continue_episodes needs at least one environment")
    if K < 2:
      raise ValueError("continue_episodes needs max_turns >= 2 (a continuation starts at a "
                       "turn k >= 1)")
    first = np.asarray(first_turn, np.int64)
    plen = np.asarray(prompt_len, np.int64)
    if first.shape != (R,) or plen.shape != (R,) or len(prefixes) != R:
      raise ValueError(f"continue_episodes: prefixes, first_turn and prompt_len must have R={R} "
                       f"entries, got {len(prefixes)}, {first.shape}, {plen.shape}")
    if ((first < 1) | (first >= K)).any():
      raise ValueError(f"continue_episodes: first_turn must lie in [1, {K}), got {first}")
    # The continuation's layout: the prefix (at most T tokens) in the prompt area, K−1 turns.
    cont = TurnLayout(prompt_width=T, max_turns=K - 1, max_action_tokens=lay.max_action_tokens,
                      max_observation_tokens=lay.max_observation_tokens)
    p_tok = np.full((R, T), self.pad_id, np.int32)
    p_mask = np.zeros((R, T), bool)
    budget_B = np.zeros(R, np.int64)
    for r, pre in enumerate(prefixes):
      pre = np.asarray(pre, np.int32)
      n = pre.shape[0]
      if pre.ndim != 1 or not plen[r] < n < T:
        raise ValueError(f"continue_episodes: prefix {r} has {n} tokens; it must hold its "
                         f"prompt ({plen[r]}) and at least one turn, and fewer than T={T}")
      p_tok[r, T - n:] = pre  # right-aligned, as `_encode_prompts` lays prompts
      p_mask[r, T - n:] = True
      budget_B[r] = lay.budget - (n - plen[r])
    if (budget_B <= 0).any():
      raise ValueError("continue_episodes: a prefix has used the whole episode budget")
    if parent is not None:
      kept, rows = parent
      rows = np.asarray(rows)
      if not isinstance(kept, sampling.RowCache) or rows.shape != (R,):
        raise ValueError(f"continue_episodes: parent must be (out.kept, rows [R={R}]) of a call "
                         f"with keep_cache=True, got {type(kept).__name__} and {rows.shape}")
      if (rows < 0).any() or (rows >= kept.slot_BT.shape[0]).any():
        raise ValueError(f"continue_episodes: parent rows must be rows of the parent call, got "
                         f"{rows.tolist()}")
      parent = (kept, rows.astype(np.int32))
    out = self._play(model_state, envs, list(prompts) if prompts is not None else [""] * R,
                     p_tok, p_mask, cont, key=key, group_id=group_id,
                     sampling_kw=dict(temperature=temperature, top_k=top_k, top_p=top_p,
                                      min_p=min_p),
                     budget_B=budget_B, turns_B=K - first, width=T, refresh=None,
                     keep_snapshots=False, t_env=0.0, parent=parent)
    # Local turn j of row r is the episode's turn first[r] + j.
    cols = first[:, None] + np.arange(K - 1)[None]  # [R, K-1] target turn columns, < K valid
    rows = np.repeat(np.arange(R), K - 1).reshape(R, K - 1)
    ok = cols < K

    def shift(x, fill):
      y = np.full((R, K), fill, x.dtype)
      y[rows[ok], cols[ok]] = x[ok]
      return y

    return out._replace(
        turn_id=np.where(out.turn_id >= 0, out.turn_id + first[:, None].astype(np.int32),
                         -1).astype(np.int32),
        step_reward=shift(out.step_reward, 0.0), turn_progress=shift(out.turn_progress, 0.0),
        turn_role=shift(out.turn_role, 0), step_mask=shift(out.step_mask, False),
        tool_status=shift(out.tool_status, TOOL_OK))

  def _first_state(self, model_state, p_tok, p_mask, key, max_new_B, params, lay: TurnLayout,
                   mesh, parent):
    """The decode state after the contexts and turn 0's first draw, and the function that
    places host rows on the device(s) as its rows are laid out. A context shared by k
    neighbouring rows goes in once for them (`shared_run`): prefilled, or copied from
    `parent`'s cache; rows are padded (finished from the start, never read back) so the mesh's
    batch axes divide."""
    B = p_tok.shape[0]
    share = shared_run(p_tok, p_mask)
    n_pre = B // share
    n_pre += sampling.pad_rows(n_pre, mesh)
    dev = functools.partial(self._device_rows, rows=n_pre * share, mesh=mesh)
    kw = dict(layout=lay.device(), pad_id=self.pad_id, share=share, mesh=mesh, rules=self.rules)
    pre = (dev(p_tok[::share], rows=n_pre, first=True),
           dev(p_mask[::share], rows=n_pre, first=True),
           key if mesh is None else sampling.replicate_key(key, mesh), dev(max_new_B), params)
    if parent is None:
      return self._start(model_state, *pre, cache_dtype=self.cache_dtype, **kw), dev
    rows = dev(parent[1][::share], rows=n_pre, first=True)
    return self._start_from(model_state, parent[0], rows, *pre, **kw), dev

  def _play(self, model_state, envs, prompts, p_tok, p_mask, lay: TurnLayout, *, key,
            group_id, sampling_kw, budget_B, turns_B, width, refresh, keep_snapshots,
            t_env, keep_cache=False, parent=None) -> MultiTurnOutput:
    """The turn loop of `__call__` / `continue_episodes`: `envs` ready to step, their
    contexts `p_tok`/`p_mask` [B,P] (right-aligned), per-row token budgets `budget_B` and
    turn limits `turns_B`; the output compacted to `width` columns. `parent`: (RowCache,
    rows [B]) the contexts are already in; `keep_cache`: return the final cache."""
    if isinstance(model_state, nnx.Module):
      model_state = nnx.state(model_state)
    B, K, W_a = len(envs), lay.max_turns, lay.max_action_tokens
    gid = np.zeros(B, np.int32) if group_id is None else np.asarray(group_id, np.int32)
    if gid.shape != (B,):
      raise ValueError(f"group_id must have shape ({B},), got {gid.shape}")
    params = sampling.sampling_params(**sampling_kw, stop_tokens=self.stop_tokens,
                                      vocab_size=self.vocab_size)
    used_B = np.zeros(B, np.int64)  # action + observation tokens so far
    max_new_B = np.minimum(W_a, budget_B).astype(np.int32)

    kinds = np.zeros((B, lay.buffer_width), np.int8)
    kinds[:, :lay.prompt_width] = np.where(
        np.sort(p_mask, axis=1), _PROMPT, _PAD)  # right-aligned, as prefill lays them
    turn_of = np.full((B, lay.buffer_width), -1, np.int32)
    rec = _TurnRecord(B, K)
    active = np.ones(B, bool)
    truncated = np.zeros(B, bool)
    actions: list[list[str]] = [[] for _ in range(B)]
    observations: list[list[str]] = [[] for _ in range(B)]
    results: list[list[Any]] = [[] for _ in range(B)]
    snaps: list[list[Any]] | None = [[] for _ in range(B)] if keep_snapshots else None
    n_action_tokens = 0
    n_obs_tokens = 0

    mesh = self.mesh if self.mesh is not None else sampling.params_mesh(model_state)
    shard = dict(mesh=mesh, rules=self.rules)
    t_dev = time.perf_counter()
    state, dev = self._first_state(model_state, p_tok, p_mask, key, max_new_B, params, lay,
                                   mesh, parent)
    t_dev = time.perf_counter() - t_dev
    for k in range(K):
      t1 = time.perf_counter()
      state = self._run_turn(model_state, state, params, layout=lay.device(), **shard)
      a0 = lay.action_column(k)
      num_new, block = (x[:B] for x in parallel.to_host(
          (state.num_new_B, state.tokens_BL[:, a0:a0 + W_a])))
      t_dev += time.perf_counter() - t1
      t1 = time.perf_counter()
      texts: list[str | None] = [None] * B
      live = np.flatnonzero(active)
      n_action_tokens += _take_actions(self.tokenizer, live, num_new, block, a0, k, kinds,
                                       turn_of, used_B, rec, actions)
      calls = self._step_envs([envs[b] for b in live], [actions[b][-1] for b in live])
      for b, call in zip(live, calls):
        res = rec.record(b, k, call)
        results[b].append(res)
        if res.done or k >= turns_B[b] - 1:
          active[b] = False
          continue
        if snaps is not None:
          snaps[b].append(envs[b].snapshot())
        # `context_reserve` (context management, `credit.envs.context`): a row also ends,
        # before its observation is added, when less than that much room is left.
        if used_B[b] >= budget_B[b] or used_B[b] + self.context_reserve > budget_B[b]:
          active[b], truncated[b] = False, True
          continue
        if not res.observation:  # the next turn needs a context token: a malformed result
          res = results[b][-1] = rec.fail(b, k, f"environment {type(envs[b]).__name__} "
                                          "returned an empty observation for a continuing "
                                          "episode")
        texts[b] = res.observation
      t_env += time.perf_counter() - t1
      if not active.any():
        break
      obs, obs_mask, kept, unreadable = self._encode_observations(texts, budget_B - used_B)
      for b in unreadable:
        results[b][-1] = rec.fail(b, k, "the observation has characters the tokenizer cannot "
                                  "encode")
      n_obs_tokens += _add_observations(self.turns, kept, lay.observation_column(k), kinds,
                                        used_B, active, truncated, observations)
      if not active.any():
        break
      max_new_B = np.minimum(W_a, np.maximum(budget_B - used_B, 0)).astype(np.int32)
      if refresh is not None:  # newer parameters from this observation on (async RL)
        newer = refresh(k + 1)
        if newer is not None:
          model_state = nnx.state(newer) if isinstance(newer, nnx.Module) else newer
      t1 = time.perf_counter()
      state = self._observe(model_state, state, dev(obs), dev(obs_mask), dev(active),
                            dev(max_new_B),
                            jnp.asarray(k, jnp.int32), params, layout=lay.device(), **shard)
      t_dev += time.perf_counter() - t1
    t1 = time.perf_counter()
    # A row whose step timed out is abandoned (its environment may still be running): 0.
    outcome = np.asarray([0.0 if (rec.tool_status[b] == TOOL_TIMEOUT).any() else
                          float(envs[b].outcome()) for b in range(B)], np.float32)
    t_env += time.perf_counter() - t1
    tokens_BL, lp_s, lp_r = (x[:B] for x in parallel.to_host(
        (state.tokens_BL, state.logprob_sampler_BL, state.logprob_raw_BL)))
    trajs = [Trajectory(prompts[b], actions[b], observations[b], results[b], float(outcome[b]),
                        bool(truncated[b])) for b in range(B)]
    out = _compact(kinds, turn_of, tokens_BL, lp_s, lp_r, width, self.pad_id)
    kept = None
    if keep_cache:  # output column j of row b is buffer column (= cache slot) slot[b, j]
      slot = np.argsort(kinds == _PAD, axis=1, kind="stable")[:, :width].astype(np.int32)
      kept = sampling.RowCache(cache=state.cache, slot_BT=dev(slot))
    timings = {"device_s": t_dev, "env_s": t_env, "action_tokens": n_action_tokens,
               "observation_tokens": n_obs_tokens,
               "tool_errors": int((rec.tool_status == TOOL_ERROR).sum()),
               "tool_timeouts": int((rec.tool_status == TOOL_TIMEOUT).sum())}
    return MultiTurnOutput(**out, group_id=gid, step_reward=rec.step_reward,
                           turn_progress=rec.progress, turn_role=rec.role,
                           step_mask=rec.step_mask, reward=outcome, truncated=truncated,
                           trajectories=trajs, timings=timings, snapshots=snaps,
                           tool_status=rec.tool_status, kept=kept)


def _take_actions(tokenizer, live, num_new, block, a0: int, k: int, kinds, turn_of, used_B,
                  rec: "_TurnRecord", actions) -> int:
  """Records turn k's sampled actions of the `live` rows (their `num_new` tokens of `block`,
  written from column a0): kinds, turn ids, tokens used, the step mask and the decoded text.
  Returns the number of action tokens."""
  total = 0
  for b in live:
    n = int(num_new[b])
    kinds[b, a0:a0 + n] = _ACTION
    turn_of[b, a0:a0 + n] = k
    used_B[b] += n
    total += n
    rec.step_mask[b, k] = True
    actions[b].append(tokenizer.decode(block[b, :n].tolist()))
  return total


def _add_observations(turns, kept, o0: int, kinds, used_B, active, truncated,
                      observations) -> int:
  """Records the observation tokens `kept` for each active row from column o0; a row with no
  room left for its observation ends, truncated by the budget. Returns the number of tokens."""
  total = 0
  for b in np.flatnonzero(active):
    n = len(kept[b])
    if n == 0:  # no room left for the observation: the budget ends the episode
      active[b], truncated[b] = False, True
      continue
    kinds[b, o0:o0 + n] = _OBS
    used_B[b] += n
    total += n
    observations[b].append(turns.observation_text(kept[b]))
  return total


class _TurnRecord:
  """The per-turn [B,K] arrays of a rollout, filled in as the environments' steps return."""

  def __init__(self, B: int, K: int):
    self.step_reward = np.zeros((B, K), np.float32)
    self.progress = np.zeros((B, K), np.float32)
    self.role = np.zeros((B, K), np.int32)
    self.step_mask = np.zeros((B, K), bool)
    self.tool_status = np.full((B, K), TOOL_OK, np.int8)

  def record(self, b: int, k: int, call: Call) -> Any:
    """Row b's turn k from its step call; returns the step's result (`_failed_step`'s for a
    failed call: no reward, the progress of turn k-1)."""
    if call.error is None:
      res = call.value
    else:
      res = _failed_step(call, float(self.progress[b, k - 1]) if k else 0.0)
      self.tool_status[b, k] = TOOL_TIMEOUT if call.timed_out else TOOL_ERROR
    self.step_reward[b, k] = float(res.reward)
    self.progress[b, k] = float(getattr(res, "progress", 0.0))
    self.role[b, k] = int(getattr(res, "role", 0))
    return res

  def fail(self, b: int, k: int, error: str) -> StepResult:
    """Turns row b's recorded turn k into a malformed result (`error`), the episode going on."""
    self.tool_status[b, k] = TOOL_ERROR
    self.step_reward[b, k] = 0.0
    return _failed_step(Call(None, error, False, 0.0), float(self.progress[b, k]))


class MalformedResult(ValueError):
  """An environment's `step` returned something that is not a step result."""


def _checked_step(env: Any, action: str) -> Any:
  """`env.step(action)`, refused (`MalformedResult`) unless it has a str `observation`, a
  bool `done`, a finite `reward` and finite `progress` / int `role` when present."""
  res = env.step(action)
  try:
    obs, done = res.observation, res.done
    numbers = [float(res.reward), float(getattr(res, "progress", 0.0))]
    int(getattr(res, "role", 0))
  except (AttributeError, TypeError, ValueError) as e:
    raise MalformedResult(f"{type(res).__name__} is not a step result ({e})") from None
  if not isinstance(obs, str):
    raise MalformedResult(f"observation is a {type(obs).__name__}, not a str")
  if not isinstance(done, (bool, np.bool_)):
    raise MalformedResult(f"done is a {type(done).__name__}, not a bool")
  if not np.isfinite(numbers).all():
    raise MalformedResult(f"reward / progress not finite: {numbers}")
  return res


def _failed_step(call: Call, progress: float) -> StepResult:
  """The result recorded for a failed step: `ERROR_OBSERVATION` (the episode goes on) or, for a
  step that timed out, `TIMEOUT_OBSERVATION` and the end of the episode; no reward, progress
  unchanged, the error in `info["tool_error"]`."""
  obs = TIMEOUT_OBSERVATION if call.timed_out else ERROR_OBSERVATION
  return StepResult(obs, bool(call.timed_out), 0.0, float(progress), 0,
                    {"valid": False, "error": call.error, "tool_error": call.error,
                     "timed_out": bool(call.timed_out)})


def _compact(kinds, turn_of, tokens_BL, lp_s_BL, lp_r_BL, width: int, pad_id: int) -> dict:
  """Moves the valid columns of each row to the left, in order (right padding after)."""
  B, L = kinds.shape
  valid = kinds != _PAD
  order = np.argsort(~valid, axis=1, kind="stable")
  take = lambda x: np.take_along_axis(x, order, axis=1)[:, :width]
  k = take(kinds)
  lengths = valid.sum(1).astype(np.int32)
  if (lengths > width).any():
    raise AssertionError(f"a row of {lengths.max()} tokens exceeds the output width {width}")
  action = k == _ACTION
  return dict(
      tokens=np.where(k != _PAD, take(tokens_BL), pad_id).astype(np.int32),
      prompt_mask=k == _PROMPT, response_mask=action, obs_mask=k == _OBS,
      turn_id=np.where(action, take(turn_of), -1).astype(np.int32),
      logprob_sampler=np.where(action, take(lp_s_BL), 0.0).astype(np.float32),
      logprob_raw=np.where(action, take(lp_r_BL), 0.0).astype(np.float32),
      lengths=lengths)


def encode_episode(tokenizer, layout: TurnLayout, prompt: str, actions: Sequence[str],
                   observations: Sequence[str]) -> dict[str, np.ndarray]:
  """One episode's texts in the layout `MultiTurnSampler` returns (compacted, right-padded to
  `layout.output_width`), rendered by the tokenizer's `credit.envs.chat.turn_template`:
  the prompt, each action with its stop token, each observation block cut to
  `max_observation_tokens`, all within the token budget (the character tokenizer: bos +
  prompt, action + eos, observation text). For supervised warm-ups on
  demonstration episodes and for tests.

  Returns tokens [T] int32, prompt_mask / response_mask / obs_mask [T] bool, turn_id [T] int32.
  """
  T = layout.output_width
  turns = turn_template(tokenizer)
  ids = turns.prompt_ids(prompt)
  if len(ids) > layout.prompt_width:
    raise ValueError(f"a prompt of {len(ids)} tokens does not fit prompt_width="
                     f"{layout.prompt_width}: {prompt!r}")
  kind = [_PROMPT] * len(ids)
  turn = [-1] * len(ids)
  left = layout.budget
  for k, a in enumerate(actions[:layout.max_turns]):
    a_ids = turns.action_ids(a)[:min(layout.max_action_tokens, left)]
    ids += a_ids
    kind += [_ACTION] * len(a_ids)
    turn += [k] * len(a_ids)
    left -= len(a_ids)
    if k < len(observations) and k < layout.max_turns - 1 and left > 0:
      o_ids = turns.observation_ids(observations[k], min(layout.max_observation_tokens, left))
      ids += o_ids
      kind += [_OBS] * len(o_ids)
      turn += [-1] * len(o_ids)
      left -= len(o_ids)
    if left <= 0:
      break
  n = len(ids)
  tokens = np.full(T, tokenizer.pad_id, np.int32)
  tokens[:n] = ids
  kind_T = np.zeros(T, np.int8)
  kind_T[:n] = kind
  turn_T = np.full(T, -1, np.int32)
  turn_T[:n] = turn
  return {"tokens": tokens, "prompt_mask": kind_T == _PROMPT, "response_mask": kind_T == _ACTION,
          "obs_mask": kind_T == _OBS, "turn_id": turn_T}


def demonstration_episode(task, example, limits=None, rng=None
                          ) -> tuple[str, list[str], list[str]]:
  """(prompt, actions, observations) of the task's demonstration, played in its environment
  (built with `limits`, the run's `credit.envs.Limits`); `rng` draws a stochastic
  demonstrator's actions (a task option such as lookup's `demo_early_answer`)."""
  env = task.make_env(example, limits)
  prompt = env.reset()
  actions = list(task.demonstration_turns(example, rng=rng))
  observations = []
  for a in actions:
    res = env.step(a)
    if res.done:
      break
    observations.append(res.observation)
  return prompt, actions, observations
