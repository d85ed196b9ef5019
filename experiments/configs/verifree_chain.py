"""VeriFree on chained arithmetic: the likelihood-reward family, on a task with reasoning.

Command:
  python -m experiments.run --config experiments/configs/verifree_chain.py --workdir runs/verifree
Variants: `:tiny` (2 steps, seconds; used by tests). The other likelihood rewards run by
name on the same setting: `--config.estimator=rlpr` (debiased by the prompt-only prior),
`jepo`, `logprob_reward`; `--config.estimator=grpo` is the verifier-reward baseline.
Time: 14 min 24 s start to exit on 2 CPU cores at load ~11 (warm-up 533 s, then 100 RL steps).
Score: held-out greedy accuracy 0.441 -> 0.859 at step 100 (seed 0; GRPO 0.879); 0.867 with the
  answer-token loss.

The setting. Prompts are `a±b±c=` with 1-digit operands (`credit.tasks.Chain`,
`max_digits=1`); a response is the running sums, the marker "=", then the answer:
"8+6-5=" -> "14,9=9". The likelihood rewards score π(a* | x, z), the gold answer a*
teacher-forced after the prompt x and the sampled reasoning z: the `answer_pass` producer
cuts each response right after its first "=" (a response without one gets the marker
inserted) and scores a* ⊕ eos there, so the reward is the policy's own belief that its
reasoning leads to the gold answer; no verifier is called for the advantages (the verifier
only reports accuracy). VeriFree (arXiv 2505.21493): R = π(a* | x, z), RLOO baseline over
the group of 8, plus its answer-token loss −R·log π(a* | x, z) (the estimator's
`trained_loss`, weight 1 as in the authors' run script; `--config.estimator_loss_coef=0`
drops it; JEPO has one too, weighted by the group's self-normalised answer probabilities).

The warm-up imitates a demonstrator that forgets the carry or borrow of each running-sum
step that needs one with probability 0.7 (`task_kwargs.demo_carry_error`) and carries the
slip on into the answer ("8+6+5=" -> "4,9=9" instead of "14,19=19"), so the warmed-up
policy answers consistently with its own reasoning and the error sits in the reasoning,
where a likelihood reward has to put the credit. Demonstrations are right on 58% of
problems; a policy that always slips gets 45% (the problems without a carry or borrow);
the verifier is exact, so only the reward can take the policy beyond its demonstrator.

Measured (seed 0, one run each, 2 CPU cores; the two runs side by side on a
machine shared with other jobs, load average ~11):
  * warm-up, 1500 SFT steps (533 s under that load): held-out greedy accuracy 0.441, the
    always-slip level; the format is learnt (every sampled response has the marker);
  * RL, 100 VeriFree steps (32 prompts x 8 samples, lr 3e-4): 0.832 / 0.828 / 0.852 / 0.859
    at steps 25 / 50 / 75 / 100 (+0.418);
  * the same with `--config.estimator=grpo` (the verifier's 0/1 reward): 0.824 / 0.863 /
    0.875 / 0.879 (+0.438): on par, GRPO 2 points higher at the end (one seed each);
  * wall time 14 min 24 s start to exit (GRPO 14 min 1 s) under that load; process CPU
    time 5 min 41 s (user 4:36 + sys 1:05); not measured on an idle machine. The answer
    pass costs ~0.26 s of a VeriFree step (`time_likelihood`).
The runs above predate the answer-token loss. With it (seed 0, one pinned core
each, the same fresh warm-up at 0.434 for all four runs):
  * VeriFree 0.805 / 0.859 / 0.867 / 0.867 at steps 25 / 50 / 75 / 100; without the term
    (`estimator_loss_coef=0`) 0.797 / 0.859 / 0.848 / 0.844;
  * JEPO 0.746 / 0.820 / 0.859 / 0.848; without the term 0.781 / 0.816 / 0.871 / 0.883;
  * within one seed's noise either way here: the policy's own answers already follow its
    reasoning after the warm-up, so −log π(a* | x, z) is small (VeriFree's term 2e-4 at step
    100, JEPO's 0.20). The term's second pass over prompt ⊕ reasoning ⊕ answer doubles the
    update (0.30 → 0.61 s; step 0.55 → 0.85 s).
VeriFree's format gate is on, as in its port (R = 0, and no answer term,
for a response without the answer tag or stopped by the length limit): here a response
that fails the chain task's `format_ok` (running sums, "=", an integer answer) gets R = 0
(`--config.estimator_kwargs.format_gate=False` turns it off). The runs above predate it
and were not repeated (their warmed-up policy wrote the marker in every sampled response).
"""
from experiments.configs import common
from experiments.configs.settings import chain_setting


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False)
  c = chain_setting(common.base_config())
  c.estimator = "verifree"              # R = π(a* | x, z), RLOO baseline (its default); the
                                        # family by name: rlpr, jepo, logprob_reward
  if a.tiny:
    common.apply_tiny(c)
  return c
