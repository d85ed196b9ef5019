"""Likelihood passes: the policy (or the frozen reference) teacher-forces a known text after
the rollout: the gold answer after every turn boundary (IGPO, TRACE), the gold answer after
the response and after the prompt alone (VeriFree, JEPO, RLPR's prior), follow-up texts
(FLR)."""
from __future__ import annotations


import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

import credit
from credit import parallel
from credit import tasks as tasks_lib
from experiments.producers.base import (Produce, Setup, SetupError, StepContext, examples_rows,
                                        is_multi_turn, producer)


def gold_prefix_masks(valid_BT: np.ndarray, prompt_BT: np.ndarray, turn_id_BT: np.ndarray,
                      num_turns: int) -> np.ndarray:
  """[B,K+1,T] bool: the tokens a turn-boundary score conditions on. Entry 0 is the prompt;
  entry k+1 is everything before the first policy token of turn k+1 (turn k's actions and
  observation included), the whole trajectory when there is no turn k+1."""
  B, T = valid_BT.shape
  cols = np.arange(T)
  out = np.zeros((B, num_turns + 1, T), bool)
  out[:, 0] = prompt_BT
  for k in range(num_turns):
    nxt = turn_id_BT == k + 1
    start = np.where(nxt.any(1), np.argmax(nxt, axis=1), T)
    out[:, k + 1] = valid_BT & (cols[None, :] < start[:, None])
  return out


def _gold_template_ids(tok, template: str, answer: str) -> tuple[list[int], list[bool]]:
  """Token ids of `template` with {answer} filled in, and which of them are the answer's."""
  pre, _, post = template.partition("{answer}")
  parts = [(tok.encode(pre) if pre else [], False), (tok.encode(answer), True),
           (tok.encode(post) if post else [], False)]
  ids = [i for p, _ in parts for i in p]
  scored = [flag for p, flag in parts for _ in p]
  return ids, scored


def _check_gold_config(c: ml_collections.ConfigDict) -> None:
  if "{answer}" not in c.gold_template:
    raise SetupError(f"gold_template={c.gold_template!r} must contain {{answer}}")
  if c.gold_scorer not in ("auto", "policy", "reference"):
    raise SetupError(f"gold_scorer={c.gold_scorer!r}; valid: auto | policy | reference")


# gold_scorer = "auto": the estimators whose papers score the gold answer with the frozen
# initial model (TRACE); the others (IGPO, A2TGPO, SIOP...) with the behaviour policy.
GOLD_REFERENCE_ESTIMATORS = frozenset({"trace"})


def gold_scorer(c: ml_collections.ConfigDict) -> str:
  """Who scores the gold answer (`c.gold_scorer`, "auto" resolved): policy | reference."""
  if c.gold_scorer != "auto":
    return c.gold_scorer
  return "reference" if c.estimator in GOLD_REFERENCE_ESTIMATORS else "policy"


@producer("gold_pass_ref",
          provides=("gold_logprob_turns", "gold_logprob_prompt"),
          requires=("tokens", "response_mask", "obs_mask", "turn_id"),
          phase="likelihood",
          doc="the same, scored by the frozen reference (TRACE)",
          when=lambda c: gold_scorer(c) == "reference",
          check=_check_gold_config,
          keeps_reference=True,
          off_doc="gold_scorer='reference'")
@producer("gold_pass",
          provides=("gold_logprob_turns", "gold_logprob_prompt"),
          requires=("tokens", "response_mask", "obs_mask", "turn_id"),
          phase="likelihood",
          doc="the policy teacher-forces the gold answer (c.gold_template) after "
"the prompt and after every turn boundary (IGPO's information gain)",
          when=lambda c: gold_scorer(c) != "reference",
          check=_check_gold_config,
          off_doc="gold_scorer='reference' uses gold_pass_ref")
def _build_gold_pass(s: Setup, wanted: frozenset) -> Produce:
  """gold_logprob_prompt [B] and gold_logprob_turns [B,K]: the mean log-prob of the gold
  answer's tokens, teacher-forced in `c.gold_template` after the prompt alone and after each
  turn boundary (`gold_prefix_masks`), by the behaviour policy or the frozen reference
  (`c.gold_scorer`). All K+1 prefixes of all rows go through one batched pass."""
  c, tok, G = s.c, s.data.tokenizer, s.group_size
  # K as the run's other per-turn arrays: single-turn turns are its steps (`turns_are_steps`).
  K = c.max_turns if is_multi_turn(c) else c.max_steps
  rows = [_gold_template_ids(tok, c.gold_template, tasks_lib.as_example(e)["answer"])
          for e in s.data.train]
  A = max(len(r[0]) for r in rows)
  score = s.scorer(entropy=False, tempered=False)
  use_ref = gold_scorer(c) == "reference"

  @jax.jit
  def mean_logprob(params, tokens, attn_mask, pos, scored):
    logprob, _ = score(params, tokens, attn_mask)
    lp = jnp.where(scored, jnp.take_along_axis(logprob, pos, axis=1), 0.0)
    return jnp.sum(lp, axis=1) / jnp.maximum(jnp.sum(scored, axis=1), 1)

  def produce(state, batch, ctx: StepContext) -> dict:
    host = batch["host"]
    tokens = host["tokens"]
    B, T = tokens.shape
    per = [_gold_template_ids(tok, c.gold_template, a["answer"])
           for a in examples_rows({"answer": ctx.examples["answer"]})]
    if max(len(p[0]) for p in per) > A:
      raise ValueError(f"a gold answer template of {max(len(p[0]) for p in per)} tokens is "
                       f"longer than the run's width A={A} (the longest of the train split)")
    ans_NA, amask_NA = tasks_lib.pad_rows([p[0] for p in per], A, pad_id=tok.pad_id,
                                          pad_left=False)
    sc_NA = np.zeros_like(amask_NA)
    for n, p in enumerate(per):
      sc_NA[n, :len(p[1])] = p[1]
    rep = lambda x: np.repeat(np.repeat(x, G, axis=0), K + 1, axis=0)
    valid = host["prompt_mask"] | host["response_mask"] | host["obs_mask"]
    keep = gold_prefix_masks(valid, host["prompt_mask"], host["turn_id"], K)
    seq, attn, pos = append_answer(np.repeat(tokens, K + 1, axis=0), keep.reshape(-1, T),
                                   rep(ans_NA), rep(amask_NA), tok.pad_id)
    params = ctx.ref_params if use_ref else state.params
    g = mean_logprob(params, *parallel.shard_batch((seq, attn, pos, rep(sc_NA)), s.mesh))
    g = parallel.to_host(g).reshape(B, K + 1)
    return parallel.shard_batch({"gold_logprob_prompt": g[:, 0].astype(np.float32),
                                 "gold_logprob_turns": g[:, 1:].astype(np.float32)}, s.mesh)

  return produce


def answer_ids(tokenizer, answer: str) -> list[int]:
  """A gold answer's token ids as the likelihood rewards teacher-force it: text + eos."""
  return list(tokenizer.encode(answer)) + [tokenizer.eos_id]


def append_answer(tokens_BS: np.ndarray, keep_BS: np.ndarray, answer_BA: np.ndarray,
                  answer_mask_BA: np.ndarray, pad_id: int) -> tuple[np.ndarray, ...]:
  """Host layout of `prefix ⊕ answer` rows for teacher-forced answer scoring.

  The kept tokens of each row stay in place (pad elsewhere); the answer follows the last
  kept column. Returns (tokens [B,S+A] int32, attn_mask [B,S+A] bool, positions [B,A] int32
  of the answer tokens; padded answer entries point past the answer, at pad).
  """
  B, S = tokens_BS.shape
  A = answer_BA.shape[1]
  cols_S = np.arange(S)
  start_B = np.where(keep_BS.any(1), np.max(np.where(keep_BS, cols_S + 1, 0), axis=1), 0)
  pos_BA = (start_B[:, None] + np.arange(A)[None, :]).astype(np.int32)
  seq = np.full((B, S + A), pad_id, np.int32)
  seq[:, :S] = np.where(keep_BS, tokens_BS, pad_id)
  attn = np.zeros((B, S + A), bool)
  attn[:, :S] = keep_BS
  np.put_along_axis(seq, pos_BA, np.where(answer_mask_BA, answer_BA, pad_id), axis=1)
  np.put_along_axis(attn, pos_BA, answer_mask_BA, axis=1)
  return seq, attn, pos_BA


# The forced sequence itself (`answer_tokens` ...), which an update needs to score the answer.
ANSWER_SEQUENCE = frozenset(credit.registry.TRAINED_SCORES["logprob_answer"])


# answer_prior_scorer = "auto": the estimators whose code scores the prior with the initial
# model (RLPR: once, before training); the others with the behaviour policy.
ANSWER_PRIOR_REFERENCE_ESTIMATORS = frozenset({"rlpr"})


def answer_prior_scorer(c: ml_collections.ConfigDict) -> str:
  """Who scores `logprob_answer_prior` (`c.answer_prior_scorer`, "auto" resolved)."""
  v = c.get("answer_prior_scorer", "auto")
  if v != "auto":
    return v
  return "reference" if c.estimator in ANSWER_PRIOR_REFERENCE_ESTIMATORS else "policy"


def _check_answer_prior(c: ml_collections.ConfigDict) -> None:
  v = c.get("answer_prior_scorer", "auto")
  if v not in ("auto", "policy", "reference"):
    raise SetupError(f"answer_prior_scorer={v!r}; valid: auto | policy | reference")


@producer("answer_prior_ref",
          provides=("logprob_answer_prior",),
          requires=("tokens", "response_mask"),
          phase="likelihood",
          doc="the frozen initial policy teacher-forces the gold answer (+ eos) after the "
              "prompt alone (RLPR's prior, computed once before training in its code)",
          when=lambda c: answer_prior_scorer(c) == "reference",
          check=_check_answer_prior,
          keeps_reference=True,
          off_doc="answer_prior_scorer='reference'")
def _build_answer_prior_ref(s: Setup, wanted: frozenset) -> Produce:
  """logprob_answer_prior [B,A] scored by the frozen reference (`_build_answer_pass`)."""
  return _build_answer_pass(s, wanted, prior_from_reference=True)


@producer("answer_pass",
          provides=("logprob_answer", "answer_mask", "logprob_answer_prior",
                    "answer_tokens", "answer_attn_mask", "answer_positions"),
          requires=("tokens", "response_mask"),
          phase="likelihood",
          doc="the policy teacher-forces the gold answer (+ eos) after prompt ⊕ response "
              "(its stop token dropped), and after the prompt alone for the prior; the "
              "forced sequence too, for a loss that scores the answer in the update",
          check=_check_answer_prior)
def _build_answer_pass(s: Setup, wanted: frozenset, prior_from_reference: bool = False
                       ) -> Produce:
  """logprob_answer [B,A]: the gold answer's tokens (text + eos) teacher-forced after the
  prompt and the response; logprob_answer_prior [B,A]: the same after the prompt alone, by
  the policy or (`prior_from_reference`, the `answer_prior_ref` producer) by the frozen
  initial policy.

  Without a task `answer_marker` the answer follows the whole response with its final stop
  token dropped (`_response_body`), and the prior follows the prompt. With one (`chain`:
  "46,41=41", marker "="), the response is reasoning ⊕ marker ⊕ the model's own answer:
  the gold answer follows the response cut right after its first marker (the reasoning and
  the marker; what the model wrote after it is dropped), a response without the marker
  keeps all of its body and the marker is inserted (context, not scored) before the
  answer, and the prior follows prompt ⊕ marker (the response with empty reasoning). The
  marker is found as its token ids (`tokenizer.encode(marker)`) in the response; a
  tokenizer that merges it with its neighbours does not find it there (the marker is then
  inserted). `answer_mask` is the same either way: the answer's tokens and eos.

  answer_tokens / answer_attn_mask [B,P+T+A] and answer_positions [B,A]: the sequence
  `logprob_answer` is read from, for a loss that scores the answer again in the update
  (VeriFree's and JEPO's `trained_loss`).
  """
  tok, G = s.data.tokenizer, s.group_size
  # A, the answer width, is fixed for the run: the longest gold answer of the train split.
  A = max(len(answer_ids(tok, tasks_lib.as_example(e)["answer"])) for e in s.data.train)
  P = s.data.max_prompt_len
  marker = getattr(s.data.task, "answer_marker", None) or ""
  marker_ids = np.asarray(tok.encode(marker) if marker else [], np.int32)
  score = s.scorer(entropy=False, tempered=False)

  @jax.jit
  def answer_logprobs(params, tokens, attn_mask, pos, answer_mask):
    logprob, _ = score(params, tokens, attn_mask)
    return jnp.where(answer_mask, jnp.take_along_axis(logprob, pos, axis=1), 0.0)

  def forced(tokens, keep, ans_BA, amask_BA, insert_B):
    """append_answer with the marker inserted before the answer on rows `insert_B`; the
    positions returned are the answer's (the marker is context)."""
    if not len(marker_ids):
      return append_answer(tokens, keep, ans_BA, amask_BA, tok.pad_id)
    ans_BW, amask_BW, off_B = _marked_answer(ans_BA, amask_BA, marker_ids, insert_B,
                                             tok.pad_id)
    seq, attn, pos_BW = append_answer(tokens, keep, ans_BW, amask_BW, tok.pad_id)
    pos = np.take_along_axis(pos_BW, off_B[:, None] + np.arange(A)[None, :], axis=1)
    return seq, attn, pos

  def produce(state, batch, ctx: StepContext) -> dict:
    host = batch["host"]
    tokens, resp, prompt = host["tokens"], host["response_mask"], host["prompt_mask"]
    rows = [answer_ids(tok, tasks_lib.as_example({"a": a})["a"])
            for a in ctx.examples["answer"]]
    if max(map(len, rows)) > A:
      raise ValueError(f"a gold answer of {max(map(len, rows))} tokens is longer than the "
                       f"run's answer width A={A} (the longest of the train split)")
    ans_NA, amask_NA = tasks_lib.pad_rows(rows, A, pad_id=tok.pad_id, pad_left=False)
    ans_BA, amask_BA = np.repeat(ans_NA, G, axis=0), np.repeat(amask_NA, G, axis=0)
    params = state.params
    out = {"answer_mask": parallel.shard_batch(amask_BA, s.mesh)}
    if wanted - {"answer_mask", "logprob_answer_prior"}:
      body, found_B = _cut_after_marker(tokens, _response_body(tok, tokens, resp), marker_ids)
      seq, attn, pos = forced(tokens, prompt | body, ans_BA, amask_BA, ~found_B)
      seq, attn, pos = parallel.shard_batch((seq, attn, pos), s.mesh)
      out["logprob_answer"] = answer_logprobs(params, seq, attn, pos, out["answer_mask"])
      if wanted & ANSWER_SEQUENCE:
        out.update(answer_tokens=seq, answer_attn_mask=attn, answer_positions=pos)
    if "logprob_answer_prior" in wanted:
      seq, attn, pos = forced(tokens[:, :P], prompt[:, :P], ans_BA, amask_BA,
                              np.ones(len(tokens), bool))
      prior_params = ctx.ref_params if prior_from_reference else params
      out["logprob_answer_prior"] = answer_logprobs(prior_params, *parallel.shard_batch(
          (seq, attn, pos), s.mesh), out["answer_mask"])
    return out

  return produce


def _cut_after_marker(tokens_BT: np.ndarray, body_BT: np.ndarray, marker_ids: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
  """(body [B,T] cut right after the first occurrence of `marker_ids` inside it, found [B]);
  rows without one keep their body. An empty marker: (body, all False)."""
  M, T = len(marker_ids), tokens_BT.shape[1]
  if not M:
    return body_BT, np.zeros(len(body_BT), bool)
  hit_BT = np.zeros_like(body_BT)
  hit_BT[:, :T - M + 1] = True
  for k, m in enumerate(marker_ids):
    hit_BT[:, :T - M + 1] &= (tokens_BT[:, k:T - M + 1 + k] == m) & body_BT[:, k:T - M + 1 + k]
  found_B = hit_BT.any(axis=1)
  end_B = np.where(found_B, np.argmax(hit_BT, axis=1) + M, T)
  return body_BT & (np.arange(T)[None, :] < end_B[:, None]), found_B


def _marked_answer(ans_BA: np.ndarray, amask_BA: np.ndarray, marker_ids: np.ndarray,
                   insert_B: np.ndarray, pad_id: int) -> tuple[np.ndarray, ...]:
  """Rows [B, M+A] of marker ⊕ answer (rows `insert_B`) or the answer alone (others),
  right-padded, their mask, and off [B] (the answer's first column: M or 0)."""
  M, A = len(marker_ids), ans_BA.shape[1]
  off_B = np.where(insert_B, M, 0)
  idx_BW = np.arange(M + A)[None, :] - off_B[:, None]
  inside_BW = (idx_BW >= 0) & (idx_BW < A)
  idx_BW = np.clip(idx_BW, 0, A - 1)
  mark_BW = insert_B[:, None] & (np.arange(M + A) < M)[None, :]
  marker_W = np.concatenate([marker_ids, np.zeros(A, np.int32)])
  ans_BW = np.where(mark_BW, marker_W[None, :],
                    np.where(inside_BW, np.take_along_axis(ans_BA, idx_BW, axis=1), pad_id))
  amask_BW = mark_BW | (inside_BW & np.take_along_axis(amask_BA, idx_BW, axis=1))
  return ans_BW.astype(np.int32), amask_BW, off_B


def _response_body(tok, tokens_BT: np.ndarray, resp_BT: np.ndarray) -> np.ndarray:
  """`response_mask` without each row's final stop token (a row cut at the budget keeps all
  of it): what `answer_pass` and `followup_pass` keep before their teacher-forced text."""
  stops = np.asarray(getattr(tok, "stop_ids", None) or (tok.eos_id,))
  last_B = np.max(np.where(resp_BT, np.arange(resp_BT.shape[1]), -1), axis=1)
  ends = (last_B >= 0) & np.isin(tokens_BT[np.arange(len(last_B)), last_B], stops)
  body = resp_BT.copy()
  body[np.flatnonzero(ends), last_B[ends]] = False
  return body


def _estimator_num_positive(c: ml_collections.ConfigDict) -> int | None:
  """The configured estimator's `num_positive` (estimator_kwargs, else its default); None
  when the estimator takes none (or is unknown: `check_method` refuses that itself)."""
  import inspect
  from credit import get_estimator
  try:
    est = get_estimator(c.estimator)
  except (KeyError, ValueError):
    return None
  param = inspect.signature(est.fn).parameters.get("num_positive")
  if param is None:
    return None
  return c.estimator_kwargs.get("num_positive", param.default)


def _followup_config(c: ml_collections.ConfigDict, tok) -> tuple[list[str], str]:
  """(the F follow-up texts, `c.followups_pos` then `c.followups_neg`; the separator).

  Raises SetupError naming the config field: a follow-up list that is not strings, no
  follow-up at all, an estimator whose `num_positive` is not len(followups_pos) (FLR counts
  the first num_positive of the F as positive), or, when `tok` is given, a text it cannot
  encode.
  """
  pos, neg = c.get("followups_pos"), c.get("followups_neg")
  sep = c.get("followup_separator")
  for key, texts in (("followups_pos", pos), ("followups_neg", neg)):
    if not isinstance(texts, (tuple, list)) or not all(isinstance(t, str) for t in texts):
      raise SetupError(f"{key}={texts!r} must be a tuple of strings (follow-up texts)")
  if not isinstance(sep, str):
    raise SetupError(f"followup_separator={sep!r} must be a string")
  if c.get("followup_scorer") not in FOLLOWUP_SCORERS:
    raise SetupError(f"followup_scorer={c.get('followup_scorer')!r}; valid: "
                     f"{list(FOLLOWUP_SCORERS)}")
  texts = list(pos) + list(neg)
  if not texts:
    raise SetupError("followups_pos and followups_neg are both empty: no follow-up to score")
  num_positive = _estimator_num_positive(c)
  if num_positive is not None and num_positive != len(pos):
    raise SetupError(
        f"estimator {c.estimator!r}: estimator_kwargs.num_positive={num_positive!r} but "
        f"followups_pos has {len(pos)} follow-up(s); the first num_positive of the "
        f"{len(texts)} scored follow-ups count as positive, so set "
        f"--config.estimator_kwargs.num_positive={len(pos)}")
  if tok is not None:
    for key, text in [("followup_separator", sep)] + [
        ("followups_pos" if i < len(pos) else "followups_neg", t) for i, t in enumerate(texts)]:
      try:
        tok.encode(text)
      except ValueError as e:
        raise SetupError(f"{key}: {text!r} cannot be encoded by the run's tokenizer ({e})"
                         ) from None
  return texts, sep


FOLLOWUP_SCORERS = ("reference", "policy")


def _check_followups(c: ml_collections.ConfigDict) -> None:
  """`_followup_config` at plan time, before any file is written: with the character
  tokenizer of from-scratch runs; a checkpoint's tokenizer (`init_from`) is checked when the
  producer is built."""
  _followup_config(c, None if c.get("init_from") else tasks_lib.CharTokenizer())


@producer("followup_pass",
          provides=("logprob_followup",),
          requires=("tokens", "response_mask"),
          phase="likelihood",
          doc="the policy teacher-forces each follow-up text (c.followups_pos, then "
              "c.followups_neg; + eos) after prompt ⊕ response (its stop token dropped) ⊕ "
              "c.followup_separator, and averages each one's token log-probs (FLR)",
          check=_check_followups,
          keeps_reference=True)
def _build_followup_pass(s: Setup, wanted: frozenset) -> Produce:
  """logprob_followup [B,F]: for each follow-up f, the mean log-prob of its tokens (text +
  eos) in prompt ⊕ response (its stop token dropped) ⊕ separator ⊕ f ⊕ eos.

  The separator is context only (not scored); it and each text are encoded on their own,
  so a follow-up's scored tokens are the same after every response. The F rows are fixed
  for the run and share one width W, so the jitted pass is traced once and called F times.
  The scorer is the frozen initial policy (`followup_scorer="reference"`, default: FLR scores
  with a fixed language model, which the policy cannot shift in its favour) or the current
  policy ("policy").
  """
  tok = s.data.tokenizer
  texts, sep = _followup_config(s.c, tok)
  sep_ids = list(tok.encode(sep))
  fu_FW, attend_FW = tasks_lib.pad_rows([sep_ids + answer_ids(tok, t) for t in texts], None,
                                        pad_id=tok.pad_id, pad_left=False)
  scored_FW = attend_FW & (np.arange(fu_FW.shape[1]) >= len(sep_ids))[None, :]
  score = s.scorer(entropy=False, tempered=False)
  use_reference = s.c.followup_scorer == "reference"

  @jax.jit
  def followup_logprob(params, tokens, attn_mask, pos, scored):
    logprob, _ = score(params, tokens, attn_mask)
    lp_BW = jnp.where(scored, jnp.take_along_axis(logprob, pos, axis=1), 0.0)
    return jnp.sum(lp_BW, axis=1) / jnp.maximum(jnp.sum(scored, axis=1), 1)

  def produce(state, batch, ctx: StepContext) -> dict:
    tokens, resp = batch["host"]["tokens"], batch["host"]["response_mask"]
    keep = batch["host"]["prompt_mask"] | _response_body(tok, tokens, resp)
    B = tokens.shape[0]
    params = ctx.ref_params if use_reference else state.params
    lp_F = []
    for f in range(len(texts)):
      seq, attn, pos = append_answer(tokens, keep, np.repeat(fu_FW[f:f + 1], B, axis=0),
                                     np.repeat(attend_FW[f:f + 1], B, axis=0), tok.pad_id)
      lp_F.append(followup_logprob(params, *parallel.shard_batch(
          (seq, attn, pos, np.repeat(scored_FW[f:f + 1], B, axis=0)), s.mesh)))
    return {"logprob_followup": jnp.stack(lp_F, axis=-1)}

  return produce
