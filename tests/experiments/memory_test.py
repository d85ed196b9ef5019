"""experiments/memory.py: the analytic parameter layout and shards against the real Decoder,
the plan's responses to remat, sharding, minibatches and dtypes, and the start-up refusal."""
import jax
import numpy as np
import pytest
from flax import nnx

from credit import parallel
from credit.models import Decoder, preset, shard_model, tiny_config
from experiments import loop, memory, validate
from experiments.configs import settings
from experiments.producers.base import model_config
from credit.tasks import CharTokenizer


@pytest.mark.parametrize("family,tie", [("llama", False), ("qwen2", True), ("qwen3", False)])
def test_param_shapes_are_the_decoders(family, tie):
  cfg = tiny_config(family, tie_embeddings=tie, num_layers=2)
  abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
  real = sorted(x.shape for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
  assert sorted(s for _, s, _ in memory.param_shapes(cfg)) == real
  assert memory.num_params(cfg) == sum(int(np.prod(s)) for s in real)


def test_params_per_device_is_what_shard_model_places():
  cfg = tiny_config("qwen2", num_heads=4, num_kv_heads=2, vocab_size=100)
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  for spec in ("fsdp=8", "data=2,fsdp=2,tensor=2", "tensor=4", "data=8"):
    mesh = parallel.make_mesh(spec)
    placed = shard_model(nnx.clone(model), mesh)
    held = sum(x.addressable_shards[0].data.size
               for x in jax.tree.leaves(nnx.state(placed, nnx.Param)))
    assert memory.params_per_device(cfg, dict(mesh.shape)) == held, spec


def test_the_plan_follows_remat_sharding_minibatches_and_dtypes():
  cfg = preset("qwen3-0.6b", num_layers=4)
  base = dict(model=cfg, mesh_shape={"data": 1}, rollout_rows=16, seq_len=256,
              num_minibatches=2)
  plan = memory.plan_memory(**base)
  n = memory.num_params(cfg)
  assert plan.rows[0][1] == 4 * n and plan.rows[1][1] == 8 * n  # f32 params; Adam mu + nu
  assert plan.available is None and plan.fits
  remat = memory.plan_memory(**dict(base, model=cfg.replace(remat=True)))
  assert remat.phase("update") < plan.phase("update")
  kept = memory.plan_memory(**dict(base, model=cfg.replace(remat=True,
                                                            remat_policy="projections")))
  assert remat.phase("update") < kept.phase("update") < plan.phase("update")
  assert any("remat_policy=full" in a for a in kept.advice)
  more = memory.plan_memory(**dict(base, num_minibatches=4))
  assert more.phase("update") < plan.phase("update")
  fsdp = memory.plan_memory(**dict(base, mesh_shape={"fsdp": 8}))
  assert fsdp.rows[0][1] == pytest.approx(plan.rows[0][1] / 8, rel=1e-3)
  bf16 = cfg.replace(param_dtype="bfloat16", dtype="bfloat16")
  mixed = memory.plan_memory(**dict(base, model=bf16, master_dtype="float32"))
  assert mixed.rows[0][1] == 2 * n and mixed.rows[1][1] == 12 * n  # master + 2 moments, f32
  copies = memory.plan_memory(**base, reference=cfg, teacher=cfg, trained_copies=1)
  assert copies.phase("resident") == pytest.approx(plan.phase("resident") + 8 * n + 12 * n)
  small = memory.plan_memory(**base, device_bytes=plan.peak / 0.9 * 0.99)
  assert not small.fits and "the run needs" in memory.refusal(small)
  assert memory.refusal(memory.plan_memory(**base, device_bytes=plan.peak / 0.9 * 1.01)) is None
  text = memory.format_plan(small)
  assert "| parameters | resident |" in text and "DOES NOT FIT" in text


def test_a_preset_config_gives_the_preset_with_the_runs_tokenizer():
  c = settings.arithmetic(tiny=True)
  c.model.preset, c.model.preset_layers, c.model.param_dtype = "qwen3-0.6b", 1, "bfloat16"
  tok = CharTokenizer()
  cfg = model_config(c, tok)
  assert cfg == preset("qwen3-0.6b", num_layers=1, param_dtype="bfloat16",
                       eos_token_id=tok.eos_id, bos_token_id=tok.bos_id,
                       pad_token_id=tok.pad_id)
  c.model.preset = ""
  assert model_config(c, tok).vocab_size == tok.vocab_size  # the explicit fields, as before


def test_a_run_that_cannot_fit_is_refused_with_its_numbers_when_the_mesh_is_made():
  c = settings.arithmetic(tiny=True)
  c.mesh = "fsdp=-1"
  validate.check_mesh(c, devices=True)  # the tiny run fits
  c.model.preset = "qwen3-4b"
  c.memory.device_gb = 4.0
  with pytest.raises(validate.Refusal, match=r"needs .* GiB per device \(parameters "):
    validate.check_mesh(c, devices=True)
  c.memory.check = False
  validate.check_mesh(c, devices=True)
  method = loop.check_method(c)
  plan = memory.plan_run(c, method=method, reference_copy=loop.keeps_reference_copy(c, method),
                         mesh_shape={"fsdp": 8}, device_bytes=4 * memory.GIB)
  assert "4.02B params" in plan.notes and not plan.fits


def test_preset_names_and_a_checkpoint_that_is_not_the_preset_are_refused(tmp_path):
  c = settings.arithmetic(tiny=True)
  c.model.preset = "qwen3-0.6"
  with pytest.raises(validate.Refusal, match="did you mean 'qwen3-0.6b'"):
    validate.check_names(c)
  import json
  from credit.models import config_to_hf
  (tmp_path / "config.json").write_text(json.dumps(config_to_hf(tiny_config("qwen3"))))
  c.model.preset, c.init_from = "qwen3-0.6b", str(tmp_path)
  with pytest.raises(validate.Refusal, match="does not match --config.init_from"):
    validate.check_preset(c)
