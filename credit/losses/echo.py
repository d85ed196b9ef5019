"""ECHO's auxiliary next-token cross-entropy on environment observation tokens."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit._checks import check_choice
from credit.losses.aggregation import F32, aggregate_loss
from credit.losses.reduction import LossOutput

__all__ = ["OBS_CE_MODES", "observation_ce_loss"]

# mode -> the `aggregate_loss` mode it is, with `obs_mask` as the mask.
_AGG = {"seq-mean": "seq-mean-token-mean", "token-mean": "token-mean"}
OBS_CE_MODES = tuple(_AGG)


def observation_ce_loss(*, logprob: ArrayLike, obs_mask: ArrayLike, coef: ArrayLike = 1.0,
                        mode: str = "seq-mean", num_tokens_global: ArrayLike | None = None,
                        num_seqs_global: ArrayLike | None = None) -> LossOutput:
  """ECHO's world-model term: λ × next-token cross-entropy on observation tokens.

  Paper: ECHO, arXiv 2605.24517: L_ECHO = L_GRPO(A) + λ·L_Env(O′). The policy is also
  trained to predict what the environment / tool returned, in the same
  forward pass as the policy-gradient loss on action tokens, so failed rollouts still
  teach; the advantages are unchanged. With O the observation mask (O′ in the paper:
  observations minus warnings and boilerplate, which the caller leaves out of `obs_mask`):

  .. math::
    L_Env = mean_{b: Σ_t O_{b,t} > 0} [ −Σ_t O_{b,t}·log π_{b,t} / Σ_t O_{b,t} ]   ("seq-mean")
          = −Σ_{b,t} O_{b,t}·log π_{b,t} / Σ_{b,t} O_{b,t}                        ("token-mean")
    loss  = λ·L_Env

  Add `loss` to the policy loss. λ = `coef` = 1.0 is this library's default. When no row
  has an observation token the loss is exactly 0 (metric
  `obs_tokens` = 0). Entries outside `obs_mask` contribute exact zeros, even when NaN,
  and receive zero gradient; the gradient flows only through `logprob`.

  Args:
    logprob: [B,T] float current-policy log-prob of the token at each position,
      observation positions included (differentiated).
    obs_mask: [B,T] bool, observation tokens to predict (contract `obs_mask`).
    coef: λ (may be traced).
    mode: "seq-mean" (length-normalised per sequence, the paper's) or "token-mean"; static.
    num_tokens_global, num_seqs_global: with micro-batches, the observation-token count /
      number of rows with an observation token over the whole mini-batch, so micro-batch
      losses sum to the mini-batch loss (see `aggregate_loss`).

  Returns:
    LossOutput(loss, {"obs_ce": token mean of −log π over observation tokens, "obs_ce_agg":
    L_Env, "obs_tokens": observation-token count, "obs_seqs": rows with one}), all
    float32 scalars, metrics stop-gradient.

  >>> import numpy as np
  >>> lp = -np.array([[0.5, 1.0], [0.2, 9.9]], np.float32)
  >>> obs = np.array([[True, True], [True, False]])
  >>> round(float(observation_ce_loss(logprob=lp, obs_mask=obs).loss), 4)
  0.475
  >>> round(float(observation_ce_loss(logprob=lp, obs_mask=obs, mode="token-mean").loss), 4)
  0.5667
  """
  check_choice("observation_ce_loss", "mode", mode, OBS_CE_MODES)
  lp_BT = jnp.asarray(logprob, F32)
  obs_BT = jnp.asarray(obs_mask)
  chex.assert_rank([lp_BT, obs_BT], 2)
  chex.assert_equal_shape([lp_BT, obs_BT])
  obs_BT = obs_BT.astype(bool)
  ce_BT = jnp.where(obs_BT, -lp_BT, 0.0)
  ce_agg = aggregate_loss(ce_BT, obs_BT, _AGG[mode], num_tokens_global=num_tokens_global,
                          num_seqs_global=num_seqs_global)
  n_tok = jnp.sum(obs_BT, dtype=F32)
  metrics = {"obs_ce": jax.lax.stop_gradient(jnp.sum(ce_BT) / jnp.maximum(n_tok, 1.0)),
             "obs_ce_agg": jax.lax.stop_gradient(ce_agg),
             "obs_tokens": n_tok,
             "obs_seqs": jnp.sum(jnp.any(obs_BT, axis=-1), dtype=F32)}
  return LossOutput(jnp.asarray(coef, F32) * ce_agg, metrics)
