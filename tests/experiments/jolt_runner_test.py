"""JOLT's two roles in the runner (`experiments/extensions/jolt.py`,
`--config.jolt.teacher_samples`): the teacher role's rows and their layouts, the combined
update, the recipe end to end, refusals.

One tiny setup (`jolt_arithmetic:tiny`, with a KL-to-reference term so that the teacher role's
reference pass runs too) is built once per module and one step's producers are run on it."""
import doctest
import glob
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import credit
from credit.scoring import score_tokens
from credit.tasks.char_tokenizer import prompt_ids
from experiments import loop, producers, train
from experiments.extensions import Step, jolt
from experiments.configs import jolt_arithmetic
from tests.experiments.runner_test import read_metrics, tiny

KL_COEF = 0.01


@pytest.fixture(scope="module")
def one_step(tmp_path_factory):
  """(runner, run state, step context, student batch with advantages) of one step's producers,
  the teacher role's stage included (nothing updated yet)."""
  c = tiny("jolt_arithmetic", kl_coef=KL_COEF, eval_every=0, checkpoint_every=0,
           export_hf=False)
  run, rs = loop.setup(c, str(tmp_path_factory.mktemp("jolt") / "run"))
  rs = loop.restore_or_warm_up(run, rs)
  ctx = loop._context(run, rs)  # pylint: disable=protected-access
  batch, times = {}, {}
  loop.run_stages(run.stages, rs.train, batch, ctx, times)
  adv, _, _ = run.adv_fn({n: batch[n] for n in run.method.estimator_fields}, None)
  batch["advantages"] = adv
  return run, rs, ctx, batch, times


def _policy(run, params):
  return train.merge_model(run.setup.graphdef, params, run.setup.rest)


def _naive_logprobs(model, prompt_texts, responses, tok, width=40):
  """Per row, the log-probs of `responses[i]` after `prompt_texts[i]` (bos + its ids), each
  row unpadded on the left (right-padded to `width`), all rows in one pass."""
  seqs = [prompt_ids(tok, p) + list(r) for p, r in zip(prompt_texts, responses)]
  ids = np.full((len(seqs), width), tok.pad_id, np.int32)
  mask = np.zeros((len(seqs), width), bool)
  for i, q in enumerate(seqs):
    ids[i, :len(q)], mask[i, :len(q)] = q, True
  lp, _ = score_tokens(model, jnp.asarray(ids), jnp.asarray(mask), return_entropy=False)
  lp = np.asarray(lp)
  return [lp[i, len(q) - len(r):len(q)] for i, (q, r) in enumerate(zip(seqs, responses))]


def test_teacher_role_rows_hold_the_privileged_context_and_the_student_rescore_does_not(
    one_step):
  """The teacher role's rows: G_T samples per prompt after "answer <gold>: <prompt>" (prompts
  of different lengths, left-aligned to one width W); ℓ_{T|T}, ℓ_{S|T} (the response after the
  plain prompt), the reference's and ℓ_{T|S} of the student rows equal unpadded passes."""
  run, rs, ctx, batch, times = one_step
  c, tok, task = run.c, run.data.tokenizer, run.data.task
  N, G_T = c.prompts_per_step, c.jolt.teacher_samples
  host, rows = batch[jolt.HOST], batch[jolt.ROWS]
  assert host["tokens"].shape[0] == N * G_T and times["jolt_teacher"] > 0
  np.testing.assert_array_equal(host["group_id"], np.repeat(np.arange(N), G_T))
  examples = producers.examples_rows(ctx.examples)  # pylint: disable=protected-access
  P = run.data.max_prompt_len
  W = host["tokens"].shape[1] - c.max_new_tokens  # the privileged prompts' width
  assert W > P and not host["response_mask"][:, :W].any() and host["response_mask"][:, W].all()
  assert len(set(host["prompt_mask"].sum(1).tolist())) > 1  # the alignment is exercised
  seq, seq_attn = jax.device_get(jolt.student_context_layout(
      np.repeat(ctx.prompt_tokens, G_T, 0), np.repeat(ctx.prompt_mask, G_T, 0),
      host["tokens"], host["prompt_mask"] | host["response_mask"], W))
  model = _policy(run, rs.train.params)
  lp_old, lp_alt, lp_ref = (np.asarray(jax.device_get(rows[k]))
                            for k in ("logprob_old", "logprob_alt", "logprob_ref"))
  texts_T, texts_S, resps = [], [], []
  for b in range(N * G_T):
    ex = examples[b // G_T]
    gold, plain = str(ex["answer"]), str(ex["prompt"])
    privileged = tok.decode(host["tokens"][b][host["prompt_mask"][b]])
    assert privileged == f"answer {gold}: {plain}", privileged
    assert privileged == producers.privileged_prompt(c, task, ex, "answer")
    # The student-context layout: the plain prompt, then the same response tokens.
    student_prompt = tok.decode(seq[b][:P][seq_attn[b][:P]])
    assert student_prompt == plain and "answer" not in student_prompt
    resp = host["tokens"][b][host["response_mask"][b]]
    np.testing.assert_array_equal(seq[b][P:][seq_attn[b][P:]], resp)
    texts_T.append(privileged)
    texts_S.append(plain)
    resps.append(resp)
  # ℓ_{T|T} and ℓ_{S|T} against unpadded passes of the same parameters.
  for texts, got in ((texts_T, lp_old), (texts_S, lp_alt)):
    for b, want in enumerate(_naive_logprobs(model, texts, resps, tok)):
      m = host["response_mask"][b]
      np.testing.assert_allclose(got[b][m], want, atol=2e-5)
      assert not got[b][~m].any()
  # The reference is the policy at step 0: its pass on the teacher layout equals ℓ_{T|T}.
  resp_all = host["response_mask"]
  np.testing.assert_allclose(lp_ref[resp_all], lp_old[resp_all], atol=1e-6)
  # The teacher role's advantages are `jolt_teacher` of its own fields (β = 0.05).
  want = credit.advantages.distill.jolt.jolt_teacher_advantages(
      reward=host["reward"], group_id=host["group_id"], response_mask=host["response_mask"],
      logprob_old=lp_old, logprob_alt=lp_alt, num_groups=N, group_size=G_T)
  np.testing.assert_allclose(np.asarray(jax.device_get(rows["advantages"])), want, atol=1e-6)
  # The student role's self-teacher pass uses the same privileged prompt (ℓ_{T|S}).
  sh = batch["host"]
  texts = [producers.privileged_prompt(c, task, examples[b // c.group_size], "answer")
           for b in range(len(sh["tokens"]))]
  resps = [sh["tokens"][b][sh["response_mask"][b]] for b in range(len(sh["tokens"]))]
  lp_teacher = np.asarray(jax.device_get(batch["logprob_teacher"]))
  for b, want in enumerate(_naive_logprobs(model, texts, resps, tok)):
    np.testing.assert_allclose(lp_teacher[b][sh["response_mask"][b]], want, atol=2e-5)


def test_combined_update_is_one_step_on_the_sum_of_the_roles_losses(one_step):
  """One minibatch, one epoch: the update's loss is L_S + w·L_T (each role's `make_rl_loss`
  on its own rows, its own layout and old log-probs), and its gradient ∇L_S + w·∇L_T (the
  cross-role log-probs are batch constants)."""
  run, rs, ctx, batch, _ = one_step
  c, m, s = run.c, run.method, run.setup
  w = 0.5
  student = dict({f: batch[f] for f in m.update_fields}, attn_mask=batch["attn_mask"])
  both = jolt.update_batch({train.MAIN: student}, Step(rs.train, batch, ctx, True),
                           num_groups=c.prompts_per_step)
  assert set(both) == {train.MAIN, jolt.ROLE}
  assert both[jolt.ROLE]["tokens"].shape[1] > both[train.MAIN]["tokens"].shape[1]  # own layout
  kw = dict(loss_spec=m.loss, loss_fields=m.loss_fields, loss_kwargs=m.loss_kwargs,
            kl_coef=c.kl_coef, kl_kind=c.kl_kind, entropy_coef=c.entropy_coef,
            chunk_size=s.chunk_size)
  role_loss = train.make_rl_loss(s.graphdef, s.rest, **kw)
  params = rs.train.params
  grad_fn = jax.jit(jax.value_and_grad(role_loss, has_aux=True))
  (l_s, m_s), g_s = grad_fn(params, both[train.MAIN])
  (l_t, m_t), g_t = grad_fn(params, both[jolt.ROLE])
  assert abs(float(l_s)) > 0 and abs(float(l_t)) > 0 and "kl_loss" in m_t
  # Plain SGD with lr 1 (the run's schedule starts at lr 0, and Adam's first step is nearly
  # sign(g)): the parameters move by exactly −∇(L_S + w·L_T).
  tx = optax.sgd(1.0)
  row_sets = [train.RowSet(train.MAIN, loss_metric="loss_student"),
              train.RowSet(jolt.ROLE, weight=w, metric_prefix="jolt_teacher_",
                           loss_metric="loss_teacher")]
  terms = [t for r in row_sets for t in train.policy_terms(
      rows=r.name, **{k: v for k, v in kw.items() if k != "chunk_size"})]
  update = jax.jit(train.make_update(s.graphdef, s.rest, tx, row_sets=row_sets, terms=terms,
                                     ppo_epochs=1, num_minibatches=1,
                                     chunk_size=s.chunk_size))
  state = jax.tree.map(jnp.copy, rs.train).replace(opt_state=tx.init(params))
  new, metrics = update(state, both)
  np.testing.assert_allclose(metrics["loss"], l_s + w * l_t, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(metrics["loss_student"], l_s, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(metrics["loss_teacher"], l_t, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(metrics["pg_loss"], m_s["pg_loss"], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(metrics["jolt_teacher_kl_loss"], m_t["kl_loss"], rtol=1e-5,
                             atol=1e-7)
  grads = jax.tree.map(lambda a, b: a + w * b, g_s, g_t)
  updates, _ = tx.update(grads, tx.init(params), params)
  want = optax.apply_updates(params, updates)
  moved = 0.0
  for got_leaf, want_leaf, old in zip(jax.tree.leaves(new.params), jax.tree.leaves(want),
                                      jax.tree.leaves(params)):
    np.testing.assert_allclose(got_leaf, want_leaf, rtol=1e-5, atol=1e-8)
    moved = max(moved, float(jnp.max(jnp.abs(want_leaf - old))))
  assert moved > 0
  assert int(new.step) == int(rs.train.step) + 1


def test_jolt_recipe_runs_end_to_end(tmp_path):
  """`jolt_arithmetic:tiny` on a 2-device data mesh (the teacher role's rows sharded like the
  student's): 2 steps with every batch (both roles) validated, the runner's outputs, per-role
  metrics; the loss is the sum of the roles' (loss_coef 1, averaged over the minibatches)."""
  c = tiny("jolt_arithmetic", debug_checks=True, mesh="data=2")
  wd = str(tmp_path / "run")
  summary = loop.run(c, wd)
  rows = read_metrics(wd)
  assert [r["step"] for r in rows] == [0, 1, 2] and summary["rows"] == 3
  last = rows[-1]
  for key in ("reward_mean", "loss", "eval_accuracy", "time_jolt_teacher", "time_teacher",
              "jolt_teacher_reward_mean", "jolt_teacher_accuracy", "jolt_teacher_adv_mean",
              "jolt_teacher_adv_abs_mean", "jolt_student_adv_mean", "jolt_student_adv_abs_mean",
              "jolt_kl_teacher_student", "jolt_kl_student_teacher", "jolt_teacher_pg_loss",
              "loss_student", "loss_teacher"):
    assert key in last and np.isfinite(last[key]), key
  for r in rows[1:]:
    np.testing.assert_allclose(r["loss"], r["loss_student"] + r["loss_teacher"], rtol=1e-4,
                               atol=1e-6)
  for f in ("curves.png", "token_credit.png"):
    with open(os.path.join(wd, f), "rb") as fh:
      assert fh.read(8).startswith(b"\x89PNG"), f
  assert glob.glob(os.path.join(wd, "tb", "events.*"))
  assert os.path.exists(os.path.join(wd, "hf_policy", "model.safetensors"))
  with open(os.path.join(wd, "summary.md")) as f:
    assert "jolt_teacher" in f.read()  # the teacher role's time in the step-time table


def test_left_alignment_worked_example():
  """`left_align_prompts`'s docstring example (prompts of 2 and 3 tokens to width 3)."""
  assert doctest.testmod(jolt).failed == 0


def test_privileged_warm_up_shows_some_demonstrations_after_the_context():
  """`jolt.sft_privileged` = q: about q of the warm-up rows read the privileged prompt and then
  the gold answer; the others are the plain warm-up's rows (same examples and demonstrations)."""
  c = tiny("jolt_arithmetic", sft_batch_size=256)
  assert c.jolt.sft_privileged == 0.5  # the recipe's privileged warm-up
  data = loop.build_data(c)
  tok = data.tokenizer
  assert jolt_arithmetic.get_config("tiny,plain_warm_up").jolt.sft_privileged == 0
  c_plain = tiny("jolt_arithmetic", sft_batch_size=c.sft_batch_size)
  c_plain.jolt.sft_privileged = 0.0
  plain = next(loop._sft_batches(  # pylint: disable=protected-access
      data, c_plain, np.random.default_rng(1)))
  mixed = next(loop._sft_batches(  # pylint: disable=protected-access
      data, c, np.random.default_rng(1)))
  W = mixed["tokens"].shape[1] - data.max_response_len
  assert W > data.max_prompt_len
  n_priv = 0
  for b in range(c.sft_batch_size):
    prompt_p = plain["attn_mask"][b] & ~plain["response_mask"][b]
    prompt_m = mixed["attn_mask"][b] & ~mixed["response_mask"][b]
    text_p = tok.decode(plain["tokens"][b][prompt_p])
    text_m = tok.decode(mixed["tokens"][b][prompt_m])
    resp_p = tok.decode(plain["tokens"][b][plain["response_mask"][b]])
    resp_m = tok.decode(mixed["tokens"][b][mixed["response_mask"][b]])
    if text_m == text_p:
      assert resp_m == resp_p  # the plain warm-up's demonstration
    else:
      n_priv += 1
      gold = text_m.split(": ")[0].removeprefix("answer ")
      assert text_m == f"answer {gold}: {text_p}" and resp_m == gold, (text_m, resp_m)
  assert 0.35 < n_priv / c.sft_batch_size < 0.65
  c.jolt.teacher_samples = 0
  assert jolt.sft_prompter(c, data) is None


def _refusal_cases():
  base = dict(eval_every=0, checkpoint_every=0, export_hf=False)
  yield "student estimator", tiny("jolt_arithmetic", estimator="grpo", **base), "estimator 'jolt'"
  yield ("teacher role alone", tiny("grpo_arithmetic", estimator="jolt_teacher", **base),
         "JOLT's teacher role")
  c = tiny("jolt_arithmetic", **base)
  c.teacher.init_from = "/nonexistent/teacher"
  yield "frozen teacher", c, "JOLT is self-teaching"
  c = tiny("jolt_arithmetic", **base)
  c.teacher.context = ""
  yield "no context", c, "set teacher.context"
  c = tiny("igpo_lookup", estimator="jolt", **base)
  c.teacher.context, c.jolt.teacher_samples = "answer", 4
  yield "multi-turn", c, "single-turn tasks only"
  c = tiny("jolt_arithmetic", **base)
  c.tree.branches = 2
  yield "trees", c, "tree and step-level sampling"
  yield "async", tiny("jolt_arithmetic", async_rollouts=True, **base), "asynchronous"
  c = tiny("jolt_arithmetic", **base)
  c.amft.enabled = True
  yield "amft", c, "AMFT"
  if "critical" in c:
    c = tiny("jolt_arithmetic", **base)
    c.critical.enabled = True
    yield "critical", c, "critical"
  yield ("top-k loss", tiny("jolt_arithmetic", policy_loss="topk_distill", **base),
         "teacher_topk")
  c = tiny("jolt_arithmetic", **base)
  c.jolt.teacher_samples = -1
  yield "negative", c, "must be >= 0"
  c = tiny("jolt_arithmetic", **base)
  c.jolt.estimator_kwargs.beta = 0.1
  yield "bad kwarg", c, "no hyperparameter 'beta'"
  c = tiny("jolt_arithmetic", **base)
  c.jolt.sft_privileged = 1.5
  yield "fraction", c, "fraction in \\[0, 1\\]"
  c = tiny("grpo_arithmetic", **base)
  c.jolt.sft_privileged = 0.5
  yield "warm-up alone", c, "privileged warm-up is part of JOLT"
  c = tiny("jolt_arithmetic", num_minibatches=8, **base)
  c.jolt.teacher_samples = 1
  yield "rows", c, "teacher role's prompts_per_step\\*jolt.teacher_samples=4 rows"


def test_what_cannot_work_is_refused_before_any_file_with_the_reason(tmp_path):
  for name, c, message in _refusal_cases():
    wd = str(tmp_path / name.replace(" ", "_"))
    with pytest.raises(loop.SetupError, match=message):
      loop.run(c, wd)
    assert not os.path.exists(wd), name
