"""Experiment runner: `python -m experiments.run --config <recipe>.py[:variant] --workdir DIR`.

One RL step: prompts -> G samples per prompt (KV-cache sampler) -> verifier
rewards -> the extra forward passes the estimator / loss / KL term need
(reference model, recomputed old log-probs) -> advantages -> PPO epochs over
minibatches (one jitted update) -> metrics, periodic eval, checkpoints, plots.

Overrides: `--config.estimator=rloo --config.steps=50 --config.mesh=data=2,fsdp=4`.
Method hyperparameters: `--config.estimator_kwargs.<k>=<v>` and `--config.loss_kwargs.<k>=<v>`
for any argument the estimator / loss accepts, and `--config.task_kwargs.<k>=<v>` for any task
option (values are Python literals, else strings; a name the method or task does not take is
refused with the valid names).
Multi-process: `--coordinator=localhost:PORT --num_processes=2 --process_id=i`.
Asynchronous RL (trainer + rollout workers, `experiments/async_rl.py`): `--config.async_rollouts=True`.
Start-up: every mistake (a size out of range, an unknown name or variant, a keyword of the
wrong type, a gold answer the verifier cannot check, a workdir that is a file) is refused by
`experiments/validate.py` before any file is written or anything compiles, in one line
`error: <what> <why>; <what to do>`, with exit status 2; `--debug` adds the traceback.
A variant's `key=value` parts that name a config field are settings: `:tiny,seed=3` is
`:tiny --config.seed=3`.
"""
from __future__ import annotations

import difflib
import sys
import traceback
from typing import Sequence

from absl import flags
from ml_collections import config_flags

# Config groups whose keys are the chosen method's hyperparameters or the task's options: open to
# any key on the command line, validated when the run starts (against the method's signature,
# or the task's dataclass fields by `credit.tasks.get_task`).
METHOD_KWARGS = ("estimator_kwargs", "loss_kwargs", "task_kwargs")


def _literal(text: str):
  """'0.1' -> 0.1, 'True' -> True, '(1, 2)' -> (1, 2), 'nan' -> nan, 'batch' -> 'batch'."""
  import ast
  if text.strip().lower() in ("nan", "inf", "+inf", "-inf"):
    return float(text)  # refused (NaN) or checked against the range by experiments.validate
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def split_method_overrides(argv: list[str]) -> tuple[list[str], dict[str, dict]]:
  """Takes `--config.<group>.<k>=<v>` for the groups in METHOD_KWARGS out of `argv`.

  Returns the remaining arguments and {group: {k: parsed v}}. ml_collections refuses keys a
  recipe did not declare, so these are applied after the config is loaded (`apply_method_
  overrides`); `loop.check_method` validates them against the method's signature.
  """
  rest, found = [], {g: {} for g in METHOD_KWARGS}
  for a in argv:
    for group in METHOD_KWARGS:
      prefix = f"--config.{group}."
      if a.startswith(prefix):
        key, eq, value = a[len(prefix):].partition("=")
        if not eq or not key or "." in key:
          raise ValueError(f"{a!r}: expected {prefix}<name>=<value>")
        found[group][key] = _literal(value)
        break
    else:
      rest.append(a)
  return rest, found


def apply_method_overrides(config, overrides: dict[str, dict]):
  """Sets the method hyperparameters taken from the command line on a (locked) config."""
  with config.unlocked():
    for group, kv in overrides.items():
      for k, v in kv.items():
        config[group][k] = v
  return config


def check_overrides(argv: list[str]) -> str | None:
  """Returns an error message for an unknown `--config.<key>` override, else None.

  config_flags would raise a bare AttributeError deep in a traceback; this names
  the key and lists the valid ones before anything starts.
  """
  import importlib.util
  path = None
  for i, a in enumerate(argv):
    if a.startswith("--config="):
      path = a.split("=", 1)[1]
    elif a == "--config" and i + 1 < len(argv):
      path = argv[i + 1]
  if not path:
    return None
  file, _, variant = path.partition(":")
  spec = importlib.util.spec_from_file_location("_recipe", file)
  if spec is None:
    return f"--config: cannot load recipe file {file!r}"
  mod = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(mod)
  except FileNotFoundError:
    return f"--config: recipe file {file!r} does not exist"
  cfg = mod.get_config(variant or None)
  for a in split_method_overrides(argv)[0]:
    if not a.startswith("--config."):
      continue
    key = a[len("--config."):].split("=", 1)[0]
    node = cfg
    parts = key.split(".")
    for j, part in enumerate(parts):
      if not hasattr(node, "keys") or part not in node:
        where = ".".join(parts[:j]) or "config"
        valid = sorted(node.keys()) if hasattr(node, "keys") else []
        close = difflib.get_close_matches(part, valid, n=1)
        known = f"did you mean {close[0]!r}?" if close else f"valid keys: {valid}"
        return f"unknown config key {key!r} (no {part!r} in {where}); {known}"
      node = node[part]
  return None


def _flag_values(args: list[str]) -> flags.FlagValues:
  """This command line's flags, parsed into their own FlagValues (so `main` can be called
  again in one process, as the tests do)."""
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "Recipe config file[:variant].",
                                  flag_values=fv, lock_config=True, sys_argv=["run", *args])
  flags.DEFINE_string("workdir", None, "Output directory (metrics, plots, checkpoints).",
                      flag_values=fv)
  flags.DEFINE_string("coordinator", None, "host:port of process 0 (multi-process runs).",
                      flag_values=fv)
  flags.DEFINE_integer("num_processes", 1, "Processes in a multi-process run.", flag_values=fv)
  flags.DEFINE_integer("process_id", 0, "This process's index.", flag_values=fv)
  flags.DEFINE_integer("local_cpu_devices", 0, "Fake CPU devices per process (0 = leave as is).",
                       flag_values=fv)
  flags.DEFINE_boolean("debug", False, "Show the traceback of a refused run.", flag_values=fv)
  fv(["run", *args])
  return fv


def _config_arg(args: list[str]) -> tuple[int, str] | None:
  """(index in args, value) of the --config flag, or None."""
  for i, a in enumerate(args):
    if a.startswith("--config="):
      return i, a.split("=", 1)[1]
    if a == "--config" and i + 1 < len(args):
      return i + 1, args[i + 1]
  return None


def parse_command_line(argv: Sequence[str]):
  """Flags, recipe and overrides of a command line -> (config, flags); refuses mistakes in
  one line (`validate.Refusal`) before anything else runs."""
  from experiments import validate
  from experiments.configs import common
  try:
    args, overrides = split_method_overrides(list(argv))
  except ValueError as e:
    raise validate.Refusal(f"{e}; write --config.<group>.<name>=<value>") from None
  found = _config_arg(args)
  if found is None:
    raise validate.refuse("--config", "is required (the recipe to run)",
                          "add --config=experiments/configs/grpo_arithmetic.py, say")
  i, spec = found
  spec, settings = validate.check_recipe(spec, list(common.base_config().keys()))
  args = args[:i] + [f"--config={spec}" if args[i].startswith("--config=") else spec] + \
      args[i + 1:]
  j = i + 1
  args = args[:j] + settings + args[j:]  # before the explicit overrides, which win
  err = check_overrides(args)
  if err:
    raise validate.Refusal(err)
  try:
    fv = _flag_values(args)
  except flags.UnrecognizedFlagError as e:
    known = sorted(_flag_values([]))
    close = difflib.get_close_matches(e.flagname, known, n=1)
    todo = f"did you mean --{close[0]}?" if close else f"the flags: {', '.join(known)}"
    raise validate.refuse(f"--{e.flagname}", "is not a flag of experiments.run", todo) from None
  except flags.Error as e:
    raise validate.Refusal(" ".join(str(e).split()) + "; see --help") from None
  return apply_method_overrides(fv.config, overrides), fv


def _setup_errors() -> tuple[type[BaseException], ...]:
  """What a refused start-up raises: the loop's SetupError, unknown names, contract errors."""
  import credit
  from credit import tasks as tasks_lib
  from experiments import loop
  return (loop.SetupError, credit.UnknownNameError, tasks_lib.UnknownTaskError,
          credit.ContractError)


def main(argv: Sequence[str] | None = None) -> int:
  """The command line `python -m experiments.run ...` (argv without the program name).

  Returns the exit status: 0 after a run, 2 when the run was refused; a refusal prints one
  line `error: <what> <why>; <what to do>` on stderr (`--debug`: with the traceback).
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  if any(a in ("-h", "--help", "--helpfull") for a in argv):
    print(__doc__)
    print(_flag_values([]).main_module_help() or _flag_values([]).get_help())
    return 0
  debug = any(a in ("--debug", "--debug=true", "--debug=True") for a in argv)
  from experiments import validate
  try:
    config, fv = parse_command_line(argv)
    validate.check(config, fv.workdir)
    return _run(config, fv, argv)
  except _setup_errors() as e:
    if debug:
      traceback.print_exc()
    print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2


def _run(config, fv: flags.FlagValues, argv: list[str]) -> int:
  import logging as pylogging
  from absl import logging
  if not flags.FLAGS.is_parsed():  # absl logging reads the global flags
    flags.FLAGS.mark_as_parsed()
  logging.set_verbosity(logging.WARNING)
  pylogging.getLogger("absl").setLevel(pylogging.WARNING)
  import jax
  if fv.local_cpu_devices:
    jax.config.update("jax_num_cpu_devices", fv.local_cpu_devices)
  if fv.coordinator and not config.async_rollouts:  # async: experiments/coordination.py
    jax.distributed.initialize(coordinator_address=fv.coordinator,
                               num_processes=fv.num_processes, process_id=fv.process_id)
  from experiments import loop, validate
  if config.async_rollouts:  # trainer and rollout workers in separate processes
    from experiments import async_rl
    async_rl.main(config, fv.workdir, argv=argv, coordinator=fv.coordinator,
                  num_processes=fv.num_processes, process_id=fv.process_id)
    return 0
  validate.check_mesh(config, devices=True)  # the backend starts here, after the settings
  loop.run(config, fv.workdir)
  return 0


if __name__ == "__main__":
  sys.exit(main())
