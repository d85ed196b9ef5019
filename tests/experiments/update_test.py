"""The one RL update builder (`experiments/train.py` `make_update`): weighted loss terms over
row sets and whole parts, minibatches per row set, a controller in place of fixed weights."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import credit
from credit.models import Decoder, ModelConfig
from credit.scoring import score_tokens
from experiments import train

B, T, V = 4, 8, 16
SPEC = credit.get_policy_loss("ppo_clip")
FIELDS = ("advantages", "logprob", "logprob_old", "response_mask")


@pytest.fixture(scope="module")
def model():
  cfg = ModelConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_layers=1,
                    num_heads=2, num_kv_heads=1, head_dim=8, pad_token_id=0)
  return train.split_model(Decoder(cfg, rngs=nnx.Rngs(0)))


def _rows(seed, rows=B):
  rng = np.random.default_rng(seed)
  resp = np.zeros((rows, T), bool)
  resp[:, 3:7] = True
  return {"tokens": rng.integers(1, V, (rows, T)).astype(np.int32),
          "attn_mask": np.ones((rows, T), bool), "response_mask": resp,
          "advantages": (rng.normal(size=(rows, T)) * resp).astype(np.float32),
          "logprob_old": np.full((rows, T), -2.0, np.float32)}


def _state(params, tx):
  return train.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                          opt_state=tx.init(params),
                          key=jax.random.key_data(jax.random.key(0)))


def _terms(rows=train.MAIN, **kw):
  return train.policy_terms(loss_spec=SPEC, loss_fields=FIELDS, loss_kwargs={}, kl_coef=0.0,
                            kl_kind="k3", entropy_coef=kw.pop("entropy_coef", 0.0), rows=rows,
                            **kw)


def test_one_row_set_is_the_minibatch_sgd_of_its_loss(model):
  """With one row set the update is `make_minibatch_sgd` of `make_rl_loss` on the same key:
  the same shuffles, the same parameters (up to the float rounding of two XLA programs)."""
  graphdef, params, rest = model
  tx = optax.adam(1e-2)
  batch = _rows(0, rows=8)
  update = jax.jit(train.make_update(
      graphdef, rest, tx, row_sets=[train.RowSet(train.MAIN)], terms=_terms(entropy_coef=0.01),
      ppo_epochs=2, num_minibatches=2, chunk_size=None))
  new, metrics = update(_state(params, tx), {train.MAIN: batch})
  loss_fn = train.make_rl_loss(graphdef, rest, loss_spec=SPEC, loss_fields=FIELDS,
                               loss_kwargs={}, kl_coef=0.0, kl_kind="k3", entropy_coef=0.01,
                               chunk_size=None)
  sgd = jax.jit(train.make_minibatch_sgd(loss_fn, tx, epochs=2, num_minibatches=2))
  key = jax.random.fold_in(jax.random.key(0), 0)
  p, _, m = sgd(params, tx.init(params), batch, key)
  for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(p)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8)
  np.testing.assert_allclose(metrics["loss"], m["loss"], rtol=1e-6)
  assert "entropy" in metrics
  assert int(new.step) == 1


def test_row_sets_and_an_own_pass_term_are_one_weighted_objective(model):
  """L = L_main + w·L_other + u(batch)·ℓ_own, one gradient: the loss, the per-set metrics
  (prefixed), the sets' own loss metrics and the parameters after one plain SGD step."""
  graphdef, params, rest = model
  tx = optax.sgd(1.0)
  main, other = _rows(1), _rows(2, rows=2)

  def own(p, mb):  # a term on a whole part, with its own pass
    lp, _ = score_tokens(train.merge_model(graphdef, p, rest), mb["extra"]["tokens"],
                         mb["extra"]["attn_mask"], return_entropy=False)
    return -jnp.mean(lp), {"own_loss": -jnp.mean(lp)}

  row_sets = [train.RowSet(train.MAIN, loss_metric="loss_main"),
              train.RowSet("other", weight=0.25, metric_prefix="other_",
                           loss_metric="loss_other")]
  terms = _terms() + _terms("other") + [
      train.LossTerm("own", own, weight=lambda mb: mb["extra"]["w"], rows=None)]
  batch = {train.MAIN: main, "other": other,
           "extra": {"tokens": main["tokens"][:2], "attn_mask": main["attn_mask"][:2],
                     "w": jnp.float32(0.5)}}
  update = jax.jit(train.make_update(graphdef, rest, tx, row_sets=row_sets, terms=terms,
                                     ppo_epochs=1, num_minibatches=1, chunk_size=None))
  new, metrics = update(_state(params, tx), batch)
  rl = train.make_rl_loss(graphdef, rest, loss_spec=SPEC, loss_fields=FIELDS, loss_kwargs={},
                          kl_coef=0.0, kl_kind="k3", entropy_coef=0.0, chunk_size=None)

  def want_loss(p):
    return rl(p, main)[0] + 0.25 * rl(p, other)[0] + 0.5 * own(p, batch)[0]

  loss, grads = jax.value_and_grad(want_loss)(params)
  np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-5)
  np.testing.assert_allclose(metrics["loss_other"], rl(params, other)[0], rtol=1e-5)
  np.testing.assert_allclose(metrics["loss_main"], rl(params, main)[0], rtol=1e-5)
  assert {"pg_loss", "other_pg_loss", "own_loss"} <= set(metrics)
  want = optax.apply_updates(params, jax.tree.map(lambda g: -g, grads))
  for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_a_pass_term_shares_the_row_sets_model_pass(model):
  """A term on a row set reads the set's scores; its weight multiplies it in L_r."""
  graphdef, params, rest = model
  seen = []

  def mean_logprob(scores, mb):
    seen.append(scores["model"] is not None and scores["entropy"] is not None)
    return -jnp.mean(scores["logprob"]), {"mean_nll": -jnp.mean(scores["logprob"])}

  extra = train.LossTerm("nll", mean_logprob, weight=2.0, needs=frozenset({"entropy"}))
  base = train.make_rl_loss(graphdef, rest, loss_spec=SPEC, loss_fields=FIELDS,
                            loss_kwargs={}, kl_coef=0.0, kl_kind="k3", entropy_coef=0.0,
                            chunk_size=None)
  both = train.make_rl_loss(graphdef, rest, loss_spec=SPEC, loss_fields=FIELDS,
                            loss_kwargs={}, kl_coef=0.0, kl_kind="k3", entropy_coef=0.0,
                            chunk_size=None, extra_terms=[extra])
  batch = _rows(3)
  (l0, _), (l1, m1) = base(params, batch), both(params, batch)
  np.testing.assert_allclose(l1, l0 + 2.0 * m1["mean_nll"], rtol=1e-6)
  assert seen == [True]


def test_controller_takes_the_gradient_and_keeps_its_state(model):
  graphdef, params, rest = model
  tx = optax.sgd(1.0)

  def step(p, state, batch, losses):
    assert set(losses) == {train.MAIN}
    loss, grads = jax.value_and_grad(losses[train.MAIN])(p)
    return train.ControlStep(jax.tree.map(lambda g: state * g, grads), loss, state + 1.0,
                             {"half": state})

  ctl = train.Controller(init=jnp.float32(0.5), step=step)
  update = jax.jit(train.make_update(graphdef, rest, tx, row_sets=[train.RowSet(train.MAIN)],
                                     terms=_terms(), ppo_epochs=1, num_minibatches=1,
                                     chunk_size=None, controller=ctl))
  state = _state(params, tx).replace(controller=ctl.init)
  new, metrics = update(state, {train.MAIN: _rows(4)})
  assert float(new.controller) == 1.5 and float(metrics["half"]) == 0.5
  assert {"loss", "grad_norm"} <= set(metrics)
  with pytest.raises(ValueError, match="one step on the whole batch"):
    train.make_update(graphdef, rest, tx, row_sets=[train.RowSet(train.MAIN)], terms=_terms(),
                      ppo_epochs=2, num_minibatches=1, chunk_size=None, controller=ctl)


def test_bad_row_sets_are_refused():
  with pytest.raises(ValueError, match="unique"):
    train.make_update(None, None, optax.sgd(0.1), row_sets=[train.RowSet("a"),
                                                            train.RowSet("a")],
                      terms=[], ppo_epochs=1, num_minibatches=1, chunk_size=None)
  with pytest.raises(ValueError, match="not among"):
    train.make_update(None, None, optax.sgd(0.1), row_sets=[train.RowSet(train.MAIN)],
                      terms=_terms("other"), ppo_epochs=1, num_minibatches=1, chunk_size=None)
