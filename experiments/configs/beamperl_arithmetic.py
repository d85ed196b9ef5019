"""BeamPERL's recipe: LoRA adapters on a loaded checkpoint, RL on a binary verifiable reward.

Paper: "BeamPERL: Parameter-Efficient RL with Verifiable Rewards Specializes Compact LLMs for
Structured Beam Mechanics Reasoning" (2026): a 1.5B reasoning model, LoRA, binary correctness
rewards from a symbolic solver, no teacher traces; the best checkpoint is an intermediate one
(later ones keep the reward but lose robustness). Nothing is new at the estimator level.

Commands (make and export the base once, then RL on it):
  python -m experiments.run --config experiments/configs/sft_teacher_arithmetic.py \\
      --workdir runs/beamperl_base --config.sft_steps=800
  python -m experiments.run --config experiments/configs/beamperl_arithmetic.py \\
      --workdir runs/beamperl --config.warm_start_from=runs/beamperl_base/hf_policy
The base is the teacher recipe cut to 800 SFT steps: its default 3000 reach held-out accuracy
1.000, which leaves RL nothing to gain.
The base is loaded from a Hugging Face directory: `warm_start_from` for an export of this
library's from-scratch runs (character tokenizer, as above), `init_from` for any other HF
checkpoint with its own tokenizer (the paper's setting, e.g. with `task=jsonl`). A run with
neither is refused before any output, naming the first command.
Variants: `:tiny` (2 steps, rank 2; tests give it a random exported model);
`:drgrpo` (Dr.GRPO, §2: advantages R − mean without the std, the constant-normaliser
aggregation `seq-mean-token-sum-norm` with C = max_new_tokens, no KL term).
Time: 12 min 27 s start to exit for 150 steps (4.4 s per step, 2 shared CPU cores), after an
  800-step base (871 s).
Score: held-out greedy accuracy 0.430 -> 0.504 at best (seed 0; `best_policy/` keeps it).

Defaults and why:
  * LoRA rank 8, α = 16, on q_proj and v_proj (LoRA, arXiv 2106.09685, §7.1; α/r = 2): only the
    adapters train, the base weights stay the loaded ones (checked by the tests);
  * binary reward: the task's exact verifier (1 if the answer is right, else 0);
  * GRPO advantages (§1) with the PPO clip ε = 0.2 (dual clip c = 3), token-mean, one epoch
    of 2 minibatches per rollout batch, 32 prompts × 8 samples;
  * a k3 KL term to the frozen reference, β = 0.04 (DeepSeekMath's GRPO; an assumption, the
    abstract does not give it). The reference is the loaded checkpoint, scored as the policy
    with its adapters off (`loop.reference_from_adapters`): no second copy of the weights;
  * lr 1e-3, above grpo_arithmetic.py's full-parameter 3e-4 (adapters are a small, zero-
    started update; not tuned: one run, see Measured), no warm-up of our own (`sft_steps=0`);
  * checkpoint-level selection: held-out greedy evaluation every 10 steps and
    `keep_best_eval`: <workdir>/best_policy/ holds the policy of the best evaluation so far
    (step 0 included; best.json gives the step), since the paper's best checkpoint is an
    intermediate one; summary.md lists the best eval_accuracy and its step.

Measured (seed 0, one run, 2 CPU cores shared with other runs, `nice -n 10`):
the base is `sft_teacher_arithmetic.py` shortened to 800 SFT steps (`--config.sft_steps=800`;
final loss 0.387, held-out greedy accuracy 0.430; 871 s, 7.0 min CPU). From it, 150 steps of
this recipe (LoRA r=8 on q/v: 15,360 trained weights, 0.93% of the 1.64M): held-out greedy
accuracy 0.430 at step 0, 0.461 / 0.484 / 0.500 at steps 20 / 30 / 40, best 0.504 first at
step 70 (best_policy/), then 0.48-0.50 (0.504 at step 150); train reward 0.29 -> 0.32 (mean
of the first / last 10 steps). 4.4 s per step (update 2.6 s, policy and reference passes
0.7 s each, sampling 0.5 s), 12 min 27 s start to exit (9.1 min CPU).
"""
from experiments.configs import common, settings

BASE_COMMAND = ("make one with: python -m experiments.run --config "
                "experiments/configs/sft_teacher_arithmetic.py --workdir runs/beamperl_base "
                "--config.sft_steps=800, then pass "
                "--config.warm_start_from=runs/beamperl_base/hf_policy")


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False, drgrpo=False)
  c = settings.arithmetic()
  c.requires_checkpoint = BASE_COMMAND  # a run without init_from / warm_start_from is refused
  c.sft_steps = 0                 # RL straight from the loaded checkpoint (no teacher traces)
  c.lora_rank = 8                 # adapters only: rank r ...
  c.lora_alpha = 16.0             # ... scale α/r = 2 ...
  c.lora_targets = ("q_proj", "v_proj")  # ... on the attention queries and values
  c.estimator = "grpo"            # binary reward z-scored in each prompt's group
  c.policy_loss = "ppo_clip"      # ε = 0.2, dual clip 3, token-mean (the loss's defaults)
  c.kl_coef = 0.04                # k3 KL to the loaded checkpoint (adapters off)
  c.kl_kind = "k3"
  c.steps = 150
  c.learning_rate = 1e-3
  c.eval_every = 10               # checkpoint-level held-out evaluation ...
  c.keep_best_eval = True         # ... and <workdir>/best_policy of the best one
  c.checkpoint_every = 50
  if a.drgrpo:
    c.estimator = "dr_grpo"
    c.kl_coef = 0.0
    c.loss_kwargs.loss_agg_mode = "seq-mean-token-sum-norm"
    c.loss_kwargs.norm_constant = float(c.max_new_tokens)
  if a.tiny:
    common.apply_tiny(c)
    c.sft_steps = 0
    c.eval_every = 1
    c.lora_rank = 2
    c.lora_alpha = 4.0
  return c
