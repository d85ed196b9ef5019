"""Field producers: how the runner makes the contract fields a method needs.

A producer is declared once, in `PRODUCERS`, with the contract fields it `provides`, the
fields it `requires` from earlier stages, and a `build(setup, wanted)` that runs at setup
time (jitting what it needs once) and returns the per-step callable::

    produce(state, batch, ctx) -> {field: array}   # new fields; `wanted` ⊆ its result

`plan(needed, c)` picks, for each needed field, the first producer in the table that
provides it and is enabled by the config (`when`), adds the producers of what those
require, and orders them by dependency (the rollout root first). A field that no enabled
producer makes is refused at setup, naming the field and the method that needs it.

The step is the planned stages called in order; a new kind of input (a teacher pass
`logprob_teacher`, an alternative-context pass `logprob_alt`, branch samples, environment
turns, a second trained model) is a new row here, never a branch in the step.

Producers return contract fields only (checked at import). What later stages need that is
not a contract field — the attention mask, host copies of the rollout for verifiers and
metrics, the sampler's raw log-probs — the rollout root records on the `StepContext`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import time
from typing import Any, Callable, Iterable, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

import credit
from credit import CONTRACT, parallel, scoring, trees
from credit import divergences as divergences_lib
from credit import tasks as tasks_lib
from credit.tasks.char_tokenizer import prompt_ids
from experiments import critical, learners, train, verifier

Produce = Callable[[Any, Mapping[str, Any], "StepContext"], dict]


class SetupError(ValueError):
  """A configuration the loop cannot run; raised before any output is written."""


class MissingFieldsError(SetupError):
  """Methods need contract fields no enabled producer makes under this config.

  Attributes:
    missing: {who: [field, ...]}, who being the estimator or loss that needs them.
    off: {producer name: ([field, ...], why it is off)} for the producers that could make
      some of them but are disabled by this config.
    made: the fields the enabled producers can make.
    reason: the short message (who needs what, and which producers are off and why), without
      the list of `made` fields and the advice the full message adds.
  """

  def __init__(self, missing: Mapping[str, list], off: Mapping[str, tuple],
               made: Iterable[str]):
    self.missing = {who: sorted(fs) for who, fs in missing.items()}
    self.off = dict(off)
    self.made = sorted(made)
    why = "; ".join(f"{who} needs {fs}" for who, fs in self.missing.items())
    offs = "".join(f"; producer {name!r} makes {fs} but is off under this config ({doc})"
                   for name, (fs, doc) in self.off.items())
    self.reason = why + offs
    super().__init__(f"{why}, which no field producer of this loop makes (it can make "
                     f"{self.made}){offs}; add a producer to experiments/producers.py or use "
                     "a recipe with an environment or critic that provides them")


@dataclasses.dataclass
class Setup:
  """What producers are built from (constant for the run)."""
  c: ml_collections.ConfigDict
  data: Any                   # loop.Data: task, tokenizer, splits, lengths
  mesh: Any
  graphdef: Any               # the policy's graph; params travel in the train state
  rest: Any                   # its non-parameter state (constant)
  sampler: Any                # credit.sampling.Sampler over the policy
  chunk_size: int | None      # scoring chunk (None: auto)
  num_groups: int             # N prompts per step
  group_size: int             # G samples per prompt
  multi_sampler: Any = None   # credit.envs.MultiTurnSampler for a multi-turn task (else None)
  _scorers: dict = dataclasses.field(default_factory=dict, repr=False)

  def model_state(self, params) -> Any:
    return nnx.merge_state(params, self.rest)

  def scorer(self, *, sum_pi_squared: bool = False, entropy: bool = True) -> Callable:
    """The jitted no-gradient scoring pass (`train.make_scorer`), built once per variant;
    `entropy=False` for the passes that only need log-probs (its slot is None)."""
    key = (sum_pi_squared, entropy)
    if key not in self._scorers:
      self._scorers[key] = jax.jit(train.make_scorer(
          self.graphdef, self.rest, self.chunk_size, sum_pi_squared=sum_pi_squared,
          entropy=entropy))
    return self._scorers[key]

  def repeat_groups(self, per_prompt: np.ndarray) -> Any:
    """[N] host values -> [B=N*G] row-sharded array (each prompt's value for its G samples)."""
    return parallel.shard_batch(np.repeat(np.asarray(per_prompt), self.group_size), self.mesh)


@dataclasses.dataclass
class StepContext:
  """Per-step inputs that are not contract fields.

  key: the step's PRNG key. examples: the loader's batch of N prompts (columns).
  prompt_tokens, prompt_mask: [N,P] host arrays of the encoded prompts.
  ref_params: the frozen reference policy (None unless a planned producer keeps one).
  learners: {producer name: its `learners.LearnerState`} of the trained producers; a
  producer replaces its own entry when it updates, and the loop carries them to the next step.
  metrics: what the producers report for the step's metrics row (e.g. `prm_loss`).
  Filled by the rollout root: attn_mask [B,T] (prompt | response, sharded), host (numpy
  copies: tokens, response_mask, prompt_mask, group_id; `texts` once decoded), extras (other arrays,
  e.g. the sampler's raw log-probs).
  """
  key: jax.Array
  examples: Mapping[str, Any]
  prompt_tokens: np.ndarray
  prompt_mask: np.ndarray
  ref_params: Any = None
  learners: dict = dataclasses.field(default_factory=dict)
  metrics: dict = dataclasses.field(default_factory=dict)
  attn_mask: Any = None
  host: dict = dataclasses.field(default_factory=dict)
  extras: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Producer:
  """One row of the producer table.

  name: what errors and timings call it. provides / requires: contract fields.
  build: `build(setup, wanted) -> produce`, with `wanted` the provided fields the plan uses.
  phase: the timing bucket it is reported under (`time_<phase>`; summary.md's step-time
  table lists each): sampling, reward, scoring (the policy's own pass), reference,
  divergence, likelihood (answer / follow-up teacher forcing), rescoring (other contexts),
  teacher (a frozen or self-teacher's pass), baseline, prm, critic, verifier (the generative
  verifier's verdicts and update), critical (CSO / InT's proposals, continuations and
  verification) — so every extra pass a method needs shows its cost per step.
  when: enabled under this config (resolved at setup); off_doc: what enables it (named when a
  needed field is refused). keeps_reference: the run keeps a frozen copy of the initial
  policy in `ctx.ref_params` (and checkpoints it). init: the producer learns
  (`experiments/learners.py`): `init(setup, policy_params) -> LearnerState` makes its
  trained state after the warm-up (checkpointed with the run), and `build` returns
  `(produce, after)`, `after(batch, targets, ctx)` running once the estimator has made the
  advantages (`targets`: its value targets, e.g. `returns`). check: `check(c)` raises
  SetupError for a setting the producer cannot run with; `plan` calls it for each planned
  producer, before any file is written.
  """
  name: str
  provides: tuple[str, ...]
  requires: tuple[str, ...]
  build: Callable[[Setup, frozenset], Produce]
  phase: str
  doc: str
  when: Callable[[ml_collections.ConfigDict], bool] = lambda c: True
  keeps_reference: bool = False
  off_doc: str = ""
  init: Callable[[Setup, Any], Any] | None = None
  check: Callable[[ml_collections.ConfigDict], None] | None = None


# --------------------------------------------------------------------------
# Build functions (setup time) returning the per-step `produce`.
# --------------------------------------------------------------------------


TURN_STEP_FIELDS = frozenset({"turn_id", "step_mask"})


def turns_are_steps(c: ml_collections.ConfigDict) -> bool:
  """Whether a single-turn run's `turn_id` is the response's steps (cut at
  `c.step_delimiters`, at most `c.max_steps`) rather than one turn.

  True with `c.steps_as_turns`, and always when the estimator reads both `turn_id` and
  `step_mask` (IGPO, TRACE, SIOP, OPRL, PBSD, the turn-level step-reward methods...): it
  takes `step_mask[b,k]` as "turn k of row b exists" and credits the tokens of `turn_id == k`,
  while single-turn `step_mask` comes from the step producers (the delimiter steps). With one
  turn the two disagree: a row whose response holds a delimiter gets turns 1.. with no tokens,
  whose rewards still enter the group statistics and the returns of turn 0 (found 2026-12-06
  on `pivotal`; a row of one step is one turn either way). Multi-turn runs: False (their turns
  are the episode's)."""
  if is_multi_turn(c):
    return False
  if c.steps_as_turns:
    return True
  try:
    needs = credit.get_estimator(c.estimator).needs
  except (KeyError, ValueError):
    return False  # check_method reports the unknown estimator
  return TURN_STEP_FIELDS <= set(needs)


def _build_rollout(s: Setup, wanted: frozenset) -> Produce:
  c, G = s.c, s.group_size
  group_id = np.repeat(np.arange(s.num_groups, dtype=np.int32), G)
  split = step_splitter(s) if turns_are_steps(c) else None

  def produce(state, batch, ctx: StepContext) -> dict:
    out = s.sampler(s.model_state(state.params), prompt_tokens=ctx.prompt_tokens,
                    prompt_mask=ctx.prompt_mask, key=jax.random.fold_in(ctx.key, 0),
                    max_new_tokens=c.max_new_tokens, num_samples=G,
                    temperature=c.temperature, top_k=c.top_k, top_p=c.top_p)
    host = parallel.to_host({"tokens": out.tokens, "response_mask": out.response_mask,
                             "prompt_mask": out.prompt_mask})
    resp = host["response_mask"]
    # One turn, no observation: the multi-turn fields as the environment rollout has them
    # (producers such as the gold pass read them from ctx.host on either rollout). With
    # `turns_are_steps` each step (`step_splitter`) is a turn, so turn-level estimators
    # credit the steps of a single-turn response (turn k <-> step k, as step_reward's).
    obs, turn = np.zeros_like(resp), np.where(resp, 0, -1).astype(np.int32)
    if split is not None:
      turn = np.where(resp, np.minimum(split(host["tokens"], resp), c.max_steps - 1),
                      -1).astype(np.int32)
    ctx.host.update(host, group_id=group_id, obs_mask=obs, turn_id=turn)
    ctx.attn_mask = parallel.shard_batch(host["prompt_mask"] | resp, s.mesh)
    ctx.extras["logprob_raw"] = out.logprob_raw
    fields = parallel.shard_batch({
        "tokens": host["tokens"], "response_mask": resp, "group_id": group_id,
        "prompt_id": np.repeat(np.asarray(ctx.examples["index"], np.int32), G),
        "obs_mask": obs, "turn_id": turn,
    }, s.mesh)
    return dict(fields, logprob_sampler=out.logprob_sampler)

  return produce


def tree_on(c: ml_collections.ConfigDict) -> bool:
  """Branch sampling is on (`c.tree.branches > 0`; single-turn tasks)."""
  return c.tree.branches > 0 and not is_multi_turn(c)


def tree_rows(c: ml_collections.ConfigDict) -> int:
  """Rows of one step's batch: N·G, plus the branches when branch sampling is on; N·k·S
  candidate rows under SLATE's step-level sampling."""
  if slate_on(c):
    return c.prompts_per_step * c.slate.candidates * c.slate.max_steps
  if logo_on(c):
    return c.prompts_per_step * c.group_size + c.logo.branch_rows * c.logo.local_size
  if not tree_on(c):
    return c.prompts_per_step * c.group_size
  t = c.tree
  return trees.tree_rows(c.prompts_per_step, c.group_size, t.branches, t.points, t.depth,
                         t.depth_decay)


# Branch criteria of the runner: the library's, with "given" filled by the task's first error.
RUNNER_CRITERIA = ("entropy", "surprisal", "step", "first_error")


def _check_tree(c: ml_collections.ConfigDict) -> None:
  t = c.tree
  if t.criterion not in RUNNER_CRITERIA:
    raise SetupError(f"tree.criterion={t.criterion!r}; the runner can branch by "
                     f"{list(RUNNER_CRITERIA)}")
  if t.criterion == "first_error" and not _task_flags_spans(c):
    raise SetupError("tree.criterion='first_error' needs a built-in task with flag_chars (the "
                     "first wrong character of a response), e.g. arithmetic, chain, countdown")
  try:
    trees.budgets(t.points, t.depth, t.depth_decay)
  except ValueError as e:
    raise SetupError(f"tree: {e}") from None
  if not (0.0 <= t.gamma_path <= 1.0 and 0.0 <= t.gamma_node < 1.0):
    raise SetupError(f"tree.gamma_path={t.gamma_path} must be in [0,1] and "
                     f"tree.gamma_node={t.gamma_node} in [0,1)")


def _tree_batch(s: Setup, ctx: StepContext, tree, **more) -> dict:
  """The contract fields of a tree batch (`credit.trees.TreeRollout`), sharded; the host views
  read whole paths (verifiers, step splitting), the loss reads each row's own tokens."""
  own = tree.response_mask
  ctx.host.update(tokens=tree.tokens, response_mask=tree.path_mask,
                  prompt_mask=tree.prompt_mask, group_id=tree.group_id, own_mask=own)
  ctx.attn_mask = parallel.shard_batch(tree.prompt_mask | tree.path_mask, s.mesh)
  ctx.extras["logprob_raw"] = parallel.shard_batch(tree.logprob_raw, s.mesh)
  index = np.asarray(ctx.examples["index"], np.int32)
  return parallel.shard_batch({
      "tokens": tree.tokens, "response_mask": own, "group_id": tree.group_id,
      "prompt_id": index[tree.group_id], "obs_mask": np.zeros_like(own),
      "turn_id": np.where(own, 0, -1).astype(np.int32), "parent_id": tree.parent_id,
      "prefix_len": tree.prefix_len, "logprob_sampler": tree.logprob_sampler, **more}, s.mesh)


def first_wrong_columns(tok, task, examples: Mapping[str, Any], tokens_BT: np.ndarray,
                        resp_BT: np.ndarray, example_of_row: np.ndarray,
                        rows: Iterable[int] | None = None) -> np.ndarray:
  """[B] the column of each row's first token the task flags wrong (`flag_chars`: the first
  character a judge marks wrong), −1 where none (or the row is not in `rows`; default all);
  row b answers example `example_of_row[b]` and its response is `resp_BT[b]`."""
  out = np.full(tokens_BT.shape[0], -1, np.int64)
  for b in range(tokens_BT.shape[0]) if rows is None else rows:
    cols = np.flatnonzero(resp_BT[b])
    ids = tokens_BT[b, cols]
    example = tasks_lib.as_example({k: examples[k][example_of_row[b]] for k in examples})
    flags = tasks_lib.token_flags(tok, ids, task.flag_chars(example, tok.decode(ids)))
    if flags.any():
      out[b] = cols[int(np.argmax(flags))]
  return out


def first_error_scores(tok, task, examples: Mapping[str, Any], tree) -> np.ndarray:
  """[B,T] 1 at the first wrong token of each wrong row's path (`first_wrong_columns`), 0
  elsewhere; row b answers example `group_id[b]`."""
  col = first_wrong_columns(tok, task, examples, tree.tokens, tree.path_mask, tree.group_id)
  out = np.zeros(tree.tokens.shape, np.float32)
  rows = np.flatnonzero(col >= 0)
  out[rows, col[rows]] = 1.0
  return out


def _build_tree_rollout(s: Setup, wanted: frozenset) -> Produce:
  """G root samples per prompt, grown into a tree by branch sampling (`credit.trees`)."""
  c, G, t = s.c, s.group_size, s.c.tree
  entropy = s.scorer(entropy=True) if t.criterion == "entropy" else None
  split = step_splitter(s) if t.criterion == "step" else None
  tok, task = s.data.tokenizer, s.data.task

  def produce(state, batch, ctx: StepContext) -> dict:
    model_state = s.model_state(state.params)
    t0 = time.perf_counter()
    out = s.sampler(model_state, prompt_tokens=ctx.prompt_tokens, prompt_mask=ctx.prompt_mask,
                    key=jax.random.fold_in(ctx.key, 0), max_new_tokens=c.max_new_tokens,
                    num_samples=G, temperature=c.temperature, top_k=c.top_k, top_p=c.top_p)
    h = parallel.to_host(out._asdict())
    B0 = h["tokens"].shape[0]
    roots = trees.TreeRollout(
        tokens=h["tokens"], response_mask=h["response_mask"], path_mask=h["response_mask"],
        prompt_mask=h["prompt_mask"], logprob_sampler=h["logprob_sampler"],
        logprob_raw=h["logprob_raw"], group_id=h["group_id"],
        parent_id=np.full(B0, -1, np.int32), prefix_len=np.zeros(B0, np.int32),
        depth=np.zeros(B0, np.int32))

    def score_fn(tree):
      if t.criterion == "first_error":
        return first_error_scores(tok, task, ctx.examples, tree)
      if split is not None:
        return trees.step_starts(split(tree.tokens, tree.path_mask)).astype(np.float32)
      sharded = parallel.shard_batch((tree.tokens, tree.prompt_mask | tree.path_mask), s.mesh)
      return np.asarray(parallel.to_host(entropy(state.params, *sharded)[1]))

    def sample_fn(prefix, mask, budget, key):
      return s.sampler(model_state, prompt_tokens=prefix, prompt_mask=mask, key=key,
                       max_new_tokens=c.max_new_tokens, num_samples=t.branches,
                       temperature=c.temperature, top_k=c.top_k, top_p=c.top_p,
                       max_new_tokens_per_row=budget, share_prefix=True)

    tree, stats = trees.grow_tree(
        roots, sample_fn, num_groups=s.num_groups, branches=t.branches, points=t.points,
        depth=t.depth, decay=t.depth_decay,
        criterion="given" if t.criterion == "first_error" else t.criterion,
        score_fn=None if t.criterion == "surprisal" else score_fn,
        max_new_tokens=c.max_new_tokens, gamma_path=t.gamma_path, gamma_node=t.gamma_node,
        key=jax.random.fold_in(ctx.key, 1))
    wall = time.perf_counter() - t0
    own = tree.response_mask
    ctx.metrics.update(rollout_tokens_per_s=float(own.sum()) / max(wall, 1e-9),
                       tree_points=float(sum(stats["points_found"])),
                       tree_branch_tokens=float(sum(stats["new_tokens"])),
                       tree_root_tokens=float(own[:B0].sum()))
    return _tree_batch(s, ctx, tree)

  return produce


def tree_batch(c: ml_collections.ConfigDict) -> bool:
  """The step's batch is a tree (branch sampling, SLATE or LoGo's local re-rollouts), not N
  contiguous groups of G."""
  return tree_on(c) or slate_on(c) or logo_on(c)


def slate_on(c: ml_collections.ConfigDict) -> bool:
  """SLATE's step-level sampling is on (`c.slate.candidates > 0`; single-turn tasks)."""
  return c.slate.candidates > 0 and not is_multi_turn(c)


def delimiter_ids(tok, delims) -> list[int]:
  """Token ids whose text holds one of the step delimiters."""
  out = []
  for i in range(tok.vocab_size):
    try:
      text = tok.decode([i])
    except (ValueError, KeyError, IndexError):
      continue
    if any(d in text for d in delims):
      out.append(i)
  return out


def _check_slate(c: ml_collections.ConfigDict) -> None:
  if tree_on(c):
    raise SetupError("slate.candidates > 0 and tree.branches > 0: SLATE's step-level sampling "
                     "is its own tree; use one of them")
  if c.slate.candidates < 2 or c.slate.max_steps < 1:
    raise SetupError(f"slate.candidates={c.slate.candidates} must be >= 2 and "
                     f"slate.max_steps={c.slate.max_steps} >= 1")
  if not c.step_delimiters:
    raise SetupError("SLATE samples one step at a time: c.step_delimiters must not be empty")
  task = tasks_lib.get_task(c.task, **dict(c.task_kwargs)) if c.task in tasks_lib.list_tasks() \
      else None
  if not callable(getattr(task, "judge_step", None)):
    raise SetupError(f"task {c.task!r} has no judge_step (the step judge SLATE's rewards come "
                     "from; built in: chain)")


def _build_slate_rollout(s: Setup, wanted: frozenset) -> Produce:
  """SLATE: k candidate steps per prompt and step, judged, one continued (`trees.step_rollout`)."""
  c, sl, tok, task = s.c, s.c.slate, s.data.tokenizer, s.data.task
  stops = tuple(sorted(set(delimiter_ids(tok, c.step_delimiters))
                       | set(getattr(tok, "stop_ids", None) or (tok.eos_id,))))
  eos = set(getattr(tok, "stop_ids", None) or (tok.eos_id,))

  def produce(state, batch, ctx: StepContext) -> dict:
    model_state = s.model_state(state.params)
    rows = _examples_rows(ctx.examples)

    def sample_fn(prefix, mask, budget, key):
      return s.sampler(model_state, prompt_tokens=prefix, prompt_mask=mask, key=key,
                       max_new_tokens=c.max_new_tokens, num_samples=sl.candidates,
                       temperature=c.temperature, top_k=c.top_k, top_p=c.top_p,
                       stop_tokens=stops, max_new_tokens_per_row=budget, share_prefix=True)

    def judge_fn(n, before, step, t):
      think, other, answer = task.judge_step(rows[n], [tok.decode(list(b)) for b in before],
                                             tok.decode([i for i in step if i not in eos]))
      final = answer or bool(set(step.tolist()) & eos)
      bonus = sl.answer_bonus * (sl.max_steps - t) / sl.max_steps if answer else 0.0
      return think + other + bonus, final

    t0 = time.perf_counter()
    tree, score, st = trees.step_rollout(
        ctx.prompt_tokens, ctx.prompt_mask, sample_fn, judge_fn, candidates=sl.candidates,
        max_steps=sl.max_steps, max_new_tokens=c.max_new_tokens, eta=sl.eta,
        key=jax.random.fold_in(ctx.key, 0))
    wall = time.perf_counter() - t0
    own = tree.response_mask
    _, path_reward = _verify(s, ctx.examples, st["path_tokens"], st["path_mask"],
                             np.arange(s.num_groups))
    ctx.metrics.update(rollout_tokens_per_s=float(own.sum()) / max(wall, 1e-9),
                       slate_path_accuracy=float(np.mean(np.asarray(path_reward) >= 1.0)),
                       slate_path_steps=float(st["path_steps"].mean()),
                       slate_step_score=float(score[own.any(1)].mean()) if own.any() else 0.0)
    return _tree_batch(s, ctx, tree, reward=score.astype(np.float32))

  return produce


def is_multi_turn(c: ml_collections.ConfigDict) -> bool:
  """The run's task is a multi-turn environment task (`credit.envs`)."""
  if c.task in ("jsonl", "tfds"):
    return False
  try:
    task = tasks_lib.get_task(c.task, **dict(c.task_kwargs))
  except (KeyError, TypeError):
    return False  # build_data reports the bad task
  return bool(getattr(task, "multi_turn", False))


def env_limits(c: ml_collections.ConfigDict, tok) -> Any:
  """The environments' `Limits`: the run's K turns, and with the character tokenizer (one
  token per character) observations cut by the environment itself, with its visible marker,
  before the sampler's `max_observation_tokens` would cut them silently."""
  from credit.envs import Limits  # pylint: disable=g-import-not-at-top
  chars = c.max_observation_tokens if isinstance(tok, tasks_lib.CharTokenizer) else None
  return Limits(max_turns=c.max_turns, max_observation_chars=chars)


def _examples_rows(examples: Mapping[str, Any]) -> list[dict]:
  n = len(next(iter(examples.values())))
  return [tasks_lib.as_example({k: examples[k][i] for k in examples}) for i in range(n)]


def transcript(trajectory) -> str:
  """One line of a multi-turn episode: action -> observation | action -> ... (for samples)."""
  parts = []
  for i, a in enumerate(trajectory.actions):
    o = trajectory.observations[i] if i < len(trajectory.observations) else None
    parts.append(a if o is None else f"{a} -> {o}")
  return " | ".join(parts)


def _build_env_rollout(s: Setup, wanted: frozenset) -> Produce:
  """G episodes per prompt with the task's environments (`credit.envs.MultiTurnSampler`)."""
  c, G, task, ms = s.c, s.group_size, s.data.task, s.multi_sampler
  group_id = np.repeat(np.arange(s.num_groups, dtype=np.int32), G)
  limits = env_limits(c, s.data.tokenizer)

  def produce(state, batch, ctx: StepContext) -> dict:
    envs = [task.make_env(e, limits) for e in _examples_rows(ctx.examples) for _ in range(G)]
    newer = ctx.extras.get("refresh")  # asynchronous workers: newer parameters between turns
    refresh = None if newer is None else (
        lambda k: None if (p := newer(k)) is None else s.model_state(p))
    t0 = time.perf_counter()
    out = ms(s.model_state(state.params), envs, key=jax.random.fold_in(ctx.key, 0),
             group_id=group_id, temperature=c.temperature, top_k=c.top_k, top_p=c.top_p,
             refresh=refresh)
    wall = time.perf_counter() - t0
    tm = out.timings
    n_tok = tm["action_tokens"] + tm["observation_tokens"]
    ctx.metrics.update(rollout_tokens_per_s=n_tok / max(wall, 1e-9),
                       rollout_env_s=tm["env_s"], turns_mean=float(out.step_mask.sum(1).mean()),
                       observation_tokens=float(out.obs_mask.sum(1).mean()),
                       truncated_frac=float(out.truncated.mean()))
    return _episode_batch(s, ctx, out, group_id)

  return produce


def _episode_batch(s: Setup, ctx: StepContext, out, group_id: np.ndarray, **more) -> dict:
  """The contract fields of a batch of environment episodes (`MultiTurnOutput` `out`, rows of
  prompt group `group_id`), sharded, and the host views, attention mask and extras (log-probs
  of the raw model, trajectories) the later producers read; `more`: extra fields (host too)."""
  ctx.host.update(tokens=out.tokens, response_mask=out.response_mask,
                  prompt_mask=out.prompt_mask, obs_mask=out.obs_mask, group_id=group_id,
                  turn_id=out.turn_id, step_mask=out.step_mask,
                  texts=[transcript(t) for t in out.trajectories], **more)
  ctx.attn_mask = parallel.shard_batch(out.prompt_mask | out.response_mask | out.obs_mask,
                                       s.mesh)
  ctx.extras["logprob_raw"] = parallel.shard_batch(out.logprob_raw, s.mesh)
  ctx.extras["trajectories"] = out.trajectories
  index = np.asarray(ctx.examples["index"], np.int32)
  return parallel.shard_batch({
      "tokens": out.tokens, "response_mask": out.response_mask, "group_id": group_id,
      "prompt_id": index[group_id], "obs_mask": out.obs_mask, "turn_id": out.turn_id,
      "logprob_sampler": out.logprob_sampler, "reward": out.reward,
      "step_reward": out.step_reward, "step_mask": out.step_mask,
      "turn_progress": out.turn_progress, "turn_role": out.turn_role, **more}, s.mesh)


def logo_on(c: ml_collections.ConfigDict) -> bool:
  """LoGo's local re-rollouts are on (`c.logo.branch_rows > 0`; multi-turn tasks)."""
  return c.logo.branch_rows > 0 and is_multi_turn(c)


def _check_logo(c: ml_collections.ConfigDict) -> None:
  lg = c.logo
  if lg.local_size < 2:
    raise SetupError(f"logo.local_size={lg.local_size}: a local group needs >= 2 siblings "
                     "(one alone gets advantage 0)")
  if lg.branch_rows > c.prompts_per_step * c.group_size:
    raise SetupError(f"logo.branch_rows={lg.branch_rows} exceeds the "
                     f"{c.prompts_per_step * c.group_size} episodes of a step (parents are "
                     "distinct episodes)")
  if c.max_turns < 2:
    raise SetupError("logo.branch_rows > 0 needs max_turns >= 2 (a saved state after turn "
                     "k >= 1 with turns left)")
  if c.estimator != "logo":
    from credit import get_estimator  # pylint: disable=g-import-not-at-top
    why = ("would pool them with the prompt's episodes (it reads no parent_id)"
           if "parent_id" not in get_estimator(c.estimator).needs else
           "is a tree estimator of single-turn branches, not tested on them")
    raise SetupError(f"logo.branch_rows={lg.branch_rows} adds LoGo's local re-rollouts; "
                     f"estimator {c.estimator!r} {why}: use estimator 'logo' or set "
                     "logo.branch_rows=0")
  if c.async_rollouts:
    raise SetupError("logo.branch_rows > 0: asynchronous rollout workers do not make local "
                     "re-rollouts")


def _build_logo_rollout(s: Setup, wanted: frozenset) -> Produce:
  """`env_rollout`'s G episodes per prompt, then LoGo's local rows (`credit.envs.branching`):
  c.logo.local_size continuations from each of c.logo.branch_rows saved intermediate states."""
  from credit.envs.branching import local_rollouts  # pylint: disable=g-import-not-at-top
  c, G, task, ms, lg = s.c, s.group_size, s.data.task, s.multi_sampler, s.c.logo
  group_id = np.repeat(np.arange(s.num_groups, dtype=np.int32), G)
  limits = env_limits(c, s.data.tokenizer)

  def produce(state, batch, ctx: StepContext) -> dict:
    rows = _examples_rows(ctx.examples)
    envs = [task.make_env(e, limits) for e in rows for _ in range(G)]
    model_state = s.model_state(state.params)
    kw = dict(temperature=c.temperature, top_k=c.top_k, top_p=c.top_p)
    t0 = time.perf_counter()
    eps = ms(model_state, envs, key=jax.random.fold_in(ctx.key, 0), group_id=group_id,
             keep_snapshots=True, **kw)
    t1 = time.perf_counter()
    lr = local_rollouts(ms, model_state, eps, lambda b: task.make_env(rows[b // G], limits),
                        num_parents=lg.branch_rows, local_size=lg.local_size,
                        key=jax.random.fold_in(ctx.key, 2), **kw)
    t2 = time.perf_counter()
    out, B = lr.out, eps.tokens.shape[0]
    tm = out.timings
    n_tok = tm["action_tokens"] + tm["observation_tokens"]
    local = np.arange(out.tokens.shape[0]) >= B
    real = local & out.response_mask.any(1)
    ctx.metrics.update(rollout_tokens_per_s=n_tok / max(t2 - t0, 1e-9),
                       rollout_env_s=tm["env_s"], turns_mean=float(eps.step_mask.sum(1).mean()),
                       observation_tokens=float(eps.obs_mask.sum(1).mean()),
                       truncated_frac=float(eps.truncated.mean()),
                       logo_local_rows=float(lr.num_local), logo_local_s=t2 - t1,
                       logo_branch_turn=float(lr.branch_turn[real].mean()) if real.any() else 0.0,
                       logo_local_reward=float(out.reward[real].mean()) if real.any() else 0.0,
                       episode_reward=float(eps.reward.mean()))
    gid = out.group_id
    from credit.advantages.tree.cbpo import validate_tree  # pylint: disable=g-import-not-at-top
    validate_tree(lr.parent_id, lr.prefix_len, gid, num_tokens=out.tokens.shape[1],
                  where="logo_rollout")
    return _episode_batch(s, ctx, out, gid, parent_id=lr.parent_id, prefix_len=lr.prefix_len)

  return produce


def gold_prefix_masks(valid_BT: np.ndarray, prompt_BT: np.ndarray, turn_id_BT: np.ndarray,
                      num_turns: int) -> np.ndarray:
  """[B,K+1,T] bool: the tokens a turn-boundary score conditions on. Entry 0 is the prompt;
  entry k+1 is everything before the first policy token of turn k+1 (turn k's actions and
  observation included), the whole trajectory when there is no turn k+1."""
  B, T = valid_BT.shape
  cols = np.arange(T)
  out = np.zeros((B, num_turns + 1, T), bool)
  out[:, 0] = prompt_BT
  for k in range(num_turns):
    nxt = turn_id_BT == k + 1
    start = np.where(nxt.any(1), np.argmax(nxt, axis=1), T)
    out[:, k + 1] = valid_BT & (cols[None, :] < start[:, None])
  return out


def _gold_template_ids(tok, template: str, answer: str) -> tuple[list[int], list[bool]]:
  """Token ids of `template` with {answer} filled in, and which of them are the answer's."""
  pre, _, post = template.partition("{answer}")
  parts = [(tok.encode(pre) if pre else [], False), (tok.encode(answer), True),
           (tok.encode(post) if post else [], False)]
  ids = [i for p, _ in parts for i in p]
  scored = [flag for p, flag in parts for _ in p]
  return ids, scored


def _check_gold_config(c: ml_collections.ConfigDict) -> None:
  if "{answer}" not in c.gold_template:
    raise SetupError(f"gold_template={c.gold_template!r} must contain {{answer}}")
  if c.gold_scorer not in ("auto", "policy", "reference"):
    raise SetupError(f"gold_scorer={c.gold_scorer!r}; valid: auto | policy | reference")


# gold_scorer = "auto": the estimators whose papers score the gold answer with the frozen
# initial model (TRACE); the others (IGPO, A2TGPO, SIOP...) with the behaviour policy.
GOLD_REFERENCE_ESTIMATORS = frozenset({"trace"})


def gold_scorer(c: ml_collections.ConfigDict) -> str:
  """Who scores the gold answer (`c.gold_scorer`, "auto" resolved): policy | reference."""
  if c.gold_scorer != "auto":
    return c.gold_scorer
  return "reference" if c.estimator in GOLD_REFERENCE_ESTIMATORS else "policy"


def _build_gold_pass(s: Setup, wanted: frozenset) -> Produce:
  """gold_logprob_prompt [B] and gold_logprob_turns [B,K]: the mean log-prob of the gold
  answer's tokens, teacher-forced in `c.gold_template` after the prompt alone and after each
  turn boundary (`gold_prefix_masks`), by the behaviour policy or the frozen reference
  (`c.gold_scorer`). All K+1 prefixes of all rows go through one batched pass."""
  c, tok, G = s.c, s.data.tokenizer, s.group_size
  # K as the run's other per-turn arrays: single-turn turns are its steps (`turns_are_steps`).
  K = c.max_turns if is_multi_turn(c) else c.max_steps
  rows = [_gold_template_ids(tok, c.gold_template, tasks_lib.as_example(e)["answer"])
          for e in s.data.train]
  A = max(len(r[0]) for r in rows)
  score = s.scorer(entropy=False)
  use_ref = gold_scorer(c) == "reference"

  @jax.jit
  def mean_logprob(params, tokens, attn_mask, pos, scored):
    logprob, _ = score(params, tokens, attn_mask)
    lp = jnp.where(scored, jnp.take_along_axis(logprob, pos, axis=1), 0.0)
    return jnp.sum(lp, axis=1) / jnp.maximum(jnp.sum(scored, axis=1), 1)

  def produce(state, batch, ctx: StepContext) -> dict:
    host = ctx.host
    tokens = host["tokens"]
    B, T = tokens.shape
    per = [_gold_template_ids(tok, c.gold_template, a["answer"])
           for a in _examples_rows({"answer": ctx.examples["answer"]})]
    if max(len(p[0]) for p in per) > A:
      raise ValueError(f"a gold answer template of {max(len(p[0]) for p in per)} tokens is "
                       f"longer than the run's width A={A} (the longest of the train split)")
    ans_NA, amask_NA = tasks_lib.pad_rows([p[0] for p in per], A, pad_id=tok.pad_id,
                                          pad_left=False)
    sc_NA = np.zeros_like(amask_NA)
    for n, p in enumerate(per):
      sc_NA[n, :len(p[1])] = p[1]
    rep = lambda x: np.repeat(np.repeat(x, G, axis=0), K + 1, axis=0)
    valid = host["prompt_mask"] | host["response_mask"] | host["obs_mask"]
    keep = gold_prefix_masks(valid, host["prompt_mask"], host["turn_id"], K)
    seq, attn, pos = append_answer(np.repeat(tokens, K + 1, axis=0), keep.reshape(-1, T),
                                   rep(ans_NA), rep(amask_NA), tok.pad_id)
    params = ctx.ref_params if use_ref else state.params
    g = mean_logprob(params, *parallel.shard_batch((seq, attn, pos, rep(sc_NA)), s.mesh))
    g = parallel.to_host(g).reshape(B, K + 1)
    return parallel.shard_batch({"gold_logprob_prompt": g[:, 0].astype(np.float32),
                                 "gold_logprob_turns": g[:, 1:].astype(np.float32)}, s.mesh)

  return produce


def _verify(s: Setup, examples: Mapping[str, Any], tokens, response_mask, example_of_row):
  """(texts, rewards [B]) of decoded responses; row b answers example `example_of_row[b]`."""
  texts = tasks_lib.decode_responses(s.data.tokenizer, tokens, response_mask)
  rows = [{k: examples[k][i] for k in examples} for i in np.asarray(example_of_row)]
  return texts, tasks_lib.verify_batch(s.data.task, rows, texts)


def _build_reward(s: Setup, wanted: frozenset) -> Produce:
  def produce(state, batch, ctx: StepContext) -> dict:
    texts, reward = _verify(s, ctx.examples, ctx.host["tokens"], ctx.host["response_mask"],
                            ctx.host["group_id"])
    ctx.host["texts"] = texts
    return {"reward": parallel.shard_batch(reward, s.mesh)}

  return produce


def _build_sampler_logprob_old(s: Setup, wanted: frozenset) -> Produce:
  def produce(state, batch, ctx: StepContext) -> dict:
    return {"logprob_old": jnp.where(batch["response_mask"], ctx.extras["logprob_raw"], 0.0)}

  return produce


def _build_policy_version(s: Setup, wanted: frozenset) -> Produce:
  def produce(state, batch, ctx: StepContext) -> dict:
    # state.step: the RL steps of the parameters that sampled (an async worker's held version).
    step = state.step
    if isinstance(step, jax.Array) and not step.is_fully_addressable:  # replicated
      step = step.addressable_data(0)
    v = np.full(batch["tokens"].shape[0], int(np.asarray(step)), np.int32)
    return {"policy_version": parallel.shard_batch(v, s.mesh)}

  return produce


def _build_policy_pass(s: Setup, wanted: frozenset) -> Produce:
  # Σπ² comes from the same model pass as the log-probs, and only when a method uses it.
  names = ("logprob", "entropy") + (("sum_pi_squared",) if "sum_pi_squared" in wanted else ())
  score = s.scorer(sum_pi_squared="sum_pi_squared" in wanted)

  def produce(state, batch, ctx: StepContext) -> dict:
    out = dict(zip(names, score(state.params, batch["tokens"], ctx.attn_mask)))
    return dict(out, logprob_old=out["logprob"])  # recomputed by the trainer: θ_old = θ

  return produce


def _build_reference_pass(s: Setup, wanted: frozenset) -> Produce:
  score = s.scorer(entropy=False)

  def produce(state, batch, ctx: StepContext) -> dict:
    logprob_ref, _ = score(ctx.ref_params, batch["tokens"], ctx.attn_mask)
    return {"logprob_ref": logprob_ref}

  return produce


# Full-vocabulary divergences of the behaviour policy from the reference, per position
# (student = the policy π, teacher = the reference π_ref in `credit.divergences`' terms).
DIVERGENCE_FIELDS = {"hellinger_ref": "hellinger", "kl_ref": "reverse_kl",
                     "kl_ref_forward": "forward_kl"}


def _build_divergence_pass(s: Setup, wanted: frozenset) -> Produce:
  names = sorted(wanted)

  @jax.jit
  def divergences(params, ref_params, tokens, attn_mask, response_mask):
    hidden = []
    for p in (params, ref_params):
      model = train.merge_model(s.graphdef, p, s.rest)
      h, valid = scoring.next_token_hidden(model.hidden_states(tokens, mask_BT=attn_mask),
                                           attn_mask)
      hidden.append((h, model.unembedding().astype(h.dtype)))
    (hs, ws), (ht, wt) = hidden
    return {n: jnp.where(response_mask, divergences_lib.token_divergence(
        hs, ws, ht, wt, kind=DIVERGENCE_FIELDS[n], mask_BT=valid, chunk_size=s.chunk_size),
        0.0) for n in names}

  def produce(state, batch, ctx: StepContext) -> dict:
    return divergences(state.params, ctx.ref_params, batch["tokens"], ctx.attn_mask,
                       batch["response_mask"])

  return produce


def _build_greedy_baseline(s: Setup, wanted: frozenset) -> Produce:
  def produce(state, batch, ctx: StepContext) -> dict:
    out = s.sampler(s.model_state(state.params), prompt_tokens=ctx.prompt_tokens,
                    prompt_mask=ctx.prompt_mask, key=ctx.key,
                    max_new_tokens=s.c.max_new_tokens, temperature=0.0)
    host = parallel.to_host({"tokens": out.tokens, "response_mask": out.response_mask})
    _, reward = _verify(s, ctx.examples, host["tokens"], host["response_mask"],
                        np.arange(s.num_groups))
    return {"reward_baseline": parallel.shard_batch(
        np.asarray(reward, np.float32)[ctx.host["group_id"]], s.mesh)}

  return produce


def _build_step_completions(s: Setup, wanted: frozenset) -> Produce:
  """step_value / start_value / step_mask [B,K] by completing each response after each step.

  Steps are `step_splitter`'s (c.step_delimiters); steps past K−1 = c.max_steps − 1 merge into
  the last entry. The value at the end of step j < n−1 (n the response's steps) is the
  verifier's reward of the greedy completion of prompt ⊕ steps 0..j; at the end of the last
  step it is the response's own reward (the response is its own completion); start_value
  is the reward of the greedy response to the prompt alone (one per prompt). TP-GRPO's
  V_0..V_n with the completion policy the current greedy one (the paper completes its
  diffusion trajectories deterministically from each step; this is the LLM analogue).
  Cost: B·(K−1) + N greedy rollouts per step (rows whose step j does not exist or is their
  last complete from the prompt and are discarded, so the shapes are static).
  """
  c, tok, K = s.c, s.data.tokenizer, s.c.max_steps
  split = step_splitter(s)

  def produce(state, batch, ctx: StepContext) -> dict:
    tokens, resp, prompt = ctx.host["tokens"], ctx.host["response_mask"], ctx.host["prompt_mask"]
    gid = ctx.host["group_id"]
    B, T = tokens.shape
    step = np.minimum(split(tokens, resp), K - 1)
    n = np.where(resp.any(1), step.max(1) + 1, 0)
    t = np.arange(T)
    plen = prompt.sum(1)
    # Completion j of row b continues prompt ⊕ steps 0..j (j = 0..K−2).
    end = np.stack([np.where(step == j, t, -1).max(1) for j in range(K - 1)], 1)  # [B,K-1]
    use = (np.arange(K - 1)[None] < n[:, None] - 1) & (end >= 0)
    cut = np.where(use, end + 1, plen[:, None]).reshape(-1)
    rows = np.repeat(np.arange(B), K - 1)
    pre_mask = t[None] < cut[:, None]
    pre_tok = np.where(pre_mask, tokens[rows], 0).astype(np.int32)
    budget = np.maximum(plen[rows] + c.max_new_tokens - cut, 0).astype(np.int32)
    model_state = s.model_state(state.params)
    out = s.sampler(model_state, prompt_tokens=pre_tok, prompt_mask=pre_mask,
                    key=ctx.key, max_new_tokens=c.max_new_tokens, temperature=0.0,
                    max_new_tokens_per_row=budget)
    h = parallel.to_host({"tokens": out.tokens, "response_mask": out.response_mask,
                          "prompt_mask": out.prompt_mask})
    width = h["tokens"].shape[1]
    whole = h["response_mask"] | (h["prompt_mask"] & (np.arange(width)[None]
                                                      >= plen[rows][:, None]))
    _, rew = _verify(s, ctx.examples, h["tokens"], whole, gid[rows])
    value = np.zeros((B, K), np.float32)
    value[:, :K - 1] = np.where(use, np.asarray(rew, np.float32).reshape(B, K - 1), 0.0)
    reward = np.asarray(parallel.to_host(batch["reward"]), np.float32)
    last = np.clip(n - 1, 0, K - 1)
    value[np.arange(B), last] = np.where(n > 0, reward, 0.0)
    mask = np.arange(K)[None] < np.minimum(n, K)[:, None]
    start = s.sampler(model_state, prompt_tokens=ctx.prompt_tokens, prompt_mask=ctx.prompt_mask,
                      key=ctx.key, max_new_tokens=c.max_new_tokens, temperature=0.0)
    hs = parallel.to_host({"tokens": start.tokens, "response_mask": start.response_mask})
    _, r0 = _verify(s, ctx.examples, hs["tokens"], hs["response_mask"],
                    np.arange(s.num_groups))
    ctx.metrics["step_completions"] = float(use.sum())
    return parallel.shard_batch({
        "step_value": value, "step_mask": mask,
        "start_value": np.asarray(r0, np.float32)[gid]}, s.mesh)

  return produce


def _task_has(method: str) -> Callable[[ml_collections.ConfigDict], bool]:
  """`when` of a producer that calls a built-in single-turn task's `method`."""
  def when(c: ml_collections.ConfigDict) -> bool:
    if is_multi_turn(c):
      return False
    try:
      task = tasks_lib.get_task(c.task, **dict(c.task_kwargs))
    except (KeyError, TypeError, ValueError):
      return False
    return callable(getattr(task, method, None))
  return when


def _tool_actions(c: ml_collections.ConfigDict) -> bool:
  """`when` of the tool-usage fields: a multi-turn task whose turns are tool calls."""
  return is_multi_turn(c) and bool(getattr(
      tasks_lib.get_task(c.task, **dict(c.task_kwargs)), "tool_actions", False))


_task_flags_spans = _task_has("flag_chars")  # character spans judged wrong


def _build_task_flags(s: Setup, wanted: frozenset) -> Produce:
  tok, task = s.data.tokenizer, s.data.task

  def produce(state, batch, ctx: StepContext) -> dict:
    tokens, resp = ctx.host["tokens"], ctx.host["response_mask"]
    examples = [tasks_lib.as_example({k: ctx.examples[k][i] for k in ctx.examples})
                for i in range(len(ctx.examples["prompt"]))]
    flags = np.zeros(resp.shape, bool)
    for b, g in enumerate(ctx.host["group_id"]):
      example = examples[g]
      ids = tokens[b][resp[b]]
      flags[b, resp[b]] = tasks_lib.token_flags(
          tok, ids, task.flag_chars(example, tok.decode(ids)))
    return {"flag_mask": parallel.shard_batch(flags, s.mesh)}

  return produce


def _build_task_decisions(s: Setup, wanted: frozenset) -> Produce:
  """decision_mask [B,T]: the response tokens at the task's `pivot_positions` (response token
  k = character k: the bifurcation tasks' character tokenizer), as `credit.bench` marks them."""
  task = s.data.task

  def produce(state, batch, ctx: StepContext) -> dict:
    resp = ctx.host["response_mask"]
    mask = np.zeros(resp.shape, bool)
    for b, g in enumerate(ctx.host["group_id"]):
      cols = np.flatnonzero(resp[b])
      for p in task.pivot_positions({k: ctx.examples[k][g] for k in ctx.examples}):
        if p < len(cols):
          mask[b, cols[p]] = True
    return {"decision_mask": parallel.shard_batch(mask, s.mesh)}

  return produce


def answer_ids(tokenizer, answer: str) -> list[int]:
  """A gold answer's token ids as the likelihood rewards teacher-force it: text + eos."""
  return list(tokenizer.encode(answer)) + [tokenizer.eos_id]


def append_answer(tokens_BS: np.ndarray, keep_BS: np.ndarray, answer_BA: np.ndarray,
                  answer_mask_BA: np.ndarray, pad_id: int) -> tuple[np.ndarray, ...]:
  """Host layout of `prefix ⊕ answer` rows for teacher-forced answer scoring.

  The kept tokens of each row stay in place (pad elsewhere); the answer follows the last
  kept column. Returns (tokens [B,S+A] int32, attn_mask [B,S+A] bool, positions [B,A] int32
  of the answer tokens; padded answer entries point past the answer, at pad).
  """
  B, S = tokens_BS.shape
  A = answer_BA.shape[1]
  cols_S = np.arange(S)
  start_B = np.where(keep_BS.any(1), np.max(np.where(keep_BS, cols_S + 1, 0), axis=1), 0)
  pos_BA = (start_B[:, None] + np.arange(A)[None, :]).astype(np.int32)
  seq = np.full((B, S + A), pad_id, np.int32)
  seq[:, :S] = np.where(keep_BS, tokens_BS, pad_id)
  attn = np.zeros((B, S + A), bool)
  attn[:, :S] = keep_BS
  np.put_along_axis(seq, pos_BA, np.where(answer_mask_BA, answer_BA, pad_id), axis=1)
  np.put_along_axis(attn, pos_BA, answer_mask_BA, axis=1)
  return seq, attn, pos_BA


# The forced sequence itself (`answer_tokens` ...), which an update needs to score the answer.
ANSWER_SEQUENCE = frozenset(credit.registry.TRAINED_SCORES["logprob_answer"])


# answer_prior_scorer = "auto": the estimators whose code scores the prior with the initial
# model (RLPR: once, before training); the others with the behaviour policy.
ANSWER_PRIOR_REFERENCE_ESTIMATORS = frozenset({"rlpr"})


def answer_prior_scorer(c: ml_collections.ConfigDict) -> str:
  """Who scores `logprob_answer_prior` (`c.answer_prior_scorer`, "auto" resolved)."""
  v = c.get("answer_prior_scorer", "auto")
  if v != "auto":
    return v
  return "reference" if c.estimator in ANSWER_PRIOR_REFERENCE_ESTIMATORS else "policy"


def _check_answer_prior(c: ml_collections.ConfigDict) -> None:
  v = c.get("answer_prior_scorer", "auto")
  if v not in ("auto", "policy", "reference"):
    raise SetupError(f"answer_prior_scorer={v!r}; valid: auto | policy | reference")


def _build_answer_prior_ref(s: Setup, wanted: frozenset) -> Produce:
  """logprob_answer_prior [B,A] scored by the frozen reference (`_build_answer_pass`)."""
  return _build_answer_pass(s, wanted, prior_from_reference=True)


def _build_answer_pass(s: Setup, wanted: frozenset, prior_from_reference: bool = False
                       ) -> Produce:
  """logprob_answer [B,A]: the gold answer's tokens (text + eos) teacher-forced after the
  prompt and the response; logprob_answer_prior [B,A]: the same after the prompt alone, by
  the policy or (`prior_from_reference`, the `answer_prior_ref` producer) by the frozen
  initial policy.

  Without a task `answer_marker` the answer follows the whole response with its final stop
  token dropped (`_response_body`), and the prior follows the prompt. With one (`chain`:
  "46,41=41", marker "="), the response is reasoning ⊕ marker ⊕ the model's own answer:
  the gold answer follows the response cut right after its first marker (the reasoning and
  the marker; what the model wrote after it is dropped), a response without the marker
  keeps all of its body and the marker is inserted (context, not scored) before the
  answer, and the prior follows prompt ⊕ marker (the response with empty reasoning). The
  marker is found as its token ids (`tokenizer.encode(marker)`) in the response; a
  tokenizer that merges it with its neighbours does not find it there (the marker is then
  inserted). `answer_mask` is the same either way: the answer's tokens and eos.

  answer_tokens / answer_attn_mask [B,P+T+A] and answer_positions [B,A]: the sequence
  `logprob_answer` is read from, for a loss that scores the answer again in the update
  (VeriFree's and JEPO's `trained_loss`).
  """
  tok, G = s.data.tokenizer, s.group_size
  # A, the answer width, is fixed for the run: the longest gold answer of the train split.
  A = max(len(answer_ids(tok, tasks_lib.as_example(e)["answer"])) for e in s.data.train)
  P = s.data.max_prompt_len
  marker = getattr(s.data.task, "answer_marker", None) or ""
  marker_ids = np.asarray(tok.encode(marker) if marker else [], np.int32)
  score = s.scorer(entropy=False)

  @jax.jit
  def answer_logprobs(params, tokens, attn_mask, pos, answer_mask):
    logprob, _ = score(params, tokens, attn_mask)
    return jnp.where(answer_mask, jnp.take_along_axis(logprob, pos, axis=1), 0.0)

  def forced(tokens, keep, ans_BA, amask_BA, insert_B):
    """append_answer with the marker inserted before the answer on rows `insert_B`; the
    positions returned are the answer's (the marker is context)."""
    if not len(marker_ids):
      return append_answer(tokens, keep, ans_BA, amask_BA, tok.pad_id)
    ans_BW, amask_BW, off_B = _marked_answer(ans_BA, amask_BA, marker_ids, insert_B,
                                             tok.pad_id)
    seq, attn, pos_BW = append_answer(tokens, keep, ans_BW, amask_BW, tok.pad_id)
    pos = np.take_along_axis(pos_BW, off_B[:, None] + np.arange(A)[None, :], axis=1)
    return seq, attn, pos

  def produce(state, batch, ctx: StepContext) -> dict:
    host = ctx.host
    tokens, resp, prompt = host["tokens"], host["response_mask"], host["prompt_mask"]
    rows = [answer_ids(tok, tasks_lib.as_example({"a": a})["a"])
            for a in ctx.examples["answer"]]
    if max(map(len, rows)) > A:
      raise ValueError(f"a gold answer of {max(map(len, rows))} tokens is longer than the "
                       f"run's answer width A={A} (the longest of the train split)")
    ans_NA, amask_NA = tasks_lib.pad_rows(rows, A, pad_id=tok.pad_id, pad_left=False)
    ans_BA, amask_BA = np.repeat(ans_NA, G, axis=0), np.repeat(amask_NA, G, axis=0)
    params = state.params
    out = {"answer_mask": parallel.shard_batch(amask_BA, s.mesh)}
    if wanted - {"answer_mask", "logprob_answer_prior"}:
      body, found_B = _cut_after_marker(tokens, _response_body(tok, tokens, resp), marker_ids)
      seq, attn, pos = forced(tokens, prompt | body, ans_BA, amask_BA, ~found_B)
      seq, attn, pos = parallel.shard_batch((seq, attn, pos), s.mesh)
      out["logprob_answer"] = answer_logprobs(params, seq, attn, pos, out["answer_mask"])
      if wanted & ANSWER_SEQUENCE:
        out.update(answer_tokens=seq, answer_attn_mask=attn, answer_positions=pos)
    if "logprob_answer_prior" in wanted:
      seq, attn, pos = forced(tokens[:, :P], prompt[:, :P], ans_BA, amask_BA,
                              np.ones(len(tokens), bool))
      prior_params = ctx.ref_params if prior_from_reference else params
      out["logprob_answer_prior"] = answer_logprobs(prior_params, *parallel.shard_batch(
          (seq, attn, pos), s.mesh), out["answer_mask"])
    return out

  return produce


def _cut_after_marker(tokens_BT: np.ndarray, body_BT: np.ndarray, marker_ids: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
  """(body [B,T] cut right after the first occurrence of `marker_ids` inside it, found [B]);
  rows without one keep their body. An empty marker: (body, all False)."""
  M, T = len(marker_ids), tokens_BT.shape[1]
  if not M:
    return body_BT, np.zeros(len(body_BT), bool)
  hit_BT = np.zeros_like(body_BT)
  hit_BT[:, :T - M + 1] = True
  for k, m in enumerate(marker_ids):
    hit_BT[:, :T - M + 1] &= (tokens_BT[:, k:T - M + 1 + k] == m) & body_BT[:, k:T - M + 1 + k]
  found_B = hit_BT.any(axis=1)
  end_B = np.where(found_B, np.argmax(hit_BT, axis=1) + M, T)
  return body_BT & (np.arange(T)[None, :] < end_B[:, None]), found_B


def _marked_answer(ans_BA: np.ndarray, amask_BA: np.ndarray, marker_ids: np.ndarray,
                   insert_B: np.ndarray, pad_id: int) -> tuple[np.ndarray, ...]:
  """Rows [B, M+A] of marker ⊕ answer (rows `insert_B`) or the answer alone (others),
  right-padded, their mask, and off [B] (the answer's first column: M or 0)."""
  M, A = len(marker_ids), ans_BA.shape[1]
  off_B = np.where(insert_B, M, 0)
  idx_BW = np.arange(M + A)[None, :] - off_B[:, None]
  inside_BW = (idx_BW >= 0) & (idx_BW < A)
  idx_BW = np.clip(idx_BW, 0, A - 1)
  mark_BW = insert_B[:, None] & (np.arange(M + A) < M)[None, :]
  marker_W = np.concatenate([marker_ids, np.zeros(A, np.int32)])
  ans_BW = np.where(mark_BW, marker_W[None, :],
                    np.where(inside_BW, np.take_along_axis(ans_BA, idx_BW, axis=1), pad_id))
  amask_BW = mark_BW | (inside_BW & np.take_along_axis(amask_BA, idx_BW, axis=1))
  return ans_BW.astype(np.int32), amask_BW, off_B


def _response_body(tok, tokens_BT: np.ndarray, resp_BT: np.ndarray) -> np.ndarray:
  """`response_mask` without each row's final stop token (a row cut at the budget keeps all
  of it): what `answer_pass` and `followup_pass` keep before their teacher-forced text."""
  stops = np.asarray(getattr(tok, "stop_ids", None) or (tok.eos_id,))
  last_B = np.max(np.where(resp_BT, np.arange(resp_BT.shape[1]), -1), axis=1)
  ends = (last_B >= 0) & np.isin(tokens_BT[np.arange(len(last_B)), last_B], stops)
  body = resp_BT.copy()
  body[np.flatnonzero(ends), last_B[ends]] = False
  return body


def _estimator_num_positive(c: ml_collections.ConfigDict) -> int | None:
  """The configured estimator's `num_positive` (estimator_kwargs, else its default); None
  when the estimator takes none (or is unknown: `check_method` refuses that itself)."""
  import inspect
  from credit import get_estimator
  try:
    est = get_estimator(c.estimator)
  except (KeyError, ValueError):
    return None
  param = inspect.signature(est.fn).parameters.get("num_positive")
  if param is None:
    return None
  return c.estimator_kwargs.get("num_positive", param.default)


def _followup_config(c: ml_collections.ConfigDict, tok) -> tuple[list[str], str]:
  """(the F follow-up texts, `c.followups_pos` then `c.followups_neg`; the separator).

  Raises SetupError naming the config field: a follow-up list that is not strings, no
  follow-up at all, an estimator whose `num_positive` is not len(followups_pos) (FLR counts
  the first num_positive of the F as positive), or, when `tok` is given, a text it cannot
  encode.
  """
  pos, neg = c.get("followups_pos"), c.get("followups_neg")
  sep = c.get("followup_separator")
  for key, texts in (("followups_pos", pos), ("followups_neg", neg)):
    if not isinstance(texts, (tuple, list)) or not all(isinstance(t, str) for t in texts):
      raise SetupError(f"{key}={texts!r} must be a tuple of strings (follow-up texts)")
  if not isinstance(sep, str):
    raise SetupError(f"followup_separator={sep!r} must be a string")
  if c.get("followup_scorer") not in FOLLOWUP_SCORERS:
    raise SetupError(f"followup_scorer={c.get('followup_scorer')!r}; valid: "
                     f"{list(FOLLOWUP_SCORERS)}")
  texts = list(pos) + list(neg)
  if not texts:
    raise SetupError("followups_pos and followups_neg are both empty: no follow-up to score")
  num_positive = _estimator_num_positive(c)
  if num_positive is not None and num_positive != len(pos):
    raise SetupError(
        f"estimator {c.estimator!r}: estimator_kwargs.num_positive={num_positive!r} but "
        f"followups_pos has {len(pos)} follow-up(s); the first num_positive of the "
        f"{len(texts)} scored follow-ups count as positive, so set "
        f"--config.estimator_kwargs.num_positive={len(pos)}")
  if tok is not None:
    for key, text in [("followup_separator", sep)] + [
        ("followups_pos" if i < len(pos) else "followups_neg", t) for i, t in enumerate(texts)]:
      try:
        tok.encode(text)
      except ValueError as e:
        raise SetupError(f"{key}: {text!r} cannot be encoded by the run's tokenizer ({e})"
                         ) from None
  return texts, sep


FOLLOWUP_SCORERS = ("reference", "policy")


def _check_followups(c: ml_collections.ConfigDict) -> None:
  """`_followup_config` at plan time, before any file is written: with the character
  tokenizer of from-scratch runs; a checkpoint's tokenizer (`init_from`) is checked when the
  producer is built."""
  _followup_config(c, None if c.get("init_from") else tasks_lib.CharTokenizer())


def _build_followup_pass(s: Setup, wanted: frozenset) -> Produce:
  """logprob_followup [B,F]: for each follow-up f, the mean log-prob of its tokens (text +
  eos) in prompt ⊕ response (its stop token dropped) ⊕ separator ⊕ f ⊕ eos.

  The separator is context only (not scored); it and each text are encoded on their own,
  so a follow-up's scored tokens are the same after every response. The F rows are fixed
  for the run and share one width W, so the jitted pass is traced once and called F times.
  The scorer is the frozen initial policy (`followup_scorer="reference"`, default: FLR scores
  with a fixed language model, which the policy cannot shift in its favour) or the current
  policy ("policy").
  """
  tok = s.data.tokenizer
  texts, sep = _followup_config(s.c, tok)
  sep_ids = list(tok.encode(sep))
  fu_FW, attend_FW = tasks_lib.pad_rows([sep_ids + answer_ids(tok, t) for t in texts], None,
                                        pad_id=tok.pad_id, pad_left=False)
  scored_FW = attend_FW & (np.arange(fu_FW.shape[1]) >= len(sep_ids))[None, :]
  score = s.scorer(entropy=False)
  use_reference = s.c.followup_scorer == "reference"

  @jax.jit
  def followup_logprob(params, tokens, attn_mask, pos, scored):
    logprob, _ = score(params, tokens, attn_mask)
    lp_BW = jnp.where(scored, jnp.take_along_axis(logprob, pos, axis=1), 0.0)
    return jnp.sum(lp_BW, axis=1) / jnp.maximum(jnp.sum(scored, axis=1), 1)

  def produce(state, batch, ctx: StepContext) -> dict:
    tokens, resp = ctx.host["tokens"], ctx.host["response_mask"]
    keep = ctx.host["prompt_mask"] | _response_body(tok, tokens, resp)
    B = tokens.shape[0]
    params = ctx.ref_params if use_reference else state.params
    lp_F = []
    for f in range(len(texts)):
      seq, attn, pos = append_answer(tokens, keep, np.repeat(fu_FW[f:f + 1], B, axis=0),
                                     np.repeat(attend_FW[f:f + 1], B, axis=0), tok.pad_id)
      lp_F.append(followup_logprob(params, *parallel.shard_batch(
          (seq, attn, pos, np.repeat(scored_FW[f:f + 1], B, axis=0)), s.mesh)))
    return {"logprob_followup": jnp.stack(lp_F, axis=-1)}

  return produce


def _prompt_texts(ctx: StepContext) -> list[str]:
  """The step's N prompts as str."""
  return [tasks_lib.as_example({"p": p})["p"] for p in ctx.examples["prompt"]]


def _prompt_width(tok, prompts: Iterable[str], what: str) -> int:
  """The longest of `prompts` as `encode_prompts` lays it out; SetupError if one cannot be
  encoded by the run's tokenizer."""
  try:
    return max(len(prompt_ids(tok, p)) for p in prompts)
  except ValueError as e:
    raise SetupError(f"{what}: the run's tokenizer cannot encode it ({e})") from None


def response_starts(ctx: StepContext) -> np.ndarray:
  """[B] int32: the column where each rollout row's response starts. The sampler packs a
  row's prompt from column 0 (`credit.sampling.SampleOutput`), so it is the row's number of
  prompt tokens, which differs between rows when prompts differ in length."""
  return np.asarray(ctx.host["prompt_mask"]).sum(axis=1).astype(np.int32)


def from_rollout(x_BT: jax.Array, start_B: jax.Array, width: int) -> jax.Array:
  """[B, T−width] the columns start_b .. start_b + T − width − 1 of each row (the response
  part of a rollout row, for width = P; columns past T are zero, the masks then False)."""
  T = x_BT.shape[1]
  cols = start_B[:, None] + jnp.arange(T - width)[None, :]
  got = jnp.take_along_axis(x_BT, jnp.minimum(cols, T - 1), axis=1)
  return jnp.where(cols < T, got, jnp.zeros((), x_BT.dtype))


def to_rollout(x_BS: jax.Array, start_B: jax.Array, width: int, T: int, fill) -> jax.Array:
  """The inverse of a re-laid row (another prompt of `width` columns, then the rollout's
  response from its column start_b): [B, width + R, ...] -> the rollout's [B, T, ...] columns,
  `fill` outside the response part. Trailing dims (top-k) are carried."""
  resp = x_BS[:, width:]
  R = resp.shape[1]
  j = jnp.arange(T)[None, :] - start_B[:, None]
  ok = (j >= 0) & (j < R)
  idx = jnp.clip(j, 0, R - 1).reshape(j.shape + (1,) * (resp.ndim - 2))
  got = jnp.take_along_axis(resp, idx, axis=1)
  return jnp.where(ok.reshape(ok.shape + (1,) * (resp.ndim - 2)), got,
                   jnp.asarray(fill, resp.dtype))


def response_layout(s: Setup, width: int) -> Callable:
  """lay(prompts [N] str, batch, attn, start) -> (tokens [B,S], attn_mask [B,S]),
  S = width + T − P: the sampled responses after other prompts (one per group; G rows each).

  The prompts are encoded as the loop encodes its own (`tasks_lib.encode_prompts`: bos,
  left padding) to the run's fixed `width` (a longer prompt raises ValueError); each row's
  response follows from its rollout column `start` (`response_starts`), so column `width + j`
  of a row is the rollout's column start_b + j (`to_rollout` maps back).
  """
  tok, G, P = s.data.tokenizer, s.group_size, s.data.max_prompt_len

  @jax.jit
  def join(prompt_tokens, prompt_mask, tokens, response_mask, start):
    return (jnp.concatenate([prompt_tokens, from_rollout(tokens, start, P)], axis=1),
            jnp.concatenate([prompt_mask, from_rollout(response_mask, start, P)], axis=1))

  def lay(prompts: list[str], batch: Mapping[str, Any], attn: Any = None, *, start):
    """`attn`: the rollout's attention mask (`StepContext.attn_mask`), so observation
    tokens of multi-turn rows stay visible; default: the response tokens only. `start`:
    [B] `response_starts` of the rollout."""
    toks, mask = tasks_lib.encode_prompts(tok, prompts, width)
    toks, mask = np.repeat(toks, G, axis=0), np.repeat(mask, G, axis=0)
    return join(*parallel.shard_batch((toks, mask), s.mesh), batch["tokens"],
                batch["response_mask"] if attn is None else attn,
                parallel.shard_batch(np.asarray(start, np.int32), s.mesh))

  return lay


def _response_rescorer(s: Setup, width: int) -> Callable:
  """rescore(params, prompts [N] str, batch, start) -> [B,T] log-probs of the sampled
  response tokens after other prompts (`response_layout`), 0 outside `response_mask`."""
  score = s.scorer(entropy=False)
  lay = response_layout(s, width)

  @jax.jit
  def rescore(params, seq, attn, response_mask, start):
    logprob, _ = score(params, seq, attn)
    return jnp.where(response_mask, to_rollout(logprob, start, width, response_mask.shape[1],
                                               0.0), 0.0)

  def run(params, prompts: list[str], batch: Mapping[str, Any], start):
    return rescore(params, *lay(prompts, batch, start=start), batch["response_mask"],
                   parallel.shard_batch(np.asarray(start, np.int32), s.mesh))

  return run


ALT_CONTEXTS = {"logprob_alt_pos": "alt_context_pos", "logprob_alt_neg": "alt_context_neg",
                "logprob_alt": "alt_context"}


def _alt_sample(prefix: str, mistake_len: int = 1) -> str:
  """An alt_context template with its fields filled by placeholder digits."""
  return prefix.replace("{answer}", "0").replace("{mistake}", "0" * mistake_len)


def _alt_contexts_encodable(c: ml_collections.ConfigDict) -> bool:
  """The alt_context prefixes are strings the run's tokenizer can encode: checked here, before
  any file is written, for the character tokenizer of from-scratch runs; a checkpoint's
  tokenizer (`init_from`) is checked when the producer is built."""
  prefixes = [c.get(key) for key in ALT_CONTEXTS.values()]
  if not all(isinstance(p, str) for p in prefixes):
    return False
  if c.get("init_from"):
    return True
  try:
    for p in prefixes:
      tasks_lib.CharTokenizer().encode(_alt_sample(p))
  except ValueError:
    return False
  return True


def _group_mistakes(texts: list[str], reward: np.ndarray, G: int, threshold: float,
                    max_chars: int) -> list[str]:
  """Per group: the first response with reward < threshold, cut to `max_chars` ("" when the
  group has none)."""
  out = []
  for n in range(len(texts) // G):
    wrong = [texts[n * G + j] for j in range(G) if reward[n * G + j] < threshold]
    out.append(wrong[0].strip()[:max_chars] if wrong else "")
  return out


def _build_alt_context_pass(s: Setup, wanted: frozenset) -> Produce:
  """logprob_alt_pos / logprob_alt_neg: the response re-scored after c.alt_context_pos /
  c.alt_context_neg ⊕ prompt. A template may hold {answer} (the example's gold answer: a
  privileged self-teacher context, SIPO) and {mistake} (the first response of the group
  with reward below 1, cut to max_new_tokens characters; "" when the group has none)."""
  tok, G, c = s.data.tokenizer, s.group_size, s.c
  prefixes = {}
  for field in sorted(wanted):
    key = ALT_CONTEXTS[field]
    prefix = c[key]
    if not isinstance(prefix, str):
      raise SetupError(f"{key}={prefix!r} must be a string (a prefix of the prompt)")
    try:
      tok.encode(_alt_sample(prefix))
    except ValueError as e:
      raise SetupError(f"{key}={prefix!r} cannot be encoded by the run's tokenizer ({e})"
                       ) from None
    prefixes[field] = prefix
  mistake_len = c.max_new_tokens

  def fill(prefix: str, example: Mapping[str, Any], mistake: str) -> str:
    return (prefix.replace("{answer}", str(example.get("answer", "")))
            .replace("{mistake}", mistake) + example["prompt"])

  # The width of the modified prompts is fixed for the run: the longest over the train split
  # (a mistake counted at its longest).
  width = _prompt_width(tok, (fill(p, tasks_lib.as_example(e), "0" * mistake_len)
                              for p in prefixes.values() for e in s.data.train),
                        "a prompt with its alt_context prefix")
  rescore = _response_rescorer(s, width)
  uses_mistake = any("{mistake}" in p for p in prefixes.values())

  def produce(state, batch, ctx: StepContext) -> dict:
    examples = _examples_rows(ctx.examples)
    mistakes = [""] * len(examples)
    if uses_mistake:
      texts = ctx.host.get("texts") or tasks_lib.decode_responses(
          tok, ctx.host["tokens"], ctx.host["response_mask"])
      reward = parallel.to_host(batch["reward"])
      mistakes = _group_mistakes(texts, reward, G, 1.0, mistake_len)
    start = response_starts(ctx)
    return {f: rescore(state.params, [fill(p, e, m) for e, m in zip(examples, mistakes)],
                       batch, start)
            for f, p in prefixes.items()}

  return produce


def _build_interventions_pass(s: Setup, wanted: frozenset) -> Produce:
  tok, task = s.data.tokenizer, s.data.task

  def interventions(example) -> list[str]:
    return task.interventions(tasks_lib.as_example(example))

  train_prompts = [interventions(e) for e in s.data.train]
  M = len(train_prompts[0])
  if M < 1 or any(len(ps) != M for ps in train_prompts):
    raise SetupError(f"task {task.name!r}: `interventions` must give the same number M >= 1 "
                     f"of prompts for every example, got {sorted({len(p) for p in train_prompts})}")
  width = _prompt_width(tok, (p for ps in train_prompts for p in ps),
                        f"an intervention prompt of task {task.name!r}")
  rescore = _response_rescorer(s, width)

  def produce(state, batch, ctx: StepContext) -> dict:
    n = len(ctx.examples["prompt"])
    rows = [interventions({k: ctx.examples[k][i] for k in ctx.examples}) for i in range(n)]
    if any(len(r) != M for r in rows):
      raise ValueError(f"task {task.name!r} gave {sorted({len(r) for r in rows})} "
                       f"interventions; the run's M is {M}")
    start = response_starts(ctx)
    return {"logprob_interventions": jnp.stack(
        [rescore(state.params, [r[m] for r in rows], batch, start) for m in range(M)],
        axis=-1)}

  return produce


# --------------------------------------------------------------------------
# Teachers: a frozen model from a local checkpoint, or the policy under a privileged context.
# --------------------------------------------------------------------------

TEACHER_FIELDS = ("logprob_teacher", "teacher_topk_logprob", "teacher_topk_ids")
CHAR_TOKENIZER_FILE = "char_tokenizer.json"  # written by exports of from-scratch runs


def _json(path: str, what: str) -> dict:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise SetupError(f"{what}: cannot read {path} ({e})") from None


def tokenizer_identity(directory: str) -> tuple[str, Any] | None:
  """What identifies a checkpoint's tokenizer: ("char", chars) for exports of from-scratch
  runs (`char_tokenizer.json`), ("hf", (vocab, added tokens)) for a Hugging Face
  `tokenizer.json`, None when the directory has neither."""
  char = os.path.join(directory, CHAR_TOKENIZER_FILE)
  if os.path.exists(char):
    return "char", _json(char, directory).get("chars")
  hf = os.path.join(directory, "tokenizer.json")
  if os.path.exists(hf):
    j = _json(hf, directory)
    added = sorted((t.get("id"), t.get("content")) for t in j.get("added_tokens", []))
    return "hf", (json.dumps(j.get("model", {}).get("vocab"), sort_keys=True), added)
  return None


def check_teacher_files(c: ml_collections.ConfigDict) -> None:
  """A frozen teacher (`c.teacher.init_from`) must share the student's tokenizer and
  vocabulary size: checked from the files, before any file is written."""
  path = c.teacher.init_from
  what = f"teacher.init_from={path!r}"
  if not os.path.isdir(path) or not os.path.exists(os.path.join(path, "config.json")):
    raise SetupError(f"{what} is not a checkpoint directory (no config.json)")
  if not any(f.endswith(".safetensors") for f in os.listdir(path)):
    raise SetupError(f"{what} has no *.safetensors weights")
  student_dir = c.init_from or c.get("warm_start_from", "")
  if c.init_from:
    student = tokenizer_identity(c.init_from)
    student_vocab = _json(os.path.join(c.init_from, "config.json"), "init_from").get(
        "vocab_size")
  else:
    student = ("char", tasks_lib.CharTokenizer().chars)
    student_vocab = tasks_lib.CharTokenizer().vocab_size
  teacher = tokenizer_identity(path)
  if teacher is None:
    raise SetupError(f"{what} has neither tokenizer.json nor {CHAR_TOKENIZER_FILE}: its "
                     "tokenizer cannot be checked against the student's (export it with this "
                     "library, or copy the tokenizer files next to its weights)")
  if teacher != student:
    kinds = {"char": "the character tokenizer of from-scratch runs",
             "hf": "a Hugging Face tokenizer.json"}
    detail = (f"the teacher has {kinds[teacher[0]]}, the student "
              f"({student_dir or 'from scratch'}) {kinds[student[0]]}"
              if teacher[0] != student[0] else "their vocabularies differ")
    raise SetupError(f"{what}: the teacher's tokenizer is not the student's ({detail}); "
                     "distillation compares the two models' probabilities of the same token "
                     "ids, so they must share one tokenizer")
  teacher_vocab = _json(os.path.join(path, "config.json"), what).get("vocab_size")
  if teacher_vocab != student_vocab:
    raise SetupError(f"{what}: its vocab_size {teacher_vocab} is not the student's "
                     f"{student_vocab} (same tokenizer, different embedding tables)")


def _teacher_scorer(graphdef, rest, chunk: int | None, top_k: int, width: int | None,
                    names: tuple[str, ...]) -> Callable:
  """jitted fn(params, seq, attn, response_mask, start) -> the wanted teacher fields,
  aligned to the rollout: `seq` is the rollout itself (`width` None; `start` unused) or
  re-laid by `response_layout` (a prompt of `width` columns, then each row's response from
  its rollout column `start`)."""

  @jax.jit
  def run(params, seq, attn, response_mask, start=None):
    model = train.merge_model(graphdef, params, rest)
    hidden, unembed, mask = scoring.model_hidden(model, seq, attn)
    ts = scoring.teacher_scores_hidden(hidden, unembed, seq, mask, top_k=top_k,
                                       chunk_size=chunk)

    def rollout_columns(x, fill):
      if width is None:
        return x
      return to_rollout(x, start, width, response_mask.shape[1], fill)

    out = {"logprob_teacher": jnp.where(response_mask, rollout_columns(ts.logprob, 0.0), 0.0)}
    if top_k:
      m = response_mask[..., None]
      out["teacher_topk_logprob"] = jnp.where(m, rollout_columns(ts.topk_logprob, 0.0), 0.0)
      out["teacher_topk_ids"] = jnp.where(m, rollout_columns(ts.topk_ids, -1), -1)
    return {n: out[n] for n in names}

  return run


def _teacher_top_k(s: Setup, wanted: frozenset) -> int:
  if not wanted & {"teacher_topk_logprob", "teacher_topk_ids"}:
    return 0
  if s.c.teacher.top_k < 1:
    raise SetupError(f"teacher.top_k={s.c.teacher.top_k}: the method needs the teacher's top-k "
                     "distribution (teacher_topk_*), so top_k must be >= 1")
  return int(s.c.teacher.top_k)


def _build_teacher_pass(s: Setup, wanted: frozenset) -> Produce:
  """The frozen teacher (`c.teacher.init_from`, its own dtype, sharded on the run's mesh)
  scores the student's tokens: log-prob of each sampled token and, when wanted, its top-k
  distribution with a tail bucket (chunked: no [B,T,V] array)."""
  from credit import models  # pylint: disable=g-import-not-at-top
  tc = s.c.teacher
  teacher, _ = models.from_pretrained(tc.init_from, mesh=s.mesh, param_dtype=tc.param_dtype,
                                      dtype=tc.compute_dtype)
  graphdef, params, rest = train.split_model(teacher)
  run = _teacher_scorer(graphdef, rest, s.chunk_size, _teacher_top_k(s, wanted), None,
                        tuple(sorted(wanted)))

  def produce(state, batch, ctx: StepContext) -> dict:
    return run(params, batch["tokens"], ctx.attn_mask, batch["response_mask"])

  return produce


def _task_context(task, example: Mapping[str, Any], kind: str) -> str:
  """The privileged text of `kind` for one example: the gold answer for "answer", else the
  task's `privileged_context(example, kind)`."""
  if kind == "answer":
    return str(example["answer"])
  fn = getattr(task, "privileged_context", None)
  if fn is None:
    raise SetupError(f"teacher.context={kind!r}: task {getattr(task, 'name', task)!r} provides "
                     "no privileged contexts (only 'answer' works for every task)")
  return fn(example, kind)


def _self_teacher_on(c: ml_collections.ConfigDict) -> bool:
  return bool(c.teacher.context) and not c.teacher.init_from


def _check_self_teacher(c: ml_collections.ConfigDict) -> None:
  if c.teacher.lag < 0:
    raise SetupError(f"teacher.lag={c.teacher.lag} must be >= 0")
  check_context(c, c.teacher.context, "teacher.context")


def check_context(c: ml_collections.ConfigDict, kind: str, what: str) -> None:
  """SetupError unless the task gives privileged context `kind` (`what` names the setting)."""
  if "{text}" not in c.teacher.prefix:
    raise SetupError(f"teacher.prefix={c.teacher.prefix!r} must contain {{text}}, where the "
                     f"privileged context goes ({what})")
  if kind == "answer":
    return
  if c.task in ("jsonl", "tfds"):
    raise SetupError(f"{what}={kind!r}: user data has only the 'answer' context")
  try:
    task = tasks_lib.get_task(c.task, **dict(c.task_kwargs))
    _task_context(task, task.generate(np.random.default_rng(0), 1)[0], kind)
  except (KeyError, TypeError):
    return  # build_data reports the bad task
  except ValueError as e:
    raise SetupError(f"{what}={kind!r}: {e}") from None


def privileged_prompt(c: ml_collections.ConfigDict, task, example: Mapping[str, Any],
                      kind: str) -> str:
  """`c.teacher.prefix` with the privileged text of `kind` for `example`, then its prompt."""
  example = tasks_lib.as_example(example)
  return c.teacher.prefix.format(context=kind, text=_task_context(task, example, kind)
                                 ) + example["prompt"]


def _init_self_teacher(s: Setup, policy_params) -> Any:
  """With `teacher.lag` = n > 0, the self-teacher's copy of the policy (refreshed every n
  steps, checkpointed with the run); None with lag 0 (the current policy scores)."""
  if not s.c.teacher.lag:
    return None
  return learners.LearnerState(params=jax.tree.map(jnp.copy, policy_params), opt_state=None,
                               step=jnp.zeros((), jnp.int32))


def _build_self_teacher_pass(s: Setup, wanted: frozenset):
  """The policy as its own teacher: the student's tokens re-scored after
  `c.teacher.prefix` (with the privileged text of `c.teacher.context`) ⊕ prompt, by the
  current parameters or (`c.teacher.lag` = n) a copy refreshed every n steps."""
  c, tok, task = s.c, s.data.tokenizer, s.data.task
  kind, lag, name = c.teacher.context, int(c.teacher.lag), "self_teacher_pass"

  def prompt_of(example) -> str:
    return privileged_prompt(c, task, example, kind)

  width = _prompt_width(tok, (prompt_of(e) for e in s.data.train),
                        f"a prompt with its teacher context {c.teacher.prefix!r}")
  lay = response_layout(s, width)
  run = _teacher_scorer(s.graphdef, s.rest, s.chunk_size, _teacher_top_k(s, wanted), width,
                        tuple(sorted(wanted)))

  def produce(state, batch, ctx: StepContext) -> dict:
    params = state.params
    if lag:
      held = ctx.learners[name]
      if int(state.step) % lag == 0:  # refresh the lagged copy
        # Copies: the update donates the train state's buffers.
        held = held.replace(params=jax.tree.map(jnp.copy, state.params),
                            step=jnp.copy(state.step))
        ctx.learners[name] = held
      params = held.params
    prompts = [prompt_of({k: ctx.examples[k][i] for k in ctx.examples})
               for i in range(len(ctx.examples["prompt"]))]
    start = response_starts(ctx)
    seq, attn = lay(prompts, batch, ctx.attn_mask, start=start)
    return run(params, seq, attn, batch["response_mask"],
               parallel.shard_batch(start, s.mesh))

  return produce, None


def _build_evidence_pass(s: Setup, wanted: frozenset) -> Produce:
  """VERPO's Fisher Evidence Contrast: `evidence_nuisance` from the current policy's hidden
  states without (the rollout) and with the privileged context (`c.teacher.context` after
  `c.teacher.prefix`, as the self-teacher pass lays it out), by
  `credit.advantages.distill.verpo.evidence_nuisance` (λ = `c.teacher.fec_lambda`)."""
  from credit.advantages.distill.verpo import evidence_nuisance  # pylint: disable=g-import-not-at-top
  c, tok, task = s.c, s.data.tokenizer, s.data.task
  kind = c.teacher.context
  width = _prompt_width(tok, (privileged_prompt(c, task, e, kind) for e in s.data.train),
                        f"a prompt with its teacher context {c.teacher.prefix!r}")
  lay = response_layout(s, width)

  @jax.jit
  def run(params, tokens, attn, seq, seq_attn, response_mask, start):
    model = train.merge_model(s.graphdef, params, s.rest)
    h0, unembed, m0 = scoring.model_hidden(model, tokens, attn)
    he, _, me = scoring.model_hidden(model, seq, seq_attn)
    h0, _ = scoring.next_token_hidden(h0, m0)
    he, _ = scoring.next_token_hidden(he, me)
    he = to_rollout(he, start, width, tokens.shape[1], 0.0)
    return evidence_nuisance(hidden_plain=h0, hidden_evidence=he, unembed=unembed,
                             tokens=tokens, mask=response_mask, fec_lambda=c.teacher.fec_lambda,
                             chunk_size=s.chunk_size)

  def produce(state, batch, ctx: StepContext) -> dict:
    prompts = [privileged_prompt(c, task, {k: ctx.examples[k][i] for k in ctx.examples}, kind)
               for i in range(len(ctx.examples["prompt"]))]
    start = response_starts(ctx)
    seq, seq_attn = lay(prompts, batch, ctx.attn_mask, start=start)
    return {"evidence_nuisance": run(state.params, batch["tokens"], ctx.attn_mask, seq,
                                     seq_attn, batch["response_mask"],
                                     parallel.shard_batch(start, s.mesh))}

  return produce


# --------------------------------------------------------------------------
# Response structure: steps, queries, parsed answers.
# --------------------------------------------------------------------------


def step_splitter(s: Setup) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
  """`split(tokens, response_mask) -> step_id`: the response cut into steps after every token
  whose text holds one of `c.step_delimiters` (the delimiter closes its step; −1 outside)."""
  tok = s.data.tokenizer
  ends = np.zeros(tok.vocab_size + 1, bool)  # token id -> closes a step (by its own text)
  ends[delimiter_ids(tok, s.c.step_delimiters)] = True

  def split(tokens: np.ndarray, resp: np.ndarray) -> np.ndarray:
    closes = ends[np.clip(tokens, 0, tok.vocab_size)] & resp
    before = np.cumsum(closes, axis=1) - closes
    return np.where(resp, before, -1).astype(np.int32)

  return split


def _build_step_segments(s: Setup, wanted: frozenset) -> Produce:
  """step_id [B,T]: the turn of each policy token in multi-turn rollouts; in single-turn
  ones `step_splitter`'s steps of the response (of a tree row: of its whole path)."""
  split = step_splitter(s)

  def produce(state, batch, ctx: StepContext) -> dict:
    return {"step_id": parallel.shard_batch(_steps_of(s, ctx, split), s.mesh)}

  return produce


def stable_hash31(data: bytes) -> int:
  """A 31-bit content hash, stable across processes (Python's `hash` of str is salted)."""
  return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") & 0x7FFFFFFF


def _steps_of(s: Setup, ctx: StepContext, split) -> np.ndarray:
  """[B,T] step of every response token: turns of multi-turn rows, else `split`'s steps."""
  resp = ctx.host["response_mask"]
  if is_multi_turn(s.c):  # not `"turn_id" in ctx.host`: the single-turn rollout has one turn
    return np.where(resp, ctx.host["turn_id"], -1).astype(np.int32)
  return split(ctx.host["tokens"], resp)


def _build_step_graph(s: Setup, wanted: frozenset) -> Produce:
  """step_key / step_mask [B,K] and anchor_id [B,T] from the content of each step.

  step_key[b,k]: a 31-bit hash of (prompt, the tokens of steps 0..k) — the state before step
  k and its action — so two rows of a prompt share a key exactly when their paths agree up
  to the end of that step (SALT's trajectory graph on single-turn reasoning; in multi-turn
  rows the observations are part of the path). anchor_id: the tokens of a step whose text
  (the step's tokens alone, wherever it occurs) recurs in another row of the prompt group
  get that text's id, numbered in order of first occurrence per group; other tokens −1
  (DiDPO's anchors: identical sub-steps across a group's trajectories). Steps past K−1 =
  c.max_steps − 1 (c.max_turns for multi-turn) merge into the last entry.
  """
  K = s.c.max_turns if is_multi_turn(s.c) else s.c.max_steps
  split = step_splitter(s)

  def produce(state, batch, ctx: StepContext) -> dict:
    tokens, gid = ctx.host["tokens"], ctx.host["group_id"]
    valid = ctx.host["prompt_mask"] | ctx.host["response_mask"] | ctx.host.get(
        "obs_mask", np.zeros_like(tokens, bool))
    step = np.minimum(_steps_of(s, ctx, split), K - 1)
    B, T = tokens.shape
    key = np.zeros((B, K), np.int32)
    mask = np.zeros((B, K), bool)
    anchor = np.full((B, T), -1, np.int32)
    texts: dict[tuple, list] = {}
    for b in range(B):
      for k in range(K):
        cols = np.flatnonzero(step[b] == k)
        if not len(cols):
          continue
        mask[b, k] = True
        upto = tokens[b, :cols[-1] + 1][valid[b, :cols[-1] + 1]]
        key[b, k] = stable_hash31(upto.astype(np.int32).tobytes())
        texts.setdefault((int(gid[b]), tokens[b, cols].tobytes()), []).append((b, cols))
    ids: dict[int, int] = {}
    for (g, _), occ in texts.items():
      if len({b for b, _ in occ}) >= 2:
        a = ids[g] = ids.get(g, -1) + 1
        for b, cols in occ:
          anchor[b, cols] = a
    return parallel.shard_batch({"step_key": key, "step_mask": mask, "anchor_id": anchor},
                                s.mesh)

  return produce


def judged_steps(tok, task, example, tokens_row: np.ndarray, step_row: np.ndarray,
                 stop: Iterable[int]) -> list[tuple[int, bool]]:
  """(k, right) for each step k present in `step_row` (ascending) of one response: the task's
  `judge_step` on the step's text after the steps before it; right = no part judged wrong.
  Stop tokens are left out of the text."""
  stop = set(stop)
  before: list[str] = []
  out = []
  for k in np.unique(step_row[step_row >= 0]):
    text = tok.decode([int(i) for i in tokens_row[step_row == k] if int(i) not in stop])
    think, other, _ = task.judge_step(example, before, text)
    out.append((int(k), think >= 0 and other >= 0))
    before.append(text)
  return out


def _build_step_judge(s: Setup, wanted: frozenset) -> Produce:
  """step_reward / step_mask [B,K]: the task's step judge on each step of each response
  (`judge_step`: 1 when the step is right — no part judged wrong — else 0), a verifiable
  process reward in the place of a PRM's step scores (ProRAG, SPARK's verdicts)."""
  tok, task, K = s.data.tokenizer, s.data.task, s.c.max_steps
  split = step_splitter(s)
  eos = set(getattr(tok, "stop_ids", None) or (tok.eos_id,))

  def produce(state, batch, ctx: StepContext) -> dict:
    tokens, resp, gid = ctx.host["tokens"], ctx.host["response_mask"], ctx.host["group_id"]
    step = np.minimum(split(tokens, resp), K - 1)
    B = len(tokens)
    reward = np.zeros((B, K), np.float32)
    mask = np.zeros((B, K), bool)
    for b in range(B):
      row = {k: ctx.examples[k][gid[b]] for k in ctx.examples}
      for k, right in judged_steps(tok, task, row, tokens[b], step[b], eos):
        reward[b, k], mask[b, k] = float(right), True
    return parallel.shard_batch({"step_reward": reward, "step_mask": mask}, s.mesh)

  return produce


def _build_format_check(s: Setup, wanted: frozenset) -> Produce:
  """format_ok [B]: the task's `format_ok(example, text)` where it has one, else the response
  ended by itself (a stop token, not the length limit)."""
  tok, task = s.data.tokenizer, s.data.task
  check = getattr(task, "format_ok", None)
  stops = np.asarray(getattr(tok, "stop_ids", None) or (tok.eos_id,))

  def produce(state, batch, ctx: StepContext) -> dict:
    tokens, resp = ctx.host["tokens"], ctx.host["response_mask"]
    if check is not None:
      texts = ctx.host.get("texts") or tasks_lib.decode_responses(tok, tokens, resp)
      rows = [{k: ctx.examples[k][g] for k in ctx.examples} for g in ctx.host["group_id"]]
      ok = np.asarray([bool(check(r, t)) for r, t in zip(rows, texts)])
    else:
      last = np.where(resp.any(1), resp.shape[1] - 1 - np.argmax(resp[:, ::-1], axis=1), 0)
      ok = resp.any(1) & np.isin(tokens[np.arange(len(tokens)), last], stops)
    return {"format_ok": parallel.shard_batch(ok, s.mesh)}

  return produce


def _build_query_mask(s: Setup, wanted: frozenset) -> Produce:
  """query_mask [B,T]: in multi-turn rollouts, the policy tokens of the argument of each
  turn's tool call (`credit.envs.query_chars`; answers are not queries); in single-turn
  ones, the whole response (a single-turn analogue: every token is the "query")."""
  from credit.envs import ToolFormat, query_chars  # pylint: disable=g-import-not-at-top
  tok = s.data.tokenizer
  fmt = getattr(s.data.task, "fmt", None) or ToolFormat()

  def produce(state, batch, ctx: StepContext) -> dict:
    resp = ctx.host["response_mask"]
    if not is_multi_turn(s.c):  # the single-turn rollout's host has a turn_id too (one turn)
      return {"query_mask": parallel.shard_batch(resp.copy(), s.mesh)}
    tokens, turn = ctx.host["tokens"], ctx.host["turn_id"]
    out = np.zeros(resp.shape, bool)
    for b in range(resp.shape[0]):
      for k in np.unique(turn[b][resp[b] & (turn[b] >= 0)]):
        cols = np.nonzero(resp[b] & (turn[b] == k))[0]
        ids = tokens[b, cols]
        out[b, cols] = tasks_lib.token_flags(tok, ids, query_chars(tok.decode(ids), fmt))
    return {"query_mask": parallel.shard_batch(out, s.mesh)}

  return produce


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_number(text: str) -> float:
  """The last number written in `text` (NaN when there is none): the default parse of a
  response's final answer for `answer_value`."""
  found = _NUMBER.findall(text)
  return float(found[-1]) if found else float("nan")


def _build_answer_value(s: Setup, wanted: frozenset) -> Produce:
  """answer_value [B]: the task's `answer_value(text)` of each response's final answer, or
  the last number in it (`last_number`); for multi-turn episodes, of the last action."""
  tok, task = s.data.tokenizer, s.data.task
  parse = getattr(task, "answer_value", None) or last_number

  def produce(state, batch, ctx: StepContext) -> dict:
    if "trajectories" in ctx.extras:
      texts = [t.actions[-1] if t.actions else "" for t in ctx.extras["trajectories"]]
    else:
      texts = tasks_lib.decode_responses(tok, ctx.host["tokens"], ctx.host["response_mask"])
    values = np.asarray([parse(t) for t in texts], np.float32)
    return {"answer_value": parallel.shard_batch(values, s.mesh)}

  return produce


def _response_rows(s: Setup, ctx: StepContext):
  """(example, response token ids, response text, response positions) of every row."""
  tok = s.data.tokenizer
  tokens, resp = ctx.host["tokens"], ctx.host["response_mask"]
  examples = _examples_rows(ctx.examples)
  for b, g in enumerate(ctx.host["group_id"]):
    ids = tokens[b][resp[b]]
    yield examples[g], ids, tok.decode(ids), np.flatnonzero(resp[b])


def _build_subproblems(s: Setup, wanted: frozenset) -> Produce:
  """sub_rewards / sub_mask [B,J] and span_id [B,T]: the task's `subproblems` (SCRL) — a
  verifier result per subproblem, and the subproblem whose answer span holds each token
  (the characters' span ids through `token_flags`, one subproblem at a time)."""
  tok, task = s.data.tokenizer, s.data.task
  J = task.num_subproblems

  def produce(state, batch, ctx: StepContext) -> dict:
    B, T = ctx.host["response_mask"].shape
    sub, sub_mask = np.zeros((B, J), np.float32), np.zeros((B, J), bool)
    span = np.full((B, T), -1, np.int32)
    for b, (example, ids, text, pos) in enumerate(_response_rows(s, ctx)):
      rewards, char_span = task.subproblems(example, text)
      n = len(rewards)
      sub[b, :n], sub_mask[b, :n] = rewards, True
      row = np.full(len(ids), -1, np.int32)
      for j in range(n):
        row[tasks_lib.token_flags(tok, ids, char_span == j) & (row < 0)] = j
      span[b, pos] = row
    return parallel.shard_batch({"sub_rewards": sub, "sub_mask": sub_mask, "span_id": span},
                                s.mesh)

  return produce


def _build_unit_tests(s: Setup, wanted: frozenset) -> Produce:
  """test_pass / test_mask [B,U]: the task's `test_pass` — each response run on every unit
  test by the task's own interpreter (limits included: a failing run fails its test)."""
  task = s.data.task
  U = task.num_tests

  def produce(state, batch, ctx: StepContext) -> dict:
    rows = list(_response_rows(s, ctx))
    passed = np.asarray([task.test_pass(e, text) for e, _, text, _ in rows], np.float32)
    return parallel.shard_batch({"test_pass": passed.reshape(len(rows), U),
                                 "test_mask": np.ones((len(rows), U), bool)}, s.mesh)

  return produce


def _build_rubric(s: Setup, wanted: frozenset) -> Produce:
  """rubric / rubric_mask [B,C]: the task's `rubric` items judged on each response."""
  task = s.data.task
  C = task.num_rubric_items

  def produce(state, batch, ctx: StepContext) -> dict:
    rows = list(_response_rows(s, ctx))
    rubric, mask = np.zeros((len(rows), C), np.float32), np.zeros((len(rows), C), bool)
    for b, (example, _, text, _) in enumerate(rows):
      items = task.rubric(example, text)
      rubric[b, :len(items)], mask[b, :len(items)] = items, True
    return parallel.shard_batch({"rubric": rubric, "rubric_mask": mask}, s.mesh)

  return produce


def _build_tool_usage(s: Setup, wanted: frozenset) -> Produce:
  """tool_calls / tool_cost [B] of multi-turn episodes: the turns that called a tool (a
  well-formed call), and every turn that cost an environment round without answering (the
  calls plus malformed actions)."""
  from credit.envs import tools as tools_lib  # pylint: disable=g-import-not-at-top

  def produce(state, batch, ctx: StepContext) -> dict:
    calls, cost = [], []
    for t in ctx.extras["trajectories"]:
      kinds = [r.info["action"].kind for r in t.results if r is not None and r.info]
      calls.append(sum(k == tools_lib.CALL for k in kinds))
      cost.append(sum(k != tools_lib.ANSWER for k in kinds))
    return parallel.shard_batch({"tool_calls": np.asarray(calls, np.int32),
                                 "tool_cost": np.asarray(cost, np.float32)}, s.mesh)

  return produce


# reward_components columns (c.reward_components): name -> (task method it needs or None, doc).
REWARD_COMPONENTS = {
    "outcome": (None, "the verifier's reward"),
    "format": (None, "1 when the response has the task's format (format_ok; else it ended "
                     "with a stop token)"),
    "rubric": ("rubric", "the fraction of the task's rubric items met"),
    "subproblems": ("subproblems", "the fraction of the task's subproblems answered right"),
    "tests": ("test_pass", "the fraction of the task's unit tests passed"),
    "brevity": (None, "1 − response tokens / max_new_tokens"),
}


def _check_reward_components(c: ml_collections.ConfigDict) -> None:
  names = list(c.reward_components)
  bad = [n for n in names if n not in REWARD_COMPONENTS]
  if bad:
    raise SetupError(f"reward_components {bad} unknown; known: {list(REWARD_COMPONENTS)}")
  if is_multi_turn(c):
    raise SetupError("reward_components are single-turn (multi-turn episodes report per-turn "
                     "rewards themselves)")
  task = tasks_lib.get_task(c.task, **dict(c.task_kwargs)) if c.task in tasks_lib.list_tasks(
      ) else None
  for n in names:
    method = REWARD_COMPONENTS[n][0]
    if method and not callable(getattr(task, method, None)):
      raise SetupError(f"reward_components: {n!r} needs a built-in task with `{method}` "
                       f"(task {c.task!r} has none)")


def _build_reward_components(s: Setup, wanted: frozenset) -> Produce:
  """reward_components [B,R]: the columns c.reward_components names (REWARD_COMPONENTS), in
  that order — several reward signals per response for multi-reward estimators (GDPO's
  decoupled normalisation, SearchLLM's gates and objectives)."""
  tok, task, names = s.data.tokenizer, s.data.task, list(s.c.reward_components)
  stops = np.asarray(getattr(tok, "stop_ids", None) or (tok.eos_id,))
  fmt = getattr(task, "format_ok", None)

  def produce(state, batch, ctx: StepContext) -> dict:
    rows = list(_response_rows(s, ctx))
    resp = ctx.host["response_mask"]
    reward = np.asarray(parallel.to_host(batch["reward"]), np.float32)
    cols = []
    for n in names:
      if n == "outcome":
        cols.append(reward)
      elif n == "format":
        if fmt is not None:
          cols.append([float(fmt(e, text)) for e, _, text, _ in rows])
        else:
          cols.append([float(len(ids) > 0 and np.isin(ids[-1], stops)) for _, ids, _, _ in rows])
      elif n == "rubric":
        cols.append([float(np.mean(task.rubric(e, t) or [0.0])) for e, _, t, _ in rows])
      elif n == "subproblems":
        cols.append([float(np.mean(task.subproblems(e, t)[0])) for e, _, t, _ in rows])
      elif n == "tests":
        cols.append([float(np.mean(task.test_pass(e, t))) for e, _, t, _ in rows])
      else:  # brevity
        cols.append(1.0 - resp.sum(1) / s.c.max_new_tokens)
    comps = np.stack([np.asarray(col, np.float32) for col in cols], 1)
    return {"reward_components": parallel.shard_batch(comps, s.mesh)}

  return produce


LOGPROB_OLD_SOURCES = ("recompute", "sampler")


def _prm_producer(name: str, reference: str, doc: str) -> Producer:
  """An online implicit PRM's row: `logprob_prm` from `learners.build_prm`, on when the
  estimator reads it against `reference` (`learners.prm_reference`)."""
  other = "implicit_prm_old" if reference == "logprob_ref" else "implicit_prm"
  return Producer(name, ("logprob_prm",),
                  ("tokens", "response_mask", "reward", "group_id", reference),
                  learners.build_prm, "prm", doc, init=learners.init_prm,
                  check=learners.check_prm_config,
                  when=lambda c: learners.prm_reference(c) == reference,
                  off_doc=f"the estimator reads logprob_prm against another reference: {other}")


# The table. Order matters only between producers of the same field: the first enabled
# one makes it. The first row is the root (every step starts with the rollout).
PRODUCERS: tuple[Producer, ...] = (
    Producer("logo_rollout", ("tokens", "response_mask", "group_id", "prompt_id", "obs_mask",
                              "turn_id", "logprob_sampler", "reward", "step_reward",
                              "step_mask", "turn_progress", "turn_role", "parent_id",
                              "prefix_len"), (), _build_logo_rollout, "sampling",
             "env_rollout's G episodes per prompt, then Memory-R2's local re-rollouts: "
             "c.logo.branch_rows episodes (distinct, >= 2 turns) each restored to its "
             "environment's snapshot after a turn k >= 1 (uniform) and continued "
             "c.logo.local_size times from the same token prefix (re-prefilled; the prefix is "
             "context, the continuation the loss tokens); parent_id = the episode's row, "
             "reward = each continuation's own outcome", when=logo_on, check=_check_logo,
             off_doc="set logo.branch_rows > 0 (multi-turn tasks), e.g. the logo_lookup recipe"),
    Producer("env_rollout", ("tokens", "response_mask", "group_id", "prompt_id", "obs_mask",
                             "turn_id", "logprob_sampler", "reward", "step_reward", "step_mask",
                             "turn_progress", "turn_role"), (), _build_env_rollout, "sampling",
             "G episodes per prompt: the KV-cache sampler plays the task's environments turn "
             "by turn (policy tokens in response_mask, environment tokens in obs_mask; "
             "reward = the episode's outcome; per-turn reward, progress and role)",
             when=is_multi_turn, off_doc="needs a multi-turn task (credit.envs), e.g. lookup"),
    Producer("slate_rollout", ("tokens", "response_mask", "group_id", "prompt_id",
                               "obs_mask", "turn_id", "logprob_sampler", "parent_id",
                               "prefix_len", "reward"), (), _build_slate_rollout, "sampling",
             "SLATE's step-level sampling: per prompt and step, c.slate.candidates next steps "
             "from the chosen path (one prefill each), judged by the task's judge_step "
             "(reward = r_think + r_answer + the early-answer bonus), one continued by "
             "softmax(A/η); each candidate a row owning its step", when=slate_on,
             check=_check_slate, off_doc="set slate.candidates > 0 (a task with judge_step)"),
    Producer("tree_rollout", ("tokens", "response_mask", "group_id", "prompt_id", "obs_mask",
                              "turn_id", "logprob_sampler", "parent_id", "prefix_len"), (),
             _build_tree_rollout, "sampling",
             "G samples per prompt grown into trees: at c.tree.points branch points per "
             "prompt (by entropy, surprisal, step starts or the first wrong token; CBPO's "
             "path/node decays), "
             "c.tree.branches continuations from each shared prefix (its KV cache computed "
             "once), c.tree.depth rounds; each tree token is a loss token in one row only",
             when=lambda c: tree_on(c) and not slate_on(c), check=_check_tree,
             off_doc="set tree.branches > 0 (single-turn tasks)"),
    Producer("rollout", ("tokens", "response_mask", "group_id", "prompt_id", "obs_mask",
                         "turn_id", "logprob_sampler"), (), _build_rollout, "sampling",
             "G samples per prompt from the KV-cache sampler (single turn)",
             when=lambda c: not is_multi_turn(c) and not tree_on(c) and not slate_on(c)),
    Producer("verifier", ("reward",), ("tokens", "response_mask"), _build_reward, "reward",
             "the task's verifier on the decoded responses"),
    Producer("gold_pass", ("gold_logprob_turns", "gold_logprob_prompt"),
             ("tokens", "response_mask", "obs_mask", "turn_id"), _build_gold_pass,
             "likelihood", "the policy teacher-forces the gold answer (c.gold_template) after "
             "the prompt and after every turn boundary (IGPO's information gain)",
             when=lambda c: gold_scorer(c) != "reference", check=_check_gold_config,
             off_doc="gold_scorer='reference' uses gold_pass_ref"),
    Producer("gold_pass_ref", ("gold_logprob_turns", "gold_logprob_prompt"),
             ("tokens", "response_mask", "obs_mask", "turn_id"), _build_gold_pass,
             "likelihood", "the same, scored by the frozen reference (TRACE)",
             when=lambda c: gold_scorer(c) == "reference", check=_check_gold_config,
             keeps_reference=True, off_doc="gold_scorer='reference'"),
    Producer("sampler_logprob_old", ("logprob_old",), ("response_mask",),
             _build_sampler_logprob_old, "scoring",
             "behaviour log-probs reported by the sampler (raw model, temperature 1)",
             when=lambda c: c.logprob_old_source == "sampler",
             off_doc="logprob_old_source='sampler'"),
    Producer("policy_version", ("policy_version",), ("tokens",), _build_policy_version,
             "sampling", "the version (RL steps) of the parameters that sampled each row: the "
             "current step in the synchronous loop; asynchronous units stamp their oldest"),
    Producer("policy_pass", ("logprob", "logprob_old", "entropy", "sum_pi_squared"),
             ("tokens",), _build_policy_pass, "scoring",
             "one no-gradient pass of the policy: log-probs (logprob_old recomputed by the "
             "trainer), entropy, and Σπ² from the same pass when needed"),
    Producer("reference_pass", ("logprob_ref",), ("tokens",), _build_reference_pass,
             "reference", "the frozen initial policy (after any warm-up) scores the tokens",
             keeps_reference=True),
    Producer("divergence_pass", tuple(DIVERGENCE_FIELDS), ("tokens", "response_mask"),
             _build_divergence_pass, "divergence",
             "full-vocabulary divergences of the behaviour policy from the frozen reference at "
             "each position (squared Hellinger, KL both ways), from one pass of each model and "
             "the chunked `credit.divergences` (no [B,T,V] array)", keeps_reference=True),
    Producer("teacher_pass", TEACHER_FIELDS, ("tokens", "response_mask"), _build_teacher_pass,
             "teacher", "a frozen teacher (c.teacher.init_from: a local checkpoint with the "
             "student's tokenizer, its own dtype) scores the student's tokens: log-prob of each "
             "and its top-k distribution with a tail bucket (c.teacher.top_k; chunked)",
             when=lambda c: bool(c.teacher.init_from), check=check_teacher_files,
             off_doc="set teacher.init_from (a frozen teacher) or teacher.context (the policy "
                     "as its own teacher)"),
    Producer("self_teacher_pass", TEACHER_FIELDS, ("tokens", "response_mask"),
             _build_self_teacher_pass, "teacher",
             "the policy as its own teacher: the student's tokens re-scored with a privileged "
             "context (c.teacher.context: answer | a task's hint...) before the prompt, by the "
             "current or a lagged copy of the parameters (c.teacher.lag)",
             when=_self_teacher_on, check=_check_self_teacher, init=_init_self_teacher,
             off_doc="set teacher.context (answer | hint | ...) without teacher.init_from"),
    Producer("evidence_pass", ("evidence_nuisance",), ("tokens", "response_mask"),
             _build_evidence_pass, "teacher",
             "VERPO's Fisher Evidence Contrast: the current policy's hidden states without and "
             "with the privileged context (c.teacher.context), the part of each token's "
             "log-prob shift along the batch's evidence-presence direction",
             when=_self_teacher_on, check=_check_self_teacher,
             off_doc="set teacher.context (answer | hint | ...) without teacher.init_from"),
    Producer("step_segments", ("step_id",), ("tokens", "response_mask"), _build_step_segments,
             "reward", "reasoning steps: the turns of multi-turn rollouts, else the response cut "
             "after each token holding one of c.step_delimiters"),
    Producer(verifier.NAME, ("step_reward", "step_mask"), ("tokens", "response_mask", "reward"),
             verifier.build, "verifier",
             "a generative verifier trained by RL next to the policy (RL Tango, TIPS): it "
             "reads each response, writes step and final verdicts, is rewarded for agreeing "
             "with the outcome; its step verdicts (±1/S) are the process rewards (c.verifier)",
             when=verifier.verifier_on, init=verifier.init, check=verifier.check_config,
             off_doc="set verifier.enabled=True (single-turn tasks)"),
    Producer(critical.PAIRS, (critical.FIELD,), ("tokens", "response_mask", "reward"),
             critical.build, "critical",
             "CSO's verified critical-step pairs: per failed row, the step of its first wrong "
             "token, c.critical.proposals alternative steps from the prefix, each continued "
             "by the policy and verified; a successful alternative (chosen) against the "
             "original step (rejected), scored by the frozen reference for step-level DPO",
             when=lambda c: critical.critical_on(c) and c.critical.objective == "dpo",
             keeps_reference=True, check=critical.check_config,
             off_doc="set critical.enabled=True (objective dpo)"),
    Producer(critical.INTERVENTIONS, (critical.FIELD,), ("tokens", "response_mask", "reward"),
             critical.build, "critical",
             "InT's interventions: per failed row, the step of its first wrong token "
             "replaced by a proposed step (optionally under a privileged context) whose "
             "continuation succeeds; SFT rows prompt -> prefix + intervention (or, with "
             "critical.data=successes, PROPA's SFT rows: up to 2 successful responses per "
             "prompt, the demonstration when none succeeded)",
             when=lambda c: critical.critical_on(c) and c.critical.objective != "dpo",
             check=critical.check_config, off_doc="set critical.enabled=True (objective sft)"),
    Producer("step_graph", ("step_key", "step_mask", "anchor_id"), ("tokens", "response_mask"),
             _build_step_graph, "reward",
             "step content keys: a hash of the path up to the end of each step (SALT's "
             "trajectory graph: equal keys = the same state and step) and anchors, the tokens "
             "of a step whose text recurs in another row of the group (DiDPO)"),
    Producer("step_judge", ("step_reward", "step_mask"), ("tokens", "response_mask"),
             _build_step_judge, "reward",
             "the task's step judge (judge_step) on each step of each response: 1 right, 0 "
             "wrong — a verifiable process reward in a PRM's place (ProRAG, SPARK)",
             when=_task_has("judge_step"),
             off_doc="single-turn built-in tasks with judge_step (chain, the bifurcation "
                     "tasks); multi-turn tasks give per-turn rewards from the environment"),
    Producer("format_check", ("format_ok",), ("tokens", "response_mask"), _build_format_check,
             "reward", "the task's format_ok on each response (else: it ended with a stop "
             "token)"),
    Producer("query_spans", ("query_mask",), ("tokens", "response_mask"), _build_query_mask,
             "reward", "the tokens of each turn's tool-call argument (multi-turn; the whole "
             "response in single-turn rollouts)"),
    Producer("answer_parse", ("answer_value",), ("tokens", "response_mask"),
             _build_answer_value, "reward", "the numeric value of each response's final "
             "answer (the task's answer_value, else the last number; NaN when none)"),
    Producer("step_completions", ("step_value", "start_value", "step_mask"),
             ("tokens", "response_mask", "reward"), _build_step_completions, "baseline",
             "the value after each step: the verifier's reward of the greedy completion of the "
             "response cut after that step (c.step_delimiters; c.max_steps entries), the "
             "response's own reward after its last step, and after the prompt alone "
             "(start_value); TP-GRPO's V_0..V_n", when=lambda c: not is_multi_turn(c),
             off_doc="single-turn tasks (multi-turn episodes report per-turn values "
                     "themselves)"),
    Producer("reward_components", ("reward_components",),
             ("tokens", "response_mask", "reward"), _build_reward_components, "reward",
             "several reward signals per response, the columns c.reward_components names: "
             + "; ".join(f"{k} ({v[1]})" for k, v in REWARD_COMPONENTS.items()),
             when=lambda c: bool(c.reward_components), check=_check_reward_components,
             off_doc="set c.reward_components, e.g. ('outcome', 'format')"),
    Producer("subproblems", ("sub_rewards", "sub_mask", "span_id"),
             ("tokens", "response_mask"), _build_subproblems, "reward",
             "the task's verifiable subproblems (SCRL): a verifier result for each and the "
             "response tokens of each one's answer span", when=_task_has("subproblems"),
             off_doc="needs a built-in task with subproblems, e.g. chain"),
    Producer("unit_tests", ("test_pass", "test_mask"), ("tokens", "response_mask"),
             _build_unit_tests, "reward",
             "the response run on each of the task's unit tests by the task's own "
             "interpreter, with step and depth limits (VeRPO)", when=_task_has("test_pass"),
             off_doc="needs a built-in task with unit tests, e.g. program"),
    Producer("rubric_check", ("rubric", "rubric_mask"), ("tokens", "response_mask"),
             _build_rubric, "reward", "the task's rubric items judged on each response "
             "(C-GRPO)", when=_task_has("rubric"),
             off_doc="needs a built-in task with a rubric, e.g. chain"),
    Producer("tool_usage", ("tool_calls", "tool_cost"), ("tokens", "response_mask"),
             _build_tool_usage, "reward",
             "tool-call rounds and tool cost of each multi-turn episode (HyperEyes TRACE "
             "cost)", when=_tool_actions,
             off_doc="needs a multi-turn task whose turns are tool calls (credit.envs, "
             "`tool_actions`), e.g. calculator or lookup"),
    Producer("greedy_baseline", ("reward_baseline",), (), _build_greedy_baseline, "baseline",
             "reward of the greedy response per prompt (ReMax)"),
    Producer("task_flags", ("flag_mask",), ("tokens", "response_mask"), _build_task_flags,
             "reward", "the task's `flag_chars` (character spans judged wrong) on the response "
             "tokens", when=_task_flags_spans,
             off_doc="needs a built-in task with flag_chars, e.g. arithmetic"),
    Producer("task_decisions", ("decision_mask",), ("tokens", "response_mask"),
             _build_task_decisions, "reward", "the task's deciding response tokens "
             "(`pivot_positions`; the credit bench's oracle placement, `credit_mask`)",
             when=_task_has("pivot_positions"),
             off_doc="needs a built-in bifurcation task (pivotal, distractor, ...)"),
    # Before answer_pass: under answer_prior_scorer=reference it makes the prior instead.
    Producer("answer_prior_ref", ("logprob_answer_prior",), ("tokens", "response_mask"),
             _build_answer_prior_ref, "likelihood",
             "the frozen initial policy teacher-forces the gold answer (+ eos) after the "
             "prompt alone (RLPR's prior, computed once before training in its code)",
             when=lambda c: answer_prior_scorer(c) == "reference", check=_check_answer_prior,
             keeps_reference=True, off_doc="answer_prior_scorer='reference'"),
    Producer("answer_pass", ("logprob_answer", "answer_mask", "logprob_answer_prior",
                             "answer_tokens", "answer_attn_mask", "answer_positions"),
             ("tokens", "response_mask"), _build_answer_pass, "likelihood",
             "the policy teacher-forces the gold answer (+ eos) after prompt ⊕ response "
             "(its stop token dropped), and after the prompt alone for the prior; the "
             "forced sequence too, for a loss that scores the answer in the update",
             check=_check_answer_prior),
    Producer("followup_pass", ("logprob_followup",), ("tokens", "response_mask"),
             _build_followup_pass, "likelihood",
             "the policy teacher-forces each follow-up text (c.followups_pos, then "
             "c.followups_neg; + eos) after prompt ⊕ response (its stop token dropped) ⊕ "
             "c.followup_separator, and averages each one's token log-probs (FLR)",
             check=_check_followups, keeps_reference=True),
    Producer("alt_context_pass", ("logprob_alt_pos", "logprob_alt_neg", "logprob_alt"),
             ("tokens", "response_mask", "reward"), _build_alt_context_pass, "rescoring",
             "the policy re-scores the response tokens after the prompt prefixed with "
             "c.alt_context_pos / c.alt_context_neg (contrastive contexts: CSCR, T-REG; with "
             "{answer} and a group {mistake} filled in, SIPO's self-teacher contexts), or "
             "c.alt_context (another context: OPID / SEED's hindsight skill)",
             when=_alt_contexts_encodable,
             off_doc="alt_context_pos / alt_context_neg / alt_context must be strings the run's "
                     "tokenizer "
                     "can encode; the character tokenizer has only "
                     f"{tasks_lib.CharTokenizer().chars!r}"),
    Producer("interventions_pass", ("logprob_interventions",), ("tokens", "response_mask"),
             _build_interventions_pass, "rescoring",
             "the policy re-scores the response tokens after each of the task's M "
             "answer-preserving prompt rewrites (`interventions`; SCAPO)",
             when=_task_has("interventions"),
             off_doc="needs a built-in task with interventions, e.g. arithmetic"),
    _prm_producer("implicit_prm", "logprob_ref",
                  "PRIME's online implicit PRM: a copy of the policy trained each step on the "
                  "outcome labels (c.prm: objective, beta, update before or after scoring), "
                  "its implicit reward against the frozen reference"),
    _prm_producer("implicit_prm_old", "logprob_old",
                  "OPRL's online implicit PRM: the same learner, its implicit reward against "
                  "the behaviour policy, trained by default with trajectory DPO on the "
                  "(success, failure) pairs of each prompt group (c.prm.objective=auto)"),
    Producer("critic", ("values",), ("tokens", "response_mask", "reward"),
             learners.build_critic, "critic",
             "a value head on a copy of the policy's trunk, regressed on the estimator's "
             "returns with the clipped value loss (c.critic)", init=learners.init_critic,
             check=learners.check_critic_config),
    Producer("critic_ref", ("values_ref",), ("tokens", "response_mask", "reward"),
             learners.build_reference_critic, "critic",
             "ReDiPPO's reference-guided critic: the same, reading the response after "
             "c.critic.ref_context (gold answer filled in) ⊕ prompt",
             when=learners.reference_context_ok,
             off_doc="critic.ref_context must hold {answer} and be encodable by the run's "
                     "tokenizer", init=learners.init_critic, check=learners.check_critic_config),
)

# Inputs of the runner's update that are not contract fields (no estimator reads them).
RUNNER_INPUTS = frozenset({critical.FIELD})

for _p in PRODUCERS:
  _bad = [f for f in _p.provides + _p.requires if f not in CONTRACT and f not in RUNNER_INPUTS]
  assert not _bad, f"producer {_p.name!r}: {_bad} are not credit.CONTRACT fields"
assert len({p.name for p in PRODUCERS}) == len(PRODUCERS), "producer names must be unique"


# The producers that read rows through `group_id` (or not by prompt at all), so they run on
# tree batches, whose branch rows follow the roots.
TREE_PRODUCERS = frozenset({"tree_rollout", "slate_rollout", "logo_rollout", "verifier",
                            critical.INTERVENTIONS,  # data="successes" only (its check)
                            "sampler_logprob_old", "policy_version", "policy_pass",
                            "reference_pass",
                            "divergence_pass", "step_segments", "task_flags", "answer_parse",
                            "greedy_baseline", "step_completions", "step_graph",
                            "format_check", "query_spans", "step_judge", "task_decisions"})


def providers(c: ml_collections.ConfigDict,
              table: Iterable[Producer] = PRODUCERS) -> dict[str, Producer]:
  """{field: the producer that makes it under config `c`} (first enabled row wins)."""
  out: dict[str, Producer] = {}
  for p in table:
    if p.when(c):
      for f in p.provides:
        out.setdefault(f, p)
  return out


@dataclasses.dataclass(frozen=True)
class Planned:
  """A producer in a plan, with the provided fields the plan takes from it."""
  producer: Producer
  wanted: frozenset

  def build(self, setup: Setup) -> "Stage":
    built = self.producer.build(setup, self.wanted)
    produce, after = built if self.producer.init is not None else (built, None)
    return Stage(self.producer.name, self.producer.phase, self.wanted, produce, after)


@dataclasses.dataclass(frozen=True)
class Stage:
  """A built producer: calling it returns exactly its wanted fields; `after` (trained
  producers) is called with the batch and the estimator's value targets."""
  name: str
  phase: str
  wanted: frozenset
  produce: Produce
  after: Callable[[Mapping[str, Any], Mapping[str, Any], StepContext], None] | None = None

  def __call__(self, state, batch, ctx: StepContext) -> dict:
    out = self.produce(state, batch, ctx)
    return {f: out[f] for f in sorted(self.wanted)}


def plan(needed: Mapping[str, Iterable[str]], c: ml_collections.ConfigDict,
         table: Iterable[Producer] = PRODUCERS) -> list[Planned]:
  """The producers that make `needed` ({field: who needs it}), in dependency order.

  Raises:
    SetupError naming, per method, each needed field that no enabled producer makes.
  """
  table = tuple(table)
  made = providers(c, table)
  missing: dict[str, list[str]] = {}
  for field, whos in needed.items():
    if field not in made:
      for who in whos:
        missing.setdefault(who, []).append(field)
  if missing:
    absent = {f for fs in missing.values() for f in fs}
    off = {p.name: (sorted(absent & set(p.provides)), p.off_doc or "see its `when`")
           for p in table if absent & set(p.provides)}
    raise MissingFieldsError(missing, off, made)
  root = next(p for p in table if p.when(c))  # the rollout (single- or multi-turn)
  wanted: dict[str, set] = {root.name: set()}
  todo = list(needed)
  while todo:
    field = todo.pop()
    p = made[field]
    if field in wanted.setdefault(p.name, set()):
      continue
    wanted[p.name].add(field)
    for r in p.requires:
      if r not in made:
        raise SetupError(f"producer {p.name!r} (for {field!r}) requires {r!r}, which no "
                         "producer makes under this config")
      todo.append(r)
  chosen = [p for p in table if p.name in wanted]
  if tree_batch(c):
    bad = [p.name for p in chosen if p.name not in TREE_PRODUCERS]
    if bad:
      raise SetupError(f"producers {bad} assume G contiguous samples per prompt and cannot run "
                       f"on tree rollouts (tree.branches > 0); with trees the loop makes "
                       f"{sorted(TREE_PRODUCERS)}")
  for p in chosen:
    if p.check is not None:
      p.check(c)
  return [Planned(p, frozenset(wanted[p.name])) for p in _dependency_order(chosen, made)]


def _dependency_order(chosen: list[Producer], made: Mapping[str, Producer]) -> list[Producer]:
  """Producers ordered so each comes after the producers of what it requires (stable)."""
  done: list[Producer] = []
  left = list(chosen)
  while left:
    ready = [p for p in left if all(made[r] in done or made[r] is p for r in p.requires)]
    if not ready:
      raise SetupError(f"producers {[p.name for p in left]} require each other's fields")
    done.append(ready[0])
    left.remove(ready[0])
  return done

