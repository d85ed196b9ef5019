"""AMFT in the runner: a meta-learned balance μ between the RL loss and an SFT loss.

`--config.amft.enabled` (`credit.losses.amft`): each RL step is one optimiser step on the
whole rollout batch along (1 − μ)∇L_RL + μ∇L_SFT (`credit.losses.amft_step`): L_RL is the
configured estimator's advantages in the configured policy loss (the rollout's rows' loss),
L_SFT the negative log-likelihood of a batch of task demonstrations (`amft.sft_batch_size`
rows drawn each step with a key of (seed, step), so a resumed run draws the same ones), and
a validation loss, the same NLL on correct demonstrations of the last `amft.val_examples`
train examples, taken at the look-ahead θ' = θ − η∇L(θ, μ) (`amft.val_at`) with η the
policy's learning rate. The controller's logit φ (μ = σ(φ)) descends ∂L_val(θ')/∂φ plus
`amft.entropy_coef`·(H − H_target), H the policy's mean token entropy on the rollout batch
(no gradient), H_target the first step's H (after the warm-up). Its state (`AmftState`) is in
the train state, so it is checkpointed. Metrics: `amft_mu`, `amft_<controller metric>`,
`entropy`, `loss` = (1 − μ)L_RL + μL_SFT, `grad_norm`.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import struct

from credit import ops, parallel
from credit import tasks as tasks_lib
from credit.scoring import score_tokens
from experiments import producers, train
from experiments.extensions.base import Built, Extension, Step

SetupError = producers.SetupError
SFT, VAL = "amft_sft", "amft_val"  # the update batch's parts: this step's and the fixed batch


class AmftState(struct.PyTreeNode):
  """AMFT's controller: the logit φ of μ = σ(φ), and the entropy target (NaN until the first
  RL step measures the policy's mean token entropy after the warm-up, as the authors' code)."""
  phi: jax.Array             # [] float32
  target_entropy: jax.Array  # [] float32


def on(c: ml_collections.ConfigDict) -> bool:
  return bool(c.amft.enabled)


def check(c: ml_collections.ConfigDict) -> None:
  """Settings the controller cannot run with (those known from the config)."""
  a = c.amft
  if not a.enabled:
    return
  if c.ppo_epochs != 1 or c.num_minibatches != 1:
    raise SetupError(f"amft: one update per RL step on the whole batch; set ppo_epochs=1 and "
                     f"num_minibatches=1 (got {c.ppo_epochs}, {c.num_minibatches})")
  if not 0.0 < a.init_mu < 1.0:
    raise SetupError(f"amft.init_mu={a.init_mu} must be in (0, 1)")
  if a.val_at not in ("lookahead", "current"):
    raise SetupError(f"amft.val_at={a.val_at!r}; valid: lookahead | current")


def check_run(c: ml_collections.ConfigDict, *, data: Any, batch_divisor: int) -> None:
  """What needs the task: single-turn demonstrations, enough train examples to hold out."""
  del batch_divisor
  a = c.amft
  if getattr(data.task, "multi_turn", False):
    raise SetupError("amft: single-turn tasks only (its SFT batches are prompt + response)")
  if not 1 <= a.val_examples < len(data.train):
    raise SetupError(f"amft.val_examples={a.val_examples} must be in [1, {len(data.train)})")


def demonstrations(data: Any, examples: list[dict], rng: np.random.Generator | None) -> dict:
  """prompt + demonstration rows of `examples` (the task's demonstrator; rng None: the
  correct answers) as an SFT batch: tokens, attn_mask, response_mask."""
  demos = [data.task.demonstration(e, rng) for e in examples]
  b = tasks_lib.encode_prompt_response(data.tokenizer, [e["prompt"] for e in examples], demos,
                                       data.max_prompt_len, data.max_response_len)
  return {"tokens": b["tokens"], "attn_mask": b["prompt_mask"] | b["response_mask"],
          "response_mask": b["response_mask"]}


def make_controller(graphdef, rest, *, init_mu: float, chunk_size: int | None, lr: float,
                    meta_lr: float, entropy_coef: float, val_at: str) -> train.Controller:
  """The `train.Controller` of one AMFT step (module docstring): its losses are the rollout
  rows' loss (`train.MAIN`) and the SFT term (`SFT`), the validation batch the part `VAL`."""
  from credit.losses.amft import amft_step  # pylint: disable=g-import-not-at-top
  nll = train.sft_nll(graphdef, rest, chunk_size)
  init = AmftState(phi=jnp.asarray(np.log(init_mu / (1 - init_mu)), jnp.float32),
                   target_entropy=jnp.asarray(np.nan, jnp.float32))

  def step(params, state: AmftState, batch, losses) -> train.ControlStep:
    rows = batch[train.MAIN]
    model = train.merge_model(graphdef, params, rest)
    _, ent = score_tokens(model, rows["tokens"], rows["attn_mask"], chunk_size=chunk_size)
    h = jax.lax.stop_gradient(ops.masked_mean(ent, rows["response_mask"]))
    target = jnp.where(jnp.isnan(state.target_entropy), h, state.target_entropy)
    out = amft_step(losses[train.MAIN], losses[SFT], lambda p: nll(p, batch[VAL]), params,
                    state.phi, lr=lr, meta_lr=meta_lr, entropy=h, target_entropy=target,
                    entropy_coef=entropy_coef, val_at=val_at)
    metrics = {f"amft_{k}": v for k, v in out.metrics.items()}
    metrics.update(amft_mu=out.mu, entropy=h)
    return train.ControlStep(out.grads, out.loss, AmftState(out.phi, target), metrics)

  return train.Controller(init=init, step=step)


def build(s: producers.Setup, method: Any) -> Built:
  """The controller, the SFT term and the hook that draws each step's SFT batch (the fixed
  validation batch is made here)."""
  del method
  c, data, mesh, a = s.c, s.data, s.mesh, s.c.amft
  nll = train.sft_nll(s.graphdef, s.rest, s.chunk_size)
  val = parallel.shard_batch(demonstrations(data, data.train[-a.val_examples:], None), mesh)
  n = min(c.sft_examples, len(data.train)) if c.sft_examples > 0 else len(data.train)

  def rows(parts: dict, step: Step) -> dict:
    rng = np.random.default_rng([c.seed, 23, int(step.state.step)])
    idx = rng.integers(0, n, size=a.sft_batch_size)
    sft = demonstrations(data, [data.train[i] for i in idx], rng)
    return dict(parts, **{SFT: parallel.shard_batch(sft, mesh), VAL: val})

  term = train.LossTerm(SFT, lambda params, mb: (nll(params, mb[SFT]), {}), rows=None)
  controller = make_controller(s.graphdef, s.rest, init_mu=a.init_mu, chunk_size=s.chunk_size,
                               lr=c.learning_rate, meta_lr=a.meta_lr,
                               entropy_coef=a.entropy_coef, val_at=a.val_at)
  return Built(rows=rows, terms=(term,), controller=controller)


EXTENSION = Extension(
    name="amft", on=on, check=check, check_run=check_run, build=build,
    doc="AMFT's meta-learned SFT/RL balance: a controller of the loss mix, one update per "
        "step on (1 − μ)∇L_RL + μ∇L_SFT")
