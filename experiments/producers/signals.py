"""Task signals: what the task's own code says about each response: the outcome reward,
reasoning steps and their content keys, step judges and greedy step completions, format,
tool-call spans, the parsed answer, subproblems, unit tests, rubrics, tool usage, reward
components, flagged and deciding tokens."""
from __future__ import annotations

import hashlib
import re
from typing import Any, Iterable, Mapping

import ml_collections
import numpy as np

from credit import parallel
from credit import tasks as tasks_lib
from experiments.producers.base import (Produce, Setup, SetupError, StepContext, examples_rows,
                                        task_has, verify_rows, is_multi_turn, step_splitter,
                                        producer)


@producer("verifier", trees=True,
          provides=("reward",),
          requires=("tokens", "response_mask"),
          phase="reward",
          doc="the task's verifier on the decoded responses")
def _build_reward(s: Setup, wanted: frozenset) -> Produce:
  def produce(state, batch, ctx: StepContext) -> dict:
    host = batch["host"]
    texts, reward = verify_rows(s, ctx.examples, host["tokens"], host["response_mask"],
                                host["group_id"])
    return {"reward": parallel.shard_batch(reward, s.mesh), "texts": texts}

  return produce




def _tool_actions(c: ml_collections.ConfigDict) -> bool:
  """`when` of the tool-usage fields: a multi-turn task whose turns are tool calls."""
  return is_multi_turn(c) and bool(getattr(
      tasks_lib.get_task(c.task, **dict(c.task_kwargs)), "tool_actions", False))


_task_flags_spans = task_has("flag_chars")  # character spans judged wrong


@producer("task_flags", trees=True,
          provides=("flag_mask",),
          requires=("tokens", "response_mask"),
          phase="reward",
          doc="the task's `flag_chars` (character spans judged wrong) on the response "
    "tokens",
          when=_task_flags_spans,
          off_doc="needs a built-in task with flag_chars, e.g. arithmetic")
def _build_task_flags(s: Setup, wanted: frozenset) -> Produce:
  tok, task = s.data.tokenizer, s.data.task

  def produce(state, batch, ctx: StepContext) -> dict:
    tokens, resp = batch["host"]["tokens"], batch["host"]["response_mask"]
    examples = [tasks_lib.as_example({k: ctx.examples[k][i] for k in ctx.examples})
                for i in range(len(ctx.examples["prompt"]))]
    flags = np.zeros(resp.shape, bool)
    for b, g in enumerate(batch["host"]["group_id"]):
      example = examples[g]
      ids = tokens[b][resp[b]]
      flags[b, resp[b]] = tasks_lib.token_flags(
          tok, ids, task.flag_chars(example, tok.decode(ids)))
    return {"flag_mask": parallel.shard_batch(flags, s.mesh)}

  return produce


@producer("task_decisions", trees=True,
          provides=("decision_mask",),
          requires=("tokens", "response_mask"),
          phase="reward",
          doc="the task's deciding response tokens "
"(`pivot_positions`; the credit bench's oracle placement, `credit_mask`)",
          when=task_has("pivot_positions"),
          off_doc="needs a built-in bifurcation task (pivotal, distractor, ...)")
def _build_task_decisions(s: Setup, wanted: frozenset) -> Produce:
  """decision_mask [B,T]: the response tokens at the task's `pivot_positions` (response token
  k = character k: the bifurcation tasks' character tokenizer), as `credit.bench` marks them."""
  task = s.data.task

  def produce(state, batch, ctx: StepContext) -> dict:
    resp = batch["host"]["response_mask"]
    mask = np.zeros(resp.shape, bool)
    for b, g in enumerate(batch["host"]["group_id"]):
      cols = np.flatnonzero(resp[b])
      for p in task.pivot_positions({k: ctx.examples[k][g] for k in ctx.examples}):
        if p < len(cols):
          mask[b, cols[p]] = True
    return {"decision_mask": parallel.shard_batch(mask, s.mesh)}

  return produce


@producer("step_segments", trees=True,
          provides=("step_id",),
          requires=("tokens", "response_mask"),
          phase="reward",
          doc="reasoning steps: the turns of multi-turn rollouts, else the response cut "
    "after each token holding one of c.step_delimiters")
def _build_step_segments(s: Setup, wanted: frozenset) -> Produce:
  """step_id [B,T]: the turn of each policy token in multi-turn rollouts; in single-turn
  ones `step_splitter`'s steps of the response (of a tree row: of its whole path)."""
  split = step_splitter(s)

  def produce(state, batch, ctx: StepContext) -> dict:
    return {"step_id": parallel.shard_batch(_steps_of(s, batch, split), s.mesh)}

  return produce


def stable_hash31(data: bytes) -> int:
  """A 31-bit content hash, stable across processes (Python's `hash` of str is salted)."""
  return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") & 0x7FFFFFFF


def _steps_of(s: Setup, batch: Mapping[str, Any], split) -> np.ndarray:
  """[B,T] step of every response token: turns of multi-turn rows, else `split`'s steps."""
  host = batch["host"]
  resp = host["response_mask"]
  if is_multi_turn(s.c):  # not `"turn_id" in host`: the single-turn rollout has one turn
    return np.where(resp, host["turn_id"], -1).astype(np.int32)
  return split(host["tokens"], resp)


@producer("step_graph", trees=True,
          provides=("step_key", "step_mask", "anchor_id"),
          requires=("tokens", "response_mask"),
          phase="reward",
          doc="step content keys: a hash of the path up to the end of each step (SALT's "
              "trajectory graph: equal keys = the same state and step) and anchors, the tokens "
              "of a step whose text recurs in another row of the group (DiDPO)")
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
    tokens, gid = batch["host"]["tokens"], batch["host"]["group_id"]
    valid = batch["host"]["prompt_mask"] | batch["host"]["response_mask"] | batch["host"].get(
        "obs_mask", np.zeros_like(tokens, bool))
    step = np.minimum(_steps_of(s, batch, split), K - 1)
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


@producer("step_judge", trees=True,
          provides=("step_reward", "step_mask"),
          requires=("tokens", "response_mask"),
          phase="reward",
          doc="the task's step judge (judge_step) on each step of each response: 1 right, 0 "
              "wrong — a verifiable process reward in a PRM's place (ProRAG, SPARK)",
          when=task_has("judge_step"),
          off_doc="single-turn built-in tasks with judge_step (chain, the bifurcation "
                  "tasks); multi-turn tasks give per-turn rewards from the environment")
def _build_step_judge(s: Setup, wanted: frozenset) -> Produce:
  """step_reward / step_mask [B,K]: the task's step judge on each step of each response
  (`judge_step`: 1 when the step is right — no part judged wrong — else 0), a verifiable
  process reward in the place of a PRM's step scores (ProRAG, SPARK's verdicts)."""
  tok, task, K = s.data.tokenizer, s.data.task, s.c.max_steps
  split = step_splitter(s)
  eos = set(getattr(tok, "stop_ids", None) or (tok.eos_id,))

  def produce(state, batch, ctx: StepContext) -> dict:
    host = batch["host"]
    tokens, resp, gid = host["tokens"], host["response_mask"], host["group_id"]
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


@producer("step_completions", trees=True,
          provides=("step_value", "start_value", "step_mask"),
          requires=("tokens", "response_mask", "reward"),
          phase="baseline",
          doc="the value after each step: the verifier's reward of the greedy completion of the "
              "response cut after that step (c.step_delimiters; c.max_steps entries), the "
              "response's own reward after its last step, and after the prompt alone "
              "(start_value); TP-GRPO's V_0..V_n",
          when=lambda c: not is_multi_turn(c),
          off_doc="single-turn tasks (multi-turn episodes report per-turn values "
                  "themselves)")
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
    host = batch["host"]
    tokens, resp, prompt = host["tokens"], host["response_mask"], host["prompt_mask"]
    gid = batch["host"]["group_id"]
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
    _, rew = verify_rows(s, ctx.examples, h["tokens"], whole, gid[rows])
    value = np.zeros((B, K), np.float32)
    value[:, :K - 1] = np.where(use, np.asarray(rew, np.float32).reshape(B, K - 1), 0.0)
    reward = np.asarray(parallel.to_host(batch["reward"]), np.float32)
    last = np.clip(n - 1, 0, K - 1)
    value[np.arange(B), last] = np.where(n > 0, reward, 0.0)
    mask = np.arange(K)[None] < np.minimum(n, K)[:, None]
    start = s.sampler(model_state, prompt_tokens=ctx.prompt_tokens, prompt_mask=ctx.prompt_mask,
                      key=ctx.key, max_new_tokens=c.max_new_tokens, temperature=0.0)
    hs = parallel.to_host({"tokens": start.tokens, "response_mask": start.response_mask})
    _, r0 = verify_rows(s, ctx.examples, hs["tokens"], hs["response_mask"],
                    np.arange(s.num_groups))
    ctx.metrics["step_completions"] = float(use.sum())
    return parallel.shard_batch({
        "step_value": value, "step_mask": mask,
        "start_value": np.asarray(r0, np.float32)[gid]}, s.mesh)

  return produce


@producer("format_check", trees=True,
          provides=("format_ok",),
          requires=("tokens", "response_mask"),
          phase="reward",
          doc="the task's format_ok on each response (else: it ended with a stop "
    "token)")
def _build_format_check(s: Setup, wanted: frozenset) -> Produce:
  """format_ok [B]: the task's `format_ok(example, text)` where it has one, else the response
  ended by itself (a stop token, not the length limit)."""
  tok, task = s.data.tokenizer, s.data.task
  check = getattr(task, "format_ok", None)
  stops = np.asarray(getattr(tok, "stop_ids", None) or (tok.eos_id,))

  def produce(state, batch, ctx: StepContext) -> dict:
    tokens, resp = batch["host"]["tokens"], batch["host"]["response_mask"]
    if check is not None:
      texts = batch.get("texts") or tasks_lib.decode_responses(tok, tokens, resp)
      rows = [{k: ctx.examples[k][g] for k in ctx.examples} for g in batch["host"]["group_id"]]
      ok = np.asarray([bool(check(r, t)) for r, t in zip(rows, texts)])
    else:
      last = np.where(resp.any(1), resp.shape[1] - 1 - np.argmax(resp[:, ::-1], axis=1), 0)
      ok = resp.any(1) & np.isin(tokens[np.arange(len(tokens)), last], stops)
    return {"format_ok": parallel.shard_batch(ok, s.mesh)}

  return produce


@producer("query_spans", trees=True,
          provides=("query_mask",),
          requires=("tokens", "response_mask"),
          phase="reward",
          doc="the tokens of each turn's tool-call argument (multi-turn; the whole "
    "response in single-turn rollouts)")
def _build_query_mask(s: Setup, wanted: frozenset) -> Produce:
  """query_mask [B,T]: in multi-turn rollouts, the policy tokens of the argument of each
  turn's tool call (`credit.envs.query_chars`; answers are not queries); in single-turn
  ones, the whole response (a single-turn analogue: every token is the "query")."""
  from credit.envs import ToolFormat, query_chars  # pylint: disable=g-import-not-at-top
  tok = s.data.tokenizer
  fmt = getattr(s.data.task, "fmt", None) or ToolFormat()

  def produce(state, batch, ctx: StepContext) -> dict:
    resp = batch["host"]["response_mask"]
    if not is_multi_turn(s.c):  # the single-turn rollout's host has a turn_id too (one turn)
      return {"query_mask": parallel.shard_batch(resp.copy(), s.mesh)}
    tokens, turn = batch["host"]["tokens"], batch["host"]["turn_id"]
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


@producer("answer_parse", trees=True,
          provides=("answer_value",),
          requires=("tokens", "response_mask"),
          phase="reward",
          doc="the numeric value of each response's final "
"answer (the task's answer_value, else the last number; NaN when none)")
def _build_answer_value(s: Setup, wanted: frozenset) -> Produce:
  """answer_value [B]: the task's `answer_value(text)` of each response's final answer, or
  the last number in it (`last_number`); for multi-turn episodes, of the last action."""
  tok, task = s.data.tokenizer, s.data.task
  parse = getattr(task, "answer_value", None) or last_number

  def produce(state, batch, ctx: StepContext) -> dict:
    if "trajectories" in batch:
      texts = [t.actions[-1] if t.actions else "" for t in batch["trajectories"]]
    else:
      host = batch["host"]
      texts = tasks_lib.decode_responses(tok, host["tokens"], host["response_mask"])
    values = np.asarray([parse(t) for t in texts], np.float32)
    return {"answer_value": parallel.shard_batch(values, s.mesh)}

  return produce


def _response_rows(s: Setup, batch: Mapping[str, Any], ctx: StepContext):
  """(example, response token ids, response text, response positions) of every row."""
  tok = s.data.tokenizer
  host = batch["host"]
  tokens, resp = host["tokens"], host["response_mask"]
  examples = examples_rows(ctx.examples)
  for b, g in enumerate(host["group_id"]):
    ids = tokens[b][resp[b]]
    yield examples[g], ids, tok.decode(ids), np.flatnonzero(resp[b])


@producer("subproblems",
          provides=("sub_rewards", "sub_mask", "span_id"),
          requires=("tokens", "response_mask"),
          phase="reward",
          doc="the task's verifiable subproblems (SCRL): a verifier result for each and the "
              "response tokens of each one's answer span",
          when=task_has("subproblems"),
          off_doc="needs a built-in task with subproblems, e.g. chain")
def _build_subproblems(s: Setup, wanted: frozenset) -> Produce:
  """sub_rewards / sub_mask [B,J] and span_id [B,T]: the task's `subproblems` (SCRL) — a
  verifier result per subproblem, and the subproblem whose answer span holds each token
  (the characters' span ids through `token_flags`, one subproblem at a time)."""
  tok, task = s.data.tokenizer, s.data.task
  J = task.num_subproblems

  def produce(state, batch, ctx: StepContext) -> dict:
    B, T = batch["host"]["response_mask"].shape
    sub, sub_mask = np.zeros((B, J), np.float32), np.zeros((B, J), bool)
    span = np.full((B, T), -1, np.int32)
    for b, (example, ids, text, pos) in enumerate(_response_rows(s, batch, ctx)):
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


@producer("unit_tests",
          provides=("test_pass", "test_mask"),
          requires=("tokens", "response_mask"),
          phase="reward",
          doc="the response run on each of the task's unit tests by the task's own "
              "interpreter, with step and depth limits (VeRPO)",
          when=task_has("test_pass"),
          off_doc="needs a built-in task with unit tests, e.g. program")
def _build_unit_tests(s: Setup, wanted: frozenset) -> Produce:
  """test_pass / test_mask [B,U]: the task's `test_pass` — each response run on every unit
  test by the task's own interpreter (limits included: a failing run fails its test)."""
  task = s.data.task
  U = task.num_tests

  def produce(state, batch, ctx: StepContext) -> dict:
    rows = list(_response_rows(s, batch, ctx))
    passed = np.asarray([task.test_pass(e, text) for e, _, text, _ in rows], np.float32)
    return parallel.shard_batch({"test_pass": passed.reshape(len(rows), U),
                                 "test_mask": np.ones((len(rows), U), bool)}, s.mesh)

  return produce


@producer("rubric_check",
          provides=("rubric", "rubric_mask"),
          requires=("tokens", "response_mask"),
          phase="reward",
          doc="the task's rubric items judged on each response "
"(C-GRPO)",
          when=task_has("rubric"),
          off_doc="needs a built-in task with a rubric, e.g. chain")
def _build_rubric(s: Setup, wanted: frozenset) -> Produce:
  """rubric / rubric_mask [B,C]: the task's `rubric` items judged on each response."""
  task = s.data.task
  C = task.num_rubric_items

  def produce(state, batch, ctx: StepContext) -> dict:
    rows = list(_response_rows(s, batch, ctx))
    rubric, mask = np.zeros((len(rows), C), np.float32), np.zeros((len(rows), C), bool)
    for b, (example, _, text, _) in enumerate(rows):
      items = task.rubric(example, text)
      rubric[b, :len(items)], mask[b, :len(items)] = items, True
    return parallel.shard_batch({"rubric": rubric, "rubric_mask": mask}, s.mesh)

  return produce


@producer("tool_usage",
          provides=("tool_calls", "tool_cost"),
          requires=("tokens", "response_mask"),
          phase="reward",
          doc="tool-call rounds and tool cost of each multi-turn episode (HyperEyes TRACE "
              "cost)",
          when=_tool_actions,
          off_doc="needs a multi-turn task whose turns are tool calls (credit.envs, "
          "`tool_actions`), e.g. calculator or lookup")
def _build_tool_usage(s: Setup, wanted: frozenset) -> Produce:
  """tool_calls / tool_cost [B] of multi-turn episodes: the turns that called a tool (a
  well-formed call), and every turn that cost an environment round without answering (the
  calls plus malformed actions)."""
  from credit.envs import tools as tools_lib  # pylint: disable=g-import-not-at-top

  def produce(state, batch, ctx: StepContext) -> dict:
    calls, cost = [], []
    for t in batch["trajectories"]:
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


@producer("reward_components",
          provides=("reward_components",),
          requires=("tokens", "response_mask", "reward"),
          phase="reward",
          doc="several reward signals per response, the columns c.reward_components names: "
              + "; ".join(f"{k} ({v[1]})" for k, v in REWARD_COMPONENTS.items()),
          when=lambda c: bool(c.reward_components),
          check=_check_reward_components,
          off_doc="set c.reward_components, e.g. ('outcome', 'format')")
def _build_reward_components(s: Setup, wanted: frozenset) -> Produce:
  """reward_components [B,R]: the columns c.reward_components names (REWARD_COMPONENTS), in
  that order — several reward signals per response for multi-reward estimators (GDPO's
  decoupled normalisation, SearchLLM's gates and objectives)."""
  tok, task, names = s.data.tokenizer, s.data.task, list(s.c.reward_components)
  stops = np.asarray(getattr(tok, "stop_ids", None) or (tok.eos_id,))
  fmt = getattr(task, "format_ok", None)

  def produce(state, batch, ctx: StepContext) -> dict:
    rows = list(_response_rows(s, batch, ctx))
    resp = batch["host"]["response_mask"]
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
