"""A fuzz table of the command line: every bad flag and bad data file is refused at start-up.

Each case calls `experiments.run.main(argv)` in this process (no JAX start-up per case) and
expects exit status 2, exactly one line on stderr, `error: ...` naming the problem, no
traceback, and no workdir left behind. The library's call path (`validate=True`) has its own
table: NaN rewards and group ids beyond `num_groups` are refused naming the argument.
"""
import json
import os
import re

import numpy as np
import pytest

import credit
from experiments import run, validate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARITH = os.path.join(ROOT, "experiments", "configs", "grpo_arithmetic.py")
JSONL = os.path.join(ROOT, "experiments", "configs", "grpo_jsonl.py")
COUNTDOWN = os.path.join(ROOT, "experiments", "configs", "rloo_countdown.py")


# (case id, recipe[:variant], extra flags, regex the error line must match). Flags may hold
# {tmp} (the test's temp dir) and {data} (a GSM8K-style file whose answers are DATA[id]).
CASES = [
    ("steps=-1", ARITH + ":tiny", ["--config.steps=-1"], r"--config\.steps=-1 must be >= 0"),
    ("sft_batch_size=0", ARITH + ":tiny", ["--config.sft_batch_size=0"],
     r"--config\.sft_batch_size=0 must be >= 1"),
    ("variant typo", ARITH + ":tinny", [], r"unknown variant 'tinny'; did you mean 'tiny'\?"),
    ("unknown variant key", ARITH + ":tiny,sed=3", [],
     r"unknown variant 'sed'; did you mean 'seed' \(a config field\)\?"),
    ("estimator typo", ARITH + ":tiny", ["--config.estimator=grop"],
     r"--config\.estimator='grop' is not a registered estimator; did you mean 'grpo'\?"),
    ("loss typo", ARITH + ":tiny", ["--config.policy_loss=ppo_clp"],
     r"--config\.policy_loss='ppo_clp' is not a registered policy loss; did you mean "
     r"'ppo_clip'\?"),
    ("KL kind typo", ARITH + ":tiny", ["--config.kl_kind=k33"],
     r"--config\.kl_kind='k33' is not a KL estimator.*did you mean 'k3'\?"),
    ("task typo", ARITH + ":tiny", ["--config.task=arithmetc"],
     r"--config\.task='arithmetc' is not a task; did you mean 'arithmetic'\?"),
    ("group_size=0", ARITH + ":tiny", ["--config.group_size=0"],
     r"--config\.group_size=0 must be >= 1"),
    ("group_size=1 under GRPO", ARITH + ":tiny", ["--config.group_size=1"],
     r"--config\.group_size=1 must be >= 2 \(estimator 'grpo'"),
    ("bad estimator_kwargs.scale", ARITH + ":tiny", ["--config.estimator_kwargs.scale=grop"],
     r"estimator_kwargs\.scale='grop' is refused by estimator 'grpo'.*'group', 'batch', "
     r"'none'.*did you mean 'group'\?"),
    ("estimator_kwargs.scale wrong type", ARITH + ":tiny", ["--config.estimator_kwargs.scale=3"],
     r"estimator_kwargs\.scale=3 is refused by estimator 'grpo'"),
    ("estimator_kwargs.eps a string", ARITH + ":tiny", ["--config.estimator_kwargs.eps=tiny"],
     r"estimator_kwargs\.eps='tiny' is refused by estimator 'grpo': it must be a number"),
    ("estimator_kwargs name typo", ARITH + ":tiny", ["--config.estimator_kwargs.scal=batch"],
     r"estimator_kwargs\.scal is refused: estimator 'grpo' has no hyperparameter 'scal'; did "
     r"you mean 'scale'\?"),
    ("loss_kwargs bad agg mode", ARITH + ":tiny", ["--config.loss_kwargs.loss_agg_mode=tokenmean"],
     r"loss_kwargs\.loss_agg_mode='tokenmean' is refused by policy loss 'ppo_clip'.*did you "
     r"mean 'token-mean'\?"),
    ("loss_kwargs NaN", ARITH + ":tiny", ["--config.loss_kwargs.clip_high=nan"],
     r"--config\.loss_kwargs\.clip_high=nan is not a number"),
    ("prompts_per_step=0", ARITH + ":tiny", ["--config.prompts_per_step=0"],
     r"--config\.prompts_per_step=0 must be >= 1"),
    ("num_minibatches=0", ARITH + ":tiny", ["--config.num_minibatches=0"],
     r"--config\.num_minibatches=0 must be >= 1"),
    ("ppo_epochs=0", ARITH + ":tiny", ["--config.ppo_epochs=0"], r"--config\.ppo_epochs=0 must"),
    ("max_new_tokens<0", ARITH + ":tiny", ["--config.max_new_tokens=-4"],
     r"--config\.max_new_tokens=-4 must be >= 1"),
    ("sft_steps<0", ARITH + ":tiny", ["--config.sft_steps=-1"], r"--config\.sft_steps=-1 must"),
    ("remat policy typo", ARITH + ":tiny", ["--config.model.remat_policy=projection"],
     r"--config\.model\.remat_policy='projection' is not a remat policy; did you mean "
     r"'projections'\?"),
    ("sft_min_accuracy>1", ARITH + ":tiny", ["--config.sft_min_accuracy=1.5"],
     r"--config\.sft_min_accuracy=1\.5 must lie in \[0, 1\]"),
    ("sft_max_steps<sft_steps", ARITH + ":tiny",
     ["--config.sft_min_accuracy=0.5", "--config.sft_max_steps=1"],
     r"--config\.sft_max_steps=1 is below sft_steps=2"),
    ("sft_min_accuracy without warm-up", ARITH + ":tiny",
     ["--config.sft_min_accuracy=0.5", "--config.sft_steps=0"],
     r"--config\.sft_min_accuracy=0\.5 checks a warm-up, but sft_steps=0"),
    ("num_eval_examples<0", ARITH + ":tiny", ["--config.num_eval_examples=-2"],
     r"--config\.num_eval_examples=-2 must be >= 1"),
    ("model width<0", ARITH + ":tiny", ["--config.model.hidden_size=-32"],
     r"--config\.model\.hidden_size=-32 must be >= 1"),
    ("seed<0", ARITH + ":tiny", ["--config.seed=-1"], r"--config\.seed=-1 must be >= 0"),
    ("learning_rate NaN", ARITH + ":tiny", ["--config.learning_rate=nan"],
     r"--config\.learning_rate=nan must lie in"),
    ("temperature=0", ARITH + ":tiny", ["--config.temperature=0.0"],
     r"--config\.temperature=0\.0 must lie in \(0, inf\]"),
    ("heads not a multiple", ARITH + ":tiny", ["--config.model.num_kv_heads=3"],
     r"num_heads=4 is not a multiple of model\.num_kv_heads=3"),
    ("task option typo", ARITH + ":tiny", ["--config.task_kwargs.max_digit=3"],
     r"task_kwargs\.max_digit is refused: task 'arithmetic' has no option 'max_digit'; did "
     r"you mean 'max_digits'\?"),
    ("NaN reward option", COUNTDOWN + ":tiny", ["--config.task_kwargs.format_reward=nan"],
     r"--config\.task_kwargs\.format_reward=nan is not a number"),
    ("unknown config key", ARITH + ":tiny", ["--config.stepz=3"],
     r"unknown config key 'stepz'.*did you mean 'steps'\?"),
    ("config value of the wrong type", ARITH + ":tiny", ["--config.steps=abc"],
     r"--config\.steps=abc"),
    ("unknown flag", ARITH + ":tiny", ["--workdri=x"],
     r"--workdri is not a flag of experiments\.run; did you mean --workdir\?"),
    ("missing recipe file", os.path.join(ROOT, "no_such_recipe.py"), [],
     r"no_such_recipe\.py' does not exist"),
    ("workdir is a file", ARITH + ":tiny", ["--workdir={tmp}/a_file"],
     r"--workdir='.*a_file' is a file, not a directory"),
    ("workdir inside a file", ARITH + ":tiny", ["--workdir={tmp}/a_file/run"],
     r"--workdir='.*a_file/run' lies inside .*a_file', which is a file"),
    ("gold answers math_verify cannot check", JSONL + ":tiny", ["--config.data_path={data}"],
     r"data_path=.*data\.jsonl' has 2 gold answer\(s\) math_verify cannot check: line 2: "
     r"'forty-two apples\?' parses to no mathematical expression; line 4: '\\\\frac\{1\}\{' .*"
     r"fix or drop lines \[2, 4\]"),
    ("gold answer the verifier rejects", JSONL + ":tiny", ["--config.data_path={data}"],
     r"1 gold answer\(s\) math_verify cannot check: line 3: '1e5' is not accepted by the "
     r"verifier as its own correct response \(reward 0\.0\); fix or drop lines \[3\]"),
    ("data file missing", JSONL + ":tiny", ["--config.data_path={tmp}/none.jsonl"],
     r"none\.jsonl' does not exist"),
    ("data file without ####", JSONL + ":tiny", ["--config.data_path={data}"],
     r"data\.jsonl:2: gsm8k format: the answer has no final '#### <answer>'"),
    ("method needs a missing field", ARITH + ":tiny", ["--config.estimator=gdpo"],
     r"needs \['reward_components'\]"),
    ("mesh axis typo", ARITH + ":tiny", ["--config.mesh=dat=1"],
     r"--config\.mesh='dat=1' is refused: .*unknown axis 'dat'"),
    ("mesh larger than the devices", ARITH + ":tiny", ["--config.mesh=data=64"],
     r"--config\.mesh='data=64' is refused: mesh spec \{'data': 64\} has 64 devices; 8 are "
     r"available"),
    # Refused by the loop's own setup (a SetupError), after the data are built: same line.
    ("batch not divisible by the mesh", ARITH + ":tiny", ["--config.mesh=data=3"],
     r"rows must be divisible by num_minibatches \(2\) x the mesh's batch-parallel size "
     r"\(3\)"),
]
DATA = {"gold answers math_verify cannot check": ["42", "forty-two apples?", "7", "\\frac{1}{"],
        "data file without ####": ["1", None],
        "gold answer the verifier rejects": ["12", "3.5", "1e5", "-7"]}


def _data_file(tmp_path, answers):
  path = tmp_path / "data.jsonl"
  with open(path, "w") as f:
    for i, a in enumerate(answers):
      answer = f"work\n#### {a}" if a is not None else "no final answer here"
      f.write(json.dumps({"question": f"{i}+{i}=", "answer": answer}) + "\n")
  return str(path)


@pytest.mark.parametrize("name,recipe,flags,match", CASES, ids=[c[0] for c in CASES])
def test_bad_command_line_is_refused_in_one_line(name, recipe, flags, match, tmp_path, capsys):
  (tmp_path / "a_file").write_text("not a directory")
  data = _data_file(tmp_path, DATA[name]) if name in DATA else ""
  workdir = str(tmp_path / "run")
  flags = [f.format(tmp=tmp_path, data=data) for f in flags]
  argv = ["--config", recipe] + ([] if any("mesh" in f for f in flags) else
                                 ["--config.mesh=data=1"]) + flags
  if not any(f.startswith("--workdir") for f in flags):
    argv += ["--workdir", workdir]
  code = run.main(argv)
  err = capsys.readouterr().err
  lines = [line for line in err.splitlines() if line.strip()]
  print(f"{name}: {err.strip()}")
  assert code == 2, err
  assert len(lines) == 1 and lines[0].startswith("error: "), err
  assert "Traceback" not in err
  assert re.search(match, lines[0]), lines[0]
  assert not os.path.exists(workdir)
  assert (tmp_path / "a_file").read_text() == "not a directory"


def test_workdir_that_cannot_be_written(tmp_path, capsys, monkeypatch):
  """(Root may write anywhere, so the permission is simulated.)"""
  monkeypatch.setattr(validate.os, "access", lambda path, mode: False)
  code = run.main(["--config", ARITH + ":tiny", "--workdir", str(tmp_path / "run")])
  err = capsys.readouterr().err.strip()
  assert code == 2 and re.fullmatch(r"error: --workdir='.*run' cannot be written \('.*' is not "
                                    r"writable\); choose a directory you can write", err), err
  assert not os.path.exists(tmp_path / "run")


def test_debug_flag_shows_the_traceback(tmp_path, capsys):
  code = run.main(["--config", ARITH + ":tiny", "--workdir", str(tmp_path / "run"),
                   "--config.steps=-1", "--debug"])
  err = capsys.readouterr().err
  assert code == 2 and "Traceback" in err and err.strip().splitlines()[-1].startswith("error: ")


def test_variant_settings_apply_to_the_config():
  """`:tiny,seed=3` sets the seed (a config field), the same as `--config.seed=3`; an explicit
  override after it wins."""
  config, fv = run.parse_command_line(["--config", ARITH + ":tiny,seed=3", "--workdir", "w"])
  assert config.seed == 3 and config.steps == 2 and fv.workdir == "w"
  config, _ = run.parse_command_line(["--config=" + ARITH + ":seed=4,tiny", "--config.seed=5"])
  assert config.seed == 5 and config.steps == 2


def test_every_recipe_passes_its_own_validation(tmp_path):
  """No false refusals: every recipe's `:tiny` config passes the start-up checks, except the
  ones that need a checkpoint made by another run (they are refused naming it)."""
  import glob
  import importlib
  needs_run = {"opd_arithmetic", "scope_arithmetic"}  # the teacher of sft_teacher_arithmetic
  for path in sorted(glob.glob(os.path.join(ROOT, "experiments", "configs", "[a-z]*_*.py"))):
    name = os.path.basename(path)[:-3]
    c = importlib.import_module(f"experiments.configs.{name}").get_config("tiny")
    if name in needs_run:
      with pytest.raises(validate.SetupError, match="teacher.init_from"):
        validate.check(c, str(tmp_path / name))
    else:
      validate.check(c, str(tmp_path / name))
    assert not os.path.exists(tmp_path / name)


# The library's call path: `spec(..., validate=True)` refuses in one line naming the argument.
_G = np.array([0, 0, 1, 1], np.int32)
_M = np.ones((4, 3), bool)
_OK = dict(reward=np.array([1.0, 0.0, 0.0, 1.0], np.float32), group_id=_G, response_mask=_M,
           num_groups=2)
LIBRARY_CASES = [
    ("NaN reward", dict(_OK, reward=np.array([1.0, np.nan, 0.0, 1.0], np.float32)),
     credit.ContractError, r"estimator 'grpo': `reward` contains NaN"),
    ("num_groups below the group ids", dict(_OK, num_groups=1), credit.ContractError,
     r"`group_id` must lie in \[0, num_groups=1\), got range \[0, 1\]"),
    ("reward of the wrong rank", dict(_OK, reward=np.ones((4, 1), np.float32)),
     credit.ContractError, r"`reward` must have shape \[B\]"),
    ("mask of the wrong dtype", dict(_OK, response_mask=np.full((4, 3), 0.5, np.float32)),
     credit.ContractError, r"mask `response_mask` must be bool or contain only 0/1"),
    ("string choice typo", dict(_OK, scale="grop"), ValueError,
     r"scale='grop' must be one of \['group', 'batch', 'none'\] \(did you mean 'group'\?\)"),
    ("argument typo", dict(_OK, scal="batch"), KeyError, r"'scal'. Did you mean \['scale'\]"),
    ("missing field", {k: v for k, v in _OK.items() if k != "reward"}, TypeError,
     r"missing field\(s\) \['reward'\]"),
]


@pytest.mark.parametrize("name,kwargs,error,match", LIBRARY_CASES,
                         ids=[c[0] for c in LIBRARY_CASES])
def test_registry_call_path_validates(name, kwargs, error, match):
  spec = credit.get_estimator("grpo")
  with pytest.raises(error, match=match):
    spec(**kwargs, validate=True)


def test_registry_call_path_matches_the_function():
  spec = credit.get_estimator("grpo")
  want = credit.advantages.outcome.grpo_advantages(**_OK)
  np.testing.assert_array_equal(np.asarray(spec(**_OK, validate=True)), np.asarray(want))
  # Without validate=True the bad group ids are not caught: whole groups silently zero.
  zeroed = np.asarray(spec(**dict(_OK, num_groups=1)))
  assert np.all(zeroed[2:] == 0) and np.any(np.asarray(want)[2:] != 0)
  loss = credit.get_policy_loss("ppo_clip")
  with pytest.raises(ValueError, match="clip_low='x' must be a number"):
    loss(logprob=np.zeros((4, 3), np.float32), logprob_old=np.zeros((4, 3), np.float32),
         advantages=np.zeros((4, 3), np.float32), response_mask=_M, clip_low="x",
         validate=True)


def test_validate_fields_takes_keyword_arguments():
  dims = credit.validate_fields(reward=_OK["reward"], group_id=_G, response_mask=_M,
                                num_groups=2)
  assert dims == {"B": 4, "T": 3}
  assert credit.validate_fields(dict(reward=_OK["reward"]), response_mask=_M) == dims
  with pytest.raises(credit.ContractError, match="`reward` contains NaN"):
    credit.validate_fields(reward=np.array([np.nan] * 4, np.float32), response_mask=_M)
  with pytest.raises(KeyError, match=r"'rewards'. Did you mean \['reward'"):
    credit.validate_fields(rewards=_OK["reward"])
  with pytest.raises(TypeError, match="given both"):
    credit.validate_fields({"reward": _OK["reward"]}, reward=_OK["reward"])
