"""Built-in verifiable tasks (no download), a character tokenizer, data sources and loaders.

Tasks: `get_task("arithmetic" | "chain" | "countdown" | "pivotal" | "copy_digit" | "program",
**options)`;
each has `generate(rng, n)`, `verify(example, response) -> float`, `demonstration(example)`
(`chain`: reasoning, then the answer after its `answer_marker`).
User data: `load_jsonl` (plain / GSM8K / MATH formats), `load_tfds`, verified with `MathVerifier`.
tfds: `build_task_dataset`, `task_data_source`; batches: `make_loader` (grain).
Token batches: `CharTokenizer`, `encode_prompts`, `encode_prompt_response`,
`decode_responses`, `token_flags` (a task's character flags on response tokens).
"""
from credit.tasks.arithmetic import Arithmetic
from credit.tasks.bifurcation import Delayed, Distractor, PivotalAnd, PivotalOr
from credit.tasks.chain import Chain
from credit.tasks.base import (Task, UnknownTaskError, as_example, get_task, list_tasks,
                               register_task, verify_batch)
from credit.tasks.copy_digit import CopyDigit
from credit.tasks.countdown import Countdown, ExpressionError, evaluate_expression, solve_countdown
from credit.tasks.data import (DATA_FORMATS, ExampleSource, MissingFieldError, boxed_answer,
                               build_task_dataset, collate, default_data_dir, detect_format,
                               gsm8k_answer, load_jsonl, load_tfds, make_loader,
                               task_data_source, task_tfds_name)
from credit.tasks.math_verifier import MathVerifier
from credit.tasks.pivotal import Pivotal
from credit.tasks.program import Program, RunResult, run_program
from credit.tasks.char_tokenizer import (CharTokenizer, decode_responses, encode_prompt_response,
                                    encode_prompts, pad_rows, token_flags)

__all__ = [
    "Delayed", "Distractor", "PivotalAnd", "PivotalOr",
    "Arithmetic", "Chain", "CharTokenizer", "CopyDigit", "Countdown", "DATA_FORMATS",
    "ExampleSource", "ExpressionError", "MathVerifier", "MissingFieldError", "Pivotal",
    "Program", "RunResult", "Task", "UnknownTaskError", "as_example", "boxed_answer",
    "build_task_dataset", "collate", "decode_responses", "default_data_dir", "detect_format",
    "encode_prompt_response", "encode_prompts", "evaluate_expression", "get_task",
    "gsm8k_answer", "list_tasks", "load_jsonl", "load_tfds", "make_loader", "pad_rows",
    "register_task", "run_program", "solve_countdown", "task_data_source", "task_tfds_name",
    "token_flags", "verify_batch"
]

# The multi-turn tasks live with their environments (credit/envs: lookup, calculator,
# multidoc); importing them here registers them, so `get_task("lookup")` works.
import credit.envs  # noqa: E402,F401  pylint: disable=g-import-not-at-top,wrong-import-position
