"""`search_qa`: a search agent over a local corpus, with BM25 retrieval and multi-hop questions.

Tools (one per turn, `credit.envs.tools` format):

  search(query)    the top `top_k` documents by BM25 score, one line each:
                   "<id>: <snippet>" ("<id> (<title>): <snippet>" when the title differs),
                   the snippet being the document's sentence that best matches the query (the
                   largest IDF sum of the query words it holds), cut to `snippet_chars`;
                   "no results" when no word matches
  open(doc, page)  page `page` (from 1) of document `doc` (its id): "<id> page 2 of 3: <text>";
                   pages hold whole sentences up to `page_chars` characters
  answer(text)     the final answer; the episode ends

Observations are cut to `max_observation_chars` (`credit.envs.base.Limits`).

Retrieval is `bm25s` (BM25 on sparse matrices, Lucene's variant by default, k1 = 1.5,
b = 0.75): maintained, pure Python on numpy (no compiled extension, no Java, no server), fast
(the document-term scores are precomputed once into a sparse matrix, so a query is a sum of a
few of its columns) and offline: nothing is downloaded. Words are lowercase runs of letters
and digits, English stopwords removed (bm25s's list); ties rank by document order, so results
are deterministic.

Corpus: the built-in one (`credit.envs.corpus`, people and their facts spread over one
document each) by default, or a JSON-lines file (`corpus_path`), one document per line:

  {"id": "doc17", "title": "Ada Lovelace", "text": "Augusta Ada King, Countess of ..."}

(`id` unique strings, `title` and `text` strings; ids must not contain ',' or ')'). Questions:
generated from the built-in corpus (1 to `max_hops` hops, module `corpus`), or a JSON-lines
file (`questions_path`), one per line, {"question": ..., "answer": ...} or
{"question": ..., "answers": [...]} (any alias counts); a share (`eval_fraction`) is held out
for the eval split.

Rewards. The answer is scored against the gold answer(s) with SQuAD's normalisation
(lowercase, punctuation and the articles a / an / the removed, whitespace collapsed):
`answer_f1` (token F1, the best over aliases) is the outcome by default (`reward="f1"`),
`answer_em` (exact match) with `reward="em"`; the answer turn's info holds both (`f1`, `em`),
and the runner's `eval_accuracy` (reward >= 1) is the exact match up to word order.
Per turn (built-in questions): reward 1 when the turn's observation first shows a sentence of
the question's chain, progress = chain sentences shown so far / hops (questions from a file:
progress 1 once an observation contains the normalised answer). info: `revealed` (the chain
hops first shown), `doc` (the document opened), `results` (the ids a search returned).

Built-in questions are kept only when the task's demonstrator solves them within the episode
(`demonstration_turns`): per hop it searches "<relation> of <name>"; when the fact's sentence
is not in the results' snippets but its document is among them, it opens the page that holds
it; a question whose fact is not found is drawn again. Held-out questions start from people
that no training question starts from (`eval_fraction` of the people, a fixed rule).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import re
import string
import zlib
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from credit.envs import corpus as corpus_lib
from credit.envs.base import Limits, TextEnv, Turn, task_limits
from credit.envs.corpus import Document
from credit.envs.lookup import SEED_HIGH
from credit.envs.tools import ANSWER, Action, ToolFormat, parse_action
from credit.tasks.base import register_task, text_field

__all__ = ["Hit", "SearchEnv", "SearchIndex", "SearchQA", "answer_em", "answer_f1",
           "load_corpus", "load_qa", "normalize_answer"]

REWARDS = ("f1", "em")
_WORD = re.compile(r"[a-z0-9]+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


# --- answers ---------------------------------------------------------------------------
def normalize_answer(text: str) -> str:
  """SQuAD's normalisation: lowercase, no punctuation, no articles, single spaces.

  >>> normalize_answer("The  North Bay!")
  'north bay'
  """
  text = _ARTICLES.sub(" ", str(text).lower().translate(_PUNCT))
  return " ".join(text.split())


def _f1(pred: str, gold: str) -> float:
  p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
  if not p or not g:
    return float(p == g)
  common = sum((collections.Counter(p) & collections.Counter(g)).values())
  if common == 0:
    return 0.0
  precision, recall = common / len(p), common / len(g)
  return 2 * precision * recall / (precision + recall)


def answer_f1(prediction: str, golds: Sequence[str] | str) -> float:
  """Token F1 of `prediction` against the best of `golds` (SQuAD's, after normalisation).

  >>> answer_f1("north hill", "north bay")
  0.5
  """
  golds = [golds] if isinstance(golds, str) else list(golds)
  return max((_f1(prediction, g) for g in golds), default=0.0)


def answer_em(prediction: str, golds: Sequence[str] | str) -> float:
  """1.0 when `prediction` equals one of `golds` after normalisation.

  >>> answer_em("The north bay.", ["north bay"])
  1.0
  """
  golds = [golds] if isinstance(golds, str) else list(golds)
  return float(any(normalize_answer(prediction) == normalize_answer(g) for g in golds))


# --- corpus files ------------------------------------------------------------------------
def _jsonl(path: str, what: str):
  if not os.path.exists(path):
    raise ValueError(f"{what} {path!r} does not exist; give a JSON-lines file")
  with open(path, encoding="utf-8") as f:
    for i, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        rec = json.loads(line)
      except ValueError as e:
        raise ValueError(f"{path}:{i}: not JSON ({e})") from None
      if not isinstance(rec, dict):
        raise ValueError(f"{path}:{i}: not a JSON object")
      yield i, rec


def load_corpus(path: str | os.PathLike) -> tuple[Document, ...]:
  """The documents of a JSON-lines corpus (module docstring); raises ValueError naming the
  file and line of the first bad record (a missing or non-string field, a repeated id, an
  id with ',' or ')')."""
  path = os.fspath(path)
  docs, seen = [], set()
  for i, rec in _jsonl(path, "corpus_path"):
    for key in ("id", "title", "text"):
      if not isinstance(rec.get(key), str):
        raise ValueError(f"{path}:{i}: field {key!r} must be a string (fields: {sorted(rec)})")
    doc_id = rec["id"].strip()
    if not doc_id or "," in doc_id or ")" in doc_id or "\n" in doc_id:
      raise ValueError(f"{path}:{i}: id {rec['id']!r} must be non-empty without ',' ')' or a "
                       "newline (open(doc, page) names it)")
    if doc_id in seen:
      raise ValueError(f"{path}:{i}: id {doc_id!r} repeats an earlier document's")
    seen.add(doc_id)
    docs.append(Document(doc_id, rec["title"], rec["text"]))
  if not docs:
    raise ValueError(f"corpus_path {path!r} holds no documents")
  return tuple(docs)


def load_qa(path: str | os.PathLike) -> list[dict]:
  """Question records of a JSON-lines file: {"question", "answer"} or {"question",
  "answers": [...]}; as examples {"prompt", "answer" (the first), "aliases" (JSON list)}."""
  path = os.fspath(path)
  out = []
  for i, rec in _jsonl(path, "questions_path"):
    q = rec.get("question")
    answers = rec.get("answers", [rec["answer"]] if "answer" in rec else None)
    if isinstance(answers, str):
      answers = [answers]
    if not isinstance(q, str) or not q.strip():
      raise ValueError(f"{path}:{i}: 'question' must be a non-empty string")
    if (not isinstance(answers, list) or not answers
        or not all(isinstance(a, str) and normalize_answer(a) for a in answers)):
      raise ValueError(f"{path}:{i}: needs 'answer' (a string) or 'answers' (a list of "
                       "strings), each non-empty after normalisation")
    out.append({"prompt": q.strip(), "answer": answers[0], "aliases": json.dumps(answers),
                "hops": int(rec.get("hops", 0))})
  if not out:
    raise ValueError(f"questions_path {path!r} holds no questions")
  return out


# --- the index -------------------------------------------------------------------------
def _words(text: str, stop: frozenset) -> list[str]:
  return [w for w in _WORD.findall(text.lower()) if w not in stop]


class Hit(NamedTuple):
  """One search result: the document's index in the corpus and its BM25 score."""
  doc: int
  score: float


class SearchIndex:
  """BM25 over documents (`bm25s`), with snippets and pages (module docstring).

  Args:
    documents: the corpus.
    k1, b: BM25's term-frequency saturation and length normalisation.
    page_chars: the longest page `page` returns (whole sentences; a longer sentence is cut).
  """

  def __init__(self, documents: Sequence[Document], *, k1: float = 1.5, b: float = 0.75,
               page_chars: int = 400):
    import bm25s  # pylint: disable=g-import-not-at-top  # only where search is used
    from bm25s.stopwords import STOPWORDS_EN  # pylint: disable=g-import-not-at-top
    if not documents:
      raise ValueError("documents is empty; give at least one document")
    if page_chars < 16:
      raise ValueError(f"page_chars must be >= 16, got {page_chars}")
    self.documents = tuple(documents)
    self.by_id = {d.id: i for i, d in enumerate(self.documents)}
    self.page_chars = page_chars
    self._stop = frozenset(STOPWORDS_EN)
    tokens = [_words(f"{d.title} {d.text}", self._stop) or [""] for d in self.documents]
    df = collections.Counter(w for t in tokens for w in set(t))
    n = len(tokens)
    self._idf = {w: float(np.log(1.0 + (n - c + 0.5) / (c + 0.5))) for w, c in df.items()}
    self._bm25 = bm25s.BM25(k1=k1, b=b)
    self._bm25.index(tokens, show_progress=False)
    self._sentences = [tuple(s for s in _SENTENCE_END.split(d.text.strip()) if s)
                       for d in self.documents]
    self._pages = [self._paginate(s) for s in self._sentences]

  def _paginate(self, sentences: Sequence[str]) -> tuple[str, ...]:
    pages, cur = [], ""
    for s in sentences:
      s = s[:self.page_chars]
      if cur and len(cur) + 1 + len(s) > self.page_chars:
        pages.append(cur)
        cur = s
      else:
        cur = f"{cur} {s}" if cur else s
    return tuple(pages + [cur]) if cur or not pages else tuple(pages)

  def scores(self, query: str) -> np.ndarray:
    """`[D] float32` BM25 score of every document for `query` (0 without a known word)."""
    words = [w for w in _words(query, self._stop) if w in self._bm25.vocab_dict]
    if not words:
      return np.zeros(len(self.documents), np.float32)
    return np.asarray(self._bm25.get_scores(words), np.float32)

  def search(self, query: str, k: int) -> list[Hit]:
    """The top `k` documents with a positive score, best first (ties: corpus order)."""
    s = self.scores(query)
    order = np.argsort(-s, kind="stable")[:k]
    return [Hit(int(i), float(s[i])) for i in order if s[i] > 0]

  def snippet(self, doc: int, query: str, chars: int) -> str:
    """The sentence of document `doc` that best matches `query`: the largest sum of the IDF of
    the query words it holds (BM25's IDF; the first such), cut to `chars` characters ending in
    "..." when longer."""
    want = set(_words(query, self._stop))
    sents = self._sentences[doc] or ("",)

    def match(j):
      return sum(self._idf.get(w, 0.0) for w in want & set(_words(sents[j], self._stop)))

    best = max(range(len(sents)), key=lambda j: (match(j), -j))
    text = sents[best]
    return text if len(text) <= chars else text[:max(chars - 3, 0)] + "..."

  def pages(self, doc: int) -> tuple[str, ...]:
    """The pages of document `doc`."""
    return self._pages[doc]


@functools.lru_cache(maxsize=8)
def _index(source: tuple, page_chars: int) -> tuple[SearchIndex, Any]:
  """The index of a corpus source, built once per process: ("builtin", seed, people) or
  ("file", path, mtime, size). Returns (index, the built-in corpus or None)."""
  if source[0] == "builtin":
    corpus = corpus_lib.make_corpus(source[1], num_people=source[2])
    return SearchIndex(corpus.documents, page_chars=page_chars), corpus
  return SearchIndex(load_corpus(source[1]), page_chars=page_chars), None


# --- the task --------------------------------------------------------------------------
@register_task("search_qa")
@dataclasses.dataclass(frozen=True)
class SearchQA:
  """Multi-hop question answering with `search` and `open` tools over a corpus (module
  docstring).

  Attributes:
    corpus_path: a JSON-lines corpus; "" = the built-in corpus.
    questions_path: JSON-lines questions over the corpus (the built-in one or yours); "" =
      questions generated from the built-in corpus.
    eval_fraction: the held-out share: of the questions file, or of the built-in corpus's
      people (questions starting from them go to the eval split).
    corpus_seed, num_people: the built-in corpus.
    min_hops, max_hops: the built-in questions' hops (1..3).
    top_k: results per search.
    snippet_chars: the longest snippet.
    page_chars: the longest page `open` returns.
    max_observation_chars: observations are cut to this many characters.
    extra_turns: turns beyond the demonstration's worst case (a search and an open per hop,
      `distractors` searches per hop, then the answer); a fuzzed question (its start named by
      a description, `credit.envs.synthesis.fuzz_question`) needs 2 more (a search and an
      open to find who that is).
    distractors: the demonstrator's detours: before each hop's search it searches another
      fact of the hop's person 0..`distractors` times (drawn per question, seeded by its
      text), so demonstrated episode lengths are uneven.
    context_keep_last: >= 1 plays episodes past the token budget with context management
      (`credit.envs.context.ContextSampler`, this many newest observations always kept; the
      runner's `context` extension); 0 = episodes end at the budget.
    context_compact_to: a compaction leaves the context at most this share of the budget.
    reward: "f1" (the default outcome) or "em".
    call_open, call_close: tool-call markers (`ToolFormat`).
  """
  corpus_path: str = ""
  questions_path: str = ""
  eval_fraction: float = 0.2
  corpus_seed: int = 0
  num_people: int = 40
  min_hops: int = 1
  max_hops: int = 3
  top_k: int = 3
  snippet_chars: int = 80
  page_chars: int = 160
  max_observation_chars: int = 320
  extra_turns: int = 1
  distractors: int = 0
  context_keep_last: int = 0
  context_compact_to: float = 0.5
  reward: str = "f1"
  call_open: str = ""
  call_close: str = ""
  name = "search_qa"
  multi_turn = True
  tool_actions = True  # turns are tool calls (each step's info holds the parsed `action`)

  def __post_init__(self):
    if self.reward not in REWARDS:
      raise ValueError(f"reward must be one of {REWARDS}, got {self.reward!r}")
    if not 1 <= self.min_hops <= self.max_hops <= 3:
      raise ValueError(f"need 1 <= min_hops <= max_hops <= 3, got {self.min_hops}, "
                       f"{self.max_hops}")
    if self.top_k < 1 or self.snippet_chars < 8 or self.max_observation_chars < 16:
      raise ValueError("need top_k >= 1, snippet_chars >= 8 and max_observation_chars >= 16")
    if self.extra_turns < 0 or self.distractors < 0 or self.context_keep_last < 0:
      raise ValueError("extra_turns, distractors and context_keep_last must be >= 0, got "
                       f"{self.extra_turns}, {self.distractors}, {self.context_keep_last}")
    if not 0.0 < self.context_compact_to <= 1.0:
      raise ValueError(f"context_compact_to must be in (0, 1], got {self.context_compact_to}")
    if not 0.0 <= self.eval_fraction < 1.0:
      raise ValueError(f"eval_fraction must be in [0, 1), got {self.eval_fraction}")
    if self.corpus_path and not self.questions_path:
      raise ValueError("corpus_path needs questions_path (questions about that corpus); "
                       "give both, or neither for the built-in corpus")
    if self.corpus_path:
      st = os.stat(self.corpus_path) if os.path.exists(self.corpus_path) else None
      if st is None:
        raise ValueError(f"corpus_path {self.corpus_path!r} does not exist")
      source = ("file", os.path.abspath(self.corpus_path), st.st_mtime_ns, st.st_size)
    else:
      source = ("builtin", int(self.corpus_seed), int(self.num_people))
    index, corpus = _index(source, int(self.page_chars))
    object.__setattr__(self, "_index", index)
    object.__setattr__(self, "_corpus", corpus)
    train = held = None
    if self.questions_path:
      train = load_qa(self.questions_path)
      n_eval = int(np.ceil(self.eval_fraction * len(train))) if self.eval_fraction else 0
      if n_eval and len(train) - n_eval < 1:
        raise ValueError(f"questions_path {self.questions_path!r} has {len(train)} question(s):"
                         f" holding out {n_eval} leaves none to train on; set eval_fraction=0")
      order = np.random.default_rng(0).permutation(len(train))
      held = [train[i] for i in sorted(order[:n_eval])] or train
      train = [train[i] for i in sorted(order[n_eval:])]
    object.__setattr__(self, "_questions", (train, held))

  # --- sizes ----------------------------------------------------------------------------
  @property
  def fmt(self) -> ToolFormat:
    return ToolFormat(self.call_open, self.call_close)

  @property
  def index(self) -> SearchIndex:
    return self._index

  @property
  def int_fields(self) -> dict[str, tuple[int, ...]]:
    return {"hops": ()}

  @property
  def max_turns(self) -> int:
    return (2 + self.distractors) * self.max_hops + 1 + self.extra_turns

  @property
  def max_prompt_chars(self) -> int:
    if self.questions_path:
      train, held = self._questions
      return max(len(e["prompt"]) for e in train + held)
    rel = max(len(r) for r in corpus_lib.RELATIONS)
    return self.max_hops * (rel + len(" of ")) + 3 + 1

  @property
  def max_action_chars(self) -> int:
    """The longest demonstrated action: a search for a question of the file (its text), or
    "search(<relation> of <name>)"."""
    if self.questions_path:
      return len(self.fmt.call("search", "x" * self.max_prompt_chars))
    words = max(len(r) for r in corpus_lib.RELATIONS)
    return len(self.fmt.call("search", "x" * (words + len(" of ") + 3)))

  @property
  def max_response_chars(self) -> int:
    return self.max_action_chars

  # --- examples -------------------------------------------------------------------------
  def _starts(self, split: str) -> tuple[str, ...]:
    people = self._corpus.people
    order = np.random.default_rng([self.corpus_seed, 0xE7]).permutation(len(people))
    n_eval = int(round(self.eval_fraction * len(people)))
    n_eval = min(max(n_eval, 1), len(people) - 1) if self.eval_fraction else 0
    picked = order[:n_eval] if split == "eval" else order[n_eval:]
    if split == "eval" and not n_eval:
      picked = order
    return tuple(people[i] for i in sorted(picked))

  def _draw_builtin(self, rng: np.random.Generator, n: int, split: str) -> list[dict]:
    starts, facts = self._starts(split), self._corpus.facts
    out, tries = [], 0
    while len(out) < n:
      tries += 1
      if tries > 200 * (n + 10):
        raise RuntimeError(f"search_qa: could not draw {n} answerable {split} questions from "
                           "the built-in corpus; raise num_people or top_k")
      h = int(rng.integers(self.min_hops, self.max_hops + 1))
      start = starts[int(rng.integers(len(starts)))]
      name, rels, seen = start, [], {start}
      for i in range(h):
        options = corpus_lib.PERSON_RELATIONS if i < h - 1 else corpus_lib.RELATIONS
        have = [r for r in options if (name, r) in facts
                and (i == h - 1 or facts[(name, r)] not in seen)]
        if not have:
          break
        r = have[int(rng.integers(len(have)))]
        rels.append(r)
        name = facts[(name, r)]
        seen.add(name)
      if len(rels) != h:
        continue
      ex = {"prompt": corpus_lib.question_text(start, tuple(rels)), "answer": name,
            "aliases": json.dumps([name]), "hops": h}
      if self._demo_turns(ex) is not None:
        out.append(ex)
    return out

  def generate(self, rng: np.random.Generator, n: int) -> list[dict]:
    if self.questions_path:
      return _draw(self._questions[0], rng, n)
    return self._draw_builtin(rng, n, "train")

  def generate_eval(self, rng: np.random.Generator, n: int) -> list[dict]:
    """Held-out questions: the file's held-out share, or built-in questions from the
    held-out start people."""
    if self.questions_path:
      return _draw(self._questions[1], rng, n)
    return self._draw_builtin(rng, n, "eval")

  # --- verification and demonstrations --------------------------------------------------
  def golds(self, example: Mapping[str, Any]) -> list[str]:
    """The example's gold answers (its aliases, else its answer)."""
    aliases = example.get("aliases")
    if aliases:
      return list(json.loads(text_field(example, "aliases")))
    return [text_field(example, "answer")]

  def score(self, example: Mapping[str, Any], answer: str) -> tuple[float, float]:
    """(F1, EM) of an answer's text."""
    golds = self.golds(example)
    return answer_f1(answer, golds), answer_em(answer, golds)

  def verify(self, example: Mapping[str, Any], response: str) -> float:
    """The reward of an answer turn's text ("answer(north bay)"): F1 or EM."""
    act = parse_action(response, self.fmt, {"search": None, "open": 2})
    if act.kind != ANSWER:
      return 0.0
    f1, em = self.score(example, act.args[0])
    return f1 if self.reward == "f1" else em

  def chain(self, example: Mapping[str, Any]) -> tuple[corpus_lib.Fact, ...] | None:
    """The facts a built-in question follows (None for questions from a file)."""
    if self._corpus is None or self.questions_path:
      return None
    prompt = text_field(example, "prompt")
    chain = corpus_lib.question_chain(self._corpus, prompt)
    if chain is None or len(chain) > self.max_hops:
      raise ValueError(f"example {prompt!r} is not a question of {self} (not a chain of at "
                       f"most max_hops={self.max_hops} facts of the built-in corpus)")
    return chain

  def _demo_turns(self, example: Mapping[str, Any]) -> list[str] | None:
    """The demonstrator's actions (module docstring); None when it cannot find a fact."""
    fmt = self.fmt
    chain = self.chain(example)
    if chain is None:
      return [fmt.call("search", text_field(example, "prompt").rstrip("?")),
              fmt.answer(text_field(example, "answer"))]
    env = self.make_env(example)
    env.reset()
    actions = []
    prompt = text_field(example, "prompt")
    rng = np.random.default_rng([self.corpus_seed, zlib.crc32(prompt.encode())])
    fuzz = corpus_lib.question_fuzz(self._corpus, prompt)
    hops = [(s, r, f"{r} of {s}") for s, r, _ in chain]
    if fuzz is not None:  # find who the description names first
      hops.insert(0, (fuzz[0], fuzz[1], f"{fuzz[1]} {fuzz[2]}"))
    for i, (s, r, query) in enumerate(hops):
      if self.distractors and (fuzz is None or i > 0):
        others = [o for o in corpus_lib.RELATIONS if o != r and (s, o) in self._corpus.facts]
        for _ in range(int(rng.integers(self.distractors + 1)) if others else 0):
          act = fmt.call("search", f"{others[int(rng.integers(len(others)))]} of {s}")
          env.step(act)
          actions.append(act)
      text, where = self._corpus.sentence[(s, r)]
      act = fmt.call("search", query)
      res = env.step(act)
      actions.append(act)
      if text in res.observation:
        continue
      if self._index.by_id[where] not in res.info["results"]:
        return None
      pages = self._index.pages(self._index.by_id[where])
      page = next((k for k, p in enumerate(pages, 1) if text in p), None)
      if page is None:
        return None
      act = fmt.call("open", where, str(page))
      res = env.step(act)
      actions.append(act)
      if text not in res.observation or env.done:
        return None
    actions.append(fmt.answer(chain[-1][2]))
    return actions if len(actions) <= env.limits.max_turns else None

  def episode_metrics(self, trajectories: Sequence[Any]) -> dict[str, float]:
    """Per-step training metrics of a batch of episodes (the env rollout reports them):
    `answer_em` / `answer_f1`, the mean exact match and F1 of the episodes' answers (0 for an
    episode that never answered), and `answered_frac`."""
    em, f1, answered = [], [], []
    for t in trajectories:
      info = getattr(t.results[-1], "info", None) if t.results else None
      ok = isinstance(info, Mapping) and "em" in info
      em.append(float(info["em"]) if ok else 0.0)
      f1.append(float(info["f1"]) if ok else 0.0)
      answered.append(float(ok))
    n = max(len(trajectories), 1)
    return {"answer_em": sum(em) / n, "answer_f1": sum(f1) / n,
            "answered_frac": sum(answered) / n}

  def demonstration_turns(self, example: Mapping[str, Any],
                          rng: np.random.Generator | None = None) -> list[str]:
    del rng  # a deterministic demonstrator
    turns = self._demo_turns(example)
    if turns is None:
      raise ValueError(f"the demonstrator cannot answer {text_field(example, 'prompt')!r} "
                       f"within max_turns={self.max_turns} (was it drawn with other options?)")
    return turns

  def demonstration_episodes(self, example: Mapping[str, Any], limits: Limits | None = None,
                             rng: np.random.Generator | None = None
                             ) -> list[tuple[str, list[str], list[str]]]:
    """The warm-up episode (prompt, actions, observations) of `example`; with context
    management (`context_keep_last` >= 1) every observation but the last
    `context_keep_last` is the placeholder a compaction leaves, so a long demonstration fits
    the budget as the final context of a sampled episode would."""
    from credit.envs.context import PLACEHOLDER  # pylint: disable=g-import-not-at-top
    from credit.envs.rollout import demonstration_episode  # pylint: disable=g-import-not-at-top
    prompt, actions, obs = demonstration_episode(self, example, limits, rng)
    keep = int(self.context_keep_last)
    if keep >= 1 and len(obs) > keep:
      obs = [PLACEHOLDER] * (len(obs) - keep) + list(obs[-keep:])
    return [(prompt, actions, obs)]

  def demonstration(self, example: Mapping[str, Any], rng: np.random.Generator | None = None
                    ) -> str:
    del rng
    return self.fmt.answer(text_field(example, "answer"))

  def make_env(self, example: Mapping[str, Any], limits: Limits | None = None) -> "SearchEnv":
    limits = task_limits(self, limits)
    if limits.max_observation_chars is None:
      limits = dataclasses.replace(limits, max_observation_chars=self.max_observation_chars)
    chain = self.chain(example)
    shown = (tuple(self._corpus.sentence[(s, r)][0] for s, r, _ in chain) if chain is not None
             else None)
    fuzz = (corpus_lib.question_fuzz(self._corpus, text_field(example, "prompt"))
            if chain is not None else None)
    if fuzz is not None:  # the description's fact is the first to find
      shown = (self._corpus.sentence[fuzz[:2]][0],) + shown
    return SearchEnv(self._index, text_field(example, "prompt"), self.golds(example), shown,
                     limits, self.fmt, top_k=self.top_k, snippet_chars=self.snippet_chars,
                     reward=self.reward)


def _draw(records: Sequence[dict], rng: np.random.Generator, n: int) -> list[dict]:
  out: list[dict] = []
  while len(out) < n:  # a fresh permutation per pass over the records
    out += [dict(records[i]) for i in rng.permutation(len(records))[:n - len(out)]]
  return out


class SearchEnv(TextEnv):
  """One `search_qa` episode (module docstring). State: which gold sentences were shown
  (built-in questions), or whether the answer was shown (questions from a file)."""
  tools = {"search": None, "open": 2}

  def __init__(self, index: SearchIndex, prompt: str, golds: Sequence[str],
               gold_sentences: Sequence[str] | None, limits: Limits,
               fmt: ToolFormat = ToolFormat(), *, top_k: int = 3, snippet_chars: int = 80,
               reward: str = "f1"):
    super().__init__(limits, fmt)
    self.index, self.prompt, self.golds = index, prompt, tuple(golds)
    self.gold_sentences = None if gold_sentences is None else tuple(gold_sentences)
    self.top_k, self.snippet_chars, self.reward = top_k, snippet_chars, reward
    self.gold_answer = fmt.answer(self.golds[0])
    self._norm_golds = tuple(normalize_answer(g) for g in self.golds)

  def _initial_state(self) -> tuple[bool, ...]:
    return (False,) * (1 if self.gold_sentences is None else len(self.gold_sentences))

  def _progress(self, state: tuple[bool, ...]) -> float:
    return sum(state) / len(state)

  def _shown(self, state: tuple[bool, ...], observation: str) -> tuple[tuple[bool, ...], tuple]:
    """The state after an observation, and the hops it showed first."""
    shown = self.limits.truncate(observation)
    if self.gold_sentences is None:
      seen = any(g and g in normalize_answer(shown) for g in self._norm_golds)
      return (state[0] or seen,), ((0,) if seen and not state[0] else ())
    new = tuple(i for i, s in enumerate(self.gold_sentences) if not state[i] and s in shown)
    return tuple(v or i in new for i, v in enumerate(state)), new

  def search(self, query: str) -> tuple[str, list[int]]:
    """The observation of `search(query)` and the indices of the documents it lists."""
    hits = self.index.search(query, self.top_k)
    if not hits:
      return "no results", []
    lines = []
    for h in hits:
      d = self.index.documents[h.doc]
      head = d.id if d.title == d.id else f"{d.id} ({d.title})"
      lines.append(f"{head}: {self.index.snippet(h.doc, query, self.snippet_chars)}")
    return "\n".join(lines), [h.doc for h in hits]

  def open(self, doc_id: str, page: str) -> tuple[str, int | None]:
    """The observation of `open(doc, page)` and the document's index (None on an error)."""
    i = self.index.by_id.get(doc_id)
    if i is None:
      return f"error: no document {doc_id[:24]}", None
    pages = self.index.pages(i)
    if not page.isdigit() or not 1 <= int(page) <= len(pages):
      return f"error: {doc_id} has pages 1 to {len(pages)}", None
    return f"{doc_id} page {int(page)} of {len(pages)}: {pages[int(page) - 1]}", i

  def _act(self, state: tuple[bool, ...], action: Action) -> tuple[Any, Turn]:
    if action.kind == ANSWER:
      f1, em = answer_f1(action.args[0], self.golds), answer_em(action.args[0], self.golds)
      out = f1 if self.reward == "f1" else em
      return state, Turn("", correct=em == 1.0, outcome=out,
                         info={"f1": f1, "em": em, "revealed": (), "results": (), "doc": None})
    if action.name == "search":
      query = (self.fmt.arg_sep + " ").join(action.args)
      obs, results = self.search(query)
      info = {"results": tuple(results), "doc": None}
    else:
      obs, doc = self.open(*action.args)
      info = {"results": (), "doc": doc}
    if obs.startswith("error: "):
      return state, Turn(obs, correct=False, info={**info, "revealed": (), "valid": False})
    state, new = self._shown(state, obs)
    return state, Turn(obs, reward=float(bool(new)), correct=bool(new),
                       info={**info, "revealed": new})
