"""What a run shows while it works (experiments/progress.py) and the report's plots that go with
it (curves panels, the token-credit caption, token_change.png). No model runs here: the tiny
end-to-end runs in runner_test.py and experiments_scale_test.py check the same files a real
run writes."""
import io
import json
import os

import numpy as np
import pytest

from experiments import progress
from experiments import reporting as rp

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_size(path):
  from matplotlib import image as mpimg
  with open(path, "rb") as f:
    assert f.read(8) == PNG_MAGIC
  return mpimg.imread(path).shape[:2]


def test_auto_every_and_durations():
  assert [progress.auto_every(n) for n in (0, 1, 2, 20, 21, 150, 2500)] == [1, 1, 1, 1, 2, 8,
                                                                           125]
  assert progress.auto_every(2500, 7) == 7
  assert progress.duration(0.4) == "0.40 s" and progress.duration(75) == "1 min 15 s"


def test_off_a_terminal_a_plain_line_every_n_steps_with_interval_means(tmp_path):
  lines, log = io.StringIO(), progress.RunLog(tmp_path, header="test run")
  bar = progress.ProgressBar(10, desc="RL", file=io.StringIO(), every=4, log=log,
                             line_fields=progress.RL_LINE_FIELDS, line_file=lines)
  assert bar.disabled and not bar.live  # a StringIO is not a terminal
  for step in range(1, 11):
    bar.update(step, {"reward_mean": float(step), "accuracy": 0.5, "loss": np.float32(2.0),
                      "response_length": 3})
  bar.close()
  log.close()
  out = lines.getvalue().splitlines()
  assert [l.split(" | ")[0] for l in out] == [
      "[credit] RL 4/10 (40%) reward 2.5 acc 0.5 len 3 loss 2",   # mean of steps 1-4
      "[credit] RL 8/10 (80%) reward 6.5 acc 0.5 len 3 loss 2",   # mean of steps 5-8
      "[credit] RL 10/10 (100%) reward 9.5 acc 0.5 len 3 loss 2"]  # the last step
  assert "left" in out[0] and "/step" in out[0] and "left" not in out[-1]
  text = (tmp_path / progress.LOG_FILE).read_text().splitlines()
  assert "==== start: test run" in text[0]
  assert [l.split(" ", 2)[2] for l in text[1:]] == [l[len("[credit] "):] for l in out]


def test_resumed_bar_counts_from_its_start_and_quiet_shows_nothing(tmp_path):
  lines = io.StringIO()
  bar = progress.ProgressBar(6, initial=4, desc="RL", file=io.StringIO(), every=2,
                             line_file=lines)
  bar.update(4)  # the restored step itself: no line
  bar.update(5, {"reward_mean": 1.0})
  bar.update(6, {"reward_mean": 0.0})
  assert [l.split(" | ")[0] for l in lines.getvalue().splitlines()] == [
      "[credit] RL 6/6 (100%) reward 0.5"]
  quiet, log = io.StringIO(), progress.RunLog(tmp_path)
  bar = progress.ProgressBar(2, file=io.StringIO(), line_file=quiet, log=log, quiet=True)
  bar.update(1, {"reward_mean": 1.0})
  bar.update(2, {"reward_mean": 1.0})
  log.close()
  assert quiet.getvalue() == ""
  assert len((tmp_path / progress.LOG_FILE).read_text().splitlines()) == 1  # the header


def test_bar_on_a_terminal_and_the_log_gets_the_lines(tmp_path):
  class Terminal(io.StringIO):
    def isatty(self):
      return True

  term, lines, log = Terminal(), io.StringIO(), progress.RunLog(tmp_path)
  bar = progress.ProgressBar(4, desc="warm-up", file=term, fields=progress.WARMUP_FIELDS,
                             every=2, log=log, line_file=lines)
  assert bar.live
  for step in range(1, 5):
    bar.update(step, {"sft_loss": 4.0 - step})
  bar.close()
  log.close()
  assert "warm-up" in term.getvalue() and "loss=0" in term.getvalue()
  assert lines.getvalue() == ""  # the bar instead of plain lines
  logged = (tmp_path / progress.LOG_FILE).read_text()
  assert "warm-up 2/4 (50%) loss 2.5 |" in logged and "warm-up 4/4 (100%) loss 0.5 |" in logged


def test_run_log_appends_across_starts(tmp_path):
  for header in ("first", "second"):
    log = progress.RunLog(tmp_path, header=header)
    progress.say(f"hello from {header}", log, file=io.StringIO())
    log.close()
  text = (tmp_path / progress.LOG_FILE).read_text().splitlines()
  assert [l.split(" ", 2)[2] for l in text][::2] == [
      f"==== start: first (pid {os.getpid()})", f"==== start: second (pid {os.getpid()})"]
  assert text[1].endswith("hello from first") and text[3].endswith("hello from second")


def test_eval_line():
  assert progress.eval_line(0, {"eval_accuracy": 0.453}) == (
      "eval at step 0: held-out accuracy 0.453 (greedy)")
  line = progress.eval_line(25, {"eval_accuracy": 0.9, "eval_pass_at_k": 1.0,
                                 "eval_mean_at_k": 0.75, "eval_turns": 2.5},
                            seconds=3.0, num_prompts=128, samples=8)
  assert line == ("eval at step 25: held-out accuracy 0.900 (greedy, 128 prompts), pass@8 "
                  "1.000, mean@8 0.750, 2.50 turns, 3.00 s")


def _write_run(tmp_path, *, binary: bool, kl: bool):
  """metrics.jsonl and warmup.jsonl shaped like a run's."""
  with rp.MetricsWriter(tmp_path, tensorboard=False) as mw:
    mw.write(0, {"eval_accuracy": 0.4, "eval_pass_at_k": 0.8})
    for s in range(1, 41):
      acc = (s % 3) / 2
      row = {"reward_mean": acc if binary else acc + 0.1, "accuracy": acc,
             "response_length": 4.0, "loss": 1.0 / s, "approx_kl": 1e-3 * s, "clipfrac": 0.01,
             "grad_norm": 0.5, "sampled_entropy": 1.0 - s / 80, "step_time": 0.4}
      if kl:
        row["kl"] = 2e-3 * s
      if s % 20 == 0:
        row.update(eval_accuracy=0.4 + s / 100, eval_pass_at_k=0.8)
      mw.write(s, row)
  with open(tmp_path / progress.WARMUP_FILE, "w") as f:
    for s in range(1, 101):
      f.write(json.dumps({"step": s, "sft_loss": 3.0 / s, "grad_norm": 1.0}) + "\n")
      if binary and s in (50, 100):  # checks of sft_min_accuracy
        f.write(json.dumps({"step": s, "eval_accuracy": s / 200}) + "\n")


@pytest.mark.parametrize("binary", [True, False])
def test_curves_draw_one_panel_per_recorded_quantity(tmp_path, binary):
  _write_run(tmp_path, binary=binary, kl=not binary)
  out = tmp_path / "curves.png"
  keys = rp.plot_curves(tmp_path / rp.METRICS_FILE, out, warmup=tmp_path / progress.WARMUP_FILE)
  want = (["sft_loss"] + (["warmup_eval_accuracy"] if binary else []) + ["reward_mean"] + ([] if binary else ["accuracy"])
          + ["eval_accuracy", "eval_pass_at_k", "response_length", "loss"]
          + ([] if binary else ["kl"]) + ["approx_kl", "sampled_entropy", "clipfrac",
                                          "grad_norm", "step_time"])
  assert keys == want  # reward = accuracy under binary rewards: one panel; no entropy pass
  h, w = _png_size(out)
  assert w > h
  if binary:  # without warm-up rows there is no warm-up panel
    keys = rp.plot_curves(tmp_path / rp.METRICS_FILE, tmp_path / "no_warmup.png", warmup=[])
    assert "sft_loss" not in keys and keys[0] == "reward_mean"


def test_credit_caption_says_what_the_estimator_puts_per_token(tmp_path):
  flat = [np.full(4, 0.7), np.full(3, -0.7)]
  varying = [np.array([0.0, 0.0, 1.2]), np.full(3, -0.3)]
  assert "sequence-level" in rp.credit_caption("grpo", flat, family="outcome")
  assert rp.credit_caption("grpo", flat, family="outcome").startswith("grpo (outcome): ")
  assert "token-level" in rp.credit_caption("dgpo", varying)
  out = tmp_path / "credit.png"
  rp.plot_token_credit(out, [list("12<"), list("1x")], [np.ones(3), -np.ones(2)],
                       caption=rp.credit_caption("grpo", flat, family="outcome"))
  plain = tmp_path / "plain.png"
  rp.plot_token_credit(plain, [list("12<"), list("1x")], [np.ones(3), -np.ones(2)])
  assert _png_size(out)[0] > _png_size(plain)[0]  # the caption's lines below the grid


def test_token_change_by_position_plot_and_table(tmp_path):
  delta = [np.array([0.1, 0.3, 0.0]), np.array([0.3, 0.1]),    # right answers
           np.array([0.0, -2.0, -0.5]), np.array([0.0, -1.0])]  # wrong ones
  correct = [True, True, False, False]
  by = rp.token_change_by_position(delta, correct)
  np.testing.assert_allclose(by["right"], [0.2, 0.2, 0.0])
  np.testing.assert_allclose(by["wrong"], [0.0, -1.5, -0.5])
  assert by["right_n"].tolist() == [2, 2, 1] and by["wrong_n"].tolist() == [2, 2, 1]
  table = rp.token_change_table(delta, correct).splitlines()
  assert table[2:] == ["| 0 | +0.200 (2) | +0.000 (2) |", "| 1 | +0.200 (2) | -1.500 (2) |",
                       "| 2 | +0.000 (1) | -0.500 (1) |"]
  tokens = [["1", "2", "<eos>"], ["9", "<eos>"], ["1", "5", "<eos>"], ["7", "<eos>"]]
  out = tmp_path / "token_change.png"
  rp.plot_token_change(out, tokens, delta, correct, prompts=["5+7=", "3+6=", "67+58=", "9-2="],
                       title="where learning happened", samples=1)
  h, w = _png_size(out)
  assert w > h > 100
  # Only wrong answers (nothing learnt yet): still a plot, one line.
  rp.plot_token_change(tmp_path / "wrong.png", tokens[2:], delta[2:], correct[2:])
  with pytest.raises(ValueError, match="2 delta arrays but 1 correct"):
    rp.token_change_by_position(delta[:2], correct[:1])


def test_npz_round_trip(tmp_path):
  path = tmp_path / "probe.npz"
  arrays = {"tokens": np.arange(6, dtype=np.int32).reshape(2, 3), "rows": 2,
            "prompt": np.asarray(["1+1=", "2+2="])}
  rp.write_npz_atomic(path, arrays)
  back = rp.read_npz(path)
  assert int(back["rows"]) == 2 and back["prompt"].tolist() == ["1+1=", "2+2="]
  np.testing.assert_array_equal(back["tokens"], arrays["tokens"])
  assert rp.read_npz(tmp_path / "missing.npz") is None
  assert os.listdir(tmp_path) == ["probe.npz"]
