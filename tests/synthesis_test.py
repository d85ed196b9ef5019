"""Question synthesis over the lookup knowledge base (credit/envs/synthesis.py, issue 16 item 4).

Injection and verification are checked on hand-picked facts of real worlds; the loop with a
scripted agent (`Oracle`, deterministic and cheap) and with a tiny random-init Decoder played
by the real `MultiTurnSampler` (it never solves: its measured pass rate is 0); the file round
trip into `Lookup(questions_path=...)`; the CLI end to end on an exported tiny model.
"""
from __future__ import annotations

import functools
import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
from flax import nnx

from credit.envs import Limits, LookupEnv
from credit.envs.lookup import Lookup, parse_question, question_text
from credit.envs.rollout import MultiTurnSampler, TurnLayout
from credit.envs.synthesis import (ExploreEnv, SamplerPlayer, check_candidate, injections,
                                   record_of, revealed_facts, synthesize, write_questions)
from credit.models import Decoder, save_pretrained
from credit.models.config import tiny_config
from credit.tasks import CharTokenizer

TOK = CharTokenizer()
TASK = Lookup(min_hops=1, max_hops=2, num_distractors=6)
LIMITS = Limits(max_turns=TASK.max_turns, max_observation_chars=16)
LAYOUT = TurnLayout(prompt_width=TASK.max_prompt_chars + 1, max_turns=TASK.max_turns,
                    max_action_tokens=TASK.max_action_chars + 1, max_observation_tokens=16)


class Oracle:
  """A scripted agent: on a question it looks up the chain and answers (`solve=False`: answers
  a wrong name); on a probe ("team of kim?") it looks the fact up, then answers."""

  def __init__(self, solve: bool = True):
    self.solve, self.calls = solve, 0

  def __call__(self, envs, key):
    del key
    self.calls += 1
    out = []
    for env in envs:
      prompt = env.reset()
      if isinstance(env, LookupEnv):
        acts = [f"lookup({s} {r})" for s, r, _ in env.world.chain]
        acts.append(f"answer({env.world.answer if self.solve else 'zzz'})")
      else:
        start, rels = parse_question(prompt)
        acts = [f"lookup({start} {rels[0]})", "answer(zzz)"]
      obs = []
      for a in acts:
        res = env.step(a)
        if res.done:
          break
        obs.append(res.observation)
      out.append(SimpleNamespace(observations=obs, outcome=env.outcome()))
    return out


def _world_with(pred, task=TASK):
  """The first world (seed 0, 1, ...) with a fact `pred(world, fact)`, and that fact."""
  for seed in range(10_000):
    w = task.world(seed)
    for (s, r), v in sorted(w.facts.items()):
      if pred(w, (s, r, v)):
        return seed, w, (s, r, v)
  raise AssertionError("no such world")


@functools.lru_cache(maxsize=None)
def _random_player(batch_size: int) -> SamplerPlayer:
  model = Decoder(tiny_config("qwen3", vocab_size=TOK.vocab_size), rngs=nnx.Rngs(0))
  return SamplerPlayer(MultiTurnSampler(model, tokenizer=TOK, layout=LAYOUT), nnx.state(model),
                       batch_size=batch_size)


# --- injection and verification -----------------------------------------------------------

def test_extend_injection_adds_one_hop_and_its_answer_is_right():
  used = lambda w: {(s, r) for s, r, _ in w.chain}
  seed, w, f = _world_with(lambda w, f: len(w.chain) == 1 and f[0] == w.answer
                           and f[:2] not in used(w))
  (via, chain), = injections(w.chain, {f, ("qqq", "boss", "bob")}, hops_max=2)
  assert via == "extend" and chain == w.chain + (f,)
  rec = record_of(seed, chain)
  assert rec == {"prompt": f"{f[1]} of {w.question}", "answer": f[2], "world_seed": seed,
                 "hops": 2}
  assert check_candidate(TASK, rec, LIMITS) is None
  env = TASK.make_env(rec, LIMITS)
  assert env.reset() == rec["prompt"] and env.world.chain == chain
  for a in TASK.demonstration_turns(rec):
    res = env.step(a)
  assert env.outcome() == 1.0 and res.info["correct"]
  assert TASK.verify(rec, f"answer({f[2]})") == 1.0 and TASK.verify(rec, "answer(zzz)") == 0.0
  with pytest.raises(ValueError, match="not the chain's end"):
    TASK.make_env(dict(rec, answer="zzz"))
  assert injections(chain, {f}, hops_max=2) == []  # at hops_max


def test_prefix_injection_keeps_the_answer():
  seed, w, f = _world_with(lambda w, f: len(w.chain) == 1 and f[2] == w.chain[0][0])
  (via, chain), = [c for c in injections(w.chain, {f}, hops_max=2) if c[0] == "prefix"]
  rec = record_of(seed, chain)
  start, rel = w.chain[0][0], w.chain[0][1]
  assert rec["prompt"] == question_text(f[0], (f[1], rel)) == f"{rel} of {f[1]} of {f[0]}?"
  assert rec["answer"] == w.answer and rec["hops"] == 2 and start == f[2]
  assert check_candidate(TASK, rec, LIMITS) is None


def test_a_candidate_not_in_the_world_is_rejected():
  seed, w, _ = _world_with(lambda w, f: len(w.chain) == 1)
  end = w.answer
  rel = next(r for r in TASK.relations if (end, r) not in w.facts)
  fake = (end, rel, "zzz")  # the agent "read" a fact the world does not hold
  (_, chain), = injections(w.chain, {fake}, hops_max=2)
  rec = record_of(seed, chain)
  assert "not a chain of facts" in check_candidate(TASK, rec, LIMITS)
  with pytest.raises(ValueError, match="not generated"):
    TASK.make_env(rec)
  good = dict(rec, prompt=w.question, answer=w.answer, hops=1)
  assert check_candidate(TASK, good, LIMITS) is None
  assert "answer" in check_candidate(TASK, dict(good, answer="zzz"), LIMITS)
  assert "hops=2" in check_candidate(TASK, dict(good, hops=2), LIMITS)
  three = f"city of boss of {w.question}"
  assert "max_hops=2" in check_candidate(TASK, dict(good, prompt=three, hops=3), LIMITS)
  # A real 2-hop question that the episode limits cannot finish is not answerable.
  seed2, w2, _ = _world_with(lambda w, f: len(w.chain) == 2)
  rec2 = record_of(seed2, w2.chain)
  assert "max_turns=2" in check_candidate(TASK, rec2, Limits(max_turns=2))


def test_revealed_facts_are_what_the_agent_saw():
  t = SimpleNamespace(observations=["ann boss: bob", "ann pet: none", "kim coach: z...",
                                    "error: write lookup(name relation)", " kim team: zed "])
  assert revealed_facts(t) == {("ann", "boss", "bob"), ("kim", "team", "zed")}
  env = ExploreEnv({("kim", "team"): "zed"}, "team of kim?", LIMITS)
  assert env.reset() == "team of kim?"
  assert env.step("lookup(kim team)").observation == "kim team: zed"
  assert env.step("lookup(kim pet)").observation == "kim pet: none"
  assert env.step("answer(zed)").done and env.outcome() == 0.0


# --- the loop ------------------------------------------------------------------------------

def test_synthesis_is_deterministic_and_every_kept_question_verifies():
  kw = dict(num=6, seed=3, k=2, min_rate=0.0, max_rate=1.0, questions_per_round=4,
            max_rounds=30, limits=LIMITS)
  a = synthesize(TASK, Oracle(), **kw)
  b = synthesize(TASK, Oracle(), **kw)
  assert a.records == b.records and a.records
  st = a.stats
  assert st["kept"] == len(a.records) <= 6 and st["answerable"] <= st["proposed"]
  assert st["measured"] >= st["kept"] and st["seed_pass_rate"] == 1.0
  for r in a.records:
    assert check_candidate(TASK, r, LIMITS) is None and r["hops"] == 2
    assert r["pass_rate"] == 1.0 and r["via"] in ("extend", "prefix")
    w = TASK.world(r["world_seed"])
    assert r["prompt"] != w.question and r["seed_prompt"] == w.question
  assert synthesize(TASK, Oracle(), **dict(kw, seed=4)).records != a.records


def test_difficulty_filter_uses_the_measured_pass_rate():
  # The scripted agent explores; the solver is a random-init policy played by the sampler
  # (never solves) or the scripted agent (always solves).
  kw = dict(num=3, seed=1, k=2, questions_per_round=2, max_rounds=12, limits=LIMITS)
  random_solver = _random_player(batch_size=4)
  hard = synthesize(TASK, Oracle(), solver=random_solver, min_rate=0.1, max_rate=0.8, **kw)
  st = hard.stats
  assert st["measured"] > 0 and st["too_hard"] == st["measured"] and not hard.records
  assert st["seed_pass_rate"] == 0.0 and st["candidate_pass_rate"] == 0.0
  lenient = synthesize(TASK, Oracle(), solver=random_solver, min_rate=0.0, max_rate=0.8, **kw)
  assert lenient.records and all(r["pass_rate"] == 0.0 for r in lenient.records)
  easy = synthesize(TASK, Oracle(), solver=Oracle(), min_rate=0.1, max_rate=0.8, **kw)
  assert easy.stats["too_easy"] == easy.stats["measured"] > 0 and not easy.records
  with pytest.raises(ValueError, match="min_rate"):
    synthesize(TASK, Oracle(), num=1, min_rate=0.9, max_rate=0.1)
  with pytest.raises(ValueError, match="hops_max"):
    synthesize(TASK, Oracle(), num=1, hops_max=3)


def test_the_policy_explores_through_the_sampler():
  # Explorer and solver are the random policy: episodes are played and measured; a random
  # policy reads no fact, so it proposes nothing (the knowledge base never does).
  res = synthesize(TASK, _random_player(batch_size=4 * (2 + 6)), num=1, seed=0, k=2,
                   questions_per_round=4, max_rounds=1, limits=LIMITS)
  assert res.stats["episodes"] > 4 * 2 and res.stats["proposed"] == 0 and not res.records


# --- the file and training -----------------------------------------------------------------

def test_questions_file_round_trip_into_lookup(tmp_path):
  res = synthesize(TASK, Oracle(), num=5, seed=2, k=1, min_rate=0.0, max_rate=1.0,
                   questions_per_round=4, max_rounds=30, limits=LIMITS)
  path = str(tmp_path / "q.jsonl")
  write_questions(path, res.records)
  key = lambda e: (e["prompt"], e["answer"], e["world_seed"], e["hops"])
  every = {key(r) for r in res.records}
  # eval_fraction 0: train and evaluate on the whole file.
  task = Lookup(min_hops=1, max_hops=2, num_distractors=6, questions_path=path, eval_fraction=0)
  ex = task.generate(np.random.default_rng(0), 12)  # more than the file: cycles
  assert len(ex) == 12 and {key(e) for e in ex} == every
  assert {key(e) for e in task.generate_eval(np.random.default_rng(1), 12)} == every
  assert all(set(e) == {"prompt", "answer", "world_seed", "hops"} for e in ex)
  assert ex == task.generate(np.random.default_rng(0), 12)
  assert ex[:len(every)] != task.generate(np.random.default_rng(1), len(every))
  # The default holds out ceil(10%) of the records (the same ones for every run seed), which
  # `generate` never draws; the runner's eval split comes from `generate_eval`.
  task = Lookup(min_hops=1, max_hops=2, num_distractors=6, questions_path=path)
  train = {key(e) for e in task.generate(np.random.default_rng(3), 40)}
  held = {key(e) for e in task.generate_eval(np.random.default_rng(4), 40)}
  assert len(held) == 1 and train | held == every and not train & held
  from experiments import loop
  from experiments.configs import igpo_lookup
  c = igpo_lookup.get_config("tiny")
  c.task_kwargs = dict(min_hops=1, max_hops=2, num_distractors=6, questions_path=path)
  data = loop.build_data(c)
  assert {key(e) for e in data.eval} == held and not {key(e) for e in data.train} & held
  # Or a file of its own, used as it is.
  other = str(tmp_path / "eval.jsonl")
  write_questions(other, res.records[:2])
  task2 = Lookup(min_hops=1, max_hops=2, num_distractors=6, questions_path=path,
                 eval_questions_path=other)
  assert {key(e) for e in task2.generate(np.random.default_rng(0), 20)} == every
  assert ({key(e) for e in task2.generate_eval(np.random.default_rng(0), 20)}
          == {key(r) for r in res.records[:2]})
  write_questions(other, res.records[:1])
  with pytest.raises(ValueError, match="leaves none to train on"):
    Lookup(min_hops=1, max_hops=2, num_distractors=6, questions_path=other)
  with pytest.raises(ValueError, match="needs questions_path"):
    Lookup(eval_questions_path=other)
  for e in ex[:5]:
    env = task.make_env(e, LIMITS)
    env.reset()
    for a in task.demonstration_turns(e):
      env.step(a)
    assert env.outcome() == 1.0 and task.verify(e, f"answer({e['answer']})") == 1.0
  assert task.max_prompt_chars == TASK.max_prompt_chars  # same shapes as the plain task


def test_a_bad_record_is_refused(tmp_path):
  seed, w, _ = _world_with(lambda w, f: True)
  good = record_of(seed, w.chain)
  path = tmp_path / "bad.jsonl"
  path.write_text(json.dumps(good) + "\n" + json.dumps(dict(good, answer="zzz")) + "\n")
  with pytest.raises(ValueError, match=r"bad.jsonl:2: the record does not verify.*answer"):
    Lookup(min_hops=1, max_hops=2, num_distractors=6, questions_path=str(path))
  path.write_text(json.dumps(good) + "\n")
  Lookup(min_hops=1, max_hops=2, num_distractors=6, questions_path=str(path),
         eval_fraction=0)  # fine (one record: nothing to hold out)
  with pytest.raises(ValueError, match="does not verify"):  # other options, other worlds
    Lookup(min_hops=1, max_hops=2, num_distractors=2, questions_path=str(path))
  path.write_text("{not json\n")
  with pytest.raises(ValueError, match="bad.jsonl:1: not JSON"):
    Lookup(questions_path=str(path))
  path.write_text(json.dumps({"prompt": "x?"}) + "\n")
  with pytest.raises(ValueError, match="no 'answer' field"):
    Lookup(questions_path=str(path))
  with pytest.raises(ValueError, match="does not exist"):
    Lookup(questions_path=str(tmp_path / "missing.jsonl"))


# --- the CLI -------------------------------------------------------------------------------

def test_cli_end_to_end_on_a_tiny_random_policy(tmp_path, capsys):
  from experiments import synthesize as cli
  cfg = tiny_config("qwen3", vocab_size=TOK.vocab_size, num_layers=1, hidden_size=32,
                    intermediate_size=64, head_dim=8)
  policy = tmp_path / "run" / "hf_policy"
  save_pretrained(Decoder(cfg, rngs=nnx.Rngs(0)), cfg, policy)
  (policy / "char_tokenizer.json").write_text(json.dumps({"chars": TOK.chars}))
  out = tmp_path / "q.jsonl"
  stats = cli.main(["--policy", str(tmp_path / "run"), "--out", str(out), "--num", "2",
                    "--seed", "0", "--task_kwargs", '{"max_hops": 2, "num_distractors": 6}',
                    "--k", "2", "--questions_per_round", "2", "--probes", "2",
                    "--max_rounds", "2", "--min_rate", "0.0", "--max_rate", "0.8"])
  text = capsys.readouterr().out
  for row in ("candidates proposed", "answerable", "kept by difficulty [0.0, 0.8]",
              "kept hops histogram", "time"):
    assert row in text
  assert stats["rounds"] == 2 and stats["episodes"] == 2 * 2 * (2 + 2)
  assert out.exists() and len(out.read_text().splitlines()) == stats["kept"]
  with pytest.raises(SystemExit, match="char_tokenizer.json"):
    os.remove(policy / "char_tokenizer.json")
    cli.main(["--policy", str(policy), "--out", str(out)])
