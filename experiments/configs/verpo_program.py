"""VeRPO on program synthesis from examples: difficulty-weighted unit tests as a dense reward.

Command:
  python -m experiments.run --config experiments/configs/verpo_program.py --workdir runs/verpo
Variants: `:tiny` (2 steps, seconds; used by tests); `:wide` (max_coef 9, max_const 19: 380
target functions, 304 train / 76 held out, max_new_tokens 11, a 600-step warm-up).
`--config.estimator=grpo` is the all-tests-pass outcome baseline on the same setting;
`--config.estimator_kwargs.scale=none` drops VeRPO's σ division (Dr. GRPO style).
Time: 60-110 s per 60-step run alone, up to 300 s beside other jobs; a 120-step warm-up ~55 s.
Score: held-out greedy accuracy 0.000 at every step on the default split (as GRPO); `:wide`
  +0.039 in 60 steps (mean of seeds 0-2; GRPO +0.040).

The task (`credit.tasks.Program`): the prompt shows f at three inputs, "f(1)=5,f(2)=7,
f(3)=9;f(x)=", and the response writes f's body in a tiny expression language the task
interprets itself ("2*x+3"; `+ - * /`, `c?a:b`, recursion through `f(...)`, under step and
depth limits: a non-terminating, crashing or malformed program fails its tests). Five unit
tests run it at x = 1, 2, 3 (shown) and 0, 7 (held out). `unit_tests` gives `test_pass`
[B,5]; `verpo_tests` weights each test by its difficulty (1 − its pass rate in the group),
gives partial credit R = o + (1 − o)·α·d (o: every test passes, d: the weighted pass
fraction, α = 0.5) and normalises R like GRPO. Held-out functions: `eval_function_fraction`
0.2 splits the 70 target functions by a fixed rule (no seed) into 56 train functions (the
warm-up and RL prompts) and 14 held-out ones (6 linear, 8 quadratic; the eval split asks each
about 18 times in its 256 prompts), so held-out accuracy means functions never trained on.

Measured (2-core CPU shared with other jobs; function split on): one warm-up on
the train functions (seed 0, exported with `--config.steps=0`, then `--config.warm_start_from=
<dir>/hf_policy --config.sft_steps=0`), 60 RL steps at lr 1e-4, seeds 0 / 1 / 2 (the seed picks
the RL samples and the eval draw, not the warm-up), `--config.eval_samples=8`; held-out greedy
accuracy at steps 0 / 20 / 40 / 60.
  Default (70 functions, 120-step warm-up): 0.000 at every step for VeRPO, VeRPO scale=none
  and GRPO on every seed. The warm-up memorises its prompts (greedy, one prompt per function:
  42 of 56 train functions, 0 of 14 held out; 600 warm-up steps, loss 0.0002: still 0) and
  answers a held-out prompt with a near-miss ("x+8" -> "3*x+6", right at f(1) only; 16% of
  held-out unit tests pass). RL on train prompts does not change that: held-out pass@8 falls
  from .078 / .074 / .094 at step 0 to .043 / .047 / .027 (VeRPO), .039 / .031 / .031
  (scale=none), .035 / .031 / .031 (GRPO) at step 60. On the train functions (greedy after 60
  steps, of 56) GRPO 46 / 46 / 46 > VeRPO scale=none 45 / 45 / 45 > VeRPO 43 / 43 / 44; sampled
  reward, last 10 steps: .625 / .619 / .630, .618 / .613 / .629, .582 / .586 / .611.
  The former numbers here (held-out .56-.73) were memorised functions.
  `:wide` (600-step warm-up: greedy 267 of 304 train, 9 of 76 held-out functions):
    VeRPO:         s0 .117 / .152 / .164 / .148   s1 .125 / .203 / .176 / .160
                   s2 .125 / .164 / .160 / .176
    VeRPO, none:   s0 .117 / .152 / .164 / .164   s1 .125 / .176 / .176 / .176
                   s2 .125 / .191 / .164 / .164
    GRPO:          s0 .117 / .141 / .176 / .152   s1 .125 / .184 / .160 / .160
                   s2 .125 / .180 / .160 / .176
  Step 60 minus step 0: VeRPO +.031 / +.035 / +.051 (mean +.039), scale=none +.047 / +.051 /
  +.039 (+.046), GRPO +.035 / +.035 / +.051 (+.040); held-out functions solved (greedy, of 76)
  12 / 12 / 13, 13 / 13 / 12, 12 / 12 / 13. One function is ~.013 of the accuracy: the three
  methods are on par. RL transfers a little to unseen functions here, through the warm-up's
  partial generalisation, whatever the advantage estimator.
Reading: dropping σ keeps VeRPO's chance partial credit small (groups with no passing row: |A|
<= α instead of unit scale) and moves VeRPO toward GRPO on the train functions; it does not
beat GRPO. Partial credit cannot help much on this task: two different polynomials of degree
<= 2 agree on at most 2 of the 5 inputs, so a wrong candidate passes at most 2 tests by chance.
One run: 60-110 s alone, up to 300 s beside other jobs (0.8-5 s per step); a 120-step warm-up
~55 s, 600 steps 4-5.5 min.
"""
from experiments.configs import common


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False, wide=False)
  c = common.base_config()
  c.task = "program"
  c.task_kwargs = {"family": "mixed",        # 30 linear + 40 quadratic target functions
                   "eval_function_fraction": 0.2}  # 14 of them held out for the eval split
  c.estimator = "verpo_tests"
  c.policy_loss = "ppo_clip"
  c.max_new_tokens = 10                 # the longest body ("x*x+3*x+9") + eos
  c.sft_steps = 120                     # greedy 42 of the 56 train functions; held-out 0
  c.steps = 60
  c.learning_rate = 1e-4                # 3e-4 lowered held-out accuracy (before the split)
  c.eval_every = 20
  c.checkpoint_every = 50
  if a.wide:                            # 380 functions (304 train, 76 held out): some transfer
    c.task_kwargs.update(max_coef=9, max_const=19)
    c.max_new_tokens = 11               # "x*x+9*x+19" + eos
    c.sft_steps = 600                   # held-out greedy accuracy ~0.12 after the warm-up
  if a.tiny:
    common.apply_tiny(c)
  return c
