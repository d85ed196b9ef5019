"""The critical batch's objective in the update: CSO's step DPO, InT's and PROPA's SFT.

The batch itself (rows of verified critical-step pairs, interventions or successful paths,
and the two weights of the step) is made by the `critical_*` producers
(`experiments/producers`, `--config.critical.enabled`) under the batch field `FIELD`. This
extension takes it out of the rollout's rows into a part of its own, passed whole to every
minibatch step, and adds its objective to the update:

    L = rl_weight · L_RL(minibatch) + weight · L_critical(critical batch)

the two weights read from the batch (arrays, so that `critical.until`'s schedule does not
recompile). `L_critical` (`make_loss`): with objective "dpo" (CSO) rows [0, M) are the chosen
and [M, 2M) the rejected steps after one shared context each, `credit.losses.dpo_pair_logprobs`
over `step_mask` against the batch's `logprob_ref`, then `dpo_pair_loss` with β (pairs whose
rows select no step token take no part); with "sft" (InT, PROPA)
`credit.losses.intervention_sft_loss` over `loss_mask`. Metrics: `critical_loss` and the
objective's own, prefixed `critical_`.
"""
from __future__ import annotations

from typing import Any, Callable

import jax.numpy as jnp
import ml_collections

from credit.losses import dpo_pair_logprobs, dpo_pair_loss, intervention_sft_loss
from credit.scoring import score_tokens
from experiments import producers, train
from experiments.extensions.base import Built, Extension, Resolved

FIELD = producers.critical.FIELD  # the critical producers' batch field, the update's part


def on(c: ml_collections.ConfigDict) -> bool:
  return bool(c.get("critical") is not None and c.critical.enabled)


def needs(c: ml_collections.ConfigDict, est: Any) -> dict[str, str]:
  del est
  return {FIELD: f"critical (objective {c.critical.objective!r})"}


def resolve(c: ml_collections.ConfigDict, est: Any, hyper: Any) -> Resolved:
  del c, est, hyper
  return Resolved(update_fields=frozenset({FIELD}))


def make_loss(graphdef, rest, *, objective: str, beta: float,
              chunk_size: int | None) -> Callable:
  """loss(params, batch) -> (loss, metrics): the objective on the critical batch (module
  docstring); `batch` holds tokens, attn_mask and step_mask + logprob_ref ("dpo") or
  loss_mask ("sft")."""
  def loss(params, batch):
    model = train.merge_model(graphdef, params, rest)
    logprob, _ = score_tokens(model, batch["tokens"], batch["attn_mask"], chunk_size=chunk_size,
                              return_entropy=False)
    if objective == "dpo":
      M = batch["tokens"].shape[0] // 2
      pairs = dpo_pair_logprobs(logprob=logprob, logprob_ref=batch["logprob_ref"],
                                token_mask=batch["step_mask"], chosen_row=jnp.arange(M),
                                rejected_row=M + jnp.arange(M))
      out = dpo_pair_loss(logprob_chosen=pairs.chosen, logprob_ref_chosen=pairs.ref_chosen,
                          logprob_rejected=pairs.rejected,
                          logprob_ref_rejected=pairs.ref_rejected, pair_mask=pairs.valid,
                          beta=beta)
    else:
      out = intervention_sft_loss(logprob=logprob, loss_mask=batch["loss_mask"])
    return out.loss, dict({f"critical_{k}": v for k, v in out.metrics.items()},
                          critical_loss=out.loss)

  return loss


def move_to_own_part(parts: dict, step: Any) -> dict:
  """The critical batch out of the rollout's rows (it has rows of its own) into its part."""
  del step
  main = dict(parts[train.MAIN])
  return dict(parts, **{train.MAIN: main, FIELD: main.pop(FIELD)})


def build(s: producers.Setup, method: Any) -> Built:
  del method
  k = s.c.critical
  loss = make_loss(s.graphdef, s.rest, objective=k.objective, beta=k.beta,
                   chunk_size=s.chunk_size)
  term = train.LossTerm("critical objective", lambda params, mb: loss(params, mb[FIELD]),
                        weight=lambda mb: mb[FIELD]["weight"], rows=None)
  return Built(rows=move_to_own_part, terms=(term,),
               main_weight=lambda mb: mb[FIELD]["rl_weight"])


EXTENSION = Extension(
    name="critical", on=on, needs=needs, resolve=resolve, build=build,
    doc="CSO's / InT's / PROPA's critical batch: its DPO or SFT objective added to every "
        "minibatch step, rl_weight·L_RL + weight·L_critical")
