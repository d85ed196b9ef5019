"""`multidoc_agents`: SPD-RAG's per-document sub-agents on the `multidoc` task.

SPD-RAG (arXiv 2603.08329, an inference-time architecture) answers a question over many
documents with three kinds of
call of one model: a coordinator that dispatches sub-questions, one agent per document that
answers a sub-question from its document alone, and a token-bounded synthesis that merges the
partial answers. Here all three are the same policy under different contexts:

  coordinator  prompt "4 docs. city of boss of ann?"; each turn `ask(d, name relation)`
               sends a sub-question to the agent of document d (role 0, dispatch);
  doc agent    a fresh context: `agent_prompt(doc_d, question)` =
               "doc: ann boss: bob. kim pet: tod. q: ann boss?", one short turn: the answer
               name, or "none" when the document does not hold it (role 1);
  coordinator  observes exactly the agent's decoded answer ("bob"; "empty" when the agent
               wrote nothing, as a continuing episode needs a context token);
  synthesis    the coordinator's final turn `answer(kim)` (role 2), read after the partial
               answers; its token bound is the estimator's per-call budget (`spd_rag`'s
               `token_budget`) and the action width.

The agents never see the coordinator's history, and the coordinator never sees a document:
only the agents' answers. A demonstration (h + 1 coordinator turns, as multidoc's):
`ask(3, ann boss)` -> "bob", `ask(2, bob city)` -> "kim", `answer(kim)`.

Who answers an `ask`: the environment's `agent(doc, question) -> (text, record)`. A freshly
made environment has the oracle (`oracle_answer`: the document's fact, else "none"), which
the demonstrations and the agents' warm-up targets use; `AgentsMultiTurnSampler` binds the
policy's agents (`DocAgents`: the `ask` calls of a turn sampled as one batch across the
episodes, the sampler's log-probs recorded) to every environment it plays, for training
rollouts and evaluation alike. The `record` of a
call (its prompt, tokens, masks and sampler log-probs, in the single-turn sampler's layout)
is the step's `info["agent_call"]`, from which the runner (experiments/extensions/subagents.py) builds
the agents' training rows. An `ask` on the episode's last turn (its answer would never be
read) calls no agent.

Fan-out (`fanout=True`, SPD-RAG's exhaustive dispatch): the coordinator also has
`askall(name relation)`, which puts the sub-question to every document's agent at once; the
multi-turn engine samples the D calls of every episode's `askall` of a turn as one batch
(D·B rows in one sampler call). The coordinator observes the merged partial answers
(`merge_answers`: the distinct answers other than "none", in document order, "bob, kim";
"none" when every agent said so), so its next turn does the synthesis of the round. The
demonstrations ask every hop with `askall`: `askall(ann boss)` -> "bob",
`askall(bob city)` -> "kim", `answer(kim)`, and the agents' warm-up covers every document
of every hop (the gold answer from the gold document, "none" from the others). The step's
`agent_call`, `agent_answer` and `agent_correct` are then lists, one entry per document.

Per turn:
  reward    1 when the turn's agent revealed a gold hop not revealed before: the gold
            document of hop i was asked hop i's question ("bob city") and answered its
            object exactly (with `askall`: the gold document's agent among the D); else 0;
  progress  (gold hops revealed so far) / h;
  info      `doc`, `question`, `agent_answer`, `agent_correct` (equal to the oracle's),
            `agent_holds` (the document holds the asked fact: the oracle's answer is not
            "none"; with `askall`, like `agent_correct`, a list), `agent_call`,
            `gold_revealed`, `gold_calls` (the ask of the first unrevealed hop, the answer
            once all are revealed), `correct`.
The document agents' own rewards (the runner's `subagents.reward`) come from these:
`document` is `agent_correct` as 0/1; `document_balanced` (`balanced_document_reward`)
weighs the calls of one turn so that the documents holding the asked fact and those without
it carry equal total reward.
Outcome: exact match of the answered name, as in `multidoc`.

Confidence: inferred. The abstract fixes the roles (coordinator, per-document agents,
synthesis under a token budget); the tool syntax, the "none" answer, the prompts and the
oracle-taught warm-up are ours.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
from flax import nnx

from credit import parallel
from credit.envs.base import Limits, Turn, task_limits
from credit.envs.lookup import RELATIONS
from credit.envs.multidoc import MultiDoc, MultiDocEnv
from credit.envs.rollout import MultiTurnSampler, demonstration_episode
from credit.envs.tools import ANSWER, MALFORMED, Action, parse_action
from credit.tasks.base import register_task, text_field
from credit.tasks.char_tokenizer import decode_responses, encode_prompts

COORDINATOR, DOC_AGENT, SYNTHESIS = 0, 1, 2
ASK_ALL = "askall"  # the fan-out tool: one sub-question to every document's agent
NONE = "none"      # a document agent's answer when its document lacks the fact
EMPTY = "empty"    # the coordinator's observation of an agent that wrote nothing
QUESTION_CHARS = 12  # a sub-question "name relation" longer than this is an error
_AGENT_FOLD = 0x5D0C  # folded into the rollout key for the agents' sampling keys

Agent = Callable[[str, str], tuple[str, Any]]


def agent_prompt(doc: str, question: str) -> str:
  """A document agent's whole context: its document and the sub-question, nothing else."""
  return f"doc: {doc} q: {question}?"


def doc_facts(doc: str) -> dict[str, str]:
  """{"ann boss": "bob"} of a document text "ann boss: bob. kim pet: tod."."""
  out = {}
  for part in doc.split("."):
    if ":" in part:
      k, v = part.split(":", 1)
      out[k.strip()] = v.strip()
  return out


def oracle_answer(doc: str, question: str) -> tuple[str, None]:
  """The agent that answers from its document without error (no record)."""
  return doc_facts(doc).get(question.strip(), NONE), None


def merge_answers(answers: Sequence[str]) -> str:
  """What the coordinator observes after `askall`: the distinct answers that are not
  "none" (nor empty), in document order, joined by ", "; "none" when there is none.

  >>> merge_answers(["none", "bob", "", "bob", "kim"])
  'bob, kim'
  """
  real = [a for a in answers if a and a not in (NONE, EMPTY)]
  return ", ".join(dict.fromkeys(real)) or NONE


@register_task("multidoc_agents")
@dataclasses.dataclass(frozen=True)
class MultiDocAgents(MultiDoc):
  """`multidoc` with per-document sub-agents (module docstring). MultiDoc's attributes, and

  Attributes:
    agent_max_tokens: a document agent's answer budget in tokens (eos included).
    fanout: the coordinator also has `askall(name relation)` (every document's agent at
      once) and the demonstrations use it (module docstring).
  """
  agent_max_tokens: int = 6
  fanout: bool = False
  name = "multidoc_agents"
  subagents = True

  def __post_init__(self):
    super().__post_init__()
    if self.agent_max_tokens < 2:
      raise ValueError(f"agent_max_tokens must be >= 2, got {self.agent_max_tokens}")
    if self.demonstrator != "gold":
      raise ValueError(f"multidoc_agents has only the gold demonstrator, got "
                       f"demonstrator={self.demonstrator!r}; leave it unset")

  @property
  def max_agent_prompt_chars(self) -> int:
    return len(agent_prompt("x" * self.max_observation_chars, "x" * QUESTION_CHARS))

  @property
  def max_prompt_chars(self) -> int:
    """Covers the agents' prompts too, so that one prompt width lays out every role."""
    return max(super().max_prompt_chars, self.max_agent_prompt_chars)

  @property
  def agent_calls_per_turn(self) -> int:
    """The most agent calls one coordinator turn makes: D with `fanout`, else 1."""
    return self.num_docs if self.fanout else 1

  @property
  def max_action_chars(self) -> int:
    rel = max(len(r) for r in RELATIONS[:self.num_relations])
    question = "xxx " + "x" * rel
    return max(len(self.fmt.call("ask", "9", question)), len(self.fmt.call(ASK_ALL, question)),
               len(self.fmt.answer("xxx")))

  @property
  def max_response_chars(self) -> int:
    return self.max_action_chars

  def demonstration_turns(self, example: Mapping[str, Any],
                          rng: np.random.Generator | None = None) -> list[str]:
    del rng
    world, _, where = self._docs_of(example)
    if self.fanout:
      asks = [self.fmt.call(ASK_ALL, f"{s} {r}") for s, r, _ in world.chain]
    else:
      asks = [self.fmt.call("ask", str(where[i] + 1), f"{s} {r}")
              for i, (s, r, _) in enumerate(world.chain)]
    return asks + [self.fmt.answer(world.answer)]

  def agent_demonstrations(self, example: Mapping[str, Any],
                           rng: np.random.Generator | None = None) -> list[tuple[str, str]]:
    """(agent prompt, oracle answer) pairs of the example: each gold hop asked of its gold
    document, and (with `rng`) one hop asked of a random other document ("none" unless that
    document holds the same fact); with `fanout`, each gold hop asked of every document (the
    calls its `askall` makes)."""
    world, texts, where = self._docs_of(example)
    docs = [texts[j][:self.max_observation_chars] for j in range(len(texts))]
    if self.fanout:
      return [(agent_prompt(doc, f"{s} {r}"), oracle_answer(doc, f"{s} {r}")[0])
              for s, r, _ in world.chain for doc in docs]
    out = []
    for i, (s, r, _) in enumerate(world.chain):
      q = f"{s} {r}"
      out.append((agent_prompt(docs[where[i]], q), oracle_answer(docs[where[i]], q)[0]))
    if rng is not None:
      i = int(rng.integers(len(world.chain)))
      others = [j for j in range(len(docs)) if j != where[i]]
      j = others[int(rng.integers(len(others)))]
      q = " ".join(world.chain[i][:2])
      out.append((agent_prompt(docs[j], q), oracle_answer(docs[j], q)[0]))
    return out

  def demonstration_episodes(self, example: Mapping[str, Any], limits: Limits | None = None,
                             rng: np.random.Generator | None = None
                             ) -> list[tuple[str, list[str], list[str]]]:
    """Warm-up episodes (prompt, actions, observations) of every role: the coordinator's
    demonstration (with the oracle agents) as often as there are agent demonstrations, so
    half the rows are coordinator episodes, and the agents' one-turn episodes."""
    coord = demonstration_episode(self, example, limits, rng)
    agents = [(p, [a], []) for p, a in self.agent_demonstrations(example, rng)]
    return [coord] * len(agents) + agents

  def make_env(self, example: Mapping[str, Any], limits: Limits | None = None,
               agent: Agent | None = None) -> "MultiDocAgentsEnv":
    world, texts, where = self._docs_of(example)
    env = MultiDocAgentsEnv(text_field(example, "prompt"), world, texts, where,
                            task_limits(self, limits), self.fmt,
                            doc_chars=self.max_observation_chars, grounded=self.grounded,
                            fanout=self.fanout)
    if agent is not None:
      env.bind_agent(agent)
    return env


class MultiDocAgentsEnv(MultiDocEnv):
  """One `multidoc_agents` episode: the coordinator's view; documents are read by agents."""
  tools = {"ask": 2}
  # Its `ask` calls sample from the policy with keys drawn in call order: stepped one after
  # another, in row order, by the multi-turn engine.
  parallel_steps = False

  def __init__(self, prompt, world, docs, where, limits: Limits, fmt, *, doc_chars: int,
               grounded: bool = False, fanout: bool = False):
    super().__init__(prompt, world, docs, where, limits, fmt, grounded=grounded)
    self.doc_chars, self.fanout = doc_chars, fanout
    if fanout:
      self.tools = {"ask": 2, ASK_ALL: 1}
    self.agent: Agent = oracle_answer

  def bind_agent(self, agent: Agent) -> None:
    """Who answers the `ask` calls from now on (`DocAgents`, or `oracle_answer`)."""
    self.agent = agent

  def _role(self, action: Action) -> int:
    return SYNTHESIS if action.kind == ANSWER else COORDINATOR

  def _asked_doc(self, action: Action) -> int | None:
    """The document index of a well-formed `ask` (d in 1..n, a question of 1 to
    QUESTION_CHARS characters), else None."""
    arg, question = action.args
    n = len(self.docs)
    ok = arg in [str(i) for i in range(1, n + 1)] and 0 < len(question) <= QUESTION_CHARS
    return int(arg) - 1 if ok else None

  def _asked_all(self, action: Action) -> bool:
    """A well-formed `askall` (a question of 1 to QUESTION_CHARS characters)."""
    return action.name == ASK_ALL and 0 < len(action.args[0]) <= QUESTION_CHARS

  def agent_request(self, action: str) -> list[tuple[str, str]]:
    """The (document text, question) pairs that `step(action)` would put to agents now, in
    the order it asks them (one for `ask`, D for `askall`, none otherwise); changes nothing
    (the multi-turn engine batches a turn's calls with it)."""
    ep = self._ep
    if not ep.started or ep.done or self.num_turns + 1 >= self.limits.max_turns:
      return []
    parsed = parse_action(action, self.fmt, self.tools)
    if parsed.kind in (MALFORMED, ANSWER):
      return []
    if parsed.name == ASK_ALL:
      q = parsed.args[0]
      return [(doc[:self.doc_chars], q) for doc in self.docs] if self._asked_all(parsed) else []
    if self._asked_doc(parsed) is None:
      return []
    return [(self.docs[self._asked_doc(parsed)][:self.doc_chars], parsed.args[1])]

  def _gold_calls(self, state: tuple[bool, ...]) -> tuple[str, ...]:
    for i, seen in enumerate(state):
      if not seen:
        s, r, _ = self.world.chain[i]
        if self.fanout:
          return (self.fmt.call(ASK_ALL, f"{s} {r}"),)
        return (self.fmt.call("ask", str(self.where[i] + 1), f"{s} {r}"),)
    return (self.fmt.answer(self.world.answer),)

  def _ask_all(self, state: tuple[bool, ...], action: Action, gold) -> tuple[Any, Turn]:
    """`askall(question)`: every document's agent, in document order; the observation is
    `merge_answers` of their answers."""
    question = action.args[0]
    if not self._asked_all(action):
      return state, Turn(f"error: write {ASK_ALL}(name relation)", correct=False,
                         info={"gold_calls": gold, "doc": None, "gold_revealed": (),
                               "agent_call": None, "valid": False})
    if self.num_turns + 1 >= self.limits.max_turns:  # nobody would read the answers
      return state, Turn("", correct=False,
                         info={"gold_calls": gold, "doc": None, "question": question,
                               "gold_revealed": (), "agent_call": None})
    docs = [doc[:self.doc_chars] for doc in self.docs]
    texts, records = zip(*(self.agent(doc, question) for doc in docs))
    hops = tuple(i for i, (s, r, o) in enumerate(self.world.chain)
                 if not state[i] and question == f"{s} {r}" and texts[self.where[i]] == o)
    state = tuple(s or i in hops for i, s in enumerate(state))
    calls = None if all(r is None for r in records) else list(records)
    return state, Turn(merge_answers(texts), reward=float(bool(hops)), correct=bool(hops),
                       info={"gold_calls": gold, "doc": None, "question": question,
                             "agent_answer": list(texts),
                             "agent_correct": [t == oracle_answer(doc, question)[0]
                                               for t, doc in zip(texts, docs)],
                             "agent_holds": [oracle_answer(doc, question)[0] != NONE
                                             for doc in docs],
                             "agent_call": calls, "gold_revealed": hops})

  def _act(self, state: tuple[bool, ...], action: Action) -> tuple[Any, Turn]:
    gold = self._gold_calls(state)
    if action.kind == ANSWER:
      return state, self._answer_turn(state, action, {"gold_calls": gold, "doc": None,
                                                      "gold_revealed": (), "agent_call": None})
    if action.name == ASK_ALL:
      return self._ask_all(state, action, gold)
    arg, question = action.args
    n = len(self.docs)
    if self._asked_doc(action) is None:
      return state, Turn(f"error: write ask(d, name relation), d in 1..{n}", correct=False,
                         info={"gold_calls": gold, "doc": None, "gold_revealed": (),
                               "agent_call": None, "valid": False})
    d = int(arg) - 1
    doc = self.docs[d][:self.doc_chars]
    if self.num_turns + 1 >= self.limits.max_turns:  # nobody would read the answer
      return state, Turn("", correct=False,
                         info={"gold_calls": gold, "doc": d + 1, "question": question,
                               "gold_revealed": (), "agent_call": None})
    text, record = self.agent(doc, question)
    expected = oracle_answer(doc, question)[0]
    hops = tuple(i for i, (s, r, o) in enumerate(self.world.chain)
                 if self.where[i] == d and not state[i] and question == f"{s} {r}"
                 and text == o)
    state = tuple(s or i in hops for i, s in enumerate(state))
    return state, Turn(text or EMPTY, reward=float(bool(hops)), correct=bool(hops),
                       info={"gold_calls": gold, "doc": d + 1, "question": question,
                             "agent_answer": text, "agent_correct": text == expected,
                             "agent_holds": expected != NONE,
                             "agent_call": record, "gold_revealed": hops})


def balanced_document_reward(*, correct: Sequence[bool],
                              holds: Sequence[bool]) -> np.ndarray:
  """The document agents' class-balanced reward over the calls of one turn (one `askall`,
  or the single call of an `ask`).

  With k of the turn's n calls put to documents that hold the asked fact, a right answer
  scores 1/k on such a document and 1/(n − k) on one without it (where "none" is right), a
  wrong answer 0:

      r_i = correct_i · (holds_i / k + (1 − holds_i) / (n − k)),

  so each class carries a total of 1 when every answer is right. Under the plain document
  reward (r_i = correct_i) an `askall` over D documents, one of which holds the fact, pays
  D − 1 for answering "none" everywhere against D for answering everything right, so the
  agents drift to "none"; here "none" everywhere earns 1 of 2. A single `ask` (n = 1) scores
  as the plain document reward. Ours: SPD-RAG (arXiv 2603.08329) trains nothing.

  Args:
    correct: per call, the answer equals the oracle's (the step's `agent_correct`).
    holds: per call, the document holds the asked fact (the step's `agent_holds`).

  Returns:
    float32 [n] rewards.

  >>> balanced_document_reward(correct=[True, True, False],
  ...                          holds=[True, False, False]).tolist()
  [1.0, 0.5, 0.0]
  """
  correct, holds = np.asarray(correct, bool), np.asarray(holds, bool)
  if correct.shape != holds.shape or correct.ndim != 1:
    raise ValueError(f"correct {correct.shape} and holds {holds.shape} must be one list "
                     "each of equal length; pass one entry per agent call of the turn")
  k = int(holds.sum())
  weight = np.where(holds, 1.0 / max(k, 1), 1.0 / max(holds.size - k, 1))
  return np.where(correct, weight, 0.0).astype(np.float32)


class DocAgents:
  """The policy as per-document agents for one rollout: each call samples one short turn
  after `agent_prompt(doc, question)` and returns (decoded answer, record). The record holds
  the row in the single-turn sampler's layout ([P + W] prompt then response, right-padded):
  `prompt`, `tokens`, `prompt_mask`, `response_mask`, `logprob_sampler`, `logprob_raw` (numpy).

  The calls of one turn across all episodes are sampled as one batch (`prefetch`, which
  `AgentsMultiTurnSampler` runs before stepping the environments); they are then answered in
  order. Calls are numbered in the order they are asked; a batch starting at call c draws its
  i-th row with fold_in(fold_in(key, c), i) (a call not prefetched: a batch of one)."""

  def __init__(self, sampler, tokenizer, model_state, key, *, prompt_width: int,
               max_tokens: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
               min_p: float = 0.0):
    self.sampler, self.tokenizer, self.model_state, self.key = (sampler, tokenizer, model_state,
                                                                key)
    self.prompt_width, self.max_tokens = prompt_width, max_tokens
    self.kw = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    self.calls = 0
    self.ready: list[tuple[tuple[str, str], tuple[str, dict]]] = []  # prefetched, in order

  def _sample(self, requests: Sequence[tuple[str, str]]) -> list[tuple[str, dict]]:
    prompts = [agent_prompt(doc, question) for doc, question in requests]
    toks, mask = encode_prompts(self.tokenizer, prompts, self.prompt_width)
    out = self.sampler(self.model_state, prompt_tokens=toks, prompt_mask=mask,
                       key=jax.random.fold_in(self.key, self.calls),
                       max_new_tokens=self.max_tokens, **self.kw)
    self.calls += len(requests)
    host = parallel.to_host({k: getattr(out, k) for k in (
        "tokens", "prompt_mask", "response_mask", "logprob_sampler", "logprob_raw")})
    texts = decode_responses(self.tokenizer, host["tokens"], host["response_mask"])
    return [(t.strip(), dict({k: v[i] for k, v in host.items()}, prompt=p, answer=t.strip()))
            for i, (t, p) in enumerate(zip(texts, prompts))]

  def prefetch(self, requests: Sequence[tuple[str, str]]) -> None:
    """Samples the answers to `requests` ((doc, question) pairs, in the order they will be
    asked) as one batch; the next calls are answered from them."""
    if requests:
      self.ready = list(zip(requests, self._sample(requests)))

  def __call__(self, doc: str, question: str) -> tuple[str, dict]:
    if self.ready:
      (asked, answer), self.ready = self.ready[0], self.ready[1:]
      if asked == (doc, question):
        return answer
      self.ready = []  # asked otherwise than foreseen: sample this call on its own
    return self._sample([(doc, question)])[0]


class AgentsMultiTurnSampler(MultiTurnSampler):
  """A `MultiTurnSampler` whose environments' `ask` calls are answered by the policy itself:
  before each rollout it binds one `DocAgents` (the same parameters, sampling settings and a
  key folded from the rollout's) to every environment that has `bind_agent`. The agents use
  the parameters the rollout starts with (an asynchronous `refresh` between turns reaches
  only the coordinator)."""

  def __init__(self, model: nnx.Module, *, tokenizer, layout, agent_max_tokens: int,
               stop_tokens: Sequence[int] | None = None, **kw):
    super().__init__(model, tokenizer=tokenizer, layout=layout, stop_tokens=stop_tokens, **kw)
    from credit.sampling import Sampler  # pylint: disable=g-import-not-at-top
    self.agent_sampler = Sampler(model, pad_id=self.pad_id, stop_tokens=self.stop_tokens)
    self.agent_max_tokens = agent_max_tokens

  def agents(self, model_state, key, **sampling_kw) -> DocAgents:
    return DocAgents(self.agent_sampler, self.tokenizer, model_state,
                     jax.random.fold_in(key, _AGENT_FOLD), prompt_width=self.layout.prompt_width,
                     max_tokens=self.agent_max_tokens, **sampling_kw)

  def _step_envs(self, envs, texts):
    """Batches the turn's agent calls across the episodes: the calls the environments'
    steps will make (`agent_request`) are sampled as one batch (`DocAgents.prefetch`), then
    the environments are stepped, in row order, and answered from it."""
    agents = getattr(self, "_agents", None)
    if agents is not None:
      asked = [env.agent_request(text) for env, text in zip(envs, texts)
               if getattr(env, "agent", None) is agents and hasattr(env, "agent_request")]
      agents.prefetch([a for calls in asked for a in calls])
    return super()._step_envs(envs, texts)

  def __call__(self, model_state, envs, *, key, **kw):
    if isinstance(model_state, nnx.Module):
      model_state = nnx.state(model_state)
    agents = self.agents(model_state, key, **{k: kw[k] for k in
                                              ("temperature", "top_k", "top_p", "min_p")
                                              if k in kw})
    for env in envs:
      if hasattr(env, "bind_agent"):
        env.bind_agent(agents)
    self._agents = agents
    try:
      return super().__call__(model_state, envs, key=key, **kw)
    finally:
      self._agents = None
