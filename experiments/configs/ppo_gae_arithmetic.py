"""PPO with a learned critic and GAE on the default arithmetic setting (the critic family);
`:redippo` adds ReDiPPO's reference-guided second critic.

Command:
  python -m experiments.run --config experiments/configs/ppo_gae_arithmetic.py --workdir runs/ppo
  python -m experiments.run --config experiments/configs/ppo_gae_arithmetic.py:redippo --workdir runs/redippo
Variants: `:tiny` (2 steps, seconds; used by tests), `:redippo` (combinable: `:redippo,tiny`).
Time: 0.84 s per RL step (`:redippo` 1.08 s; GRPO 0.39-0.51 s) on 2 CPU cores, 150 steps from
  the default warm-up.
Score: held-out greedy accuracy 0.926 after 150 steps, `:redippo` 0.934 (seed 0; GRPO 0.941).

The setting is the default one (`settings.arithmetic`), so the estimators compare directly. The
critic is a copy of the warmed-up policy's decoder with a scalar value head (initialised to 0),
trained after each policy update on the estimator's returns with PPO's clipped value loss (c_v =
0.5, verl's `cliprange_value`), its own AdamW at the policy's learning rate, 2 minibatches per
step (`experiments/producers/learners.py`). GAE uses verl's defaults γ = λ = 1 (the advantage is then the
return minus the value, whitened over the batch's tokens); the per-step critic metrics are
`critic_vf_mse`, `critic_vpred_mean`, `critic_loss`, and its time `time_critic`.

`:redippo` (inferred from the abstract, see
`credit.advantages.implicit.redippo`): a second, reference-guided critic reads the response
after "answer <gold>: " ⊕ prompt (`critic.ref_context`); GAE runs on its values with λ =
0.95, and each token's advantage is weighted by 1 + β·|V_ref − V|/mean|V_ref − V| clipped to
[0, 3]. Both critics regress on the same returns.

Measured (seed 0 only, 2 CPU cores, RL from the same warm-up as GRPO's via
`--config.warm_start_from`), held-out greedy accuracy at steps 0 / 25 / 50 / 75 / 100 / 125 /
150: PPO-GAE 0.453 / 0.871 / 0.891 / 0.922 / 0.930 / 0.934 / 0.926; `:redippo` 0.453 / 0.883 /
0.891 / 0.926 / 0.934 / 0.941 / 0.934; GRPO on the same seed 0.941 at 150. Critic value MSE at
the end 0.116 (GAE), 0.110 and 0.107 (ReDiPPO's standard and reference-guided critics). Step
0.84 s (critic update 0.38 s) and 1.08 s (two critics 0.76 s) against GRPO's 0.39-0.51 s.
"""
from experiments.configs import common, settings


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False, redippo=False)
  c = settings.arithmetic(a.tiny)
  c.estimator = "redippo" if a.redippo else "gae"
  c.policy_loss = "ppo_clip"
  c.estimator_kwargs = {"gamma": 1.0, "lam": 0.95 if a.redippo else 1.0}
  c.critic.learning_rate = c.learning_rate
  c.critic.clip_range_value = 0.5
  c.critic.num_minibatches = c.num_minibatches
  return c
