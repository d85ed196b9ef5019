"""The RL training loop: orchestration only; every array step is a jitted pure function.

`run(config, workdir)` validates everything (estimator inputs, data fields,
model path, mesh) before it writes a single file, then: builds the task data
and policy, optionally runs the supervised warm-up, restores the latest
complete checkpoint if there is one, and runs RL steps with periodic eval,
checkpoints, metrics, plots and a summary.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

import credit
from credit import parallel
from credit import tasks as tasks_lib
from credit.models import ModelConfig, Decoder
from experiments import train


class SetupError(ValueError):
  """A configuration the loop cannot run; raised before any output is written."""


# --------------------------------------------------------------------------
# Validation and construction (no files written here).
# --------------------------------------------------------------------------


def check_method(c: ml_collections.ConfigDict):
  """Registry lookups and a refusal for inputs this loop cannot produce."""
  est = credit.get_estimator(c.estimator)
  loss = credit.get_policy_loss(c.policy_loss)
  for kind, spec in (("estimator", est), ("policy loss", loss)):
    produced = train.LOOP_FIELDS | ({"advantages"} if kind == "policy loss" else set())
    needs = spec.needs_for(dict(c.estimator_kwargs)) if kind == "estimator" else spec.needs
    missing = sorted(set(needs) - produced)
    if missing:
      raise SetupError(
          f"{kind} {spec.name!r} needs {missing}, which this single-turn loop cannot produce "
          f"(it produces {sorted(train.LOOP_FIELDS)}); use a recipe with an environment or "
          f"critic that provides them")
  if c.logprob_old_source not in ("recompute", "sampler"):
    raise SetupError(f"logprob_old_source={c.logprob_old_source!r}; valid: 'recompute', 'sampler'")
  return est, loss


@dataclasses.dataclass
class Data:
  task: Any
  tokenizer: Any
  train: list[dict]
  eval: list[dict]
  max_prompt_len: int
  max_response_len: int


def build_data(c: ml_collections.ConfigDict) -> Data:
  """Task, tokenizer and the train / held-out examples (deterministic in c.seed)."""
  tok = tasks_lib.CharTokenizer()
  if c.task in ("jsonl", "tfds"):
    if not c.data_path:
      raise SetupError(f"task={c.task!r} needs --config.data_path")
    if c.task == "jsonl":
      if not os.path.exists(c.data_path):
        raise SetupError(f"data_path {c.data_path!r} does not exist")
      examples = tasks_lib.load_jsonl(c.data_path, prompt_field=c.prompt_field,
                                      answer_field=c.answer_field)
    else:
      examples = tasks_lib.load_tfds(c.data_path, "train", c.data_dir or None,
                                     prompt_field=c.prompt_field, answer_field=c.answer_field)
    task = tasks_lib.MathVerifier()
    n_eval = min(c.num_eval_examples, max(1, len(examples) // 10))
    train_ex, eval_ex = examples[n_eval:], examples[:n_eval]
    train_ex = [dict(e, index=i) for i, e in enumerate(train_ex)]
  else:
    task = tasks_lib.get_task(c.task, **dict(c.task_kwargs))
    train_ex = task.generate(np.random.default_rng(c.seed), c.num_train_examples)
    for i, e in enumerate(train_ex):
      e["index"] = i  # stable prompt id (keys per-prompt estimator state, e.g. DCPO)
    eval_ex = task.generate(np.random.default_rng(10_000 + c.seed), c.num_eval_examples)
  # +1 for bos; responses get +1 for eos.
  max_prompt = max(len(tok.encode(e["prompt"])) for e in train_ex + eval_ex) + 1
  return Data(task, tok, train_ex, eval_ex, max_prompt, c.max_new_tokens)


def build_model_config(c: ml_collections.ConfigDict, tok) -> ModelConfig:
  m = c.model
  return ModelConfig(vocab_size=tok.vocab_size, hidden_size=m.hidden_size,
                     intermediate_size=m.intermediate_size, num_layers=m.num_layers,
                     num_heads=m.num_heads, num_kv_heads=m.num_kv_heads, head_dim=m.head_dim,
                     rope_theta=m.rope_theta, family=m.family, qk_norm=m.family == "qwen3",
                     qkv_bias=m.family == "qwen2", tie_embeddings=False,
                     eos_token_id=tok.eos_id, pad_token_id=tok.pad_id, bos_token_id=tok.bos_id,
                     remat=bool(m.remat))


def build_policy(c: ml_collections.ConfigDict, tok, mesh) -> tuple[Decoder, ModelConfig]:
  """A tiny from-scratch policy, or `from_pretrained(c.init_from)` (+ LoRA)."""
  from credit import models
  if c.init_from:
    if not os.path.isdir(c.init_from):
      raise SetupError(f"init_from={c.init_from!r} is not a directory")
    if not os.path.exists(os.path.join(c.init_from, "config.json")):
      raise SetupError(f"init_from={c.init_from!r} has no config.json")
    if not any(f.endswith(".safetensors") for f in os.listdir(c.init_from)):
      raise SetupError(f"init_from={c.init_from!r} has no *.safetensors weights")
    model, mcfg = models.from_pretrained(c.init_from, mesh=mesh, remat=bool(c.model.remat))
  else:
    mcfg = build_model_config(c, tok)
    with jax.set_mesh(mesh):
      model = Decoder(mcfg, rngs=nnx.Rngs(c.seed))
  if c.lora_rank:
    model = models.apply_lora(model, rank=c.lora_rank, alpha=c.lora_alpha,
                              targets=tuple(c.lora_targets), rngs=nnx.Rngs(c.seed + 1))
  return model, mcfg


# --------------------------------------------------------------------------
# The run.
# --------------------------------------------------------------------------


def _key_data(seed: int) -> jax.Array:
  return jax.random.key_data(jax.random.key(seed))


class _Timer:
  """Accumulates wall time per phase (block_until_ready is the caller's job)."""

  def __init__(self):
    self.t: dict[str, float] = {}

  def add(self, name: str, start: float) -> float:
    now = time.perf_counter()
    self.t[name] = self.t.get(name, 0.0) + now - start
    return now


def _sft_batches(data: Data, c, rng: np.random.Generator):
  """Demonstration batches (prompt + correct response) for supervised warm-up."""
  n = len(data.train)
  while True:
    idx = rng.integers(0, n, size=c.sft_batch_size)
    ex = [data.train[i] for i in idx]
    demos = [data.task.demonstration(e) for e in ex]
    b = tasks_lib.encode_prompt_response(data.tokenizer, [e["prompt"] for e in ex], demos,
                                         data.max_prompt_len, data.max_response_len)
    yield {"tokens": b["tokens"], "attn_mask": b["prompt_mask"] | b["response_mask"],
           "response_mask": b["response_mask"]}


def evaluate(sampler, model_state, data: Data, c, batch_size: int) -> dict[str, float]:
  """Greedy decoding on the held-out split: accuracy and mean reward."""
  rewards = []
  ex = data.eval
  for i in range(0, len(ex), batch_size):
    chunk = ex[i:i + batch_size]
    pad = batch_size - len(chunk)
    prompts = [e["prompt"] for e in chunk] + [chunk[-1]["prompt"]] * pad
    toks, mask = tasks_lib.encode_prompts(data.tokenizer, prompts, data.max_prompt_len)
    out = sampler(model_state, prompt_tokens=toks, prompt_mask=mask, key=jax.random.key(0),
                  max_new_tokens=c.max_new_tokens, temperature=0.0)
    host = parallel.to_host({"tokens": out.tokens, "response_mask": out.response_mask})
    texts = tasks_lib.decode_responses(data.tokenizer, host["tokens"], host["response_mask"])
    rewards.append(tasks_lib.verify_batch(data.task, chunk, texts[:len(chunk)]))
  r = np.concatenate(rewards)
  return {"eval_accuracy": float(np.mean(r >= 1.0)), "eval_reward": float(np.mean(r))}


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains `config` into `workdir`; returns the final summary dict."""
  c = config
  # ---- 1. everything that can be refused is checked before any file is written ----
  est_spec, loss_spec = check_method(c)
  data = build_data(c)
  mesh = parallel.make_mesh(c.mesh)
  N, G = c.prompts_per_step, c.group_size
  B = N * G
  div = parallel.batch_divisor(mesh)
  if B % (c.num_minibatches * div):
    raise SetupError(f"prompts_per_step*group_size={B} must be divisible by num_minibatches "
                     f"({c.num_minibatches}) x the mesh's batch-parallel size ({div})")
  model, mcfg = build_policy(c, data.tokenizer, mesh)
  from credit.models import lora_trainable_mask, shard_model
  shard_model(model, mesh)
  est_needs = est_spec.needs_for(dict(c.estimator_kwargs))  # + optional inputs switched on
  dummy = {n: None for n in est_needs}
  _, est_static = train.estimator_arguments(est_spec, dummy, dict(c.estimator_kwargs),
                                            num_groups=N, group_size=G)
  loss_kwargs = {k: (tuple(v) if isinstance(v, list) else v) for k, v in dict(c.loss_kwargs).items()}
  import inspect
  loss_params = inspect.signature(loss_spec.fn).parameters
  for k in loss_kwargs:
    if k not in loss_params:
      raise SetupError(f"policy loss {loss_spec.name!r} has no argument {k!r}; valid: "
                       f"{[p for p in loss_params if p not in loss_spec.needs]}")
  need_ref = c.kl_coef != 0.0 or "logprob_ref" in est_needs or "logprob_ref" in loss_spec.needs
  if c.scoring_chunk_size < 0:
    raise SetupError(f"scoring_chunk_size={c.scoring_chunk_size} must be >= 0 (0 = auto)")
  chunk = c.scoring_chunk_size or None  # None: credit.scoring.auto_chunk_size
  # ---- 2. outputs ----
  from experiments import checkpointing, reporting
  os.makedirs(workdir, exist_ok=True)
  is_main = jax.process_index() == 0
  graphdef, params, rest = train.split_model(model)
  from credit.sampling import Sampler
  sampler = Sampler(model, pad_id=data.tokenizer.pad_id, stop_tokens=(data.tokenizer.eos_id,))
  model_state = lambda p: nnx.merge_state(p, rest)
  trainable = lora_trainable_mask(params) if c.lora_rank else None
  tx = train.make_optimizer(learning_rate=c.learning_rate, total_steps=c.steps,
                            warmup_steps=c.warmup_steps, weight_decay=c.weight_decay,
                            grad_clip=c.grad_clip, trainable=trainable)
  est_state = None
  if est_spec.stateful:
    init = getattr(__import__(est_spec.fn.__module__, fromlist=["_"]), f"{est_spec.name}_init_state")
    est_state = init(len(data.train))
  rep = parallel.replicated(mesh)
  p_sh, o_sh = train.state_shardings(tx, params, tx.init(params), mesh)
  params = jax.device_put(params, p_sh)
  place_opt = jax.jit(tx.init, out_shardings=o_sh)
  state = train.TrainState(step=jax.device_put(jnp.zeros((), jnp.int32), rep), params=params,
                           opt_state=place_opt(params), key=jax.device_put(_key_data(c.seed), rep),
                           estimator_state=jax.device_put(est_state, rep))
  st_sh = train.TrainState(step=rep, params=p_sh, opt_state=o_sh, key=rep,
                           estimator_state=jax.tree.map(lambda _: rep, est_state))
  ckpt_state = {"train": state, "ref_params": params if need_ref else None}
  ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"),
                                    max_to_keep=c.keep_checkpoints)
  restored = ckpt.restore_latest(checkpointing.abstract_like(ckpt_state))
  loader = tasks_lib.make_loader(data.train, N, seed=c.seed)
  timer = _Timer()
  if restored is not None:
    state, ref_params = restored.state["train"], restored.state["ref_params"]
    loader.set_state(restored.meta["loader"])
    start = int(state.step)
    print(f"[credit] resumed from step {start} in {ckpt.directory}")
  else:
    start = 0
    if c.sft_steps:
      sft_tx = train.make_optimizer(learning_rate=c.sft_learning_rate, total_steps=c.sft_steps,
                                    warmup_steps=min(10, c.sft_steps // 10),
                                    weight_decay=0.0, grad_clip=c.grad_clip, trainable=trainable)
      _, so_sh = train.state_shardings(sft_tx, params, sft_tx.init(params), mesh)
      sft_step = jax.jit(train.make_sft_step(graphdef, rest, sft_tx, chunk),
                         out_shardings=(p_sh, so_sh, rep), donate_argnums=(0, 1))
      p = jax.tree.map(jnp.copy, params)
      o = jax.jit(sft_tx.init, out_shardings=so_sh)(params)
      batches = _sft_batches(data, c, np.random.default_rng(c.seed + 7))
      t0 = time.perf_counter()
      for i in range(c.sft_steps):
        p, o, m = sft_step(p, o, parallel.shard_batch(next(batches), mesh))
      jax.block_until_ready(p)
      timer.add("sft", t0)
      state = state.replace(params=p, opt_state=place_opt(p))
      print(f"[credit] SFT warm-up: {c.sft_steps} steps, loss {float(m['sft_loss']):.4f}, "
            f"{timer.t['sft']:.1f}s")
    # A copy: the update donates state.params, which would delete buffers shared with it.
    ref_params = jax.tree.map(jnp.copy, state.params) if need_ref else None
    ckpt.save(0, state={"train": state, "ref_params": ref_params},
              meta={"loader": loader.get_state()}, force=True)
  # ---- 3. jitted steps ----
  scorer = jax.jit(train.make_scorer(graphdef, rest, chunk))
  need_spi = "sum_pi_squared" in est_needs  # Σπ² of the behaviour policy (OTB), same pass
  policy_scorer = (jax.jit(train.make_scorer(graphdef, rest, chunk, sum_pi_squared=True))
                   if need_spi else scorer)
  adv_fn = jax.jit(train.make_advantage_fn(est_spec, est_static),
                   out_shardings=(parallel.batch_sharding(mesh, 2), st_sh.estimator_state))
  update = jax.jit(train.make_rl_update(
      graphdef, rest, tx, loss_spec=loss_spec, loss_kwargs=loss_kwargs, kl_coef=c.kl_coef,
      kl_kind=c.kl_kind, entropy_coef=c.entropy_coef, ppo_epochs=c.ppo_epochs,
      num_minibatches=c.num_minibatches, chunk_size=chunk),
      out_shardings=(st_sh, rep), donate_argnums=(0,))
  metrics_writer = reporting.MetricsWriter(workdir, resume_step=start if restored else None) \
      if is_main else None
  bar = reporting.ProgressBar(c.steps, initial=start, disable=None if c.progress else True)
  eval_bs = min(128, max(div, len(data.eval)))
  eval_bs -= eval_bs % div
  heat = None
  if start == 0:
    ev = evaluate(sampler, model_state(state.params), data, c, eval_bs)
    if metrics_writer:
      metrics_writer.write(0, ev)
    print(f"[credit] step 0 eval_accuracy {ev['eval_accuracy']:.3f}")
  for step in range(start, c.steps):
    timer.t.clear()
    t0 = t_step = time.perf_counter()
    key = jax.random.fold_in(jax.random.wrap_key_data(_key_data(c.seed)), step)
    ex = loader.next() if hasattr(loader, "next") else next(loader)
    prompts = ex["prompt"]
    toks, pmask = tasks_lib.encode_prompts(data.tokenizer, prompts, data.max_prompt_len)
    out = sampler(model_state(state.params), prompt_tokens=toks, prompt_mask=pmask,
                  key=jax.random.fold_in(key, 0), max_new_tokens=c.max_new_tokens,
                  num_samples=G, temperature=c.temperature, top_k=c.top_k, top_p=c.top_p)
    host = parallel.to_host({"tokens": out.tokens, "response_mask": out.response_mask,
                             "prompt_mask": out.prompt_mask})
    t0 = timer.add("sampling", t0)
    texts = tasks_lib.decode_responses(data.tokenizer, host["tokens"], host["response_mask"])
    rep = [{k: ex[k][i] for k in ex} for i in range(N) for _ in range(G)]
    reward = tasks_lib.verify_batch(data.task, rep, texts)
    t0 = timer.add("reward", t0)
    attn = host["prompt_mask"] | host["response_mask"]
    arrays = parallel.shard_batch({"tokens": host["tokens"], "attn_mask": attn,
                                   "response_mask": host["response_mask"], "reward": reward,
                                   "group_id": np.repeat(np.arange(N, dtype=np.int32), G)}, mesh)
    lp_cur, ent, *spi = policy_scorer(state.params, arrays["tokens"], arrays["attn_mask"])
    if c.logprob_old_source == "sampler":
      lp_old = jnp.where(arrays["response_mask"], out.logprob_raw, 0.0)
    else:
      lp_old = lp_cur
    fields = dict(arrays, logprob=lp_cur, logprob_old=lp_old, entropy=ent,
                  logprob_sampler=out.logprob_sampler,
                  obs_mask=jnp.zeros_like(arrays["response_mask"]),
                  turn_id=jnp.where(arrays["response_mask"], 0, -1).astype(jnp.int32),
                  prompt_id=jnp.asarray(np.repeat(np.asarray(ex.get("index", np.arange(N))), G),
                                        jnp.int32))
    if "reward_baseline" in est_needs:  # ReMax: reward of the greedy response per prompt
      greedy = sampler(model_state(state.params), prompt_tokens=toks, prompt_mask=pmask,
                       key=key, max_new_tokens=c.max_new_tokens, temperature=0.0)
      gh = parallel.to_host({"tokens": greedy.tokens, "response_mask": greedy.response_mask})
      gtexts = tasks_lib.decode_responses(data.tokenizer, gh["tokens"], gh["response_mask"])
      base = tasks_lib.verify_batch(data.task, [{k: ex[k][i] for k in ex} for i in range(N)],
                                    gtexts)
      fields["reward_baseline"] = parallel.shard_batch(np.repeat(base, G), mesh)
    if need_ref:
      fields["logprob_ref"], _ = scorer(ref_params, arrays["tokens"], arrays["attn_mask"])
    if need_spi:
      fields["sum_pi_squared"] = spi[0]
    jax.block_until_ready(fields["logprob_old"])
    t0 = timer.add("scoring", t0)
    est_arrays = {n: fields[n] for n in est_needs
                  if n in inspect.signature(est_spec.fn).parameters}
    adv, new_est_state = adv_fn(est_arrays, state.estimator_state)
    batch = {"tokens": arrays["tokens"], "attn_mask": arrays["attn_mask"],
             "response_mask": arrays["response_mask"], "advantages": adv,
             "logprob_old": fields["logprob_old"]}
    for extra in ("logprob_ref", "group_id"):
      if extra in fields and (extra in loss_params or (extra == "logprob_ref" and c.kl_coef)):
        batch[extra] = fields[extra]
    if c.importance_correction:  # truncated IS against the sampler's own log-probs
      batch["logprob_sampler"] = fields["logprob_sampler"]
    state = state.replace(estimator_state=new_est_state)
    state, upd_metrics = update(state, batch)
    jax.block_until_ready(state.params)
    t0 = timer.add("update", t0)
    step_time = time.perf_counter() - t_step
    resp_len = host["response_mask"].sum(-1)
    m = {k: float(v) for k, v in jax.device_get(upd_metrics).items()}
    m.update(reward_mean=float(reward.mean()), accuracy=float(np.mean(reward >= 1.0)),
             response_length=float(resp_len.mean()),
             adv_abs_mean=float(jnp.sum(jnp.abs(adv)) / max(1, int(resp_len.sum()))),
             step_time=step_time, **{f"time_{k}": v for k, v in timer.t.items()})
    m["time_overhead"] = step_time - sum(timer.t[k] for k in ("sampling", "scoring", "update"))
    done = step + 1
    if c.eval_every and (done % c.eval_every == 0 or done == c.steps):
      m.update(evaluate(sampler, model_state(state.params), data, c, eval_bs))
    if metrics_writer:
      metrics_writer.write(done, m)
    bar.update(done, m)
    if c.checkpoint_every and (done % c.checkpoint_every == 0 or done == c.steps):
      ckpt.save(done, state={"train": state, "ref_params": ref_params},
                meta={"loader": loader.get_state()}, force=True)
    heat = (host, texts, np.asarray(parallel.to_host(adv)), reward)
    if done == c.kill_at_step:
      os.kill(os.getpid(), signal.SIGKILL)
  bar.close()
  ckpt.close()
  if c.export_hf:  # every process takes part (save_pretrained all-gathers); process 0 writes
    export_policy(train.merge_model(graphdef, state.params, rest), mcfg,
                  os.path.join(workdir, "hf_policy"), init_from=c.init_from)
  summary = {}
  if is_main and metrics_writer:
    metrics_writer.close()
    summary = _finish_outputs(workdir, c, data, heat, reporting)
  return summary


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "generation_config.json", "vocab.json", "merges.txt")


def export_policy(model: Decoder, mcfg: ModelConfig, out_dir: str, *, init_from: str = "") -> None:
  """The trained policy as a Hugging Face directory (LoRA merged): safetensors + config.json,
  plus the tokenizer files of `init_from` when the policy came from a checkpoint."""
  from credit import models
  models.save_pretrained(models.merge_lora(model, inplace=True), mcfg.replace(remat=False), out_dir)
  if init_from and jax.process_index() == 0:
    for name in TOKENIZER_FILES:
      src = os.path.join(init_from, name)
      if os.path.exists(src):
        shutil.copyfile(src, os.path.join(out_dir, name))


def _finish_outputs(workdir, c, data: Data, heat, reporting) -> dict[str, Any]:
  """Plots, token-credit heatmap and summary table from what the run wrote."""
  path = os.path.join(workdir, "metrics.jsonl")
  reporting.plot_curves(path, os.path.join(workdir, "curves.png"),
                        keys=("reward_mean", "accuracy", "eval_accuracy", "loss", "step_time"))
  if heat is not None:
    host, texts, adv, reward = heat
    rows = list(range(min(c.num_heatmap_samples, len(texts))))
    toks, advs, labels = [], [], []
    for i in rows:
      m = host["response_mask"][i]
      ids = host["tokens"][i][m]
      toks.append(["<eos>" if int(t) == data.tokenizer.eos_id else
                   (data.tokenizer.decode([int(t)]) or f"<{int(t)}>") for t in ids])
      advs.append(adv[i][m])
      labels.append(f"r={reward[i]:.0f}")
    reporting.plot_token_credit(os.path.join(workdir, "token_credit.png"), toks, advs,
                                labels=labels, title=f"{c.estimator}: per-token advantages")
  rows = reporting.read_metrics(path)
  keys = ["reward_mean", "accuracy", "eval_accuracy", "loss", "step_time"]
  table = reporting.summary_table(rows, [k for k in keys if any(k in r for r in rows)])
  reporting.write_text_atomic(os.path.join(workdir, "summary.md"),
                              f"# {c.estimator} / {c.policy_loss} on {c.task}\n\n{table}\n")
  evals = [r["eval_accuracy"] for r in rows if "eval_accuracy" in r]
  return {"eval_accuracy_first": evals[0] if evals else None,
          "eval_accuracy_last": evals[-1] if evals else None, "rows": len(rows)}
