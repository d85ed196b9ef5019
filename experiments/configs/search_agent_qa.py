"""ProCredit on `search_qa`: a search agent answering multi-hop questions with BM25 search over a corpus.

Command:
  python -m experiments.run --config experiments/configs/search_agent_qa.py \\
      --workdir runs/search_agent_qa
Variants: `:tiny` (2 steps of a 1-layer model, 1-hop questions; seconds; used by tests).
`:long`: ASearcher-style long episodes: 3-hop questions, a demonstrator that makes 0-3
distractor searches per hop (uneven episode lengths), 32 turns, and context management
(`credit.envs.context`): when the 1536-token context is full, the oldest observations but the
last 2 become "(dropped)" and the episode continues from the compacted context (the training
row is the final context). Asynchronous: add `--config.async_rollouts=True`
(experiments/async_rl.py); synthesized questions (injection and fuzzing, kept by a
with/without-tools difficulty check; `python -m experiments.synthesize --task=search_qa`):
`--config.task_kwargs.questions_path=...`. `:long,tiny` for tests. Your
own corpus: `--config.task_kwargs.corpus_path=docs.jsonl --config.task_kwargs.questions_path=
qa.jsonl` (JSON lines: {"id", "title", "text"} per document, {"question", "answer"} per
question; docs/guides/tools.md), with a checkpoint's tokenizer (`--config.init_from`) when the
texts leave the character tokenizer's vocabulary. The GRPO baseline on the same setting:
`--config.estimator=grpo`; exact match as the outcome: `--config.task_kwargs.reward=em`.
Time: `:tiny` 40 s of CPU time (2.6 min wall at load average 15 on a 2-core CPU; igpo_lookup
  `:tiny` 45 s CPU measured alongside); the full run is not yet measured.
Score: not yet measured.

The setting (`credit.envs.search`, `credit.envs.corpus`). The built-in corpus describes 40
people, one document each, with facts about their boss, coach, aunt, city, team, club and pet;
a fact between two people is stated on either one's document, so a chain of facts is spread
over several documents. A question follows 1 or 2 facts ("city of boss of ann?"); the policy
calls `search(boss of ann)` (BM25 via bm25s over the corpus: the top 3 documents, each with
the sentence that shares most words with the query), `open(doc, page)` when a snippet does not
show the fact, and `answer(north bay)`. The outcome is the answer's token F1 against the gold
answer (SQuAD normalisation; a two-word value half right earns 0.5); `eval_accuracy` counts
F1 = 1. Per turn the environment reports whether the turn first showed a sentence of the
question's chain (`step_reward`) and the fraction of the chain shown so far (`turn_progress`).

ProCredit (`credit.advantages.turn.procredit`): the change of verified progress over each turn,
group-normalised over the turns of the prompt's episodes, added to the GRPO outcome advantage,
so a search that found the next fact is credited even in an episode that answered wrong.
"""
import ml_collections

from experiments.configs import common


def get_config(arg=None):
  a = common.parse_arg(arg, tiny=False, long=False)
  c = common.base_config()
  c.task = "search_qa"
  c.task_kwargs = ml_collections.ConfigDict({
      "corpus_path": "",           # "" = the built-in corpus (no download)
      "questions_path": "",        # "" = questions generated from the built-in corpus
      "min_hops": 1,
      "max_hops": 2,
      "top_k": 3,                  # results per search
      "snippet_chars": 48,         # one sentence of each result
      "page_chars": 120,           # one page of open(doc, page)
      "reward": "f1"})             # the outcome; "em" for exact match
  c.estimator = "procredit"
  c.policy_loss = "ppo_clip"
  c.max_turns = 6                 # 2 hops: up to search + open per hop, the answer, one spare
  c.max_action_tokens = 24        # "search(coach of ann)" + eos
  c.max_observation_tokens = 128  # 3 results of one sentence, or one page
  c.max_new_tokens = 640          # the episode's budget: actions + observations
  common.multi_turn_training(c, tiny=a.tiny)
  if a.long:                      # ASearcher-style long episodes (module docstring)
    c.task_kwargs.update(min_hops=3, max_hops=3, distractors=3, extra_turns=16,
                         context_keep_last=2, context_compact_to=0.5)
    c.max_turns = 32              # (2 + distractors)·3 hops + 1 + extra_turns
    c.max_action_tokens = 28      # "search(club of the one whose ...)" + eos
    c.max_new_tokens = 1536       # the context budget (32 short actions, placeholders and the
                                  # 2 kept observations fit): compacted beyond it
    c.policy_loss = "decoupled_ppo"  # exact under asynchronous rollouts as well
    if a.tiny:                    # 32 turns still; a small context so compactions happen
      c.max_observation_tokens = 64
      c.task_kwargs.update(top_k=1, snippet_chars=40)
      c.max_new_tokens = 512
    return c
  if a.tiny:                      # 1-hop questions: a search and the answer fit the budget
    c.task_kwargs.update(max_hops=1, top_k=2)
    c.max_turns = 3
    c.max_new_tokens = 192
  return c
