"""Credit-assignment benchmark: every registered estimator against exact token advantages.

  python -m benchmarks.credit_bench [--quick] [--only grpo,rloo] [--tasks pivotal,distractor]
                                    [--out credit_bench] [--seeds 3] [--no-learning]
                                    [--workdir DIR] [--resume] [--merge OLD/results.csv]
  python -m benchmarks.credit_bench --tables --out DIR [--tasks distractor]
                                    [--add NEW/results.csv,NEW/learning.csv]

On bifurcation tasks (`credit/tasks/bifurcation.py`, `credit/tasks/pivotal.py`) the response
positions that decide the reward are known, and `credit.bench.true_advantages` computes each
sampled token's true advantage Q(s,a) − V(s) under the policy that sampled it. On the
multi-turn `pivot_turn` (`credit/envs/pivot_turn.py`: K questions over K turns, one of which
decides the reward) the rollouts are the runner's environment episodes and
`credit.bench.true_turn_advantages` gives the truth on the policy's tokens (observations get
none); the turn-level estimators (`Settings.multi_turn_estimators` in --quick, every
registered one otherwise) are scored there with the fields the runner's producers make (per-turn
rewards and progress from the environment, the gold pass). Per task:

1. Policy snapshots. A supervised warm-up gives the start; GRPO trains from it, and the
   parameters after 0, `snapshot_steps/2` and `snapshot_steps` RL steps are the early, middle
   and late snapshots every estimator is scored on.
2. Credit quality. For each snapshot, `batches` rollout batches (fixed prompts and keys) are
   sampled through the runner's own rollout producer; every estimator then makes its
   advantages on exactly those rollouts (checked), with the fields its plan needs made by the
   runner's producers (`experiments/producers/`; the reference policy is the warm-up, as in
   a run; a trained producer such as an implicit PRM or a critic starts from the snapshot,
   untrained — its learning shows in part 3; a stateful estimator, e.g. `dcpo` or `serene`,
   is scored from its initial state on every batch, as at a run's first step). Metrics
   (`credit.bench.credit_metrics`): correlation with the true advantages, share of |A| on
   pivotal tokens (next to chance and the true advantages' own share), balanced sign accuracy
   at pivotal tokens, shares of zero tokens and zero groups; mean and spread over snapshots ×
   batches. Two reference rows: `oracle` (the true advantages) and `constant` (1 on every
   response token).
3. Learning. Every estimator the loop can run trains from the same warm-up (its own,
   `learn_sft_steps`, in the full settings: one that leaves RL room to learn) for `learn_steps`
   steps with the default policy loss (so only the credit differs), `seeds` seeds; held-out
   greedy accuracy is recorded against steps and wall time; reported: final accuracy, area
   under the curve and steps to `threshold`, each with a bootstrap interval over seeds.
   A learning reference, `grpo@pivot` (the full settings' `learn_references`): GRPO with
   its advantages kept on the task's deciding tokens (`credit_mask=decision_mask`), what
   perfect placement of GRPO's credit gives; `--only NAME@pivot` runs any estimator so.

Estimators whose inputs the bench cannot produce on a task (multi-turn fields on a single-turn
task, tree rollouts, a teacher checkpoint...) are listed in skipped.md with the runner's reason.

Outputs in --out: results.csv (task, estimator, family, part, metric, mean, lo, hi, n),
table.md (per task, every metric with intervals), summary.md (one line per estimator across
tasks: the README's table), skipped.md, learning.csv (every eval point of every run, written
after each finished run; `--resume` keeps the finished ones, so the hours-long full learning
part can be run in pieces: same --out, same settings), learning_<task>.md (the learning
part's table, by `--tables`), bars_<task>.png (metrics
with intervals), curves_<task>.png (learning curves), heatmap_<task>.png (one batch under each
estimator next to the truth). `--quick` (one task, a few estimators, 2 snapshots, GRPO's learning
curve over 3 seeds of a few steps) takes about 2 minutes on 2 CPU cores; notebooks/estimator_gallery.ipynb runs it.
`--tables` runs nothing: it rebuilds --out's tables and plots (not the heatmaps) from its
results.csv and learning.csv, after folding in follow-up `--only` runs made into their own
--out (`--add NEW/results.csv,NEW/learning.csv`: their (task, estimator) pairs replace the
old ones, and NEW/skipped.md's entries those of skipped.md), and recomputes results.csv's
learning rows from learning.csv, so a full run made in pieces ends as one directory.
`--quick --tasks pivot_turn` does the same on the multi-turn task, with igpo, a2tgpo, procredit
and mapo besides (about 1.5 minutes).
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
import types
from typing import Any, Iterable, Mapping, Sequence

if __package__ in (None, ""):  # `python benchmarks/credit_bench.py` as well as `-m`
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

import credit
from credit import bench
from credit import tasks as tasks_lib
from experiments import loop, producers, reporting, train
from experiments.configs import common

# Tasks and their settings: short responses, so a small model learns them after a short
# warm-up and the exact last-step values stay cheap.
TASK_KWARGS = {
    "pivotal": {"response_len": 6},
    "pivotal_and": {"response_len": 6},
    "pivotal_or": {"response_len": 6},
    "distractor": {"response_len": 6},
    "delayed": {},
    "pivot_turn": {},  # multi-turn: K = 3 questions, one decides (credit/envs/pivot_turn.py)
}
REFERENCES = ("oracle", "constant")
# Tree estimators (parent_id / prefix_len) are scored on tree batches of the same snapshots;
# these are scored there too, named with the suffix, as their baselines.
TREE = "@tree"
TREE_BASELINES = ("oracle", "grpo")
# A learning reference "<estimator>@pivot": the estimator's advantages kept on the task's
# deciding tokens only (`credit_mask=decision_mask`), the learning that perfect placement of
# its credit would give; learnt only (its credit part would be the oracle's placement).
PIVOT = "@pivot"
CREDIT_METRICS = ("corr", "pivot_mass", "sign_acc", "zero_tokens", "zero_groups")
# Multi-turn tasks also score at the turn level: each estimator's per-turn mean advantage
# against the true turn advantages (`bench.turn_credit_metrics`).
TURN_METRICS = ("turn_corr", "turn_pivot_mass", "turn_sign_acc")
LEARN_METRICS = ("final_accuracy", "auc", "steps_to_threshold")


LEARN_SFT_BY_TASK = (("distractor", 170), ("delayed", 120), ("pivotal_and", 105),
                     ("pivotal_or", 60), ("pivot_turn", 60))


@dataclasses.dataclass(frozen=True)
class Settings:
  """How much the bench runs (`QUICK` / `FULL`; command-line flags override)."""
  tasks: tuple[str, ...]
  estimators: tuple[str, ...] | None  # None: every registered estimator
  learn_estimators: tuple[str, ...] | None  # None: every estimator scored in part 2
  seeds: int
  sft_steps: int
  snapshot_steps: int
  num_snapshots: int
  batches: int
  num_rollouts: int
  learn_steps: int
  eval_every: int
  threshold: float
  prompts_per_step: int = 8
  group_size: int = 8
  hidden_size: int = 64
  num_layers: int = 2
  learning_rate: float = 3e-4
  teacher_sft_steps: int = 0  # > 0: a teacher (a longer warm-up) for the distillation methods
  # > 0: the learning runs start from a warm-up of their own with this many SFT steps (the
  # credit part keeps `sft_steps`): a start that leaves RL room to learn and shows it.
  learn_sft_steps: int = 0
  # Per task, the learning warm-up's SFT steps where `learn_sft_steps` would not fit (used only
  # when `learn_sft_steps` > 0). Calibrated like pivotal's 90 (held-out 0.27-0.39 over seeds
  # 0-2): distractor 90 / 150 / 170 / 200 / 300 steps give 0.13-0.22 / 0.11-0.28
  # / 0.28-0.47 / 0.58-0.73 / 1.00; delayed 90 / 120 / 150 give 0.17-0.23 / 0.20-0.41 /
  # 0.73-0.86; pivotal_and 90 / 105 / 120 / 150 give 0.08-0.20 / 0.27-0.44 / 0.33-0.44 /
  # 0.38-0.55; pivotal_or 60 / 75 / 90 / 150 give 0.22-0.41 / 0.48-0.59 / 0.52-0.67 /
  # 0.88-0.94; pivot_turn 60 / 90 give 0.28 / 0.20 / 0.33 and 1.00 on every
  # seed (so its learning starts from the credit part's 60-step warm-up).
  # Tasks not listed take `learn_sft_steps`.
  learn_sft_by_task: tuple[tuple[str, int], ...] = LEARN_SFT_BY_TASK
  # > 0: estimators that need branch fields are scored on tree batches (`tree_config`):
  # G/2 roots, `tree_points` branch points per prompt with `tree_branches` continuations each.
  tree_branches: int = 2
  tree_points: int = 2
  # Where the branch points go: "entropy" (the highest-entropy positions, as CBPO / TreeRL
  # branch) or "first_error" (a failed row's first wrong token: its wrong pivot).
  tree_criterion: str = "entropy"
  # Scored on multi-turn tasks besides `estimators` (when that is a list): the turn-level
  # estimators the runner's producers can feed there.
  multi_turn_estimators: tuple[str, ...] = ()
  # Learning references (`PIVOT`) run after the estimators on single-turn tasks.
  learn_references: tuple[str, ...] = ()


QUICK = Settings(tasks=("pivotal",), estimators=("grpo", "rloo", "dr_grpo", "gae"),
                 learn_estimators=("grpo",), seeds=3, sft_steps=300, snapshot_steps=4,
                 num_snapshots=2, batches=2, num_rollouts=8, learn_steps=4, eval_every=2,
                 threshold=0.5, prompts_per_step=4, group_size=8, hidden_size=32, num_layers=1,
                 multi_turn_estimators=("igpo", "a2tgpo", "procredit", "mapo"))
# The learning part (measured on pivotal, GRPO, 3 seeds): from the 60-step warm-up
# (0.02-0.05 held-out) RL does not move the policy (0.08 after 300 steps); from 115+ SFT steps
# the warm-up alone is at 0.95-1.0; from 90 steps (0.27-0.39) GRPO climbs to 0.53-0.64 in 750
# steps (no gain yet at 150). Hence its own 90-step warm-up, 750 steps and threshold 0.5.
FULL = Settings(tasks=tuple(TASK_KWARGS), estimators=None, learn_estimators=None, seeds=3,
                sft_steps=60, snapshot_steps=40, num_snapshots=3, batches=4, num_rollouts=32,
                learn_steps=750, eval_every=150, threshold=0.5, teacher_sft_steps=600,
                learn_sft_steps=90, learn_references=(f"grpo{PIVOT}",))


def base_config(task: str, s: Settings, seed: int = 0) -> ml_collections.ConfigDict:
  """The runner config every part of the bench starts from (GRPO, one device)."""
  c = common.base_config()
  c.task = task
  c.task_kwargs = dict(TASK_KWARGS.get(task, {}))
  c.seed = seed
  c.mesh = "data=1"
  c.estimator = "grpo"
  c.model.hidden_size = s.hidden_size
  c.model.intermediate_size = 4 * s.hidden_size
  c.model.num_layers = s.num_layers
  c.model.head_dim = s.hidden_size // 4
  c.prompts_per_step, c.group_size = s.prompts_per_step, s.group_size
  c.num_train_examples, c.num_eval_examples = 2000, 64
  t = tasks_lib.get_task(task, **c.task_kwargs)
  c.max_new_tokens = t.max_response_chars + 2
  if getattr(t, "multi_turn", False):  # every turn fits, and the budget never cuts an episode
    c.max_turns = t.max_turns
    c.max_action_tokens = t.max_action_chars + 1
    c.max_observation_tokens = t.max_observation_chars
    c.max_new_tokens = c.max_turns * (c.max_action_tokens + c.max_observation_tokens)
    c.gold_template = getattr(t, "gold_template", c.gold_template)
  c.sft_steps = s.sft_steps
  c.learning_rate = s.learning_rate
  c.steps = s.snapshot_steps
  c.eval_every, c.checkpoint_every, c.samples_every = 0, 0, 0
  c.progress = False
  return c


def warm_up(task: str, s: Settings, workdir: str, name: str = "warmup",
            sft_steps: int | None = None) -> str:
  """A supervised warm-up, exported (`steps=0`); returns its hf_policy directory. The
  shared start (`s.sft_steps`), or the distillation teacher (`s.teacher_sft_steps`)."""
  out = os.path.join(workdir, name)
  if not os.path.exists(os.path.join(out, "hf_policy", "config.json")):
    c = base_config(task, s)
    c.steps = 0
    if sft_steps is not None:
      c.sft_steps = sft_steps
    loop.run(c, out)
  return os.path.join(out, "hf_policy")


def learn_sft_steps(s: Settings, task: str) -> int:
  """SFT steps of the learning part's warm-up on `task` (0: it starts from the credit part's)."""
  if not s.learn_sft_steps:
    return 0
  return dict(s.learn_sft_by_task).get(task, s.learn_sft_steps)


def from_warm_start(c: ml_collections.ConfigDict, hf_dir: str) -> ml_collections.ConfigDict:
  c.warm_start_from, c.sft_steps = hf_dir, 0
  return c


# --------------------------------------------------------------------------
# Part 1: snapshots, and the shared rollout batches with their true advantages.
# --------------------------------------------------------------------------


def snapshots(task: str, s: Settings, hf_dir: str, workdir: str):
  """(runner, [(step, params)]): GRPO from the warm-up, parameters copied at the snapshot
  steps (0, ..., snapshot_steps evenly)."""
  c = from_warm_start(base_config(task, s), hf_dir)
  run, rs = loop.setup(c, os.path.join(workdir, "snapshots"))
  rs = loop.restore_or_warm_up(run, rs)
  at = sorted({int(round(x)) for x in np.linspace(0, s.snapshot_steps, s.num_snapshots)})
  out = []
  while True:
    if rs.step in at:
      out.append((rs.step, jax.tree.map(jnp.copy, rs.train.params)))
    if rs.step >= at[-1]:
      break
    rs, _ = loop.rl_step(run, rs)
  return run, out


@dataclasses.dataclass
class Batch:
  """One rollout batch of one snapshot: what every estimator is scored on."""
  snapshot: int
  params: Any
  ref_params: Any         # the start of training (the warm-up): the reference policy
  ctx_args: dict          # StepContext arguments (key, examples, prompt tokens/mask)
  host: dict              # numpy tokens, response_mask, group_id, reward
  truth: Any              # credit.bench true advantages (NamedTuple)


def _context(args: dict, ref_params=None, learners=None) -> producers.StepContext:
  return producers.StepContext(ref_params=ref_params, learners=dict(learners or {}), **args)


def rollout_batches(run, snaps, s: Settings, seed: int = 0) -> list[Batch]:
  """`s.batches` batches per snapshot: fixed prompts and keys, sampled by the runner's
  rollout and reward producers, with the true advantages of every sampled token."""
  data = run.data
  loader = tasks_lib.make_loader(data.train, s.prompts_per_step, seed=seed + 101)
  prompts = [next(loader) for _ in range(s.batches)]
  out = []
  for step, params in snaps:
    for k, ex in enumerate(prompts):
      toks, pmask = tasks_lib.encode_prompts(data.tokenizer, ex["prompt"], data.max_prompt_len)
      key = jax.random.fold_in(jax.random.key(seed + 7), 1000 * step + k)
      args = dict(key=key, examples=ex, prompt_tokens=toks, prompt_mask=pmask)
      ctx = _context(args)
      state = types.SimpleNamespace(params=params)
      batch = {}
      for stage in run.stages:
        batch.update(stage(state, batch, ctx))
      host = {n: np.asarray(jax.device_get(batch[n]))
              for n in ("tokens", "response_mask", "group_id", "reward")}
      rollout = batch["host"]  # the rollout's host copies
      host["prompt_mask"] = np.asarray(rollout["prompt_mask"])
      if getattr(data.task, "multi_turn", False):  # environment episodes
        host["obs_mask"] = np.asarray(rollout["obs_mask"])
        host["turn_id"] = np.asarray(rollout["turn_id"])
      # A tree row's loss tokens are its own segment; its truth is computed along its whole
      # path (the shared prefix it continues), whose tokens belong to an ancestor row.
      path = np.asarray(rollout["response_mask"]) if "own_mask" in rollout else None
      truth = true_advantages(run, params, ex, host if path is None
                              else {**host, "response_mask": path}, key, s)
      out.append(Batch(step, params, snaps[0][1], args, host, truth))
  return out


def true_advantages(run, params, examples, host: dict, key, s: Settings):
  """The exact per-token advantages of a batch under the policy that sampled it
  (`bench.true_turn_advantages` on a multi-turn batch)."""
  rows = [{k: v[g] for k, v in examples.items()} for g in host["group_id"]]
  if "turn_id" in host:  # a multi-turn batch (rollout_batches)
    rows = [tasks_lib.as_example(r) for r in rows]
    return bench.true_turn_advantages(
        run.setup.sampler, run.setup.model_state(params), task=run.data.task,
        tokenizer=run.data.tokenizer, examples=rows, tokens=host["tokens"],
        response_mask=host["response_mask"], obs_mask=host["obs_mask"],
        prompt_mask=host["prompt_mask"], turn_id=host["turn_id"],
        layout=loop.turn_layout(run.c, run.data),
        limits=producers.env_limits(run.c, run.data.tokenizer),
        key=jax.random.fold_in(key, 99), num_rollouts=s.num_rollouts,
        temperature=float(run.c.temperature), top_k=int(run.c.top_k), top_p=float(run.c.top_p))
  return bench.true_advantages(
      run.setup.sampler, run.setup.model_state(params), task=run.data.task,
      tokenizer=run.data.tokenizer, examples=rows, tokens=host["tokens"],
      response_mask=host["response_mask"], prompt_mask=host["prompt_mask"],
      key=jax.random.fold_in(key, 99), num_rollouts=s.num_rollouts,
      temperature=float(run.c.temperature), top_k=int(run.c.top_k), top_p=float(run.c.top_p))


# --------------------------------------------------------------------------
# Part 2: every estimator's advantages on the shared batches.
# --------------------------------------------------------------------------


class Skip(Exception):
  """An estimator the bench cannot run here, with the reason; `missing`: the contract fields
  it lacks when that is the reason (`producers.MissingFieldsError`), else empty."""

  def __init__(self, reason: str, missing: Iterable[str] = ()):
    super().__init__(reason)
    self.missing = frozenset(missing)


# The fields only a tree rollout makes (`tree_config`): an estimator missing nothing else is
# scored again on tree batches.
TREE_FIELDS = frozenset({"parent_id", "prefix_len"})


def estimator_config(base: ml_collections.ConfigDict, name: str,
                     teacher: str = "") -> ml_collections.ConfigDict:
  """`base` running estimator `name` (teacher checkpoint `teacher`); per-character steps
  (`step_config`) when its step rewards come from the task's step judge or its turns are the
  steps (`per_character_steps`); two reward
  components (the outcome, and whether the response ended by itself) for the multi-reward
  methods (gdpo, searchllm)."""
  c = ml_collections.ConfigDict(base.to_dict())
  c.estimator = name
  c.estimator_kwargs = dict(BENCH_KWARGS.get(name, {}))
  c.update(METHOD_CONFIG.get(name, {}))
  c.teacher.init_from = teacher
  if name in credit.list_estimators() and "reward_components" in credit.get_estimator(
      name).needs:
    c.reward_components = MULTI_REWARD
  if per_character_steps(c):
    c = step_config(c)
  return c


# Estimator settings of the bench that differ from the method's defaults, each for a reason of
# the bench's layout: PiCA's step-count penalty (0.3 · 1.5^(n−2) from the 4th step) is meant
# for a few search calls; with one step per character it is a length penalty that makes an
# empty response the best one.
BENCH_KWARGS = {"pica": {"penalty": 0.0}}

# Runner settings that are part of a method, not of the bench (its recipe sets them too): the
# shared defaults would run it as another method. SIPO's two self-teacher contexts are the gold
# answer and the gold answer with the group's mistake (`experiments/configs/sipo_arithmetic.py`);
# the default alt contexts ("correct: " / "wrong: ") are CSCR's and T-REG's, which hold neither.
METHOD_CONFIG = {"sipo": {"alt_context_pos": "answer {answer}: ",
                          "alt_context_neg": "answer {answer}, not {mistake}: "}}

# The reward components of the multi-reward estimators: the task's outcome and the format
# check (the response ended with its stop token, not at the length limit).
MULTI_REWARD = ("outcome", "format")


def per_character_steps(c: ml_collections.ConfigDict) -> bool:
  """Whether the bench runs the method with every response character a step (`step_config`):
  the step-reward methods (their step judge is then exact per character), and the turn-level
  ones that read `turn_id` with `step_mask` (IGPO, TRACE, SIOP, OPRL, PBSD...), whose turns on
  a single-turn row are its steps (`producers.turns_are_steps`). With the default delimiters a
  bifurcation response is one step, so those methods would see one turn and no credit
  inside the response; per character, their turn signals (information gain of the gold
  answer, a learned PRM's step score...) can land on the pivot."""
  return uses_step_judge(c) or producers.turns_are_steps(c)


def uses_step_judge(c: ml_collections.ConfigDict) -> bool:
  """Whether the method's planned producers include the task's step judge (`step_reward` of
  the step-reward estimators: abseeker, prorag, vpr, ...)."""
  try:
    method = loop.check_method(c)
  except (ValueError, KeyError):
    return False
  return any(p.producer.name == "step_judge" for p in method.plan)


def step_config(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Every response character is a step (each character token closes one; the stop token is
  a step of its own, the response's end), judged by the bifurcation task's exact
  `judge_step`: a perfect process reward, 0/1 per character; the steps are the turns too
  (`steps_as_turns`), for the methods that index step rewards by turn. The step-reward
  estimators then show how well they turn a right process signal into token credit."""
  c.step_delimiters = tuple(tasks_lib.CharTokenizer().chars)
  c.max_steps = c.max_new_tokens
  c.steps_as_turns = True  # turn-level step methods (pica, vpr...): turn k = step k
  return c


def estimator_fn(run, name: str, teacher: str = ""):
  """advantages(batch: Batch) -> [B,T] numpy for estimator `name` on the runner's setup, its
  fields made by its planned producers from the batch's own rollouts (a teacher checkpoint
  `teacher` for the distillation methods, "" = none); raises Skip."""
  c = estimator_config(run.c, name, teacher)
  try:
    method = loop.check_method(c)
  except producers.MissingFieldsError as e:
    # The reason without the list of every field it can make, and advice.
    raise Skip(e.reason, (f for fs in e.missing.values() for f in fs)) from None
  except (ValueError, KeyError) as e:
    raise Skip(str(e)) from None
  base = run.setup
  ps = producers.Setup(c, base.data, base.mesh, base.graphdef, base.rest, base.sampler,
                       base.chunk_size, base.num_groups, base.group_size,
                       multi_sampler=base.multi_sampler)
  try:
    stages = [p.build(ps) for p in method.plan]
  except (ValueError, KeyError) as e:
    raise Skip(str(e)) from None
  est = method.estimator
  adv_fn = jax.jit(train.make_advantage_fn(est, method.estimator_static))
  est_state = est.init_state(len(base.data.train)) if est.stateful else None

  def advantages(b: Batch) -> np.ndarray:
    ctx = _context(b.ctx_args, ref_params=b.ref_params,
                   learners={p.producer.name: p.producer.init(ps, b.params)
                             for p in method.plan if p.producer.init is not None})
    state = types.SimpleNamespace(params=b.params)
    batch = {}
    for stage in stages:
      batch.update(stage(state, batch, ctx))
    tokens = np.asarray(jax.device_get(batch["tokens"]))
    if not np.array_equal(tokens, b.host["tokens"]):
      raise RuntimeError(f"{name}: its rollout differs from the shared batch (same key)")
    arrays = {n: batch[n] for n in method.estimator_fields}
    if "train_step" in est.params:
      arrays["train_step"] = jnp.asarray(b.snapshot, jnp.float32)
    adv, _, _ = adv_fn(arrays, est_state)
    return np.asarray(jax.device_get(adv), np.float32)

  return advantages


def reference_advantages(name: str, b: Batch) -> np.ndarray:
  resp = b.host["response_mask"]
  if name == "oracle":
    return np.where(resp, np.asarray(b.truth.advantage), 0.0).astype(np.float32)
  return resp.astype(np.float32)  # constant


def score(adv: np.ndarray, b: Batch) -> dict[str, float]:
  m = bench.credit_metrics(adv, np.asarray(b.truth.advantage), b.host["response_mask"],
                           np.asarray(b.truth.pivot_mask), b.host["group_id"])
  if isinstance(b.truth, bench.TurnTrueAdvantages):
    m.update(bench.turn_credit_metrics(adv, b.truth, b.host["response_mask"],
                                       b.host["turn_id"], b.host["group_id"]))
  return m


# --------------------------------------------------------------------------
# Part 3: learning curves.
# --------------------------------------------------------------------------


def _learning_lines(task: str, name: str, seed: int, rows: list[dict]) -> list[list]:
  """A run's learning.csv lines (`LearningLog.HEADER`)."""
  return [[task, name, seed, r["step"], f"{r.get('wall_time', float('nan')):.3f}",
           f"{r['eval_accuracy']:.4f}"] for r in rows]


def _resume_key(fingerprint: dict, kept: dict) -> tuple:
  """What must agree for a resumed learning.csv to go on: every setting, except that the
  per-task warm-up lengths count only for the tasks the file holds (a warm-up calibrated since
  for another task leaves its runs valid)."""
  as_settings = types.SimpleNamespace(**fingerprint)  # learn_sft_steps reads two fields
  rest = {k: v for k, v in fingerprint.items() if k not in ("learn_sft_steps",
                                                           "learn_sft_by_task")}
  return rest, sorted((task, learn_sft_steps(as_settings, task))
                      for task in {task for task, _ in kept})


class LearningLog:
  """The learning part's record, kept as it grows: `learning.csv` rows (task, estimator, seed,
  step, wall_time, eval_accuracy) appended after every finished run, so a long full run can be
  stopped and resumed (`--resume`) without redoing a finished (task, estimator, seed). A run
  counts as finished when its last eval is at `learn_steps`. `settings.json` beside it must
  match the settings of the run that resumes (a different setting would mix curves)."""

  HEADER = ["task", "estimator", "seed", "step", "wall_time", "eval_accuracy"]

  def __init__(self, out: str, s: Settings, resume: bool):
    os.makedirs(out, exist_ok=True)
    self.path = os.path.join(out, "learning.csv")
    self.learn_steps = s.learn_steps
    as_json = lambda x: json.loads(json.dumps(x))  # tuples read back as lists
    fingerprint = as_json({k: v for k, v in dataclasses.asdict(s).items()
                           if k not in ("tasks", "estimators", "learn_estimators", "seeds",
                                        "multi_turn_estimators", "learn_references")})
    spath = os.path.join(out, "settings.json")
    self.done: dict[tuple[str, str, int], list[dict]] = {}
    if resume and os.path.exists(self.path):
      old = json.load(open(spath)) if os.path.exists(spath) else None
      if old is not None:  # a setting added since the file was written counts as its default
        defaults = {f.name: f.default for f in dataclasses.fields(Settings)}
        old = {**{k: as_json(defaults[k]) for k in fingerprint if k not in old}, **old}
      kept = read_learning(self.path)
      if old is None or _resume_key(old, kept) != _resume_key(fingerprint, kept):
        raise SystemExit(f"--resume: {spath} holds other settings ({old}) than this run's "
                         f"({fingerprint}); use another --out or drop --resume")
      self.done = {(task, name, seed): rows
                   for (task, name), by_seed in kept.items()
                   for seed, rows in by_seed.items() if rows[-1]["step"] == s.learn_steps}
    with open(self.path, "w", newline="") as f:  # finished runs only (a partial one is redone)
      csv.writer(f).writerow(self.HEADER)
    for (task, name, seed), rows in self.done.items():
      self._write(task, name, seed, rows)
    json.dump(fingerprint, open(spath, "w"), indent=1)

  def _write(self, task: str, name: str, seed: int, rows: list[dict]) -> None:
    with open(self.path, "a", newline="") as f:
      csv.writer(f).writerows(_learning_lines(task, name, seed, rows))

  def get(self, task: str, name: str, seed: int) -> list[dict] | None:
    return self.done.get((task, name, seed))

  def add(self, task: str, name: str, seed: int, rows: list[dict]) -> None:
    self.done[(task, name, seed)] = rows
    self._write(task, name, seed, rows)


def learning_runs(task: str, name: str, s: Settings, hf_dir: str, workdir: str,
                  teacher: str = "", log: LearningLog | None = None,
                  tree: bool = False) -> list[list[dict]]:
  """Per seed, the eval rows (step, wall_time, eval_accuracy) of a run from the warm-up
  (taken from `log` when it holds the finished run, else run and added to it); `tree`: on
  tree batches (`tree_config`), for the estimators that need them."""
  out = []
  for seed in range(s.seeds):
    rows = log.get(task, name, seed) if log is not None else None
    if rows is None:
      base = name[:-len(PIVOT)] if name.endswith(PIVOT) else name
      c = estimator_config(from_warm_start(base_config(task, s, seed), hf_dir), base, teacher)
      if base != name:
        c.credit_mask = "decision_mask"
      if tree:
        c = tree_config(c, s)
      c.steps, c.eval_every, c.export_hf = s.learn_steps, s.eval_every, False
      c.checkpoint_every = 0
      wd = os.path.join(workdir, "learn", f"{name}_seed{seed}")
      if os.path.exists(wd):  # an interrupted run: start it again, not from its checkpoint
        shutil.rmtree(wd)
      loop.run(c, wd)
      rows = [{k: r[k] for k in ("step", "wall_time", "eval_accuracy") if k in r}
              for r in reporting.read_metrics(os.path.join(wd, "metrics.jsonl"))
              if "eval_accuracy" in r]
      if log is not None:
        log.add(task, name, seed, rows)
    out.append(rows)
  return out


def _never(steps: Sequence[float]) -> float:
  """Steps to threshold of a run that never reached it: its length + one eval interval."""
  return float(steps[-1] + (steps[-1] - steps[-2] if len(steps) > 1 else 1.0))


def learning_stats(runs: list[list[dict]], threshold: float) -> dict[str, list[float]]:
  """Per-seed final accuracy, AUC (accuracy over steps, normalised) and steps to threshold
  (the run's length + eval interval when never reached, so the mean stays finite)."""
  out = {m: [] for m in LEARN_METRICS}
  for rows in runs:
    steps = np.asarray([r["step"] for r in rows], np.float64)
    acc = np.asarray([r["eval_accuracy"] for r in rows], np.float64)
    out["final_accuracy"].append(float(acc[-1]))
    out["auc"].append(float(bench.auc(steps, acc)))
    hit = bench.steps_to_threshold(steps, acc, threshold)
    never = _never(steps)
    out["steps_to_threshold"].append(float(never if hit is None or not np.isfinite(hit)
                                           else hit))
  return out


def read_learning(path: str) -> dict[tuple[str, str], dict[int, list[dict]]]:
  """The runs of a learning.csv: {(task, estimator): {seed: its eval rows in step order}}."""
  runs: dict[tuple[str, str], dict[int, list[dict]]] = {}
  with open(path, newline="") as f:
    for r in csv.DictReader(f):
      runs.setdefault((r["task"], r["estimator"]), {}).setdefault(int(r["seed"]), []).append(
          {"step": int(r["step"]), "wall_time": float(r["wall_time"]),
           "eval_accuracy": float(r["eval_accuracy"])})
  return {k: {seed: sorted(rows, key=lambda r: r["step"]) for seed, rows in sorted(v.items())}
          for k, v in runs.items()}


def write_learning(path: str, runs: Mapping[tuple[str, str], Mapping[int, list[dict]]]) -> None:
  """`runs` (as `read_learning` gives them) as a learning.csv."""
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(LearningLog.HEADER)
    for (task, name), seeds in runs.items():
      for seed, rows in seeds.items():
        w.writerows(_learning_lines(task, name, seed, rows))


def learning_table(runs: Mapping[tuple[str, str], Mapping[int, list[dict]]], task: str,
                   threshold: float, seeds: int) -> tuple[str, list[str]]:
  """Markdown: one line per estimator with `seeds` finished runs on `task` (final accuracy,
  AUC, steps to `threshold`: mean [bootstrap 95%]), best final accuracy first; and the
  estimators left out for having fewer runs. A run that never reached the threshold counts
  as its length + one eval interval (`learning_stats`); a mean at that value reads "never"."""
  mine = {k: v for k, v in runs.items() if k[0] == task}
  short = [name for (_, name), by_seed in mine.items() if len(by_seed) < seeds]
  stats: dict[str, dict[str, Row]] = {}
  for r in learning_rows(mine, threshold, seeds, families={}):
    stats.setdefault(r.estimator, {})[r.metric] = r
  lines = []
  for name, cells in stats.items():
    steps = [r["step"] for r in mine[(task, name)][min(mine[(task, name)])]]
    never = _never(steps)
    f, a, n = (cells[m] for m in ("final_accuracy", "auc", "steps_to_threshold"))
    f, a, n = (f.mean, f.lo, f.hi), (a.mean, a.lo, a.hi), (n.mean, n.lo, n.hi)
    reach = (f"never ({never:.0f})" if n[0] >= never
             else f"{n[0]:.0f} [{n[1]:.0f}, {n[2]:.0f}]")
    lines.append((-f[0], -a[0], name,
                  f"| `{name}` | {f[0]:.2f} [{f[1]:.2f}, {f[2]:.2f}] | "
                  f"{a[0]:.2f} [{a[1]:.2f}, {a[2]:.2f}] | {reach} |"))
  head = [f"| estimator | final accuracy | AUC | steps to {threshold:g} |", "|---|---|---|---|"]
  return "\n".join(head + [line for *_, line in sorted(lines)]) + "\n", sorted(short)


def learning_rows(runs: Mapping[tuple[str, str], Mapping[int, list[dict]]], threshold: float,
                  seeds: int, families: Mapping[str, str] | None = None) -> list[Row]:
  """results.csv's learning rows (`LEARN_METRICS`, mean [bootstrap 95%] over seeds) of every
  (task, estimator) in `runs` with `seeds` finished runs (the first ones by seed); `families`
  {} leaves the family empty (a table that does not show it)."""
  rows = []
  for (task, name), by_seed in runs.items():
    if len(by_seed) < seeds:
      continue
    per_seed = [by_seed[k] for k in sorted(by_seed)[:seeds]]
    family = _family(name) if families is None else families.get(name, "")
    for m, vals in learning_stats(per_seed, threshold).items():
      mean, lo, hi = _interval(vals)
      rows.append(Row(task, name, family, "learning", m, mean, lo, hi, len(vals)))
  return rows


def rebuild(out: str, add: Sequence[str], tasks: Sequence[str], s: Settings,
            command: str) -> str:
  """`--tables`: no runs. Folds each `add` file, the results.csv or learning.csv of a
  follow-up `--only` run made into its own --out, into `out`'s (its (task, estimator, seed)
  learning runs and its (task, estimator) credit rows (`merge_rows`) replacing the ones
  there), recomputes results.csv's learning rows from learning.csv, and writes results.csv,
  table.md, summary.md, learning_<task>.md, and bars_<task>.png / curves_<task>.png (the
  heatmaps need a run); skipped.md takes in the
  skipped.md beside an added results.csv. `tasks` (default: all): the tasks taken from the
  added files and the learning tables written. A follow-up's --out starts as a copy of the
  record, so its other tasks' runs may predate a later rerun; naming its tasks keeps them
  out. Returns the learning tables."""
  rpath, lpath = os.path.join(out, "results.csv"), os.path.join(out, "learning.csv")
  if not os.path.exists(rpath) and not os.path.exists(lpath):
    raise SystemExit(f"--tables: neither {rpath} nor {lpath} exists")
  spath = os.path.join(out, "skipped.md")
  rows = read_rows(rpath) if os.path.exists(rpath) else []
  runs = read_learning(lpath) if os.path.exists(lpath) else {}
  skipped = read_skipped(spath) if os.path.exists(spath) else {}
  for extra in add:
    if os.path.basename(extra) == "learning.csv":
      # Per seed: a follow-up holding fewer seeds of a pair (an unfinished one) keeps the rest.
      for key, by_seed in read_learning(extra).items():
        if not tasks or key[0] in tasks:
          runs[key] = {**runs.get(key, {}), **by_seed}
    else:
      new_rows = [r for r in read_rows(extra) if r.part != "learning"
                  and (not tasks or r.task in tasks)]
      rows = merge_rows(rows, new_rows)
      # Its skipped.md too: an estimator it scored leaves the list, one it skipped enters.
      extra_sk = os.path.join(os.path.dirname(extra), "skipped.md")
      new_sk = read_skipped(extra_sk) if os.path.exists(extra_sk) else {}
      scored = {(r.task, r.estimator) for r in new_rows}
      for task in dict.fromkeys([t for t, _ in scored] + list(new_sk)):
        skipped[task] = {**{n: w for n, w in skipped.get(task, {}).items()
                            if (task, n) not in scored}, **new_sk.get(task, {})}
  families = {r.estimator: r.family for r in rows}
  rows = [r for r in rows if r.part != "learning"] + learning_rows(
      runs, s.threshold, s.seeds, {n: families.get(n) or _family(n) for _, n in runs})
  write_rows(rpath, rows)
  if runs:
    write_learning(lpath, runs)
  if skipped:
    write_skipped(spath, skipped)
  write_tables(out, rows, f"Rebuilt by `{command}` from results.csv and learning.csv (the "
                          f"runs' commands: README)")
  for task in dict.fromkeys(r.task for r in rows):
    plot_bars(os.path.join(out, f"bars_{task}.png"), [r for r in rows if r.task == task], task)
  text = []
  for task in tasks or dict.fromkeys(t for t, _ in runs):
    table, short = learning_table(runs, task, s.threshold, s.seeds)
    note = f"\nFewer than {s.seeds} finished seeds: {', '.join(short)}.\n" if short else ""
    with open(os.path.join(out, f"learning_{task}.md"), "w") as f:
      f.write(table + note)
    curves = {n: [v[k] for k in sorted(v)] for (t, n), v in runs.items() if t == task}
    plot_curves(os.path.join(out, f"curves_{task}.png"), curves, task)
    text.append(f"## {task}\n\n{table}{note}")
  return "\n".join(text)


# --------------------------------------------------------------------------
# The whole bench.
# --------------------------------------------------------------------------


@dataclasses.dataclass
class Row:
  task: str
  estimator: str
  family: str
  part: str
  metric: str
  mean: float
  lo: float
  hi: float
  n: int


def _interval(values: Sequence[float], seed: int = 0) -> tuple[float, float, float]:
  v = np.asarray(values, np.float64)
  if len(v) < 2:
    return float(v.mean()), float(v.mean()), float(v.mean())
  lo, hi = bench.bootstrap_ci(v, seed=seed)
  return float(v.mean()), float(lo), float(hi)


def _family(name: str) -> str:
  if name in REFERENCES or name.endswith(PIVOT):
    return "reference"
  return credit.get_estimator(name).family


def needs_tree(e: Skip) -> bool:
  """Whether a tree rollout removes the skip: the estimator lacks branch fields, nothing else."""
  return bool(e.missing) and e.missing <= TREE_FIELDS


def tree_config(c: ml_collections.ConfigDict, s: Settings) -> ml_collections.ConfigDict:
  """The runner config on tree batches: G/2 roots per prompt grown by branch sampling at
  `tree_points` positions (`tree_criterion`: high-entropy ones, or failed rows' first wrong
  token) with `tree_branches` continuations each (depth 1), so a prompt has as many rows as
  in the plain batches when points·branches = G/2."""
  c.group_size = max(s.group_size // 2, 2)
  c.tree.branches, c.tree.points, c.tree.depth = s.tree_branches, s.tree_points, 1
  c.tree.criterion = s.tree_criterion
  return c


def tree_runner(task: str, s: Settings, hf_dir: str, workdir: str):
  """A runner sampling tree batches (`tree_config`) for the same snapshots' parameters."""
  c = tree_config(from_warm_start(base_config(task, s), hf_dir), s)
  run, _ = loop.setup(c, os.path.join(workdir, "tree_runner"))
  return run


def score_estimators(task: str, run, batches: list[Batch], names: Sequence[str], teacher: str,
                     say=print) -> tuple[list[Row], dict[str, str], list[str], dict, list[str]]:
  """(rows, skipped {name: reason}, scored names, {name: last batch's advantages}, the skipped
  names a tree batch would run (`needs_tree`)) of every estimator in `names` (REFERENCES too)
  on `batches`; a name ending in TREE is that estimator (or reference) scored again on tree
  batches, as a baseline for the tree estimators."""
  rows, skipped, scored, heat, tree = [], {}, [], {}, []
  for name in names:
    base = name[:-len(TREE)] if name.endswith(TREE) else name
    t1 = time.perf_counter()
    try:
      fn = ((lambda b, n=base: reference_advantages(n, b)) if base in REFERENCES
            else estimator_fn(run, base, teacher))
      advs = [fn(b) for b in batches]
    except Skip as e:
      skipped[name] = str(e)
      if needs_tree(e):
        tree.append(name)
      continue
    except Exception as e:  # a bug to report, not to hide: listed as FAILED  # pylint: disable=broad-except
      skipped[name] = f"FAILED: {type(e).__name__}: {e}"
      say(f"[{task}] {name} FAILED: {type(e).__name__}: {e}")
      continue
    per = [score(a, b) for a, b in zip(advs, batches)]
    for m in per[0]:
      vals = [p[m] for p in per if np.isfinite(p[m])]  # sign_acc: undefined on some batches
      if vals:
        mean, lo, hi = _interval(vals)
        rows.append(Row(task, name, _family(base), "credit", m, mean, lo, hi, len(vals)))
    heat[name] = advs[-1]
    if base not in REFERENCES:
      scored.append(name)
    say(f"[{task}] {name}: corr {np.mean([p['corr'] for p in per]):+.2f}, "
        f"pivot mass {np.mean([p['pivot_mass'] for p in per]):.2f} "
        f"({time.perf_counter() - t1:.1f}s)")
  return rows, skipped, scored, heat, tree


def run_task(task: str, s: Settings, workdir: str, *, learning: bool = True,
             say=print, log: LearningLog | None = None) -> tuple[list[Row], dict[str, str], dict]:
  """(rows, skipped {estimator: reason}, extras for plots) of one task."""
  t0 = time.perf_counter()
  hf_dir = warm_up(task, s, workdir)
  teacher = (warm_up(task, s, workdir, "teacher", s.teacher_sft_steps)
             if s.teacher_sft_steps else "")
  run, snaps = snapshots(task, s, hf_dir, workdir)
  batches = rollout_batches(run, snaps, s)
  say(f"[{task}] warm-up, {len(snaps)} snapshots and {len(batches)} batches with true "
      f"advantages: {time.perf_counter() - t0:.0f}s")
  names = list(s.estimators) if s.estimators is not None else credit.list_estimators()
  if s.estimators is not None and getattr(run.data.task, "multi_turn", False):
    names += [n for n in s.multi_turn_estimators if n not in names]
  rows, skipped, scored, heat, tree_names = score_estimators(
      task, run, batches, list(REFERENCES) + names, teacher, say)
  if tree_names and s.tree_branches and not getattr(run.data.task, "multi_turn", False):
    t1 = time.perf_counter()
    trun = tree_runner(task, s, hf_dir, workdir)
    tbatches = rollout_batches(trun, snaps, s)
    say(f"[{task}] tree batches ({trun.c.group_size} roots + {s.tree_points} x "
        f"{s.tree_branches} branches per prompt) with true advantages: "
        f"{time.perf_counter() - t1:.0f}s")
    again = [f"{n}{TREE}" for n in TREE_BASELINES]
    r2, sk2, sc2, _, _ = score_estimators(task, trun, tbatches, again + tree_names, teacher,
                                          say)
    for n in tree_names:
      skipped.pop(n)
    rows += r2
    skipped.update(sk2)
    scored += [n for n in sc2 if not n.endswith(TREE)]
  curves = {}
  if learning:
    n = learn_sft_steps(s, task)  # its length names the directory: a reused one matches
    learn_dir = warm_up(task, s, workdir, f"learn_warmup_{n}", n) if n else hf_dir
    learn = scored if s.learn_estimators is None else [n for n in s.learn_estimators
                                                       if n in scored]
    if not getattr(run.data.task, "multi_turn", False):
      learn = list(learn) + list(s.learn_references)
    for name in learn:
      t1 = time.perf_counter()
      try:
        runs = learning_runs(task, name, s, learn_dir, workdir, teacher, log,
                             tree=name in tree_names)
      except (ValueError, KeyError) as e:
        skipped[f"{name} (learning)"] = str(e)
        continue
      curves[name] = runs
      rows += learning_rows({(task, name): dict(enumerate(runs))}, s.threshold, s.seeds)
      say(f"[{task}] learning {name}: {s.seeds} seeds, {time.perf_counter() - t1:.0f}s")
  extras = {"batch": batches[-1], "heat": heat, "curves": curves,
            "tokenizer": run.data.tokenizer}
  return rows, skipped, extras


def write_skipped(path: str, skipped: dict[str, dict[str, str]]) -> None:
  """skipped.md: per task, each skipped estimator with the runner's reason (one line each)."""
  with open(path, "w") as f:
    for task, sk in skipped.items():
      f.write(f"## {task}: {len(sk)} skipped\n\n")
      for name, why in sorted(sk.items()):
        f.write(f"- `{name}`: {' '.join(str(why).split())}\n")
      f.write("\n")


def read_skipped(path: str) -> dict[str, dict[str, str]]:
  """`write_skipped`'s file read back: {task: {estimator: reason}}."""
  out: dict[str, dict[str, str]] = {}
  for line in open(path):
    if line.startswith("## "):
      task = line[3:].rsplit(":", 1)[0]
      out[task] = {}
    elif line.startswith("- `"):
      name, why = line[3:].rstrip("\n").split("`: ", 1)
      out[task][name] = why
  return out


def write_outputs(out: str, rows: list[Row], skipped: dict[str, dict[str, str]],
                  extras: dict[str, dict], command: str, wall: float,
                  learning_csv: bool = True) -> None:
  """The bench's files in `out` (module docstring); `learning_csv=False` when a LearningLog
  already keeps learning.csv (it also holds runs of earlier, resumed invocations)."""
  os.makedirs(out, exist_ok=True)
  write_rows(os.path.join(out, "results.csv"), rows)
  if learning_csv:
    write_learning(os.path.join(out, "learning.csv"),
                   {(task, name): dict(enumerate(runs)) for task, ex in extras.items()
                    for name, runs in ex["curves"].items()})
  write_tables(out, rows, f"Command: `{command}` ({wall / 60:.1f} min)")
  write_skipped(os.path.join(out, "skipped.md"), skipped)
  for task, ex in extras.items():
    plot_bars(os.path.join(out, f"bars_{task}.png"), [r for r in rows if r.task == task], task)
    if ex["curves"]:
      plot_curves(os.path.join(out, f"curves_{task}.png"), ex["curves"], task)
    plot_heatmap(os.path.join(out, f"heatmap_{task}.png"), ex, task)


def write_rows(path: str, rows: Sequence[Row]) -> None:
  """`rows` as a results.csv."""
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow([fld.name for fld in dataclasses.fields(Row)])
    for r in rows:
      w.writerow([r.task, r.estimator, r.family, r.part, r.metric, f"{r.mean:.6g}",
                  f"{r.lo:.6g}", f"{r.hi:.6g}", r.n])


def write_tables(out: str, rows: list[Row], header: str) -> None:
  """table.md and summary.md of `rows`, under `header` (the command that made them)."""
  with open(os.path.join(out, "table.md"), "w") as f:
    f.write(markdown_table(rows, header))
  with open(os.path.join(out, "summary.md"), "w") as f:
    f.write(summary_table(rows, header))


def read_rows(path: str) -> list[Row]:
  """The rows of a results.csv written by `write_outputs`."""
  with open(path, newline="") as f:
    return [Row(r["task"], r["estimator"], r["family"], r["part"], r["metric"],
                float(r["mean"]), float(r["lo"]), float(r["hi"]), int(r["n"]))
            for r in csv.DictReader(f)]


def merge_rows(old: Sequence[Row], new: Sequence[Row],
               skipped: Mapping[str, Iterable[str]] | None = None) -> list[Row]:
  """`old` with every (task, estimator, part) that `new` measured replaced by `new`'s rows,
  and without the estimators this run skipped on a task (`skipped`: {task: names}; an
  estimator the runner now refuses keeps no stale row): a follow-up `--only` run (a fixed
  estimator, one added since) folded into a full table."""
  fresh = {(r.task, r.estimator, r.part) for r in new}
  gone = {(t, n) for t, names in (skipped or {}).items() for n in names}
  return [r for r in old if (r.task, r.estimator, r.part) not in fresh
          and (r.task, r.estimator) not in gone] + list(new)


def _cell(r: Row | None, digits: int = 2) -> str:
  if r is None:
    return ""
  if r.n < 2 or r.lo == r.hi:
    return f"{r.mean:.{digits}f}"
  return f"{r.mean:.{digits}f} [{r.lo:.{digits}f}, {r.hi:.{digits}f}]"


def markdown_table(rows: list[Row], header: str) -> str:
  """One table per task: an estimator per line, credit metrics (on a multi-turn task the
  turn-level ones too) then learning metrics (mean [95% bootstrap interval])."""
  out = [header + "\n"]
  for task in dict.fromkeys(r.task for r in rows):
    table = {(r.estimator, r.part, r.metric): r for r in rows if r.task == task}
    turn = [m for m in TURN_METRICS if any(k[2] == m for k in table)]
    cols = ([("credit", m) for m in CREDIT_METRICS + tuple(turn)]
            + [("learning", m) for m in LEARN_METRICS])
    names = list(dict.fromkeys(r.estimator for r in rows if r.task == task))
    chance = next((r for r in rows if r.task == task and r.metric == "chance"), None)
    truth = next((r for r in rows if r.task == task and r.metric == "pivot_mass_true"), None)
    out.append(f"\n### {task}\n")
    if chance is not None and truth is not None:
      out.append(f"pivot_mass by chance {chance.mean:.2f}; of the true advantages "
                 f"{truth.mean:.2f}.\n")
    out.append("\n| estimator | family | " + " | ".join(m for _, m in cols) + " |")
    out.append("|" + "---|" * (len(cols) + 2))
    for n in names:
      fam = next(r.family for r in rows if r.task == task and r.estimator == n)
      cells = [_cell(table.get((n, p, m)), 1 if m == "steps_to_threshold" else 2)
               for p, m in cols]
      out.append(f"| `{n}` | {fam} | " + " | ".join(cells) + " |")
  return "\n".join(out) + "\n"


def summary_table(rows: list[Row], header: str) -> str:
  """One line per estimator across tasks: correlation with the true advantages (with its
  bootstrap interval), pivotal mass and balanced sign accuracy (means over snapshots ×
  batches), the turn-level correlation on
  multi-turn tasks, and final held-out accuracy when learning ran; sorted by mean
  correlation. The README's table."""
  tasks = list(dict.fromkeys(r.task for r in rows))
  get = {(r.task, r.estimator, r.metric): r for r in rows}
  names = list(dict.fromkeys(r.estimator for r in rows))
  learn = any(r.part == "learning" for r in rows)

  def corr(n):
    v = [get[(t, n, "corr")].mean for t in tasks if (t, n, "corr") in get]
    return float(np.mean(v)) if v else -2.0

  # Multi-turn tasks add the turn-level correlation (`turn_corr`).
  metrics = {t: ("corr", "pivot_mass", "sign_acc") + (
      ("turn_corr",) if any(r.task == t and r.metric == "turn_corr" for r in rows) else ())
      for t in tasks}
  head = "| estimator | family | " + " | ".join(
      f"{t}: corr / pivot mass / sign acc" + (" / turn corr" if len(metrics[t]) > 3 else "")
      + (" / final acc" if learn else "") for t in tasks)
  out = [f"{header}. Chance pivot mass per task: " +
         ", ".join(f"{t} {get[(t, 'constant', 'chance')].mean:.2f}" for t in tasks
                   if (t, "constant", "chance") in get) + ".\n", head + " |",
         "|---|---|" + "---|" * len(tasks)]
  for n in sorted(names, key=corr, reverse=True):
    cells = []
    for t in tasks:
      vals = [get.get((t, n, m)) for m in metrics[t]]
      txt = " / ".join("–" if v is None else f"{v.mean:.2f}" for v in vals)
      if vals[0] is not None and vals[0].hi > vals[0].lo:  # the correlation's 95% interval
        txt = txt.replace(f"{vals[0].mean:.2f}", f"{vals[0].mean:.2f} [{vals[0].lo:.2f}, "
                          f"{vals[0].hi:.2f}]", 1)
      if learn:
        f = get.get((t, n, "final_accuracy"))
        txt += " / " + ("–" if f is None else f"{f.mean:.2f} [{f.lo:.2f}, {f.hi:.2f}]")
      cells.append(txt)
    fam = next(r.family for r in rows if r.estimator == n)
    out.append(f"| `{n}` | {fam} | " + " | ".join(cells) + " |")
  return "\n".join(out) + "\n"


def plot_bars(path: str, rows: list[Row], task: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  metrics = [m for m in CREDIT_METRICS + TURN_METRICS + LEARN_METRICS
             if any(r.metric == m for r in rows)]
  names = list(dict.fromkeys(r.estimator for r in rows))
  fig, axes = plt.subplots(len(metrics), 1, figsize=(max(6, 0.35 * len(names) + 2),
                                                     2.2 * len(metrics)), squeeze=False)
  for ax, m in zip(axes[:, 0], metrics):
    rs = [next((r for r in rows if r.estimator == n and r.metric == m), None) for n in names]
    x = np.arange(len(names))
    mean = np.asarray([r.mean if r else np.nan for r in rs])
    err = np.asarray([[r.mean - r.lo if r else 0 for r in rs], [r.hi - r.mean if r else 0
                                                                 for r in rs]])
    ax.bar(x, mean, yerr=err, color="#4477aa", capsize=2)
    ax.set_ylabel(m, fontsize=8)
    ax.set_xticks(x, names, rotation=90, fontsize=7)
  axes[0, 0].set_title(f"{task}: credit quality and learning (95% bootstrap intervals)")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def plot_curves(path: str, curves: dict[str, list[list[dict]]], task: str,
                highlight: int = 8) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  final = {n: np.mean([rr[-1]["eval_accuracy"] for rr in runs]) for n, runs in curves.items()}
  # Many estimators (a full run): the best few and GRPO in colour, the rest thin and grey.
  shown = set(curves) if len(curves) <= highlight else set(
      sorted(final, key=final.get, reverse=True)[:highlight - 1]) | {"grpo"}
  colours = iter([c for i, c in enumerate(plt.cm.tab10.colors) if i != 7] * 2)  # 7: grey
  for name in sorted(curves, key=lambda n: (n in shown, final[n])):
    runs = curves[name]
    steps = np.asarray([r["step"] for r in runs[0]])
    acc = np.asarray([[r["eval_accuracy"] for r in rr][:len(steps)] for rr in runs])
    wall = np.asarray([[r.get("wall_time", np.nan) for r in rr][:len(steps)] for rr in runs])
    if name not in shown:
      axes[0].plot(steps, acc.mean(0), color="0.75", lw=0.7)
      axes[1].plot(np.nanmean(wall, 0), acc.mean(0), color="0.75", lw=0.7)
      continue
    line, = axes[0].plot(steps, acc.mean(0), label=name, color=next(colours))
    axes[0].fill_between(steps, acc.min(0), acc.max(0), alpha=0.15, color=line.get_color())
    axes[1].plot(np.nanmean(wall, 0), acc.mean(0), label=name, color=line.get_color())
  axes[0].set_xlabel("RL step")
  axes[1].set_xlabel("wall time (s)")
  for ax in axes:
    ax.set_ylabel("held-out greedy accuracy")
  axes[0].set_title(f"{task}: mean over seeds (band: min-max)")
  axes[1].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def plot_heatmap(path: str, ex: dict, task: str, rows_shown: int = 4) -> None:
  """The responses of one batch (a mixed group first), the true advantages and each
  estimator's, token by token; each block is scaled by its own largest |A| on the rows shown
  (estimators differ in scale by orders of magnitude), the scale in its label."""
  b, tok = ex["batch"], ex["tokenizer"]
  resp, reward, gid = b.host["response_mask"], b.host["reward"], b.host["group_id"]
  picks = reporting.select_rows(reward, gid, rows_shown, per_group=2)
  tokens, advs, labels = [], [], []
  series = [("truth", np.asarray(b.truth.advantage))] + list(ex["heat"].items())
  for name, adv in series:
    scale = max(float(np.max(np.abs(np.asarray(adv)[picks]))), 1e-12)
    for i in picks:
      ids = b.host["tokens"][i][resp[i]]
      tokens.append([tok.decode([int(t)]) or "∅" for t in ids])
      advs.append(np.asarray(adv[i][resp[i]], np.float64) / scale)
      labels.append(f"{name} #{i} r={reward[i]:.0f} (÷{scale:.2g})")
  reporting.plot_token_credit(path, tokens, advs, labels=labels, vmax=1.0,
                              title=f"{task}: true advantages and each estimator's (scaled)")


def main(argv: Sequence[str] | None = None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--quick", action="store_true", help="one task, a few estimators, minutes")
  p.add_argument("--only", default="", help="comma-separated estimators (default: all)")
  p.add_argument("--tasks", default="", help="comma-separated tasks")
  p.add_argument("--out", default="credit_bench")
  p.add_argument("--workdir", default="", help="runs and warm-ups (default: a temp dir)")
  p.add_argument("--seeds", type=int, default=0)
  p.add_argument("--no-learning", action="store_true")
  p.add_argument("--resume", action="store_true",
                 help="keep the finished learning runs in --out/learning.csv (same settings)")
  p.add_argument("--merge", default="",
                 help="an earlier results.csv: its rows of the (task, estimator) pairs this "
                      "run does not measure are kept in this run's results.csv and tables")
  p.add_argument("--tables", action="store_true",
                 help="no runs: rebuild --out's results.csv learning rows, tables and plots "
                      "from its results.csv and learning.csv (after folding in --add)")
  p.add_argument("--add", default="",
                 help="with --tables: comma-separated results.csv / learning.csv files of "
                      "follow-up runs; their (task, estimator) credit rows and (task, "
                      "estimator, seed) learning runs replace --out's (only --tasks' tasks "
                      "when given)")
  p.add_argument("--tree-criterion", default="entropy", choices=("entropy", "first_error"),
                 help="branch points of the tree batches (first_error: a failed row's first "
                      "wrong token)")
  a = p.parse_args(argv)
  s = QUICK if a.quick else FULL
  s = dataclasses.replace(s, tree_criterion=a.tree_criterion)
  if a.only:
    only = tuple(x.strip() for x in a.only.split(",") if x.strip())
    refs = tuple(n for n in only if n.endswith(PIVOT))
    only = tuple(n for n in only if not n.endswith(PIVOT))
    unknown = [n for n in only + tuple(r[:-len(PIVOT)] for r in refs)
               if n not in credit.list_estimators() and n not in REFERENCES]
    if unknown:
      raise SystemExit(f"unknown estimators {unknown}; known: {credit.list_estimators()}")
    s = dataclasses.replace(s, estimators=only, learn_estimators=None, multi_turn_estimators=(),
                            learn_references=refs)
  if a.tasks:
    s = dataclasses.replace(s, tasks=tuple(x.strip() for x in a.tasks.split(",") if x.strip()))
  if a.seeds:
    s = dataclasses.replace(s, seeds=a.seeds)
  if a.add and not a.tables:
    raise SystemExit("--add goes with --tables")
  if a.tables:
    command = "python -m benchmarks.credit_bench " + " ".join(
        argv if argv is not None else sys.argv[1:])
    print(rebuild(a.out, [x for x in a.add.split(",") if x], s.tasks if a.tasks else (), s,
                  command.strip()))
    return {"out": a.out}
  for t in s.tasks:
    tasks_lib.get_task(t, **TASK_KWARGS.get(t, {}))  # unknown task: its error, now
  workdir = a.workdir or tempfile.mkdtemp(prefix="credit_bench_")
  if not jax.config.jax_compilation_cache_dir:  # the seeds' runs compile the same programs
    jax.config.update("jax_compilation_cache_dir", os.path.join(workdir, "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.3)
  t0 = time.perf_counter()
  rows, skipped, extras = [], {}, {}
  log = None if a.no_learning else LearningLog(a.out, s, a.resume)
  for task in s.tasks:
    r, sk, ex = run_task(task, s, os.path.join(workdir, task), learning=not a.no_learning,
                         log=log)
    rows += r
    skipped[task], extras[task] = sk, ex
  wall = time.perf_counter() - t0
  if a.merge:
    rows = merge_rows(read_rows(a.merge), rows, skipped)
  command = "python -m benchmarks.credit_bench " + " ".join(argv if argv is not None
                                                            else sys.argv[1:])
  write_outputs(a.out, rows, skipped, extras, command.strip(), wall, learning_csv=log is None)
  print(open(os.path.join(a.out, "table.md")).read())
  print(f"wrote {a.out}/results.csv, table.md, skipped.md and plots in {wall:.0f}s")
  return {"rows": rows, "skipped": skipped, "wall": wall, "out": a.out}


if __name__ == "__main__":
  main()
