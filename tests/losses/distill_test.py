"""Tests of the distillation losses `topk_distill` and `sd_search` (credit.losses.policy.distill).

The registry-wide properties (numpy reference, stop-gradients, degenerate inputs,
micro-batches, importance weights) run them in tests/losses/policy_test.py and friends with
the bucket fields of `helpers.with_needs`; here: the worked example, the k = V limit,
the pure-distillation and query-only cases, and the errors.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from credit import losses
from credit.divergences import divergence_from_logits
from credit.registry import UnknownNameError
from tests.losses.helpers import run

_P = np.log(np.array([0.7, 0.2, 0.1], np.float32))
_Q = np.log(np.array([0.2, 0.5, 0.3], np.float32))


def _row(n=1, query=None, adv=0.0):
  """A [1,n] batch on policy (ratio 1) with the example's p (student) and q (teacher) buckets."""
  lp = np.full((1, n), -1.0, np.float32)
  return dict(logprob=lp, logprob_old=lp.copy(), advantages=np.full((1, n), adv, np.float32),
              response_mask=np.ones((1, n), bool),
              logprob_topk=np.broadcast_to(_P, (1, n, 3)).copy(),
              teacher_topk_logprob=np.broadcast_to(_Q, (1, n, 3)).copy(),
              **({} if query is None else {"query_mask": np.asarray([query], bool)}))


def test_sd_search_worked_example_jsd():
  # distill_and_structure.md A11: p = [0.7, 0.2, 0.1], q = [0.2, 0.5, 0.3] → JSD = 0.132918.
  loss, metrics, _ = run("sd_search", _row(1, [True]))
  np.testing.assert_allclose(loss, 0.132918, atol=1e-6)
  np.testing.assert_allclose(metrics["distill_div"], 0.132918, atol=1e-6)
  # Two tokens, one of them a query: the JSD counts once, over the response's 2 tokens.
  loss, metrics, _ = run("sd_search", _row(2, [True, False]))
  np.testing.assert_allclose(loss, 0.132918 / 2, atol=1e-6)
  np.testing.assert_allclose(metrics["query_frac"], 0.5)
  # No query tokens: PPO only (zero here, on policy with A = 0).
  loss, _, g = run("sd_search", _row(2, [False, False]))
  assert loss == 0.0 and np.all(g["logprob_topk"] == 0.0)


def test_topk_distill_kinds_on_the_worked_buckets():
  p, q = np.exp(_P.astype(np.float64)), np.exp(_Q.astype(np.float64))
  want = {"reverse_kl": np.sum(p * np.log(p / q)), "forward_kl": np.sum(q * np.log(q / p)),
          "js": 0.132918}
  for kind, w in want.items():
    loss, _, _ = run("topk_distill", _row(), kind=kind)
    np.testing.assert_allclose(loss, w, rtol=1e-5, err_msg=kind)
  loss, _, _ = run("topk_distill", _row(), {"coef": 0.25})
  np.testing.assert_allclose(loss, 0.25 * want["reverse_kl"], rtol=1e-5)


def test_topk_distill_with_all_ids_is_the_full_vocabulary_divergence():
  # k = V (teacher ids = the whole vocabulary, tail bucket empty at the 1e-8 floor): the term
  # is the full reverse KL, in value and in gradient w.r.t. the student's logits.
  rng = np.random.default_rng(0)
  zs, zt = rng.normal(size=(2, 3, 5)).astype(np.float32), rng.normal(size=(2, 3, 5))
  zt = zt.astype(np.float32)
  mask = np.array([[True, True, False], [True, True, True]])
  zero = np.zeros((2, 3), np.float32)

  def buckets(z):
    lp = jax.nn.log_softmax(z, -1)
    return jnp.concatenate([lp, jnp.full(lp.shape[:-1] + (1,), jnp.log(1e-8))], -1)

  def distill(zs):
    return losses.topk_distill_loss(
        logprob=zero, logprob_old=zero, advantages=zero, response_mask=mask,
        logprob_topk=buckets(zs), teacher_topk_logprob=buckets(zt),
        pg_coef=0.0).loss

  def full(zs):
    return jnp.where(mask, divergence_from_logits(zs, zt), 0.0)

  np.testing.assert_allclose(distill(zs), full(zs), atol=1e-6)
  g_d = jax.grad(lambda z: distill(z).sum())(zs)
  g_f = jax.grad(lambda z: full(z).sum())(zs)
  np.testing.assert_allclose(g_d, g_f, atol=1e-6)


def test_pg_coef_zero_is_distillation_only():
  b = _row(2, adv=3.0)
  b["logprob"] = b["logprob"] + np.float32(0.1)  # off policy: PPO would be non-zero
  loss, _, g = run("topk_distill", b, {"pg_coef": 0.0})
  np.testing.assert_allclose(loss, np.sum(np.exp(_P) * (_P - _Q)), rtol=1e-5)
  assert np.all(g["logprob"] == 0.0) and np.any(g["logprob_topk"] != 0.0)
  with_pg, _, g = run("topk_distill", b)
  assert with_pg < loss and np.any(g["logprob"] != 0.0)


def test_queries_outside_the_response_are_ignored():
  b = _row(2, [True, True])
  b["response_mask"] = np.array([[True, False]])
  loss, metrics, _ = run("sd_search", b)
  np.testing.assert_allclose(loss, 0.132918, atol=1e-6)  # one query token, one response token
  np.testing.assert_allclose(metrics["query_frac"], 1.0)


def test_bad_inputs_fail_before_tracing():
  b = _row(1)
  with pytest.raises(UnknownNameError, match="kind .tv.*forward_kl.*js.*reverse_kl"):
    losses.topk_distill_loss(**b, kind="tv")
  with pytest.raises(AssertionError):  # bucket arrays of different k
    losses.topk_distill_loss(**{**b, "teacher_topk_logprob": np.zeros((1, 1, 4), np.float32)})
  with pytest.raises(AssertionError):  # a [B,T] query mask of the wrong shape
    losses.sd_search_loss(**b, query_mask=np.ones((1, 2), bool))
