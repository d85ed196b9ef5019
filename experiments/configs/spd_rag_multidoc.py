"""SPD-RAG on `multidoc_agents`: a coordinator, per-document agents and a synthesis turn, one policy.

Command:
  python -m experiments.run --config experiments/configs/spd_rag_multidoc.py \\
      --workdir runs/spd_rag_multidoc
Variants: `:tiny` (2 steps, seconds; used by tests), `:grpo` (the GRPO baseline on the same
setting: the episode's outcome advantage, normalised over the G episodes of a prompt, for
every policy token of the episode, and each document agent's answer gets its episode's
advantage: `subagents.credit=episode`), `:document` (the document agents rewarded by their own
verifiable reward, their answer against their document, instead of the episode's outcome:
`subagents.reward=document`; combinable, `:grpo,document` runs GRPO on both row sets),
`:fanout` (SPD-RAG's exhaustive dispatch: the coordinator's `askall(ann boss)` puts each
sub-question to every document's agent at once, the D·B calls of a turn sampled as one batch
across documents and episodes, and observes their merged answers; the demonstrations use it;
4 turns; combinable with `:document` and `:grpo`), `:balanced` (the document reward
class-balanced within each turn, `subagents.reward=document_balanced`: a right answer scores
1/k on each of the k documents holding the asked fact and 1/(n − k) on each of the n − k
without it, so under `askall` the right "none"s do not outweigh the one answer that finds
the fact; implies `:document`'s setting, meant as `:fanout,balanced`; under a single `ask`
it equals `:document`).
`:fanout` measured (seed 0, 2026-12-07, 2-core CPU at load 7-21; 300-step warm-up ~5 CPU-min,
then 12 steps of 4 prompts x 8 episodes, 2.8 CPU-min): held-out greedy accuracy 0.164 ->
0.258; with `:fanout,document` 0.164 -> 0.023, the agents collapsing onto "none" (right on
2 of every 3 fan-out calls); with `:fanout,balanced` 0.164 -> 0.188 (0.227 at step 6), no
collapse (benchmarks/results/spd_rag.md).
Time: ~30 s per RL step on 2 CPU cores at load 11-14, 30 steps after a 300-step warm-up.
Score: held-out greedy accuracy 0.367 -> 0.500 at step 30 (seed 0; `:grpo` 0.477).

The setting (`credit.envs.subagents`; SPD-RAG, arXiv 2603.08329). A 1- or 2-hop question
over 3 hidden documents ("3 docs. city of boss of ann?"). The
coordinator never reads a document: each turn it sends a sub-question to one document's agent,
`ask(2, ann boss)`, and observes that agent's answer ("bob", or "none"); then the synthesis turn
writes `answer(kim)`. A document agent is the same policy under another context: the document's
text and the sub-question only ("doc: ann boss: bob. q: ann boss?"), one short turn (at most 6
tokens). The warm-up imitates every role: the coordinator's demonstration (which asks the gold
documents, answered by oracle agents) and the agents' answers from their documents (the gold
hops, and "none" from a document without the fact). Where the facts are is not in the prompt,
so a coordinator that asks the wrong document must ask another; the two spare turns allow it,
the demonstrations never show it.

SPD-RAG (`credit.advantages.turn.spd_rag`) credits every agent call from the final answer,
normalised within the prompt group per role: the coordinator's dispatch turns (role 0) against
the group's dispatch turns, the document agents' answers (role 1, rows of their own: the
runner's experiments/extensions/subagents.py) against the group's agent answers, the synthesis turns
(role 2) against the group's synthesis turns; a call longer than `token_budget` = 12 tokens
(the synthesis "answer(kim)" + eos) loses budget_coef·(excess / budget) (the dispatch turns,
16-17 tokens, all pay about the same, which the per-role normalisation removes).

Measured (seed 0, 2-core CPU at load 11-14; one 300-step warm-up at held-out
greedy accuracy 0.367, then 30 steps of 8 prompts x 8 episodes, `--config.prompts_per_step=8
--config.steps=30 --config.eval_every=10`): spd_rag 0.477 / 0.500 / 0.500 at steps 10 / 20 /
30, GRPO (`:grpo`) 0.453 / 0.469 / 0.477 — 3 of 128 questions apart, one seed. ~30 s per step
(update ~20 s). Under both, the agents' sampled answers that equal the oracle's fall from 0.46
to ~0.24 while the episode reward rises to ~0.44: an agent credited only by the outcome is
blamed for a correct "none" whenever the coordinator asked the wrong document.
"""
import ml_collections

from experiments.configs import common


def multidoc_config(a, task: str = "multidoc_agents") -> ml_collections.ConfigDict:
  """The shared multi-turn setting on `multidoc` / `multidoc_agents`."""
  c = common.base_config()
  c.task = task
  c.task_kwargs = ml_collections.ConfigDict({"min_hops": 1, "max_hops": 2, "num_docs": 3,
                                             "num_distractors": 2, "extra_turns": 2})
  c.max_turns = 5                 # 2-3 turns in a demonstration, two spare
  c.max_action_tokens = 18        # "ask(3, ann boss)" + eos
  c.max_observation_tokens = 40   # an agent's answer ("bob"); plain multidoc: a document
  c.max_new_tokens = 100          # the episode's budget: actions + observations
  c = common.multi_turn_training(c, tiny=a.tiny)
  if a.tiny:
    c.max_new_tokens = 64
  return c


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False, grpo=False, document=False, fanout=False,
                       balanced=False)
  c = multidoc_config(a)
  if a.fanout:                    # askall per hop + the answer + one spare turn
    c.task_kwargs.fanout = True
    c.task_kwargs.extra_turns = 1
    c.max_turns = 4
  c.estimator = "spd_rag"
  c.estimator_kwargs = ml_collections.ConfigDict({"token_budget": 12.0, "budget_coef": 0.1})
  # credit: auto | estimator | episode; reward: outcome (the episode's answer) | document
  # (the agent's answer against its own document, `agent_correct`) | document_balanced
  # (the same, the fact-holding and the other documents of a turn weighted to equal totals)
  c.subagents = ml_collections.ConfigDict({"credit": "auto", "loss_coef": 1.0,
                                           "reward": "outcome"})
  c.policy_loss = "ppo_clip"
  if a.document:
    c.subagents.reward = "document"
  if a.balanced:
    c.subagents.reward = "document_balanced"
  if a.grpo:
    c.estimator = "grpo"
    c.estimator_kwargs = ml_collections.ConfigDict()
  return c
