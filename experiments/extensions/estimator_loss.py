"""An estimator's own term in the RL objective (`EstimatorSpec.trained_loss`).

Some estimators train something besides the policy's advantages: VIMPO a terminal-value loss,
VeriFree and JEPO the likelihood of the reference answer. Their registration names the term
(`credit.TrainedLoss`: its function, inputs, per-row targets the estimator returns, default
weight). With weight c = `c.estimator_loss_coef` (None: the registered default; 0: off) the
update adds c·term on the rollout's rows, on the same model pass as the policy loss:

    L_main = L_policy (+ KL, entropy, observation terms) + c · term(logprob | logprob_answer, ...)

`logprob` is that pass's log-probs of the sampled tokens; `logprob_answer` ([B,A]) teacher-
forces the reference answer again on the minibatch's `answer_tokens` (prompt ⊕ response ⊕
answer) in a second pass. Metric: `estimator_loss` (the unweighted term).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import ml_collections

import credit
from credit.scoring import score_tokens
from experiments import producers, train
from experiments.extensions.base import Built, Extension, Resolved

SetupError = producers.SetupError
NAME = "estimator_loss"


@dataclasses.dataclass(frozen=True)
class EstimatorLoss:
  """An estimator's own term resolved for a run:
  coef · fn(**<the update's own scores>, **{f: minibatch[f] for f in inputs}, **kwargs),
  the scores being `logprob` (the sampled tokens) and / or `logprob_answer` (the reference
  answer, teacher-forced again on the minibatch's `answer_tokens`)."""
  fn: Callable
  inputs: tuple[str, ...]      # batch fields: contract fields and the estimator's targets
  kwargs: Mapping[str, Any]    # its hyperparameters
  coef: float
  scores: tuple[str, ...] = ("logprob",)
  score_inputs: tuple[str, ...] = ()  # batch fields the scores are computed from

  @property
  def batch_fields(self) -> tuple[str, ...]:
    """Every batch field the term reads."""
    return tuple(self.inputs) + tuple(self.score_inputs)


def coef(c: ml_collections.ConfigDict, est: credit.EstimatorSpec) -> float:
  """The weight of the estimator's own loss term: `c.estimator_loss_coef`, or the registered
  default when that is None (0 for an estimator without a term)."""
  if c.get("estimator_loss_coef") is not None:
    return float(c.estimator_loss_coef)
  return est.trained_loss.coef if est.trained_loss is not None else 0.0


def _estimator(c: ml_collections.ConfigDict) -> credit.EstimatorSpec | None:
  try:
    return credit.get_estimator(c.estimator)
  except (KeyError, ValueError):
    return None


def on(c: ml_collections.ConfigDict) -> bool:
  """The run's estimator has a loss term and its weight is not 0."""
  est = _estimator(c)
  return est is not None and est.trained_loss is not None and coef(c, est) > 0


def check(c: ml_collections.ConfigDict) -> None:
  """A negative weight, or a weight for an estimator without a term of its own."""
  if c.get("estimator_loss_coef") is None:
    return
  est = credit.get_estimator(c.estimator)
  w = coef(c, est)
  if w < 0:
    raise SetupError(f"estimator_loss_coef={c.estimator_loss_coef} must be >= 0 (0: off)")
  if w and est.trained_loss is None:
    with_term = [n for n in credit.list_estimators()
                 if credit.get_estimator(n).trained_loss is not None]
    raise SetupError(f"estimator_loss_coef={c.estimator_loss_coef}: estimator {est.name!r} "
                     f"has no loss term of its own (those that do: {with_term})")


def needs(c: ml_collections.ConfigDict, est: credit.EstimatorSpec) -> dict[str, str]:
  """The contract fields the term reads (its inputs and what its scores are computed from)."""
  tl = est.trained_loss
  if tl is None or not coef(c, est):
    return {}
  who = f"estimator {est.name!r}'s loss term"
  return {f: who for f in tl.fields_for(dict(c.estimator_kwargs)) + tl.score_inputs}


def resolve(c: ml_collections.ConfigDict, est: credit.EstimatorSpec,
            hyper: Mapping[str, Any]) -> Resolved:
  """`EstimatorLoss` of the run (inputs: the fields its hyperparameters select and the
  estimator's per-row targets) and the batch fields it reads."""
  tl = est.trained_loss
  term = EstimatorLoss(fn=tl.fn, inputs=tl.fields_for(hyper) + tuple(tl.targets),
                       kwargs=tl.kwargs_for(est.fn, hyper), coef=coef(c, est),
                       scores=tl.scores, score_inputs=tl.score_inputs)
  return Resolved(term, frozenset(term.batch_fields))


def answer_scores(model, mb: Mapping[str, jax.Array], chunk_size: int | None) -> jax.Array:
  """[B,A] log-probs of the reference answer's tokens under `model`: one pass over the
  minibatch's `answer_tokens` (prompt ⊕ response ⊕ answer), read at `answer_positions`."""
  logprob, _ = score_tokens(model, mb["answer_tokens"], mb["answer_attn_mask"],
                            chunk_size=chunk_size, return_entropy=False)
  return jnp.take_along_axis(logprob, mb["answer_positions"], axis=1)


def loss_term(term: EstimatorLoss, chunk_size: int | None) -> train.LossTerm:
  """`term` as a `train.LossTerm` on the main rows' model pass, weight `term.coef`, metric
  `estimator_loss`."""

  def fn(scores, mb):
    own = {"logprob": scores["logprob"]}
    if "logprob_answer" in term.scores:
      own["logprob_answer"] = answer_scores(scores["model"], mb, chunk_size)
    value = term.fn(**{s: own[s] for s in term.scores}, **{f: mb[f] for f in term.inputs},
                    **term.kwargs)
    return value, {"estimator_loss": value}

  return train.LossTerm("the estimator's loss term", fn, weight=term.coef)


def build(s: producers.Setup, method: Any) -> Built:
  return Built(terms=(loss_term(method.extensions[NAME], s.chunk_size),))


EXTENSION = Extension(
    name=NAME, on=on, check=check, needs=needs, resolve=resolve, build=build,
    doc="an estimator's own loss term (`trained_loss`: VIMPO's value loss, VeriFree's and "
        "JEPO's answer likelihood), weight estimator_loss_coef, on the policy loss's pass")
