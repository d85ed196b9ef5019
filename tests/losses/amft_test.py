"""Tests of credit.losses.amft (AMFT's meta-learned SFT/RL balance, distill_and_structure.md A13).

Toy problem with a known optimum: quadratic losses L_RL = ½‖θ − a‖², L_SFT = ½‖θ − b‖² over a
pytree θ, so the mixed loss is minimised at θ*(μ) = (1 − μ)a + μb; the validation loss
L_val = ½‖θ − c‖² with c = θ*(μ*) is minimised by the mix μ*. φ must move μ toward μ* from
both sides.
"""
import doctest
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from credit.losses import amft

A = {"w": np.array([1.0, -2.0, 0.5], np.float32), "b": np.float32(3.0)}
S = {"w": np.array([-1.0, 1.0, 2.5], np.float32), "b": np.float32(-1.0)}
MU_STAR = 0.3
C = jax.tree.map(lambda a, s: (1 - MU_STAR) * a + MU_STAR * s, A, S)


def _sq(p, target):
  return 0.5 * sum(jnp.sum((x - t) ** 2) for x, t in zip(jax.tree.leaves(p),
                                                         jax.tree.leaves(target)))


loss_rl = functools.partial(_sq, target=A)
loss_sft = functools.partial(_sq, target=S)
loss_val = functools.partial(_sq, target=C)


def theta_star(mu):
  return jax.tree.map(lambda a, s: (1 - mu) * a + mu * s, A, S)


def logit(p):
  return float(np.log(p / (1 - p)))


def test_doctests():
  res = doctest.testmod(amft, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert res.attempted > 0 and res.failed == 0


def test_loss_mix_example():
  mu = amft.amft_mu(0.0)
  assert float(mu) == 0.5
  np.testing.assert_allclose(float(amft.amft_loss(loss_rl=0.8, loss_sft=1.2, mu=mu)), 1.0,
                             atol=1e-6)


@pytest.mark.parametrize("val_at", ["lookahead", "current"])
def test_meta_gradient_matches_autodiff(val_at):
  """Look-ahead: the formula is the exact d L_val(θ'(μ))/dμ; current: the code's formula."""
  theta = {"w": np.array([0.2, 0.1, -0.3], np.float32), "b": np.float32(0.4)}
  lr, mu = 0.3, 0.6
  g_rl, g_sft = jax.grad(loss_rl)(theta), jax.grad(loss_sft)(theta)

  def val_after(m):
    return loss_val(jax.tree.map(lambda p, r, s: p - lr * ((1 - m) * r + m * s),
                                 theta, g_rl, g_sft))

  at = jax.tree.map(lambda p, r, s: p - lr * ((1 - mu) * r + mu * s), theta, g_rl, g_sft)
  g_val = jax.grad(loss_val)(at if val_at == "lookahead" else theta)
  got = amft.amft_meta_gradient(grad_rl=g_rl, grad_sft=g_sft, grad_val=g_val, lr=lr)
  if val_at == "lookahead":
    np.testing.assert_allclose(float(got), float(jax.grad(val_after)(mu)), rtol=1e-5)
  out = amft.amft_step(loss_rl, loss_sft, loss_val, theta, logit(mu), lr=lr, val_at=val_at)
  np.testing.assert_allclose(float(out.metrics["meta_gradient"]), float(got), rtol=1e-5)


@pytest.mark.parametrize("mu0", [0.05, 0.9])
def test_single_step_moves_mu_toward_the_optimum(mu0):
  out = amft.amft_step(loss_rl, loss_sft, loss_val, theta_star(mu0), logit(mu0), lr=0.5,
                       meta_lr=1.0)
  assert abs(float(out.mu) - MU_STAR) < abs(mu0 - MU_STAR)
  assert np.sign(float(out.metrics["meta_gradient"])) == np.sign(mu0 - MU_STAR)


@functools.partial(jax.jit, static_argnames=("steps", "val_at"))
def _train(phi0, steps, val_at):
  def body(carry, _):
    theta, phi = carry
    out = amft.amft_step(loss_rl, loss_sft, loss_val, theta, phi, lr=0.5, meta_lr=2.0,
                         val_at=val_at)
    theta = jax.tree.map(lambda p, g: p - 0.5 * g, theta, out.grads)
    return (theta, out.phi), out.mu

  theta0 = theta_star(jax.nn.sigmoid(phi0))
  _, mus = jax.lax.scan(body, (theta0, phi0), None, length=steps)
  return mus


@pytest.mark.parametrize("val_at", ["lookahead", "current"])
def test_training_converges_to_the_known_balance_from_both_sides(val_at):
  for mu0 in (0.05, 0.9):
    mus = np.asarray(_train(jnp.float32(logit(mu0)), 300, val_at))
    assert abs(mus[-1] - MU_STAR) < 0.02, (mu0, mus[-1])
    assert abs(mus[-1] - MU_STAR) < abs(mus[10] - MU_STAR) < abs(mu0 - MU_STAR)


def test_entropy_regulariser_raises_mu_when_entropy_collapses():
  low = amft.amft_update_phi(0.0, meta_gradient=0.0, entropy=0.5, target_entropy=1.0)
  high = amft.amft_update_phi(0.0, meta_gradient=0.0, entropy=1.5, target_entropy=1.0)
  same = amft.amft_update_phi(0.0, meta_gradient=0.0, entropy=1.0, target_entropy=1.0)
  np.testing.assert_allclose([float(low), float(high), float(same)],
                             [0.01 * 0.1 * 0.5, -0.01 * 0.1 * 0.5, 0.0], atol=1e-8)
  with pytest.raises(ValueError, match="both"):
    amft.amft_update_phi(0.0, meta_gradient=0.0, entropy=1.0)


def test_jit_equals_eager():
  theta = theta_star(0.7)
  kw = dict(lr=0.2, meta_lr=0.5, entropy=jnp.float32(0.8), target_entropy=jnp.float32(1.1))
  eager = amft.amft_step(loss_rl, loss_sft, loss_val, theta, 0.3, **kw)
  jitted = jax.jit(lambda t, p, kw: amft.amft_step(loss_rl, loss_sft, loss_val, t, p, **kw))(
      theta, jnp.float32(0.3), kw)
  for e, j in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
    np.testing.assert_allclose(np.asarray(e), np.asarray(j), rtol=1e-5, atol=1e-6)
  # The returned gradient is the mix with the updated μ.
  mu = float(eager.mu)
  want = jax.tree.map(lambda r, s: (1 - mu) * r + mu * s, jax.grad(loss_rl)(theta),
                      jax.grad(loss_sft)(theta))
  for e, w in zip(jax.tree.leaves(eager.grads), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(e), np.asarray(w), rtol=1e-5, atol=1e-6)


def test_bad_val_at_raises():
  with pytest.raises(ValueError, match="val_at"):
    amft.amft_step(loss_rl, loss_sft, loss_val, A, 0.0, lr=0.1, val_at="later")
