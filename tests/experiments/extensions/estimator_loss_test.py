"""An estimator's own loss term as an extension (`experiments/extensions/estimator_loss.py`):
its weight, checks, needs and the term on the policy loss's model pass. The terms trained
end to end (VIMPO, VeriFree, JEPO) are `tests/experiments/runner_test.py`'s."""
import importlib

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import credit
from credit.models import Decoder, ModelConfig
from experiments import producers, train
from experiments.extensions import estimator_loss


def _config(**kw):
  c = importlib.import_module("experiments.configs.grpo_arithmetic").get_config("tiny")
  for k, v in kw.items():
    c[k] = v
  return c


def test_weight_is_the_config_or_the_registered_default():
  vimpo = credit.get_estimator("vimpo")
  assert estimator_loss.coef(_config(estimator="vimpo"), vimpo) == vimpo.trained_loss.coef
  assert estimator_loss.coef(_config(estimator_loss_coef=3.0), vimpo) == 3.0
  assert estimator_loss.coef(_config(), credit.get_estimator("grpo")) == 0.0
  assert estimator_loss.on(_config(estimator="vimpo"))
  assert not estimator_loss.on(_config(estimator="vimpo", estimator_loss_coef=0.0))
  assert not estimator_loss.on(_config())


@pytest.mark.parametrize("kw,match", [
    (dict(estimator="vimpo", estimator_loss_coef=-1.0), "must be >= 0"),
    (dict(estimator_loss_coef=1.0), r"'grpo' has no loss term.*'vimpo'"),
])
def test_bad_weights_are_refused(kw, match):
  with pytest.raises(producers.SetupError, match=match):
    estimator_loss.check(_config(**kw))


def test_needs_and_resolved_term():
  c = _config(estimator="vimpo")
  est = credit.get_estimator("vimpo")
  needs = estimator_loss.needs(c, est)
  assert set(needs) >= {"logprob_ref", "response_mask"}
  assert needs["logprob_ref"] == "estimator 'vimpo''s loss term"
  r = estimator_loss.resolve(c, est, dict(c.estimator_kwargs))
  assert r.value.coef == est.trained_loss.coef and "value_target" in r.value.inputs
  assert r.update_fields == frozenset(r.value.batch_fields)
  assert estimator_loss.needs(_config(estimator="vimpo", estimator_loss_coef=0.0), est) == {}


def test_term_adds_coef_times_its_value_on_the_same_pass():
  cfg = ModelConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_layers=1,
                    num_heads=2, num_kv_heads=1, head_dim=8, pad_token_id=0)
  graphdef, params, rest = train.split_model(Decoder(cfg, rngs=nnx.Rngs(0)))

  def mean_logprob(*, logprob, response_mask, scale):
    return -scale * jnp.sum(jnp.where(response_mask, logprob, 0.0)) / jnp.sum(response_mask)

  term = estimator_loss.EstimatorLoss(fn=mean_logprob, inputs=("response_mask",),
                                      kwargs={"scale": 2.0}, coef=0.25)
  rng = np.random.default_rng(0)
  resp = np.zeros((2, 6), bool)
  resp[:, 3:] = True
  mb = {"tokens": rng.integers(1, 16, (2, 6)).astype(np.int32),
        "attn_mask": np.ones((2, 6), bool), "response_mask": resp,
        "advantages": np.zeros((2, 6), np.float32),
        "logprob_old": np.zeros((2, 6), np.float32)}
  kw = dict(loss_spec=credit.get_policy_loss("ppo_clip"),
            loss_fields=("advantages", "logprob", "logprob_old", "response_mask"),
            loss_kwargs={}, kl_coef=0.0, kl_kind="k3", entropy_coef=0.0, chunk_size=None)
  base = train.make_rl_loss(graphdef, rest, **kw)
  with_term = train.make_rl_loss(graphdef, rest, **kw,
                                 extra_terms=[estimator_loss.loss_term(term, None)])
  (l0, _), (l1, m1) = base(params, mb), with_term(params, mb)
  np.testing.assert_allclose(l1, l0 + 0.25 * m1["estimator_loss"], rtol=1e-6)
  assert float(m1["estimator_loss"]) > 0
