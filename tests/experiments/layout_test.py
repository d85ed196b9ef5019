"""Re-laid rows (a response after another prompt) on rollouts whose prompts differ in length."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from credit.tasks.char_tokenizer import prompt_ids
from experiments import loop, producers
from experiments.configs import rloo_countdown


def test_from_and_to_rollout_are_inverse_on_the_response_columns():
  rng = np.random.default_rng(0)
  B, P, T, width = 5, 6, 14, 9
  start = rng.integers(2, P + 1, size=B).astype(np.int32)
  x = rng.normal(size=(B, T)).astype(np.float32)
  resp = np.arange(T)[None] >= start[:, None]
  part = producers.from_rollout(jnp.asarray(x), jnp.asarray(start), P)  # [B, T−P]
  for b in range(B):
    n = T - start[b]
    np.testing.assert_array_equal(np.asarray(part)[b, :min(n, T - P)], x[b, start[b]:][:T - P])
  relaid = jnp.concatenate([jnp.zeros((B, width)), part], axis=1)
  back = producers.to_rollout(relaid, jnp.asarray(start), width, T, 0.0)
  keep = resp & (np.arange(T)[None] < start[:, None] + T - P)
  np.testing.assert_array_equal(np.where(keep, np.asarray(back), 0.0), np.where(keep, x, 0.0))
  assert not np.asarray(back)[~resp].any()
  topk = producers.to_rollout(jnp.stack([relaid, -relaid], -1), jnp.asarray(start), width, T, -1)
  assert topk.shape == (B, T, 2)


@pytest.fixture(scope="module")
def countdown(tmp_path_factory):
  c = rloo_countdown.get_config("tiny")
  c.mesh = "data=1"
  run, rs = loop.setup(c, str(tmp_path_factory.mktemp("countdown")))
  ctx = loop._context(run, rs)  # pylint: disable=protected-access
  batch = {}
  batch.update(run.stages[0](rs.train, batch, ctx))
  return run, rs, ctx, batch


def test_a_rescored_response_is_scored_after_the_other_prompt(countdown):
  run, rs, ctx, batch = countdown
  s, tok, G = run.setup, run.data.tokenizer, run.setup.group_size
  h = batch["host"]
  plen = h["prompt_mask"].sum(1)
  assert len(set(plen.tolist())) > 1, "the regression needs prompts of different lengths"
  prompts = ["answer 7: " + str(p) for p in ctx.examples["prompt"]]
  width = max(len(prompt_ids(tok, p)) for p in prompts)
  got = np.asarray(producers.rescoring._response_rescorer(s, width)(  # pylint: disable=protected-access
      rs.train.params, prompts, batch, producers.response_starts(batch)))
  score = s.scorer(entropy=False)
  for b in range(0, h["tokens"].shape[0], G):
    resp = h["tokens"][b, h["response_mask"][b]].tolist()
    ids = prompt_ids(tok, prompts[b // G]) + resp
    lp, _ = score(rs.train.params, jnp.asarray([ids], jnp.int32), jnp.ones((1, len(ids)), bool))
    want = np.asarray(lp)[0, -len(resp):]
    np.testing.assert_allclose(got[b, h["response_mask"][b]], want, rtol=1e-4, atol=1e-5)
    assert not got[b, ~h["response_mask"][b]].any()


def test_evidence_nuisance_of_the_runner_matches_unpadded_passes(tmp_path):
  """VERPO's FEC field (`evidence_pass`) on countdown's variable-length prompts equals
  `evidence_nuisance` of hidden states computed row by row without padding."""
  from credit import scoring
  from credit.advantages.distill.verpo import evidence_nuisance
  from experiments import train
  c = rloo_countdown.get_config("tiny")
  c.mesh = "data=1"
  c.estimator = "verpo"
  c.estimator_kwargs = {"fec": True}
  c.teacher.context = "answer"
  run, rs = loop.setup(c, str(tmp_path / "w"))
  assert "evidence_pass" in [st.name for st in run.stages]
  ctx = loop._context(run, rs)  # pylint: disable=protected-access
  batch = {}
  for stage in run.stages:
    batch.update(stage(rs.train, batch, ctx))
  got = np.asarray(batch["evidence_nuisance"])
  h = batch["host"]
  tok, s = run.data.tokenizer, run.setup
  model = train.merge_model(s.graphdef, rs.train.params, s.rest)
  B, T = h["tokens"].shape
  h0 = np.zeros((B, T, model.config.hidden_size), np.float32)
  he = np.zeros_like(h0)
  for b in range(B):
    resp_cols = np.flatnonzero(h["response_mask"][b])
    resp = h["tokens"][b, resp_cols].tolist()
    ex = {k: ctx.examples[k][b // s.group_size] for k in ctx.examples}
    for out, prompt in ((h0, ex["prompt"]),
                        (he, producers.privileged_prompt(c, run.data.task, ex, "answer"))):
      ids = jnp.asarray([prompt_ids(tok, prompt) + resp], jnp.int32)
      hid, _, m = scoring.model_hidden(model, ids, jnp.ones(ids.shape, bool))
      pred, _ = scoring.next_token_hidden(hid, m)
      out[b, resp_cols] = np.asarray(pred)[0, -len(resp):]
  want = evidence_nuisance(hidden_plain=h0, hidden_evidence=he, unembed=model.unembedding(),
                           tokens=h["tokens"], mask=h["response_mask"],
                           fec_lambda=c.teacher.fec_lambda)
  np.testing.assert_allclose(got, np.asarray(want), rtol=2e-3, atol=2e-5)
  assert np.any(got != 0)
