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
"""
from __future__ import annotations

import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Recipe config file[:variant].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory (metrics, plots, checkpoints).")
_COORD = flags.DEFINE_string("coordinator", None, "host:port of process 0 (multi-process runs).")
_NPROC = flags.DEFINE_integer("num_processes", 1, "Processes in a multi-process run.")
_PID = flags.DEFINE_integer("process_id", 0, "This process's index.")
_LOCAL_DEVICES = flags.DEFINE_integer("local_cpu_devices", 0,
                                      "Fake CPU devices per process (0 = leave as is).")


# Config groups whose keys are the chosen method's hyperparameters or the task's options: open to
# any key on the command line, validated when the run starts (against the method's signature,
# or the task's dataclass fields by `credit.tasks.get_task`).
METHOD_KWARGS = ("estimator_kwargs", "loss_kwargs", "task_kwargs")


def _literal(text: str):
  """'0.1' -> 0.1, 'True' -> True, '(1, 2)' -> (1, 2), 'batch' -> 'batch'."""
  import ast
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


_METHOD_OVERRIDES: dict[str, dict] = {}
_ARGV: list[str] = []  # the command line as given (asynchronous runs start workers with it)


def main(argv):
  del argv
  if _WORKDIR.value is None:
    raise app.UsageError("--workdir is required")
  import logging as pylogging
  from absl import logging
  logging.set_verbosity(logging.WARNING)
  pylogging.getLogger("absl").setLevel(pylogging.WARNING)
  import jax
  if _LOCAL_DEVICES.value:
    jax.config.update("jax_num_cpu_devices", _LOCAL_DEVICES.value)
  if _COORD.value and not _CONFIG.value.async_rollouts:  # async: experiments/coordination.py
    jax.distributed.initialize(coordinator_address=_COORD.value,
                               num_processes=_NPROC.value, process_id=_PID.value)
  from experiments import loop
  config = apply_method_overrides(_CONFIG.value, _METHOD_OVERRIDES)
  try:
    if config.async_rollouts:  # trainer and rollout workers in separate processes
      from experiments import async_rl
      async_rl.main(config, _WORKDIR.value, argv=_ARGV, coordinator=_COORD.value,
                    num_processes=_NPROC.value, process_id=_PID.value)
      return
    loop.run(config, _WORKDIR.value)
  except loop.SetupError as e:  # refused before any output: the reason, not a traceback
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


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
        return f"unknown config key {key!r} (no {part!r} in {where}); valid keys: {valid}"
      node = node[part]
  return None


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  _ARGV = sys.argv[1:]
  try:
    args, _METHOD_OVERRIDES = split_method_overrides(sys.argv[1:])
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  sys.argv = sys.argv[:1] + args
  err = check_overrides(args)
  if err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(2)
  app.run(main)
