"""SPD-RAG's document agents (credit/envs/subagents.py, experiments/extensions/subagents.py):
contexts, observations, roles and masks, spd_rag credit on a produced batch, a tiny end-to-end
run."""
from __future__ import annotations

import functools
import itertools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import credit
from credit.envs import Limits, run_episode
from credit.envs.rollout import TurnLayout
from credit.envs.subagents import (EMPTY, AgentsMultiTurnSampler, MultiDocAgentsEnv,
                                   agent_prompt, oracle_answer)
from credit.tasks import CharTokenizer, get_task
from experiments.extensions import subagents
from tests.tiny_decoder import scaled_tiny_decoder

TOK = CharTokenizer()
TASK = get_task("multidoc_agents", min_hops=2, max_hops=2, num_docs=3, num_distractors=2,
                agent_max_tokens=5)
K = 3  # coordinator turns: two asks (agents answer), then the synthesis
LIMITS = Limits(max_turns=K, max_observation_chars=8)
EXAMPLES = TASK.generate(np.random.default_rng(3), 3)
G = 2  # episodes per prompt


class _Recorder:
  def __init__(self, answers):
    self.answers, self.calls = list(answers), []

  def __call__(self, doc, question):
    self.calls.append((doc, question))
    return self.answers.pop(0), {"tag": len(self.calls)}


def test_oracle_demonstration_roles_and_progress():
  e = EXAMPLES[0]
  ep = run_episode(TASK.make_env(e, LIMITS), TASK.demonstration_turns(e))
  world, docs, where = TASK.documents(e["world_seed"])
  assert [r.role for r in ep.results] == [0, 0, 2]  # dispatch, dispatch, synthesis
  assert [r.observation for r in ep.results[:2]] == [o for _, _, o in world.chain]
  assert [r.reward for r in ep.results] == [1.0, 1.0, 0.0]
  assert [r.progress for r in ep.results] == [0.5, 1.0, 1.0]
  assert ep.outcome == 1.0
  s, r, o = world.chain[0]
  assert oracle_answer(docs[where[0]], f"{s} {r}") == (o, None)
  assert oracle_answer(docs[where[0]], "zzz boss") == ("none", None)


def test_agents_see_only_document_and_question_and_coordinator_sees_the_answer():
  e = EXAMPLES[1]
  world, docs, where = TASK.documents(e["world_seed"])
  env = TASK.make_env(e, Limits(max_turns=4, max_observation_chars=8))
  agent = _Recorder(["bob", "", "kim"])
  env.bind_agent(agent)
  prompt = env.reset()
  s, r, o = world.chain[0]
  res = env.step(f"ask({where[0] + 1}, {s} {r})")
  assert agent.calls == [(docs[where[0]], f"{s} {r}")]  # its document + sub-question only
  assert prompt not in agent_prompt(*agent.calls[0])
  assert res.observation == "bob" and res.info["agent_call"] == {"tag": 1}
  assert res.info["agent_answer"] == "bob" and res.reward == float(o == "bob")
  assert env.step("ask(1, ann boss)").observation == EMPTY  # an empty answer
  assert env.step("ask(7, ann boss)").observation.startswith("error")  # no agent called
  res = env.step("ask(2, ann boss)")  # the last turn: nobody would read the answer
  assert len(agent.calls) == 2 and res.done and res.info["agent_call"] is None


def _model():
  return scaled_tiny_decoder(TOK.vocab_size)


class _Scripted(MultiDocAgentsEnv):
  """The coordinator's turns replaced: the gold ask of the first unrevealed hop (an ask of a
  missing fact once all are), then the answer, right on rows with `final_ok`."""
  final_ok = True

  def step(self, action):
    if self.num_turns < self.limits.max_turns - 1:
      action = self._gold_calls(self._ep.state)[0]
      action = "ask(1, zzz boss)" if action.startswith("answer") else action
    else:
      action = self.fmt.answer(self.world.answer if self.final_ok else "xxx")
    return super().step(action)


def _scripted_envs():
  envs = []
  for b, e in enumerate(x for x in EXAMPLES[:2] for _ in range(G)):
    env = TASK.make_env(e, LIMITS)
    env.__class__ = _Scripted
    env.final_ok = b % 2 == 0
    envs.append(env)
  return envs


@functools.lru_cache(maxsize=None)
def _produced():
  width = subagents.agent_prompt_width(TASK, TOK)
  lay = TurnLayout(prompt_width=width, max_turns=K, max_action_tokens=4,
                   max_observation_tokens=8)
  sampler = AgentsMultiTurnSampler(_model(), tokenizer=TOK, layout=lay,
                                   agent_max_tokens=TASK.agent_max_tokens)
  envs = _scripted_envs()
  gid = np.arange(len(envs)) // G
  out = sampler(_model(), envs, key=jax.random.key(0), group_id=gid)
  rows = subagents.agent_rows(out.trajectories, out.reward, gid, slots_M=K - 1,
                              width=width + TASK.agent_max_tokens, num_turns=K,
                              pad_id=TOK.pad_id)
  return out, rows, width


def test_coordinator_observation_is_the_agents_decoded_answer():
  out, rows, width = _produced()
  for b, traj in enumerate(out.trajectories):
    calls = [r.info["agent_call"] for r in traj.results if r.info.get("agent_call")]
    assert len(calls) == K - 1
    for m, (rec, obs) in enumerate(zip(calls, traj.observations)):
      assert obs == (rec["answer"] or EMPTY)
      i = b * (K - 1) + m
      resp = rows["response_mask"][i]
      assert TOK.decode(rows["tokens"][i][resp].tolist()).strip() == rec["answer"]
      # the agent's row: bos + its own prompt, no coordinator text
      assert TOK.decode(rows["tokens"][i][rows["prompt_mask"][i]].tolist()) == rec["prompt"]
      assert traj.prompt not in rec["prompt"] and rec["prompt"].startswith("doc: ")
    # the observation tokens of the coordinator's row are those answers
    obs_ids = out.tokens[b][out.obs_mask[b]].tolist()
    assert TOK.decode(obs_ids) == "".join(traj.observations)


def test_agent_rows_roles_masks_and_recorded_logprobs():
  out, rows, width = _produced()
  B, M = len(out.trajectories), K - 1
  used = rows["response_mask"].any(1)
  assert used.all() and rows["tokens"].shape == (B * M, width + TASK.agent_max_tokens)
  np.testing.assert_array_equal(rows["group_id"], np.repeat(np.arange(B) // G, M))
  np.testing.assert_array_equal(rows["reward"], np.repeat(out.reward, M))
  np.testing.assert_array_equal(rows["step_mask"][:, 0], used)
  assert not rows["step_mask"][:, 1:].any()
  np.testing.assert_array_equal(rows["turn_role"], rows["step_mask"].astype(np.int32))
  np.testing.assert_array_equal(rows["turn_id"] == 0, rows["response_mask"])
  assert not (rows["prompt_mask"] & rows["response_mask"]).any()
  # coordinator rows: dispatch turns role 0, the synthesis turn role 2
  np.testing.assert_array_equal(out.turn_role, np.tile([0, 0, 2], (B, 1)))
  np.testing.assert_array_equal(out.reward, np.tile([1.0, 0.0], B // 2))
  # the recorded sampler log-probs (temperature 1) are the model's on the agent's own row
  attn = rows["prompt_mask"] | rows["response_mask"]
  logits = _model()(jnp.asarray(rows["tokens"]), mask_BT=jnp.asarray(attn))[0]
  lp = jax.nn.log_softmax(np.asarray(logits, np.float64)[:, :-1], -1)
  want = np.take_along_axis(lp, rows["tokens"][:, 1:, None], -1)[..., 0]
  resp = rows["response_mask"][:, 1:]
  np.testing.assert_allclose(rows["logprob_sampler"][:, 1:][resp], want[resp], atol=2e-4)


def _spd_rag_reference(groups, roles, rewards, lengths, budget, coef, eps=1e-6):
  """Per-(group, role) normalisation of R − c·max(0, L − B)/B over a flat list of turns."""
  r = np.asarray(rewards, np.float64) - coef * np.maximum(np.asarray(lengths) - budget, 0) / budget
  out = np.zeros_like(r)
  keys = list(zip(groups, roles))
  for key in set(keys):
    idx = [i for i, k in enumerate(keys) if k == key]
    if len(idx) > 1:
      v = r[idx]
      out[idx] = (v - v.mean()) / (v.std(ddof=1) + eps)
  return out


def test_spd_rag_on_a_produced_batch_equals_numpy_reference():
  out, rows, _ = _produced()
  est = credit.get_estimator("spd_rag")
  kw = dict(num_groups=2, token_budget=3.0, budget_coef=0.5)
  coord = est.fn(reward=out.reward, step_mask=out.step_mask, turn_role=out.turn_role,
                 turn_id=out.turn_id, group_id=out.group_id, response_mask=out.response_mask,
                 **kw)
  agents = est.fn(reward=rows["reward"], step_mask=rows["step_mask"],
                  turn_role=rows["turn_role"], turn_id=rows["turn_id"],
                  group_id=rows["group_id"], response_mask=rows["response_mask"], **kw)
  # every call of the step as one flat list: coordinator turns, then agent answers
  turns = []
  for b in range(len(out.reward)):
    for k in np.flatnonzero(out.step_mask[b]):
      tok = out.response_mask[b] & (out.turn_id[b] == k)
      turns.append(("c", b, k, out.group_id[b], out.turn_role[b, k], out.reward[b], tok.sum()))
  for i in np.flatnonzero(rows["step_mask"][:, 0]):
    turns.append(("a", i, 0, rows["group_id"][i], 1, rows["reward"][i],
                  rows["response_mask"][i].sum()))
  ref = _spd_rag_reference([t[3] for t in turns], [t[4] for t in turns],
                           [t[5] for t in turns], [t[6] for t in turns], 3.0, 0.5)
  assert np.abs(ref).max() > 0.1  # the reference has signal (mixed outcomes in a group)
  for t, a in zip(turns, ref):
    which, b, k = t[:3]
    adv, resp, tid = ((coord, out.response_mask, out.turn_id) if which == "c" else
                      (agents, rows["response_mask"], rows["turn_id"]))
    sel = resp[b] & (tid[b] == k)
    np.testing.assert_allclose(np.asarray(adv)[b][sel], a, rtol=1e-4, atol=1e-5)
  assert not np.asarray(agents)[~rows["response_mask"]].any()


def test_episode_credit_gives_each_agent_row_its_episode_advantage():
  adv = jnp.asarray([[1.0, 1.0, 0.0], [0.0, -2.0, -4.0]])
  resp = jnp.asarray([[1, 1, 0], [0, 1, 1]], bool)
  got = subagents.episode_advantages(adv, resp, jnp.asarray([0, 0, 1, 1]),
                                     jnp.asarray([[1, 0], [0, 0], [1, 1], [0, 1]], bool))
  np.testing.assert_allclose(got, [[1.0, 0.0], [0.0, 0.0], [-3.0, -3.0], [0.0, -3.0]])


def test_config_checks():
  from experiments.configs import spd_rag_multidoc
  c = spd_rag_multidoc.get_config("tiny")
  assert subagents.on(c) and subagents.credit_mode(c) == "estimator"
  assert subagents.credit_mode(spd_rag_multidoc.get_config("tiny,grpo")) == "episode"
  c.subagents.credit = "both"
  with pytest.raises(subagents.SetupError, match="subagents.credit"):
    subagents.check(c)
  c = spd_rag_multidoc.get_config("tiny,grpo")
  c.subagents.credit = "estimator"
  subagents.check(c)  # grpo needs only what the agent rows have
  c.async_rollouts = True
  with pytest.raises(subagents.SetupError, match="async_rollouts"):
    subagents.check(c)


def test_tiny_run_trains_the_agents(tmp_path, monkeypatch):
  """The :tiny recipe, the coordinator scripted (gold asks, then a right or wrong answer in
  turn) so that agents are called and outcomes differ within a group: the agents' rows are
  in the update with spd_rag credit."""
  from experiments import loop
  from experiments.configs import spd_rag_multidoc
  parity = itertools.count()
  step = MultiDocAgentsEnv.step

  def scripted(self, action):
    if self.num_turns < self.limits.max_turns - 1:
      action = self._gold_calls(self._ep.state)[0]
      action = "ask(1, zzz boss)" if action.startswith("answer") else action
    else:
      action = self.fmt.answer(self.world.answer if next(parity) % 2 else "xxx")
    return step(self, action)

  monkeypatch.setattr(MultiDocAgentsEnv, "step", scripted)
  c = spd_rag_multidoc.get_config("tiny")
  c.mesh, c.eval_every, c.num_eval_examples, c.checkpoint_every = "data=1", 0, 4, 0
  c.debug_checks = True
  c.max_new_tokens = 120  # no episode ends by the token budget: K actions + 4 answers fit
  loop.run(c, str(tmp_path / "run"))
  with open(os.path.join(tmp_path, "run", "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f if '"loss"' in line]
  assert len(rows) == c.steps
  for m in rows:
    assert m["agent_calls"] == c.max_turns - 1  # every non-final turn asked an agent
    assert m["agent_adv_abs_mean"] > 0.5 and np.isfinite(m["loss_agents"])
    assert m["reward_mean"] == 0.5
