"""Field producers of the runner: task span flags (`flag_mask`), the teacher-forced answer
pass (`logprob_answer`, `answer_mask`, `logprob_answer_prior`), the follow-up pass
(`logprob_followup`) and the response re-scored under other prompts (`logprob_alt_pos` / `_neg`,
`logprob_interventions`), unit and end to end."""
import importlib
import json
import os
import types

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


@pytest.mark.parametrize("response,want", [
    ("3*5+7", "......"),      # 22: correct, nothing flagged
    ("7+3*5", "......"),
    ("3*9+7", "..####"),      # 9 is not offered: flagged from it onward
    ("3*5+3", "....##"),      # 3 used twice
    ("3*5+07", "....###"),    # a leading zero
    ("3*5x7", "...###"),      # a character outside the alphabet
    ("3+5+7", "######"),      # legitimate numbers, wrong value: the whole response
    ("3*(5+7", "#######"),    # malformed
    ("", "#"),
])
def test_countdown_flags_from_the_first_wrong_step(response, want):
  task = tasks_lib.get_task("countdown")
  ex = {"prompt": "3 5 7:22=", "numbers": [3, 5, 7], "target": 22}
  assert dots(task.flag_chars(ex, response)) == want


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
  c = tiny(estimator="perceval", task="copy_digit")
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
  """(runner, ctx, batch) after the planned producers of one step, checked against the
  contract, and the estimator's advantages on it (finite, 0 outside the response); no update
  (the update is the same for every estimator and runs in tests/experiments/runner_test.py)."""
  run, rs = loop.setup(c, workdir)
  ctx = loop._context(run, rs)
  batch = {}
  for stage in run.stages:
    batch.update(stage(rs.train, batch, ctx))
  loop.check_batch(batch, num_groups=c.prompts_per_step, where="test")
  adv, _, _ = run.adv_fn({n: batch[n] for n in run.method.estimator_fields},
                         rs.train.estimator_state)
  adv, resp = np.asarray(adv), np.asarray(batch["response_mask"])
  assert np.all(np.isfinite(adv)) and np.all(adv[~resp] == 0.0), c.estimator
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


def test_answer_logprobs_after_the_task_marker_match_direct_scoring(tmp_path):
  """With a task `answer_marker` (chain: "46,41=41"), logprob_answer[b] equals the log-probs
  of the answer (+ eos) in bos ⊕ prompt ⊕ response cut right after its first marker ⊕ answer
  ⊕ eos, or, for a response without the marker, bos ⊕ prompt ⊕ response (no eos) ⊕ marker ⊕
  answer ⊕ eos; the prior is scored after bos ⊕ prompt ⊕ marker. Markers are written into
  the sampled responses (none, one, two) so that every case occurs."""
  c = tiny("verifree_chain", estimator="rlpr", mesh="data=4", sft_steps=0)
  run, rs = loop.setup(c, str(tmp_path / "w"))
  rs = loop.restore_or_warm_up(run, rs)  # the frozen reference scores rlpr's prior
  ctx = loop._context(run, rs)
  tok = run.data.tokenizer
  (m,) = tok.encode(run.data.task.answer_marker)
  batch = {}
  for stage in run.stages:
    if stage.name == "answer_pass":
      host = batch["host"] = dict(batch["host"])
      tokens = host["tokens"] = np.array(host["tokens"])  # the host copy is read-only
      resp = batch["host"]["response_mask"]
      cols = np.flatnonzero(resp.any(0))
      tokens[:, cols] = np.where(resp[:, cols] & (tokens[:, cols] == m), tok.encode("7")[0],
                                 tokens[:, cols])
      for b in range(len(tokens)):
        body = [j for j in cols if resp[b, j] and tokens[b, j] != tok.eos_id]
        if b % 3 and len(body) >= 4:
          tokens[b, body[1]] = m
          if b % 3 == 2:
            tokens[b, body[3]] = m  # a second marker: the cut is after the first
    batch.update(stage(rs.train, batch, ctx))
  loop.check_batch(batch, num_groups=c.prompts_per_step, where="test")
  score = jax.jit(train.make_scorer(run.setup.graphdef, run.setup.rest, None))
  host = jax.tree.map(np.asarray, {k: batch[k] for k in (
      "logprob_answer", "logprob_answer_prior", "answer_mask")})
  tokens, resp = batch["host"]["tokens"], batch["host"]["response_mask"]
  G = c.group_size
  rows = {"logprob_answer": [], "logprob_answer_prior": []}
  found = []
  for b in range(tokens.shape[0]):
    example = {k: ctx.examples[k][b // G] for k in ctx.examples}
    answer = tok.encode(str(example["answer"])) + [tok.eos_id]
    response = [int(t) for t in tokens[b][resp[b]]]
    if response and response[-1] == tok.eos_id:
      response = response[:-1]
    found.append(m in response)
    prefix = response[:response.index(m) + 1] if found[-1] else response + [m]
    prompt = prompt_ids(tok, str(example["prompt"]))
    rows["logprob_answer"].append((prompt + prefix, answer))
    rows["logprob_answer_prior"].append((prompt + [m], answer))
  assert 0 < sum(found) < len(found)
  for field, pairs in rows.items():
    seq, mask = tasks_lib.pad_rows([p + a for p, a in pairs], None, pad_id=tok.pad_id,
                                   pad_left=False)
    want, _ = score(rs.train.params, jnp.asarray(seq), jnp.asarray(mask))
    for b, (prefix, answer) in enumerate(pairs):
      assert host["answer_mask"][b].sum() == len(answer)
      np.testing.assert_allclose(host[field][b][:len(answer)],
                                 np.asarray(want)[b, len(prefix):len(prefix) + len(answer)],
                                 atol=2e-5, rtol=1e-5, err_msg=f"{field} row {b}")
      assert np.all(host[field][b][len(answer):] == 0.0)


def test_cut_after_marker():
  tokens = np.array([[9, 5, 7, 5, 2], [9, 6, 6, 2, 0], [5, 5, 7, 2, 0]], np.int32)
  body = np.array([[0, 1, 1, 1, 0], [0, 1, 1, 0, 0], [1, 1, 1, 0, 0]], bool)
  keep, found = producers.likelihood._cut_after_marker(tokens, body, np.array([5], np.int32))
  np.testing.assert_array_equal(found, [True, False, True])
  np.testing.assert_array_equal(keep, [[0, 1, 0, 0, 0], [0, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
  keep, found = producers.likelihood._cut_after_marker(tokens, body, np.array([5, 7], np.int32))
  np.testing.assert_array_equal(found, [True, False, True])
  np.testing.assert_array_equal(keep, [[0, 1, 1, 0, 0], [0, 1, 1, 0, 0], [1, 1, 1, 0, 0]])
  keep, found = producers.likelihood._cut_after_marker(tokens, body, np.zeros(0, np.int32))
  assert keep is body and not found.any()


# --------------------------------------------------------------------------
# The follow-up pass (FLR).
# --------------------------------------------------------------------------


def test_followup_logprobs_match_direct_scoring_of_each_row(tmp_path):
  """logprob_followup[b, f] equals the mean log-prob of follow-up f's tokens (text + eos) in
  bos ⊕ prompt ⊕ response (no eos) ⊕ separator ⊕ f ⊕ eos built from the texts and scored
  directly (the separator unscored); F=3 of different lengths, on a 4-way data mesh."""
  c = tiny(estimator="flr", mesh="data=4", sft_steps=0, followups_pos=("correct", "yes"),
           followups_neg=("wrong",), followup_separator=". ")
  c.estimator_kwargs.num_positive = 2
  run, rs, ctx, batch = _one_step_batch(c, str(tmp_path / "w"))
  assert "followup_pass" in [s.name for s in run.stages]
  tok, G = run.data.tokenizer, c.group_size
  score = jax.jit(train.make_scorer(run.setup.graphdef, run.setup.rest, None))
  host = jax.tree.map(np.asarray, {k: batch[k] for k in (
      "logprob_followup", "tokens", "response_mask")})
  B = host["tokens"].shape[0]
  texts = ["correct", "yes", "wrong"]
  assert host["logprob_followup"].shape == (B, 3)
  assert host["logprob_followup"].dtype == np.float32
  for f, text in enumerate(texts):
    pairs = []
    for b in range(B):
      example = {k: ctx.examples[k][b // G] for k in ctx.examples}
      response = [int(t) for t in host["tokens"][b][host["response_mask"][b]]]
      if response and response[-1] == tok.eos_id:
        response = response[:-1]
      pairs.append((prompt_ids(tok, str(example["prompt"])) + response + tok.encode(". "),
                    tok.encode(text) + [tok.eos_id]))
    seq, mask = tasks_lib.pad_rows([p + a for p, a in pairs], None, pad_id=tok.pad_id,
                                   pad_left=False)
    want, _ = score(rs.train.params, jnp.asarray(seq), jnp.asarray(mask))
    want = np.asarray(want)
    for b, (prefix, followup) in enumerate(pairs):
      np.testing.assert_allclose(
          host["logprob_followup"][b, f],
          want[b, len(prefix):len(prefix) + len(followup)].mean(), atol=2e-5, rtol=1e-5,
          err_msg=f"follow-up {text!r} row {b}")
  # The follow-ups and the responses change the scores.
  assert np.all(np.ptp(host["logprob_followup"], axis=1) > 1e-4)
  assert np.ptp(host["logprob_followup"][:, 0]) > 1e-4


@pytest.mark.parametrize("overrides,kwargs,why", [
    ({}, {"num_positive": 2}, r"num_positive=2 but followups_pos has 1 follow-up"),
    ({"followups_pos": ("Correct",)}, {}, r"followups_pos: 'Correct' cannot be encoded"),
    ({"followup_separator": "\t"}, {}, r"followup_separator: '\\t' cannot be encoded"),
    ({"followups_pos": (), "followups_neg": ()}, {"num_positive": 0}, r"both empty"),
])
def test_followups_are_refused_before_any_file(tmp_path, overrides, kwargs, why):
  """A num_positive other than len(followups_pos) or a follow-up the tokenizer cannot encode
  is refused by check_method (no file written), and when the producer is built (naming the
  field and value: a checkpoint's tokenizer is checked there)."""
  c = tiny(estimator="flr", **overrides)
  c.estimator_kwargs.update(kwargs)
  wd = tmp_path / "w"
  with pytest.raises(loop.SetupError, match=why):
    loop.run(c, str(wd))
  assert not os.path.exists(wd)
  loop.check_method(tiny(estimator="grpo", **overrides))  # unused: no matter
  setup = types.SimpleNamespace(c=c, data=types.SimpleNamespace(tokenizer=CharTokenizer()))
  with pytest.raises(loop.SetupError, match=why):
    producers.likelihood._build_followup_pass(setup, frozenset({"logprob_followup"}))


def test_flr_plans_its_follow_ups_and_gives_finite_advantages(tmp_path):
  """flr by name on the grpo_arithmetic:tiny recipe (default follow-ups, num_positive=1): one
  step's batch through the planned producers and the estimator (the update after it is the
  same for every estimator and runs in tests/experiments/runner_test.py)."""
  c = tiny(estimator="flr")
  plan = {p.producer.name: p.wanted for p in loop.check_method(c).plan}
  assert plan["followup_pass"] == {"logprob_followup"}
  _, _, _, batch = _one_step_batch(c, str(tmp_path / "flr"))
  assert np.all(np.isfinite(np.asarray(batch["logprob_followup"])))


# --------------------------------------------------------------------------
# Re-scoring the response under other prompts: contrastive contexts, interventions.
# --------------------------------------------------------------------------


def test_arithmetic_interventions_keep_the_answer():
  task = tasks_lib.get_task("arithmetic", min_digits=1, max_digits=3, ops="+-*")
  tok = CharTokenizer()
  examples = task.generate(np.random.default_rng(0), 300)
  assert {next(ch for ch in e["prompt"] if ch in "+-*") for e in examples} == set("+-*")
  for e in examples:
    rewrites = task.interventions(e)
    assert len(rewrites) == 2 and e["prompt"] not in rewrites
    for p in rewrites:
      assert p.endswith("=") and str(eval(p[:-1])) == e["answer"], (e, p)  # pylint: disable=eval-used
      assert task.verify(dict(e, prompt=p), e["answer"]) == 1.0
      tok.encode(p)
  assert task.interventions({"prompt": "12+34=", "answer": "46"}) == ["34+12=", "12+34+0="]
  assert task.interventions({"prompt": "12-34=", "answer": "-22"}) == ["0+12-34=", "12-34+0="]
  assert task.interventions({"prompt": "7*7=", "answer": "49"}) == ["0+7*7=", "7*7+0="]
  with pytest.raises(ValueError, match="not an arithmetic prompt"):
    task.interventions({"prompt": "12+=", "answer": "12"})


@pytest.mark.parametrize("estimator,producer,wanted", [
    ("cscr", "alt_context_pass", {"logprob_alt_pos", "logprob_alt_neg"}),
    ("treg", "alt_context_pass", {"logprob_alt_pos", "logprob_alt_neg"}),
    ("scapo", "interventions_pass", {"logprob_interventions"}),
])
def test_rescoring_methods_plan_their_producer(estimator, producer, wanted):
  plan = {p.producer.name: p.wanted for p in loop.check_method(tiny(estimator=estimator)).plan}
  assert plan[producer] == wanted


def test_interventions_are_refused_for_a_task_without_them():
  c = tiny(estimator="scapo", task="countdown")
  c.task_kwargs = {}
  with pytest.raises(loop.SetupError,
                     match=r"'scapo' needs \['logprob_interventions'\].*'interventions_pass'.*off"):
    loop.check_method(c)


def test_alt_context_the_tokenizer_cannot_encode_is_refused(tmp_path):
  # Before any file (the character tokenizer has no capitals) ...
  wd = tmp_path / "w"
  with pytest.raises(loop.SetupError, match=r"'cscr' needs \['logprob_alt_neg', "
                     r"'logprob_alt_pos'\].*'alt_context_pass'.*off.*alt_context_pos"):
    loop.run(tiny(estimator="cscr", alt_context_pos="Correct: "), str(wd))
  assert not os.path.exists(wd)
  loop.check_method(tiny(estimator="grpo", alt_context_pos="Correct: "))  # unused: no matter
  # ... and when the producer is built (a checkpoint's tokenizer), naming the config field.
  setup = types.SimpleNamespace(
      c=tiny(alt_context_neg="Wrong: "), group_size=2,
      data=types.SimpleNamespace(tokenizer=CharTokenizer(), train=[{"prompt": "1+2="}]))
  with pytest.raises(loop.SetupError, match=r"alt_context_neg='Wrong: ' cannot be encoded"):
    producers.rescoring._build_alt_context_pass(setup, frozenset({"logprob_alt_pos", "logprob_alt_neg"}))


def test_rescored_logprobs_match_direct_scoring_of_each_row(tmp_path):
  """logprob_alt_pos / _neg [b] and logprob_interventions [b, :, m] equal the log-probs of the
  response tokens in bos ⊕ other prompt ⊕ response scored directly (prompt = alt_context
  prefix + prompt, or the task's m-th intervention), at the response's own columns and 0
  elsewhere; on a 4-way data mesh."""
  c = tiny(estimator="cscr", mesh="data=4", sft_steps=0)
  run, rs, ctx, batch = _one_step_batch(c, str(tmp_path / "w"))
  assert "alt_context_pass" in [s.name for s in run.stages]
  (interventions,) = [p for p in producers.PRODUCERS if p.name == "interventions_pass"]
  batch.update(producers.Planned(interventions, frozenset({"logprob_interventions"}))
               .build(run.setup)(rs.train, batch, ctx))
  tok, task, G = run.data.tokenizer, run.data.task, c.group_size
  score = jax.jit(train.make_scorer(run.setup.graphdef, run.setup.rest, None))
  host = jax.tree.map(np.asarray, {k: batch[k] for k in (
      "logprob_alt_pos", "logprob_alt_neg", "logprob_interventions", "tokens",
      "response_mask")})
  B, T = host["tokens"].shape
  assert host["logprob_interventions"].shape == (B, T, 2)
  fields = {"logprob_alt_pos": host["logprob_alt_pos"], "logprob_alt_neg": host["logprob_alt_neg"],
            "intervention 0": host["logprob_interventions"][..., 0],
            "intervention 1": host["logprob_interventions"][..., 1]}
  for field, got in fields.items():
    pairs = []
    for b in range(B):
      example = {k: ctx.examples[k][b // G] for k in ctx.examples}
      prompt = str(example["prompt"])
      if field.startswith("intervention"):
        prompt = task.interventions(example)[int(field[-1])]
      else:
        prompt = c[producers.ALT_CONTEXTS[field]] + prompt
      response = [int(t) for t in host["tokens"][b][host["response_mask"][b]]]
      pairs.append((prompt_ids(tok, prompt), response))
    seq, mask = tasks_lib.pad_rows([p + r for p, r in pairs], None, pad_id=tok.pad_id,
                                   pad_left=False)
    want, _ = score(rs.train.params, jnp.asarray(seq), jnp.asarray(mask))
    for b, (prefix, response) in enumerate(pairs):
      resp = host["response_mask"][b]
      np.testing.assert_allclose(got[b][resp],
                                 np.asarray(want)[b, len(prefix):len(prefix) + len(response)],
                                 atol=2e-5, rtol=1e-5, err_msg=f"{field} row {b}")
      assert np.all(got[b][~resp] == 0.0)
  # The contexts change the scores (else the test could not tell them from the plain prompt).
  plain = np.asarray(batch["logprob_old"])
  assert not np.allclose(host["logprob_alt_pos"], plain, atol=1e-4)
  assert not np.allclose(host["logprob_alt_pos"], host["logprob_alt_neg"], atol=1e-4)


# --------------------------------------------------------------------------
# End to end.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("estimator,wanted", [
    ("perceval", {"flag_mask"}),
    ("logprob_reward", {"logprob_answer", "answer_mask"}),
    # Their answer terms score the answer again in the update, from the forced sequence.
    ("verifree", {"logprob_answer", "answer_mask", *producers.ANSWER_SEQUENCE}),
    # RLPR's prior comes from answer_prior_ref (the frozen initial policy).
    ("rlpr", {"logprob_answer", "answer_mask"}),
    ("jepo", {"logprob_answer", "answer_mask", *producers.ANSWER_SEQUENCE}),
])
def test_methods_plan_the_new_producers(estimator, wanted):
  plan = {p.producer.name: p.wanted for p in loop.check_method(tiny(estimator=estimator)).plan}
  assert plan["task_flags" if estimator == "perceval" else "answer_pass"] == wanted
  # VeriFree's format gate and RLPR's format term (on by default, as in their code) ask
  # for format_ok.
  assert ("format_check" in plan) == (estimator in ("verifree", "rlpr"))
  assert ("answer_prior_ref" in plan) == (estimator == "rlpr")


def test_rlpr_prior_is_scored_by_the_frozen_initial_policy(tmp_path):
  """answer_prior_scorer="auto" gives rlpr its prior from the frozen reference (RLPR's code
  computes it once, before training, with the initial model): with the policy moved away
  from the reference the prior stays, while logprob_answer follows the policy. Under
  "policy" the prior moves with the policy and no reference is kept."""
  out = {}
  for scorer, maker in (("auto", "answer_prior_ref"), ("policy", "answer_pass")):
    c = tiny("verifree_chain", estimator="rlpr", sft_steps=0, answer_prior_scorer=scorer)
    m = loop.check_method(c)
    plan = {p.producer.name: p.wanted for p in m.plan}
    assert "logprob_answer_prior" in plan[maker] and "format_ok" in plan["format_check"]
    assert m.keeps_reference == (scorer == "auto")
    run, rs = loop.setup(c, str(tmp_path / scorer))
    rs = loop.restore_or_warm_up(run, rs)
    ctx = loop._context(run, rs)
    batch = {}
    for stage in run.stages:
      batch.update(stage(rs.train, batch, ctx))
    moved = rs.train.replace(params=jax.tree.map(lambda x: x * 1.5, rs.train.params))
    for state, key in ((rs.train, False), (moved, True)):
      got = {}
      for stage in run.stages:
        if stage.name in ("answer_pass", "answer_prior_ref"):
          got.update(stage(state, batch, ctx))
      out[scorer, key] = {k: np.asarray(got[k]) for k in (
          "logprob_answer", "logprob_answer_prior")}
  for scorer in ("auto", "policy"):
    assert not np.allclose(out[scorer, False]["logprob_answer"],
                           out[scorer, True]["logprob_answer"])
  np.testing.assert_array_equal(out["auto", False]["logprob_answer_prior"],
                                out["auto", True]["logprob_answer_prior"])
  assert not np.allclose(out["policy", False]["logprob_answer_prior"],
                         out["policy", True]["logprob_answer_prior"])
  with pytest.raises(producers.SetupError, match="answer_prior_scorer"):
    loop.check_method(tiny("verifree_chain", estimator="rlpr", answer_prior_scorer="init"))


def test_scapo_plans_interventions_and_gives_finite_advantages(tmp_path):
  """SCAPO's [B,T,M] re-scored log-probs through the planned producers and the estimator on
  one step's batch (perceval, rlpr and cscr do the same in the tests above)."""
  c = tiny(estimator="scapo", sft_steps=0)
  assert "interventions_pass" in [p.producer.name for p in loop.check_method(c).plan]
  _, _, _, batch = _one_step_batch(c, str(tmp_path / "scapo"))
  lp = np.asarray(batch["logprob_interventions"])
  assert lp.ndim == 3 and np.all(np.isfinite(lp))


def _assert_turns_are_steps(run, ctx, batch, max_steps: int) -> np.ndarray:
  """turn_id is the response's delimiter steps (merged at max_steps) and step_mask marks
  exactly the turns each row has; returns step_mask."""
  resp = batch["host"]["response_mask"]
  split = producers.step_splitter(run.setup)(batch["host"]["tokens"], resp)
  want = np.where(resp, np.minimum(split, max_steps - 1), -1)
  np.testing.assert_array_equal(np.asarray(batch["turn_id"]), want)
  assert (want.max(axis=1) > 0).any()  # several steps somewhere
  steps = np.asarray(batch["step_mask"])
  for b in range(len(want)):
    np.testing.assert_array_equal(np.flatnonzero(steps[b]), np.unique(want[b][want[b] >= 0]))
  return steps


def test_steps_as_turns_makes_each_step_a_turn_of_a_single_turn_response(tmp_path):
  # A turn-level step-reward method (vpr) on chain's single-turn responses: turn k is step k
  # (cut at the step delimiters, the last one merged at max_steps), as step_reward's column k.
  c = tiny("verifree_chain", estimator="vpr", steps_as_turns=True, max_steps=3)
  run, rs, ctx, batch = _one_step_batch(c, str(tmp_path / "w"))
  _assert_turns_are_steps(run, ctx, batch, c.max_steps)


def test_turn_level_estimators_take_the_steps_as_turns_on_single_turn_rows(tmp_path):
  """IGPO reads step_mask (the step graph's delimiter steps) as its turns and turn_id as their
  tokens: on a single-turn task the two must agree without steps_as_turns (before, turn_id
  was 0 everywhere while step_mask had a turn per step, so rows with a delimiter had turns
  without tokens), and the gold pass scores one prefix per step."""
  assert not producers.turns_are_steps(tiny("verifree_chain", estimator="grpo"))
  assert not producers.turns_are_steps(tiny("igpo_lookup", estimator="igpo"))  # episode turns
  c = tiny("verifree_chain", estimator="igpo", max_steps=3)
  assert not c.steps_as_turns and producers.turns_are_steps(c)
  run, rs, ctx, batch = _one_step_batch(c, str(tmp_path / "w"))
  steps = _assert_turns_are_steps(run, ctx, batch, c.max_steps)
  assert np.asarray(batch["gold_logprob_turns"]).shape == steps.shape


def test_flag_mask_marks_wrong_rows_only(tmp_path):
  run, rs, ctx, batch = _one_step_batch(tiny(estimator="perceval"), str(tmp_path / "w"))
  flags, resp, reward = (np.asarray(batch[k]) for k in ("flag_mask", "response_mask", "reward"))
  assert not np.any(flags & ~resp)
  assert not np.any(flags[reward == 1.0])
  assert np.all(flags[reward == 0.0].any(axis=1))


# --------------------------------------------------------------------------
# Structured rewards (subproblems, rubric, unit tests, reward components).
# --------------------------------------------------------------------------


def test_subproblem_rubric_and_component_fields_match_the_task(tmp_path):
  """scrl_chain's one-step batch: sub_rewards / sub_mask / span_id are the task's subproblems
  on each decoded response (one token per character), and the rubric and reward-component
  producers on the same batch give the task's rubric and the named columns."""
  c = tiny("scrl_chain", sft_steps=0)
  c.reward_components = ("outcome", "format", "rubric", "subproblems", "brevity")
  run, rs, ctx, batch = _one_step_batch(c, str(tmp_path / "w"))
  task, tok = run.data.task, run.data.tokenizer
  resp, gid = batch["host"]["response_mask"], batch["host"]["group_id"]
  sub, sub_mask, span = (np.asarray(batch[k]) for k in ("sub_rewards", "sub_mask", "span_id"))
  rubric = producers.signals._build_rubric(run.setup, frozenset())(rs.train, batch, ctx)
  comps = np.asarray(producers.signals._build_reward_components(run.setup, frozenset())(
      rs.train, batch, ctx)["reward_components"])
  rows = producers.examples_rows(ctx.examples)
  texts = tasks_lib.decode_responses(tok, batch["host"]["tokens"], resp)
  assert not np.any((span >= 0) & ~resp)
  checked = 0
  for b, text in enumerate(texts):
    example = rows[gid[b]]
    want, char_span = task.subproblems(example, text)
    n = len(want)
    assert sub[b, :n].tolist() == want and sub_mask[b].sum() == n and sub[b, n:].sum() == 0
    ids = batch["host"]["tokens"][b][resp[b]]
    if np.all(ids[:-1] > tok.eos_id):  # one character per token (no pad / bos sampled)
      assert span[b, resp[b]].tolist() == char_span[:resp[b].sum()].tolist(), text
      checked += 1
    items = task.rubric(example, text)
    assert np.asarray(rubric["rubric"])[b, :len(items)].tolist() == items
    np.testing.assert_allclose(comps[b], [
        float(batch["reward"][b]), float(task.format_ok(example, text)), np.mean(items),
        np.mean(want), 1.0 - resp[b].sum() / c.max_new_tokens], atol=1e-6)
  assert checked >= len(texts) // 2, checked


def test_unit_test_fields_and_hostile_programs(tmp_path):
  """verpo_program's one-step batch: test_pass is the task's unit-test table on each decoded
  response; the producer on hostile responses (non-terminating, runtime error, syntax
  error, overflow) fails their tests and returns, while a right program passes all."""
  run, rs, ctx, batch = _one_step_batch(tiny("verpo_program", sft_steps=0),
                                        str(tmp_path / "w"))
  task, tok = run.data.task, run.data.tokenizer
  rows = producers.examples_rows(ctx.examples)
  texts = tasks_lib.decode_responses(tok, batch["host"]["tokens"], batch["host"]["response_mask"])
  want = [task.test_pass(rows[g], t) for g, t in zip(batch["host"]["group_id"], texts)]
  np.testing.assert_array_equal(np.asarray(batch["test_pass"]), want)
  assert np.asarray(batch["test_mask"]).all()
  # call depth, step limit (4^7 calls at x = 7), division by zero, syntax, overflow; right
  hostile = ["f(x)", "x?f(x-1)+f(x-1)+f(x-1)+f(x-1):x-x-1", "x/(x-x)", "x+*1",
             "(x+1)*99999*99999", rows[0]["answer"]]
  ids = [tok.encode(h, add_eos=True) for h in hostile]
  width = batch["host"]["tokens"].shape[1]
  tokens = np.zeros((len(ids), width), np.int32)
  mask = np.zeros((len(ids), width), bool)
  for b, row in enumerate(ids):
    tokens[b, width - len(row):], mask[b, width - len(row):] = row, True
  fake = producers.StepContext(key=None, examples=ctx.examples, prompt_tokens=None,
                               prompt_mask=None)
  host = {"tokens": tokens, "response_mask": mask, "group_id": np.zeros(len(ids), int)}
  got = np.asarray(producers.signals._build_unit_tests(run.setup, frozenset())(
      None, {"host": host}, fake)["test_pass"])
  assert got[-1].all() and not got[:-1].any()
  assert got.shape == (len(hostile), task.num_tests)


def test_tool_usage_counts_calls_and_rounds():
  """tool_calls: the turns with a well-formed tool call; tool_cost: every turn that did not
  answer (calls and malformed actions), from the episodes' step results."""
  from credit.envs.rollout import Trajectory
  task = tasks_lib.get_task("calculator")
  example = task.generate(np.random.default_rng(0), 1)[0]

  def play(actions):
    env = task.make_env(example, None)
    env.reset()
    results = []
    for a in actions:
      results.append(env.step(a))
      if results[-1].done:
        break
    return Trajectory("", actions, [], results, 0.0, False)

  gold = list(task.demonstration_turns(example))
  episodes = [play(gold), play(["calc(1+", "nonsense"] + gold), play([gold[-1]])]
  setup = types.SimpleNamespace(mesh=jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",)))
  ctx = producers.StepContext(key=None, examples={}, prompt_tokens=None, prompt_mask=None)
  out = producers.signals._build_tool_usage(setup, frozenset())(
      None, {"trajectories": episodes}, ctx)
  n = len(gold) - 1  # the demonstration's calls before its answer
  assert np.asarray(out["tool_calls"]).tolist() == [n, n, 0]
  assert np.asarray(out["tool_cost"]).tolist() == [n, n + 2, 0]
  # A multi-turn task whose turns are not tool calls (pivot_turn answers a digit per turn)
  # has no tool usage to count: an estimator that needs it is refused at setup, naming why.
  from tests.experiments.runner_test import tiny
  c = tiny("igpo_lookup", estimator="trace_cost", task="pivot_turn")
  c.task_kwargs = {}
  with pytest.raises(producers.MissingFieldsError, match="tool_calls.*turns are tool calls") as e:
    loop.check_method(c)
  # The structured error carries who needs what and why each able producer is off, so a caller
  # (the credit bench's skip list) need not parse the message.
  assert e.value.missing == {"estimator 'trace_cost'": ["tool_calls", "tool_cost"]}
  assert list(e.value.off) == ["tool_usage"]
  assert "turns are tool calls" in e.value.off["tool_usage"][1]
  assert "it can make" not in e.value.reason and "tool_usage" in e.value.reason


# Registered estimators whose inputs no producer of the loop makes yet, and the field each
# lacks, or that run only as a role inside another method's step (refused by name, with why).
# Everything else must plan on the default recipe (turn-level methods: on the multi-turn
# `igpo_lookup` recipe), and so run by name.
NOT_YET_RUNNABLE: dict[str, str] = {"jolt_teacher": "JOLT's teacher role"}
# Estimators whose recipe switches on a rollout producer of their own: (recipe, root producer).
OWN_ROLLOUT_RECIPES = {"logo": ("logo_lookup", "logo_rollout")}  # Memory-R2's local re-rollouts
# Reward-shaping methods whose structured rewards come from a task: the recipe that has it.
SHAPING_RECIPES = {"scrl": "scrl_chain", "c_grpo": "scrl_chain", "verpo_tests": "verpo_program",
                   "trace_cost": "igpo_lookup"}


def test_every_estimator_plans_by_name_or_is_refused_naming_its_field():
  import credit
  from tests.experiments.runner_test import tiny
  for name in credit.list_estimators():
    spec = credit.get_estimator(name)
    family = spec.family
    # Tree and step methods: branch / step-level sampling or per-step producers on chain.
    tree = None if family != "tree" else {"slate": ("slate_chain", "slate_rollout")}.get(
        name, ("cbpo_chain", "tree_rollout") if "parent_id" in spec.needs else
        ("tp_grpo_chain", "rollout"))
    turn = tree is None and (family == "turn" or "step_mask" in spec.needs)  # multi-turn
    recipe = SHAPING_RECIPES.get(name) or (tree[0] if tree else "igpo_lookup" if turn
                                           else "grpo_arithmetic")
    if name in OWN_ROLLOUT_RECIPES:
      recipe, tree = OWN_ROLLOUT_RECIPES[name][0], OWN_ROLLOUT_RECIPES[name]
    c = tiny(recipe, estimator=name)
    if "reward_components" in spec.needs:  # several reward signals from the task's verifier
      c.reward_components = ("format", "outcome", "brevity")
    if family == "distill":  # the policy as its own teacher (no checkpoint needed)
      c.teacher.context = "answer"
    if name in NOT_YET_RUNNABLE:
      with pytest.raises(producers.SetupError, match=NOT_YET_RUNNABLE[name]):
        loop.check_method(c)
    else:
      plan = loop.check_method(c).plan
      root = tree[1] if tree else "env_rollout" if turn or recipe == "igpo_lookup" else "rollout"
      assert plan[0].producer.name == root, name


def test_divergence_pass_matches_model_divergence(tmp_path):
  """hellinger_ref / kl_ref / kl_ref_forward equal `credit.divergences.model_divergence`
  between the policy and the frozen reference, on response tokens only (DGPO with
  exact_hellinger and VIMPO with exact_kl plan the pass)."""
  from credit import divergences
  c = tiny(estimator="dgpo", sft_steps=0)
  c.estimator_kwargs = {"exact_hellinger": True}
  assert "divergence_pass" in [p.producer.name for p in loop.check_method(c).plan]
  c2 = tiny(estimator="vimpo", sft_steps=0)
  c2.estimator_kwargs = {"exact_kl": True}
  assert "divergence_pass" in [p.producer.name for p in loop.check_method(c2).plan]
  run, rs = loop.setup(c, str(tmp_path))
  # A reference that differs from the policy: perturb the policy's copy.
  ref = jax.tree.map(lambda x: x + 0.05 * jnp.sin(jnp.arange(x.size, dtype=x.dtype)
                                                 ).reshape(x.shape), rs.train.params)
  rs.ref_params = ref
  ctx = loop._context(run, rs)
  batch = {}
  for stage in run.stages:
    batch.update(stage(rs.train, batch, ctx))
  assert {st.name: st.wanted for st in run.stages}["divergence_pass"] == {"hellinger_ref"}
  out = producers.passes._build_divergence_pass(run.setup, frozenset(producers.DIVERGENCE_FIELDS))(
      rs.train, batch, ctx)
  policy = train.merge_model(run.setup.graphdef, rs.train.params, run.setup.rest)
  reference = train.merge_model(run.setup.graphdef, ref, run.setup.rest)
  resp = np.asarray(batch["response_mask"])
  for field, kind in producers.DIVERGENCE_FIELDS.items():
    want = np.asarray(divergences.model_divergence(policy, reference, batch["tokens"],
                                                   batch["attn_mask"], kind=kind))
    got = np.asarray(out[field])
    np.testing.assert_allclose(got[resp], want[resp], rtol=1e-4, atol=1e-6, err_msg=field)
    assert np.all(got[~resp] == 0) and np.all(got[resp] >= -1e-6) and got[resp].max() > 1e-4


def test_multi_turn_plans_echo_and_trace_from_the_environment_rollout():
  """ECHO's observation loss and TRACE's reference-scored gold answer plan on a multi-turn
  recipe: obs_mask comes from the environment rollout, the gold scores from gold_pass_ref."""
  from tests.experiments.runner_test import tiny
  m = loop.check_method(tiny("igpo_lookup", obs_ce_coef=0.5))
  assert "obs_mask" in m.update_fields and m.plan[0].producer.name == "env_rollout"
  m = loop.check_method(tiny("igpo_lookup", estimator="trace"))  # gold_scorer=auto
  assert "gold_pass_ref" in [p.producer.name for p in m.plan] and m.keeps_reference
  m = loop.check_method(tiny("igpo_lookup", estimator="trace", gold_scorer="policy"))
  assert "gold_pass" in [p.producer.name for p in m.plan]
  m = loop.check_method(tiny("igpo_lookup", estimator="igpo"))
  assert "gold_pass" in [p.producer.name for p in m.plan] and not m.keeps_reference
  with pytest.raises(producers.SetupError, match="gold_template"):
    loop.check_method(tiny("igpo_lookup", gold_template="answer()"))


def test_gold_pass_runs_on_the_single_turn_rollout(tmp_path):
  """IGPO's gold-answer pass on a single-turn task: the rollout gives the producers the same
  obs_mask / turn_id host arrays as the environment rollout (it raised KeyError before)."""
  c = tiny(estimator="igpo")
  assert "gold_pass" in [p.producer.name for p in loop.check_method(c).plan]
  _, _, ctx, batch = _one_step_batch(c, str(tmp_path / "igpo"))
  assert not batch["host"]["obs_mask"].any()
  g = np.asarray(batch["gold_logprob_turns"])
  assert g.shape[0] == c.prompts_per_step * c.group_size and np.all(np.isfinite(g))
  assert np.all(np.asarray(batch["gold_logprob_prompt"]) < 0.0)


def test_credit_mask_keeps_the_advantages_on_the_deciding_tokens(tmp_path):
  """`credit_mask=decision_mask` (the credit bench's oracle placement, `grpo@pivot`): the
  task_decisions producer marks response token p of a pivotal prompt "p:d=", and the step's
  advantages (samples.jsonl) are the estimator's there and 0 on every other token (OPSA: it
  credits tokens without a reward, which an untrained policy never earns). Refused: a field
  that is not a [B,T] bool one, and a task without `pivot_positions`."""
  c = tiny("dcpo_pivotal", estimator="opsa", policy_loss="ppo_clip", credit_mask="decision_mask",
           samples_every=1, samples_per_step=16, prompts_per_step=4, group_size=4,
           checkpoint_every=0)
  assert "task_decisions" in [p.producer.name for p in loop.check_method(c).plan]
  loop.run(c, str(tmp_path / "w"))
  rows = [json.loads(line) for line in open(tmp_path / "w" / "samples.jsonl")]
  assert rows
  at_pivot = []
  for r in rows:
    p = int(r["prompt"].split(":")[0][-1])
    adv = np.asarray(r["advantages"])
    off = np.ones(len(adv), bool)
    off[p:p + 1] = False  # a response shorter than p has no deciding token: all zero
    assert np.all(adv[off] == 0.0), r
    at_pivot += list(adv[~off])
  assert np.any(np.asarray(at_pivot) != 0.0)
  with pytest.raises(loop.SetupError, match=r"credit_mask='reward': not a \[B,T\] bool"):
    loop.check_method(tiny("dcpo_pivotal", estimator="grpo", credit_mask="reward"))
  with pytest.raises(loop.SetupError, match=r"decision_mask.*task_decisions.*bifurcation"):
    loop.check_method(tiny(estimator="grpo", credit_mask="decision_mask"))


def test_a_quoted_mistake_keeps_only_what_the_tokenizer_encodes():
  # A multi-turn response carries the rollout's markup ('>' and '|'), which the character
  # tokenizer cannot encode; SIPO's {mistake} context must still encode.
  from experiments.producers.rescoring import _encodable
  tok = CharTokenizer()
  assert _encodable(tok, "ask(2) > 7 | answer(7)") == "ask(2)  7  answer(7)"
  assert _encodable(tok, "12+3=15") == "12+3=15"
  tok.encode(_encodable(tok, "a>|b\u00e9c"))
