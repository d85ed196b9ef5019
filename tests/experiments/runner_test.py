"""End-to-end tests of the runner: tiny recipes, bad input, outputs, the command line.
They call `experiments.loop.run` in-process (or the CLI in a subprocess); resume after
SIGKILL, meshes and multi-process runs are in experiments_scale_test.py (a separate file, so
the two run on different test workers)."""
import glob
import importlib
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import credit
from experiments import loop, producers, train
from experiments.configs import settings
from experiments.extensions import estimator_loss
from experiments.configs import grpo_arithmetic
from experiments.run import apply_method_overrides, check_overrides, split_method_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ALL_RECIPES = sorted(os.path.basename(p)[:-3] for p in glob.glob(
    os.path.join(ROOT, "experiments", "configs", "*_*.py")) if not os.path.basename(p).startswith("_"))
# Distillation recipes need a teacher checkpoint, and the teacher recipe is SFT only: both
# run in distill_runner_test.py (on another test worker), with the tiny teacher it trains.
DISTILL_RECIPES = ("opd_arithmetic", "scope_arithmetic", "sft_teacher_arithmetic")
# SLATE's and TP-GRPO's one-step batches are checked in tree_runner_test.py; cbpo_chain runs a
# tree batch end to end here (the update is the same for every tree batch).
TREE_STEP_RECIPES = ("slate_chain", "tp_grpo_chain")
# SCRL's one-step batch (subproblem fields and advantages) is checked in producers_test.py; the
# chain task runs end to end here through verifree_chain and cbpo_chain. The reward-shaping
# recipes' one-step batches are shaping_recipes_test.py's (with one end-to-end run of the five).
ONE_STEP_RECIPES = ("scrl_chain", "c_grpo_chain", "searchllm_chain", "atom_searcher_chain",
                    "prm_transform_chain", "ppr_renorm_chain")
# grpo_jsonl's tiny run (its own data file, sampled eval) is jsonl_recipe_test.py's;
# rl_tango_chain's (policy and verifier, with a resume) is verifier_test.py's; beamperl's
# (LoRA on an exported checkpoint the test makes) is beamperl_recipe_test.py's; cso_chain's,
# int_chain's and propa_chain's (a second objective in the update) are critical_test.py's;
# jolt_arithmetic's (both roles, on a 2-device mesh) is jolt_runner_test.py's;
# spd_rag_multidoc's (document agents' rows in the update) is spd_rag_runner_test.py's.
OTHER_FILE_RECIPES = ("grpo_jsonl", "rl_tango_chain", "beamperl_arithmetic", "cso_chain",
                      "int_chain", "propa_chain", "jolt_arithmetic", "spd_rag_multidoc")
RECIPES = [r for r in ALL_RECIPES
           if r not in DISTILL_RECIPES + TREE_STEP_RECIPES + ONE_STEP_RECIPES + OTHER_FILE_RECIPES]
# One recipe runs with bfloat16 parameters and activations (a run of its own would compile
# every program a second time).
BF16_RECIPE = "dgpo_arithmetic"


def tiny(recipe="grpo_arithmetic", **overrides):
  mod = importlib.import_module(f"experiments.configs.{recipe}")
  c = mod.get_config("tiny")
  c.mesh = "data=1"
  for k, v in overrides.items():
    c[k] = v
  return c


def read_metrics(workdir, name="metrics.jsonl"):
  with open(os.path.join(workdir, name)) as f:
    return [json.loads(line) for line in f]


def run_cli(args, env_extra=None, timeout=600):
  env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=ROOT)  # the tests' XLA_FLAGS included
  env.update(env_extra or {})
  return subprocess.run([sys.executable, "-m", "experiments.run", *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  """`tiny_run(recipe) -> (workdir, summary)`: the recipe's `:tiny` run, done once per module
  and shared by the tests that inspect its outputs."""
  done = {}

  def get(recipe="grpo_arithmetic"):
    if recipe not in done:
      wd = str(tmp_path_factory.mktemp(recipe) / "run")
      c = tiny(recipe)
      if recipe == BF16_RECIPE:
        c.model.param_dtype = c.model.compute_dtype = "bfloat16"
      done[recipe] = (wd, loop.run(c, wd))
    return done[recipe]

  return get


@pytest.mark.parametrize("recipe", RECIPES)
def test_tiny_recipe_runs_end_to_end(recipe, tiny_run):
  wd, summary = tiny_run(recipe)
  rows = read_metrics(wd)
  steps = [r["step"] for r in rows]
  assert steps[0] == 0 and steps[-1] == 2, steps
  last = rows[-1]
  for key in ("reward_mean", "accuracy", "loss", "step_time", "time_sampling", "time_update",
              "eval_accuracy"):
    assert key in last and np.isfinite(last[key]), key
  for f in ("curves.png", "token_credit.png", "summary.md"):
    with open(os.path.join(wd, f), "rb") as fh:
      head = fh.read(8)
    assert head.startswith(b"\x89PNG") or f.endswith(".md")
  assert glob.glob(os.path.join(wd, "tb", "events.*"))
  assert summary["rows"] == len(rows)
  if recipe == BF16_RECIPE:  # bf16 end to end: finite, and the export keeps the dtype
    assert np.isfinite(last["grad_norm"])
    with open(os.path.join(wd, "hf_policy", "config.json")) as f:
      cfg = json.load(f)
    assert cfg.get("dtype", cfg.get("torch_dtype")) == "bfloat16"
  if recipe == RECIPES[0]:  # the exported policy is a transformers model with the same logits
    import torch
    import transformers
    from credit.models import from_pretrained
    hf_dir = os.path.join(wd, "hf_policy")
    ours, _ = from_pretrained(hf_dir)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    tokens = np.random.default_rng(0).integers(3, ours.config.vocab_size, (2, 12))
    with torch.no_grad():
      want = theirs(torch.tensor(tokens)).logits.numpy()
    got, _ = ours(jnp.asarray(tokens, jnp.int32))
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=1e-4)


def test_sft_only_control_runs_no_rl_step(tmp_path):
  """The default recipe's control (`:sft_only`): the warm-up is longer, no RL step runs, and
  the run still evaluates the policy, writes its summary and exports it."""
  mod = importlib.import_module("experiments.configs.grpo_arithmetic")
  c = mod.get_config("tiny,sft_only")
  c.mesh = "data=1"
  assert c.steps == 0 and c.sft_steps == tiny().sft_steps + 2
  assert mod.get_config("sft_only").sft_steps == (
      settings.DEFAULT_SFT_STEPS + settings.DEFAULT_CONTROL_EXTRA_SFT_STEPS)
  wd = str(tmp_path / "run")
  summary = loop.run(c, wd)
  rows = read_metrics(wd)
  assert [r["step"] for r in rows] == [0] and "eval_accuracy" in rows[0]
  assert summary["eval_accuracy_first"] == rows[0]["eval_accuracy"]
  assert os.path.exists(os.path.join(wd, "summary.md"))
  assert os.path.exists(os.path.join(wd, "hf_policy", "model.safetensors"))
  assert not os.path.exists(os.path.join(wd, "token_credit.png"))
  # Another run starts from that warm-up (`warm_start_from`, no SFT of its own): it holds
  # (and, with no step, exports) exactly the same weights.
  c2 = tiny(sft_steps=0, steps=0, warm_start_from=os.path.join(wd, "hf_policy"))
  wd2 = str(tmp_path / "warm")
  loop.run(c2, wd2)
  from safetensors.numpy import load_file
  a, b = (load_file(os.path.join(d, "hf_policy", "model.safetensors")) for d in (wd, wd2))
  assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
  assert read_metrics(wd2)[0]["eval_reward"] == rows[0]["eval_reward"]
  with pytest.raises(loop.SetupError, match="init_from and warm_start_from are exclusive"):
    loop.run(tiny(init_from=wd, warm_start_from=os.path.join(wd, "hf_policy")),
             str(tmp_path / "w3"))


def test_warm_up_goes_on_until_it_reaches_sft_min_accuracy(tmp_path, monkeypatch):
  """`sft_min_accuracy`: the warm-up is checked after `sft_steps` and after each
  `sft_extend_steps` more, stops once the held-out accuracy reaches the bar or at
  `sft_max_steps`, and records each check in warmup.jsonl."""
  fast = dict(steps=0, export_hf=False, checkpoint_every=0, sft_min_accuracy=0.5,
              sft_extend_steps=3)
  # At the cap (the real check: a 2-step warm-up scores 0 held-out).
  wd = str(tmp_path / "cap")
  loop.run(tiny(sft_max_steps=5, **fast), wd)
  warm = read_metrics(wd, "warmup.jsonl")
  checks = [(r["step"], r["eval_accuracy"]) for r in warm if "eval_accuracy" in r]
  assert [s for s, _ in checks] == [2, 5]
  assert max(r["step"] for r in warm if "sft_loss" in r) == 5
  assert checks[-1][1] == read_metrics(wd)[0]["eval_accuracy"]  # the same policy as step 0
  with open(os.path.join(wd, "log.txt")) as f:
    assert "still < sft_min_accuracy 0.5 at the cap (sft_max_steps=5)" in f.read()
  # Reached after two extensions (the check's answers stand in for a warm-up that learns).
  answers = iter([0.1, 0.3, 0.6])
  monkeypatch.setattr(loop, "_warm_up_accuracy", lambda run, params: next(answers))
  wd = str(tmp_path / "reached")
  loop.run(tiny(sft_max_steps=20, **fast), wd)
  warm = read_metrics(wd, "warmup.jsonl")
  assert [r["step"] for r in warm if "eval_accuracy" in r] == [2, 5, 8]
  assert max(r["step"] for r in warm if "sft_loss" in r) == 8
  with open(os.path.join(wd, "log.txt")) as f:
    assert "held-out accuracy 0.600 >= sft_min_accuracy 0.5" in f.read()


def test_samples_jsonl_holds_rollouts_as_the_model_saw_them(tiny_run):
  """samples.jsonl of the tiny run (samples_every=10 > steps: the last step only): rows with
  the prompt as fed (decoded from the prompt tokens), the response, its ids, reward and one
  advantage per response token."""
  wd, _ = tiny_run()
  c = tiny()
  rows = read_metrics(wd, "samples.jsonl")
  assert len(rows) == c.samples_per_step and {r["step"] for r in rows} == {c.steps}
  data = loop.build_data(c)
  answer_of = {e["prompt"]: e["answer"] for e in data.train}
  for r in rows:
    assert set(r) == {"step", "group", "row", "prompt", "response", "response_ids", "reward",
                      "advantages", "answer"}
    assert r["prompt"] in answer_of and r["answer"] == answer_of[r["prompt"]]
    assert r["row"] // c.group_size == r["group"] < c.prompts_per_step
    assert 1 <= len(r["response_ids"]) == len(r["advantages"]) <= c.max_new_tokens
    assert r["response"] == data.tokenizer.decode(r["response_ids"])
    assert r["reward"] == data.task.verify({"answer": r["answer"]}, r["response"])
    assert all(np.isfinite(r["advantages"]))
  # Two rows per group, from groups with mixed rewards first.
  groups = [r["group"] for r in rows]
  assert groups[0] == groups[1] and groups[2] == groups[3]


def test_summary_md_compares_start_and_end(tiny_run):
  wd, summary = tiny_run()
  text = open(os.path.join(wd, "summary.md")).read()
  rows = read_metrics(wd)
  step0 = rows[0]
  assert step0["step"] == 0 and {"eval_accuracy", "eval_time", "warm_up_time",
                                 "wall_time"} <= set(step0)
  assert all("wall_time" in r for r in rows)
  evals = [r["eval_accuracy"] for r in rows if "eval_accuracy" in r]
  assert summary["eval_accuracy_first"] == step0["eval_accuracy"] == evals[0]
  line = next(l for l in text.splitlines() if l.startswith("| held-out accuracy (greedy) |"))
  assert line.endswith(f"| step 0 \u2192 step {tiny().steps} |"), line
  for prefix in ("| train reward, mean of 1 step |", "| mean response length (tokens), mean of 1",
                 "| total (start to last step) |", "| SFT warm-up", "| time_sampling |",
                 "| time_update |", "| estimator | grpo |", "| seed | 0 |", "| reward_mean |",
                 "| SFT warm-up loss, mean of 1 step |", "## Where learning happened",
                 "| 0 | "):
    assert any(l.startswith(prefix) for l in text.splitlines()), prefix


def test_run_log_warm_up_record_and_where_learning_happened(tiny_run):
  """log.txt holds the run's lines (warm-up and RL progress, every evaluation, the end); the
  warm-up's loss per step is in warmup.jsonl; the probe (the starting policy's greedy answers)
  is kept for a resume and drawn in token_change.png; each step records the sampled tokens'
  entropy estimate."""
  wd, _ = tiny_run()
  c = tiny()
  log = open(os.path.join(wd, "log.txt")).read()
  for part in ("==== start: grpo / ppo_clip on arithmetic", "warm-up 1/2 (50%) loss ",
               "warm-up 2/2 (100%)", "SFT warm-up: 2 steps", "eval at step 0: held-out accuracy",
               "RL 1/2 (50%) reward", f"eval at step {c.steps}: held-out", "RL 2/2 (100%)",
               "done at step 2 in "):
    assert part in log, part
  warm = read_metrics(wd, "warmup.jsonl")
  assert [r["step"] for r in warm] == [1, 2] and all(np.isfinite(r["sft_loss"]) for r in warm)
  probe = np.load(os.path.join(wd, "probe.npz"))
  assert int(probe["rows"]) == c.num_eval_examples and probe["logprob_start"].shape == (
      probe["tokens"].shape)
  resp = probe["response_mask"]
  assert np.all(probe["logprob_start"][resp] <= 0) and resp.any(1).all()
  with open(os.path.join(wd, "token_change.png"), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert all(r["sampled_entropy"] > 0 for r in read_metrics(wd) if r["step"] > 0)


def test_heatmap_keeps_the_latest_mixed_step():
  def batch(step, mixed):
    return loop.StepBatch(step, {}, None, [], mixed)

  kept = None
  for step, mixed in ((1, False), (2, True), (3, False), (4, False)):
    kept = loop._heatmap_batch(kept, batch(step, mixed))
  assert kept.step == 2 and kept.mixed
  assert loop._heatmap_batch(kept, batch(5, True)).step == 5
  assert loop._heatmap_batch(batch(1, False), batch(2, False)).step == 2


@pytest.mark.parametrize("change,match", [
    ({"estimator": "no_such"}, r"Unknown estimator .no_such.*Known"),
    ({"policy_loss": "no_such"}, r"Unknown policy loss .no_such.*Known"),
    ({"estimator": "gdpo"}, r"needs \['reward_components'\]"),
    ({"task": "no_such_task"}, "Known tasks"),
    ({"init_from": "/nonexistent/model"}, "is not a directory"),
    ({"mesh": "data=9"}, "devices"),
    ({"mesh": "data=3"}, "divisible"),
])
def test_bad_setup_is_refused_before_any_output(change, match, tmp_path):
  wd = str(tmp_path / "w")
  with pytest.raises(Exception, match=match):
    loop.run(tiny(**change), wd)
  assert not os.path.exists(wd) or not os.listdir(wd)


# A method's own run needs only its RL steps: warm-up, evaluation, checkpoints and the export
# are the same code for every method and are covered by the tiny recipe runs above.
METHOD_RUN = dict(sft_steps=0, eval_every=0, checkpoint_every=0, export_hf=False)


@pytest.mark.parametrize("estimator,kl_coef,estimator_kwargs,producer", [
    ("remax", 0.0, {}, "greedy_baseline"),                       # reward_baseline
    ("optimal_token_baseline", 0.0, {}, "policy_pass"),          # Σπ² from the policy pass
    ("reinforce_pp", 0.01, {"kl_coef": 0.05}, "reference_pass"),  # KL-in-reward and KL loss
    ("redippo", 0.0, {}, "critic_ref"),                           # two trained critics
])
def test_methods_with_extra_inputs_run_end_to_end(estimator, kl_coef, estimator_kwargs,
                                                   producer, tmp_path):
  """Methods whose needs call extra producers run 2 tiny steps with every batch validated.

  REINFORCE++ with its KL-in-reward switched on gets logprob_old/logprob_ref (a reference
  pass planned because the estimator's optional needs ask for it); a KL-to-reference loss
  term on top uses the same frozen copy (the update donates the live parameters)."""
  c = tiny(estimator=estimator, kl_coef=kl_coef, debug_checks=True, **METHOD_RUN)
  c.estimator_kwargs = estimator_kwargs
  assert producer in [p.producer.name for p in loop.check_method(c).plan]
  wd = str(tmp_path / estimator)
  loop.run(c, wd)
  last = read_metrics(wd)[-1]
  assert last["step"] == 2 and np.isfinite(last["loss"]) and np.isfinite(last["adv_abs_mean"])
  if estimator == "remax":
    assert last["time_baseline"] > 0
  if estimator == "redippo":  # both critics learn after the update, timed as `critic`
    assert last["time_critic"] > 0 and int(last["step"]) == 2
    assert np.isfinite(last["critic_vf_mse"]) and np.isfinite(last["critic_ref_vf_mse"])
  if kl_coef:
    assert np.isfinite(last["kl_loss"])


def test_vimpo_value_loss_is_trained_with_the_policy(tmp_path):
  """VIMPO's reward enters only through its terminal-value loss, which the update adds
  (`EstimatorSpec.trained_loss`, c_V = 200 by default) on each minibatch with the batch's
  `value_target` = R − b_g. From π = π_ref every implied TD error is 0, so the actor
  advantages are 0: without the term (`estimator_loss_coef=0`) the policy never moves,
  whatever the rewards; with it the first step with a rewarded row moves it."""
  moved, rewards = {}, {}
  for coef in (0.0, None):
    # pivotal: an untrained policy picks the deciding digit right now and then (here at the
    # second step; the two runs sample the same batches until the first one that moves).
    c = tiny(estimator="vimpo", debug_checks=True, estimator_loss_coef=coef, task="pivotal",
             task_kwargs={}, **METHOD_RUN)
    m = loop.check_method(c)
    if coef is None:
      term = m.extensions["estimator_loss"]
      assert term.coef == 200.0 and "value_target" in m.update_fields
      assert term.kwargs == {"beta": 5e-4, "clip": None, "kl_estimate": "k3"}
    else:
      assert "estimator_loss" not in m.extensions and "value_target" not in m.update_fields
    run, rs = loop.setup(c, str(tmp_path / f"w{coef}"))
    rs = loop.restore_or_warm_up(run, rs)
    moved[coef], rewards[coef] = [], []
    for _ in range(2):
      before = jax.device_get(rs.train.params)
      rs, metrics = loop.rl_step(run, rs)
      rewards[coef].append(metrics["reward_mean"])
      moved[coef].append(max(float(np.max(np.abs(np.asarray(a) - b))) for a, b in zip(
          jax.tree.leaves(rs.train.params), jax.tree.leaves(before))))
      if coef is None:
        assert (metrics["estimator_loss"] > 1e-6) == (metrics["reward_mean"] > 0)
      else:
        assert metrics["adv_abs_mean"] == 0.0 and "estimator_loss" not in metrics
  assert rewards[0.0] == rewards[None] == [0.0, 0.0625]
  assert moved[0.0] == [0.0, 0.0] and moved[None][1] > 0.0
  with pytest.raises(loop.SetupError,
                     match=r"'grpo' has no loss term.*\['jepo', 'verifree', 'vimpo'\]"):
    loop.check_method(tiny(estimator_loss_coef=1.0))


ANSWER_SEQUENCE = {"answer_tokens", "answer_attn_mask", "answer_positions"}


@pytest.mark.parametrize("estimator,kwargs", [
    ("jepo", {}), ("verifree", {"answer_weight": "one", "format_gate": False})])
def test_answer_likelihood_term_scores_the_answer_again_in_the_update(estimator, kwargs,
                                                                       tmp_path):
  """VeriFree's and JEPO's answer term (`trained_loss` with scores ("logprob_answer",)): the
  update teacher-forces the reference answer again on the batch's `answer_tokens`. With one
  minibatch and one epoch the loss is taken at the behaviour parameters, so the logged term
  equals `answer_likelihood_loss` on the answer pass's `logprob_answer` with the estimator's
  weights (verifree's "one": w = 1, as its untrained R ≈ 0 would give ≈ 0; its format gate
  off, as the untrained responses run to the length limit and would get w = 0), and the step
  lowers it. Off (`estimator_loss_coef=0`), the sequence stays out of the update batch."""
  c = tiny(estimator=estimator, estimator_kwargs=kwargs, ppo_epochs=1, num_minibatches=1,
           warmup_steps=0, debug_checks=True, **METHOD_RUN)
  m = loop.check_method(c)
  assert ANSWER_SEQUENCE | {"answer_weight", "answer_mask"} <= set(m.update_fields)
  term = m.extensions["estimator_loss"]
  assert term.scores == ("logprob_answer",) and term.coef == 1.0
  run, rs = loop.setup(c, str(tmp_path / "w"))
  rs = loop.restore_or_warm_up(run, rs)
  ctx = loop._context(run, rs)
  batch, times = {}, {}
  loop.run_stages(run.stages, rs.train, batch, ctx, times)
  out = credit.get_estimator(estimator).fn(**{n: batch[n] for n in m.estimator_fields},
                                           **m.estimator_static)
  want = float(credit.advantages.implicit.answer_likelihood_loss(
      logprob_answer=batch["logprob_answer"], answer_mask=batch["answer_mask"],
      answer_weight=out.answer_weight))
  assert want > 0.1  # the untrained model's answers are unlikely: −Σ log π is large
  rs, metrics = loop.learn(run, rs, ctx, dict(batch), times, 0.0)
  assert metrics["estimator_loss"] == pytest.approx(want, rel=1e-4)
  model = train.merge_model(run.setup.graphdef, rs.train.params, run.setup.rest)
  after = float(credit.advantages.implicit.answer_likelihood_loss(
      logprob_answer=estimator_loss.answer_scores(model, batch, None),
      answer_mask=batch["answer_mask"],
      answer_weight=out.answer_weight))
  assert after < want
  off = loop.check_method(tiny(estimator=estimator, estimator_loss_coef=0.0, **METHOD_RUN))
  assert "estimator_loss" not in off.extensions and not ANSWER_SEQUENCE & set(off.update_fields)


def test_scheduled_estimator_and_oreal_loss_run_end_to_end(tmp_path):
  """RL Tango's advantage (a schedule over the runner's traced train_step; total_steps from
  c.steps) on the chain task's judged steps, with OREAL's loss (reward and the reference's
  log-probs as loss inputs): 2 tiny steps, every batch validated."""
  c = tiny("scrl_chain", estimator="rl_tango", policy_loss="oreal", debug_checks=True,
           **METHOD_RUN)
  method = loop.check_method(c)
  assert method.estimator_static["total_steps"] == c.steps
  assert {"step_judge", "reference_pass"} <= {p.producer.name for p in method.plan}
  with pytest.raises(loop.SetupError, match="train_step is passed by the runner"):
    loop.check_method(tiny("scrl_chain", estimator="rl_tango",
                           estimator_kwargs={"train_step": 3}))
  wd = str(tmp_path / "tango")
  loop.run(c, wd)
  last = read_metrics(wd)[-1]
  assert last["step"] == 2 and np.isfinite(last["loss"]) and np.isfinite(last["adv_abs_mean"])


def test_the_loop_learns_a_trivial_task_from_scratch(tmp_path):
  """No warm-up, one-token answers: GRPO must take the training reward from chance (~1/54)
  to >= 0.95. A loop with a sign error, a shifted mask or a dropped update fails here."""
  c = grpo_arithmetic.get_config()
  c.task, c.task_kwargs = "copy_digit", {}
  # One device: the 8 fake CPU devices of the test process would shard every step 8 ways on
  # 2 cores (~3x slower). 100 steps: the 3-step mean reaches 0.95 after 55-70 (seed 0).
  c.sft_steps, c.max_new_tokens, c.learning_rate, c.steps = 0, 1, 1e-3, 100
  c.num_train_examples, c.num_eval_examples = 256, 16
  c.eval_every, c.checkpoint_every, c.export_hf, c.progress = 0, 0, False, False
  c.mesh = "data=1"
  loop.run(c, str(tmp_path / "copy"))
  reward = [r["reward_mean"] for r in read_metrics(str(tmp_path / "copy")) if "reward_mean" in r]
  assert np.mean(reward[:3]) < 0.2, reward[:3]
  assert max(np.convolve(reward, np.ones(3) / 3, "valid")) >= 0.95, reward


def test_estimator_hyperparameter_typo_is_refused(tmp_path):
  c = tiny(estimator="reinforce_pp", steps=1)
  c.estimator_kwargs = {"kl_coeff": 0.05}
  with pytest.raises(ValueError, match="no hyperparameter 'kl_coeff'"):
    loop.run(c, str(tmp_path / "typo"))
  assert not os.path.exists(tmp_path / "typo")


def test_plan_orders_producers_and_names_missing_fields():
  c = tiny(estimator="optimal_token_baseline")
  plan = loop.check_method(c).plan
  names = [p.producer.name for p in plan]
  assert names[0] == "rollout" and names.index("verifier") > 0
  assert "sum_pi_squared" in {f for p in plan for f in p.wanted}
  # The sampler's log-probs replace the recomputed ones: no policy pass at all for GRPO.
  names = [p.producer.name for p in loop.check_method(tiny(logprob_old_source="sampler")).plan]
  assert "sampler_logprob_old" in names and "policy_pass" not in names
  with pytest.raises(loop.SetupError,
                     match=r"estimator 'gdpo' needs \['reward_components'\]"):
    loop.check_method(tiny(estimator="gdpo"))
  with pytest.raises(loop.SetupError, match=r"the KL term .* needs \['logprob_teacher'\]"):
    producers.plan({"logprob_teacher": ["the KL term (kl_coef=1)"]}, c)
  # A new kind of input is a new table row: a multi-component verifier, and GDPO plans.
  graded = producers.Producer("graded", ("reward_components",), ("tokens",),
                              lambda s, w: None, "reward", "several reward signals")
  table = producers.PRODUCERS + (graded,)
  gdpo = loop.method_needs(tiny(), credit.get_estimator("gdpo"), ())
  plan = producers.plan(gdpo, c, table)
  assert [p.producer.name for p in plan][-1] == "graded"
  assert plan[-1].wanted == {"reward_components"}
  # GAE's critic is a trained producer: planned after the rollout, before nothing it needs.
  names = [p.producer.name for p in loop.check_method(tiny(estimator="gae")).plan]
  assert names.index("critic") > names.index("rollout") and "policy_pass" in names
  for p in producers.PRODUCERS:  # contract fields, or the update's own inputs
    assert set(p.provides) <= set(credit.CONTRACT) | producers.RUNNER_INPUTS


def test_corrupted_batch_is_refused_naming_the_field():
  N, G, T = 2, 2, 5
  batch = {"tokens": np.ones((N * G, T), np.int32),
           "response_mask": np.ones((N * G, T), bool),
           "group_id": np.repeat(np.arange(N, dtype=np.int32), G),
           "reward": np.array([1.0, np.nan, 0.0, 1.0], np.float32)}
  with pytest.raises(credit.ContractError, match="batch of step 3: `reward` contains NaN"):
    loop.check_batch(batch, num_groups=N, where="batch of step 3")
  batch["reward"] = np.zeros(N * G, np.float32)
  loop.check_batch(batch, num_groups=N, where="ok")
  batch["group_id"] = np.arange(N * G, dtype=np.int32)
  with pytest.raises(credit.ContractError, match="`group_id` must lie in"):
    loop.check_batch(batch, num_groups=N, where="x")


def test_kl_and_entropy_terms_follow_the_loss_aggregation():
  gspo = credit.get_policy_loss("gspo")
  assert train.aggregation_kwargs(gspo, {}) == {"loss_agg_mode": "seq-mean-token-mean"}
  assert train.aggregation_kwargs(gspo, {"loss_agg_mode": "token-sum", "clip_low": 0.1}) == {
      "loss_agg_mode": "token-sum"}


def test_model_dir_without_weights_or_config(tmp_path):
  d = tmp_path / "model"
  d.mkdir()
  with pytest.raises(loop.SetupError, match="no config.json"):
    loop.run(tiny(init_from=str(d)), str(tmp_path / "w1"))
  (d / "config.json").write_text("{}")
  with pytest.raises(loop.SetupError, match="no \\*.safetensors"):
    loop.run(tiny(init_from=str(d)), str(tmp_path / "w2"))
  assert not os.path.exists(tmp_path / "w1") and not os.path.exists(tmp_path / "w2")


def test_dataset_without_field_names_file_and_field(tmp_path):
  data = tmp_path / "d.jsonl"
  data.write_text(json.dumps({"question": "1+1=", "answer": "2"}) + "\n")
  with pytest.raises(Exception, match=r"d\.jsonl.*prompt|prompt.*d\.jsonl"):
    loop.run(tiny(task="jsonl", data_path=str(data)), str(tmp_path / "w"))
  assert not os.path.exists(tmp_path / "w")


def test_method_hyperparameters_from_the_command_line(tmp_path):
  rest, found = split_method_overrides(["--config=x", "--config.estimator_kwargs.scale=batch",
                                        "--config.loss_kwargs.clip_high=0.28",
                                        "--config.loss_kwargs.clip_ratio_c=None",
                                        "--config.task_kwargs.min_digits=1",
                                        "--config.steps=3"])
  assert rest == ["--config=x", "--config.steps=3"]
  assert found == {"estimator_kwargs": {"scale": "batch"},
                   "loss_kwargs": {"clip_high": 0.28, "clip_ratio_c": None},
                   "task_kwargs": {"min_digits": 1}}
  c = tiny()
  c.lock()
  apply_method_overrides(c, found)
  assert c.estimator_kwargs.scale == "batch" and c.loss_kwargs.clip_high == 0.28
  assert c.is_locked
  assert loop.build_data(c).task.min_digits == 1  # task options: the task's dataclass fields
  with pytest.raises(TypeError, match=r"no option\(s\) \['min_digit'\].*'min_digits'"):
    loop.build_data(apply_method_overrides(tiny(), {"task_kwargs": {"min_digit": 1}}))
  m = loop.check_method(c)   # validated against the signatures
  assert m.estimator_static["scale"] == "batch" and m.loss_kwargs["clip_high"] == 0.28
  with pytest.raises(ValueError, match="expected --config.loss_kwargs.<name>=<value>"):
    split_method_overrides(["--config.loss_kwargs.clip_high"])
  cfg = os.path.join(ROOT, "experiments/configs/grpo_arithmetic.py:tiny")
  r = run_cli(["--config", cfg, "--workdir", str(tmp_path / "w"),
               "--config.estimator_kwargs.scal=batch"], timeout=120)
  assert r.returncode == 2, r.stderr[-2000:]
  assert "no hyperparameter 'scal'" in r.stderr and "'scale'" in r.stderr
  assert not os.path.exists(tmp_path / "w")


def test_unknown_config_key_and_wrong_type_are_named():
  cfg = "experiments/configs/grpo_arithmetic.py:tiny"
  err = check_overrides(["--config", cfg, "--config.stepz=3"])
  assert "stepz" in err and "'steps'" in err
  err = check_overrides(["--config", cfg, "--config.model.widht=3"])
  assert "widht" in err and "hidden_size" in err
  assert check_overrides(["--config", cfg, "--config.steps=3"]) is None
  r = run_cli(["--config", os.path.join(ROOT, cfg), "--workdir", "/tmp/never",
               "--config.steps=abc"], timeout=120)
  assert r.returncode != 0 and "steps" in r.stderr
