"""Trained field producers (experiments/producers/learners.py): the implicit PRM learns which token
decides the outcome, the critic regresses on its targets, and bad settings are refused."""
import dataclasses
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from credit import parallel
from credit import tasks as tasks_lib
from experiments import loop, producers
from experiments.producers import learners


def tiny(estimator, **overrides):
  c = importlib.import_module("experiments.configs.grpo_arithmetic").get_config("tiny")
  c.mesh = "data=1"
  c.estimator = estimator
  for k, v in overrides.items():
    c[k] = v
  return c


@pytest.fixture(scope="module")
def prm_run(tmp_path_factory):
  c = tiny("prime")
  c.sft_steps = 0
  c.prompts_per_step, c.group_size = 8, 8
  c.prm.learning_rate, c.prm.beta = 1e-2, 0.5
  return loop.setup(c, str(tmp_path_factory.mktemp("prm")))


def _decided_batch(run, rng, n_rows, k=2, length=5):
  """Prompt "1+1=" then `length` random digits; the digit at response position k decides
  the label: '7' -> 1, '3' -> 0 (half each). Returns host arrays and the label."""
  tok, P = run.data.tokenizer, run.data.max_prompt_len
  toks, pmask = tasks_lib.encode_prompts(tok, ["1+1="] * n_rows, P)
  T = P + run.c.max_new_tokens
  digits = rng.integers(0, 10, (n_rows, length))
  label = np.arange(n_rows) % 2 == 0
  digits[:, k] = np.where(label, 7, 3)
  tokens = np.full((n_rows, T), tok.pad_id, np.int32)
  tokens[:, :P] = toks
  resp = np.zeros((n_rows, T), bool)
  for i in range(n_rows):
    ids = tok.encode("".join(map(str, digits[i])))
    tokens[i, P:P + length] = ids
    resp[i, P:P + length] = True
  return tokens, pmask, resp, label.astype(np.float32)


@pytest.mark.parametrize("objective", ["ce", "dpo"])
def test_implicit_prm_raises_the_reward_of_the_deciding_token(prm_run, objective):
  """Trained on outcome labels alone, the PRM's implicit reward β·log πφ/πref moves onto the
  token that decides the outcome: up where it made the answer right, down where wrong, while
  random tokens before it, which cannot predict the outcome, do not separate right from wrong
  (PRIME's claim, controlled; the same with OPRL's in-group trajectory DPO). (Tokens after the
  decision are left free: either objective only fixes the sequence sums.)"""
  run, rs = prm_run
  s, P, k = run.setup, run.data.max_prompt_len, 2
  c = s.c.copy_and_resolve_references()
  c.prm.objective = objective
  s = dataclasses.replace(s, c=c)
  trainer = learners._prm_trainer(s)
  learner = learners.init_prm(s, rs.train.params)
  ref = rs.train.params
  score = s.scorer()
  rng = np.random.default_rng(0)

  def batch():
    tokens, pmask, resp, label = _decided_batch(run, rng, 64)
    attn = np.zeros_like(resp)
    attn[:, :P] = pmask
    attn |= resp
    tokens, attn, resp, label = parallel.shard_batch((tokens, attn, resp, label), s.mesh)
    logprob_ref, _ = score(ref, tokens, attn)
    return {"tokens": tokens, "attn_mask": attn, "response_mask": resp, "reward": label,
            "logprob_ref": jnp.where(resp, logprob_ref, 0.0),
            "group_id": parallel.shard_batch(np.arange(64, dtype=np.int32) // 8, s.mesh)}

  first = None
  for i in range(40):
    learner, metrics = trainer.update(learner, batch(), jax.random.key(i))
    first = first if first is not None else float(metrics["loss"])
  assert float(metrics["loss"]) < 0.5 * first
  b = batch()
  logprob, _ = score(learner.params, b["tokens"], b["attn_mask"])
  r = np.asarray(s.c.prm.beta * jnp.where(b["response_mask"], logprob - b["logprob_ref"], 0.0))
  label = np.asarray(b["reward"]) > 0
  decisive, before = r[:, P + k], r[:, P:P + k]
  assert decisive[label].mean() > 0.3 and decisive[~label].mean() < -0.3
  # Tokens before the decision cannot predict the outcome: their rewards do not separate the
  # labels (they drift alike for both; the CE objective fixes only the sequence sums).
  gap = decisive[label].mean() - decisive[~label].mean()
  assert abs(before[label].mean() - before[~label].mean()) < 0.2 * gap


def test_pair_dpo_takes_every_better_worse_pair_of_a_group_only():
  # Rows 0-2 group 0 (rewards 1, 0, 0), rows 3-4 group 1 (1, 1: no pair), row 5 alone.
  lr = np.array([0.4, -0.2, 0.1, 0.3, 0.0, 2.0], np.float32)
  reward = np.array([1, 0, 0, 1, 1, 0], np.float32)
  gid = np.array([0, 0, 0, 1, 1, 2], np.int32)
  lp = np.stack([lr, np.zeros(6, np.float32)], axis=1)  # the sequence sums are lr
  kw = dict(logprob_prm=lp, logprob_ref=np.zeros_like(lp), response_mask=np.ones((6, 2), bool),
            reward=reward, beta=0.5)
  out = learners.prm_pair_dpo_loss(group_id=gid, **kw)
  want = np.mean([np.log1p(np.exp(-0.5 * (lr[0] - lr[j]))) for j in (1, 2)])
  np.testing.assert_allclose(float(out.loss), want, rtol=1e-5)
  assert float(out.metrics["prm_pair_accuracy"]) == 1.0
  none = learners.prm_pair_dpo_loss(group_id=np.arange(6, dtype=np.int32), **kw)
  assert float(none.loss) == 0.0  # no group with a reward spread: no pair, no update


def test_each_prm_method_trains_its_prm_against_the_reference_it_reads():
  # PRIME reads β log πφ/πref and trains with cross-entropy; OPRL reads β log πφ/πold and
  # trains with in-group trajectory DPO (prm.objective=auto), against π_old.
  for est, name, objective in (("prime", "implicit_prm", "ce"), ("oprl", "implicit_prm_old", "dpo")):
    c = tiny(est)
    planned = [p.producer.name for p in loop.check_method(c).plan]
    assert name in planned and learners.prm_objective(c) == objective, est
  c = tiny("oprl")
  c.prm.objective, c.prm.num_minibatches = "dpo", 4
  c.prompts_per_step, c.group_size = 2, 8  # 16 rows split in 4 would cut the groups
  with pytest.raises(producers.SetupError, match="keep whole groups"):
    learners.check_prm_config(c)


def test_critic_regresses_on_the_value_targets(tmp_path):
  """The critic producer's values move toward the targets it is given after each step (the
  estimator's `returns`), starting from 0 (zero value head); the reference critic reads the
  response after the answer context, so its values differ from the plain critic's."""
  c = tiny("redippo", sft_steps=0)
  c.critic.learning_rate = 1e-2
  run, rs = loop.setup(c, str(tmp_path))
  ctx = loop._context(run, rs)
  batch = {}
  for stage in run.stages:
    batch.update(stage(rs.train, batch, ctx))
  assert set(ctx.learners) == {"critic", "critic_ref"}
  resp = np.asarray(batch["response_mask"])
  assert np.all(np.asarray(batch["values"]) == 0) and np.all(np.asarray(batch["values_ref"]) == 0)
  target = jnp.where(batch["response_mask"], 0.7, 0.0)
  critics = [st for st in run.stages if st.after is not None]
  for _ in range(30):
    for st in critics:
      batch.update(st(rs.train, batch, ctx))
      st.after(batch, {"returns": target}, ctx)
  for field in ("values", "values_ref"):
    v = np.asarray(batch[field])
    assert np.all(v[~resp] == 0)
    np.testing.assert_allclose(v[resp].mean(), 0.7, atol=0.1, err_msg=field)
  assert not np.allclose(np.asarray(batch["values"]), np.asarray(batch["values_ref"]))
  assert int(ctx.learners["critic"].step) == 30
  assert np.isfinite(ctx.metrics["critic_vf_mse"]) and "critic_ref_vf_mse" in ctx.metrics


@pytest.mark.parametrize("key,value,match", [
    ("objective", "nca", "prm.objective='nca'; valid"),
    ("order", "later", "prm.order='later'; valid"),
    ("num_minibatches", 3, "prm.num_minibatches=3 must divide"),
])
def test_bad_prm_settings_are_refused_before_any_file(key, value, match, tmp_path):
  c = tiny("prime")
  c.prm[key] = value
  wd = tmp_path / "run"
  with pytest.raises(producers.SetupError, match=match):
    loop.run(c, str(wd))
  assert not wd.exists()
