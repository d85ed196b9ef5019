"""Tests of credit.losses.entropy_bonus."""
import jax
import numpy as np
import pytest

from credit import losses
from tests.losses.helpers import B, make_batch, np_aggregate


def test_entropy_bonus_token_mean_and_gradient():
  b = make_batch(21)
  h = np.abs(b["logprob"])
  m = b["response_mask"]
  out = losses.entropy_bonus(entropy=h, response_mask=m, coef=0.01)
  np.testing.assert_allclose(out.loss, -0.01 * h[m].mean(), rtol=1e-6)
  np.testing.assert_allclose(out.metrics["entropy"], h[m].mean(), rtol=1e-6)
  g = jax.grad(lambda x: losses.entropy_bonus(entropy=x, response_mask=m, coef=0.01).loss)(h)
  np.testing.assert_allclose(g, np.where(m, -0.01 / m.sum(), 0.0), rtol=1e-6)


@pytest.mark.parametrize("mode", losses.AGG_MODES)
def test_entropy_bonus_follows_the_aggregation_mode(mode):
  b = make_batch(22)
  m = b["response_mask"]
  h = np.where(m, np.abs(b["logprob"]), np.nan).astype(np.float32)  # garbage off the mask
  kw = dict(num_tokens_global=40.0, num_seqs_global=9.0, norm_constant=6.0)
  out = losses.entropy_bonus(entropy=h, response_mask=m, coef=0.3, loss_agg_mode=mode, **kw)
  want = losses.aggregate_loss(h, m, mode, **kw)
  np.testing.assert_allclose(out.loss, -0.3 * want, rtol=1e-6)
  np.testing.assert_allclose(out.metrics["entropy_agg"], want, rtol=1e-6)
  np.testing.assert_allclose(want, np_aggregate(h, m, mode, C=6.0, nt=40.0, ns=9.0),
                             rtol=1e-5)
  g = jax.grad(lambda x: losses.entropy_bonus(entropy=x, response_mask=m, coef=0.3,
                                              loss_agg_mode=mode, **kw).loss)(h)
  assert np.all(np.isfinite(g)) and np.all(np.asarray(g)[~m] == 0.0)
  assert g.shape == (B, h.shape[1])


def test_entropy_bonus_unknown_mode():
  m = np.ones((2, 2), bool)
  with pytest.raises(ValueError, match="loss_agg_mode"):
    losses.entropy_bonus(entropy=np.ones((2, 2)), response_mask=m, loss_agg_mode="mean")
