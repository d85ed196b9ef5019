"""SLATE on chained arithmetic: truncated step-level sampling with judged steps.

Command (after the shared chain warm-up, exported once with `--config.steps=0`):
  python -m experiments.run --config experiments/configs/slate_chain.py --workdir runs/slate \\
      --config.warm_start_from=runs/chain_warmup/hf_policy --config.sft_steps=0
Variants: `:tiny` (2 steps, seconds; used by tests).
Time: 2.5 min per 100-step run on 2 CPU cores, from the shared chain warm-up.
Score: held-out greedy accuracy 0.828 / 0.863 / 0.848 after 100 steps, seeds 0 / 1 / 2 (GRPO
  0.879 / 0.930 / 0.891).

The setting is the shared chain setting (`settings.chain_setting`). At each step of a response
the sampler draws k = 4 candidate next steps from the same prefix (one prefill; a candidate ends
at its step delimiter ","), the task's `judge_step` scores each in the place of SLATE's
decomposed ternary LLM judge (r_think: the candidate's running sum right +1 / wrong −1; on the
answer step also r_answer, +1 / −1, and the early-answer bonus 0.1·(B_max − t)/B_max), the k
scores are normalised, and the path continues from one candidate drawn by softmax(A/0.7)
(algoprog/SLATE `configs/slate.yaml`). Every candidate is a row owning only its step, so the
loss sees each step once; `slate` normalises the candidates of each node. The loss is the code's
step objective: the candidate's ratio exp(mean token log-ratio) clipped at 0.2 (`gspo` with ε =
0.2, one ratio per row = per step, averaged over rows), plus the low-variance KL (k3) to the
reference with β = 0.001. Up to `slate.max_steps` = 3 steps: 4·3 = 12 rows per prompt (16
prompts per step).

Measured (2-core CPU; from the shared warm-up, seeds 0 / 1 / 2): held-out greedy
accuracy 0.828 / 0.863 / 0.848 after 100 steps (GRPO with 32 prompts x 8 samples: 0.879 /
0.930 / 0.891); the judge-guided paths of the rollouts reach 0.88; 2.5 min per run. With the
token-level `ppo_clip` instead of the step objective: 0.824 / 0.863 (seeds 0 / 1). README
trees table.
"""
from experiments.configs import common
from experiments.configs.settings import chain_setting


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = chain_setting(common.base_config())
  c.step_delimiters = (",",)
  c.estimator = "slate"
  # SLATE's step objective (code): the ratio of a candidate step is exp(mean token log-ratio)
  # clipped at 0.2, averaged over candidates (rows): GSPO's sequence ratio on each step row.
  c.policy_loss = "gspo"
  c.loss_kwargs.clip_low = 0.2
  c.loss_kwargs.clip_high = 0.2
  c.kl_coef = 0.001                     # the code's low-variance KL (k3) to the reference
  c.kl_kind = "k3"
  c.prompts_per_step = 16
  c.slate.candidates = 4
  c.slate.max_steps = 3
  c.slate.eta = 0.7
  c.slate.answer_bonus = 0.1
  if a.tiny:
    common.apply_tiny(c)
  return c
