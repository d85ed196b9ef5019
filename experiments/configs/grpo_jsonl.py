"""GRPO on a local JSON-lines file of math problems, rewarded by math_verify.

Command:
  python -m experiments.run --config experiments/configs/grpo_jsonl.py --workdir runs/jsonl \\
      --config.data_path=train.jsonl [--config.eval_samples=8]
Formats (detected from the first line, or --config.data_format=gsm8k|math|plain):
  GSM8K {"question", "answer": "...#### 42"}, MATH {"problem", "solution": "...\\boxed{...}"},
  plain {"prompt", "answer"} (other names via --config.prompt_field / --config.answer_field).
  Gold answers that math_verify cannot parse are refused at start-up, naming their lines.
The first min(num_eval_examples, 10%) lines are held out for evaluation.
Variants: `:tiny` (2 steps, seconds; used by tests; without a data_path it trains on a
generated GSM8K-style file of 2-digit sums, written once to the temp dir). From scratch
(character tokenizer) the policy only suits short prompts with short answers; real data wants
--config.init_from=<HF checkpoint dir> and a larger max_new_tokens.
Time: not measured yet (it depends on the data file and the model).
Score: not measured yet.
"""
import json
import os
import tempfile

import numpy as np

from experiments.configs import common


def tiny_gsm8k_file(n: int = 64) -> str:
  """A GSM8K-style file of n 2-digit sums/differences in the temp dir (same content each call)."""
  from credit.tasks import get_task
  path = os.path.join(tempfile.gettempdir(), f"credit_grpo_jsonl_tiny_{n}.jsonl")
  if not os.path.exists(path):
    examples = get_task("arithmetic", max_digits=2).generate(np.random.default_rng(0), n)
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as f:
      for e in examples:
        f.write(json.dumps({"question": e["prompt"],
                            "answer": f"{e['prompt']}{e['answer']}\n#### {e['answer']}"}) + "\n")
    os.replace(tmp, path)  # atomic: concurrent test processes never see a partial file
  return path


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = common.base_config()
  c.task = "jsonl"                # user data from data_path, rewarded by MathVerifier.
  c.data_path = ""                # the JSONL file (required: --config.data_path=FILE).
  c.data_format = "auto"          # auto | gsm8k | math | plain (see common.py).
  c.estimator = "grpo"            # group-relative advantages.
  c.policy_loss = "ppo_clip"      # clipped surrogate.
  c.sft_steps = 0                 # no warm-up: demonstrations are only the boxed gold answer.
  c.steps = 200                   # RL steps.
  c.learning_rate = 1e-4          # AdamW peak lr for RL.
  c.max_new_tokens = 16           # response budget (tokens; raise it for reasoning models).
  c.num_eval_examples = 128       # held-out prompts (at most 10% of the file).
  c.eval_every = 25               # steps between held-out evaluations.
  c.eval_samples = 4              # k: also report eval_mean_at_k / eval_pass_at_k (0 = off).
  c.ppo_epochs = 1                # passes over each rollout batch.
  c.num_minibatches = 2           # minibatches per epoch.
  if a.tiny:
    common.apply_tiny(c)
    c.sft_steps = 0               # MathVerifier demonstrations (\boxed{..}) are not in the
                                  # character tokenizer's vocabulary.
    c.eval_samples = 2            # keep the sampled evaluation cheap in tests.
    c.max_new_tokens = 8          # answers are 1-3 digits.
    c.data_path = tiny_gsm8k_file()  # overridden by --config.data_path / a test's own file.
  return c
