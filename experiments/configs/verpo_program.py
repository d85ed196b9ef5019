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

Measured (2-core CPU, 2026-12-05, seed 0): the 120-step warm-up reaches held-out greedy
accuracy 0.695 (600 steps reach 1.0); 60 RL steps then lower it — VeRPO 0.535 / 0.574 / 0.582
at steps 20 / 40 / 60, GRPO 0.512 / 0.590 / 0.656 — while the sampled reward rises from 0.32
to ~0.5. Not yet a setting where RL helps; tune the learning rate and temperature first.
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
  c.learning_rate = 3e-4
  c.eval_every = 20
  c.checkpoint_every = 50
  if a.tiny:
    common.apply_tiny(c)
  return c
