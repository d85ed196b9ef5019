"""DGPO on the default arithmetic setting: the GRPO sequence advantage redistributed over a
response's tokens by an entropy gate and the policy's Hellinger deviation from the reference,
with no KL term (the token-redistribution family).

Command:
  python -m experiments.run --config experiments/configs/dgpo_arithmetic.py --workdir runs/dgpo
Variants: `:tiny` (2 steps, seconds; used by tests).
Time: 0.70-0.90 s per RL step on a loaded 2-core CPU (GRPO 0.33-0.51 s), 150 steps from the
  default warm-up.
Score: held-out greedy accuracy 0.927 after 150 steps (mean of seeds 0-2; GRPO 0.924).

The setting is the default one (`settings.arithmetic`), so the two compare directly. DGPO (arXiv
2605.03327; `credit.advantages.token.dgpo`) needs per-token entropies, the reference's log-probs
and the full-vocabulary squared Hellinger distance between the policy's and the reference's
next-token distributions (`exact_hellinger=True`; without it a sampled-token proxy): the runner
plans the policy pass, a reference pass over a frozen copy of the warmed-up policy
(`reference_pass`) and `divergence_pass` (both models' hidden states, the divergence chunked
over positions so no [B,T,V] array exists). The entropy gate divides by log|V|; the runner fills
`vocab_size` from the model. Other estimators of the family run on the same recipe by name
(`--config.estimator=eapo|opsa|cscr|scapo|perceval|treg`), each planning its own producers.

Measured (2 CPU cores; each seed's RL from the same warm-up as GRPO's via
`--config.warm_start_from`), held-out greedy accuracy after 150 steps, seeds 0 / 1 / 2: DGPO
0.934 / 0.867 / 0.980 (mean 0.927), GRPO 0.941 / 0.859 / 0.973 (0.924), from 0.453 / 0.500 /
0.484; at step 25 0.842 against 0.850. On this task the two are indistinguishable with 3
seeds. A step cost 0.70-0.90 s on a loaded machine (divergence pass 0.15-0.19 s, reference
pass 0.08-0.10 s) against GRPO's 0.33-0.51 s.
"""
from experiments.configs import common, settings


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = settings.arithmetic(a.tiny)
  c.estimator = "dgpo"
  c.policy_loss = "ppo_clip"
  c.kl_coef = 0.0
  c.estimator_kwargs = {"exact_hellinger": True}  # the paper's full-vocabulary Hellinger
  return c
