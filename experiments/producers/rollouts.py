"""Rollout producers: the step's rows, one producer per rollout kind.

`c.rollout` names the kind (`ROLLOUT_KINDS`): plain (G samples per prompt), tree (branches
from shared prefixes), slate (SLATE's step-level candidates), env (multi-turn episodes), logo
(episodes plus Memory-R2's local re-rollouts). Under 'auto' the kind whose switch is on
(`tree.branches`, `slate.candidates`, `logo.branch_rows`) is taken, else the task type's
default (plain or env). Each kind owns its row count (`rollout_rows`) and whether its rows
are N contiguous groups of G (`tree_batch`).
"""
from __future__ import annotations

import dataclasses
import difflib
import time
from typing import Any, Callable, Iterable, Mapping

import jax
import ml_collections
import numpy as np

import credit
from credit import parallel, trees
from credit import tasks as tasks_lib
from experiments.producers.base import (Produce, Setup, SetupError, StepContext, examples_rows,
                                        verify_rows, delimiter_ids, is_multi_turn, step_splitter,
                                        producer)
from experiments.producers.signals import (_task_flags_spans)


def _group_rows(c: ml_collections.ConfigDict) -> int:
  return c.prompts_per_step * c.group_size


def _tree_rows(c: ml_collections.ConfigDict) -> int:
  t = c.tree
  return trees.tree_rows(c.prompts_per_step, c.group_size, t.branches, t.points, t.depth,
                         t.depth_decay)


def _slate_rows(c: ml_collections.ConfigDict) -> int:
  return c.prompts_per_step * c.slate.candidates * c.slate.max_steps


def _logo_rows(c: ml_collections.ConfigDict) -> int:
  return c.prompts_per_step * c.group_size + c.logo.branch_rows * c.logo.local_size


@dataclasses.dataclass(frozen=True)
class RolloutKind:
  """A way to sample a step's rows.

  name: the value of `c.rollout`. producer: the rollout producer that makes the rows.
  multi_turn: it plays a multi-turn environment task (else a single-turn task). grouped: the
  rows are N contiguous groups of G samples (else a tree batch: branch rows follow the roots).
  rows: the number of rows of a step under config `c`. switch: the setting that selects it
  under `rollout='auto'` (None: the default kind of its task type); switch_doc names it.
  """
  name: str
  producer: str
  multi_turn: bool
  grouped: bool
  rows: Callable[[ml_collections.ConfigDict], int]
  switch: Callable[[ml_collections.ConfigDict], bool] | None = None
  switch_doc: str = ""


ROLLOUT_KINDS = {k.name: k for k in (
    RolloutKind("plain", "rollout", multi_turn=False, grouped=True, rows=_group_rows),
    RolloutKind("tree", "tree_rollout", multi_turn=False, grouped=False, rows=_tree_rows,
                switch=lambda c: c.tree.branches > 0, switch_doc="tree.branches > 0"),
    RolloutKind("slate", "slate_rollout", multi_turn=False, grouped=False, rows=_slate_rows,
                switch=lambda c: c.slate.candidates > 0, switch_doc="slate.candidates > 0"),
    RolloutKind("env", "env_rollout", multi_turn=True, grouped=True, rows=_group_rows),
    RolloutKind("logo", "logo_rollout", multi_turn=True, grouped=False, rows=_logo_rows,
                switch=lambda c: c.logo.branch_rows > 0, switch_doc="logo.branch_rows > 0"),
)}


def rollout_kind(c: ml_collections.ConfigDict) -> str:
  """The run's rollout kind: `c.rollout`, or under 'auto' the kind whose switch is on (the
  task type's default kind, plain or env, when none is).

  Raises:
    SetupError: an unknown kind; a kind for the other task type; two switches on; an
      explicit kind whose switch is off, or another kind's switch on beside it.
  """
  multi = is_multi_turn(c)
  task_type = "multi-turn" if multi else "single-turn"
  on = [k for k in ROLLOUT_KINDS.values() if k.switch is not None and k.switch(c)]
  wrong = [k for k in on if k.multi_turn != multi]
  if wrong:
    raise SetupError(f"{wrong[0].switch_doc} selects {wrong[0].name!r} rollouts, which need a "
                     f"{'multi' if wrong[0].multi_turn else 'single'}-turn task; task "
                     f"{c.task!r} is {task_type}: unset it")
  if len(on) > 1:
    raise SetupError(f"{' and '.join(k.switch_doc for k in on)}: each selects its own rollout "
                     f"({', '.join(repr(k.name) for k in on)}); keep one of them")
  want = c.get("rollout", "auto")
  if want == "auto":
    if on:
      return on[0].name
    return next(k.name for k in ROLLOUT_KINDS.values() if k.switch is None and
                k.multi_turn == multi)
  kind = ROLLOUT_KINDS.get(want)
  if kind is None:
    close = difflib.get_close_matches(str(want), ["auto", *ROLLOUT_KINDS], n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise SetupError(f"rollout={want!r} is not a rollout kind; {hint}use one of "
                     f"{['auto', *ROLLOUT_KINDS]}")
  if kind.multi_turn != multi:
    raise SetupError(f"rollout={want!r} needs a {'multi' if kind.multi_turn else 'single'}"
                     f"-turn task; task {c.task!r} is {task_type}")
  if kind.switch is not None and kind not in on:
    raise SetupError(f"rollout={want!r} needs {kind.switch_doc}")
  if on and on[0] is not kind:
    raise SetupError(f"{on[0].switch_doc} selects {on[0].name!r} rollouts but rollout={want!r};"
                     f" set rollout={on[0].name!r} (or 'auto'), or unset it")
  return kind.name


def rollout_rows(c: ml_collections.ConfigDict) -> int:
  """Rows of one step's batch under config `c` (N·G for grouped kinds; the tree's rows)."""
  return ROLLOUT_KINDS[rollout_kind(c)].rows(c)


def tree_batch(c: ml_collections.ConfigDict) -> bool:
  """The step's batch is a tree (branch sampling, SLATE or LoGo's local re-rollouts), not N
  contiguous groups of G."""
  return not ROLLOUT_KINDS[rollout_kind(c)].grouped


TURN_STEP_FIELDS = frozenset({"turn_id", "step_mask"})


def turns_are_steps(c: ml_collections.ConfigDict) -> bool:
  """Whether a single-turn run's `turn_id` is the response's steps (cut at
  `c.step_delimiters`, at most `c.max_steps`) rather than one turn.

  True with `c.steps_as_turns`, and always when the estimator reads both `turn_id` and
  `step_mask` (IGPO, TRACE, SIOP, OPRL, PBSD, the turn-level step-reward methods...): it
  takes `step_mask[b,k]` as "turn k of row b exists" and credits the tokens of `turn_id == k`,
  while single-turn `step_mask` comes from the step producers (the delimiter steps). With one
  turn the two disagree: a row whose response holds a delimiter gets turns 1.. with no tokens,
  whose rewards still enter the group statistics and the returns of turn 0 (seen
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


@producer("rollout",
          provides=("tokens", "response_mask", "group_id", "prompt_id", "obs_mask",
                    "turn_id", "logprob_sampler"),
          requires=(),
          phase="sampling",
          doc="G samples per prompt from the KV-cache sampler (single turn)",
          when=lambda c: rollout_kind(c) == "plain")
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
    # (producers such as the gold pass read them from the host copies on either rollout). With
    # `turns_are_steps` each step (`step_splitter`) is a turn, so turn-level estimators
    # credit the steps of a single-turn response (turn k <-> step k, as step_reward's).
    obs, turn = np.zeros_like(resp), np.where(resp, 0, -1).astype(np.int32)
    if split is not None:
      turn = np.where(resp, np.minimum(split(host["tokens"], resp), c.max_steps - 1),
                      -1).astype(np.int32)
    fields = parallel.shard_batch({
        "group_id": group_id, "obs_mask": obs, "turn_id": turn,
        "prompt_id": np.repeat(np.asarray(ctx.examples["index"], np.int32), G),
    }, s.mesh)
    # The sampler's arrays are already row-sharded on the run's mesh (its parameters'); the
    # host copies serve the verifiers only.
    return dict(fields, tokens=out.tokens, response_mask=out.response_mask,
                logprob_sampler=out.logprob_sampler, logprob_raw=out.logprob_raw,
                attn_mask=out.prompt_mask | out.response_mask,
                host=dict(host, group_id=group_id, obs_mask=obs, turn_id=turn))

  return produce


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
  runner = {"host": dict(tokens=tree.tokens, response_mask=tree.path_mask,
                         prompt_mask=tree.prompt_mask, group_id=tree.group_id, own_mask=own),
            "attn_mask": parallel.shard_batch(tree.prompt_mask | tree.path_mask, s.mesh),
            "logprob_raw": parallel.shard_batch(tree.logprob_raw, s.mesh)}
  index = np.asarray(ctx.examples["index"], np.int32)
  return runner | parallel.shard_batch({
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


@producer("tree_rollout", trees=True,
          provides=("tokens", "response_mask", "group_id", "prompt_id", "obs_mask",
                    "turn_id", "logprob_sampler", "parent_id", "prefix_len"),
          requires=(),
          phase="sampling",
          doc="G samples per prompt grown into trees: at c.tree.points branch points per "
              "prompt (by entropy, surprisal, step starts or the first wrong token; CBPO's "
              "path/node decays), "
              "c.tree.branches continuations from each shared prefix (its KV cache copied "
              "from the parent row's), c.tree.depth rounds; each tree token is a loss token "
              "in one row only",
          when=lambda c: rollout_kind(c) == "tree",
          check=_check_tree,
          off_doc="set tree.branches > 0 (single-turn tasks)")
def _build_tree_rollout(s: Setup, wanted: frozenset) -> Produce:
  """G root samples per prompt, grown into a tree by branch sampling (`credit.trees`)."""
  c, G, t = s.c, s.group_size, s.c.tree
  entropy = s.scorer(entropy=True) if t.criterion == "entropy" else None
  split = step_splitter(s) if t.criterion == "step" else None
  tok, task = s.data.tokenizer, s.data.task

  def produce(state, batch, ctx: StepContext) -> dict:
    model_state = s.model_state(state.params)
    t0 = time.perf_counter()
    out, kept = s.sampler(model_state, prompt_tokens=ctx.prompt_tokens,
                          prompt_mask=ctx.prompt_mask, key=jax.random.fold_in(ctx.key, 0),
                          max_new_tokens=c.max_new_tokens, num_samples=G,
                          temperature=c.temperature, top_k=c.top_k, top_p=c.top_p,
                          keep_cache=True)
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

    def sample_fn(prefix, mask, budget, key, parent):  # branches start from their parent's cache
      out, kept = s.sampler(
          model_state, prompt_tokens=prefix, prompt_mask=mask, key=key,
          max_new_tokens=c.max_new_tokens, num_samples=t.branches, temperature=c.temperature,
          top_k=c.top_k, top_p=c.top_p, max_new_tokens_per_row=budget, share_prefix=True,
          parent=parent[0], parent_rows=parent[1], keep_cache=True)
      return parallel.to_host(out), kept  # rows sharded on the mesh, read on the host

    tree, stats = trees.grow_tree(
        roots, sample_fn, num_groups=s.num_groups, branches=t.branches, points=t.points,
        depth=t.depth, decay=t.depth_decay,
        criterion="given" if t.criterion == "first_error" else t.criterion,
        score_fn=None if t.criterion == "surprisal" else score_fn,
        max_new_tokens=c.max_new_tokens, gamma_path=t.gamma_path, gamma_node=t.gamma_node,
        key=jax.random.fold_in(ctx.key, 1), cache=kept)
    wall = time.perf_counter() - t0
    own = tree.response_mask
    ctx.metrics.update(rollout_tokens_per_s=float(own.sum()) / max(wall, 1e-9),
                       tree_points=float(sum(stats["points_found"])),
                       tree_branch_tokens=float(sum(stats["new_tokens"])),
                       tree_root_tokens=float(own[:B0].sum()))
    return _tree_batch(s, ctx, tree)

  return produce


def _check_slate(c: ml_collections.ConfigDict) -> None:
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


@producer("slate_rollout", trees=True,
          provides=("tokens", "response_mask", "group_id", "prompt_id",
                    "obs_mask", "turn_id", "logprob_sampler", "parent_id",
                    "prefix_len", "reward"),
          requires=(),
          phase="sampling",
          doc="SLATE's step-level sampling: per prompt and step, c.slate.candidates next steps "
              "from the chosen path (one prefill each), judged by the task's judge_step "
              "(reward = r_think + r_answer + the early-answer bonus), one continued by "
              "softmax(A/η); each candidate a row owning its step",
          when=lambda c: rollout_kind(c) == "slate",
          check=_check_slate,
          off_doc="set slate.candidates > 0 (a task with judge_step)")
def _build_slate_rollout(s: Setup, wanted: frozenset) -> Produce:
  """SLATE: k candidate steps per prompt and step, judged, one continued (`trees.step_rollout`)."""
  c, sl, tok, task = s.c, s.c.slate, s.data.tokenizer, s.data.task
  stops = tuple(sorted(set(delimiter_ids(tok, c.step_delimiters))
                       | set(getattr(tok, "stop_ids", None) or (tok.eos_id,))))
  eos = set(getattr(tok, "stop_ids", None) or (tok.eos_id,))

  def produce(state, batch, ctx: StepContext) -> dict:
    model_state = s.model_state(state.params)
    rows = examples_rows(ctx.examples)

    def sample_fn(prefix, mask, budget, key):  # rows sharded on the mesh, read on the host
      return parallel.to_host(s.sampler(
          model_state, prompt_tokens=prefix, prompt_mask=mask, key=key,
          max_new_tokens=c.max_new_tokens, num_samples=sl.candidates, temperature=c.temperature,
          top_k=c.top_k, top_p=c.top_p, stop_tokens=stops, max_new_tokens_per_row=budget,
          share_prefix=True))

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
    _, path_reward = verify_rows(s, ctx.examples, st["path_tokens"], st["path_mask"],
                             np.arange(s.num_groups))
    ctx.metrics.update(rollout_tokens_per_s=float(own.sum()) / max(wall, 1e-9),
                       slate_path_accuracy=float(np.mean(np.asarray(path_reward) >= 1.0)),
                       slate_path_steps=float(st["path_steps"].mean()),
                       slate_step_score=float(score[own.any(1)].mean()) if own.any() else 0.0)
    return _tree_batch(s, ctx, tree, reward=score.astype(np.float32))

  return produce


def env_limits(c: ml_collections.ConfigDict, tok) -> Any:
  """The environments' `Limits`: the run's K turns, and with the character tokenizer (one
  token per character) observations cut by the environment itself, with its visible marker,
  before the sampler's `max_observation_tokens` would cut them silently."""
  from credit.envs import Limits  # pylint: disable=g-import-not-at-top
  chars = c.max_observation_tokens if isinstance(tok, tasks_lib.CharTokenizer) else None
  return Limits(max_turns=c.max_turns, max_observation_chars=chars)


def transcript(trajectory) -> str:
  """One line of a multi-turn episode: action -> observation | action -> ... (for samples)."""
  parts = []
  for i, a in enumerate(trajectory.actions):
    o = trajectory.observations[i] if i < len(trajectory.observations) else None
    parts.append(a if o is None else f"{a} -> {o}")
  return " | ".join(parts)


@producer("env_rollout",
          provides=("tokens", "response_mask", "group_id", "prompt_id", "obs_mask",
                    "turn_id", "logprob_sampler", "reward", "step_reward", "step_mask",
                    "turn_progress", "turn_role"),
          requires=(),
          phase="sampling",
          doc="G episodes per prompt: the KV-cache sampler plays the task's environments turn "
              "by turn (policy tokens in response_mask, environment tokens in obs_mask; "
              "reward = the episode's outcome; per-turn reward, progress and role)",
          when=lambda c: rollout_kind(c) == "env",
          off_doc="needs a multi-turn task (credit.envs), e.g. lookup")
def _build_env_rollout(s: Setup, wanted: frozenset) -> Produce:
  """G episodes per prompt with the task's environments (`credit.envs.MultiTurnSampler`)."""
  c, G, task, ms = s.c, s.group_size, s.data.task, s.multi_sampler
  group_id = np.repeat(np.arange(s.num_groups, dtype=np.int32), G)
  limits = env_limits(c, s.data.tokenizer)

  def produce(state, batch, ctx: StepContext) -> dict:
    envs = [task.make_env(e, limits) for e in examples_rows(ctx.examples) for _ in range(G)]
    newer = ctx.refresh  # asynchronous workers: newer parameters between turns
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
                       truncated_frac=float(out.truncated.mean()),
                       tool_errors=float(tm["tool_errors"]),
                       tool_timeouts=float(tm["tool_timeouts"]))
    if "compactions" in tm:  # context management (experiments/extensions/context.py)
      ctx.metrics.update(compactions=tm["compactions"] / len(envs),
                         dropped_observations=tm["dropped_observations"] / len(envs))
    episode_metrics = getattr(task, "episode_metrics", None)  # a task's own, e.g. exact match
    if episode_metrics is not None:
      ctx.metrics.update(episode_metrics(out.trajectories))
    return _episode_batch(s, ctx, out, group_id)

  return produce


def _episode_batch(s: Setup, ctx: StepContext, out, group_id: np.ndarray, **more) -> dict:
  """The contract fields of a batch of environment episodes (`MultiTurnOutput` `out`, rows of
  prompt group `group_id`), sharded, and the host views, attention mask and extras (log-probs
  of the raw model, trajectories) the later producers read; `more`: extra fields (host too)."""
  runner = {
      "host": dict(tokens=out.tokens, response_mask=out.response_mask,
                   prompt_mask=out.prompt_mask, obs_mask=out.obs_mask, group_id=group_id,
                   turn_id=out.turn_id, step_mask=out.step_mask, **more),
      "texts": [transcript(t) for t in out.trajectories],
      "attn_mask": parallel.shard_batch(out.prompt_mask | out.response_mask | out.obs_mask,
                                        s.mesh),
      "logprob_raw": parallel.shard_batch(out.logprob_raw, s.mesh),
      "trajectories": out.trajectories}
  index = np.asarray(ctx.examples["index"], np.int32)
  return runner | parallel.shard_batch({
      "tokens": out.tokens, "response_mask": out.response_mask, "group_id": group_id,
      "prompt_id": index[group_id], "obs_mask": out.obs_mask, "turn_id": out.turn_id,
      "logprob_sampler": out.logprob_sampler, "reward": out.reward,
      "step_reward": out.step_reward, "step_mask": out.step_mask,
      "turn_progress": out.turn_progress, "turn_role": out.turn_role, **more}, s.mesh)


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


@producer("logo_rollout", trees=True,
          provides=("tokens", "response_mask", "group_id", "prompt_id", "obs_mask",
                    "turn_id", "logprob_sampler", "reward", "step_reward",
                    "step_mask", "turn_progress", "turn_role", "parent_id",
                    "prefix_len"),
          requires=(),
          phase="sampling",
          doc="env_rollout's G episodes per prompt, then Memory-R2's local re-rollouts: "
              "c.logo.branch_rows episodes (distinct, >= 2 turns) each restored to its "
              "environment's snapshot after a turn k >= 1 (uniform) and continued "
              "c.logo.local_size times from the same token prefix (its cache copied once "
              "from the episodes' for the siblings, who share it; the prefix is "
              "context, the continuation the loss tokens); parent_id = the episode's row, "
              "reward = each continuation's own outcome",
          when=lambda c: rollout_kind(c) == "logo",
          check=_check_logo,
          off_doc="set logo.branch_rows > 0 (multi-turn tasks), e.g. the logo_lookup recipe")
def _build_logo_rollout(s: Setup, wanted: frozenset) -> Produce:
  """`env_rollout`'s G episodes per prompt, then LoGo's local rows (`credit.envs.branching`):
  c.logo.local_size continuations from each of c.logo.branch_rows saved intermediate states."""
  from credit.envs.branching import local_rollouts  # pylint: disable=g-import-not-at-top
  c, G, task, ms, lg = s.c, s.group_size, s.data.task, s.multi_sampler, s.c.logo
  group_id = np.repeat(np.arange(s.num_groups, dtype=np.int32), G)
  limits = env_limits(c, s.data.tokenizer)

  def produce(state, batch, ctx: StepContext) -> dict:
    rows = examples_rows(ctx.examples)
    envs = [task.make_env(e, limits) for e in rows for _ in range(G)]
    model_state = s.model_state(state.params)
    kw = dict(temperature=c.temperature, top_k=c.top_k, top_p=c.top_p)
    t0 = time.perf_counter()
    eps = ms(model_state, envs, key=jax.random.fold_in(ctx.key, 0), group_id=group_id,
             keep_snapshots=True, keep_cache=True, **kw)
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
                       tool_errors=float(tm["tool_errors"]),
                       tool_timeouts=float(tm["tool_timeouts"]),
                       logo_local_rows=float(lr.num_local), logo_local_s=t2 - t1,
                       logo_branch_turn=float(lr.branch_turn[real].mean()) if real.any() else 0.0,
                       logo_local_reward=float(out.reward[real].mean()) if real.any() else 0.0,
                       episode_reward=float(eps.reward.mean()))
    gid = out.group_id
    from credit.trees import validate_tree  # pylint: disable=g-import-not-at-top
    validate_tree(lr.parent_id, lr.prefix_len, gid, num_tokens=out.tokens.shape[1],
                  where="logo_rollout")
    return _episode_batch(s, ctx, out, gid, parent_id=lr.parent_id, prefix_len=lr.prefix_len)

  return produce
