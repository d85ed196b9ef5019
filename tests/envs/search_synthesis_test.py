"""ASearcher-style synthesis over the search corpus (credit/envs/synthesis.py, second half):
injection, fuzzing, and the with/without-tools difficulty check. No model: cheap."""
from __future__ import annotations

import functools

import numpy as np

from credit.envs import corpus as corpus_lib
from credit.envs import synthesis as S
from credit.envs.search import SearchQA


@functools.lru_cache(maxsize=None)
def _task():
  return SearchQA(min_hops=1, max_hops=3, distractors=2, extra_turns=4)


def _chains(corpus, n=40):
  """Chains of 2 hops of the corpus, in corpus order."""
  out = []
  for (p, r), q in corpus.facts.items():
    if r in corpus_lib.PERSON_RELATIONS:
      for r2 in corpus_lib.ATTRIBUTES:
        if (q, r2) in corpus.facts and q != p:
          out.append(((p, r, q), (q, r2, corpus.facts[(q, r2)])))
  return out[:n]


def test_fuzzing_is_seeded_keeps_the_answer_and_removes_the_name():
  corpus = _task()._corpus
  fuzzed = 0
  for chain in _chains(corpus):
    a = S.fuzz_question(corpus, chain, np.random.default_rng(3))
    b = S.fuzz_question(corpus, chain, np.random.default_rng(3))
    assert a == b  # deterministic in the seed
    if a is None:
      continue
    fuzzed += 1
    start = chain[0][0]
    assert start not in a.split() and "the one whose" in a
    # the description names exactly one person, and the chain (so the answer) is unchanged
    assert corpus_lib.question_chain(corpus, a) == chain
    fact = corpus_lib.question_fuzz(corpus, a)
    assert fact[0] == start and corpus.facts[fact[:2]] == fact[2]
  assert fuzzed >= 10


def test_a_description_two_people_fit_is_refused():
  corpus = _task()._corpus
  by_value = {}
  for (p, r), v in corpus.facts.items():
    if r in corpus_lib.ATTRIBUTES:
      by_value.setdefault((r, v), []).append(p)
  shared = next(k for k, ps in by_value.items() if len(ps) > 1)
  q = corpus_lib.question_text(corpus_lib.describe(*shared), ("boss",))
  assert corpus_lib.question_chain(corpus, q) is None


def test_injection_lengthens_the_chain_and_keeps_its_facts():
  corpus = _task()._corpus
  chain = _chains(corpus)[0][:1]
  options = S.corpus_injections(corpus, chain, 3)
  assert options
  for kind, longer in options:
    assert len(longer) == 2 and kind in ("prefix", "extend")
    assert all(corpus.facts[(s, r)] == v for s, r, v in longer)
    assert (longer[1:] if kind == "prefix" else longer[:1]) == tuple(chain)
    q = corpus_lib.question_text(longer[0][0], tuple(r for _, r, _ in longer))
    assert corpus_lib.question_chain(corpus, q) == longer


def test_difficulty_check_drops_questions_answered_without_tools():
  task = _task()
  res = S.synthesize_search(task, num=12, seed=0, k=2, batch=16)
  again = S.synthesize_search(task, num=12, seed=0, k=2, batch=16)
  assert [r["prompt"] for r in res.records] == [r["prompt"] for r in again.records]
  assert len(res.records) == 12
  assert res.stats["answered_without_tools"] >= 1  # the prior guesses some answers
  held_out = set(task._starts("eval"))
  for r in res.records:
    assert r["closed_rate"] == 0.0 and r["open_rate"] > 0
    assert r["hops"] >= 2 and r["via"] != "seed"
    chain = corpus_lib.question_chain(task._corpus, r["prompt"])
    assert chain[-1][2] == r["answer"] and chain[0][0] not in held_out
  assert any("fuzz" in r["via"] for r in res.records)
  # a closed-book player that always knows the answer keeps nothing
  class Oracle:
    def __call__(self, envs, key):
      del key
      return [S._played(e, [task.fmt.answer(e.golds[0])]) for e in envs]
  none = S.synthesize_search(task, num=4, seed=0, k=1, batch=8, max_rounds=1,
                             without_tools=Oracle())
  assert not none.records and none.stats["answered_without_tools"] == none.stats["measured"]


def test_synthesized_questions_are_a_questions_file(tmp_path):
  task = _task()
  res = S.synthesize_search(task, num=6, seed=1, k=1, batch=8)
  path = tmp_path / "q.jsonl"
  S.write_search_questions(path, res.records)
  t2 = SearchQA(questions_path=str(path), eval_fraction=0.0, max_hops=3)
  ex = t2.generate(np.random.default_rng(0), 6)
  assert {e["prompt"] for e in ex} <= {r["prompt"] for r in res.records}


def test_episode_metrics_report_exact_match():
  task = _task()
  ex = task.generate(np.random.default_rng(0), 2)
  good = S._played(task.make_env(ex[0]), task.demonstration_turns(ex[0]))
  bad = S._played(task.make_env(ex[1]), [task.fmt.answer("nobody")])
  m = task.episode_metrics([good, bad])
  assert m == {"answer_em": 0.5, "answer_f1": 0.5, "answered_frac": 1.0}
