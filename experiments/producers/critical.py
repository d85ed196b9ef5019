"""Critical steps of failed responses, corrected and verified: CSO's DPO pairs and InT's
intervention SFT, built each step from the policy's own rollouts.

Both methods start from the policy's failed responses and change credit at one step — the
step where the response went wrong — instead of spreading an outcome over every token:

* CSO, "Verified Critical Step Optimization for LLM Agents" (Li et al., arXiv 2602.03412;
  code https://github.com/kiaia/CSO): a PRM flags candidate critical steps of failed
  trajectories, an expert proposes alternative steps there, the policy continues from each
  alternative to the end, and only alternatives whose continuation succeeds are kept, as
  DPO pairs (chosen = the alternative step, rejected = the original step, the shared prefix
  as context). Confidence: inferred from the paper's abstract and the repository's README
  (collect failed trajectories -> PRM-scored alternatives -> branch and verify -> verified
  DPO pairs); the training code was not read.
* InT, "InT: Self-Proposed Interventions Enable Credit Assignment in LLM Reasoning" (Yang et
  al., ICLR 2026, arXiv 2601.14209; code https://github.com/intervention-training/int): the
  model, given the reference solution, finds the first error of its own failed trace and
  writes a one-step intervention in its place; continuations conditioned on the
  intervention filter the interventions (the code's optional step 3: keep those that lead to
  a correct outcome); SFT on prompt -> (prefix before the error ⧺ intervention), not the
  suffix; then RL. Confidence: inferred from the abstract and the repository's README steps
  (sample incorrect rollouts, propose, filter by guided rollouts, SFT, RL).

Here, per RL step and per failed row of the batch (reward < `success`):

1. the critical step: the step (cut at `c.step_delimiters`) holding the first wrong token,
   from the task's `flag_chars` (the task's verifiable steps stand in for CSO's PRM and for
   InT's self-verification against the reference solution — a tiny model cannot verify);
2. `proposals` alternative steps sampled from the prompt ⊕ the response before that step,
   each cut at the next step delimiter, by the policy itself (`proposer="policy"`) or by a
   frozen expert model (`proposer="teacher"`: `c.teacher.init_from`, CSO's expert), either of
   them optionally under a privileged context (`context="answer"` puts the reference answer
   in front of the prompt, as `teacher.prefix` writes it: InT's reference solution); a
   proposal equal to the original step is no alternative;
3. each alternative continued by the policy in its plain context to the end of the response
   budget (`continuations` = 1 sample) and the whole response verified by the task;
4. an item per failed row whose step was found (at most `max_items`, drawn at random): its
   first alternative whose continuation succeeded (`require_success`; without it, its first
   distinct alternative) becomes
   - `objective="dpo"` (CSO): a pair of rows prompt ⊕ prefix ⊕ step, chosen = the
     alternative, rejected = the original step, loss only on the step tokens
     (`credit.losses.dpo_pair_logprobs` / `dpo_pair_loss`, β, the frozen initial policy as
     the DPO reference);
   - `objective="sft"` (InT): a row prompt ⊕ prefix ⊕ intervention with the loss on prefix ⊕
     intervention (`train_on="all"`, the code's SFT target) or on the intervention only
     (`credit.losses.intervention_sft_mask` / `intervention_sft_loss`).

The update adds the objective to every minibatch step of the policy update:
L = rl_weight·L_RL + weight·L_critical, the weights arriving as arrays so that a schedule does
not recompile. `until` = n > 0 runs the critical objective for the first n RL steps, then plain
RL (InT's SFT-then-RL in one run; rl_weight = 0 makes those first steps pure InT SFT); `until`
= 0 keeps it on (CSO's iterated DPO with rl_weight = 0; rl_weight = 1 adds it to the RL loss).

All arrays have static shapes: M rows per side (`max_items` rounded up to a multiple of the
mesh's batch-parallel size; pairs: 2·M rows), the rollout's width T; rows without an item are
masked. The pipeline runs on the host and the
jitted sampler, in the `critical` phase of the step-time table.
"""
from __future__ import annotations

import itertools


import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from credit import tasks as tasks_lib
from credit.losses import SFT_TARGETS, intervention_sft_mask
from credit.tasks.char_tokenizer import pad_rows, prompt_ids
from credit import parallel
from experiments import train
from experiments.producers.base import (producer, Setup, SetupError, StepContext, prompt_width,
                                        task_has, verify_rows, delimiter_ids, is_multi_turn,
                                        step_splitter)
from experiments.producers.rollouts import first_wrong_columns, tree_batch
from experiments.producers.signals import _task_flags_spans
from experiments.producers.teachers import check_context, check_teacher_files, privileged_prompt


FIELD = "critical_batch"  # the update input this module makes (not a contract field)
OBJECTIVES = ("dpo", "sft")
DATA = ("corrections", "successes")
PROPOSERS = ("policy", "teacher")
PAIRS, INTERVENTIONS = "critical_pairs", "critical_interventions"  # producer names


def critical_on(c: ml_collections.ConfigDict) -> bool:
  return bool(c.critical.enabled)


def check_config(c: ml_collections.ConfigDict) -> None:
  """SetupError for settings the pipeline cannot run with (before any file is written)."""
  err = SetupError
  k = c.critical
  if k.objective not in OBJECTIVES:
    raise err(f"critical.objective={k.objective!r}; valid: {list(OBJECTIVES)} (dpo: CSO's "
              "verified step pairs, sft: InT's interventions)")
  if k.data not in DATA:
    raise err(f"critical.data={k.data!r}; valid: {list(DATA)} (corrections: CSO / InT, "
              "successes: PROPA's SFT)")
  if is_multi_turn(c):
    raise err("critical: single-turn tasks only")
  if k.data == "successes":
    if k.objective != "sft":
      raise err("critical.data='successes' trains by SFT: set critical.objective='sft'")
    if int(k.max_paths) < 1:
      raise err(f"critical.max_paths={k.max_paths} must be >= 1")
    if k.gold_when_none and not task_has("demonstration")(c):
      raise err("critical.gold_when_none: the task has no demonstration to train on when no "
                "response of a prompt succeeds; set it False or use a built-in task")
  elif tree_batch(c):
    raise err("critical.data='corrections' reads rollouts of G samples per prompt (no "
              "tree.branches or slate.candidates)")
  if c.amft.enabled:
    raise err("critical and amft both add a second objective to the update; use one")
  if c.async_rollouts:
    raise err("critical: the synchronous runner only (its pipeline samples with the current "
              "policy inside the step)")
  _check_common(c, k, err)
  if k.data == "corrections":
    _check_corrections(c, k, err)


def _check_common(c, k, err) -> None:
  if not (k.beta > 0 and k.weight >= 0 and k.rl_weight >= 0 and k.until >= 0):
    raise err(f"critical: beta={k.beta} must be > 0 and weight={k.weight}, "
              f"rl_weight={k.rl_weight}, until={k.until} >= 0")
  if k.weight == 0 and k.rl_weight == 0:
    raise err("critical: weight = rl_weight = 0 trains nothing")
  if int(k.max_items) < 1:
    raise err(f"critical.max_items={k.max_items} must be >= 1")


def _check_corrections(c, k, err) -> None:
  if not _task_flags_spans(c):
    raise err("critical: the critical step is the step of the first wrong token, from the "
              "task's flag_chars; built in: arithmetic, chain, countdown")
  if not c.step_delimiters:
    raise err("critical: steps are cut at c.step_delimiters, which is empty")
  for name in ("proposals", "continuations"):
    if int(k[name]) < 1:
      raise err(f"critical.{name}={k[name]} must be >= 1")
  if k.continuations != 1:
    raise err("critical.continuations: one continuation per alternative is implemented")
  if k.train_on not in SFT_TARGETS:
    raise err(f"critical.train_on={k.train_on!r}; valid: {list(SFT_TARGETS)}")
  if k.proposer not in PROPOSERS:
    raise err(f"critical.proposer={k.proposer!r}; valid: {list(PROPOSERS)}")
  if k.proposer == "teacher":
    if not c.teacher.init_from:
      raise err("critical.proposer='teacher' samples the alternatives from a frozen expert: "
                "set teacher.init_from=<HF dir> (same tokenizer as the policy)")
    check_teacher_files(c)
  if k.context:
    check_context(c, k.context, "critical.context")


def weights(c: ml_collections.ConfigDict, step: int) -> tuple[float, float, bool]:
  """(rl_weight, critical weight, pipeline on) of the update after `step` completed steps."""
  k = c.critical
  if k.until and step >= k.until:
    return 1.0, 0.0, False
  return float(k.rl_weight), float(k.weight), True


def critical_steps(step_id_BT: np.ndarray, first_wrong_B: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
  """(start [B], end [B]) columns of the step holding each row's first wrong token
  (`first_wrong_B` a column, −1 for none: start = end = −1). A step is the run of columns
  with one `step_id` (−1 outside the response)."""
  B = step_id_BT.shape[0]
  start = np.full(B, -1, np.int64)
  end = np.full(B, -1, np.int64)
  for b in range(B):
    e = int(first_wrong_B[b])
    if e < 0 or step_id_BT[b, e] < 0:
      continue
    cols = np.flatnonzero(step_id_BT[b] == step_id_BT[b, e])
    start[b], end[b] = cols[0], cols[-1] + 1
  return start, end


def _pack(rows: list[list[int]], width: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
  """Right-padded [R, width] tokens and their validity mask."""
  return pad_rows(rows, width, pad_id=pad, pad_left=False)


def _new_tokens(out) -> list[list[int]]:
  """The sampled tokens of each output row."""
  toks, resp = parallel.to_host((out.tokens, out.response_mask))  # rows sharded on the mesh
  return [toks[r, resp[r]].tolist() for r in range(toks.shape[0])]


def _expert(s: "Setup"):
  """(sampler, model state) of the frozen expert of `c.teacher.init_from` (its own dtype,
  sharded on the run's mesh), CSO's proposer of alternative steps."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from credit import models  # pylint: disable=g-import-not-at-top
  from credit.sampling import Sampler  # pylint: disable=g-import-not-at-top
  tc, tok = s.c.teacher, s.data.tokenizer
  teacher, _ = models.from_pretrained(tc.init_from, mesh=s.mesh, param_dtype=tc.param_dtype,
                                      dtype=tc.compute_dtype)
  _, params, rest = train.split_model(teacher)
  sampler = Sampler(teacher, pad_id=tok.pad_id,
                    stop_tokens=getattr(tok, "stop_ids", None) or (tok.eos_id,))
  return sampler, nnx.merge_state(params, rest)


def _empty(rows: int, T: int, objective: str) -> dict:
  """The host arrays of a critical batch with no item (every row masked)."""
  a = {"tokens": np.zeros((rows, T), np.int32), "attn_mask": np.zeros((rows, T), bool)}
  if objective == "dpo":
    a.update(step_mask=np.zeros((rows, T), bool), logprob_ref=np.zeros((rows, T), np.float32))
  else:
    a["loss_mask"] = np.zeros((rows, T), bool)
  return a


def _finish(s: "Setup", arrays: dict, rl_w: float, w: float) -> dict:
  """{FIELD: the batch}, rows sharded over the mesh, the two weights replicated arrays."""
  out = dict(parallel.shard_batch(arrays, s.mesh))
  rep = parallel.replicated(s.mesh)
  out["rl_weight"] = jax.device_put(jnp.asarray(rl_w, jnp.float32), rep)
  out["weight"] = jax.device_put(jnp.asarray(w, jnp.float32), rep)
  return {FIELD: out}


def diverse_pair(responses: list[list[int]]) -> list[int]:
  """Indices of at most two of `responses`: all when there are two or fewer, else the first
  pair (in `itertools.combinations` order) with the shortest common prefix — PROPA's pick of
  the two correct leaves whose lowest common ancestor is closest to the root, with the tree's
  nodes read as tokens."""
  if len(responses) <= 2:
    return list(range(len(responses)))
  best, best_len = [0, 1], None
  for i, j in itertools.combinations(range(len(responses)), 2):
    a, b = responses[i], responses[j]
    n = next((t for t, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if best_len is None or n < best_len:
      best, best_len = [i, j], n
  return best


def _build_successes(s: "Setup"):
  """PROPA's interleaved SFT data (`data="successes"`): per prompt group, the responses that
  succeeded (at most `max_paths`, `diverse_pair` for 2), or the task's demonstration when
  none did (`gold_when_none`); SFT on each response after its prompt."""
  c, k, tok, task = s.c, s.c.critical, s.data.tokenizer, s.data.task
  N, per = s.num_groups, int(k.max_paths)
  div = parallel.batch_divisor(s.mesh)
  M = -(-(N * per) // div) * div

  def produce(state, batch, ctx: "StepContext") -> dict:
    rl_w, w, on = weights(c, int(state.step))
    host = batch["host"]
    tokens, resp = host["tokens"], host["response_mask"]
    T = tokens.shape[1]
    arrays = _empty(M, T, "sft")
    if not on:
      ctx.metrics.update(critical_on=0.0)
      return _finish(s, arrays, rl_w, w)
    reward = np.asarray(parallel.to_host(batch["reward"]), np.float32)
    valid = host["prompt_mask"] | resp
    rows, masks, gold = [], [], 0
    for g in range(N):
      ok = np.flatnonzero((host["group_id"] == g) & (reward >= k.success))
      if len(ok):
        picks = ok[diverse_pair([tokens[b, resp[b]].tolist() for b in ok])][:per]
        for b in picks:
          rows.append(tokens[b, valid[b]].tolist())
          masks.append(int(host["prompt_mask"][b].sum()))
      elif k.gold_when_none:
        ex = tasks_lib.as_example({kk: ctx.examples[kk][g] for kk in ctx.examples})
        p = prompt_ids(tok, ex["prompt"])
        demo = list(tok.encode(task.demonstration(ex))) + [tok.eos_id]
        rows.append((p + demo)[:T])
        masks.append(len(p))
        gold += 1
    ctx.metrics.update(critical_on=1.0, critical_items=float(len(rows)),
                       critical_gold=float(gold))
    if rows:
      toks, attn = _pack(rows, T, tok.pad_id)
      plen = np.asarray(masks)
      n = len(rows)
      arrays["tokens"][:n], arrays["attn_mask"][:n] = toks, attn
      arrays["loss_mask"][:n] = attn & (np.arange(T)[None] >= plen[:, None])
    return _finish(s, arrays, rl_w, w)

  return produce


class _Corrections:
  """CSO's pairs / InT's interventions (`data="corrections"`) of one run: the build-time
  constants, and the pipeline's stages as methods (`build` returns the bound `produce`)."""

  def __init__(self, s: Setup):
    c, k, tok, task = s.c, s.c.critical, s.data.tokenizer, s.data.task
    self.s, self.c, self.k, self.tok, self.task = s, c, k, tok, task
    self.K, self.cap = int(k.proposals), int(k.max_items)
    self.split = step_splitter(s)
    self.stop_ids = tuple(getattr(tok, "stop_ids", None) or (tok.eos_id,))
    self.delims = tuple(sorted(set(delimiter_ids(tok, c.step_delimiters)) | set(self.stop_ids)))
    div = parallel.batch_divisor(s.mesh)
    self.M = -(-self.cap // div) * div  # rows per side, padded so the batch shards over the mesh
    self.rows_out = 2 * self.M if k.objective == "dpo" else self.M
    self.ref_score = s.scorer(entropy=False, tempered=False) if k.objective == "dpo" else None
    self.expert = _expert(s) if k.proposer == "teacher" else None
    self.priv_width = 0
    if k.context:
      self.priv_width = prompt_width(
          tok, (privileged_prompt(c, task, e, k.context) for e in s.data.train),
          f"a prompt with critical.context={k.context!r}")
    self.rng_seed = int(c.seed) + 101

  def empty(self, T: int) -> dict:
    return _empty(self.rows_out, T, self.k.objective)

  def finish(self, arrays: dict, rl_w: float, w: float) -> dict:
    return _finish(self.s, arrays, rl_w, w)

  def produce(self, state, batch, ctx: "StepContext") -> dict:
    """produce(state, batch, ctx) -> {FIELD: the update's critical batch}."""
    c, k, tok, task = self.c, self.k, self.tok, self.task
    step = int(state.step)
    rl_w, w, on = weights(c, step)
    host = batch["host"]
    tokens, resp = host["tokens"], host["response_mask"]
    B, T = tokens.shape
    if not on:
      ctx.metrics.update(critical_on=0.0)
      return self.finish(self.empty(T), rl_w, w)
    reward = np.asarray(parallel.to_host(batch["reward"]), np.float32)
    example_of_row = host["group_id"]
    valid = host["prompt_mask"] | resp
    failed = np.flatnonzero(reward < k.success)
    wrong = first_wrong_columns(tok, task, ctx.examples, tokens, resp, example_of_row, failed)
    start, end = critical_steps(self.split(tokens, resp), wrong)
    located = np.flatnonzero(start >= 0)
    rng = np.random.default_rng([self.rng_seed, step])
    items = (rng.choice(located, size=self.cap, replace=False) if len(located) > self.cap
             else located)
    n = len(items)
    metrics = {"critical_on": 1.0, "critical_failed": float(len(failed)),
               "critical_located": float(len(located)), "critical_items": 0.0,
               "critical_distinct": 0.0, "critical_verified": 0.0}
    if n == 0:
      ctx.metrics.update(metrics)
      return self.finish(self.empty(T), rl_w, w)
    # Context of each item: the row's valid prompt tokens, then its response before the step.
    ctx_ids = [tokens[b, valid[b] & (np.arange(T) < start[b])].tolist() for b in items]
    orig = [tokens[b, start[b]:end[b]].tolist() for b in items]
    plen = [int(host["prompt_mask"][b].sum()) for b in items]
    budget = [max(p + c.max_new_tokens - len(x), 0) for p, x in zip(plen, ctx_ids)]
    model_state = self.s.model_state(state.params)
    alts = self.propose(model_state, ctx, items, example_of_row, ctx_ids, plen, budget, T)
    ok = self.verified(model_state, ctx, items, example_of_row, ctx_ids, plen, budget, alts, T)
    K, rows_of = self.K, np.repeat(np.arange(n), self.K)
    distinct = np.array([alts[r] != orig[rows_of[r]] and len(alts[r]) > 0
                         for r in range(n * K)])
    keep = distinct & ok if k.require_success else distinct
    picked = []  # (item, alternative)
    for i in range(n):
      js = np.flatnonzero(keep[i * K:(i + 1) * K])
      if len(js):
        picked.append((i, alts[i * K + js[0]]))
    metrics.update(critical_items=float(len(picked)), critical_distinct=float(distinct.mean()),
                   critical_verified=float(ok[distinct].mean()) if distinct.any() else 0.0)
    ctx.metrics.update(metrics)
    arrays = self.empty(T)
    if not picked:
      return self.finish(arrays, rl_w, w)
    if k.objective == "sft":
      self.interventions(arrays, picked, ctx_ids, plen, T)
    else:
      self.pairs(arrays, picked, ctx_ids, orig, T, ctx)
    return self.finish(arrays, rl_w, w)

  def propose(self, model_state, ctx: "StepContext", items, example_of_row, ctx_ids, plen,
              budget, T: int) -> list[list[int]]:
    """2. Proposals: K alternative steps per item (n·K rows, item-major), cut at the next
    delimiter."""
    s, c, k, tok, task, M = self.s, self.c, self.k, self.tok, self.task, self.M
    fill = lambda lst, pad: lst + [pad] * (M - len(lst))  # static shapes: M items
    if k.context:
      prop_ctx = []
      for b, x, p in zip(items, ctx_ids, plen):
        ex = {kk: ctx.examples[kk][example_of_row[b]] for kk in ctx.examples}
        prop_ctx.append(prompt_ids(tok, privileged_prompt(c, task, ex, k.context))
                        + x[p:])
      width = self.priv_width + c.max_new_tokens
    else:
      prop_ctx, width = ctx_ids, T
    ptoks, pmask = _pack(fill(prop_ctx, prop_ctx[0]), width, tok.pad_id)
    pbudget = np.asarray(fill(budget, 0), np.int32)
    sampler, proposer_state = (s.sampler, model_state) if self.expert is None else self.expert
    out = sampler(proposer_state, prompt_tokens=ptoks, prompt_mask=pmask,
                  key=jax.random.fold_in(ctx.key, 71), max_new_tokens=c.max_new_tokens,
                  num_samples=self.K, temperature=k.temperature, top_k=c.top_k, top_p=c.top_p,
                  stop_tokens=self.delims, max_new_tokens_per_row=pbudget, share_prefix=True)
    return _new_tokens(out)[:len(items) * self.K]

  def verified(self, model_state, ctx: "StepContext", items, example_of_row, ctx_ids, plen,
               budget, alts, T: int) -> np.ndarray:
    """3. Each alternative continued by the policy in its plain context, then verified:
    bool [n·K], the whole response succeeded."""
    s, c, k, tok, K = self.s, self.c, self.k, self.tok, self.K
    n = len(items)
    seqs, cbudget = [], []
    for i in range(n):
      for j in range(K):
        a = alts[i * K + j]
        seqs.append(ctx_ids[i] + a)
        done = bool(a) and a[-1] in self.stop_ids
        cbudget.append(0 if done else max(budget[i] - len(a), 0))
    R = self.M * K
    ctoks, cmask = _pack(seqs + [seqs[0]] * (R - len(seqs)), T, tok.pad_id)
    cb = np.asarray(cbudget + [0] * (R - len(cbudget)), np.int32)
    cont = s.sampler(model_state, prompt_tokens=ctoks, prompt_mask=cmask,
                     key=jax.random.fold_in(ctx.key, 72), max_new_tokens=c.max_new_tokens,
                     num_samples=1, temperature=c.temperature, top_k=c.top_k, top_p=c.top_p,
                     max_new_tokens_per_row=cb)
    tails = _new_tokens(cont)[:n * K]
    full = [seqs[r] + tails[r] for r in range(n * K)]
    rows_of = np.repeat(np.arange(n), K)
    ftoks, fvalid = _pack(full, T + c.max_new_tokens, tok.pad_id)
    fresp = fvalid & (np.arange(ftoks.shape[1])[None] >= np.asarray(plen)[rows_of][:, None])
    _, ok = verify_rows(s, ctx.examples, ftoks, fresp, example_of_row[items][rows_of])
    return np.asarray(ok) >= k.success

  def interventions(self, arrays: dict, picked, ctx_ids, plen, T: int) -> None:
    """InT's SFT rows prompt ⊕ prefix ⊕ intervention, written into `arrays`."""
    P = len(picked)
    rows = [ctx_ids[i] + a for i, a in picked]
    toks, attn = _pack(rows, T, self.tok.pad_id)
    plens = np.asarray([plen[i] for i, _ in picked])
    resp_cols = attn & (np.arange(T)[None] >= plens[:, None])
    mask = np.asarray(intervention_sft_mask(
        np.asarray([len(ctx_ids[i]) for i, _ in picked], np.int32),
        np.asarray([len(a) for _, a in picked], np.int32), T, train_on=self.k.train_on,
        response_mask=resp_cols))
    arrays["tokens"][:P], arrays["attn_mask"][:P], arrays["loss_mask"][:P] = toks, attn, mask

  def pairs(self, arrays: dict, picked, ctx_ids, orig, T: int, ctx: "StepContext") -> None:
    """CSO's DPO pairs (chosen rows 0..P, rejected rows M..M+P) and their frozen-reference
    step log-probs, written into `arrays`."""
    s, M, P = self.s, self.M, len(picked)
    chosen = [ctx_ids[i] + a for i, a in picked]
    rejected = [ctx_ids[i] + orig[i] for i, _ in picked]
    for off, rows in ((0, chosen), (M, rejected)):
      toks, attn = _pack(rows, T, self.tok.pad_id)
      lens = np.asarray([len(ctx_ids[i]) for i, _ in picked])
      arrays["tokens"][off:off + P], arrays["attn_mask"][off:off + P] = toks, attn
      arrays["step_mask"][off:off + P] = attn & (np.arange(T)[None] >= lens[:, None])
    sharded = parallel.shard_batch((arrays["tokens"], arrays["attn_mask"]), s.mesh)
    logprob_ref, _ = self.ref_score(ctx.ref_params, *sharded)
    arrays["logprob_ref"] = np.where(arrays["step_mask"],
                                     np.asarray(parallel.to_host(logprob_ref)), 0.0
                                     ).astype(np.float32)


@producer(INTERVENTIONS, trees=True,  # data="successes" only on trees (check_config)
          provides=(FIELD,),
          requires=("tokens", "response_mask", "reward"),
          phase="critical",
          doc="InT's interventions: per failed row, the step of its first wrong token "
              "replaced by a proposed step (optionally under a privileged context) whose "
              "continuation succeeds; SFT rows prompt -> prefix + intervention (or, with "
              "data=successes, PROPA's SFT rows: up to 2 successful responses per "
              "prompt, the demonstration when none succeeded)",
          when=lambda c: critical_on(c) and c.critical.objective != "dpo",
          check=check_config,
          off_doc="set enabled=True (objective sft)")
@producer(PAIRS,
          provides=(FIELD,),
          requires=("tokens", "response_mask", "reward"),
          phase="critical",
          doc="CSO's verified critical-step pairs: per failed row, the step of its first wrong "
              "token, c.proposals alternative steps from the prefix, each continued "
              "by the policy and verified; a successful alternative (chosen) against the "
              "original step (rejected), scored by the frozen reference for step-level DPO",
          when=lambda c: critical_on(c) and c.critical.objective == "dpo",
          keeps_reference=True,
          check=check_config,
          off_doc="set enabled=True (objective dpo)")
def build(s: Setup, wanted: frozenset):
  """The producer: produce(state, batch, ctx) -> {FIELD: the update's critical batch}."""
  if s.c.critical.data == "successes":
    return _build_successes(s)
  return _Corrections(s).produce
