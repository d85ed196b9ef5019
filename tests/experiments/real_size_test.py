"""The real-size path: one full GRPO step (sample, score, update) of a model of Qwen3-0.6B's
width and vocabulary (151,936; one block) on 8 host devices with FSDP, and the accelerator
benchmark's reduced mode (`benchmarks/accelerator.py`), so neither can rot."""
import math
import time

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from benchmarks import accelerator
from experiments import memory


def test_one_grpo_step_at_qwen3_0_6b_width_and_vocabulary_on_8_devices_with_fsdp():
  s = accelerator.Setting(model="qwen3-0.6b", overrides=(("num_layers", 1),), prompts=2,
                          group=4, prompt_len=6, new_tokens=4, dtype="float32", remat=True,
                          mesh="fsdp=8", repeats=0)
  t0 = time.process_time()
  cfg, mesh, step, state = accelerator.build(s)
  assert (cfg.vocab_size, cfg.hidden_size, cfg.num_heads, cfg.head_dim) == (151936, 1024, 16, 128)
  assert mesh.shape == {"fsdp": 8}
  emb = state.params["embed_tokens"]["embedding"][...]
  assert emb.sharding.spec == P(None, "fsdp") and emb.addressable_shards[0].data.shape == (
      151936, 128)
  before = np.asarray(emb[:4, :8])
  state, metrics, times, out = step(state, jax.random.key(0))
  assert out.tokens.shape == (8, 10) and out.tokens.sharding.spec[0] == "fsdp"
  assert int(np.asarray(out.response_mask).sum()) == 8 * 4  # no stop token: R tokens per row
  assert all(math.isfinite(float(metrics[k])) for k in ("loss", "grad_norm", "reward_mean"))
  assert float(metrics["grad_norm"]) > 0
  after = state.params["embed_tokens"]["embedding"][...]
  assert after.sharding.spec == P(None, "fsdp")
  assert not np.array_equal(np.asarray(after[:4, :8]), before)  # the update moved the weights
  plan = memory.plan_memory(model=cfg, mesh_shape=dict(mesh.shape), rollout_rows=8, seq_len=10)
  assert plan.rows[0][1] == memory.params_per_device(cfg, mesh.shape) * 4
  print(f"real-width GRPO step: {times} (wall s), {time.process_time() - t0:.1f} s CPU in all")
  del state, out, emb, after
  jax.clear_caches()  # its programs hold the 151,936-row buffers' layouts; free them now


def test_the_accelerator_benchmark_runs_in_its_reduced_mode(capsys):
  results = accelerator.main(["--cpu-reduced", "--repeats", "1", "--mesh", "fsdp=2"])
  assert len(results) == 1 and results[0].changed and math.isfinite(results[0].loss)
  assert results[0].sample_tok_s > 0 and results[0].update_tok_s > 0
  assert "measured" in results[0].mfu and 0 < results[0].mfu["measured"]["step"]
  text = capsys.readouterr().out
  assert "| qwen3-0.6b (reduced) |" in text and "reduced mode" in text
