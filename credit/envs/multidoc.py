"""`multidoc`: multi-document question answering, a coordinator reading documents.

The facts an h-hop question needs (as in `lookup`: "city of boss of ann?") are spread over
several generated documents, one gold fact per document, among distractor facts. The
prompt names the number of documents D and the question; the documents are hidden:

  prompt "3 docs. city of boss of ann?"
  doc 1  "kim pet: tod."   doc 2  "bob city: kim. ann team: rus."   doc 3  "ann boss: bob."

The policy reads one document per turn with `read(d)` (d in 1..D; the observation is the
document text, cut to the limits' `max_observation_chars` with a visible marker) and ends
with `answer(name)`. A gold fact counts as revealed only when the (cut) observation shows
it whole; distractors go to the documents with the fewest facts, so with the defaults a
document holds at most two facts and is never cut.

Demonstrators (`demonstrator`):
  gold    reads the gold documents in chain order, then answers (h + 1 turns): `read(3)`,
          `read(2)`, `answer(kim)`. Where the facts are is not in the prompt, so its first
          read is a uniform draw from the policy's point of view, and it never shows what to
          do after reading a document without a gold fact.
  search  what a reader who cannot see the documents can do: reads unread documents in a
          random order (drawn from the warm-up's generator, else from `world_seed`) until
          every gold fact has been revealed, then answers (h + 1 to D + 1 turns): `read(1)`
          -> "kim pet: tod.", `read(3)`, `read(2)`, `answer(kim)`. Misses are followed by
          reads.
  scan    as `search`, in the documents' order: `read(1)`, `read(2)`, ... until every gold
          fact has been revealed, then the answer; the next read follows from the last one.

Roles (`StepResult.role` -> `turn_role`): 0 for the coordinator's dispatch turns (reads,
errors), 1 for the synthesis turn (the answer).

Per turn:
  reward    1 when the document read holds a gold fact not revealed before, else 0;
  progress  (gold facts revealed so far) / h; reading documents needs no order; with
            `settle_progress`, (gold facts revealed so far) / (h + 1) and, on the episode's
            last turn (its answer, or the turn limit), the outcome: 1 for a right answer, 0
            for a wrong one or none, so the turns' progress gains sum to the outcome (an
            episode that reveals facts and then fails gives it all back on its last turn);
  info      `doc`: the document read (None on an error), `gold_revealed`: the chain hops
            it revealed first, `gold_calls`: the reads of every document that still holds
            an unrevealed gold fact (the answer once none does), `correct`.
Outcome: exact match of the answered name with the chain's end; with `grounded`, only when
the reads before the answer revealed every gold fact as well (a right name guessed from a
document that does not hold the chain scores 0). The answer turn's info has `exact` (the name
is right) and `grounded` (every gold fact was revealed). `gold_answer` is "answer(<name>)".

Documents are a pure function of the example's `world_seed` and the task options: the
knowledge base of `Lookup(...).world(world_seed)`, its facts placed on documents by a
second generator seeded from `world_seed`. All texts use the character tokenizer's
vocabulary.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from credit.envs.base import Limits, StepResult, TextEnv, Turn, task_limits
from credit.envs.lookup import SEED_HIGH, Lookup, World
from credit.envs.tools import ANSWER, Action, ToolFormat, parse_action
from credit.tasks.base import int_field, register_task, text_field

DISPATCH, SYNTHESIS = 0, 1
DEMONSTRATORS = ("gold", "search", "scan")


@register_task("multidoc")
@dataclasses.dataclass(frozen=True)
class MultiDoc:
  """Multi-hop QA over D hidden documents with a `read(d)` tool (module docstring).

  Attributes:
    min_hops, max_hops: h, the number of gold facts (documents to read).
    num_docs: D >= max_hops.
    num_distractors: non-chain facts, placed on random documents.
    num_relations: relations used (`lookup.RELATIONS`).
    extra_turns: turns beyond a demonstration's h + 1.
    max_observation_chars: observations (documents) are cut to this many characters.
    call_open, call_close: tool-call markers (`ToolFormat`).
    demonstrator: "gold" (the gold documents in chain order), "search" (unread documents
      in a random order until the chain is revealed) or "scan" (the same in the documents'
      order); search and scan need max_turns >= num_docs + 1.
    grounded: the outcome needs every gold fact revealed before the answer (module docstring).
    settle_progress: the last turn's progress is the outcome (module docstring).
  """
  min_hops: int = 2
  max_hops: int = 3
  num_docs: int = 4
  num_distractors: int = 3
  num_relations: int = 6
  extra_turns: int = 1
  max_observation_chars: int = 52
  call_open: str = ""
  call_close: str = ""
  demonstrator: str = "gold"
  grounded: bool = False
  settle_progress: bool = False
  name = "multidoc"
  multi_turn = True
  tool_actions = True  # turns are tool calls (each step's info holds the parsed `action`)

  def __post_init__(self):
    Lookup(self.min_hops, self.max_hops, self.num_distractors, self.num_relations)  # checks
    if not self.max_hops <= self.num_docs <= 9:
      raise ValueError(f"num_docs must be in [max_hops, 9], got {self.num_docs}")
    if self.extra_turns < 0 or self.max_observation_chars < 8:
      raise ValueError("need extra_turns >= 0 and max_observation_chars >= 8")
    if self.demonstrator not in DEMONSTRATORS:
      raise ValueError(f"demonstrator={self.demonstrator!r} is not one of {DEMONSTRATORS}")
    if self.demonstrator != "gold" and self.max_turns < self.num_docs + 1:
      raise ValueError(f"demonstrator={self.demonstrator!r} reads up to num_docs={self.num_docs} documents "
                       f"and answers, but max_turns={self.max_turns}; raise extra_turns to "
                       f">= {self.num_docs - self.max_hops}")

  @property
  def fmt(self) -> ToolFormat:
    return ToolFormat(self.call_open, self.call_close)

  @property
  def _lookup(self) -> Lookup:
    return Lookup(self.min_hops, self.max_hops, self.num_distractors, self.num_relations)

  @property
  def int_fields(self) -> dict[str, tuple[int, ...]]:
    return {"world_seed": (), "hops": ()}

  @property
  def max_turns(self) -> int:
    return self.max_hops + 1 + self.extra_turns

  @property
  def max_prompt_chars(self) -> int:
    return len(f"{self.num_docs} docs. ") + self._lookup.max_prompt_chars

  @property
  def max_action_chars(self) -> int:
    return max(len(self.fmt.call("read", "9")), len(self.fmt.answer("xxx")))

  @property
  def max_response_chars(self) -> int:
    return self.max_action_chars

  def documents(self, seed: int) -> tuple[World, tuple[str, ...], dict]:
    """The world, the D document texts and where each gold hop is: hop -> doc index."""
    world = self._lookup.world(seed)
    rng = np.random.default_rng([seed, 1])
    h, d = len(world.chain), self.num_docs
    gold_docs = rng.permutation(d)[:h]
    docs: list[list[str]] = [[] for _ in range(d)]
    for (s, r, o), j in zip(world.chain, gold_docs):
      docs[j].append(f"{s} {r}: {o}.")
    gold = set(world.chain)
    for (s, r), o in world.facts.items():
      if (s, r, o) not in gold:  # on a random one of the documents with the fewest facts
        fewest = min(len(f) for f in docs)
        free = [j for j in range(d) if len(docs[j]) == fewest]
        docs[free[int(rng.integers(len(free)))]].append(f"{s} {r}: {o}.")
    texts = tuple(" ".join(rng.permutation(f).tolist()) if f else "empty." for f in docs)
    return world, texts, {i: int(j) for i, j in enumerate(gold_docs)}

  def generate(self, rng: np.random.Generator, n: int) -> list[dict]:
    out = []
    for _ in range(n):
      seed = int(rng.integers(0, SEED_HIGH))
      w = self._lookup.world(seed)
      out.append({"prompt": f"{self.num_docs} docs. {w.question}", "answer": w.answer,
                  "world_seed": seed, "hops": len(w.chain)})
    return out

  def verify(self, example: Mapping[str, Any], response: str) -> float:
    act = parse_action(response, self.fmt, {"read": 1})
    return float(act.kind == ANSWER and act.args[0] == text_field(example, "answer"))

  def _docs_of(self, example: Mapping[str, Any]):
    world, texts, where = self.documents(int_field(example, "world_seed"))
    if f"{self.num_docs} docs. {world.question}" != text_field(example, "prompt"):
      raise ValueError(f"example {text_field(example, 'prompt')!r} was not generated by {self}")
    return world, texts, where

  def demonstration_turns(self, example: Mapping[str, Any],
                          rng: np.random.Generator | None = None) -> list[str]:
    world, texts, where = self._docs_of(example)
    if self.demonstrator == "gold":
      return [self.fmt.call("read", str(where[i] + 1)) for i in range(len(world.chain))] + [
          self.fmt.answer(world.answer)]
    if rng is None and self.demonstrator == "search":
      rng = np.random.default_rng([int_field(example, "world_seed"), 2])
    limits = task_limits(self)
    missing = {i for i, (s, r, o) in enumerate(world.chain)
               if f"{s} {r}: {o}." in limits.truncate(texts[where[i]])}
    turns = []
    order = (range(self.num_docs) if self.demonstrator == "scan" else
             rng.permutation(self.num_docs).tolist())
    for d in order:
      if not missing:
        break
      turns.append(self.fmt.call("read", str(d + 1)))
      missing -= {i for i in missing if where[i] == d}
    return turns + [self.fmt.answer(world.answer)]

  def demonstration(self, example: Mapping[str, Any], rng: np.random.Generator | None = None
                    ) -> str:
    del rng
    return self.fmt.answer(text_field(example, "answer"))

  def make_env(self, example: Mapping[str, Any], limits: Limits | None = None) -> "MultiDocEnv":
    world, texts, where = self._docs_of(example)
    return MultiDocEnv(text_field(example, "prompt"), world, texts, where,
                       task_limits(self, limits), self.fmt, grounded=self.grounded,
                       settle_progress=self.settle_progress)


class MultiDocEnv(TextEnv):
  """One `multidoc` episode. State: the tuple of revealed-flags of the chain's hops."""
  tools = {"read": 1}

  def __init__(self, prompt: str, world: World, docs: tuple[str, ...], where: dict,
               limits: Limits, fmt: ToolFormat = ToolFormat(), *, grounded: bool = False,
               settle_progress: bool = False):
    super().__init__(limits, fmt)
    self.prompt, self.world, self.docs, self.where = prompt, world, docs, where
    self.gold_answer = fmt.answer(world.answer)
    self.grounded, self.settle_progress = grounded, settle_progress

  def step(self, action: str) -> StepResult:
    """`TextEnv.step`; with `settle_progress`, the last turn's progress is the outcome (the
    state then carries it after the h revealed-flags)."""
    res = super().step(action)
    if self.settle_progress and res.done:
      ok = self._ep.outcome >= 1.0
      h = len(self.world.chain)
      self._ep = self._ep._replace(state=self._ep.state[:h] + (ok,))
      res = res._replace(progress=float(ok))
    return res

  def _answer_turn(self, state: tuple[bool, ...], action: Action, info: dict) -> Turn:
    """The answer turn: right name (and, when grounded, every gold fact revealed)."""
    exact, seen = action.args[0] == self.world.answer, all(state[:len(self.world.chain)])
    ok = exact and (seen or not self.grounded)
    return Turn("", correct=ok, outcome=float(ok), info=dict(info, exact=exact, grounded=seen))

  def _initial_state(self) -> tuple[bool, ...]:
    return (False,) * len(self.world.chain)

  def _progress(self, state: tuple[bool, ...]) -> float:
    h = len(self.world.chain)
    if len(state) > h:  # settled
      return float(state[h])
    return sum(state) / (h + int(self.settle_progress))

  def _role(self, action: Action) -> int:
    return SYNTHESIS if action.kind == ANSWER else DISPATCH

  def _gold_calls(self, state: tuple[bool, ...]) -> tuple[str, ...]:
    calls = tuple(self.fmt.call("read", str(self.where[i] + 1))
                  for i, seen in enumerate(state) if not seen)
    return calls or (self.fmt.answer(self.world.answer),)

  def _act(self, state: tuple[bool, ...], action: Action) -> tuple[Any, Turn]:
    gold = self._gold_calls(state)
    if action.kind == ANSWER:
      return state, self._answer_turn(state, action, {"gold_calls": gold, "doc": None,
                                                      "gold_revealed": ()})
    arg, n = action.args[0], len(self.docs)
    if arg not in [str(i) for i in range(1, n + 1)]:
      return state, Turn(f"error: write read(d), d in 1..{n}", correct=False,
                         info={"gold_calls": gold, "doc": None, "gold_revealed": (),
                               "valid": False})
    d = int(arg) - 1
    text = self.limits.truncate(self.docs[d])
    hops = tuple(i for i, (s, r, o) in enumerate(self.world.chain)
                 if self.where[i] == d and not state[i] and f"{s} {r}: {o}." in text)
    state = tuple(s or i in hops for i, s in enumerate(state))
    return state, Turn(self.docs[d], reward=float(bool(hops)), correct=bool(hops),
                       info={"gold_calls": gold, "doc": d + 1, "gold_revealed": hops})
