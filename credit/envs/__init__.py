"""Multi-turn environments (host side), a tool-call format and built-in multi-turn tasks.

`base`: `StepResult`, `Limits`, the `Environment` / `MultiTurnTask` protocols, `TextEnv`
(shared episode bookkeeping), `EnvBatch` (B episodes stepped together, their per-turn
contract fields) and `run_episode`. `tools`: `ToolFormat`, `parse_action`, `Action`.
`chat`: `turn_template`, how a tokenizer renders prompts, policy turns and observations (its
chat template with the tool role, or the plain character layout). `calls`: `call_all`, the
concurrent, time-limited, isolated calls the multi-turn engine steps environments with.
Tasks (registered, so `credit.tasks.get_task("lookup")` works once this package is
imported): `lookup` (multi-hop search over a hidden knowledge base), `calculator`
(one arithmetic operation per turn with a calculator tool), `multidoc` (multi-hop QA over
several hidden documents read with `read(d)`; dispatch turns role 0, the answer role 1),
`multidoc_agents` (the same questions with SPD-RAG's per-document agents: `ask(d, question)`
answered by the policy in the document's own context; `subagents`),
`pivot_turn` (K questions over K turns, only the one named in the prompt decides the reward:
the credit benchmark's multi-turn bifurcation task), `search_qa` (multi-hop questions answered
with BM25 `search` and `open` over a corpus: the built-in one of `corpus`, or the user's
JSON-lines documents; `search`), `python_program` (programs written in Python and run on unit
tests in the sandbox; `pyprogram`). `sandbox`: `run_python`, one program in a fresh,
resource-limited subprocess with no network and no files outside its scratch directory.
`fanout`: SPD-RAG at inference (every document's agent in one batched call, a token-bounded
synthesis, the paper's baselines, tokens per question).

The engines that play these environments with a policy run the model, so this package does
not re-export them; import them from their modules: `rollout.MultiTurnSampler` (and
`TurnLayout`), `context.ContextSampler` (long episodes under a context budget: the oldest
observations dropped), `subagents.AgentsMultiTurnSampler` (the policy as document agents).
"""
from credit.envs.base import (Environment, Episode, EpisodeDoneError, EnvBatch, Limits,
                              MultiTurnTask, StepResult, TextEnv, Turn, run_episode,
                              task_limits)
from credit.envs.calculator import Calculator, CalculatorEnv
from credit.envs.calls import Call, call_all
from credit.envs.chat import ChatTurns, PlainTurns, TurnTemplate, turn_template
from credit.envs.lookup import Lookup, LookupEnv
from credit.envs.multidoc import MultiDoc, MultiDocEnv
from credit.envs.pivot_turn import PivotTurn, PivotTurnEnv
from credit.envs.pyprogram import PythonProgram  # registers python_program
from credit.envs.sandbox import SandboxLimits, SandboxResult, run_python
from credit.envs.search import SearchEnv, SearchIndex, SearchQA  # registers search_qa
from credit.envs.subagents import MultiDocAgents, MultiDocAgentsEnv  # registers multidoc_agents
from credit.envs.tools import Action, ToolFormat, parse_action, query_chars

__all__ = [
    "Action", "Calculator", "CalculatorEnv", "Call", "ChatTurns", "EnvBatch", "Environment", "Episode",
    "EpisodeDoneError", "Limits", "Lookup", "LookupEnv", "MultiDoc", "MultiDocEnv",
    "MultiTurnTask", "PivotTurn", "PivotTurnEnv", "PlainTurns", "PythonProgram",
    "SandboxLimits", "SandboxResult", "SearchEnv", "SearchIndex", "SearchQA", "StepResult",
    "TextEnv", "ToolFormat", "Turn", "TurnTemplate", "call_all", "parse_action", "query_chars",
    "run_episode", "run_python", "task_limits", "turn_template",
]
