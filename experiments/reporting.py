"""Metrics files, progress bar, plots and summaries for the experiment runner.

* `MetricsWriter`: one JSON object per `write` appended to
  ``workdir/metrics.jsonl`` (flushed at once) plus TensorBoard scalars in
  ``workdir/tb`` (`experiments.tb_events`). On resume it drops the rows of steps after
  the restored checkpoint, so the file of an interrupted-and-resumed run equals
  the file of an uninterrupted one (up to wall-clock fields such as
  ``step_time``), and TensorBoard is told to purge the same steps.
* `SamplesWriter`: a few rollouts per step as the model saw them (prompt,
  response, reward, per-token advantages) appended to ``workdir/samples.jsonl``,
  truncated on resume like the metrics file.
* `ProgressBar`: tqdm with reward / accuracy / step time in the postfix;
  disabled off a TTY. `write_message` prints progress messages through `tqdm.write`.
* `plot_curves`, `plot_token_credit`: PNGs drawn with matplotlib's object API
  (`matplotlib.figure.Figure`, Agg canvas), so importing this module changes
  no global pyplot backend.
* `select_rows`: which rollouts of a step to show (groups with mixed rewards first).
* `summary_table`: a markdown table of first / last / best value per metric;
  `run_summary`: the whole ``summary.md`` (before / after, wall time, that table).

Files that a reader could mistake for complete when half-written (PNGs,
summaries, the rewritten metrics file on resume) are written to a temporary
file in the same directory and moved into place with `os.replace`.
"""
from __future__ import annotations

import json
import logging
import math
import numbers
import os
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np

from experiments import tb_events

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
TB_DIR = "tb"
DEFAULT_CURVE_KEYS = ("reward_mean", "accuracy", "eval_accuracy", "response_length", "loss",
                      "step_time")


# --------------------------------------------------------------------------
# Small file helpers.
# --------------------------------------------------------------------------


def _tmp_name(path: str) -> str:
  root, ext = os.path.splitext(path)
  return f"{root}.tmp-{os.getpid()}{ext}"


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
  """Writes `text` to `path` via a temporary file and `os.replace`."""
  path = os.fspath(path)
  tmp = _tmp_name(path)
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def _save_figure_atomic(fig, out_png: str | os.PathLike, dpi: int) -> None:
  out_png = os.fspath(out_png)
  parent = os.path.dirname(os.path.abspath(out_png))
  os.makedirs(parent, exist_ok=True)
  tmp = _tmp_name(out_png)
  try:
    fig.savefig(tmp, format="png", dpi=dpi)
    os.replace(tmp, out_png)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def _to_scalar(key: str, value: Any) -> bool | int | float:
  """Python scalar from a Python/numpy/jax scalar or a size-1 array."""
  if isinstance(value, (bool, np.bool_)):
    return bool(value)
  if isinstance(value, numbers.Integral):
    return int(value)
  if isinstance(value, numbers.Real):
    return float(value)
  try:
    arr = np.asarray(value)
  except Exception as e:  # noqa: BLE001
    raise TypeError(f"metric {key!r}: cannot convert {type(value).__name__}") from e
  if arr.size != 1 or arr.dtype.kind not in "biuf":
    raise TypeError(f"metric {key!r} must be a numeric scalar, got "
                    f"{type(value).__name__} of shape {arr.shape} dtype {arr.dtype}")
  return _to_scalar(key, arr.reshape(()).item())


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
  """Reads a metrics (or samples) JSONL file; a malformed (e.g. half-written) line is skipped.

  Args:
    path: a file written by `MetricsWriter` or `SamplesWriter`.

  Returns:
    The rows in file order; each has an int "step" and scalar metrics.
    Missing file: an empty list.
  """
  rows, _ = _read_lines(os.fspath(path))
  return [row for _, row in rows]


def _read_lines(path: str) -> tuple[list[tuple[str, dict]], int]:
  """(raw line, parsed row) pairs of a JSONL file and the count of bad lines."""
  out, bad = [], 0
  if not os.path.exists(path):
    return out, bad
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
          raise ValueError("not an object with an int 'step'")
      except ValueError as e:
        bad += 1
        logger.warning("Skipping malformed line %d of %s: %s", lineno, path, e)
        continue
      out.append((line if line.endswith("\n") else line + "\n", row))
  return out, bad


def _prepare_jsonl(path: str, resume_step: int | None) -> int | None:
  """Makes a JSONL file of step rows fit the run that opens it; returns its last step.

  Fresh run (`resume_step` None): an existing file is emptied. Resume: rows with
  ``step > resume_step`` and malformed lines are dropped (rewritten atomically).
  """
  lines, bad = _read_lines(path)
  if resume_step is None:
    keep = []
    if lines or bad:
      logger.info("Fresh run: emptying %s (%d old rows).", path, len(lines))
  else:
    keep = [(raw, row) for raw, row in lines if row["step"] <= resume_step]
    if len(keep) != len(lines) or bad:
      logger.info("Resuming at step %d: dropping %d rows after it and %d "
                  "malformed lines from %s.", resume_step, len(lines) - len(keep),
                  bad, path)
  if len(keep) != len(lines) or bad or (resume_step is None and os.path.exists(path)):
    write_text_atomic(path, "".join(raw for raw, _ in keep))
  return keep[-1][1]["step"] if keep else None


# --------------------------------------------------------------------------
# Metrics writer.
# --------------------------------------------------------------------------


class MetricsWriter:
  """Appends per-step scalar metrics to ``metrics.jsonl`` and TensorBoard.

  Args:
    workdir: the run directory (created if missing).
    resume_step: the step of the restored checkpoint. Rows with
      ``step > resume_step`` (written after that checkpoint by the run that
      was interrupted) are dropped, as is a half-written last line, and
      TensorBoard purges events from ``resume_step + 1`` on. None means a
      fresh run: an existing ``metrics.jsonl`` is emptied and old TensorBoard
      events are purged.
    tensorboard: also write TensorBoard event files under ``workdir/tb``.

  Example::

    with MetricsWriter(workdir, resume_step=start_step) as mw:
      mw.write(step, {"reward_mean": reward.mean(), "loss": loss})
  """

  def __init__(self, workdir: str | os.PathLike, *, resume_step: int | None = None,
               tensorboard: bool = True):
    self.workdir = os.fspath(workdir)
    os.makedirs(self.workdir, exist_ok=True)
    self.path = os.path.join(self.workdir, METRICS_FILE)
    self._last_step = self._prepare_file(resume_step)
    self._file = open(self.path, "a", encoding="utf-8")
    self._tb = None
    if tensorboard:
      self._tb = self._open_tensorboard(resume_step)

  def _prepare_file(self, resume_step: int | None) -> int | None:
    return _prepare_jsonl(self.path, resume_step)

  def _open_tensorboard(self, resume_step: int | None):
    tb_dir = os.path.join(self.workdir, TB_DIR)
    has_events = os.path.isdir(tb_dir) and any(
        "tfevents" in name for name in os.listdir(tb_dir))
    if resume_step is not None:
      purge_step = resume_step + 1
    else:
      purge_step = 0 if has_events else None
    return tb_events.EventWriter(tb_dir, purge_step=purge_step)

  @property
  def last_step(self) -> int | None:
    """The step of the last row in the file, or None when it is empty."""
    return self._last_step

  def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Appends one row ``{"step": step, **metrics}`` and flushes it.

    Args:
      step: the training step; must not decrease between calls (several rows
        for one step, e.g. train then eval, are fine).
      metrics: name -> numeric scalar (Python, numpy or jax scalar, or a
        size-1 array). NaN and inf are written as JSON ``NaN`` / ``Infinity``
        (Python's `json` reads them back).

    Returns:
      The row as written, with Python scalars.

    Raises:
      TypeError: a value is not a numeric scalar (nothing is written).
      ValueError: `step` is lower than the previous row's step, or a metric
        is named "step".
    """
    step = int(step)
    if self._last_step is not None and step < self._last_step:
      raise ValueError(f"step {step} is before the last written step {self._last_step}")
    if "step" in metrics:
      raise ValueError("'step' is reserved for the row's step")
    row: dict[str, Any] = {"step": step}
    for key, value in metrics.items():
      row[str(key)] = _to_scalar(key, value)
    self._file.write(json.dumps(row) + "\n")
    self._file.flush()
    self._last_step = step
    if self._tb is not None:
      self._tb.add_scalars(step, [(k, float(v)) for k, v in row.items() if k != "step"])
      self._tb.flush()
    return row

  def close(self) -> None:
    """Flushes and closes both outputs."""
    if not self._file.closed:
      self._file.close()
    if self._tb is not None:
      self._tb.close()
      self._tb = None

  def __enter__(self) -> MetricsWriter:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


class SamplesWriter:
  """Appends rollouts, one JSON object per line, to ``workdir/samples.jsonl``.

  A row is whatever the runner puts in it (prompt and response text, token ids, reward,
  per-token advantages, ...) plus an int "step"; `read_metrics` reads the file back.
  Resume and fresh-run handling are those of `MetricsWriter` (rows after `resume_step`
  dropped; a fresh run empties the file). The file is opened on the first `write`.

  Args:
    workdir: the run directory (created if missing).
    resume_step: the step of the restored checkpoint, or None for a fresh run.
  """

  def __init__(self, workdir: str | os.PathLike, *, resume_step: int | None = None):
    self.workdir = os.fspath(workdir)
    os.makedirs(self.workdir, exist_ok=True)
    self.path = os.path.join(self.workdir, SAMPLES_FILE)
    self._last_step = _prepare_jsonl(self.path, resume_step)
    self._file = None

  @property
  def last_step(self) -> int | None:
    """The step of the last row in the file, or None when it is empty."""
    return self._last_step

  def write(self, rows: Sequence[Mapping[str, Any]]) -> None:
    """Appends `rows` (each with an int "step", not decreasing) and flushes.

    Raises:
      ValueError: a row has no int "step" or goes back in steps (nothing is written).
    """
    last, lines = self._last_step, []
    for row in rows:
      step = row.get("step")
      if not isinstance(step, (int, np.integer)) or isinstance(step, bool):
        raise ValueError(f"sample row without an int 'step': {sorted(row)}")
      if last is not None and step < last:
        raise ValueError(f"step {step} is before the last written step {last}")
      last = int(step)
      lines.append(json.dumps(dict(row, step=last), ensure_ascii=False) + "\n")
    if not lines:
      return
    if self._file is None:
      self._file = open(self.path, "a", encoding="utf-8")
    self._file.write("".join(lines))
    self._file.flush()
    self._last_step = last

  def close(self) -> None:
    if self._file is not None and not self._file.closed:
      self._file.close()

  def __enter__(self) -> SamplesWriter:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def select_rows(reward: Any, group_id: Any, num: int, *, per_group: int = 3) -> list[int]:
  """The rows of a batch worth reading: groups with mixed rewards first.

  A group whose samples all got the same reward carries no signal for group-relative
  estimators (its advantages are all zero or all alike); one with mixed rewards shows what
  separated a good response from a bad one. Mixed groups come first (in group-id order), then
  the rest. Within a group rows alternate best, worst, second best, second worst, ... (by
  reward, ties in row order), so correct and wrong responses sit side by side.

  Args:
    reward: [B] rewards.
    group_id: [B] int group of each row.
    num: rows wanted at most.
    per_group: rows taken from one group at most.

  Returns:
    Up to `num` row indices, in display order.

  >>> select_rows([0, 0, 1, 1, 0, 1], [0, 0, 1, 1, 2, 2], 4, per_group=2)
  [5, 4, 0, 1]
  """
  reward, group_id, groups, mixed = _mixed_groups(reward, group_id)
  order = list(groups[mixed]) + list(groups[~mixed])
  out: list[int] = []
  for g in order:
    rows = np.flatnonzero(group_id == g)
    rows = rows[np.argsort(-reward[rows], kind="stable")]
    alternating = [rows[(i // 2) if i % 2 == 0 else len(rows) - 1 - i // 2]
                   for i in range(len(rows))]
    out.extend(int(r) for r in alternating[:max(1, per_group)])
    if len(out) >= num:
      break
  return out[:max(0, num)]


def has_mixed_group(reward: Any, group_id: Any) -> bool:
  """Some group got different rewards for its samples."""
  return bool(np.any(_mixed_groups(reward, group_id)[3]))


def _mixed_groups(reward, group_id):
  """(reward [B], group_id [B], the group ids [K] sorted, mixed [K] bool)."""
  reward = np.asarray(reward, np.float64).reshape(-1)
  group_id = np.asarray(group_id).reshape(-1)
  if reward.shape != group_id.shape:
    raise ValueError(f"reward {reward.shape} and group_id {group_id.shape} differ")
  groups, inverse = np.unique(group_id, return_inverse=True)
  hi = np.full(groups.shape, -np.inf)
  lo = np.full(groups.shape, np.inf)
  np.maximum.at(hi, inverse, reward)
  np.minimum.at(lo, inverse, reward)
  return reward, group_id, groups, hi > lo


def short_text(text: str, max_chars: int = 40) -> str:
  """`text` on one line (whitespace runs as one space), cut to `max_chars` with "…"."""
  text = " ".join(str(text).split())
  return text if len(text) <= max_chars else text[:max(1, max_chars - 1)] + "\u2026"


# --------------------------------------------------------------------------
# Progress bar.
# --------------------------------------------------------------------------

# (label shown, metric key) pairs for the postfix.
DEFAULT_POSTFIX = (("reward", "reward_mean"), ("acc", "accuracy"), ("s/step", "step_time"))


def _fmt(value: float) -> str:
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return f"{value:.4g}"


def write_message(message: str, file=None) -> None:
  """Prints a progress message (default: stdout) with `tqdm.write`, which clears and redraws
  any live tqdm bar around it, so messages and the bar never interleave."""
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  tqdm.write(message, file=sys.stdout if file is None else file)


class ProgressBar:
  """A tqdm bar over training steps with live metrics in the postfix.

  Args:
    total: the last step of the run.
    initial: the step the run starts from (the restored step on resume).
    desc: text before the bar.
    disable: True hides the bar; None (default) hides it when `file` is not a
      TTY (CI logs, tests); False always shows it.
    fields: (label, metric key) pairs shown in the postfix when present.
    file: the stream (default stderr).
  """

  def __init__(self, total: int, *, initial: int = 0, desc: str = "train",
               disable: bool | None = None,
               fields: Sequence[tuple[str, str]] = DEFAULT_POSTFIX, file=None):
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    file = sys.stderr if file is None else file
    if disable is None:
      disable = not (hasattr(file, "isatty") and file.isatty())
    self.disabled = bool(disable)
    self.fields = tuple(fields)
    self.postfix: dict[str, str] = {}
    self._bar = tqdm(total=total, initial=initial, desc=desc, disable=self.disabled,
                     file=file, dynamic_ncols=True, unit="step")
    self._n = initial

  def update(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
    """Moves the bar to `step` and shows the fields present in `metrics`."""
    step = int(step)
    if metrics:
      for label, key in self.fields:
        if key in metrics:
          self.postfix[label] = _fmt(_to_scalar(key, metrics[key]))
    if not self.disabled:
      if self.postfix:
        self._bar.set_postfix(self.postfix, refresh=False)
      self._bar.update(step - self._n)
    self._n = step

  def write(self, message: str) -> None:
    """Prints a line on stdout without breaking the bar (shown whether or not the bar is)."""
    write_message(message)

  def close(self) -> None:
    self._bar.close()

  def __enter__(self) -> ProgressBar:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


# --------------------------------------------------------------------------
# Plots.
# --------------------------------------------------------------------------


def _figure(width: float, height: float):
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  return Figure(figsize=(width, height), layout="constrained")


def _series(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
  pts = [(row["step"], float(row[key])) for row in rows
         if key in row and row[key] is not None and math.isfinite(float(row[key]))]
  if not pts:
    return np.zeros(0), np.zeros(0)
  steps, values = zip(*pts)
  return np.asarray(steps, np.float64), np.asarray(values, np.float64)


def _moving_average(y: np.ndarray, window: int) -> np.ndarray:
  kernel = np.ones(window) / window
  # Valid part only, then pad the start with the running mean.
  head = np.cumsum(y[:window - 1]) / np.arange(1, window)
  return np.concatenate([head, np.convolve(y, kernel, mode="valid")])


def plot_curves(metrics_jsonl_path: str | os.PathLike, out_png: str | os.PathLike,
                keys: Sequence[str] = DEFAULT_CURVE_KEYS, *, title: str | None = None,
                dpi: int = 110) -> list[str]:
  """Plots metric curves against the step, one subplot per key present.

  Sparse series (fewer than 30 points, e.g. periodic eval) are drawn with
  markers; dense ones (per-step training metrics) as a faint raw line plus a
  moving average over max(5, 1/20 of the points). Non-finite values are left out.
  The default keys are what a reader of a run checks first: train reward and
  accuracy, held-out accuracy (step 0 included), mean response length, loss,
  step time. A timing series whose first point (the compiling step) dwarfs the rest is
  drawn without it, its value written in the panel's corner.

  Args:
    metrics_jsonl_path: a file written by `MetricsWriter`.
    out_png: where the PNG goes (written atomically).
    keys: metric names to plot; names without any finite value are skipped.
    title: figure title.
    dpi: resolution.

  Returns:
    The keys that were plotted. When none is present the PNG says so.
  """
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top
  rows = read_metrics(metrics_jsonl_path)
  series = {k: _series(rows, k) for k in keys}
  present = [k for k in keys if series[k][0].size]
  ncols = max(1, min(len(present), 3))
  nrows = max(1, math.ceil(len(present) / ncols))
  fig = _figure(4.2 * ncols, 3.0 * nrows)
  axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
  for ax, key in zip(axes, present):
    x, y = series[key]
    if "time" in key and y.size > 2 and y[0] > 3 * np.max(y[1:]):
      # The first step compiles: drawn without it, its value written in the panel.
      ax.set_title(f"step {int(x[0])} (compiling): {_fmt(float(y[0]))}", fontsize=7,
                   loc="right")
      x, y = x[1:], y[1:]
    if x.size < 30:
      ax.plot(x, y, marker="o", markersize=3, linewidth=1.2)
    else:
      window = max(5, x.size // 20)
      ax.plot(x, y, linewidth=0.8, alpha=0.35, label="raw")
      ax.plot(x, _moving_average(y, window), linewidth=1.6,
              label=f"moving avg ({window})")
      ax.legend(fontsize=7, loc="best")
    ax.set_title(key, fontsize=10)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
  for ax in axes[len(present):]:
    ax.set_axis_off()
  if not present:
    axes[0].text(0.5, 0.5, f"no data for {', '.join(keys)}", ha="center",
                 va="center", transform=axes[0].transAxes)
  if title:
    fig.suptitle(title)
  _save_figure_atomic(fig, out_png, dpi)
  return present


_VISIBLE = {"\n": "\u21b5", "\t": "\u2192", "\r": "\u240d", " ": "\u00b7"}


def _visible_token(token: str, max_chars: int) -> str:
  text = "".join(_VISIBLE.get(ch, ch) for ch in token)
  if not text:
    text = "\u2205"
  if len(text) > max_chars:
    text = text[:max_chars - 1] + "\u2026"
  return text


def plot_token_credit(out_png: str | os.PathLike, tokens: Sequence[Sequence[str]],
                      advantages: Sequence[Any], *,
                      title: str = "Per-token advantages",
                      labels: Sequence[str] | None = None, wrap: int = 20,
                      max_tokens: int = 160, max_chars: int = 7,
                      vmax: float | None = None, dpi: int = 110,
                      observations: Sequence[Any] | None = None) -> None:
  """Draws sampled responses as token grids coloured by advantage.

  Each response is wrapped into rows of `wrap` tokens; a cell shows the token
  text (spaces as "·", newlines as "↵") on a diverging colour (blue positive,
  red negative, white zero) with the scale symmetric around 0; a colorbar
  gives the values. Responses are labelled on the left and, when one spans
  several rows, separated by an empty row.

  Args:
    out_png: where the PNG goes (written atomically).
    tokens: per response, its token strings (e.g. `tokenizer.decode([id])` of
      each response token).
    advantages: per response, a 1-D array of the same length as its tokens.
    title: figure title.
    labels: per response, a short label (e.g. "12+34= r=1"); default "#i".
    wrap: tokens per row at most (fewer when the longest response is shorter); the figure
      is sized to the grid and the labels.
    max_tokens: tokens shown per response; longer ones are cut (marked "…").
    max_chars: characters shown per token.
    vmax: colour scale limit; default the largest |advantage| shown.
    dpi: resolution.
    observations: per response, a bool per token: True for environment tokens of a
      multi-turn episode (they get no advantage and are drawn grey, in italics, so the
      policy's turns stand apart).

  Raises:
    ValueError: lengths of `tokens`, `advantages` or `labels` disagree.
  """
  from matplotlib import colors  # pylint: disable=g-import-not-at-top
  from matplotlib import colormaps  # pylint: disable=g-import-not-at-top
  if len(tokens) != len(advantages):
    raise ValueError(f"{len(tokens)} token lists but {len(advantages)} advantage arrays")
  if labels is not None and len(labels) != len(tokens):
    raise ValueError(f"{len(labels)} labels for {len(tokens)} responses")
  if not tokens:
    raise ValueError("nothing to plot")
  responses: list[list[tuple[str, float]]] = []
  obs_cells: set = set()  # (response, index) of observation tokens
  for i, (toks, adv) in enumerate(zip(tokens, advantages)):
    adv = np.asarray(adv, np.float64)
    if adv.ndim != 1 or adv.shape[0] != len(toks):
      raise ValueError(f"response {i}: {len(toks)} tokens but advantages of "
                       f"shape {adv.shape}")
    if observations is not None:
      flags = np.asarray(observations[i], bool)
      if flags.shape != (len(toks),):
        raise ValueError(f"response {i}: {len(toks)} tokens but {flags.shape} observation flags")
      adv = np.where(flags, math.nan, adv)
      obs_cells.update((i, j) for j in np.flatnonzero(flags[:max_tokens]))
    cells = [(_visible_token(t, max_chars), a) for t, a in
             zip(toks[:max_tokens], adv[:max_tokens])]
    if len(toks) > max_tokens:
      cells.append(("\u2026", math.nan))
    responses.append(cells or [("(empty)", math.nan)])
  # No wider than the longest response: short answers get a narrow grid, not empty columns.
  wrap = max(1, min(wrap, max(len(cells) for cells in responses)))
  label_texts = [labels[i] if labels is not None else f"#{i}" for i in range(len(tokens))]
  grid_rows: list[list[tuple[str, float]]] = []
  label_rows: list[tuple[int, str]] = []
  grey: list[tuple[int, int]] = []  # grid (row, column) of observation cells
  multi_row = any(len(cells) > wrap for cells in responses)
  for i, (cells, label) in enumerate(zip(responses, label_texts)):
    if grid_rows and multi_row:
      grid_rows.append([])  # separator between responses that span several rows
    label_rows.append((len(grid_rows), label))
    for start in range(0, len(cells), wrap):
      grey += [(len(grid_rows), j - start) for j in range(start, min(start + wrap, len(cells)))
               if (i, j) in obs_cells]
      grid_rows.append(cells[start:start + wrap])

  values = np.full((len(grid_rows), wrap), np.nan)
  for r, row in enumerate(grid_rows):
    for c, (_, a) in enumerate(row):
      values[r, c] = a
  finite = values[np.isfinite(values)]
  if vmax is None:
    vmax = float(np.max(np.abs(finite))) if finite.size else 1.0
  vmax = vmax if vmax > 0 else 1.0
  norm = colors.Normalize(vmin=-vmax, vmax=vmax)
  cmap = colormaps["RdBu"].with_extremes(bad="white")

  # Size from the content: cells, the widest label, the colorbar; at least the title's width.
  label_width = 0.06 * max(len(t) for t in label_texts)
  width = max(0.62 * wrap + label_width + 1.5, 0.085 * len(title) + 0.8)
  fig = _figure(width, 0.34 * len(grid_rows) + 1.3)
  ax = fig.add_subplot()
  image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, norm=norm,
                    aspect="auto", interpolation="nearest")
  from matplotlib.patches import Rectangle  # pylint: disable=g-import-not-at-top
  for r, c in grey:
    ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, color="0.85", linewidth=0))
  grey_set = set(grey)
  for r, row in enumerate(grid_rows):
    for c, (text, a) in enumerate(row):
      dark = math.isfinite(a) and abs(a) / vmax > 0.6
      obs = (r, c) in grey_set
      ax.text(c, r, text, ha="center", va="center", fontsize=7,
              color="white" if dark else ("0.3" if obs else "black"),
              style="italic" if obs else "normal", parse_math=False)
  # Thin cell borders on filled cells only.
  for r, row in enumerate(grid_rows):
    if row:
      ax.hlines([r - 0.5, r + 0.5], -0.5, len(row) - 0.5, color="0.85", linewidth=0.4)
      ax.vlines(np.arange(len(row) + 1) - 0.5, r - 0.5, r + 0.5, color="0.85",
                linewidth=0.4)
  ax.set_yticks([r for r, _ in label_rows], [lab for _, lab in label_rows], fontsize=8)
  ax.set_xticks([])
  for spine in ax.spines.values():
    spine.set_visible(False)
  ax.tick_params(length=0)
  ax.set_title(title, fontsize=10)
  fig.colorbar(image, ax=ax, label="advantage", fraction=0.04, pad=0.02)
  _save_figure_atomic(fig, out_png, dpi)


# --------------------------------------------------------------------------
# Summary table.
# --------------------------------------------------------------------------

_LOWER_IS_BETTER_HINTS = ("loss", "kl", "time", "error", "grad_norm")


def _default_lower_is_better(key: str) -> bool:
  return any(hint in key.lower() for hint in _LOWER_IS_BETTER_HINTS)


def summary_table(metrics_rows: Sequence[Mapping[str, Any]], keys: Sequence[str], *,
                  lower_is_better: Collection[str] | Callable[[str], bool] | None = None
                  ) -> str:
  """A markdown table with the first, last and best value of each metric.

  Args:
    metrics_rows: rows as returned by `read_metrics` (each with "step").
    keys: metrics to list, in this order; a key with no finite value gets a
      row of dashes.
    lower_is_better: which metrics are minimised: a collection of names or a
      predicate. Default: names containing "loss", "kl", "time", "error" or
      "grad_norm".

  Returns:
    The table as a string ending in a newline.
  """
  if lower_is_better is None:
    is_min = _default_lower_is_better
  elif callable(lower_is_better):
    is_min = lower_is_better
  else:
    names = frozenset(lower_is_better)
    is_min = names.__contains__
  lines = ["| metric | first | last | best | best step | goal | points |",
           "|---|---:|---:|---:|---:|:---:|---:|"]
  for key in keys:
    steps, values = _series(metrics_rows, key)
    goal = "min" if is_min(key) else "max"
    if not values.size:
      lines.append(f"| {key} | – | – | – | – | {goal} | 0 |")
      continue
    best = int(np.argmin(values) if goal == "min" else np.argmax(values))
    lines.append(f"| {key} | {_fmt(values[0])} | {_fmt(values[-1])} | "
                 f"{_fmt(values[best])} | {int(steps[best])} | {goal} | {values.size} |")
  return "\n".join(lines) + "\n"


# (metric key, what the before / after table calls it)
_EVAL_ROWS = (("eval_accuracy", "held-out accuracy (greedy)"),
              ("eval_mean_at_k", "held-out mean@k (sampled)"),
              ("eval_pass_at_k", "held-out pass@k (sampled)"))
_TRAIN_ROWS = (("reward_mean", "train reward"), ("accuracy", "train accuracy"),
               ("response_length", "mean response length (tokens)"))
SUMMARY_KEYS = ("reward_mean", "accuracy", "eval_accuracy", "eval_mean_at_k", "eval_pass_at_k",
                "response_length", "loss", "step_time")


def _span(first: float, last: float) -> str:
  first, last = int(first), int(last)
  return f"step {first}" if first == last else f"steps {first}\u2013{last}"


def before_after_table(metrics_rows: Sequence[Mapping[str, Any]], *, window: int = 10) -> str:
  """A markdown table of where the run started and where it ended.

  Held-out metrics (eval_*): the first evaluation (the starting policy at step 0) against the
  last. Training metrics (reward, accuracy, response length): the mean over the first
  `window` steps against the mean over the last `window` (fewer when the run has under
  2 x `window` steps, so the two never overlap). Metrics absent from the rows are left out.

  Returns:
    The table as a string ending in a newline ("" when no metric is present).
  """
  lines = []
  for key, name in _EVAL_ROWS:
    steps, values = _series(metrics_rows, key)
    if values.size:
      lines.append((name, values[0], values[-1],
                    f"{_span(steps[0], steps[0])} \u2192 {_span(steps[-1], steps[-1])}"))
  for key, name in _TRAIN_ROWS:
    steps, values = _series(metrics_rows, key)
    if values.size:
      w = min(window, max(1, values.size // 2))
      lines.append((f"{name}, mean of {w} step{'s' if w > 1 else ''}", values[:w].mean(),
                    values[-w:].mean(),
                    f"{_span(steps[0], steps[w - 1])} \u2192 {_span(steps[-w], steps[-1])}"))
  if not lines:
    return ""
  out = ["| | before | after | change | measured at |", "|---|---:|---:|---:|---|"]
  for name, before, after, where in lines:
    out.append(f"| {name} | {_fmt(float(before))} | {_fmt(float(after))} | "
               f"{float(after - before):+.4g} | {where} |")
  return "\n".join(out) + "\n"


def _seconds(value: float) -> str:
  if abs(value) >= 10:
    return f"{value:.1f}"
  return f"{value:.2f}" if abs(value) >= 0.01 else f"{value:.1g}"


def time_table(metrics_rows: Sequence[Mapping[str, Any]]) -> str:
  """Markdown tables of where the wall time went.

  Reads the runner's clock fields: ``wall_time`` (seconds since the run began, resumed runs
  included, on every row), ``warm_up_time`` and ``eval_time`` on the step-0 row (SFT warm-up
  with the step-0 checkpoint; the starting policy's evaluation), ``eval_time`` on later
  evaluation rows, and the per-step ``step_time`` with its ``time_<phase>`` parts (averaged
  over the steps after the first, which compiles).

  Returns:
    The tables as a string ("" when the rows have no timing).
  """
  out = []
  _, wall = _series(metrics_rows, "wall_time")
  if wall.size:
    total = float(wall.max())
    start = [r for r in metrics_rows if r["step"] == 0]
    first = lambda k: next((float(r[k]) for r in start if k in r), 0.0)  # noqa: E731
    wall0 = max((float(r["wall_time"]) for r in start if "wall_time" in r), default=0.0)
    sft, eval0 = first("warm_up_time"), first("eval_time")
    steps = float(_series(metrics_rows, "step_time")[1].sum())
    evals = float(sum(float(r["eval_time"]) for r in metrics_rows
                      if r["step"] > 0 and "eval_time" in r))
    rl = total - wall0
    parts = (("total (start to last step)", total),
             ("setup (model, data, compile, restore)", wall0 - sft - eval0),
             ("SFT warm-up (with the step-0 checkpoint)", sft),
             ("evaluation of the starting policy", eval0),
             ("RL", rl),
             ("\u2003RL steps (sum of step_time)", steps),
             ("\u2003evaluations", evals),
             ("\u2003checkpoints, logging, other", rl - steps - evals))
    out += ["| wall time | seconds | share |", "|---|---:|---:|"]
    out += [f"| {name} | {_seconds(v)} | {100 * v / total if total > 0 else 0:.0f}% |"
            for name, v in parts]
    out.append("")
  steps, step = _series(metrics_rows, "step_time")
  if step.size:
    # The first step compiles: the steady mean leaves it out (when there are others).
    rows = [r for r in metrics_rows if "step_time" in r]
    if len(rows) > 1:
      rows = rows[1:]
      header = (f"step time (mean of {_span(steps[1], steps[-1])}; step {int(steps[0])}, "
                f"compiling, took {_seconds(float(step[0]))} s)")
    else:
      header = "step time"
    mean = float(_series(rows, "step_time")[1].mean())
    phases = []
    for row in rows:
      phases += [k for k in row if k.startswith("time_") and k not in phases]
    out += [f"| {header} | seconds | share |", "|---|---:|---:|",
            f"| step_time | {_seconds(mean)} | 100% |"]
    for key in phases:
      v = float(_series(rows, key)[1].mean())
      out.append(f"| {key} | {_seconds(v)} | {100 * v / mean if mean > 0 else 0:.0f}% |")
    out.append("")
  return "\n".join(out)


def run_summary(metrics_rows: Sequence[Mapping[str, Any]], *, title: str,
                settings: Mapping[str, Any] | None = None, keys: Sequence[str] = SUMMARY_KEYS,
                window: int = 10) -> str:
  """The text of a run's ``summary.md``: settings, before / after, wall time, per metric.

  Args:
    metrics_rows: rows as returned by `read_metrics`.
    title: the heading.
    settings: name -> value of the config essentials (estimator, loss, task, steps, seed).
    keys: metrics of the first / last / best table (`summary_table`), those present.
    window: steps averaged at each end for the training rows of `before_after_table`.

  Returns:
    Plain markdown.
  """
  parts = [f"# {title}\n"]
  if settings:
    parts.append("| setting | value |\n|---|---|\n" + "".join(
        f"| {k} | {v} |\n" for k, v in settings.items()))
  before_after = before_after_table(metrics_rows, window=window)
  if before_after:
    parts.append("## Before / after\n\n" + before_after)
  times = time_table(metrics_rows)
  if times:
    parts.append("## Time\n\n" + times)
  present = [k for k in keys if any(k in r for r in metrics_rows)]
  parts.append("## Metrics (first / last / best)\n\n" + summary_table(metrics_rows, present))
  return "\n".join(parts)
