"""PRIME on the default arithmetic setting: outcome RLOO plus the dense implicit process
reward of an online implicit PRM trained next to the policy (the implicit-PRM family).

Command:
  python -m experiments.run --config experiments/configs/prime_arithmetic.py --workdir runs/prime
Variants: `:tiny` (2 steps, seconds; used by tests).
Time: ~1.5 s per RL step on an idle 2-core CPU (GRPO 0.39 s), 150 steps from the default
  warm-up.
Score: held-out greedy accuracy 0.887 after 150 steps (mean of seeds 0-2; GRPO 0.924).

The setting is the default one (`settings.arithmetic`) (2-digit +/-, a warm-up on a demonstrator
that forgets carries, 150 RL steps of 32 prompts x 8 samples), so the two compare directly. What
PRIME adds (arXiv 2502.01456; PRIME-RL/PRIME's released code is the default where it differs
from the paper, see `credit.advantages.implicit.prime`):

* the PRM π_φ starts as a copy of the warmed-up policy and the reference π_ref is the frozen
  warmed-up policy, as in PRIME (both from the SFT model);
* each step the PRM takes one AdamW step on the batch's outcome labels with the cross-entropy
  objective on β·Σ_t log π_φ/π_ref (β = 0.05, `beta_train`), *then* scores the batch
  (`prm.order="update_first"`, the code's `update=before`); grad clip 10 as PRIME;
* advantages: the token scores q = log π_φ − log π_ref normalised by the batch's largest
  |reverse cumulative sum| (the code's `batch_norm`), the group-mean baseline of the code,
  plus the outcome RLOO on the last token, reverse-summed and whitened over the batch;
  PPO clip (ε = 0.2), no KL term, as the authors' script.
The PRM learning rate is 2x the policy's, PRIME's ratio (1e-6 vs 5e-7 at 7B). The runner
reports `prm_loss`, `prm_accuracy` (sign of β·Σq against the label) and `time_prm`.

Measured (2 CPU cores; each seed's RL from the same warm-up as GRPO's via
`--config.warm_start_from`, which reproduces the full GRPO runs exactly), held-out greedy
accuracy after 150 steps, seeds 0 / 1 / 2: PRIME 0.930 / 0.777 / 0.953 (mean 0.887), GRPO
0.941 / 0.859 / 0.973 (0.924), from 0.453 / 0.500 / 0.484. At step 25 PRIME is at 0.788 on
average, GRPO 0.850. The PRM barely separates right from wrong in 150 steps at β = 0.05
(`prm_accuracy` 0.52-0.66 at the end): the implicit reward β·Σq stays small, so its token
scores are mostly noise after the max-return normalisation. A step costs ~1.5 s on an idle
machine (PRM update 0.68 s: a second model's forward and backward; two scoring passes 0.22
s; policy update 0.48 s), against GRPO's 0.39 s.
"""
from experiments.configs import common, settings


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = settings.arithmetic(a.tiny)
  c.estimator = "prime"
  c.policy_loss = "ppo_clip"
  c.kl_coef = 0.0
  c.prm.objective = "ce"
  c.prm.beta = 0.05
  c.prm.order = "update_first"
  c.prm.learning_rate = 2 * c.learning_rate
  c.prm.grad_clip = 10.0
  return c
