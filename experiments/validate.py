"""One validation pass over a run, before any file is written or anything compiles.

`check(config, workdir)` refuses a user's mistake with a `Refusal` whose message is one line,
``<what> <why>; <what to do>``, which `experiments.run` prints as ``error: ...`` with exit
status 2. In order:

* the workdir: not a file, inside a writable directory; the mesh spec (and, once the JAX
  backend may start, that it fits the devices: `check_mesh(c, devices=True)`, and that the
  run's memory plan per device fits a device: `check_memory`, `experiments/memory.py`);
* every size, count and step range-checked (`SIZES`, `RANGES`), and no NaN anywhere in the
  config or the method's keyword arguments;
* every name resolved against what exists, with the closest match offered: estimator,
  policy loss, KL kind, task, rollout kind, model family, dtypes, data format (`NAMES`);
* the estimator's and the loss's keyword arguments against their signatures (names, types,
  string choices from `Literal[...]` annotations) and the task's options against its
  dataclass fields; then the method as the loop resolves it (`loop.check_method`: needs,
  producers);
* the data: every gold answer must be one the task's verifier accepts as its own correct
  response (`verify(example, demonstration(example)) == 1`, and for math_verify a gold answer
  that parses to a mathematical object, not only to its text); a JSON-lines file names the
  lines that fail.

`check_recipe` resolves the recipe file and its `:variant` (unknown variants are refused with
the closest one; `key=value` parts naming a config field become `--config.key=value`).
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import math
import os
import re
from typing import Any, Callable

import ml_collections
import numpy as np

from experiments.producers.base import SetupError


class Refusal(SetupError):
  """A run refused at start-up; the message is one line: what, why, what to do."""


def refuse(what: str, why: str, todo: str) -> Refusal:
  return Refusal(f"{what} {why}; {todo}")


def _closest(value: Any, known) -> str:
  close = difflib.get_close_matches(str(value), [str(k) for k in known], n=1)
  return f"did you mean {close[0]!r}?" if close else ""


# --------------------------------------------------------------------------
# Sizes, counts and steps.
# --------------------------------------------------------------------------

# (config key, smallest valid value, what the number is). Keys a config lacks are skipped.
SIZES: tuple[tuple[str, int, str], ...] = (
    ("seed", 0, "the PRNG seed"),
    ("num_train_examples", 1, "train examples generated"),
    ("num_eval_examples", 1, "held-out examples"),
    ("sft_steps", 0, "warm-up steps, 0 = none"),
    ("sft_batch_size", 1, "demonstrations per warm-up step"),
    ("sft_examples", 0, "demonstrations available, 0 = all"),
    ("sft_extend_steps", 1, "warm-up steps between accuracy checks"),
    ("sft_max_steps", 0, "the warm-up's cap with its extensions, 0 = 2 x sft_steps"),
    ("prompts_per_step", 1, "prompts per RL step"),
    ("group_size", 1, "samples per prompt"),
    ("max_new_tokens", 1, "the response budget in tokens"),
    ("max_turns", 1, "policy turns per episode"),
    ("max_action_tokens", 1, "tokens per policy turn"),
    ("max_observation_tokens", 1, "tokens per observation"),
    ("max_steps", 1, "steps per response"),
    ("steps", 0, "RL steps, 0 = the warm-up and the export only"),
    ("warmup_steps", 0, "learning-rate warm-up steps"),
    ("ppo_epochs", 1, "passes over each rollout batch"),
    ("num_minibatches", 1, "minibatches per pass"),
    ("eval_every", 0, "steps between evaluations, 0 = none"),
    ("eval_samples", 0, "samples per held-out prompt, 0 = off"),
    ("checkpoint_every", 0, "steps between checkpoints, 0 = never"),
    ("keep_checkpoints", 1, "checkpoints kept"),
    ("num_heatmap_samples", 0, "responses in the heatmap"),
    ("samples_every", 0, "steps between written samples, 0 = off"),
    ("samples_per_step", 0, "samples written per such step"),
    ("log_every", 0, "steps between progress lines, 0 = about 20 per phase"),
    ("scoring_chunk_size", 0, "positions per scoring chunk, 0 = auto"),
    ("top_k", 0, "sampling top-k, 0 = off"),
    ("model.hidden_size", 1, "the model width"),
    ("model.intermediate_size", 1, "the MLP width"),
    ("model.num_layers", 1, "decoder blocks"),
    ("model.num_heads", 1, "query heads"),
    ("model.num_kv_heads", 1, "key/value heads"),
    ("model.head_dim", 1, "the per-head width"),
    ("model.preset_layers", 0, "blocks kept of a preset, 0 = all"),
    ("memory.prompt_tokens", 0, "prompt positions planned for, 0 = estimated"),
    ("tree.branches", 0, "continuations per branch point, 0 = off"),
    ("tree.points", 1, "branch points per group"),
    ("tree.depth", 1, "branching rounds"),
    ("slate.candidates", 0, "candidate steps, 0 = off"),
    ("slate.max_steps", 1, "steps per response"),
    ("logo.branch_rows", 0, "restored episodes, 0 = off"),
    ("logo.local_size", 1, "continuations per restored episode"),
    ("teacher.lag", 0, "steps between teacher refreshes, 0 = the current policy"),
    ("teacher.top_k", 1, "the teacher's top-k"),
    ("jolt.teacher_samples", 0, "teacher-role samples per prompt, 0 = off"),
    ("amft.sft_batch_size", 1, "demonstrations per AMFT step"),
    ("prm.epochs", 1, "PRM passes per batch"),
    ("prm.num_minibatches", 1, "PRM minibatches per pass"),
    ("prm.warmup_steps", 0, "PRM warm-up steps"),
    ("critic.epochs", 1, "critic passes per batch"),
    ("critic.num_minibatches", 1, "critic minibatches per pass"),
    ("critic.warmup_steps", 0, "critic warm-up steps"),
    ("verifier.samples", 1, "verdicts per response"),
    ("verifier.update_every", 1, "policy steps per verifier update"),
    ("verifier.epochs", 1, "verifier passes per batch"),
    ("verifier.num_minibatches", 1, "verifier minibatches per pass"),
    ("verifier.sft_steps", 0, "verifier warm-up steps"),
    ("verifier.solo_steps", 0, "verifier-only steps"),
    ("critical.proposals", 1, "alternatives per critical step"),
    ("critical.continuations", 1, "continuations per alternative"),
    ("critical.max_items", 1, "critical steps per RL step"),
    ("critical.max_paths", 1, "successes per prompt"),
    ("critical.until", 0, "steps with the critical objective, 0 = every step"),
    ("async_rl.num_workers", 1, "rollout worker processes"),
    ("async_rl.max_staleness", 0, "batches generation may run ahead"),
    ("async_rl.groups_per_rollout", 1, "prompts per rollout unit"),
    ("async_rl.max_in_flight", 0, "units in flight, 0 = no cap"),
)

# (config key, low, high, low inclusive, what it is): real-valued settings with a range.
RANGES: tuple[tuple[str, float, float, bool, str], ...] = (
    ("learning_rate", 0.0, math.inf, True, "the RL learning rate"),
    ("sft_learning_rate", 0.0, math.inf, True, "the warm-up learning rate"),
    ("weight_decay", 0.0, math.inf, True, "the AdamW weight decay"),
    ("grad_clip", 0.0, math.inf, False, "the global-norm gradient clip"),
    ("temperature", 0.0, math.inf, False, "the sampling temperature"),
    ("top_p", 0.0, 1.0, False, "the nucleus-sampling mass"),
    ("kl_coef", 0.0, math.inf, True, "the KL coefficient, 0 = off"),
    ("obs_ce_coef", 0.0, math.inf, True, "the observation cross-entropy weight, 0 = off"),
    ("memory.device_gb", 0.0, math.inf, True, "a device's memory in GiB, 0 = measured"),
    ("group_filter.min_accuracy", 0.0, 1.0, True, "a group accuracy"),
    ("sft_min_accuracy", 0.0, 1.0, True, "the held-out accuracy the warm-up must reach"),
    ("group_filter.max_accuracy", 0.0, 1.0, True, "a group accuracy"),
)


def _get(c: ml_collections.ConfigDict, key: str) -> tuple[bool, Any]:
  node: Any = c
  for part in key.split("."):
    if not hasattr(node, "keys") or part not in node:
      return False, None
    node = node[part]
  return True, node


def group_estimator(c: ml_collections.ConfigDict) -> str | None:
  """The estimator's name when it compares the samples of a prompt (needs `group_id`)."""
  import credit
  try:
    est = credit.get_estimator(c.estimator)
  except KeyError:
    return None
  return est.name if "group_id" in est.needs else None


def check_sizes(c: ml_collections.ConfigDict) -> None:
  """Range checks of every size, count and step (`SIZES`, `RANGES`) and no NaN anywhere."""
  for key, low, what in SIZES:
    found, v = _get(c, key)
    if not found:
      continue
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
      raise refuse(f"--config.{key}={v!r}", f"must be an int ({what})",
                   f"set --config.{key} to an integer >= {low}")
    if v < low:
      raise refuse(f"--config.{key}={v}", f"must be >= {low} ({what})",
                   f"set --config.{key} to {low} or more")
  for key, low, high, low_ok, what in RANGES:
    found, v = _get(c, key)
    if not found or v is None:
      continue
    ok = (v >= low if low_ok else v > low) and v <= high
    if not ok or math.isnan(v):
      span = f"{'[' if low_ok else '('}{low:g}, {high:g}]"
      raise refuse(f"--config.{key}={v}", f"must lie in {span} ({what})",
                   f"set --config.{key} inside that range")
  if c.get("sft_min_accuracy", 0.0) > 0:
    if not c.sft_steps:
      raise refuse(f"--config.sft_min_accuracy={c.sft_min_accuracy}",
                   "checks a warm-up, but sft_steps=0 runs none",
                   "set --config.sft_steps above 0 or --config.sft_min_accuracy=0")
    if c.sft_max_steps and c.sft_max_steps < c.sft_steps:
      raise refuse(f"--config.sft_max_steps={c.sft_max_steps}",
                   f"is below sft_steps={c.sft_steps} (it caps the warm-up with its extensions)",
                   f"set --config.sft_max_steps to {c.sft_steps} or more, or 0 (2 x sft_steps)")
  name = group_estimator(c)
  if name and c.group_size < 2 and not c.get("tree", {}).get("branches", 0):
    raise refuse(f"--config.group_size={c.group_size}",
                 f"must be >= 2 (estimator {name!r} compares the samples of each prompt's "
                 "group; one sample gets no signal)", "set --config.group_size=8, say")
  for key, v in _walk(c):
    if isinstance(v, float) and math.isnan(v):
      raise refuse(f"--config.{key}=nan", "is not a number", f"give --config.{key} a number")
  if c.get("model") and not c.get("init_from"):
    m = c.model
    if m.num_heads % m.num_kv_heads:
      raise refuse(f"--config.model.num_heads={m.num_heads}",
                   f"is not a multiple of model.num_kv_heads={m.num_kv_heads} (grouped-query "
                   "attention shares each key/value head among whole groups of query heads)",
                   "make num_heads a multiple of num_kv_heads")


def _walk(node: Any, prefix: str = ""):
  for k in node.keys():
    v = node[k]
    key = f"{prefix}{k}"
    if hasattr(v, "keys"):
      yield from _walk(v, key + ".")
    elif isinstance(v, (tuple, list)):
      for x in v:
        yield key, x
    else:
      yield key, v


# --------------------------------------------------------------------------
# Names.
# --------------------------------------------------------------------------


def _names() -> dict[str, tuple[Callable[[], Any], str]]:
  """{config key: (the valid values, what the key names)}, built on first use."""
  import credit
  from credit import tasks as tasks_lib
  from credit.models.config import DTYPES, FAMILIES, REMAT_POLICIES
  from credit.models.presets import list_presets
  from experiments.producers.rollouts import ROLLOUT_KINDS
  return {
      "estimator": (credit.list_estimators, "registered estimator"),
      "policy_loss": (credit.list_policy_losses, "registered policy loss"),
      "kl_kind": (lambda: credit.KL_KINDS, "KL estimator (credit.KL_KINDS)"),
      "task": (lambda: tasks_lib.list_tasks() + ["jsonl", "tfds"], "task"),
      "rollout": (lambda: ["auto", *ROLLOUT_KINDS], "rollout kind"),
      "data_format": (lambda: tasks_lib.DATA_FORMATS, "data format"),
      "model.family": (lambda: FAMILIES, "model family"),
      "model.param_dtype": (lambda: tuple(DTYPES), "dtype"),
      "model.compute_dtype": (lambda: tuple(DTYPES), "dtype"),
      "model.preset": (lambda: ["", *list_presets()], "model preset"),
      "model.optimizer_dtype": (lambda: ("param", "float32"), "optimizer dtype"),
      "model.remat_policy": (lambda: REMAT_POLICIES, "remat policy"),
      "teacher.param_dtype": (lambda: tuple(DTYPES), "dtype"),
      "teacher.compute_dtype": (lambda: tuple(DTYPES), "dtype"),
      "tree.criterion": (lambda: ("entropy", "surprisal", "step", "first_error"),
                         "branch-point criterion"),
  }


def check_names(c: ml_collections.ConfigDict) -> None:
  """Every name in the config is one that exists; refusals offer the closest."""
  for key, (known_fn, what) in _names().items():
    found, v = _get(c, key)
    if not found:
      continue
    known = list(known_fn())
    if v not in known:
      hint = _closest(v, known)
      listing = (f"the {len(known)} valid ones: {', '.join(map(str, known))}"
                 if len(known) <= 24 else
                 f"{len(known)} exist ({_LISTERS.get(key, 'see the docs')})")
      raise refuse(f"--config.{key}={v!r}", f"is not a {what}",
                   f"{hint + ' ' if hint else ''}{listing}")


_LISTERS = {"estimator": "credit.list_estimators() lists them",
            "policy_loss": "credit.list_policy_losses() lists them"}


# --------------------------------------------------------------------------
# The method's and the task's keyword arguments.
# --------------------------------------------------------------------------


def _kwarg_problem(group: str, owner: str, valid, hints: dict, defaults: dict,
                   kwargs: dict, choices: dict | None = None, noun: str = "hyperparameter"
                   ) -> None:
  from credit._checks import value_problem
  for k, v in kwargs.items():
    if k not in valid:
      hint = _closest(k, valid)
      raise refuse(f"--config.{group}.{k}", f"is refused: {owner} has no {noun} {k!r}",
                   f"{hint + ' ' if hint else ''}valid: {', '.join(valid) or 'none'}")
    problem = value_problem(v, hints.get(k), defaults.get(k), (choices or {}).get(k))
    if problem:
      problem, _, hint = problem.partition(" (did you mean ")
      todo = f"did you mean {hint[:-2]}?" if hint else f"fix --config.{group}.{k}"
      raise refuse(f"--config.{group}.{k}={v!r}", f"is refused by {owner}: it {problem}", todo)


def check_method_kwargs(c: ml_collections.ConfigDict) -> None:
  """estimator_kwargs and loss_kwargs against the signatures: names, types, choices."""
  import inspect

  import credit
  from credit.losses import aggregation, importance
  from credit._checks import hyperparameter_hints
  est = credit.get_estimator(c.estimator)
  params = inspect.signature(est.fn).parameters
  valid = [p for p in est.hyperparameters if p not in ("train_step",)]
  _kwarg_problem("estimator_kwargs", f"estimator {est.name!r}", valid,
                 hyperparameter_hints(est.fn), {k: p.default for k, p in params.items()},
                 dict(c.estimator_kwargs))
  loss = credit.get_policy_loss(c.policy_loss)
  params = inspect.signature(loss.fn).parameters
  valid = [p for p in loss.hyperparameters if p != "train_version"]
  choices = {"loss_agg_mode": aggregation.AGG_MODES, "is_level": importance.IS_LEVELS,
             "is_mode": importance.IS_MODES}
  kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in dict(c.loss_kwargs).items()}
  _kwarg_problem("loss_kwargs", f"policy loss {loss.name!r}", valid,
                 hyperparameter_hints(loss.fn, loss.token_fn),
                 {k: p.default for k, p in params.items()}, kwargs,
                 {k: v for k, v in choices.items() if k in valid})


def builtin_task(c: ml_collections.ConfigDict):
  """The built-in task of `c` with its options, after checking them; None for user data."""
  from credit import tasks as tasks_lib
  from credit._checks import hyperparameter_hints
  if c.task in ("jsonl", "tfds"):
    return None
  cls = tasks_lib.base._TASKS[c.task]  # pylint: disable=protected-access
  fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
  defaults = {k: (f.default if f.default is not dataclasses.MISSING else None)
              for k, f in fields.items()}
  _kwarg_problem("task_kwargs", f"task {c.task!r}", list(fields), hyperparameter_hints(cls),
                 defaults, dict(c.task_kwargs), noun="option")
  try:
    return tasks_lib.get_task(c.task, **dict(c.task_kwargs))
  except (TypeError, ValueError) as e:
    raise refuse(f"--config.task_kwargs ({c.task!r})", f"are refused by the task: {e}",
                 "fix the task options") from None


def check_method(c: ml_collections.ConfigDict) -> None:
  """The method as the loop resolves it (needs against producers, registry checks)."""
  from experiments import loop
  try:
    loop.check_method(c)
  except SetupError:
    raise
  except (KeyError, ValueError, TypeError) as e:
    raise Refusal(" ".join(str(e).split())) from None


# --------------------------------------------------------------------------
# Data.
# --------------------------------------------------------------------------

SAMPLE_EXAMPLES = 16  # generated examples of a built-in task whose verification is checked


# A gold answer that is a plain decimal number, which math_verify always parses and accepts
# boxed: checked without calling it (a GSM8K file is mostly these; math_verify takes ms each).
_PLAIN_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)")


def _gold_problem(task, example: dict, cache: dict) -> str | None:
  """Why the task's verifier cannot check `example`'s gold answer, or None (`cache`: by
  answer text)."""
  key = example.get("answer")
  if isinstance(key, str) and key in cache:
    return cache[key]
  problem = _verify_problem(task, example)
  if isinstance(key, str):
    cache[key] = problem
  return problem


def _verify_problem(task, example: dict) -> str | None:
  parse_gold = getattr(task, "parse_gold", None)  # math_verify
  if parse_gold is not None:
    answer = example.get("answer")
    if isinstance(answer, str) and _PLAIN_NUMBER.fullmatch(answer.strip()):
      return None
    if all(isinstance(g, str) for g in parse_gold(answer)):  # the text alone, no math
      return "parses to no mathematical expression"
  try:
    reward = task.verify(example, task.demonstration(example))
  except Exception as e:  # noqa: BLE001 - the verifier failing on it is the problem
    return f"makes the verifier fail ({type(e).__name__}: {e})"
  if not np.isfinite(reward):
    return f"gets reward {reward} from the verifier"
  if reward != 1.0:
    return f"is not accepted by the verifier as its own correct response (reward {reward})"
  return None


def check_data(c: ml_collections.ConfigDict, task) -> None:
  """Each gold answer verifiable by the task's verifier; a JSON-lines file names its lines."""
  if c.task == "jsonl":
    _check_jsonl(c)
    return
  if task is None or getattr(task, "multi_turn", False):
    return  # tfds (read at setup); multi-turn tasks verify episodes, not responses
  rng = np.random.default_rng(c.seed)
  examples = task.generate(rng, min(SAMPLE_EXAMPLES, c.num_train_examples))
  cache: dict = {}
  for e in examples:
    problem = _gold_problem(task, e, cache)
    if problem is None:
      try:
        wrong = task.verify(e, "")
      except Exception:  # noqa: BLE001 - an empty response may be refused outright
        wrong = 0.0
      if not np.isfinite(wrong):
        problem = f"gives an empty response reward {wrong}"
    if problem:
      raise refuse(f"task {c.task!r} (options {dict(c.task_kwargs)})",
                   f"has a gold answer {e.get('answer')!r} for prompt {e.get('prompt')!r} "
                   f"that {problem}", "fix the task or its options (--config.task_kwargs)")


def _check_jsonl(c: ml_collections.ConfigDict) -> None:
  from credit import tasks as tasks_lib
  path = c.data_path
  if not path:
    raise refuse("--config.data_path", "is empty (task='jsonl' reads a JSON-lines file)",
                 "set --config.data_path=FILE.jsonl")
  if not os.path.isfile(path):
    why = "is a directory" if os.path.isdir(path) else "does not exist"
    raise refuse(f"--config.data_path={path!r}", why, "give the path of a JSON-lines file")
  verifier = tasks_lib.MathVerifier()
  try:
    examples = tasks_lib.load_jsonl(path, prompt_field=c.prompt_field,
                                    answer_field=c.answer_field,
                                    data_format=c.get("data_format", "auto"), verifier=verifier)
  except (ValueError, KeyError) as e:
    raise Refusal(" ".join(str(e).split()) + "; fix or drop the lines it names") from None
  with open(path, encoding="utf-8") as f:
    lines = [i for i, line in enumerate(f, start=1) if line.strip()]
  cache: dict = {}
  bad = [(lines[i], e["answer"], p) for i, e in enumerate(examples)
         if (p := _gold_problem(verifier, e, cache))]
  if bad:
    shown = "; ".join(f"line {n}: {a!r} {p}" for n, a, p in bad[:5])
    more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
    raise refuse(f"--config.data_path={path!r}",
                 f"has {len(bad)} gold answer(s) math_verify cannot check: {shown}{more}",
                 f"fix or drop lines {[n for n, _, _ in bad][:20]}")


# --------------------------------------------------------------------------
# The workdir and the recipe.
# --------------------------------------------------------------------------


def check_workdir(workdir: str | None) -> None:
  """The workdir is a directory (or can become one) this process may write."""
  if not workdir:
    raise refuse("--workdir", "is required (metrics, plots and checkpoints go there)",
                 "add --workdir=DIR")
  path = os.path.abspath(workdir)
  if os.path.exists(path) and not os.path.isdir(path):
    raise refuse(f"--workdir={workdir!r}", "is a file, not a directory",
                 "choose another path or move the file away")
  parent = path
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise refuse(f"--workdir={workdir!r}", f"lies inside {parent!r}, which is a file",
                 "choose a path under a directory")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise refuse(f"--workdir={workdir!r}", f"cannot be written ({parent!r} is not writable)",
                 "choose a directory you can write")


def check_recipe(spec: str, config_keys: list[str]) -> tuple[str, list[str]]:
  """Resolves `file.py[:variant]`: returns the spec to load and `--config.k=v` settings.

  Variant parts the recipe does not declare are refused with the closest variant, except
  `key=value` parts whose key is a config field (`:tiny,seed=3`), which become settings.
  """
  from experiments.configs.common import UnknownVariantError
  file, _, variant = spec.partition(":")
  if not os.path.isfile(file):
    raise refuse(f"--config={file!r}", "does not exist", "give a recipe file, e.g. "
                 "experiments/configs/grpo_arithmetic.py")
  module_spec = importlib.util.spec_from_file_location("_recipe", file)
  mod = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(mod)
  parts = [p.strip() for p in variant.split(",") if p.strip()]
  settings: list[str] = []
  while True:
    try:
      mod.get_config(",".join(parts) or None)
      break
    except UnknownVariantError as e:
      part = next(p for p in parts if p.split("=", 1)[0] == e.key)
      if "=" in part and e.key in config_keys:
        parts.remove(part)
        settings.append(f"--config.{part}")
        continue
      hint = _closest(e.key, e.known)
      if not hint and "=" in part:  # a misspelt config field, e.g. :tiny,sed=3
        hint = _closest(e.key, config_keys)
        hint = hint[:-1] + " (a config field)?" if hint else ""
      raise refuse(f"--config={spec!r}", f"has unknown variant {e.key!r}",
                   f"{hint + ' ' if hint else ''}the recipe's variants: "
                   f"{', '.join(e.known)}") from None
  return file + (":" + ",".join(parts) if parts else ""), settings


def check_mesh(c: ml_collections.ConfigDict, *, devices: bool = False) -> None:
  """The mesh spec's syntax and axis names; with `devices`, that it fits the devices (this
  starts the JAX backend: call it after the device and multi-process settings)."""
  from credit import parallel
  try:
    mesh = parallel.make_mesh(c.mesh) if devices else parallel.parse_mesh_spec(c.mesh)
  except ValueError as e:
    raise refuse(f"--config.mesh={c.mesh!r}", f"is refused: {' '.join(str(e).split())}",
                 "e.g. --config.mesh=data=-1 puts every device on the data axis") from None
  if devices:
    check_memory(c, dict(mesh.shape))


def check_memory(c: ml_collections.ConfigDict, mesh_shape: dict) -> None:
  """The run's memory plan per device (`experiments/memory.py`) against one device's memory:
  a planned peak above 90% of it is refused with the plan's numbers (`c.memory.check`)."""
  from experiments import memory
  if not c.get("memory", {}).get("check", True):
    return
  from experiments import loop
  method = loop.check_method(c)
  plan = memory.plan_run(c, method=method, mesh_shape=mesh_shape,
                         reference_copy=loop.keeps_reference_copy(c, method),
                         device_bytes=memory.device_memory(c))
  why = memory.refusal(plan) if plan is not None else None
  if why:
    raise Refusal(why)


def check_preset(c: ml_collections.ConfigDict) -> None:
  """A model preset with a checkpoint (init_from) must name the checkpoint's shapes."""
  from experiments import memory
  from credit.models import preset
  name = c.get("model", {}).get("preset", "")
  if not name or not c.get("init_from", ""):
    return
  ckpt = memory._checkpoint_config(c.init_from, None, None)  # pylint: disable=protected-access
  if ckpt is None:
    return  # the loop reports an unreadable checkpoint
  want = preset(name)
  if c.model.preset_layers:
    want = want.replace(num_layers=int(c.model.preset_layers))
  keys = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
          "num_kv_heads", "head_dim", "tie_embeddings", "family")
  diff = [f"{k} {getattr(ckpt, k)} (preset {getattr(want, k)})" for k in keys
          if getattr(ckpt, k) != getattr(want, k)]
  if diff:
    raise refuse(f"--config.model.preset={name!r}",
                 f"does not match --config.init_from={c.init_from!r}: {', '.join(diff)}",
                 "drop the preset (the checkpoint's config.json sets the shapes) or load a "
                 "checkpoint of that model")


def check(c: ml_collections.ConfigDict, workdir: str | None) -> None:
  """Every check above, cheapest first; raises `Refusal` (or the loop's SetupError). The
  device count is checked apart (`check_mesh(c, devices=True)`)."""
  check_workdir(workdir)
  check_names(c)
  check_sizes(c)
  check_mesh(c)
  check_method_kwargs(c)
  check_preset(c)
  task = builtin_task(c)
  check_method(c)
  check_data(c, task)
