"""SPD-RAG at inference on `multidoc`: fan-out to every document agent, a token-bounded synthesis.

SPD-RAG (Sub-Agent Per Document Retrieval-Augmented Generation, arXiv 2603.08329) answers a
question over D documents in three layers:

  coordination  the question is split into sub-questions; for a chain question
                "city of boss of ann?" they are its hops, "ann boss" then "<answer> city",
                so they are asked in rounds, one per hop;
  retrieval     each round's sub-question goes to every document's agent at once: the B·D
                calls of a round, across documents and episodes, are ONE batched `reader`
                call (`agent_prompt(doc, question)` -> a name, or "none");
  synthesis     the D partial answers of a round are merged into one by recursive
                map-reduce: ordered by similarity (answers alike side by side), packed into
                merge calls whose prompt holds at most `budget` tokens (map), and the merged
                answers merged again the same way until one is left (reduce).

Baselines on the same documents (the paper's): `full_context_answers` (every document in one
context, cut to `budget` tokens, one call), `agentic_answers` (retrieval turns: `read(d)`
one document per turn, the plain `multidoc` environment). Every system counts the tokens it
sends to and receives from the model per question (`Cost`): the prompt tokens of every call
(a multi-turn agent re-reads its whole context at each turn, as an API bills it) and the
tokens it writes.

Readers (who answers an agent's call): `oracle_reader` reads the document without error (the
architecture's ceiling: what is lost is lost to truncation, budgets and turn limits), and
`PolicyReader` samples the calls from a policy (one `Sampler` call per round). The merge call
is `vote_merge` (the most frequent answer other than "none"), a rule standing in for the
paper's model call; its tokens are counted as a call's.

Deviations: the decomposition into hops is parsed from the question, not written by a model;
the merge is a vote, not a generation; similarity is character-bigram overlap, not an
embedding.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from credit.envs.lookup import parse_question
from credit.envs.subagents import EMPTY, NONE, agent_prompt, oracle_answer
from credit.tasks.char_tokenizer import prompt_ids

_FACT = re.compile(r"([a-z]+ [a-z]+): ([a-z]+)\.")
Reader = Callable[[Sequence[tuple[str, str]]], "list[Reply]"]
Merge = Callable[[str, Sequence[str]], str]


class Reply(NamedTuple):
  """One call's answer and its token counts (prompt tokens read, tokens written)."""
  text: str
  tokens_in: int
  tokens_out: int


@dataclasses.dataclass
class Cost:
  """Tokens of one question: read (prompt tokens of every call), written, and model calls."""
  tokens_in: int = 0
  tokens_out: int = 0
  calls: int = 0

  def add(self, tokens_in: int, tokens_out: int, calls: int = 1) -> None:
    self.tokens_in += int(tokens_in)
    self.tokens_out += int(tokens_out)
    self.calls += int(calls)

  @property
  def tokens(self) -> int:
    return self.tokens_in + self.tokens_out


def count_tokens(tokenizer: Any, text: str) -> int:
  """Tokens of `text` as a prompt row (`char_tokenizer.prompt_ids`: bos + text, or the
  checkpoint's prompt format)."""
  return len(prompt_ids(tokenizer, text))


def oracle_reader(tokenizer: Any) -> Reader:
  """Answers every call from its document exactly (`subagents.oracle_answer`); the tokens are
  the agent prompt's and the answer's + its end token."""
  def read(requests):
    out = []
    for doc, question in requests:
      text = oracle_answer(doc, question)[0]
      out.append(Reply(text, count_tokens(tokenizer, agent_prompt(doc, question)),
                       len(tokenizer.encode(text)) + 1))
    return out
  return read


class PolicyReader:
  """The document agents sampled from a policy: all requests of a call in one batch
  (`credit.envs.subagents.DocAgents`), greedy unless `temperature` > 0."""

  def __init__(self, agents):
    self.agents = agents

  def __call__(self, requests):
    if not requests:
      return []
    out = []
    for text, rec in self.agents._sample(list(requests)):  # pylint: disable=protected-access
      out.append(Reply(text, int(rec["prompt_mask"].sum()), int(rec["response_mask"].sum())))
    return out


def similarity(a: str, b: str) -> float:
  """Overlap (Jaccard) of the character bigrams of two answers; 1 for equal strings."""
  if a == b:
    return 1.0
  ga = {a[i:i + 2] for i in range(len(a) - 1)} or {a}
  gb = {b[i:i + 2] for i in range(len(b) - 1)} or {b}
  return len(ga & gb) / len(ga | gb)


def similarity_order(answers: Sequence[str]) -> list[int]:
  """Indices of `answers` in a greedy nearest-neighbour chain: start at the first, then each
  time the most similar answer not yet placed (ties: the earliest)."""
  left = list(range(len(answers)))
  if not left:
    return []
  order = [left.pop(0)]
  while left:
    cur = answers[order[-1]]
    j = max(left, key=lambda i: (similarity(cur, answers[i]), -i))
    left.remove(j)
    order.append(j)
  return order


def merge_prompt(question: str, answers: Sequence[str]) -> str:
  """The context of one merge call: the sub-question and the partial answers."""
  return f"q: {question}? answers: {', '.join(answers)}"


def vote_merge(question: str, answers: Sequence[str]) -> str:
  """The most frequent answer that is not "none" / "empty" (ties: the first); "none" if all
  are."""
  del question
  real = [a for a in answers if a not in (NONE, EMPTY, "")]
  if not real:
    return NONE
  counts = {a: real.count(a) for a in real}
  return max(real, key=lambda a: (counts[a], -real.index(a)))


class Synthesis(NamedTuple):
  """A synthesis' answer, its merge calls' cost and its depth (reduce levels)."""
  answer: str
  cost: Cost
  depth: int


def synthesize(question: str, answers: Sequence[str], *, budget: int, tokenizer: Any,
               merge: Merge = vote_merge) -> Synthesis:
  """Merges partial answers into one by recursive map-reduce under a token bound.

  Each level orders the answers by `similarity_order`, packs consecutive ones into merge calls
  whose `merge_prompt` holds at most `budget` tokens, merges each call, and recurses on the
  merged answers until one is left. One answer needs no call (depth 0). When not even two
  answers fit one call, they are merged in pairs (over the budget) so that the recursion
  ends.

  Args:
    question: the sub-question the answers answer.
    answers: the partial answers (one per document agent).
    budget: the most prompt tokens of one merge call (>= the prompt of one short answer).
    tokenizer: counts the tokens.
    merge: (question, answers) -> merged answer.

  Returns:
    Synthesis(answer, cost of the merge calls, depth).
  """
  if budget < 1:
    raise ValueError(f"budget must be >= 1 token, got {budget}")
  cost, depth, level = Cost(), 0, list(answers) or [NONE]
  while len(level) > 1:
    depth += 1
    ordered = [level[i] for i in similarity_order(level)]
    calls, cur = [], []
    for a in ordered:
      if cur and count_tokens(tokenizer, merge_prompt(question, cur + [a])) > budget:
        calls.append(cur)
        cur = []
      cur.append(a)
    calls.append(cur)
    if len(calls) == len(level) and len(level) > 1:  # no two answers fit one call: pairs
      calls = [ordered[i:i + 2] for i in range(0, len(ordered), 2)]
    merged = []
    for group in calls:
      out = merge(question, group)
      cost.add(count_tokens(tokenizer, merge_prompt(question, group)),
               len(tokenizer.encode(out)) + 1)
      merged.append(out)
    level = merged
  return Synthesis(level[0], cost, depth)


class Result(NamedTuple):
  """Per question: the system's answer, right or not, and its cost."""
  answers: list[str]
  correct: np.ndarray  # [B] bool
  costs: list[Cost]


def _chain(example: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
  prompt = str(example["prompt"])
  parsed = parse_question(prompt.split(". ", 1)[1] if ". " in prompt else prompt)
  if parsed is None:
    raise ValueError(f"example prompt {prompt!r} is not a chain question")
  return parsed


def spd_rag_answers(task, examples: Sequence[Mapping[str, Any]], reader: Reader, *,
                    tokenizer: Any, synthesis_budget: int = 32,
                    merge: Merge = vote_merge) -> Result:
  """SPD-RAG over `examples` of a `multidoc` task (module docstring): per hop, one batched
  `reader` call for every document of every unfinished episode, then `synthesize` per
  episode. The coordinator's cost is reading the question and writing each sub-question."""
  B = len(examples)
  docs = [task.documents(int(e["world_seed"]))[1] for e in examples]
  docs = [[d[:task.max_observation_chars] for d in ds] for ds in docs]
  chains = [_chain(e) for e in examples]
  costs = [Cost() for _ in range(B)]
  name = [start for start, _ in chains]
  for b, e in enumerate(examples):
    costs[b].add(count_tokens(tokenizer, str(e["prompt"])), 0, 0)
  for hop in range(max(len(rels) for _, rels in chains)):
    live = [b for b in range(B) if hop < len(chains[b][1]) and name[b] != NONE]
    questions = {b: f"{name[b]} {chains[b][1][hop]}" for b in live}
    requests = [(d, questions[b]) for b in live for d in docs[b]]
    replies = reader(requests)
    for j, b in enumerate(live):
      D = len(docs[b])
      part = replies[j * D:(j + 1) * D]
      costs[b].add(0, len(tokenizer.encode(questions[b])) + 1, 0)  # the coordinator writes it
      for r in part:
        costs[b].add(r.tokens_in, r.tokens_out)
      syn = synthesize(questions[b], [r.text for r in part], budget=synthesis_budget,
                       tokenizer=tokenizer, merge=merge)
      costs[b].add(syn.cost.tokens_in, syn.cost.tokens_out, syn.cost.calls)
      name[b] = syn.answer
  correct = np.array([name[b] == str(e["answer"]) for b, e in enumerate(examples)])
  return Result(name, correct, costs)


def full_context_prompt(docs: Sequence[str], question: str, *, budget: int,
                        tokenizer: Any) -> str:
  """Every document in one context, "docs: d1 d2 ... q: <question>", the documents cut
  (from the end) so that the whole prompt holds at most `budget` tokens."""
  tail = f" q: {question}"
  body = "docs: " + " ".join(docs)
  while body and count_tokens(tokenizer, body + tail) > budget:
    body = body[:-1]
  return body + tail


def chain_answer(context: str, start: str, relations: Sequence[str]) -> str:
  """The exact reader of a context: follows the chain through the facts written whole in it;
  "none" where a hop is missing."""
  facts = dict(_FACT.findall(context))  # a fact cut short (no ".") is not read
  name = start
  for r in relations:
    name = facts.get(f"{name} {r}", NONE)
    if name == NONE:
      return NONE
  return name


def full_context_answers(task, examples: Sequence[Mapping[str, Any]], *, tokenizer: Any,
                         budget: int) -> Result:
  """The full-context baseline with the exact reader: one call per question over the
  documents cut to `budget` tokens."""
  answers, costs = [], []
  for e in examples:
    docs = task.documents(int(e["world_seed"]))[1]
    start, rels = _chain(e)
    prompt = full_context_prompt(docs, str(e["prompt"]), budget=budget, tokenizer=tokenizer)
    a = chain_answer(prompt.rsplit(" q: ", 1)[0], start, rels)
    c = Cost()
    c.add(count_tokens(tokenizer, prompt), len(tokenizer.encode(task.fmt.answer(a))) + 1)
    answers.append(a)
    costs.append(c)
  correct = np.array([a == str(e["answer"]) for a, e in zip(answers, examples)])
  return Result(answers, correct, costs)


def episode_cost(tokenizer: Any, prompt: str, actions: Sequence[str],
                 observations: Sequence[str]) -> Cost:
  """A multi-turn episode's cost as an API bills it: each turn's call reads the whole
  context so far (prompt, earlier actions and observations) and writes its action + end
  token."""
  c, context = Cost(), count_tokens(tokenizer, prompt)
  for k, a in enumerate(actions):
    out = len(tokenizer.encode(a)) + 1
    c.add(context, out)
    context += out + (len(tokenizer.encode(observations[k])) if k < len(observations) else 0)
  return c


def agentic_answers(task, examples: Sequence[Mapping[str, Any]], *, tokenizer: Any,
                    rng: np.random.Generator | None = None) -> Result:
  """The agentic-RAG baseline with the searching reader: `task.demonstration_turns` of a
  `multidoc` task with `demonstrator="search"` (retrieval turns over unread documents in a
  random order until the chain is revealed, then the answer), played in its environment,
  cut at the task's `max_turns`."""
  answers, costs, correct = [], [], []
  for e in examples:
    env = task.make_env(e)
    prompt = env.reset()
    actions, observations = [], []
    for a in task.demonstration_turns(e, rng=rng):
      res = env.step(a)
      actions.append(a)
      if res.done:
        break
      observations.append(res.observation)
    answers.append(actions[-1])
    correct.append(env.outcome() >= 1.0)
    costs.append(episode_cost(tokenizer, prompt, actions, observations))
  return Result(answers, np.array(correct), costs)
