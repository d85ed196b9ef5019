"""BeamPERL's recipe (experiments/configs/beamperl_arithmetic.py) end to end (issue 14, item 5).

The base is a tiny random model exported by `loop.export_policy` (the format of
`sft_teacher_arithmetic`'s hf_policy/), loaded with `warm_start_from`. A random model never
answers arithmetic, so the verifier is swapped for another binary reward on the tokens (an
even first response token), which gives the adapters a gradient.
"""
import importlib
import json
import os

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from credit import tasks as tasks_lib
from credit.models import Decoder
from experiments import loop, producers

recipe = importlib.import_module("experiments.configs.beamperl_arithmetic")


def tiny(**overrides):
  c = recipe.get_config("tiny")
  c.mesh = "data=1"
  for k, v in overrides.items():
    c[k] = v
  return c


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("base") / "hf_policy")
  c, tok = tiny(), tasks_lib.CharTokenizer()
  mcfg = loop.build_model_config(c, tok)
  loop.export_policy(Decoder(mcfg, rngs=nnx.Rngs(3)), mcfg, out, tokenizer=tok)
  return out


def _flat(params) -> dict:
  return {jax.tree_util.keystr(p): np.array(v) for p, v in
          jax.tree_util.tree_flatten_with_path(jax.device_get(params))[0]}


def _even_first_token(s, examples, tokens, response_mask, example_of_row):
  texts = tasks_lib.decode_responses(s.data.tokenizer, tokens, response_mask)
  first = np.asarray(tokens)[np.arange(len(texts)), np.argmax(response_mask, axis=1)]
  return texts, (first % 2 == 0).astype(np.float32)


def test_tiny_recipe_trains_only_the_adapters(base, tmp_path, monkeypatch):
  seen = {"batches": []}
  real_setup, real_learn, real_finish = loop.setup, loop.learn, loop.finish
  real_eval = loop.evaluate

  def spy_setup(config, workdir):
    runner, rs = real_setup(config, workdir)
    seen["start"], seen["trainable"] = _flat(rs.train.params), _flat(runner.trainable)
    return runner, rs

  def spy_learn(run, rs, ctx, batch, times, t_step):
    assert ctx.ref_params is not None and rs.ref_params is None  # adapters off, no copy
    seen["batches"].append({k: np.asarray(batch[k]) for k in
                            ("logprob_old", "logprob_ref", "response_mask", "reward")})
    return real_learn(run, rs, ctx, batch, times, t_step)

  def spy_finish(run, rs, out):
    seen["end"] = _flat(rs.train.params)  # before the export merges the adapters
    return real_finish(run, rs, out)

  def fake_accuracy(sampler, model_state, data, c, batch_size, step=0, probe=False):
    m, first = real_eval(sampler, model_state, data, c, batch_size, step=step, probe=True)
    m = dict(m, eval_accuracy=(0.25, 0.5, 0.5)[step])  # best at step 1 (the earliest tie)
    return (m, first) if probe else m

  for name, fn in (("setup", spy_setup), ("learn", spy_learn), ("finish", spy_finish),
                   ("evaluate", fake_accuracy)):
    monkeypatch.setattr(loop, name, fn)
  monkeypatch.setattr(producers.signals, "verify_rows", _even_first_token)  # the verifier stage's
  wd = tmp_path / "run"
  result = loop.run(tiny(warm_start_from=base), str(wd))

  # Only the adapters changed; the base weights are the loaded ones, bit for bit.
  lora = {k for k, t in seen["trainable"].items() if t}
  assert lora and len(lora) < len(seen["start"])
  assert all("lora_" in k for k in lora)
  for k, v in seen["start"].items():
    if k in lora:
      continue
    np.testing.assert_array_equal(seen["end"][k], v, err_msg=k)
  assert any("lora_b" in k and not np.array_equal(seen["end"][k], seen["start"][k])
             for k in lora)
  # The reference is the loaded checkpoint: at step 1 (adapters B = 0) it scores exactly as
  # the behaviour policy; at step 2 the trained adapters move the policy away from it.
  b1, b2 = seen["batches"]
  assert b1["reward"].min() == 0.0 and b1["reward"].max() == 1.0  # advantages are not all 0
  np.testing.assert_array_equal(b1["logprob_ref"], b1["logprob_old"])
  m2 = b2["response_mask"]
  assert np.abs(b2["logprob_ref"] - b2["logprob_old"])[m2].max() > 1e-6

  rows = [json.loads(line) for line in open(wd / "metrics.jsonl")]
  assert [r["step"] for r in rows] == [0, 1, 2]
  assert all("kl_loss" in r and np.isfinite(r["loss"]) for r in rows[1:])
  assert (wd / "summary.md").exists() and (wd / "hf_policy" / "config.json").exists()
  # The best held-out evaluation's policy (step 1), not the last one, in best_policy/.
  best = json.loads((wd / "best_policy" / "best.json").read_text())
  assert best == {"step": 1, "eval_accuracy": 0.5}
  assert (result["eval_best_step"], result["eval_accuracy_best"]) == (1, 0.5)
  w = {d: load_file(str(os.path.join(d, "model.safetensors")))
       for d in (base, str(wd / "best_policy"), str(wd / "hf_policy"))}
  base_w, best_w, last_w = w.values()
  q = next(k for k in base_w if k.endswith("q_proj.weight"))
  k_ = next(k for k in base_w if k.endswith("k_proj.weight"))
  assert not np.array_equal(best_w[q], base_w[q]) and not np.array_equal(best_w[q], last_w[q])
  np.testing.assert_array_equal(best_w[k_], base_w[k_])  # no adapter on k_proj


def test_a_run_without_a_loaded_checkpoint_is_refused(tmp_path):
  wd = tmp_path / "w"
  with pytest.raises(loop.SetupError, match="sft_teacher_arithmetic.*warm_start_from"):
    loop.run(tiny(), str(wd))
  assert not wd.exists()


def test_drgrpo_variant_has_no_reference_and_a_constant_normaliser():
  c = recipe.get_config("drgrpo")
  m = loop.check_method(c)
  assert c.estimator == "dr_grpo" and not m.keeps_reference
  assert m.loss_kwargs == {"loss_agg_mode": "seq-mean-token-sum-norm",
                           "norm_constant": float(c.max_new_tokens)}
  c = recipe.get_config()
  assert c.lora_rank == 8 and loop.check_method(c).keeps_reference  # the KL term's reference
