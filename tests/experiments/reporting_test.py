"""Tests for experiments/reporting.py: JSONL + TensorBoard, progress, plots, summary."""
import glob
import itertools
import io
import json
import os
import struct

import jax.numpy as jnp
import numpy as np
import pytest

from experiments import reporting as rp

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _metrics(step):
  """Deterministic metrics of a step, in the types a runner passes."""
  return {"reward_mean": jnp.float32(step / 10.0),
          "accuracy": np.float32(step % 3 / 2.0),
          "loss": 1.0 / step,
          "num_tokens": np.int64(100 + step),
          "clipped": jnp.asarray([step % 2 == 0])}


def _read_tfrecords(path):
  """Payloads of a TFRecord file (length, crc, data, crc per record)."""
  out = []
  with open(path, "rb") as f:
    data = f.read()
  pos = 0
  while pos < len(data):
    (length,) = struct.unpack("<Q", data[pos:pos + 8])
    assert data[pos + 8:pos + 12] == _masked_crc(data[pos:pos + 8])
    payload = data[pos + 12:pos + 12 + length]
    assert data[pos + 12 + length:pos + 16 + length] == _masked_crc(payload)
    out.append(payload)
    pos += 12 + length + 4
  return out


def _masked_crc(data):
  """tensorboardX's own masked CRC-32C: an implementation independent of ours."""
  from tensorboardX.record_writer import masked_crc32c
  return struct.pack("<I", masked_crc32c(data))


def test_crc32c_check_values():
  """The CRC-32C check value (RFC 3720 B.4) and an all-zero 32-byte block."""
  from experiments.tb_events import crc32c
  assert crc32c(b"123456789") == 0xE3069283
  assert crc32c(bytes(32)) == 0x8A9136AA


def _tb_events(tb_dir):
  from tensorboardX.proto import event_pb2
  events = []
  for path in sorted(glob.glob(os.path.join(tb_dir, "*tfevents*"))):
    for payload in _read_tfrecords(path):
      ev = event_pb2.Event()
      ev.ParseFromString(payload)
      events.append(ev)
  return events


def test_jsonl_rows_types_and_flush(tmp_path):
  with rp.MetricsWriter(tmp_path, tensorboard=False) as mw:
    row = mw.write(1, _metrics(1))
    # Flushed: readable before close.
    assert rp.read_metrics(tmp_path / rp.METRICS_FILE) == [row]
    mw.write(2, _metrics(2))
    mw.write(2, {"eval_accuracy": jnp.float32(0.75)})
    mw.write(3, {"nan_metric": float("nan")})
  rows = rp.read_metrics(tmp_path / rp.METRICS_FILE)
  assert rows[0] == {"step": 1, "reward_mean": pytest.approx(0.1), "accuracy": 0.5,
                     "loss": 1.0, "num_tokens": 101, "clipped": False}
  assert type(rows[0]["num_tokens"]) is int and type(rows[1]["clipped"]) is bool
  assert rows[1]["clipped"] is True
  assert rows[2] == {"step": 2, "eval_accuracy": 0.75}
  assert np.isnan(rows[3]["nan_metric"])
  lines = (tmp_path / rp.METRICS_FILE).read_text().splitlines()
  assert len(lines) == 4 and all(json.loads(l)["step"] for l in lines)


def test_rejects_non_scalars_and_decreasing_steps(tmp_path):
  with rp.MetricsWriter(tmp_path, tensorboard=False) as mw:
    mw.write(5, {"a": 1})
    with pytest.raises(TypeError, match="'b'"):
      mw.write(6, {"a": 1, "b": jnp.ones(3)})
    with pytest.raises(TypeError, match="'s'"):
      mw.write(6, {"s": "text"})
    with pytest.raises(ValueError, match="before the last"):
      mw.write(4, {"a": 1})
    with pytest.raises(ValueError, match="reserved"):
      mw.write(6, {"step": 1})
  assert rp.read_metrics(tmp_path / rp.METRICS_FILE) == [{"step": 5, "a": 1}]


def test_resume_truncates_to_restored_step_and_matches_uninterrupted(tmp_path, caplog):
  full, resumed = tmp_path / "full", tmp_path / "resumed"
  with rp.MetricsWriter(full, tensorboard=False) as mw:
    for s in range(1, 11):
      mw.write(s, _metrics(s))
  # Interrupted run: got to step 8, last line half written, checkpoint at 5.
  with rp.MetricsWriter(resumed, tensorboard=False) as mw:
    for s in range(1, 9):
      mw.write(s, _metrics(s))
  with open(resumed / rp.METRICS_FILE, "a") as f:
    f.write('{"step": 9, "reward_mea')
  with rp.MetricsWriter(resumed, resume_step=5, tensorboard=False) as mw:
    assert mw.last_step == 5
    assert [r["step"] for r in rp.read_metrics(resumed / rp.METRICS_FILE)] == [1, 2, 3, 4, 5]
    for s in range(6, 11):
      mw.write(s, _metrics(s))
  assert (resumed / rp.METRICS_FILE).read_bytes() == (full / rp.METRICS_FILE).read_bytes()
  assert not glob.glob(str(resumed / "*.tmp*"))
  # A fresh run in the same directory starts an empty file.
  with rp.MetricsWriter(resumed, tensorboard=False) as mw:
    assert mw.last_step is None
    mw.write(1, {"a": 2})
  assert rp.read_metrics(resumed / rp.METRICS_FILE) == [{"step": 1, "a": 2}]


def test_tensorboard_event_file_holds_scalars_and_purge_on_resume(tmp_path, monkeypatch):
  # Both files in the same second, and the process's writer count crossing a digit (9 -> 10)
  # between them: their names must still sort in creation order (TensorBoard reads a
  # directory's files by name).
  from experiments import tb_events
  monkeypatch.setattr(tb_events, "_counter", itertools.count(9))
  monkeypatch.setattr(tb_events.time, "time", lambda: 1_800_000_000.0)
  with rp.MetricsWriter(tmp_path) as mw:
    for s in range(1, 4):
      mw.write(s, _metrics(s))
  files = glob.glob(str(tmp_path / rp.TB_DIR / "*tfevents*"))
  assert len(files) == 1 and os.path.getsize(files[0]) > 0
  events = _tb_events(tmp_path / rp.TB_DIR)
  scalars = {(v.tag, ev.step): v.simple_value
             for ev in events for v in ev.summary.value}
  assert scalars[("reward_mean", 2)] == pytest.approx(0.2)
  assert scalars[("loss", 3)] == pytest.approx(1 / 3)
  assert scalars[("num_tokens", 1)] == 101
  assert scalars[("clipped", 2)] == 1.0
  # Resume at step 2: TensorBoard is told to drop the old events from step 3 on.
  with rp.MetricsWriter(tmp_path, resume_step=2) as mw:
    mw.write(3, {"reward_mean": 9.0})
  events = _tb_events(tmp_path / rp.TB_DIR)
  starts = [ev.step for ev in events if ev.HasField("session_log")
            and ev.session_log.status == ev.session_log.START]
  assert starts == [3]
  assert [v.simple_value for ev in events for v in ev.summary.value
          if v.tag == "reward_mean" and ev.step == 3][-1] == 9.0


def test_progress_bar_postfix_and_disable(tmp_path):
  stream = io.StringIO()  # not a TTY: disabled by default
  with rp.ProgressBar(10, file=stream) as bar:
    bar.update(1, {"reward_mean": jnp.float32(0.25), "accuracy": 0.5, "step_time": 1.23456})
    assert bar.disabled
    assert bar.postfix == {"reward": "0.25", "acc": "0.5", "s/step": "1.235"}
  assert stream.getvalue() == ""
  stream = io.StringIO()
  with rp.ProgressBar(10, initial=3, file=stream, disable=False) as bar:
    bar.update(7, {"reward_mean": 0.5, "accuracy": 0.125, "other": 3})
  out = stream.getvalue()
  assert "7/10" in out and "reward=0.5" in out and "acc=0.125" in out
  assert "other" not in out


def _check_png(path):
  from matplotlib import image as mpimg
  data = open(path, "rb").read()
  assert data[:8] == PNG_MAGIC and len(data) > 1000
  img = mpimg.imread(path)
  assert img.ndim == 3 and img.shape[2] in (3, 4) and min(img.shape[:2]) > 100
  assert not glob.glob(os.path.join(os.path.dirname(path), "*.tmp*"))
  return img


def test_plot_curves_png(tmp_path):
  with rp.MetricsWriter(tmp_path, tensorboard=False) as mw:
    for s in range(1, 121):
      mw.write(s, {"reward_mean": np.sin(s / 10) + s / 100, "accuracy": s / 120})
      if s % 20 == 0:
        mw.write(s, {"eval_accuracy": s / 150})
  out = tmp_path / "plots" / "curves.png"
  keys = rp.plot_curves(tmp_path / rp.METRICS_FILE, out)
  assert keys == ["reward_mean", "accuracy", "eval_accuracy"]
  img = _check_png(out)
  assert img.shape[1] > img.shape[0]  # three panels side by side
  keys = rp.plot_curves(tmp_path / rp.METRICS_FILE, tmp_path / "one.png",
                        keys=("accuracy", "missing"))
  assert keys == ["accuracy"]
  _check_png(tmp_path / "one.png")
  assert rp.plot_curves(tmp_path / rp.METRICS_FILE, tmp_path / "none.png",
                        keys=("missing",)) == []
  _check_png(tmp_path / "none.png")


def test_plot_token_credit_png_colours(tmp_path):
  tokens = [["The", " answer", " is", " $x$", "\n", "42", "."],
            ["I", " think", " 17", "<|endoftext|>"] + [" pad"] * 30]
  advantages = [np.array([0.1, 0.2, 0.1, -0.3, 0.0, 1.5, 0.2]),
                np.concatenate([[-1.0, -0.5, -1.2, 0.0], np.full(30, -0.1)])]
  out = tmp_path / "credit.png"
  rp.plot_token_credit(out, tokens, advantages, labels=["r=1", "r=0"], wrap=12)
  img = _check_png(out)[..., :3]
  r, g, b = img[..., 0], img[..., 1], img[..., 2]
  assert np.sum((b - r > 0.3) & (b > 0.4)) > 50   # strong positive cells (blue)
  assert np.sum((r - b > 0.3) & (r > 0.4)) > 50   # strong negative cells (red)
  with pytest.raises(ValueError, match="response 1"):
    rp.plot_token_credit(out, tokens, [advantages[0], advantages[1][:5]])
  with pytest.raises(ValueError, match="labels"):
    rp.plot_token_credit(out, tokens, advantages, labels=["a"])


def test_summary_table(tmp_path):
  rows = [{"step": 1, "reward_mean": 0.2, "loss": 3.0},
          {"step": 2, "reward_mean": 0.9, "loss": 1.0, "eval_accuracy": 0.5},
          {"step": 3, "reward_mean": 0.7, "loss": float("nan")},
          {"step": 4, "reward_mean": 0.8, "loss": 2.0}]
  table = rp.summary_table(rows, ["reward_mean", "loss", "eval_accuracy", "absent"])
  lines = table.splitlines()
  assert lines[0] == "| metric | first | last | best | best step | goal | points |"
  assert lines[2] == "| reward_mean | 0.2 | 0.8 | 0.9 | 2 | max | 4 |"
  assert lines[3] == "| loss | 3 | 2 | 1 | 2 | min | 3 |"
  assert lines[4] == "| eval_accuracy | 0.5 | 0.5 | 0.5 | 2 | max | 1 |"
  assert lines[5] == "| absent | – | – | – | – | max | 0 |"
  explicit = rp.summary_table(rows, ["reward_mean"], lower_is_better={"reward_mean"})
  assert "| reward_mean | 0.2 | 0.8 | 0.2 | 1 | min | 4 |" in explicit
  rp.write_text_atomic(tmp_path / "summary.md", table)
  assert (tmp_path / "summary.md").read_text() == table
  assert os.listdir(tmp_path) == ["summary.md"]


def _run_rows(steps=40, eval_every=10):
  """Rows shaped like a runner's metrics.jsonl: step-0 eval with timings, per-step training
  metrics with time_* parts and wall_time, periodic eval rows."""
  rows = [{"step": 0, "eval_accuracy": 0.1, "eval_reward": 0.1, "eval_pass_at_k": 0.3,
           "eval_time": 2.0, "warm_up_time": 5.0, "wall_time": 10.0}]
  wall = 10.0
  for s in range(1, steps + 1):
    step_time = 20.0 if s == 1 else 1.0
    wall += step_time
    row = {"step": s, "reward_mean": s / steps, "accuracy": s / (2 * steps),
           "response_length": 30.0 - s / 4, "loss": 1.0 / s, "step_time": step_time,
           "time_sampling": 0.6 * step_time, "time_update": 0.4 * step_time,
           "time_overhead": 0.0}
    if s % eval_every == 0:
      row.update(eval_accuracy=0.1 + s / 100, eval_pass_at_k=0.3 + s / 100, eval_time=0.5)
      wall += 0.5
    row["wall_time"] = wall
    rows.append(row)
  return rows


def test_plot_curves_draws_what_a_run_records(tmp_path):
  with rp.MetricsWriter(tmp_path, tensorboard=False) as mw:
    for row in _run_rows(steps=80):
      mw.write(row["step"], {k: v for k, v in row.items() if k != "step"})
  keys = rp.plot_curves(tmp_path / rp.METRICS_FILE, tmp_path / "curves.png")
  assert keys == ["reward_mean", "accuracy", "eval_accuracy", "eval_pass_at_k",
                  "response_length", "loss", "step_time"]  # pass@k in the held-out panel
  img = _check_png(tmp_path / "curves.png")
  assert img.shape[1] > img.shape[0]  # 3 x 2 panels


def test_samples_writer_appends_and_truncates_on_resume(tmp_path):
  def rows(step):
    return [{"step": step, "prompt": "12+34=", "response": "46", "response_ids": [8, 10, 2],
             "reward": float(i), "advantages": [0.5, -0.5, 0.0]} for i in range(2)]

  full, resumed = tmp_path / "full", tmp_path / "resumed"
  with rp.SamplesWriter(full) as sw:
    for s in (10, 20, 30):
      sw.write(rows(s))
  with rp.SamplesWriter(resumed) as sw:
    for s in (10, 20):
      sw.write(rows(s))
  with open(resumed / rp.SAMPLES_FILE, "a") as f:
    f.write('{"step": 30, "prom')  # killed mid-line after the step-15 checkpoint
  with rp.SamplesWriter(resumed, resume_step=15) as sw:
    assert sw.last_step == 10
    assert [r["step"] for r in rp.read_metrics(resumed / rp.SAMPLES_FILE)] == [10, 10]
    for s in (20, 30):
      sw.write(rows(s))
    with pytest.raises(ValueError, match="before the last"):
      sw.write(rows(5))
    with pytest.raises(ValueError, match="int 'step'"):
      sw.write([{"prompt": "x"}])
  assert (resumed / rp.SAMPLES_FILE).read_bytes() == (full / rp.SAMPLES_FILE).read_bytes()
  assert rp.read_metrics(full / rp.SAMPLES_FILE)[1] == rows(10)[1]
  # Fresh run: emptied; with nothing written it stays empty.
  rp.SamplesWriter(resumed).close()
  assert rp.read_metrics(resumed / rp.SAMPLES_FILE) == []


def test_select_rows_prefers_mixed_groups_and_pairs_good_with_bad():
  # Group 0: all wrong; group 1: mixed; group 2: all right; group 3: mixed.
  reward = np.array([0, 0, 0, 0, 1, 0, 1, 0, 1, 1, 1, 1, 0, 0, 0, 1], np.float32)
  group = np.repeat(np.arange(4), 4)
  rows = rp.select_rows(reward, group, 6, per_group=3)
  assert rows == [4, 7, 6, 15, 14, 12]
  assert [int(group[r]) for r in rows] == [1, 1, 1, 3, 3, 3]
  assert reward[rows[0]] == 1 and reward[rows[1]] == 0  # good and bad side by side
  # More rows than the mixed groups hold: the uniform groups follow.
  rows = rp.select_rows(reward, group, 8, per_group=2)
  assert [int(group[r]) for r in rows] == [1, 1, 3, 3, 0, 0, 2, 2]
  assert rp.has_mixed_group(reward, group)
  assert not rp.has_mixed_group(np.ones(4), np.array([0, 0, 1, 1]))
  assert rp.select_rows(np.ones(4), np.array([0, 0, 1, 1]), 3, per_group=2) == [0, 1, 2]
  assert rp.select_rows(reward, group, 0) == []
  assert rp.short_text("What  is\n 12+34?", 40) == "What is 12+34?"
  assert rp.short_text("x" * 50, 40) == "x" * 39 + "\u2026"


def test_plot_token_credit_fits_short_responses(tmp_path):
  """Short answers: the grid is as wide as the longest response, not `wrap` columns."""
  tokens = [["4", "6", "<eos>"], ["4", "7", "<eos>"], ["9", "<eos>"]]
  advantages = [np.array([1.0, 0.5, 0.2]), np.array([-1.0, -0.5, -0.2]), np.array([0.0, -1.0])]
  labels = [rp.short_text("A very long word problem about clips sold in April and May") + " r=1",
            "12+34= r=0", "12+34= r=0"]
  out = tmp_path / "short.png"
  rp.plot_token_credit(out, tokens, advantages, labels=labels, wrap=20)
  narrow = _check_png(out)
  rp.plot_token_credit(out, [t * 7 for t in tokens], [np.tile(a, 7) for a in advantages],
                       labels=labels, wrap=20)
  wide = _check_png(out)
  assert narrow.shape[1] < 0.7 * wide.shape[1], (narrow.shape, wide.shape)


def test_run_summary_before_after_and_time(tmp_path):
  rows = _run_rows(steps=40)
  text = rp.run_summary(rows, title="grpo / ppo_clip on arithmetic",
                        settings={"estimator": "grpo", "seed": 0})
  assert text.startswith("# grpo / ppo_clip on arithmetic\n")
  assert "| estimator | grpo |" in text and "| seed | 0 |" in text
  lines = text.splitlines()
  row = lambda prefix: next(l for l in lines if l.startswith(prefix))  # noqa: E731
  # Held-out: the starting policy (step 0) against the last evaluation.
  assert row("| held-out accuracy (greedy) |") == (
      "| held-out accuracy (greedy) | 0.1 | 0.5 | +0.4 | step 0 \u2192 step 40 |")
  assert row("| held-out pass@k") == "| held-out pass@k (sampled) | 0.3 | 0.7 | +0.4 | step 0 \u2192 step 40 |"
  # Training: first 10 steps against the last 10.
  assert row("| train reward, mean of 10 steps |") == (
      "| train reward, mean of 10 steps | 0.1375 | 0.8875 | +0.75 | "
      "steps 1\u201310 \u2192 steps 31\u201340 |")
  assert row("| mean response length (tokens)").split(" | ")[1:3] == ["28.62", "21.12"]
  assert "mean@k" not in text  # absent metrics are left out
  # Wall time: total from the clock, the step-0 parts, RL = steps + evals + other.
  assert row("| total (start to last step) |") == "| total (start to last step) | 71.0 | 100% |"
  assert row("| SFT warm-up") == "| SFT warm-up (with the step-0 checkpoint) | 5.00 | 7% |"
  assert row("| setup") == "| setup (model, data, compile, restore) | 3.00 | 4% |"
  assert row("| RL |") == "| RL | 61.0 | 86% |"
  assert row("| \u2003RL steps") == "| \u2003RL steps (sum of step_time) | 59.0 | 83% |"
  assert row("| \u2003evaluations") == "| \u2003evaluations | 2.00 | 3% |"
  assert row("| \u2003checkpoints") == "| \u2003checkpoints, logging, other | 0 | 0% |"
  # Step time without the compiling first step, with its parts.
  assert row("| step time (mean of steps 2\u201340; step 1, compiling, took 20.0 s)") is not None
  assert row("| step_time |") == "| step_time | 1.00 | 100% |"
  assert row("| time_sampling |") == "| time_sampling | 0.60 | 60% |"
  assert "| reward_mean | 0.025 | 1 | 1 | 40 | max | 40 |" in text
  # A short run: the windows shrink so they do not overlap.
  short = rp.before_after_table(_run_rows(steps=4, eval_every=2))
  assert "| train reward, mean of 2 steps | 0.375 | 0.875 | +0.5 | steps 1\u20132 \u2192 steps 3\u20134 |" in short
  assert rp.run_summary([], title="empty").startswith("# empty")
