"""bfloat16 parameters with a float32 optimiser: `train.with_master_copy` / `make_optimizer(
master_dtype="float32")`."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from credit.models import Decoder, apply_lora, lora_trainable_mask, tiny_config
from credit import parallel
from experiments import train


def _opt(master_dtype=None, trainable=None, lr=1e-3):
  return train.make_optimizer(learning_rate=lr, total_steps=100, warmup_steps=0,
                              weight_decay=0.0, grad_clip=1.0, trainable=trainable,
                              master_dtype=master_dtype)


def _adam(state):
  """The ScaleByAdamState inside an optimiser state."""
  found = [x for x in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
           if isinstance(x, optax.ScaleByAdamState)]
  assert len(found) == 1
  return found[0]


def _steps(tx, params, grad_fn, n):
  state = tx.init(params)

  @jax.jit
  def step(params, state):
    u, state = tx.update(grad_fn(params), state, params)
    return optax.apply_updates(params, u), state

  for _ in range(n):
    params, state = step(params, state)
  return params, state


def test_small_steps_accumulate_in_the_master_copy_and_move_bfloat16_weights():
  # Adam's step is ~lr = 1e-3, under half of bfloat16's spacing at 1.0 (2^-7): alone, the
  # bfloat16 weight never moves; through the float32 master copy it moves by ~n·lr.
  params = {"w": jnp.ones((4,), jnp.bfloat16)}
  grad = lambda p: {"w": jnp.ones_like(p["w"])}
  plain, plain_state = _steps(_opt(None), params, grad, 20)
  np.testing.assert_array_equal(np.asarray(plain["w"], np.float32), 1.0)
  assert _adam(plain_state).mu["w"].dtype == jnp.bfloat16  # moments follow the params
  mixed, state = _steps(_opt("float32"), params, grad, 20)
  assert mixed["w"].dtype == jnp.bfloat16
  assert isinstance(state, train.MasterState) and state.master["w"].dtype == jnp.float32
  adam = _adam(state.inner)
  assert adam.mu["w"].dtype == adam.nu["w"].dtype == jnp.float32
  master = np.asarray(state.master["w"])
  np.testing.assert_allclose(master, 1.0 - 20 * 1e-3, rtol=1e-3)
  # The stored weight is the master copy rounded to bfloat16.
  np.testing.assert_array_equal(np.asarray(mixed["w"]),
                                np.asarray(jnp.asarray(master).astype(jnp.bfloat16)))


def test_float32_params_keep_no_copy_and_the_same_updates():
  params = {"w": jnp.linspace(-1.0, 1.0, 6, dtype=jnp.float32), "b": jnp.zeros((3,))}
  grad = jax.grad(lambda p: jnp.sum(jnp.sin(3 * p["w"])) + jnp.sum((p["b"] - 0.3) ** 2))
  a, _ = _steps(_opt(None), params, grad, 5)
  b, state = _steps(_opt("float32"), params, grad, 5)
  assert all(isinstance(m, optax.MaskedNode) for m in state.master.values())
  for k in params:
    np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))


def test_a_bfloat16_decoder_trains_sharded_with_lora_and_without():
  mesh = parallel.make_mesh("fsdp=4", jax.devices()[:4])
  model = Decoder(tiny_config("qwen3", param_dtype="bfloat16", dtype="bfloat16"),
                  rngs=nnx.Rngs(0))
  for lora in (False, True):
    m = apply_lora(model, rank=2, alpha=4.0, targets=("q_proj",), rngs=nnx.Rngs(1)) if lora \
        else model
    graphdef, params, rest = train.split_model(m)
    trainable = lora_trainable_mask(params) if lora else None
    tx = _opt("float32", trainable=trainable)
    p_sh, o_sh = train.state_shardings(tx, params, tx.init(params), mesh)
    params = jax.device_put(params, p_sh)
    opt_state = jax.jit(tx.init, out_shardings=o_sh)(params)
    tokens = jnp.arange(16, dtype=jnp.int32).reshape(4, 4) % 100

    def loss(p):
      logits, _ = train.merge_model(graphdef, p, rest)(tokens)
      return -jnp.mean(jax.nn.log_softmax(logits)[..., 0])

    @jax.jit
    def step(p, o):
      u, o = tx.update(jax.grad(loss)(p), o, p)
      return optax.apply_updates(p, u), o

    new, opt_state = step(params, opt_state)
    dtypes = {x.dtype for x in jax.tree.leaves(new)}
    assert dtypes == {jnp.dtype(jnp.bfloat16)}, dtypes
    wide = [x for x in jax.tree.leaves(opt_state) if getattr(x, "ndim", 0) > 0]
    assert wide and all(x.dtype == jnp.float32 for x in wide)
    changed = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), params, new)
    if lora:  # only the adapters train; their master copies are the only ones kept
      assert any(jax.tree.leaves(changed)) and not any(
          c for c, t in zip(jax.tree.leaves(changed), jax.tree.leaves(trainable)) if not t)
      n_master = sum(x.size for x in wide) // 3  # master, mu, nu per trainable weight
      assert n_master == sum(x.size for x, t in zip(jax.tree.leaves(params),
                                                    jax.tree.leaves(trainable)) if t)
    else:  # every master copy moved, though a norm weight of 1 stays 1 in bfloat16
      master = opt_state.master
      moved = jax.tree.map(lambda m, p: bool(jnp.any(m != p.astype(jnp.float32))), master, params)
      assert all(jax.tree.leaves(moved)) and not all(jax.tree.leaves(changed))
