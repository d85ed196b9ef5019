"""GRPO on 2-digit arithmetic with a tiny from-scratch policy (the default recipe, `make run`).

Command:
  python -m experiments.run --config experiments/configs/grpo_arithmetic.py --workdir runs/grpo
Variants: `:tiny` (2 steps, seconds; used by tests); `:sft_only` (the control: the RL phase's
wall time spent on more supervised warm-up instead, no RL step).
Time: about 6.5 min start to exit on 2 idle CPU cores; 6.2-8.1 CPU-minutes measured (a
  warm-up extended by its accuracy check costs about 0.1 s per extra step).
Score: held-out greedy accuracy 0.504 -> 0.953 after 200 steps (seed 0, +0.449); seeds 0-4:
  +0.355 to +0.449 (mean +0.402), and +0.289 to +0.441 (mean +0.335) on another floating-point
  path; `benchmarks/default_recipe.py`.

The setting. Prompts are `a+b=` / `a-b=` with 2-digit operands (answers may be negative or have
3 digits). The warm-up imitates an imperfect demonstrator that forgets every carry and borrow
with probability 0.6 (`task_kwargs.demo_carry_error`: 67+58 -> "15", 52-38 -> "26"), the
classic slip of column arithmetic; about 58% of problems need a carry or a borrow. Imitating it
exactly gets at best the other 42% right under greedy decoding, however long the warm-up runs
(the slip is the mode, 0.6 against 0.4, a margin the warm-up learns rather than a tie that
rounding decides); the verifier is exact, so only the reward can take the policy beyond its
demonstrator. That is the regime RL fine-tuning is used in (SFT on a weaker model's traces,
then RL on verifiable rewards), and the error sits on a few digits of the answer, so
token-level credit matters.

Why q = 0.6, 200 RL steps and a checked warm-up. The former recipe (q = 0.7, 150 RL steps)
gave +0.488 / +0.359 / +0.488 for seeds 0-2 on one 2-core machine and +0.289 for seed 0 on
another: 2650 steps accumulate the CPU's rounding. With 30% of the carry demonstrations right,
how well the warm-up learns the carry, which RL must build on, is left to chance (our reading);
at q = 0.6, 40% of them are right, so the warm-up samples the right answer more often and GRPO
has more to reinforce. When the warm-up learns column arithmetic also varies: after 2500 steps
seed 3 was still at 0.320 (loss 0.56 where the others reach 0.14-0.20) and GRPO took it only
to 0.500. So the warm-up is checked (`sft_min_accuracy` = 0.45, a little above the 0.42 of
exact imitation): below it, 250 more steps at a time at the schedule's final learning rate, up
to 5000; seed 3 then passes at 3000 steps (0.473) and ends at 0.840. Measured (held-out greedy
accuracy, change over the warm-up's):
  * seeds 0-4: +0.449, +0.418, +0.422, +0.367, +0.355; with
    `XLA_FLAGS=--xla_cpu_enable_fast_math=true` (another floating-point path from the first
    warm-up step on, a proxy for another CPU): +0.441, +0.336, +0.305 (warm-up extended to
    3500 steps), +0.305, +0.289; the control (SFT only, same time) stays at its warm-up's level;
  * a shorter warm-up does not hold: 1500 SFT steps (q = 0.6) reach 0.488, and GRPO only
    0.797 at step 200 (+0.309, 0.695 at step 25); 1000 SFT steps reach 0.129 and GRPO stays
    near 0.1-0.15 for 75 steps (the warm-up has not learnt column arithmetic yet).
Earlier choices, measured on seed 0 while tuning (issue 9), with q = 0.7:
  * perfect demonstrator: SFT alone reaches 0.99 after a 2500-step warm-up (0.10 / 0.31 / 0.57
    / 0.86 / 0.97 after 750 / 1250 / 1750 / 2250 / 2500 steps of a 3000-step schedule), so no
    RL gain could show against the control; demonstrations
    limited to 2048 examples still generalise (0.38 after 1500 steps, 0.99 after 4000);
  * a demonstrator forgetting only the units carry (q = 0.7): 0.59 after 2500 SFT steps, GRPO
    0.88 at step 50 and 0.91 at 150, too little headroom for a sure 30 points; after 1500 SFT
    steps (0.49) GRPO reached only 0.69 in 200 steps;
  * learning rate (from the 2048-example warm-up at 0.38): 1e-3 or more from a fresh Adam state
    wrecks the policy within 25 steps (0.38 -> 0.08; 3e-3 -> 0.03), 1e-4 barely moves it;
    3e-4 is what the recipe uses.
"""
from experiments.configs import common, settings


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False, sft_only=False)
  c = settings.default_arithmetic(a.tiny)  # GRPO, PPO clip, q = 0.6, 2500 SFT + 200 RL steps
  if a.sft_only:  # the same budget, all of it supervised: no RL step
    c.sft_steps += 2 if a.tiny else settings.DEFAULT_CONTROL_EXTRA_SFT_STEPS
    c.steps = 0
  return c
