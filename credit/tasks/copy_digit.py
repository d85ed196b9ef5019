"""Copy digit: the smallest task a working RL loop must solve from scratch.

The prompt "d=" asks for the single digit d; r(x, y) = 1[y.strip() == d]. With a one-token
response budget a uniform policy over the character ids succeeds with probability ≈ 1/54,
so a group of 8 samples contains a success about 14% of the time — enough signal for GRPO
to reach a training reward above 0.95 in a few dozen steps with no warm-up. The runner's
test suite uses it as a check that the loop learns at all (a sign error, a mask shifted by
one, an update that is dropped would all fail it), which no unit test of a part can show.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from credit.tasks.base import register_task, text_field


@register_task("copy_digit")
@dataclasses.dataclass(frozen=True)
class CopyDigit:
  """Answer with the digit shown in the prompt ("7=" -> "7")."""
  name = "copy_digit"
  max_prompt_chars = 2
  max_response_chars = 1

  @property
  def int_fields(self) -> dict[str, tuple[int, ...]]:
    return {}

  def generate(self, rng: np.random.Generator, n: int) -> list[dict]:
    return [{"prompt": f"{d}=", "answer": str(d)} for d in rng.integers(0, 10, size=n)]

  def verify(self, example: Mapping[str, Any], response: str) -> float:
    return float(response.strip() == text_field(example, "answer"))

  def demonstration(self, example: Mapping[str, Any], rng: np.random.Generator | None = None
                    ) -> str:
    return text_field(example, "answer")
