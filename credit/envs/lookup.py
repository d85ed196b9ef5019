"""`lookup`: a multi-hop search agent over a small hidden knowledge base.

Every example has its own knowledge base: facts `(name, relation) -> name` over random
three-letter names ("ann", "bob", ...) and a few relations ("boss", "city", ...). The
prompt is an h-hop question that follows a chain of facts from a start name, written
outermost relation first:

  prompt "city of boss of ann?"      facts  ann boss -> bob,  bob city -> kim  (+ distractors)

The knowledge base is hidden: the policy reads it one fact per turn with the tool
`lookup(name relation)`, whose observation is the fact "ann boss: bob" (or "ann pet: none"
for a pair without a fact), and ends with `answer(name)`. A correct episode (the
demonstration) has h + 1 turns:

  lookup(ann boss) -> "ann boss: bob"   lookup(bob city) -> "bob city: kim"   answer(kim)

Distractor facts (`num_distractors`) give the chain's names other relations and add facts
about other names, so the relation asked matters. Each (name, relation) has at most one
fact, so the question has exactly one answer.

Per turn (`StepResult`, see `credit.envs.base`):
  reward    1 when the turn revealed a gold-chain fact not revealed before, else 0 (the
            answer turn, a repeated or distractor lookup and an error all get 0);
  progress  (number of gold-chain facts revealed so far) / h, in any order;
  info      `revealed`: the fact the turn read ((name, relation, value) or none),
            `gold_revealed`: the indices of the chain hops it revealed first,
            `gold_calls`: the gold call of the state the turn was played in (the lookup of
            the first unrevealed hop, or the answer once all are revealed),
            `correct`: the turn revealed a new gold fact / answered right.
Outcome: 1 if the answer turn's name equals the chain's end exactly, else 0 (0 without an
answer). `gold_answer` is the text of the correct answer turn, "answer(kim)".

The knowledge base is a pure function of the example's integer field `world_seed` and the
task options, so examples are plain (prompt, answer, world_seed, hops) records that the
tfds builder stores; `make_env` rebuilds the world and checks it against the prompt.
All texts use only the character tokenizer's vocabulary.

Synthesised questions (`credit.envs.synthesis`): any other chain of real facts of the same
world is a valid question too ("team of city of boss of ann?" when the world also holds
"kim team: zed"); `make_env` accepts it when every hop is a fact of the world (at most one
per (name, relation), so the answer is unique), no fact is used twice and it has at most
`max_hops` hops. With `questions_path`, `generate` draws its examples from such a jsonl file
(each record verified against its world on loading) instead of the worlds' own questions, and
`generate_eval` from held-out records (`eval_questions_path`, or a share of the file).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from credit.envs.base import Limits, TextEnv, Turn, task_limits
from credit.envs.tools import ANSWER, Action, ToolFormat, parse_action
from credit.tasks.base import int_field, register_task, text_field

RELATIONS = ("boss", "city", "team", "pet", "home", "club", "coach", "aunt")
_CONSONANTS = "bcdfghjklmnprstvz"
_VOWELS = "aeiou"
NAMES = tuple(n for n in (a + b + c for a in _CONSONANTS for b in _VOWELS for c in _CONSONANTS)
              if n not in RELATIONS)
_WORD = re.compile(r"[a-z]+")
SEED_HIGH = 2**31 - 1


class World(NamedTuple):
  """One example's knowledge base and question."""
  question: str
  chain: tuple[tuple[str, str, str], ...]  # the h gold facts (name, relation, value), in order
  facts: dict  # (name, relation) -> value, gold and distractor facts

  @property
  def answer(self) -> str:
    return self.chain[-1][2]


@register_task("lookup")
@dataclasses.dataclass(frozen=True)
class Lookup:
  """Multi-hop question answering with a `lookup(name relation)` tool (module docstring).

  Attributes:
    min_hops, max_hops: h, the chain length, uniform in this range per example.
    num_distractors: non-chain facts per knowledge base.
    num_relations: the first this many of `RELATIONS` are used.
    extra_turns: turns allowed beyond a demonstration's h + 1 (max_turns =
      max_hops + 1 + extra_turns).
    demo_early_answer: an imperfect demonstrator for the supervised warm-up: on a question
      of h >= 2 hops, with this probability its demonstration stops after j lookups (j
      uniform in 1..h-1) and answers with the name the last one revealed, the classic
      premature answer of a search agent ("city of boss of ann?": `lookup(ann boss)` ->
      "ann boss: bob", then `answer(bob)`). Imitating it answers that share of such
      questions wrong; only the outcome reward can teach the policy to finish the chain.
    max_observation_chars: observations are cut to this many characters.
    call_open, call_close: tool-call markers (`ToolFormat`); "" for the character model.
    questions_path: a jsonl file of (prompt, answer, world_seed, hops) records, e.g.
      synthesised by `experiments.synthesize`; when set, `generate` draws its examples from
      it (a fresh permutation of the file per pass, from `rng`) instead of random worlds. Every
      record must verify against its world under these task options (`load_questions`).
    eval_questions_path: held-out questions for `generate_eval` (the runner's eval split),
      verified the same way. Unset, a fixed `eval_fraction` of the `questions_path` records
      (chosen by a permutation with seed 0, the same for every run seed) is held out and
      never drawn by `generate`.
    eval_fraction: the share of `questions_path` held out when `eval_questions_path` is
      unset (at least one record, at least one left to train on); 0 evaluates on the
      training questions themselves.
  """
  min_hops: int = 1
  max_hops: int = 3
  num_distractors: int = 4
  num_relations: int = 6
  extra_turns: int = 1
  demo_early_answer: float = 0.0
  max_observation_chars: int = 52
  call_open: str = ""
  call_close: str = ""
  questions_path: str = ""
  eval_questions_path: str = ""
  eval_fraction: float = 0.1
  name = "lookup"
  multi_turn = True
  tool_actions = True  # turns are tool calls (each step's info holds the parsed `action`)

  def __post_init__(self):
    if not 1 <= self.min_hops <= self.max_hops:
      raise ValueError(f"Need 1 <= min_hops <= max_hops, got {self.min_hops}, {self.max_hops}")
    if not 0.0 <= self.demo_early_answer <= 1.0:
      raise ValueError(f"demo_early_answer must be in [0, 1], got {self.demo_early_answer}")
    if not 2 <= self.num_relations <= len(RELATIONS):
      raise ValueError(f"num_relations must be in [2, {len(RELATIONS)}], got "
                       f"{self.num_relations}")
    if self.num_distractors < 0 or self.extra_turns < 0:
      raise ValueError("num_distractors and extra_turns must be >= 0")
    if self.max_observation_chars < 8:
      raise ValueError(f"max_observation_chars must be >= 8, got {self.max_observation_chars}")
    if not 0.0 <= self.eval_fraction < 1.0:
      raise ValueError(f"eval_fraction must be in [0, 1), got {self.eval_fraction}")
    if self.eval_questions_path and not self.questions_path:
      raise ValueError("eval_questions_path needs questions_path (the training questions)")
    # Questions files are read and verified once, here, so a bad file fails at setup.
    train = self.load_questions(self.questions_path) if self.questions_path else None
    held = None
    if self.eval_questions_path:
      held = self.load_questions(self.eval_questions_path)
    elif train is not None and self.eval_fraction > 0:
      n = len(train)
      n_eval = max(1, int(np.ceil(self.eval_fraction * n)))
      if n - n_eval < 1:
        raise ValueError(f"lookup questions_path {self.questions_path!r} has {n} record(s): "
                         f"holding out {n_eval} for evaluation (eval_fraction="
                         f"{self.eval_fraction}) leaves none to train on; give "
                         "eval_questions_path or eval_fraction=0")
      order = np.random.default_rng(0).permutation(n)
      held = [train[i] for i in sorted(order[:n_eval])]
      train = [train[i] for i in sorted(order[n_eval:])]
    object.__setattr__(self, "_questions", train)
    object.__setattr__(self, "_eval_questions", held if held is not None else train)

  # --- sizes --------------------------------------------------------------------------
  @property
  def fmt(self) -> ToolFormat:
    return ToolFormat(self.call_open, self.call_close)

  @property
  def relations(self) -> tuple[str, ...]:
    return RELATIONS[:self.num_relations]

  @property
  def int_fields(self) -> dict[str, tuple[int, ...]]:
    return {"world_seed": (), "hops": ()}

  @property
  def max_turns(self) -> int:
    return self.max_hops + 1 + self.extra_turns

  @property
  def max_prompt_chars(self) -> int:
    rel = max(len(r) for r in self.relations)
    return self.max_hops * (rel + len(" of ")) + 3 + 1  # "... of ann?"

  @property
  def max_action_chars(self) -> int:
    rel = max(len(r) for r in self.relations)
    return len(self.fmt.call("lookup", "x" * (3 + 1 + rel)))

  @property
  def max_response_chars(self) -> int:
    return self.max_action_chars

  # --- examples -----------------------------------------------------------------------
  def world(self, seed: int) -> World:
    """The knowledge base and question of `world_seed` (deterministic)."""
    rng = np.random.default_rng(seed)
    h = int(rng.integers(self.min_hops, self.max_hops + 1))
    n_other = max(self.num_distractors // 2, 1)
    picked = rng.choice(len(NAMES), size=h + 1 + n_other, replace=False)
    names = [NAMES[i] for i in picked]
    chain_names = names[:h + 1]
    rels = self.relations
    chain = tuple((chain_names[i], rels[int(rng.integers(len(rels)))], chain_names[i + 1])
                  for i in range(h))
    facts = {(s, r): o for s, r, o in chain}
    added, tries = 0, 0
    while added < self.num_distractors and tries < 100 * (self.num_distractors + 1):
      tries += 1
      s = names[int(rng.integers(len(names)))]
      r = rels[int(rng.integers(len(rels)))]
      o = names[int(rng.integers(len(names)))]
      if (s, r) in facts or o == s:
        continue
      facts[(s, r)] = o
      added += 1
    question = "".join(f"{r} of " for _, r, _ in reversed(chain)) + chain[0][0] + "?"
    return World(question, chain, facts)

  def generate(self, rng: np.random.Generator, n: int) -> list[dict]:
    if self.questions_path:
      return self._draw(self._questions, rng, n)
    out = []
    for _ in range(n):
      seed = int(rng.integers(0, SEED_HIGH))
      w = self.world(seed)
      out.append({"prompt": w.question, "answer": w.answer, "world_seed": seed,
                  "hops": len(w.chain)})
    return out

  def _world_of(self, example: Mapping[str, Any]) -> World:
    w = self.world(int_field(example, "world_seed"))
    prompt = text_field(example, "prompt")
    if w.question == prompt:
      return w
    chain = self.question_chain(w.facts, prompt)
    if chain is None:
      raise ValueError(f"example {prompt!r} was not generated by {self} "
                       f"(its world_seed gives {w.question!r}, and the prompt is not a chain "
                       "of that world's facts)")
    if "answer" in example and text_field(example, "answer") != chain[-1][2]:
      raise ValueError(f"example {prompt!r}: its answer {text_field(example, 'answer')!r} is "
                       f"not the chain's end {chain[-1][2]!r} in its world")
    return World(prompt, chain, w.facts)

  # --- synthesised questions (credit.envs.synthesis) ----------------------------------
  def question_chain(self, facts: Mapping[tuple[str, str], str], prompt: str
                     ) -> tuple[tuple[str, str, str], ...] | None:
    """The facts a question follows in a knowledge base, first hop first; None when the
    prompt is not "<rel> of ... of <name>?" with 1..max_hops of this task's relations, a
    hop is not a fact of `facts`, or a fact would be used twice."""
    parsed = parse_question(prompt)
    if parsed is None:
      return None
    start, rels = parsed
    if not 1 <= len(rels) <= self.max_hops or any(r not in self.relations for r in rels):
      return None
    return follow_chain(facts, start, rels)

  def check_question(self, record: Mapping[str, Any]) -> str | None:
    """Why a (prompt, answer, world_seed, hops) record is not a valid question of its world
    under these options (None: valid): its prompt must be the world's own question or a
    chain of its facts (`question_chain`), with that answer and hop count."""
    for field in ("prompt", "answer", "world_seed", "hops"):
      if field not in record:
        return f"no {field!r} field (fields: {sorted(record)})"
    try:
      seed, hops = int(record["world_seed"]), int(record["hops"])
      w = self.world(seed)
    except (TypeError, ValueError) as e:
      return f"world_seed / hops are not integers ({e})"
    prompt = str(record["prompt"])
    parsed = parse_question(prompt)
    if parsed is not None and len(parsed[1]) > self.max_hops:
      return f"{prompt!r} has {len(parsed[1])} hops, more than max_hops={self.max_hops}"
    chain = w.chain if prompt == w.question else self.question_chain(w.facts, prompt)
    if chain is None:
      return (f"{prompt!r} is not a chain of facts of world {seed} "
              f"(whose own question is {w.question!r})")
    if str(record["answer"]) != chain[-1][2]:
      return f"answer {record['answer']!r} is not the chain's end {chain[-1][2]!r}"
    if hops != len(chain):
      return f"hops={hops} but the question has {len(chain)}"
    return None

  def load_questions(self, path: str | os.PathLike) -> list[dict]:
    """The records of a questions file, each verified (`check_question`); raises ValueError
    naming the file, line and reason for the first record that does not verify."""
    path = os.fspath(path)
    if not os.path.exists(path):
      raise ValueError(f"lookup questions_path {path!r} does not exist")
    out = []
    with open(path) as f:
      for i, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          rec = json.loads(line)
        except ValueError as e:
          raise ValueError(f"{path}:{i}: not JSON ({e})") from None
        why = self.check_question(rec) if isinstance(rec, dict) else "not a JSON object"
        if why is not None:
          raise ValueError(f"{path}:{i}: the record does not verify against its world under "
                           f"{self}: {why} (was it synthesised with other task options?)")
        out.append({"prompt": str(rec["prompt"]), "answer": str(rec["answer"]),
                    "world_seed": int(rec["world_seed"]), "hops": int(rec["hops"])})
    if not out:
      raise ValueError(f"lookup questions_path {path!r} holds no records")
    return out

  def generate_eval(self, rng: np.random.Generator, n: int) -> list[dict]:
    """Held-out examples: `generate`'s fresh worlds, or with `questions_path` the held-out
    records (`eval_questions_path`, else the `eval_fraction` split of the file)."""
    if self.questions_path:
      return self._draw(self._eval_questions, rng, n)
    return self.generate(rng, n)

  @staticmethod
  def _draw(records: Sequence[dict], rng: np.random.Generator, n: int) -> list[dict]:
    out: list[dict] = []
    while len(out) < n:  # a fresh permutation per pass over the file
      out += [dict(records[i]) for i in rng.permutation(len(records))[:n - len(out)]]
    return out

  def verify(self, example: Mapping[str, Any], response: str) -> float:
    """1.0 when `response` is the answer turn `answer(<the chain's end>)`."""
    act = parse_action(response, self.fmt, {"lookup": 1})
    return float(act.kind == ANSWER and act.args[0] == text_field(example, "answer"))

  def demonstration_turns(self, example: Mapping[str, Any],
                          rng: np.random.Generator | None = None) -> list[str]:
    """The actions of a demonstration episode; with `rng` and `demo_early_answer` > 0, those
    of the imperfect demonstrator (class docstring)."""
    w = self._world_of(example)
    chain = w.chain
    answer = w.answer
    h = len(chain)
    if rng is not None and self.demo_early_answer > 0 and h >= 2 and (
        rng.random() < self.demo_early_answer):
      j = int(rng.integers(1, h))
      chain, answer = chain[:j], chain[j - 1][2]
    return [self.fmt.call("lookup", f"{s} {r}") for s, r, _ in chain] + [
        self.fmt.answer(answer)]

  def demonstration(self, example: Mapping[str, Any], rng: np.random.Generator | None = None
                    ) -> str:
    del rng
    return self.fmt.answer(text_field(example, "answer"))

  def make_env(self, example: Mapping[str, Any], limits: Limits | None = None) -> "LookupEnv":
    return LookupEnv(self._world_of(example), task_limits(self, limits), self.fmt)


def question_text(start: str, relations: tuple[str, ...]) -> str:
  """The prompt of the chain from `start` over `relations` (first hop first):
  ("ann", ("boss", "city")) -> "city of boss of ann?"."""
  return "".join(f"{r} of " for r in reversed(relations)) + start + "?"


def follow_chain(facts: Mapping[tuple[str, str], str], start: str, rels
                 ) -> tuple[tuple[str, str, str], ...] | None:
  """The facts (subject, relation, value) met following `rels` from `start` in `facts`, first
  hop first; None when a hop is not a fact or a fact would be used twice."""
  chain, name = [], start
  for r in rels:
    value = facts.get((name, r))
    if value is None:
      return None
    chain.append((name, r, value))
    name = value
  if len({(s, r) for s, r, _ in chain}) != len(chain):
    return None
  return tuple(chain)


def parse_question(prompt: str) -> tuple[str, tuple[str, ...]] | None:
  """(start name, relations first hop first) of "city of boss of ann?"; None if not that form."""
  if not prompt.endswith("?"):
    return None
  words = prompt[:-1].split(" of ")
  if len(words) < 2 or not all(_WORD.fullmatch(w) for w in words):
    return None
  return words[-1], tuple(reversed(words[:-1]))


class LookupEnv(TextEnv):
  """One `lookup` episode. State: the tuple of revealed-flags of the chain's hops."""
  tools = {"lookup": 1}

  def __init__(self, world: World, limits: Limits, fmt: ToolFormat = ToolFormat()):
    super().__init__(limits, fmt)
    self.world = world
    self.prompt = world.question
    self.gold_answer = fmt.answer(world.answer)
    self._hop_of = {(s, r): i for i, (s, r, _) in enumerate(world.chain)}

  def _initial_state(self) -> tuple[bool, ...]:
    return (False,) * len(self.world.chain)

  def _progress(self, state: tuple[bool, ...]) -> float:
    return sum(state) / len(state)

  def _gold_calls(self, state: tuple[bool, ...]) -> tuple[str, ...]:
    for (s, r, _), seen in zip(self.world.chain, state):
      if not seen:
        return (self.fmt.call("lookup", f"{s} {r}"),)
    return (self.fmt.answer(self.world.answer),)

  def _act(self, state: tuple[bool, ...], action: Action) -> tuple[Any, Turn]:
    gold = self._gold_calls(state)
    if action.kind == ANSWER:
      ok = action.args[0] == self.world.answer
      return state, Turn("", correct=ok, outcome=float(ok),
                         info={"gold_calls": gold, "revealed": None, "gold_revealed": ()})
    words = action.args[0].split()
    if len(words) != 2 or not all(_WORD.fullmatch(w) for w in words):
      return state, Turn("error: write lookup(name relation)", correct=False,
                         info={"gold_calls": gold, "revealed": None, "gold_revealed": (),
                               "valid": False})
    s, r = words
    value = self.world.facts.get((s, r))
    if value is None:
      return state, Turn(f"{s} {r}: none", correct=False,
                         info={"gold_calls": gold, "revealed": None, "gold_revealed": ()})
    hop = self._hop_of.get((s, r))
    new = hop is not None and not state[hop]
    if new:
      state = state[:hop] + (True,) + state[hop + 1:]
    return state, Turn(f"{s} {r}: {value}", reward=float(new), correct=new,
                       info={"gold_calls": gold, "revealed": (s, r, value),
                             "gold_revealed": (hop,) if new else ()})
