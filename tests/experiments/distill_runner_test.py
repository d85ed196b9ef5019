"""Distillation in the runner: the teacher recipe, frozen and self-teachers, their checks,
the distillation recipes and SD-Search's query positions on the multi-turn lookup task.

One tiny teacher (`sft_teacher_arithmetic:tiny`) is trained per module and shared."""
import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file

from experiments import loop, producers
from tests.experiments.runner_test import METHOD_RUN, read_metrics, tiny


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
  wd = str(tmp_path_factory.mktemp("teacher") / "run")
  loop.run(tiny("sft_teacher_arithmetic"), wd)
  return os.path.join(wd, "hf_policy")


def test_teacher_recipe_exports_a_larger_model_with_its_tokenizer_identity(teacher):
  rows = read_metrics(os.path.dirname(teacher))
  assert [r["step"] for r in rows] == [0] and "eval_accuracy" in rows[0]  # SFT only
  with open(os.path.join(teacher, producers.CHAR_TOKENIZER_FILE)) as f:
    assert json.load(f)["chars"] == loop.tasks_lib.CharTokenizer().chars
  with open(os.path.join(teacher, "config.json")) as f:
    assert json.load(f)["hidden_size"] > tiny("opd_arithmetic").model.hidden_size


def test_scope_recipe_runs_with_the_trained_teacher(teacher, tmp_path):
  """`scope_arithmetic:tiny` from the tiny teacher (the OPD recipe runs in the next test)."""
  c = tiny("scope_arithmetic")
  c.teacher.init_from = teacher
  wd = str(tmp_path / "run")
  loop.run(c, wd)
  rows = read_metrics(wd)
  assert [r["step"] for r in rows][-1] == c.steps
  assert np.isfinite(rows[-1]["time_teacher"]) and np.isfinite(rows[-1]["loss"])


def test_a_teacher_identical_to_the_student_leaves_it_unchanged(teacher, tmp_path):
  """`opd_arithmetic:tiny` with the student's own weights as the frozen teacher: OPD's
  advantage ℓ_teacher − ℓ_student is exactly zero (the two passes agree bit for bit), so
  two RL steps change no weight. (The top-k term's gradient at p_S = p_T is zero only up to rounding, which Adam
  would scale up to a full step: `topk_distill` is checked by its divergence instead.)"""
  c = tiny("opd_arithmetic", sft_steps=0, warm_start_from=teacher)
  c.teacher.init_from = teacher
  wd = str(tmp_path / "run")
  loop.run(c, wd)
  a, b = (load_file(os.path.join(d, "model.safetensors"))
          for d in (teacher, os.path.join(wd, "hf_policy")))
  assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _fake_checkpoint(path, vocab_size, files):
  os.makedirs(path)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump({"vocab_size": vocab_size}, f)
  open(os.path.join(path, "model.safetensors"), "wb").close()
  for name, content in files.items():
    with open(os.path.join(path, name), "w") as f:
      json.dump(content, f)
  return path


def test_a_teacher_with_another_tokenizer_is_refused_before_any_file_is_written(tmp_path):
  V = loop.tasks_lib.CharTokenizer().vocab_size
  chars = loop.tasks_lib.CharTokenizer().chars
  cases = {
      "hf": (_fake_checkpoint(str(tmp_path / "hf"), V, {"tokenizer.json": {
          "model": {"vocab": {"a": 0}}, "added_tokens": []}}), "the teacher has a Hugging Face"),
      "chars": (_fake_checkpoint(str(tmp_path / "chars"), V, {
          producers.CHAR_TOKENIZER_FILE: {"chars": chars[::-1]}}), "vocabularies differ"),
      "none": (_fake_checkpoint(str(tmp_path / "none"), V, {}), "neither tokenizer.json"),
      "vocab": (_fake_checkpoint(str(tmp_path / "vocab"), V + 8, {
          producers.CHAR_TOKENIZER_FILE: {"chars": chars}}), "vocab_size"),
  }
  for name, (path, message) in cases.items():
    c = tiny("opd_arithmetic")
    c.teacher.init_from = path
    wd = str(tmp_path / f"run_{name}")
    with pytest.raises(loop.SetupError, match=message):
      loop.run(c, wd)
    assert not os.path.exists(wd), name


def test_self_teacher_with_a_hint_and_a_lagged_copy_runs_and_refuses_unknown_contexts(tmp_path):
  c = tiny("opd_arithmetic", steps=3, **METHOD_RUN)
  c.teacher.init_from = ""
  c.teacher.context = "hint"
  c.teacher.lag = 2
  wd = str(tmp_path / "run")
  loop.run(c, wd)
  assert all(np.isfinite(r["time_teacher"]) for r in read_metrics(wd) if r["step"])
  c.teacher.context = "skill"
  with pytest.raises(loop.SetupError, match="privileged contexts \\['hint'\\]"):
    loop.run(c, str(tmp_path / "bad"))


def test_sd_search_distils_on_the_query_tokens_of_lookup_episodes(tmp_path):
  """The multi-turn lookup task with the policy as a hindsight self-teacher (the gold answer
  in its prompt): the JSD term covers the tool-call arguments only."""
  c = tiny("igpo_lookup", estimator="grpo", policy_loss="sd_search", steps=1,
           **dict(METHOD_RUN, sft_steps=2))  # a warm-up, so that episodes call the tool
  c.teacher.context = "answer"
  c.teacher.top_k = 4
  wd = str(tmp_path / "run")
  loop.run(c, wd)
  last = read_metrics(wd)[-1]
  assert 0.0 < last["query_frac"] < 1.0 and np.isfinite(last["distill_div"])


def test_amft_balances_sft_and_rl_in_the_loop(tmp_path):
  """`--config.amft.enabled`: one update per step on (1 − μ)∇L_RL + μ∇L_SFT; the controller's
  state is in the train state (checkpointed), its metrics in metrics.jsonl."""
  c = tiny(num_minibatches=1, **METHOD_RUN)
  c.amft.enabled = True
  c.amft.val_examples = 8
  c.amft.sft_batch_size = 8
  c.amft.meta_lr = 10.0  # visible movement in two steps
  wd = str(tmp_path / "run")
  loop.run(c, wd)
  rows = [r for r in read_metrics(wd) if r["step"]]
  assert len(rows) == c.steps
  for r in rows:
    assert 0.0 < r["amft_mu"] < 1.0 and np.isfinite(r["amft_meta_gradient"])
    np.testing.assert_allclose(r["loss"], (1 - r["amft_mu"]) * r["amft_loss_rl"]
                               + r["amft_mu"] * r["amft_loss_sft"], rtol=1e-4, atol=1e-6)
  assert rows[-1]["amft_mu"] != 0.5
  with pytest.raises(loop.SetupError, match="num_minibatches=1"):
    loop.run(tiny(num_minibatches=2, amft=dict(c.amft)), str(tmp_path / "bad"))
