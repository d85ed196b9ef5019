"""Log-probs recomputed for the update are taken under the distribution that was sampled.

The rollout samples from softmax(z/τ); the policy pass that recomputes `logprob_old` (and the
update's current log-probs) score under the same τ, so the behaviour weight
π_old / π_sampler is 1 before any update. Truncation (top-k / top-p) renormalises over a kept
set no scoring pass forms, so a run that weighs rows by π_old / π_sampler refuses it.
"""
import importlib

import numpy as np
import pytest

from experiments import loop, producers


def tiny(**overrides):
  c = importlib.import_module("experiments.configs.grpo_arithmetic").get_config("tiny")
  c.mesh = "data=1"
  c.sft_steps = 0
  for k, v in overrides.items():
    c[k] = v
  return c


def _batch(c, workdir):
  run, rs = loop.setup(c, str(workdir))
  ctx = loop._context(run, rs)  # pylint: disable=protected-access
  batch = {}
  loop.run_stages(run.stages, rs.train, batch, ctx, {})
  return batch


@pytest.mark.parametrize("source", ["recompute", "sampler"])
def test_behaviour_weight_is_one_at_the_sampling_temperature(tmp_path, source):
  c = tiny(temperature=0.7, importance_correction=True, logprob_old_source=source)
  batch = _batch(c, tmp_path)
  resp = np.asarray(batch["response_mask"])
  assert resp.any()
  old = np.asarray(batch["logprob_old"])[resp]
  behaviour = np.asarray(batch["logprob_sampler"])[resp]
  weight = np.exp(old - behaviour)
  np.testing.assert_allclose(weight, 1.0, rtol=0, atol=2e-5)
  assert producers.scoring_temperature(c) == 0.7


def test_the_raw_model_would_give_a_biased_weight(tmp_path):
  """The same rows scored at τ = 1 (what the runner did before): the weight moves off 1."""
  c = tiny(temperature=0.7, importance_correction=True)
  run, rs = loop.setup(c, str(tmp_path))
  ctx = loop._context(run, rs)  # pylint: disable=protected-access
  batch = {}
  loop.run_stages(run.stages, rs.train, batch, ctx, {})
  raw, _ = run.setup.scorer(entropy=False, tempered=False)(rs.train.params, batch["tokens"],
                                                           batch["attn_mask"])
  resp = np.asarray(batch["response_mask"])
  weight = np.exp(np.asarray(raw)[resp] - np.asarray(batch["logprob_sampler"])[resp])
  assert np.abs(weight - 1).max() > 1e-3


@pytest.mark.parametrize("flag,value", [("top_p", 0.9), ("top_k", 5)])
def test_truncation_with_an_importance_correction_is_refused(flag, value):
  c = tiny(temperature=0.7, importance_correction=True, **{flag: value})
  with pytest.raises(loop.SetupError, match=f"{flag}=.*truncate the sampling distribution"):
    loop.check_method(c)


def test_truncation_without_a_correction_runs_at_its_temperature():
  c = tiny(temperature=0.7, top_p=0.9)
  loop.check_method(c)  # plain PPO ratio π_θ / π_old: both tempered, no sampler weight


def test_sampler_log_probs_with_truncation_are_refused():
  c = tiny(temperature=0.7, top_p=0.9, logprob_old_source="sampler")
  with pytest.raises(loop.SetupError, match="logprob_old_source='sampler'"):
    loop.check_method(c)


def test_greedy_and_unit_temperatures_score_the_raw_model():
  assert producers.scoring_temperature(tiny(temperature=0.0)) == 1.0
  assert producers.scoring_temperature(tiny(temperature=1.0)) == 1.0
