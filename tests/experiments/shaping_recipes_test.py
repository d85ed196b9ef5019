"""The reward-shaping recipes on chained arithmetic (c_grpo_chain, searchllm_chain,
atom_searcher_chain, prm_transform_chain, ppr_renorm_chain), cheaply: each recipe's tiny config
plans its producers and runs one one-step batch (contract check, finite advantages), then its
shaping producers and estimator run on hand-written responses whose fields and advantages are
checked against a worked table and a numpy reference; atom_searcher_chain also runs end to end
(its schedule takes the runner's step). The recipes are left out of runner_test.py's
generic tiny runs (its ONE_STEP_RECIPES), so the five add one end-to-end run to CI, not five.
"""
import jax.numpy as jnp
import numpy as np
import pytest

from credit.tasks.chain import running_sums
from experiments import loop, producers
from tests.experiments.runner_test import read_metrics, tiny
from tests.experiments.producers_test import _one_step_batch

# The fields of each recipe's shaping producers (beyond rollout, verifier and policy pass).
PLANNED = {
    "c_grpo_chain": {"rubric_check"},
    "searchllm_chain": {"reward_components"},
    "atom_searcher_chain": {"step_judge", "format_check"},
    "prm_transform_chain": {"step_segments", "step_judge"},
    "ppr_renorm_chain": {"step_segments", "step_judge"},
}
EPS = 1e-6

# Worked table for a prompt with running sums s2, s3 (3 operands: "a+b-c=" -> "s2,s3=s3"):
# response, outcome, format_ok, rubric, step judgements (1 right / 0 wrong, one per step).
TEMPLATES = (
    (lambda s2, s3: f"{s2},{s3}={s3}", 1.0, True, [1, 1], [1, 1]),          # gold
    (lambda s2, s3: f"{s2 + 1},{s3}={s3}", 1.0, True, [0, 1], [0, 1]),      # slip, right answer
    (lambda s2, s3: f"{s2},{s3 + 1}={s3 + 1}", 0.0, True, [1, 0], [1, 0]),  # wrong last sum
    (lambda s2, s3: f"={s3}", 1.0, True, [0, 0], [1]),                      # no reasoning
    (lambda s2, s3: f"{s2},{s3 + 1}=", 0.0, False, [1, 0], [1, 0]),         # no answer
)
# Each group of 4 rows takes 4 of the 5 templates; the group without the gold row has a
# rubric maximum below 1, so C-GRPO's max-normalised r̂ and the code's raw r differ there.


def _crafted(run, ctx, batch):
  """A host batch of hand-written responses to the step's prompts (row b of group g takes
  template (b + g) % 5), laid out as the single-turn rollout lays its host arrays (turn_id 0
  on the response), and the table's values for each row."""
  tok, G = run.data.tokenizer, run.c.group_size
  gid = np.asarray(batch["host"]["group_id"])
  B, W = len(gid), run.c.max_new_tokens
  tokens, resp = np.zeros((B, W), np.int32), np.zeros((B, W), bool)
  want = []
  for b, g in enumerate(gid):
    sums = running_sums(ctx.examples["prompt"][g])
    assert len(sums) == 3, sums  # the recipes' chains: 3 operands, 2 running sums
    fn, o, fmt, rubric, steps = TEMPLATES[(b % G + g) % len(TEMPLATES)]
    ids = tok.encode(fn(sums[1], sums[2]), add_eos=True)
    tokens[b, :len(ids)], resp[b, :len(ids)] = ids, True
    # the step of each token: the comma closes step 0; the rest (eos included) is step 1
    comma = [i for i, t in enumerate(ids) if tok.decode([t]) == ","]
    sid = [0 if not comma or i <= comma[0] else 1 for i in range(len(ids))]
    want.append(dict(o=o, fmt=fmt, rubric=rubric, steps=steps, sid=sid))
  host = {"tokens": tokens, "response_mask": resp, "group_id": gid,
          "prompt_mask": np.zeros_like(resp), "obs_mask": np.zeros_like(resp),
          "turn_id": np.where(resp, 0, -1).astype(np.int32)}
  fake = producers.StepContext(key=None, examples=ctx.examples, prompt_tokens=None,
                               prompt_mask=None)
  return fake, host, want


def _group_z(x, gid):
  """GRPO's z-score of x [B] within each group (unbiased σ, ε on σ)."""
  out = np.zeros_like(x)
  for g in np.unique(gid):
    m = gid == g
    out[m] = (x[m] - x[m].mean()) / (x[m].std(ddof=1) + EPS)
  return out


def _reference(recipe, c, want, gid, resp, train_step):
  """Numpy advantages [B,T] of the recipe's estimator with its config, from the table."""
  o = np.array([w["o"] for w in want])
  rub = np.array([np.mean(w["rubric"]) for w in want])
  fmt = np.array([w["fmt"] for w in want])
  kw = c.estimator_kwargs
  B, T = resp.shape
  if recipe in ("c_grpo_chain", "searchllm_chain", "atom_searcher_chain"):
    if recipe == "c_grpo_chain":  # positive mode, un-normalised rubric
      R = np.where(o == 0, 0.0, (1 - kw.alpha) * o + kw.alpha * rub)
    elif recipe == "searchllm_chain":  # format gate; 0.7·outcome + 0.3·rubric
      w = np.asarray(kw.weights) / np.sum(kw.weights)
      R = np.where(fmt >= kw.thresholds, w[0] * o + w[1] * rub, kw.r_fail)
    else:
      lam = kw.lambda0 * np.clip(1 - train_step / c.steps, 0, 1)
      atr = np.array([np.mean(w["steps"]) for w in want])
      R = np.where(fmt, lam * atr + (1 - lam) * o, kw.r_fail)
    return np.where(resp, _group_z(R, gid)[:, None], 0.0)
  adv = np.zeros((B, T))
  if recipe == "prm_transform_chain":  # clip-delta: the return from step s is α·clip(p_s) + R
    clip = [np.minimum(np.asarray(w["steps"], float) - kw.eta, 0.0) for w in want]
    g0 = np.array([kw.alpha * cl[0] + oo for cl, oo in zip(clip, o)])
    for b, w in enumerate(want):
      base = g0[gid == gid[b]].mean()
      for t, s in enumerate(w["sid"]):
        adv[b, t] = kw.alpha * clip[b][s] + o[b] - base
    return adv
  # ppr_renorm: p + o − 1 per step, z-scored over all steps of the group (unbiased σ)
  for g in np.unique(gid):
    rows = np.flatnonzero(gid == g)
    r = np.concatenate([np.asarray(want[b]["steps"], float) + o[b] - 1 for b in rows])
    mu, sd = r.mean(), r.std(ddof=1)
    for b in rows:
      for t, s in enumerate(want[b]["sid"]):
        adv[b, t] = (want[b]["steps"][s] + o[b] - 1 - mu) / (sd + EPS)
  return adv


@pytest.mark.parametrize("recipe", sorted(PLANNED))
def test_shaping_recipe_one_step_and_worked_batch(recipe, tmp_path):
  c = tiny(recipe, sft_steps=0)
  plan = [p.producer.name for p in loop.check_method(c).plan]
  assert PLANNED[recipe] <= set(plan) and plan[0] == "rollout", plan
  run, rs, ctx, batch = _one_step_batch(c, str(tmp_path / "w"))  # the sampled batch
  assert float(jnp.abs(batch["reward"]).max()) <= 1.0

  # The shaping producers on hand-written responses: the fields of the worked table.
  fake, host, want = _crafted(run, ctx, batch)
  resp, gid = host["response_mask"], host["group_id"]
  fields = {"response_mask": resp, "group_id": gid, "host": host}
  fields.update(producers.signals._build_reward(run.setup, frozenset())(rs.train, fields, fake))
  np.testing.assert_array_equal(fields["reward"], [w["o"] for w in want])
  if "rubric_check" in plan:
    fields.update(producers.signals._build_rubric(run.setup, frozenset())(rs.train, fields, fake))
    assert np.asarray(fields["rubric_mask"]).all()
    np.testing.assert_array_equal(fields["rubric"], [w["rubric"] for w in want])
  if "reward_components" in plan:
    fields.update(producers.signals._build_reward_components(run.setup, frozenset())(
        rs.train, fields, fake))
    np.testing.assert_allclose(fields["reward_components"], [  # format, outcome, rubric
        [w["fmt"], w["o"], np.mean(w["rubric"])] for w in want], atol=1e-6)
  if "format_check" in plan:
    fields.update(producers.signals._build_format_check(run.setup, frozenset())(rs.train, fields, fake))
    np.testing.assert_array_equal(fields["format_ok"], [w["fmt"] for w in want])
  if "step_judge" in plan:
    K = c.max_steps
    fields.update(producers.signals._build_step_judge(run.setup, frozenset())(rs.train, fields, fake))
    fields.update(producers.signals._build_step_segments(run.setup, frozenset())(rs.train, fields, fake))
    np.testing.assert_array_equal(fields["step_reward"], [
        w["steps"] + [0] * (K - len(w["steps"])) for w in want])
    np.testing.assert_array_equal(fields["step_mask"], [
        [k < len(w["steps"]) for k in range(K)] for w in want])
    # The steps split at the comma on the single-turn rollout too (its host has turn_id).
    sid = np.asarray(fields["step_id"])
    for b, w in enumerate(want):
      assert sid[b][resp[b]].tolist() == w["sid"] and np.all(sid[b][~resp[b]] == -1)

  # The recipe's estimator, with its config, against the numpy reference.
  arrays = {n: jnp.asarray(fields[n]) for n in run.method.estimator_fields}
  train_step = 1.0
  if "train_step" in run.method.estimator.params:  # as the runner passes it
    arrays["train_step"] = jnp.asarray(train_step, jnp.float32)
  adv, _, _ = run.adv_fn(arrays, rs.train.estimator_state)
  ref = _reference(recipe, c, want, gid, resp, train_step)
  np.testing.assert_allclose(np.asarray(adv), ref, atol=1e-4, rtol=1e-4)
  assert np.abs(ref).max() > 0.1  # the table separates the rows


def test_atom_searcher_chain_runs_end_to_end(tmp_path):
  """The one tiny run of the five (its schedule reads the runner's traced step)."""
  c = tiny("atom_searcher_chain")
  summary = loop.run(c, str(tmp_path / "run"))
  rows = read_metrics(str(tmp_path / "run"))
  assert [r["step"] for r in rows][-1] == c.steps == 2 and summary["rows"] == len(rows)
  for key in ("reward_mean", "loss", "eval_accuracy", "adv_abs_mean"):
    assert np.isfinite(rows[-1][key]), key
