"""Chained arithmetic: short reasoning, then a short answer after a marker.

Prompt "12+34-5=", response "46,41=41": the running sums after each operation (the
reasoning z, comma-separated), the marker "=", then the answer (the last running sum):

  x = "a_1 op_2 a_2 … op_n a_n ="      z = "s_2,…,s_n"      y = z ⊕ "=" ⊕ str(s_n),
  s_1 = a_1,  s_k = s_{k−1} op_k a_k.

The example's `answer` is the final answer alone ("41"), as in GSM8K-style data (the gold
value after "####"); `demonstration` writes the whole response. It is the built-in task for
the likelihood rewards (VeriFree, RLPR, JEPO, log-prob reward), which score
π(answer | prompt, reasoning): the `answer_pass`
producer cuts each sampled response right after its first `answer_marker` and
teacher-forces the gold answer there. On the single-answer tasks (arithmetic) there is no
reasoning for them to credit.

The reward is outcome only, on the answer after the first marker:

  r(x, y) = 1[z is a comma-separated list of integers (possibly empty) and
              the text after the first "=" == str(s_n)],

with `y` stripped of surrounding whitespace. The values and the number of the partial sums
are not checked (a response "=41" is accepted); a response without the marker, with other
characters before it, or with a non-canonical answer ("041", "+41", "41=") scores 0.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

import numpy as np

from credit.tasks.arithmetic import _sample_number, forgotten_carry
from credit.tasks.base import register_task, text_field

_TERM = re.compile(r"([-+])(\d+)")
_PROBLEM = re.compile(r"\d+(?:[-+]\d+)+=")
_REASONING = re.compile(r"(?:-?\d+(?:,-?\d+)*)?")
MARKER = "="


@register_task("chain")
@dataclasses.dataclass(frozen=True)
class Chain:
  """`a_1 ± a_2 ± … ± a_n =` worked as running sums, then `=` and the answer.

  Attributes:
    min_operands, max_operands: n, drawn uniformly in this range per example (n >= 2).
    min_digits, max_digits: digit count of each operand, drawn uniformly in this range per
      operand, then the value uniformly among numbers of that length (as arithmetic).
    ops: operators drawn uniformly, a subset of "+-" containing "+". A "-" that would make
      the running sum negative is written as "+", so every running sum of the gold chain is
      >= 0 (and fits `max_response_chars`).
    demo_carry_error: an imperfect demonstrator for the supervised warm-up: at each step of
      the chain that needs a carry (+) or a borrow (-), its demonstration forgets it with
      this probability (`arithmetic.forgotten_carry` of that step: "12+39-5=" ->
      "41,36=36" instead of "51,46=46"), and the slipped sum is carried on into the later
      sums and the answer, so its responses stay consistent with their own reasoning. A
      step whose running sum is negative (after an earlier slip) is worked right; a slip
      that would make the response longer than `max_response_chars` is not made. 0 =
      always correct. Applies only when the warm-up passes an rng.
  """
  min_operands: int = 3
  max_operands: int = 3
  min_digits: int = 1
  max_digits: int = 2
  ops: str = "+-"
  demo_carry_error: float = 0.0
  name = "chain"
  answer_marker = MARKER

  def __post_init__(self):
    if not 2 <= self.min_operands <= self.max_operands:
      raise ValueError(f"Need 2 <= min_operands <= max_operands, got {self.min_operands}, "
                       f"{self.max_operands}")
    if not 1 <= self.min_digits <= self.max_digits:
      raise ValueError(f"Need 1 <= min_digits <= max_digits, got {self.min_digits}, "
                       f"{self.max_digits}")
    if not self.ops or set(self.ops) - set("+-") or "+" not in self.ops:
      raise ValueError(f"ops must be a subset of '+-' containing '+', got {self.ops!r}")
    if not 0.0 <= self.demo_carry_error <= 1.0:
      raise ValueError(f"demo_carry_error must be in [0, 1], got {self.demo_carry_error}")

  @property
  def int_fields(self) -> dict[str, tuple[int, ...]]:
    return {}

  @property
  def max_prompt_chars(self) -> int:
    return self.max_operands * (self.max_digits + 1)

  @property
  def _sum_chars(self) -> int:
    return len(str(self.max_operands * (10 ** self.max_digits - 1)))

  @property
  def max_response_chars(self) -> int:
    n, w = self.max_operands, self._sum_chars
    return (n - 1) * w + (n - 2) + len(MARKER) + w  # n−1 sums, n−2 commas, marker, answer

  def generate(self, rng: np.random.Generator, n: int) -> list[dict]:
    out = []
    for _ in range(n):
      k = int(rng.integers(self.min_operands, self.max_operands + 1))
      digits = rng.integers(self.min_digits, self.max_digits + 1, size=k)
      values = [_sample_number(rng, int(d)) for d in digits]
      total, prompt = values[0], str(values[0])
      for v in values[1:]:
        op = self.ops[int(rng.integers(len(self.ops)))]
        op = "+" if op == "-" and total < v else op
        total = total + v if op == "+" else total - v
        prompt += f"{op}{v}"
      out.append({"prompt": prompt + "=", "answer": str(total)})
    return out

  def verify(self, example: Mapping[str, Any], response: str) -> float:
    reasoning, marker, answer = response.strip().partition(MARKER)
    if not marker or _REASONING.fullmatch(reasoning) is None:
      return 0.0
    return float(answer == text_field(example, "answer"))

  def flag_chars(self, example: Mapping[str, Any], response: str) -> np.ndarray:
    """Per-character flags of a wrong response: from its first wrong character onward.

    As `Arithmetic.flag_chars`, against the correct response (running sums, marker,
    answer): the first character that differs from it, after any leading whitespace, and
    everything after it are flagged; the last entry (the stop token) is flagged when the
    response stops short of it or ends after a flagged character. A response the verifier
    accepts gets no flag.

      12+34-5= "46,41=41" -> .........   "46,40=40" -> ....#####   "46,41" -> .....#
    """
    flags = np.zeros(len(response) + 1, bool)
    if self.verify(example, response) == 1.0:
      return flags
    gold = self.demonstration(example)
    start = len(response) - len(response.lstrip())
    body = response[start:]
    k = 0
    while k < min(len(body), len(gold)) and body[k] == gold[k]:
      k += 1
    flags[start + k:] = True
    return flags

  def format_ok(self, example: Mapping[str, Any], response: str) -> bool:
    """The response has the output format: running sums (integers, comma-separated), the
    marker, then an integer answer, whatever the values (SPARK's format constraint)."""
    reasoning, marker, answer = response.strip().partition(MARKER)
    return bool(marker) and _REASONING.fullmatch(reasoning) is not None and re.fullmatch(
        r"-?\d+", answer) is not None

  def judge_step(self, example: Mapping[str, Any], steps_before: list[str], step: str
                 ) -> tuple[float, float, bool]:
    """A verifier in the place of SLATE's ternary LLM judge: (r_think, r_answer, is_answer).

    `step` is the next step of a response whose earlier steps are `steps_before` (each
    ending at its delimiter ","), possibly with the delimiter or trailing space. A step
    holding the marker is the answer step: r_think judges the running sum before the
    marker (0 when there is none: "=41" skips the reasoning, which `verify` accepts) and
    r_answer the answer after it; another step is a reasoning step whose r_think judges its
    running sum, r_answer = 0. Each is +1 when right, −1 when wrong (a running sum at an
    index past the chain, or not an integer, is wrong).

      12+34-5=, [] "46,"  -> (1, 0, False)      ["46,"] "41=41" -> (1, 1, True)
      12+34-5=, [] "45,"  -> (-1, 0, False)     ["46,"] "41=40" -> (1, -1, True)
    """
    sums = running_sums(text_field(example, "prompt"))[1:]  # s_2..s_n, the reasoning's sums
    i = len(steps_before)

    def judge_sum(text: str) -> float:
      return 1.0 if i < len(sums) and text == str(sums[i]) else -1.0

    body = step.strip().rstrip(",;").strip()
    reasoning, marker, answer = body.partition(MARKER)
    if not marker:
      return judge_sum(reasoning), 0.0, False
    think = judge_sum(reasoning) if reasoning else 0.0
    return think, 1.0 if answer == text_field(example, "answer") else -1.0, True

  @property
  def num_subproblems(self) -> int:
    """J, the most subproblems an example has (n − 1: see `subproblems`)."""
    return self.max_operands - 1

  def subproblems(self, example: Mapping[str, Any], response: str
                  ) -> tuple[list[float], np.ndarray]:
    """SCRL's verifiable subproblems of a chain and the response's answer span for each.

    A chain of n operands is n − 1 subproblems: subproblem j < n − 2 is the running sum
    s_{j+2} (its answer is the reasoning's j-th comma-separated field), and the last one is
    the original problem (its answer is the text after the marker, judged by `verify`; the
    reasoning's last field, which computes the same sum, belongs to its span too). A field
    the response does not write is a failed subproblem (reward 0, still counted).

    Returns:
      (rewards, span): `rewards[j]` in {0, 1} for the example's n − 1 subproblems;
      `span [len(response) + 1]` int, the subproblem whose answer span holds each character
      (a field's digits and the comma after it; the marker, the answer and the end — the
      stop token — belong to the last subproblem), −1 for characters of no span (leading
      whitespace, fields past the chain).

      12+34-5= "46,41=41" -> rewards [1, 1], span 0 0 0 1 1 1 1 1 | end 1
      12+34-5= "45,41=41" -> rewards [0, 1]
    """
    sums = running_sums(text_field(example, "prompt"))
    n_sub = len(sums) - 1
    span = np.full(len(response) + 1, -1, np.int32)
    start = len(response) - len(response.lstrip())
    body = response[start:].rstrip()
    reasoning, marker, _ = body.partition(MARKER)
    fields = reasoning.split(",") if reasoning else []
    rewards = [0.0] * n_sub
    pos = start
    for j, text in enumerate(fields):
      width = len(text) + (j < len(fields) - 1)  # the field and its comma
      if j < n_sub:
        span[pos:pos + width] = j
        if j < n_sub - 1:
          rewards[j] = float(text == str(sums[j + 1]))
      pos += width
    if marker:
      span[pos:] = n_sub - 1
    elif not fields:
      span[start:] = n_sub - 1  # no marker and no reasoning: everything answers the problem
    span[-1] = n_sub - 1
    rewards[-1] = self.verify(example, response)
    return rewards, span

  @property
  def num_rubric_items(self) -> int:
    """C, the most rubric items an example has (its n − 1 running sums)."""
    return self.max_operands - 1

  def rubric(self, example: Mapping[str, Any], response: str) -> list[float]:
    """Rubric items for C-GRPO: item j is 1 when the reasoning states the running sum
    s_{j+2} as its j-th field (n − 1 items per example, s_n included). A response that
    skips its reasoning ("=41", which `verify` accepts) meets none.

      12+34-5= "46,41=41" -> [1, 1]     "=41" -> [0, 0]     "46,40=41" -> [1, 0]
    """
    sums = running_sums(text_field(example, "prompt"))
    reasoning, marker, _ = response.strip().partition(MARKER)
    fields = reasoning.split(",") if marker and reasoning else []
    return [float(j < len(fields) and fields[j] == str(sums[j + 1]))
            for j in range(len(sums) - 1)]

  def demonstration(self, example: Mapping[str, Any], rng: np.random.Generator | None = None
                    ) -> str:
    prompt = text_field(example, "prompt")
    sums = running_sums(prompt)
    gold = _response(sums)
    if rng is None or not self.demo_carry_error:
      return gold
    terms = _TERM.findall(prompt.strip()[:-1])
    total, slipped = sums[0], []
    for op, v in terms:
      slip = forgotten_carry(f"{total}{op}{v}=") if total >= 0 else None
      if slip is not None and rng.random() < self.demo_carry_error:
        total = slip
      else:
        total = total + int(v) if op == "+" else total - int(v)
      slipped.append(total)
    demo = _response([sums[0]] + slipped)
    return demo if len(demo) <= self.max_response_chars else gold


def running_sums(prompt: str) -> list[int]:
  """[s_1, …, s_n] of a chain prompt "a_1 op a_2 … op a_n=" (s_1 = a_1); raises ValueError on
  a prompt that is not one."""
  prompt = prompt.strip()
  if _PROBLEM.fullmatch(prompt) is None:
    raise ValueError(f"not a chain prompt: {prompt!r}")
  sums = [int(re.match(r"\d+", prompt).group())]
  for op, v in _TERM.findall(prompt[:-1]):
    sums.append(sums[-1] + int(v) if op == "+" else sums[-1] - int(v))
  return sums


def _response(sums: list[int]) -> str:
  """"s_2,…,s_n=s_n" from the running sums [s_1, …, s_n]."""
  return ",".join(map(str, sums[1:])) + MARKER + str(sums[-1])
