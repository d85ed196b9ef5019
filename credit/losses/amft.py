"""AMFT: a meta-learned balance μ = σ(φ) between the RL loss and the SFT loss.

AMFT is a training-loop component, not an advantage estimator: its controller needs the
gradients of two losses and a look-ahead parameter step. The pieces are pure JAX functions
over pytrees, so they jit and compose with any estimator / policy loss of this library:

  amft_mu              μ = σ(φ)
  amft_loss            L = (1 − μ)·L_RL + μ·L_SFT
  amft_meta_gradient   ∂L_val(θ')/∂μ = −η ⟨g_val, g_SFT − g_RL⟩
  amft_update_phi      φ ← φ − η_φ·[σ'(φ)·∂L_val/∂μ + c_H·(H − H_target)]
  amft_step            all of the above from three loss functions, with jax.grad

Source: "AMFT: Aligning LLM Reasoners by Meta-Learning the Optimal Imitation-Exploration
Balance", He, Feng, Li, arXiv 2508.06944 (the arXiv listing notes the paper was withdrawn by
its authors pending a misconduct investigation). The controller below is this library's
design, compared with the authors' code, TSYJ-He/AMFT
(`src/controller/adaptive_weight_controller.py`, `src/trainer/amft_trainer.py`,
`configs/training/amft_params.yaml`). The code's controller:

* keeps μ itself (no sigmoid), starts at 0.8 (config; 0.5 in the class), and after each
  change clamps it to [0.05, 0.95];
* meta-gradient m = −η_θ ⟨∇L_val(θ), ∇L_SFT(θ) − ∇L_RL(θ)⟩, every 20 steps (else m = 0),
  with L_val a cross-entropy on a validation batch and all three gradients at the *current*
  θ (no look-ahead step is taken);
* μ ← clamp(μ + 1e-4·m + 5e-4·(H_target − H)), with H the policy's mean token entropy on the
  RL batch and H_target the mean entropy measured once after the SFT warm-up;
* then L = (1 − μ)·L_RL + μ·L_SFT with the *updated* μ.

Note the sign: m is ∂L_val(θ')/∂μ, so `μ + 1e-4·m` climbs the validation loss; we descend
(φ ← φ − η_φ ∂L_val/∂φ, as the paper's "maximise validation performance" intends). The
entropy term agrees in sign with the code: entropy below target raises μ. Choices (ours):
μ = σ(φ) instead of a clamp (no dead zone at the bounds); η_φ = 1e-2 and c_H = 0.1 (not
given in the paper); c_H multiplies the entropy gap inside the φ
gradient, so its rate is η_φ·c_H (the code has a separate rate 5e-4); the meta-update
frequency is the caller's (call `amft_step` with `meta_lr=0` on other steps — the entropy
term is then off too, unlike the code's every-step entropy update).

Which gradients are evaluated where (`amft_step`): g_RL = ∇L_RL(θ) and g_SFT = ∇L_SFT(θ) at
the current parameters; the look-ahead θ' = θ − η[(1 − μ)g_RL + μ g_SFT] with the current
μ; g_val = ∇L_val(θ') (`val_at="lookahead"`) or ∇L_val(θ) (`val_at="current"`, the authors'
code). Since g_RL, g_SFT do not depend on μ, ∂θ'/∂μ = −η(g_SFT − g_RL) exactly, so with the
look-ahead the formula is the exact derivative of L_val(θ') for one SGD step; "first-order"
refers to treating g_RL, g_SFT as μ-free (no second-order terms through earlier steps),
and `val_at="current"` adds the further approximation ∇L_val(θ') ≈ ∇L_val(θ).
"""
from __future__ import annotations

from typing import Any, Callable, Literal, NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit._checks import check_choice

Array = jax.Array
PyTree = Any

__all__ = ["AmftStep", "VAL_AT", "amft_mu", "amft_loss", "amft_meta_gradient",
           "amft_update_phi", "amft_step"]

VAL_AT = ("lookahead", "current")


class AmftStep(NamedTuple):
  """What one `amft_step` returns.

  Attributes:
    phi: the updated logit φ (float32 scalar).
    mu: σ(φ) after the update.
    grads: (1 − μ)·g_RL + μ·g_SFT at θ with the updated μ, a pytree like `params`: the
      gradient the caller's optimizer applies (code order: μ is updated first).
    loss: (1 − μ)·L_RL + μ·L_SFT at θ with the same updated μ.
    metrics: scalars {"mu_before", "meta_gradient" (∂L_val/∂μ), "loss_rl", "loss_sft",
      "loss_val" (at the point g_val was taken), "entropy_gap" (H − H_target, 0 without)}.
  """
  phi: Array
  mu: Array
  grads: PyTree
  loss: Array
  metrics: dict[str, Array]


def _f32(x: ArrayLike) -> Array:
  return jnp.asarray(x, jnp.float32)


def amft_mu(phi: ArrayLike) -> Array:
  """μ = σ(φ), the SFT weight in [0, 1] (float32)."""
  return jax.nn.sigmoid(_f32(phi))


def amft_loss(*, loss_rl: ArrayLike, loss_sft: ArrayLike, mu: ArrayLike) -> Array:
  """The AMFT loss mix L = (1 − μ)·L_RL + μ·L_SFT (scalars or matching arrays).

  Gradients flow through both losses; pass μ under `jax.lax.stop_gradient` (as `amft_step`
  does) unless φ should be trained by this loss.

  >>> float(amft_loss(loss_rl=0.8, loss_sft=1.2, mu=amft_mu(0.0)))
  1.0
  """
  mu = _f32(mu)
  return (1.0 - mu) * _f32(loss_rl) + mu * _f32(loss_sft)


def _vdot(a: PyTree, b: PyTree) -> Array:
  leaves = jax.tree.map(lambda x, y: jnp.vdot(_f32(x), _f32(y)), a, b)
  return sum(jax.tree.leaves(leaves), jnp.zeros((), jnp.float32))


def amft_meta_gradient(*, grad_rl: PyTree, grad_sft: PyTree, grad_val: PyTree,
                       lr: ArrayLike) -> Array:
  """∂L_val(θ')/∂μ = −η ⟨g_val, g_SFT − g_RL⟩ for θ' = θ − η[(1 − μ)g_RL + μ g_SFT].

  Args:
    grad_rl, grad_sft: pytrees (same structure), ∇L_RL and ∇L_SFT at θ.
    grad_val: ∇L_val at θ' (exact for the SGD look-ahead) or at θ (the authors' code).
    lr: η, the inner (policy) learning rate of the look-ahead step.

  Returns:
    float32 scalar; positive means more SFT weight would raise the validation loss.

  >>> import numpy as np
  >>> g = lambda *v: {"w": np.array(v, np.float32)}
  >>> float(amft_meta_gradient(grad_rl=g(1., 0.), grad_sft=g(0., 1.), grad_val=g(2., 1.),
  ...                          lr=0.5))
  0.5
  """
  diff = jax.tree.map(lambda s, r: _f32(s) - _f32(r), grad_sft, grad_rl)
  return -_f32(lr) * _vdot(grad_val, diff)


def amft_update_phi(phi: ArrayLike, *, meta_gradient: ArrayLike, meta_lr: ArrayLike = 1e-2,
                    entropy: ArrayLike | None = None, target_entropy: ArrayLike | None = None,
                    entropy_coef: ArrayLike = 0.1) -> Array:
  """One controller step φ ← φ − η_φ·[σ'(φ)·∂L_val/∂μ + c_H·(H − H_target)].

  σ'(φ) = μ(1 − μ) turns the μ-gradient into a φ-gradient. The entropy term (only when both
  `entropy` and `target_entropy` are given) raises φ, hence the imitation weight μ, when
  the policy entropy H falls below its target (entropy collapse) and lowers it above.

  Args:
    phi: current logit φ.
    meta_gradient: ∂L_val(θ')/∂μ (`amft_meta_gradient`).
    meta_lr: η_φ (1e-2).
    entropy: H, the policy's mean token entropy on the RL batch (optional).
    target_entropy: H_target (the code: the mean entropy after the SFT warm-up).
    entropy_coef: c_H (0.1).

  Returns:
    The updated φ, float32 scalar.

  >>> round(float(amft_update_phi(0.0, meta_gradient=4.0, meta_lr=0.5)), 6)
  -0.5
  """
  if (entropy is None) != (target_entropy is None):
    raise ValueError("amft_update_phi: pass both entropy and target_entropy, or neither")
  phi = _f32(phi)
  mu = jax.nn.sigmoid(phi)
  grad_phi = mu * (1.0 - mu) * _f32(meta_gradient)
  if entropy is not None:
    grad_phi = grad_phi + _f32(entropy_coef) * (_f32(entropy) - _f32(target_entropy))
  return phi - _f32(meta_lr) * grad_phi


def amft_step(loss_rl_fn: Callable[[PyTree], ArrayLike],
              loss_sft_fn: Callable[[PyTree], ArrayLike],
              loss_val_fn: Callable[[PyTree], ArrayLike], params: PyTree, phi: ArrayLike, *,
              lr: ArrayLike, meta_lr: ArrayLike = 1e-2, entropy: ArrayLike | None = None,
              target_entropy: ArrayLike | None = None, entropy_coef: ArrayLike = 0.1,
              val_at: Literal["lookahead", "current"] = "lookahead") -> AmftStep:
  """One AMFT step: gradients, look-ahead, controller update and the mixed gradient.

  g_RL = ∇L_RL(θ), g_SFT = ∇L_SFT(θ); θ' = θ − η[(1 − μ)g_RL + μ g_SFT] with μ = σ(φ);
  g_val = ∇L_val(θ') ("lookahead") or ∇L_val(θ) ("current", the authors' code);
  m = −η⟨g_val, g_SFT − g_RL⟩; φ' = amft_update_phi(φ, m, ...); μ' = σ(φ');
  returns φ', μ' and the gradient (1 − μ')g_RL + μ' g_SFT for the caller's optimizer
  (three backward passes per step: RL, SFT, validation).

  Args:
    loss_rl_fn, loss_sft_fn, loss_val_fn: `params -> scalar` losses (batches closed over):
      the RL loss of any estimator + policy loss, the SFT negative log-likelihood on
      demonstrations, and the validation loss (the code: cross-entropy on a validation
      batch; a differentiable surrogate of validation reward works too).
    params: pytree θ.
    phi: the controller's logit φ (μ = σ(φ); φ = 0 is μ = 0.5).
    lr: η, the policy learning rate used for the look-ahead (plain SGD step).
    meta_lr, entropy, target_entropy, entropy_coef: as in `amft_update_phi`.
    val_at: static, where ∇L_val is taken, "lookahead" (θ') or "current" (θ).

  Returns:
    `AmftStep`.

  >>> import jax.numpy as jnp
  >>> out = amft_step(lambda p: 0.5 * (p - 1.0) ** 2, lambda p: 0.5 * (p + 1.0) ** 2,
  ...                 lambda p: 0.5 * (p - 0.5) ** 2, jnp.float32(0.0), 0.0, lr=1.0,
  ...                 meta_lr=1.0)
  >>> float(out.phi) < 0.0   # the validation optimum 0.5 is nearer the RL target: less SFT
  True
  """
  check_choice("amft_step", "val_at", val_at, VAL_AT)
  loss_rl, g_rl = jax.value_and_grad(loss_rl_fn)(params)
  loss_sft, g_sft = jax.value_and_grad(loss_sft_fn)(params)
  mu0 = jax.lax.stop_gradient(amft_mu(phi))
  if val_at == "lookahead":
    lr_ = _f32(lr)
    at = jax.tree.map(lambda p, r, s: p - (lr_ * ((1.0 - mu0) * r + mu0 * s)).astype(p.dtype),
                      params, g_rl, g_sft)
  else:
    at = params
  loss_val, g_val = jax.value_and_grad(loss_val_fn)(at)
  meta = amft_meta_gradient(grad_rl=g_rl, grad_sft=g_sft, grad_val=g_val, lr=lr)
  new_phi = amft_update_phi(phi, meta_gradient=meta, meta_lr=meta_lr, entropy=entropy,
                            target_entropy=target_entropy, entropy_coef=entropy_coef)
  mu = amft_mu(new_phi)
  grads = jax.tree.map(lambda r, s: ((1.0 - mu) * r + mu * s).astype(r.dtype), g_rl, g_sft)
  gap = (jnp.zeros((), jnp.float32) if entropy is None
         else _f32(entropy) - _f32(target_entropy))
  metrics = {"mu_before": mu0, "meta_gradient": meta, "loss_rl": _f32(loss_rl),
             "loss_sft": _f32(loss_sft), "loss_val": _f32(loss_val), "entropy_gap": gap}
  metrics = jax.tree.map(jax.lax.stop_gradient, metrics)
  return AmftStep(phi=new_phi, mu=mu, grads=grads,
                  loss=amft_loss(loss_rl=loss_rl, loss_sft=loss_sft, mu=mu), metrics=metrics)
