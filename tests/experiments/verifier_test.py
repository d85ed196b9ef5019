"""The generative verifier trained next to the policy (experiments/producers/verifier.py; RL Tango, TIPS):
its output format and rewards, and the rl_tango_chain recipe end to end with an exact resume."""
import importlib
import json
import os
import shutil

import numpy as np
import pytest

from experiments import loop, producers
from experiments.producers import verifier as V


@pytest.mark.parametrize("text,steps,final,score", [
    ("yn:n", (True, False), False, 1.0),
    (" yy:y\n", (True, True), True, 1.0),
    ("y:n", (True,), False, 0.2),           # one verdict for two steps
    ("yny:y", (True, False, True), True, 0.2),
    (":y", (), True, 0.2),                   # no step verdict
    ("yn:x", (True, False), None, 0.2),      # no final verdict
    ("y?n:n", (True, False), False, 0.6),    # other characters among the verdicts
    ("yn", (), None, 0.0),                   # not <steps>:<final>
    ("y:n:n", (), None, 0.0),
    ("", (), None, 0.0),
])
def test_parse_verdict_scores_the_format_as_the_code(text, steps, final, score):
  d = V.parse_verdict(text, 2)
  assert d.steps == steps and d.final is final
  np.testing.assert_allclose(d.format_score, score, atol=1e-9)


def test_step_count_is_not_checked_when_the_response_lacks_the_format():
  """The code checks the verdict count only when the generator's own format is right."""
  assert V.parse_verdict("y:n", 2, response_format_ok=False).format_score == 1.0
  assert V.parse_verdict("y:n", 2, response_format_ok=True).format_score == pytest.approx(0.2)


def test_rewards_and_process_rewards():
  good, wrong_count, none = V.parse_verdict("yn:n", 2), V.parse_verdict("y:n", 2), \
      V.parse_verdict("yn", 2)
  assert V.verifier_reward(good, False) == pytest.approx(1.8)
  assert V.verifier_reward(good, True) == pytest.approx(0.8)
  assert V.verifier_reward(good, False, format_weight=0.0) == 1.0  # TIPS
  assert V.verifier_reward(wrong_count, False) == pytest.approx(1.0 + 0.8 * 0.2)
  assert V.verifier_reward(none, False) == 0.0  # no final verdict: no correctness reward
  values, ok = V.process_rewards(good, 2)
  assert ok and values.tolist() == [0.5, -0.5]
  assert not V.process_rewards(wrong_count, 2)[1]
  assert not V.process_rewards(V.parse_verdict(":y", 0), 0)[1]
  for steps in ([], [True], [False, True, True]):
    for final in (True, False):
      d = V.parse_verdict(V.verdict_text(steps, final), len(steps))
      assert d.steps == tuple(steps) and d.final is final


def _tiny(**overrides):
  c = importlib.import_module("experiments.configs.rl_tango_chain").get_config("tiny")
  c.mesh = "data=1"
  c.eval_every = 0
  c.export_hf = False
  for k, v in overrides.items():
    c[k] = v
  return c


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if "loss" in r]


def test_policy_and_verifier_train_together_and_resume_exactly(tmp_path):
  """rl_tango_chain:tiny: the verifier makes step_reward/step_mask, warms up once (format SFT,
  a solo step), is updated every step with its own metrics and time, and both models resume
  exactly from a checkpoint (parameters, optimiser, class-count EMAs, the warm-up flag)."""
  wd = str(tmp_path / "run")
  c = _tiny()
  plan = {p.producer.name: p.wanted for p in loop.check_method(c).plan}
  assert plan[V.NAME] == {"step_reward", "step_mask"}
  loop.run(c, wd)
  rows = _rows(wd)
  assert [r["step"] for r in rows] == [1, 2]
  assert "verifier_sft_loss" in rows[0] and "verifier_solo_loss" in rows[0]
  assert "verifier_sft_loss" not in rows[1]  # the warm-up runs once
  for r in rows:
    assert r["time_verifier"] > 0 and np.isfinite(r["verifier_loss"])
    assert 0 <= r["verifier_format"] <= 1 and 0 <= r["verifier_aligned"] <= 1
  # Resume from step 1: the second step repeats exactly.
  shutil.rmtree(os.path.join(wd, "checkpoints", "2"))
  wd2 = str(tmp_path / "again")
  shutil.copytree(os.path.join(wd, "checkpoints"), os.path.join(wd2, "checkpoints"))
  loop.run(_tiny(), wd2)
  again = _rows(wd2)
  assert [r["step"] for r in again] == [2]
  for k in ("loss", "verifier_loss", "verifier_reward_mean", "verifier_grad_norm",
            "verifier_final_acc", "verifier_format", "adv_abs_mean"):
    assert again[0][k] == rows[1][k], k


@pytest.mark.parametrize("key,value,match", [
    ("advantage", "rloo", "verifier.advantage='rloo'; valid"),
    ("balance", "log", "verifier.balance='log'; valid"),
    ("sft_labels", "teacher", "verifier.sft_labels='teacher'; valid"),
    ("suffix", "?", "has no {steps} field"),
    ("samples", 1, "samples must be >= 2"),
    ("num_minibatches", 3, "must divide its batch"),
])
def test_bad_verifier_settings_are_refused_before_any_file(key, value, match, tmp_path):
  c = _tiny()
  c.verifier[key] = value
  wd = tmp_path / "run"
  with pytest.raises(producers.SetupError, match=match):
    loop.run(c, str(wd))
  assert not wd.exists()
