"""HyperEyes' TRACE tool-cost reward on `lookup`: accuracy plus a bonus for answering with no
more tool calls than the prompt's reference, GRPO over the result.

Command:
  python -m experiments.run --config experiments/configs/trace_cost_lookup.py --workdir runs/trace_cost
Variants: `:tiny` (2 steps, seconds; used by tests). The GRPO baseline on the same setting:
`--config.estimator=grpo`.
Time: 1.2 s per RL step (GRPO 1.1 s) on 2 CPU cores, 50 steps from the 300-step lookup warm-up.
Score: held-out greedy accuracy 0.562 -> 0.992 at step 50 (seed 0; GRPO 1.000).

The setting is `igpo_lookup.py`'s (1-2 hop questions over a per-question knowledge base, an
imperfect demonstrator that answers 2-hop questions after one lookup, 300 warm-up steps, 50 RL
steps of 16 prompts x 8 episodes). The `tool_usage` producer counts each episode's tool-call
rounds (`tool_calls`) and its environment rounds (`tool_cost`); `trace_cost`
(`credit.advantages.shaping.trace_cost`, code-verified against DeepExperience/HyperEyes'
reward function) adds to the 0/1 accuracy a bonus ranked among the group's correct episodes
(0.05-0.20 within the prompt's reference cost, −0.10..−0.02 above it; −0.1 for a wrong answer
with too few or too many calls) and normalises as GRPO. The released reward function never
sets a reference (its cache update is skipped, so every correct episode is "bad"); this recipe
sets it from the group's cheapest correct episode and keeps the best one seen
(`init_missing_ref=True`, `update_ref=True`, ours), so the bonus can reward staying within it.

Measured (seed 0, 2-core CPU; both from the same 300-step warm-up at held-out greedy
accuracy 0.562): held-out accuracy 0.992 / 0.992 at steps 25 / 50 (GRPO 0.992 / 1.000); turns
per episode 2.42 over steps 1-10 and 2.57 over steps 41-50 (GRPO 2.42 and 2.57): the policy
learns the second lookup of 2-hop questions under both, and makes no redundant call for the
cost term to remove — lookup asks for exactly hops + 1 turns, so this setting cannot show what
TRACE saves. 1.2 s per step (GRPO 1.1 s).
"""
from experiments.configs import common
from experiments.configs.igpo_lookup import lookup_config


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = lookup_config(a)
  c.estimator = "trace_cost"
  c.estimator_kwargs = {"init_missing_ref": True, "update_ref": True}
  c.policy_loss = "ppo_clip"
  return c
