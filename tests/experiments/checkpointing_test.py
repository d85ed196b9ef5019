"""Tests for experiments/checkpointing.py: round trips, shardings, corruption."""
import glob
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from experiments import checkpointing as ck

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _train_state(step: int):
  """A nested state like the runner's: params, adamw state, key, estimator state."""
  params = {"dense": {"w": jnp.arange(12.0).reshape(4, 3) / 7.0 + step,
                      "b": jnp.full((3,), -1.5)},
            "layers": [jnp.ones((2,)), jnp.arange(3.0)]}
  tx = optax.adamw(1e-2)
  opt = tx.init(params)
  # One real update so mu/nu/count are non-trivial.
  grads = jax.tree.map(lambda x: jnp.sin(x) + 0.5, params)
  _, opt = tx.update(grads, opt, params)
  return {
      "params": params,
      "opt": opt,
      "key": jax.random.fold_in(jax.random.key(42), step),
      "step": jnp.int32(step),
      "estimator": {"running_mean": jnp.float32(0.25 * step),
                    "running_var": jnp.float32(2.0),
                    "count": jnp.int32(10 * step)},
  }


def _assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
      assert y.dtype == x.dtype
      x, y = jax.random.key_data(x), jax.random.key_data(y)
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _save_steps(directory, steps, **kwargs):
  ckpt = ck.Checkpointer(directory, max_to_keep=10, **kwargs)
  for s in steps:
    assert ckpt.save(s, state=_train_state(s), meta={"step": s, "data": {"pos": 3 * s}})
  ckpt.close()


def test_round_trip_nested_state_with_typed_key_and_adamw(tmp_path):
  state = _train_state(7)
  meta = {"data_iter": {"next_index": np.int64(96), "epoch": 1},
          "config_hash": "abc123", "reward_mean": np.float32(0.5),
          "history": jnp.arange(3)}
  with ck.Checkpointer(tmp_path / "ckpt") as ckpt:
    assert ckpt.save(7, state=state, meta=meta)
    assert os.path.exists(tmp_path / "ckpt" / "7" / ck.MANIFEST_NAME)
  # A fresh object, as after a restart.
  with ck.Checkpointer(tmp_path / "ckpt") as ckpt:
    step, restored, rmeta = ckpt.restore_latest(ck.abstract_like(state))
  assert step == 7
  _assert_trees_equal(restored, state)
  assert isinstance(restored["opt"][0], optax.ScaleByAdamState)
  assert int(restored["opt"][0].count) == 1
  # The restored key continues the same random stream.
  np.testing.assert_array_equal(jax.random.normal(restored["key"], (4,)),
                                jax.random.normal(state["key"], (4,)))
  assert rmeta == {"data_iter": {"next_index": 96, "epoch": 1},
                   "config_hash": "abc123", "reward_mean": 0.5, "history": [0, 1, 2]}


def test_meta_must_be_json(tmp_path):
  with ck.Checkpointer(tmp_path) as ckpt:
    with pytest.raises(TypeError, match="not JSON serialisable"):
      ckpt.save(1, state={"x": jnp.ones(2)}, meta={"bad": object()})
    assert ckpt.all_steps() == []


def test_empty_directory_restores_none(tmp_path):
  with ck.Checkpointer(tmp_path / "none") as ckpt:
    assert ckpt.restore_latest({"x": jax.ShapeDtypeStruct((2,), jnp.float32)}) is None


def test_sharded_restore_keeps_named_shardings(tmp_path):
  assert jax.device_count() == 8
  mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"),
              axis_types=(AxisType.Auto,) * 2)
  def put(x, spec):
    return jax.device_put(x, NamedSharding(mesh, spec))
  state = {
      "w": put(jnp.arange(64.0).reshape(8, 8), P("data", "model")),
      "b": put(jnp.arange(8.0), P("model")),
      "keys": put(jax.random.split(jax.random.key(3), 8), P("data")),
      "step": put(jnp.int32(5), P()),
  }
  with ck.Checkpointer(tmp_path) as ckpt:
    ckpt.save(5, state=state, meta={})
    abstract = ck.abstract_like(state)
    _, restored, _ = ckpt.restore_latest(abstract)
    for name in state:
      assert isinstance(restored[name].sharding, NamedSharding), name
      assert restored[name].sharding == state[name].sharding, name
    _assert_trees_equal(restored, state)
    # Shardings come from the abstract state, not from disk.
    abstract["w"] = jax.ShapeDtypeStruct((8, 8), jnp.float32,
                                         sharding=NamedSharding(mesh, P(None, "data")))
    _, restored, _ = ckpt.restore_latest(abstract)
    assert restored["w"].sharding.spec == P(None, "data")
    assert len(restored["w"].addressable_shards) == 8
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.asarray(state["w"]))


def _data_files(step_dir):
  return sorted(glob.glob(os.path.join(step_dir, "state", "**", "d", "*"), recursive=True))


def _delete_data_files(step_dir):
  for f in _data_files(step_dir):
    os.remove(f)


def _truncate_data_files(step_dir):
  for f in _data_files(step_dir):
    with open(f, "r+b") as fh:
      fh.truncate(os.path.getsize(f) // 2)


def _garbage_meta_same_size(step_dir):
  path = os.path.join(step_dir, "meta", "metadata")
  n = os.path.getsize(path)
  with open(path, "wb") as fh:
    fh.write(b"{" * n)


def _empty_step_dir(step_dir):
  shutil.rmtree(step_dir)
  os.mkdir(step_dir)


def _garbage_manifest(step_dir):
  with open(os.path.join(step_dir, ck.MANIFEST_NAME), "w") as fh:
    fh.write("\x00garbage")


def _meta_not_object_no_manifest(step_dir):
  os.remove(os.path.join(step_dir, ck.MANIFEST_NAME))
  with open(os.path.join(step_dir, "meta", "metadata"), "w") as fh:
    fh.write("[1, 2]")


@pytest.mark.parametrize("corrupt, reason", [
    (_delete_data_files, "is missing"),
    (_truncate_data_files, "truncated"),
    (_garbage_meta_same_size, "fails its CRC-32 check"),  # same size: the manifest CRC
    (_empty_step_dir, "orbax could not read it"),
    (_garbage_manifest, "unreadable manifest"),
    (_meta_not_object_no_manifest, "not a JSON object"),
])
def test_corrupt_latest_falls_back_to_previous(tmp_path, caplog, corrupt, reason):
  directory = tmp_path / "ckpt"
  _save_steps(directory, [1, 2, 3])
  corrupt(str(directory / "3"))
  with ck.Checkpointer(directory, max_to_keep=10) as ckpt:
    with caplog.at_level(logging.WARNING, logger=ck.__name__):
      step, state, meta = ckpt.restore_latest(ck.abstract_like(_train_state(0)))
    assert step == 2 and meta == {"step": 2, "data": {"pos": 6}}
    _assert_trees_equal(state, _train_state(2))
    messages = [r.getMessage() for r in caplog.records if r.name == ck.__name__]
    assert any("Skipping checkpoint step 3" in m and reason in m for m in messages), messages
    # The corrupt step is out of the way: the resumed run can save step 3 again.
    assert ckpt.all_steps() == [1, 2]
    assert len(os.listdir(directory / ck.QUARANTINE_DIR)) == 1
    assert ckpt.save(3, state=_train_state(3), meta={"step": 3})
    assert ckpt.restore_latest(ck.abstract_like(_train_state(0))).step == 3


def test_checksum_catches_same_size_content_damage(tmp_path, caplog):
  directory = tmp_path / "ckpt"
  _save_steps(directory, [1, 2], checksum=True)
  manifest_files = ck._list_files(str(directory / "2"))
  assert "state/_METADATA" in manifest_files
  path = directory / "2" / "state" / "_METADATA"
  data = bytearray(path.read_bytes())
  data[len(data) // 2] = ord("x") if data[len(data) // 2] != ord("x") else ord("y")
  path.write_bytes(bytes(data))
  with ck.Checkpointer(directory, checksum=True) as ckpt:
    with caplog.at_level(logging.WARNING, logger=ck.__name__):
      restored = ckpt.restore_latest(ck.abstract_like(_train_state(0)))
  assert restored.step == 1
  assert any("CRC-32" in r.getMessage() for r in caplog.records)


def test_partial_tmp_dir_and_missing_manifest(tmp_path, caplog):
  directory = tmp_path / "ckpt"
  _save_steps(directory, [1, 2])
  # An interrupted save of step 3: orbax's tmp directory, half written.
  tmp_dir = directory / "3.orbax-checkpoint-tmp-1733140000000000"
  shutil.copytree(directory / "2", tmp_dir)
  _delete_data_files(str(tmp_dir))
  # Step 2 was finalised by orbax but the process died before the manifest.
  os.remove(directory / "2" / ck.MANIFEST_NAME)
  with caplog.at_level(logging.WARNING, logger=ck.__name__):
    ckpt = ck.Checkpointer(directory)
  assert any("Ignoring partial checkpoint 3.orbax-checkpoint-tmp" in r.getMessage()
             for r in caplog.records)
  with ckpt:
    assert ckpt.all_steps() == [1, 2]
    restored = ckpt.restore_latest(ck.abstract_like(_train_state(0)))
    assert restored.step == 2
    _assert_trees_equal(restored.state, _train_state(2))
    assert ckpt.save(3, state=_train_state(3))


def test_all_corrupt_raises_without_moving(tmp_path):
  directory = tmp_path / "ckpt"
  _save_steps(directory, [1, 2])
  for s in (1, 2):
    _truncate_data_files(str(directory / str(s)))
  with ck.Checkpointer(directory) as ckpt:
    with pytest.raises(ck.CheckpointError, match=r"step 2: .*step 1: "):
      ckpt.restore_latest(ck.abstract_like(_train_state(0)))
    assert ckpt.all_steps() == [1, 2]


def test_structure_or_shape_mismatch_raises(tmp_path):
  directory = tmp_path / "ckpt"
  _save_steps(directory, [1])
  abstract = ck.abstract_like(_train_state(0))
  with ck.Checkpointer(directory) as ckpt:
    wrong_shape = jax.tree.map(lambda x: x, abstract)
    wrong_shape["params"]["dense"]["w"] = jax.ShapeDtypeStruct((5, 3), jnp.float32)
    with pytest.raises(ck.CheckpointMismatchError, match="dense/w"):
      ckpt.restore_latest(wrong_shape)
    extra = dict(abstract, new_leaf=jax.ShapeDtypeStruct((), jnp.float32))
    with pytest.raises(ck.CheckpointMismatchError, match="new_leaf"):
      ckpt.restore_latest(extra)
    assert ckpt.all_steps() == [1]  # nothing quarantined


def test_interval_max_to_keep_and_step_order(tmp_path):
  state = {"x": jnp.ones(3)}
  with ck.Checkpointer(tmp_path, max_to_keep=2, save_interval_steps=2) as ckpt:
    assert ckpt.save(1, state=state)  # orbax always writes the first save
    assert ckpt.save(2, state=state)
    assert not ckpt.save(3, state=state)
    assert ckpt.save(4, state=state)
    assert ckpt.save(5, state=state, force=True)
    assert ckpt.all_steps() == [4, 5]
    assert not ckpt.save(5, state=state)  # already there: no-op
    with pytest.raises(ValueError, match="already holds step 5"):
      ckpt.save(2, state=state, force=True)


def test_async_save_then_wait(tmp_path):
  with ck.Checkpointer(tmp_path, async_save=True) as ckpt:
    assert ckpt.save(1, state=_train_state(1), meta={"a": 1})
    assert ckpt.save(2, state=_train_state(2), meta={"a": 2})
    ckpt.wait()
    for s in (1, 2):
      assert os.path.exists(tmp_path / str(s) / ck.MANIFEST_NAME)
    restored = ckpt.restore_latest(ck.abstract_like(_train_state(0)))
  assert restored.step == 2 and restored.meta == {"a": 2}


_CHILD = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp
    from experiments.checkpointing import Checkpointer
    ckpt = Checkpointer(sys.argv[1], max_to_keep=3)
    key = jax.random.key(0)
    for step in range(1, 100000):
      state = {"x": jnp.full((256, 1024), step, jnp.float32),
               "key": jax.random.fold_in(key, step), "step": jnp.int32(step)}
      ckpt.save(step, state=state, meta={"step": step})
      print("saved", step, flush=True)
    """)


def test_sigkill_mid_run_leaves_last_complete_step(tmp_path, caplog):
  directory = tmp_path / "ckpt"
  script = tmp_path / "child.py"
  script.write_text(_CHILD)
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO_ROOT)
  env.pop("XLA_FLAGS", None)
  proc = subprocess.Popen([sys.executable, str(script), str(directory)], cwd=REPO_ROOT,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  last_saved = 0
  try:
    deadline = time.monotonic() + 120
    while last_saved < 4:
      line = proc.stdout.readline()
      if not line:
        pytest.fail(f"child exited early: {proc.stderr.read()[-2000:]}")
      if line.startswith("saved"):
        last_saved = int(line.split()[1])
      assert time.monotonic() < deadline, "child too slow"
    # The child is now inside the next save (or about to start it).
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  assert proc.returncode == -signal.SIGKILL
  with ck.Checkpointer(directory, max_to_keep=3) as ckpt:
    abstract = {"x": jax.ShapeDtypeStruct((256, 1024), jnp.float32),
                "key": jax.ShapeDtypeStruct((), jax.random.key(0).dtype),
                "step": jax.ShapeDtypeStruct((), jnp.int32)}
    step, state, meta = ckpt.restore_latest(abstract)
    # Every save() that returned is complete; at most one more may have finished.
    assert last_saved <= step <= last_saved + 1
    assert meta == {"step": step} and int(state["step"]) == step
    np.testing.assert_array_equal(np.asarray(state["x"]), np.full((256, 1024), step))
    np.testing.assert_array_equal(
        jax.random.key_data(state["key"]),
        jax.random.key_data(jax.random.fold_in(jax.random.key(0), step)))
    # The resumed run continues saving from there.
    assert ckpt.save(step + 1, state=dict(state, step=jnp.int32(step + 1)),
                     meta={"step": step + 1})
