"""Tests of credit.losses.reduction: the shared reduction, sample weights, the decorator and
the registry entries it builds."""
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from credit import losses
from credit.losses import TokenLoss, reduce_policy_loss
from credit.registry import CONFIDENCE_TAGS, UnknownNameError, get_policy_loss
from tests.losses.helpers import (B, EXPECTED, NAMES, T, fn_of, make_batch, np_aggregate,
                                  with_needs)

REDUCTION_ARGS = ("logprob_sampler", "is_level", "is_mode", "is_threshold",
                  "is_threshold_lower", "loss_agg_mode", "num_tokens_global",
                  "num_seqs_global", "norm_constant", "sample_weight", "policy_version",
                  "train_version", "max_staleness")
SEQ_MEAN_DEFAULT = {"gspo", "luspo", "gmpo", "sapo"}


# --------------------------------------------------------------------------
# Registry entries built by `policy_loss`.
# --------------------------------------------------------------------------


def test_registry_has_every_loss_with_contract_needs():
  assert EXPECTED <= set(NAMES)
  for n in NAMES:
    spec = get_policy_loss(n)
    base = {"logprob", "logprob_old", "advantages", "response_mask"}
    # A2TGPO's per-turn clip range reads the turn fields as well.
    # The distillation losses read the student's and teacher's top-k buckets (and queries).
    extra = {"a2tgpo": {"gold_logprob_turns", "gold_logprob_prompt", "step_mask", "turn_id",
                        "group_id"},
             "decoupled_ppo": {"logprob_sampler"},
             "topk_distill": {"logprob_topk", "teacher_topk_logprob"},
             "sd_search": {"logprob_topk", "teacher_topk_logprob", "query_mask"},
             "slate_step": {"parent_id", "prefix_len", "group_id"}}.get(n, set())
    assert spec.needs == base | extra, n
    assert "arXiv" in spec.paper
    assert {"loss_agg_mode", "is_level", "is_mode"} <= set(spec.static_argnames)
    assert spec.confidence in CONFIDENCE_TAGS
    assert spec.token_fn.__name__ == f"{n}_loss"
    assert getattr(losses, f"{n}_loss") is spec.token_fn
    assert spec.fn.__name__ == n and spec.fn.__module__ == spec.token_fn.__module__
  assert {n for n in NAMES if get_policy_loss(n).batch_coupled} == {"clip_cov", "kl_cov", "m2po",
                                                                     "slate_step"}
  assert get_policy_loss("clip_cov").static_argnames[-1] == "clip_cov_ratio"
  assert get_policy_loss("luspo").confidence == "paper-equation"


@pytest.mark.parametrize("name", NAMES)
def test_signature_is_per_token_arguments_plus_the_reduction(name):
  spec = get_policy_loss(name)
  full = inspect.signature(spec.fn).parameters
  token = inspect.signature(spec.token_fn).parameters
  assert list(full) == list(token) + list(REDUCTION_ARGS)
  assert spec.params == tuple(full)
  assert all(p.kind is p.KEYWORD_ONLY for p in full.values())
  want = "seq-mean-token-mean" if name in SEQ_MEAN_DEFAULT else "token-mean"
  want = "token-sum" if name == "slate_step" else want  # its weights hold the averages
  assert full["loss_agg_mode"].default == want
  assert set(REDUCTION_ARGS).isdisjoint(token)
  doc = spec.fn.__doc__
  assert "Args:" in doc and "sample_weight:" in doc and f'default "{want}"' in doc
  assert doc.startswith(inspect.cleandoc(spec.token_fn.__doc__).split("\n", 1)[0])


@pytest.mark.parametrize("name", NAMES)
def test_full_loss_is_token_loss_then_reduction(name):
  b = with_needs(name, make_batch(3))
  smp = b["logprob_old"] + np.float32(0.1) * np.sin(np.arange(B * T, dtype=np.float32)
                                                    ).reshape(B, T)
  w = np.linspace(0.0, 2.0, B).astype(np.float32)
  red = dict(logprob_sampler=smp, is_level="geometric", is_mode="mask", is_threshold=1.05,
             loss_agg_mode="seq-mean-token-sum-norm", norm_constant=7.0, sample_weight=w)
  spec = get_policy_loss(name)
  got = spec.fn(**b, **red)
  tok = spec.token_fn(**b)
  want = reduce_policy_loss(tok, logprob=b["logprob"], logprob_old=b["logprob_old"],
                            response_mask=b["response_mask"], **red)
  np.testing.assert_array_equal(got.loss, want.loss)
  assert set(got.metrics) == set(want.metrics)
  for k in want.metrics:
    np.testing.assert_array_equal(got.metrics[k], want.metrics[k], err_msg=k)


@pytest.mark.parametrize("name", NAMES)
def test_token_loss_is_float32_and_zero_outside_the_mask(name):
  b = with_needs(name, make_batch(4))
  m = b["response_mask"]
  junk = {k: np.where(m.reshape(m.shape + (1,) * (v.ndim - 2)), v, np.nan).astype(np.float32)
          for k, v in b.items() if v.dtype != bool}
  out = get_policy_loss(name).token_fn(**{**b, **junk})
  assert isinstance(out, TokenLoss) and out.loss.dtype == jnp.float32
  assert out.loss.shape == (B, T)
  np.testing.assert_array_equal(np.asarray(out.loss)[~m], 0.0)
  assert np.all(np.isfinite(out.loss))


def test_policy_loss_rejects_per_token_functions_it_cannot_reduce():
  def no_mask(*, logprob, logprob_old, advantages):
    """Confidence: inferred."""

  def takes_reduction_arg(*, logprob, logprob_old, advantages, response_mask, norm_constant):
    """Confidence: inferred."""

  def positional(logprob, *, logprob_old, advantages, response_mask):
    """Confidence: inferred."""

  for fn in (no_mask, takes_reduction_arg, positional):
    with pytest.raises(TypeError, match="keyword-only"):
      losses.policy_loss("test_never_registered", "arXiv 0000.00000")(fn)
  with pytest.raises(UnknownNameError, match="loss_agg_mode"):
    losses.policy_loss("test_never_registered", "x", loss_agg_mode="mean")
  assert "test_never_registered" not in NAMES


def test_unknown_aggregation_mode_fails_before_any_work():
  with pytest.raises(UnknownNameError, match="loss_agg_mode"):
    fn_of("ppo_clip")(**make_batch(), loss_agg_mode="sum")
  # ... even with arrays of the wrong shape, which the per-token term would reject.
  with pytest.raises(UnknownNameError, match="loss_agg_mode"):
    fn_of("gpg")(logprob=1.0, logprob_old=1.0, advantages=1.0, response_mask=True,
                 loss_agg_mode="sum")


# --------------------------------------------------------------------------
# reduce_policy_loss: metrics and per-sample weights.
# --------------------------------------------------------------------------


def _token_loss_batch(seed=5):
  b = make_batch(seed)
  rng = np.random.default_rng(seed)
  l = rng.normal(size=(B, T)).astype(np.float32)
  return b, l


def _reduce(l, b, **kw):
  return reduce_policy_loss(TokenLoss(l, {}), logprob=b["logprob"],
                            logprob_old=b["logprob_old"], response_mask=b["response_mask"],
                            norm_constant=7.0, **kw)


def test_metrics_are_masked_token_means_and_scalars():
  b, l = _token_loss_batch()
  m = b["response_mask"]
  flag = np.arange(B * T).reshape(B, T) % 3 == 0
  out = reduce_policy_loss(TokenLoss(l, {"flag": flag, "value": l, "s": jnp.float32(4.0)}),
                           logprob=b["logprob"], logprob_old=b["logprob_old"],
                           response_mask=m)
  np.testing.assert_allclose(out.metrics["flag"], flag[m].mean(), rtol=1e-6)
  np.testing.assert_allclose(out.metrics["value"], l[m].mean(), rtol=1e-5)
  assert out.metrics["s"] == 4.0
  d = (b["logprob"] - b["logprob_old"])[m]
  np.testing.assert_allclose(out.metrics["approx_kl"], -d.mean(), rtol=1e-5)
  np.testing.assert_allclose(out.metrics["ratio_mean"], np.exp(d).mean(), rtol=1e-5)
  np.testing.assert_allclose(out.metrics["ratio_max"], np.exp(d.max()), rtol=1e-5)
  np.testing.assert_allclose(out.metrics["ratio_min"], np.exp(d.min()), rtol=1e-5)
  assert not any(k.startswith("is_") for k in out.metrics)


@pytest.mark.parametrize("mode", losses.AGG_MODES)
def test_sample_weight_one_is_no_weight(mode):
  b, l = _token_loss_batch()
  plain = _reduce(l, b, loss_agg_mode=mode)
  ones = _reduce(l, b, loss_agg_mode=mode, sample_weight=np.ones(B, np.float32))
  np.testing.assert_array_equal(ones.loss, plain.loss)
  assert set(ones.metrics) == set(plain.metrics)


@pytest.mark.parametrize("mode", losses.AGG_MODES)
def test_sample_weight_scales_rows_and_keeps_them_in_the_counts(mode):
  b, l = _token_loss_batch()
  m = b["response_mask"]
  w = np.array([0.0, 1.0, 2.0, 0.5, 0.0, 1.0, 3.0, 1.0], np.float32)
  f = lambda x: _reduce(x, b, loss_agg_mode=mode, sample_weight=w).loss
  got, g = jax.value_and_grad(f)(l)
  # Rows scale by their weight; the denominators (N, B') are those of the unweighted batch.
  np.testing.assert_allclose(got, np_aggregate(l * w[:, None], m, mode, C=7.0), rtol=1e-5,
                             atol=1e-6)
  zeroed = np.where((w == 0)[:, None], 0.0, l).astype(np.float32)
  np.testing.assert_allclose(got, _reduce(zeroed * w[:, None], b, loss_agg_mode=mode).loss,
                             rtol=1e-5, atol=1e-6)
  # A weight-0 row contributes nothing, not even a gradient; metrics are unweighted.
  np.testing.assert_array_equal(np.asarray(g)[w == 0], 0.0)
  plain = _reduce(l, b, loss_agg_mode=mode)
  out = _reduce(l, b, loss_agg_mode=mode, sample_weight=w)
  for k in plain.metrics:
    np.testing.assert_array_equal(out.metrics[k], plain.metrics[k], err_msg=k)


def test_sample_weight_is_stop_gradient_combines_with_importance_and_ignores_empty_rows():
  b, l = _token_loss_batch()
  m = b["response_mask"].copy()
  m[2] = False
  b["response_mask"] = m
  w = np.linspace(0.5, 1.5, B).astype(np.float32)
  w[2] = np.nan  # an empty row's weight is never used
  smp = b["logprob_old"] - np.float32(np.log(0.5))  # constant IS weight 0.5

  def f(x, ww):
    return _reduce(x, b, sample_weight=ww, logprob_sampler=smp).loss

  got, (g_l, g_w) = jax.value_and_grad(f, argnums=(0, 1))(l, w)
  w_used = np.where(m.any(1), w, 0.0)
  np.testing.assert_allclose(got, 0.5 * np_aggregate(l * w_used[:, None], m, "token-mean"),
                             rtol=1e-5)
  np.testing.assert_array_equal(g_w, 0.0)
  assert np.all(np.isfinite(g_l))


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "clip_cov"])
def test_full_losses_take_sample_weight(name):
  b = make_batch(6)
  w = np.where(np.arange(B) % 2 == 0, 1.0, 0.0).astype(np.float32)
  fn = fn_of(name)
  got = fn(**b, sample_weight=w)
  tok = get_policy_loss(name).token_fn(**b)
  mode = inspect.signature(fn).parameters["loss_agg_mode"].default
  want = losses.aggregate_loss(tok.loss * w[:, None], b["response_mask"], mode)
  np.testing.assert_allclose(got.loss, want, rtol=1e-6)
