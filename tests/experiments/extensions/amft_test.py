"""AMFT's controller as an extension (`experiments/extensions/amft.py`): its checks, its
initial state and its step against `credit.losses.amft_step`. The loop end to end is
`tests/experiments/distill_runner_test.py`'s."""
import importlib
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from credit.losses.amft import amft_step
from experiments import extensions, producers, train
from experiments.extensions import amft


def _config(**amft_kw):
  c = importlib.import_module("experiments.configs.grpo_arithmetic").get_config("tiny")
  c.num_minibatches = 1
  c.amft.enabled = True
  c.amft.update(amft_kw)
  return c


@pytest.mark.parametrize("kw,match", [
    (dict(init_mu=1.0), "init_mu"), (dict(val_at="later"), "val_at")])
def test_bad_settings_are_refused(kw, match):
  with pytest.raises(producers.SetupError, match=match):
    amft.check(_config(**kw))


def test_one_update_per_step_and_enough_examples():
  c = _config()
  c.num_minibatches = 2
  with pytest.raises(producers.SetupError, match="num_minibatches=1"):
    amft.check(c)
  data = types.SimpleNamespace(task=types.SimpleNamespace(multi_turn=False), train=[{}] * 4)
  with pytest.raises(producers.SetupError, match="val_examples"):
    amft.check_run(_config(val_examples=4), data=data, batch_divisor=1)
  amft.check_run(_config(val_examples=3), data=data, batch_divisor=1)
  data.task.multi_turn = True
  with pytest.raises(producers.SetupError, match="single-turn"):
    amft.check_run(_config(val_examples=3), data=data, batch_divisor=1)


def test_controller_step_is_amft_step_on_the_row_and_sft_losses():
  """The controller's gradient, μ and φ are `amft_step`'s for the losses it is given (here
  two quadratics), its entropy target the first step's entropy."""
  from credit.models import Decoder, ModelConfig
  from flax import nnx
  cfg = ModelConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_layers=1,
                    num_heads=2, num_kv_heads=1, head_dim=8, pad_token_id=0)
  graphdef, params, rest = train.split_model(Decoder(cfg, rngs=nnx.Rngs(0)))
  ctl = amft.make_controller(graphdef, rest, init_mu=0.25, chunk_size=None, lr=0.1,
                             meta_lr=1.0, entropy_coef=0.1, val_at="lookahead")
  np.testing.assert_allclose(jax.nn.sigmoid(ctl.init.phi), 0.25, rtol=1e-6)
  assert np.isnan(ctl.init.target_entropy)
  rng = np.random.default_rng(0)
  rows = {"tokens": rng.integers(1, 16, (2, 6)).astype(np.int32),
          "attn_mask": np.ones((2, 6), bool), "response_mask": np.ones((2, 6), bool)}
  sq = lambda p, s: sum(jnp.sum((x - s) ** 2) for x in jax.tree.leaves(p))
  losses = {train.MAIN: lambda p: sq(p, 0.1), amft.SFT: lambda p: sq(p, -0.1)}
  batch = {train.MAIN: rows, amft.VAL: rows}
  out = jax.jit(lambda p, st: ctl.step(p, st, batch, losses))(params, ctl.init)
  nll = train.sft_nll(graphdef, rest, None)
  h = float(out.metrics["entropy"])
  want = amft_step(losses[train.MAIN], losses[amft.SFT], lambda p: nll(p, rows), params,
                   ctl.init.phi, lr=0.1, meta_lr=1.0, entropy=h, target_entropy=h,
                   entropy_coef=0.1, val_at="lookahead")
  np.testing.assert_allclose(out.state.phi, want.phi, rtol=1e-5)
  np.testing.assert_allclose(out.metrics["amft_mu"], want.mu, rtol=1e-5)
  np.testing.assert_allclose(out.loss, want.loss, rtol=1e-5)
  np.testing.assert_allclose(out.state.target_entropy, h, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(out.grads), jax.tree.leaves(want.grads)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def test_rows_hook_draws_each_steps_sft_batch_from_the_step():
  """The SFT part depends only on (seed, step), so a resumed run draws the same; the
  validation part is the last `val_examples` train examples, the same every step."""
  from credit import parallel
  from experiments import loop
  c = _config(val_examples=8, sft_batch_size=4)
  c.mesh = "data=1"
  data = loop.build_data(c)
  s = types.SimpleNamespace(c=c, data=data, mesh=parallel.make_mesh(c.mesh), graphdef=None,
                            rest=None, chunk_size=None)
  built = amft.build(s, None)
  assert built.controller is not None and [t.name for t in built.terms] == [amft.SFT]
  at = lambda k: extensions.Step(types.SimpleNamespace(step=jnp.int32(k)), {}, None, False)
  p1, p1b, p2 = (built.rows({train.MAIN: {}}, at(k)) for k in (1, 1, 2))
  host = lambda p, part: np.asarray(jax.device_get(p[part]["tokens"]))
  np.testing.assert_array_equal(host(p1, amft.SFT), host(p1b, amft.SFT))
  assert not np.array_equal(host(p1, amft.SFT), host(p2, amft.SFT))
  np.testing.assert_array_equal(host(p1, amft.VAL), host(p2, amft.VAL))
  assert host(p1, amft.SFT).shape[0] == 4 and host(p1, amft.VAL).shape[0] == 8
