"""pivot_turn (the multi-turn bifurcation task) and the multi-turn true advantages of credit.bench."""
import functools

import hypothesis
import jax
import numpy as np
import optax
import pytest
from flax import nnx
from hypothesis import strategies as st

import credit
from credit import bench
from credit import tasks as ct
from credit.envs import run_episode
from credit.envs.pivot_turn import TINY
from credit.envs.rollout import (MultiTurnSampler, TurnLayout, demonstration_episode,
                                 encode_episode)
from credit.models import Decoder, tiny_config
from credit.sampling import Sampler, sampling_params

SETTINGS = [{}, TINY, {"num_turns": 5, "demo_filler": "right", "shift": 3}]
ALPHABET = "0123456789abz:=; "


def _examples(kw, n=20, seed=0):
  task = ct.get_task("pivot_turn", **kw)
  return task, task.generate(np.random.default_rng(seed), n)


@pytest.mark.parametrize("kw", SETTINGS)
def test_generation_is_deterministic_and_demonstrations_verify(kw):
  task, ex = _examples(kw)
  assert ex == task.generate(np.random.default_rng(0), 20)
  assert ex != task.generate(np.random.default_rng(1), 20)
  tok = ct.CharTokenizer()
  rng = np.random.default_rng(3)
  for e in ex:
    (p,) = task.pivot_turns(e)
    assert 0 <= p < task.num_turns and task.decided_at_turn(e) == (p, 0)
    assert len(e["prompt"]) <= task.max_prompt_chars and len(e["questions"]) == task.num_turns
    assert task.verify(e, task.demonstration(e)) == 1.0 and task.demonstration(e) == e["answer"]
    for turns in (task.demonstration_turns(e), task.demonstration_turns(e, rng)):
      ep = run_episode(task.make_env(e), turns)
      assert ep.outcome == 1.0 and len(ep.results) == task.num_turns and ep.results[-1].done
      assert turns[p] == e["answer"]
      for t, r in zip(turns, ep.results):
        assert len(t) <= task.max_action_chars and len(r.observation) <= task.max_observation_chars
        tok.encode(t + r.observation + e["prompt"])  # in the character vocabulary
  # Random filler answers: many digits at a filler turn over demonstrator draws; "right": one.
  e = next(e for e in ex if task.pivot_turns(e)[0] != 0)
  seen = {task.demonstration_turns(e, rng)[0] for _ in range(40)}
  assert len(seen) == (1 if task.demo_filler == "right" else 10)


def test_a_worked_episode():
  task = ct.get_task("pivot_turn")
  ex = {"prompt": "1;0:4=", "answer": "7", "questions": [4, 6, 0]}
  env = task.make_env(ex)
  assert env.reset() == "1;0:4="
  r0, r1, r2 = env.step("5"), env.step("7"), env.step("3")
  assert (r0.observation, r1.observation, r2.observation) == ("1:6=", "2:0=", "")
  assert [r.reward for r in (r0, r1, r2)] == [1.0, 1.0, 0.0]   # every answer graded
  assert [r.progress for r in (r0, r1, r2)] == pytest.approx([1 / 3, 2 / 3, 2 / 3])
  assert env.done and env.outcome() == 1.0 and r1.info["pivotal"] and not r0.info["pivotal"]
  with pytest.raises(credit.envs.EpisodeDoneError):
    env.step("1")


@hypothesis.given(data=st.data())
def test_only_the_pivotal_turn_changes_the_reward(data):
  mode = data.draw(st.sampled_from(["every", "pivot", "none"]))
  task, ex = _examples({"process_reward": mode}, n=8, seed=4)
  e = data.draw(st.sampled_from(ex))
  (p,) = task.pivot_turns(e)
  acts = data.draw(st.lists(st.text(ALPHABET, max_size=3), min_size=3, max_size=3))
  env = task.make_env(e)
  env.reset()
  res = []
  for k, a in enumerate(acts):
    res.append(env.step(a))
    if k == p:
      known = env.outcome()   # the outcome is known once the pivotal turn is played
  got = env.outcome()
  assert got == known == task.verify(e, acts[p])
  right = [a[:1] == task.right_answer(q) for a, q in zip(acts, e["questions"])]
  want = {"every": right, "pivot": [r and k == p for k, r in enumerate(right)],
          "none": [False] * 3}[mode]
  assert [r.reward for r in res] == [float(w) for w in want]
  # Another answer at any other turn, or the pivotal action cut after its first character,
  # leaves the outcome.
  k = data.draw(st.sampled_from([i for i in range(3) if i != p]))
  other = list(acts)
  other[k] = data.draw(st.text(ALPHABET, max_size=3))
  other[p] = other[p][:1]
  assert run_episode(task.make_env(e), other).outcome == got
  # The right first character at the pivot decides it.
  flipped = list(acts)
  flipped[p] = ("x" if got else e["answer"]) + acts[p][1:]
  assert run_episode(task.make_env(e), flipped).outcome == 1.0 - got


def test_bad_settings_and_foreign_examples_are_refused():
  for kw, match in (({"num_turns": 1}, "num_turns"), ({"num_turns": 11}, "num_turns"),
                    ({"process_reward": "all"}, "process_reward"),
                    ({"demo_filler": "wrong"}, "demo_filler")):
    with pytest.raises(ValueError, match=match):
      ct.get_task("pivot_turn", **kw)
  task, ex = _examples({})
  with pytest.raises(ValueError, match="not generated"):
    task.make_env(dict(ex[0], questions=[1, 2]))
  with pytest.raises(ValueError, match="not a pivot_turn prompt"):
    task.pivot_turns(dict(ex[0], prompt="city of ann?"))


def test_tfds_builder_config_round_trips(tmp_path):
  import tensorflow_datasets as tfds
  from credit.tasks.credit_tasks import credit_tasks_dataset_builder as cb
  assert "pivot_turn" in {c.name for c in cb.Builder.BUILDER_CONFIGS}
  sizes = {"train_size": 6, "test_size": 4}
  ct.build_task_dataset("pivot_turn", tmp_path, **sizes)
  source = tfds.data_source(ct.task_tfds_name("pivot_turn", **sizes), split="test",
                            data_dir=tmp_path, download=False)
  task = ct.get_task("pivot_turn")
  got = [ct.as_example(source[i]) for i in range(len(source))]
  assert got == task.generate(np.random.default_rng([0, 1]), 4)
  for e in got:
    assert run_episode(task.make_env(e), task.demonstration_turns(e)).outcome == 1.0


# --------------------------------------------------------------------------
# True advantages of multi-turn episodes.
# --------------------------------------------------------------------------

LAYOUT = TurnLayout(prompt_width=7, max_turns=3, max_action_tokens=2, max_observation_tokens=4)
TOP_K = 3
NUM_ROLLOUTS = 48
SFT_STEPS = 30


@functools.lru_cache(maxsize=None)
def _setup():
  """A tiny policy after a short supervised warm-up on pivot_turn demonstrations (so the right
  digit is among its top-k at the pivotal turn), its samplers, and one batch of episodes
  (3 examples with pivotal turns 2, 1, 0; 4 episodes each; top-k sampling)."""
  from experiments import train
  tok = ct.CharTokenizer()
  task = ct.get_task("pivot_turn", demo_filler="right")  # a quick warm-up learns this one
  model = Decoder(tiny_config("qwen3", vocab_size=tok.vocab_size, hidden_size=32,
                              intermediate_size=64, num_layers=1, head_dim=8),
                  rngs=nnx.Rngs(3))
  rng = np.random.default_rng(0)
  eps = [encode_episode(tok, LAYOUT, *demonstration_episode(task, e, None, rng))
         for e in task.generate(rng, 128)]
  b = {k: np.stack([r[k] for r in eps]) for k in eps[0]}
  batch = {"tokens": b["tokens"], "response_mask": b["response_mask"],
           "attn_mask": b["prompt_mask"] | b["response_mask"] | b["obs_mask"]}
  graphdef, params, rest = train.split_model(model)
  tx = optax.adam(1e-2)
  step = jax.jit(train.make_sft_step(graphdef, rest, tx, None))
  opt = tx.init(params)
  for _ in range(SFT_STEPS):
    params, opt, _ = step(params, opt, batch)
  model = train.merge_model(graphdef, params, rest)
  state = nnx.state(model)
  sampler = Sampler(model, pad_id=tok.pad_id, stop_tokens=(tok.eos_id,))
  examples = [{"prompt": f"{p};0:{q[0]}=", "answer": task.right_answer(q[p]), "questions": q}
              for p, q in ((2, [5, 1, 7]), (1, [3, 8, 0]), (0, [9, 4, 4]))]
  G = 4
  rows = [e for e in examples for _ in range(G)]
  ms = MultiTurnSampler(model, tokenizer=tok, layout=LAYOUT)
  out = ms(state, [task.make_env(e) for e in rows], key=jax.random.key(1),
           group_id=np.repeat(np.arange(len(examples)), G), temperature=1.0, top_k=TOP_K)
  return tok, task, state, sampler, rows, out


def _kw(**over):
  tok, task, _, _, rows, out = _setup()
  kw = dict(task=task, tokenizer=tok, examples=rows, tokens=out.tokens,
            response_mask=out.response_mask, obs_mask=out.obs_mask, prompt_mask=out.prompt_mask,
            turn_id=out.turn_id, layout=LAYOUT, key=jax.random.key(5), top_k=TOP_K)
  kw.update(over)
  return kw


@functools.lru_cache(maxsize=None)
def _both():
  _, _, state, sampler, _, _ = _setup()
  return (bench.true_turn_advantages(sampler, state, exact=True, **_kw()),
          bench.true_turn_advantages(sampler, state, num_rollouts=NUM_ROLLOUTS, **_kw()))


def _assert_within_monte_carlo_error(mc, exact, R):
  """Every Monte-Carlo value (per token and per turn) within 4.5 standard errors of the
  enumerated one. W lies in [0, 1], so Var W <= V(1 - V) with V = E W: the bound gives the
  standard error without trusting the sample's own (which is ~0 when R draws happen to agree,
  e.g. all but one rare branch). Advantages are differences of these values."""
  for got, want in ((mc.value, exact.value), (mc.turn_value, exact.turn_value)):
    se = np.sqrt(want * (1.0 - want) / R)
    z = (np.abs(got - want) - 1e-5) / np.maximum(se, 1e-12)
    assert np.all(z < 4.5), (z[z >= 4.5], got[z >= 4.5], want[z >= 4.5])
  # The reported standard errors are those of a mean of R values in [0, 1] (A: two of them).
  assert np.all(mc.stderr <= np.sqrt(2 * 0.25 / (R - 1)) + 1e-6)


def test_monte_carlo_turn_values_equal_exact_enumeration_within_their_error():
  exact, mc = _both()
  out = _setup()[5]
  policy = out.response_mask
  assert np.all(exact.stderr == 0.0) and np.all(exact.turn_stderr == 0.0)
  for x in (exact, mc):
    assert np.all(x.value[~policy] == 0.0) and np.all(x.advantage[~policy] == 0.0)
  assert (mc.stderr > 1e-6).sum() >= 4 and 0.05 < exact.value[policy].mean() < 0.95
  _assert_within_monte_carlo_error(mc, exact, NUM_ROLLOUTS)


def test_the_decision_is_exact_and_nothing_after_it_has_credit():
  tok, task, state, sampler, rows, out = _setup()
  exact, _ = _both()
  policy = bench._Policy(sampler.graphdef, state, sampling_params(temperature=1.0, top_k=TOP_K,
                                                                  vocab_size=tok.vocab_size), 64)
  for i, ex in enumerate(rows):
    (p,) = task.pivot_turns(ex)
    valid = out.prompt_mask[i] | out.response_mask[i] | out.obs_mask[i]
    turn = out.turn_id[i]
    d = int(np.flatnonzero(turn == p)[0])          # token 0 of the pivotal turn
    r = float(out.reward[i])
    # V(s_d) = Σ_a π(a | s_d) · 1[a is the right digit] (a stop token: an empty answer, wrong).
    lp = policy([out.tokens[i, :d][valid[:d]].tolist()], tok.pad_id)[0]
    v = float(np.exp(lp[tok.encode(ex["answer"])[0]]))
    np.testing.assert_allclose(exact.value[i, d], v, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(exact.advantage[i, d], r - v, rtol=1e-5, atol=1e-6)
    assert exact.decided_mask[i, d] and exact.decided_mask[i].sum() == 1
    after = out.response_mask[i] & (np.arange(out.tokens.shape[1]) > d)
    assert np.all(exact.advantage[i, after] == 0.0) and np.all(exact.value[i, after] == r)
    np.testing.assert_array_equal(exact.pivot_mask[i], out.response_mask[i] & (turn == p))
    np.testing.assert_array_equal(exact.pivot_turn_mask[i], np.arange(3) == p)
    # Σ_t A_t = r − V(s_0); each turn's advantage is the sum of its tokens'; the turn value is
    # the value at its first token.
    first = np.flatnonzero(out.response_mask[i])[0]
    np.testing.assert_allclose(exact.advantage[i].sum(), r - exact.value[i, first], atol=1e-5)
    for k in range(3):
      cols = np.flatnonzero(turn == k)
      np.testing.assert_allclose(exact.turn_advantage[i, k], exact.advantage[i, cols].sum(),
                                 atol=1e-5)
      assert exact.turn_value[i, k] == exact.value[i, cols[0]]
  assert not np.any(exact.decided_mask & ~out.response_mask)


class _WholeActionEnv:
  """A pivot_turn environment where an answer counts only when it is one character: the
  action, or "" for a longer one."""

  def __init__(self, inner):
    self.inner = inner

  def reset(self):
    return self.inner.reset()

  def step(self, action):
    return self.inner.step(action if len(action) == 1 else "")

  def outcome(self):
    return self.inner.outcome()

  def snapshot(self):
    return self.inner.snapshot()

  def restore(self, snap):
    self.inner.restore(snap)

  @property
  def done(self):
    return self.inner.done


class _WholeAction:
  """pivot_turn where the pivotal action must be exactly the right digit: its first token
  and the stop after it both decide, so the decisive token is token 1 of the turn (the last
  that can change the reward; a stop at token 0 ends the turn before it). Its observations
  are pivot_turn's, so the same rollouts replay."""
  name = "whole_action"

  def __init__(self, task):
    self.task = task

  def pivot_turns(self, example):
    return self.task.pivot_turns(example)

  def decided_at_turn(self, example):
    return (self.task.pivot_turns(example)[0], 1)

  def make_env(self, example, limits=None):
    return _WholeActionEnv(self.task.make_env(example, limits))


def test_a_decision_inside_the_turn():
  """The decisive token is the second of the pivotal turn: Monte-Carlo equals enumeration
  (continuations stop inside the turn at it), and a row whose pivotal turn stopped before it
  has no decisive token (its credit ends with that turn)."""
  _, task, state, sampler, rows, out = _setup()
  second = _WholeAction(task)
  kw = _kw(task=second)
  exact = bench.true_turn_advantages(sampler, state, exact=True, **kw)
  mc = bench.true_turn_advantages(sampler, state, num_rollouts=NUM_ROLLOUTS, **kw)
  _assert_within_monte_carlo_error(mc, exact, NUM_ROLLOUTS)
  assert (mc.stderr > 1e-6).sum() >= 4 and 0.05 < exact.value[out.response_mask].mean() < 0.95
  reached = 0
  for i, ex in enumerate(rows):
    (p,) = task.pivot_turns(ex)
    r = run_episode(second.make_env(ex), out.trajectories[i].actions).outcome
    cols = np.flatnonzero(out.turn_id[i] == p)
    end = cols[1] if cols.size >= 2 else cols[-1]
    if cols.size >= 2:
      reached += 1
      assert exact.decided_mask[i, cols[1]] and exact.decided_mask[i].sum() == 1
    else:
      assert not exact.decided_mask[i].any()
    after = out.response_mask[i] & (np.arange(out.tokens.shape[1]) > end)
    assert np.all(exact.advantage[i, after] == 0.0) and np.all(exact.value[i, after] == r)
    first = np.flatnonzero(out.response_mask[i])[0]
    np.testing.assert_allclose(exact.advantage[i].sum(), r - exact.value[i, first], atol=1e-5)
  assert reached >= 1


def test_bench_metrics_run_on_a_multi_turn_batch():
  _, _, _, _, _, out = _setup()
  _, mc = _both()
  args = (mc.advantage, out.response_mask, mc.pivot_mask, out.group_id)
  oracle = bench.credit_metrics(mc.advantage, *args)
  assert oracle["corr"] == pytest.approx(1.0) and oracle["pivot_mass"] == oracle["pivot_mass_true"]
  assert oracle["pivot_mass_true"] > 0.5 and oracle["chance"] == pytest.approx(1 / 3)
  const = bench.credit_metrics(np.where(out.response_mask, 1.0, 0.0), *args)
  assert const["corr"] == 0.0 and const["pivot_mass"] == pytest.approx(const["chance"])
  fields = dict(reward=out.reward, group_id=out.group_id, response_mask=out.response_mask,
                turn_id=out.turn_id, step_mask=out.step_mask, step_reward=out.step_reward,
                turn_progress=out.turn_progress)
  # Turn level: an estimator that gives every token its turn's true advantage is perfect there.
  per_turn = np.where(out.response_mask, np.take_along_axis(
      mc.turn_advantage, np.maximum(out.turn_id, 0), axis=1), 0.0)
  t = bench.turn_credit_metrics(per_turn, mc, out.response_mask, out.turn_id, out.group_id)
  assert t["turn_corr"] == pytest.approx(1.0)
  assert np.isnan(t["turn_sign_acc"]) or t["turn_sign_acc"] == 1.0
  assert t["turn_pivot_mass"] == pytest.approx(t["turn_pivot_mass_true"])
  assert t["turn_chance"] == pytest.approx(1 / 3)
  for name in ("grpo", "procredit", "mapo"):   # outcome-level and turn-level estimators
    spec = credit.get_estimator(name)
    adv = np.asarray(spec.fn(**{k: fields[k] for k in spec.needs}, num_groups=3))
    assert np.all(adv[~out.response_mask] == 0.0)
    m = bench.credit_metrics(adv, *args)
    assert -1.0 <= m["corr"] <= 1.0 and 0.0 <= m["pivot_mass"] <= 1.0, (name, m)
    assert np.isnan(m["sign_acc"]) or 0.0 <= m["sign_acc"] <= 1.0
    t = bench.turn_credit_metrics(adv, mc, out.response_mask, out.turn_id, out.group_id)
    assert -1.0 <= t["turn_corr"] <= 1.0 and 0.0 <= t["turn_pivot_mass"] <= 1.0, (name, t)


def test_turn_means_worked_example():
  adv = np.array([[9.0, 1.0, 3.0, 9.0, 2.0, 9.0], [0.0, 4.0, 4.0, 4.0, 9.0, 9.0]])
  resp = np.array([[0, 1, 1, 0, 1, 0], [0, 1, 1, 1, 0, 0]], bool)
  tid = np.array([[-1, 0, 0, -1, 1, -1], [-1, 0, 0, 0, -1, -1]])
  mean, played = bench.turn_means(adv, resp, tid, 3)
  np.testing.assert_array_equal(mean, [[2.0, 2.0, 0.0], [4.0, 0.0, 0.0]])
  np.testing.assert_array_equal(played, [[True, True, False], [True, False, False]])
  with pytest.raises(ValueError, match="same"):
    bench.turn_means(adv[:, :-1], resp, tid, 3)


def test_bad_inputs_are_refused():
  _, _, state, sampler, rows, out = _setup()
  with pytest.raises(TypeError, match="pivot_turns"):
    bench.true_turn_advantages(sampler, state, **_kw(task=ct.get_task("lookup")))
  with pytest.raises(ValueError, match="cut episodes"):
    bench.true_turn_advantages(sampler, state, **_kw(
        layout=TurnLayout(7, 3, 2, 4, max_total_tokens=12)))
  swapped = rows[4:] + rows[:4]
  with pytest.raises(ValueError, match="replays observation"):
    bench.true_turn_advantages(sampler, state, **_kw(examples=swapped))
  with pytest.raises(ValueError, match="overlap"):
    bench.true_turn_advantages(sampler, state, **_kw(obs_mask=out.response_mask))
  with pytest.raises(ValueError, match="max_enumeration"):
    bench.true_turn_advantages(sampler, state, exact=True, max_enumeration=5, **_kw())
  with pytest.raises(ValueError, match="same"):
    bench.true_turn_advantages(sampler, state, **_kw(turn_id=out.turn_id[:, :-1]))
  with pytest.raises(ValueError, match="examples"):
    bench.true_turn_advantages(sampler, state, **_kw(examples=rows[:-1]))


def test_the_credit_bench_runs_estimators_on_the_multi_turn_task(tmp_path):
  """The bench's plumbing end to end at the smallest size: its config for a multi-turn task,
  the runner's episodes, their true advantages (the replay check passes), an outcome-level and
  a turn-level estimator scored on them."""
  import dataclasses
  from benchmarks import credit_bench
  from experiments import loop
  c = credit_bench.base_config("pivot_turn", credit_bench.QUICK)
  assert (c.max_turns, c.max_action_tokens, c.max_observation_tokens) == (3, 2, 4)
  assert c.max_new_tokens == 3 * (2 + 4) and c.gold_template == "{answer}"
  for name in credit_bench.QUICK.multi_turn_estimators:   # their fields have producers here
    loop.check_method(credit_bench.estimator_config(c, name))
  s = dataclasses.replace(credit_bench.QUICK, tasks=("pivot_turn",), estimators=("grpo",),
                          multi_turn_estimators=("procredit",), sft_steps=2, snapshot_steps=0,
                          num_snapshots=1, batches=1, num_rollouts=2, prompts_per_step=2,
                          group_size=4)
  rows, skipped, extras = credit_bench.run_task("pivot_turn", s, str(tmp_path), learning=False,
                                                say=lambda *_: None)
  assert not skipped and set(extras["heat"]) == {"oracle", "constant", "grpo", "procredit"}
  got = {(r.estimator, r.metric): r.mean for r in rows}
  assert got[("oracle", "corr")] in (0.0, 1.0) and 0.0 < got[("constant", "chance")] < 1.0
  b = extras["batch"]
  assert b.host["obs_mask"].any() and not np.any(b.truth.advantage[b.host["obs_mask"]])
