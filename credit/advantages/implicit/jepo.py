"""JEPO: the group's Jensen bound log mean_g π(a* | x, z_g), credited to each chain of thought
by its leave-one-out contribution."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from credit import ops
from credit.advantages.implicit import _likelihood as lk
from credit.registry import TrainedLoss, register_estimator

Array = jax.Array

__all__ = ["jepo_advantages", "JepoOutput", "answer_likelihood_loss"]

answer_likelihood_loss = lk.answer_likelihood_loss


class JepoOutput(NamedTuple):
  advantages: Array     # [B,T] leave-one-out credit of each chain of thought
  answer_weight: Array  # [B] n_g · the group's self-normalised answer probability

_PAPER = ("Beyond Verifiable Rewards: Scaling Reinforcement Learning for Language Models to "
          "Unverifiable Data (JEPO) (Tang, Wang, Madaan, Munos), arXiv 2503.19618")


def _masked_logmeanexp(x_B: Array, sel_BB: Array) -> tuple[Array, Array]:
  """log mean_{j: sel[..., i, j]} exp(x[..., j]) per row i, and the count (0 where nothing
  selected); x [..., n], sel [..., n, n] (any leading batch axes)."""
  n_B = jnp.sum(sel_BB, axis=-1, dtype=jnp.float32)
  xx_BB = jnp.where(sel_BB, x_B[..., None, :], -jnp.inf)
  top_B = jnp.max(xx_BB, axis=-1)
  top_B = jax.lax.stop_gradient(jnp.where(n_B > 0, top_B, 0.0))
  e_BB = jnp.where(sel_BB, jnp.exp(jnp.where(sel_BB, x_B[..., None, :] - top_B[..., None],
                                             0.0)), 0.0)
  s_B = jnp.sum(e_BB, axis=-1)
  ok_B = n_B > 0
  out_B = top_B + jnp.log(jnp.where(ok_B, s_B, 1.0)) - jnp.log(jnp.maximum(n_B, 1.0))
  return jnp.where(ok_B, out_B, 0.0), n_B


@register_estimator("jepo",
                    needs=("group_id", "response_mask", "logprob_answer", "answer_mask"),
                    paper=_PAPER, static_argnames=("num_groups", "group_size"),
                    returns_output=True,
                    trained_loss=TrainedLoss(
                        fn=lk.answer_likelihood_loss, fields=("answer_mask",),
                        targets=("answer_weight",), params=(), coef=1.0,
                        scores=("logprob_answer",)),
                    confidence="inferred",
                    source=_PAPER)
def jepo_advantages(*, group_id: ArrayLike | None, response_mask: ArrayLike,
                    logprob_answer: ArrayLike, answer_mask: ArrayLike, num_groups: int,
                    group_size: int | None = None,
                    reward_scale: ArrayLike = 1.0) -> JepoOutput:
  """Multi-sample JEPO: leave-one-out credit for the group's Jensen evidence bound.

  The chain of thought z is a latent variable; with G samples of a prompt the objective is
  the bound L_G = log (1/G) Σ_g π(a* | x, z_g) ≤ log π(a* | x). Each sample is credited with
  its leave-one-out contribution to the bound, with ℓ_g = Σ_j log π(a*_j | x, z_g, a*_{<j})::

    A_g = L_G − log (1/(G−1)) Σ_{h≠g} exp(ℓ_h)

  constant over the response tokens of sample g. The bound's gradient through the answer
  tokens is Σ_g w_g ∇ℓ_g with w_g the group's self-normalised answer probabilities: the
  returned `answer_weight` (n_g·w_g) feeds `answer_likelihood_loss`, which the
  registration's `trained_loss` makes the runner add to every minibatch's loss.

  Paper: "Beyond Verifiable Rewards: Scaling Reinforcement Learning for Language Models to
  Unverifiable Data", arXiv 2503.19618. The paper's reward is the bound shared by the
  group, whose group-baselined advantage would be zero; the leave-one-out credit (VIMCO's
  control variate, arXiv 1602.06725) and the answer weights are derived here from the
  bound. Empty rows take no part; one-row groups and groups with equal ℓ get advantage 0.

  Args:
    group_id: [B] int group ids (may be None with `group_size`).
    response_mask: [B,T] bool.
    logprob_answer: [B,A] float log-probs of the reference-answer tokens.
    answer_mask: [B,A] bool.
    num_groups: static number of groups.
    group_size: static G for contiguous groups (O(B·G) instead of O(B²) memory).
    reward_scale: multiplies A (not the answer weights).

  Returns:
    JepoOutput: advantages [B,T] float32 (zero outside `response_mask`) and answer_weight
    [B] float32 (0 on rows that take no part).

  Example:
    >>> import numpy as np
    >>> lp = np.log(np.array([[.9, .8], [.5, .5], [.2, .9], [.1, .1]], np.float32))
    >>> out = jepo_advantages(group_id=np.zeros(4, np.int32),
    ...                       response_mask=np.ones((4, 2), bool), logprob_answer=lp,
    ...                       answer_mask=np.ones((4, 2), bool), num_groups=1)
    >>> np.round(np.asarray(out.advantages[:, 0], np.float64), 4).tolist()
    [0.6817, -0.045, -0.1191, -0.279]
  """
  fn = "jepo_advantages"
  lp_BA, _, has_B = lk.answer_inputs(logprob_answer, answer_mask,
                                     jnp.shape(logprob_answer)[0])
  ell_B = jnp.sum(lp_BA, axis=-1)
  rows = lk.rows(fn, group_id, response_mask, num_groups, group_size, ell_B, has_B)
  valid_B = rows.valid
  gid_B = rows.group_id
  ell_B = jnp.where(valid_B, ell_B, 0.0)
  B = ell_B.shape[0]
  if group_size is not None:  # contiguous groups: [N,G,G] masks, O(B·G)
    ell, val = ell_B.reshape(B // group_size, group_size), valid_B.reshape(-1, group_size)
    same = val[:, :, None] & val[:, None, :]
    eye = jnp.eye(group_size, dtype=bool)
  else:  # any group ids: one [B,B] same-group mask, O(B²)
    ell, val = ell_B, valid_B
    same = (gid_B[:, None] == gid_B[None, :]) & val[:, None] & val[None, :]
    eye = jnp.eye(B, dtype=bool)
  full, n = _masked_logmeanexp(ell, same)
  loo, _ = _masked_logmeanexp(ell, same & ~jnp.broadcast_to(eye, same.shape))
  full_B, n_B, loo_B = full.reshape(B), n.reshape(B), loo.reshape(B)
  adv_B = jnp.where(valid_B & (n_B > 1), full_B - loo_B, 0.0)
  adv_B = jnp.asarray(reward_scale, jnp.float32) * adv_B
  # n·softmax(ℓ) = exp(ℓ − log mean exp ℓ) ≤ n.
  log_n_B = jnp.log(jnp.maximum(n_B, 1.0))
  w_B = jnp.where(valid_B, jnp.exp(jnp.minimum(ell_B - full_B, log_n_B)), 0.0)  # valid: n ≥ 1
  return JepoOutput(ops.broadcast_to_tokens(adv_B, rows.mask), w_B)
