"""VeRPO on program synthesis from examples: difficulty-weighted unit tests as a dense reward.

Command:
  python -m experiments.run --config experiments/configs/verpo_program.py --workdir runs/verpo
Variants: `:tiny` (2 steps, seconds; used by tests). `--config.estimator=grpo` is the
all-tests-pass outcome baseline on the same setting.

The task (`credit.tasks.Program`): the prompt shows f at three inputs, "f(1)=5,f(2)=7,
f(3)=9;f(x)=", and the response writes f's body in a tiny expression language the task
interprets itself ("2*x+3"; `+ - * /`, `c?a:b`, recursion through `f(...)`, under step and
depth limits: a non-terminating, crashing or malformed program fails its tests). Five unit
tests run it at x = 1, 2, 3 (shown) and 0, 7 (held out). `unit_tests` gives `test_pass`
[B,5]; `verpo_tests` weights each test by its difficulty (1 − its pass rate in the group),
gives partial credit R = o + (1 − o)·α·d (o: every test passes, d: the weighted pass
fraction, α = 0.5) and normalises R like GRPO.

Measured (2-core CPU shared with other jobs, 2026-12-05): one 120-step warm-up (seed 0,
exported with `--config.steps=0`, then `--config.warm_start_from=<dir>/hf_policy
--config.sft_steps=0`) and 60 RL steps, held-out greedy accuracy at steps 0 / 20 / 40 / 60.
The seed also picks the eval set, so compare each row with its own step 0.
  lr 3e-4 (former default), s0: VeRPO .695 / .535 / .574 / .582, GRPO .695 / .512 / .590 / .656
  lr 1e-4, GRPO:   s0 .695 / .730 / .730 / .715   s1 .645 / .652 / .660 / .660
                   s2 .559 / .598 / .574 / .574
  lr 1e-4, VeRPO:  s0 .695 / .586 / .617 / .629   s1 .645 / .594 / .637 / .637
                   s2 .559 / .582 / .582 / .570
  lr 1e-4, VeRPO α = 0.2, s0: .695 / .582 / .609 / .633 (no better than α = 0.5);
  α = 0 (R = o), s0: .695 / .730 / .730 / .715, identical to GRPO (same metrics), so
  partial credit alone causes the drop.
At 1e-4 GRPO gains +0.017 on average at step 60 (+0.020 / +0.016 / +0.016; small, but positive
on every seed); VeRPO changes it by -0.066 / -0.008 / +0.012. The sampled reward rises 0.35 ->
0.41-0.49 (reward_mean, last 10 steps). No collapse in samples.jsonl: the failures are wrong
constants and coefficients. Two caveats. (1) Partial credit cannot help on this task: two
different polynomials of degree <= 2 agree on at most 2 of the 5 inputs, so a wrong polynomial
passes at most 2 tests, and d rewards chance agreement. In groups with no correct sample,
GRPO's σ-normalisation scales those chance differences up to full size, whatever α is. (2) The
"held-out" prompts are not new functions: `mixed` with max_coef 3, max_const 9 has only 70
distinct functions, and the train split holds every one of them. So held-out accuracy measures
how well the model has learned the training functions. The held-out tests (x = 0, 7) are also
part of the training reward.
One run: ~4-7 min on the shared machine (3.5-10 s per step).
"""
from experiments.configs import common


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = common.base_config()
  c.task = "program"
  c.task_kwargs = {"family": "mixed"}
  c.estimator = "verpo_tests"
  c.policy_loss = "ppo_clip"
  c.max_new_tokens = 10                 # the longest body ("x*x+3*x+9") + eos
  c.sft_steps = 120                     # 600 steps reach held-out accuracy 1.0 (no room for RL)
  c.steps = 60
  c.learning_rate = 1e-4                # 3e-4 lowers held-out accuracy for VeRPO and GRPO
  c.eval_every = 20
  c.checkpoint_every = 50
  if a.tiny:
    common.apply_tiny(c)
  return c
