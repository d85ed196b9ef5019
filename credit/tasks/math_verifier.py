"""Math answer checking with `math_verify` (HuggingFace Math-Verify), for user data.

  r(x, y) = 1[ math_verify.verify(parse(gold), parse(y)) ]

`parse` extracts the last boxed / LaTeX / plain expression of the response and
turns it into sympy; `verify` compares symbolically and numerically
(`float_rounding` digits), so "\\frac{1}{2}" and "0.5" agree. The gold answer is
parsed as given and, if that extracts nothing, once more wrapped in "$...$".

math_verify guards parsing and comparison with a SIGALRM timeout, which only
works in the main thread; elsewhere the verifier runs without a timeout.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any, Mapping

import numpy as np

from credit.tasks.base import text_field


@dataclasses.dataclass(frozen=True)
class MathVerifier:
  """Reward 1.0 when the response's final answer equals `example["answer"]` mathematically.

  Attributes:
    float_rounding: decimal digits kept when comparing numbers.
    timeout_seconds: per parse / verify call (main thread only); None disables.
  """
  float_rounding: int = 6
  timeout_seconds: int | None = 5
  name = "math"

  @property
  def int_fields(self) -> dict[str, tuple[int, ...]]:
    return {}

  def _timeout(self) -> int | None:
    in_main = threading.current_thread() is threading.main_thread()
    return self.timeout_seconds if in_main else None

  def parse_gold(self, answer: str) -> list:
    import math_verify
    t = self._timeout()
    gold = math_verify.parse(answer, parsing_timeout=t)
    if not gold and not answer.strip().startswith("$"):
      gold = math_verify.parse(f"${answer}$", parsing_timeout=t)
    return gold

  def verify(self, example: Mapping[str, Any], response: str) -> float:
    import math_verify
    gold = self.parse_gold(text_field(example, "answer"))
    if not gold:
      raise ValueError(f"math_verify cannot parse the gold answer {example['answer']!r}")
    t = self._timeout()
    pred = math_verify.parse(response, parsing_timeout=t)
    if not pred:
      return 0.0
    ok = math_verify.verify(gold, pred, float_rounding=self.float_rounding, timeout_seconds=t)
    return float(ok)

  def unparsable(self, examples) -> list[int]:
    """Indices of the examples whose gold answer does not parse (empty: all fine)."""
    return [i for i, e in enumerate(examples) if not self.parse_gold(text_field(e, "answer"))]

  def validate_examples(self, examples) -> None:
    """Raises ValueError listing the examples whose gold answer does not parse.

    Call it once on user data before training: `verify` raises on such an example.
    """
    bad = self.unparsable(examples)
    if bad:
      raise ValueError(f"{len(bad)} gold answers do not parse with math_verify, at indices "
                       f"{bad[:20]}{' ...' if len(bad) > 20 else ''}")

  def demonstration(self, example: Mapping[str, Any], rng: np.random.Generator | None = None
                    ) -> str:
    """The gold answer in a box (what a minimal correct response looks like)."""
    return f"\\boxed{{{text_field(example, 'answer')}}}"
