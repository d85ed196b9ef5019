"""credit: JAX-native credit assignment for reinforcement learning of LLMs.

Shape legend used in names throughout the library (`adv_BT`, `reward_NG`, ...):
  B  sequences in a batch (B = N·G when groups are contiguous)
  T  tokens per sequence (prompt + response, right-padded)
  N  prompts;  G  samples per prompt
  K  turns / steps per sequence;  R  reward components;  k  top-k entries
  V  vocabulary;  D  model width;  H  heads;  S  cache length

Public API:
  * methods by name: `list_estimators(family=None)`, `get_estimator`, `list_families`,
    `list_policy_losses`, `get_policy_loss` (unknown names list the known ones);
  * the families as namespaces: `credit.advantages.outcome.grpo_advantages` (every
    estimator function is also `credit.advantages.<function>`), one module per method
    in `credit/advantages/<family>/<name>.py`;
  * `credit.losses`: per-token policy losses, `reduce_policy_loss`, aggregation,
    importance correction, KL, entropy and value losses;
  * the rollout contract (`CONTRACT`, `Rollout`, `validate_fields`) and `credit.ops`;
  * model primitives: `credit.models`, `credit.sampling`, `credit.scoring`,
    `credit.divergences`; built-in tasks in `credit.tasks`.
"""
from credit import contract, ops, registry
from credit.contract import (CONTRACT, ContractError, Field, Rollout, contiguous_group_size,
                             validate_fields, validate_rollout)
from credit.registry import (CONFIDENCE_TAGS, FAMILIES, EstimatorSpec, PolicyLossSpec,
                             TrainedLoss, UnknownNameError, get_estimator, get_policy_loss,
                             list_estimators, list_families, list_policy_losses)

from credit import advantages, losses  # noqa: E402  (imports register every method)
from credit.losses import (AGG_MODES, KL_KINDS, ImportanceCorrection, LossOutput, TokenLoss,
                           aggregate_loss, entropy_bonus, importance_correction, kl_in_reward,
                           kl_loss, kl_penalty, reduce_policy_loss, value_loss)
from credit import divergences, models, sampling, scoring, tasks  # noqa: E402
from credit.models import (DEFAULT_RULES, Decoder, KVCache, LoRAParam, ModelConfig, apply_lora,
                           from_pretrained, init_cache, load_tokenizer, lora_trainable_mask,
                           merge_lora, save_pretrained, shard_model)
from credit.scoring import (TokenScores, score_tokens, score_with_context,
                            token_logprobs_and_entropy, token_topk)
from credit.divergences import model_divergence, token_divergence, topk_divergence
from credit.sampling import (SampleOutput, Sampler, SamplingParams, SamplingState, sample,
                             sampling_params)

__all__ = [
    # registry and contract
    "CONFIDENCE_TAGS", "FAMILIES", "EstimatorSpec", "PolicyLossSpec", "TrainedLoss",
    "UnknownNameError", "get_estimator", "get_policy_loss", "list_estimators", "list_families",
    "list_policy_losses", "CONTRACT", "ContractError", "Field", "Rollout",
    "contiguous_group_size", "validate_fields", "validate_rollout",
    # namespaces
    "advantages", "losses", "ops", "contract", "registry", "divergences", "models", "sampling",
    "scoring", "tasks",
    # losses
    "AGG_MODES", "KL_KINDS", "ImportanceCorrection", "LossOutput", "TokenLoss",
    "aggregate_loss", "entropy_bonus", "importance_correction", "kl_in_reward", "kl_loss",
    "kl_penalty", "reduce_policy_loss", "value_loss",
    # models, sampling, scoring
    "DEFAULT_RULES", "Decoder", "KVCache", "LoRAParam", "ModelConfig", "apply_lora",
    "from_pretrained", "init_cache", "load_tokenizer", "lora_trainable_mask", "merge_lora",
    "save_pretrained", "shard_model", "TokenScores", "score_tokens", "score_with_context",
    "token_logprobs_and_entropy", "token_topk", "model_divergence", "token_divergence",
    "topk_divergence", "SampleOutput", "Sampler", "SamplingParams", "SamplingState", "sample",
    "sampling_params",
]
