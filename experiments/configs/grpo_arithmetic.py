"""GRPO on 2-digit arithmetic with a tiny from-scratch policy (the default recipe, `make run`).

Command:
  python -m experiments.run --config experiments/configs/grpo_arithmetic.py --workdir runs/grpo
Variants: `:tiny` (2 steps, seconds; used by tests); `:sft_only` (the control: the RL phase's
wall time spent on more supervised warm-up instead, no RL step).

The setting. Prompts are `a+b=` / `a-b=` with 2-digit operands (answers may be negative or have
3 digits). The warm-up imitates an imperfect demonstrator that forgets every carry and borrow
with probability 0.7 (`task_kwargs.demo_carry_error`: 67+58 -> "15", 52-38 -> "26"), the
classic slip of column arithmetic; about 58% of problems need a carry or a borrow. Imitating it
exactly gets at best the other 42% right under greedy decoding, however long the warm-up runs;
the verifier is exact, so only the reward can take the policy beyond its demonstrator. That is
the regime RL fine-tuning is used in (SFT on a weaker model's traces, then RL on verifiable
rewards), and the error sits on a few digits of the answer, so token-level credit matters.

Measured (README table; 2 CPU cores):
  * warm-up, 2500 SFT steps: held-out greedy accuracy ~0.45 (the model has learnt both the
    right and the slipped answers: pass@8 ~0.88, mean@8 ~0.54);
  * RL, 150 GRPO steps (32 prompts x 8 samples, lr 3e-4): greedy accuracy ~0.93; most of the
    rise comes in the first 25 steps, when RL moves probability onto the right answer it
    already samples;
  * control, the RL phase's wall time spent on more SFT (`:sft_only`): stays at the
    demonstrator's level.
Choices, measured on seed 0 (issue 9): with a perfect demonstrator, SFT alone reaches 0.97 in
2500 steps, so no RL gain could be shown against the control; with demonstrations limited to
2048 examples SFT still generalises (0.99 after 4000 steps). A shorter warm-up (1500 steps,
0.49) leaves RL less to sharpen (0.69 after 200 steps). RL at lr 1e-3 or above from a
fresh Adam state destroys the warm-up policy within 25 steps (0.38 -> 0.08); 1e-4 barely
moves it in 150 steps.
"""
from experiments.configs import common

SFT_STEPS = 2500
# The control's extra SFT steps: the RL phase's wall time (150 steps + 6 evaluations) divided by
# the SFT step time, both measured in the same runs (README).
CONTROL_EXTRA_SFT_STEPS = 900


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False, sft_only=False)
  c = common.base_config()
  c.task = "arithmetic"
  c.task_kwargs.demo_carry_error = 0.7
  c.estimator = "grpo"
  c.policy_loss = "ppo_clip"
  c.sft_steps = SFT_STEPS
  c.steps = 150
  c.learning_rate = 3e-4
  c.ppo_epochs = 1
  c.num_minibatches = 2
  c.eval_every = 25
  c.eval_samples = 0
  c.checkpoint_every = 50
  if a.tiny:
    common.apply_tiny(c)
  if a.sft_only:  # the same budget, all of it supervised: no RL step
    c.sft_steps += 2 if a.tiny else CONTROL_EXTRA_SFT_STEPS
    c.steps = 0
  return c
