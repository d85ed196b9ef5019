"""Model passes over the rollout: the policy's own scoring pass (log-probs, entropy, Σπ²),
the sampler's behaviour log-probs, the frozen reference, full-vocabulary divergences, the
parameter version of each row and ReMax's greedy baseline."""
from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np

from credit import parallel, scoring
from credit import divergences as divergences_lib
from experiments import train
from experiments.producers.base import (Produce, Setup, SetupError, StepContext, producer,
                                        scoring_temperature, truncated_sampling, verify_rows)


def _check_sampler_logprob_old(c) -> None:
  if scoring_temperature(c) != 1.0 and truncated_sampling(c):
    raise SetupError(
        f"logprob_old_source='sampler' at temperature={c.temperature} with top_k={c.top_k} / "
        f"top_p={c.top_p}: the sampler reports log-probs renormalised over the kept tokens, "
        "which no other pass of the run scores; use logprob_old_source='recompute' or sample "
        "without truncation")


@producer("sampler_logprob_old", trees=True,
          provides=("logprob_old",),
          requires=("response_mask", "logprob_sampler"),
          phase="scoring",
          doc="behaviour log-probs reported by the sampler, under the distribution the scoring "
              "passes use (the raw model at temperature 1, else the tempered one)",
          when=lambda c: c.logprob_old_source == "sampler",
          check=_check_sampler_logprob_old,
          off_doc="logprob_old_source='sampler'")
def _build_sampler_logprob_old(s: Setup, wanted: frozenset) -> Produce:
  # At τ = 1 the sampler's raw log-probs; at τ != 1 (no truncation: checked) its sampling
  # log-probs, which are then the tempered policy's, as the recomputing passes score it.
  raw = scoring_temperature(s.c) == 1.0

  def produce(state, batch, ctx: StepContext) -> dict:
    lp = batch["logprob_raw"] if raw else batch["logprob_sampler"]
    return {"logprob_old": jnp.where(batch["response_mask"], lp, 0.0)}

  return produce


@producer("policy_version", trees=True,
          provides=("policy_version",),
          requires=("tokens",),
          phase="sampling",
          doc="the version (RL steps) of the parameters that sampled each row: the "
  "current step in the synchronous loop; asynchronous units stamp their oldest")
def _build_policy_version(s: Setup, wanted: frozenset) -> Produce:
  def produce(state, batch, ctx: StepContext) -> dict:
    # state.step: the RL steps of the parameters that sampled (an async worker's held version).
    step = state.step
    if isinstance(step, jax.Array) and not step.is_fully_addressable:  # replicated
      step = step.addressable_data(0)
    v = np.full(batch["tokens"].shape[0], int(np.asarray(step)), np.int32)
    return {"policy_version": parallel.shard_batch(v, s.mesh)}

  return produce


@producer("policy_pass", trees=True,
          provides=("logprob", "logprob_old", "entropy", "sum_pi_squared"),
          requires=("tokens",),
          phase="scoring",
          doc="one no-gradient pass of the policy: log-probs (logprob_old recomputed by the "
              "trainer), entropy, and Σπ² from the same pass when needed")
def _build_policy_pass(s: Setup, wanted: frozenset) -> Produce:
  # Σπ² comes from the same model pass as the log-probs, and only when a method uses it.
  names = ("logprob", "entropy") + (("sum_pi_squared",) if "sum_pi_squared" in wanted else ())
  score = s.scorer(sum_pi_squared="sum_pi_squared" in wanted)

  def produce(state, batch, ctx: StepContext) -> dict:
    out = dict(zip(names, score(state.params, batch["tokens"], batch["attn_mask"])))
    return dict(out, logprob_old=out["logprob"])  # recomputed by the trainer: θ_old = θ

  return produce


@producer("reference_pass", trees=True,
          provides=("logprob_ref",),
          requires=("tokens",),
          phase="reference",
          doc="the frozen initial policy (after any warm-up) scores the tokens",
          keeps_reference=True)
def _build_reference_pass(s: Setup, wanted: frozenset) -> Produce:
  score = s.scorer(entropy=False)

  def produce(state, batch, ctx: StepContext) -> dict:
    logprob_ref, _ = score(ctx.ref_params, batch["tokens"], batch["attn_mask"])
    return {"logprob_ref": logprob_ref}

  return produce


# Full-vocabulary divergences of the behaviour policy from the reference, per position
# (student = the policy π, teacher = the reference π_ref in `credit.divergences`' terms).
DIVERGENCE_FIELDS = {"hellinger_ref": "hellinger", "kl_ref": "reverse_kl",
                     "kl_ref_forward": "forward_kl"}


@producer("divergence_pass", trees=True,
          provides=tuple(DIVERGENCE_FIELDS),
          requires=("tokens", "response_mask"),
          phase="divergence",
          doc="full-vocabulary divergences of the behaviour policy from the frozen reference at "
              "each position (squared Hellinger, KL both ways), from one pass of each model and "
              "the chunked `credit.divergences` (no [B,T,V] array)",
          keeps_reference=True)
def _build_divergence_pass(s: Setup, wanted: frozenset) -> Produce:
  names = sorted(wanted)

  @jax.jit
  def divergences(params, ref_params, tokens, attn_mask, response_mask):
    hidden = []
    for p in (params, ref_params):
      model = train.merge_model(s.graphdef, p, s.rest)
      h, valid = scoring.next_token_hidden(model.hidden_states(tokens, mask_BT=attn_mask),
                                           attn_mask)
      hidden.append((h, model.unembedding().astype(h.dtype)))
    (hs, ws), (ht, wt) = hidden
    return {n: jnp.where(response_mask, divergences_lib.token_divergence(
        hs, ws, ht, wt, kind=DIVERGENCE_FIELDS[n], mask_BT=valid, chunk_size=s.chunk_size),
        0.0) for n in names}

  def produce(state, batch, ctx: StepContext) -> dict:
    return divergences(state.params, ctx.ref_params, batch["tokens"], batch["attn_mask"],
                       batch["response_mask"])

  return produce


@producer("greedy_baseline", trees=True,
          provides=("reward_baseline",),
          requires=(),
          phase="baseline",
          doc="reward of the greedy response per prompt (ReMax)")
def _build_greedy_baseline(s: Setup, wanted: frozenset) -> Produce:
  def produce(state, batch, ctx: StepContext) -> dict:
    out = s.sampler(s.model_state(state.params), prompt_tokens=ctx.prompt_tokens,
                    prompt_mask=ctx.prompt_mask, key=ctx.key,
                    max_new_tokens=s.c.max_new_tokens, temperature=0.0)
    host = parallel.to_host({"tokens": out.tokens, "response_mask": out.response_mask})
    _, reward = verify_rows(s, ctx.examples, host["tokens"], host["response_mask"],
                        np.arange(s.num_groups))
    return {"reward_baseline": parallel.shard_batch(
        np.asarray(reward, np.float32)[batch["host"]["group_id"]], s.mesh)}

  return produce


LOGPROB_OLD_SOURCES = ("recompute", "sampler")
