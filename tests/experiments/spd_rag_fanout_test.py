"""SPD-RAG's fan-out inside training (`multidoc_agents` with `fanout=True`): `askall` asks every
document's agent, the D·B calls of a turn are one sampler call, the agent rows hold one row
per document, the document reward (plain and class-balanced) reaches them, and the
`:tiny,fanout,document` and `:tiny,fanout,balanced` recipes run."""
from __future__ import annotations

import functools
import json
import os

import jax
import numpy as np
import pytest

from credit.envs import Limits, run_episode
from credit.envs.rollout import TurnLayout
from credit.envs.subagents import (ASK_ALL, NONE, AgentsMultiTurnSampler, MultiDocAgentsEnv,
                                   balanced_document_reward, merge_answers, oracle_answer)
from credit.tasks import CharTokenizer, get_task
from experiments.extensions import subagents
from tests.experiments.spd_rag_runner_test import _Recorder
from tests.subagent_batching_test import count_agent_rows
from tests.tiny_decoder import scaled_tiny_decoder

TOK = CharTokenizer()
D = 3
TASK = get_task("multidoc_agents", min_hops=2, max_hops=2, num_docs=D, num_distractors=2,
                agent_max_tokens=5, fanout=True)
K = 3  # two askall turns, then the answer
LIMITS = Limits(max_turns=K, max_observation_chars=24)  # D merged answers fit
EXAMPLES = TASK.generate(np.random.default_rng(5), 2)
G = 2


def test_merge_answers():
  assert merge_answers(["none", "bob", "", "bob", "kim"]) == "bob, kim"
  assert merge_answers(["none", "", "empty"]) == NONE


def test_demonstration_asks_every_document_per_hop():
  e = EXAMPLES[0]
  world, docs, _ = TASK.documents(e["world_seed"])
  turns = TASK.demonstration_turns(e)
  assert turns == [f"{ASK_ALL}({s} {r})" for s, r, _ in world.chain] + [f"answer({world.answer})"]
  ep = run_episode(TASK.make_env(e, LIMITS), turns)
  assert [r.observation for r in ep.results[:2]] == [o for _, _, o in world.chain]
  assert [r.reward for r in ep.results] == [1.0, 1.0, 0.0] and ep.outcome == 1.0
  assert [r.role for r in ep.results] == [0, 0, 2]
  assert ep.results[0].info["agent_correct"] == [True] * D
  # the agents' warm-up: every hop asked of every document, "none" from all but the gold one
  pairs = TASK.agent_demonstrations(e, np.random.default_rng(0))
  assert len(pairs) == 2 * D
  assert [a for _, a in pairs].count(NONE) >= 2 * (D - 1)


def test_askall_calls_each_document_in_order_and_merges():
  e = EXAMPLES[1]
  world, docs, where = TASK.documents(e["world_seed"])
  env = TASK.make_env(e, Limits(max_turns=4, max_observation_chars=16))
  s, r, o = world.chain[0]
  answers = [NONE] * D
  answers[where[0]] = o
  agent = _Recorder(answers + ["kim", "", NONE])
  env.bind_agent(agent)
  env.reset()
  assert env.agent_request(f"{ASK_ALL}({s} {r})") == [(d, f"{s} {r}") for d in docs]
  assert not agent.calls  # agent_request changes nothing
  res = env.step(f"{ASK_ALL}({s} {r})")
  assert agent.calls == [(d, f"{s} {r}") for d in docs]
  assert res.observation == o and res.reward == 1.0
  assert res.info["agent_call"] == [{"tag": i + 1} for i in range(D)]
  assert res.info["agent_correct"] == [True] * D
  assert res.info["agent_holds"] == [d == where[0] for d in range(D)]
  res = env.step(f"{ASK_ALL}(zzz boss)")
  assert res.observation == "kim" and res.reward == 0.0
  assert res.info["agent_correct"] == [False, False, True]  # only the "none" is right
  assert res.info["agent_holds"] == [False] * D
  assert env.step(f"{ASK_ALL}({'x' * 20})").observation.startswith("error")
  assert env.agent_request(f"{ASK_ALL}(ann boss)") == []  # the last turn: nobody would read
  res = env.step(f"{ASK_ALL}(ann boss)")
  assert len(agent.calls) == 2 * D and res.done and res.info["agent_call"] is None
  # without fanout the tool does not exist
  plain = get_task("multidoc_agents", min_hops=2, max_hops=2, num_docs=D, num_distractors=2)
  env = plain.make_env(plain.generate(np.random.default_rng(5), 1)[0], LIMITS)
  env.reset()
  assert "unknown tool askall" in env.step(f"{ASK_ALL}(ann boss)").info["error"]


def test_balanced_document_reward_values():
  # one of four documents holds the fact: a right answer there 1, a right "none" 1/3
  np.testing.assert_allclose(
      balanced_document_reward(correct=[True, True, False, True],
                               holds=[True, False, False, False]), [1, 1 / 3, 0, 1 / 3])
  # "none" everywhere: the holding document wrong, the others' class still sums to 1
  r = balanced_document_reward(correct=[False, True, True, True],
                               holds=[True, False, False, False])
  assert r[0] == 0 and np.isclose(r[1:].sum(), 1.0)
  # two holding documents: 1/2 each; every answer right: each class totals 1
  r = balanced_document_reward(correct=[True] * 5, holds=[True, False, True, False, False])
  np.testing.assert_allclose(r, [1 / 2, 1 / 3, 1 / 2, 1 / 3, 1 / 3], rtol=1e-6)
  # no document holds it (a missing fact): 1/n each; a single ask: the plain 0/1
  np.testing.assert_allclose(balanced_document_reward(correct=[True, False, True],
                                                      holds=[False] * 3), [1 / 3, 0, 1 / 3])
  assert balanced_document_reward(correct=[True], holds=[True]).tolist() == [1.0]
  assert balanced_document_reward(correct=[True], holds=[False]).tolist() == [1.0]
  assert balanced_document_reward(correct=[False], holds=[True]).tolist() == [0.0]
  with pytest.raises(ValueError, match="equal length"):
    balanced_document_reward(correct=[True, False], holds=[True])


class _Asking(MultiDocAgentsEnv):
  """askall of the first unrevealed hop (of a missing fact once all are), then the answer,
  right on even rows; `agent_request` sees the same action."""
  final_ok = True

  def _script(self, action):
    if self.num_turns < self.limits.max_turns - 1:
      action = self._gold_calls(self._ep.state)[0]
      return f"{ASK_ALL}(zzz boss)" if action.startswith("answer") else action
    return self.fmt.answer(self.world.answer if self.final_ok else "xxx")

  def step(self, action):
    return super().step(self._script(action))

  def agent_request(self, action):
    return super().agent_request(self._script(action))


@functools.lru_cache(maxsize=None)
def _produced():
  model = scaled_tiny_decoder(TOK.vocab_size)
  width = subagents.agent_prompt_width(TASK, TOK)
  lay = TurnLayout(prompt_width=width, max_turns=K, max_action_tokens=4,
                   max_observation_tokens=24)
  sampler = AgentsMultiTurnSampler(model, tokenizer=TOK, layout=lay,
                                   agent_max_tokens=TASK.agent_max_tokens)
  rows_per_call = count_agent_rows(sampler)
  envs = []
  for b, e in enumerate(x for x in EXAMPLES for _ in range(G)):
    env = TASK.make_env(e, LIMITS)
    env.__class__ = _Asking
    env.final_ok = b % 2 == 0
    envs.append(env)
  gid = np.arange(len(envs)) // G
  out = sampler(model, envs, key=jax.random.key(0), group_id=gid)
  M = (K - 1) * TASK.agent_calls_per_turn
  kw = dict(slots_M=M, width=width + TASK.agent_max_tokens, num_turns=K, pad_id=TOK.pad_id)
  rows = {src: subagents.agent_rows(out.trajectories, out.reward, gid, reward_source=src, **kw)
          for src in ("outcome", "document", "document_balanced")}
  return out, rows, rows_per_call


def test_a_turns_fanout_is_one_sampler_call_across_documents_and_episodes():
  out, _, rows_per_call = _produced()
  B = len(out.trajectories)
  assert rows_per_call == [B * D] * (K - 1)
  for traj in out.trajectories:
    for res, obs in zip(traj.results[:K - 1], traj.observations):
      recs = res.info["agent_call"]
      assert len(recs) == D
      assert obs == merge_answers([rec["answer"] for rec in recs])
      assert [rec["prompt"].split(" q: ")[1] for rec in recs] == [res.info["question"] + "?"] * D
      assert len({rec["prompt"] for rec in recs}) == D  # one call per document


def test_agent_rows_one_per_document_with_the_document_reward():
  out, rows, _ = _produced()
  B, M = len(out.trajectories), (K - 1) * D
  doc, outcome = rows["document"], rows["outcome"]
  assert doc["response_mask"].any(1).all() and doc["tokens"].shape[0] == B * M
  np.testing.assert_array_equal(outcome["reward"], np.repeat(out.reward, M))
  want = []
  for traj in out.trajectories:
    for res in traj.results[:K - 1]:
      docs = [p["prompt"][len("doc: "):].split(" q: ")[0] for p in res.info["agent_call"]]
      want += [rec["answer"] == oracle_answer(d, res.info["question"])[0]
               for rec, d in zip(res.info["agent_call"], docs)]
  np.testing.assert_array_equal(doc["agent_correct"], want)
  np.testing.assert_array_equal(doc["reward"], np.asarray(want, np.float32))
  assert doc["answers"] == [rec["answer"] for traj in out.trajectories
                            for res in traj.results[:K - 1] for rec in res.info["agent_call"]]
  # balanced: per turn, a right answer scores 1/k on the k holding documents, 1/(D-k) on
  # the others (the second askall asks a missing fact when the question has one hop)
  bal, want_bal = rows["document_balanced"], []
  for traj in out.trajectories:
    for res in traj.results[:K - 1]:
      holds = np.asarray(res.info["agent_holds"])
      k = holds.sum()
      want_bal += [ok * (1 / k if h else 1 / (D - k))
                   for ok, h in zip(res.info["agent_correct"], holds)]
  np.testing.assert_allclose(bal["reward"], want_bal, rtol=1e-6)
  np.testing.assert_array_equal(bal["agent_correct"], doc["agent_correct"])
  with pytest.raises(ValueError, match="reward_source"):
    subagents.agent_rows(out.trajectories, out.reward, np.zeros(B, int), slots_M=M,
                         width=doc["tokens"].shape[1], num_turns=K, pad_id=TOK.pad_id,
                         reward_source="balanced")


def test_recipe_fanout_variant_and_slots():
  from experiments.configs import spd_rag_multidoc
  c = spd_rag_multidoc.get_config("tiny,fanout,document")
  assert c.task_kwargs.fanout and c.max_turns == 4 and c.subagents.reward == "document"
  assert subagents.slots(c) == (c.max_turns - 1) * c.task_kwargs.num_docs
  subagents.check(c)
  assert subagents.row_sets(c)[0].group_size == c.group_size * subagents.slots(c)
  c = spd_rag_multidoc.get_config("tiny,fanout,balanced")
  assert c.subagents.reward == "document_balanced" and subagents.credit_mode(c) == "estimator"
  subagents.check(c)
  c.subagents.credit = "episode"
  with pytest.raises(subagents.SetupError, match="subagents.reward=document_balanced"):
    subagents.check(c)
  c.subagents.credit, c.subagents.reward = "auto", "balanced"
  with pytest.raises(subagents.SetupError, match="valid: outcome"):
    subagents.check(c)


@pytest.mark.parametrize("variant", ["document", "balanced"])
def test_tiny_fanout_run_trains_the_agents_on_their_document_reward(tmp_path, monkeypatch,
                                                                    variant):
  """`:tiny,fanout,document` and `:tiny,fanout,balanced` end to end, the coordinator scripted to `askall` the gold hops
  (batched through `agent_request`), so every document's agent answers on every asking turn
  and its row is trained on its own reward."""
  from experiments import loop
  from experiments.configs import spd_rag_multidoc
  step, request = MultiDocAgentsEnv.step, MultiDocAgentsEnv.agent_request
  script = lambda self, action: _Asking._script(self, action)  # final_ok: class default
  monkeypatch.setattr(MultiDocAgentsEnv, "final_ok", True, raising=False)
  monkeypatch.setattr(MultiDocAgentsEnv, "_script", script, raising=False)
  monkeypatch.setattr(MultiDocAgentsEnv, "step", lambda self, a: step(self, script(self, a)))
  monkeypatch.setattr(MultiDocAgentsEnv, "agent_request",
                      lambda self, a: request(self, script(self, a)))
  c = spd_rag_multidoc.get_config(f"tiny,fanout,{variant}")
  c.mesh, c.eval_every, c.num_eval_examples, c.checkpoint_every = "data=1", 0, 4, 0
  c.debug_checks = True
  c.max_new_tokens = 120
  loop.run(c, str(tmp_path / "run"))
  with open(os.path.join(tmp_path, "run", "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f if '"loss"' in line]
  assert len(rows) == c.steps
  for m in rows:
    # every non-final turn asks all D documents (1-hop questions ask a missing fact after)
    assert m["agent_calls"] == (c.max_turns - 1) * c.task_kwargs.num_docs
    assert 0.0 <= m["agent_accuracy"] <= 1.0 and np.isfinite(m["loss_agents"])
    assert m["reward_mean"] == 1.0
