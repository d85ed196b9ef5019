"""What a run shows while it works: a bar on a terminal, plain lines elsewhere, a log file.

* `ProgressBar`: for the supervised warm-up and the RL steps alike. On a terminal a tqdm bar
  with the latest metrics in its postfix; when the output is not a terminal (a file, a pipe,
  CI) a plain line every `every` steps instead, with the metrics averaged over the steps since
  the previous line, the elapsed time, the time per step and the time left. Either way the
  plain lines also go to the run's log.
* `RunLog`: ``<workdir>/log.txt``, the run's human-readable lines with a time stamp: messages
  (`say`), the progress lines, one line per evaluation (`eval_line`). It is appended to, so a
  resumed run continues the file of the run it resumes; each start writes a header line.
* `WarmupRecord`: the warm-up's loss at every step, in ``<workdir>/warmup.jsonl`` (rows
  ``{"step", "sft_loss", "grad_norm"}``), which `reporting.plot_curves` draws beside the RL
  curves. The warm-up runs before the step-0 checkpoint, so the file is always written whole.
* `auto_every`: the default spacing of the plain lines, about `LINES_PER_PHASE` per phase.

Everything here is host-side Python; nothing runs inside a jitted function.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

LOG_FILE = "log.txt"
WARMUP_FILE = "warmup.jsonl"
LINES_PER_PHASE = 20
MESSAGE_PREFIX = "[credit] "

# (label shown, metric key) pairs: the RL bar's postfix and its plain lines.
DEFAULT_POSTFIX = (("reward", "reward_mean"), ("acc", "accuracy"), ("s/step", "step_time"))
RL_LINE_FIELDS = (("reward", "reward_mean"), ("acc", "accuracy"), ("len", "response_length"),
                  ("loss", "loss"))
WARMUP_FIELDS = (("loss", "sft_loss"),)


def auto_every(total: int, every: int = 0) -> int:
  """Steps between plain progress lines: `every` when > 0, else about `LINES_PER_PHASE` lines
  over `total` steps (at least 1).

  >>> auto_every(2500), auto_every(150), auto_every(2), auto_every(150, 10)
  (125, 8, 1, 10)
  """
  if every > 0:
    return int(every)
  return max(1, math.ceil(int(total) / LINES_PER_PHASE))


def _fmt(value: float) -> str:
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return f"{value:.4g}"


def _scalar(key: str, value: Any) -> float:
  try:
    return float(np.asarray(value).reshape(()))
  except (TypeError, ValueError) as e:
    raise TypeError(f"metric {key!r} must be a numeric scalar, got {type(value).__name__}") from e


def duration(seconds: float) -> str:
  """`seconds` for a reader: "0.41 s", "12.3 s", "4 min 7 s", "1 h 2 min".

  >>> duration(0.412), duration(12.34), duration(247.2), duration(3725)
  ('0.41 s', '12.3 s', '4 min 7 s', '1 h 2 min')
  """
  s = max(0.0, float(seconds))
  if s < 10:
    return f"{s:.2f} s"
  if s < 60:
    return f"{s:.1f} s"
  m, sec = divmod(int(round(s)), 60)
  if m < 60:
    return f"{m} min {sec} s"
  h, m = divmod(m, 60)
  return f"{h} h {m} min"


def write_message(message: str, file=None) -> None:
  """Prints a line (default: stdout) with `tqdm.write`, which clears and redraws any live
  tqdm bar around it, so lines and the bar never interleave; flushed at once, so a file being
  written can be watched (`tail -f`)."""
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  file = sys.stdout if file is None else file
  tqdm.write(message, file=file)
  if hasattr(file, "flush"):
    file.flush()


class RunLog:
  """``<workdir>/log.txt``: the run's lines, each with a time stamp, appended and flushed.

  Args:
    workdir: the run directory (it must exist).
    header: what this start is (method, task, steps); written after a "====" line with the
      date, so the starts of a resumed run stand apart in the file.
  """

  def __init__(self, workdir: str | os.PathLike, *, header: str = ""):
    self.path = os.path.join(os.fspath(workdir), LOG_FILE)
    self._file = open(self.path, "a", encoding="utf-8")
    self.write(f"==== start{': ' + header if header else ''} (pid {os.getpid()})")

  def write(self, line: str) -> None:
    if self._file.closed:
      return
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    self._file.write("".join(f"{stamp} {part}\n" for part in str(line).splitlines() or [""]))
    self._file.flush()

  def close(self) -> None:
    if not self._file.closed:
      self._file.close()


def say(message: str, log: RunLog | None = None, file=None) -> None:
  """`message` on stdout (prefixed "[credit] ", through tqdm) and in `log`."""
  write_message(MESSAGE_PREFIX + message, file=file)
  if log is not None:
    log.write(message)


def eval_line(step: int, metrics: Mapping[str, Any], *, seconds: float | None = None,
              num_prompts: int | None = None, samples: int = 0) -> str:
  """One line for a held-out evaluation: step, greedy accuracy, pass@k and mean@k where
  measured (`samples` = k), the mean number of turns of multi-turn episodes, and the time.

  >>> eval_line(25, {"eval_accuracy": 0.879, "eval_pass_at_k": 0.95}, seconds=2.1,
  ...           num_prompts=128, samples=8)
  'eval at step 25: held-out accuracy 0.879 (greedy, 128 prompts), pass@8 0.950, 2.10 s'
  """
  where = f"greedy, {num_prompts} prompts" if num_prompts else "greedy"
  parts = [f"eval at step {int(step)}: held-out accuracy "
           f"{float(metrics.get('eval_accuracy', math.nan)):.3f} ({where})"]
  k = f"@{samples}" if samples else "@k"
  if "eval_pass_at_k" in metrics:
    parts.append(f"pass{k} {float(metrics['eval_pass_at_k']):.3f}")
  if "eval_mean_at_k" in metrics:
    parts.append(f"mean{k} {float(metrics['eval_mean_at_k']):.3f}")
  if "eval_turns" in metrics:
    parts.append(f"{float(metrics['eval_turns']):.2f} turns")
  if seconds is not None:
    parts.append(duration(seconds))
  return ", ".join(parts)


def _width(file, disabled: bool) -> dict:
  """tqdm's size options: follow the terminal, or 100 x 40 where it reports no size (tqdm
  draws nothing on a pseudo-terminal of 0 x 0 otherwise)."""
  try:
    sized = disabled or os.get_terminal_size(file.fileno()).columns > 0
  except (AttributeError, OSError, ValueError):
    sized = True  # not a real file: tqdm decides
  return {"dynamic_ncols": True} if sized else {"ncols": 100, "nrows": 40}


class ProgressBar:
  """Progress over a run's steps: a tqdm bar on a terminal, plain lines elsewhere.

  On a terminal the bar shows the latest value of each of `fields` in its postfix. Off a
  terminal (or with `disable=True`) a plain line is printed on `line_file` every `every` steps
  and at the last one:

    RL 24/150 (16%) reward 0.58 acc 0.58 len 3.1 loss 0.012 | 11.0 s, 0.40 s/step, ~50.6 s left

  with each of `line_fields` averaged over the steps since the previous line; s/step leaves
  out the first step of this bar (it compiles) once there are others. The same lines go to
  `log` in both cases.

  Args:
    total: the last step.
    initial: the step the bar starts from (the restored step on resume).
    desc: what is counted ("warm-up", "RL").
    disable: True never draws a bar (plain lines instead); None (default) draws it when
      `file` is a terminal; False always draws it.
    fields: (label, metric key) pairs of the bar's postfix.
    file: the bar's stream (default stderr).
    every: steps between plain lines; None or 0: `auto_every(total)`.
    log: a `RunLog` that gets every plain line (with or without a bar).
    line_fields: (label, metric key) pairs of the plain lines (default: `fields`).
    line_file: the plain lines' stream (default stdout).
    quiet: show and log nothing (the processes other than 0 of a multi-process run).
  """

  def __init__(self, total: int, *, initial: int = 0, desc: str = "train",
               disable: bool | None = None, fields: Sequence[tuple[str, str]] = DEFAULT_POSTFIX,
               file=None, every: int | None = None, log: RunLog | None = None,
               line_fields: Sequence[tuple[str, str]] | None = None, line_file=None,
               quiet: bool = False):
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    file = sys.stderr if file is None else file
    if disable is None:
      disable = not (hasattr(file, "isatty") and file.isatty())
    self.disabled = bool(disable) or quiet
    self.quiet = quiet
    self.total, self.desc = int(total), desc
    self.fields = tuple(fields)
    self.line_fields = tuple(self.fields if line_fields is None else line_fields)
    self.every = auto_every(total, every or 0)
    self.log = None if quiet else log
    self.line_file = line_file
    self.postfix: dict[str, str] = {}
    self._bar = tqdm(total=total, initial=initial, desc=desc, disable=self.disabled,
                     file=file, unit="step", **_width(file, self.disabled))
    self._n = self._n0 = int(initial)
    self._t0 = time.perf_counter()
    self._first: tuple[int, float] | None = None  # (step, time) of the first update
    self._sums: dict[str, list[float]] = {}

  @property
  def live(self) -> bool:
    """A bar is being drawn (a caller may then refresh it more often than every line)."""
    return not self.disabled

  def update(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
    """Moves to `step`; shows the fields present in `metrics`; prints and logs a plain line
    when `step` is a multiple of `every` or the last step."""
    step = int(step)
    now = time.perf_counter()
    if metrics:
      for label, key in self.fields:
        if key in metrics:
          self.postfix[label] = _fmt(_scalar(key, metrics[key]))
      for _, key in self.line_fields:
        if key in metrics:
          value = _scalar(key, metrics[key])
          if math.isfinite(value):
            acc = self._sums.setdefault(key, [0.0, 0])
            acc[0] += value
            acc[1] += 1
    if not self.disabled:
      if self.postfix:
        self._bar.set_postfix(self.postfix, refresh=False)
      self._bar.update(step - self._n)
    self._n = step
    if self._first is None:
      self._first = (step, now)
    if step > self._n0 and (step % self.every == 0 or step == self.total) and not self.quiet:
      self._emit(self._line(step, now))

  def extend(self, total: int) -> None:
    """Moves the last step to `total` (a warm-up that goes on past its planned length)."""
    self.total = int(total)
    self._bar.total = self.total
    if not self.disabled:
      self._bar.refresh()

  def _line(self, step: int, now: float) -> str:
    """The plain line at `step`; the averages start again after it."""
    pct = f" ({100 * step / self.total:.0f}%)" if self.total else ""
    parts = [f"{self.desc} {step}/{self.total}{pct}"]
    for label, key in self.line_fields:
      if key in self._sums and self._sums[key][1]:
        total, count = self._sums[key]
        parts.append(f"{label} {_fmt(total / count)}")
    self._sums = {}
    elapsed = now - self._t0
    done = step - self._n0
    first_step, first_t = self._first or (self._n0, self._t0)
    if step - first_step >= 1:  # without the first (compiling) step
      per_step = (now - first_t) / (step - first_step)
    else:
      per_step = elapsed / max(1, done)
    timing = f"{duration(elapsed)}, {duration(per_step)}/step"
    if step < self.total:
      timing += f", ~{duration(per_step * (self.total - step))} left"
    return " ".join(parts) + " | " + timing

  def _emit(self, line: str) -> None:
    if self.disabled:
      write_message(MESSAGE_PREFIX + line, file=self.line_file)
    if self.log is not None:
      self.log.write(line)

  def write(self, message: str) -> None:
    """Prints a line on stdout without breaking the bar (shown whether or not the bar is)."""
    write_message(message)

  def close(self) -> None:
    self._bar.close()

  def __enter__(self) -> ProgressBar:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


class WarmupRecord:
  """Writes the warm-up's per-step metrics to ``<workdir>/warmup.jsonl`` (a fresh file).

  Each row: {"step": the warm-up step (1-based), "sft_loss", "grad_norm"} where present.
  """

  def __init__(self, workdir: str | os.PathLike):
    self.path = os.path.join(os.fspath(workdir), WARMUP_FILE)
    self._file = open(self.path, "w", encoding="utf-8")

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    row = {"step": int(step), **{k: _scalar(k, v) for k, v in metrics.items()}}
    self._file.write(json.dumps(row) + "\n")

  def flush(self) -> None:
    self._file.flush()

  def close(self) -> None:
    if not self._file.closed:
      self._file.close()
