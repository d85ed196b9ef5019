"""Bifurcation tasks: ground truth (pivot positions, decision point) and the task contract."""
import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

from credit import tasks as ct

SETTINGS = [("pivotal", {"response_len": 6}), ("pivotal_and", {}), ("pivotal_and", {"num_pivots": 3}),
            ("pivotal_or", {}), ("distractor", {}), ("delayed", {})]
ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 =:+-"


def _task_examples(name, kw, n=30, seed=0):
  task = ct.get_task(name, **kw)
  return task, task.generate(np.random.default_rng(seed), n)


@pytest.mark.parametrize("name,kw", SETTINGS)
def test_generation_is_deterministic_and_demonstrations_verify(name, kw):
  task, ex = _task_examples(name, kw)
  assert ex == task.generate(np.random.default_rng(0), 30)
  assert ex != task.generate(np.random.default_rng(1), 30)
  tok = ct.CharTokenizer()
  rng = np.random.default_rng(3)
  for e in ex:
    assert len(e["prompt"]) <= task.max_prompt_chars
    for demo in (task.demonstration(e), task.demonstration(e, rng), e["answer"]):
      assert len(demo) <= task.max_response_chars and task.verify(e, demo) == 1.0
      tok.encode(demo)  # in the character vocabulary
    pos = task.pivot_positions(e)
    assert list(pos) == sorted(set(pos)) and task.decided_at(e) == pos[-1]
    assert all(0 <= p < task.max_response_chars for p in pos)


@pytest.mark.parametrize("name,kw", SETTINGS)
@hypothesis.given(data=st.data())
def test_only_pivots_matter_and_nothing_after_the_decision(name, kw, data):
  task, ex = _task_examples(name, kw, n=8)
  e = data.draw(st.sampled_from(ex))
  r = data.draw(st.text(alphabet=ALPHABET, max_size=task.max_response_chars + 3))
  got = task.verify(e, r)                              # never raises on arbitrary text
  assert got in (0.0, 1.0)
  d = task.decided_at(e)
  if len(r) > d:
    assert task.verify(e, r[:d + 1]) == got
  # Changing a non-pivot character never changes the reward.
  pos = set(task.pivot_positions(e))
  free = [i for i in range(len(r)) if i not in pos]
  if free:
    i = data.draw(st.sampled_from(free))
    c = data.draw(st.sampled_from(ALPHABET))
    assert task.verify(e, r[:i] + c + r[i + 1:]) == got


@pytest.mark.parametrize("name,kw", SETTINGS)
def test_each_pivot_can_change_the_reward(name, kw):
  task, ex = _task_examples(name, kw, n=10)
  for e in ex:
    demo = task.demonstration(e)
    for p in task.pivot_positions(e):
      wrong = demo[:p] + "z" + demo[p + 1:]
      if name == "pivotal_or" and len(task.pivot_positions(e)) > 1:
        assert task.verify(e, wrong) == 1.0    # another pivot still holds
        everything = "".join("z" if i in task.pivot_positions(e) else c
                             for i, c in enumerate(demo))
        assert task.verify(e, everything) == 0.0
      else:
        assert task.verify(e, wrong) == 0.0


@pytest.mark.parametrize("name,kw", SETTINGS)
@hypothesis.given(data=st.data())
def test_step_judge_is_exact_and_independent_of_the_step_split(name, kw, data):
  # Cut a response into steps anywhere, then its end (""): some step is judged wrong iff the
  # response fails (AND / single pivot); under OR a failure always has a wrong step and a
  # response without one succeeds (a wrong pivot may still be saved by a later one).
  task, ex = _task_examples(name, kw, n=8)
  e = data.draw(st.sampled_from(ex))
  r = data.draw(st.text(alphabet=ALPHABET, max_size=task.max_response_chars + 2))
  if data.draw(st.booleans()):  # often close to the demonstration: pivots right or off by one
    r = data.draw(st.sampled_from([task.demonstration(e), task.demonstration(e)[:-1]]))
  wrong = []
  for cuts in (sorted(data.draw(st.sets(st.integers(1, max(len(r) - 1, 1))))), range(1, len(r))):
    bounds = [0] + [c for c in cuts if c < len(r)] + [len(r)]
    steps = [r[a:b] for a, b in zip(bounds, bounds[1:]) if b > a] + [""]
    verdicts = [task.judge_step(e, steps[:k], s) for k, s in enumerate(steps)]
    assert all(v[1:] == (0.0, False) and v[0] in (1.0, -1.0) for v in verdicts)
    wrong.append(any(v[0] < 0 for v in verdicts))
  assert wrong[0] == wrong[1]
  ok = task.verify(e, r) == 1.0
  assert (not ok) <= wrong[0]
  # The flags: none on a success; on a failure, wrong pivots (or the end) only.
  flags = task.flag_chars(e, r)
  assert flags.shape == (len(r) + 1,) and flags.any() == (not ok)
  pos = set(task.pivot_positions(e))
  assert all(i in pos or i == len(r) for i in np.flatnonzero(flags))
  if name != "pivotal_or":
    assert ok == (not wrong[0])


@pytest.mark.parametrize("name,kwargs,m", [
    ("pivotal", {}, 2), ("distractor", {}, 2), ("delayed", {}, 2),
    ("pivotal_and", {}, 1), ("pivotal_or", {"num_pivots": 3}, 2)])
def test_interventions_preserve_the_rule(name, kwargs, m):
  task, ex = _task_examples(name, kwargs, n=10)
  for e in ex:
    prompts = task.interventions(e)
    assert len(prompts) == m == len(set(prompts))
    for prompt in prompts:
      assert prompt != e["prompt"]
      moved = {"prompt": prompt}  # parsed from the rewritten prompt alone
      assert task.verify(moved, e["answer"]) == 1.0
      assert task.pivot_positions(moved) == task.pivot_positions(e)
      assert task.decided_at(moved) == task.decided_at(e)
      # A wrong digit at any pivot is judged the same under the rewrite.
      wrong = e["answer"][:task.pivot_positions(e)[0]] + "x" + e["answer"][
          task.pivot_positions(e)[0] + 1:]
      assert task.verify(moved, wrong) == task.verify(e, wrong)
  with pytest.raises(ValueError, match="one pivot"):
    ct.get_task("pivotal_and", num_pivots=1).interventions({"prompt": "3:4="})


def test_distractors_are_high_entropy_in_demonstrations_and_never_matter():
  task, ex = _task_examples("distractor", {}, n=50)
  rng = np.random.default_rng(0)
  for e in ex[:10]:
    dis = task.distractor_positions(e)
    assert len(dis) == 2 and task.pivot_positions(e)[0] not in dis
    demos = [task.demonstration(e, rng) for _ in range(40)]
    for q in range(task.response_len):
      seen = {d[q] for d in demos}
      if q in dis:
        assert len(seen) > 5                       # many choices, all fine
      elif q != task.pivot_positions(e)[0]:
        assert seen == {task.constant}            # the low-entropy filler


def test_delayed_decides_early_in_a_long_response():
  task, ex = _task_examples("delayed", {}, n=50)
  assert task.max_response_chars == 16
  assert {task.decided_at(e) for e in ex} == {0, 1}


def test_bad_settings_are_refused():
  with pytest.raises(ValueError, match="num_pivots"):
    ct.get_task("pivotal_and", num_pivots=7)
  with pytest.raises(ValueError, match="response_len"):
    ct.get_task("pivotal_or", response_len=11)
  with pytest.raises(ValueError, match="digit-free"):
    ct.get_task("distractor", wide="ab1")
  with pytest.raises(ValueError, match="early"):
    ct.get_task("delayed", early=0)


def test_builder_configs_construct_and_a_tiny_dataset_round_trips(tmp_path):
  import tensorflow_datasets as tfds
  from credit.tasks.credit_tasks import credit_tasks_dataset_builder as cb
  names = {c.name for c in cb.Builder.BUILDER_CONFIGS}
  assert {"pivotal_and", "pivotal_or", "distractor", "delayed"} <= names
  for name in ("pivotal_and", "pivotal_or", "distractor", "delayed"):
    assert cb.make_config(name).make_task().name == name
  sizes = {"train_size": 8, "test_size": 4}
  ct.build_task_dataset("pivotal_or", tmp_path, **sizes)
  task = ct.get_task("pivotal_or")
  source = tfds.data_source(ct.task_tfds_name("pivotal_or", **sizes), split="test",
                            data_dir=tmp_path, download=False)
  got = [ct.as_example(source[i]) for i in range(len(source))]
  assert got == task.generate(np.random.default_rng([0, 1]), 4)
  assert all(task.verify(e, task.demonstration(e)) == 1.0 for e in got)
