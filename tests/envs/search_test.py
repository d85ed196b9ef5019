"""The search agent's tools and task (credit/envs/search.py, credit/envs/corpus.py): SQuAD
answer scores, BM25 retrieval, snippets and pages, the built-in corpus and its questions, a
user's JSON-lines corpus, and the environment's per-turn signals."""
import json

import numpy as np
import pytest

from credit.envs import corpus as corpus_lib
from credit.envs.base import EnvBatch, run_episode
from credit.envs.search import (SearchIndex, SearchQA, answer_em, answer_f1, load_corpus,
                                normalize_answer)
from credit.tasks import CharTokenizer, get_task


@pytest.fixture(scope="module")
def task():
  return SearchQA(num_people=24, max_hops=3)


def test_answer_scores_follow_squad():
  assert normalize_answer("The  North-Bay, an old one!") == "northbay old one"
  assert answer_em("the north bay.", ["North Bay"]) == 1.0
  assert answer_em("north", "north bay") == 0.0
  assert answer_f1("north hill", "north bay") == pytest.approx(0.5)     # p = r = 1/2
  assert answer_f1("north bay hill", "north bay") == pytest.approx(0.8)  # p 2/3, r 1
  assert answer_f1("the", "a") == 1.0                                     # both empty
  assert answer_f1("bob", ["kim", "bob"]) == 1.0                          # the best alias
  assert answer_f1("", "bob") == 0.0


def test_the_built_in_corpus_is_deterministic_and_in_the_character_vocabulary():
  a, b = corpus_lib.make_corpus(3, num_people=20), corpus_lib.make_corpus(3, num_people=20)
  assert a.documents == b.documents
  assert a.documents != corpus_lib.make_corpus(4, num_people=20).documents
  tok = CharTokenizer()
  for d in a.documents:
    tok.encode(d.text)  # raises on a character outside the vocabulary
  for (s, r), (sentence, where) in a.sentence.items():
    assert sentence in a.documents[a.people.index(where)].text
    assert a.facts[(s, r)] in sentence and where in (s, a.facts[(s, r)])


def test_bm25_ranks_the_documents_that_share_the_query_words(task):
  index = task.index
  c = corpus_lib.make_corpus(0, num_people=24)
  (s, r), (sentence, where) = next(iter(c.sentence.items()))
  hits = index.search(f"{r} of {s}", 5)
  assert [index.documents[h.doc].id for h in hits].count(where) == 1
  assert all(h.score > 0 for h in hits) and [h.score for h in hits] == sorted(
      [h.score for h in hits], reverse=True)
  assert index.search("zzzz qqqq", 3) == []
  assert index.search(f"{r} of {s}", 5) == hits  # deterministic


def test_snippets_and_pages_are_bounded_sentences():
  docs = [corpus_lib.Document("a", "Alpha", "Cats purr. Dogs bark loudly at night. Owls hoot."),
          corpus_lib.Document("b", "Beta", "Nothing here.")]
  index = SearchIndex(docs, page_chars=24)
  assert index.snippet(0, "dogs night", 80) == "Dogs bark loudly at night."
  assert index.snippet(0, "dogs night", 12) == "Dogs bark..."
  assert index.pages(0) == ("Cats purr.", "Dogs bark loudly at nigh", "Owls hoot.")
  assert all(len(p) <= 24 for p in index.pages(0))
  assert index.search("alpha", 2)[0].doc == 0  # titles are indexed too


def test_demonstrations_solve_every_question_and_turns_report_progress(task):
  examples = task.generate(np.random.default_rng(0), 40)
  assert {e["hops"] for e in examples} == {1, 2, 3}
  used_open = False
  for e in examples:
    turns = task.demonstration_turns(e)
    ep = run_episode(task.make_env(e), turns)
    assert ep.outcome == 1.0 and ep.results[-1].info["em"] == 1.0, (e, turns)
    tool_results = ep.results[:-1]
    assert [r.progress for r in tool_results][-1] == 1.0
    assert sum(r.reward for r in tool_results) == e["hops"]  # each chain fact shown once
    used_open |= any(t.startswith("open(") for t in turns)
  assert used_open  # some facts are not in a snippet: the demonstrator opens their page


def test_held_out_questions_start_from_held_out_people(task):
  train = task.generate(np.random.default_rng(0), 60)
  held = task.generate_eval(np.random.default_rng(1), 30)
  start = lambda e: corpus_lib.parse_question(e["prompt"])[0]  # noqa: E731
  assert not {start(e) for e in train} & {start(e) for e in held}
  assert task.generate(np.random.default_rng(0), 60) == train


def test_tools_answer_errors_with_observations_and_rewards_partial_answers(task):
  e = next(e for e in task.generate(np.random.default_rng(2), 50) if " " in e["answer"])
  env = task.make_env(e)
  env.reset()
  assert env.step("open(nobody, 1)").observation == "error: no document nobody"
  res = env.step(f"open({task.index.documents[0].id}, 99)")
  assert res.observation.startswith("error:") and res.info["valid"] is False
  assert env.step("fly(away)").observation.startswith("error: unknown tool fly")
  half = e["answer"].split()[0]
  res = env.step(f"answer({half})")
  assert res.done and env.outcome() == pytest.approx(2 / 3) and res.info["em"] == 0.0
  em = get_task("search_qa", num_people=24, max_hops=3, reward="em")
  assert em.verify(e, f"answer({half})") == 0.0 and em.verify(e, f"answer({e['answer']})") == 1.0
  assert task.verify(e, f"answer({half})") == pytest.approx(2 / 3)


def test_a_users_corpus_and_questions(tmp_path):
  docs = [{"id": "d1", "title": "Ada Lovelace", "text": "Ada wrote the first program. "
           "She worked with Charles Babbage on the Analytical Engine."},
          {"id": "d2", "title": "Charles Babbage", "text": "Babbage designed the Difference "
           "Engine. He was born in London."}]
  qa = [{"question": "Where was the man Ada worked with born?", "answers": ["London", "UK"]},
        {"question": "Who wrote the first program?", "answer": "Ada Lovelace"}]
  (tmp_path / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
  (tmp_path / "qa.jsonl").write_text("".join(json.dumps(q) + "\n" for q in qa))
  task = SearchQA(corpus_path=str(tmp_path / "docs.jsonl"),
                  questions_path=str(tmp_path / "qa.jsonl"), eval_fraction=0.0)
  ex = {e["prompt"]: e for e in task.generate(np.random.default_rng(0), 2)}
  e = ex[qa[0]["question"]]
  env = task.make_env(e)
  env.reset()
  res = env.step("search(Babbage born)")
  assert res.observation.splitlines()[0] == "d2 (Charles Babbage): He was born in London."
  assert res.progress == 1.0 and res.reward == 1.0  # the answer was shown
  assert env.step("open(d1, 1)").observation.startswith("d1 page 1 of 1: Ada wrote")
  assert env.step("answer(UK)").done and env.outcome() == 1.0  # any alias counts
  assert run_episode(task.make_env(e), task.demonstration_turns(e)).results[0].observation


@pytest.mark.parametrize("line, why", [
    ('{"id": "a", "title": "t"}', "field 'text' must be a string"),
    ('{"id": "a,b", "title": "t", "text": "x"}', "without ','"),
    ('not json', "not JSON"),
])
def test_a_bad_corpus_line_is_refused_naming_the_file_and_line(tmp_path, line, why):
  path = tmp_path / "c.jsonl"
  path.write_text('{"id": "ok", "title": "t", "text": "x"}\n' + line + "\n")
  with pytest.raises(ValueError, match=f"c.jsonl:2: .*{why}"):
    load_corpus(path)


def test_a_batch_of_episodes_plays_concurrently_and_deterministically(task):
  examples = task.generate(np.random.default_rng(5), 4)
  batches = [EnvBatch.from_examples(task, examples, repeat=2) for _ in range(2)]
  for b in batches:
    b.reset()
    b.step([f"search({e['prompt'].rstrip('?')})" for e in examples for _ in range(2)])
  assert [r[0].observation for r in batches[0].results] == [
      r[0].observation for r in batches[1].results]
  fields = batches[0].turn_fields(task.max_turns)
  assert fields["step_mask"][:, 0].all() and not fields["step_mask"][:, 1:].any()


def test_questions_from_a_file_over_the_built_in_corpus(tmp_path):
  """A user's questions over the built-in corpus: scored by F1, progress from the answer."""
  c = corpus_lib.make_corpus(0, num_people=24)
  (s, r), v = next((k, v) for k, v in c.facts.items() if k[1] == "city")
  path = tmp_path / "qa.jsonl"
  path.write_text(json.dumps({"question": f"where does {s} live?", "answer": v}) + "\n")
  task = SearchQA(num_people=24, questions_path=str(path), eval_fraction=0.0)
  e = task.generate(np.random.default_rng(0), 1)[0]
  assert task.demonstration_turns(e) == [f"search(where does {s} live)", f"answer({v})"]
  assert len(task.demonstration_turns(e)[0]) <= task.max_action_chars
  env = task.make_env(e)
  env.reset()
  res = env.step(f"search(city of {s})")
  assert res.progress == 1.0 and v in res.observation
