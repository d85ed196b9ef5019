"""Pure step functions of the runner: optimiser, SFT warm-up, advantages, RL update.

Everything here is a function of arrays and pytrees; `experiments/run.py` owns
the Python loop, files and logging. Each factory resolves configuration in
Python and returns a function the caller jits, so no string is compared inside
a traced body.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

import credit
from credit import ops
from credit.kl import kl_penalty
from credit.losses import aggregate_loss
from credit.scoring import model_hidden, score_hidden, score_tokens, sum_pi_squared_hidden

# Inputs the single-turn loop produces for estimators and losses.
LOOP_FIELDS = frozenset({
    "tokens", "response_mask", "group_id", "reward", "logprob", "logprob_old",
    "logprob_ref", "logprob_sampler", "entropy", "obs_mask", "turn_id", "prompt_id",
    "reward_baseline", "sum_pi_squared",
})


class TrainState(struct.PyTreeNode):
  """Everything that changes during training; a pytree the caller can see and checkpoint."""
  step: jax.Array           # [] int32, RL steps completed
  params: Any               # nnx.State of the policy's parameters
  opt_state: Any            # optax state
  key: jax.Array            # raw PRNG key data, uint32[2]
  estimator_state: Any = None  # e.g. DCPO running statistics


def make_optimizer(*, learning_rate: float, total_steps: int, warmup_steps: int,
                   weight_decay: float, grad_clip: float,
                   trainable: Any | None = None) -> optax.GradientTransformation:
  """AdamW with global-norm clipping and linear warm-up + cosine decay to 10%.

  `trainable` is an optional pytree of bools matching the params (LoRA: only
  adapters train); frozen leaves get zero updates and no optimiser moments.
  """
  sched = optax.warmup_cosine_decay_schedule(
      init_value=0.0 if warmup_steps else learning_rate, peak_value=learning_rate,
      warmup_steps=warmup_steps, decay_steps=max(total_steps, warmup_steps + 1),
      end_value=0.1 * learning_rate)
  tx = optax.chain(optax.clip_by_global_norm(grad_clip),
                   optax.adamw(sched, weight_decay=weight_decay))
  if trainable is not None:
    tx = optax.multi_transform({True: tx, False: optax.set_to_zero()},
                               jax.tree.map(bool, trainable))
  return tx


def state_shardings(tx: optax.GradientTransformation, params: Any, opt_state: Any, mesh) -> tuple:
  """(param shardings, optimiser-state shardings): moments follow their params, the rest replicated.

  Used as explicit `out_shardings` so that a step's outputs have exactly the
  shardings of its inputs and the next call hits the compilation cache.
  """
  from jax.sharding import NamedSharding, PartitionSpec as P
  rep = NamedSharding(mesh, P())

  def of(x):
    s = getattr(x, "sharding", None)
    return s if isinstance(s, NamedSharding) and s.mesh == mesh else rep

  p_sh = jax.tree.map(of, params)
  o_sh = optax.tree_map_params(tx, lambda _, s: s, opt_state, p_sh,
                               transform_non_params=lambda _: rep)
  return p_sh, o_sh


def split_model(model: nnx.Module):
  """(graphdef, params, rest) so params can be a jit argument and rest a constant."""
  return nnx.split(model, nnx.Param, ...)


def merge_model(graphdef, params, rest) -> nnx.Module:
  return nnx.merge(graphdef, params, rest)


# --------------------------------------------------------------------------
# Supervised warm-up.
# --------------------------------------------------------------------------


def make_sft_step(graphdef, rest, tx: optax.GradientTransformation,
                  chunk_size: int | None) -> Callable:
  """Returns sft_step(params, opt_state, batch) -> (params, opt_state, metrics).

  batch: tokens [B,T] (prompt + demonstration, right-padded), attn_mask [B,T]
  (valid tokens), response_mask [B,T] (demonstration tokens: the NLL targets).
  """

  def loss_fn(params, batch):
    model = merge_model(graphdef, params, rest)
    logprob, _ = score_tokens(model, batch["tokens"], batch["attn_mask"],
                              chunk_size=chunk_size, return_entropy=False)
    return -ops.masked_mean(logprob, batch["response_mask"])

  def sft_step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, {"sft_loss": loss, "grad_norm": optax.global_norm(grads)}

  return sft_step


# --------------------------------------------------------------------------
# Advantages.
# --------------------------------------------------------------------------


def estimator_arguments(spec: credit.EstimatorSpec, fields: Mapping[str, Any],
                        hyper: Mapping[str, Any], *, num_groups: int,
                        group_size: int | None) -> tuple[dict, dict]:
  """Splits the call of `spec.fn` into (array kwargs, static kwargs).

  `num_groups` / `group_size` are passed when the function takes them.
  """
  params = inspect.signature(spec.fn).parameters
  needs = spec.needs_for(hyper)
  arrays = {n: fields[n] for n in needs if n in params}
  static = dict(hyper)
  if "num_groups" in params:
    static["num_groups"] = num_groups
  if "group_size" in params:
    static["group_size"] = group_size
  for k, v in list(static.items()):
    if k not in params and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
      valid = [p for p in params if p not in needs]
      raise ValueError(f"estimator {spec.name!r} has no hyperparameter {k!r}; valid: {valid}")
    if isinstance(v, list):
      static[k] = tuple(v)
  return arrays, static


def make_advantage_fn(spec: credit.EstimatorSpec, static: Mapping[str, Any]) -> Callable:
  """advantage_fn(arrays, estimator_state) -> (advantages [B,T], estimator_state)."""

  def advantage_fn(arrays, estimator_state):
    kwargs = dict(arrays)
    if spec.stateful:
      kwargs["state"] = estimator_state
    out = spec.fn(**kwargs, **static)
    if spec.stateful:
      return out.advantages, out.state
    if spec.returns_output:
      return out.advantages, estimator_state
    return out, estimator_state

  return advantage_fn


# --------------------------------------------------------------------------
# RL update: PPO epochs over minibatches, one jitted function.
# --------------------------------------------------------------------------


def make_rl_update(graphdef, rest, tx: optax.GradientTransformation, *,
                   loss_spec: credit.PolicyLossSpec, loss_kwargs: Mapping[str, Any],
                   kl_coef: float, kl_kind: str, entropy_coef: float,
                   ppo_epochs: int, num_minibatches: int, chunk_size: int | None) -> Callable:
  """Returns update(state, batch) -> (state, metrics).

  batch holds [B,...] arrays: tokens, attn_mask, response_mask, advantages,
  logprob_old, and logprob_ref / logprob_sampler when used. Each epoch
  shuffles rows with a key folded from the state key and takes
  `num_minibatches` optimiser steps.
  """
  loss_params = inspect.signature(loss_spec.fn).parameters
  agg_mode = loss_kwargs.get("loss_agg_mode", "token-mean")
  extra_fields = [n for n in ("logprob_ref", "logprob_sampler", "entropy", "group_id")
                  if n in loss_params]  # passed when present in the batch

  def loss_fn(params, mb):
    model = merge_model(graphdef, params, rest)
    need_entropy = entropy_coef != 0.0 or "entropy" in loss_params
    logprob, entropy = score_tokens(model, mb["tokens"], mb["attn_mask"],
                                    chunk_size=chunk_size, return_entropy=need_entropy)
    kwargs = {k: mb[k] for k in extra_fields if k in mb and k != "entropy"}
    if "entropy" in loss_params:
      kwargs["entropy"] = jax.lax.stop_gradient(entropy)
    out = loss_spec.fn(logprob=logprob, logprob_old=mb["logprob_old"],
                       advantages=mb["advantages"], response_mask=mb["response_mask"],
                       **kwargs, **loss_kwargs)
    loss = out.loss
    metrics = dict(out.metrics)
    metrics["pg_loss"] = out.loss
    if kl_coef:
      kl = kl_penalty(logprob, mb["logprob_ref"], kind=kl_kind)
      kl_loss = aggregate_loss(kl, mb["response_mask"], agg_mode)
      loss = loss + kl_coef * kl_loss
      metrics["kl_loss"] = kl_loss
    if need_entropy:
      ent = ops.masked_mean(entropy, mb["response_mask"])
      metrics["entropy"] = ent
      if entropy_coef:
        loss = loss - entropy_coef * ent
    return loss, metrics

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def update(state: TrainState, batch: Mapping[str, jax.Array]):
    B = batch["tokens"].shape[0]
    mb_size = B // num_minibatches
    key = jax.random.wrap_key_data(state.key)

    def epoch(carry, e):
      params, opt_state = carry
      perm = jax.random.permutation(jax.random.fold_in(key, e), B)
      shuffled = jax.tree.map(lambda x: x[perm].reshape((num_minibatches, mb_size) + x.shape[1:]),
                              dict(batch))

      def minibatch(carry, mb):
        params, opt_state = carry
        (loss, metrics), grads = grad_fn(params, mb)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = dict(metrics, loss=loss, grad_norm=optax.global_norm(grads))
        return (params, opt_state), metrics

      return jax.lax.scan(minibatch, (params, opt_state), shuffled)

    (params, opt_state), metrics = jax.lax.scan(
        epoch, (state.params, state.opt_state), jnp.arange(ppo_epochs))
    metrics = jax.tree.map(jnp.mean, metrics)
    return state.replace(params=params, opt_state=opt_state, step=state.step + 1), metrics

  return update


def make_scorer(graphdef, rest, chunk_size: int | None, *,
                sum_pi_squared: bool = False) -> Callable:
  """score(params, tokens, attn_mask) -> (logprob [B,T], entropy [B,T]) without gradients; with
  `sum_pi_squared`, (logprob, entropy, Σπ² [B,T]) from the same model pass."""

  def score(params, tokens, attn_mask):
    model = merge_model(graphdef, params, rest)
    hidden, unembed, mask = model_hidden(model, tokens, attn_mask)
    out = score_hidden(hidden, unembed, tokens, mask, chunk_size=chunk_size, return_entropy=True)
    if not sum_pi_squared:
      return out
    return (*out, sum_pi_squared_hidden(hidden, unembed, mask, chunk_size=chunk_size))

  return score
