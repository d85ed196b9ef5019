"""credit: JAX-native credit assignment for reinforcement learning of LLMs.

Shape legend used in names throughout the library (`adv_BT`, `reward_NG`, ...):
  B  sequences in a batch (B = N·G when groups are contiguous)
  T  tokens per sequence (prompt + response, right-padded)
  N  prompts;  G  samples per prompt
  K  turns / steps per sequence
  V  vocabulary;  D  model width;  H  heads;  S  cache length

Public API: estimators and policy losses by name (`list_estimators`,
`get_estimator`, `list_policy_losses`, `get_policy_loss`), the rollout contract
(`Rollout`, `validate_fields`), and the primitives in `credit.ops`.
"""
from credit import ops
from credit.contract import (CONTRACT, ContractError, Rollout, contiguous_group_size,
                             validate_fields, validate_rollout)
from credit.registry import (EstimatorSpec, PolicyLossSpec, UnknownNameError, get_estimator,
                             get_policy_loss, list_estimators, list_policy_losses)

from credit import advantages, kl, losses, models, tasks  # noqa: E402  (registers estimators and losses)
from credit.models import (DEFAULT_RULES, Decoder, KVCache, LoRAParam, ModelConfig, apply_lora,
                           from_pretrained, init_cache, load_tokenizer, lora_trainable_mask,
                           merge_lora, save_pretrained, shard_model)
from credit.advantages.outcome import (DCPOOutput, DCPOState, GAEOutput, dapo_advantages,
                                       dapo_keep_mask, dapo_overlong_penalty, dcpo_advantages,
                                       dcpo_init_state, dr_grpo_advantages, gae_advantages,
                                       gdpo_advantages, gpg_advantages, grpo_advantages,
                                       grpo_passk_advantages, opo_advantages,
                                       optimal_token_baseline_advantages,
                                       reinforce_pp_advantages, reinforce_pp_baseline_advantages,
                                       remax_advantages, rloo_advantages)
from credit.kl import KL_KINDS, kl_in_reward, kl_loss, kl_penalty
from credit import divergences, sampling, scoring  # noqa: E402
from credit.scoring import (TokenScores, score_tokens, score_with_context,
                            token_logprobs_and_entropy, token_topk)
from credit.divergences import model_divergence, token_divergence, topk_divergence
from credit.sampling import (SampleOutput, Sampler, SamplingParams, SamplingState, make_sampler,
                             sample, sampling_params)
from credit.losses import (AGG_MODES, ImportanceCorrection, LossOutput, aggregate_loss,
                           dcpo_clip_bounds, entropy_bonus, importance_correction, value_loss)

__all__ = [
    "advantages", "kl", "losses", "models", "tasks",
    "DEFAULT_RULES", "Decoder", "KVCache", "LoRAParam", "ModelConfig", "apply_lora",
    "from_pretrained", "init_cache", "load_tokenizer", "lora_trainable_mask", "merge_lora",
    "save_pretrained", "shard_model",
    "DCPOOutput", "DCPOState", "GAEOutput", "dapo_advantages", "dapo_keep_mask",
    "dapo_overlong_penalty", "dcpo_advantages", "dcpo_init_state", "dr_grpo_advantages",
    "gae_advantages", "gdpo_advantages", "gpg_advantages", "grpo_advantages",
    "grpo_passk_advantages", "opo_advantages", "optimal_token_baseline_advantages",
    "reinforce_pp_advantages", "reinforce_pp_baseline_advantages", "remax_advantages",
    "rloo_advantages", "kl_in_reward", "kl_loss", "kl_penalty", "AGG_MODES",
    "ImportanceCorrection", "LossOutput", "aggregate_loss", "dcpo_clip_bounds", "entropy_bonus",
    "importance_correction", "value_loss", "KL_KINDS", "sampling", "scoring", "divergences",
    "TokenScores", "score_tokens", "score_with_context", "token_logprobs_and_entropy",
    "token_topk", "model_divergence", "token_divergence", "topk_divergence", "SampleOutput",
    "Sampler", "SamplingParams", "SamplingState", "make_sampler", "sample", "sampling_params",
    "CONTRACT", "ContractError", "Rollout", "contiguous_group_size", "validate_fields",
    "validate_rollout", "EstimatorSpec", "PolicyLossSpec", "UnknownNameError",
    "get_estimator", "get_policy_loss", "list_estimators", "list_policy_losses", "ops",
]
