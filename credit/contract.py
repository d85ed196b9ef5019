"""The rollout array contract (DESIGN.md) and eager input validation.

`Rollout` is a pytree holding one batch of B sequences of length T. Every field
but `tokens`/`response_mask` is optional (None when absent). Estimators never
take a `Rollout`: they take its fields as keyword arguments, so the runner can
pass exactly the fields a registry entry asks for (`rollout.fields(spec.needs)`).

`validate_*` helpers run eagerly, on concrete arrays, *before* tracing: they turn
bad input into errors that name the argument, instead of silent NaNs inside jit.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, NamedTuple

import jax
import numpy as np
from flax import struct

from credit._checks import unknown


class Field(NamedTuple):
  """One row of the contract table.

  shape: letters, one per axis (B batch, T tokens, K turns/steps, R reward components,
    k top-k entries, M prompt interventions, A tokens of a teacher-forced reference answer,
    S tokens of the sequence that teacher-forces it (prompt ⊕ response ⊕ answer),
    F follow-up texts, J verifiable subproblems, U unit tests, C rubric items); fields sharing
    a letter must agree on its size.
  dtype: "i" integer, "b" bool (or a 0/1 numeric mask), "f" floating.
  meaning: what the array holds.
  finite: values must be finite where used (under `response_mask` for [B,T..] fields,
    under `step_mask` for `step_reward`); checked by `validate_fields`.
  """
  shape: str
  dtype: str
  meaning: str
  finite: bool = False


# The one table of rollout fields. `Rollout`, the finite checks, the registry's check of
# `needs` and the runner's producible fields all derive from it.
CONTRACT: dict[str, Field] = {
    # --- tokens and masks ---
    "tokens": Field("BT", "i", "prompt then response tokens, right-padded"),
    "response_mask": Field("BT", "b", "tokens the policy generated (policy-gradient targets)"),
    "obs_mask": Field("BT", "b", "tokens from an environment / tool; never policy-gradient "
                      "targets"),
    "turn_id": Field("BT", "i", "agent turn of each token, -1 outside turns"),
    "step_id": Field("BT", "i", "reasoning step / segment of each token, -1 outside"),
    # --- groups and prompts ---
    "group_id": Field("B", "i", "which prompt group a sample answers"),
    "prompt_id": Field("B", "i", "stable id of the prompt across steps (per-prompt state)"),
    # --- rewards ---
    "reward": Field("B", "f", "outcome reward", True),
    "reward_baseline": Field("B", "f", "reward of a baseline response to the same prompt "
                             "(ReMax: the greedy decode)", True),
    "reward_components": Field("BR", "f", "several reward signals per sample", True),
    "step_reward": Field("BK", "f", "per-turn / per-step rewards (process, progress, judge)",
                         True),
    "step_mask": Field("BK", "b", "valid entries of step_reward; in multi-turn rollouts the "
                       "turns a sample took (turn k of row b ran iff step_mask[b,k])"),
    "turn_progress": Field("BK", "f", "verifiable task progress in [0,1] after each turn "
                           "(progress before the first turn is 0; ProCredit, HyperGraphPro)",
                           True),
    "turn_role": Field("BK", "i", "role that played each turn (0 the main agent / planner, "
                       "1 a worker / synthesiser, ...; role-decoupled advantages)"),
    "gold_logprob_turns": Field("BK", "f", "mean per-token log-prob of the gold answer given "
                                "the trajectory up to the end of turn k (its observation "
                                "included; IGPO, TRACE)", True),
    "gold_logprob_prompt": Field("B", "f", "the same given the prompt alone (before any "
                                 "turn)", True),
    "token_reward": Field("BT", "f", "dense per-token rewards", True),
    "flag_mask": Field("BT", "b", "tokens inside spans a judge / PRM flagged as wrong "
                       "(Perceval: hallucinated perceptual claims); penalised"),
    "decision_mask": Field("BT", "b", "response tokens that decide the reward, as a "
                           "bifurcation task knows them (`pivot_positions`): ground truth for "
                           "the credit bench's references, not a method's input"),
    "sample_weight": Field("B", "f", "per-sample loss weight", True),
    # --- log-probs and model statistics ---
    "logprob": Field("BT", "f", "current policy log-prob of the sampled token (differentiated)",
                     True),
    "logprob_old": Field("BT", "f", "behaviour policy log-prob of the sampled token", True),
    "logprob_ref": Field("BT", "f", "frozen reference model log-prob", True),
    "logprob_teacher": Field("BT", "f", "teacher model log-prob of the student's token", True),
    "evidence_nuisance": Field("BT", "f", "the part of the evidence-conditioned log-prob shift "
                               "along the batch's evidence-presence direction (VERPO's FEC, "
                               "from hidden states)", True),
    "logprob_sampler": Field("BT", "f", "log-prob reported by the rollout engine", True),
    "logprob_alt": Field("BT", "f", "the same tokens scored under another context "
                         "(answer-conditioned, counterfactual, privileged)", True),
    "logprob_alt_pos": Field("BT", "f", "the sampled tokens scored by the behaviour policy "
                             "under a positive contrastive context (CSCR: 'this answer is "
                             "correct'; T-REG: 'improve the response')", True),
    "logprob_alt_neg": Field("BT", "f", "the same under the negative contrastive context "
                             "(CSCR: 'this answer is incorrect'; T-REG: 'worsen the response')",
                             True),
    "logprob_interventions": Field("BTM", "f", "the sampled tokens scored by the behaviour "
                                   "policy under M answer-preserving prompt interventions "
                                   "(SCAPO semifactuals)", True),
    "logprob_prm": Field("BT", "f", "implicit process reward model's log-prob of the sampled "
                         "token (PRIME's online PRM, trained by `credit.losses.prm`; its "
                         "reference is `logprob_ref`)", True),
    "logprob_answer": Field("BA", "f", "log-prob of each reference-answer token, "
                            "teacher-forced after prompt ⊕ response by the behaviour policy "
                            "(likelihood rewards); anything where `answer_mask` is 0"),
    "logprob_answer_prior": Field("BA", "f", "the same answer tokens after the prompt alone "
                                  "(no response; RLPR debiasing)"),
    "answer_mask": Field("BA", "b", "valid tokens of `logprob_answer` (right-padded)"),
    "logprob_followup": Field("BF", "f", "mean per-token log-prob of follow-up text f given "
                              "prompt ⊕ response (FLR; positive follow-ups first)", True),
    "teacher_topk_logprob": Field("BTk", "f", "top-k teacher log-probs (last entry: tail "
                                  "bucket)"),
    "teacher_topk_ids": Field("BTk", "i", "token ids of teacher_topk_logprob (tail: -1)"),
    "logprob_topk": Field("BTk", "f", "the current policy's log-probs of teacher_topk_ids "
                          "(the trainer's own pass, differentiated; last entry: the tail "
                          "bucket), for full-distribution distillation losses"),
    "entropy": Field("BT", "f", "policy entropy at each position", True),
    "sum_pi_squared": Field("BT", "f", "Σ_v π(v)² of the behaviour policy at each position",
                            True),
    "is_weights": Field("BT", "f", "truncated rollout importance weights", True),
    "hellinger_ref": Field("BT", "f", "squared Hellinger distance 1 − Σ_v √(π π_ref) between the "
                           "behaviour policy's and the reference's next-token distributions "
                           "(full vocabulary; DGPO)", True),
    "kl_ref": Field("BT", "f", "KL(π ‖ π_ref) between the behaviour policy's and the "
                    "reference's next-token distributions (full vocabulary; VIMPO)", True),
    "kl_ref_forward": Field("BT", "f", "KL(π_ref ‖ π), the other direction", True),
    # --- critic and targets ---
    "values": Field("BT", "f", "critic values", True),
    "values_ref": Field("BT", "f", "values of the reference-guided critic (it sees the "
                        "reference answer in its context; ReDiPPO)", True),
    "values_old": Field("BT", "f", "critic values at rollout time", True),
    "advantages": Field("BT", "f", "what an estimator returns and a policy loss consumes",
                        True),
    "returns": Field("BT", "f", "value targets", True),
    # --- trees and asynchronous rollouts ---
    "parent_id": Field("B", "i", "tree rollouts: the row a branch continues (-1: a root)"),
    "prefix_len": Field("B", "i", "tree rollouts: position where the branch departs"),
    "policy_version": Field("B", "i", "version (RL steps done) of the parameters that sampled "
                            "the row: the current step in a synchronous run; in an "
                            "asynchronous one the unit's stamp (the oldest version when "
                            "interrupted rollouts changed parameters between turns)"),
    # --- answers and queries (self-distillation, majority voting) ---
    "query_mask": Field("BT", "b", "policy tokens inside the queries a response issued (the "
                        "arguments of its search / tool calls; SD-Search's distillation "
                        "positions)"),
    "answer_value": Field("B", "f", "numeric value of the response's final answer as the task "
                          "parses it, NaN when it has none (SOLID's solver objective; "
                          "majority voting without gold answers)"),
    # --- steps and trees (step-level and sibling-comparison credit) ---
    "step_key": Field("BK", "i", "content key of each step (a host-side hash of the state "
                      "before it and its text): equal keys in one prompt group are the same "
                      "step (SALT's trajectory graph); valid where step_mask"),
    "step_value": Field("BK", "f", "value of the state at the end of each step: the reward "
                        "of a completion from that step boundary (TP-GRPO) or the step node's "
                        "MCTS Q (PROPA); valid where step_mask"),
    "start_value": Field("B", "f", "the same before the first step (a completion from the "
                         "prompt alone; TP-GRPO's V_0)"),
    "anchor_id": Field("BT", "i", "anchor (a cluster of near-identical sub-diffs / step "
                       "edits across a group) each token belongs to, -1 for none (DiDPO)"),
    "format_ok": Field("B", "b", "the response follows the task's output format"),
    # --- structured rewards (reward shaping before an estimator runs) ---
    "sub_rewards": Field("BJ", "f", "verifier result for each subproblem's answer (SCRL; the "
                         "last subproblem is the original problem)", True),
    "sub_mask": Field("BJ", "b", "subproblems the prompt has (valid entries of sub_rewards)"),
    "span_id": Field("BT", "i", "subproblem j whose answer span holds the token, -1 outside "
                     "answer spans"),
    "test_pass": Field("BU", "f", "1 when the response passes unit test u, 0 when it fails "
                       "(a malformed, crashing or non-terminating program fails every test)"),
    "test_mask": Field("BU", "b", "unit tests the prompt has (valid entries of test_pass)"),
    "rubric": Field("BC", "f", "score in [0,1] for each rubric item a judge checked (C-GRPO: "
                    "1 when a hidden entity is identified, cited and connected to the answer)"),
    "rubric_mask": Field("BC", "b", "rubric items the prompt has (valid entries of rubric)"),
    "tool_calls": Field("B", "i", "tool-call rounds the response used"),
    "tool_cost": Field("B", "f", "total cost of the response's tool use (e.g. searches or "
                       "calculator operations issued over all rounds)", True),
    "token_rm_logit": Field("BT", "f", "logit of a token-level reward model at each response "
                            "token (OREAL's importance weights)", True),
    # --- sequences for scoring again in the update (a trained loss's inputs) ---
    "answer_tokens": Field("BS", "i", "the sequence `logprob_answer` is scored on: prompt ⊕ "
                           "response ⊕ reference answer (padded), so an update can score the "
                           "answer again under its own parameters (a `TrainedLoss` on it)"),
    "answer_attn_mask": Field("BS", "b", "attended positions of `answer_tokens`"),
    "answer_positions": Field("BA", "i", "where each answer token sits in `answer_tokens`"),
    "state_key": Field("BK", "i", "key of the environment state (observation) each turn "
                       "starts from, a host-side hash: equal keys in one prompt group are the "
                       "same anchor state (GiGPO's step groups); valid where step_mask"),
}

_REQUIRED = ("tokens", "response_mask")


def _make_rollout():
  """A class with one annotated attribute per contract field, for `struct.dataclass`."""
  ns = {k: v for k, v in vars(_RolloutMethods).items() if k not in ("__dict__", "__weakref__")}
  ns["__annotations__"] = {n: Any for n in CONTRACT}
  ns["__annotations__"]["extras"] = Mapping[str, Any]
  ns["__annotations__"] = {n: ns["__annotations__"][n] for n in
                           list(_REQUIRED) + [n for n in CONTRACT if n not in _REQUIRED]
                           + ["extras"]}
  for n in CONTRACT:
    if n not in _REQUIRED:
      ns[n] = None
  ns["extras"] = dataclasses.field(default_factory=dict)
  return type("Rollout", (), ns)


class _RolloutMethods:
  """One batch of rollouts, right-padded to T (DESIGN.md, "The rollout contract").

  One attribute per `CONTRACT` field (absent fields are None; `tokens` and
  `response_mask` are required); `extras` carries other arrays by name.
  """

  @property
  def batch_size(self) -> int:
    return self.tokens.shape[0]

  @property
  def seq_len(self) -> int:
    return self.tokens.shape[1]

  def get(self, name: str) -> Any:
    value = getattr(self, name) if name in CONTRACT else None
    return self.extras.get(name) if value is None else value

  def fields(self, names: Iterable[str]) -> dict[str, Any]:
    """The named fields as a kwargs dict; raises if one is missing."""
    out = {n: self.get(n) for n in names}
    missing = sorted(n for n, v in out.items() if v is None)
    if missing:
      raise ValueError(f"Rollout lacks field(s) {missing} (present: {sorted(self.present())})")
    return out

  def present(self) -> list[str]:
    return [n for n in CONTRACT if getattr(self, n) is not None] + list(self.extras)


Rollout = struct.dataclass(_make_rollout())
Rollout.__module__ = __name__


class ContractError(ValueError):
  """Raised eagerly when an input violates the rollout contract."""


def _kind_ok(arr: np.ndarray, kind: str) -> bool:
  k = arr.dtype.kind
  if kind == "i":
    return k in "iu"
  if kind == "b":
    return k in "biuf"  # bool preferred; 0/1 numeric masks are accepted (checked below)
  if kind == "f":
    return k == "f"
  return True


def validate_fields(fields: Mapping[str, Any] | None = None, /, *,
                    num_groups: int | None = None, where: str = "input",
                    require_nonempty_mask: bool = True,
                    dims: Mapping[str, int] | None = None, **named: Any) -> dict[str, int]:
  """Checks contract fields eagerly; returns the resolved dimensions (letters -> sizes).

  The fields come as keyword arguments, as an estimator takes them
  (``validate_fields(reward=r, group_id=g, response_mask=m, num_groups=2)``), or as one
  mapping (``validate_fields(batch, num_groups=2)``), or both.

  Checks: rank and shape agreement across fields (B, T, K, ...), dtype kinds, 0/1
  masks, finite floats (only where `response_mask` selects, for [B,T] fields),
  group ids in [0, num_groups), and that `response_mask` selects at least one
  token. In the mapping, names that are not contract fields are ignored (a batch may
  carry extras; estimator-specific ones are checked by their estimator's own
  validator); a keyword argument that is not a contract field is refused, naming the
  closest fields.

  Raises:
    ContractError naming the argument, the expected and the actual shape/dtype.
    UnknownNameError: a keyword argument that is not a contract field.
    TypeError: `fields` is not a mapping, or a field is given twice.
  """
  if fields is not None and not isinstance(fields, Mapping):
    raise TypeError(f"{where}: validate_fields takes a mapping of fields or keyword "
                    f"arguments, got {type(fields).__name__}")
  for name in named:
    if name not in CONTRACT:
      raise unknown("contract field", name, CONTRACT)
  twice = sorted(set(fields or {}) & set(named))
  if twice:
    raise TypeError(f"{where}: field(s) {twice} given both in the mapping and as keywords")
  fields = {**(fields or {}), **named}
  d: dict[str, int] = dict(dims or {})
  arrays = {}
  for name, val in fields.items():
    if val is None or name not in CONTRACT:
      continue
    try:
      arr = np.asarray(val)
    except Exception as e:  # tracers cannot be validated eagerly
      raise ContractError(f"{where}: `{name}` must be a concrete array to validate "
                          f"(call validate_* outside jit): {e}") from None
    letters, kind = CONTRACT[name].shape, CONTRACT[name].dtype
    if arr.ndim != len(letters):
      raise ContractError(
          f"{where}: `{name}` must have shape [{','.join(letters)}] (rank {len(letters)}), "
          f"got shape {arr.shape}")
    for letter, size in zip(letters, arr.shape):
      if letter in d and d[letter] != size:
        raise ContractError(
            f"{where}: `{name}` has shape {arr.shape}; expected [{','.join(letters)}] with "
            f"{letter}={d[letter]} (from the other fields)")
      d.setdefault(letter, size)
    if not _kind_ok(arr, kind):
      want = {"i": "an integer dtype (int32)", "b": "bool", "f": "a float dtype (float32)"}[kind]
      raise ContractError(f"{where}: `{name}` must have {want}, got {arr.dtype}")
    if kind == "b" and arr.dtype.kind != "b":
      if not np.all((arr == 0) | (arr == 1)):
        raise ContractError(f"{where}: mask `{name}` must be bool or contain only 0/1")
    arrays[name] = arr

  mask = arrays.get("response_mask")
  if mask is not None:
    mask_b = mask.astype(bool)
    if require_nonempty_mask and not mask_b.any():
      raise ContractError(f"{where}: `response_mask` selects no token; nothing to train on")
  for name, arr in arrays.items():
    if not CONTRACT[name].finite:
      continue
    letters = CONTRACT[name].shape
    sel = arr
    if letters.startswith("BT") and mask is not None:
      sel = arr[mask.astype(bool)]
    elif letters == "BK" and "step_mask" in arrays:
      sel = arr[arrays["step_mask"].astype(bool)]
    bad = ~np.isfinite(sel)
    if bad.any():
      kind = "NaN" if np.isnan(sel).any() else "inf"
      raise ContractError(f"{where}: `{name}` contains {kind} values "
                          f"({int(bad.sum())} of {sel.size} checked entries)")
  gid = arrays.get("group_id")
  if gid is not None and num_groups is not None:
    if gid.size and (gid.min() < 0 or gid.max() >= num_groups):
      raise ContractError(f"{where}: `group_id` must lie in [0, num_groups={num_groups}), "
                          f"got range [{gid.min()}, {gid.max()}]")
  return d


def validate_rollout(rollout: Rollout, *, num_groups: int | None = None) -> dict[str, int]:
  """`validate_fields` over every present field of a `Rollout`."""
  fields = {n: rollout.get(n) for n in rollout.present() if n in CONTRACT}
  return validate_fields(fields, num_groups=num_groups, where="Rollout")


def contiguous_group_size(group_id: Any) -> int | None:
  """G when `group_id` is [0]*G + [1]*G + ... (the [N,G] fast path), else None."""
  gid = np.asarray(group_id)
  if gid.ndim != 1 or gid.size == 0:
    return None
  n = int(gid.max()) + 1
  if gid.size % n:
    return None
  G = gid.size // n
  return G if np.array_equal(gid, np.repeat(np.arange(n), G)) else None
