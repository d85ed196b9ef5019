"""Checkpoints corrupted in place (same size, other bytes) are caught by the manifest's CRC-32.

Without a content checksum such a checkpoint restores silently (orbax decodes the changed
bytes as numbers) and the run fails later, e.g. as NaN log-probs; with it the step is skipped,
moved to `_corrupt/`, and the previous good one is restored, as for a truncated file.
"""
import inspect
import json
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import checkpointing as ck


def _state(step: int) -> dict:
  return {"params": {"w": jnp.arange(2048, dtype=jnp.float32) / 7.0 + step,
                     "b": jnp.full((8,), -1.5 * step)},
          "step": jnp.int32(step)}


def _save(directory, steps, **kwargs) -> None:
  with ck.Checkpointer(directory, max_to_keep=10, **kwargs) as ckpt:
    for s in steps:
      assert ckpt.save(s, state=_state(s), meta={"step": s})


def _corrupt_in_place(step_dir) -> str:
  """Flips 64 bytes in the middle of the step's largest array data file; keeps its size."""
  files = [f for f in ck._list_files(str(step_dir))  # pylint: disable=protected-access
           if f.startswith("state/") and "_METADATA" not in f]
  rel = max(files, key=lambda f: os.path.getsize(step_dir / f))
  path = step_dir / rel
  data = bytearray(path.read_bytes())
  size = len(data)
  for i in range(size // 2, min(size, size // 2 + 64)):
    data[i] ^= 0xFF
  path.write_bytes(bytes(data))
  assert os.path.getsize(path) == size
  return rel


def _equal(a, b) -> bool:
  return jax.tree.structure(a) == jax.tree.structure(b) and all(
      np.array_equal(np.asarray(x), np.asarray(y))
      for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_checksums_are_on_by_default():
  """The runner builds its Checkpointer without `checksum=`: every manifest gets CRCs."""
  assert inspect.signature(ck.Checkpointer).parameters["checksum"].default is True


def test_manifest_holds_a_crc32_per_file(tmp_path):
  _save(tmp_path / "ckpt", [1])
  with open(tmp_path / "ckpt" / "1" / ck.MANIFEST_NAME) as f:
    files = json.load(f)["files"]
  assert files and all(set(e) == {"size", "crc32"} for e in files.values()), files


def test_corrupted_in_place_is_moved_aside_and_the_previous_step_restored(tmp_path, caplog):
  directory = tmp_path / "ckpt"
  _save(directory, [1, 2, 3])
  rel = _corrupt_in_place(directory / "3")
  with ck.Checkpointer(directory) as ckpt:
    with caplog.at_level(logging.WARNING, logger=ck.__name__):
      restored = ckpt.restore_latest(ck.abstract_like(_state(0)))
    assert restored.step == 2 and restored.meta == {"step": 2}
    assert _equal(restored.state, _state(2))
    messages = [r.getMessage() for r in caplog.records if r.name == ck.__name__]
    assert any("Skipping checkpoint step 3" in m and rel in m and "CRC-32" in m
               for m in messages), messages
    assert ckpt.all_steps() == [1, 2]
    assert len(os.listdir(directory / ck.QUARANTINE_DIR)) == 1
    # The resumed run saves step 3 again, and that one restores.
    assert ckpt.save(3, state=_state(3), meta={"step": 3})
    assert ckpt.restore_latest(ck.abstract_like(_state(0))).step == 3


def test_two_corrupted_steps_fall_back_to_the_last_good_one(tmp_path):
  directory = tmp_path / "ckpt"
  _save(directory, [1, 2, 3])
  _corrupt_in_place(directory / "2")
  _corrupt_in_place(directory / "3")
  with ck.Checkpointer(directory) as ckpt:
    restored = ckpt.restore_latest(ck.abstract_like(_state(0)))
    assert restored.step == 1 and _equal(restored.state, _state(1))
    assert ckpt.all_steps() == [1]
  assert len(os.listdir(directory / ck.QUARANTINE_DIR)) == 2


def test_every_step_corrupted_is_an_error_and_moves_nothing(tmp_path):
  directory = tmp_path / "ckpt"
  _save(directory, [1])
  _corrupt_in_place(directory / "1")
  with ck.Checkpointer(directory) as ckpt:
    with pytest.raises(ck.CheckpointError, match="step 1: file .* fails its CRC-32 check"):
      ckpt.restore_latest(ck.abstract_like(_state(0)))
  assert os.path.isdir(directory / "1") and not os.path.exists(directory / ck.QUARANTINE_DIR)


def test_manifests_without_checksums_still_restore(tmp_path):
  """checksum=False (or a manifest written before checksums): sizes only, as before."""
  directory = tmp_path / "ckpt"
  _save(directory, [1, 2], checksum=False)
  with open(directory / "2" / ck.MANIFEST_NAME) as f:
    assert all(set(e) == {"size"} for e in json.load(f)["files"].values())
  with ck.Checkpointer(directory) as ckpt:
    restored = ckpt.restore_latest(ck.abstract_like(_state(0)))
  assert restored.step == 2 and _equal(restored.state, _state(2))
