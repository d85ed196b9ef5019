"""Policy losses, their one reduction, KL estimators, entropy and value losses.

Modules::

  aggregation.py   `aggregate_loss`, `AGG_MODES`
  importance.py    `importance_correction` (sampler/trainer TIS / MIS)
  reduction.py     `TokenLoss`, `LossOutput`, `reduce_policy_loss`, `policy_loss`
  policy/          one module per policy loss: the per-token `<key>_loss`, registered
                   (with the reduction) as registry key `<key>`
  kl.py            `kl_penalty`, `kl_loss`, `kl_in_reward`, `KL_KINDS`
  entropy.py       `entropy_bonus`
  value.py         `value_loss`
  echo.py          `observation_ce_loss` (ECHO's auxiliary cross-entropy on observation tokens)
  prm.py           implicit-PRM training objectives: `prm_ce_loss`, `prm_dpo_loss`,
                   `prm_kto_loss`, `prm_vanilla_kto_loss`
  amft.py          AMFT's meta-learned SFT/RL balance: `amft_loss`, `amft_meta_gradient`,
                   `amft_update_phi`, `amft_step` (a training-loop component)
  preference.py    step-level preference and intervention losses: `dpo_pair_loss`,
                   `dpo_pair_logprobs` (CSO's verified critical-step pairs),
                   `intervention_sft_mask`, `intervention_sft_loss` (InT)
  oreal.py         OREAL's loss (registry key `oreal`: behaviour cloning on positives, a
                   policy gradient on negatives, k3 KL) and `oreal_token_rm_loss`

A registered loss is used by name: `credit.get_policy_loss("ppo_clip").fn(...)` is
`ppo_clip_loss(...)` followed by `reduce_policy_loss(...)`.
"""
from credit.losses.aggregation import AGG_MODES, aggregate_loss
from credit.losses.importance import ImportanceCorrection, importance_correction
from credit.losses.reduction import LossOutput, TokenLoss, policy_loss, reduce_policy_loss
from credit.losses.kl import KL_KINDS, kl_in_reward, kl_loss, kl_penalty
from credit.losses.entropy import entropy_bonus
from credit.losses.value import value_loss
from credit.losses.echo import OBS_CE_MODES, observation_ce_loss
from credit.losses.prm import (prm_ce_loss, prm_dpo_loss, prm_kto_loss, prm_sequence_logratio,
                               prm_vanilla_kto_loss)
from credit.losses.amft import (AmftStep, amft_loss, amft_meta_gradient, amft_mu, amft_step,
                                amft_update_phi)
from credit.losses.preference import (SFT_TARGETS, PairLogprobs, dpo_pair_logprobs,
                                      dpo_pair_loss, intervention_sft_loss, intervention_sft_mask)
from credit.losses import policy
from credit.losses.policy import *  # noqa: F401,F403  (every per-token `<key>_loss`)
from credit.losses.oreal import oreal_loss, oreal_token_rm_loss

__all__ = [
    "AGG_MODES", "aggregate_loss", "ImportanceCorrection", "importance_correction",
    "LossOutput", "TokenLoss", "policy_loss", "reduce_policy_loss", "KL_KINDS",
    "kl_in_reward", "kl_loss", "kl_penalty", "entropy_bonus", "value_loss", "policy",
    "OBS_CE_MODES", "observation_ce_loss",
    "prm_ce_loss", "prm_dpo_loss", "prm_kto_loss", "prm_sequence_logratio",
    "prm_vanilla_kto_loss", "AmftStep", "amft_loss", "amft_meta_gradient", "amft_mu",
    "amft_step", "amft_update_phi", "SFT_TARGETS", "PairLogprobs", "dpo_pair_logprobs",
    "dpo_pair_loss", "intervention_sft_loss", "intervention_sft_mask", "oreal_loss",
    "oreal_token_rm_loss", *policy.__all__,
]
