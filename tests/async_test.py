"""Asynchronous RL (experiments/async_rl.py): the staleness rule, the ledger, unit contents,
settings that are refused, and a trainer + worker run on CPU that is killed and resumes."""
import json
import os

import numpy as np
import pytest

from experiments import async_rl
from experiments.async_rl import Ledger, capacity, nth_free, pack, unpack, unit_examples
from tests.experiments_test import ROOT, read_metrics, run_cli, tiny


def cap(**kw):
  args = dict(version=0, launch_version=0, claims=0, consumed=0, dropped=0, units_per_step=4,
              max_staleness=2, max_in_flight=0)
  args.update(kw)
  return capacity(**args)


def test_staleness_rule_caps_units_ahead_of_the_trainer():
  # Fresh: (η + 1)·B = 12 units may start before the first update, not one more.
  assert cap(claims=11) == 1 and cap(claims=12) == 0
  # Each version opens one more batch; consuming alone does not (AReaL counts accepted units).
  assert cap(claims=12, consumed=4) == 0
  assert cap(claims=12, consumed=4, version=1) == 4
  # A dropped unit was not accepted: its slot opens again.
  assert cap(claims=12, dropped=1) == 1
  # After a restart at version 5 the count starts again from the trained units.
  assert cap(version=5, launch_version=5, claims=0) == 12
  assert cap(version=5, launch_version=5, claims=12) == 0
  # η = 0: only the current version's batch.
  assert cap(max_staleness=0, claims=3) == 1 and cap(max_staleness=0, claims=4) == 0
  # The in-flight cap (ready + running) binds first when smaller.
  assert cap(max_in_flight=5, claims=5) == 0
  assert cap(max_in_flight=5, claims=5, consumed=4) == min(5 - 1, 12 - 5)


def test_ledger_state_round_trip_and_free_units():
  led = Ledger(consumed={0, 1, 2, 3, 5, 6, 9}, dropped=2)
  state = json.loads(json.dumps(led.get_state()))
  assert state["consumed"] == [[0, 4], [5, 7], [9, 10]]
  back = Ledger()
  back.set_state(state)
  assert back == led
  # Claims after a restart skip consumed units and fill the holes first.
  assert [nth_free(k, led.consumed) for k in range(4)] == [4, 7, 8, 10]
  assert [nth_free(k, set()) for k in range(3)] == [0, 1, 2]


def test_units_cover_each_epoch_once_and_are_deterministic():
  train = [{"prompt": f"p{i}", "index": i} for i in range(10)]
  seen = [e["index"] for s in range(5) for e in unit_examples(train, s, 2, seed=3)]
  assert sorted(seen) == list(range(10))  # epoch 0: a permutation
  assert seen != list(range(10))
  again = [e["index"] for s in range(5) for e in unit_examples(train, s, 2, seed=3)]
  assert seen == again
  nxt = [e["index"] for s in range(5, 10) for e in unit_examples(train, s, 2, seed=3)]
  assert sorted(nxt) == list(range(10)) and nxt != seen  # epoch 1: reshuffled


def test_pack_round_trip_keeps_dtypes_and_shapes():
  import jax.numpy as jnp
  arrays = {"a": np.arange(6, dtype=np.int32).reshape(2, 3), "b": np.array([True, False]),
            "c": np.asarray(jnp.ones((2, 2), jnp.bfloat16)), "d": np.float32(1.5) * np.ones(())}
  out, meta = unpack(pack(arrays, {"unit": 7, "texts": ["x"]}))
  assert meta == {"unit": 7, "texts": ["x"]}
  for k, v in arrays.items():
    assert out[k].dtype == v.dtype and out[k].shape == v.shape
    np.testing.assert_array_equal(np.asarray(out[k], np.float32), np.asarray(v, np.float32))


@pytest.mark.parametrize("key, value, match", [
    ("max_staleness", -1, "max_staleness"),
    ("max_in_flight", 3, "smaller than one batch"),
    ("groups_per_rollout", 3, "divide prompts_per_step"),
    ("num_workers", 0, "num_workers"),
])
def test_bad_async_settings_are_refused(key, value, match):
  c = tiny("igpo_lookup")
  c.async_rl[key] = value
  with pytest.raises(async_rl.SetupError, match=match):
    async_rl.check_async(c)


def test_async_sampler_logprob_old_only_without_the_decoupled_loss():
  """decoupled_ppo needs the recomputed proximal policy; M2PO trains against the stale
  behaviour policy itself (logprob_old = the sampler's log-probs)."""
  c = tiny("igpo_lookup")
  c.logprob_old_source, c.policy_loss = "sampler", "decoupled_ppo"
  with pytest.raises(async_rl.SetupError, match="recompute"):
    async_rl.check_async(c)
  c.policy_loss = "m2po"
  async_rl.check_async(c)


def test_async_lookup_run_trains_is_killed_and_resumes(tmp_path):
  """Trainer + one rollout worker (two processes) on the multi-turn lookup task with the
  decoupled PPO loss: killed after step 1, the command resumes from its checkpoint and
  finishes; every unit index is consumed exactly once across the two launches."""
  wd = str(tmp_path / "run")
  args = ["--config", os.path.join(ROOT, "experiments/configs/igpo_lookup.py:tiny"),
          "--workdir", wd, "--config.estimator=grpo", "--config.policy_loss=decoupled_ppo",
          "--config.async_rollouts=True", "--config.async_rl.max_staleness=1",
          "--config.steps=3", "--config.checkpoint_every=1", "--config.eval_every=0",
          "--config.mesh=data=1", "--config.async_rl.heartbeat_s=5"]
  r = run_cli(args + ["--config.kill_at_step=1"])
  assert r.returncode == -9, r.stderr[-3000:]
  assert [x["step"] for x in read_metrics(wd)] == [0, 1]
  assert os.path.exists(os.path.join(wd, "async", "worker_1.log"))
  r = run_cli(args)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "resumed from step 1" in r.stdout
  rows = read_metrics(wd)
  assert [x["step"] for x in rows] == [0, 1, 2, 3]
  for x in rows[1:]:
    assert 0 <= x["async_staleness_max"] <= 1  # η = 1, nothing dropped
    assert np.isfinite(x["loss"]) and 0.0 <= x["trainer_idle_frac"] <= 1.0
    assert 0.0 <= x["is_frac_high"] <= 1.0  # the behaviour weight's cap (decoupled PPO)
  # 3 steps x 4 units (prompts_per_step 4, one prompt per unit), each index once.
  meta = json.load(open(os.path.join(wd, "checkpoints", "3", "meta", "metadata")))
  assert meta["loader"] == {"consumed": [[0, 12]], "dropped": 0}
