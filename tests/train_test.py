"""Pure step functions of the runner (experiments/train.py): extra loss terms."""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import credit
from credit.losses import observation_ce_loss
from credit.models import Decoder, ModelConfig
from credit.scoring import score_tokens
from experiments import train


def test_observation_cross_entropy_adds_echo_term_to_the_rl_loss():
  """With obs_ce_coef = λ the RL loss is the policy loss + λ·observation_ce_loss of the same
  model pass over `obs_mask` (ECHO), and its gradient reaches the parameters; λ = 0 leaves
  the loss as it was."""
  cfg = ModelConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_layers=1,
                    num_heads=2, num_kv_heads=1, head_dim=8, pad_token_id=0)
  graphdef, params, rest = train.split_model(Decoder(cfg, rngs=nnx.Rngs(0)))
  rng = np.random.default_rng(0)
  B, T = 4, 10
  tokens = rng.integers(1, 16, (B, T)).astype(np.int32)
  attn = np.ones((B, T), bool)
  resp = np.zeros((B, T), bool)
  resp[:, 3:6] = True
  obs = np.zeros((B, T), bool)
  obs[:, 6:9] = True          # an observation after the first action turn
  obs[3] = False              # a row without observations
  mb = {"tokens": tokens, "attn_mask": attn, "response_mask": resp, "obs_mask": obs,
        "advantages": rng.normal(size=(B, T)).astype(np.float32) * resp,
        "logprob_old": np.zeros((B, T), np.float32)}
  spec = credit.get_policy_loss("ppo_clip")
  fields = ("advantages", "logprob", "logprob_old", "response_mask")

  def loss(coef):
    fn = train.make_rl_loss(graphdef, rest, loss_spec=spec, loss_fields=fields, loss_kwargs={},
                            kl_coef=0.0, kl_kind="k3", entropy_coef=0.0, chunk_size=None,
                            obs_ce_coef=coef)
    return jax.jit(fn)(params, mb)

  (base, m0), (with_ce, m1) = loss(0.0), loss(0.5)
  logprob, _ = jax.jit(lambda p: score_tokens(train.merge_model(graphdef, p, rest), tokens, attn,
                                              chunk_size=None, return_entropy=False))(params)
  want = observation_ce_loss(logprob=logprob, obs_mask=obs, coef=0.5)
  np.testing.assert_allclose(with_ce, base + want.loss, rtol=1e-5)
  assert "obs_tokens" not in m0 and float(m1["obs_tokens"]) == obs.sum()
  fn = train.make_rl_loss(graphdef, rest, loss_spec=spec, loss_fields=fields, loss_kwargs={},
                          kl_coef=0.0, kl_kind="k3", entropy_coef=0.0, chunk_size=None,
                          obs_ce_coef=1.0)
  grads = jax.jit(jax.grad(lambda p: fn(p, dict(mb, advantages=np.zeros((B, T), np.float32)))[0]))(
      params)
  assert float(jnp.sqrt(sum(jnp.sum(g ** 2) for g in jax.tree.leaves(grads)))) > 0
