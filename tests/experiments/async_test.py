"""Asynchronous RL (experiments/async_rl.py): the staleness rule, the ledger, unit contents,
settings that are refused, and a trainer + worker run on CPU that is killed and resumes."""
import json
import os
import types

import jax
import numpy as np
import pytest

from experiments import async_rl
from experiments.async_rl import Ledger, capacity, nth_free, pack, unpack, unit_examples
from tests.experiments.runner_test import ROOT, read_metrics, run_cli, tiny


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


def test_staleness_bound_drops_old_rows_inside_the_loss():
  """reduce_policy_loss(max_staleness=η): rows with train_version − policy_version > η leave
  the mask (numpy reference: the same loss on the kept rows only); decoupled PPO keeps its
  pre-rejection denominator, so a dropped row is a zero in the mean there."""
  import credit
  from tests.losses.helpers import make_batch, np_aggregate
  b = make_batch(3)
  B = b["response_mask"].shape[0]
  pv = np.array([5, 4, 3, 5, 2, 5, 4, 3], np.int32)[:B]
  keep = 5 - pv <= 1
  ppo = credit.get_policy_loss("ppo_clip")
  tok = np.asarray(ppo.token_fn(**b).loss, np.float64)
  got = ppo.fn(**b, policy_version=pv, train_version=np.int32(5), max_staleness=1)
  m = b["response_mask"] & keep[:, None]
  np.testing.assert_allclose(got.loss, np_aggregate(tok, m, "token-mean"), rtol=1e-5)
  rows = b["response_mask"].any(1)
  assert np.isclose(got.metrics["stale_row_frac"], (rows & ~keep).sum() / rows.sum())
  # [B] train_version, the bound as an array, and jit give the same loss.
  f = lambda tv, eta: ppo.fn(**b, policy_version=pv, train_version=tv, max_staleness=eta).loss
  np.testing.assert_allclose(jax.jit(f)(np.full(B, 5, np.int32), np.int32(1)), got.loss,
                             rtol=1e-6)
  # A bound no row exceeds is no bound.
  np.testing.assert_allclose(ppo.fn(**b, policy_version=pv, train_version=5,
                                    max_staleness=3).loss, ppo.fn(**b).loss, rtol=1e-6)
  dec = credit.get_policy_loss("decoupled_ppo")
  smp = b["logprob_old"] - np.float32(0.1)
  got = dec.fn(**b, logprob_sampler=smp, policy_version=pv, train_version=5, max_staleness=1)
  tok = np.asarray(dec.token_fn(**b).loss, np.float64)  # ε = 0.4
  want = np.where(m, tok * np.exp(0.1), 0.0).sum() / b["response_mask"].sum()
  np.testing.assert_allclose(got.loss, want, rtol=1e-5)
  with pytest.raises(ValueError, match="needs policy_version"):
    ppo.fn(**b, max_staleness=1)
  with pytest.raises(ValueError, match=">= 0"):
    ppo.fn(**b, policy_version=pv, train_version=5, max_staleness=-1)


def test_runner_feeds_the_staleness_bound_its_version_fields():
  """loss_kwargs.max_staleness plans the policy_version producer (the sync loop's current
  step) and puts the field in the update batch; train_version is the runner's."""
  from experiments import loop
  c = tiny("igpo_lookup")
  c.loss_kwargs = {"max_staleness": 0}
  m = loop.check_method(c)
  assert "policy_version" in m.loss_fields and "policy_version" in m.update_fields
  assert "policy_version" in [p.producer.name for p in m.plan]
  c.loss_kwargs = {"train_version": 3}
  with pytest.raises(loop.SetupError, match="passed by the runner"):
    loop.check_method(c)
  # The producer stamps every row with the step of the state it is given (the synchronous
  # loop's TrainState: the current step; an async worker's held version).
  import jax.numpy as jnp
  from credit import parallel
  from experiments import producers
  setup = types.SimpleNamespace(mesh=parallel.make_mesh("data=1"))
  produce = producers.passes._build_policy_version(setup, frozenset({"policy_version"}))
  for step in (jnp.asarray(7, jnp.int32), 7):
    out = produce(types.SimpleNamespace(step=step), {"tokens": np.zeros((6, 3), np.int32)},
                  None)
    assert out["policy_version"].dtype == np.int32
    np.testing.assert_array_equal(np.asarray(out["policy_version"]), np.full(6, 7))


class _Store:
  """The two calls `_Held` makes of a Coordinator, over a dict."""

  def __init__(self, **kv):
    self.kv = kv

  def try_get(self, key):
    return self.kv.get(key)

  def get_json(self, key, timeout_s):
    return json.loads(self.kv[key])


def test_parameters_through_a_file_round_trip_and_a_missing_file_is_named(tmp_path):
  import jax.numpy as jnp
  like = {"a": jnp.arange(6, dtype=jnp.float32).reshape(2, 3), "b": jnp.ones(4, jnp.bfloat16)}
  new = {"a": like["a"] + 1, "b": like["b"] * 2}
  path = str(tmp_path / "p" / "params_3.safetensors")
  ptr = async_rl.pack_params(new, path)
  assert len(ptr) < 200 and os.listdir(tmp_path / "p") == ["params_3.safetensors"]
  for raw in (ptr, async_rl.pack_params(new)):  # the file and the store give the same tree
    got = async_rl.unpack_params(raw, like)
    assert got["b"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got["a"]), np.asarray(new["a"]))
  assert async_rl.params_nbytes(like) == 6 * 4 + 4 * 2
  state, a = {"version": 3}, types.SimpleNamespace(timeout_s=1.0)
  store = _Store(**{"async/params/3": ptr, "async/state": json.dumps(state)})
  held = async_rl._Held(store, a, like)
  assert held.newest(state) and held.version == 3
  np.testing.assert_array_equal(np.asarray(held.params["a"]), np.asarray(new["a"]))
  os.remove(path)  # the state still names version 3: not a race, a directory not shared
  with pytest.raises(async_rl.CoordinationError, match="params_dir must be a directory"):
    async_rl._Held(store, a, like).newest(state)


def test_wait_key_blocks_until_the_key_is_set_or_times_out():
  import threading
  import time
  from experiments.coordination import Coordinator, CoordinationError, free_port
  coord = Coordinator(f"localhost:{free_port()}", 1, 0, heartbeat_s=5)
  try:
    for poll_s in (0.0, 0.01):
      key = f"k/{poll_s}"
      threading.Timer(0.3, lambda k=key: coord.set(k, b"x")).start()
      t0 = time.perf_counter()
      assert coord.wait_key(key, 10.0, poll_s) == b"x"
      assert 0.25 < time.perf_counter() - t0 < 5.0
      with pytest.raises(CoordinationError, match="waiting for"):
        coord.wait_key(key + "/never", 0.2, poll_s)
  finally:
    coord.close()


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
  finishes; every unit index is consumed exactly once across the two launches. The first
  launch sends parameters through the store, the second through files (params_file_mb=0);
  both bound row staleness inside the loss (loss_kwargs.max_staleness, policy_version)."""
  wd = str(tmp_path / "run")
  args = ["--config", os.path.join(ROOT, "experiments/configs/igpo_lookup.py:tiny"),
          "--workdir", wd, "--config.estimator=grpo", "--config.policy_loss=decoupled_ppo",
          "--config.async_rollouts=True", "--config.async_rl.max_staleness=1",
          "--config.loss_kwargs.max_staleness=0",
          "--config.steps=3", "--config.checkpoint_every=1", "--config.eval_every=0",
          "--config.mesh=data=1", "--config.async_rl.heartbeat_s=5"]
  r = run_cli(args + ["--config.kill_at_step=1"])
  assert r.returncode == -9, r.stderr[-3000:]
  assert [x["step"] for x in read_metrics(wd)] == [0, 1]
  assert os.path.exists(os.path.join(wd, "async", "worker_1.log"))
  assert not os.path.exists(os.path.join(wd, "async", "params"))  # tiny: through the store
  r = run_cli(args + ["--config.async_rl.params_file_mb=0"])
  assert r.returncode == 0, r.stderr[-3000:]
  assert "resumed from step 1" in r.stdout
  assert os.listdir(os.path.join(wd, "async", "params")) == []  # files, removed at the end
  rows = read_metrics(wd)
  assert [x["step"] for x in rows] == [0, 1, 2, 3]
  for x in rows[1:]:
    assert 0 <= x["async_staleness_max"] <= 1  # η = 1, nothing dropped
    assert np.isfinite(x["loss"]) and 0.0 <= x["trainer_idle_frac"] <= 1.0
    assert 0.0 <= x["is_frac_high"] <= 1.0  # the behaviour weight's cap (decoupled PPO)
    # Rows older than the version trained (max_staleness 0) are out of the loss.
    # (staleness is 0 or 1 here, so the stale fraction of rows is the mean staleness).
    assert x["stale_row_frac"] == pytest.approx(x["async_staleness_mean"], abs=1e-6)
    assert 0.0 <= x["async_wait_cpu_s"] <= x["async_wait_s"] + 0.05
  # 3 steps x 4 units (prompts_per_step 4, one prompt per unit), each index once.
  meta = json.load(open(os.path.join(wd, "checkpoints", "3", "meta", "metadata")))
  assert meta["loader"] == {"consumed": [[0, 12]], "dropped": 0}
