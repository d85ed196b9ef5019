"""Field producers of the runner: task span flags (`flag_mask`) and the teacher-forced answer
pass (`logprob_answer`, `answer_mask`, `logprob_answer_prior`), unit and end to end."""
import importlib
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from credit import tasks as tasks_lib
from credit.tasks import CharTokenizer, token_flags
from credit.tasks.char_tokenizer import prompt_ids
from experiments import loop, producers, train


def tiny(recipe="grpo_arithmetic", **overrides):
  c = importlib.import_module(f"experiments.configs.{recipe}").get_config("tiny")
  c.mesh = "data=1"
  for k, v in overrides.items():
    c[k] = v
  return c


def dots(flags):
  return "".join("#" if f else "." for f in flags)


# --------------------------------------------------------------------------
# Span flags.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("response,want", [
    ("125", "...."),     # correct: nothing flagged
    (" 125 ", "......"),  # the verifier strips whitespace: still correct
    ("115", ".###"),     # first wrong character onward, and the end
    ("12", "..#"),       # stops too early: only the end (its stop token)
    ("1256", "...##"),   # one character too many
    ("", "#"),           # empty response
    (" 135", "..###"),   # leading whitespace is skipped before the comparison
    ("-125", "#####"),
])
def test_arithmetic_flags_from_the_first_wrong_character(response, want):
  task = tasks_lib.get_task("arithmetic")
  assert dots(task.flag_chars({"prompt": "57+68=", "answer": "125"}, response)) == want


def test_token_flags_with_the_character_tokenizer():
  tok = CharTokenizer()
  ids = tok.encode("115", add_eos=True)
  assert dots(token_flags(tok, ids, [0, 1, 1, 1])) == ".###"
  assert dots(token_flags(tok, ids, [0, 1, 0, 0])) == ".#.."
  # The end flag lands on the stop token; a response cut at the budget has none.
  assert dots(token_flags(tok, tok.encode("12", add_eos=True), [0, 0, 1])) == "..#"
  assert dots(token_flags(tok, tok.encode("12"), [0, 0, 1])) == ".."
  # A special that decodes to nothing (bos mid-response) takes no flag and shifts nothing.
  ids = tok.encode("1") + [tok.bos_id] + tok.encode("5", add_eos=True)
  assert dots(token_flags(tok, ids, [0, 1, 1])) == "..##"
  with pytest.raises(ValueError, match="one per character and one for the end"):
    token_flags(tok, tok.encode("12"), [0, 0])


class _PieceTokenizer:
  """Multi-character tokens: id i decodes to PIECES[i]; id 0 is eos."""
  PIECES = ("", "12", "3", "456", "7")
  eos_id = 0

  def decode(self, ids):
    out = []
    for i in ids:
      if i == self.eos_id:
        break
      out.append(self.PIECES[i])
    return "".join(out)


def test_token_flags_cover_multi_character_tokens():
  tok = _PieceTokenizer()
  ids = [1, 2, 3, 0]  # "12" "3" "456" eos -> "123456"
  assert dots(token_flags(tok, ids, [0, 1, 0, 0, 0, 0, 0])) == "#..."
  assert dots(token_flags(tok, ids, [0, 0, 0, 0, 0, 1, 1])) == "..##"
  assert dots(token_flags(tok, ids, [0, 0, 0, 0, 0, 0, 1])) == "...#"


def test_flags_are_refused_at_setup_for_a_task_without_them():
  c = tiny(estimator="perceval", task="countdown")
  c.task_kwargs = {}
  with pytest.raises(loop.SetupError,
                     match=r"estimator 'perceval' needs \['flag_mask'\].*'task_flags'.*off"):
    loop.check_method(c)
  assert "task_flags" in [p.producer.name for p in loop.check_method(
      tiny(estimator="perceval")).plan]


# --------------------------------------------------------------------------
# The answer pass.
# --------------------------------------------------------------------------


def test_append_answer_layout():
  tokens = np.array([[5, 6, 7, 0], [5, 8, 0, 0]], np.int32)
  keep = np.array([[1, 1, 0, 0], [1, 1, 0, 0]], bool)  # row 0 drops its stop token 7
  ans = np.array([[9, 4], [9, 0]], np.int32)
  amask = np.array([[1, 1], [1, 0]], bool)
  seq, attn, pos = producers.append_answer(tokens, keep, ans, amask, pad_id=0)
  np.testing.assert_array_equal(seq, [[5, 6, 9, 4, 0, 0], [5, 8, 9, 0, 0, 0]])
  np.testing.assert_array_equal(attn, [[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]])
  np.testing.assert_array_equal(pos, [[2, 3], [2, 3]])


def _one_step_batch(c, workdir):
  """(runner, ctx, batch) after the planned producers of one step (no update)."""
  run, rs = loop.setup(c, workdir)
  ctx = loop._context(run, rs)
  batch = {}
  for stage in run.stages:
    batch.update(stage(rs.train, batch, ctx))
  return run, rs, ctx, batch


def test_answer_logprobs_match_direct_scoring_of_each_row(tmp_path):
  """logprob_answer[b] equals the log-probs of the answer (+ eos) tokens in the sequence
  bos ⊕ prompt ⊕ response (no eos) ⊕ answer ⊕ eos built from the texts and scored directly;
  the prior the same without the response; on one device and on a 4-way data mesh."""
  c = tiny(estimator="rlpr", mesh="data=4", sft_steps=0)
  run, rs, ctx, batch = _one_step_batch(c, str(tmp_path / "w"))
  assert "answer_pass" in [s.name for s in run.stages]
  tok = run.data.tokenizer
  score = jax.jit(train.make_scorer(run.setup.graphdef, run.setup.rest, None))
  host = jax.tree.map(np.asarray, {k: batch[k] for k in (
      "logprob_answer", "logprob_answer_prior", "answer_mask", "tokens", "response_mask")})
  G, A = c.group_size, host["answer_mask"].shape[1]
  rows = {"logprob_answer": [], "logprob_answer_prior": []}
  for b in range(host["tokens"].shape[0]):
    example = {k: ctx.examples[k][b // G] for k in ctx.examples}
    answer = tok.encode(str(example["answer"])) + [tok.eos_id]
    assert host["answer_mask"][b].tolist() == [j < len(answer) for j in range(A)]
    response = [int(t) for t in host["tokens"][b][host["response_mask"][b]]]
    if response and response[-1] == tok.eos_id:
      response = response[:-1]
    prompt = prompt_ids(tok, str(example["prompt"]))
    rows["logprob_answer"].append((prompt + response, answer))
    rows["logprob_answer_prior"].append((prompt, answer))
  for field, pairs in rows.items():
    # One batch of unpadded rows (right padding does not change a causal model's log-probs).
    seq, mask = tasks_lib.pad_rows([p + a for p, a in pairs], None, pad_id=tok.pad_id,
                                   pad_left=False)
    want, _ = score(rs.train.params, jnp.asarray(seq), jnp.asarray(mask))
    for b, (prefix, answer) in enumerate(pairs):
      np.testing.assert_allclose(host[field][b][:len(answer)],
                                 np.asarray(want)[b, len(prefix):len(prefix) + len(answer)],
                                 atol=2e-5, rtol=1e-5, err_msg=f"{field} row {b}")
      assert np.all(host[field][b][len(answer):] == 0.0)


# --------------------------------------------------------------------------
# End to end.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("estimator,wanted", [
    ("perceval", {"flag_mask"}),
    ("logprob_reward", {"logprob_answer", "answer_mask"}),
    ("verifree", {"logprob_answer", "answer_mask"}),
    ("rlpr", {"logprob_answer", "answer_mask", "logprob_answer_prior"}),
    ("jepo", {"logprob_answer", "answer_mask"}),
])
def test_methods_plan_the_new_producers(estimator, wanted):
  plan = {p.producer.name: p.wanted for p in loop.check_method(tiny(estimator=estimator)).plan}
  assert plan["task_flags" if estimator == "perceval" else "answer_pass"] == wanted


@pytest.mark.parametrize("estimator,producer", [
    ("perceval", "task_flags"),
    ("rlpr", "answer_pass"),   # logprob_answer and the prompt-only prior
])
def test_new_producers_run_end_to_end(estimator, producer, tmp_path):
  c = tiny(estimator=estimator, debug_checks=True, eval_every=0, export_hf=False,
           checkpoint_every=0, sft_steps=0)
  assert producer in [p.producer.name for p in loop.check_method(c).plan]
  wd = str(tmp_path / estimator)
  loop.run(c, wd)
  with open(os.path.join(wd, "metrics.jsonl")) as f:
    last = [json.loads(line) for line in f][-1]
  assert last["step"] == 2 and np.isfinite(last["loss"]) and np.isfinite(last["adv_abs_mean"])


def test_flag_mask_marks_wrong_rows_only(tmp_path):
  run, rs, ctx, batch = _one_step_batch(tiny(estimator="perceval"), str(tmp_path / "w"))
  flags, resp, reward = (np.asarray(batch[k]) for k in ("flag_mask", "response_mask", "reward"))
  assert not np.any(flags & ~resp)
  assert not np.any(flags[reward == 1.0])
  assert np.all(flags[reward == 0.0].any(axis=1))
