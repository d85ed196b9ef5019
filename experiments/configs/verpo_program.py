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
  c.sft_steps = 600
  c.steps = 100
  c.learning_rate = 3e-4
  c.eval_every = 25
  c.checkpoint_every = 50
  if a.tiny:
    common.apply_tiny(c)
  return c
