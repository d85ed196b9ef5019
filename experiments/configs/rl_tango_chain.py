"""RL Tango on chained arithmetic: the policy and a generative verifier trained together by RL.

Command (after the shared chain warm-up, exported once with `--config.steps=0`):
  python -m experiments.run --config experiments/configs/rl_tango_chain.py --workdir runs/tango \\
      --config.warm_start_from=runs/chain_warmup/hf_policy --config.sft_steps=0
Variants: `:tiny` (2 steps, seconds; used by tests); `:tips` trains the verifier as TIPS does
(reward 1[final = outcome] only, Dr.GRPO advantages without std, no class weights).
Time: 1.77 s per RL step (1.56 s of it the verifier) plus its 91 s warm-up, 100 steps on 2 CPU
  cores.
Score: held-out greedy accuracy 0.434 -> 0.887 at step 100 (seed 0; GRPO 0.879).

The setting is the shared chain setting (`settings.chain_setting`) (1-digit operands, running
sums, a demonstrator that forgets carries). The verifier (`experiments/producers/verifier.py`,
`c.verifier`) is a copy of the warmed-up policy. It first learns the output format by supervised
steps on the policy's own responses, every verdict labelled with the outcome (it never sees a
step label), then plays `solo_steps` verifier-only RL steps, then both train: each step the
verifier judges every response ("yn:n": one verdict per step, then the final one), its step
verdicts ±1/S become `step_reward`, `rl_tango` mixes their z-scored returns with the GRPO
outcome advantage (α = 0.5 decaying to 1e-3 over the run, the code's exp schedule), and the
verifier is updated on the same responses with reward 1[final = outcome] + 0.8·format,
class-balanced.

`--config.verifier.enabled=False` runs rl_tango with the task's exact step judge in the
verifier's place (the upper bound of what a verifier can give); `--config.estimator=grpo`
drops the process reward. The verifier's metrics (`verifier_step_acc`,
`verifier_wrong_step_recall`) score its step verdicts against that judge, and
`verifier_step_acc_outcome_copy` gives the baseline of copying the outcome onto every step.

Measured (seed 0, 2 CPU cores, after the fix of single-turn step ids; held-out
greedy accuracy at steps 25 / 50 / 75 / 100 from the warm-up's 0.434): this recipe 0.828 /
0.875 / 0.887 / 0.887 (1.77 s per step, 1.56 of them the verifier; its warm-up 91 s); with the
task's exact judge 0.836 / 0.859 / 0.867 / 0.871 (0.21 s); GRPO 0.820 / 0.863 / 0.867 / 0.879
(0.40 s). The verifier's final verdicts are 87-89% right, its step verdicts no better than
copying the outcome (README, "A generative verifier trained with the policy").
"""
from experiments.configs import common
from experiments.configs.settings import chain_setting


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False, tips=False)
  c = chain_setting(common.base_config())
  c.estimator = "rl_tango"
  c.verifier.enabled = True
  c.verifier.sft_steps = 200
  c.verifier.solo_steps = 10
  c.verifier.samples = 4
  if a.tips:  # RUCBM/TIPS run_math_process_judge_grpo.sh: norm_adv_by_std=False, no format term
    c.verifier.format_weight = 0.0
    c.verifier.advantage = "dr_grpo"
    c.verifier.balance = "none"
  if a.tiny:
    common.apply_tiny(c)
    c.verifier.sft_steps = 2
    c.verifier.solo_steps = 1
    c.verifier.samples = 2
  return c
