"""ProCredit on `multidoc`: multi-hop QA over hidden documents read one per turn, credit from progress.

Command:
  python -m experiments.run --config experiments/configs/procredit_multidoc.py \\
      --workdir runs/procredit_multidoc
Variants: `:tiny` (2 steps, seconds; used by tests). The GRPO baseline on the same setting:
`--config.estimator=grpo`; IGPO (information gain of the gold answer after each turn):
`--config.estimator=igpo`. The same questions with SPD-RAG's per-document agents:
spd_rag_multidoc.py.

The setting (`credit.envs.multidoc`, single agent): a 1- or 2-hop question over 3 hidden
documents ("3 docs. city of boss of ann?"); each turn the policy reads one document with
`read(d)` (observation: the document's text, one gold fact among distractors) and ends with
`answer(kim)` (dispatch turns role 0, the answer role 1). The warm-up imitates the
demonstration, which reads the gold documents in chain order; where the facts are is not in
the prompt, so a policy that reads a wrong document must read another (two spare turns).

ProCredit (`credit.advantages.turn.procredit`; distill_and_structure.md B10): the change of
verified progress (gold facts revealed / h) over each turn, group-normalised over the turns of
the prompt's episodes, added to the GRPO outcome advantage.

Not measured yet.
"""
from experiments.configs import common
from experiments.configs.spd_rag_multidoc import multidoc_config


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = multidoc_config(a, task="multidoc")
  c.estimator = "procredit"
  c.policy_loss = "ppo_clip"
  return c
