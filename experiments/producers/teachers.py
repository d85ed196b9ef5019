"""Teacher passes: a frozen teacher checkpoint, the policy as its own teacher under a
privileged context, and VERPO's evidence contrast; with the checks of teacher files and
privileged contexts that other producers reuse."""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from credit import parallel, scoring
from credit import tasks as tasks_lib
from experiments import train
from experiments.producers import learners
from experiments.producers.base import (Produce, Setup, SetupError, StepContext, prompt_width,
                                        response_starts, to_rollout, producer)
from experiments.producers.rescoring import (response_layout)


# --------------------------------------------------------------------------
# Teachers: a frozen model from a local checkpoint, or the policy under a privileged context.
# --------------------------------------------------------------------------

TEACHER_FIELDS = ("logprob_teacher", "teacher_topk_logprob", "teacher_topk_ids")
CHAR_TOKENIZER_FILE = "char_tokenizer.json"  # written by exports of from-scratch runs


def _json(path: str, what: str) -> dict:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise SetupError(f"{what}: cannot read {path} ({e})") from None


def tokenizer_identity(directory: str) -> tuple[str, Any] | None:
  """What identifies a checkpoint's tokenizer: ("char", chars) for exports of from-scratch
  runs (`char_tokenizer.json`), ("hf", (vocab, added tokens)) for a Hugging Face
  `tokenizer.json`, None when the directory has neither."""
  char = os.path.join(directory, CHAR_TOKENIZER_FILE)
  if os.path.exists(char):
    return "char", _json(char, directory).get("chars")
  hf = os.path.join(directory, "tokenizer.json")
  if os.path.exists(hf):
    j = _json(hf, directory)
    added = sorted((t.get("id"), t.get("content")) for t in j.get("added_tokens", []))
    return "hf", (json.dumps(j.get("model", {}).get("vocab"), sort_keys=True), added)
  return None


def check_teacher_files(c: ml_collections.ConfigDict) -> None:
  """A frozen teacher (`c.teacher.init_from`) must share the student's tokenizer and
  vocabulary size: checked from the files, before any file is written."""
  path = c.teacher.init_from
  what = f"teacher.init_from={path!r}"
  if not os.path.isdir(path) or not os.path.exists(os.path.join(path, "config.json")):
    raise SetupError(f"{what} is not a checkpoint directory (no config.json)")
  if not any(f.endswith(".safetensors") for f in os.listdir(path)):
    raise SetupError(f"{what} has no *.safetensors weights")
  student_dir = c.init_from or c.get("warm_start_from", "")
  if c.init_from:
    student = tokenizer_identity(c.init_from)
    student_vocab = _json(os.path.join(c.init_from, "config.json"), "init_from").get(
        "vocab_size")
  else:
    student = ("char", tasks_lib.CharTokenizer().chars)
    student_vocab = tasks_lib.CharTokenizer().vocab_size
  teacher = tokenizer_identity(path)
  if teacher is None:
    raise SetupError(f"{what} has neither tokenizer.json nor {CHAR_TOKENIZER_FILE}: its "
                     "tokenizer cannot be checked against the student's (export it with this "
                     "library, or copy the tokenizer files next to its weights)")
  if teacher != student:
    kinds = {"char": "the character tokenizer of from-scratch runs",
             "hf": "a Hugging Face tokenizer.json"}
    detail = (f"the teacher has {kinds[teacher[0]]}, the student "
              f"({student_dir or 'from scratch'}) {kinds[student[0]]}"
              if teacher[0] != student[0] else "their vocabularies differ")
    raise SetupError(f"{what}: the teacher's tokenizer is not the student's ({detail}); "
                     "distillation compares the two models' probabilities of the same token "
                     "ids, so they must share one tokenizer")
  teacher_vocab = _json(os.path.join(path, "config.json"), what).get("vocab_size")
  if teacher_vocab != student_vocab:
    raise SetupError(f"{what}: its vocab_size {teacher_vocab} is not the student's "
                     f"{student_vocab} (same tokenizer, different embedding tables)")


def _teacher_scorer(graphdef, rest, chunk: int | None, top_k: int, width: int | None,
                    names: tuple[str, ...]) -> Callable:
  """jitted fn(params, seq, attn, response_mask, start) -> the wanted teacher fields,
  aligned to the rollout: `seq` is the rollout itself (`width` None; `start` unused) or
  re-laid by `response_layout` (a prompt of `width` columns, then each row's response from
  its rollout column `start`)."""

  @jax.jit
  def run(params, seq, attn, response_mask, start=None):
    model = train.merge_model(graphdef, params, rest)
    hidden, unembed, mask = scoring.model_hidden(model, seq, attn)
    ts = scoring.teacher_scores_hidden(hidden, unembed, seq, mask, top_k=top_k,
                                       chunk_size=chunk)

    def rollout_columns(x, fill):
      if width is None:
        return x
      return to_rollout(x, start, width, response_mask.shape[1], fill)

    out = {"logprob_teacher": jnp.where(response_mask, rollout_columns(ts.logprob, 0.0), 0.0)}
    if top_k:
      m = response_mask[..., None]
      out["teacher_topk_logprob"] = jnp.where(m, rollout_columns(ts.topk_logprob, 0.0), 0.0)
      out["teacher_topk_ids"] = jnp.where(m, rollout_columns(ts.topk_ids, -1), -1)
    return {n: out[n] for n in names}

  return run


def _teacher_top_k(s: Setup, wanted: frozenset) -> int:
  if not wanted & {"teacher_topk_logprob", "teacher_topk_ids"}:
    return 0
  if s.c.teacher.top_k < 1:
    raise SetupError(f"teacher.top_k={s.c.teacher.top_k}: the method needs the teacher's top-k "
                     "distribution (teacher_topk_*), so top_k must be >= 1")
  return int(s.c.teacher.top_k)


@producer("teacher_pass",
          provides=TEACHER_FIELDS,
          requires=("tokens", "response_mask"),
          phase="teacher",
          doc="a frozen teacher (c.teacher.init_from: a local checkpoint with the "
   "student's tokenizer, its own dtype) scores the student's tokens: log-prob of each "
   "and its top-k distribution with a tail bucket (c.teacher.top_k; chunked)",
          when=lambda c: bool(c.teacher.init_from),
          check=check_teacher_files,
          off_doc="set teacher.init_from (a frozen teacher) or teacher.context (the policy "
                  "as its own teacher)")
def _build_teacher_pass(s: Setup, wanted: frozenset) -> Produce:
  """The frozen teacher (`c.teacher.init_from`, its own dtype, sharded on the run's mesh)
  scores the student's tokens: log-prob of each sampled token and, when wanted, its top-k
  distribution with a tail bucket (chunked: no [B,T,V] array)."""
  from credit import models  # pylint: disable=g-import-not-at-top
  tc = s.c.teacher
  teacher, _ = models.from_pretrained(tc.init_from, mesh=s.mesh, param_dtype=tc.param_dtype,
                                      dtype=tc.compute_dtype)
  graphdef, params, rest = train.split_model(teacher)
  run = _teacher_scorer(graphdef, rest, s.chunk_size, _teacher_top_k(s, wanted), None,
                        tuple(sorted(wanted)))

  def produce(state, batch, ctx: StepContext) -> dict:
    return run(params, batch["tokens"], batch["attn_mask"], batch["response_mask"])

  return produce


def _task_context(task, example: Mapping[str, Any], kind: str) -> str:
  """The privileged text of `kind` for one example: the gold answer for "answer", else the
  task's `privileged_context(example, kind)`."""
  if kind == "answer":
    return str(example["answer"])
  fn = getattr(task, "privileged_context", None)
  if fn is None:
    raise SetupError(f"teacher.context={kind!r}: task {getattr(task, 'name', task)!r} provides "
                     "no privileged contexts (only 'answer' works for every task)")
  return fn(example, kind)


def _self_teacher_on(c: ml_collections.ConfigDict) -> bool:
  return bool(c.teacher.context) and not c.teacher.init_from


def _check_self_teacher(c: ml_collections.ConfigDict) -> None:
  if c.teacher.lag < 0:
    raise SetupError(f"teacher.lag={c.teacher.lag} must be >= 0")
  check_context(c, c.teacher.context, "teacher.context")


def check_context(c: ml_collections.ConfigDict, kind: str, what: str) -> None:
  """SetupError unless the task gives privileged context `kind` (`what` names the setting)."""
  if "{text}" not in c.teacher.prefix:
    raise SetupError(f"teacher.prefix={c.teacher.prefix!r} must contain {{text}}, where the "
                     f"privileged context goes ({what})")
  if kind == "answer":
    return
  if c.task in ("jsonl", "tfds"):
    raise SetupError(f"{what}={kind!r}: user data has only the 'answer' context")
  try:
    task = tasks_lib.get_task(c.task, **dict(c.task_kwargs))
    _task_context(task, task.generate(np.random.default_rng(0), 1)[0], kind)
  except (KeyError, TypeError):
    return  # build_data reports the bad task
  except ValueError as e:
    raise SetupError(f"{what}={kind!r}: {e}") from None


def privileged_prompt(c: ml_collections.ConfigDict, task, example: Mapping[str, Any],
                      kind: str) -> str:
  """`c.teacher.prefix` with the privileged text of `kind` for `example`, then its prompt."""
  example = tasks_lib.as_example(example)
  return c.teacher.prefix.format(context=kind, text=_task_context(task, example, kind)
                                 ) + example["prompt"]


def _init_self_teacher(s: Setup, policy_params) -> Any:
  """With `teacher.lag` = n > 0, the self-teacher's copy of the policy (refreshed every n
  steps, checkpointed with the run); None with lag 0 (the current policy scores)."""
  if not s.c.teacher.lag:
    return None
  return learners.LearnerState(params=jax.tree.map(jnp.copy, policy_params), opt_state=None,
                               step=jnp.zeros((), jnp.int32))


@producer("self_teacher_pass",
          provides=TEACHER_FIELDS,
          requires=("tokens", "response_mask"),
          phase="teacher",
          doc="the policy as its own teacher: the student's tokens re-scored with a privileged "
              "context (c.teacher.context: answer | a task's hint...) before the prompt, by the "
              "current or a lagged copy of the parameters (c.teacher.lag)",
          when=_self_teacher_on,
          check=_check_self_teacher,
          init=_init_self_teacher,
          off_doc="set teacher.context (answer | hint | ...) without teacher.init_from")
def _build_self_teacher_pass(s: Setup, wanted: frozenset):
  """The policy as its own teacher: the student's tokens re-scored after
  `c.teacher.prefix` (with the privileged text of `c.teacher.context`) ⊕ prompt, by the
  current parameters or (`c.teacher.lag` = n) a copy refreshed every n steps."""
  c, tok, task = s.c, s.data.tokenizer, s.data.task
  kind, lag, name = c.teacher.context, int(c.teacher.lag), "self_teacher_pass"

  def prompt_of(example) -> str:
    return privileged_prompt(c, task, example, kind)

  width = prompt_width(tok, (prompt_of(e) for e in s.data.train),
                        f"a prompt with its teacher context {c.teacher.prefix!r}")
  lay = response_layout(s, width)
  run = _teacher_scorer(s.graphdef, s.rest, s.chunk_size, _teacher_top_k(s, wanted), width,
                        tuple(sorted(wanted)))

  def produce(state, batch, ctx: StepContext) -> dict:
    params = state.params
    if lag:
      held = ctx.learners[name]
      if int(state.step) % lag == 0:  # refresh the lagged copy
        # Copies: the update donates the train state's buffers.
        held = held.replace(params=jax.tree.map(jnp.copy, state.params),
                            step=jnp.copy(state.step))
        ctx.learners[name] = held
      params = held.params
    prompts = [prompt_of({k: ctx.examples[k][i] for k in ctx.examples})
               for i in range(len(ctx.examples["prompt"]))]
    start = response_starts(batch)
    seq, attn = lay(prompts, batch, batch["attn_mask"], start=start)
    return run(params, seq, attn, batch["response_mask"],
               parallel.shard_batch(start, s.mesh))

  return produce, None


@producer("evidence_pass",
          provides=("evidence_nuisance",),
          requires=("tokens", "response_mask"),
          phase="teacher",
          doc="VERPO's Fisher Evidence Contrast: the current policy's hidden states without and "
              "with the privileged context (c.teacher.context), the part of each token's "
              "log-prob shift along the batch's evidence-presence direction",
          when=_self_teacher_on,
          check=_check_self_teacher,
          off_doc="set teacher.context (answer | hint | ...) without teacher.init_from")
def _build_evidence_pass(s: Setup, wanted: frozenset) -> Produce:
  """VERPO's Fisher Evidence Contrast: `evidence_nuisance` from the current policy's hidden
  states without (the rollout) and with the privileged context (`c.teacher.context` after
  `c.teacher.prefix`, as the self-teacher pass lays it out), by
  `credit.advantages.distill.verpo.evidence_nuisance` (λ = `c.teacher.fec_lambda`)."""
  from credit.advantages.distill.verpo import evidence_nuisance  # pylint: disable=g-import-not-at-top
  c, tok, task = s.c, s.data.tokenizer, s.data.task
  kind = c.teacher.context
  width = prompt_width(tok, (privileged_prompt(c, task, e, kind) for e in s.data.train),
                        f"a prompt with its teacher context {c.teacher.prefix!r}")
  lay = response_layout(s, width)

  @jax.jit
  def run(params, tokens, attn, seq, seq_attn, response_mask, start):
    model = train.merge_model(s.graphdef, params, s.rest)
    h0, unembed, m0 = scoring.model_hidden(model, tokens, attn)
    he, _, me = scoring.model_hidden(model, seq, seq_attn)
    h0, _ = scoring.next_token_hidden(h0, m0)
    he, _ = scoring.next_token_hidden(he, me)
    he = to_rollout(he, start, width, tokens.shape[1], 0.0)
    return evidence_nuisance(hidden_plain=h0, hidden_evidence=he, unembed=unembed,
                             tokens=tokens, mask=response_mask, fec_lambda=c.teacher.fec_lambda,
                             chunk_size=s.chunk_size)

  def produce(state, batch, ctx: StepContext) -> dict:
    prompts = [privileged_prompt(c, task, {k: ctx.examples[k][i] for k in ctx.examples}, kind)
               for i in range(len(ctx.examples["prompt"]))]
    start = response_starts(batch)
    seq, seq_attn = lay(prompts, batch, batch["attn_mask"], start=start)
    return {"evidence_nuisance": run(state.params, batch["tokens"], batch["attn_mask"], seq,
                                     seq_attn, batch["response_mask"],
                                     parallel.shard_batch(start, s.mesh))}

  return produce
