"""The critical batch's objective as an extension (`experiments/extensions/critical.py`):
the batch moves out of the rollout's rows into a part of its own and the update descends
rl_weight·L_RL + weight·L_critical. The producers that make the batch are
`tests/experiments/critical_test.py`'s."""
import importlib
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import credit
from credit.models import Decoder, ModelConfig
from experiments import train
from experiments.extensions import critical

T, V = 8, 16


def _config(recipe="cso_chain"):
  return importlib.import_module(f"experiments.configs.{recipe}").get_config("tiny")


def test_on_needs_and_update_fields():
  c = _config()
  assert critical.on(c) and not critical.on(_config("grpo_arithmetic"))
  assert critical.needs(c, None) == {critical.FIELD: "critical (objective 'dpo')"}
  assert critical.resolve(c, None, {}).update_fields == frozenset({critical.FIELD})


def test_rows_hook_moves_the_batch_into_its_own_part():
  batch = {"tokens": np.zeros((2, 3))}
  main = {"tokens": np.ones((4, 3)), critical.FIELD: batch}
  parts = critical.move_to_own_part({train.MAIN: main}, None)
  assert parts[critical.FIELD] is batch and critical.FIELD not in parts[train.MAIN]
  assert critical.FIELD in main  # the caller's dict is left as it was


def test_update_descends_the_scheduled_sum():
  """One plain SGD step of the built update: loss = rl_weight·L_RL + weight·L_SFT, the weights
  read from the critical batch (here 0.5 and 2), the gradient that of the sum."""
  cfg = ModelConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_layers=1,
                    num_heads=2, num_kv_heads=1, head_dim=8, pad_token_id=0)
  graphdef, params, rest = train.split_model(Decoder(cfg, rngs=nnx.Rngs(0)))
  c = _config("int_chain")  # objective sft
  s = types.SimpleNamespace(c=c, graphdef=graphdef, rest=rest, chunk_size=None)
  built = critical.build(s, None)
  rng = np.random.default_rng(0)
  resp = np.zeros((4, T), bool)
  resp[:, 4:] = True
  rows = {"tokens": rng.integers(1, V, (4, T)).astype(np.int32),
          "attn_mask": np.ones((4, T), bool), "response_mask": resp,
          "advantages": (rng.normal(size=(4, T)) * resp).astype(np.float32),
          "logprob_old": np.full((4, T), -2.0, np.float32)}
  loss_mask = np.zeros((2, T), bool)
  loss_mask[:, 3:6] = True
  crit = {"tokens": rows["tokens"][:2], "attn_mask": np.ones((2, T), bool),
          "loss_mask": loss_mask, "rl_weight": jnp.float32(0.5), "weight": jnp.float32(2.0)}
  spec = credit.get_policy_loss("ppo_clip")
  fields = ("advantages", "logprob", "logprob_old", "response_mask")
  kw = dict(loss_spec=spec, loss_fields=fields, loss_kwargs={}, kl_coef=0.0, kl_kind="k3",
            entropy_coef=0.0)
  tx = optax.sgd(1.0)
  update = jax.jit(train.make_update(
      graphdef, rest, tx, row_sets=[train.RowSet(train.MAIN, weight=built.main_weight)],
      terms=train.policy_terms(**kw) + list(built.terms), ppo_epochs=1, num_minibatches=1,
      chunk_size=None))
  parts = built.rows({train.MAIN: dict(rows, **{critical.FIELD: crit})}, None)
  state = train.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                           opt_state=tx.init(params), key=jax.random.key_data(jax.random.key(0)))
  new, metrics = update(state, parts)
  rl = train.make_rl_loss(graphdef, rest, chunk_size=None, **kw)
  sft = critical.make_loss(graphdef, rest, objective="sft", beta=0.1, chunk_size=None)
  want = lambda p: 0.5 * rl(p, rows)[0] + 2.0 * sft(p, crit)[0]
  loss, grads = jax.value_and_grad(want)(params)
  np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-5)
  np.testing.assert_allclose(metrics["critical_loss"], sft(params, crit)[0], rtol=1e-5)
  for a, b, g in zip(jax.tree.leaves(new.params), jax.tree.leaves(params),
                     jax.tree.leaves(grads)):
    np.testing.assert_allclose(a, b - g, rtol=1e-5, atol=1e-7)
