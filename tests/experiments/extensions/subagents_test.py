"""SPD-RAG's document agents as an extension (`experiments/extensions/subagents.py`): the row
set, the rows hook (the `episode` credit) and the multi-turn sampler it brings. The agent rows
end to end are `tests/experiments/spd_rag_runner_test.py`."""
import importlib
import types

import jax.numpy as jnp
import numpy as np
import pytest

from credit.envs.subagents import AgentsMultiTurnSampler
from experiments import extensions, producers, train
from experiments.extensions import subagents


def _config(recipe="spd_rag_multidoc"):
  return importlib.import_module(f"experiments.configs.{recipe}").get_config("tiny")


def test_row_set_of_the_agents():
  c = _config()
  (rows,) = subagents.row_sets(c)
  assert rows.name == subagents.ROLE and rows.metric_prefix == "agent_"
  assert rows.loss_metric == "loss_agents" and rows.weight == float(c.subagents.loss_coef)
  assert rows.group_size == c.group_size * (c.max_turns - 1)
  assert subagents.EXTENSION.main_role == "episodes"
  assert subagents.row_sets(_config("grpo_arithmetic")) == ()


def test_estimator_loss_term_is_refused_with_agents():
  c = _config()
  c.estimator_loss_coef = 1.0
  c.estimator = "vimpo"
  with pytest.raises(producers.SetupError, match="sub-agent rows have no targets"):
    subagents.check(c)


def test_rows_hook_gives_agents_their_episodes_mean_advantage():
  """Credit `episode`: an agent row's advantage is its episode's mean over the episode's
  policy tokens, on the agent's response tokens."""
  adv = jnp.asarray([[1.0, 3.0, 0.0], [-2.0, 0.0, 0.0]])
  resp = np.array([[True, True, False], [True, False, False]])
  agent_resp = np.array([[True, True], [False, False], [True, False], [False, False]])
  rows = {"tokens": np.ones((4, 2), np.int32), "response_mask": agent_resp,
          "attn_mask": np.ones((4, 2), bool)}
  ctx = types.SimpleNamespace(metrics={})
  step = extensions.Step(None, {"advantages": adv, "response_mask": resp, subagents.ROWS: rows,
                                subagents.HOST: {"episode": np.array([0, 0, 1, 1]),
                                                 "response_mask": agent_resp}}, ctx, False)
  main = {"tokens": np.zeros((2, 3), np.int32)}
  parts = subagents.update_batch({train.MAIN: main}, step,
                                 update_fields=("tokens", "advantages"), num_groups=1)
  assert parts[train.MAIN] is main and set(parts[subagents.ROLE]) == {"tokens", "advantages",
                                                                       "attn_mask"}
  np.testing.assert_allclose(parts[subagents.ROLE]["advantages"],
                             [[2.0, 2.0], [0, 0], [-2.0, 0.0], [0, 0]])
  np.testing.assert_allclose(ctx.metrics["agent_adv_mean"], 2 / 3, rtol=1e-6)


def test_turn_sampler_is_the_agents_sampler_with_their_prompt_width():
  from credit.tasks import CharTokenizer, get_task
  c = _config()
  task = get_task(c.task, **dict(c.task_kwargs))
  data = types.SimpleNamespace(task=task, tokenizer=CharTokenizer())
  own = subagents.turn_sampler(data)
  assert own.cls is AgentsMultiTurnSampler
  assert own.kwargs == {"agent_max_tokens": int(task.agent_max_tokens)}
  assert own.prompt_width == subagents.agent_prompt_width(task, data.tokenizer) > 0


def _record(width, answer):
  resp = np.zeros(width, bool)
  resp[-2:] = True
  return {"tokens": np.ones(width, np.int32), "prompt_mask": ~resp, "response_mask": resp,
          "logprob_sampler": np.full(width, -0.5, np.float32),
          "logprob_raw": np.full(width, -0.5, np.float32), "answer": answer}


def test_agent_rows_reward_is_the_outcome_or_the_agents_own():
  """`reward_source`: the episode's outcome on every slot, or the agent's answer against its
  document (`agent_correct`), 0 on an unused slot."""
  step = lambda rec, ok: types.SimpleNamespace(info={"agent_call": rec, "agent_correct": ok})
  trajs = [types.SimpleNamespace(results=[step(_record(4, "bob"), True),
                                          step(_record(4, "kim"), False),
                                          step(None, False)]),
           types.SimpleNamespace(results=[step(_record(4, "none"), True)])]
  kw = dict(slots_M=2, width=4, num_turns=3, pad_id=0)
  out = subagents.agent_rows(trajs, np.array([0.0, 1.0]), np.array([0, 0]), **kw)
  np.testing.assert_array_equal(out["reward"], [0, 0, 1, 1])
  doc = subagents.agent_rows(trajs, np.array([0.0, 1.0]), np.array([0, 0]),
                             reward_source="document", **kw)
  np.testing.assert_array_equal(doc["reward"], [1, 0, 1, 0])
  np.testing.assert_array_equal(doc["agent_correct"], [True, False, True, False])
  assert doc["answers"] == ["bob", "kim", "none", None]
  with pytest.raises(ValueError, match="reward_source"):
    subagents.agent_rows(trajs, np.zeros(2), np.zeros(2), reward_source="judge", **kw)


def test_document_reward_needs_the_estimators_credit():
  c = importlib.import_module("experiments.configs.spd_rag_multidoc").get_config("tiny,document")
  assert c.subagents.reward == "document" and subagents.credit_mode(c) == "estimator"
  subagents.check(c)
  c.subagents.credit = "episode"
  with pytest.raises(producers.SetupError, match="subagents.credit=estimator"):
    subagents.check(c)
  c.subagents.reward = "judge"
  with pytest.raises(producers.SetupError, match="subagents.reward"):
    subagents.check(c)
  g = importlib.import_module("experiments.configs.spd_rag_multidoc").get_config(
      "tiny,grpo,document")
  assert subagents.credit_mode(g) == "estimator"  # auto: the agents' own reward needs it
