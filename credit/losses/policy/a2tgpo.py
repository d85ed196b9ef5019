"""A2TGPO: PPO clip whose range follows each turn's normalised information gain."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit.advantages.turn.a2tgpo import a2tgpo_clip_range, a2tgpo_normalized_gains
from credit.losses.policy._common import policy_inputs
from credit.losses.policy.ppo_clip import _check_dual, clipped_surrogate_loss
from credit.losses.reduction import POLICY_NEEDS, STATIC_ARGNAMES, TokenLoss, _full_loss
from credit.registry import register_policy_loss

__all__ = ["a2tgpo_loss", "dense_group_ids"]

Array = jax.Array

_NAME = "a2tgpo"
_PAPER = ("A^2TGPO: Agentic Turn-Group Policy Optimization with Adaptive Turn-level Clipping, "
          "arXiv preprint")
_TURN_FIELDS = ("gold_logprob_turns", "gold_logprob_prompt", "step_mask", "turn_id", "group_id")


def dense_group_ids(group_id: ArrayLike, row_valid: ArrayLike) -> Array:
  """Group ids remapped to [0, B): the index of the group's first valid row; an invalid row
  keeps its own index.

  Lets a loss normalise within groups without a static `num_groups` (the runner does not
  pass one to losses): with B rows there are at most B groups. One stable sort, O(B log B)
  (valid rows first, by id), so equal ids form runs whose first element is the group's
  first row.
  """
  gid = jnp.asarray(group_id, jnp.int32)
  ok = jnp.asarray(row_valid, bool)
  pos = jnp.arange(gid.shape[0], dtype=jnp.int32)
  order = jnp.lexsort((gid, ~ok)).astype(jnp.int32)
  gid_s, ok_s = gid[order], ok[order]
  run_start = (pos == 0) | ~ok_s | (gid_s != jnp.roll(gid_s, 1))
  first_s = order[jax.lax.cummax(jnp.where(run_start, pos, 0), axis=0)]
  return jnp.zeros_like(pos).at[order].set(first_s)


def a2tgpo_loss(*, logprob: ArrayLike, logprob_old: ArrayLike, advantages: ArrayLike,
                response_mask: ArrayLike, gold_logprob_turns: ArrayLike | None = None,
                gold_logprob_prompt: ArrayLike | None = None,
                step_mask: ArrayLike | None = None, turn_id: ArrayLike | None = None,
                group_id: ArrayLike | None = None, clip_eps: ArrayLike = 0.2,
                lam: ArrayLike = 0.5, delta: ArrayLike = 0.5,
                clip_ratio_c: ArrayLike | None = 3.0, gain: str = "log_prob_diff") -> TokenLoss:
  """A2TGPO adaptive turn-level clipping: PPO clip with ε[b,k] from the turn's normalised gain.

  ::

    ε[b,k] = ε0 clip(1 + λ tanh(ĩ[b,k]), 1 − δ, 1 + δ)        (outcome turn: ε0)
    ℓ = max(−A ρ, −A clip(ρ, 1 − ε[b,k(t)], 1 + ε[b,k(t)]))   (+ dual clip c for A < 0)

  ĩ is recomputed from the contract fields exactly as `a2tgpo_advantages` does. Turns with
  a large positive ĩ get a wider range, turns with a negative one a narrower range. The
  statistics are over the rows the loss receives, so it is registered with
  `whole_groups=True` (minibatches hold whole prompt groups); group ids may be any int32
  values. Without the turn fields every token gets ε0 (`ppo_clip` with ε0).

  Paper: "A^2TGPO: Agentic Turn-Group Policy Optimization with Adaptive Turn-level
  Clipping" (arXiv preprint). The range formula and λ = δ = 0.5 are this library's reading
  of the abstract.

  Args:
    logprob: [B,T] float32 current log-probs.
    logprob_old: [B,T] float32 old log-probs.
    advantages: [B,T] float32.
    response_mask: [B,T] bool.
    gold_logprob_turns: optional [B,K] (as `a2tgpo_advantages`).
    gold_logprob_prompt: optional [B].
    step_mask: optional [B,K] bool.
    turn_id: optional [B,T] int.
    group_id: optional [B] int.
    clip_eps: ε0.
    lam: λ of the range.
    delta: δ of the range.
    clip_ratio_c: dual-clip constant (> 1) for A < 0; None disables it.
    gain: static, "log_prob_diff" | "prob_diff".

  Returns:
    TokenLoss; metrics `clipfrac`, `clipfrac_lower` and `clip_eps_mean`.
  """
  _check_dual(clip_ratio_c)
  x = policy_inputs(logprob, logprob_old, advantages, response_mask)
  fields = (gold_logprob_turns, gold_logprob_prompt, step_mask, turn_id, group_id)
  if any(f is None for f in fields):
    eps_BT = jnp.broadcast_to(jnp.asarray(clip_eps, jnp.float32), x.mask.shape)
  else:
    gid = dense_group_ids(group_id, jnp.any(x.mask, axis=1))
    i_hat, cells, _ = a2tgpo_normalized_gains(
        gold_logprob_turns=gold_logprob_turns, gold_logprob_prompt=gold_logprob_prompt,
        step_mask=step_mask, turn_id=turn_id, group_id=gid, response_mask=x.mask,
        num_groups=x.mask.shape[0], gain=gain)
    eps_BT = a2tgpo_clip_range(jax.lax.stop_gradient(i_hat), cells, turn_id, clip_eps=clip_eps,
                               lam=lam, delta=delta)
  eps_BT = jnp.where(x.mask, eps_BT, 0.0)
  loss_BT, clipped, dual = clipped_surrogate_loss(x.adv, jnp.exp(x.delta), 1.0 - eps_BT,
                                                  1.0 + eps_BT, clip_ratio_c)
  return TokenLoss(loss_BT, {"clipfrac": clipped, "clipfrac_lower": dual,
                             "clip_eps_mean": eps_BT})


# Registered by hand (not with `policy_loss`) because the loss takes contract fields beyond
# `POLICY_NEEDS`; the full loss is the same per-token term + shared reduction.
register_policy_loss(_NAME, needs=POLICY_NEEDS + _TURN_FIELDS, paper=_PAPER,
                     confidence="inferred", source=_PAPER + ", abstract",
                     static_argnames=STATIC_ARGNAMES + ("gain",), whole_groups=True,
                     token_fn=a2tgpo_loss)(_full_loss(_NAME, a2tgpo_loss, "token-mean"))
