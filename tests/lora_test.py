"""Tests for credit.models.lora."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from credit.models import (Decoder, LoRAEinsum, LoRAParam, apply_lora, lora_trainable_mask,
                           merge_lora, save_pretrained, tiny_config)

CFG = tiny_config("qwen2", num_layers=1)


def _base_model(seed=0):
  model = nnx.eval_shape(lambda: Decoder(CFG, rngs=nnx.Rngs(0)))
  rng = np.random.RandomState(seed)
  for _, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    var.set_value(jnp.asarray(0.3 * rng.standard_normal(var.shape), var.dtype))
  return model


TOKENS = jnp.asarray(np.random.RandomState(1).randint(0, 128, (2, 7)), jnp.int32)
MASK = jnp.asarray(np.arange(7)[None, :] >= np.array([[0], [3]]))
TARGETS = ("q_proj", "v_proj", r"layers\.0\.mlp\.down_proj")

_logits = nnx.jit(lambda m: m(TOKENS, mask_BT=MASK)[0])


def _loss(model):
  logits = model(TOKENS, mask_BT=MASK)[0]
  logp = jax.nn.log_softmax(logits[:, :-1])
  nll = -jnp.take_along_axis(logp, TOKENS[:, 1:, None], axis=-1)[..., 0]
  return jnp.sum(jnp.where(MASK[:, 1:], nll, 0.0)) / jnp.sum(MASK[:, 1:])


def _lora_model():
  return apply_lora(_base_model(), rank=4, alpha=8.0, targets=TARGETS, rngs=nnx.Rngs(3))


def _frozen(model):
  return nnx.state(model, nnx.All(nnx.Param, nnx.Not(LoRAParam)))


def _flat(state):
  return {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(state)}


def test_apply_lora_targets_and_initial_equality():
  base = _logits(_base_model())
  model = _lora_model()
  attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
  assert isinstance(attn.q_proj, LoRAEinsum) and isinstance(attn.v_proj, LoRAEinsum)
  assert isinstance(mlp.down_proj, LoRAEinsum)
  assert not isinstance(attn.k_proj, LoRAEinsum) and not isinstance(mlp.up_proj, LoRAEinsum)
  assert attn.q_proj.lora_a[...].shape == (64, 4)
  assert attn.q_proj.lora_b[...].shape == (4, 4, 16)
  assert mlp.down_proj.lora_a.get_metadata()["out_sharding"] == ("mlp", "lora_rank")
  assert not np.asarray(attn.q_proj.lora_b[...]).any() and np.asarray(attn.q_proj.lora_a[...]).any()
  np.testing.assert_array_equal(np.asarray(_logits(model)), np.asarray(base))
  with pytest.raises(ValueError, match="no projection"):
    apply_lora(_base_model(), rank=2, alpha=1.0, targets=("nope",), rngs=nnx.Rngs(0))


def test_training_changes_only_lora_params():
  """nnx.Optimizer(wrt=LoRAParam) and optax.multi_transform over the mask both leave W₀ alone."""
  model = _lora_model()
  frozen0, lora0 = _flat(_frozen(model)), _flat(nnx.state(model, LoRAParam))
  opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=LoRAParam)

  @nnx.jit
  def step(model, opt):
    loss, grads = nnx.value_and_grad(_loss, argnums=nnx.DiffState(0, LoRAParam))(model)
    opt.update(model, grads)
    return loss

  losses = [float(step(model, opt)) for _ in range(4)]
  assert losses[-1] < losses[0]
  for k, v in _flat(_frozen(model)).items():
    np.testing.assert_array_equal(v, frozen0[k])
  lora1 = _flat(nnx.state(model, LoRAParam))
  assert all(np.abs(lora1[k] - lora0[k]).max() > 0 for k in lora0 if k[-1] == "lora_b")

  # Whole-state optimisation with the mask: frozen params still do not move.
  params = nnx.state(model, nnx.Param)
  labels = lora_trainable_mask(params)
  assert sorted(k for k, v in _flat(labels).items() if v) == sorted(lora0)
  tx = optax.multi_transform({True: optax.sgd(0.1), False: optax.set_to_zero()}, labels)

  @jax.jit
  def whole_step(params, grads):
    updates, _ = tx.update(grads, tx.init(params), params)
    return optax.apply_updates(params, updates)

  new = whole_step(params, nnx.jit(nnx.grad(_loss))(model))
  flat_new, flat_old = _flat(new), _flat(params)
  for k in frozen0:
    np.testing.assert_array_equal(flat_new[k], flat_old[k])
  assert any(np.abs(flat_new[k] - flat_old[k]).max() > 0 for k in lora0)


def test_merge_lora_matches_and_exports(tmp_path):
  model = _lora_model()
  rng = np.random.RandomState(5)  # non-zero B so the merge is exercised
  for _, var in nnx.to_flat_state(nnx.state(model, LoRAParam)):
    var.set_value(jnp.asarray(0.2 * rng.standard_normal(var.shape), var.dtype))
  want = np.asarray(_logits(model))
  merged = merge_lora(model)
  assert type(merged) is Decoder
  assert not jax.tree.leaves(nnx.state(merged, LoRAParam))
  assert isinstance(model.layers[0].self_attn.q_proj, LoRAEinsum)  # original untouched
  got = np.asarray(_logits(merged))
  assert np.abs(want - np.asarray(_logits(_base_model()))).max() > 1e-2
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
  with pytest.raises(ValueError, match="merge_lora"):
    save_pretrained(model, CFG, tmp_path / "lora")
  save_pretrained(merged, CFG, tmp_path / "merged")
  assert (tmp_path / "merged" / "model.safetensors").exists()
