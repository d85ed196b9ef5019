"""VeRPO on `python_program`: Python programs written from examples, run on unit tests in the sandbox.

Command:
  python -m experiments.run --config experiments/configs/verpo_python.py --workdir runs/verpo_py
Variants: `:tiny` (2 steps, seconds; used by tests). `--config.estimator=grpo` is the
all-tests-pass outcome baseline; `--config.task_kwargs.reward=fraction` makes the outcome the
fraction of tests passed.
Time: `:tiny` 32 s of CPU time in the runner plus ~27 ms per sandboxed run (2.1 min wall at
  load average 14 on a 2-core CPU; verpo_program `:tiny` 34 s CPU measured alongside); the full
  run is not yet measured.
Score: not yet measured.

The task (`credit.envs.pyprogram.PythonProgram`): the target functions, held-out split and
unit-test inputs of `verpo_program` (`credit.tasks.Program`, "mixed": 30 linear and 40
quadratic functions, 14 held out), but the prompt asks for Python, "f(1)=5,f(2)=7,f(3)=9;
python:", and the response is a program defining f ("def f(x):\\n return 2*x+3"). Each response
runs once, in a fresh sandboxed interpreter (`credit.envs.sandbox.run_python`: CPU, memory,
file-size and process limits, a wall timeout, no network, no files outside its scratch
directory), which calls f on the five test inputs (three shown, two held out) with a timer per
test; only the inputs enter the sandbox, the expected outputs stay outside. A syntax error, an
exception, an endless loop or a blocked operation fails the tests it touches and the run goes
on. `unit_tests` gives `test_pass` [B,5] for `verpo_tests` (difficulty-weighted tests, partial
credit R = o + (1 − o)·α·d, normalised like GRPO); the reward's runs are cached, so the unit
tests cost no second run, and a batch's programs run 4 at a time.
"""
from experiments.configs import common


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = common.base_config()
  c.task = "python_program"
  c.task_kwargs = {"family": "mixed",          # 30 linear + 40 quadratic target functions
                   "eval_function_fraction": 0.2,  # 14 of them held out for the eval split
                   "per_test_s": 0.5,          # one call of f
                   "cpu_s": 3.0,               # one response's run, every test
                   "reward": "all_pass"}       # the outcome: every unit test passes
  c.estimator = "verpo_tests"
  c.policy_loss = "ppo_clip"
  c.max_new_tokens = 30                 # "def f(x):\n return x*x+3*x+9" + eos
  c.sft_steps = 120
  c.steps = 60
  c.learning_rate = 1e-4
  c.eval_every = 20
  c.checkpoint_every = 50
  if a.tiny:
    common.apply_tiny(c)
  return c
