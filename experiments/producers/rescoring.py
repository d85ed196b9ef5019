"""Re-scoring passes: the response tokens scored again after another prompt (contrastive
contexts, hindsight contexts, the task's answer-preserving rewrites), and the layout helpers
that move a response between the rollout's columns and another prompt's."""
from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from credit import parallel
from credit import tasks as tasks_lib
from experiments.producers.base import (Produce, Setup, SetupError, StepContext, examples_rows,
                                        prompt_width, task_has, from_rollout, response_starts,
                                        to_rollout, producer)


def response_layout(s: Setup, width: int) -> Callable:
  """lay(prompts [N] str, batch, attn, start) -> (tokens [B,S], attn_mask [B,S]),
  S = width + T − P: the sampled responses after other prompts (one per group; G rows each).

  The prompts are encoded as the loop encodes its own (`tasks_lib.encode_prompts`: bos,
  left padding) to the run's fixed `width` (a longer prompt raises ValueError); each row's
  response follows from its rollout column `start` (`response_starts`), so column `width + j`
  of a row is the rollout's column start_b + j (`to_rollout` maps back).
  """
  tok, G, P = s.data.tokenizer, s.group_size, s.data.max_prompt_len

  @jax.jit
  def join(prompt_tokens, prompt_mask, tokens, response_mask, start):
    return (jnp.concatenate([prompt_tokens, from_rollout(tokens, start, P)], axis=1),
            jnp.concatenate([prompt_mask, from_rollout(response_mask, start, P)], axis=1))

  def lay(prompts: list[str], batch: Mapping[str, Any], attn: Any = None, *, start):
    """`attn`: the rollout's attention mask (`StepContext.attn_mask`), so observation
    tokens of multi-turn rows stay visible; default: the response tokens only. `start`:
    [B] `response_starts` of the rollout."""
    toks, mask = tasks_lib.encode_prompts(tok, prompts, width)
    toks, mask = np.repeat(toks, G, axis=0), np.repeat(mask, G, axis=0)
    return join(*parallel.shard_batch((toks, mask), s.mesh), batch["tokens"],
                batch["response_mask"] if attn is None else attn,
                parallel.shard_batch(np.asarray(start, np.int32), s.mesh))

  return lay


def _response_rescorer(s: Setup, width: int) -> Callable:
  """rescore(params, prompts [N] str, batch, start) -> [B,T] log-probs of the sampled
  response tokens after other prompts (`response_layout`), 0 outside `response_mask`."""
  score = s.scorer(entropy=False)
  lay = response_layout(s, width)

  @jax.jit
  def rescore(params, seq, attn, response_mask, start):
    logprob, _ = score(params, seq, attn)
    return jnp.where(response_mask, to_rollout(logprob, start, width, response_mask.shape[1],
                                               0.0), 0.0)

  def run(params, prompts: list[str], batch: Mapping[str, Any], start):
    return rescore(params, *lay(prompts, batch, start=start), batch["response_mask"],
                   parallel.shard_batch(np.asarray(start, np.int32), s.mesh))

  return run


ALT_CONTEXTS = {"logprob_alt_pos": "alt_context_pos", "logprob_alt_neg": "alt_context_neg",
                "logprob_alt": "alt_context"}


def _alt_sample(prefix: str, mistake_len: int = 1) -> str:
  """An alt_context template with its fields filled by placeholder digits."""
  return prefix.replace("{answer}", "0").replace("{mistake}", "0" * mistake_len)


def _alt_contexts_encodable(c: ml_collections.ConfigDict) -> bool:
  """The alt_context prefixes are strings the run's tokenizer can encode: checked here, before
  any file is written, for the character tokenizer of from-scratch runs; a checkpoint's
  tokenizer (`init_from`) is checked when the producer is built."""
  prefixes = [c.get(key) for key in ALT_CONTEXTS.values()]
  if not all(isinstance(p, str) for p in prefixes):
    return False
  if c.get("init_from"):
    return True
  try:
    for p in prefixes:
      tasks_lib.CharTokenizer().encode(_alt_sample(p))
  except ValueError:
    return False
  return True


def _group_mistakes(texts: list[str], reward: np.ndarray, G: int, threshold: float,
                    max_chars: int) -> list[str]:
  """Per group: the first response with reward < threshold, cut to `max_chars` ("" when the
  group has none)."""
  out = []
  for n in range(len(texts) // G):
    wrong = [texts[n * G + j] for j in range(G) if reward[n * G + j] < threshold]
    out.append(wrong[0].strip()[:max_chars] if wrong else "")
  return out


def _encodable(tok, text: str) -> str:
  """`text` without the characters the run's tokenizer cannot encode: a multi-turn response
  holds the rollout's turn and observation markup (e.g. `>` and `|`), which a character
  tokenizer's alphabet may lack, and a mistake quoted in a prompt must still encode."""
  try:
    tok.encode(text)
    return text
  except ValueError:
    pass

  def ok(ch: str) -> bool:
    try:
      tok.encode(ch)
      return True
    except ValueError:
      return False

  return "".join(ch for ch in text if ok(ch))


@producer("alt_context_pass",
          provides=("logprob_alt_pos", "logprob_alt_neg", "logprob_alt"),
          requires=("tokens", "response_mask", "reward"),
          phase="rescoring",
          doc="the policy re-scores the response tokens after the prompt prefixed with "
              "c.alt_context_pos / c.alt_context_neg (contrastive contexts: CSCR, T-REG; with "
              "{answer} and a group {mistake} filled in, SIPO's self-teacher contexts), or "
              "c.alt_context (another context: OPID / SEED's hindsight skill)",
          when=_alt_contexts_encodable,
          off_doc="alt_context_pos / alt_context_neg / alt_context must be strings the run's "
                  "tokenizer "
                  "can encode; the character tokenizer has only "
                  f"{tasks_lib.CharTokenizer().chars!r}")
def _build_alt_context_pass(s: Setup, wanted: frozenset) -> Produce:
  """logprob_alt_pos / logprob_alt_neg: the response re-scored after c.alt_context_pos /
  c.alt_context_neg ⊕ prompt. A template may hold {answer} (the example's gold answer: a
  privileged self-teacher context, SIPO) and {mistake} (the first response of the group
  with reward below 1, cut to max_new_tokens characters; "" when the group has none)."""
  tok, G, c = s.data.tokenizer, s.group_size, s.c
  prefixes = {}
  for field in sorted(wanted):
    key = ALT_CONTEXTS[field]
    prefix = c[key]
    if not isinstance(prefix, str):
      raise SetupError(f"{key}={prefix!r} must be a string (a prefix of the prompt)")
    try:
      tok.encode(_alt_sample(prefix))
    except ValueError as e:
      raise SetupError(f"{key}={prefix!r} cannot be encoded by the run's tokenizer ({e})"
                       ) from None
    prefixes[field] = prefix
  mistake_len = c.max_new_tokens

  def fill(prefix: str, example: Mapping[str, Any], mistake: str) -> str:
    return (prefix.replace("{answer}", str(example.get("answer", "")))
            .replace("{mistake}", mistake) + example["prompt"])

  # The width of the modified prompts is fixed for the run: the longest over the train split
  # (a mistake counted at its longest).
  width = prompt_width(tok, (fill(p, tasks_lib.as_example(e), "0" * mistake_len)
                              for p in prefixes.values() for e in s.data.train),
                        "a prompt with its alt_context prefix")
  rescore = _response_rescorer(s, width)
  uses_mistake = any("{mistake}" in p for p in prefixes.values())

  def produce(state, batch, ctx: StepContext) -> dict:
    examples = examples_rows(ctx.examples)
    mistakes = [""] * len(examples)
    if uses_mistake:
      texts = batch.get("texts") or tasks_lib.decode_responses(
          tok, batch["host"]["tokens"], batch["host"]["response_mask"])
      reward = parallel.to_host(batch["reward"])
      mistakes = [_encodable(tok, m)
                  for m in _group_mistakes(texts, reward, G, 1.0, mistake_len)]
    start = response_starts(batch)
    return {f: rescore(state.params, [fill(p, e, m) for e, m in zip(examples, mistakes)],
                       batch, start)
            for f, p in prefixes.items()}

  return produce


@producer("interventions_pass",
          provides=("logprob_interventions",),
          requires=("tokens", "response_mask"),
          phase="rescoring",
          doc="the policy re-scores the response tokens after each of the task's M "
              "answer-preserving prompt rewrites (`interventions`; SCAPO)",
          when=task_has("interventions"),
          off_doc="needs a built-in task with interventions, e.g. arithmetic")
def _build_interventions_pass(s: Setup, wanted: frozenset) -> Produce:
  tok, task = s.data.tokenizer, s.data.task

  def interventions(example) -> list[str]:
    return task.interventions(tasks_lib.as_example(example))

  train_prompts = [interventions(e) for e in s.data.train]
  M = len(train_prompts[0])
  if M < 1 or any(len(ps) != M for ps in train_prompts):
    raise SetupError(f"task {task.name!r}: `interventions` must give the same number M >= 1 "
                     f"of prompts for every example, got {sorted({len(p) for p in train_prompts})}")
  width = prompt_width(tok, (p for ps in train_prompts for p in ps),
                        f"an intervention prompt of task {task.name!r}")
  rescore = _response_rescorer(s, width)

  def produce(state, batch, ctx: StepContext) -> dict:
    n = len(ctx.examples["prompt"])
    rows = [interventions({k: ctx.examples[k][i] for k in ctx.examples}) for i in range(n)]
    if any(len(r) != M for r in rows):
      raise ValueError(f"task {task.name!r} gave {sorted({len(r) for r in rows})} "
                       f"interventions; the run's M is {M}")
    start = response_starts(batch)
    return {"logprob_interventions": jnp.stack(
        [rescore(state.params, [r[m] for r in rows], batch, start) for m in range(M)],
        axis=-1)}

  return produce
