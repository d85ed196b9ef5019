"""What every producer module shares: the setup, the step context, the declaration.

`producer(...)` declares a build function as a row of the producer table (`table()`); the
table's order (`MODULE_ORDER`, then declaration order) decides which enabled producer makes a
field several can make. The small helpers here (prompt widths, response layouts, the step
splitter, the task's verifier on host rows) serve more than one producer module.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from credit import CONTRACT, parallel
from credit.models import ModelConfig
from credit import tasks as tasks_lib
from credit.tasks.char_tokenizer import prompt_ids
from experiments import train


Produce = Callable[[Any, Mapping[str, Any], "StepContext"], dict]


class SetupError(ValueError):
  """A configuration the loop cannot run; raised before any output is written."""


class MissingFieldsError(SetupError):
  """Methods need contract fields no enabled producer makes under this config.

  Attributes:
    missing: {who: [field, ...]}, who being the estimator or loss that needs them.
    off: {producer name: ([field, ...], why it is off)} for the producers that could make
      some of them but are disabled by this config.
    made: the fields the enabled producers can make.
    reason: the short message (who needs what, and which producers are off and why), without
      the list of `made` fields and the advice the full message adds.
  """

  def __init__(self, missing: Mapping[str, list], off: Mapping[str, tuple],
               made: Iterable[str]):
    self.missing = {who: sorted(fs) for who, fs in missing.items()}
    self.off = dict(off)
    self.made = sorted(made)
    why = "; ".join(f"{who} needs {fs}" for who, fs in self.missing.items())
    offs = "".join(f"; producer {name!r} makes {fs} but is off under this config ({doc})"
                   for name, (fs, doc) in self.off.items())
    self.reason = why + offs
    super().__init__(f"{why}, which no field producer of this loop makes (it can make "
                     f"{self.made}){offs}; add a producer to experiments/producers/ or use "
                     "a recipe with an environment or critic that provides them")


@dataclasses.dataclass
class Setup:
  """What producers are built from (constant for the run)."""
  c: ml_collections.ConfigDict
  data: Any                   # loop.Data: task, tokenizer, splits, lengths
  mesh: Any
  graphdef: Any               # the policy's graph; params travel in the train state
  rest: Any                   # its non-parameter state (constant)
  sampler: Any                # credit.sampling.Sampler over the policy
  chunk_size: int | None      # scoring chunk (None: auto)
  num_groups: int             # N prompts per step
  group_size: int             # G samples per prompt
  multi_sampler: Any = None   # credit.envs.MultiTurnSampler for a multi-turn task (else None)
  _scorers: dict = dataclasses.field(default_factory=dict, repr=False)

  def model_state(self, params) -> Any:
    return nnx.merge_state(params, self.rest)

  def scorer(self, *, sum_pi_squared: bool = False, entropy: bool = True,
             tempered: bool = True) -> Callable:
    """The jitted no-gradient scoring pass (`train.make_scorer`), built once per variant;
    `entropy=False` for the passes that only need log-probs (its slot is None). `tempered`:
    scores under the sampling temperature (`scoring_temperature`), as every pass over the
    sampled rows whose log-probs meet the update's (old, reference, re-scoring); False: the
    raw model (teacher-forced gold texts, the verifier's and DPO's own objectives)."""
    temperature = scoring_temperature(self.c) if tempered else 1.0
    key = (sum_pi_squared, entropy, temperature)
    if key not in self._scorers:
      self._scorers[key] = jax.jit(train.make_scorer(
          self.graphdef, self.rest, self.chunk_size, sum_pi_squared=sum_pi_squared,
          entropy=entropy, temperature=temperature))
    return self._scorers[key]

  def repeat_groups(self, per_prompt: np.ndarray) -> Any:
    """[N] host values -> [B=N*G] row-sharded array (each prompt's value for its G samples)."""
    return parallel.shard_batch(np.repeat(np.asarray(per_prompt), self.group_size), self.mesh)



def model_config(c: ml_collections.ConfigDict, tok) -> ModelConfig:
  """The from-scratch policy's `ModelConfig`: the shapes of `c.model.preset` (a
  `credit.models.PRESETS` name: vocabulary, widths, heads, RoPE, norms, tied embeddings; with
  `c.model.preset_layers` > 0 only that many blocks), else the explicit fields of `c.model`
  (vocabulary = the tokenizer's); special ids from the run's tokenizer `tok`; dtypes and remat
  from `c.model`. SetupError when the tokenizer has more ids than the preset's vocabulary."""
  m = c.model
  run = dict(eos_token_id=tok.eos_id, pad_token_id=tok.pad_id, bos_token_id=tok.bos_id,
             remat=bool(m.remat), remat_policy=m.get("remat_policy", "full"),
             param_dtype=m.param_dtype, dtype=m.compute_dtype)
  name = m.get("preset", "")
  if name:
    from credit.models import preset
    cfg = preset(name, **run)
    if m.get("preset_layers", 0):
      cfg = cfg.replace(num_layers=int(m.preset_layers))
    if tok.vocab_size > cfg.vocab_size:
      raise SetupError(f"model.preset={name!r} has {cfg.vocab_size} token ids but the run's "
                       f"tokenizer {tok.vocab_size}")
    return cfg
  return ModelConfig(vocab_size=tok.vocab_size, hidden_size=m.hidden_size,
                     intermediate_size=m.intermediate_size, num_layers=m.num_layers,
                     num_heads=m.num_heads, num_kv_heads=m.num_kv_heads, head_dim=m.head_dim,
                     rope_theta=m.rope_theta, family=m.family, qk_norm=m.family == "qwen3",
                     qkv_bias=m.family == "qwen2", tie_embeddings=False, **run)


def init_policy(cfg: ModelConfig, mesh, seed: int) -> nnx.Module:
  """A randomly initialised `Decoder(cfg)` whose parameters are created already sharded on
  `mesh` by their logical axes (`credit.models.logical_to_mesh_sharding`): one jitted init
  whose outputs carry those shardings, so each device draws only its own shard. Eager
  creation (even under `jax.set_mesh`) makes every array whole first, on one device or on
  each, which at a real vocabulary (151,936 x 1024) costs gigabytes per device."""
  from credit.models import Decoder, logical_to_mesh_sharding
  abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(seed)))
  graphdef, abstract_state = nnx.split(abstract)
  shardings = logical_to_mesh_sharding(abstract_state, mesh)
  state = jax.jit(lambda: nnx.split(Decoder(cfg, rngs=nnx.Rngs(seed)))[1],
                  out_shardings=shardings)()
  return nnx.merge(graphdef, state)


def scoring_temperature(c: ml_collections.ConfigDict) -> float:
  """The temperature τ the rows were sampled at, under which the passes over them score
  (softmax(z/τ)), so the recomputed old log-probs are the behaviour policy's: π_old/π_behav = 1.
  Greedy sampling (τ = 0) scores the raw model (τ = 1). A Python float: τ = 1 compiles no
  rescaling at all."""
  t = float(c.temperature)
  return t if t > 0 else 1.0


def truncated_sampling(c: ml_collections.ConfigDict) -> bool:
  """The sampler truncates its distribution (top-k or top-p), so the sampled tokens' log-probs
  (`logprob_sampler`) are renormalised over a kept set the scoring passes do not form."""
  return c.top_k > 0 or c.top_p < 1.0

@dataclasses.dataclass
class StepContext:
  """Per-step inputs that are not contract fields.

  key: the step's PRNG key. examples: the loader's batch of N prompts (columns).
  prompt_tokens, prompt_mask: [N,P] host arrays of the encoded prompts.
  ref_params: the frozen reference policy (None unless a planned producer keeps one).
  learners: {producer name: its `learners.LearnerState`} of the trained producers; a
  producer replaces its own entry when it updates, and the loop carries them to the next step.
  metrics: what the producers report for the step's metrics row (e.g. `prm_loss`).
  refresh: asynchronous rollout workers: `refresh(key)` returns newer parameters between
  turns, or None (the synchronous loop: None).
  Producers hand fields on through the batch, never through the context: besides the contract
  fields it carries the runner fields of `RUNNER_FIELDS` (the attention mask, host copies of
  the rollout, the sampler's raw log-probs, decoded texts, trajectories).
  """
  key: jax.Array
  examples: Mapping[str, Any]
  prompt_tokens: np.ndarray
  prompt_mask: np.ndarray
  ref_params: Any = None
  learners: dict = dataclasses.field(default_factory=dict)
  metrics: dict = dataclasses.field(default_factory=dict)
  refresh: Callable | None = None


@dataclasses.dataclass(frozen=True)
class Producer:
  """One row of the producer table.

  name: what errors and timings call it. provides / requires: contract fields.
  build: `build(setup, wanted) -> produce`, with `wanted` the provided fields the plan uses.
  phase: the timing bucket it is reported under (`time_<phase>`; summary.md's step-time
  table lists each): sampling, reward, scoring (the policy's own pass), reference,
  divergence, likelihood (answer / follow-up teacher forcing), rescoring (other contexts),
  teacher (a frozen or self-teacher's pass), baseline, prm, critic, verifier (the generative
  verifier's verdicts and update), critical (CSO / InT's proposals, continuations and
  verification) — so every extra pass a method needs shows its cost per step.
  when: enabled under this config (resolved at setup); off_doc: what enables it (named when a
  needed field is refused). keeps_reference: the run keeps a frozen copy of the initial
  policy in `ctx.ref_params` (and checkpoints it). init: the producer learns
  (`experiments/producers/learners.py`): `init(setup, policy_params) -> LearnerState` makes its
  trained state after the warm-up (checkpointed with the run), and `build` returns
  `(produce, after)`, `after(batch, targets, ctx)` running once the estimator has made the
  advantages (`targets`: its value targets, e.g. `returns`). check: `check(c)` raises
  SetupError for a setting the producer cannot run with; `plan` calls it for each planned
  producer, before any file is written. trees: it reads rows through `group_id` (or not
  by prompt at all), so it also runs on tree batches, whose branch rows follow the roots.
  module: the module that declared it (`producer` fills it in; orders the table).
  """
  name: str
  provides: tuple[str, ...]
  requires: tuple[str, ...]
  build: Callable[[Setup, frozenset], Produce]
  phase: str
  doc: str
  when: Callable[[ml_collections.ConfigDict], bool] = lambda c: True
  keeps_reference: bool = False
  off_doc: str = ""
  init: Callable[[Setup, Any], Any] | None = None
  check: Callable[[ml_collections.ConfigDict], None] | None = None
  trees: bool = False
  module: str = ""


# Inputs of the runner's update that are not contract fields (no estimator reads them).
RUNNER_INPUTS = frozenset({"critical_batch"})  # critical.FIELD

# Fields of the step's batch that are not contract fields: what the rollout hands the later
# producers, the loop and the extensions besides the contract fields (no estimator reads them).
# A stage's result keeps them beside its wanted contract fields.
RUNNER_FIELDS = {
    "attn_mask": "[B,T] bool, sharded: the tokens each row attends to (prompt, response, "
                 "observations)",
    "host": "numpy copies of the rollout for host-side producers: tokens, response_mask "
            "(tree batches: whole paths; own_mask the row's own tokens), prompt_mask, group_id, "
            "obs_mask, turn_id (multi-turn: step_mask)",
    "logprob_raw": "[B,T] f32: the sampler's log-probs under the raw model (temperature 1)",
    "texts": "the decoded responses (the verifier's), or the episodes' transcripts",
    "trajectories": "multi-turn rollouts: the environments' trajectories",
}

# The table's order, by declaring module (within a module: declaration order). It matters only
# between producers of the same field, where the first enabled one makes it: a rollout's own
# reward before the verifier's; the environment's and the trained verifier's step rewards
# before the step judge's; the sampler's behaviour log-probs (when chosen) before the policy
# pass's recomputed ones.
MODULE_ORDER = ("rollouts", "passes", "teachers", "likelihood", "rescoring", "verifier",
                "critical", "signals", "learners")
_DECLARED: list[Producer] = []


def register(p: Producer) -> Producer:
  """Adds a producer to the table (checked: contract fields, a unique name, a known module)."""
  bad = [f for f in p.provides + p.requires
         if f not in CONTRACT and f not in RUNNER_INPUTS and f not in RUNNER_FIELDS]
  if bad:
    raise ValueError(f"producer {p.name!r}: {bad} are not credit.CONTRACT fields")
  if any(q.name == p.name for q in _DECLARED):
    raise ValueError(f"producer {p.name!r} is declared twice")
  if p.module.rsplit(".", 1)[-1] not in MODULE_ORDER:
    raise ValueError(f"producer {p.name!r}: module {p.module!r} is not in MODULE_ORDER")
  _DECLARED.append(p)
  return p


def producer(name: str, *, provides: Iterable[str], requires: Iterable[str], phase: str,
             doc: str, **options) -> Callable:
  """Declares the decorated `build(setup, wanted)` as the producer `name` (see `Producer`
  for the fields); the function is returned unchanged, so one build can serve two rows."""
  def declare(build: Callable) -> Callable:
    register(Producer(name, tuple(provides), tuple(requires), build, phase, doc,
                      module=build.__module__, **options))
    return build
  return declare


def table() -> tuple[Producer, ...]:
  """Every declared producer, in table order (`MODULE_ORDER`, then declaration order)."""
  rank = {m: i for i, m in enumerate(MODULE_ORDER)}
  return tuple(sorted(_DECLARED, key=lambda p: rank[p.module.rsplit(".", 1)[-1]]))


def delimiter_ids(tok, delims) -> list[int]:
  """Token ids whose text holds one of the step delimiters."""
  out = []
  for i in range(tok.vocab_size):
    try:
      text = tok.decode([i])
    except (ValueError, KeyError, IndexError):
      continue
    if any(d in text for d in delims):
      out.append(i)
  return out


def is_multi_turn(c: ml_collections.ConfigDict) -> bool:
  """The run's task is a multi-turn environment task (`credit.envs`)."""
  if c.task in ("jsonl", "tfds"):
    return False
  try:
    task = tasks_lib.get_task(c.task, **dict(c.task_kwargs))
  except (KeyError, TypeError):
    return False  # build_data reports the bad task
  return bool(getattr(task, "multi_turn", False))


def examples_rows(examples: Mapping[str, Any]) -> list[dict]:
  n = len(next(iter(examples.values())))
  return [tasks_lib.as_example({k: examples[k][i] for k in examples}) for i in range(n)]


def verify_rows(s: Setup, examples: Mapping[str, Any], tokens, response_mask, example_of_row):
  """(texts, rewards [B]) of decoded responses; row b answers example `example_of_row[b]`."""
  texts = tasks_lib.decode_responses(s.data.tokenizer, tokens, response_mask)
  rows = [{k: examples[k][i] for k in examples} for i in np.asarray(example_of_row)]
  return texts, tasks_lib.verify_batch(s.data.task, rows, texts)


def task_has(method: str) -> Callable[[ml_collections.ConfigDict], bool]:
  """`when` of a producer that calls a built-in single-turn task's `method`."""
  def when(c: ml_collections.ConfigDict) -> bool:
    if is_multi_turn(c):
      return False
    try:
      task = tasks_lib.get_task(c.task, **dict(c.task_kwargs))
    except (KeyError, TypeError, ValueError):
      return False
    return callable(getattr(task, method, None))
  return when


def prompt_texts(ctx: StepContext) -> list[str]:
  """The step's N prompts as str."""
  return [tasks_lib.as_example({"p": p})["p"] for p in ctx.examples["prompt"]]


def prompt_width(tok, prompts: Iterable[str], what: str) -> int:
  """The longest of `prompts` as `encode_prompts` lays it out; SetupError if one cannot be
  encoded by the run's tokenizer."""
  try:
    return max(len(prompt_ids(tok, p)) for p in prompts)
  except ValueError as e:
    raise SetupError(f"{what}: the run's tokenizer cannot encode it ({e})") from None


def response_starts(batch: Mapping[str, Any]) -> np.ndarray:
  """[B] int32: the column where each rollout row's response starts. The sampler packs a
  row's prompt from column 0 (`credit.sampling.SampleOutput`), so it is the row's number of
  prompt tokens, which differs between rows when prompts differ in length."""
  return np.asarray(batch["host"]["prompt_mask"]).sum(axis=1).astype(np.int32)


def from_rollout(x_BT: jax.Array, start_B: jax.Array, width: int) -> jax.Array:
  """[B, T−width] the columns start_b .. start_b + T − width − 1 of each row (the response
  part of a rollout row, for width = P; columns past T are zero, the masks then False)."""
  T = x_BT.shape[1]
  cols = start_B[:, None] + jnp.arange(T - width)[None, :]
  got = jnp.take_along_axis(x_BT, jnp.minimum(cols, T - 1), axis=1)
  return jnp.where(cols < T, got, jnp.zeros((), x_BT.dtype))


def to_rollout(x_BS: jax.Array, start_B: jax.Array, width: int, T: int, fill) -> jax.Array:
  """The inverse of a re-laid row (another prompt of `width` columns, then the rollout's
  response from its column start_b): [B, width + R, ...] -> the rollout's [B, T, ...] columns,
  `fill` outside the response part. Trailing dims (top-k) are carried."""
  resp = x_BS[:, width:]
  R = resp.shape[1]
  j = jnp.arange(T)[None, :] - start_B[:, None]
  ok = (j >= 0) & (j < R)
  idx = jnp.clip(j, 0, R - 1).reshape(j.shape + (1,) * (resp.ndim - 2))
  got = jnp.take_along_axis(resp, idx, axis=1)
  return jnp.where(ok.reshape(ok.shape + (1,) * (resp.ndim - 2)), got,
                   jnp.asarray(fill, resp.dtype))


# --------------------------------------------------------------------------
# Response structure: steps, queries, parsed answers.
# --------------------------------------------------------------------------


def step_splitter(s: Setup) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
  """`split(tokens, response_mask) -> step_id`: the response cut into steps after every token
  whose text holds one of `c.step_delimiters` (the delimiter closes its step; −1 outside)."""
  tok = s.data.tokenizer
  ends = np.zeros(tok.vocab_size + 1, bool)  # token id -> closes a step (by its own text)
  ends[delimiter_ids(tok, s.c.step_delimiters)] = True

  def split(tokens: np.ndarray, resp: np.ndarray) -> np.ndarray:
    closes = ends[np.clip(tokens, 0, tok.vocab_size)] & resp
    before = np.cumsum(closes, axis=1) - closes
    return np.where(resp, before, -1).astype(np.int32)

  return split
