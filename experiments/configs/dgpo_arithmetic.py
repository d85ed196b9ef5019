"""DGPO on the default arithmetic setting: the GRPO sequence advantage redistributed over a
response's tokens by an entropy gate and the policy's Hellinger deviation from the reference,
with no KL term (the token-redistribution family).

Command:
  python -m experiments.run --config experiments/configs/dgpo_arithmetic.py --workdir runs/dgpo
Variants: `:tiny` (2 steps, seconds; used by tests).

The setting is `grpo_arithmetic.py`'s, so the two compare directly. DGPO (arXiv 2605.03327;
`credit.advantages.token.dgpo`) needs per-token entropies, the reference's log-probs and the
full-vocabulary squared Hellinger distance between the policy's and the reference's
next-token distributions (`exact_hellinger=True`; without it a sampled-token proxy): the
runner plans the policy pass, a reference pass over a frozen copy of the warmed-up policy
(`reference_pass`) and `divergence_pass` (both models' hidden states, the divergence chunked
over positions so no [B,T,V] array exists). The entropy gate divides by log|V|; the runner fills `vocab_size` from the
model. Other estimators of the family run on the same recipe by name
(`--config.estimator=eapo|opsa|cscr|scapo|perceval|treg`), each planning its own producers.
"""
from experiments.configs import common, grpo_arithmetic


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = grpo_arithmetic.get_config("tiny" if a.tiny else None)
  c.estimator = "dgpo"
  c.policy_loss = "ppo_clip"
  c.kl_coef = 0.0
  c.estimator_kwargs = {"exact_hellinger": True}  # the paper's full-vocabulary Hellinger
  return c
