"""Tests for credit.tasks: tokenizer, tasks, verifiers, tfds datasets, grain loader, user data."""
import json
import os
import subprocess
import sys
from fractions import Fraction

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from credit import tasks as ct
from credit.tasks import char_tokenizer as tok_lib

TASK_VARIANTS = [
    ("arithmetic", {}),
    ("arithmetic", {"min_digits": 1, "max_digits": 4, "ops": "+-*", "allow_negative": False}),
    ("chain", {}),
    ("chain", {"min_operands": 2, "max_operands": 4, "min_digits": 2, "ops": "+"}),
    ("countdown", {}),
    ("countdown", {"num_numbers": 3, "max_number": 50, "max_target": 200, "ops": "+-*"}),
    ("countdown", {"require_all": True}),
    ("pivotal", {}),
    ("pivotal", {"response_len": 12, "shift": 0, "filler": "xyz"}),
    ("program", {}),
    ("program", {"family": "mixed", "max_coef": 5, "test_inputs": (2, 5, 0, 1, 11), "shown": 2}),
]
TOK = ct.CharTokenizer()


def _examples(name, kwargs, n=200, seed=0):
  task = ct.get_task(name, **kwargs)
  return task, task.generate(np.random.default_rng(seed), n)


# ---------------------------------------------------------------- tokenizer


def test_tokenizer_vocabulary():
  assert TOK.vocab_size < 64
  assert (TOK.pad_id, TOK.bos_id, TOK.eos_id) == (0, 1, 2)
  ids = TOK.encode(TOK.chars)
  assert ids == list(range(3, TOK.vocab_size))
  assert hash(TOK) == hash(ct.CharTokenizer())  # usable as a static jit argument
  with pytest.raises(ValueError, match="'#' at position 2"):
    TOK.encode("12#")


@hypothesis.given(st.text(alphabet=tok_lib.DEFAULT_CHARS, max_size=20))
def test_tokenizer_round_trip(text):
  assert TOK.decode(TOK.encode(text)) == text
  assert TOK.decode(TOK.encode(text, add_bos=True, add_eos=True)) == text


def test_tokenizer_decode_stops_at_eos_and_skips_pad():
  ids = [TOK.bos_id] + TOK.encode("12") + [TOK.pad_id] + TOK.encode("3") + [TOK.eos_id]
  assert TOK.decode(ids + TOK.encode("999")) == "123"
  assert TOK.decode(np.asarray(ids, np.int32)) == "123"
  assert TOK.decode([TOK.eos_id] + TOK.encode("7")) == ""
  assert TOK.decode(TOK.encode("ab") + [TOK.vocab_size + 5]) == "ab" + tok_lib.UNKNOWN_CHAR


@pytest.mark.parametrize("name,kwargs", TASK_VARIANTS)
def test_task_text_round_trips_through_tokenizer(name, kwargs):
  _, examples = _examples(name, kwargs, n=50)
  for e in examples:
    for text in (e["prompt"], e["answer"]):
      assert TOK.decode(TOK.encode(text, add_eos=True)) == text


def test_encode_prompts_left_pads():
  tokens, mask = ct.encode_prompts(TOK, ["1+2=", "12+345="], max_len=10)
  assert tokens.dtype == np.int32 and mask.dtype == bool and tokens.shape == (2, 10)
  np.testing.assert_array_equal(mask.sum(1), [5, 8])  # bos + characters
  np.testing.assert_array_equal(mask[0], [False] * 5 + [True] * 5)
  assert tokens[0, 5] == TOK.bos_id and tokens[1, 2] == TOK.bos_id
  assert np.all(tokens[~mask] == TOK.pad_id)
  assert tokens[0, -1] == tokens[1, -1] == TOK.encode("=")[0]  # prompts end in one column
  assert TOK.decode(tokens[1]) == "12+345="
  with pytest.raises(ValueError, match="Row 1 has 8 tokens"):
    ct.encode_prompts(TOK, ["1+2=", "12+345="], max_len=7)
  tokens, mask = ct.encode_prompts(TOK, ["1+2="], max_len=4, add_bos=False)
  assert mask.all() and TOK.decode(tokens[0]) == "1+2="


@hypothesis.given(st.lists(st.tuples(st.text(alphabet="0123456789+-=", min_size=1, max_size=6),
                                     st.text(alphabet="0123456789abc", max_size=5)),
                           min_size=1, max_size=4))
def test_encode_prompt_response_and_decode_responses(pairs):
  prompts, responses = [p for p, _ in pairs], [r for _, r in pairs]
  batch = ct.encode_prompt_response(TOK, prompts, responses, max_prompt_len=7,
                                    max_response_len=7)
  tokens, p_mask, r_mask = batch["tokens"], batch["prompt_mask"], batch["response_mask"]
  assert tokens.shape == p_mask.shape == r_mask.shape == (len(pairs), 14)
  assert not np.any(p_mask & r_mask)
  assert not np.any(p_mask[:, 7:]) and not np.any(r_mask[:, :7])
  np.testing.assert_array_equal(r_mask.sum(1), [len(r) + 1 for r in responses])  # + eos
  assert ct.decode_responses(TOK, tokens, r_mask) == responses
  assert ct.decode_responses(TOK, tokens, p_mask) == prompts
  # Junk after eos (as a sampler that keeps going would leave) is ignored; the
  # last column is always past eos (responses have at most 5 characters + eos).
  junk = tokens.copy()
  junk[:, -1] = TOK.encode("9")[0]
  assert ct.decode_responses(TOK, junk, r_mask | (np.arange(14) == 13)) == responses


# ---------------------------------------------------------------- registry


def test_registry():
  assert set(ct.list_tasks()) >= {"arithmetic", "countdown", "pivotal"}
  with pytest.raises(ct.UnknownTaskError, match=r"Did you mean \['countdown'\].*arithmetic"):
    ct.get_task("countdwn")
  with pytest.raises(TypeError, match="no option.*'digits'.*max_digits"):
    ct.get_task("arithmetic", digits=3)
  assert ct.get_task("arithmetic", max_digits=4) == ct.Arithmetic(max_digits=4)
  with pytest.raises(ValueError):
    ct.get_task("arithmetic", ops="+^")


# ---------------------------------------------------------------- all tasks


@pytest.mark.parametrize("name,kwargs", TASK_VARIANTS)
def test_generate_is_deterministic_per_seed(name, kwargs):
  _, a = _examples(name, kwargs, n=64, seed=3)
  _, b = _examples(name, kwargs, n=64, seed=3)
  _, c = _examples(name, kwargs, n=64, seed=4)
  assert a == b
  assert a != c
  assert len({e["prompt"] for e in a}) > 20  # not a constant generator


@pytest.mark.parametrize("name,kwargs", TASK_VARIANTS)
def test_demonstrations_verify_and_fit_bounds(name, kwargs):
  task, examples = _examples(name, kwargs)
  for e in examples:
    demo = task.demonstration(e)
    assert task.verify(e, demo) == 1.0, (e, demo)
    if name != "pivotal":  # surrounding whitespace is ignored (pivotal positions are absolute)
      assert task.verify(e, f" {demo}\n") == 1.0
    assert len(e["prompt"]) <= task.max_prompt_chars
    assert len(demo) <= task.max_response_chars
    assert set(task.int_fields) <= set(e)
    for key, shape in task.int_fields.items():
      assert np.shape(e[key]) == shape
  if name != "countdown":  # the bound is attained (countdown's is loose: distinct digit counts)
    assert max(len(e["prompt"]) for e in examples) == task.max_prompt_chars


@pytest.mark.parametrize("name,kwargs", TASK_VARIANTS)
def test_obviously_wrong_responses_score_zero(name, kwargs):
  task, examples = _examples(name, kwargs, n=50)
  for e in examples:
    demo = task.demonstration(e)
    wrong = ["", "xyz", "((", "=" + demo]
    if name == "arithmetic":
      wrong += [str(int(demo) + 1), demo + "0", "+" + demo, demo + "="]
    if name == "chain":
      reasoning, answer = demo.split("=")
      wrong += [reasoning, answer, reasoning + "=" + str(int(answer) + 1),
                reasoning + "=0" + answer, reasoning + "=+" + answer, demo + "=",
                reasoning + ";=" + answer, "x" + demo]
    if name == "countdown":
      wrong += [demo + "+1", f"({demo})*2", demo + "+", "(" + demo]
    if name == "program":
      wrong += [demo + "+1", f"({demo})*2", demo + "+", "f(x)", "x/0", demo + "/0"]
    if name == "pivotal":
      p = e["pivot_position"]
      wrong += [demo[:p]]  # too short to reach the pivot
    for w in wrong:
      assert task.verify(e, w) == 0.0, (e, w)


def test_verify_batch_on_loader_batches():
  task, examples = _examples("arithmetic", {}, n=8)
  batch = ct.collate(examples)
  responses = [e["answer"] if i % 2 else "0x" for i, e in enumerate(examples)]
  rewards = ct.verify_batch(task, batch, responses)
  assert rewards.dtype == np.float32
  np.testing.assert_array_equal(rewards, [i % 2 for i in range(8)])
  np.testing.assert_array_equal(ct.verify_batch(task, examples, responses), rewards)
  with pytest.raises(ValueError, match="8 examples but 7"):
    ct.verify_batch(task, examples, responses[:7])


# ---------------------------------------------------------------- arithmetic


def test_arithmetic_answers_match_python():
  task, examples = _examples("arithmetic", {"ops": "+-*", "min_digits": 2, "max_digits": 3})
  ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
  seen_ops, seen_digits = set(), set()
  for e in examples:
    body = e["prompt"][:-1]
    op = next(c for c in "+-*" if c in body[1:])
    a, b = body.split(op)
    seen_ops.add(op)
    seen_digits |= {len(a), len(b)}
    assert e["answer"] == str(ops[op](int(a), int(b)))
  assert seen_ops == {"+", "-", "*"} and seen_digits == {2, 3}
  _, examples = _examples("arithmetic", {"ops": "-", "allow_negative": False})
  assert all(not e["answer"].startswith("-") for e in examples)


@pytest.mark.parametrize("prompt,slip", [
    ("47+38=", 75), ("12+13=", None), ("67+58=", 15), ("55+45=", 90), ("56+45=", 91), ("91+12=", 3),
    ("52-38=", 26), ("38-52=", -26), ("50-38=", 28), ("58-32=", None), ("32-58=", None),
    ("7+8=", 5), ("7*8=", None)])
def test_forgotten_carry(prompt, slip):
  assert ct.arithmetic.forgotten_carry(prompt) == slip


def test_imperfect_demonstrator_forgets_carries_at_its_rate():
  task = ct.Arithmetic(max_digits=2, demo_carry_error=0.7)
  examples = task.generate(np.random.default_rng(0), 4000)
  rng = np.random.default_rng(1)
  carry = [e for e in examples if ct.arithmetic.forgotten_carry(e["prompt"]) is not None]
  plain = [e for e in examples if ct.arithmetic.forgotten_carry(e["prompt"]) is None]
  assert 0.55 < len(carry) / len(examples) < 0.65
  # Problems without a carry are always demonstrated right; carries are forgotten at ~70%.
  assert all(task.verify(e, task.demonstration(e, rng)) == 1.0 for e in plain)
  wrong = np.mean([task.verify(e, task.demonstration(e, rng)) == 0.0 for e in carry])
  assert abs(wrong - 0.7) < 0.04
  # Without an rng (or with demo_carry_error=0) the demonstration is the answer.
  assert all(task.demonstration(e) == e["answer"] for e in carry)
  exact = ct.Arithmetic(max_digits=2)
  assert all(exact.demonstration(e, rng) == e["answer"] for e in carry)
  with pytest.raises(ValueError, match="demo_carry_error"):
    ct.Arithmetic(demo_carry_error=1.5)


# ---------------------------------------------------------------- chain


def test_chain_format_and_answers():
  task, examples = _examples("chain", {"min_operands": 2, "max_operands": 4})
  assert task.answer_marker == "=" and task.verify({"answer": "41"}, "46,41=41") == 1.0
  seen_n = set()
  for e in examples:
    terms = e["prompt"][:-1].replace("-", "+-").split("+")
    values = [int(t) for t in terms]
    sums = np.cumsum(values).tolist()
    assert min(sums) >= 0 and e["answer"] == str(sums[-1])  # no negative running sum
    assert task.demonstration(e) == ",".join(map(str, sums[1:])) + "=" + str(sums[-1])
    assert ct.chain.running_sums(e["prompt"]) == sums
    seen_n.add(len(values))
  assert seen_n == {2, 3, 4}
  e = {"prompt": "12+34-5=", "answer": "41"}
  assert task.demonstration(e) == "46,41=41"
  with pytest.raises(ValueError, match="not a chain prompt"):
    ct.chain.running_sums("12*3=")


@pytest.mark.parametrize("response,reward", [
    ("46,41=41", 1.0), (" 46,41=41\n", 1.0), ("=41", 1.0),
    ("45,40=41", 1.0),  # the reasoning's values are not checked: the reward is the outcome
    ("46,41=40", 0.0), ("46,41", 0.0), ("41", 0.0), ("46,41=041", 0.0), ("46,41=+41", 0.0),
    ("46,41=41=41", 0.0), ("46;41=41", 0.0), ("46,,41=41", 0.0), ("a=41", 0.0), ("", 0.0),
    ("46,-41=41", 1.0)])
def test_chain_verify(response, reward):
  assert ct.Chain().verify({"prompt": "12+34-5=", "answer": "41"}, response) == reward


@pytest.mark.parametrize("response,want", [
    ("46,41=41", "........."), ("46,40=40", "....#####"), ("46,41", ".....#"),
    ("56,51=51", "#########"), ("46,41=41=", "........##")])
def test_chain_flags_from_the_first_wrong_character(response, want):
  flags = ct.Chain().flag_chars({"prompt": "12+34-5=", "answer": "41"}, response)
  assert "".join("#" if f else "." for f in flags) == want


def test_chain_imperfect_demonstrator_slips_and_carries_the_slip_on():
  task = ct.Chain(demo_carry_error=1.0)
  rng = np.random.default_rng(0)
  # 12+39 forgets the units carry (41), and the answer follows the slipped sum; every step
  # with a carry or a borrow slips at rate 1 (41-5 -> 44).
  assert task.demonstration({"prompt": "12+39-1=", "answer": "50"}, rng) == "41,40=40"
  assert task.demonstration({"prompt": "12+39-5=", "answer": "46"}, rng) == "41,44=44"
  assert task.demonstration({"prompt": "12+34-5=", "answer": "41"}, rng) == "46,41=41"
  task = ct.Chain(demo_carry_error=0.7, max_operands=4)
  examples = task.generate(np.random.default_rng(1), 2000)
  demos = [task.demonstration(e, rng) for e in examples]
  wrong = [task.verify(e, d) == 0.0 for e, d in zip(examples, demos)]
  assert 0.4 < np.mean(wrong) < 0.8
  for e, d in zip(examples, demos):
    reasoning, answer = d.split("=")
    assert reasoning.split(",")[-1] == answer  # consistent with its own reasoning
    assert len(d) <= task.max_response_chars
  assert all(task.demonstration(e) == ct.Chain().demonstration(e) for e in examples)
  with pytest.raises(ValueError, match="demo_carry_error"):
    ct.Chain(demo_carry_error=-0.1)
  with pytest.raises(ValueError, match="ops"):
    ct.Chain(ops="-")


@pytest.mark.parametrize("response,rewards,span,rubric", [
    ("46,41=41", [1, 1], "000111111", [1, 1]),
    ("45,41=41", [0, 1], "000111111", [0, 1]),
    (" 46,41=41\n", [1, 1], "-0001111111", [1, 1]),  # leading space: no span
    ("=41", [0, 1], "1111", [0, 0]),  # verified, but no reasoning: no rubric item met
    ("46,40=41", [1, 1], "000111111", [1, 0]),
    ("46", [1, 0], "001", [0, 0]),  # no marker: the answer fails, and no rubric
    ("46,41,3=41", [1, 1], "000111-1111", [1, 1]),  # a field past the chain: no span
    ("", [0, 0], "1", [0, 0])])
def test_chain_subproblems_and_rubric(response, rewards, span, rubric):
  task, e = ct.Chain(), {"prompt": "12+34-5=", "answer": "41"}
  got_r, got_span = task.subproblems(e, response)
  assert got_r == rewards and task.rubric(e, response) == rubric
  assert "".join("-" if v < 0 else str(v) for v in got_span) == span
  assert task.num_subproblems == task.num_rubric_items == 2


def test_chain_subproblems_on_demonstrations():
  task, examples = _examples("chain", {"min_operands": 2, "max_operands": 4}, n=50)
  for e in examples:
    demo = task.demonstration(e)
    rewards, span = task.subproblems(e, demo)
    n = len(ct.chain.running_sums(e["prompt"]))
    assert rewards == [1.0] * (n - 1) and task.rubric(e, demo) == [1.0] * (n - 1)
    assert len(span) == len(demo) + 1 and span.min() == 0 and span.max() == n - 2


# ---------------------------------------------------------------- program


@pytest.mark.parametrize("program,x,value,status", [
    ("2*x+1", 3, 7, "ok"), ("x*x+2*x+1", 4, 25, "ok"), (" -x - -3 ", 5, -2, "ok"),
    ("7/2", 0, 3, "ok"), ("-7/2", 0, -4, "ok"),  # floor division
    ("x?f(x-1)+2:1", 5, 11, "ok"), ("x-3?0:1", 3, 1, "ok"), ("(x)", 9, 9, "ok"),
    # hostile candidates: each ends with a clear status, none raises or hangs
    ("f(x)", 1, None, "call depth exceeded"),  # never terminates
    ("f(x+1)", 0, None, "call depth exceeded"),
    ("x?f(x-1)+f(x-1):1", 30, None, "step limit exceeded"),  # 2^30 calls
    ("x/(x-x)", 2, None, "runtime error: division by zero"),
    ("x*x*x*x*x*x*x*x*x*x*x*x", 7, None, "overflow"),
    ("x+*2", 1, None, "syntax error: unexpected '*'"),
    ("x%2", 1, None, "syntax error: unexpected character '%' at 1"),
    ("", 1, None, "syntax error: empty program"),
    ("x?1", 1, None, "syntax error: unexpected end of program"),
    ("f x", 1, None, "syntax error: expected '(', got 'x'"),
    ("2x", 1, None, "syntax error: unexpected 'x' after the expression"),
    ("(" * 80 + "x" + ")" * 80, 1, None, "syntax error: nested deeper than 64"),
    ("-" * 200 + "x", 1, None, "syntax error: nested deeper than 64"),
    ("9" * 12, 1, None, "syntax error: number literal longer than 9 digits")])
def test_program_interpreter(program, x, value, status):
  assert ct.run_program(program, x) == ct.RunResult(value, status)


def test_program_unit_tests_hold_out_inputs():
  task = ct.Program()  # tests at x = 1, 2, 3 (shown), 0, 7 (held out)
  e = {"prompt": "f(1)=3,f(2)=5,f(3)=7;f(x)=", "answer": "2*x+1", "outputs": [3, 5, 7, 1, 15]}
  assert task.generate(np.random.default_rng(0), 1)[0]["prompt"].endswith(";f(x)=")
  assert task.test_pass(e, "2*x+1") == [1.0] * 5 and task.verify(e, "2*x+1") == 1.0
  assert task.test_pass(e, "x?2*x+1:0") == [1, 1, 1, 0, 1]  # wrong at the held-out 0
  assert task.test_pass(e, "x-3?2*x+1:7") == [1, 1, 1, 1, 1]
  assert task.test_pass(e, "x*x-x+3") == [1, 1, 0, 0, 0]
  assert task.verify(e, "x?2*x+1:0") == 0.0
  for bad in ("f(x)", "x/0", "2*x+", "x?f(x-1)+f(x-1):3", "x*99999*99999"):
    assert task.test_pass(e, bad) == [0.0] * 5, bad
  with pytest.raises(ValueError, match="family"):
    ct.Program(family="cubic")
  with pytest.raises(ValueError, match="shown"):
    ct.Program(shown=6)


# ---------------------------------------------------------------- countdown


@pytest.mark.parametrize("text,value,numbers", [
    ("2+3*4", 14, [2, 3, 4]),
    ("(2+3)*4", 20, [2, 3, 4]),
    ("8-4-2", 2, [8, 4, 2]),
    ("8-(4-2)", 6, [8, 4, 2]),
    ("8/4/2", 1, [8, 4, 2]),
    ("8/(4/2)", 4, [8, 4, 2]),
    ("1/3*3", 1, [1, 3, 3]),
    (" ( ( 25 ) ) - 7 * 3 ", 4, [25, 7, 3]),
    ("100", 100, [100]),
])
def test_countdown_parser_precedence(text, value, numbers):
  got, used = ct.evaluate_expression(text)
  assert got == value and used == numbers


@pytest.mark.parametrize("text", [
    "", "2+", "+2", "-2", "2*-3", "(2+3", "2+3)", "()", "2 3", "2**3", "02+1", "2x", "2^3",
    "5/(3-3)", "1/0", "(" * 40 + "1" + ")" * 40,
])
def test_countdown_parser_rejects(text):
  with pytest.raises(ct.ExpressionError):
    ct.evaluate_expression(text)


def _expr_strategy():
  leaf = st.integers(1, 30).map(lambda n: (str(n), f"Fraction({n})"))

  def combine(children):
    return st.tuples(children, st.sampled_from("+-*/"), children, st.booleans()).map(
        lambda t: ((f"({t[0][0]}{t[1]}{t[2][0]})" if t[3] else f"{t[0][0]}{t[1]}{t[2][0]}"),
                   (f"({t[0][1]}{t[1]}{t[2][1]})" if t[3] else f"{t[0][1]}{t[1]}{t[2][1]}")))
  return st.recursive(leaf, combine, max_leaves=6)


@hypothesis.given(_expr_strategy())
def test_countdown_parser_matches_python_on_fractions(pair):
  text, reference = pair
  try:
    expected = eval(reference, {"Fraction": Fraction})  # test-only reference  # noqa: S307
  except ZeroDivisionError:
    with pytest.raises(ct.ExpressionError, match="division by zero"):
      ct.evaluate_expression(text)
    return
  value, used = ct.evaluate_expression(text)
  assert value == expected
  assert used == [int(x) for x in reference.replace("Fraction(", " ").replace(")", " ").replace(
      "(", " ").translate(str.maketrans("+-*/", "    ")).split()]


def test_countdown_number_use_rules():
  task = ct.Countdown()
  ex = {"prompt": "3 5 7 2:15=", "numbers": [3, 5, 7, 2], "target": 15, "answer": "3*5"}
  assert task.verify(ex, "3*5") == 1.0
  assert task.verify(ex, "(7+3)+5") == 1.0
  assert task.verify(ex, "7*2+3-2") == 0.0  # 2 twice, given once
  assert task.verify(ex, "5*3*1") == 0.0  # 1 not given
  assert task.verify(ex, "15") == 0.0  # 15 not given
  assert task.verify(ex, "3*5+7/(2-2)") == 0.0  # division by zero
  assert task.verify(ex, "3*5 = 15") == 0.0  # not an expression
  twice = dict(ex, numbers=[3, 5, 3, 2], prompt="3 5 3 2:15=")
  assert task.verify(twice, "3+3*2") == 0.0 and task.verify(twice, "3*(3+2)") == 1.0
  strict = ct.Countdown(require_all=True)
  assert strict.verify(ex, "3*5") == 0.0  # a subset is not enough
  assert strict.verify(dict(ex, target=12), "7*2+3-5") == 1.0
  assert strict.verify(dict(ex, target=12), "7*2-2") == 0.0  # 2 twice, 3 and 5 unused
  assert strict.verify(dict(ex, target=12), "7*2+3-5+0") == 0.0  # 0 not given
  graded = ct.Countdown(format_reward=0.1)
  assert graded.verify(ex, "3*5+7") == pytest.approx(0.1)
  assert graded.verify(ex, "3*5+8") == 0.0 and graded.verify(ex, "3*") == 0.0
  # Without the int fields the prompt is parsed.
  assert task.verify({"prompt": ex["prompt"]}, "3*5") == 1.0


def test_countdown_solver_and_demonstration_fallback():
  task, examples = _examples("countdown", {}, n=40, seed=5)
  for e in examples:
    found = ct.solve_countdown(e["numbers"], e["target"])
    assert found is not None and task.verify(e, found) == 1.0
    bare = {"prompt": e["prompt"]}
    assert task.verify(e, task.demonstration(bare)) == 1.0
    broken = dict(e, answer="1+1")
    assert task.verify(e, task.demonstration(broken)) == 1.0
  strict = ct.Countdown(require_all=True)
  demo = strict.demonstration({"prompt": "3 5 7 2:13="})
  assert strict.verify({"prompt": "3 5 7 2:13="}, demo) == 1.0
  assert ct.solve_countdown([1, 1, 1, 1], 97) is None
  with pytest.raises(ValueError, match="no solution"):
    task.demonstration({"prompt": "1 1 1 1:97="})


# ---------------------------------------------------------------- pivotal


def test_pivotal_only_the_pivot_matters():
  task, examples = _examples("pivotal", {}, n=40)
  alphabet = tok_lib.DEFAULT_CHARS + tok_lib.UNKNOWN_CHAR
  positions = set()
  for e in examples:
    p, demo = e["pivot_position"], task.demonstration(e)
    positions.add(p)
    assert demo[p] == str((int(e["prompt"].split(":")[1][0]) + 1) % 10)
    assert all(not c.isdigit() for i, c in enumerate(demo) if i != p)
    wrong = demo[:p] + str((e["pivot_value"] + 3) % 10) + demo[p + 1:]
    for i in range(len(demo)):
      for c in alphabet:
        right_i = demo[:i] + c + demo[i + 1:]
        wrong_i = wrong[:i] + c + wrong[i + 1:]
        if i == p:
          expected = float(c == demo[p])
          assert task.verify(e, right_i) == expected and task.verify(e, wrong_i) == expected
        else:
          assert task.verify(e, right_i) == 1.0 and task.verify(e, wrong_i) == 0.0
    # Length beyond the pivot does not matter.
    assert task.verify(e, demo[:p + 1]) == 1.0 and task.verify(e, demo + "abc") == 1.0
    # The rule can be read from the prompt alone.
    assert task.verify({"prompt": e["prompt"]}, demo) == 1.0
    assert task.verify({"prompt": e["prompt"]}, task.demonstration({"prompt": e["prompt"]})) == 1
  assert positions == set(range(task.response_len))


# ---------------------------------------------------------------- tfds + grain

SIZES = {"train_size": 64, "test_size": 16}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("tfds")
  for name in ("arithmetic", "countdown", "pivotal", "program"):
    ct.build_task_dataset(name, path, **SIZES)
  return path


@pytest.mark.parametrize("name", ["arithmetic", "countdown", "pivotal", "program"])
def test_tfds_builds_and_reads_back_without_tensorflow(data_dir, name):
  import tensorflow_datasets as tfds
  from credit.tasks.credit_tasks import credit_tasks_dataset_builder as cb
  config = cb.make_config(name, **SIZES)
  task = config.make_task()
  for split, stream, n in (("train", 0, 64), ("test", 1, 16)):
    assert ct.task_tfds_name(name, **SIZES) == f"credit_tasks/{config.name}"
    source = tfds.data_source(f"credit_tasks/{config.name}", split=split, data_dir=data_dir,
                              download=False)
    assert len(source) == n
    draw = getattr(task, "generate_eval", task.generate) if split == "test" else task.generate
    expected = draw(np.random.default_rng([0, stream]), n)
    got = [ct.as_example(source[i]) for i in range(n)]
    assert got == expected
    assert all(task.verify(source[i], task.demonstration(source[i])) == 1.0 for i in range(n))
  examples = ct.task_data_source(name, "test", data_dir, **SIZES)
  assert examples[:] == getattr(task, "generate_eval", task.generate)(
      np.random.default_rng([0, 1]), 16)
  assert "tensorflow" not in sys.modules


def test_tfds_configs_separate_settings(data_dir):
  from credit.tasks.credit_tasks import credit_tasks_dataset_builder as cb
  assert cb.make_config("pivotal").name == "pivotal"
  names = {cb.make_config("pivotal", **SIZES).name, cb.make_config("pivotal", seed=1, **SIZES).name,
           cb.make_config("pivotal", response_len=5, **SIZES).name,
           cb.make_config(ct.Pivotal(response_len=5), **SIZES).name}
  assert len(names) == 3  # task object == same options by keyword
  other = ct.task_data_source("pivotal", "train", data_dir, seed=1, **SIZES)
  base = ct.task_data_source("pivotal", "train", data_dir, **SIZES)
  assert len(other) == 64 and other[:] != base[:]
  short = ct.task_data_source(ct.Pivotal(response_len=5), "train", data_dir, **SIZES)
  assert all(len(e["answer"]) == 5 for e in short)
  # All defaults: the predefined config "pivotal" (10k train examples).
  default = ct.task_data_source("pivotal", "test", data_dir)
  assert len(default) == cb.DEFAULT_TEST_SIZE and (data_dir / "credit_tasks" / "pivotal").is_dir()


def _take(it, n):
  return [next(it) for _ in range(n)]


def _assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(np.asarray(x[k]), np.asarray(y[k]))


@pytest.mark.parametrize("num_threads", [0, 2])
def test_loader_state_round_trip(data_dir, num_threads):
  source = ct.task_data_source("countdown", "train", data_dir, **SIZES)
  make = lambda seed: ct.make_loader(source, batch_size=24, seed=seed, num_threads=num_threads)
  it = make(7)  # 64 examples: batches cross epoch boundaries
  first = _take(it, 3)
  state = it.get_state()
  state = json.loads(json.dumps(state))  # checkpointable as JSON
  rest = _take(it, 6)
  resumed = make(7)
  resumed.set_state(state)
  _assert_batches_equal(_take(resumed, 6), rest)
  _assert_batches_equal(_take(make(7), 3), first)
  other_seed = _take(make(8), 3)
  assert [b["prompt"] for b in other_seed] != [b["prompt"] for b in first]
  b = first[0]
  assert len(b["prompt"]) == 24 and b["numbers"].shape == (24, 4) and b["target"].shape == (24,)
  assert ct.verify_batch(ct.Countdown(), b, b["answer"]).tolist() == [1.0] * 24


def test_loader_epochs_and_shards():
  examples = [{"prompt": f"{i}+0=", "answer": str(i)} for i in range(10)]
  one = list(ct.make_loader(examples, 4, seed=0, num_epochs=1, drop_remainder=False))
  assert [len(b["prompt"]) for b in one] == [4, 4, 2]
  assert sorted(sum((b["answer"] for b in one), [])) == sorted(e["answer"] for e in examples)
  two = list(ct.make_loader(examples, 5, seed=0, num_epochs=2))
  first, second = two[0]["answer"] + two[1]["answer"], two[2]["answer"] + two[3]["answer"]
  assert sorted(first) == sorted(second) and first != second  # reshuffled per epoch
  ordered = next(ct.make_loader(examples, 10, seed=0, shuffle=False))
  assert ordered["answer"] == [str(i) for i in range(10)]
  shards = [sum((b["answer"] for b in ct.make_loader(examples, 1, seed=0, num_epochs=1,
                                                      shard_index=i, num_shards=3)), [])
            for i in range(3)]
  assert sorted(sum(shards, []), key=int) == [str(i) for i in range(10)]
  with pytest.raises(ValueError):
    ct.make_loader(examples, 4, seed=0, shard_index=3, num_shards=3)


# ---------------------------------------------------------------- user data


def test_load_jsonl(tmp_path):
  path = tmp_path / "data.jsonl"
  path.write_text('{"question": "1+1=", "solution": 2, "id": 0}\n\n'
                  '{"question": "2+2=", "solution": "4"}\n')
  examples = ct.load_jsonl(path, prompt_field="question", answer_field="solution")
  assert examples == [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]
  with pytest.raises(ct.MissingFieldError) as err:
    ct.load_jsonl(path)
  msg = str(err.value)
  assert str(path) + ":1" in msg and "'prompt'" in msg and "['id', 'question', 'solution']" in msg
  with pytest.raises(KeyError, match=r"data.jsonl:3: no answer field 'solution'.*\['question'\]"):
    path.write_text('{"question": "1", "solution": 2}\n\n{"question": "2"}\n')
    ct.load_jsonl(path, prompt_field="question", answer_field="solution")
  path.write_text('{"prompt": "1", "answer": 2}\n{"prompt": "2", "answer": \n')
  with pytest.raises(ValueError, match="data.jsonl:2: not valid JSON"):
    ct.load_jsonl(path)
  path.write_text('[1, 2]\n')
  with pytest.raises(ValueError, match="data.jsonl:1: expected a JSON object"):
    ct.load_jsonl(path)


def test_load_tfds_user_fields(data_dir):
  name = ct.task_tfds_name("countdown", **SIZES)
  examples = ct.load_tfds(name, "test", data_dir)
  assert len(examples) == 16 and set(examples[0]) == {"prompt", "answer"}
  by_target = ct.load_tfds(name, "test", data_dir, answer_field="target")
  assert by_target[3]["answer"] == str(ct.task_data_source("countdown", "test", data_dir,
                                                           **SIZES)[3]["target"])
  with pytest.raises(ct.MissingFieldError,
                     match=r"split 'test': no prompt field 'question'.*'answer', 'numbers'"):
    ct.load_tfds(name, "test", data_dir, prompt_field="question")
  assert "tensorflow" not in sys.modules


def test_load_tfds_reads_a_dataset_whose_builder_is_not_imported(data_dir):
  """User datasets are read from their files alone (fresh process, builder never imported)."""
  name = ct.task_tfds_name("arithmetic", **SIZES)
  code = (
      "import sys\n"
      "from credit.tasks import data\n"
      f"src = data.load_tfds({name!r}, 'train[:10]', {str(data_dir)!r})\n"
      "assert 'credit.tasks.credit_tasks.credit_tasks_dataset_builder' not in sys.modules\n"
      "assert 'tensorflow' not in sys.modules\n"
      "print(len(src), src[0]['prompt'])\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  first = ct.task_data_source("arithmetic", "train", data_dir, **SIZES)[0]["prompt"]
  assert out.stdout.split() == ["10", first]


def test_math_verifier():
  mv = ct.MathVerifier()
  half = {"prompt": "?", "answer": "\\frac{1}{2}"}
  assert mv.verify(half, "0.5") == 1.0
  assert mv.verify(half, "The answer is \\boxed{0.5}.") == 1.0
  assert mv.verify(half, "$\\frac{2}{4}$") == 1.0
  assert mv.verify(half, "\\boxed{0.25}") == 0.0
  assert mv.verify(half, "no idea") == 0.0
  assert mv.verify({"answer": "0.5"}, "so it is $\\frac12$") == 1.0
  assert mv.verify({"answer": "x^2+1"}, "$1+x^2$") == 1.0
  assert mv.verify({"answer": "3"}, "\\boxed{4}") == 0.0
  assert mv.verify({"answer": b"3"}, mv.demonstration({"answer": "3"})) == 1.0
  mv.validate_examples([half, {"answer": "3"}])
  with pytest.raises(ValueError, match="indices \\[1\\]"):
    mv.validate_examples([half, {"answer": ""}])


def test_math_verifier_unparsable_and_jsonl_formats(tmp_path):
  mv = ct.MathVerifier()
  assert mv.unparsable([{"answer": "3"}, {"answer": ""}, {"answer": "\\text{}"}]) == [1, 2]
  path = tmp_path / "mixed.jsonl"
  path.write_text('{"problem": "p", "solution": "\\\\boxed{\\\\frac{3}{4}}"}\n'
                  '{"question": "q", "answer": "#### 1"}\n')
  with pytest.raises(ct.MissingFieldError, match=r"mixed.jsonl:2 \(math format\)"):
    ct.load_jsonl(path)  # the format is detected once per file, from its first line
  path.write_text('{"question": "q", "answer": "r\\n#### 12,5"}\n')
  assert ct.load_jsonl(path, verifier=mv) == [{"prompt": "q", "answer": "125"}]
