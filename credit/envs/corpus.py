"""A built-in document corpus with multi-hop questions, so that the search agent runs offline.

The corpus (`make_corpus`, a pure function of its seed and sizes) describes `num_people`
people. Each person has facts of two kinds:

  person relations    boss, coach, aunt  -> another person      "the boss of ann is bob."
  attributes          city, team, club, pet -> a two-word value  "the city of bob is north bay."

Each person has one document (id and title: the name; text: the name, then the sentences in a
random order, with a few filler sentences). A person relation is stated on the subject's
document ("the boss of ann is bob.") or on the object's ("bob is the boss of ann."), by a
seeded coin, so following a chain means reading several documents, and the document that
holds a fact is not always the one named in the question. Every text uses only lowercase
letters, digits, spaces and ".,:" (the character tokenizer's vocabulary).

Questions (`question_chain`, `question_text`) follow 1 to 3 facts from a start person, written
outermost relation first, as in `credit.envs.lookup`: "city of boss of ann?" asks for the city
of ann's boss. Every hop but the last is a person relation; the last may be an attribute, so
an answer is a name ("kim") or a two-word value ("north bay", where a half-right answer earns
a partial F1). Each (person, relation) has at most one fact, so the answer is unique.
A fuzzed question names its start person by a description instead ("city of boss of the one
whose pet is red goat?", `describe`), valid when exactly one person fits it; its chain starts
at that person and `question_fuzz` gives the fact the description names.

>>> c = make_corpus(0, num_people=12)
>>> len(c.documents), c.documents[0].id == c.documents[0].title
(12, True)
"""
from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

from credit.envs.lookup import NAMES, follow_chain

__all__ = ["ATTRIBUTES", "Corpus", "Document", "PERSON_RELATIONS", "RELATIONS", "describe",
           "make_corpus", "parse_question", "question_chain", "question_fuzz", "question_text",
           "resolve_start"]

PERSON_RELATIONS = ("boss", "coach", "aunt")
# attribute -> the second words of its values (the first word is one of _ADJECTIVES)
ATTRIBUTES = {"city": ("bay", "hill", "port", "ford", "moor", "vale"),
              "team": ("lions", "owls", "bears", "wolves", "hawks", "foxes"),
              "club": ("chess", "rowing", "poetry", "garden", "film", "jazz"),
              "pet": ("cat", "dog", "parrot", "horse", "rabbit", "goat")}
RELATIONS = PERSON_RELATIONS + tuple(ATTRIBUTES)
_ADJECTIVES = ("north", "south", "east", "west", "red", "blue", "green", "old", "new", "high",
               "low", "gold")
_FILLERS = ("likes tea", "likes rain", "reads at night", "walks to work", "plays the drum",
            "keeps bees", "paints on sundays", "was born in 1990", "was born in 1985",
            "sings in a choir", "grows beans", "rides a bike")
_RESERVED = set(RELATIONS) | set(_ADJECTIVES) | {w for v in ATTRIBUTES.values() for w in v} | {
    "the", "of", "is", "a", "in", "on", "at", "to"}
PEOPLE = tuple(n for n in NAMES if n not in _RESERVED)

Fact = tuple[str, str, str]  # (person, relation, value)


class Document(NamedTuple):
  """One document of a corpus: a unique `id`, a `title` and its `text`."""
  id: str
  title: str
  text: str


class Corpus(NamedTuple):
  """Documents and the facts they state.

  Attributes:
    documents: the documents, one per person.
    facts: (person, relation) -> value.
    sentence: (person, relation) -> (the sentence stating the fact, the id of its document).
    people: the names, in document order.
  """
  documents: tuple[Document, ...]
  facts: dict
  sentence: dict
  people: tuple[str, ...]


def make_corpus(seed: int, *, num_people: int = 40, p_relation: float = 0.7,
                p_attribute: float = 0.8, fillers: int = 2) -> Corpus:
  """The built-in corpus of `seed` (module docstring); deterministic.

  Args:
    seed: the corpus seed.
    num_people: people (documents), in [4, len(PEOPLE)].
    p_relation: chance that a person has each person relation.
    p_attribute: chance that a person has each attribute.
    fillers: filler sentences per document.
  """
  if not 4 <= num_people <= len(PEOPLE):
    raise ValueError(f"num_people must be in [4, {len(PEOPLE)}], got {num_people}")
  for name, p in (("p_relation", p_relation), ("p_attribute", p_attribute)):
    if not 0.0 < p <= 1.0:
      raise ValueError(f"{name} must be in (0, 1], got {p}")
  if fillers < 0:
    raise ValueError(f"fillers must be >= 0, got {fillers}")
  rng = np.random.default_rng([seed, 0xC0])
  people = tuple(PEOPLE[i] for i in sorted(rng.choice(len(PEOPLE), num_people, replace=False)))
  facts, sentence = {}, {}
  body: dict[str, list[str]] = {p: [] for p in people}
  for p in people:
    for r in PERSON_RELATIONS:
      if rng.random() < p_relation:
        q = people[int(rng.integers(num_people - 1))]
        q = q if q != p else people[-1]
        facts[(p, r)] = q
        if rng.random() < 0.5:
          text, where = f"the {r} of {p} is {q}.", p
        else:
          text, where = f"{q} is the {r} of {p}.", q
        sentence[(p, r)] = (text, where)
        body[where].append(text)
    for r, nouns in ATTRIBUTES.items():
      if rng.random() < p_attribute:
        v = f"{_ADJECTIVES[int(rng.integers(len(_ADJECTIVES)))]} {nouns[int(rng.integers(6))]}"
        facts[(p, r)] = v
        sentence[(p, r)] = (f"the {r} of {p} is {v}.", p)
        body[p].append(sentence[(p, r)][0])
    for j in rng.choice(len(_FILLERS), min(fillers, len(_FILLERS)), replace=False):
      body[p].append(f"{p} {_FILLERS[int(j)]}.")
  docs = tuple(Document(p, p, " ".join([f"{p}."] + [body[p][i] for i in
                                                     rng.permutation(len(body[p]))]))
               for p in people)
  return Corpus(docs, facts, sentence, people)


def question_text(start: str, relations: tuple[str, ...]) -> str:
  """("ann", ("boss", "city")) -> "city of boss of ann?"."""
  return "".join(f"{r} of " for r in reversed(relations)) + start + "?"


_DESCRIPTION = re.compile(r"the one whose ([a-z]+) is ([a-z]+ [a-z]+)")


def describe(attribute: str, value: str) -> str:
  """A fuzzed start: ("pet", "red goat") -> "the one whose pet is red goat"."""
  return f"the one whose {attribute} is {value}"


def parse_question(prompt: str) -> tuple[str, tuple[str, ...]] | None:
  """(start, relations first hop first) of "city of boss of ann?"; None if not that form.
  The start may be a description, "city of boss of the one whose pet is red goat?"
  (`describe`, a fuzzed question)."""
  if not prompt.endswith("?"):
    return None
  words = prompt[:-1].split(" of ")
  if len(words) < 2 or any(not w.isalpha() or not w.islower() for w in words[:-1]):
    return None
  if not (words[-1].isalpha() and words[-1].islower()) and not _DESCRIPTION.fullmatch(words[-1]):
    return None
  return words[-1], tuple(reversed(words[:-1]))


def resolve_start(corpus: Corpus, start: str) -> tuple[str, Fact | None] | None:
  """The person a question starts from and the fact that identifies them when the start is a
  description (`describe`): (name, None) for a name, (name, (name, attribute, value)) for a
  description that exactly one person of the corpus fits, else None."""
  m = _DESCRIPTION.fullmatch(start)
  if m is None:
    return (start, None) if start in corpus.people else None
  attribute, value = m.groups()
  fits = [p for p in corpus.people if corpus.facts.get((p, attribute)) == value]
  return (fits[0], (fits[0], attribute, value)) if len(fits) == 1 else None


def question_fuzz(corpus: Corpus, prompt: str) -> Fact | None:
  """The fact a fuzzed question's description names (None for a plain question)."""
  parsed = parse_question(prompt)
  resolved = None if parsed is None else resolve_start(corpus, parsed[0])
  return None if resolved is None else resolved[1]


def question_chain(corpus: Corpus, prompt: str) -> tuple[Fact, ...] | None:
  """The facts a question follows, first hop first; None when it is not a chain of the
  corpus's facts (every hop but the last a person relation, no fact used twice)."""
  parsed = parse_question(prompt)
  if parsed is None:
    return None
  resolved = resolve_start(corpus, parsed[0])
  if resolved is None:
    return None
  rels = parsed[1]
  if any(r not in RELATIONS or (i < len(rels) - 1 and r not in PERSON_RELATIONS)
         for i, r in enumerate(rels)):
    return None
  return follow_chain(corpus.facts, resolved[0], rels)
