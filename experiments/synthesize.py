"""Agent-synthesised lookup questions: `python -m experiments.synthesize --policy DIR --out FILE`.

`--task=search_qa`: questions over the built-in search corpus grown by injection and fuzzing,
kept when answered without tools by none and with tools at least `--min_open` of `--k` times
(`credit.envs.synthesis.synthesize_search`; without `--policy` the task's demonstrator plays
with tools and a corpus prior without):

  python -m experiments.synthesize --task=search_qa --out synth.jsonl --num 256 \
      --task_kwargs '{"max_hops": 3}' --k 4
  python -m experiments.run --config experiments/configs/search_agent_qa.py:long \
      --workdir runs/long_synth --config.task_kwargs.questions_path=synth.jsonl

The policy explores worlds of the lookup task, its transcripts propose one-hop-longer
questions (injection), the knowledge base verifies them, and the solver's pass rate over k
sampled episodes keeps those in [min_rate, max_rate] (`credit.envs.synthesis`). Example:

  python -m experiments.synthesize --policy runs/lookup_warmup/hf_policy --out questions.jsonl \
      --num 64 --seed 0 --task_kwargs '{"max_hops": 3}' --hops_max 3 --k 8 \
      --min_rate 0.1 --max_rate 0.8 --max_turns 5

then train on them with the same task options:

  python -m experiments.run --config experiments/configs/igpo_lookup.py --workdir runs/synth \
      --config.task_kwargs.max_hops=3 --config.task_kwargs.questions_path=questions.jsonl

`--policy` is an `hf_policy/` export of a from-scratch run of this library (or the run's
workdir holding one): its `char_tokenizer.json` identifies the tokenizer. `--solver` gives
another policy for the difficulty (default: the explorer). The file is valid only for the
task options it was made with (the worlds are a function of world_seed and the options);
`Lookup(questions_path=...)` re-verifies every record and refuses a file that does not match.
The run evaluates on records held out of the file (10%, `task_kwargs.eval_fraction`), or on a
second file (`task_kwargs.eval_questions_path`, e.g. synthesised with another --seed).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

from credit.envs.base import Limits
from credit.envs.lookup import Lookup
from credit.envs.rollout import MultiTurnSampler, TurnLayout
from credit.envs.synthesis import SamplerPlayer, synthesize, write_questions
from credit.tasks import CharTokenizer

CHAR_TOKENIZER_FILE = "char_tokenizer.json"  # = experiments.producers.CHAR_TOKENIZER_FILE


def load_policy(path: str) -> tuple[Any, CharTokenizer, str]:
  """(model, tokenizer, directory) of an exported policy (`path` or `path`/hf_policy)."""
  from credit import models  # pylint: disable=g-import-not-at-top
  if os.path.isdir(os.path.join(path, "hf_policy")):
    path = os.path.join(path, "hf_policy")
  if not os.path.exists(os.path.join(path, "config.json")):
    raise SystemExit(f"--policy {path!r}: no config.json (give an hf_policy/ export)")
  tok_file = os.path.join(path, CHAR_TOKENIZER_FILE)
  if not os.path.exists(tok_file):
    raise SystemExit(f"--policy {path!r} has no {CHAR_TOKENIZER_FILE}: the lookup questions are "
                     "written for the character tokenizer of this library's from-scratch runs")
  with open(tok_file) as f:
    tok = CharTokenizer(json.load(f)["chars"])
  model, cfg = models.from_pretrained(path)
  if cfg.vocab_size < tok.vocab_size:
    raise SystemExit(f"--policy {path!r}: vocab_size {cfg.vocab_size} < the tokenizer's "
                     f"{tok.vocab_size}")
  return model, tok, path


def _player(path: str, task: Lookup, layout: TurnLayout, batch_size: int, a) -> SamplerPlayer:
  from flax import nnx  # pylint: disable=g-import-not-at-top
  model, tok, _ = load_policy(path)
  sampler = MultiTurnSampler(model, tokenizer=tok, layout=layout)
  return SamplerPlayer(sampler, nnx.state(model), batch_size=batch_size,
                       temperature=a.temperature, top_k=a.top_k, top_p=a.top_p)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="python -m experiments.synthesize", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--task", default="lookup", choices=("lookup", "search_qa"),
                 help="lookup (the agent explores worlds) or search_qa (injection and fuzzing "
                      "over the built-in search corpus)")
  p.add_argument("--policy", default="", help="hf_policy/ export (or a run workdir); "
                 "search_qa without it: the demonstrator with tools, a prior without")
  p.add_argument("--solver", default="", help="policy for the pass rate (default: --policy)")
  p.add_argument("--out", required=True, help="jsonl file of kept questions")
  p.add_argument("--num", type=int, default=64, help="questions to keep")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--task_kwargs", default="{}", help='lookup options as JSON, e.g. {"max_hops": 3}')
  p.add_argument("--hops_max", type=int, default=0, help="longest question (0: task max_hops)")
  p.add_argument("--k", type=int, default=8, help="episodes per question for the pass rate")
  p.add_argument("--min_rate", type=float, default=0.1)
  p.add_argument("--max_rate", type=float, default=0.8)
  p.add_argument("--questions_per_round", type=int, default=8)
  p.add_argument("--probes", type=int, default=-1,
                 help="probe episodes per question (-1: every relation)")
  p.add_argument("--branch", type=int, default=1, help="injections of a question measured")
  p.add_argument("--max_rounds", type=int, default=50)
  p.add_argument("--max_turns", type=int, default=0, help="K (0: the task's max_turns)")
  p.add_argument("--max_action_tokens", type=int, default=0, help="0: longest action + eos")
  p.add_argument("--max_observation_tokens", type=int, default=16,
                 help="observation tokens (= chars: the env cuts them, as in training)")
  p.add_argument("--max_new_tokens", type=int, default=0, help="episode budget (0: no limit)")
  p.add_argument("--fuzz_prob", type=float, default=0.5, help="search_qa: fuzzed share")
  p.add_argument("--max_closed", type=float, default=0.0,
                 help="search_qa: highest pass rate without tools kept")
  p.add_argument("--min_open", type=float, default=0.25,
                 help="search_qa: lowest pass rate with tools kept")
  p.add_argument("--temperature", type=float, default=1.0)
  p.add_argument("--top_k", type=int, default=0)
  p.add_argument("--top_p", type=float, default=1.0)
  return p.parse_args(argv)


def table(stats: dict, a, task: Lookup) -> str:
  """The summary printed at the end."""
  def rate(x):
    return "-" if x != x else f"{x:.2f}"  # NaN: nothing measured
  hops = "  ".join(f"{h}:{n}" for h, n in stats["hops"].items()) or "-"
  rows = [
      ("task", repr(task)),
      ("rounds / seed worlds / episodes",
       f"{stats['rounds']} / {stats['seeds']} / {stats['episodes']}"),
      ("seed questions' mean pass rate", rate(stats["seed_pass_rate"])),
      ("candidates proposed", stats["proposed"]),
      ("answerable (verified)", f"{stats['answerable']} (rejected {stats['rejected']})"),
      (f"difficulty measured (k={a.k})",
       f"{stats['measured']} (mean pass rate {rate(stats['candidate_pass_rate'])})"),
      (f"kept by difficulty [{a.min_rate}, {a.max_rate}]",
       f"{stats['kept']} (too easy {stats['too_easy']}, too hard {stats['too_hard']})"),
      ("kept hops histogram", hops),
      ("kept via", ", ".join(f"{k}:{v}" for k, v in stats["via"].items()) or "-"),
      ("time", f"{stats['seconds']:.1f} s"),
  ]
  w = max(len(r[0]) for r in rows)
  return "\n".join(f"{name:<{w}}  {value}" for name, value in rows)


def search_main(a: argparse.Namespace) -> dict:
  """`--task=search_qa`: `credit.envs.synthesis.synthesize_search` over the built-in corpus."""
  from credit.envs.search import SearchQA  # pylint: disable=g-import-not-at-top
  from credit.envs.synthesis import synthesize_search, write_search_questions  # pylint: disable=g-import-not-at-top
  try:
    task = SearchQA(**json.loads(a.task_kwargs))
  except (ValueError, TypeError) as e:
    raise SystemExit(f"--task_kwargs {a.task_kwargs!r}: {e}") from None
  with_tools = without = None
  if a.policy:  # the policy plays both sides
    K = a.max_turns or task.max_turns
    layout = TurnLayout(prompt_width=task.max_prompt_chars + 1, max_turns=K,
                        max_action_tokens=a.max_action_tokens or task.max_action_chars + 1,
                        max_observation_tokens=a.max_observation_tokens,
                        max_total_tokens=a.max_new_tokens or None)
    with_tools = without = _player(a.policy, task, layout, a.questions_per_round * a.k, a)
  res = synthesize_search(task, num=a.num, with_tools=with_tools, without_tools=without, k=a.k,
                          seed=a.seed, fuzz_prob=a.fuzz_prob, max_closed=a.max_closed,
                          min_open=a.min_open, batch=a.questions_per_round,
                          max_rounds=a.max_rounds)
  os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
  write_search_questions(a.out, res.records)
  print("  ".join(f"{k}: {v:.1f}" if isinstance(v, float) else f"{k}: {v}"
                  for k, v in res.stats.items()))
  print(f"wrote {len(res.records)} questions to {a.out}")
  return res.stats


def main(argv: Sequence[str] | None = None) -> dict:
  a = parse_args(argv)
  if a.task == "search_qa":
    return search_main(a)
  if not a.policy:
    raise SystemExit("--policy is required for --task=lookup")
  try:
    task = Lookup(**json.loads(a.task_kwargs))
  except (ValueError, TypeError) as e:
    raise SystemExit(f"--task_kwargs {a.task_kwargs!r}: {e}") from None
  K = a.max_turns or task.max_turns
  layout = TurnLayout(prompt_width=task.max_prompt_chars + 1, max_turns=K,
                      max_action_tokens=a.max_action_tokens or task.max_action_chars + 1,
                      max_observation_tokens=a.max_observation_tokens,
                      max_total_tokens=a.max_new_tokens or None)
  limits = Limits(max_turns=K, max_observation_chars=a.max_observation_tokens)
  probes = len(task.relations) if a.probes < 0 else a.probes
  Q = a.questions_per_round
  if a.solver:  # explorer plays the probes, the solver the questions
    explorer = _player(a.policy, task, layout, max(1, Q * probes), a)
    solver = _player(a.solver, task, layout, Q * a.k, a)
  else:  # one batch per round: k episodes + the probes of every question
    explorer, solver = _player(a.policy, task, layout, Q * (a.k + probes), a), None
  res = synthesize(task, explorer, solver=solver, num=a.num, seed=a.seed,
                   hops_max=a.hops_max or None, k=a.k, min_rate=a.min_rate,
                   max_rate=a.max_rate, questions_per_round=Q, probes=probes,
                   branch=a.branch, max_rounds=a.max_rounds, limits=limits,
                   log=lambda line: print(line, file=sys.stderr, flush=True))
  os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
  write_questions(a.out, res.records)
  print(table(res.stats, a, task))
  print(f"wrote {len(res.records)} questions to {a.out}")
  for line in res.stats["reject_examples"]:
    print(f"  rejected: {line}")
  return res.stats


if __name__ == "__main__":
  main()
