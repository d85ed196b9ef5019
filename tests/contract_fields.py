"""Random rollout fields generated from `credit.CONTRACT`, for registry-wide tests.

Every contract field gets a value of its declared shape and dtype; the few whose values have
a meaning beyond their dtype (masks, ids, log-probabilities, Σπ²) get values that respect it.
A field added to the contract is generated the moment it exists (generic by dtype), so a new
estimator needing it is tested at once; add an entry to `_SPECIAL` when its values must obey
more than their dtype.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

import credit

N, G, T = 4, 4, 6
B = N * G
NUM_PROMPTS = N + 3
DIMS = {"B": B, "T": T, "K": 3, "R": 2, "k": 4, "M": 2, "A": 3, "F": 3, "J": 2, "U": 3,
        "C": 3, "S": T + 3}


def contiguous_ids(nb: int = B) -> np.ndarray:
  return np.arange(nb, dtype=np.int32) // G


def _shape(name: str, dims: dict) -> tuple[int, ...]:
  return tuple(dims[c] for c in credit.CONTRACT[name].shape)


def _lp(rng, shape):  # log-probabilities of sampled tokens
  return rng.uniform(-4.0, -0.01, shape).astype(np.float32)


_SPECIAL: dict[str, Callable[[np.random.Generator, dict, dict], Any]] = {
    "tokens": lambda r, d, f: r.integers(3, 50, _shape("tokens", d)).astype(np.int32),
    "obs_mask": lambda r, d, f: np.zeros(_shape("obs_mask", d), bool),
    # Multi-turn layout: response positions t go to turn min(t // 2, K-1); a turn took place
    # (step_mask) when it holds a policy token.
    "turn_id": lambda r, d, f: np.where(f["response_mask"],
                                        np.minimum(np.arange(d["T"]) // 2, d["K"] - 1),
                                        -1).astype(np.int32),
    "step_mask": lambda r, d, f: np.stack(
        [(f["turn_id"] == k).any(1) for k in range(d["K"])], 1),
    "turn_role": lambda r, d, f: r.integers(0, 2, _shape("turn_role", d)).astype(np.int32),
    "turn_progress": lambda r, d, f: np.sort(r.uniform(0.0, 1.0, _shape("turn_progress", d)),
                                             1).astype(np.float32),
    "gold_logprob_turns": lambda r, d, f: _lp(r, _shape("gold_logprob_turns", d)),
    "gold_logprob_prompt": lambda r, d, f: _lp(r, (d["B"],)),
    "step_id": lambda r, d, f: np.where(f["response_mask"], np.arange(d["T"]) // 2,
                                        -1).astype(np.int32),
    "prompt_id": lambda r, d, f: ((f["group_id"] * 5 + 2) % NUM_PROMPTS).astype(np.int32),
    "reward_components": lambda r, d, f: np.stack(
        [f["reward"], r.choice([0.0, 1.0], d["B"])] + [r.uniform(-1, 1, d["B"])] * (d["R"] - 2),
        1).astype(np.float32),
    "entropy": lambda r, d, f: r.uniform(0.0, 3.0, _shape("entropy", d)).astype(np.float32),
    "sum_pi_squared": lambda r, d, f: r.uniform(0.05, 1.0, _shape("sum_pi_squared", d)
                                                ).astype(np.float32),
    "hellinger_ref": lambda r, d, f: r.uniform(0.0, 1.0, _shape("hellinger_ref", d)
                                               ).astype(np.float32),
    "kl_ref": lambda r, d, f: r.uniform(0.0, 2.0, _shape("kl_ref", d)).astype(np.float32),
    "kl_ref_forward": lambda r, d, f: r.uniform(0.0, 2.0, _shape("kl_ref_forward", d)
                                                ).astype(np.float32),
    "is_weights": lambda r, d, f: r.uniform(0.5, 1.5, _shape("is_weights", d)).astype(np.float32),
    "sample_weight": lambda r, d, f: r.uniform(0.5, 1.5, d["B"]).astype(np.float32),
    "teacher_topk_logprob": lambda r, d, f: np.asarray(jax.nn.log_softmax(
        r.normal(size=_shape("teacher_topk_logprob", d)), -1), np.float32),
    "teacher_topk_ids": lambda r, d, f: r.integers(0, 50, _shape("teacher_topk_ids", d)
                                                   ).astype(np.int32),
    # A few distinct values (clusters for majority voting) and some unparsed answers.
    "answer_value": lambda r, d, f: r.choice([3.0, 7.0, 7.0000001, np.nan], d["B"]
                                             ).astype(np.float32),
    "query_mask": lambda r, d, f: f["response_mask"] & (r.random(_shape("query_mask", d)) > 0.5),
    "anchor_id": lambda r, d, f: np.where(f["response_mask"], r.integers(-1, 2, _shape(
        "anchor_id", d)), -1).astype(np.int32),
    "step_value": lambda r, d, f: r.choice([0.0, 0.5, 1.0], _shape("step_value", d)
                                           ).astype(np.float32),
    "start_value": lambda r, d, f: r.choice([0.0, 0.5, 1.0], d["B"]).astype(np.float32),
    "parent_id": lambda r, d, f: np.full(d["B"], -1, np.int32),
    "prefix_len": lambda r, d, f: np.zeros(d["B"], np.int32),
    "policy_version": lambda r, d, f: np.zeros(d["B"], np.int32),
    "answer_mask": lambda r, d, f: (np.arange(d["A"])[None, :]
                                    < r.integers(1, d["A"] + 1, d["B"])[:, None]),
    # Structured rewards: 0/1 verifier results; every prompt has its first subproblem / test /
    # rubric item; answer spans: subproblem j on response positions [2j, 2j+2).
    "sub_rewards": lambda r, d, f: r.choice([0.0, 1.0], _shape("sub_rewards", d)
                                            ).astype(np.float32),
    "sub_mask": lambda r, d, f: np.arange(d["J"])[None, :] < r.integers(1, d["J"] + 1, (
        d["B"], 1)),
    "span_id": lambda r, d, f: np.where(f["response_mask"] & (np.arange(d["T"]) < 2 * d["J"]),
                                        np.arange(d["T"]) // 2, -1).astype(np.int32),
    "test_pass": lambda r, d, f: r.choice([0.0, 1.0], _shape("test_pass", d)).astype(np.float32),
    "test_mask": lambda r, d, f: np.arange(d["U"])[None, :] < r.integers(1, d["U"] + 1, (
        d["B"], 1)),
    "rubric": lambda r, d, f: r.choice([0.0, 0.5, 1.0], _shape("rubric", d)).astype(np.float32),
    "rubric_mask": lambda r, d, f: np.arange(d["C"])[None, :] < r.integers(1, d["C"] + 1, (
        d["B"], 1)),
    "tool_calls": lambda r, d, f: r.integers(0, 4, d["B"]).astype(np.int32),
    "tool_cost": lambda r, d, f: r.integers(0, 6, d["B"]).astype(np.float32),
}


def _generic(name: str, rng: np.random.Generator, dims: dict) -> np.ndarray:
  field = credit.CONTRACT[name]
  shape = _shape(name, dims)
  if name.startswith("logprob"):
    return _lp(rng, shape)
  if field.dtype == "f":
    return rng.uniform(-1.0, 1.0, shape).astype(np.float32)
  if field.dtype == "b":
    return rng.random(shape) > 0.3
  return rng.integers(0, 3, shape).astype(np.int32)


def mixed_layout(seed: int, contiguous: bool = False):
  """(reward, lengths, group_id) of a mixed batch: group 0 all equal, row 5 fully masked,
  group ids permuted unless `contiguous`."""
  rng = np.random.default_rng(seed)
  reward = rng.choice([0., 1., 0.5, 2.], B)
  reward[:G] = 1.0
  lengths = rng.integers(1, T + 1, B)
  lengths[5] = 0
  gid = contiguous_ids()
  if not contiguous:
    gid = gid[rng.permutation(B)]
  return reward, lengths, gid


def make_fields(seed: int = 0, *, reward=None, lengths=None, group_id=None,
                holes: bool = False, dims: dict | None = None) -> dict[str, np.ndarray]:
  """Every contract field for one batch (numpy, float32/int32/bool).

  Args:
    seed: seeds every random value.
    reward: [B] rewards (default: a mix of 0, 1, 0.5, 2).
    lengths: [B] response lengths (default: random in [1, T]); the response mask is
      right-padded `arange(T) < length`.
    group_id: [B] group ids (default: contiguous, N groups of G).
    holes: observation tokens inside responses (mask holes), as in multi-turn rollouts.
    dims: sizes of the shape letters (default `DIMS`).
  """
  d = dict(DIMS, **(dims or {}))
  rng = np.random.default_rng(seed)
  nb = d["B"]
  reward = rng.choice([0.0, 1.0, 0.5, 2.0], nb) if reward is None else reward
  lengths = rng.integers(1, d["T"] + 1, nb) if lengths is None else np.asarray(lengths)
  mask = np.arange(d["T"])[None, :] < lengths[:, None]
  obs = np.zeros_like(mask)
  if holes:
    obs = mask & (rng.random(mask.shape) < 0.3)
    mask = mask & ~obs
  gid = contiguous_ids(nb) if group_id is None else np.asarray(group_id, np.int32)
  f: dict[str, Any] = {"response_mask": mask, "reward": np.asarray(reward, np.float32),
                       "group_id": gid}
  for name in credit.CONTRACT:
    if name in f:
      continue
    gen = _SPECIAL.get(name)
    f[name] = gen(rng, d, f) if gen else _generic(name, rng, d)
  f["obs_mask"] = obs
  return f


def random_state(spec, seed: int = 0):
  """A stateful estimator's `init_state(NUM_PROMPTS)` with random, valid-looking contents
  (integers in [0, 4), floats in [0, 1)), so that state enters the computation."""
  if not spec.stateful:
    return None
  rng = np.random.default_rng(seed)
  state = spec.init_state(NUM_PROMPTS)

  def fill(x):
    x = np.asarray(x)
    if x.dtype.kind in "iu":
      return rng.integers(0, 4, x.shape).astype(x.dtype)
    if x.dtype.kind == "f":
      return rng.uniform(0.0, 1.0, x.shape).astype(x.dtype)
    return x

  return jax.tree.map(fill, state)
