"""Settings that several recipes share: a task, its warm-up and its RL schedule.

A recipe starts from one of these and then sets its method; recipes never import each other,
so changing one recipe never changes another. Every field is explained in `common.py`.

* `arithmetic(tiny)`: the arithmetic setting: 2-digit `a+b=` / `a-b=`, a 2500-step
  warm-up on a demonstrator that forgets each carry or borrow with probability 0.7, then 150
  GRPO steps. `dgpo_arithmetic`, `prime_arithmetic`, `ppo_gae_arithmetic`,
  `sipo_arithmetic`, `jolt_arithmetic`, `sft_teacher_arithmetic` and `beamperl_arithmetic`
  start here; `distill_arithmetic(tiny)` adds the teacher of `sft_teacher_arithmetic` for
  `opd_arithmetic` and `scope_arithmetic`.
* `default_arithmetic(tiny)`: the default recipe's own variant of it (`grpo_arithmetic`):
  a demonstrator that forgets each carry or borrow with probability 0.6, a warm-up that goes
  on (250 steps at a time, up to 5000) until its held-out greedy accuracy reaches 0.45, then
  200 GRPO steps.
* `chain_setting(c)`: chained arithmetic with running sums (`8+6-5=` -> `14,9=9`), a 1500-step
  warm-up on a demonstrator that forgets carries and borrows in the running sums with
  probability 0.7, then 100 RL steps. Every `*_chain` recipe uses it, so one exported warm-up
  (any of them with `--config.steps=0`, e.g. into `runs/chain_warmup`) serves them all.
"""
from experiments.configs import common

ARITHMETIC_SFT_STEPS = 2500
# The default recipe (`grpo_arithmetic.py`, `make run`; `default_arithmetic`): the same
# warm-up length on a demonstrator that slips less often, then more RL steps.
DEFAULT_DEMO_CARRY_ERROR = 0.6
DEFAULT_SFT_STEPS = 2500
DEFAULT_RL_STEPS = 200
# The held-out greedy accuracy the default warm-up must reach before RL (`sft_min_accuracy`):
# a little above the 0.42 that exact imitation of the demonstrator gets.
DEFAULT_MIN_WARMUP_ACCURACY = 0.45
# `grpo_arithmetic:sft_only`'s extra SFT steps: the RL phase's time divided by the SFT step
# time on an idle 2-core machine (200 x 0.40 s / 0.081 s, plus 8 evaluations: ~1000).
DEFAULT_CONTROL_EXTRA_SFT_STEPS = 1000
CHAIN_SFT_STEPS = 1500
# `sft_teacher_arithmetic.py`'s export, where the distillation recipes look for their teacher.
ARITHMETIC_TEACHER = "runs/teacher/hf_policy"


def arithmetic(tiny: bool = False):
  """The default setting with GRPO as its estimator; `tiny`: the 2-step test variant."""
  c = common.base_config()
  c.task = "arithmetic"
  c.task_kwargs.demo_carry_error = 0.7  # the imperfect demonstrator of the warm-up
  c.estimator = "grpo"
  c.policy_loss = "ppo_clip"
  c.sft_steps = ARITHMETIC_SFT_STEPS
  c.steps = 150
  c.learning_rate = 3e-4
  c.ppo_epochs = 1
  c.num_minibatches = 2
  c.eval_every = 25
  c.eval_samples = 0
  c.checkpoint_every = 50
  if tiny:
    common.apply_tiny(c)
  return c


def default_arithmetic(tiny: bool = False):
  """The default recipe's setting: `arithmetic` with its 2500-step warm-up on a demonstrator
  that forgets each carry or borrow with probability 0.6 (not 0.7), extended until its
  held-out greedy accuracy reaches 0.45 (`sft_min_accuracy`), then 200 GRPO steps."""
  c = arithmetic()
  c.task_kwargs.demo_carry_error = DEFAULT_DEMO_CARRY_ERROR
  c.sft_steps = DEFAULT_SFT_STEPS
  c.sft_min_accuracy = DEFAULT_MIN_WARMUP_ACCURACY  # else 250 more steps at a time, up to 5000
  c.steps = DEFAULT_RL_STEPS
  if tiny:
    common.apply_tiny(c)
  return c


def distill_arithmetic(tiny: bool = False):
  """The default setting with a teacher: `sft_teacher_arithmetic.py`'s export, PPO clip."""
  c = arithmetic(tiny)
  c.policy_loss = "ppo_clip"
  c.teacher.init_from = ARITHMETIC_TEACHER
  return c


def chain_setting(c):
  """The chained-arithmetic RL setting on `c`: task, warm-up, 100 RL steps, evaluation."""
  c.task = "chain"
  c.task_kwargs.max_digits = 1         # 1-digit operands: "8+6-5=" -> "14,9=9"
  c.task_kwargs.demo_carry_error = 0.7  # the imperfect demonstrator of the warm-up
  c.max_new_tokens = 9                  # the longest response ("18,27=27") + eos
  c.policy_loss = "ppo_clip"
  c.sft_steps = CHAIN_SFT_STEPS
  c.steps = 100
  c.learning_rate = 3e-4
  c.ppo_epochs = 1
  c.num_minibatches = 2
  c.eval_every = 25
  c.eval_samples = 0
  c.checkpoint_every = 50
  return c
