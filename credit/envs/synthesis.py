"""Agent-synthesised multi-hop questions (ASearcher's data agent): over the `lookup` knowledge base, and over the search corpus with injection and fuzzing.

The second half (`synthesize_search`) grows `search_qa` questions over the built-in corpus by
injection and fuzzing and keeps those answered without tools by none and with tools at least
once (its section comment below); the first half, what follows, is the `lookup` synthesis.

What ASearcher does (inclusionAI/ASearcher @ 813e804, `qa_synthesis/qa_synthesis_agent.py`,
`ConstructQAAgent.generate`, and the README's "Data Synthesis"): a prompt-driven LLM agent
(QwQ-32B for reasoning, Qwen2.5-72B-Instruct for page extraction and judging) grows one
question at a time over Wikipedia pages.

  1. Base QA: a random root page; the agent writes a simple question with a unique answer and
     a declarative `statement` of the fact it uses (`base_qa`).
  2. Up to `max_turns = 16` edits; each turn the agent chooses an action (`choose_action`):
     SELECT ("context injection"): pick an entity from its relevant-entity list, a random
       unseen neighbour page from that entity's in/out links (`random.choice`), write a
       "link QA" whose answer is the entity and whose context is the neighbour, check its
       statement is not already covered (`check_info_cover`), then combine (`combine_qa`):
       the mention of the entity in the question is replaced by the sub-question, and the
       combined question must keep the SAME answer (asserted);
     FUZZ: rewrite the question to obscure one detail that gives the answer away;
     EXIT: offered only once the current question was solved by none of the direct answers;
     (BRAINSTORM, adding LLM-proposed entities checked against their pages, is commented out.)
  3. Checks after every edit; an edit that fails one is dropped (`continue`):
     validity (`check_qa_valid`, an LLM judge: not a concatenation of questions, the answer
       is the only correct one, solvable from the collected statements);
     difficulty (`direct_generate`: 8 answers of the reasoning model at temperature 0.6,
       without tools, judged by `llm_judge_answer`; the accuracy "c/8" is recorded);
     uniqueness (`check_alternative_answer`: a wrong answer that also fits every constraint
       makes the question ambiguous, and the edit is dropped).
     A passing edit becomes the new state and joins `qa_history` with its accuracy; which
     questions to train on is decided downstream (the report keeps the hard ones).

Here, scaled to the built-in task. The knowledge base is a world of `credit.envs.lookup`
(facts (name, relation) -> name, a pure function of `world_seed`); a question is a chain of
facts ("city of boss of ann?"). The agent is a policy (a model played by the rollout engine,
`credit.envs.rollout.MultiTurnSampler`, through `SamplerPlayer`), and what it reads decides
what can be synthesised:

  * Seed: the world's own question, when it has fewer than `hops_max` hops (the base QA).
  * Exploration: each round the agent plays k episodes of the current question and one probe
    episode per relation about the question's answer entity, prompted in the task's own
    form ("team of kim?"). The facts it read are the observations in its transcripts
    ("kim team: zed"); they accumulate along a question's lineage (ASearcher's memory of
    relevant entities and statements). Nothing else enters: the knowledge base only verifies.
  * Injection, one hop more:
      "prefix" (ASearcher's SELECT): a read fact (x, r, start) replaces the start name by the
        sub-question "r of x": "city of boss of ann?" -> "city of boss of pet of zed?", the
        answer unchanged;
      "extend" (the issue's form): a read fact (answer, r, v) asks one hop further:
        "team of city of boss of ann?", answer v.
    The lookup tool reads facts forwards only, so an agent can be sent to explore from the
    answer (the probes) but cannot be asked who points at the start: prefix injections come
    only from facts it read on its own. Both are kept; `via` records which.
  * FUZZ has no counterpart: names and relations are exact symbols, and blurring one
    ("? of ann") would make the answer non-unique, which the check below would refuse. What
    fuzzing buys ASearcher (no single detail gives the answer away) the hidden knowledge base
    gives here: every hop has to be looked up.
  * Answerability (`check_candidate`), exact instead of an LLM judge: every hop is a fact of
    the world (`Lookup.check_question`); the answer is unique because the world holds at most
    one fact per (name, relation), so no alternative-answer check is needed; the prompt
    parses back through `Lookup.make_env`, and the task's demonstrator solves it within the
    episode limits.
  * Difficulty: the solver policy (the explorer unless given) plays k sampled episodes of the
    candidate in the real multi-turn environment (ASearcher answers without tools); the pass
    rate is the mean outcome. A candidate is kept when `min_rate <= rate <= max_rate`. Its
    episodes are also the next round's exploration, so a candidate's k episodes serve both.
    Like ASearcher, growth does not wait on difficulty: an answerable candidate is injected
    again (up to `hops_max`), whatever its rate.

Kept questions are (prompt, answer, world_seed, hops) records (plus `pass_rate`, `via`,
`seed_prompt`), written as jsonl; `Lookup(questions_path=...)` trains on them, re-verifying
every record against its world. Everything is deterministic in `seed` (numpy rng for worlds,
probes and choices; `jax.random.fold_in(key(seed), round)` for the episodes).

>>> task = Lookup(max_hops=3)                                            # doctest: +SKIP
>>> player = SamplerPlayer(sampler, model_state, batch_size=112)          # doctest: +SKIP
>>> res = synthesize(task, player, num=32)                               # doctest: +SKIP
>>> write_questions("questions.jsonl", res.records)                      # doctest: +SKIP
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import json
import os
import re
import time
from typing import Any, Callable, Mapping, NamedTuple, Protocol, Sequence

import jax
import numpy as np

from credit.envs import corpus as corpus_lib
from credit.envs.base import Limits, TextEnv, Turn, run_episode, task_limits
from credit.envs.lookup import SEED_HIGH, Lookup, question_text
from credit.envs.search import SearchEnv, SearchQA
from credit.envs.tools import ANSWER, Action, ToolFormat

__all__ = ["ClosedBookEnv", "DemonstratorPlayer", "ExploreEnv", "Node", "Player", "PriorPlayer",
           "SamplerPlayer", "SynthesisResult", "check_candidate", "closed_book_env",
           "corpus_injections", "fuzz_question", "injections", "record_of", "revealed_facts",
           "synthesize", "synthesize_search", "write_questions", "write_search_questions"]

Fact = tuple[str, str, str]  # (name, relation, value)
_FACT = re.compile(r"([a-z]+) ([a-z]+): ([a-z]+)")
_WORD = re.compile(r"[a-z]+")


def record_of(world_seed: int, chain: Sequence[Fact]) -> dict:
  """The lookup example of a chain of facts: prompt, answer, world_seed, hops."""
  return {"prompt": question_text(chain[0][0], tuple(r for _, r, _ in chain)),
          "answer": chain[-1][2], "world_seed": int(world_seed), "hops": len(chain)}


def revealed_facts(trajectory: Any) -> set[Fact]:
  """The facts an episode's observations showed the agent ("ann boss: bob"), as it saw them:
    a cut observation or "ann pet: none" reveals nothing."""
  out = set()
  for obs in trajectory.observations:
    m = _FACT.fullmatch(obs.strip())
    if m and m.group(3) != "none":
      out.add(m.groups())
  return out


def injections(chain: Sequence[Fact], known: Sequence[Fact] | frozenset,
               hops_max: int) -> list[tuple[str, tuple[Fact, ...]]]:
  """The one-hop-longer questions that the facts `known` make of `chain` (module docstring):
  ("extend", chain + (f,)) for a fact f from the answer, ("prefix", (f,) + chain) for a fact
  f whose value is the start name; none that would use a (name, relation) twice or exceed
  `hops_max` hops. Sorted, so the result does not depend on set order."""
  chain = tuple(chain)
  if len(chain) >= hops_max:
    return []
  used = {(s, r) for s, r, _ in chain}
  start, end = chain[0][0], chain[-1][2]
  out = []
  for f in sorted(set(known)):
    s, r, v = f
    if (s, r) in used:
      continue
    if s == end:
      out.append(("extend", chain + (f,)))
    if v == start:
      out.append(("prefix", (f,) + chain))
  return out


def check_candidate(task: Lookup, record: Mapping[str, Any],
                    limits: Limits | None = None) -> str | None:
  """Why a candidate question is not answerable (None: it is): a chain of facts of its
  world with that answer and hop count (`Lookup.check_question`; the answer is unique, as
  the world holds one fact per (name, relation)); `make_env` parses the prompt back to the
  same question; the task's demonstration solves it within `limits`."""
  why = task.check_question(record)
  if why is not None:
    return why
  env = task.make_env(record, limits)
  if env.reset() != record["prompt"] or env.world.answer != record["answer"]:
    return "make_env does not parse the prompt back to this question"
  try:
    ep = run_episode(env, task.demonstration_turns(record))
  except ValueError:
    return f"not answerable within max_turns={env.limits.max_turns}"
  if ep.outcome != 1.0:
    return "the demonstration does not solve it"
  return None


class ExploreEnv(TextEnv):
  """A probe episode: the prompt asks for one fact ("team of kim?"); `lookup(name relation)`
  reads the knowledge base as in `LookupEnv` and `answer(...)` ends the episode. No reward,
  outcome 0: a probe is for reading (which fact exists is for the agent to find out)."""
  tools = {"lookup": 1}

  def __init__(self, facts: Mapping[tuple[str, str], str], prompt: str, limits: Limits,
               fmt: ToolFormat = ToolFormat()):
    super().__init__(limits, fmt)
    self.facts, self.prompt = facts, prompt

  def _initial_state(self) -> tuple:
    return ()

  def _progress(self, state: tuple) -> float:
    del state
    return 0.0

  def _act(self, state: tuple, action: Action) -> tuple[tuple, Turn]:
    if action.kind == ANSWER:
      return state, Turn("", correct=False)
    words = action.args[0].split()
    if len(words) != 2 or not all(_WORD.fullmatch(w) for w in words):
      return state, Turn("error: write lookup(name relation)", correct=False)
    s, r = words
    return state, Turn(f"{s} {r}: {self.facts.get((s, r), 'none')}")


class Player(Protocol):
  """Plays environments to the end: one result per env with `observations` (the texts the
  agent saw) and `outcome` (`credit.envs.rollout.Trajectory` has both)."""

  def __call__(self, envs: Sequence[Any], key: jax.Array) -> list[Any]: ...


class SamplerPlayer:
  """A policy as a `Player`: `MultiTurnSampler` episodes in fixed batches of `batch_size`
  rows (one compiled shape; padding rows play copies of the last env and are dropped)."""

  def __init__(self, sampler, model_state, *, batch_size: int, temperature: float = 1.0,
               top_k: int = 0, top_p: float = 1.0):
    if batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    self.sampler, self.model_state, self.batch_size = sampler, model_state, batch_size
    self.temperature, self.top_k, self.top_p = temperature, top_k, top_p

  def __call__(self, envs: Sequence[Any], key: jax.Array) -> list[Any]:
    out, B = [], self.batch_size
    for j, i in enumerate(range(0, len(envs), B)):
      chunk = list(envs[i:i + B])
      rows = chunk + [copy.copy(chunk[-1]) for _ in range(B - len(chunk))]
      res = self.sampler(self.model_state, rows, key=jax.random.fold_in(key, j),
                         temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)
      out += res.trajectories[:len(chunk)]
    return out


class Node(NamedTuple):
  """A verified question of one world and what the agent has read along its lineage."""
  world_seed: int
  chain: tuple[Fact, ...]
  known: frozenset  # facts (name, relation, value) read in the agent's transcripts
  via: str          # "seed" (the world's own question), "extend" or "prefix"
  seed_prompt: str  # the world question it grew from

  @property
  def record(self) -> dict:
    return record_of(self.world_seed, self.chain)


class SynthesisResult(NamedTuple):
  """Kept questions (records with `pass_rate`, `via`, `seed_prompt`) and the counts:
  rounds, seeds, episodes, proposed (distinct injections of read facts), answerable,
  rejected (the first few in `reject_examples`), measured (difficulty measured), kept,
  too_easy, too_hard, hops / via histograms of the kept, seed and candidate mean pass
  rates, seconds."""
  records: list[dict]
  stats: dict


def synthesize(task: Lookup, explorer: Player, *, num: int, solver: Player | None = None,
               seed: int = 0, hops_max: int | None = None, k: int = 8, min_rate: float = 0.1,
               max_rate: float = 0.8, questions_per_round: int = 4, probes: int | None = None,
               branch: int = 1, max_rounds: int = 50, limits: Limits | None = None,
               log: Callable[[str], None] | None = None) -> SynthesisResult:
  """Grows questions from seed worlds by injection and keeps the verified, mid-difficulty
  ones (module docstring).

  Args:
    task: the lookup task (its options define the worlds; the file is valid only for them).
    explorer: the agent that explores (plays the probes, and the questions unless `solver`).
    num: stop once this many questions are kept.
    solver: the policy whose pass rate is the difficulty (default: the explorer).
    seed: worlds, probes, choices and episode keys.
    hops_max: longest question (default and at most `task.max_hops`, the prompt width the
      task is built for); seeds have fewer hops.
    k: episodes per question for the pass rate.
    min_rate, max_rate: kept when min_rate <= pass rate <= max_rate.
    questions_per_round: questions played per round (seeds fill up the queue).
    probes: probe episodes per question about its answer entity, one per relation drawn
      (default: every relation it does not use); none once a question has `hops_max` hops.
    branch: answerable injections of a question queued for measuring (ASearcher: 1, one path).
    max_rounds: stop after this many rounds.
    limits: episode limits (default the task's); the players' layouts must agree.
    log: called with one line per round.
  """
  hops_max = _check_synthesis_options(task, hops_max, num=num, k=k, min_rate=min_rate,
                                      max_rate=max_rate,
                                      questions_per_round=questions_per_round, branch=branch,
                                      max_rounds=max_rounds)
  run = _Synthesis(task, explorer, solver, seed=seed, hops_max=hops_max, k=k, min_rate=min_rate,
                   max_rate=max_rate, num=num, branch=branch,
                   n_probe=len(task.relations) if probes is None else int(probes),
                   limits=task_limits(task, limits))
  t0 = time.perf_counter()
  rnd = 0
  while len(run.kept) < num and rnd < max_rounds:
    run.play_round(rnd, questions_per_round)
    rnd += 1
    if log is not None:
      st = run.st
      log(f"round {rnd}: episodes {st['episodes']} proposed {st['proposed']} answerable "
          f"{st['answerable']} measured {st['measured']} kept {len(run.kept)}")
  return SynthesisResult(run.kept, run.stats(rnd, time.perf_counter() - t0))


def _check_synthesis_options(task: Lookup, hops_max: int | None, *, num: int, k: int,
                             min_rate: float, max_rate: float, questions_per_round: int,
                             branch: int, max_rounds: int) -> int:
  """Refuses bad options; returns hops_max (default: the task's max_hops)."""
  hops_max = task.max_hops if hops_max is None else int(hops_max)
  if not task.min_hops < hops_max <= task.max_hops:
    raise ValueError(f"hops_max must be in ({task.min_hops}, {task.max_hops}] (above the "
                     f"seeds' min_hops, within the task's max_hops), got {hops_max}")
  if not 0.0 <= min_rate <= max_rate <= 1.0:
    raise ValueError(f"need 0 <= min_rate <= max_rate <= 1, got {min_rate}, {max_rate}")
  for name, v in (("num", num), ("k", k), ("questions_per_round", questions_per_round),
                  ("branch", branch), ("max_rounds", max_rounds)):
    if v < 1:
      raise ValueError(f"{name} must be >= 1, got {v}")
  return hops_max


class _Synthesis:
  """The state of one `synthesize` run: the queue of questions to measure, what was seen and
  kept, the counters; `play_round` measures one round of questions and queues their
  injections. Every random choice draws from one generator in a fixed order (seeded runs
  repeat)."""

  def __init__(self, task: Lookup, explorer: Player, solver: Player | None, *, seed: int,
               hops_max: int, k: int, min_rate: float, max_rate: float, num: int, branch: int,
               n_probe: int, limits: Limits):
    self.task, self.explorer, self.solver = task, explorer, solver
    self.hops_max, self.k, self.min_rate, self.max_rate = hops_max, k, min_rate, max_rate
    self.num, self.branch, self.n_probe, self.limits = num, branch, n_probe, limits
    self.rng = np.random.default_rng(seed)
    self.key = jax.random.key(seed)
    self.st = collections.Counter()
    self.reasons: list[str] = []
    self.seed_rates, self.cand_rates = [], []
    self.queue: collections.deque[Node] = collections.deque()
    self.seen: set[tuple[int, str]] = set()
    self.kept: list[dict] = []

  def new_seed(self) -> Node:
    for _ in range(1000):
      s = int(self.rng.integers(0, SEED_HIGH))
      w = self.task.world(s)
      if len(w.chain) < self.hops_max and (s, w.question) not in self.seen:
        self.seen.add((s, w.question))
        self.st["seeds"] += 1
        return Node(s, w.chain, frozenset(), "seed", w.question)
    raise RuntimeError("no seed world with fewer than hops_max hops in 1000 draws")

  def play_round(self, rnd: int, questions_per_round: int) -> None:
    """Measures `questions_per_round` questions (seeds fill the queue up) and queues up to
    `branch` answerable injections of each."""
    while len(self.queue) < questions_per_round:
      self.queue.append(self.new_seed())
    nodes = [self.queue.popleft() for _ in range(questions_per_round)]
    solve_t, read = self._play(nodes, rnd)
    k = self.k
    for i, node in enumerate(nodes):
      self._measure(node, float(np.mean([t.outcome for t in solve_t[i * k:(i + 1) * k]])))
      self._grow(node, node.known | frozenset(read[i]))

  def _play(self, nodes: Sequence[Node], rnd: int) -> tuple[list, list[set]]:
    """Plays k episodes of each question and the probes about its answer entity: (the
    question episodes, the facts each question's episodes and probes revealed)."""
    task, k, limits = self.task, self.k, self.limits
    solve_envs, probe_envs, probe_of = [], [], []
    for i, node in enumerate(nodes):
      solve_envs += [task.make_env(node.record, limits) for _ in range(k)]
      if len(node.chain) < self.hops_max:
        end = node.chain[-1][2]
        used = {(s, r) for s, r, _ in node.chain}
        rels = [r for r in task.relations if (end, r) not in used]
        facts = task.world(node.world_seed).facts
        for j in self.rng.permutation(len(rels))[:self.n_probe]:
          probe_envs.append(ExploreEnv(facts, question_text(end, (rels[j],)), limits, task.fmt))
          probe_of.append(i)
    k_e, k_s = jax.random.fold_in(self.key, 2 * rnd), jax.random.fold_in(self.key, 2 * rnd + 1)
    if self.solver is None:
      trajs = self.explorer(solve_envs + probe_envs, k_e)
      solve_t, probe_t = trajs[:len(solve_envs)], trajs[len(solve_envs):]
    else:
      probe_t = self.explorer(probe_envs, k_e) if probe_envs else []
      solve_t = self.solver(solve_envs, k_s)
    self.st["episodes"] += len(solve_envs) + len(probe_envs)
    read: list[set] = [set() for _ in nodes]
    for i, node in enumerate(nodes):
      for t in solve_t[i * k:(i + 1) * k]:
        read[i] |= revealed_facts(t)
    for i, t in zip(probe_of, probe_t):
      read[i] |= revealed_facts(t)
    return solve_t, read

  def _measure(self, node: Node, rate: float) -> None:
    """Records a question's pass rate; keeps a candidate of mid difficulty."""
    if node.via == "seed":
      self.seed_rates.append(rate)
      return
    self.st["measured"] += 1
    self.cand_rates.append(rate)
    if rate < self.min_rate:
      self.st["too_hard"] += 1
    elif rate > self.max_rate:
      self.st["too_easy"] += 1
    elif len(self.kept) < self.num:
      self.kept.append(dict(node.record, pass_rate=rate, via=node.via,
                            seed_prompt=node.seed_prompt))

  def _grow(self, node: Node, known: frozenset) -> None:
    """Proposes every new injection of the question, checks each, queues `branch` of the
    answerable ones."""
    ok = []
    for via, chain in injections(node.chain, known, self.hops_max):
      rec = record_of(node.world_seed, chain)
      if (node.world_seed, rec["prompt"]) in self.seen:
        continue
      self.seen.add((node.world_seed, rec["prompt"]))
      self.st["proposed"] += 1
      why = check_candidate(self.task, rec, self.limits)
      if why is not None:
        self.st["rejected"] += 1
        if len(self.reasons) < 5:
          self.reasons.append(f"{rec['prompt']} (world {node.world_seed}): {why}")
        continue
      self.st["answerable"] += 1
      ok.append(Node(node.world_seed, chain, known, via, node.seed_prompt))
    for j in self.rng.permutation(len(ok))[:self.branch]:
      self.queue.append(ok[j])

  def stats(self, rounds: int, seconds: float) -> dict:
    st, kept = self.st, self.kept
    hist = collections.Counter(r["hops"] for r in kept)
    return {"rounds": rounds, "seeds": st["seeds"], "episodes": st["episodes"],
            "proposed": st["proposed"], "answerable": st["answerable"],
            "rejected": st["rejected"], "reject_examples": self.reasons,
            "measured": st["measured"], "kept": len(kept), "too_easy": st["too_easy"],
            "too_hard": st["too_hard"],
            "hops": {h: hist[h] for h in sorted(hist)},
            "via": dict(collections.Counter(r["via"] for r in kept)),
            "seed_pass_rate": (float(np.mean(self.seed_rates)) if self.seed_rates
                               else float("nan")),
            "candidate_pass_rate": (float(np.mean(self.cand_rates)) if self.cand_rates
                                    else float("nan")),
            "seconds": seconds}


def write_questions(path: str | os.PathLike, records: Sequence[Mapping[str, Any]]) -> None:
  """One JSON record per line (what `Lookup(questions_path=...)` reads)."""
  with open(path, "w") as f:
    for r in records:
      f.write(json.dumps(dict(r), sort_keys=True) + "\n")



# --- the search corpus: injection, fuzzing and a two-sided difficulty check ----------------
#
# ASearcher's data agent (arXiv 2508.07976, section "Data Synthesis") edits a question with
# two actions: injection adds a fact that lengthens the chain the question follows, and
# fuzzing obscures a detail the question names, so that no single detail gives the answer
# away; each edit must keep the answer unique, and a question is kept only when it is hard:
# answered by a model without tools rarely, yet answerable with them. Here, over the built-in
# search corpus (`credit.envs.corpus`), with exact checks in place of LLM judges:
#
#   injection   "prefix": a fact (x, r, start) of the corpus, r a person relation, makes
#                 x's r the new start: "city of boss of ann?" -> "city of boss of coach of kim?";
#               "extend": a fact (answer, r, v) asks one hop further (answer becomes v);
#   fuzzing     the start person's name is replaced by a description derived from the corpus,
#               an attribute of theirs whose value no other person shares: "city of boss of
#               the one whose pet is red goat?" (`corpus.describe`); the agent must first find
#               who that is (one more search);
#   checks      the edited question parses back to a chain of corpus facts with the same
#               answer (`corpus.question_chain`, the description resolving to exactly one
#               person), and the task's demonstrator answers it within the episode;
#   difficulty  each candidate is played `k` times without tools (`ClosedBookEnv`: one turn,
#               the answer only) and `k` times with them (the task's environment); kept when
#               the closed-book pass rate is at most `max_closed` (default 0: never answered
#               without tools) and the pass rate with tools at least `min_open` (> 0).
#
# Players are `Player`s: a policy (`SamplerPlayer`) or, without a model, `DemonstratorPlayer`
# (the task's demonstrator, with tools) and `PriorPlayer` (closed book: the corpus's most
# common value of the question's last relation, a prior that knows the corpus's statistics but
# none of its documents).


class ClosedBookEnv(SearchEnv):
  """A `search_qa` question without tools: one turn; `search` / `open` are refused."""

  def search(self, query: str) -> tuple[str, list[int]]:
    del query
    return "error: no tools", []

  def open(self, doc_id: str, page: str) -> tuple[str, int | None]:
    del doc_id, page
    return "error: no tools", None


def closed_book_env(task: SearchQA, example: Mapping[str, Any]) -> ClosedBookEnv:
  """`task`'s environment of `example` with no tools and one turn."""
  env = task.make_env(example, Limits(max_turns=1))
  out = ClosedBookEnv.__new__(ClosedBookEnv)
  out.__dict__.update(env.__dict__)
  return out


class DemonstratorPlayer:
  """The task's demonstrator as a `Player` (with tools): it plays the demonstration of each
  environment's question (`search_qa` environments; deterministic, `key` unused)."""

  def __init__(self, task: SearchQA):
    self.task = task

  def __call__(self, envs: Sequence[Any], key: jax.Array) -> list[Any]:
    del key
    out = []
    for env in envs:
      ex = {"prompt": env.prompt, "answer": env.golds[0], "aliases": json.dumps(env.golds)}
      turns = self.task._demo_turns(ex) or [self.task.fmt.answer("")]  # pylint: disable=protected-access
      out.append(_played(env, turns))
    return out


class PriorPlayer:
  """A closed-book guesser as a `Player`: answers the corpus's most common value of the
  question's last relation (ties: the first in corpus order); deterministic."""

  def __init__(self, task: SearchQA):
    corpus = task._corpus  # pylint: disable=protected-access
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for (_, r), v in corpus.facts.items():
      counts[r][v] += 1
    self.fmt = task.fmt
    self.guess = {r: c.most_common(1)[0][0] for r, c in counts.items()}

  def __call__(self, envs: Sequence[Any], key: jax.Array) -> list[Any]:
    del key
    out = []
    for env in envs:
      parsed = corpus_lib.parse_question(env.prompt)
      guess = self.guess.get(parsed[1][-1], "") if parsed else ""
      out.append(_played(env, [self.fmt.answer(guess)]))
    return out


def _played(env: Any, actions: Sequence[str]) -> Any:
  """Plays `actions` in `env` until it is done: a `Trajectory`-like record."""
  from credit.envs.rollout import Trajectory  # pylint: disable=g-import-not-at-top
  prompt, results, observations = env.reset(), [], []
  for a in actions:
    if env.done:
      break
    res = env.step(a)
    results.append(res)
    if res.observation:
      observations.append(res.observation)
  return Trajectory(prompt, list(actions[:len(results)]), observations, results,
                    float(env.outcome()), False)


def corpus_injections(corpus: Any, chain: Sequence[Fact], max_hops: int,
                      starts: Sequence[str] | None = None) -> list[tuple[str, tuple[Fact, ...]]]:
  """The chains one injected fact longer (("prefix" | "extend", chain)), at most `max_hops`
  long, each person visited once, a prefix's new start among `starts` (None: anyone; the
  train split's start people keep held-out people out of training questions); in corpus
  order (deterministic)."""
  if len(chain) >= max_hops:
    return []
  people = {chain[0][0]} | {v for _, _, v in chain}
  start, answer = chain[0][0], chain[-1][2]
  out = []
  for (x, r), v in corpus.facts.items():
    if (r in corpus_lib.PERSON_RELATIONS and v == start and x not in people
        and (starts is None or x in starts)):
      out.append(("prefix", ((x, r, start),) + tuple(chain)))
  if answer in corpus.people and chain[-1][1] in corpus_lib.PERSON_RELATIONS:
    for r in corpus_lib.RELATIONS:
      v = corpus.facts.get((answer, r))
      if v is not None and v not in people:
        out.append(("extend", tuple(chain) + ((answer, r, v),)))
  return out


def fuzz_question(corpus: Any, chain: Sequence[Fact], rng: np.random.Generator
                  ) -> str | None:
  """The question of `chain` with its start person's name replaced by a description only they
  fit (one of their attributes, drawn by `rng` among those whose value no other person
  shares); None when they have no such attribute.

  >>> c = corpus_lib.make_corpus(0, num_people=12)
  >>> p = c.people[0]
  >>> chain = next(((p, r, v),) for (q, r), v in c.facts.items() if q == p)
  >>> q = fuzz_question(c, chain, np.random.default_rng(0))
  >>> q is None or (p not in q.split() and corpus_lib.question_chain(c, q) == chain)
  True
  """
  start = chain[0][0]
  options = []
  for attribute in corpus_lib.ATTRIBUTES:
    value = corpus.facts.get((start, attribute))
    if value is not None and sum(corpus.facts.get((p, attribute)) == value
                                 for p in corpus.people) == 1:
      if all((s, r) != (start, attribute) for s, r, _ in chain):  # not the question itself
        options.append((attribute, value))
  if not options:
    return None
  attribute, value = options[int(rng.integers(len(options)))]
  return corpus_lib.question_text(corpus_lib.describe(attribute, value), tuple(r for _, r, _ in chain))


def _search_record(prompt: str, chain: Sequence[Fact], via: str, seed_prompt: str) -> dict:
  answer = chain[-1][2]
  return {"prompt": prompt, "answer": answer, "aliases": json.dumps([answer]),
          "hops": len(chain), "via": via, "seed_prompt": seed_prompt}


def synthesize_search(task: SearchQA, *, num: int, with_tools: Player | None = None,
                      without_tools: Player | None = None, k: int = 4, seed: int = 0,
                      fuzz_prob: float = 0.5, max_closed: float = 0.0, min_open: float = 0.25,
                      batch: int = 32, max_rounds: int = 50) -> SynthesisResult:
  """Questions over the built-in search corpus grown by injection and fuzzing, kept by the
  two-sided difficulty check (see the section comment above).

  Each round draws `batch` seed questions (1-hop, from the train split's start people, so
  held-out people stay unseen), injects facts up to a target length drawn in
  [2, task.max_hops] (a random applicable injection each time), fuzzes the start with
  probability `fuzz_prob`, checks the candidate, and plays every candidate `k` times without
  and with tools (`without_tools` default `PriorPlayer`, `with_tools` default
  `DemonstratorPlayer`). Deterministic in `seed` (and the players').

  Returns `SynthesisResult` (records: prompt, answer, aliases, hops, via, seed_prompt,
  closed_rate, open_rate; load them with `write_search_questions` + `questions_path`).
  """
  if task.questions_path or task.corpus_path:
    raise ValueError("synthesize_search works on the built-in corpus; give a SearchQA "
                     "without corpus_path / questions_path")
  if num < 1 or k < 1 or batch < 1:
    raise ValueError(f"num, k and batch must be >= 1, got {num}, {k}, {batch}")
  if task.max_hops < 2:
    raise ValueError(f"task.max_hops must be >= 2 for injection, got {task.max_hops}")
  corpus = task._corpus  # pylint: disable=protected-access
  with_tools = with_tools or DemonstratorPlayer(task)
  without_tools = without_tools or PriorPlayer(task)
  rng = np.random.default_rng([seed, 0x5E])
  base = dataclasses.replace(task, min_hops=1, max_hops=1)
  starts = frozenset(task._starts("train"))  # pylint: disable=protected-access
  kept, seen = [], set()
  st = collections.Counter()
  t0 = time.perf_counter()
  for rnd in range(max_rounds):
    cands = []
    for ex in base.generate(rng, batch):
      chain = corpus_lib.question_chain(corpus, ex["prompt"])
      target = int(rng.integers(2, task.max_hops + 1))
      via = []
      while len(chain) < target:
        options = corpus_injections(corpus, chain, task.max_hops, starts)
        if not options:
          break
        kind, chain = options[int(rng.integers(len(options)))]
        via.append(kind)
      prompt = corpus_lib.question_text(chain[0][0], tuple(r for _, r, _ in chain))
      if rng.random() < fuzz_prob:
        fuzzed = fuzz_question(corpus, chain, rng)
        if fuzzed is not None:
          prompt, via = fuzzed, via + ["fuzz"]
      st["candidates"] += 1
      rec = _search_record(prompt, chain, "+".join(via) or "seed", ex["prompt"])
      if (not via or prompt in seen or corpus_lib.question_chain(corpus, prompt) != chain
          or task._demo_turns(rec) is None):  # pylint: disable=protected-access
        st["refused"] += 1
        continue
      seen.add(prompt)
      cands.append(rec)
    if cands:
      key = jax.random.fold_in(jax.random.key(seed), rnd)
      closed = without_tools([closed_book_env(task, r) for r in cands for _ in range(k)],
                             jax.random.fold_in(key, 0))
      opened = with_tools([task.make_env(r) for r in cands for _ in range(k)],
                          jax.random.fold_in(key, 1))
      for i, rec in enumerate(cands):
        c_rate = float(np.mean([t.outcome >= 1.0 for t in closed[i * k:(i + 1) * k]]))
        o_rate = float(np.mean([t.outcome >= 1.0 for t in opened[i * k:(i + 1) * k]]))
        st["measured"] += 1
        if c_rate > max_closed:
          st["answered_without_tools"] += 1
        elif o_rate < min_open:
          st["not_answered_with_tools"] += 1
        elif len(kept) < num:
          kept.append(dict(rec, closed_rate=c_rate, open_rate=o_rate))
    if len(kept) >= num:
      break
  stats = dict(st, kept=len(kept), rounds=rnd + 1, seconds=time.perf_counter() - t0)
  return SynthesisResult(kept, stats)


def write_search_questions(path: str | os.PathLike, records: Sequence[Mapping[str, Any]]
                           ) -> None:
  """Writes `synthesize_search` records as a `search_qa` questions file (`questions_path`):
  {"question", "answers", "hops", ...} per line."""
  with open(path, "w", encoding="utf-8") as f:
    for r in records:
      out = {"question": r["prompt"], "answers": json.loads(r["aliases"]), "hops": r["hops"]}
      out.update({k: r[k] for k in ("via", "closed_rate", "open_rate") if k in r})
      f.write(json.dumps(out) + "\n")
