"""The search agent's long-horizon recipe (search_agent_qa.py:long): 32 turns, context
management through the runner's `context` extension, uneven demonstrations."""
import numpy as np

from credit.envs.context import ContextSampler
from credit.envs.rollout import encode_episode
from experiments import extensions, loop
from experiments.configs import search_agent_qa


def test_long_variant_plays_32_turns_with_context_management():
  for arg in ("long", "long,tiny"):
    c = search_agent_qa.get_config(arg)
    assert c.max_turns >= 32 and c.task_kwargs.min_hops == 3
    assert "context_management" in [e.name for e in extensions.enabled(c)]
  assert "context_management" not in [e.name for e in extensions.enabled(search_agent_qa.get_config("tiny"))]
  c = search_agent_qa.get_config("long,tiny")
  data = loop.build_data(c)
  (own,) = loop.turn_samplers(c, data)
  assert own.cls is ContextSampler and own.kwargs == {"keep_last": 2, "compact_to": 0.5}
  assert data.task.max_turns <= c.max_turns
  # uneven demonstrations (distractor searches), and each fits the context as a final one
  lay = loop.turn_layout(c, data)
  lengths = []
  for ex in data.train[:24]:
    ((prompt, actions, obs),) = data.task.demonstration_episodes(ex)
    lengths.append(len(actions))
    assert len(obs) == len(actions) - 1 and all(o == "(dropped)" for o in obs[:-2])
    row = encode_episode(data.tokenizer, lay, prompt, actions, obs)
    assert row["response_mask"].sum() > 0 and row["turn_id"].max() == len(actions) - 1
  assert max(lengths) - min(lengths) >= 4
