"""credit.bench: true token advantages on bifurcation tasks, and the credit metrics."""
import dataclasses
import functools

import hypothesis
import hypothesis.extra.numpy as hnp
import jax
import numpy as np
import pytest
from flax import nnx
from hypothesis import strategies as st

from credit import bench
from credit.models import Decoder, tiny_config
from credit.sampling import Sampler, sampling_params
from credit.tasks import CharTokenizer, get_task
from credit.tasks.char_tokenizer import encode_prompts


@functools.lru_cache(maxsize=None)
def _setup():
  """A tiny random policy, its sampler, and one sampled batch on pivotal (pivots 0 and 1)."""
  tok = CharTokenizer()
  model = Decoder(tiny_config("qwen3", vocab_size=tok.vocab_size, hidden_size=32,
                              intermediate_size=64, num_layers=1, head_dim=8),
                  rngs=nnx.Rngs(3))
  state = nnx.state(model)
  sampler = Sampler(model, pad_id=tok.pad_id, stop_tokens=(tok.eos_id,))
  task = get_task("pivotal", response_len=2, shift=0)
  examples = [{"prompt": f"{p}:{d}=", "answer": "", "pivot_position": p, "pivot_value": d}
              for p, d in ((0, 4), (1, 7), (1, 2))]
  G = 4
  toks, pmask = encode_prompts(tok, [e["prompt"] for e in examples], 5)
  out = sampler(state, prompt_tokens=toks, prompt_mask=pmask, key=jax.random.key(0),
                max_new_tokens=3, num_samples=G, temperature=1.0)
  rows = [examples[i // G] for i in range(len(examples) * G)]
  batch = {k: np.asarray(getattr(out, k)) for k in ("tokens", "response_mask", "prompt_mask",
                                                     "group_id")}
  return tok, state, sampler, task, rows, batch


def _truth(exact, num_rollouts=64, **kw):
  tok, state, sampler, task, rows, b = _setup()
  return bench.true_advantages(sampler, state, task=task, tokenizer=tok, examples=rows,
                               tokens=b["tokens"], response_mask=b["response_mask"],
                               prompt_mask=b["prompt_mask"], key=jax.random.key(5),
                               num_rollouts=num_rollouts, exact=exact, **kw)


@functools.lru_cache(maxsize=None)
def _both():
  return _truth(True), _truth(False)


def test_monte_carlo_values_equal_exact_enumeration_within_their_error():
  exact, mc = _both()
  resp = _setup()[5]["response_mask"]
  assert np.all(exact.stderr == 0.0)
  for x in (exact, mc):
    assert np.all(x.value[~resp] == 0.0) and np.all(x.advantage[~resp] == 0.0)
  sampled = mc.stderr > 0
  assert sampled.any()
  z = np.abs(mc.advantage - exact.advantage)[sampled] / mc.stderr[sampled]
  assert np.all(z < 4.5), z
  np.testing.assert_allclose(mc.advantage[~sampled], exact.advantage[~sampled], atol=1e-6)


def test_the_decision_is_exact_and_nothing_after_it_has_credit():
  tok, state, sampler, task, rows, b = _setup()
  exact, _ = _both()
  # One forward pass per row: V(s_d) = Σ_a π(a | s_d) · verify(prefix + a).
  policy = bench._Policy(sampler.graphdef, state, sampling_params(temperature=1.0), 64)
  for i, ex in enumerate(rows):
    cols = np.flatnonzero(b["response_mask"][i])
    resp = b["tokens"][i, cols].tolist()
    d = task.decided_at(ex)
    if len(resp) <= d:
      continue
    lp = policy([b["tokens"][i][b["prompt_mask"][i]].tolist() + resp[:d]], tok.pad_id)[0]
    text = tok.decode(resp[:d])
    rew = [task.verify(ex, text if a == tok.eos_id else text + tok.decode([a]))
           for a in range(lp.size)]
    v = float(np.dot(np.exp(lp), rew))
    r = task.verify(ex, tok.decode(resp))
    np.testing.assert_allclose(exact.value[i, cols[d]], v, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(exact.advantage[i, cols[d]], r - v, rtol=1e-5, atol=1e-7)
    assert np.all(exact.advantage[i, cols[d + 1:]] == 0.0)
    assert np.all(exact.value[i, cols[d + 1:]] == r)
    assert exact.pivot_mask[i, cols[d]] and exact.pivot_mask[i].sum() == 1
    assert exact.decided_mask[i, cols[d]] and exact.decided_mask[i].sum() == 1
  assert not np.any(exact.decided_mask & ~b["response_mask"])
  # Q(s_t, y_t) − V(s_t) telescopes: Σ_t A_t = r − V(s_0) on every row.
  for i, ex in enumerate(rows):
    cols = np.flatnonzero(b["response_mask"][i])
    r = task.verify(ex, tok.decode(b["tokens"][i, cols].tolist()))
    np.testing.assert_allclose(exact.advantage[i].sum(), r - exact.value[i, cols[0]], atol=1e-5)


class _EvenAnd:
  """A local bifurcation task: reward 1 iff the characters at all of the example's pivots have
  even code points (AND of two pivots; about half the vocabulary is right at each)."""
  name = "even_and"

  def pivot_positions(self, example):
    return tuple(example["pivots"])

  def decided_at(self, example):
    return max(example["pivots"])

  def verify(self, example, response):
    return float(all(len(response) > p and ord(response[p]) % 2 == 0
                     for p in example["pivots"]))


def test_two_pivots_under_top_k_sampling():
  """π is the top-k distribution the sampler draws from: Monte-Carlo equals enumeration under
  top_k = 3, credit is 0 after the decision, and Σ_t A_t = r − V(s_0) telescopes exactly."""
  tok, state, sampler, _, _, _ = _setup()
  task = _EvenAnd()
  examples = [{"prompt": "ab", "pivots": (0, 2)}, {"prompt": "xyz", "pivots": (1, 2)}]
  G = 3
  toks, pmask = encode_prompts(tok, [e["prompt"] for e in examples], 4)
  out = sampler(state, prompt_tokens=toks, prompt_mask=pmask, key=jax.random.key(1),
                max_new_tokens=4, num_samples=G, temperature=1.0, top_k=3)
  rows = [examples[i // G] for i in range(len(examples) * G)]
  resp = np.asarray(out.response_mask)
  kw = dict(task=task, tokenizer=tok, examples=rows, tokens=np.asarray(out.tokens),
            response_mask=resp, prompt_mask=np.asarray(out.prompt_mask), key=jax.random.key(2),
            top_k=3)
  exact = bench.true_advantages(sampler, state, exact=True, **kw)
  mc = bench.true_advantages(sampler, state, num_rollouts=48, **kw)
  sampled = mc.stderr > 0
  assert sampled.any() and 0.0 < exact.value[resp].mean() < 1.0
  z = np.abs(mc.advantage - exact.advantage)[sampled] / mc.stderr[sampled]
  assert np.all(z < 4.5), z
  for i, ex in enumerate(rows):
    cols = np.flatnonzero(resp[i])
    r = task.verify(ex, tok.decode(np.asarray(out.tokens)[i, cols].tolist()))
    want = np.zeros(resp.shape[1], bool)
    want[cols[[p for p in ex["pivots"] if p < cols.size]]] = True
    np.testing.assert_array_equal(exact.pivot_mask[i], want)
    for x in (exact, mc):
      assert np.all(x.advantage[i, cols[3:]] == 0.0)
      np.testing.assert_allclose(x.advantage[i].sum(), r - x.value[i, cols[0]], atol=1e-5)
  # One compiled forward pass per shape, reused by later calls.
  n = bench._next_logprobs._cache_size()
  bench.true_advantages(sampler, state, num_rollouts=48, **kw)
  assert bench._next_logprobs._cache_size() == n


def test_bad_inputs_are_refused():
  tok, state, sampler, task, rows, b = _setup()
  kw = dict(tokenizer=tok, examples=rows, tokens=b["tokens"], response_mask=b["response_mask"],
            prompt_mask=b["prompt_mask"], key=jax.random.key(0))
  with pytest.raises(TypeError, match="pivot_positions"):
    bench.true_advantages(sampler, state, task=get_task("copy_digit"), **kw)
  with pytest.raises(ValueError, match="selects no token"):
    bench.true_advantages(sampler, state, task=task,
                          **dict(kw, response_mask=np.zeros_like(b["response_mask"])))
  with pytest.raises(ValueError, match="same"):
    bench.true_advantages(sampler, state, task=task, **dict(kw, tokens=b["tokens"][:, :-1]))
  with pytest.raises(ValueError, match="examples"):
    bench.true_advantages(sampler, state, task=task, **dict(kw, examples=rows[:-1]))
  with pytest.raises(ValueError, match="max_enumeration"):
    bench.true_advantages(sampler, state, task=task, exact=True, max_enumeration=10, **kw)
  with pytest.raises(ValueError, match="num_rollouts"):
    bench.true_advantages(sampler, state, task=task, num_rollouts=0, **kw)
  with pytest.raises(ValueError, match="overlap"):
    bench.true_advantages(sampler, state, task=task, **dict(kw, prompt_mask=b["response_mask"]))
  with pytest.raises(ValueError, match="contiguous"):
    holes = b["response_mask"].copy()
    row = int(np.flatnonzero(holes.sum(1) >= 3)[0])
    holes[row, np.flatnonzero(holes[row])[1]] = False
    bench.true_advantages(sampler, state, task=task, **dict(kw, response_mask=holes))
  with pytest.raises(ValueError, match="cut at 1 tokens"):
    cut = b["response_mask"].copy()
    row = next(i for i in range(len(rows)) if task.decided_at(rows[i]) == 1
               and b["tokens"][i, np.flatnonzero(cut[i])[0]] != tok.eos_id)
    cut[row, np.flatnonzero(cut[row])[1:]] = False
    bench.true_advantages(sampler, state, task=task, **dict(kw, response_mask=cut))
  with pytest.raises(ValueError, match="temperature"):
    bench.true_advantages(sampler, state, task=task, temperature=-1.0, **kw)


# --------------------------------------------------------------------------
# Metrics.
# --------------------------------------------------------------------------


def _metric_case(seed=0, B=8, T=6):
  rng = np.random.default_rng(seed)
  resp = np.zeros((B, T), bool)
  for b in range(B):
    resp[b, 1:1 + rng.integers(2, T)] = True
  piv = np.zeros((B, T), bool)
  piv[np.arange(B), 2] = True
  true = np.where(resp, rng.normal(size=(B, T)) * 0.1, 0.0)
  true[:, 2] = np.where(np.arange(B) % 2 == 0, 0.6, -0.4)
  gid = np.arange(B) // 4
  return true, resp, piv & resp, gid


def test_oracle_is_perfect_and_a_constant_is_chance():
  true, resp, piv, gid = _metric_case()
  m = bench.credit_metrics(true, true, resp, piv, gid)
  assert m["corr"] == pytest.approx(1.0) and m["sign_acc"] == 1.0
  assert m["pivot_mass"] == pytest.approx(m["pivot_mass_true"])
  c = bench.credit_metrics(np.where(resp, 0.7, 0.0), true, resp, piv, gid)
  assert c["corr"] == 0.0 and c["sign_acc"] == 0.5
  assert c["pivot_mass"] == pytest.approx(c["chance"]) and c["zero_tokens"] == 0.0
  z = bench.credit_metrics(np.zeros_like(true), true, resp, piv, gid)
  assert z["corr"] == 0.0 and z["sign_acc"] == 0.5 and z["zero_groups"] == 1.0
  assert z["pivot_mass"] == 0.0 and z["zero_tokens"] == 1.0
  one_class = np.where(true > 0, true, np.where(piv, 0.0, true))  # no negative pivot left
  assert np.isnan(bench.credit_metrics(true, one_class, resp, piv, gid)["sign_acc"])
  # Degenerate truth (all zero): every metric finite except the undefined sign accuracy.
  d = bench.credit_metrics(true, np.zeros_like(true), resp, piv, gid)
  assert d["corr"] == 0.0 and d["pivot_mass_true"] == 0.0 and np.isnan(d["sign_acc"])
  assert all(np.isfinite(v) for k, v in d.items() if k != "sign_acc")


@hypothesis.given(hnp.arrays(np.float32, (6, 5), elements=st.floats(-3, 3, width=32)),
                  hnp.arrays(np.float32, (6, 5), elements=st.floats(-3, 3, width=32)),
                  hnp.arrays(np.bool_, (6, 5)), hnp.arrays(np.bool_, (6, 5)))
def test_metrics_are_bounded_and_ignore_padding(est, true, resp, piv):
  hypothesis.assume(resp.any())
  gid = np.arange(6) // 2
  m = bench.credit_metrics(est, true, resp, piv, gid)
  assert -1.0 <= m["corr"] <= 1.0
  for k in ("pivot_mass", "pivot_mass_true", "chance", "zero_tokens", "zero_groups"):
    assert 0.0 <= m[k] <= 1.0, k
  assert np.isnan(m["sign_acc"]) or 0.0 <= m["sign_acc"] <= 1.0
  # Garbage in padded columns and outside the response changes nothing.
  pad = lambda x, v: np.concatenate([np.where(resp, x, v) if x.dtype != bool else x,
                                     np.full((6, 2), v, x.dtype)], axis=1)
  m2 = bench.credit_metrics(pad(est, 9.0), pad(true, -9.0), pad(resp, False), pad(piv, True),
                            gid)
  for k in m:
    np.testing.assert_allclose(m2[k], m[k], rtol=1e-9, atol=1e-12, equal_nan=True)


def test_learning_statistics_and_bootstrap():
  steps, acc = [0, 10, 20, 30], [0.0, 0.4, 0.8, 0.9]
  assert bench.steps_to_threshold(steps, acc, 0.8) == 20.0
  assert bench.steps_to_threshold(steps, acc, 0.95) is None
  assert bench.auc(steps, acc) == pytest.approx((0.2 + 0.6 + 0.85) / 3)
  assert bench.auc([5], [0.3]) == 0.3
  x = [0.8, 0.85, 0.9, 0.7]
  lo, hi = bench.bootstrap_ci(x, seed=1)
  assert (lo, hi) == bench.bootstrap_ci(x, seed=1) and lo <= np.mean(x) <= hi and lo < hi
  assert bench.bootstrap_ci([0.5, 0.5, 0.5]) == (0.5, 0.5)
  agg = bench.aggregate([{"corr": 0.2, "sign_acc": np.nan}, {"corr": 0.4, "sign_acc": 0.5},
                         {"corr": 0.3, "sign_acc": 0.7}])
  assert agg["corr"] == pytest.approx((0.3, np.std([0.2, 0.4, 0.3])))
  assert agg["sign_acc"] == pytest.approx((0.6, 0.1))  # NaN (undefined) batches left out
  assert np.isnan(bench.aggregate([{"sign_acc": np.nan}])["sign_acc"]).all()
  with pytest.raises(ValueError, match="keys"):
    bench.aggregate([{"corr": 0.2}, {"zero_tokens": 0.4}])
  with pytest.raises(ValueError, match="increase"):
    bench.auc([0, 0], [1, 1])
  with pytest.raises(ValueError, match="finite"):
    bench.bootstrap_ci([0.1, np.nan])
  with pytest.raises(ValueError, match="selects no token"):
    bench.credit_metrics(np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((2, 3), bool),
                         np.zeros((2, 3), bool), np.zeros(2))
  with pytest.raises(ValueError, match="finite"):
    bench.credit_metrics(np.full((2, 3), np.nan), np.zeros((2, 3)), np.ones((2, 3), bool),
                         np.zeros((2, 3), bool), np.zeros(2))


def test_learning_log_resumes_finished_runs_only(tmp_path):
  """`--resume` keeps the finished (task, estimator, seed) runs of learning.csv, redoes a
  partial one, and refuses other settings."""
  import dataclasses
  import os
  from benchmarks import credit_bench
  s = dataclasses.replace(credit_bench.QUICK, learn_steps=20)
  log = credit_bench.LearningLog(str(tmp_path), s, resume=False)
  full = [{"step": 0, "wall_time": 0.0, "eval_accuracy": 0.1},
          {"step": 20, "wall_time": 3.0, "eval_accuracy": 0.5}]
  log.add("pivotal", "grpo", 0, full)
  log.add("pivotal", "grpo", 1, full[:1])  # interrupted before its last eval
  again = credit_bench.LearningLog(str(tmp_path), s, resume=True)
  assert again.get("pivotal", "grpo", 0) == full
  assert again.get("pivotal", "grpo", 1) is None
  with open(os.path.join(tmp_path, "learning.csv")) as f:
    assert len(f.read().splitlines()) == 3  # the header and the finished run's two evals
  assert credit_bench.LearningLog(str(tmp_path), s, resume=False).get("pivotal", "grpo", 0) is None
  log = credit_bench.LearningLog(str(tmp_path), s, resume=False)
  log.add("pivotal", "grpo", 0, full)
  with pytest.raises(SystemExit, match="other settings"):
    credit_bench.LearningLog(str(tmp_path), dataclasses.replace(s, learn_steps=30), resume=True)
  # A setting added after settings.json was written counts as its default there.
  import json
  # (a tuple-valued one, such as the per-task learning warm-ups, reads back as lists)
  assert "learn_sft_by_task" in json.load(open(os.path.join(tmp_path, "settings.json")))
  assert (credit_bench.learn_sft_steps(credit_bench.FULL, "pivotal"),
          credit_bench.learn_sft_steps(credit_bench.FULL, "distractor"),
          credit_bench.learn_sft_steps(credit_bench.QUICK, "distractor")) == (90, 170, 0)
  spath = os.path.join(tmp_path, "settings.json")
  saved = json.load(open(spath))
  del saved["tree_criterion"]
  json.dump(saved, open(spath, "w"))
  assert credit_bench.LearningLog(str(tmp_path), s, resume=True).get("pivotal", "grpo", 0) == full
  json.dump(saved, open(spath, "w"))
  with pytest.raises(SystemExit, match="other settings"):
    credit_bench.LearningLog(str(tmp_path), dataclasses.replace(s, tree_criterion="first_error"),
                             resume=True)
  # A warm-up calibrated since for a task the file does not hold leaves its runs valid; a
  # changed warm-up for a task it holds does not.
  w = dataclasses.replace(s, learn_sft_steps=90, learn_sft_by_task=(("delayed", 120),))
  credit_bench.LearningLog(str(tmp_path), w, resume=False).add("pivotal", "grpo", 0, full)
  calibrated = dataclasses.replace(w, learn_sft_by_task=(("delayed", 120), ("pivotal_or", 60)))
  assert credit_bench.LearningLog(str(tmp_path), calibrated, resume=True).get(
      "pivotal", "grpo", 0) == full
  with pytest.raises(SystemExit, match="other settings"):
    credit_bench.LearningLog(str(tmp_path), dataclasses.replace(
        calibrated, learn_sft_by_task=(("pivotal", 100),)), resume=True)


def test_learning_warm_up_and_tree_estimators(tmp_path):
  """With `learn_sft_steps` the learning part starts from a warm-up of its own (the credit
  part keeps `sft_steps`). Estimators that need branch fields are scored (and learn) on tree
  batches of the same snapshots, next to GRPO and the truth on those batches; a tree row's
  truth lies along its whole path, and its own tokens are the ones scored."""
  import dataclasses
  import os
  from benchmarks import credit_bench
  s = dataclasses.replace(credit_bench.QUICK, estimators=("grpo", "cbpo", "prm_transform"),
                          learn_estimators=("grpo", "cbpo"), seeds=1, sft_steps=2,
                          learn_sft_steps=3, snapshot_steps=0, num_snapshots=1, batches=1,
                          num_rollouts=2, prompts_per_step=2, group_size=4, learn_steps=1,
                          eval_every=1, tree_branches=2, tree_points=1,
                          learn_references=("grpo@pivot",))
  rows, skipped, extras = credit_bench.run_task("pivotal", s, str(tmp_path),
                                                say=lambda *_: None)
  assert not skipped, skipped
  for name in ("warmup", "learn_warmup_3"):
    assert os.path.exists(os.path.join(tmp_path, name, "hf_policy", "config.json"))
  got = {(r.estimator, r.part, r.metric): r.mean for r in rows}
  for name in ("grpo", "cbpo", "grpo@tree", "oracle@tree", "prm_transform"):
    assert (name, "credit", "corr") in got, name
  assert got[("oracle@tree", "credit", "corr")] == pytest.approx(1.0)
  for name in ("grpo", "cbpo", "grpo@pivot"):  # and the oracle-placement learning reference
    assert {m for (n, p, m) in got if n == name and p == "learning"} == set(
        credit_bench.LEARN_METRICS)
    assert len(extras["curves"][name]) == 1
  assert ("grpo@pivot", "credit", "corr") not in got
  assert {r.family for r in rows if r.estimator == "grpo@pivot"} == {"reference"}
  c = credit_bench.tree_config(credit_bench.base_config("pivotal", s), s)
  assert (c.group_size, c.tree.branches, c.tree.points) == (2, 2, 1)


def test_step_reward_estimators_get_per_character_steps():
  # The bifurcation tasks' exact step judge feeds step_reward; those estimators run with every
  # character a step and one more for the stop token.
  from benchmarks import credit_bench
  base = credit_bench.base_config("pivotal", credit_bench.QUICK)
  c = credit_bench.estimator_config(base, "prm_transform")
  assert credit_bench.uses_step_judge(c) and c.max_steps == c.max_new_tokens
  assert c.steps_as_turns  # turn-level step methods read step k on turn k
  assert set("abcdefghij0123456789") <= set(c.step_delimiters)
  g = credit_bench.estimator_config(base, "grpo")
  assert not credit_bench.uses_step_judge(g)
  assert (g.step_delimiters, g.max_steps, g.steps_as_turns) == (
      base.step_delimiters, base.max_steps, False)
  # Turn-level methods that read turn_id with step_mask (IGPO's information gain here) take
  # the characters as their turns too; the other ones keep the one-turn layout.
  i = credit_bench.estimator_config(base, "igpo")
  assert credit_bench.per_character_steps(i) and not credit_bench.uses_step_judge(i)
  assert i.max_steps == i.max_new_tokens and i.steps_as_turns
  assert not credit_bench.per_character_steps(g)
  # Multi-reward methods get the outcome and the format check as their components.
  assert tuple(credit_bench.estimator_config(base, "gdpo").reward_components) == (
      credit_bench.MULTI_REWARD)
  assert tuple(g.reward_components) == ()


def test_sipo_is_scored_with_its_own_self_teacher_contexts():
  # SIPO's contrast is between the gold answer and the gold answer plus a group mistake; the
  # shared alt contexts ("correct: " / "wrong: ") are CSCR's and hold neither.
  from benchmarks import credit_bench
  base = credit_bench.base_config("pivotal", credit_bench.QUICK)
  c = credit_bench.estimator_config(base, "sipo")
  assert "{answer}" in c.alt_context_pos and "{answer}" in c.alt_context_neg
  assert "{mistake}" in c.alt_context_neg and "{mistake}" not in c.alt_context_pos
  from experiments.configs import sipo_arithmetic
  recipe = sipo_arithmetic.get_config()
  assert (c.alt_context_pos, c.alt_context_neg) == (recipe.alt_context_pos,
                                                    recipe.alt_context_neg)
  other = credit_bench.estimator_config(base, "cscr")
  assert (other.alt_context_pos, other.alt_context_neg) == (base.alt_context_pos,
                                                            base.alt_context_neg)


def test_tree_skips_are_the_ones_missing_only_branch_fields():
  from benchmarks import credit_bench as cb
  tree = cb.Skip("estimator 'cbpo' needs ['parent_id', 'prefix_len']", ["parent_id", "prefix_len"])
  assert cb.needs_tree(tree) and cb.needs_tree(cb.Skip("logo", ["parent_id"]))
  assert not cb.needs_tree(cb.Skip("estimator 'pica' needs ['step_reward']", ["step_reward"]))
  # A tree makes the branch fields but not the rest: it would still be skipped there.
  assert not cb.needs_tree(cb.Skip("both", ["parent_id", "flag_mask"]))
  assert not cb.needs_tree(cb.Skip("not a missing field"))


def test_summary_table_adds_turn_corr_on_multi_turn_tasks():
  from benchmarks import credit_bench as cb
  R = cb.Row
  rows = [R("pivotal", "grpo", "outcome", "credit", m, v, v, v, 1)
          for m, v in (("corr", 0.3), ("pivot_mass", 0.1), ("sign_acc", 0.8))]
  rows += [R("pivot_turn", "grpo", "outcome", "credit", m, v, v, v, 1)
           for m, v in (("corr", 0.4), ("pivot_mass", 0.3), ("sign_acc", 1.0),
                        ("turn_corr", 0.52))]
  rows[0] = R("pivotal", "grpo", "outcome", "credit", "corr", 0.3, 0.25, 0.36, 12)
  table = cb.summary_table(rows, "Command: `cmd` (1.0 min)")
  assert "| estimator | family | pivotal: corr / pivot mass / sign acc | pivot_turn: corr / " \
         "pivot mass / sign acc / turn corr |" in table
  assert ("| `grpo` | outcome | 0.30 [0.25, 0.36] / 0.10 / 0.80 | 0.40 / 0.30 / 1.00 / 0.52 |"
          in table)


def test_merge_keeps_the_rows_a_follow_up_run_did_not_measure(tmp_path):
  # A follow-up `--only` run replaces its estimators' rows of a task and keeps the rest.
  from benchmarks import credit_bench
  R = credit_bench.Row
  old = [R("pivotal", "grpo", "outcome", "credit", "corr", 0.3, 0.2, 0.4, 12),
         R("pivotal", "igpo", "turn", "credit", "corr", -0.1, -0.2, 0.0, 12),
         R("pivotal", "igpo", "turn", "learning", "auc", 0.4, 0.3, 0.5, 3),
         R("delayed", "igpo", "turn", "credit", "corr", 0.1, 0.0, 0.2, 12)]
  credit_bench.write_outputs(str(tmp_path), old, {}, {}, "old", 1.0, learning_csv=False)
  back = credit_bench.read_rows(str(tmp_path / "results.csv"))
  assert [(r.estimator, r.part, r.mean, r.n) for r in back] == [
      (r.estimator, r.part, r.mean, r.n) for r in old]
  new = [R("pivotal", "igpo", "turn", "credit", "corr", 0.5, 0.4, 0.6, 12)]
  got = credit_bench.merge_rows(back, new)
  assert [(r.task, r.estimator, r.part, r.mean) for r in got] == [
      ("pivotal", "grpo", "credit", 0.3), ("pivotal", "igpo", "learning", 0.4),
      ("delayed", "igpo", "credit", 0.1), ("pivotal", "igpo", "credit", 0.5)]
  # An estimator the follow-up run skipped on a task (now refused) keeps no row there.
  got = credit_bench.merge_rows(back, new, {"pivotal": ["grpo"], "delayed": []})
  assert [(r.task, r.estimator, r.part) for r in got] == [
      ("pivotal", "igpo", "learning"), ("delayed", "igpo", "credit"), ("pivotal", "igpo", "credit")]


def test_tables_fold_in_follow_up_runs_and_rank_estimators(tmp_path):
  """`--tables`: a follow-up run's (task, estimator, seed) learning runs and (task, estimator)
  credit rows replace the main record's (other tasks' runs of the same estimator stay);
  results.csv's learning rows are recomputed from learning.csv; the learning table ranks by final accuracy with the
  bench's intervals, and an estimator short of seeds is named, not scored."""
  import os
  from benchmarks import credit_bench as cb
  def run(acc):  # evals at 0, 10, 20
    return [{"step": k * 10, "wall_time": float(k), "eval_accuracy": a} for k, a in enumerate(acc)]
  main = {("pivotal", "grpo"): {0: run([0.1, 0.5, 0.6]), 1: run([0.1, 0.3, 0.4])},
          ("distractor", "grpo"): {0: run([0.2, 0.2, 0.2]), 1: run([0.2, 0.2, 0.3])},
          ("distractor", "rloo"): {0: run([0.2, 0.6, 0.9]), 1: run([0.2, 0.7, 0.8])}}
  out, new = tmp_path / "main", tmp_path / "new"
  os.makedirs(out), os.makedirs(new)
  R = cb.Row
  cb.write_learning(str(out / "learning.csv"), main)
  assert cb.read_learning(str(out / "learning.csv")) == main
  cb.write_rows(str(out / "results.csv"), [
      R("distractor", "grpo", "outcome", "credit", "corr", 0.3, 0.2, 0.4, 12),
      R("distractor", "grpo", "outcome", "learning", "auc", 0.9, 0.9, 0.9, 3)])  # stale
  cb.write_learning(str(new / "learning.csv"),
                    {("distractor", "grpo"): {0: run([0.2, 0.9, 1.0]), 1: run([0.2, 0.8, 1.0])},
                     ("distractor", "eapo"): {0: run([0.2, 0.3, 0.4])},
                     ("distractor", "rloo"): {1: run([0.2, 0.5, 0.5])},
                     ("pivotal", "grpo"): {0: run([0.0, 0.0, 0.0])}})  # a stale copy
  cb.write_rows(str(new / "results.csv"),
                [R("distractor", "grpo", "outcome", "credit", "corr", 0.35, 0.3, 0.4, 12)])
  cb.write_skipped(str(out / "skipped.md"), {"distractor": {"grpo": "was skipped", "x": "why"}})
  cb.write_skipped(str(new / "skipped.md"), {"pivot_turn": {"y": "needs\n  a field"}})
  s = dataclasses.replace(cb.QUICK, seeds=2, threshold=0.5)
  cb.rebuild(str(out), [str(new / "learning.csv"), str(new / "results.csv")], ("distractor",),
             s, "cmd")
  folded = cb.read_learning(str(out / "learning.csv"))
  # Only the named tasks are taken from the added files: the stale pivotal copy stays out.
  assert folded[("pivotal", "grpo")] == main[("pivotal", "grpo")]
  assert folded[("distractor", "grpo")][0][-1]["eval_accuracy"] == 1.0
  # Runs fold per seed: a follow-up with one seed of a pair keeps the record's other seeds.
  assert folded[("distractor", "rloo")] == {0: main[("distractor", "rloo")][0],
                                           1: run([0.2, 0.5, 0.5])}
  grpo = cb.learning_stats([folded[("distractor", "grpo")][k] for k in (0, 1)], 0.5)
  rows = {(r.task, r.estimator, r.part, r.metric): r for r in cb.read_rows(str(out / "results.csv"))}
  assert rows[("distractor", "grpo", "credit", "corr")].mean == 0.35
  # skipped.md: an estimator the follow-up scored leaves the list; a new task's entries enter.
  assert cb.read_skipped(str(out / "skipped.md")) == {"distractor": {"x": "why"},
                                                       "pivot_turn": {"y": "needs a field"}}
  assert rows[("distractor", "grpo", "learning", "auc")].mean == pytest.approx(np.mean(grpo["auc"]))
  assert ("distractor", "eapo", "learning", "auc") not in rows
  assert rows[("pivotal", "grpo", "learning", "final_accuracy")].family == "outcome"
  assert "Rebuilt by `cmd`" in open(out / "summary.md").read()
  assert os.path.exists(out / "curves_distractor.png") and os.path.exists(out / "bars_pivotal.png")
  assert not os.path.exists(out / "learning_pivotal.md")
  lines = open(out / "learning_distractor.md").read().splitlines()
  assert lines[0] == "| estimator | final accuracy | AUC | steps to 0.5 |"
  assert [ln.split("|")[1].strip() for ln in lines[2:4]] == ["`grpo`", "`rloo`"]
  assert lines[2].split("|")[2].strip() == "{:.2f} [{:.2f}, {:.2f}]".format(
      *cb._interval(grpo["final_accuracy"]))
  assert lines[-1] == "Fewer than 2 finished seeds: eapo."
  cb.rebuild(str(out), [], ("pivotal",), s, "cmd")
  piv = open(out / "learning_pivotal.md").read().splitlines()[2]
  assert piv.endswith("| 20 [10, 30] |")  # seed 0 at step 10, seed 1 never (30)
  cb.write_learning(str(out / "learning.csv"), {("pivotal", "gpg"): {0: run([0.1, 0.1, 0.2]),
                                                                     1: run([0.1, 0.2, 0.2])}})
  cb.rebuild(str(out), [], (), s, "cmd")
  assert open(out / "learning_pivotal.md").read().splitlines()[2].endswith("| never (30) |")
  with pytest.raises(SystemExit, match="--tables"):
    cb.main(["--add", "x.csv", "--out", str(out)])
  with pytest.raises(SystemExit, match=r"unknown estimators \['foo'\]"):
    cb.main(["--only", "grpo@pivot,foo@pivot", "--out", str(out)])
  with pytest.raises(SystemExit, match="neither"):
    cb.main(["--tables", "--out", str(tmp_path / "empty")])
