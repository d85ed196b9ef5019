"""Losses on constructed data: step-level DPO pairs (CSO) and SFT on self-proposed
interventions (InT).

Neither is an advantage estimator: the loop builds the data (CSO: a PRM proposes critical
steps of failed trajectories, an expert proposes alternatives, the policy continues from
them, and verified successes become `chosen` against the original step; InT: the model finds
the first error in its own failed trace and writes a one-step correction) and these
functions give the differentiable objective.

  dpo_pair_logprobs        [B,T] log-probs + step-token mask + pair rows -> per-pair sums
  dpo_pair_loss            mean softplus(−β[(l_c − l_rc) − (l_r − l_rr)])       (CSO, B6)
  intervention_sft_mask    [B,T] loss mask of prefix ⧺ intervention              (InT, B7)
  intervention_sft_loss    token-mean NLL under that mask                        (InT, B7)

Both follow the papers' abstracts: the DPO form is standard DPO with β = 0.1, and the
InT mask rule is this library's reading.
"""
from __future__ import annotations

from typing import Literal, NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit._checks import check_choice, check_int
from credit.losses.reduction import LossOutput

__all__ = ["PairLogprobs", "dpo_pair_logprobs", "dpo_pair_loss", "intervention_sft_mask",
           "intervention_sft_loss", "SFT_TARGETS"]

Array = jax.Array
F32 = jnp.float32
SFT_TARGETS = ("all", "intervention_only")


class PairLogprobs(NamedTuple):
  """Per-pair sums of step-token log-probs, each [P] float32: `chosen` / `rejected` under the
  policy (differentiable), `ref_chosen` / `ref_rejected` under the reference (stop-gradient),
  and `valid` [P] bool (both rows exist and their step selects a token)."""
  chosen: Array
  ref_chosen: Array
  rejected: Array
  ref_rejected: Array
  valid: Array


def dpo_pair_logprobs(*, logprob: ArrayLike, logprob_ref: ArrayLike, token_mask: ArrayLike,
                      chosen_row: ArrayLike, rejected_row: ArrayLike) -> PairLogprobs:
  """Summed log-probs of each pair's step tokens, from batch arrays.

  Each pair p compares two rows that share a context (the trajectory up to the critical
  step): row `chosen_row[p]` ends in the verified alternative step, row `rejected_row[p]`
  in the original one. `token_mask` selects the tokens of the step itself, so the shared
  prefix is context only (in the tree layout, `response_mask` of a branch row already
  excludes its copied prefix):

  .. math::
    l_c = Σ_t m[c,t] log π(y_{c,t}),  l_rc = Σ_t m[c,t] log π_ref(y_{c,t})   (same for r)

  Args:
    logprob: [B,T] float policy log-probs of the sampled tokens (differentiated).
    logprob_ref: [B,T] float reference log-probs (no gradient).
    token_mask: [B,T] bool, the step tokens of each row (masked entries may hold NaN).
    chosen_row, rejected_row: [P] int row of each pair's chosen / rejected step; pairs
      with a row outside [0, B) are invalid.

  Returns:
    PairLogprobs of [P] arrays.
  """
  lp = jnp.asarray(logprob, F32)
  ref = jnp.asarray(logprob_ref, F32)
  m = jnp.asarray(token_mask)
  chex.assert_rank([lp, ref, m], 2)
  chex.assert_equal_shape([lp, ref, m])
  ci, ri = jnp.asarray(chosen_row), jnp.asarray(rejected_row)
  chex.assert_rank([ci, ri], 1)
  chex.assert_type([ci, ri], int)
  chex.assert_equal_shape([ci, ri])
  m = m.astype(bool)
  B = lp.shape[0]
  pol_B = jnp.sum(jnp.where(m, lp, 0.0), axis=1)
  ref_B = jax.lax.stop_gradient(jnp.sum(jnp.where(m, ref, 0.0), axis=1))
  row_ok = jnp.any(m, axis=1)
  ok = (ci >= 0) & (ci < B) & (ri >= 0) & (ri < B)
  ci, ri = jnp.clip(ci, 0, B - 1), jnp.clip(ri, 0, B - 1)
  ok = ok & row_ok[ci] & row_ok[ri]
  return PairLogprobs(chosen=pol_B[ci], ref_chosen=ref_B[ci], rejected=pol_B[ri],
                      ref_rejected=ref_B[ri], valid=ok)


def dpo_pair_loss(*, logprob_chosen: ArrayLike, logprob_ref_chosen: ArrayLike,
                  logprob_rejected: ArrayLike, logprob_ref_rejected: ArrayLike,
                  pair_mask: ArrayLike | None = None, beta: ArrayLike = 0.1) -> LossOutput:
  """Step-level DPO on verified critical steps (CSO).

  Paper: "Critical Step Optimization" (CSO). Its abstract builds "DPO training data" from
  verified critical steps; the loss is standard DPO, β = 0.1 the usual default.

  .. math::
    z_p = β [ (l_c − l_rc) − (l_r − l_rr) ],    L = mean_p softplus(−z_p) = −mean_p log σ(z_p)

  with l_c, l_r the summed step log-probs of the chosen / rejected step under the policy and
  l_rc, l_rr under the reference (`dpo_pair_logprobs` builds them). Only pairs whose
  continuation verified success belong here (the loop's filter).

  Args:
    logprob_chosen, logprob_ref_chosen, logprob_rejected, logprob_ref_rejected: [P] float
      (the reference sums get no gradient).
    pair_mask: optional [P] bool; pairs off here take no part (all off: loss 0).
    beta: β.

  Returns:
    LossOutput(loss, metrics): `dpo_pair_accuracy` (z > 0), `dpo_margin_mean` (mean z/β),
    `dpo_num_pairs`.

  >>> out = dpo_pair_loss(logprob_chosen=jnp.array([-5.]), logprob_ref_chosen=jnp.array([-6.]),
  ...                     logprob_rejected=jnp.array([-4.]),
  ...                     logprob_ref_rejected=jnp.array([-3.5]))
  >>> round(float(out.loss), 6)
  0.620957
  """
  lc, lrc = jnp.asarray(logprob_chosen, F32), jnp.asarray(logprob_ref_chosen, F32)
  lr, lrr = jnp.asarray(logprob_rejected, F32), jnp.asarray(logprob_ref_rejected, F32)
  chex.assert_rank([lc, lrc, lr, lrr], 1)
  chex.assert_equal_shape([lc, lrc, lr, lrr])
  ok = jnp.ones(lc.shape, bool)
  if pair_mask is not None:
    pm = jnp.asarray(pair_mask)
    chex.assert_equal_shape([pm, lc])
    ok = pm.astype(bool)
  sg = jax.lax.stop_gradient
  margin = jnp.where(ok, (lc - sg(lrc)) - (lr - sg(lrr)), 0.0)
  z = jnp.asarray(beta, F32) * margin
  w = ok.astype(F32)
  n = jnp.sum(w)
  mean = lambda x: jnp.sum(jnp.where(ok, x, 0.0)) / jnp.maximum(n, 1.0)
  metrics = {"dpo_pair_accuracy": mean((sg(z) > 0).astype(F32)),
             "dpo_margin_mean": mean(sg(margin)), "dpo_num_pairs": n}
  return LossOutput(mean(jax.nn.softplus(-z)), metrics)


def intervention_sft_mask(prefix_len: ArrayLike, interv_len: ArrayLike, seq_len: int, *,
                          train_on: Literal["all", "intervention_only"] = "all",
                          response_mask: ArrayLike | None = None) -> Array:
  """[B,T] bool loss mask of InT's SFT sample: the prefix before the error ⧺ the intervention.

  Paper: "InT: Self-Proposed Interventions Enable Credit Assignment in LLM Reasoning"
  (this library's reading of its abstract).

  .. math::
    all:                mask[b,t] = t < prefix_len_b + interv_len_b
    intervention_only:  mask[b,t] = prefix_len_b ≤ t < prefix_len_b + interv_len_b

  Positions count from the first column of the array; pass `response_mask` to drop the
  prompt columns (the mask is ANDed with it). The default trains on the
  prefix too ("SFT on the rollout up to the error concatenated with the intervention").
  Samples where no error was found should be dropped by the loop (interv_len = 0 then
  trains on nothing with "intervention_only").

  Args:
    prefix_len: [B] int number of tokens before the first error.
    interv_len: [B] int number of intervention tokens that follow.
    seq_len: static T.
    train_on: static, "all" | "intervention_only".
    response_mask: optional [B,T] bool.

  >>> intervention_sft_mask(jnp.array([3]), jnp.array([2]), 7).astype(int).tolist()
  [[1, 1, 1, 1, 1, 0, 0]]
  """
  check_choice("intervention_sft_mask", "train_on", train_on, SFT_TARGETS)
  check_int("intervention_sft_mask", "seq_len", seq_len)
  p = jnp.asarray(prefix_len)
  n = jnp.asarray(interv_len)
  chex.assert_rank([p, n], 1)
  chex.assert_type([p, n], int)
  chex.assert_equal_shape([p, n])
  t = jnp.arange(seq_len)[None, :]
  end = (p + n)[:, None]
  mask = t < end
  if train_on == "intervention_only":
    mask = mask & (t >= p[:, None])
  if response_mask is not None:
    rm = jnp.asarray(response_mask)
    chex.assert_shape(rm, mask.shape)
    mask = mask & rm.astype(bool)
  return mask


def intervention_sft_loss(*, logprob: ArrayLike, loss_mask: ArrayLike) -> LossOutput:
  """Token-mean NLL: −Σ m·log π / max(Σ m, 1) (InT's SFT step; any SFT mask works).

  Args:
    logprob: [B,T] float policy log-probs of the target tokens (differentiated).
    loss_mask: [B,T] bool, e.g. `intervention_sft_mask(...)` (masked entries may be NaN).

  Returns:
    LossOutput(loss, {"sft_tokens": number of trained tokens}).

  >>> out = intervention_sft_loss(logprob=jnp.array([[-1., -3., 0.]]),
  ...                             loss_mask=jnp.array([[True, True, False]]))
  >>> float(out.loss)
  2.0
  """
  lp = jnp.asarray(logprob, F32)
  m = jnp.asarray(loss_mask)
  chex.assert_rank([lp, m], 2)
  chex.assert_equal_shape([lp, m])
  m = m.astype(bool)
  n = jnp.sum(m.astype(F32))
  loss = -jnp.sum(jnp.where(m, lp, 0.0)) / jnp.maximum(n, 1.0)
  return LossOutput(loss, {"sft_tokens": n})
