"""PiCA: PRM step rewards (success probability − baseline) at the end of each search turn, GAE."""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit._checks import check_choice
from credit.ops._cast import as_f32
from credit.ops.baselines import GAEOutput, gae
from credit.ops.returns import last_token_mask
from credit.ops.turns import turn_broadcast, turn_edges, turn_layout
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["pica_advantages", "pica_step_rewards"]

_PAPER = ("PiCA: Pivot-Based Credit Assignment for Search Agentic Reinforcement Learning, "
          "arXiv preprint")


def pica_step_rewards(step_reward: ArrayLike, valid_BK: ArrayLike, *,
                      mode: str = "code", baseline: ArrayLike = 0.55,
                      penalty: ArrayLike = 0.3, penalty_base: ArrayLike = 1.5,
                      gamma: ArrayLike = 1.0, terminal_BK: ArrayLike | None = None) -> Array:
  """Unscaled PiCA turn rewards [B,K] from the steps' success probabilities ρ = 1 − h.

  code: r_k = ρ_k − b − pen_k, with pen_k = α γ_p^(n−2) for the n-th valid step (0-based)
  n ≥ 3, else 0. pbrs: r_k = γ Φ_k − Φ_{k−1} over the valid steps, with Φ_k = Π_{j ≤ k} ρ_j
  the probability that no step up to k is wrong, Φ before the first step = 1, and Φ after
  the last valid step replaced by `terminal_BK`'s value on that step (0 if None).
  """
  check_choice("pica_step_rewards", "mode", mode, ("code", "pbrs"))
  valid = jnp.asarray(valid_BK, bool)
  rho = jnp.where(valid, as_f32(step_reward), 0.0)
  if mode == "code":
    n = jax.lax.cumsum(valid.astype(jnp.float32), axis=1) - 1.0
    pen = jnp.where(n >= 3.0, penalty * jnp.power(penalty_base, jnp.maximum(n - 2.0, 0.0)), 0.0)
    r = rho - baseline - pen
  else:
    term = jnp.zeros_like(rho) if terminal_BK is None else as_f32(terminal_BK)
    last = valid & (jax.lax.cumsum(valid.astype(jnp.int32), axis=1, reverse=True) == 1)
    # Survival after each step (invalid steps multiply by 1, so the column before a valid
    # step holds the survival after the previous valid one), the last valid one terminal.
    surv = jnp.cumprod(jnp.where(valid, rho, 1.0), axis=1)
    phi = jnp.where(last, term, surv)
    before = jnp.pad(surv[:, :-1], ((0, 0), (1, 0)), constant_values=1.0)
    r = gamma * phi - before
  return jnp.where(valid, r, 0.0)


@register_estimator(
    "pica", needs=("reward", "step_reward", "step_mask", "turn_id", "values", "response_mask"),
    paper=_PAPER, static_argnames=("mode", "pbrs_terminal", "whiten"), returns_output=True,
    optional_needs={"logprob_old": "kl_coef", "logprob_ref": "kl_coef"},
                    confidence="code-verified",
                    source=(_PAPER + "; code: novdream/PiCA Search-R1/verl/trainer/main_ppo.py "
                            "(comupute_step_reward, _compute_step_reward_tensor), "
                            "Search-R1/train_ppo.sh, the CRMLoss of its OpenRLHF copy"))
def pica_advantages(*, reward: ArrayLike, step_reward: ArrayLike, step_mask: ArrayLike,
                    turn_id: ArrayLike, values: ArrayLike, response_mask: ArrayLike,
                    logprob_old: ArrayLike | None = None, logprob_ref: ArrayLike | None = None,
                    mode: Literal["code", "pbrs"] = "code",
                    pbrs_terminal: Literal["zero", "outcome"] = "zero", step_scale: ArrayLike = 0.3,
                    outcome_scale: ArrayLike = 1.5, baseline: ArrayLike = 0.55,
                    penalty: ArrayLike = 0.3, penalty_base: ArrayLike = 1.5,
                    gamma: ArrayLike = 1.0, lam: ArrayLike = 1.0, kl_coef: ArrayLike = 0.0,
                    whiten: bool = True) -> GAEOutput:
  """PiCA: PRM step rewards on the last token of each turn, the outcome on the last token, GAE.

  ρ = `step_reward` in [0, 1] is the probability that each search step is right given the
  history (higher is better). The step rewards go on the last policy token of each turn,
  the outcome on the row's last token, and GAE turns them into advantages::

    code: r_k = ρ_k − b − pen_k,     pen_k = α γ_p^(k−2) for k ≥ 3 (0-based), else 0
    pbrs: r_k = γ Φ_k − Φ_{k−1},     Φ_k = Π_{j ≤ k} ρ_j,  Φ_{−1} = 1,  Φ_last = 0 (or R)
    x[b, t_k] = c_s r_k,   x[b, L_b] = c_o R_b    (code: overwrites a step reward there)
    (A, returns) = GAE(x, V; γ, λ)                 (whitened over the response tokens)

  The step-count penalty counts valid steps (meant for a few search calls).

  Paper: "PiCA: Pivot-Based Credit Assignment for Search Agentic Reinforcement Learning"
  (arXiv preprint). The authors' PRM serves the hazard h (the probability that a step is
  the first wrong one), so their 1 − h − b is ρ − b here. Differences from the code: the
  step scale is the paper's c_s = 0.3 (the code's aliasing gives 1.3: pass
  `step_scale=1.3`); the code's k1 KL-in-reward (0.001) is `kl_coef`, 0 by default; the
  whitening covers the response tokens only (the code includes observation tokens).

  Args:
    reward: [B] outcome.
    step_reward: [B,K] the steps' success probabilities ρ.
    step_mask: [B,K] bool steps (search calls) that took place.
    turn_id: [B,T] int (−1 outside turns).
    values: [B,T] critic values.
    response_mask: [B,T] bool.
    logprob_old: optional [B,T] behaviour log-probs (KL-in-reward, with `logprob_ref`).
    logprob_ref: optional [B,T] reference log-probs.
    mode: static "code" | "pbrs".
    pbrs_terminal: static, Φ after the last step in "pbrs": "zero" | "outcome".
    step_scale: c_s.
    outcome_scale: c_o.
    baseline: b.
    penalty: α of the step-count penalty.
    penalty_base: γ_p of the step-count penalty.
    gamma: GAE discount.
    lam: GAE λ.
    kl_coef: β of the KL-in-reward.
    whiten: static, as `gae_advantages`.

  Returns:
    GAEOutput(advantages [B,T], returns [B,T]) for the policy and the critic.

  Example:
    >>> import numpy as np
    >>> tid = np.array([[0, 0, 1, 1]] * 2, np.int32)
    >>> out = pica_advantages(reward=np.array([1., 0.]), step_reward=np.array([[.9, .8],
    ...     [.9, .2]]), step_mask=np.ones((2, 2), bool), turn_id=tid, values=np.zeros((2, 4)),
    ...     response_mask=np.ones((2, 4), bool), whiten=False)
    >>> np.round(np.asarray(out.advantages, np.float64), 4).tolist()   # .3 (.9 − .55) = .105
    [[1.605, 1.605, 1.5, 1.5], [0.105, 0.105, 0.0, 0.0]]
  """
  check_choice("pica_advantages", "mode", mode, ("code", "pbrs"))
  check_choice("pica_advantages", "pbrs_terminal", pbrs_terminal, ("zero", "outcome"))
  mask_BT, row, valid, last, tid = turn_layout(response_mask, step_mask, turn_id)
  terminal = None
  if pbrs_terminal == "outcome":
    terminal = jnp.where(last, as_f32(reward)[:, None], 0.0)
  r_BK = pica_step_rewards(step_reward, valid, mode=mode, baseline=baseline, penalty=penalty,
                           penalty_base=penalty_base, gamma=gamma, terminal_BK=terminal)
  ends = turn_edges(tid, mask_BT, valid.shape[1], last=True)
  step_BT = jnp.where(ends, step_scale * turn_broadcast(r_BK, tid), 0.0)
  if mode == "code":
    last_tok = last_token_mask(mask_BT)
    step_BT = jnp.where(last_tok, 0.0, step_BT)
  out_B = jnp.where(row, outcome_scale * as_f32(reward), 0.0)
  return gae("pica_advantages", reward=out_B, values=values, response_mask=mask_BT,
             logprob_old=logprob_old, logprob_ref=logprob_ref, token_reward=step_BT,
             gamma=gamma, lam=lam, kl_coef=kl_coef, whiten=whiten)
