"""ProCredit on `multidoc`: multi-hop QA over hidden documents read one per turn, credit from progress.

Command:
  python -m experiments.run --config experiments/configs/procredit_multidoc.py \\
      --workdir runs/procredit_multidoc
Variants: `:tiny` (2 steps, seconds; used by tests). The GRPO baseline on the same setting:
`--config.estimator=grpo`; IGPO (information gain of the gold answer after each turn):
`--config.estimator=igpo`. The same questions with SPD-RAG's per-document agents:
spd_rag_multidoc.py.
Time: warm-up 14 min (1000 SFT steps), then ~16 s per RL step on 2 CPU cores shared with 3-4
  other runs.
Score: held-out greedy accuracy 0.570 -> 0.477 at step 50 (seed 0; GRPO 0.539, IGPO 0.562): no
  method improves on the warm-up here.

The setting (`credit.envs.multidoc`, single agent): a 1- or 2-hop question over 3 hidden
documents ("3 docs. city of boss of ann?"); each turn the policy reads one document with
`read(d)` (observation: the document's text, one gold fact among distractors) and ends with
`answer(kim)` (dispatch turns role 0, the answer role 1). The warm-up imitates the
demonstration, which reads the gold documents in chain order; where the facts are is not in
the prompt, so a policy that reads a wrong document must read another (two spare turns).

ProCredit (`credit.advantages.turn.procredit`; distill_and_structure.md B10): the change of
verified progress (gold facts revealed / h) over each turn, group-normalised over the turns of
the prompt's episodes, added to the GRPO outcome advantage.

Measured (seed 0, 2-core CPU shared with 3-4 other runs, ~16 s per RL step; all
from one warm-up, `--config.warm_start_from`; held-out greedy accuracy on 128 questions at
steps 0 / 25 / 50). The recipe's 300-step warm-up leaves the policy at 0.180 (sampled train
reward ~0.05; GRPO 0.078 / 0.102 and ProCredit 0.062 / 0.070 at 25 / 50: no signal to learn
from), so the warm-up here is 1000 steps (`sft_steps = 1000`; SFT loss 0.085, 14 min on the
loaded machine), at 0.570:

  | method | step 25 | step 50 |
  |---|---:|---:|
  | GRPO | 0.531 | 0.539 |
  | GRPO, lr 1e-4 | 0.555 | 0.531 |
  | IGPO | 0.469 | 0.562 |
  | ProCredit | 0.461 | 0.477 |

None improves on the warm-up in 50 steps (sampled train reward stays at 0.35-0.46). Not
diagnosed: a 1-hop question read in the wrong document is sometimes answered right by a
guessed name, which rewards guessing, and the demonstrations never show a second read after
a miss. The same questions with SPD-RAG's agents (`spd_rag_multidoc.py`) do improve (0.367 ->
0.500 in 30 steps).
"""
from experiments.configs import common
from experiments.configs.spd_rag_multidoc import multidoc_config


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = multidoc_config(a, task="multidoc")
  if not a.tiny:
    c.sft_steps = 1000            # 300 leave the policy at 0.18 (module docstring)
  c.estimator = "procredit"
  c.policy_loss = "ppo_clip"
  return c
