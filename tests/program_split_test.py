"""The program task's held-out functions (credit/tasks/program.py, `eval_function_fraction`)."""
from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from credit import tasks as ct
from credit.tasks.program import FAMILIES, _canonical


def answers(fns) -> set[str]:
  return {_canonical(*f) for f in fns}


def every_function(family, max_coef=3, max_const=9) -> set[str]:
  """The family's target functions, enumerated straight from the ranges."""
  lin = {_canonical(a, b, False) for a in range(1, max_coef + 1) for b in range(max_const + 1)}
  quad = {_canonical(a, b, True) for a in range(max_coef + 1) for b in range(max_const + 1)}
  return {"linear": lin, "quadratic": quad, "mixed": lin | quad}[family]


def old_generate(task, rng, n):
  """The draw before the split (a uniform in its range, b uniform), as a reference."""
  out = []
  for _ in range(n):
    quad = task.family == "quadratic" or (task.family == "mixed" and bool(rng.integers(2)))
    a = int(rng.integers(0 if quad else 1, task.max_coef + 1))
    b = int(rng.integers(0, task.max_const + 1))
    ys = [(v * v if quad else 0) + a * v + b for v in task.test_inputs]
    prompt = ",".join(f"f({v})={y}" for v, y in zip(task.test_inputs[:task.shown], ys))
    out.append({"prompt": prompt + ";f(x)=", "answer": _canonical(a, b, quad), "outputs": ys})
  return out


@pytest.mark.parametrize("family,n_train,n_eval", [("linear", 24, 6), ("quadratic", 32, 8),
                                                   ("mixed", 56, 14)])
def test_split_is_disjoint_complete_and_counted(family, n_train, n_eval):
  task = ct.Program(family=family)  # defaults: max_coef 3, max_const 9, fraction 0.2
  train, held = answers(task.functions("train")), answers(task.functions("eval"))
  assert (len(train), len(held)) == (n_train, n_eval)
  assert not train & held and train | held == every_function(family)
  assert answers(task.functions("all")) == every_function(family)
  # Examples: generate only ever asks for train functions, generate_eval only for eval ones.
  got = {e["answer"] for e in task.generate(np.random.default_rng(0), 600)}
  assert got == train  # 600 draws reach every train function
  ev = task.generate_eval(np.random.default_rng(0), 3 * n_eval + 1)
  counts = {h: sum(e["answer"] == h for e in ev) for h in held}
  assert sorted(set(counts.values())) in ([3, 4], [3]) and sum(counts.values()) == len(ev)
  for e in ev[:20]:  # the examples are those of the functions: demonstrations pass
    assert task.verify(e, task.demonstration(e)) == 1.0


def test_split_is_fixed_and_family_independent():
  lin, quad, mixed = (ct.Program(family=f) for f in FAMILIES)
  assert mixed.functions("eval") == lin.functions("eval") + quad.functions("eval")
  assert mixed.functions("train") == lin.functions("train") + quad.functions("train")
  # No seed enters: a fresh instance (and a run with another seed) holds out the same ones.
  assert ct.Program(family="mixed").functions("eval") == mixed.functions("eval")
  for seed in range(3):
    assert {e["answer"] for e in mixed.generate_eval(np.random.default_rng(seed), 28)} == (
        answers(mixed.functions("eval")))
  # Pinned: the rule (SHA-256 order of the canonical expression) must not drift silently.
  assert sorted(answers(lin.functions("eval"))) == ["2*x+5", "2*x+9", "3*x+7", "3*x+8",
                                                    "x+8", "x+9"]
  # Determinism given the rng, as every task.
  for fn in (mixed.generate, mixed.generate_eval):
    assert fn(np.random.default_rng(5), 30) == fn(np.random.default_rng(5), 30)
  assert mixed.generate(np.random.default_rng(5), 30) != mixed.generate(
      np.random.default_rng(6), 30)


@pytest.mark.parametrize("family", FAMILIES)
def test_fraction_zero_is_the_old_shared_draw(family):
  task = ct.Program(family=family, eval_function_fraction=0)
  assert task.functions("eval") == () and answers(task.functions("train")) == every_function(
      family)
  want = old_generate(task, np.random.default_rng(7), 50)
  assert task.generate(np.random.default_rng(7), 50) == want
  assert task.generate_eval(np.random.default_rng(7), 50) == want
  ct.Program(family="linear", max_coef=1, max_const=0, eval_function_fraction=0)  # 1 function


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(family=st.sampled_from(FAMILIES), max_coef=st.integers(1, 6),
                  max_const=st.integers(1, 12), fraction=st.floats(0.01, 0.99))
def test_split_properties(family, max_coef, max_const, fraction):
  task = ct.Program(family=family, max_coef=max_coef, max_const=max_const,
                    eval_function_fraction=fraction)
  train, held = task.functions("train"), task.functions("eval")
  assert not answers(train) & answers(held)
  assert answers(train) | answers(held) == every_function(family, max_coef, max_const)
  for quad in {"linear": (False,), "quadratic": (True,), "mixed": (False, True)}[family]:
    n = len(every_function("quadratic" if quad else "linear", max_coef, max_const))
    k = sum(f[2] == quad for f in held)
    assert k == min(max(round(fraction * n), 1), n - 1)  # each kind: round(φ·n) in [1, n-1]
  e = task.generate(np.random.default_rng(0), 8) + task.generate_eval(np.random.default_rng(0), 8)
  assert {x["answer"] for x in e[:8]} <= answers(train)
  assert {x["answer"] for x in e[8:]} <= answers(held)
  assert max(len(x["prompt"]) for x in e) <= task.max_prompt_chars


def test_bad_fraction_raises():
  for bad in (1.0, -0.1, 1.5, True, "0.2"):
    with pytest.raises(ValueError, match="eval_function_fraction"):
      ct.Program(eval_function_fraction=bad)
  with pytest.raises(ValueError, match="needs >= 2 linear functions"):
    ct.Program(family="linear", max_coef=1, max_const=0)
  with pytest.raises(ValueError, match="split"):
    ct.Program().functions("test")


def test_build_data_eval_split_asks_for_held_out_functions():
  from experiments import loop
  from experiments.configs import verpo_program
  c = verpo_program.get_config("tiny")
  data = loop.build_data(c)
  task = data.task
  train = {e["answer"] for e in data.train}
  held = {e["answer"] for e in data.eval}
  assert held <= answers(task.functions("eval")) and len(held) == min(len(data.eval), 14)
  assert train <= answers(task.functions("train")) and not train & held
  # The `wide` variant: 380 functions, 76 held out; the longest body + eos fits.
  wide = loop.build_data(verpo_program.get_config("wide,tiny"))
  assert (len(wide.task.functions("train")), len(wide.task.functions("eval"))) == (304, 76)
  assert {e["answer"] for e in wide.eval} <= answers(wide.task.functions("eval"))
  assert wide.task.max_response_chars + 1 == wide.max_response_len
