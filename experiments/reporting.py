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
* `ProgressBar`, `write_message`: in `experiments.progress` (a bar on a terminal, plain
  lines and log.txt elsewhere); importable from here too.
* `plot_curves` (one panel per recorded quantity, the warm-up's loss included),
  `plot_token_credit` (responses coloured by advantage, with `credit_caption` saying what
  the estimator put per token), `plot_token_change` (where a per-token quantity moved, right
  and wrong answers apart): PNGs drawn with matplotlib's object API
  (`matplotlib.figure.Figure`, Agg canvas), so importing this module changes
  no global pyplot backend.
* `select_rows`: which rollouts of a step to show (groups with mixed rewards first).
* `summary_table`: a markdown table of first / last / best value per metric;
  `run_summary`: the whole ``summary.md`` (before / after, wall time, that table).
* `write_run_report`: what a finished run leaves for its reader (the plots and
  ``summary.md``) from the files it wrote.

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
from typing import Any, NamedTuple

import numpy as np

from experiments import progress, tb_events

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
TB_DIR = "tb"


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
# Progress (in experiments/progress.py; these names stay importable from here).
# --------------------------------------------------------------------------

DEFAULT_POSTFIX = progress.DEFAULT_POSTFIX
ProgressBar = progress.ProgressBar
write_message = progress.write_message


def _fmt(value: float) -> str:
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return f"{value:.4g}"


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


# (panel title, the metric keys drawn in it). A panel is drawn when a key of it was recorded.
CURVE_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("train reward", ("reward_mean",)),
    ("train accuracy", ("accuracy",)),
    ("held-out accuracy", ("eval_accuracy", "eval_pass_at_k", "eval_mean_at_k")),
    ("response length (tokens)", ("response_length",)),
    ("loss", ("loss",)),
    ("KL (nats/token)", ("kl", "approx_kl")),
    ("entropy (nats/token)", ("entropy", "sampled_entropy")),
    ("clip fraction", ("clipfrac",)),
    ("grad norm", ("grad_norm",)),
    ("step time (s)", ("step_time",)),
)
DEFAULT_CURVE_KEYS = tuple(k for _, keys in CURVE_PANELS for k in keys)
# What a line is, where a panel holds several.
CURVE_LABELS = {"eval_accuracy": "greedy", "eval_pass_at_k": "pass@k (sampled)",
                "eval_mean_at_k": "mean@k (sampled)", "kl": "to the reference (KL term)",
                "approx_kl": "behaviour \u2192 updated policy", "entropy": "policy (loss pass)",
                "sampled_entropy": "\u2212log \u03c0 of the sampled tokens"}


def _same_series(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> bool:
  return a[0].shape == b[0].shape and np.array_equal(a[0], b[0]) and np.allclose(a[1], b[1])


def _draw_series(ax, x: np.ndarray, y: np.ndarray, *, label: str | None, color) -> None:
  """Sparse series (< 30 points) with markers; dense ones raw (faint) plus a moving average
  over max(5, 1/20 of the points)."""
  if x.size < 30:
    ax.plot(x, y, marker="o", markersize=3, linewidth=1.2, color=color, label=label)
    return
  window = max(5, x.size // 20)
  ax.plot(x, y, linewidth=0.8, alpha=0.35, color=color, label=None if label else "raw")
  ax.plot(x, _moving_average(y, window), linewidth=1.6, color=color,
          label=f"{label}, moving avg ({window})" if label else f"moving avg ({window})")


def plot_curves(metrics_jsonl_path: str | os.PathLike, out_png: str | os.PathLike,
                keys: Sequence[str] | None = None, *,
                warmup: str | os.PathLike | Sequence[Mapping[str, Any]] | None = None,
                title: str | None = None, dpi: int = 110) -> list[str]:
  """Plots a run's curves against the step, one panel per quantity the run recorded.

  By default (`keys` None) the panels of `CURVE_PANELS`: train reward and accuracy, held-out
  accuracy (greedy, with pass@k and mean@k where measured; step 0 included), response length,
  loss, KL, entropy, clip fraction, grad norm, step time; before them the supervised warm-up's
  loss (`warmup`, against the warm-up step) and, when the warm-up was checked against
  `sft_min_accuracy`, its held-out accuracy at each check. A panel is drawn only when the run recorded one of
  its metrics. Train accuracy is left out when it equals the train reward at every step (binary
  rewards), the reward panel then saying so. Sparse series (fewer than 30 points, e.g.
  periodic eval) are drawn with markers; dense ones as a faint raw line plus a moving average
  over max(5, 1/20 of the points). Non-finite values are left out. A timing series whose first
  point (the compiling step) dwarfs the rest is drawn without it, its value written in the
  panel's corner.

  Args:
    metrics_jsonl_path: a file written by `MetricsWriter`.
    out_png: where the PNG goes (written atomically).
    keys: metric names, one panel each, instead of the default panels; names without any
      finite value are skipped.
    warmup: the warm-up's rows (`progress.WarmupRecord`'s file, or its rows): an "sft_loss"
      per warm-up step.
    title: figure title.
    dpi: resolution.

  Returns:
    The keys that were plotted, in panel order ("sft_loss" for the warm-up,
    "warmup_eval_accuracy" for its checks). When none is present the PNG says so.
  """
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top
  rows = read_metrics(metrics_jsonl_path)
  panels = [(k, (k,)) for k in keys] if keys is not None else list(CURVE_PANELS)
  series = {k: _series(rows, k) for _, ks in panels for k in ks}
  plan: list[tuple[str, list[tuple[str, tuple[np.ndarray, np.ndarray]]], str]] = []
  if warmup is not None:
    warm_rows = read_metrics(warmup) if isinstance(warmup, (str, os.PathLike)) else warmup
    w = _series(warm_rows, "sft_loss")
    if w[0].size:
      plan.append(("warm-up loss (SFT)", [("sft_loss", w)], "warm-up step"))
    w = _series(warm_rows, "eval_accuracy")  # the checks of sft_min_accuracy
    if w[0].size:
      plan.append(("warm-up checks: held-out accuracy", [("warmup_eval_accuracy", w)],
                   "warm-up step"))
  same = (keys is None and series["reward_mean"][0].size
          and _same_series(series["reward_mean"], series["accuracy"]))
  for name, ks in panels:
    if same and ks == ("accuracy",):
      continue
    if same and ks == ("reward_mean",):
      name = "train reward (= train accuracy)"
    drawn = [(k, series[k]) for k in ks if series[k][0].size]
    if len(ks) > 1 and len(drawn) == 1:  # say which of the panel's quantities it is
      name = f"{name}: {CURVE_LABELS.get(drawn[0][0], drawn[0][0])}"
    if drawn:
      plan.append((name, drawn, "step"))
  n = len(plan)
  ncols = max(1, min(n, 4 if n > 6 else 3))
  nrows = max(1, math.ceil(n / ncols))
  fig = _figure(4.2 * ncols, 3.0 * nrows)
  axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
  colors = [f"C{i}" for i in range(10)]
  for ax, (name, drawn, xlabel) in zip(axes, plan):
    for i, (key, (x, y)) in enumerate(drawn):
      if "time" in key and y.size > 2 and y[0] > 3 * np.max(y[1:]):
        # The first step compiles: drawn without it, its value written in the panel.
        ax.set_title(f"step {int(x[0])} (compiling): {_fmt(float(y[0]))}", fontsize=7,
                     loc="right")
        x, y = x[1:], y[1:]
      label = CURVE_LABELS.get(key, key) if len(drawn) > 1 else None
      _draw_series(ax, x, y, label=label, color=colors[i % len(colors)])
    if len(drawn) > 1 or max(x.size for _, (x, _) in drawn) >= 30:
      ax.legend(fontsize=7, loc="best")
    ax.set_title(name, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
  for ax in axes[n:]:
    ax.set_axis_off()
  if not plan:
    wanted = keys if keys is not None else [k for _, ks in panels for k in ks]
    axes[0].text(0.5, 0.5, f"no data for {', '.join(wanted)}", ha="center",
                 va="center", transform=axes[0].transAxes)
  if title:
    fig.suptitle(title)
  _save_figure_atomic(fig, out_png, dpi)
  return [k for _, drawn, _ in plan for k, _ in drawn]


_VISIBLE = {"\n": "\u21b5", "\t": "\u2192", "\r": "\u240d", " ": "\u00b7"}


def _visible_token(token: str, max_chars: int) -> str:
  text = "".join(_VISIBLE.get(ch, ch) for ch in token)
  if not text:
    text = "\u2205"
  if len(text) > max_chars:
    text = text[:max_chars - 1] + "\u2026"
  return text


def token_label(tokenizer: Any, token_id: int) -> str:
  """One response token as the token plots write it: its text, or <eos> / <id> (a byte
  fragment or control character of a BPE tokenizer)."""
  if token_id == tokenizer.eos_id:
    return "<eos>"
  text = tokenizer.decode([token_id])
  return text if text and (text.isprintable() or text.isspace()) else f"<{token_id}>"


class _Grid(NamedTuple):
  """Responses wrapped into a grid: rows of (text, value) cells, (grid row, label) pairs,
  the (row, column) cells of observation tokens, the [R, wrap] values (NaN where empty)."""
  rows: list
  labels: list
  grey: list
  values: np.ndarray
  wrap: int
  label_width: float


def _token_grid(tokens, values, labels, observations, *, wrap: int, max_tokens: int,
                max_chars: int, what: str = "advantages") -> _Grid:
  if len(tokens) != len(values):
    raise ValueError(f"{len(tokens)} token lists but {len(values)} {what} arrays")
  if labels is not None and len(labels) != len(tokens):
    raise ValueError(f"{len(labels)} labels for {len(tokens)} responses")
  if not tokens:
    raise ValueError("nothing to plot")
  responses: list[list[tuple[str, float]]] = []
  obs_cells: set = set()  # (response, index) of observation tokens
  for i, (toks, val) in enumerate(zip(tokens, values)):
    val = np.asarray(val, np.float64)
    if val.ndim != 1 or val.shape[0] != len(toks):
      raise ValueError(f"response {i}: {len(toks)} tokens but {what} of shape {val.shape}")
    if observations is not None:
      flags = np.asarray(observations[i], bool)
      if flags.shape != (len(toks),):
        raise ValueError(f"response {i}: {len(toks)} tokens but {flags.shape} observation flags")
      val = np.where(flags, math.nan, val)
      obs_cells.update((i, j) for j in np.flatnonzero(flags[:max_tokens]))
    cells = [(_visible_token(t, max_chars), a) for t, a in
             zip(toks[:max_tokens], val[:max_tokens])]
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
  grid = np.full((len(grid_rows), wrap), np.nan)
  for r, row in enumerate(grid_rows):
    for c, (_, a) in enumerate(row):
      grid[r, c] = a
  return _Grid(grid_rows, label_rows, grey, grid, wrap,
               0.06 * max(len(t) for t in label_texts))


def _draw_token_grid(ax, grid: _Grid, vmax: float | None):
  """Draws `grid` on `ax` (diverging colours symmetric around 0); returns the image."""
  from matplotlib import colors  # pylint: disable=g-import-not-at-top
  from matplotlib import colormaps  # pylint: disable=g-import-not-at-top
  from matplotlib.patches import Rectangle  # pylint: disable=g-import-not-at-top
  finite = grid.values[np.isfinite(grid.values)]
  if vmax is None:
    vmax = float(np.max(np.abs(finite))) if finite.size else 1.0
  vmax = vmax if vmax > 0 else 1.0
  norm = colors.Normalize(vmin=-vmax, vmax=vmax)
  cmap = colormaps["RdBu"].with_extremes(bad="white")
  image = ax.imshow(np.ma.masked_invalid(grid.values), cmap=cmap, norm=norm,
                    aspect="auto", interpolation="nearest")
  for r, c in grid.grey:
    ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, color="0.85", linewidth=0))
  grey_set = set(grid.grey)
  for r, row in enumerate(grid.rows):
    for c, (text, a) in enumerate(row):
      dark = math.isfinite(a) and abs(a) / vmax > 0.6
      obs = (r, c) in grey_set
      ax.text(c, r, text, ha="center", va="center", fontsize=7,
              color="white" if dark else ("0.3" if obs else "black"),
              style="italic" if obs else "normal", parse_math=False)
  # Thin cell borders on filled cells only.
  for r, row in enumerate(grid.rows):
    if row:
      ax.hlines([r - 0.5, r + 0.5], -0.5, len(row) - 0.5, color="0.85", linewidth=0.4)
      ax.vlines(np.arange(len(row) + 1) - 0.5, r - 0.5, r + 0.5, color="0.85",
                linewidth=0.4)
  ax.set_yticks([r for r, _ in grid.labels], [lab for _, lab in grid.labels], fontsize=8)
  ax.set_xticks([])
  for spine in ax.spines.values():
    spine.set_visible(False)
  ax.tick_params(length=0)
  return image


def _wrapped(text: str, width_in: float) -> str:
  """`text` wrapped to about the characters of 8-point type that fit `width_in` inches."""
  import textwrap  # pylint: disable=g-import-not-at-top
  return "\n".join(textwrap.wrap(text, max(30, int(width_in / 0.075))))


def credit_caption(estimator: str, advantages: Sequence[Any], *, family: str = "") -> str:
  """What an estimator put per token in the responses a heatmap shows: one value per response
  (every token of a row shares it: sequence-level credit) or values that vary along a
  response (token-level credit).

  >>> credit_caption("grpo", [np.full(3, 0.5), np.full(2, -0.5)], family="outcome")[:58]
  'grpo (outcome): one advantage per response, the same on ev'
  """
  rows = [np.asarray(a, np.float64) for a in advantages]
  rows = [a[np.isfinite(a)] for a in rows]
  flat = all(a.size == 0 or np.ptp(a) <= 1e-6 * max(1.0, float(np.max(np.abs(a))))
             for a in rows)
  name = f"{estimator} ({family})" if family else estimator
  if flat:
    return (f"{name}: one advantage per response, the same on every token of it "
            "(sequence-level credit); blue rows are pushed up, red rows down")
  return (f"{name}: an advantage per token, varying along a response (token-level credit); "
          "blue tokens are pushed up, red tokens down")


def plot_token_credit(out_png: str | os.PathLike, tokens: Sequence[Sequence[str]],
                      advantages: Sequence[Any], *,
                      title: str = "Per-token advantages",
                      labels: Sequence[str] | None = None, wrap: int = 20,
                      max_tokens: int = 160, max_chars: int = 7,
                      vmax: float | None = None, dpi: int = 110,
                      observations: Sequence[Any] | None = None,
                      caption: str | None = None) -> None:
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
    caption: a sentence under the grid (e.g. `credit_caption`: what the estimator puts per
      token), wrapped to the figure's width.

  Raises:
    ValueError: lengths of `tokens`, `advantages` or `labels` disagree.
  """
  grid = _token_grid(tokens, advantages, labels, observations, wrap=wrap,
                     max_tokens=max_tokens, max_chars=max_chars)
  # Size from the content: cells, the widest label, the colorbar; at least the title's width.
  width = max(0.62 * grid.wrap + grid.label_width + 1.5, 0.085 * len(title) + 0.8)
  text = _wrapped(caption, width) if caption else ""
  fig = _figure(width, 0.34 * len(grid.rows) + 1.3 + 0.16 * (text.count("\n") + 1 if text else 0))
  ax = fig.add_subplot()
  image = _draw_token_grid(ax, grid, vmax)
  ax.set_title(title, fontsize=10)
  if text:
    ax.set_xlabel(text, fontsize=8)
  fig.colorbar(image, ax=ax, label="advantage", fraction=0.04, pad=0.02)
  _save_figure_atomic(fig, out_png, dpi)


# --------------------------------------------------------------------------
# Where learning happened: per-token log-prob change on a fixed batch.
# --------------------------------------------------------------------------


def token_change_by_position(delta: Sequence[Any], correct: Sequence[bool]
                             ) -> dict[str, np.ndarray]:
  """Mean per-token change by response position, for right and wrong responses apart.

  Args:
    delta: per response, a 1-D array (e.g. log π_end(y_t) − log π_start(y_t) of its tokens).
    correct: per response, whether it was right.

  Returns:
    {"position": [L] 0..L-1, "right": [L] mean over the right responses long enough (NaN
    where none is), "right_n": [L] their count, "wrong", "wrong_n": the same for the wrong}.

  >>> out = token_change_by_position([np.array([1.0, 2.0]), np.array([-1.0])], [True, False])
  >>> out["right"].tolist(), out["wrong"].tolist(), out["wrong_n"].tolist()
  ([1.0, 2.0], [-1.0, nan], [1, 0])
  """
  if len(delta) != len(correct):
    raise ValueError(f"{len(delta)} delta arrays but {len(correct)} correct flags")
  rows = [np.asarray(d, np.float64).reshape(-1) for d in delta]
  length = max((r.size for r in rows), default=0)
  out: dict[str, np.ndarray] = {"position": np.arange(length)}
  for name, want in (("right", True), ("wrong", False)):
    total, count = np.zeros(length), np.zeros(length, np.int64)
    for r, ok in zip(rows, correct):
      if bool(ok) == want:
        total[:r.size] += np.where(np.isfinite(r), r, 0.0)
        count[:r.size] += np.isfinite(r)
    out[name] = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    out[f"{name}_n"] = count
  return out


def token_change_table(delta: Sequence[Any], correct: Sequence[bool], *,
                       max_positions: int = 12) -> str:
  """A markdown table of `token_change_by_position` (first `max_positions` positions)."""
  by = token_change_by_position(delta, correct)
  cell = lambda m, n: f"{m:+.3f} ({n})" if n else "\u2013"  # noqa: E731
  lines = ["| response position | right answers: mean change (n) | wrong answers: mean change "
           "(n) |", "|---:|---:|---:|"]
  for p in by["position"][:max_positions]:
    lines.append(f"| {p} | {cell(by['right'][p], by['right_n'][p])} | "
                 f"{cell(by['wrong'][p], by['wrong_n'][p])} |")
  return "\n".join(lines) + "\n"


def _most_changed(delta, correct, want: bool, num: int) -> list[int]:
  """Up to `num` responses with `correct == want`, largest total |change| first."""
  rows = [i for i, ok in enumerate(correct) if bool(ok) == want]
  size = [float(np.nansum(np.abs(np.asarray(delta[i], np.float64)))) for i in rows]
  return [rows[j] for j in np.argsort(size, kind="stable")[::-1][:num]]


def plot_token_change(out_png: str | os.PathLike, tokens: Sequence[Sequence[str]],
                      delta: Sequence[Any], correct: Sequence[bool], *,
                      prompts: Sequence[str] | None = None, title: str = "",
                      samples: int = 2, wrap: int = 20, dpi: int = 110) -> None:
  """Where learning happened: a per-token change on fixed responses, right against wrong.

  Top: the mean change at each response position, for the right and the wrong responses
  apart (the count of each in the legend). Below: the `samples` right and `samples` wrong
  responses that changed most (largest total |change|), their tokens coloured by the change
  (blue up, red down, symmetric scale).

  Args:
    out_png: where the PNG goes (written atomically).
    tokens: per response, its token strings.
    delta: per response, a 1-D array with the change at each of its tokens (e.g.
      log π_end(y_t) − log π_start(y_t)).
    correct: per response, whether it was right.
    prompts: per response, its prompt (for the labels).
    title: figure title.
    samples: right and wrong responses drawn as tokens, each.
    wrap: tokens per grid row at most.
    dpi: resolution.
  """
  by = token_change_by_position(delta, correct)
  show = _most_changed(delta, correct, True, samples) + _most_changed(delta, correct, False,
                                                                     samples)
  labels = [f"{'right' if correct[i] else 'wrong'}: "
            f"{short_text(prompts[i]) if prompts is not None else f'#{i}'}" for i in show]
  grid = (_token_grid([tokens[i] for i in show], [delta[i] for i in show], labels, None,
                      wrap=wrap, max_tokens=160, max_chars=7, what="delta")
          if show else None)
  grid_w = 0.62 * grid.wrap + grid.label_width + 1.5 if grid else 0.0
  width = max(7.0, grid_w, 0.075 * len(title) + 0.8)
  grid_h = 0.34 * len(grid.rows) + 1.0 if grid else 0.0
  fig = _figure(width, 3.0 + grid_h)
  top, bottom = fig.subfigures(2, 1, height_ratios=[3.0, grid_h]) if grid else (fig, None)
  ax = top.add_subplot()
  for name, color in (("right", "C0"), ("wrong", "C3")):
    keep = by[f"{name}_n"] > 0
    n = int(sum(1 for ok in correct if bool(ok) == (name == "right")))
    if keep.any():
      ax.plot(by["position"][keep], by[name][keep], marker="o", markersize=3, color=color,
              label=f"{name} answers (n={n})")
  ax.axhline(0.0, color="0.5", linewidth=0.8)
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax.set_xlabel("response position (token)")
  ax.set_ylabel("mean change")
  ax.grid(alpha=0.3)
  if by["position"].size:
    ax.legend(fontsize=8, loc="best")
  ax.set_title(_wrapped(title, width) if title else "", fontsize=9)
  if grid:  # cells as in the token-credit heatmap, centred under the curve
    pad = (width - grid_w) / 2 + 1e-3
    axg = bottom.add_subplot(bottom.add_gridspec(1, 3, width_ratios=[pad, grid_w, pad])[0, 1])
    image = _draw_token_grid(axg, grid, None)
    bottom.colorbar(image, ax=axg, label="change", fraction=0.04, pad=0.02)
    right = sum(1 for i in show if correct[i])
    axg.set_xlabel(_wrapped(f"the answers that changed most ({right} right, "
                            f"{len(show) - right} wrong; blue: more likely now, red: less "
                            "likely)", grid_w), fontsize=8)
  _save_figure_atomic(fig, out_png, dpi)


def write_npz_atomic(path: str | os.PathLike, arrays: Mapping[str, Any]) -> None:
  """numpy arrays to a .npz file via a temporary file and `os.replace`."""
  path = os.fspath(path)
  tmp = _tmp_name(path)
  try:
    with open(tmp, "wb") as f:
      np.savez(f, **{k: np.asarray(v) for k, v in arrays.items()})
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def read_npz(path: str | os.PathLike) -> dict[str, np.ndarray] | None:
  """The arrays of a .npz file; None when it is missing or unreadable."""
  try:
    with np.load(os.fspath(path)) as f:
      return {k: f[k] for k in f.files}
  except (OSError, ValueError):
    return None


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


def before_after_table(metrics_rows: Sequence[Mapping[str, Any]], *, window: int = 10,
                       warmup_rows: Sequence[Mapping[str, Any]] = ()) -> str:
  """A markdown table of where the run started and where it ended.

  Held-out metrics (eval_*): the first evaluation (the starting policy at step 0) against the
  last. Training metrics (reward, accuracy, response length; the warm-up's loss from
  `warmup_rows`): the mean over the first `window` steps against the mean over the last
  `window` (fewer when there are under 2 x `window` steps, so the two never overlap). Metrics
  absent from the rows are left out.

  Returns:
    The table as a string ending in a newline ("" when no metric is present).
  """
  lines = []
  steps, values = _series(warmup_rows, "sft_loss")
  if values.size:
    w = min(window, max(1, values.size // 2))
    lines.append((f"SFT warm-up loss, mean of {w} step{'s' if w > 1 else ''}",
                  values[:w].mean(), values[-w:].mean(),
                  f"warm-up {_span(steps[0], steps[w - 1])} \u2192 "
                  f"{_span(steps[-w], steps[-1])}"))
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
                window: int = 10, warmup_rows: Sequence[Mapping[str, Any]] = (),
                sections: Mapping[str, str] | None = None) -> str:
  """The text of a run's ``summary.md``: settings, before / after, wall time, per metric.

  Args:
    metrics_rows: rows as returned by `read_metrics`.
    title: the heading.
    settings: name -> value of the config essentials (estimator, loss, task, steps, seed).
    keys: metrics of the first / last / best table (`summary_table`), those present.
    window: steps averaged at each end for the training rows of `before_after_table`.
    warmup_rows: the warm-up's rows (`progress.WarmupRecord`), for its loss in that table.
    sections: heading -> markdown of further sections, after the time tables.

  Returns:
    Plain markdown.
  """
  parts = [f"# {title}\n"]
  if settings:
    parts.append("| setting | value |\n|---|---|\n" + "".join(
        f"| {k} | {v} |\n" for k, v in settings.items()))
  before_after = before_after_table(metrics_rows, window=window, warmup_rows=warmup_rows)
  if before_after:
    parts.append("## Before / after\n\n" + before_after)
  times = time_table(metrics_rows)
  if times:
    parts.append("## Time\n\n" + times)
  for heading, text in (sections or {}).items():
    parts.append(f"## {heading}\n\n{text}")
  present = [k for k in keys if any(k in r for r in metrics_rows)]
  parts.append("## Metrics (first / last / best)\n\n" + summary_table(metrics_rows, present))
  return "\n".join(parts)


# --------------------------------------------------------------------------
# The run's report.
# --------------------------------------------------------------------------


def write_token_credit(workdir: str, c, tokenizer: Any, batch: Any, *, family: str = "") -> None:
  """token_credit.png: up to `c.num_heatmap_samples` responses of `batch` (the runner's
  `StepBatch`: step, host arrays, adv, prompts, mixed), three per group from groups with
  mixed rewards first (good and bad side by side), each labelled with its prompt and reward;
  the caption says what the estimator (of `family`) put per token (`credit_caption`)."""
  host = batch.host
  toks, advs, labels = [], [], []
  obs_all = host.get("obs_mask")
  obs = [] if obs_all is not None else None
  for i in select_rows(host["reward"], host["group_id"], c.num_heatmap_samples, per_group=3):
    m = host["response_mask"][i]
    if obs is not None:  # multi-turn: observations shown in place, greyed
      m = m | obs_all[i]
      obs.append(obs_all[i][m])
    toks.append([token_label(tokenizer, int(t)) for t in host["tokens"][i][m]])
    advs.append(batch.adv[i][m])
    labels.append(f"{short_text(batch.prompts[int(host['group_id'][i])])} "
                  f"r={float(host['reward'][i]):g}")
  note = "" if batch.mixed else " (no group with mixed rewards)"
  plot_token_credit(os.path.join(workdir, "token_credit.png"), toks, advs,
                    labels=labels, observations=obs,
                    title=f"{c.estimator}: per-token advantages, step {batch.step}{note}",
                    caption=credit_caption(c.estimator, advs, family=family))


def write_token_change(workdir: str, tokenizer: Any, change: Mapping[str, Any], step: int) -> str:
  """token_change.png (`plot_token_change`) of the runner's probe: log π(y_t) after `step`
  RL steps minus under the starting policy, on the starting policy's greedy answers to the
  first held-out batch; returns summary.md's section (the mean change by position)."""
  n, resp = int(change["rows"]), change["response_mask"]
  delta = change["logprob_end"] - change["logprob_start"]
  toks = [[token_label(tokenizer, int(t)) for t in change["tokens"][i][resp[i]]]
          for i in range(n)]
  deltas = [delta[i][resp[i]] for i in range(n)]
  correct = [bool(r >= 1.0) for r in change["reward"][:n]]
  plot_token_change(
      os.path.join(workdir, "token_change.png"), toks, deltas, correct,
      prompts=[str(p) for p in change["prompt"][:n]],
      title=f"Where learning happened: log \u03c0(y_t) after RL step {step} minus under the "
            f"starting policy, on the starting policy's greedy answers to {n} held-out prompts")
  return (f"The change in log \u03c0(y_t) from the starting policy to the policy after step "
          f"{step}, on the starting policy's greedy answers to {n} held-out prompts "
          f"({sum(correct)} right, {n - sum(correct)} wrong), by response position "
          "(token_change.png draws it, with the answers that changed most):\n\n"
          + token_change_table(deltas, correct))


def run_settings(c) -> dict[str, Any]:
  """The config essentials summary.md opens with."""
  def with_kwargs(name, kwargs):
    kwargs = dict(kwargs)
    return f"{name} {kwargs}" if kwargs else name
  return {"estimator": with_kwargs(c.estimator, c.estimator_kwargs),
          "policy_loss": with_kwargs(c.policy_loss, c.loss_kwargs),
          "task": c.data_path if c.task in ("jsonl", "tfds") else c.task,
          "policy": c.init_from or c.warm_start_from or "from scratch", "steps": c.steps,
          "prompts x samples per step": f"{c.prompts_per_step} x {c.group_size}",
          "SFT warm-up steps": c.sft_steps, "seed": c.seed}


def run_headline(c) -> str:
  """The run in one line (log.txt's header)."""
  task = c.data_path if c.task in ("jsonl", "tfds") else c.task
  return (f"{c.estimator} / {c.policy_loss} on {task}, {c.sft_steps} warm-up + {c.steps} RL "
          f"steps, seed {c.seed}")


def write_run_report(workdir: str, c, tokenizer: Any, heatmap: Any, *,
                     change: Mapping[str, Any] | None = None, step: int = 0,
                     family: str = "", memory_plan: str = "") -> dict[str, Any]:
  """What a finished run leaves for its reader, from the files it wrote: curves.png (with the
  warm-up's loss), token_credit.png (`heatmap`, the runner's `StepBatch`, or None),
  token_change.png (`change`: the probe with its log-probs at both ends, or None) and
  summary.md (with `memory_plan`, the markdown of `experiments.memory.format_plan`, when given).

  Returns:
    {eval_accuracy_first, eval_accuracy_last, eval_accuracy_best, eval_best_step, rows}.
  """
  path = os.path.join(workdir, "metrics.jsonl")
  warm = read_metrics(os.path.join(workdir, progress.WARMUP_FILE))
  plot_curves(path, os.path.join(workdir, "curves.png"), warmup=warm)
  if heatmap is not None:
    write_token_credit(workdir, c, tokenizer, heatmap, family=family)
  sections = ({"Where learning happened": write_token_change(workdir, tokenizer, change, step)}
              if change is not None else {})
  if memory_plan:
    sections["Memory plan"] = memory_plan
  rows = read_metrics(path)
  write_text_atomic(os.path.join(workdir, "summary.md"), run_summary(
      rows, title=f"{c.estimator} / {c.policy_loss} on {c.task}", settings=run_settings(c),
      warmup_rows=warm, sections=sections))
  evals = [(r["eval_accuracy"], r["step"]) for r in rows if "eval_accuracy" in r]
  best = max(evals, key=lambda e: (e[0], -e[1])) if evals else (None, None)
  return {"eval_accuracy_first": evals[0][0] if evals else None,
          "eval_accuracy_last": evals[-1][0] if evals else None,
          "eval_accuracy_best": best[0], "eval_best_step": best[1], "rows": len(rows)}
