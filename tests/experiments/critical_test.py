"""CSO / InT critical-step pipeline (experiments/producers/critical.py) and its update term."""
from __future__ import annotations

import dataclasses
import json
import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from credit import parallel
from credit import tasks as tasks_lib
from credit.losses import dpo_pair_loss, intervention_sft_mask
from credit.tasks import chain
from credit.tasks.chain import running_sums
from credit.tasks.char_tokenizer import prompt_ids
from experiments import loop, producers
from experiments.producers import critical
from experiments.extensions import critical as critical_term
from experiments.configs import cso_chain, int_chain, propa_chain


def test_critical_steps_are_the_steps_of_the_first_wrong_token():
  step_id = np.array([[-1, -1, 0, 0, 1, 1, 1, -1],
                      [-1, 0, 0, 0, 1, 1, -1, -1],
                      [-1, 0, 0, 1, 1, 1, 1, 1]])
  start, end = critical.critical_steps(step_id, np.array([5, -1, 1]))
  np.testing.assert_array_equal(start, [4, -1, 1])
  np.testing.assert_array_equal(end, [7, -1, 3])


def test_weights_follow_until():
  c = int_chain.get_config("tiny")
  c.critical.until = 3
  assert critical.weights(c, 2) == (0.0, 1.0, True)
  assert critical.weights(c, 3) == (1.0, 0.0, False)
  c.critical.until = 0
  assert critical.weights(c, 100) == (0.0, 1.0, True)


# --------------------------------------------------------------------------
# The pipeline on a hand-made batch, with a sampler that writes the gold response.
# --------------------------------------------------------------------------


class GoldSampler:
  """Continues every prefix with the rest of its example's gold response when the prefix's
  response part is a prefix of it (else with the stop token: a wrong ending), cut after the
  first stop token and at the row's budget; the output layout is the sampler's (valid
  prefix tokens packed first, then the new tokens)."""

  def __init__(self, tok, prompts, golds):
    self.tok = tok
    self.prompts = [prompt_ids(tok, p, add_bos=False) for p in prompts]
    self.golds = [tok.encode(g) + [tok.eos_id] for g in golds]
    self.calls = []

  def _example(self, ids):
    for n, p in enumerate(self.prompts):
      for i in range(len(ids) - len(p) + 1):
        if ids[i:i + len(p)] == p:
          return n, ids[i + len(p):]
    raise AssertionError(f"no example's prompt in {self.tok.decode(ids)!r}")

  def __call__(self, model_state, *, prompt_tokens, prompt_mask, key, max_new_tokens,
               num_samples, stop_tokens=(), max_new_tokens_per_row=None, **kw):
    texts = [self.tok.decode(np.asarray(prompt_tokens[r])[np.asarray(prompt_mask[r])])
             for r in range(prompt_tokens.shape[0])]
    self.calls.append(dict(num_samples=num_samples, stop_tokens=tuple(stop_tokens), texts=texts))
    stops = set(stop_tokens) | {self.tok.eos_id}
    rows = []
    for r in range(prompt_tokens.shape[0]):
      ids = np.asarray(prompt_tokens[r])[np.asarray(prompt_mask[r])].tolist()
      n, present = self._example(ids)
      gold = self.golds[n]
      new = gold[len(present):] if gold[:len(present)] == present else [self.tok.eos_id]
      cut = next((i + 1 for i, t in enumerate(new) if t in stops), len(new))
      new = new[:cut]
      if max_new_tokens_per_row is not None:
        new = new[:int(max_new_tokens_per_row[r])]
      rows += [(ids, new)] * num_samples
    width = prompt_tokens.shape[1] + max_new_tokens
    toks = np.zeros((len(rows), width), np.int32)
    resp = np.zeros((len(rows), width), bool)
    for r, (ids, new) in enumerate(rows):
      toks[r, :len(ids) + len(new)] = ids + new
      resp[r, len(ids):len(ids) + len(new)] = True
    return types.SimpleNamespace(tokens=toks, response_mask=resp)


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
  c = cso_chain.get_config("tiny")
  c.critical.max_items = 4
  run, rs = loop.setup(c, str(tmp_path_factory.mktemp("cso")))
  return run, rs


def _batch(run, responses_per_prompt):
  """ctx, batch and host arrays of N prompts x G given responses, laid out as the sampler's."""
  s, tok = run.setup, run.data.tokenizer
  N, G = s.num_groups, s.group_size
  examples = run.data.train[:N]
  cols = {k: [e[k] for e in examples] for k in examples[0]}
  T = run.data.max_prompt_len + run.c.max_new_tokens
  toks = np.zeros((N * G, T), np.int32)
  pm = np.zeros((N * G, T), bool)
  rm = np.zeros((N * G, T), bool)
  for n in range(N):
    p = prompt_ids(tok, examples[n]["prompt"])
    for g in range(G):
      r = tok.encode(responses_per_prompt[n][g]) + [tok.eos_id]
      b = n * G + g
      toks[b, :len(p) + len(r)] = p + r
      pm[b, :len(p)] = True
      rm[b, len(p):len(p) + len(r)] = True
  texts = tasks_lib.decode_responses(tok, toks, rm)
  rows = [examples[b // G] for b in range(N * G)]
  reward = np.asarray(tasks_lib.verify_batch(run.data.task, rows, texts), np.float32)
  ptoks, pmask = tasks_lib.encode_prompts(tok, cols["prompt"], run.data.max_prompt_len)
  ctx = producers.StepContext(key=jax.random.key(0), examples=cols, prompt_tokens=ptoks,
                              prompt_mask=pmask)
  host = dict(tokens=toks, response_mask=rm, prompt_mask=pm,
              group_id=np.repeat(np.arange(N, dtype=np.int32), G))
  return ctx, {"reward": jnp.asarray(reward), "host": host}, reward


def _wrong(prompt: str, step: int) -> str:
  """A chain response whose `step`-th reasoning step is off by one, carried to the answer."""
  sums = running_sums(prompt)
  sums = sums[:step + 1] + [v + 1 for v in sums[step + 1:]]
  return chain._response(sums)  # pylint: disable=protected-access


def test_pipeline_builds_verified_pairs_and_interventions(runner):
  run, rs = runner
  task, tok = run.data.task, run.data.tokenizer
  N, G = run.setup.num_groups, run.setup.group_size
  golds = [task.demonstration(e) for e in run.data.train[:N]]
  wrong0 = _wrong(run.data.train[0]["prompt"], 0)  # the first running sum wrong
  assert task.verify(run.data.train[0], wrong0) == 0.0
  responses = [[golds[n]] * G for n in range(N)]
  responses[0][1] = wrong0
  ctx, batch, reward = _batch(run, responses)
  assert reward.tolist().count(0.0) == 1
  sampler = GoldSampler(tok, [e["prompt"] for e in run.data.train[:N]], golds)
  s = dataclasses.replace(run.setup, sampler=sampler)
  state = rs.train
  ctx.ref_params = state.params
  out = critical.build(s, frozenset({critical.FIELD}))(state, batch, ctx)[critical.FIELD]
  assert ctx.metrics["critical_failed"] == 1 and ctx.metrics["critical_located"] == 1
  assert ctx.metrics["critical_items"] == 1 and ctx.metrics["critical_verified"] == 1.0
  # Proposals stop at step delimiters; continuations do not.
  assert sampler.calls[0]["num_samples"] == run.c.critical.proposals
  assert set(producers.delimiter_ids(tok, run.c.step_delimiters)) <= set(sampler.calls[0]["stop_tokens"])
  assert sampler.calls[1]["stop_tokens"] == ()
  M = np.asarray(out["tokens"]).shape[0] // 2  # max_items rounded up to the mesh
  assert M >= run.c.critical.max_items and M % parallel.batch_divisor(run.mesh) == 0
  toks, attn, step = (np.asarray(out[k]) for k in ("tokens", "attn_mask", "step_mask"))
  first = golds[0].split(",")[0] + ","
  bad_first = wrong0.split(",")[0] + ","
  assert first != bad_first
  assert tok.decode(toks[0][step[0]]) == first           # chosen: the gold step
  assert tok.decode(toks[M][step[M]]) == bad_first       # rejected: the original step
  assert tok.decode(toks[0][attn[0] & ~step[0]]).endswith(run.data.train[0]["prompt"])
  np.testing.assert_array_equal(toks[0][attn[0] & ~step[0]], toks[M][attn[M] & ~step[M]])
  assert not attn[1:M].any() and not attn[M + 1:].any()  # no other items
  # The reference log-probs are the frozen policy's on the step tokens, 0 elsewhere.
  lp, _ = run.setup.scorer(entropy=False)(state.params, *parallel.shard_batch(
      (toks, attn), run.mesh))
  np.testing.assert_allclose(np.asarray(out["logprob_ref"]),
                             np.where(step, np.asarray(lp), 0.0), rtol=1e-5, atol=1e-6)
  assert float(out["rl_weight"]) == 0.0 and float(out["weight"]) == 1.0

  # InT: the intervention under the answer context; SFT row prompt -> prefix + intervention.
  c = int_chain.get_config("tiny")
  c.critical.max_items = M
  c.critical.train_on = "intervention_only"
  c.critical.context = "answer"     # InT's reference solution in front of the proposer's prompt
  s_int = dataclasses.replace(s, c=c)
  sampler.calls.clear()
  ctx2, batch2, _ = _batch(run, [[golds[n]] * G for n in range(N)][:1]
                           + [[_wrong(run.data.train[n]["prompt"], 1)] + [golds[n]] * (G - 1)
                              for n in range(1, N)])
  out2 = critical.build(s_int, frozenset({critical.FIELD}))(state, batch2, ctx2)[critical.FIELD]
  assert ctx2.metrics["critical_failed"] == N - 1 and ctx2.metrics["critical_items"] == N - 1
  # The proposals saw the answer after the teacher prefix; the continuations did not.
  for i in range(N - 1):
    answer = str(run.data.train[i + 1]["answer"])
    context = c.teacher.prefix.format(context="answer", text=answer)
    assert sampler.calls[0]["texts"][i].startswith(context)
    assert not sampler.calls[1]["texts"][i * c.critical.proposals].startswith(context)
  toks2, mask2 = np.asarray(out2["tokens"]), np.asarray(out2["loss_mask"])
  for i in range(N - 1):
    gold = golds[i + 1]
    second = gold.replace("=", ",=").split(",")[1]
    got = tok.decode(toks2[i][mask2[i]])
    assert got.startswith(second), (got, gold)          # the intervention only
    assert tok.decode(toks2[i][np.asarray(out2["attn_mask"])[i]]).endswith(
        gold.split(",")[0] + "," + got)


def test_pipeline_refuses_and_drops_unverified(runner):
  run, rs = runner
  task, tok = run.data.task, run.data.tokenizer
  N, G = run.setup.num_groups, run.setup.group_size
  golds = [task.demonstration(e) for e in run.data.train[:N]]
  responses = [[_wrong(run.data.train[n]["prompt"], 0)] * G for n in range(N)]
  ctx, batch, _ = _batch(run, responses)
  # A sampler that never finds the gold step: nothing is verified, no pair is made.
  wrong_sampler = GoldSampler(tok, [e["prompt"] for e in run.data.train[:N]],
                              [_wrong(e["prompt"], 0) for e in run.data.train[:N]])
  s = dataclasses.replace(run.setup, sampler=wrong_sampler)
  ctx.ref_params = rs.train.params
  out = critical.build(s, frozenset({critical.FIELD}))(rs.train, batch, ctx)[critical.FIELD]
  assert ctx.metrics["critical_located"] == N * G
  assert ctx.metrics["critical_items"] == 0 and ctx.metrics["critical_distinct"] == 0.0
  assert not np.asarray(out["attn_mask"]).any()


@pytest.mark.parametrize("bad, match", [
    (dict(objective="ppo"), "objective"),
    (dict(proposals=0), "proposals"),
    (dict(weight=0.0, rl_weight=0.0), "trains nothing"),
    (dict(context="nope"), "context"),
])
def test_bad_settings_are_refused(bad, match):
  c = cso_chain.get_config("tiny")
  c.critical.update(bad)
  with pytest.raises(producers.SetupError, match=match):
    loop.check_method(c)


def test_tree_batches_are_refused():
  c = cso_chain.get_config("tiny")
  c.tree.branches = 2
  with pytest.raises(producers.SetupError, match="cannot run on tree rollouts"):
    loop.check_method(c)


# --------------------------------------------------------------------------
# The update term.
# --------------------------------------------------------------------------


def test_critical_loss_is_dpo_and_sft_of_the_scored_rows(runner):
  run, rs = runner
  s = run.setup
  rng = np.random.default_rng(0)
  M, T = 2, 12
  toks = rng.integers(3, 10, size=(2 * M, T)).astype(np.int32)
  attn = np.ones((2 * M, T), bool)
  step = np.zeros((2 * M, T), bool)
  step[:, 6:9] = True
  ref = np.where(step, rng.normal(-2.0, 0.3, size=(2 * M, T)), 0.0).astype(np.float32)
  dpo = jax.jit(critical_term.make_loss(s.graphdef, s.rest, objective="dpo", beta=0.1,
                                        chunk_size=None))
  loss, metrics = dpo(rs.train.params, dict(tokens=toks, attn_mask=attn, step_mask=step,
                                            logprob_ref=ref))
  lp, _ = s.scorer(entropy=False)(rs.train.params, toks, attn)
  lsum = np.sum(np.where(step, np.asarray(lp), 0.0), axis=1)
  rsum = ref.sum(1)
  want = dpo_pair_loss(logprob_chosen=lsum[:M], logprob_ref_chosen=rsum[:M],
                       logprob_rejected=lsum[M:], logprob_ref_rejected=rsum[M:], beta=0.1)
  np.testing.assert_allclose(float(loss), float(want.loss), rtol=1e-5)
  assert float(metrics["critical_dpo_num_pairs"]) == M
  sft = jax.jit(critical_term.make_loss(s.graphdef, s.rest, objective="sft", beta=0.1,
                                        chunk_size=None))
  mask = np.asarray(intervention_sft_mask(np.array([4, 5]), np.array([2, 3]), T))
  loss, _ = sft(rs.train.params, dict(tokens=toks[:2], attn_mask=attn[:2], loss_mask=mask))
  want = -np.sum(np.where(mask, np.asarray(lp)[:2], 0.0)) / mask.sum()
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)


# --------------------------------------------------------------------------
# The recipes end to end.
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cso_run(tmp_path_factory):
  c = cso_chain.get_config("tiny")
  c.mesh = "data=1"
  wd = str(tmp_path_factory.mktemp("cso_run") / "run")
  loop.run(c, wd)
  return c, wd


def _rows(wd):
  with open(os.path.join(wd, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f][1:]
  assert [r["step"] for r in rows] == [1, 2]
  for r in rows:
    assert np.isfinite(r["loss"]) and "time_critical" in r
  return rows


def test_tiny_cso_recipe_trains_on_the_dpo_term_alone(cso_run):
  c, wd = cso_run
  assert c.kl_coef == 0 and c.entropy_coef == 0  # the RL loss is the policy loss alone
  for r in _rows(wd):  # L = rl_weight·L_RL + weight·L_critical with rl_weight 0
    assert r["critical_on"] == 1.0 and "critical_dpo_num_pairs" in r
    np.testing.assert_allclose(r["loss"], r["critical_loss"], rtol=1e-5, atol=1e-7)


def test_tiny_int_recipe_runs_int_then_rl_with_an_expert_proposer(cso_run, tmp_path):
  _, teacher_dir = cso_run
  c = int_chain.get_config("tiny")
  c.mesh = "data=1"
  c.critical.proposer = "teacher"   # the cso run's exported policy as the frozen expert
  c.teacher.init_from = os.path.join(teacher_dir, "hf_policy")
  wd = str(tmp_path / "run")
  loop.run(c, wd)
  rows = _rows(wd)
  assert [r["critical_on"] for r in rows] == [1.0, 0.0]  # until = 1: InT, then GRPO alone
  np.testing.assert_allclose(rows[0]["loss"], rows[0]["critical_loss"], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(rows[1]["loss"], rows[1]["pg_loss"], rtol=1e-5, atol=1e-7)


def test_an_expert_proposer_needs_a_teacher():
  c = cso_chain.get_config("tiny")
  c.critical.proposer = "teacher"
  with pytest.raises(producers.SetupError, match="teacher.init_from"):
    loop.check_method(c)


# --------------------------------------------------------------------------
# PROPA's interleaved SFT data (data="successes").
# --------------------------------------------------------------------------


def test_diverse_pair_keeps_the_pair_with_the_shortest_common_prefix():
  assert critical.diverse_pair([[1, 2]]) == [0]
  assert critical.diverse_pair([[1, 2], [1, 3]]) == [0, 1]
  assert critical.diverse_pair([[1, 2, 3], [1, 2, 4], [5, 2], [1, 9]]) == [0, 2]
  assert critical.diverse_pair([[1, 2], [1, 2], [1, 2]]) == [0, 1]  # ties: the first pair


def test_successes_are_sft_rows_and_the_demonstration_stands_in_for_none(runner):
  run, rs = runner
  task, tok = run.data.task, run.data.tokenizer
  N, G = run.setup.num_groups, run.setup.group_size
  ex = run.data.train[:N]
  golds = [task.demonstration(e) for e in ex]
  wrong = [_wrong(e["prompt"], 0) for e in ex]
  # group 0: all wrong; group 1: one success; groups 2..: all right.
  responses = [[wrong[0]] * G, [wrong[1]] * (G - 1) + [golds[1]]] + [[golds[n]] * G
                                                                     for n in range(2, N)]
  ctx, batch, _ = _batch(run, responses)
  c = propa_chain.get_config("tiny")
  s = dataclasses.replace(run.setup, c=c)
  out = critical.build(s, frozenset({critical.FIELD}))(rs.train, batch, ctx)[critical.FIELD]
  assert ctx.metrics["critical_gold"] == 1
  assert ctx.metrics["critical_items"] == 1 + 1 + 2 * (N - 2)
  toks, attn, mask = (np.asarray(out[k]) for k in ("tokens", "attn_mask", "loss_mask"))
  eos = tok.decode([tok.eos_id])
  texts = [tok.decode(toks[i][mask[i]]) for i in range(int(ctx.metrics["critical_items"]))]
  assert texts[0] == golds[0] + eos                     # the demonstration of group 0
  assert texts[1] == golds[1] + eos                     # group 1's one success
  assert texts[2:] == [g + eos for g in golds[2:] for _ in range(2)]
  for i in range(len(texts)):  # the prompt is context only
    assert tok.decode(toks[i][attn[i] & ~mask[i]]).endswith(ex[min(i, 1) if i < 2 else
                                                              2 + (i - 2) // 2]["prompt"])
  assert not attn[len(texts):].any()
  c.critical.gold_when_none = False
  out = critical.build(dataclasses.replace(run.setup, c=c), frozenset({critical.FIELD}))(
      rs.train, batch, ctx)[critical.FIELD]
  assert ctx.metrics["critical_gold"] == 0 and ctx.metrics["critical_items"] == 1 + 2 * (N - 2)


def test_tiny_propa_recipe_runs_sft_with_rl_on_trees(tmp_path):
  c = propa_chain.get_config("tiny")
  c.mesh = "data=1"
  wd = str(tmp_path / "run")
  loop.run(c, wd)
  for r in _rows(wd):  # L = L_RL + 1·L_SFT
    assert r["critical_on"] == 1.0 and r["critical_items"] >= 1
    np.testing.assert_allclose(r["loss"], r["pg_loss"] + r["critical_loss"], rtol=1e-5,
                               atol=1e-6)


def test_successes_need_sft():
  c = propa_chain.get_config("tiny")
  c.tree.branches = 0                # flat rollouts: the critical check, not the plan, refuses
  c.estimator = "grpo"
  c.critical.objective = "dpo"
  with pytest.raises(producers.SetupError, match="successes"):
    loop.check_method(c)
