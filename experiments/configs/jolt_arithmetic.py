"""JOLT on the default arithmetic setting: one policy, a privileged teacher role and a student role.

Command:
  python -m experiments.run --config experiments/configs/jolt_arithmetic.py --workdir runs/jolt
Several methods from one warm-up: export it once (`--config.steps=0`, this recipe, so that it is
the privileged warm-up below), then `--config.warm_start_from=runs/<warm-up>/hf_policy
--config.sft_steps=0` for this recipe and for `grpo_arithmetic.py`.
Variants: `:tiny` (2 steps, seconds; used by tests); `:student_reward` (ρ = 1: the student role
also gets its own GRPO advantage, "with student rewards"); `:plain_warm_up` (the
warm-up of `grpo_arithmetic.py`, no privileged demonstration).
Time: 2 min 30 s per 50-step run (2.1 s per step; GRPO 55 s), 2 CPU cores shared with other
  work.
Score: held-out greedy accuracy 0.441 -> 0.883 at step 50 from the privileged warm-up, as GRPO
  (seed 0).

The setting is the default one (`settings.arithmetic`). Each step the policy plays two roles
(`experiments/extensions/jolt.py`, `credit.advantages.distill.jolt`):
  * student role: 32 prompts x 8 samples after the plain prompt, the same tokens re-scored with
    the gold answer before the prompt (`teacher.context=answer`, prefix "answer {answer}: ");
    advantage ℓ_teacher-role − ℓ_student-role per token (`jolt`, ρ = 0);
  * teacher role (`jolt.teacher_samples=8`): 8 samples per prompt AFTER the privileged prompt,
    rewarded by the verifier, re-scored without the answer; advantage GRPO(r) − β·(ℓ_T − ℓ_S)
    per token (`jolt_teacher`, β = 0.05), so that it stays reachable for the student role.
Both roles' PPO-clip losses are summed into one update of the one set of parameters.
The warm-up (`jolt.sft_privileged=0.5`): half of its demonstrations are shown after the
privileged prompt and answer correctly, so that the model can read the context, as a pretrained
LLM reads a hint. A from-scratch model that never saw the prefix cannot: from the plain warm-up
its teacher role answers 1% of the train prompts (the student role 29%), ℓ_T − ℓ_S is about −6
nats per token, and the student role is distilled toward that (table below).

Measured (2 CPU cores shared with other work, load 5-9; seed 0; 50 RL steps, lr
3e-4 cosine over the 50 steps, eval every 10; held-out greedy accuracy on 256 problems; GRPO and
JOLT from the same exported warm-up each):
  * privileged warm-up (2500 SFT steps, q = 0.5; step 0: 0.441): GRPO 0.809 / 0.820 / 0.855 /
    0.883 / 0.883 at steps 10-50, JOLT 0.816 / 0.828 / 0.855 / 0.863 / 0.883: the same. The
    teacher role answers all train prompts (it copies the answer; its GRPO term is 0, only the
    KL term trains it: `jolt_kl_teacher_student` 0.33 -> 0.12), the student role's gap
    `jolt_kl_student_teacher` falls from 2.98 to 1.25 nats per token.
  * plain warm-up of `grpo_arithmetic.py` (step 0: 0.398): GRPO 0.578 / 0.641 / 0.664 / 0.691
    / 0.711, JOLT 0.191 / 0.129 / 0.121 / 0.117 / 0.105, `:student_reward` 0.203 / 0.070 /
    0.062 / 0.062 / 0.062 (collapse: the teacher role never learns to read the context).
  * step time (median): JOLT 2.1 s (update of both roles 1.33 s, teacher-role sampling,
    verification and its two scoring passes 0.38-0.42 s, the student's self-teacher pass
    0.18 s) against GRPO's 0.53-0.60 s; 2 min 30 s per 50-step run against 55 s.
"""
from experiments.configs import common, settings


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False, student_reward=False, plain_warm_up=False)
  c = settings.arithmetic(a.tiny)
  c.estimator = "jolt"                 # the student role's rows
  c.policy_loss = "ppo_clip"
  c.teacher.context = "answer"         # the privileged context of the teacher role
  c.teacher.prefix = "{context} {text}: "
  c.jolt.teacher_samples = c.group_size  # G_T teacher-role samples per prompt
  c.jolt.loss_coef = 1.0               # L = L_student + 1.0 * L_teacher
  c.jolt.sft_privileged = 0.0 if a.plain_warm_up else 0.5  # warm-up rows after the context
  if a.student_reward:
    c.estimator_kwargs.reward_coef = 1.0
  return c
