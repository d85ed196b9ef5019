"""Shared config pieces: the default fields every recipe has, and variant parsing.

Every field is commented here once; recipes override what they change.
"""
import difflib

import ml_collections


class UnknownVariantError(ValueError):
  """A recipe variant (`recipe.py:<variant>`) the recipe does not declare."""

  def __init__(self, key: str, known):
    self.key, self.known = key, sorted(known)
    close = difflib.get_close_matches(key, self.known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    super().__init__(f"unknown variant {key!r}; {hint}this recipe's variants: {self.known}")


def parse_arg(arg: str | None, **defaults):
  """'tiny,sft_only' -> ConfigDict(tiny=True, sft_only=True) over `defaults` (big_vision
  style); a key not in `defaults` raises UnknownVariantError (a typo never runs silently)."""
  out = ml_collections.ConfigDict(defaults)
  for part in (arg or "").split(","):
    part = part.strip()
    if not part:
      continue
    if part.split("=", 1)[0] not in defaults:
      raise UnknownVariantError(part.split("=", 1)[0], defaults)
    if "=" in part:
      k, v = part.split("=", 1)
      typ = type(out[k]) if k in out else str
      out[k] = typ(v) if typ is not bool else v.lower() in ("1", "true", "yes")
    else:
      out[part] = True
  return out


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0                      # PRNG seed for init, data order and sampling.
  # --- task / data ---
  c.task = "arithmetic"           # built-in task (credit.tasks.list_tasks()) or "jsonl" / "tfds".
  c.task_kwargs = ml_collections.ConfigDict({"max_digits": 2})  # task constructor args.
  c.data_path = ""                # JSONL file or tfds name for task="jsonl"/"tfds".
  c.data_format = "auto"          # task="jsonl": auto (detected from the first line) | plain
                                  # ({prompt_field, answer_field}) | gsm8k ({"question", "answer"};
                                  # gold = what follows "####", commas removed) | math
                                  # ({"problem", "solution"}; gold = the last \\boxed{...}).
                                  # Gold answers math_verify cannot parse are refused at start-up.
  c.prompt_field = "prompt"       # field names in user data (plain format; auto picks plain
  c.answer_field = "answer"       # whenever the first line has both).
  c.num_train_examples = 20000    # size of the generated train split (built-in tasks).
  c.num_eval_examples = 256       # size of the held-out split used for accuracy.
  c.data_dir = ""                 # tfds data dir; "" = <workdir>/data.
  # --- policy model ---
  c.init_from = ""                # local HF checkpoint dir; "" = train a tiny model from scratch.
                                  # Its tokenizer (tokenizer.json, special tokens,
                                  # generation_config stop ids) replaces the character tokenizer.
  c.chat_template = "auto"        # init_from only: prompts through the checkpoint's chat template.
                                  # auto = when it has one | true (refused if none) | false.
  c.system_prompt = ""            # init_from only: the chat prompt's system message ("" = none).
  c.prompt_template = "{prompt}"  # init_from only: the user message (or plain prompt) made from
                                  # the task prompt, e.g. "Compute {prompt}".
  c.model = ml_collections.ConfigDict(dict(
      preset="",                  # a published model's exact shapes, randomly initialised
                                  # (credit.models.list_presets(): qwen3-0.6b, qwen3-1.7b,
                                  # qwen3-4b, qwen2.5-0.5b, qwen2.5-1.5b, llama-3.2-1b,
                                  # llama-3.2-3b); the shape fields below are then unused.
                                  # With init_from: refused unless the checkpoint has its shapes.
      preset_layers=0,            # preset only: keep the first n blocks (0 = all of them).
      hidden_size=128,            # width D.
      intermediate_size=512,      # SwiGLU width.
      num_layers=2,               # decoder blocks.
      num_heads=4,                # query heads.
      num_kv_heads=2,             # key/value heads (GQA).
      head_dim=32,                # per-head width.
      rope_theta=10000.0,         # RoPE base.
      family="qwen3",             # llama | qwen2 | qwen3 (architecture variant for from-scratch models).
      remat=False,                # activation checkpointing per block (also for init_from models).
      remat_policy="full",        # with remat: full (keep block inputs only) | projections (also
                                  # the weight matmuls' outputs: less recompute, more memory).
      param_dtype="float32",      # parameter storage: float32 | bfloat16 (policy and reference).
      compute_dtype="float32",    # activations: float32 | bfloat16; log-prob scoring and the
                                  # losses accumulate in float32 either way.
      optimizer_dtype="param",    # param: Adam moments and the update in param_dtype | float32:
                                  # bfloat16 parameters get a float32 master copy, and the
                                  # clipping, moments and update run in float32
                                  # (experiments/train.py with_master_copy).
  ))
  # The memory plan per device (experiments/memory.py), checked when the mesh is made: a run
  # whose planned peak exceeds 90% of a device's memory is refused before anything compiles.
  c.memory = ml_collections.ConfigDict(dict(
      device_gb=0.0,              # one device's memory in GiB; 0 = measured (the accelerator's
                                  # bytes_limit; on CPU the available host memory / devices).
      prompt_tokens=0,            # prompt positions planned for; 0 = the longest of a sample
                                  # of the task's prompts (x1 per character, + the template).
      check=True,                 # False: print the plan but refuse nothing.
  ))
  c.warm_start_from = ""          # hf_policy/ exported by an earlier from-scratch run (same task):
                                  # start from its weights (architecture from its config.json),
                                  # e.g. one shared warm-up (`--config.steps=0` exports it) for
                                  # several methods; the reference policy is this start. Set
                                  # sft_steps=0 to skip a further warm-up.
  c.requires_checkpoint = ""      # a recipe that fine-tunes a loaded model sets how to make one:
                                  # a run without init_from / warm_start_from is refused with it.
  c.lora_rank = 0                 # >0: train LoRA adapters only (on lora_targets).
  c.lora_alpha = 16.0             # LoRA scale alpha/rank.
  c.lora_targets = ("q_proj", "v_proj")  # projections that get adapters.
  # --- supervised warm-up on task demonstrations ---
  c.sft_steps = 0                 # number of SFT steps before RL (0 = none).
  c.sft_batch_size = 64           # demonstrations per SFT step.
  c.sft_learning_rate = 3e-3      # AdamW lr for SFT (cosine to 10%).
  c.sft_examples = 0              # demonstrations available for SFT: the first n train examples
                                  # (0 = all). RL still draws prompts from the whole train split.
  c.sft_min_accuracy = 0.0        # held-out greedy accuracy the warm-up must reach before RL
                                  # (0 = no check). Checked after sft_steps; below it, the warm-up
                                  # goes on sft_extend_steps at a time at the schedule's final
                                  # learning rate, checked after each, up to sft_max_steps.
  c.sft_extend_steps = 250        # warm-up steps between the checks of sft_min_accuracy.
  c.sft_max_steps = 0             # cap on the warm-up with its extensions (0 = 2 x sft_steps).
  # --- rollouts ---
  c.prompts_per_step = 32         # N prompts per RL step.
  c.group_size = 8                # G samples per prompt.
  c.max_new_tokens = 8            # response budget in tokens (eos included). Dr.GRPO's constant is
                                  # loss_kwargs.norm_constant, set separately.
  # Multi-turn tasks (credit.envs: lookup, calculator, ...): the episode's token budget is
  # max_new_tokens (actions + observations); each policy turn ends at eos or max_action_tokens.
  c.max_turns = 4                 # K, policy turns per episode.
  c.max_action_tokens = 16        # tokens of one policy turn (eos included).
  c.max_observation_tokens = 16   # tokens of one observation (longer ones are truncated).
  c.gold_template = "answer({answer})"  # igpo / trace / a2tgpo: the gold answer is teacher-forced
                                  # in this template after each turn; only its {answer} tokens
                                  # are scored.
  c.gold_scorer = "auto"          # who scores the gold answer: policy (the behaviour policy, IGPO)
                                  # | reference (the frozen initial policy, TRACE) | auto (the
                                  # estimator's paper: trace reference, others policy).
  c.answer_prior_scorer = "auto"  # who scores logprob_answer_prior (the answer after the prompt
                                  # alone): policy (the behaviour policy, every step) | reference
                                  # (the frozen initial policy: RLPR's code computes it once,
                                  # before training) | auto (rlpr reference, others policy).
  c.step_delimiters = (",", ";", "\n")  # step-level methods (step_id) on single-turn responses:
                                  # a token holding one of these closes a step (multi-turn: turns).
  # How a step's rows are sampled (experiments/producers/rollouts.py ROLLOUT_KINDS): plain (G
  # samples per prompt), tree, slate, env (multi-turn episodes), logo; 'auto' takes the kind
  # whose switch below is on (tree.branches, slate.candidates, logo.branch_rows), else plain for
  # single-turn tasks and env for multi-turn ones.
  c.rollout = "auto"
  # Branch sampling (credit.trees; tree estimators such as cbpo, slate): G roots per prompt,
  # then `points` branch points per prompt group, `branches` continuations from each shared
  # prefix, for `depth` rounds (budget × depth_decay per round). 0 branches = off.
  c.tree = ml_collections.ConfigDict(dict(
      branches=0, points=2, depth=1, depth_decay=0.5,
      criterion="entropy",        # entropy | surprisal | step (starts of c.step_delimiters steps)
                                  # | first_error (the first wrong token: task flag_chars)
      gamma_path=0.5, gamma_node=0.5))  # CBPO's path-level and node-level decays.
  # SLATE's step-level sampling (estimator slate): per prompt and step, `candidates` next steps
  # (cut at c.step_delimiters) judged by the task's judge_step, one continued by softmax(A/eta),
  # up to `max_steps` steps. 0 candidates = off.
  c.slate = ml_collections.ConfigDict(dict(candidates=0, max_steps=4, eta=0.7, answer_bonus=0.1))
  # Memory-R2's LoGo local groups (estimator logo; multi-turn tasks): after the N·G episodes,
  # `branch_rows` of them (distinct, >= 2 turns) are restored to their environment's state
  # after a turn k >= 1 and continued `local_size` times from the same prefix; the step's batch
  # is N·G + branch_rows·local_size rows. 0 branch_rows = off.
  c.logo = ml_collections.ConfigDict(dict(branch_rows=0, local_size=4))
  # Group filter (experiments/extensions/group_filter.py): groups whose accuracy (share of rows with
  # reward >= success_threshold) lies outside [min_accuracy, max_accuracy], or whose rewards
  # are all equal with drop_uniform, are dropped from the step after the reward (PRIME:
  # 0.2 / 0.8; DAPO's dynamic sampling: drop_uniform, without its refill). 0 / 1 / False: off.
  c.group_filter = ml_collections.ConfigDict(dict(
      min_accuracy=0.0, max_accuracy=1.0, drop_uniform=False, success_threshold=1.0))
  c.reward_components = ()        # reward_components [B,R] columns (gdpo, searchllm): outcome |
                                  # format | rubric | subproblems | tests | brevity
                                  # (experiments/producers/ REWARD_COMPONENTS).
  c.max_steps = 4                 # K of per-step arrays on single-turn responses (step_value of
                                  # TP-GRPO; steps past K-1 merge into the last entry).
  c.steps_as_turns = False        # single-turn rollouts: turn_id = the response's steps (cut at
                                  # step_delimiters, at most max_steps), so turn-level methods
                                  # (pica, vpr, scout...) credit steps; False: one turn, except
                                  # for estimators that read turn_id and step_mask together
                                  # (producers.turns_are_steps).
  c.temperature = 1.0             # sampling temperature.
  c.top_k = 0                     # 0 = off.
  c.top_p = 1.0                   # 1.0 = off.
  c.logprob_old_source = "recompute"  # "recompute" (trainer forward) or "sampler" (sampler's log-probs).
  c.importance_correction = False  # pass sampler log-probs to the loss: truncated IS (loss_kwargs is_*).
  # --- credit assignment ---
  c.estimator = "grpo"            # advantage estimator registry name (credit.list_estimators()).
  c.estimator_kwargs = ml_collections.ConfigDict()  # its hyperparameters.
  # Weight of the estimator's own loss term, for one that has one (`EstimatorSpec.trained_loss`:
  # VIMPO's value loss, VeriFree's / JEPO's answer likelihood); None = its registered default
  # (VIMPO 200, VeriFree and JEPO 1), 0 = off.
  c.estimator_loss_coef = ml_collections.config_dict.placeholder(float)
  c.credit_mask = ""              # a [B,T] bool contract field: the estimator's advantages are
                                  # kept on its tokens only ("decision_mask": the credit bench's
                                  # oracle placement, the task's deciding tokens); "" = all.
  c.policy_loss = "ppo_clip"      # policy loss registry name (credit.list_policy_losses()).
  c.loss_kwargs = ml_collections.ConfigDict()       # its hyperparameters (clip eps, agg mode...).
  c.kl_coef = 0.0                 # β of a KL-to-reference loss term (0 = no reference model).
  c.kl_kind = "k3"                # KL estimator for that term.
  c.entropy_coef = 0.0            # entropy bonus coefficient.
  c.obs_ce_coef = 0.0             # ECHO: λ of a cross-entropy term on observation tokens (obs_mask;
                                  # multi-turn rollouts); 0 = off.
  c.obs_ce_mode = "seq-mean"      # its reduction: seq-mean (ECHO) | token-mean.
  c.alt_context_pos = "correct: "  # cscr / treg: prefix of the prompt for logprob_alt_pos (run's tokenizer).
  c.alt_context_neg = "wrong: "   # cscr / treg: the same for logprob_alt_neg ("" = the plain prompt).
                                  # Either may hold {answer} (the gold answer) and {mistake} (the
                                  # group's first wrong response): SIPO's self-teacher contexts.
  c.alt_context = "answer {answer}: "  # opid / seed: the context of logprob_alt (their hindsight
                                  # "skill"; here the gold answer, same fields as above).
  c.followups_pos = ("correct",)  # flr: follow-up texts scored after prompt + response (run's
                                  # tokenizer); estimator_kwargs.num_positive must equal their number.
  c.followups_neg = ("wrong",)    # flr: the negative follow-ups (scored after the positive ones).
  c.followup_separator = "\n"     # flr: teacher-forced between the response and each follow-up
                                  # (context, not scored; "" = none).
  c.followup_scorer = "reference"  # flr: who scores the follow-ups: reference (the frozen initial
                                  # policy; FLR's fixed LM) | policy (the current policy).
  c.teacher = ml_collections.ConfigDict(dict(  # distillation (credit.advantages.distill).
      init_from="",               # a frozen teacher: local HF checkpoint with the student's
                                  # tokenizer (e.g. hf_policy/ of sft_teacher_<task>); refused at
                                  # start-up when the tokenizers differ.
      param_dtype="float32",      # the frozen teacher's parameter storage and activations.
      compute_dtype="float32",
      context="",                 # the policy as its own teacher ("" = off; ignored with
                                  # init_from): answer (the gold answer) | hint | ... (a task's
                                  # `privileged_context`), put before the prompt as `prefix`.
      prefix="{context} {text}: ",  # the privileged context before the prompt ({context} = the
                                  # kind, {text} = its text; the run's tokenizer must encode it).
      lag=0,                      # self-teacher parameters: 0 = the current policy; n > 0 = a
                                  # copy refreshed every n steps (checkpointed).
      top_k=16,                   # k of the teacher's top-k distribution (teacher_topk_*, + a
                                  # tail bucket) when a loss needs it (topk_distill, sd_search).
      fec_lambda=1e-2,            # λ of VERPO's Fisher Evidence Contrast (evidence_nuisance):
                                  # κ = ‖m‖²/(‖m‖² + λ) of the evidence-presence direction m.
  ))
  c.jolt = ml_collections.ConfigDict(dict(  # JOLT's two roles of one policy (experiments/extensions/jolt.py).
      teacher_samples=0,          # G_T > 0: each step also samples G_T teacher-role responses per
                                  # prompt after teacher.prefix (teacher.context) ⊕ prompt, verified
                                  # by the task, re-scored without the privileged text, and given
                                  # `jolt_teacher` advantages; their loss is added to the student
                                  # role's (estimator "jolt", the self-teacher pass) in one update.
                                  # 0 = off (the student role alone). Single-turn, no trees, no
                                  # async, no teacher.init_from (JOLT teaches itself).
      estimator_kwargs=ml_collections.ConfigDict(),  # jolt_teacher's hyperparameters: kl_coef
                                  # (β of the per-token KL toward the student role, 0.05), eps.
      loss_coef=1.0,              # weight of the teacher role's loss in the sum (student's: 1).
      sft_privileged=0.0,         # q: each warm-up demonstration is shown after the privileged
                                  # prompt with probability q (the model learns to read the
                                  # context, as a pretrained LLM reads a hint); 0 = plain warm-up.
  ))
  c.amft = ml_collections.ConfigDict(dict(  # AMFT: a meta-learned SFT/RL balance (credit.losses.amft).
      enabled=False,              # one update per RL step on (1 − μ)∇L_RL + μ∇L_SFT, μ = σ(φ)
                                  # learnt by a look-ahead meta-gradient (needs ppo_epochs =
                                  # num_minibatches = 1; single-turn tasks).
      init_mu=0.5,                # μ at the start.
      meta_lr=1e-2,               # η_φ of the controller.
      entropy_coef=0.1,           # c_H: entropy below its post-warm-up level raises μ.
      val_at="lookahead",         # where ∇L_val is taken: lookahead (θ') | current (the code).
      sft_batch_size=32,          # demonstrations per step for L_SFT (the task's demonstrator).
      val_examples=64,            # the last n train examples with correct answers: L_val.
  ))
  # --- optimisation ---
  c.steps = 100                   # RL steps.
  c.learning_rate = 1e-3          # AdamW peak lr for RL.
  c.warmup_steps = 5              # linear warm-up, then cosine decay to 10%.
  c.weight_decay = 0.0            # AdamW weight decay.
  c.grad_clip = 1.0               # global-norm gradient clipping.
  c.ppo_epochs = 1                # passes over each rollout batch.
  c.num_minibatches = 2           # minibatches per epoch.
  # --- trained field producers (experiments/producers/learners.py; built only when a method needs them) ---
  c.prm = ml_collections.ConfigDict(dict(   # PRIME's online implicit PRM (logprob_prm).
      objective="auto",           # auto (the estimator's: oprl dpo, else ce) | ce (PRIME) | kto |
                                  # vanilla_kto (credit.losses.prm) | dpo (in-group pairs).
      beta=0.05,                  # β of the implicit reward β·Σ log πφ/πref in the PRM loss.
      order="update_first",       # update_first: update on the batch, then score it (PRIME's
                                  # code default, update=before) | score_first: score, then update.
      learning_rate=1e-4,         # AdamW lr (PRIME: 1e-6 for 7B, 2x the policy's).
      warmup_steps=0,             # its linear warm-up (then cosine decay over c.steps).
      grad_clip=10.0,             # PRIME's PRM grad clip.
      epochs=1,                   # passes over each rollout batch.
      num_minibatches=1,          # optimiser steps per pass (PRIME: one update per batch).
  ))
  c.critic = ml_collections.ConfigDict(dict(  # value critics (values, values_ref): gae, redippo.
      learning_rate=1e-4,         # AdamW lr of the trunk copy + value head.
      warmup_steps=0,             # its linear warm-up.
      grad_clip=1.0,              # global-norm clip.
      clip_range_value=0.5,       # c_v of the clipped value loss (verl cliprange_value).
      epochs=1,                   # passes over each rollout batch.
      num_minibatches=2,          # optimiser steps per pass.
      ref_context="answer {answer}: ",  # ReDiPPO's reference-guided critic reads this (gold
                                  # answer filled in) before the prompt.
  ))
  c.verifier = ml_collections.ConfigDict(dict(  # generative verifier trained by RL (RL Tango,
      enabled=False,              # TIPS; experiments/producers/verifier.py): it makes step_reward/step_mask.
      suffix=";{steps}?",         # after prompt ⊕ response: what it is asked ({steps}: step count).
      samples=4,                  # verdicts per response: its GRPO group (code 5); the first is
                                  # the policy's process reward (the code's 1 inference rollout).
      update_every=1,             # a verifier update every n policy steps (the code: 1 per 3).
      temperature=1.0,            # sampling of verdicts (training and inference).
      correctness_weight=1.0,     # reward = w_c·1[final verdict == outcome] + w_f·format.
      format_weight=0.8,          # RL Tango 0.8; TIPS 0.
      advantage="grpo",           # grpo | dr_grpo (TIPS: no std normalisation).
      balance="inverse",          # class-balance weights: inverse (code) | sqrt_inverse | none.
      balance_decay=0.8,          # EMA decay of the class counts.
      clip_range=0.2,             # PPO clip of its loss.
      learning_rate=1e-4,         # AdamW lr (RL Tango: 1e-6 on 7B, as the generator).
      warmup_steps=0,             # linear lr warm-up.
      grad_clip=1.0,
      epochs=1,
      num_minibatches=1,
      sft_steps=0,                # format warm-up: supervised steps on the policy's own responses
                                  # (one step's batch each),
      sft_labels="outcome",       # labelled: outcome (every verdict = the outcome) | judge (the
                                  # task's step judge) | random (format only).
      sft_learning_rate=1e-3,
      solo_steps=0,               # verifier-only RL steps before the policy's first (code: 40).
  ))
  c.critical = ml_collections.ConfigDict(dict(  # critical steps of failed responses, corrected
      enabled=False,              # and verified (experiments/producers/critical.py): CSO's step-level DPO
                                  # pairs or InT's intervention SFT, built each step and added to
                                  # the update: rl_weight·L_RL + weight·L_critical.
      data="corrections",         # corrections (CSO / InT: failed rows corrected at their first
                                  # error) | successes (PROPA's interleaved SFT: up to max_paths
                                  # successful responses per prompt, the task's demonstration
                                  # when none succeeded; tree batches too).
      objective="dpo",            # dpo (CSO: verified alternative vs original step) | sft (InT,
                                  # PROPA).
      max_paths=2,                # successes: responses per prompt (PROPA's 2, the pair whose
                                  # common prefix is shortest).
      gold_when_none=True,        # successes: the demonstration for a prompt without a success.
      proposals=4,                # alternative steps sampled per critical step,
      proposer="policy",          # by: policy (itself) | teacher (the frozen expert of
                                  # teacher.init_from, CSO's expert model),
      context="",                 # after: "" the plain prompt | answer (or a task context: the
                                  # prompt after c.teacher.prefix with that text; InT's
                                  # reference solution).
      temperature=1.0,            # sampling temperature of the proposals.
      continuations=1,            # policy continuations per alternative (verified by the task).
      require_success=True,       # keep only alternatives whose continuation succeeds (CSO;
                                  # InT's optional filter).
      max_items=8,                # critical steps per RL step (static; extra ones drawn at random).
      success=1.0,                # reward >= success: a correct response.
      beta=0.1,                   # DPO's β (dpo).
      train_on="all",             # sft: prefix + intervention (InT's code) | intervention_only.
      weight=1.0,                 # weight of L_critical.
      rl_weight=1.0,              # weight of the RL loss while the critical objective is on
                                  # (0: pure CSO / InT steps).
      until=0,                    # n > 0: the critical objective for the first n RL steps, then
                                  # plain RL (InT then RL); 0: every step.
  ))
  # --- evaluation, checkpoints, output ---
  c.eval_every = 20               # steps between held-out evaluations (greedy decoding).
  c.eval_samples = 0              # k > 0: evaluations also draw k samples per prompt (temperature,
                                  # top_k, top_p as in training) and report eval_mean_at_k (mean
                                  # reward) and eval_pass_at_k (fraction of prompts with a correct
                                  # sample). 0 = off.
  c.checkpoint_every = 10         # steps between checkpoints (0 = never).
  c.keep_checkpoints = 2          # checkpoints kept on disk.
  c.keep_best_eval = False        # True: <workdir>/best_policy (+ best.json) holds the policy of the
                                  # best held-out evaluation so far (checkpoint selection, BeamPERL).
  c.export_hf = True              # write the final policy to <workdir>/hf_policy (HF safetensors).
  c.num_heatmap_samples = 6       # responses drawn in the token-credit heatmap (3 per group,
                                  # groups with mixed rewards first).
  c.samples_every = 10            # steps between rollouts written to samples.jsonl (and the last
                                  # step); 0 = off.
  c.samples_per_step = 4          # rollouts written per such step (mixed-reward groups first).
  c.progress = True               # a tqdm bar when stderr is a terminal; False: never a bar.
  c.log_every = 0                 # steps between plain progress lines, printed instead of the bar
                                  # off a terminal (a file, a pipe, CI) and always written to
                                  # <workdir>/log.txt, for the warm-up and the RL steps alike;
                                  # 0 = about 20 lines per phase.
  # --- asynchronous RL (experiments/async_rl.py; ASearcher / AReaL) ---
  c.async_rollouts = False        # rollout workers in separate processes, never waiting for the
                                  # trainer; use policy_loss="decoupled_ppo".
  c.async_rl = ml_collections.ConfigDict(dict(
      num_workers=1,              # rollout worker processes (the trainer is process 0).
      max_staleness=1,            # η: generation runs at most η batches ahead (AReaL's
                                  # max_head_offpolicyness). ASearcher's 4 (lr ~1e-6, big
                                  # models) collapsed 2 of 3 lookup runs at lr 3e-4 here
                                  # (benchmarks/async_rl.py); η = 1 learned in all 3.
      groups_per_rollout=1,       # prompts (with their G samples) per rollout unit.
      max_in_flight=0,            # cap on units ready + running (0: only the staleness rule).
      drop_stale=False,           # drop units more than η versions old when the trainer takes them.
      interrupt=True,             # multi-turn units take newer parameters between turns (AReaL's
                                  # interruptible rollouts); the unit's version is its oldest.
      worker_mesh="data=-1",      # a worker's mesh over its own devices.
      poll_s=0.0,                 # 0: blocking waits on the coordination service; > 0: poll
                                  # every poll_s seconds (the earlier way, for comparison).
      timeout_s=3600.0, heartbeat_s=20,
      params_file_mb=1.0,         # parameter trees of at least this many MiB reach the workers
                                  # through a file (safetensors, renamed into place) that the
                                  # store only names; smaller ones through the store itself;
                                  # -1: always the store (benchmarks/async_transfer.py).
      params_dir=""))             # where those files go ("": <workdir>/async/params): this
                                  # run's own directory (its params_* files are removed at the
                                  # end); on a cluster, one every host mounts.
  # --- scale ---
  c.mesh = "data=-1"              # mesh axes, e.g. "data=2,fsdp=4"; -1 takes the remaining devices.
  c.scoring_chunk_size = 0        # positions per scoring chunk; 0 = auto (~256 rows of B x chunk).
  # --- checks and testing hooks ---
  c.debug_checks = False          # validate every batch against credit.CONTRACT on the host (shapes,
                                  # dtypes, NaN/inf, group ids) and the advantages; the first batch
                                  # of a run is always validated.
  c.kill_at_step = -1             # test only: SIGKILL the process after this step completes.
  return c


def apply_tiny(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The `:tiny` variant shared by every recipe: 2 steps of a 1-layer model, for tests."""
  c.sft_steps = 2
  c.sft_min_accuracy = 0.0  # two steps learn nothing to check
  c.steps = 2
  c.prompts_per_step = 4
  c.group_size = 4
  c.num_train_examples = 64
  c.num_eval_examples = 16
  c.eval_every = 2
  c.checkpoint_every = 1
  c.model.hidden_size = 32
  c.model.intermediate_size = 64
  c.model.num_layers = 1
  c.model.head_dim = 8
  c.progress = False
  c.ppo_epochs = 1
  c.num_minibatches = 2
  return c


def multi_turn_training(c: ml_collections.ConfigDict, *, tiny: bool) -> ml_collections.ConfigDict:
  """The training settings the multi-turn recipes share (igpo_lookup, procredit_calculator):
  a short supervised warm-up on demonstration episodes, 50 RL steps of 16 prompts x 8
  episodes; with `tiny`, `apply_tiny` and a 64-token episode budget."""
  c.sft_steps = 300
  c.sft_batch_size = 32
  c.steps = 50
  c.prompts_per_step = 16
  c.group_size = 8
  c.learning_rate = 3e-4
  c.ppo_epochs = 1
  c.num_minibatches = 2
  c.eval_every = 25
  c.num_eval_examples = 128
  c.checkpoint_every = 50
  if tiny:
    apply_tiny(c)
    c.max_new_tokens = 64
  return c
