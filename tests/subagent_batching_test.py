"""SPD-RAG's document agents answered in one batched sampler call per turn across the episodes
(credit/envs/subagents.py `AgentsMultiTurnSampler._step_envs`, `DocAgents.prefetch`)."""
from __future__ import annotations

import jax
import numpy as np

from credit.envs.rollout import TurnLayout
from credit.envs.subagents import EMPTY, AgentsMultiTurnSampler, MultiDocAgentsEnv
from experiments.extensions import subagents
from tests.experiments.spd_rag_runner_test import EXAMPLES, G, K, LIMITS, TASK, TOK, _model


class _Asking(MultiDocAgentsEnv):
  """The coordinator asks the gold question of its first unrevealed hop (a missing fact once
  all are) on every turn but the last, where it answers; `agent_request` sees the same
  action, so the engine can batch the asks."""

  def _script(self, action):
    if self.num_turns < self.limits.max_turns - 1:
      action = self._gold_calls(self._ep.state)[0]
      return "ask(1, zzz boss)" if action.startswith("answer") else action
    return self.fmt.answer(self.world.answer)

  def step(self, action):
    return super().step(self._script(action))

  def agent_request(self, action):
    return super().agent_request(self._script(action))


def count_agent_rows(sampler: AgentsMultiTurnSampler) -> list[int]:
  """Wraps `sampler`'s document-agent sampler; the returned list gets each call's row count."""
  rows_per_call = []
  inner = sampler.agent_sampler.__call__

  def counting(model_state, **kw):
    rows_per_call.append(len(kw["prompt_tokens"]))
    return inner(model_state, **kw)

  sampler.agent_sampler = counting
  return rows_per_call


def test_agent_calls_of_a_turn_are_one_batch_and_answer_their_episodes():
  width = subagents.agent_prompt_width(TASK, TOK)
  lay = TurnLayout(prompt_width=width, max_turns=K, max_action_tokens=4,
                   max_observation_tokens=8)
  sampler = AgentsMultiTurnSampler(_model(), tokenizer=TOK, layout=lay,
                                   agent_max_tokens=TASK.agent_max_tokens)
  rows_per_call = count_agent_rows(sampler)
  envs = []
  for e in (x for x in EXAMPLES[:2] for _ in range(G)):
    env = TASK.make_env(e, LIMITS)
    env.__class__ = _Asking
    envs.append(env)
  out = sampler(_model(), envs, key=jax.random.key(0), group_id=np.arange(len(envs)) // G)
  B = len(envs)
  assert rows_per_call == [B] * (K - 1)  # one call per asking turn, every episode's ask in it
  prompts = set()
  for traj in out.trajectories:
    calls = [r.info["agent_call"] for r in traj.results if r.info.get("agent_call")]
    assert len(calls) == K - 1
    for rec, obs, res in zip(calls, traj.observations, traj.results):
      assert obs == (rec["answer"] or EMPTY)  # the episode got its own call's answer
      assert rec["prompt"].startswith("doc: ") and res.info["question"] in rec["prompt"]
      resp = rec["response_mask"]
      assert TOK.decode(rec["tokens"][resp].tolist()).strip() == rec["answer"]
      prompts.add(rec["prompt"])
  assert len(prompts) > 1
