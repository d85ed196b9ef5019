"""User data formats (GSM8K, MATH, plain JSONL), the start-up refusal of unparsable gold
answers, and the grpo_jsonl recipe end to end with sampled evaluation (mean@k / pass@k)."""
import json
import os

import numpy as np
import pytest

import credit.tasks as ct
from experiments import loop
from experiments.configs import grpo_jsonl

GSM8K = [
    {"question": "1+2=", "answer": "1+2=<<1+2=3>>3\n#### 3"},
    {"question": "How many?", "answer": "Ten hundred.\n#### 1,000"},
    {"question": "9-12=", "answer": "so #### is not it\n#### -3"},
]
MATH = [
    {"problem": "Half of 1?", "solution": "It is $\\boxed{\\frac{1}{2}}$."},
    {"problem": "Two boxes", "solution": "\\boxed{1} first, then \\boxed{\\sqrt{x^{2}}} last"},
    {"problem": "Poly", "solution": "so \\boxed {{x}^{2}+1}"},
]
PLAIN = [{"prompt": "3*3=", "answer": 9}, {"prompt": "x?", "answer": "\\pi"}]


def write(path, records, extra=""):
  path.write_text("".join(json.dumps(r) + "\n" for r in records) + extra)
  return path


def test_formats_are_detected_and_parsed(tmp_path):
  g = ct.load_jsonl(write(tmp_path / "g.jsonl", GSM8K))
  assert g == [{"prompt": "1+2=", "answer": "3"}, {"prompt": "How many?", "answer": "1000"},
               {"prompt": "9-12=", "answer": "-3"}]
  m = ct.load_jsonl(write(tmp_path / "m.jsonl", MATH))
  assert [e["prompt"] for e in m] == ["Half of 1?", "Two boxes", "Poly"]
  assert [e["answer"] for e in m] == ["\\frac{1}{2}", "\\sqrt{x^{2}}", "{x}^{2}+1"]
  p = ct.load_jsonl(write(tmp_path / "p.jsonl", PLAIN))
  assert p == [{"prompt": "3*3=", "answer": "9"}, {"prompt": "x?", "answer": "\\pi"}]
  assert [ct.detect_format(r) for r in (GSM8K[0], MATH[0], PLAIN[0])] == ["gsm8k", "math",
                                                                          "plain"]
  # Named fields win over detection: the full GSM8K solution is then the answer.
  raw = ct.load_jsonl(tmp_path / "g.jsonl", prompt_field="question", answer_field="answer")
  assert raw[0]["answer"] == GSM8K[0]["answer"]
  # Forced formats; every gold answer checks against itself with math_verify.
  assert ct.load_jsonl(tmp_path / "g.jsonl", data_format="gsm8k") == g
  mv = ct.MathVerifier()
  assert ct.load_jsonl(tmp_path / "m.jsonl", data_format="math", verifier=mv) == m
  for e in g + m + p:
    assert mv.verify(e, mv.demonstration(e)) == 1.0, e
  with pytest.raises(ct.MissingFieldError, match=r"g.jsonl:1 \(math format\): no prompt field "
                     r"'problem'"):
    ct.load_jsonl(tmp_path / "g.jsonl", data_format="math")
  with pytest.raises(ValueError, match="data_format='csv'"):
    ct.load_jsonl(tmp_path / "g.jsonl", data_format="csv")


def test_boxed_and_gsm8k_extraction():
  assert ct.boxed_answer("a \\boxed{\\frac{1}{2}} b") == "\\frac{1}{2}"
  assert ct.boxed_answer("\\boxed{1} \\boxed{{2}^{3}}") == "{2}^{3}"
  assert ct.boxed_answer("\\boxed{1} then \\boxed{2") == "1"  # unclosed: the last complete one
  assert ct.boxed_answer("no box") is None
  assert ct.gsm8k_answer("x\n#### 1,234,567 ") == "1234567"
  assert ct.gsm8k_answer("no marker") is None


def test_malformed_lines_are_refused_with_their_line(tmp_path):
  bad = GSM8K[:1] + [{"question": "q", "answer": "no final marker"}]
  with pytest.raises(ValueError, match=r"b.jsonl:2: gsm8k format: .*####"):
    ct.load_jsonl(write(tmp_path / "b.jsonl", bad))
  bad = MATH[:1] + [{"problem": "q", "solution": "\\boxed{unclosed"}]
  with pytest.raises(ValueError, match=r"b.jsonl:2: math format: .*boxed"):
    ct.load_jsonl(write(tmp_path / "b.jsonl", bad))


def test_unparsable_gold_answers_are_refused_naming_lines(tmp_path):
  records = MATH[:1] + [{"problem": "q", "solution": "\\boxed{\\text{}}"}, MATH[1],
                        {"problem": "r", "solution": "\\boxed{ \\text{} }"}]
  path = tmp_path / "u.jsonl"
  path.write_text(json.dumps(records[0]) + "\n\n" + "".join(json.dumps(r) + "\n"
                                                            for r in records[1:]))
  assert len(ct.load_jsonl(path)) == 4  # without a verifier: loaded as given
  with pytest.raises(ValueError, match=r"u.jsonl: 2 gold answer\(s\) do not parse .*"
                     r"lines \[3, 5\]"):
    ct.load_jsonl(path, verifier=ct.MathVerifier())
  wd = tmp_path / "w"
  c = grpo_jsonl.get_config("tiny")
  c.mesh, c.data_path = "data=1", str(path)
  with pytest.raises(loop.SetupError, match=r"lines \[3, 5\]"):
    loop.run(c, str(wd))
  assert not wd.exists()
  c.data_format = "yaml"
  with pytest.raises(loop.SetupError, match="data_format='yaml'"):
    loop.run(c, str(wd))
  assert not wd.exists()


def test_grpo_jsonl_tiny_trains_with_sampled_eval(tmp_path):
  rng = np.random.default_rng(1)
  lines = []
  for _ in range(40):
    a, b = (int(x) for x in rng.integers(0, 10, 2))
    lines.append({"question": f"{a}+{b}=", "answer": f"{a}+{b}={a + b}\n#### {a + b}"})
  path = write(tmp_path / "train.jsonl", lines)
  c = grpo_jsonl.get_config("tiny")
  assert c.task == "jsonl" and c.eval_samples == 2
  c.mesh, c.data_path = "data=1", str(path)
  wd = str(tmp_path / "w")
  loop.run(c, wd)
  with open(os.path.join(wd, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  evals = [r for r in rows if "eval_accuracy" in r]
  assert [r["step"] for r in evals] == [0, 2], [r["step"] for r in rows]
  for r in evals:
    mean, passk = r["eval_mean_at_k"], r["eval_pass_at_k"]
    assert 0.0 <= mean <= 1.0 and 0.0 <= passk <= 1.0, r
    assert passk >= mean - 1e-9, r  # 0/1 rewards: any-correct >= the mean per prompt
    assert 0.0 <= r["eval_accuracy"] <= 1.0
