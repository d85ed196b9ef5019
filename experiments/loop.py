"""The RL training loop: orchestration only; every array step is a jitted pure function.

`run(config, workdir)` is five parts, each a function below:

* `setup`: everything that can be refused is checked before a file is written (the
  method's inputs against the field producers, data, model path, mesh); then the policy,
  optimiser, planned producer stages and jitted advantage / update functions are built.
* `restore_or_warm_up`: the latest complete checkpoint, or the supervised warm-up and a
  step-0 checkpoint.
* `rl_step`: the planned producers in order (rollout, rewards, the extra passes the method
  needs), the estimator with exactly its data fields, the update with exactly the loss's.
* `record`: progress, periodic eval, metrics, sampled rollouts, checkpoints.
* `finish`: HF export, plots, summary.

What a run writes for its reader (process 0): log.txt (what it printed: progress lines
every `c.log_every` steps, each evaluation, messages; `experiments/progress.py`),
metrics.jsonl (+ TensorBoard), warmup.jsonl (the warm-up's loss per step), samples.jsonl (a
few rollouts every `c.samples_every` steps, as the model saw them), curves.png,
token_credit.png, token_change.png (log π of the starting policy's greedy held-out answers,
final minus start: `probe.npz`), summary.md (before / after, wall time, where learning
happened); `reporting.write_run_report`.

Everything threaded from step to step is in `RunState` (the checkpointed pytree, the
loader position, the step count), not in closures.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

import credit
from credit import parallel
from credit import tasks as tasks_lib
from credit.envs.rollout import (MultiTurnSampler, TurnLayout, demonstration_episode,
                                 encode_episode)
from credit.models import ModelConfig, Decoder
from credit.tasks.char_tokenizer import prompt_ids
from experiments import (checkpointing, extensions, memory, producers, progress, reporting,
                         train)

SetupError = producers.SetupError

# Fields the runner itself reads from every batch (update inputs, metrics, heatmap).
RUNNER_NEEDS = ("tokens", "response_mask", "reward")
# Fields the step makes itself for the loss: advantages (the estimator), the update's own
# model pass (`train.UPDATE_FIELDS`).
STEP_FIELDS = frozenset({"advantages"}) | train.UPDATE_FIELDS


# --------------------------------------------------------------------------
# The method: what the step calls, with which fields (resolved once).
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Method:
  """The resolved credit-assignment method.

  estimator_fields / estimator_static: the estimator's data arguments and its static
  keyword arguments (`EstimatorSpec.split_arguments`). loss_fields: the contract fields the
  loss takes. update_fields: the batch fields the update reads from the rollout's rows
  (tokens, the loss's fields it does not make itself, logprob_ref for the KL term, those the
  enabled extensions add). plan: the producers to run. extensions: {name: what an enabled
  extension resolved for the run (`Extension.resolve`)}.
  """
  estimator: credit.EstimatorSpec
  loss: credit.PolicyLossSpec
  estimator_fields: tuple[str, ...]
  estimator_static: dict
  loss_fields: tuple[str, ...]
  loss_kwargs: dict
  update_fields: tuple[str, ...]
  plan: tuple[producers.Planned, ...]
  extensions: dict = dataclasses.field(default_factory=dict)

  @property
  def keeps_reference(self) -> bool:
    return any(p.producer.keeps_reference for p in self.plan)


def method_needs(c: ml_collections.ConfigDict, est: credit.EstimatorSpec,
                 loss_fields: tuple[str, ...]) -> dict[str, list[str]]:
  """{contract field: who needs it} for the configured method."""
  needed: dict[str, list[str]] = {}

  def need(fields, who):
    for f in sorted(fields):
      needed.setdefault(f, []).append(who)

  need(RUNNER_NEEDS, "the runner (update inputs and metrics)")
  need(est.needs_for(dict(c.estimator_kwargs)), f"estimator {est.name!r}")
  for ext in extensions.enabled(c):
    for field, who in (ext.needs(c, est) if ext.needs is not None else {}).items():
      need([field], who)
  need(set(loss_fields) - STEP_FIELDS, f"policy loss {c.policy_loss!r}")
  if "logprob_topk" in loss_fields:  # the update scores the teacher's top-k ids itself
    need(["teacher_topk_ids"], f"policy loss {c.policy_loss!r} (logprob_topk)")
  if c.kl_coef:
    need(["logprob_ref"], f"the KL term (kl_coef={c.kl_coef})")
  if c.importance_correction:
    need(["logprob_sampler"], "importance_correction")
  if c.obs_ce_coef:
    need(["obs_mask"], f"the observation cross-entropy term (obs_ce_coef={c.obs_ce_coef})")
  if c.credit_mask:
    need([c.credit_mask], f"credit_mask={c.credit_mask!r}")
  return needed


def check_method(c: ml_collections.ConfigDict) -> Method:
  """Registry lookups, hyperparameter names, and the method's needs against the producers.

  Raises SetupError naming each needed field that no field producer makes and the method
  (estimator, loss, KL term, importance correction) that needs it; every extension's
  settings check (`Extension.check`) runs first.
  """
  for ext in extensions.EXTENSIONS:  # their specific refusals come first
    ext.check(c)
  est = credit.get_estimator(c.estimator)
  loss = credit.get_policy_loss(c.policy_loss)
  if c.credit_mask:
    masks = sorted(n for n, f in credit.CONTRACT.items() if f.shape == "BT" and f.dtype == "b")
    if c.credit_mask not in masks:
      raise SetupError(f"credit_mask={c.credit_mask!r}: not a [B,T] bool contract field; "
                       f"valid: {masks}")
    apart = [ext.name for ext in extensions.enabled(c) if ext.row_sets(c)]
    if apart:
      raise SetupError(f"credit_mask applies to the rollout's own rows only; the rows of "
                       f"{apart} make their advantages apart: leave it empty there")
  if c.logprob_old_source not in producers.LOGPROB_OLD_SOURCES:
    raise SetupError(f"logprob_old_source={c.logprob_old_source!r}; valid: "
                     f"{list(producers.LOGPROB_OLD_SOURCES)}")
  hyper = dict(c.estimator_kwargs)
  if "train_step" in est.params:  # a schedule over training (Atom-Searcher, RL Tango)
    if "train_step" in hyper:
      raise SetupError(f"estimator {est.name!r}: train_step is passed by the runner (the RL "
                       "step, as an array); do not set it in estimator_kwargs")
    if "total_steps" in est.params and "total_steps" not in hyper:
      hyper["total_steps"] = c.steps
  if "vocab_size" in est.params and "vocab_size" not in hyper:
    hyper["vocab_size"] = model_vocab_size(c)  # e.g. DGPO's entropy gate H / log|V|
  try:
    # Tree batches are not contiguous [N,G] blocks: estimators take the segment path.
    est_fields, est_static = est.split_arguments(
        hyper, num_groups=c.prompts_per_step,
        group_size=None if producers.tree_batch(c) else c.group_size)
  except ValueError as e:
    raise SetupError(str(e)) from None
  loss_kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in dict(c.loss_kwargs).items()}
  bad = [k for k in loss_kwargs if k not in loss.hyperparameters]
  if bad:
    raise SetupError(f"policy loss {loss.name!r} has no argument(s) {bad}; valid: "
                     f"{list(loss.hyperparameters)}")
  if c.importance_correction and "logprob_sampler" not in loss.params:
    raise SetupError(f"importance_correction: policy loss {loss.name!r} takes no "
                     "`logprob_sampler`")
  if "train_version" in loss_kwargs:
    raise SetupError("loss_kwargs.train_version is passed by the runner (the RL step)")
  # The row-level staleness bound (reduce_policy_loss) reads each row's policy_version.
  stale = {"policy_version"} if loss_kwargs.get("max_staleness") is not None else set()
  loss_fields = tuple(sorted(loss.needs | stale | ({"logprob_sampler"}
                                                   if c.importance_correction else set())))
  if "logprob_sampler" in loss_fields and producers.truncated_sampling(c):
    raise SetupError(
        f"top_k={c.top_k} / top_p={c.top_p} truncate the sampling distribution, but "
        f"{'importance_correction' if c.importance_correction else f'policy loss {loss.name!r}'}"
        " weighs rows by pi_old / pi_sampler, and the recomputed pi_old is the tempered policy "
        "over the whole vocabulary (not renormalised over each position's kept tokens), so the "
        "weight would be biased; sample with top_k=0 and top_p=1, or drop the correction")
  if c.obs_ce_mode not in credit.losses.OBS_CE_MODES:
    raise SetupError(f"obs_ce_mode={c.obs_ce_mode!r}; valid: {list(credit.losses.OBS_CE_MODES)}")
  resolved = {ext.name: ext.resolve(c, est, hyper) for ext in extensions.enabled(c)
              if ext.resolve is not None}
  update_fields = tuple(sorted({"tokens"} | (set(loss_fields) - train.UPDATE_FIELDS)
                               | ({"logprob_ref"} if c.kl_coef else set())
                               | ({"obs_mask"} if c.obs_ce_coef else set())
                               | ({"teacher_topk_ids"} if "logprob_topk" in loss_fields
                                  else set())
                               | set().union(*(r.update_fields for r in resolved.values()))))
  plan = producers.plan(method_needs(c, est, loss_fields), c)
  return Method(est, loss, est_fields, est_static, loss_fields, loss_kwargs, update_fields,
                tuple(plan), {name: r.value for name, r in resolved.items()})


def reference_from_adapters(c: ml_collections.ConfigDict, method: Method) -> bool:
  """Whether the frozen reference is the policy with its LoRA adapters off, not a copy.

  Exact when no warm-up ran: the base weights never train, and B = 0 at init makes the
  adapted start equal to the base, so zeroed adapters give the initial policy (the loaded
  checkpoint). Saves a second copy of the weights (BeamPERL, outcome_and_clipping.md §25).
  Asynchronous runs keep the copy (their rollout workers take `rs.ref_params`).
  """
  return bool(method.keeps_reference and c.lora_rank and not c.sft_steps
              and not c.async_rollouts)


def adapters_off(params, trainable):
  """`params` with the LoRA adapter weights (`trainable` True) zeroed; the base leaves are
  the same arrays (no copy)."""
  return jax.tree.map(lambda p, t: jnp.zeros_like(p) if t else p, params, trainable)


def model_vocab_size(c: ml_collections.ConfigDict) -> int:
  """|V| of the policy's output distribution: the checkpoint's `vocab_size` (init_from,
  warm_start_from), else the character tokenizer's (from-scratch models)."""
  source = c.init_from or c.get("warm_start_from", "")
  if source:
    hf = _read_checkpoint_config(source, "init_from" if c.init_from else "warm_start_from")
    if "vocab_size" not in hf:
      raise SetupError(f"{source!r}: config.json has no vocab_size")
    return int(hf["vocab_size"])
  return tasks_lib.CharTokenizer().vocab_size


def check_batch(fields: dict[str, Any], *, num_groups: int, where: str) -> None:
  """`credit.validate_fields` on host copies of a batch's contract fields.

  Raises credit.ContractError naming the field (shape, dtype, NaN/inf, group ids).
  """
  host = parallel.to_host({k: v for k, v in fields.items() if k in credit.CONTRACT})
  credit.validate_fields(host, num_groups=num_groups, where=where)
  if "parent_id" in host and "prefix_len" in host:  # a tree batch: parents first, same group
    from credit.trees import validate_tree
    validate_tree(host["parent_id"], host["prefix_len"], host.get("group_id"),
                  num_tokens=np.shape(host["tokens"])[1] if "tokens" in host else None,
                  where=where)


# --------------------------------------------------------------------------
# Data and model construction (no files written here).
# --------------------------------------------------------------------------


@dataclasses.dataclass
class Data:
  task: Any
  tokenizer: Any
  train: list[dict]
  eval: list[dict]
  max_prompt_len: int
  max_response_len: int


def build_data(c: ml_collections.ConfigDict) -> Data:
  """Task, tokenizer and the train / held-out examples (deterministic in c.seed).

  The tokenizer is the checkpoint's (`checkpoint_tokenizer`) with `c.init_from`, else the
  character tokenizer of the from-scratch models.
  """
  if c.init_from and c.get("warm_start_from"):
    raise SetupError("init_from and warm_start_from are exclusive: warm_start_from is for "
                     "policies exported by a from-scratch run (the task's character tokenizer)")
  hf = _read_checkpoint_config(c.init_from) if c.init_from else None
  tok = checkpoint_tokenizer(c, hf) if hf is not None else tasks_lib.CharTokenizer()
  if c.task in ("jsonl", "tfds"):
    if not c.data_path:
      raise SetupError(f"task={c.task!r} needs --config.data_path")
    task = tasks_lib.MathVerifier()
    if c.task == "jsonl":
      if not os.path.exists(c.data_path):
        raise SetupError(f"data_path {c.data_path!r} does not exist")
      data_format = c.get("data_format", "auto")
      if data_format not in tasks_lib.DATA_FORMATS:
        raise SetupError(f"data_format={data_format!r}; valid: "
                         f"{' | '.join(tasks_lib.DATA_FORMATS)}")
      try:  # gold answers that math_verify cannot parse are refused here, with line numbers
        examples = tasks_lib.load_jsonl(c.data_path, prompt_field=c.prompt_field,
                                        answer_field=c.answer_field, data_format=data_format,
                                        verifier=task)
      except (ValueError, KeyError) as e:
        raise SetupError(str(e)) from None
    else:
      examples = tasks_lib.load_tfds(c.data_path, "train", c.data_dir or None,
                                     prompt_field=c.prompt_field, answer_field=c.answer_field)
    n_eval = min(c.num_eval_examples, max(1, len(examples) // 10))
    train_ex, eval_ex = examples[n_eval:], examples[:n_eval]
    train_ex = [dict(e, index=i) for i, e in enumerate(train_ex)]
  else:
    task = tasks_lib.get_task(c.task, **dict(c.task_kwargs))
    train_ex = task.generate(np.random.default_rng(c.seed), c.num_train_examples)
    for i, e in enumerate(train_ex):
      e["index"] = i  # stable prompt id (keys per-prompt estimator state, e.g. DCPO)
    generate_eval = getattr(task, "generate_eval", task.generate)  # a held-out set, if any
    eval_ex = generate_eval(np.random.default_rng(10_000 + c.seed), c.num_eval_examples)
  # Prompt rows as the sampler gets them (bos or the chat template's specials included);
  # responses get +1 for eos within max_new_tokens.
  max_prompt = max(len(prompt_ids(tok, e["prompt"])) for e in train_ex + eval_ex)
  context = (hf or {}).get("max_position_embeddings")
  if context and max_prompt + c.max_new_tokens > context:
    raise SetupError(f"the longest prompt ({max_prompt} tokens) + max_new_tokens "
                     f"({c.max_new_tokens}) exceeds the model's context "
                     f"(max_position_embeddings={context})")
  return Data(task, tok, train_ex, eval_ex, max_prompt, c.max_new_tokens)


def _read_checkpoint_config(path: str, key: str = "init_from") -> dict:
  """config.json of a checkpoint directory; SetupError (naming config `key`) if it is not one."""
  if not os.path.isdir(path):
    raise SetupError(f"{key}={path!r} is not a directory")
  if not os.path.exists(os.path.join(path, "config.json")):
    raise SetupError(f"{key}={path!r} has no config.json")
  if not any(f.endswith(".safetensors") for f in os.listdir(path)):
    raise SetupError(f"{key}={path!r} has no *.safetensors weights")
  try:
    with open(os.path.join(path, "config.json")) as f:
      return json.load(f)
  except ValueError as e:
    raise SetupError(f"{key}={path!r}: config.json is not JSON ({e})") from None


_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def checkpoint_tokenizer(c: ml_collections.ConfigDict, hf: dict):
  """The `init_from` checkpoint's tokenizer in the task batch helpers' interface
  (`TaskTokenizer`: chat template per `c.chat_template`, `c.system_prompt`,
  `c.prompt_template`). Raises SetupError on missing tokenizer files, a vocabulary larger
  than the model's embedding, or a template that cannot render."""
  from credit.models import hf_tokenizer
  if not os.path.exists(os.path.join(c.init_from, "tokenizer.json")):
    raise SetupError(f"init_from={c.init_from!r} has no tokenizer.json (the checkpoint's "
                     "tokenizer is needed to feed it prompts)")
  mode = str(c.chat_template).strip().lower()
  if mode not in ("auto",) + _TRUE + _FALSE:
    raise SetupError(f"chat_template={c.chat_template!r}; valid: auto | true | false")
  if "{prompt}" not in c.prompt_template:
    raise SetupError(f"prompt_template={c.prompt_template!r} has no {{prompt}} field")
  try:
    base = hf_tokenizer.load_tokenizer(c.init_from)
    use_chat = bool(base.chat_template) if mode == "auto" else mode in _TRUE
    tok = hf_tokenizer.TaskTokenizer(base, chat_template=use_chat, system_prompt=c.system_prompt,
                                     prompt_template=c.prompt_template)
    tok.encode_prompt("1+1=")  # a template that cannot render fails here, not mid-run
  except (ValueError, KeyError, IndexError) as e:  # ChatTemplateError is a ValueError
    raise SetupError(f"init_from={c.init_from!r} tokenizer: {e}") from None
  vocab = hf.get("vocab_size")
  if vocab is not None and tok.vocab_size > vocab:
    raise SetupError(f"init_from={c.init_from!r}: the tokenizer has {tok.vocab_size} ids but "
                     f"the model's embedding only {vocab} (vocab_size)")
  return tok


def build_model_config(c: ml_collections.ConfigDict, tok) -> ModelConfig:
  """The from-scratch policy's shapes: `c.model.preset` or the explicit `c.model` fields
  (`producers.base.model_config`)."""
  return producers.base.model_config(c, tok)


# Above this many parameter bytes a from-scratch policy is created already sharded (one jitted
# init); below it eagerly, as before, so small runs keep their exact initial weights.
SHARDED_INIT_BYTES = 1 << 30


def build_policy(c: ml_collections.ConfigDict, tok, mesh) -> tuple[Decoder, ModelConfig]:
  """A tiny from-scratch policy, or `from_pretrained(c.init_from)`, or the exported policy of
  an earlier from-scratch run (`c.warm_start_from`) (+ LoRA)."""
  from credit import models
  source = c.init_from or c.get("warm_start_from", "")
  if source:
    key = "init_from" if c.init_from else "warm_start_from"
    hf = _read_checkpoint_config(source, key)
    if not c.init_from and hf.get("vocab_size") != tok.vocab_size:
      raise SetupError(f"warm_start_from={source!r}: its vocab_size {hf.get('vocab_size')} is "
                       f"not the task tokenizer's {tok.vocab_size} (was it exported by a "
                       "from-scratch run of this library?)")
    model, mcfg = models.from_pretrained(source, mesh=mesh, remat=bool(c.model.remat),
                                         remat_policy=c.model.get("remat_policy", "full"),
                                         param_dtype=c.model.param_dtype,
                                         dtype=c.model.compute_dtype)
  else:
    mcfg = build_model_config(c, tok)
    shapes = nnx.state(nnx.eval_shape(lambda: Decoder(mcfg, rngs=nnx.Rngs(c.seed))), nnx.Param)
    nbytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(shapes))
    if nbytes > SHARDED_INIT_BYTES:  # each device draws only its shard
      model = producers.base.init_policy(mcfg, mesh, c.seed)
    else:
      with jax.set_mesh(mesh):
        model = Decoder(mcfg, rngs=nnx.Rngs(c.seed))
  if c.lora_rank:
    model = models.apply_lora(model, rank=c.lora_rank, alpha=c.lora_alpha,
                              targets=tuple(c.lora_targets), rngs=nnx.Rngs(c.seed + 1))
  return model, mcfg


def turn_layout(c: ml_collections.ConfigDict, data: Data) -> TurnLayout:
  """The multi-turn rollout sizes of a run: prompt width, K turns, per-turn action and
  observation widths, and the episode's token budget `max_new_tokens`."""
  width = data.max_prompt_len
  for own in turn_samplers(c, data):  # e.g. prompts of another role share the columns
    width = max(width, own.prompt_width)
  return TurnLayout(prompt_width=width, max_turns=c.max_turns,
                    max_action_tokens=c.max_action_tokens,
                    max_observation_tokens=c.max_observation_tokens,
                    max_total_tokens=c.max_new_tokens)


def turn_samplers(c: ml_collections.ConfigDict, data: Data) -> list[extensions.TurnSampler]:
  """The multi-turn samplers of the run's enabled extensions (`Extension.turn_sampler`)."""
  return [ext.turn_sampler(data) for ext in extensions.enabled(c)
          if ext.turn_sampler is not None]


def multi_turn_sampler(c: ml_collections.ConfigDict, data: Data, model):
  """The run's `MultiTurnSampler` (or an enabled extension's own) for a multi-turn task, else
  None."""
  if not getattr(data.task, "multi_turn", False):
    return None
  tok = data.tokenizer
  cls, more = MultiTurnSampler, {}
  for own in turn_samplers(c, data):
    cls, more = own.cls, dict(own.kwargs)
  return cls(model, tokenizer=tok, layout=turn_layout(c, data),
             stop_tokens=getattr(tok, "stop_ids", None) or (tok.eos_id,), **more)


def _episode_batches(data: Data, c, rng: np.random.Generator, n: int):
  """Supervised warm-up batches of a multi-turn task: demonstration episodes played in the
  environment; the loss is on the policy's actions only (observations are context). Each
  example's episode is drawn once (a stochastic demonstrator's draw is then kept, like a
  fixed set of traces) and reused."""
  lay = turn_layout(c, data)
  limits = producers.env_limits(c, data.tokenizer)
  cache: dict[int, dict] = {}
  while True:
    idx = rng.integers(0, n, size=c.sft_batch_size)
    rows = []
    for i in idx:
      if i not in cache:
        many = getattr(data.task, "demonstration_episodes", None)  # several roles' episodes
        eps = (many(data.train[i], limits, rng) if many else
               [demonstration_episode(data.task, data.train[i], limits, rng)])
        cache[i] = [encode_episode(data.tokenizer, lay, *ep) for ep in eps]
      rows.append(cache[i][int(rng.integers(len(cache[i])))] if len(cache[i]) > 1 else
                  cache[i][0])
    b = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
    yield {"tokens": b["tokens"],
           "attn_mask": b["prompt_mask"] | b["response_mask"] | b["obs_mask"],
           "response_mask": b["response_mask"]}


def _sft_batches(data: Data, c, rng: np.random.Generator):
  """Demonstration batches (prompt + correct response) for supervised warm-up, drawn from the
  first `c.sft_examples` train examples (all when 0)."""
  n = min(c.sft_examples, len(data.train)) if c.sft_examples > 0 else len(data.train)
  if getattr(data.task, "multi_turn", False):
    yield from _episode_batches(data, c, rng, n)
  privileged = None  # an extension's prompts for some demonstrations
  for ext in extensions.enabled(c):
    if ext.sft_prompts is not None:
      privileged = ext.sft_prompts(c, data) or privileged
  while True:
    idx = rng.integers(0, n, size=c.sft_batch_size)
    ex = [data.train[i] for i in idx]
    demos = [data.task.demonstration(e, rng) for e in ex]
    prompts, width = [e["prompt"] for e in ex], data.max_prompt_len
    if privileged is not None:
      prompts, demos, width = privileged(ex, demos)
    b = tasks_lib.encode_prompt_response(data.tokenizer, prompts, demos, width,
                                         data.max_response_len)
    yield {"tokens": b["tokens"], "attn_mask": b["prompt_mask"] | b["response_mask"],
           "response_mask": b["response_mask"]}


def evaluate(sampler, model_state, data: Data, c, batch_size: int,
             step: int = 0, probe: bool = False, samples: int | None = None):
  """Held-out evaluation: greedy accuracy and mean reward; with `c.eval_samples = k > 0` also
  k samples per prompt at the training temperature / top_k / top_p:

    eval_mean_at_k = mean reward over the k samples of every prompt (mean@k),
    eval_pass_at_k = fraction of prompts with at least one correct (reward >= 1) sample.

  The sampling key depends only on (c.seed, step), so a resumed run evaluates identically.
  With `probe`, returns (metrics, the first batch's greedy answers: host tokens,
  prompt_mask, response_mask, prompt texts, reward of its `rows` real rows), or (metrics,
  None) for multi-turn tasks. `samples` overrides `c.eval_samples` (0: greedy only).
  """
  k = max(0, int(c.get("eval_samples", 0) or 0) if samples is None else samples)
  key = jax.random.fold_in(jax.random.key(c.seed + 7_919), step)
  if getattr(sampler, "layout", None) is not None:  # a MultiTurnSampler: play episodes
    m = _evaluate_episodes(sampler, model_state, data, c, batch_size, k, key)
    return (m, None) if probe else m
  greedy, sampled, first = [], [], None
  ex = data.eval
  for n, i in enumerate(range(0, len(ex), batch_size)):
    chunk = ex[i:i + batch_size]
    pad = batch_size - len(chunk)
    prompts = [e["prompt"] for e in chunk] + [chunk[-1]["prompt"]] * pad
    toks, mask = tasks_lib.encode_prompts(data.tokenizer, prompts, data.max_prompt_len)
    out = sampler(model_state, prompt_tokens=toks, prompt_mask=mask, key=jax.random.key(0),
                  max_new_tokens=c.max_new_tokens, temperature=0.0)
    host = parallel.to_host({"tokens": out.tokens, "response_mask": out.response_mask})
    texts = tasks_lib.decode_responses(data.tokenizer, host["tokens"], host["response_mask"])
    greedy.append(tasks_lib.verify_batch(data.task, chunk, texts[:len(chunk)]))
    if probe and n == 0:
      first = dict(parallel.to_host({"prompt_mask": out.prompt_mask}), **host,
                   reward=np.asarray(greedy[0], np.float32), rows=len(chunk),
                   prompt=np.asarray([e["prompt"] for e in chunk]))
    if k:  # rows n*k .. n*k+k-1 continue prompt n
      out = sampler(model_state, prompt_tokens=toks, prompt_mask=mask,
                    key=jax.random.fold_in(key, n), max_new_tokens=c.max_new_tokens,
                    num_samples=k, temperature=c.temperature, top_k=c.top_k, top_p=c.top_p)
      host = parallel.to_host({"tokens": out.tokens, "response_mask": out.response_mask})
      texts = tasks_lib.decode_responses(data.tokenizer, host["tokens"], host["response_mask"])
      rows = [e for e in chunk for _ in range(k)]
      sampled.append(np.asarray(tasks_lib.verify_batch(data.task, rows, texts[:len(rows)]),
                                np.float64).reshape(len(chunk), k))
  r = np.concatenate(greedy)
  m = {"eval_accuracy": float(np.mean(r >= 1.0)), "eval_reward": float(np.mean(r))}
  if k:
    s = np.concatenate(sampled)
    m["eval_mean_at_k"] = float(np.mean(s))
    m["eval_pass_at_k"] = float(np.mean(np.any(s >= 1.0, axis=1)))
  return (m, first) if probe else m


def _evaluate_episodes(sampler, model_state, data: Data, c, batch_size: int, k: int,
                       key) -> dict[str, float]:
  """`evaluate` for multi-turn tasks: greedy episodes (and k sampled ones per prompt) in the
  task's environments; the reward is the episode outcome. Also the mean number of turns."""
  greedy, sampled, turns = [], [], []
  ex = data.eval
  for n, i in enumerate(range(0, len(ex), batch_size)):
    chunk = ex[i:i + batch_size]
    rows = chunk + [chunk[-1]] * (batch_size - len(chunk))
    limits = producers.env_limits(c, data.tokenizer)
    out = sampler(model_state, [data.task.make_env(e, limits) for e in rows], key=jax.random.key(0),
                  temperature=0.0)
    greedy.append(out.reward[:len(chunk)])
    turns.append(out.step_mask[:len(chunk)].sum(1))
    if k:  # k episodes per prompt, batch_size rows per call
      per = max(1, batch_size // k)
      for j in range(0, len(chunk), per):
        sub = chunk[j:j + per]
        envs = [data.task.make_env(e, limits) for e in sub for _ in range(k)]
        envs += [data.task.make_env(sub[-1], limits) for _ in range(batch_size - len(envs))]
        out = sampler(model_state, envs, key=jax.random.fold_in(key, n * 1_000 + j),
                      temperature=c.temperature, top_k=c.top_k, top_p=c.top_p)
        sampled.append(np.asarray(out.reward[:len(sub) * k], np.float64).reshape(len(sub), k))
  r = np.concatenate(greedy)
  m = {"eval_accuracy": float(np.mean(r >= 1.0)), "eval_reward": float(np.mean(r)),
       "eval_turns": float(np.mean(np.concatenate(turns)))}
  if k:
    s = np.concatenate(sampled)
    m["eval_mean_at_k"] = float(np.mean(s))
    m["eval_pass_at_k"] = float(np.mean(np.any(s >= 1.0, axis=1)))
  return m


# --------------------------------------------------------------------------
# The run.
# --------------------------------------------------------------------------


def _key_data(seed: int) -> jax.Array:
  return jax.random.key_data(jax.random.key(seed))


@dataclasses.dataclass
class Runner:
  """What a run builds once: config, data, mesh, method, producer stages, jitted steps,
  shardings and the checkpointer. Holds no number that changes from step to step."""
  c: ml_collections.ConfigDict
  workdir: str
  data: Data
  mesh: Any
  mcfg: ModelConfig
  method: Method
  setup: producers.Setup        # graphdef, rest, sampler, chunk size, N, G
  stages: list[producers.Stage]
  tx: Any
  trainable: Any                # LoRA mask (None: everything trains)
  shardings: train.TrainState   # of the train state (out_shardings of the update)
  adv_fn: Any
  update: Any
  extensions: tuple             # `extensions.Built` of the enabled extensions, in order
  ckpt: checkpointing.Checkpointer
  eval_batch_size: int
  is_main: bool
  log: progress.RunLog | None = None  # <workdir>/log.txt (process 0)
  memory_plan: str = ""         # `memory.format_plan` of the run (setup and summary.md)

  def say(self, message: str) -> None:
    """A message on stdout and in log.txt (process 0 only), through tqdm so it never breaks
    the bar."""
    if self.is_main:
      progress.say(message, self.log)


class StepBatch(NamedTuple):
  """What the heatmap needs of one step: host (numpy tokens, masks, reward, group_id, texts),
  adv ([B,T] advantages, left on the device until the run finishes), prompts (the N task
  prompts, by group id) and whether a group got mixed rewards."""
  step: int
  host: dict
  adv: Any
  prompts: list
  mixed: bool


@dataclasses.dataclass
class RunState:
  """What changes from step to step.

  train: the train state pytree. ref_params: the frozen reference policy (None unless a
  planned producer keeps one). learners: {producer name: LearnerState} of the trained field
  producers (implicit PRM, critics; `experiments/producers/learners.py`). All three are
  checkpointed. loader: the prompt iterator (its position is saved with each checkpoint).
  step: RL steps completed. checked: the first batch of this process's run has been
  validated. heatmap: the batch of the most recent step
  with a mixed-reward group (else of the most recent step), for the token-credit heatmap.
  samples: this step's rows for samples.jsonl (empty on other steps and other processes).
  best_eval: with `c.keep_best_eval`, the step and eval_accuracy of <workdir>/best_policy
  (saved in the checkpoint's meta). probe: the starting policy's greedy answers to the first
  held-out batch with their log-probs under it (`PROBE_FILE`), for token_change.png.
  """
  train: train.TrainState
  ref_params: Any
  loader: Any
  learners: dict = dataclasses.field(default_factory=dict)
  step: int = 0
  checked: bool = False
  heatmap: StepBatch | None = None
  samples: list = dataclasses.field(default_factory=list)
  best_eval: dict = dataclasses.field(default_factory=dict)  # keep_best_eval: step, accuracy
  probe: dict | None = None

  def checkpoint(self) -> dict[str, Any]:
    return {"train": self.train, "ref_params": self.ref_params, "learners": self.learners}


def _checked_setup(c: ml_collections.ConfigDict):
  """(method, data, mesh, model, mcfg, chunk): every refusal happens here, before any file."""
  if c.requires_checkpoint and not (c.init_from or c.warm_start_from):
    raise SetupError("this recipe fine-tunes a loaded checkpoint: set --config.init_from=<HF "
                     "dir> or --config.warm_start_from=<hf_policy/ of a from-scratch run>; "
                     f"{c.requires_checkpoint}")
  method = check_method(c)  # the extensions' own checks first
  if method.loss.whole_groups and c.num_minibatches > 1:
    if producers.tree_batch(c):
      raise SetupError(f"policy loss {c.policy_loss!r} needs whole prompt groups in every "
                       "minibatch, which tree batches do not keep: set num_minibatches=1")
    if c.prompts_per_step % c.num_minibatches:
      raise SetupError(f"policy loss {c.policy_loss!r} needs whole prompt groups in every "
                       f"minibatch: num_minibatches={c.num_minibatches} must divide "
                       f"prompts_per_step={c.prompts_per_step}")
  data = build_data(c)
  mesh = parallel.make_mesh(c.mesh)
  B = producers.rollout_rows(c)
  div = parallel.batch_divisor(mesh)
  if B % (c.num_minibatches * div):
    what = "the tree batch" if producers.tree_batch(c) else "prompts_per_step*group_size"
    raise SetupError(f"{what}={B} rows must be divisible by num_minibatches "
                     f"({c.num_minibatches}) x the mesh's batch-parallel size ({div})")
  for ext in extensions.enabled(c):  # what an extension can only check with data and mesh
    if ext.check_run is not None:
      ext.check_run(c, data=data, batch_divisor=div)
  if c.scoring_chunk_size < 0:
    raise SetupError(f"scoring_chunk_size={c.scoring_chunk_size} must be >= 0 (0 = auto)")
  model, mcfg = build_policy(c, data.tokenizer, mesh)
  from credit.models import shard_model
  shard_model(model, mesh)
  return method, data, mesh, model, mcfg, c.scoring_chunk_size or None  # None: auto chunk


def setup(c: ml_collections.ConfigDict, workdir: str) -> tuple[Runner, RunState]:
  """Checks everything, then builds the runner and the initial (step 0) run state."""
  method, data, mesh, model, mcfg, chunk = _checked_setup(c)
  plan = memory.plan_run(c, method=method, reference_copy=keeps_reference_copy(c, method),
                         mesh_shape=dict(mesh.shape), device_bytes=memory.device_memory(c),
                         model=mcfg)
  os.makedirs(workdir, exist_ok=True)
  from credit.models import lora_trainable_mask
  from credit.sampling import Sampler
  graphdef, params, rest = train.split_model(model)
  tok = data.tokenizer
  sampler = Sampler(model, pad_id=tok.pad_id,
                    stop_tokens=getattr(tok, "stop_ids", None) or (tok.eos_id,))
  prod_setup = producers.Setup(c, data, mesh, graphdef, rest, sampler, chunk,
                               c.prompts_per_step, c.group_size,
                               multi_sampler=multi_turn_sampler(c, data, model))
  trainable = lora_trainable_mask(params) if c.lora_rank else None
  tx = train.make_optimizer(learning_rate=c.learning_rate, total_steps=c.steps,
                            warmup_steps=c.warmup_steps, weight_decay=c.weight_decay,
                            grad_clip=c.grad_clip, trainable=trainable,
                            master_dtype=master_dtype(c))
  est = method.estimator
  est_state = est.init_state(len(data.train)) if est.stateful else None
  rep = parallel.replicated(mesh)
  p_sh, o_sh = train.state_shardings(tx, params, tx.init(params), mesh)
  params = jax.device_put(params, p_sh)
  exts = extensions.enabled(c)
  built = [ext.build(prod_setup, method) for ext in exts]
  controller = _at_most_one(exts, built, "controller")
  ctl_state = controller.init if controller is not None else None
  state = train.TrainState(step=jax.device_put(jnp.zeros((), jnp.int32), rep), params=params,
                           opt_state=jax.jit(tx.init, out_shardings=o_sh)(params),
                           key=jax.device_put(_key_data(c.seed), rep),
                           estimator_state=jax.device_put(est_state, rep),
                           controller=jax.device_put(ctl_state, rep))
  st_sh = train.TrainState(step=rep, params=p_sh, opt_state=o_sh, key=rep,
                           estimator_state=jax.tree.map(lambda _: rep, est_state),
                           controller=jax.tree.map(lambda _: rep, ctl_state))
  adv_fn = jax.jit(train.make_advantage_fn(est, method.estimator_static),
                   out_shardings=(parallel.batch_sharding(mesh, 2), st_sh.estimator_state,
                                  parallel.batch_sharding(mesh)))  # [B,T] and [B] targets
  row_sets, terms = update_objective(c, method, exts, built)
  update = jax.jit(train.make_update(
      graphdef, rest, tx, row_sets=row_sets, terms=terms, ppo_epochs=c.ppo_epochs,
      num_minibatches=c.num_minibatches, chunk_size=chunk, controller=controller,
      temperature=producers.scoring_temperature(c)),
      out_shardings=(st_sh, rep), donate_argnums=(0,))
  stages = [p.build(prod_setup) for p in method.plan]
  for ext, b in zip(exts, built):  # the extensions' stages, where each says
    for placed in b.stages:
      stages = extensions.place(stages, placed, ext.name)
  div = parallel.batch_divisor(mesh)
  eval_bs = min(128, max(div, len(data.eval)))
  runner = Runner(
      c=c, workdir=workdir, data=data, mesh=mesh, mcfg=mcfg, method=method,
      setup=prod_setup, stages=stages, tx=tx,
      trainable=trainable, shardings=st_sh, adv_fn=adv_fn, update=update,
      extensions=tuple(built),
      ckpt=checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"),
                                      max_to_keep=c.keep_checkpoints),
      eval_batch_size=eval_bs - eval_bs % div, is_main=jax.process_index() == 0,
      log=(progress.RunLog(workdir, header=reporting.run_headline(c))
           if jax.process_index() == 0 else None),
      memory_plan=memory.format_plan(plan) if plan is not None else "")
  if runner.memory_plan:
    runner.say(runner.memory_plan)
  ref = state.params if keeps_reference_copy(c, method) else None  # restore template only
  return runner, RunState(state, ref, tasks_lib.make_loader(data.train, c.prompts_per_step,
                                                            seed=c.seed),
                          learners=init_learners(runner, state.params))


def keeps_reference_copy(c: ml_collections.ConfigDict, method: Method) -> bool:
  """The run keeps a frozen copy of the policy's parameters as its reference (not when the
  reference is the base model under LoRA adapters)."""
  return method.keeps_reference and not reference_from_adapters(c, method)


def master_dtype(c: ml_collections.ConfigDict) -> str | None:
  """The optimiser's master-copy dtype (`c.model.optimizer_dtype`; None: the parameters')."""
  d = c.model.get("optimizer_dtype", "param")
  return None if d == "param" else d


def _at_most_one(exts, built, what: str):
  """The one enabled extension's `what` (None when none sets it); SetupError for several."""
  have = [(e.name, getattr(b, what)) for e, b in zip(exts, built) if getattr(b, what) is not None]
  if len(have) > 1:
    raise SetupError(f"{[n for n, _ in have]} each set the update's {what}; use one of them")
  return have[0][1] if have else None


def update_objective(c: ml_collections.ConfigDict, method: Method, exts, built
                     ) -> tuple[list[train.RowSet], list[train.LossTerm]]:
  """The update's row sets and loss terms: the rollout's rows (`train.MAIN`, weight from an
  extension or 1) and every enabled extension's row sets, each with the configured policy
  loss, KL, entropy and observation terms (`train.policy_terms`), then the extensions' own
  terms."""
  roles = [e.main_role for e in exts if e.main_role]
  weight = _at_most_one(exts, built, "main_weight")
  main = train.RowSet(train.MAIN, weight=1.0 if weight is None else weight,
                      group_size=None if producers.tree_batch(c) else c.group_size,
                      loss_metric=f"loss_{roles[0]}" if roles else None)
  row_sets = [main] + [r for e in exts for r in e.row_sets(c)]
  terms = [t for r in row_sets for t in train.policy_terms(
      loss_spec=method.loss, loss_fields=method.loss_fields, loss_kwargs=method.loss_kwargs,
      kl_coef=c.kl_coef, kl_kind=c.kl_kind, entropy_coef=c.entropy_coef,
      obs_ce_coef=c.obs_ce_coef, obs_ce_mode=c.obs_ce_mode, rows=r.name)]
  return row_sets, terms + [t for b in built for t in b.terms]


def init_learners(run: Runner, policy_params) -> dict:
  """{name: LearnerState} of the planned trained producers, initialised from `policy_params`."""
  return {p.producer.name: p.producer.init(run.setup, policy_params)
          for p in run.method.plan if p.producer.init is not None}


def restore_or_warm_up(run: Runner, rs: RunState) -> RunState:
  """The latest complete checkpoint; else the SFT warm-up (if any), the frozen reference
  copy (if a producer keeps one) and a step-0 checkpoint."""
  restored = run.ckpt.restore_latest(checkpointing.abstract_like(rs.checkpoint()))
  if restored is not None:
    rs.loader.set_state(restored.meta["loader"])
    state = restored.state["train"]
    rs = dataclasses.replace(rs, train=state, ref_params=restored.state["ref_params"],
                             learners=restored.state["learners"], step=int(state.step),
                             best_eval=dict(restored.meta.get("best_eval") or {}))
    run.say(f"resumed from step {rs.step} in {run.ckpt.directory}")
    return rs
  stale = os.path.join(run.workdir, progress.WARMUP_FILE)
  if run.is_main and not run.c.sft_steps and os.path.exists(stale):
    os.remove(stale)  # an earlier run's warm-up in this workdir
  state = warm_up(run, rs.train) if run.c.sft_steps else rs.train
  # A copy: the update donates state.params, which would delete buffers shared with it.
  keep_copy = keeps_reference_copy(run.c, run.method)
  ref = jax.tree.map(jnp.copy, state.params) if keep_copy else None
  rs = dataclasses.replace(rs, train=state, ref_params=ref,
                           learners=init_learners(run, state.params))
  save(run, rs)
  return rs


def warm_up(run: Runner, state: train.TrainState) -> train.TrainState:
  """`c.sft_steps` supervised steps on task demonstrations; fresh optimiser state after.

  With `c.sft_min_accuracy > 0` the warm-up is checked on the held-out split (greedy, the
  same evaluation as the RL loop's) after its `sft_steps`; while the accuracy is below it,
  `sft_extend_steps` more steps run at the schedule's final learning rate and it is checked
  again, up to `sft_max_steps` (0: twice `sft_steps`). How long a from-scratch warm-up takes
  to learn its task varies with the seed and the CPU's rounding; the check makes RL start
  from a policy that has learnt it, or says that it has not.
  """
  c, s = run.c, run.setup
  sft_tx = train.make_optimizer(learning_rate=c.sft_learning_rate, total_steps=c.sft_steps,
                                warmup_steps=min(10, c.sft_steps // 10), weight_decay=0.0,
                                grad_clip=c.grad_clip, trainable=run.trainable,
                                master_dtype=master_dtype(c))
  p_sh, o_sh = run.shardings.params, run.shardings.opt_state
  _, so_sh = train.state_shardings(sft_tx, state.params, sft_tx.init(state.params), run.mesh)
  sft_step = jax.jit(train.make_sft_step(s.graphdef, s.rest, sft_tx, s.chunk_size),
                     out_shardings=(p_sh, so_sh, parallel.replicated(run.mesh)),
                     donate_argnums=(0, 1))
  p = jax.tree.map(jnp.copy, state.params)
  o = jax.jit(sft_tx.init, out_shardings=so_sh)(state.params)
  batches = _sft_batches(run.data, c, np.random.default_rng(c.seed + 7))
  bar = progress.ProgressBar(c.sft_steps, desc="warm-up", disable=None if c.progress else True,
                             fields=progress.WARMUP_FIELDS, every=c.get("log_every", 0),
                             log=run.log, quiet=not run.is_main)
  record = progress.WarmupRecord(run.workdir) if run.is_main else None
  min_acc = float(c.get("sft_min_accuracy", 0.0) or 0.0)
  cap = int(c.get("sft_max_steps", 0) or 0) or 2 * c.sft_steps
  t0 = seen = time.perf_counter()
  pending = []  # the metrics of steps not yet read back (reading waits for the device)
  i, target = 0, c.sft_steps
  while True:
    while i < target:
      p, o, m = sft_step(p, o, parallel.shard_batch(next(batches), run.mesh))
      pending.append(m)
      i += 1
      if (i % bar.every == 0 or i in (1, target)
          or (bar.live and time.perf_counter() - seen > 0.5)):
        for step, row in enumerate(jax.device_get(pending), i + 1 - len(pending)):
          row = {k: float(v) for k, v in row.items()}
          bar.update(step, row)
          if record:
            record.write(step, row)
        pending, seen = [], time.perf_counter()
    if not min_acc:
      break
    acc = _warm_up_accuracy(run, p)
    if record:
      record.write(i, {"eval_accuracy": acc})
    if acc >= min_acc or i >= cap:
      verdict = (f">= sft_min_accuracy {min_acc:g}" if acc >= min_acc else
                 f"still < sft_min_accuracy {min_acc:g} at the cap (sft_max_steps={cap}); "
                 "RL starts from here")
      run.say(f"warm-up check at step {i}: held-out accuracy {acc:.3f} {verdict}")
      break
    target = min(cap, i + c.sft_extend_steps)
    run.say(f"warm-up check at step {i}: held-out accuracy {acc:.3f} < sft_min_accuracy "
            f"{min_acc:g}; {target - i} more steps (cap {cap})")
    bar.extend(target)
  jax.block_until_ready(p)
  bar.close()
  if record:
    record.close()
  run.say(f"SFT warm-up: {i} steps, loss {float(m['sft_loss']):.4f}, "
          f"{time.perf_counter() - t0:.1f}s")
  return state.replace(params=p, opt_state=jax.jit(run.tx.init, out_shardings=o_sh)(p))


def _warm_up_accuracy(run: Runner, params) -> float:
  """Held-out greedy accuracy of the warm-up's `params` (`evaluate` without samples)."""
  m = evaluate(run.setup.multi_sampler or run.setup.sampler, run.setup.model_state(params),
               run.data, run.c, run.eval_batch_size, samples=0)
  return m["eval_accuracy"]


def save(run: Runner, rs: RunState) -> None:
  run.ckpt.save(rs.step, state=rs.checkpoint(),
                meta={"loader": rs.loader.get_state(), "best_eval": rs.best_eval}, force=True)


def _context(run: Runner, rs: RunState) -> producers.StepContext:
  """The step's key and prompts (the loader advances here)."""
  ex = next(rs.loader)
  toks, pmask = tasks_lib.encode_prompts(run.data.tokenizer, ex["prompt"],
                                         run.data.max_prompt_len)
  key = jax.random.fold_in(jax.random.wrap_key_data(_key_data(run.c.seed)), rs.step)
  ref = rs.ref_params
  if reference_from_adapters(run.c, run.method):  # used before the update donates the params
    ref = adapters_off(rs.train.params, run.trainable)
  return producers.StepContext(key=key, examples=ex, prompt_tokens=toks, prompt_mask=pmask,
                               ref_params=ref, learners=dict(rs.learners))


def rl_step(run: Runner, rs: RunState) -> tuple[RunState, dict[str, float]]:
  """One RL step: the planned producers, the estimator, the update; returns its metrics."""
  t_step = time.perf_counter()
  ctx = _context(run, rs)
  batch, times = {}, {}
  run_stages(run.stages, rs.train, batch, ctx, times)
  return learn(run, rs, ctx, batch, times, t_step)


def run_stages(stages, state, batch: dict, ctx: producers.StepContext, times: dict) -> None:
  """Runs producer `stages` in order, adding their fields to `batch` and their seconds to
  `times[phase]`."""
  for stage in stages:
    t0 = time.perf_counter()
    batch.update(jax.block_until_ready(stage(state, batch, ctx)))
    times[stage.phase] = times.get(stage.phase, 0.0) + time.perf_counter() - t0


def learn(run: Runner, rs: RunState, ctx: producers.StepContext, batch: dict, times: dict,
          t_step: float) -> tuple[RunState, dict[str, float]]:
  """The second half of a step, on a produced batch: checks, the estimator, the update, the
  trained producers' `after`, the samples and the metrics."""
  c, m = run.c, run.method
  where = f"batch of step {rs.step + 1}"
  if any(b.skip is not None and b.skip(batch, ctx) for b in run.extensions):
    # An extension left nothing to train (e.g. a filter kept no group): no update this step.
    host = _host_view(batch)
    metrics = _step_metrics(dict(ctx.metrics, update_skipped=1.0), host, jnp.zeros(()),
                            time.perf_counter() - t_step, times)
    return dataclasses.replace(rs, step=rs.step + 1, samples=[], learners=ctx.learners), metrics
  if c.debug_checks or not rs.checked:
    check_batch(batch, num_groups=c.prompts_per_step, where=where)
  t0 = time.perf_counter()
  arrays = {n: batch[n] for n in m.estimator_fields}
  if "train_step" in m.estimator.params:  # traced, so a schedule does not recompile
    arrays["train_step"] = jnp.asarray(rs.step, jnp.float32)
  adv, est_state, targets = run.adv_fn(arrays, rs.train.estimator_state)
  if c.credit_mask:  # the estimator's credit kept on those tokens (the bench's oracle placement)
    adv = adv * batch[c.credit_mask]
  batch["advantages"] = adv
  batch.update(targets)  # the estimator's per-row targets (an extension's loss term reads them)
  if c.debug_checks:
    check_batch({"advantages": adv, "response_mask": batch["response_mask"]},
                num_groups=c.prompts_per_step, where=f"{m.estimator.name} advantages, {where}")
  upd_batch = dict({f: batch[f] for f in m.update_fields}, attn_mask=batch["attn_mask"])
  parts = {train.MAIN: upd_batch}
  step_view = extensions.Step(rs.train, batch, ctx, c.debug_checks or not rs.checked)
  for b in run.extensions:  # their rows and parts join the rollout's in the one update
    if b.rows is not None:
      parts = b.rows(parts, step_view)
  state, upd = run.update(rs.train.replace(estimator_state=est_state), parts)
  jax.block_until_ready(state.params)
  times["update"] = time.perf_counter() - t0
  for stage in run.stages:  # trained producers learn from this step's targets
    if stage.after is not None:
      t0 = time.perf_counter()
      stage.after(batch, targets, ctx)
      jax.block_until_ready(ctx.learners)
      times[stage.phase] = times.get(stage.phase, 0.0) + time.perf_counter() - t0
  host = _host_view(batch)
  step, samples = rs.step + 1, []
  heatmap = _heatmap_batch(rs.heatmap, StepBatch(
      step, host, adv, [str(p) for p in ctx.examples["prompt"]],
      reporting.has_mixed_group(host["reward"], host["group_id"])))
  if c.samples_every and c.samples_per_step and (step % c.samples_every == 0 or step == c.steps):
    adv_host = np.asarray(parallel.to_host(adv))  # every process: a collective on several
    if run.is_main:
      samples = _sample_rows(run.data.tokenizer, host, adv_host, ctx.examples, step,
                             c.samples_per_step)
  metrics = _step_metrics(dict(upd, **ctx.metrics), host, adv, time.perf_counter() - t_step,
                          times)
  lp = _sampling_logprob(c, batch)
  if lp is not None:  # −log π of the sampled tokens: an entropy estimate, without a pass
    lp = jnp.where(batch["response_mask"], lp, 0.0)
    metrics["sampled_entropy"] = float(-jnp.sum(lp) / max(1, int(host["response_mask"].sum())))
  return dataclasses.replace(rs, train=state, step=step, checked=True, heatmap=heatmap,
                             samples=samples, learners=ctx.learners), metrics


def _sampling_logprob(c, batch: dict):
  """log π_sample(y_t) [B,T] of the sampled tokens under the distribution they were drawn from,
  when the batch has it: `logprob_sampler`, or the sampler's `logprob_raw` when sampling was
  plain (temperature 1, no truncation); else None. Its mean negative over the response tokens
  is a one-sample estimate of the sampling policy's per-token entropy."""
  if "logprob_sampler" in batch:
    return batch["logprob_sampler"]
  plain = float(c.temperature) == 1.0 and not producers.truncated_sampling(c)
  return batch.get("logprob_raw") if plain else None


def _host_view(batch: dict) -> dict:
  """The step's host copies for metrics and samples: the rollout's, its texts, the reward."""
  host = dict(batch["host"], **parallel.to_host({"reward": batch["reward"]}))
  if "texts" in batch:
    host["texts"] = batch["texts"]
  return host


def _heatmap_batch(kept: StepBatch | None, new: StepBatch) -> StepBatch:
  """The batch the heatmap shows: the newest with a mixed-reward group, else the newest."""
  return kept if kept is not None and kept.mixed and not new.mixed else new


def _prompt_text(tokenizer, ids) -> str:
  """A prompt row as the model got it: a checkpoint tokenizer's text with its specials (chat
  template markers), else the character tokenizer's text (bos and pad skipped)."""
  inner = getattr(tokenizer, "tokenizer", None)
  if inner is not None:
    return inner.decode(ids, skip_special_tokens=False)
  return tokenizer.decode(ids)


def _sample_rows(tokenizer, host: dict, adv, examples, step: int, num: int) -> list[dict]:
  """Up to `num` rollouts of a step for samples.jsonl, from groups with mixed rewards first
  (`reporting.select_rows`, two per group: a good and a bad one side by side).

  Each row: step, group, row (in the batch), prompt (the prompt tokens decoded), response
  (decoded up to eos), response_ids (eos included), reward, advantages (per response token),
  answer (the task's gold answer, when its examples have one).
  """
  answers = examples.get("answer")
  out = []
  for i in reporting.select_rows(host["reward"], host["group_id"], num, per_group=2):
    g, resp = int(host["group_id"][i]), host["response_mask"][i]
    ids = host["tokens"][i][resp]
    text = host["texts"][i] if "texts" in host else tokenizer.decode(ids)
    row = {"step": step, "group": g, "row": i,
           "prompt": _prompt_text(tokenizer, host["tokens"][i][host["prompt_mask"][i]]),
           "response": text, "response_ids": [int(t) for t in ids],
           "reward": float(host["reward"][i]),
           "advantages": [round(float(a), 6) for a in adv[i][resp]]}
    if answers is not None:
      row["answer"] = str(answers[g])
    out.append(row)
  return out


def _step_metrics(upd, host, adv, step_time: float, times: dict) -> dict[str, float]:
  reward = host["reward"]
  resp_len = host.get("sampled_response_mask", host["response_mask"]).sum(-1)
  m = {k: float(v) for k, v in jax.device_get(upd).items()}
  m.update(reward_mean=float(reward.mean()), accuracy=float(np.mean(reward >= 1.0)),
           response_length=float(resp_len.mean()),
           adv_abs_mean=float(jnp.sum(jnp.abs(adv))
                              / max(1, int(host["response_mask"].sum()))),
           step_time=step_time, **{f"time_{k}": v for k, v in times.items()},
           time_overhead=step_time - sum(times.values()))
  return m


def _evaluate(run: Runner, rs: RunState, probe: bool = False):
  """`evaluate` on the current policy (with `probe`: (metrics, the first batch's answers)),
  the best policy kept, and one line on the terminal and in log.txt."""
  t0 = time.perf_counter()
  m, first = evaluate(run.setup.multi_sampler or run.setup.sampler,
                      run.setup.model_state(rs.train.params), run.data, run.c,
                      run.eval_batch_size, step=rs.step, probe=True)
  if run.c.keep_best_eval and m["eval_accuracy"] > rs.best_eval.get("eval_accuracy", -1):
    keep_best(run, rs, m["eval_accuracy"])
  run.say(progress.eval_line(rs.step, m, seconds=time.perf_counter() - t0,
                             num_prompts=len(run.data.eval), samples=run.c.eval_samples))
  return (m, first) if probe else m


PROBE_FILE = "probe.npz"


def _probe_logprobs(run: Runner, params, probe: dict) -> np.ndarray:
  """log π(y_t) [R,T] of the probe's tokens under `params` (the raw model: temperature 1)."""
  score = run.setup.scorer(entropy=False, tempered=False)
  dev = parallel.shard_batch({"tokens": probe["tokens"],
                              "attn_mask": probe["prompt_mask"] | probe["response_mask"]},
                             run.mesh)
  return np.asarray(parallel.to_host(score(params, dev["tokens"], dev["attn_mask"])[0]))


def keep_best(run: Runner, rs: RunState, accuracy: float) -> None:
  """Exports the policy to <workdir>/best_policy (+ best.json: step, eval_accuracy) and
  records it in `rs.best_eval`: the best held-out greedy accuracy so far, step 0 (the start)
  included, the earliest step on ties (checkpoint-level selection, BeamPERL)."""
  s, out = run.setup, os.path.join(run.workdir, "best_policy")
  # New Variables over the same arrays: the export merges LoRA into its model in place.
  model = train.merge_model(s.graphdef, jax.tree.map(lambda x: x, rs.train.params), s.rest)
  export_policy(model, run.mcfg, out, init_from=run.c.init_from, tokenizer=run.data.tokenizer)
  rs.best_eval = {"step": rs.step, "eval_accuracy": float(accuracy)}
  if run.is_main:
    reporting.write_text_atomic(os.path.join(out, "best.json"), json.dumps(rs.best_eval))


@dataclasses.dataclass
class Outputs:
  """Process 0's run files and wall clock.

  metrics: metrics.jsonl (+ TensorBoard). samples: samples.jsonl. t0: `time.perf_counter()`
  when this process's `run` began. offset: the wall time the rows kept from earlier runs in
  the workdir had reached (the restored step's; 0 for a fresh run), so `wall_time()` counts
  the whole run across resumes (less the work lost after the restored checkpoint).
  """
  metrics: reporting.MetricsWriter
  samples: reporting.SamplesWriter
  t0: float
  offset: float = 0.0

  @classmethod
  def open(cls, workdir: str, *, resume_step: int | None, t0: float) -> Outputs:
    metrics = reporting.MetricsWriter(workdir, resume_step=resume_step)
    samples = reporting.SamplesWriter(workdir, resume_step=resume_step)
    kept = reporting.read_metrics(metrics.path) if resume_step is not None else []
    offset = max((float(r["wall_time"]) for r in kept if "wall_time" in r), default=0.0)
    return cls(metrics, samples, t0, offset)

  def wall_time(self) -> float:
    return self.offset + time.perf_counter() - self.t0

  def close(self) -> None:
    self.metrics.close()
    self.samples.close()


def record(run: Runner, rs: RunState, metrics: dict, out: Outputs | None, bar) -> None:
  """After a step: progress (the bar, or a plain line every `c.log_every` steps), periodic eval
  (one line), metrics row (with `wall_time`), sampled rollouts, checkpoint, the test kill
  hook."""
  c, done = run.c, rs.step
  bar.update(done, metrics)
  if c.eval_every and (done % c.eval_every == 0 or done == c.steps):
    t0 = time.perf_counter()
    metrics.update(_evaluate(run, rs))
    metrics["eval_time"] = time.perf_counter() - t0
  if out:
    out.metrics.write(done, dict(metrics, wall_time=out.wall_time()))
    out.samples.write(rs.samples)
  if c.checkpoint_every and (done % c.checkpoint_every == 0 or done == c.steps):
    save(run, rs)
  if done == c.kill_at_step:
    os.kill(os.getpid(), signal.SIGKILL)


def finish(run: Runner, rs: RunState, out: Outputs | None) -> dict[str, Any]:
  """Export and the heatmap's advantages to the host (every process takes part: both gather
  across processes), then plots and summary on process 0."""
  run.ckpt.close()
  c, s = run.c, run.setup
  change = None  # the probe's log-probs now, before the export merges LoRA into the weights
  if rs.probe is not None and rs.step > 0:
    change = dict(rs.probe, logprob_end=_probe_logprobs(run, rs.train.params, rs.probe))
  if c.export_hf:
    export_policy(train.merge_model(s.graphdef, rs.train.params, s.rest), run.mcfg,
                  os.path.join(run.workdir, "hf_policy"), init_from=c.init_from,
                  tokenizer=run.data.tokenizer)
  heatmap = rs.heatmap
  if heatmap is not None:
    heatmap = heatmap._replace(adv=np.asarray(parallel.to_host(heatmap.adv)))
  if not out:
    return {}
  out.close()
  try:
    family = credit.get_estimator(c.estimator).family
  except (KeyError, ValueError):
    family = ""
  result = reporting.write_run_report(run.workdir, c, run.data.tokenizer, heatmap,
                                      change=change, step=rs.step, family=family,
                                      memory_plan=run.memory_plan)
  first, last = result["eval_accuracy_first"], result["eval_accuracy_last"]
  evals = ("" if first is None else f": held-out accuracy {first:.3f} -> {last:.3f} (best "
           f"{result['eval_accuracy_best']:.3f} at step {result['eval_best_step']})")
  run.say(f"done at step {rs.step} in {progress.duration(out.wall_time())}{evals}; summary.md, "
          f"curves.png and log.txt in {run.workdir}")
  if run.log is not None:
    run.log.close()
  return result


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains `config` into `workdir`; returns the final summary dict.

  The step-0 row of metrics.jsonl (fresh runs) holds the starting policy's evaluation, its
  `eval_time`, the `warm_up_time` (SFT warm-up and step-0 checkpoint) and `wall_time`.
  """
  t_start = time.perf_counter()
  runner, rs = setup(config, workdir)
  t0 = time.perf_counter()
  rs = restore_or_warm_up(runner, rs)
  warm_up_time = time.perf_counter() - t0
  resumed = rs.step > 0
  out = (Outputs.open(workdir, resume_step=rs.step if resumed else None, t0=t_start)
         if runner.is_main else None)
  if not resumed:
    t0 = time.perf_counter()
    ev, first = _evaluate(runner, rs, probe=True)
    ev["eval_time"] = time.perf_counter() - t0
    if out:
      out.metrics.write(0, dict(ev, warm_up_time=warm_up_time, wall_time=out.wall_time()))
    rs.probe = _start_probe(runner, rs, first)
  else:
    rs.probe = reporting.read_npz(os.path.join(workdir, PROBE_FILE))
  bar = progress.ProgressBar(config.steps, initial=rs.step, desc="RL",
                             disable=None if config.progress else True,
                             every=config.get("log_every", 0), log=runner.log,
                             line_fields=progress.RL_LINE_FIELDS, quiet=not runner.is_main)
  while rs.step < config.steps:
    rs, metrics = rl_step(runner, rs)
    record(runner, rs, metrics, out, bar)
  bar.close()
  return finish(runner, rs, out)


def _start_probe(run: Runner, rs: RunState, first: dict | None) -> dict | None:
  """A fresh run's probe: the step-0 evaluation's first batch (`first`) with its log-probs
  under the starting policy, saved to <workdir>/probe.npz for a resumed run; None (and no
  file) for multi-turn tasks or a run without RL steps."""
  path = os.path.join(run.workdir, PROBE_FILE)
  if first is None or not run.c.steps:
    if run.is_main and os.path.exists(path):
      os.remove(path)
    return None
  probe = dict(first, logprob_start=_probe_logprobs(run, rs.train.params, first))
  if run.is_main:
    reporting.write_npz_atomic(path, probe)
  return probe


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "generation_config.json", "vocab.json", "merges.txt")


def export_policy(model: Decoder, mcfg: ModelConfig, out_dir: str, *, init_from: str = "",
                  tokenizer: Any = None) -> None:
  """The trained policy as a Hugging Face directory (LoRA merged): safetensors + config.json,
  plus the tokenizer files of `init_from` when the policy came from a checkpoint, or the
  character tokenizer's identity (`producers.CHAR_TOKENIZER_FILE`) when it did not, so that a
  distillation run can check a teacher's tokenizer against its student's."""
  from credit import models
  models.save_pretrained(models.merge_lora(model, inplace=True), mcfg.replace(remat=False), out_dir)
  if (not init_from and isinstance(tokenizer, tasks_lib.CharTokenizer)
      and jax.process_index() == 0):
    with open(os.path.join(out_dir, producers.CHAR_TOKENIZER_FILE), "w") as f:
      json.dump({"chars": tokenizer.chars}, f)
  if init_from and jax.process_index() == 0:
    for name in TOKENIZER_FILES:
      src = os.path.join(init_from, name)
      if os.path.exists(src):
        shutil.copyfile(src, os.path.join(out_dir, name))
