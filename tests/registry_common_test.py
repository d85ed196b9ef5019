"""Properties every registered estimator and policy loss must have, parametrized over the registry.

A new registry entry is covered the moment its module is imported: inputs are generated from
the contract (`tests/contract_fields.py`) for the entry's `needs`, layout arguments
(`num_groups`, `group_size`) come from its signature, state from its `init_state`. Per-method
test files keep only the worked example and a numpy reference.

Shapes are fixed (N=4 groups x G=4 samples, T=6; B=16 divides the 8 fake devices), and each
(entry, variant, group path) compiles once per property, shared through `_jitted`.
"""
from __future__ import annotations

import functools
import inspect
import os
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import credit
from credit import registry
from tests.contract_fields import (B, G, N, NUM_PROMPTS, T, make_fields,
                                   mixed_layout, random_state)

# --------------------------------------------------------------------------
# Estimator cases: the defaults, plus every optional input switched on.
# --------------------------------------------------------------------------


# Hyperparameters without a usable default that a recipe must set (see each docstring).
REQUIRED_HYPER = {
    "dgpo": (("vocab_size", 50),),   # the paper's entropy gate H/log|V|
}


def _variants(name: str) -> list[tuple[str, tuple, tuple]]:
  """(id, hyperparameters, optional contract inputs): the defaults, and every optional input
  switched on (the optional-needs switches set, plus every other contract field the function
  accepts, e.g. dense `token_reward`, `is_weights`)."""
  spec = registry.get_estimator(name)
  base = REQUIRED_HYPER.get(name, ())
  out = [(name, base, ())]
  switches = tuple(sorted({(s, 0.1) for _, s in spec.optional_needs}))
  extras = tuple(sorted(p for p in spec.params if p in credit.CONTRACT
                        and p not in spec.needs_for(dict(switches))))
  if switches or extras:
    out.append((name + "+optional", base + switches, extras))
  return out


EST_CASES = [v for n in registry.list_estimators() for v in _variants(n)]
EST_IDS = [c[0] for c in EST_CASES]
GROUP_CASES = [c for c in EST_CASES
               if "group_size" in registry.get_estimator(c[0].split("+")[0]).params]


def _spec(case) -> registry.EstimatorSpec:
  return registry.get_estimator(case[0].split("+")[0])


def _arguments(case, group_size):
  spec = _spec(case)
  names, static = spec.split_arguments(dict(case[1]), num_groups=N, group_size=group_size)
  return tuple(names) + case[2], static


@functools.lru_cache(maxsize=None)
def _jitted(case, group_size):
  spec = _spec(case)
  _, static = _arguments(case, group_size)
  return jax.jit(lambda data, state: _call(spec, data, state, static))


def _call(spec, data, state, static):
  kw = dict(data, **static)
  if spec.stateful:
    kw["state"] = state
  return spec.fn(**kw)


def run(case, fields, *, group_size=None, jit=True, state=None, seed=0):
  """All output leaves (advantages first) as numpy arrays."""
  spec = _spec(case)
  names, static = _arguments(case, group_size)
  data = {n: fields[n] for n in names}
  if state is None:
    state = random_state(spec, seed)
  out = _jitted(case, group_size)(data, state) if jit else _call(spec, data, state, static)
  adv = spec.advantages(out)
  rest = [x for x in jax.tree.leaves(out) if x is not adv]
  return [np.asarray(adv)] + [np.asarray(x) for x in rest]


def assert_close(got, want, rtol=1e-5, atol=1e-6):
  assert len(got) == len(want)
  for g_, w_ in zip(got, want):
    np.testing.assert_allclose(np.asarray(g_, np.float64), np.asarray(w_, np.float64),
                               rtol=rtol, atol=atol)


def _batch(seed, contiguous=False, **kw):
  """A mixed batch (`mixed_layout`) with every contract field."""
  reward, lengths, gid = mixed_layout(seed, contiguous)
  return make_fields(seed, reward=reward, lengths=lengths, group_id=gid, **kw)


def _rows(x) -> bool:
  return x.ndim >= 1 and x.shape[0] == B


# --------------------------------------------------------------------------
# Registration.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", registry.list_estimators())
def test_estimator_entry_is_complete(name):
  spec = registry.get_estimator(name)
  assert spec.family in registry.FAMILIES, spec.family
  # One hop from the name to its file: the module is named after the key, or its
  # docstring says it registers the key.
  module = sys.modules[spec.module]
  assert spec.module.startswith(f"credit.advantages.{spec.family}."), spec.module
  assert spec.module.rsplit(".", 1)[1] == name or name in (module.__doc__ or ""), spec.module
  assert os.path.basename(module.__file__)[:-3] == spec.module.rsplit(".", 1)[1]
  assert spec.confidence in registry.CONFIDENCE_TAGS
  assert "arXiv" in spec.paper or "http" in spec.paper, spec.paper
  assert set(spec.needs) <= set(credit.CONTRACT)
  doc = spec.fn.__doc__ or ""
  assert "Args" in doc or "as `" in doc, f"{name}: document the arguments"
  # Every exported name of the family namespace is reachable from credit.advantages.
  assert getattr(credit.advantages, spec.fn.__name__) is spec.fn
  assert getattr(getattr(credit.advantages, spec.family), spec.fn.__name__) is spec.fn


def test_families_are_namespaces():
  fams = registry.list_families()
  assert set(registry.FAMILIES) <= set(fams)
  for fam in registry.FAMILIES:
    assert getattr(credit.advantages, fam).__name__ == f"credit.advantages.{fam}"
  assert "grpo" in fams["outcome"]


def test_unknown_names_list_the_known_ones():
  with pytest.raises(KeyError, match="grpo"):
    credit.get_estimator("grpoo")
  with pytest.raises(KeyError, match="ppo_clip"):
    credit.get_policy_loss("ppo")
  with pytest.raises(ValueError, match="outcome"):
    registry.list_estimators("nope")


_PROVENANCE = dict(confidence="inferred", source="a test")


def test_registering_a_user_estimator():
  @registry.register_estimator("_user_test_constant", needs=("reward", "response_mask"),
                               paper="none (test), http://example.invalid",
                               confidence="inferred", source="a test")
  def constant_advantages(*, reward, response_mask, value: float = 1.0):
    """A user's estimator."""
    return jnp.where(response_mask, value, 0.0)

  try:
    spec = registry.get_estimator("_user_test_constant")
    assert spec.family == "user" and spec.confidence == "inferred"
    assert spec.source == "a test"
    assert spec.hyperparameters == ("value",)
    with pytest.raises(ValueError, match="valid: \\['value'\\]"):
      spec.split_arguments({"valeu": 2.0})
    with pytest.raises(ValueError, match="not contract fields"):
      registry.register_estimator("_bad", needs=("rewards",), paper="x", **_PROVENANCE)(
          constant_advantages)
    with pytest.raises(ValueError, match="registered twice"):
      registry.register_estimator("grpo", needs=("reward",), paper="x", **_PROVENANCE)(
          constant_advantages)
    # A trained loss must take the scores it asks for, and only known ones.
    for scores, loss in ((("logprob_answer",), lambda *, logprob, value=1.0: 0.0),
                         (("logits",), lambda *, logits, value=1.0: 0.0),
                         ((), lambda *, value=1.0: 0.0)):
      with pytest.raises(ValueError, match="must take its scores"):
        registry.register_estimator(
            "_bad_loss", needs=("reward", "response_mask"), paper="x", returns_output=True,
            **_PROVENANCE,
            trained_loss=registry.TrainedLoss(fn=loss, fields=(), targets=(),
                                              params=("value",), coef=1.0, scores=scores))(
                                                  constant_advantages)
    assert "_bad_loss" not in registry.list_estimators()
  finally:
    registry._ESTIMATORS.pop("_user_test_constant", None)


# --------------------------------------------------------------------------
# Estimator properties.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("case", EST_CASES, ids=EST_IDS)
def test_jit_equals_eager_without_retrace(case):
  """Jitted equals eager (op by op) on the defaults; every variant: no retrace on new values,
  and the contiguous [N,G] fast path equals the segment path. The eager run is the costly
  part (~1 s per case), so the `+optional` variants, whose jitted outputs every other test
  here checks, are not also run eagerly."""
  b = _batch(3)
  jitted = run(case, b)
  if "+optional" not in case[0]:
    assert_close(jitted, run(case, b, jit=False), rtol=1e-6, atol=1e-6)
  before = _jitted(case, None)._cache_size()
  run(case, _batch(4))                     # new values, same shapes: no new trace
  assert _jitted(case, None)._cache_size() == before
  if case in GROUP_CASES:                  # the contiguous [N,G] fast path equals the segment path
    bc = _batch(3, contiguous=True)
    assert_close(run(case, bc, group_size=G), run(case, bc), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", EST_CASES, ids=EST_IDS)
def test_masked_rows_equal_sliced_rows_and_padding_changes_nothing(case):
  """Rows masked out get exact zeros and leave every other row as if they were sliced away;
  extra padded columns holding garbage (NaN, -1) get zeros and change nothing. One batch does
  both (sliced rows and padded columns), so each case compiles one extra program."""
  b = _batch(7, holes=True)
  drop = np.zeros(B, bool)
  drop[[1, 6, 11, 12]] = True
  masked = run(case, dict(b, response_mask=b["response_mask"] & ~drop[:, None]))
  assert np.all(masked[0][drop] == 0.0)
  pad = 3
  cut = {}
  for k, v in b.items():
    v = v[~drop] if _rows(v) else v
    if v.ndim >= 2 and v.shape[1] == T:         # garbage under the mask must not leak
      fill = False if v.dtype == bool else (np.nan if v.dtype.kind == "f" else -1)
      v = np.concatenate([v, np.full((v.shape[0], pad) + v.shape[2:], fill, v.dtype)], axis=1)
    cut[k] = v
  got = run(case, cut)
  want = [x[~drop] if _rows(x) else x for x in masked]
  assert len(got) == len(want)
  for w_, g_ in zip(want, got):
    if g_.ndim >= 2 and g_.shape[1] == T + pad:
      assert np.all(g_[:, T:] == 0.0)
      g_ = g_[:, :T]
    np.testing.assert_allclose(g_, w_, rtol=1e-5, atol=1e-5)


# Estimators that rank rows batch-wide and break ties by row index (as their code does), so
# a permutation changes which tied rows win: their permutation test draws the ranked fields
# without ties.
RANKS_WITH_INDEX_TIES = {
    "tp_grpo": ("balancing keeps the turning points with the largest |key| (key Δ = R − V_0 "
                "or d_k), ties by flat index", ("step_value", "start_value")),
}


def _without_ties(case, b, rng):
  name = case[0].split("+")[0]
  for field in RANKS_WITH_INDEX_TIES.get(name, ("", ()))[1]:
    b[field] = rng.uniform(0.0, 1.0, b[field].shape).astype(np.float32)
  return b


@pytest.mark.parametrize("case", [c for c in EST_CASES if "group_id" in _spec(c).needs],
                         ids=lambda c: c[0])
def test_permutation_within_groups(case):
  rng = np.random.default_rng(11)
  b = _without_ties(case, _batch(9), rng)
  perm = rng.permutation(B)                # segment path: rows move with their group ids
  out, pout = run(case, b), run(case, {k: v[perm] for k, v in b.items()})
  for o, p_ in zip(out, pout):
    np.testing.assert_allclose(p_, o[perm] if _rows(o) else o, rtol=1e-5, atol=1e-6)
  if case in GROUP_CASES:                  # fast path: permutation inside each group
    bc = _without_ties(case, _batch(9, contiguous=True), rng)
    perm = np.concatenate([g * G + rng.permutation(G) for g in range(N)])
    out = run(case, bc, group_size=G)
    pout = run(case, {k: v[perm] for k, v in bc.items()}, group_size=G)
    for o, p_ in zip(out, pout):
      np.testing.assert_allclose(p_, o[perm] if _rows(o) else o, rtol=1e-5, atol=1e-6)


# Group estimators whose advantage is not exactly 0 when every reward of a group is equal,
# and why. Every other estimator taking `group_id` must give exact zeros there.
EQUAL_GROUP_NOT_ZERO = {
    "optimal_token_baseline": "B* = G·ΣW/(ΣW+ε): the baseline differs from G by O(ε)",
    "prime": "the implicit process rewards differ between samples of an equal-outcome group",
    "vimpo": "the actor advantage comes from the log-ratios alone (whitened over the batch)",
    "treg": "additive mode: A = Â + α r̂, and r̂ is not zero where Â is",
    "logprob_reward": "the reward is the answer log-likelihood, not the `reward` field",
    "verifree": "the reward is the answer probability, not the `reward` field",
    "rlpr": "the reward is the answer's mean token probability, not the `reward` field",
    "jepo": "credit comes from the answer log-likelihoods, not the `reward` field",
    "flr": "the reward is the follow-up likelihood, not the `reward` field",
    # Turn-level methods: credit from per-turn signals (information gain, progress, verdicts,
    # judge or rubric scores, PRM log-ratios) differs between the turns of equal-outcome rows.
    **{name: "per-turn signals give credit where the outcomes are equal" for name in (
        "igpo", "a2tgpo", "siop", "trace", "procredit", "vpr", "lean_first_error", "matchtir",
        "abseeker", "dataprm", "lean4agentic", "mapo", "oprl", "rdpo", "river", "scout",
        "taco", "veritas")},
    # Distillation: teacher / self-teacher signals give credit where the outcomes are equal.
    "diffgate": "an all-fail group gets pure bounded teacher guidance (d_g = 1)",
    "scope": "all-correct groups get weighted MLE (λ·w), all-failed ones weighted OPD",
    "hypereyes": "failed rows (reward ≤ 0) keep the OPD term after the group normalisation",
    "jolt_teacher": "per-token KL toward the student role: −β(ℓ_T|T − ℓ_S|T)",
    "solid": "the reward is the majority pseudo-label from answer_value, not the `reward` field",
    "sipo": "the contrastive self-teacher term applies wherever the group has a mistake",
    "opid": "the skill teacher term w_e·(ℓ_skill − ℓ) is per token, whatever the outcome",
    "seed": "the skill teacher term w_e·(ℓ_skill − ℓ) is per token, whatever the outcome",
    "sod": "the additive OPD term α·w·(ℓᵀ − ℓˢ) is not zero where Â = 0",
    "pcsd": "the additive teacher-support term β·w·s is not zero where Â = 0",
    "pbsd": "the additive turn-evidence term λ·ẽ contrasts the turns of a group",
    "prorag": "the additive PRM step term β·(s − μ')/σ' contrasts the steps of a group",
    "propa": "step_value_form: the additive MCTS step term β·(Q − μ^Q)/σ^Q contrasts steps",
    "spark": "the reward is the format-gated step-verdict aggregate, not the `reward` field",
    "tp_grpo": "step rewards are value increments d_k = V_k − V_{k−1}, not the `reward` field",
    # Reward shaping: the reward is built from structured signals, not the `reward` field alone.
    "scrl": "the advantage comes from `sub_rewards`, not the `reward` field",
    "verpo_tests": "the reward comes from `test_pass`, not the `reward` field",
    "c_grpo": "the rubric fraction is blended into the `reward` of correct rows",
    "atom_searcher": "λ·(mean atomic-thought score) is added to the outcome",
    "trace_cost": "the tool-cost bonus ranks the correct rows of an equal-accuracy group",
    "ppr_renorm": "step scores contrast the steps of equal-outcome rows",
    "rl_tango": "verifier step judgments contrast the steps of equal-outcome rows",
    # Behaviour diversity: responses differ where their rewards do not.
    "satisdive": "every row clears the cutoff, so the diversity term alone contrasts them",
    "novelty_search": "the novelty bonus contrasts responses of equal reward",
    "serene": "the exploration phase's advantage is the novelty, not the reward",
    "vigil": "the blind-confidence token penalty applies whatever the outcome",
    "opac": "the latent token rewards fitted over the batch differ between equal-label rows",
    "rewam": "the self-teacher's token log-ratio applies whatever the outcome",
}
# Group estimators whose only valid row in a group (default settings) is not exactly 0.
SINGLETON_NOT_ZERO = {
    "gdpo": "batch whitening shifts every row by the batch mean",
    "reinforce_pp_baseline": "batch whitening shifts every row by the batch mean",
    "dcpo": "the prompt's history gives a baseline for a single sample",
    "vimpo": "the actor advantage comes from the log-ratios alone (whitened over the batch)",
    "treg": "additive mode: A = Â + α r̂ with Â = 0",
    "ppr_renorm": "a lone row's steps are z-scored against each other",
    "rl_tango": "a lone row's steps are z-scored against each other (n ≤ 1 step: μ=0, σ=1)",
    # Turn-level methods pooling the turns of one row (or the batch), so a lone sample's
    # turns still contrast with each other; MatchTIR keeps a lone sample's raw value (code).
    **{name: "per-turn contrasts within one sample (or a batch-wide part)" for name in (
        "igpo", "siop", "trace", "procredit", "lean_first_error", "matchtir", "abseeker",
        "dataprm", "veritas", "oprl", "mapo", "taco", "rdpo", "lean4agentic")},
    # Distillation: a lone sample keeps its teacher term (or its weight-1 path).
    "scope": "a lone sample has weight 1: λ (correct) or the teacher gap (failed)",
    "jolt_teacher": "per-token teacher-role KL",
    "diffgate": "a failed lone sample gets the bounded teacher term",
    "hypereyes": "a failed lone sample keeps the OPD term",
    "sipo": "a lone failed sample keeps its contrast term",
    "opid": "code: a lone trajectory gets μ=0, σ=1, i.e. its raw reward",
    "seed": "code: a lone trajectory gets μ=0, σ=1, i.e. its raw reward",
    "sod": "the additive OPD term α·w·(ℓᵀ − ℓˢ) is not zero where Â = 0",
    "pcsd": "the additive teacher-support term β·w·s is not zero where Â = 0",
    "pbsd": "the additive turn-evidence term λ·ẽ contrasts the turns of a lone sample",
    "vigil": "a lone sample keeps its blind-confidence token penalty",
    "rewam": "a lone sample keeps its self-teacher token term",
}


def _degenerate_batch():
  """Group 0 all equal, group 1 a singleton (three rows masked), row 15 empty."""
  b = _batch(17, contiguous=True)
  b["reward"][:G] = 2.0
  b["reward_components"][:G] = 0.5
  b["response_mask"][G + 1:2 * G] = False
  b["response_mask"][B - 1] = False
  return b


@pytest.mark.parametrize("case", EST_CASES, ids=EST_IDS)
def test_degenerate_batches_give_finite_values_and_gradients(case):
  spec = _spec(case)
  b = _degenerate_batch()
  mask = b["response_mask"]
  outs = run(case, b)
  assert all(np.all(np.isfinite(x)) for x in outs)
  assert np.all(outs[0][~mask] == 0.0)
  if ("group_id" in spec.needs and spec.name not in SINGLETON_NOT_ZERO
      and "+optional" not in case[0]):
    assert np.all(outs[0][G] == 0.0), outs[0][G]          # group 1 is a singleton
  # All rewards equal everywhere (fresh state: no history). Only then, since batch-whitened
  # estimators shift an all-equal group by the batch mean.
  same = dict(b, reward=np.full(B, 0.7, np.float32),
              reward_components=np.full_like(b["reward_components"], 0.3))
  outs = run(case, same, state=spec.init_state(NUM_PROMPTS) if spec.stateful else None)
  assert all(np.all(np.isfinite(x)) for x in outs)
  if "group_id" in spec.needs and spec.name not in EQUAL_GROUP_NOT_ZERO:
    assert np.all(outs[0] == 0.0)
  # Nothing valid at all: exact zeros.
  outs = run(case, dict(b, response_mask=np.zeros_like(mask)))
  assert np.all(outs[0] == 0.0) and all(np.all(np.isfinite(x)) for x in outs)
  # Gradients with respect to every float input: finite, and zero under the mask.
  names, static = _arguments(case, None)
  floats = {n: b[n] for n in names if b[n].dtype.kind == "f"}
  rest = {n: b[n] for n in names if n not in floats}
  if not floats:
    return
  state = random_state(spec)
  w = np.random.default_rng(0).normal(size=(B, T)).astype(np.float32)
  loss = lambda fl: jnp.sum(spec.advantages(_call(spec, dict(fl, **rest), state, static)) * w)
  grads = jax.jit(jax.grad(loss))(floats)
  for k, g_ in grads.items():
    g_ = np.asarray(g_)
    assert np.all(np.isfinite(g_)), k
    if g_.shape[:2] == (B, T):
      assert np.all(g_[~mask] == 0.0), k


@pytest.mark.parametrize("case", EST_CASES, ids=EST_IDS)
def test_sharded_equals_unsharded(case):
  mesh = Mesh(np.asarray(jax.devices()), ("data",))
  b = _batch(23)
  spec = _spec(case)
  names, static = _arguments(case, None)

  def shard(x):
    x = np.asarray(x)
    axes = ("data",) + (None,) * (x.ndim - 1) if _rows(x) else ()
    return jax.device_put(x, NamedSharding(mesh, P(*axes)))

  data = {n: shard(b[n]) for n in names}
  state = jax.tree.map(shard, random_state(spec))
  out = _jitted(case, None)(data, state)
  adv = spec.advantages(out)
  got = [np.asarray(adv)] + [np.asarray(x) for x in jax.tree.leaves(out) if x is not adv]
  assert_close(got, run(case, b), atol=1e-5)


def _numeric_hyper(spec, skip=()) -> str | None:
  """The first float hyperparameter that is neither static nor an optional-needs switch."""
  switches = {s for _, s in getattr(spec, "optional_needs", ())}
  sig = inspect.signature(spec.fn).parameters
  for p in spec.hyperparameters:
    d = sig[p].default
    if (p not in spec.static_argnames and p not in switches and p not in skip
        and isinstance(d, float) and not isinstance(d, bool)):
      return p
  return None


@pytest.mark.parametrize("name", registry.list_estimators())
def test_vmap_over_a_hyperparameter(name):
  spec = registry.get_estimator(name)
  hp = _numeric_hyper(spec)
  if hp is None:
    pytest.skip(f"{name} has no float hyperparameter that may be traced")
  default = inspect.signature(spec.fn).parameters[hp].default
  values = np.asarray([default, 0.5 * default + 0.1], np.float32)
  case = (name, REQUIRED_HYPER.get(name, ()), ())
  b = _batch(29)
  names, static = _arguments(case, None)
  data = {n: b[n] for n in names}
  state = random_state(spec)
  one = lambda v: spec.advantages(_call(spec, data, state, dict(static, **{hp: v})))
  sweep = jax.jit(jax.vmap(one))(values)
  single = jax.jit(one)  # one program for both values (the eager path is checked above)
  for i, v in enumerate(values):
    np.testing.assert_allclose(np.asarray(sweep[i]), np.asarray(single(v)), rtol=1e-5,
                               atol=1e-5, err_msg=f"{name}: vmap over {hp}={v}")


# --------------------------------------------------------------------------
# Policy losses.
# --------------------------------------------------------------------------

LOSSES = registry.list_policy_losses()
REDUCTION_ARGS = ("logprob_sampler", "is_level", "is_mode", "is_threshold", "is_threshold_lower",
                  "loss_agg_mode", "num_tokens_global", "num_seqs_global", "norm_constant",
                  "sample_weight", "policy_version", "train_version", "max_staleness")


def _loss_fields(seed, *, lengths=None):
  rng = np.random.default_rng(seed)
  b = make_fields(seed, lengths=lengths)
  b["logprob"] = (b["logprob_old"] + rng.normal(0, 0.3, (B, T))).astype(np.float32)
  b["advantages"] = rng.normal(0, 1, (B, T)).astype(np.float32)
  return b


@functools.lru_cache(maxsize=None)
def _loss_jitted(name):
  spec = registry.get_policy_loss(name)
  return jax.jit(lambda data: spec.fn(**data))


def loss_run(name, fields, jit=True):
  spec = registry.get_policy_loss(name)
  data = {n: fields[n] for n in spec.needs}
  out = _loss_jitted(name)(data) if jit else spec.fn(**data)
  return np.asarray(out.loss), {k: np.asarray(v) for k, v in out.metrics.items()}


@pytest.mark.parametrize("name", LOSSES)
def test_loss_entry_is_complete(name):
  spec = registry.get_policy_loss(name)
  assert spec.confidence in registry.CONFIDENCE_TAGS
  assert {"logprob", "logprob_old", "advantages", "response_mask"} <= spec.needs
  assert set(REDUCTION_ARGS) <= set(spec.params), "every loss takes the shared reduction"
  assert spec.token_fn.__name__.endswith("_loss")
  assert spec.token_fn.__name__ not in {registry.get_estimator(e).fn.__name__
                                        for e in registry.list_estimators()}
  assert getattr(credit.losses, spec.token_fn.__name__) is spec.token_fn


@pytest.mark.parametrize("name", LOSSES)
def test_loss_jit_equals_eager_and_sharded(name):
  b = _loss_fields(31)
  loss, metrics = loss_run(name, b)
  eager_loss, eager_metrics = loss_run(name, b, jit=False)
  np.testing.assert_allclose(loss, eager_loss, rtol=1e-5, atol=1e-6)
  assert set(metrics) == set(eager_metrics)
  mesh = Mesh(np.asarray(jax.devices()), ("data",))
  spec = registry.get_policy_loss(name)
  data = {n: jax.device_put(b[n], NamedSharding(mesh, P("data", *[None] * (b[n].ndim - 1))))
          for n in spec.needs}
  out = _loss_jitted(name)(data)
  np.testing.assert_allclose(np.asarray(out.loss), loss, rtol=1e-5, atol=1e-6)
  for k in metrics:
    np.testing.assert_allclose(np.asarray(out.metrics[k]), metrics[k], rtol=1e-4, atol=1e-5,
                               err_msg=k)


@pytest.mark.parametrize("name", [n for n in LOSSES
                                  if not registry.get_policy_loss(n).batch_coupled])
def test_loss_masked_rows_equal_sliced_rows_and_padding(name):
  b = _loss_fields(37)
  drop = np.zeros(B, bool)
  drop[[0, 7, 9]] = True
  masked = loss_run(name, dict(b, response_mask=b["response_mask"] & ~drop[:, None]))
  sliced = loss_run(name, {k: v[~drop] for k, v in b.items()})
  # Padding columns full of garbage (NaN, ±inf) change nothing.
  fill = {"b": False, "f": np.inf}
  pad = {k: (np.concatenate([v, np.full((B, 3) + v.shape[2:], fill.get(v.dtype.kind, -1),
                                        v.dtype)], 1) if v.shape[:2] == (B, T) else v)
         for k, v in b.items()}
  pad["logprob"][:, T:] = -np.inf
  pad["advantages"][:, T + 1] = np.nan
  padded = loss_run(name, pad)
  unpadded = loss_run(name, b)
  for got, want in ((masked, sliced), (padded, unpadded)):
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    assert set(got[1]) == set(want[1])
    for k in want[1]:
      np.testing.assert_allclose(got[1][k], want[1][k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("name", LOSSES)
def test_loss_degenerate_inputs_finite_gradients(name):
  spec = registry.get_policy_loss(name)
  lengths = np.random.default_rng(41).integers(1, T + 1, B)
  lengths[3] = 0
  b = _loss_fields(41, lengths=lengths)
  mask = b["response_mask"]
  b["advantages"][:G] = 0.0                                   # an all-equal group
  b["logprob"][4, 0], b["logprob_old"][4, 0] = -0.01, -60.0   # an extreme ratio
  b["logprob"][5, 0], b["logprob_old"][5, 0] = -60.0, -0.01
  for k in ("logprob", "logprob_old", "advantages"):          # garbage under the mask
    b[k] = np.where(mask, b[k], np.nan).astype(np.float32)
  rest = {n: b[n] for n in spec.needs if n != "logprob"}

  def loss(lp):
    return spec.fn(logprob=lp, **rest).loss

  value, grad = jax.jit(jax.value_and_grad(loss))(b["logprob"])
  assert np.isfinite(value)
  grad = np.asarray(grad)
  assert np.all(np.isfinite(grad)) and np.all(grad[~mask] == 0.0)
  empty = dict(b, response_mask=np.zeros_like(mask))
  value, metrics = loss_run(name, empty)
  assert value == 0.0 and all(np.all(np.isfinite(v)) for v in metrics.values())


@pytest.mark.parametrize("name", LOSSES)
def test_loss_vmap_over_a_hyperparameter(name):
  spec = registry.get_policy_loss(name)
  hp = _numeric_hyper(spec, skip=("is_threshold",))
  if hp is None:
    pytest.skip(f"{name} has no float hyperparameter of its own")
  default = inspect.signature(spec.fn).parameters[hp].default
  values = np.asarray([default, 0.5 * default + 0.1], np.float32)
  b = _loss_fields(43)
  data = {n: b[n] for n in spec.needs}
  sweep = jax.jit(jax.vmap(lambda v: spec.fn(**data, **{hp: v}).loss))(values)
  for i, v in enumerate(values):
    np.testing.assert_allclose(np.asarray(sweep[i]),
                               np.asarray(spec.fn(**data, **{hp: float(v)}).loss),
                               rtol=1e-5, atol=1e-6, err_msg=f"{name}: vmap over {hp}")


# --------------------------------------------------------------------------
# The catalog (`python -m credit.catalog`; the docs' method catalogue uses the same functions).
# --------------------------------------------------------------------------


def test_catalog_compact_fits_100_columns_and_lists_every_method(capsys):
  from credit import catalog
  assert catalog.main([]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert max(len(line) for line in lines) <= 100
  names = {line.split()[0] for line in lines[1:-1]}
  assert names == set(registry.list_estimators()) | set(registry.list_policy_losses())
  assert catalog.main(["--wide"]) == 0
  wide = capsys.readouterr().out
  for name in registry.list_estimators() + registry.list_policy_losses():
    assert f"| `{name}` |" in wide


def test_catalog_family_filter(capsys):
  from credit import catalog
  for family, names in registry.list_families().items():
    assert [r[0] for r in catalog.rows(family)] == list(names)
  assert catalog.main(["--family", "loss"]) == 0
  listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:-1]]
  assert listed == list(registry.list_policy_losses())
  with pytest.raises(SystemExit) as e:
    catalog.main(["--family", "nope"])
  assert e.value.code == 2
  assert "unknown family 'nope'" in capsys.readouterr().err
