"""SCOPE (credit/advantages/distill/scope.py): the code's defaults against a transcription of
machine981/SCOPE (`_compute_scope_dual_path_weights`, `compute_advantage`, the weighted SFT
term of `dp_actor.py`); the paper-form options against the loop reference of `_ref_teach`."""
from __future__ import annotations

import doctest

import jax
import numpy as np
import pytest

from credit import registry
from credit.advantages.distill import scope
from tests.advantages.distill._harness import reference_test, run, table
from tests.advantages.distill._ref_teach import (B, G, N, T, batch, pick, ref_scope,
                                                 ref_scope_weights, row_valid)

FIELDS = ("reward", "group_id", "response_mask", "logprob_old", "logprob_teacher")
# The loop reference `ref_scope` is the student-uncertainty form without the token rescale.
_PAPERISH = dict(student_weight="uncertain", mle_token_scale=False)
CONFIGS = {
    "default": dict(_PAPERISH),
    "tempered": dict(_PAPERISH, temperature=0.5, mle_coef=0.3, success_threshold=0.5),
    "fast": dict(_PAPERISH, group_size=G),
}




def ref_paperish(b, **cfg):
  return ref_scope(b, **{k: v for k, v in cfg.items() if k not in _PAPERISH})


CASES = table(scope.scope_advantages, FIELDS, ref_paperish, CONFIGS, rtol=1e-4, atol=1e-5)
CASE = {c.id: c for c in CASES}
test_matches_numpy_reference = reference_test(CASES)


def test_registered():
  spec = registry.get_estimator("scope")
  assert spec.family == "distill" and spec.confidence == "code-verified"
  assert "machine981/SCOPE" in spec.source
  assert spec.needs == set(FIELDS)


def test_doctests():
  res = doctest.testmod(scope, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_spec_example():
  lp = lambda ppl: -np.log(np.asarray(ppl, np.float32))[:, None]
  w, correct = scope.scope_weights(
      reward=np.array([1., 1., 0., 0.]), group_id=np.zeros(4, np.int32),
      response_mask=np.ones((4, 1), bool), logprob_old=lp([1.2, 2.0, 1.0, 1.0]),
      logprob_teacher=lp([1.0, 1.0, 1.5, 3.0]), num_groups=1, student_weight="uncertain")
  np.testing.assert_allclose(np.asarray(w), [0.75, 1.25, 1.333333, 0.666667], atol=1e-5)
  assert np.asarray(correct).tolist() == [True, True, False, False]


@pytest.mark.parametrize("seed", [2, 3])
def test_weights_are_mean_one_per_group_and_path(seed):
  b = batch(seed)
  w, correct = scope.scope_weights(**pick(b, *FIELDS), num_groups=N, student_weight="uncertain")
  w, correct, valid = np.asarray(w), np.asarray(correct), row_valid(b)
  np.testing.assert_allclose(w, ref_scope_weights(b), rtol=1e-4, atol=1e-6)
  assert np.all(w[~valid] == 0.0) and np.all(w[valid] > 0.0)
  for g in range(N):
    for path in (True, False):
      on = valid & (b["group_id"] == g) & (correct == path)
      if on.any():
        np.testing.assert_allclose(w[on].mean(), 1.0, rtol=1e-5)


def test_paths_and_signs():
  b = batch(4)
  a = np.asarray(run(CASE["default"], b))
  correct = (b["reward"] >= 1.0)[:, None] & b["response_mask"] & row_valid(b)[:, None]
  assert np.all(a[correct] > 0.0)                    # MLE path: λ·w > 0 on every token
  # Failed path: the sign of the teacher gap is kept (w > 0).
  same = dict(b, logprob_teacher=b["logprob_old"])
  a = np.asarray(run(CASE["default"], same))
  assert np.all(a[~correct] == 0.0)


def test_no_gradient_and_bad_shape():
  b = batch(5)
  f = lambda lo: scope.scope_advantages(**dict(pick(b, *FIELDS), logprob_old=lo),
                                        num_groups=N).sum()
  assert np.all(np.asarray(jax.grad(f)(np.full((B, T), -1.0, np.float32))) == 0.0)
  with pytest.raises(AssertionError):
    scope.scope_advantages(**dict(pick(b, *FIELDS), logprob_teacher=np.zeros((B, T + 1))),
                           num_groups=N)


# --------------------------------------------------------------------------
# The code's defaults (machine981/SCOPE, the released run_experiment_*.sh flags).
# --------------------------------------------------------------------------


def code_weights(R, mask, ls, lt, uid, tau=1.0, student_sign=1.0, teacher_sign=1.0):
  """`_compute_scope_dual_path_weights`: per uid, softmax(sign·mean logp/τ)·n on each path."""
  seq_len = np.maximum(mask.sum(-1), 1.0)
  s_logp = (ls * mask).sum(-1) / seq_len
  t_logp = (lt * mask).sum(-1) / seq_len
  correct = R > 0
  sw, tw = np.zeros(len(R)), np.zeros(len(R))
  for u in np.unique(uid):
    for path, out, logp, sign in ((True, sw, s_logp, student_sign),
                                  (False, tw, t_logp, teacher_sign)):
      idx = [i for i in range(len(R)) if uid[i] == u and correct[i] == path]
      if len(idx) == 1:
        out[idx[0]] = 1.0
      elif idx:
        z = np.array([sign * logp[i] / tau for i in idx])
        e = np.exp(z - z.max())
        for j, i in enumerate(idx):
          out[i] = e[j] / e.sum() * len(idx)
  return sw, tw


def code_gradient(R, mask, ls, lt, uid, kl_type="kl"):
  """∂loss/∂log π at π = π_old of the code's update: the PPO loss (token-mean over all
  response tokens) on advantages −kl_penalty(ℓˢ, ℓᵀ)·w_teacher, plus the SFT term
  −w_student·log π token-mean over the correct rows' tokens."""
  sw, tw = code_weights(R, mask, ls, lt, uid)
  if kl_type == "kl":
    kld = ls - lt
  else:                                        # low_var_kl
    kl = lt - ls
    kld = np.clip(np.exp(kl) - kl - 1, -10, 10)
  adv = -kld * tw[:, None]
  n_all = mask.sum()
  correct_tok = (sw > 0)[:, None] & mask
  grad = -adv * mask / n_all                   # d(−A·ρ)/d log π = −A·ρ = −A at ρ = 1
  grad -= sw[:, None] * correct_tok / max(correct_tok.sum(), 1)
  return grad


def _code_batch(seed):
  rng = np.random.default_rng(seed)
  Bn, Tn = 12, 6
  R = rng.choice([0.0, 1.0], Bn)
  R[:4] = [1, 0, 0, 0]                         # a lone correct row in group 0
  mask = np.arange(Tn)[None, :] < rng.integers(1, Tn + 1, Bn)[:, None]
  ls = rng.uniform(-3, -0.05, (Bn, Tn)) * mask
  lt = rng.uniform(-3, -0.05, (Bn, Tn)) * mask
  uid = np.repeat(np.arange(3), 4)
  return R, mask, ls, lt, uid


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kind", ["k1", "low_var_kl"])
def test_default_update_has_the_code_gradient(seed, kind):
  # One update per batch as in the scripts: at π = π_old, our advantages through the
  # library's token-mean PPO loss give the gradient of the code's PPO + weighted SFT losses.
  R, mask, ls, lt, uid = _code_batch(seed)
  f32 = lambda x: np.asarray(x, np.float32)
  adv = scope.scope_advantages(reward=f32(R), group_id=uid.astype(np.int32),
                               response_mask=mask, logprob_old=f32(ls), logprob_teacher=f32(lt),
                               num_groups=3, distill_kind=kind)
  loss = registry.get_policy_loss("ppo_clip").fn
  g = jax.grad(lambda lp: loss(logprob=lp, logprob_old=f32(ls), advantages=adv,
                               response_mask=mask).loss)(f32(ls))
  want = code_gradient(R, mask, ls, lt, uid, "kl" if kind == "k1" else "low_var_kl")
  np.testing.assert_allclose(np.asarray(g), want, rtol=1e-4, atol=1e-6)


def test_code_weights_and_the_paper_forms():
  R, mask, ls, lt, uid = _code_batch(3)
  f32 = lambda x: np.asarray(x, np.float32)
  kw = dict(reward=f32(R), group_id=uid.astype(np.int32), response_mask=mask,
            logprob_old=f32(ls), logprob_teacher=f32(lt), num_groups=3)
  sw, tw = code_weights(R, mask, ls, lt, uid)
  w, correct = scope.scope_weights(**kw)
  np.testing.assert_allclose(np.asarray(w), np.where(R > 0, sw, tw), rtol=1e-5)
  # The code with the student flag off (the paper's "uncertain" direction).
  sw_u, _ = code_weights(R, mask, ls, lt, uid, student_sign=-1.0)
  w_u, _ = scope.scope_weights(**kw, student_weight="uncertain")
  np.testing.assert_allclose(np.asarray(w_u)[R > 0], sw_u[R > 0], rtol=1e-5)
  # "paper" normalisation: the softmax alone, so each path sums to 1 in each group.
  w_p, _ = scope.scope_weights(**kw, normalization="paper")
  for u in range(3):
    for path in (True, False):
      on = (uid == u) & ((R > 0) == path)
      if on.sum() > 1:
        np.testing.assert_allclose(np.asarray(w_p)[on].sum(), 1.0, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(w_p)[on] * on.sum(), np.asarray(w)[on],
                                   rtol=1e-5)
      elif on.sum() == 1:
        assert np.asarray(w_p)[on][0] == 1.0


def test_low_var_kl_signal_is_never_positive_and_clipped():
  R, mask, ls, lt, uid = _code_batch(4)
  lt = lt.copy()
  lt[1, 0], ls[1, 0] = -0.01, -19.0            # δ = 19: k3 ≈ e^19, clipped at 10
  a = np.asarray(scope.scope_advantages(
      reward=np.float32(R), group_id=uid.astype(np.int32), response_mask=mask,
      logprob_old=np.float32(ls), logprob_teacher=np.float32(lt), num_groups=3,
      distill_kind="low_var_kl"))
  failed = (R == 0)[:, None] & mask
  assert np.all(a[failed] <= 0.0)
  w, _ = scope.scope_weights(reward=np.float32(R), group_id=uid.astype(np.int32),
                             response_mask=mask, logprob_old=np.float32(ls),
                             logprob_teacher=np.float32(lt), num_groups=3)
  np.testing.assert_allclose(a[1, 0], -10.0 * np.asarray(w)[1], rtol=1e-5)
