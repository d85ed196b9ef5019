"""Atom-Searcher (credit/advantages/shaping/atom_searcher.py)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from credit.advantages.shaping import atom_searcher_advantages, atom_searcher_weight
from tests.advantages.outcome._harness import Case, N, fixed_batch, reference_test, row0
from tests.advantages.shaping._harness_a import grpo_on, jcall, one_group

FIELDS = ("reward", "step_reward", "step_mask", "group_id", "response_mask")


def shaped_reward(b, lambda0=0.5, train_step=0, total_steps=None, r_fail=-1.0,
                  use_format=False):
  lam = (lambda0 if total_steps is None
         else lambda0 * min(max(1 - train_step / total_steps, 0), 1))
  m = b["step_mask"].astype(bool)
  s = b["step_reward"].astype(np.float64)
  atr = np.array([s[i, m[i]].mean() if m[i].any() else 0.0 for i in range(len(m))])
  R = lam * atr + (1 - lam) * b["reward"].astype(np.float64)
  if use_format:
    R = np.where(b["format_ok"], R, r_fail)
  return R


def ref_atom(b, singleton="zero", format_gate=False, **kw):
  return (grpo_on(b, shaped_reward(b, use_format=format_gate, **kw), singleton=singleton),)


CASES = [
    Case("atom_searcher", "atom_searcher", FIELDS, ref_atom),
    Case("atom_searcher_format", "atom_searcher", FIELDS + ("format_ok",), ref_atom,
         (("format_gate", True), ("train_step", 30), ("total_steps", 100), ("r_fail", -0.5))),
]

test_matches_numpy_reference = reference_test(CASES)


def test_worked_example():
  # Worked example: λ at steps 0/50/100 of 100 = 0.5/0.25/0; thought mean 0.8 with outcome 0.4 at
  # step 50 -> R = 0.5. Past total_steps λ stays 0.
  lam = atom_searcher_weight(jnp.asarray([0, 50, 100, 150]), 100)
  np.testing.assert_allclose(np.asarray(lam), [0.5, 0.25, 0.0, 0.0], atol=1e-6)
  # Row 0: thoughts [0.6, 1.0] (mean 0.8, a third one masked out), outcome 0.4 -> R = 0.5;
  # row 1: no thoughts (mean 0), outcome 0 -> R = 0. A two-row group gives ±0.707107.
  scores = np.array([[0.6, 1.0, 5.0], [0.3, 0.3, 0.3]], np.float32)
  mask = np.array([[1, 1, 0], [0, 0, 0]], bool)
  fn = jax.jit(lambda step: atom_searcher_advantages(
      reward=np.array([0.4, 0.0], np.float32), step_reward=scores, step_mask=mask,
      train_step=step,
      total_steps=100, **one_group(2)))
  np.testing.assert_allclose(row0(fn(jnp.asarray(50))), [0.707106, -0.707106], atol=1e-5)
  # At step 100 R = o = [0.4, 0]: still ±0.707107.
  np.testing.assert_allclose(row0(fn(jnp.asarray(100))), [0.707106, -0.707106], atol=1e-5)


def test_format_invalid_rows_get_r_fail():
  o = np.array([1.0, 0.2, 0.0], np.float32)
  kw = dict(reward=o, step_reward=np.ones((3, 1), np.float32), step_mask=np.ones((3, 1), bool),
            **one_group(3))
  fok = np.array([False, True, True])
  a = row0(jcall(atom_searcher_advantages, **kw, format_ok=fok, format_gate=True))
  R = np.array([-1.0, 0.5 + 0.1, 0.5])
  np.testing.assert_allclose(a, (R - R.mean()) / (R.std(ddof=1) + 1e-6), atol=1e-5)


def test_bad_arguments_raise():
  b = fixed_batch()
  kw = {f: b[f] for f in FIELDS}
  with pytest.raises(ValueError, match="format_ok"):
    atom_searcher_advantages(**kw, num_groups=N, format_gate=True)
  with pytest.raises(ValueError, match="total_steps"):
    atom_searcher_advantages(**kw, num_groups=N, total_steps=0)
  with pytest.raises(ValueError, match="singleton"):
    atom_searcher_advantages(**kw, num_groups=N, singleton="one")
