"""TensorBoard scalar event files, written directly (no tensorboardX, so no torch import).

An event file is a sequence of TFRecords, each holding one serialised `tensorflow.Event`:

  record  = uint64 length | uint32 masked_crc32c(length) | payload | uint32 masked_crc32c(payload)
  Event   = wall_time (1, double) | step (2, int64) | file_version (3, string)
            | summary (5, Summary) | session_log (7, SessionLog)
  Summary = repeated value (1, Value);  Value = tag (1, string) | simple_value (2, float)

The masked CRC is ((crc >> 15) | (crc << 17)) + 0xa282ead8 over CRC-32C (Castagnoli). Only
the fields TensorBoard's scalar dashboard reads are written. `EventWriter(purge_step=s)`
writes SessionLog.START at step s first: TensorBoard then drops the events of earlier files
at steps >= s (how a resumed run hides the steps it repeats).
"""
from __future__ import annotations

import itertools
import os
import socket
import struct
import time
from typing import Iterable

_CRC_TABLE = []
for _n in range(256):
  _c = _n
  for _ in range(8):
    _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
  _CRC_TABLE.append(_c)
del _n, _c

_counter = itertools.count()


def crc32c(data: bytes) -> int:
  """CRC-32C of `data` (crc32c(b"123456789") == 0xE3069283)."""
  crc = 0xFFFFFFFF
  table = _CRC_TABLE
  for byte in data:
    crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> bytes:
  crc = crc32c(data)
  return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def _varint(n: int) -> bytes:
  n &= (1 << 64) - 1  # int64 fields: two's complement, as protobuf encodes negatives
  out = bytearray()
  while True:
    byte = n & 0x7F
    n >>= 7
    if n:
      out.append(byte | 0x80)
    else:
      out.append(byte)
      return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
  """A length-delimited field (wire type 2)."""
  return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def encode_event(step: int, *, wall_time: float | None = None,
                 scalars: Iterable[tuple[str, float]] = (), file_version: str = "",
                 session_start: bool = False) -> bytes:
  """One serialised `Event` with the given scalars (one Summary.Value each)."""
  out = bytearray(b"\x09" + struct.pack("<d", time.time() if wall_time is None else wall_time))
  out += b"\x10" + _varint(int(step))
  if file_version:
    out += _field(3, file_version.encode())
  values = b"".join(_field(1, _field(1, tag.encode()) + b"\x15" + struct.pack("<f", value))
                    for tag, value in scalars)
  if values:
    out += _field(5, values)
  if session_start:
    out += _field(7, b"\x08\x01")  # SessionLog.status = START
  return bytes(out)


def encode_record(payload: bytes) -> bytes:
  header = struct.pack("<Q", len(payload))
  return header + _masked_crc(header) + payload + _masked_crc(payload)


class EventWriter:
  """Appends scalar events to a new ``events.out.tfevents.*`` file in `logdir`."""

  def __init__(self, logdir: str | os.PathLike, *, purge_step: int | None = None):
    os.makedirs(logdir, exist_ok=True)
    name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}"
            f".{os.getpid()}.{next(_counter):06d}")  # padded: names sort in creation order
    self.path = os.path.join(os.fspath(logdir), name)
    self._file = open(self.path, "ab")
    self._file.write(encode_record(encode_event(0, file_version="brain.Event:2")))
    if purge_step is not None:
      self._file.write(encode_record(encode_event(purge_step, session_start=True)))
    self._file.flush()

  def add_scalars(self, step: int, scalars: Iterable[tuple[str, float]]) -> None:
    """One event at `step` holding every (tag, value) pair."""
    self._file.write(encode_record(encode_event(step, scalars=scalars)))

  def flush(self) -> None:
    self._file.flush()

  def close(self) -> None:
    if not self._file.closed:
      self._file.close()
