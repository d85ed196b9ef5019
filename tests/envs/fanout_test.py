"""SPD-RAG at inference (credit/envs/fanout.py): fan-out, recursive synthesis, baselines, costs."""
import numpy as np
import pytest

from credit.envs import fanout
from credit.envs.subagents import agent_prompt
from credit.tasks import CharTokenizer, get_task

TOK = CharTokenizer()


def _task(num_docs=3, **kw):
  return get_task("multidoc", min_hops=1, max_hops=2, num_docs=num_docs,
                  num_distractors=2 * num_docs - 4 or 2, extra_turns=num_docs - 1,
                  demonstrator="search", **kw)


def test_similarity_order_puts_equal_answers_side_by_side():
  answers = ["bob", "none", "kim", "bob", "none"]
  order = fanout.similarity_order(answers)
  assert sorted(order) == list(range(5)) and order[:2] == [0, 3]
  assert [answers[i] for i in order][2:4] == ["none", "none"]
  assert fanout.similarity("bob", "bob") == 1.0 and fanout.similarity("bob", "kim") == 0.0


def test_vote_merge():
  assert fanout.vote_merge("q", ["none", "kim", "bob", "kim"]) == "kim"
  assert fanout.vote_merge("q", ["none", "empty"]) == "none"
  assert fanout.vote_merge("q", ["bob", "kim"]) == "bob"  # a tie: the first


def test_synthesis_recurses_under_the_token_bound():
  answers = ["none"] * 7 + ["kim"]
  wide = fanout.synthesize("ann boss", answers, budget=200, tokenizer=TOK)
  assert wide == fanout.Synthesis("kim", wide.cost, 1) and wide.cost.calls == 1
  tight = fanout.synthesize("ann boss", answers, budget=40, tokenizer=TOK)
  assert tight.answer == "kim" and tight.depth >= 2 and tight.cost.calls > 2
  # Every call's prompt fits the bound: calls x budget bounds what is read.
  assert tight.cost.tokens_in <= 40 * tight.cost.calls
  one = fanout.synthesize("ann boss", ["bob"], budget=30, tokenizer=TOK)
  assert (one.answer, one.depth, one.cost.calls) == ("bob", 0, 0)
  with pytest.raises(ValueError, match="budget"):
    fanout.synthesize("q", answers, budget=0, tokenizer=TOK)


def test_spd_rag_fans_out_one_reader_call_per_hop():
  task = _task()
  ex = task.generate(np.random.default_rng(0), 16)
  calls = []
  oracle = fanout.oracle_reader(TOK)

  def reader(requests):
    calls.append(list(requests))
    return oracle(requests)

  out = fanout.spd_rag_answers(task, ex, reader, tokenizer=TOK, synthesis_budget=64)
  assert out.correct.all()  # exact agents and a vote: every chain is found
  assert len(calls) == max(e["hops"] for e in ex)
  assert len(calls[0]) == 16 * 3  # every document of every episode, in one call
  assert len(calls[1]) == 3 * sum(e["hops"] == 2 for e in ex)
  e = ex[0]
  docs = task.documents(e["world_seed"])[1]
  reads = sum(fanout.count_tokens(TOK, agent_prompt(d, q)) for d, q in
              [r for c in calls for r in c] if d in docs and (d, q) in
              {(dd, qq) for dd, qq in calls[0][:3]})
  assert out.costs[0].tokens_in >= reads  # the agents' prompts are counted


def test_baselines_and_costs():
  task = _task()
  ex = task.generate(np.random.default_rng(1), 24)
  full = fanout.full_context_answers(task, ex, tokenizer=TOK, budget=512)
  assert full.correct.all() and all(c.calls == 1 for c in full.costs)
  cut = fanout.full_context_answers(task, ex, tokenizer=TOK, budget=40)
  assert cut.correct.mean() < full.correct.mean()
  assert all(c.tokens_in <= 40 for c in cut.costs)
  agentic = fanout.agentic_answers(task, ex, tokenizer=TOK, rng=np.random.default_rng(0))
  assert agentic.correct.all()
  # A two-turn episode reads its prompt, then prompt + action + observation.
  c = fanout.episode_cost(TOK, "3 docs. pet of ann?", ["read(1)", "answer(bob)"],
                          ["ann pet: bob."])
  p = fanout.count_tokens(TOK, "3 docs. pet of ann?")
  assert (c.tokens_in, c.tokens_out, c.calls) == (p + p + 8 + 13, 8 + 12, 2)
  assert fanout.chain_answer("docs: ann pet: bob. bob city: ki", "ann", ("pet",)) == "bob"
  assert fanout.chain_answer("docs: ann pet: bob. bob city: ki", "ann",
                             ("pet", "city")) == "none"  # a fact cut short is not read


def test_policy_agents_are_one_sampler_call_per_hop():
  """`PolicyReader`: a hop's B·D agent calls are one batch of the policy's sampler, and the
  replies carry the rows' prompt and answer token counts."""
  import jax
  from flax import nnx

  from credit.envs.subagents import DocAgents
  from credit.sampling import Sampler
  from credit.tasks.char_tokenizer import prompt_ids
  from tests.tiny_decoder import scaled_tiny_decoder

  model = scaled_tiny_decoder(TOK.vocab_size)
  sampler = Sampler(model, pad_id=TOK.pad_id, stop_tokens=(TOK.eos_id,))
  batches = []

  def counting(*a, **kw):
    batches.append(kw["prompt_tokens"].shape[0])
    return sampler(*a, **kw)

  agents_task = get_task("multidoc_agents", min_hops=1, max_hops=2, num_docs=3,
                         num_distractors=2)
  width = len(prompt_ids(TOK, "x" * agents_task.max_agent_prompt_chars))
  agents = DocAgents(counting, TOK, nnx.state(model), jax.random.key(0), prompt_width=width,
                     max_tokens=4, temperature=0.0)
  task = _task()
  ex = [e for e in task.generate(np.random.default_rng(0), 12) if e["hops"] == 1][:4]
  out = fanout.spd_rag_answers(task, ex, fanout.PolicyReader(agents), tokenizer=TOK)
  assert batches == [4 * 3]
  assert all(c.calls >= 3 and c.tokens_in > 0 for c in out.costs)


def test_agent_breakdown_scores_holding_and_other_documents_apart():
  from benchmarks.spd_rag import agent_breakdown, multidoc_task
  task = multidoc_task(3)
  ex = task.generate(np.random.default_rng(0), 8)
  exact = agent_breakdown(fanout.oracle_reader(TOK), task, ex)
  hops = sum(int(e["hops"]) for e in ex)
  assert exact["calls"] == 3 * hops and exact["docs"] == 3
  assert exact["holding_acc"] == exact["other_acc"] == exact["other_none"] == 1.0
  assert exact["holding_none"] == 0.0
  lazy = agent_breakdown(lambda reqs: [fanout.Reply("none", 1, 1) for _ in reqs], task, ex)
  assert lazy["holding_acc"] == 0.0 and lazy["other_acc"] == 1.0 and lazy["holding_none"] == 1.0
