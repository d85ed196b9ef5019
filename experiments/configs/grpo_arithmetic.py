"""GRPO on 2-digit arithmetic with a tiny from-scratch policy (the default recipe, `make run`).

Command:
  python -m experiments.run --config experiments/configs/grpo_arithmetic.py --workdir runs/grpo
Variants: `:tiny` (2 steps, seconds; used by tests); `:sft_only` (the control: the RL phase's
wall time spent on more supervised warm-up instead, no RL step).
Time: 4 min 51 s to 5 min 11 s start to exit on 2 CPU cores (warm-up ~200 s, RL ~74 s).
Score: held-out greedy accuracy 0.479 -> 0.924 after 150 steps (mean of seeds 0-2, +0.445);
  `:sft_only` 0.496.

The setting. Prompts are `a+b=` / `a-b=` with 2-digit operands (answers may be negative or have
3 digits). The warm-up imitates an imperfect demonstrator that forgets every carry and borrow
with probability 0.7 (`task_kwargs.demo_carry_error`: 67+58 -> "15", 52-38 -> "26"), the
classic slip of column arithmetic; about 58% of problems need a carry or a borrow. Imitating it
exactly gets at best the other 42% right under greedy decoding, however long the warm-up runs;
the verifier is exact, so only the reward can take the policy beyond its demonstrator. That is
the regime RL fine-tuning is used in (SFT on a weaker model's traces, then RL on verifiable
rewards), and the error sits on a few digits of the answer, so token-level credit matters.

Measured (README table; 3 seeds, 2 CPU cores):
  * warm-up, 2500 SFT steps (~200 s): held-out greedy accuracy 0.453 / 0.500 / 0.484; the
    model has learnt both the right and the slipped answers (seed 0: pass@8 0.88, mean@8 0.54);
  * RL, 150 GRPO steps (32 prompts x 8 samples, lr 3e-4; 0.37-0.42 s per step, ~74 s):
    0.941 / 0.859 / 0.973, mean +0.445; most of the rise comes in the first 25 steps (mean
    0.850), when RL moves probability onto the right answer the model already samples;
    4 min 51 s to 5 min 11 s per run, start to exit;
  * control (`:sft_only`), the RL phase's time spent on 900 more SFT steps: 0.488 / 0.520 /
    0.480 (mean 0.496, +0.017 over the warm-up): imitation stays at the demonstrator's level.
Choices, measured on seed 0 while tuning (issue 9), on the variants tried on the way:
  * perfect demonstrator: SFT alone reaches 0.99 after a 2500-step warm-up (0.10 / 0.31 / 0.57
    / 0.86 / 0.97 after 750 / 1250 / 1750 / 2250 / 2500 steps of a 3000-step schedule), so no
    RL gain could show against the control; demonstrations
    limited to 2048 examples still generalise (0.38 after 1500 steps, 0.99 after 4000);
  * a demonstrator forgetting only the units carry (q = 0.7): 0.59 after 2500 SFT steps, GRPO
    0.88 at step 50 and 0.91 at 150, too little headroom for a sure 30 points; after 1500 SFT
    steps (0.49) GRPO reached only 0.69 in 200 steps, so the warm-up stays at 2500;
  * learning rate (from the 2048-example warm-up at 0.38): 1e-3 or more from a fresh Adam state
    wrecks the policy within 25 steps (0.38 -> 0.08; 3e-3 -> 0.03), 1e-4 barely moves it;
    3e-4 is what the recipe uses.
"""
from experiments.configs import common, settings


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False, sft_only=False)
  c = settings.arithmetic(a.tiny)       # GRPO, PPO clip, 2500 SFT + 150 RL steps
  if a.sft_only:  # the same budget, all of it supervised: no RL step
    c.sft_steps += 2 if a.tiny else settings.ARITHMETIC_CONTROL_EXTRA_SFT_STEPS
    c.steps = 0
  return c
