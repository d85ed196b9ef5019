"""A2TGPO: IG normalised per (prompt, turn index), √n-rescaled accumulation, per-turn clip range."""
from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.advantages.turn._common import igpo_turn_rewards
from credit.ops.turns import turn_broadcast, turn_layout, turn_normalize, turn_returns
from credit.registry import register_estimator

Array = jax.Array

__all__ = ["a2tgpo_advantages", "a2tgpo_normalized_gains", "a2tgpo_clip_range"]

_PAPER = ("A^2TGPO: Agentic Turn-Group Policy Optimization with Adaptive Turn-level Clipping, "
          "arXiv preprint")


def a2tgpo_normalized_gains(*, gold_logprob_turns: ArrayLike, gold_logprob_prompt: ArrayLike,
                            step_mask: ArrayLike, turn_id: ArrayLike, group_id: ArrayLike,
                            response_mask: ArrayLike, num_groups: int,
                            gain: str = "log_prob_diff", eps: float = 1e-6
                            ) -> tuple[Array, Array, Array]:
  """(ĩ_BK, ig_cells_BK, last_BK): IG z-scored per (group, turn index), population std.

  IG cells are the valid turns before each row's last valid turn (whose slot holds the
  outcome); a (group, k) cell with fewer than two members gives 0. Shared by the estimator
  and the `a2tgpo` policy loss.
  """
  _, _, valid, last, _ = turn_layout(response_mask, step_mask, turn_id)
  ig, _ = igpo_turn_rewards(reward=jnp.zeros(valid.shape[0]), gold_logprob_turns=gold_logprob_turns,
                            gold_logprob_prompt=gold_logprob_prompt, valid_BK=valid,
                            last_BK=last, gain=gain)
  cells = valid & ~last
  i_hat = turn_normalize(ig, cells, group_id, num_groups, by="index", ddof=0, eps=eps)
  return i_hat, cells, last


def a2tgpo_clip_range(i_hat_BK: ArrayLike, ig_cells_BK: ArrayLike, turn_id: ArrayLike, *,
                      clip_eps: ArrayLike = 0.2, lam: ArrayLike = 0.5,
                      delta: ArrayLike = 0.5) -> Array:
  """Per-token clip range [B,T]: ε0·clip(1 + λ·tanh(ĩ_{b,k}), 1 − δ, 1 + δ) on IG turns, ε0
  elsewhere (the outcome turn, tokens outside turns)."""
  i_hat = jnp.asarray(i_hat_BK, jnp.float32)
  mult = jnp.clip(1.0 + lam * jnp.tanh(i_hat), 1.0 - delta, 1.0 + delta)
  mult = jnp.where(jnp.asarray(ig_cells_BK, bool), mult, 1.0)
  tid = jnp.asarray(turn_id, jnp.int32)
  K = i_hat.shape[1]
  in_turn = (tid >= 0) & (tid < K)
  return clip_eps * jnp.where(in_turn, turn_broadcast(mult, tid), 1.0)


@register_estimator(
    "a2tgpo", needs=("reward", "gold_logprob_turns", "gold_logprob_prompt", "step_mask",
                     "turn_id", "group_id", "response_mask"),
    paper=_PAPER, static_argnames=("num_groups", "gain", "sqrt_n"),
                    confidence="inferred",
                    source=_PAPER + ", abstract")
def a2tgpo_advantages(*, reward: ArrayLike, gold_logprob_turns: ArrayLike,
                      gold_logprob_prompt: ArrayLike, step_mask: ArrayLike, turn_id: ArrayLike,
                      group_id: ArrayLike, response_mask: ArrayLike, num_groups: int,
                      gain: Literal["log_prob_diff", "prob_diff"] = "log_prob_diff",
                      gamma: ArrayLike = 1.0, eps: float = 1e-6, sqrt_n: bool = True) -> Array:
  """A2TGPO turn advantage (pair it with the `a2tgpo` policy loss for adaptive clipping).

  Information gains (as IGPO) are normalised per (prompt, turn index), the outcome per
  prompt, and the accumulated return is rescaled by the number of turns it sums::

    ĩ[b,k] = (IG[b,k] − μ_{g,k}) / (σ_{g,k} + eps)       (rows of group g with turn k)
    õ_b    = (R_b − μ_g) / (σ_g + eps)                    (on the row's last valid turn)
    A[b,k] = Σ_{k'=k}^{K_b} γ^{k'−k} x[b,k'] / sqrt(K_b − k + 1),   x = ĩ ⊕ õ

  with population stds and fewer than two members giving 0. The per-turn clip range
  ε0 · clip(1 + λ tanh ĩ, 1 − δ, 1 + δ) belongs to the loss (`credit.losses.a2tgpo_loss`).

  Paper: "A^2TGPO: Agentic Turn-Group Policy Optimization with Adaptive Turn-level
  Clipping" (arXiv preprint). The abstract gives the idea but no equation: the formulas are
  this library's reading of it.

  Args:
    reward: [B] outcome.
    gold_logprob_turns: [B,K] mean log-prob of the gold answer after each turn.
    gold_logprob_prompt: [B] the same after the prompt alone.
    step_mask: [B,K] bool, turns that took place.
    turn_id: [B,T] int turn of each token (−1 outside turns).
    group_id: [B] int prompt group.
    response_mask: [B,T] bool policy tokens.
    num_groups: static number of groups.
    gain: static, "log_prob_diff" | "prob_diff".
    gamma: turn discount.
    eps: added to the std.
    sqrt_n: static; False gives plain accumulation.

  Returns:
    [B,T] float32 advantages, zero outside `response_mask` and outside turns.

  Example:
    >>> import numpy as np
    >>> tid = np.array([[0, 1, 2], [0, 1, -1]], np.int32)
    >>> a = a2tgpo_advantages(reward=np.array([1., 0.]), gold_logprob_turns=np.array(
    ...     [[.2, .15, 0.], [.4, 0., 0.]]), gold_logprob_prompt=np.zeros(2),
    ...     step_mask=tid >= 0, turn_id=tid, group_id=np.zeros(2, np.int32),
    ...     response_mask=tid >= 0, num_groups=1)
    >>> (np.round(np.asarray(a, np.float64), 4) + 0.0).tolist()
    [[0.0, 0.7071, 1.0], [0.0, -1.0, 0.0]]
  """
  mask_BT, _, valid, last, tid = turn_layout(response_mask, step_mask, turn_id)
  i_hat, _, _ = a2tgpo_normalized_gains(
      gold_logprob_turns=gold_logprob_turns, gold_logprob_prompt=gold_logprob_prompt,
      step_mask=step_mask, turn_id=turn_id, group_id=group_id, response_mask=response_mask,
      num_groups=num_groups, gain=gain, eps=eps)
  r_B = jnp.asarray(reward, jnp.float32)
  out = turn_normalize(jnp.where(last, r_B[:, None], 0.0), last, group_id, num_groups,
                       by="pooled", ddof=0, eps=eps)
  adv_BK = turn_returns(i_hat + out, valid, gamma, sqrt_n=sqrt_n)
  return turn_broadcast(adv_BK, tid, mask_BT)
