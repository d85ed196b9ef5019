"""SPD-RAG against its baselines on the built-in multi-document task: accuracy and tokens.

Systems (`credit.envs.fanout`), on the same `multidoc` questions and documents:

  spd_rag       per hop, the sub-question to every document's agent in one batched call
                across documents and questions, then a synthesis of the D partial answers by
                similarity-ordered recursive map-reduce, each merge call's prompt at most
                `--synthesis_budget` tokens;
  full_context  every document in one context cut to `--budget` tokens, one call (and, for
                the ratios, the same uncut);
  agentic_rag   retrieval turns: `read(d)` one document per turn (unread documents in a random
                order until the chain is revealed), each turn a call that re-reads the context.

Readers: `oracle` (exact reading: each system's ceiling under its budgets; the default) and,
with `--agents_from <hf_policy>`, SPD-RAG's document agents sampled greedily from a policy
trained on `multidoc_agents` (e.g. `experiments/configs/spd_rag_multidoc.py`'s export). At
two document counts (`--docs 3,8`); tokens are prompt tokens read by every call plus tokens
written, per question, and the ratio to full context's in the same run. With
`--agents_from`, also the agents alone (`agent_breakdown`): every hop's sub-question put to
every document, greedy, scored against the document (the fact on the document that holds
it, "none" on the others), and the share of "none" answers.

  python benchmarks/spd_rag.py [--docs 3,8] [--examples 256] [--budget 128]
      [--synthesis_budget 40] [--agents_from runs/spd_rag_multidoc/hf_policy] [--out FILE]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from credit.envs import fanout
from credit.tasks import CharTokenizer, get_task


def multidoc_task(num_docs: int):
  """1- and 2-hop questions over `num_docs` documents holding one or two facts each."""
  return get_task("multidoc", min_hops=1, max_hops=2, num_docs=num_docs,
                  num_distractors=max(2, 2 * num_docs - 4), extra_turns=num_docs - 1,
                  demonstrator="search")


def policy_reader(path: str, tokenizer, task, seed: int):
  """SPD-RAG's document agents from an exported policy, greedy, one batch per call."""
  import jax  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top

  from credit.envs.subagents import DocAgents  # pylint: disable=g-import-not-at-top
  from credit.models.hf_io import from_pretrained  # pylint: disable=g-import-not-at-top
  from credit.sampling import Sampler  # pylint: disable=g-import-not-at-top
  from credit.tasks.char_tokenizer import prompt_ids  # pylint: disable=g-import-not-at-top
  model = from_pretrained(path)
  model = model[0] if isinstance(model, tuple) else model
  sampler = Sampler(model, pad_id=tokenizer.pad_id, stop_tokens=(tokenizer.eos_id,))
  width = len(prompt_ids(tokenizer, "x" * task.max_agent_prompt_chars))
  agents = DocAgents(sampler, tokenizer, nnx.state(model), jax.random.key(seed),
                     prompt_width=width, max_tokens=task.agent_max_tokens, temperature=0.0)
  return fanout.PolicyReader(agents)


def agent_breakdown(reader, task, examples) -> dict:
  """The document agents alone: each gold hop's sub-question to every document (one
  `reader` call); accuracy on the documents that hold the fact and on the others (whose right
  answer is "none"), and the share of "none" answers on each."""
  from credit.envs.subagents import NONE, oracle_answer  # pylint: disable=g-import-not-at-top
  requests, holds = [], []
  for e in examples:
    world, texts, where = task.documents(int(e["world_seed"]))
    docs = [t[:task.max_observation_chars] for t in texts]
    for i, (s, r, _) in enumerate(world.chain):
      for j, d in enumerate(docs):
        requests.append((d, f"{s} {r}"))
        holds.append(j == where[i])
  holds = np.array(holds)
  answers = np.array([rep.text for rep in reader(requests)])
  right = answers == np.array([oracle_answer(d, q)[0] for d, q in requests])
  none = answers == NONE
  return {"docs": task.num_docs, "calls": len(requests),
          "holding_acc": float(right[holds].mean()), "other_acc": float(right[~holds].mean()),
          "holding_none": float(none[holds].mean()), "other_none": float(none[~holds].mean())}


def run(num_docs: int, examples: int, budget: int, synthesis_budget: int,
        agents_from: str, seed: int, breakdown: list | None = None) -> list[dict]:
  tok = CharTokenizer()
  task = multidoc_task(num_docs)
  ex = task.generate(np.random.default_rng(seed), examples)
  systems = [("spd_rag (oracle agents)",
              lambda: fanout.spd_rag_answers(task, ex, fanout.oracle_reader(tok), tokenizer=tok,
                                             synthesis_budget=synthesis_budget))]
  if agents_from:
    agents_task = get_task("multidoc_agents", min_hops=1, max_hops=2, num_docs=num_docs,
                           num_distractors=max(2, 2 * num_docs - 4))
    reader = policy_reader(agents_from, tok, agents_task, seed)
    if breakdown is not None:
      breakdown.append(agent_breakdown(reader, task, ex))
    systems.append(("spd_rag (policy agents)",
                    lambda: fanout.spd_rag_answers(task, ex, reader, tokenizer=tok,
                                                   synthesis_budget=synthesis_budget)))
  systems += [("full_context", lambda: fanout.full_context_answers(task, ex, tokenizer=tok,
                                                                   budget=budget)),
              ("full_context (uncut)", lambda: fanout.full_context_answers(
                  task, ex, tokenizer=tok, budget=10**6)),
              ("agentic_rag", lambda: fanout.agentic_answers(
                  task, ex, tokenizer=tok, rng=np.random.default_rng(seed)))]
  rows = []
  for name, fn in systems:
    t0 = time.process_time()
    r = fn()
    rows.append({"system": name, "docs": num_docs, "accuracy": float(r.correct.mean()),
                 "tokens_in": float(np.mean([c.tokens_in for c in r.costs])),
                 "tokens_out": float(np.mean([c.tokens_out for c in r.costs])),
                 "calls": float(np.mean([c.calls for c in r.costs])),
                 "cpu_s": time.process_time() - t0})
  full = next(r for r in rows if r["system"] == "full_context (uncut)")
  for r in rows:
    r["vs_full"] = (r["tokens_in"] + r["tokens_out"]) / (full["tokens_in"] + full["tokens_out"])
  return rows


def table(rows: list[dict]) -> str:
  out = ["| system | docs | accuracy | tokens / question (read + written) | calls / question "
         "| tokens vs uncut full context |", "|---|---:|---:|---:|---:|---:|"]
  for r in rows:
    out.append(f"| {r['system']} | {r['docs']} | {r['accuracy']:.3f} | "
               f"{r['tokens_in'] + r['tokens_out']:.0f} ({r['tokens_in']:.0f} + "
               f"{r['tokens_out']:.0f}) | {r['calls']:.1f} | {r['vs_full']:.2f}x |")
  return "\n".join(out)


def main(argv=None) -> list[dict]:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--docs", default="3,8", help="document counts, comma-separated (<= 9)")
  p.add_argument("--examples", type=int, default=256)
  p.add_argument("--budget", type=int, default=128, help="full context's prompt tokens")
  p.add_argument("--synthesis_budget", type=int, default=40,
                 help="prompt tokens of one merge call")
  p.add_argument("--agents_from", default="", help="hf_policy of a multidoc_agents run")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default="", help="also write the table (markdown) here")
  a = p.parse_args(argv)
  rows, agents = [], []
  for d in (int(x) for x in a.docs.split(",")):
    rows += run(d, a.examples, a.budget, a.synthesis_budget, a.agents_from, a.seed, agents)
  text = table(rows)
  if agents:
    text += ("\n\n| docs | agent calls | accuracy where the document holds the fact | "
             "\"none\" share there | accuracy (= \"none\" share) on the other documents |\n"
             "|---:|---:|---:|---:|---:|\n" + "\n".join(
                 f"| {b['docs']} | {b['calls']} | {b['holding_acc']:.3f} | "
                 f"{b['holding_none']:.3f} | {b['other_acc']:.3f} |" for b in agents))
  print(text)
  if a.out:
    with open(a.out, "w") as f:
      f.write(text + "\n")
  return rows


if __name__ == "__main__":
  main()
