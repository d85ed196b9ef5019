"""Multi-turn environments: tool format, lookup / calculator / multidoc tasks, EnvBatch, tfds."""
import doctest

import numpy as np
import pytest

from credit import envs
from credit.envs import calculator as calc_mod
from credit.envs import tools as tools_mod
from credit.envs.base import EnvBatch, EpisodeDoneError, Limits, run_episode
from credit.envs.tools import Action, ToolFormat, parse_action
from credit.tasks import as_example, build_task_dataset, get_task, task_data_source
from credit.tasks.char_tokenizer import DEFAULT_CHARS, UNKNOWN_CHAR

TASKS = ("lookup", "calculator", "multidoc")
TOOL = {"lookup": "lookup", "calculator": "calc", "multidoc": "read"}
ALLOWED = set(DEFAULT_CHARS)
SIZES = dict(train_size=24, test_size=8)


def _results(ep):
  return [(r.observation, r.done, r.reward, r.progress, r.role) for r in ep.results]


# --- tool format ----------------------------------------------------------------------

def test_parse_action():
  tools = {"lookup": 1, "add": 2}
  assert parse_action(" lookup(ann boss) ", tools=tools) == Action("call", "lookup", ("ann boss",))
  assert parse_action("add(1, (2,3))", tools=tools) == Action("call", "add", ("1", "(2,3)"))
  assert parse_action("answer(1, 2)", tools=tools) == Action("answer", "answer", ("1, 2",))
  assert parse_action("anything(x)") == Action("call", "anything", ("x",))  # no tool list
  err = parse_action("foo(1)", tools=tools)
  assert err.kind == "malformed" and err.error == "unknown tool foo; tools: lookup, add, answer"
  assert parse_action("add(1)", tools=tools).error == "add takes 2 args, got 1"
  assert parse_action("lookup(a, b)", tools=tools).error == "lookup takes 1 arg, got 2"
  for text in ("", "lookup", "lookup(ann", "Lookup(x)", "answer()", "add(1,2))", "add((1,2)",
               "x" * 200, f"lookup(a{UNKNOWN_CHAR})x", "answer(1)answer(2)", "\n\n"):
    act = parse_action(text, tools=tools)
    assert act.kind == "malformed" and act.error and not act.ok, text
  long = parse_action("abcdefghijklmnop(1)", tools=tools)
  assert "abcdefgh;" in long.error and "abcdefghi" not in long.error
  fmt = ToolFormat("<tool>", "</tool>")
  assert parse_action("<tool>calc(4*5)</tool>", fmt, {"calc": 1}) == Action("call", "calc",
                                                                            ("4*5",))
  assert parse_action("calc(4*5)", fmt, {"calc": 1}).error == "write <tool>tool(args)</tool>"
  assert fmt.call("add", "1", "2") == "<tool>add(1, 2)</tool>"
  assert fmt.answer("7") == "<tool>answer(7)</tool>"
  assert doctest.testmod(tools_mod).failed == 0


# --- both tasks -----------------------------------------------------------------------

@pytest.mark.parametrize("name", TASKS)
def test_determinism(name):
  task = get_task(name)
  a = task.generate(np.random.default_rng(3), 20)
  b = task.generate(np.random.default_rng(3), 20)
  assert a == b and a != task.generate(np.random.default_rng(4), 20)
  for ex in a[:5]:
    eps = [run_episode(task.make_env(ex), task.demonstration_turns(ex)) for _ in range(2)]
    assert _results(eps[0]) == _results(eps[1])


@pytest.mark.parametrize("name", TASKS)
def test_demonstrations_solve_the_task(name):
  task = get_task(name)
  assert task.multi_turn and getattr(envs, type(task).__name__) is type(task)
  for ex in task.generate(np.random.default_rng(0), 50):
    turns = task.demonstration_turns(ex)
    assert 2 <= len(turns) <= min(task.max_turns, 4)
    assert turns[-1] == task.demonstration(ex)
    assert task.verify(ex, task.demonstration(ex)) == 1.0
    assert task.verify(ex, "answer(x" + ex["answer"] + ")") == 0.0
    assert task.verify(ex, ex["answer"]) == 0.0  # not an answer turn
    env = task.make_env(ex)
    ep = run_episode(env, turns)
    assert ep.outcome == 1.0 and ep.results[-1].done and ep.results[-1].progress == 1.0
    assert env.gold_answer == turns[-1] and env.first_error_turn() == -1
    assert all(not r.done for r in ep.results[:-1])
    assert [r.reward for r in ep.results] == [1.0] * (len(turns) - 1) + [0.0]
    progress = [r.progress for r in ep.results]
    assert progress == sorted(progress) and progress[0] > 0.0
    assert all(r.info["correct"] and r.info["valid"] for r in ep.results)
    roles = [r.role for r in ep.results]  # multidoc: the answer is the synthesis turn
    assert roles == [0] * (len(turns) - 1) + [int(name == "multidoc")]
    assert all(t in r.info["gold_calls"] for t, r in zip(turns, ep.results))


@pytest.mark.parametrize("name", TASKS)
def test_bad_actions_give_error_observations(name):
  task = get_task(name)
  ex = task.generate(np.random.default_rng(1), 1)[0]
  env = task.make_env(ex, Limits(max_turns=20, max_observation_chars=100))
  assert env.reset() == ex["prompt"]
  for text in ("hello", "foo(1)", "lookup(a, b, c)" if name == "lookup" else "calc(1, 2)",
               "lookup(a)" if name == "lookup" else "calc(3+4*2)", "answer()", "",
               f"calc({UNKNOWN_CHAR})", "lookup(Ann Boss)", "calc(-1+2)", "read(0)", "read(x)",
               "read(\u00b2)"):
    res = env.step(text)
    assert res.observation.startswith("error: ") and not res.done, (text, res)
    assert res.reward == 0.0 and res.progress == 0.0 and not res.info["correct"]
    assert not res.info["valid"] and set(res.observation) <= ALLOWED
  unknown = env.step("search(x)")
  assert unknown.observation == (
      f"error: unknown tool search; tools: {TOOL[name]}, answer")
  assert env.first_error_turn() == 0 and env.outcome() == 0.0 and env.progress == 0.0


@pytest.mark.parametrize("name", TASKS)
def test_limits(name):
  task = get_task(name)
  ex = task.generate(np.random.default_rng(2), 1)[0]
  env = task.make_env(ex)
  assert env.limits == Limits(max_turns=task.max_turns,
                              max_observation_chars=task.max_observation_chars)
  env.reset()
  results = [env.step("nothing") for _ in range(task.max_turns)]
  assert [r.done for r in results] == [False] * (task.max_turns - 1) + [True]
  assert results[-1].observation == "" and env.num_turns == task.max_turns
  assert env.done and env.outcome() == 0.0
  with pytest.raises(EpisodeDoneError, match="over"):
    env.step(task.demonstration(ex))
  # An answer ends the episode at once.
  env.reset()
  assert env.step(task.demonstration(ex)).done and env.outcome() == 1.0
  # Long observations are cut, with a visible marker.
  short = task.make_env(ex, Limits(max_turns=3, max_observation_chars=10))
  short.reset()
  res = short.step("foo(1)")
  assert res.observation == "error: ..." and res.info["truncated"]
  assert Limits(max_observation_chars=2).truncate("abcdef") == ".."
  assert Limits().truncate("x" * 500) == "x" * 500
  with pytest.raises(RuntimeError, match="reset"):
    task.make_env(ex).step("x")
  with pytest.raises(ValueError):
    Limits(max_turns=0)


@pytest.mark.parametrize("name", TASKS)
def test_snapshot_restore_replays(name):
  task = get_task(name)
  ex = task.generate(np.random.default_rng(5), 1)[0]
  env = task.make_env(ex)
  env.reset()
  first = env.step(task.demonstration_turns(ex)[0])
  snap = env.snapshot()
  rest = task.demonstration_turns(ex)[1:]
  conts = {"demo": rest, "bad": ["foo(1)", "answer(zz)"], "answer": [task.demonstration(ex)]}
  played = {}
  for key, acts in conts.items():
    env.restore(snap)
    played[key] = [tuple(env.step(a)[:5]) for a in acts] + [env.outcome(), env.num_turns]
  for key, acts in conts.items():
    env.restore(snap)
    assert [tuple(env.step(a)[:5]) for a in acts] + [env.outcome(), env.num_turns] == played[key]
  assert played["demo"][-2] == 1.0 and played["bad"][-2] == 0.0
  env.restore(snap)
  assert env.num_turns == 1 and not env.done and env.progress == first.progress
  with pytest.raises(TypeError):
    env.restore("nope")


@pytest.mark.parametrize("name", TASKS)
def test_env_batch(name):
  task = get_task(name)
  exs = task.generate(np.random.default_rng(6), 2)
  batch = EnvBatch.from_examples(task, exs, repeat=2)
  assert len(batch) == 4 and batch.group_id.tolist() == [0, 0, 1, 1]
  prompts = batch.reset()
  assert prompts == [exs[0]["prompt"]] * 2 + [exs[1]["prompt"]] * 2
  demos = [task.demonstration_turns(exs[b // 2]) for b in range(4)]
  out = batch.step([demos[0][0], None, "foo(1)", demos[3][0]])
  assert out[1] is None and out[0].reward == 1.0 and out[2].observation.startswith("error")
  assert batch.num_turns.tolist() == [1, 0, 1, 1]
  out = batch.step([demos[0][-1], None, None, demos[3][-1]])  # rows 0 and 3 answer
  assert batch.done.tolist() == [True, False, False, True]
  assert batch.outcomes().tolist() == [1.0, 0.0, 0.0, 1.0] and batch.outcomes().dtype == np.float32
  snap = batch.snapshot()
  assert batch.step(["answer(1)"] * 4)[0] is None  # done rows are skipped
  fields = batch.turn_fields(task.max_turns)
  assert fields["step_mask"].tolist()[1] == [True] + [False] * (task.max_turns - 1)
  batch.restore(snap)
  assert batch.num_turns.tolist() == [2, 0, 1, 2]
  fields = batch.turn_fields(3)
  assert fields["step_mask"].tolist() == [[True, True, False], [False] * 3,
                                          [True, False, False], [True, True, False]]
  assert fields["step_reward"][0, 0] == 1.0 and fields["step_reward"][2, 0] == 0.0
  assert fields["turn_progress"][0, 1] == out[0].progress and fields["turn_role"].dtype == np.int32
  with pytest.raises(ValueError):
    batch.turn_fields(1)
  with pytest.raises(ValueError):
    batch.step(["x"])
  # A collated batch of columns works too.
  cols = {"prompt": [e["prompt"] for e in exs], "answer": [e["answer"] for e in exs],
          **{k: np.asarray([e[k] for e in exs]) for k in task.int_fields}}
  assert EnvBatch.from_examples(task, cols).reset() == [e["prompt"] for e in exs]


@pytest.mark.parametrize("name", TASKS)
def test_texts_use_the_char_vocabulary(name):
  task = get_task(name)
  for ex in task.generate(np.random.default_rng(7), 300):
    assert set(ex["prompt"]) <= ALLOWED and set(ex["answer"]) <= ALLOWED
    assert len(ex["prompt"]) <= task.max_prompt_chars
    turns = task.demonstration_turns(ex)
    assert all(set(t) <= ALLOWED and len(t) <= task.max_action_chars for t in turns)
    ep = run_episode(task.make_env(ex), turns)
    for r in ep.results:
      assert set(r.observation) <= ALLOWED
      assert len(r.observation) <= task.max_observation_chars and not r.info["truncated"]
  assert task.max_response_chars == task.max_action_chars


@pytest.mark.parametrize("name", TASKS)
def test_tfds_dataset(tmp_path, name):
  task = get_task(name)
  build_task_dataset(name, tmp_path, **SIZES)
  source = task_data_source(name, "test", tmp_path, **SIZES)
  assert source[:] == task.generate(np.random.default_rng([0, 1]), SIZES["test_size"])
  for ex in source[:4]:
    ep = run_episode(task.make_env(ex), task.demonstration_turns(ex))
    assert ep.outcome == 1.0
  other = get_task(name, extra_turns=2)
  src = task_data_source(other, "train", tmp_path, **SIZES)
  assert len(src) == SIZES["train_size"] and as_example(src[0]) == src[0]


# --- task specifics -------------------------------------------------------------------

def test_lookup_rewards_and_info():
  task = get_task("lookup", min_hops=2, max_hops=2, num_distractors=6)
  ex = task.generate(np.random.default_rng(8), 1)[0]
  w = task.world(ex["world_seed"])
  (a, r1, b), (_, r2, c) = w.chain
  assert ex["prompt"] == f"{r2} of {r1} of {a}?" and ex["answer"] == c and ex["hops"] == 2
  assert len(w.facts) == 2 + 6
  env = task.make_env(ex, Limits(max_turns=8))
  env.reset()
  # The second hop looked up first still reveals a gold fact.
  res = env.step(f"lookup({b} {r2})")
  assert (res.observation, res.reward, res.progress) == (f"{b} {r2}: {c}", 1.0, 0.5)
  assert res.info["gold_revealed"] == (1,) and res.info["gold_calls"] == (f"lookup({a} {r1})",)
  again = env.step(f"lookup({b} {r2})")
  assert again.reward == 0.0 and again.progress == 0.5 and not again.info["correct"]
  (ds, dr), dv = next((k, v) for k, v in w.facts.items() if (k[0], k[1], v) not in w.chain)
  dis = env.step(f"lookup({ds} {dr})")
  assert dis.observation == f"{ds} {dr}: {dv}" and dis.reward == 0.0
  assert dis.info["revealed"] == (ds, dr, dv) and dis.info["gold_revealed"] == ()
  missing = env.step("lookup(zzz boss)")
  assert missing.observation == "zzz boss: none" and missing.info["revealed"] is None
  env2 = task.make_env(ex)
  env2.reset()
  assert env2.step(f"answer({c})").done and env2.outcome() == 1.0  # a lucky guess
  env2.reset()
  assert env2.step(f"answer( {c} )").info["correct"] and env2.outcome() == 1.0
  with pytest.raises(ValueError, match="not generated"):
    task.make_env({**ex, "prompt": "boss of bob?"})
  with pytest.raises(ValueError):
    get_task("lookup", min_hops=3, max_hops=2)


def test_calculator_worked_example():
  task = get_task("calculator")
  ex = {"prompt": "(3+4)*2-5=?", "answer": "9", "num_ops": 3}
  assert task.demonstration_turns(ex) == ["calc(3+4)", "calc(7*2)", "calc(14-5)", "answer(9)"]
  env = task.make_env(ex)
  assert env.reset() == ex["prompt"] and env.gold_answer == "answer(9)"
  wrong = env.step("calc(4*2)")  # computed, but not a reduction of this expression
  assert (wrong.observation, wrong.reward, wrong.progress) == ("8; now (3+4)*2-5", 0.0, 0.0)
  assert wrong.info["value"] == 8 and wrong.info["gold_calls"] == ("calc(3+4)",)
  assert env.first_error_turn() == 0
  ok = env.step("calc(4+3)")  # + commutes
  assert (ok.observation, ok.reward, ok.progress) == ("7; now 7*2-5", 1.0, 1 / 3)
  assert env.step("calc(7 * 2)").observation == "14; now 14-5"
  assert env.step("calc(5-14)").reward == 0.0  # - does not commute
  assert env.first_error_turn() == 0
  final = env.step("answer(9)")
  assert final.done and final.progress == 2 / 3 and env.outcome() == 1.0  # max_turns = 5
  # Several reducible operations: each is a gold call; the first error is turn 1 here.
  ex2 = {"prompt": "(1+2)*(6-4)=?", "answer": "6", "num_ops": 3}
  env = task.make_env(ex2, Limits(max_turns=6))
  env.reset()
  res = env.step("calc(6-4)")
  assert res.info["gold_calls"] == ("calc(1+2)", "calc(6-4)") and res.reward == 1.0
  assert res.observation == "2; now (1+2)*2"
  assert env.step("calc(3*2)").reward == 0.0 and env.first_error_turn() == 1
  assert env.step("answer(06)").info["correct"] is False and env.outcome() == 0.0
  plain = get_task("calculator", show_state=False).make_env(ex)
  plain.reset()
  assert plain.step("calc(3+4)").observation == "7"


def test_calculator_expressions_round_trip():
  task = get_task("calculator", min_ops=1, max_ops=4, max_operand=12)
  for ex in task.generate(np.random.default_rng(9), 200):
    tree = task.tree(ex)
    assert calc_mod.render(tree) + "=?" == ex["prompt"]
    assert calc_mod.evaluate(tree) == int(ex["answer"]) >= 0
    assert calc_mod.count_ops(tree) == ex["num_ops"]
    assert len(ex["prompt"]) <= task.max_prompt_chars
    assert all(len(t) <= task.max_action_chars for t in task.demonstration_turns(ex))
  assert calc_mod.render(("-", 9, ("+", 3, 1))) == "9-(3+1)"
  assert calc_mod.render(("*", ("+", 1, 2), ("*", 3, 4))) == "(1+2)*(3*4)"
  assert calc_mod.parse("9-3-1") == ("-", ("-", 9, 3), 1)
  assert calc_mod.parse("2+3*4") == ("+", 2, ("*", 3, 4))
  for bad in ("2+", "(2+3", "2+3)", "2x3"):
    with pytest.raises(ValueError):
      calc_mod.parse(bad)


def test_multidoc_documents_roles_and_cuts():
  task = get_task("multidoc", min_hops=3, max_hops=3, num_docs=5)
  ex = task.generate(np.random.default_rng(10), 1)[0]
  world, docs, where = task.documents(ex["world_seed"])
  assert ex["prompt"] == f"5 docs. {world.question}" and len(docs) == 5
  assert sorted(where) == [0, 1, 2] and len(set(where.values())) == 3
  for i, (s, r, o) in enumerate(world.chain):
    assert f"{s} {r}: {o}." in docs[where[i]]
  other = next(j for j in range(5) if j not in where.values())
  env = task.make_env(ex)
  env.reset()
  res = env.step(f"read({other + 1})")
  assert (res.observation, res.reward, res.progress, res.role) == (docs[other], 0.0, 0.0, 0)
  assert res.info["doc"] == other + 1 and not res.info["correct"]
  assert res.info["gold_calls"] == tuple(f"read({where[i] + 1})" for i in range(3))
  last = env.step(f"read({where[2] + 1})")  # any order
  assert last.reward == 1.0 and last.progress == 1 / 3 and last.info["gold_revealed"] == (2,)
  ans = env.step(f"answer({world.answer})")
  assert ans.done and ans.role == 1 and env.outcome() == 1.0
  # A document cut before its gold fact reveals nothing.
  cut = task.make_env(ex, Limits(max_turns=4, max_observation_chars=8))
  cut.reset()
  res = cut.step(f"read({where[0] + 1})")
  assert len(res.observation) == 8 and res.observation.endswith("...") and res.reward == 0.0
  assert res.info["truncated"] and res.info["gold_revealed"] == ()
  with pytest.raises(ValueError):
    get_task("multidoc", num_docs=2)


def test_imperfect_demonstrators_slip_where_documented():
  from credit.envs.rollout import demonstration_episode
  rng = np.random.default_rng(0)
  # lookup: a 2-hop question answered right after the first lookup, with its name.
  task = get_task("lookup", min_hops=2, max_hops=2, demo_early_answer=1.0)
  for ex in task.generate(np.random.default_rng(1), 5):
    _, acts, obs = demonstration_episode(task, ex, rng=rng)
    assert len(acts) == 2 and acts[0].startswith("lookup(")
    assert acts[1] == f"answer({obs[0].split(': ')[1]})"
    env = task.make_env(ex)
    env.reset()
    assert [env.step(a).reward for a in acts] == [1.0, 0.0] and env.outcome() == 0.0
    assert task.demonstration_turns(ex) == task.demonstration_turns(ex, rng=None)  # no rng: right
  # calculator: multi-digit operands copied with their first digit, the wrong value carried.
  task = get_task("calculator", demo_truncate=1.0)
  seen = 0
  for ex in task.generate(np.random.default_rng(2), 40):
    _, acts, _ = demonstration_episode(task, ex, rng=rng)
    env = task.make_env(ex)
    env.reset()
    rewards = [env.step(a).reward for a in acts[:-1]]
    env.step(acts[-1])
    right = task.demonstration_turns(ex)
    if acts == right:  # no multi-digit operand: the demonstration is the right one
      assert env.outcome() == 1.0
      continue
    seen += 1
    first = next(i for i, (a, b) in enumerate(zip(acts, right)) if a != b)
    assert rewards[:first] == [1.0] * first and all(r == 0.0 for r in rewards[first:])
    assert env.outcome() == 0.0
  assert seen >= 5
