"""A tiny character-level tokenizer for the built-in tasks, and batch helpers.

Every character is one token, so an index into a response string is an index into
its response tokens (the `pivot_position` of the pivotal task relies on this).
Ids 0, 1, 2 are the specials pad, bos, eos; then one id per character of
`DEFAULT_CHARS` (digits, the operators `+-*/()=`, space, a little punctuation,
newline, lowercase letters): 54 ids in all.

Batch layout (shared with the sampler and the rollout contract): prompts are
LEFT-padded so that every prompt ends at the same column and generation starts
at column P for the whole batch; responses follow, right-padded. The batch
helpers here work with any tokenizer that has `encode(text) -> list[int]`,
`decode(ids) -> str`, `pad_id`, `bos_id` (may be None) and `eos_id`.

>>> tok = CharTokenizer()
>>> tok.decode(tok.encode("12+345=", add_bos=True, add_eos=True) + [7, 7])
'12+345='
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

DEFAULT_CHARS = "0123456789+-*/()= .,:;?!\nabcdefghijklmnopqrstuvwxyz"
SPECIALS = ("<pad>", "<bos>", "<eos>")
# What `decode` writes for an id outside the vocabulary (a model whose embedding
# table is padded past `vocab_size` can sample one). It is no task's valid
# character, so a verifier scores it as wrong, and it keeps string index ==
# token index.
UNKNOWN_CHAR = "\ufffd"


@dataclasses.dataclass(frozen=True)
class CharTokenizer:
  """Fixed character vocabulary; hashable, so it can be a static jit argument.

  Attributes:
    chars: the characters, in id order after the three specials.
  """
  chars: str = DEFAULT_CHARS
  _index: dict = dataclasses.field(init=False, repr=False, compare=False, hash=False)

  pad_id = 0
  bos_id = 1
  eos_id = 2

  def __post_init__(self):
    if len(set(self.chars)) != len(self.chars):
      raise ValueError(f"CharTokenizer chars must be unique, got {self.chars!r}")
    index = {c: i + len(SPECIALS) for i, c in enumerate(self.chars)}
    object.__setattr__(self, "_index", index)

  @property
  def vocab_size(self) -> int:
    return len(SPECIALS) + len(self.chars)

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    """Characters of `text` to ids; raises ValueError on a character not in the vocabulary."""
    ids = [self.bos_id] if add_bos else []
    for pos, c in enumerate(text):
      i = self._index.get(c)
      if i is None:
        raise ValueError(f"Character {c!r} at position {pos} of {text!r} is not in the "
                         f"CharTokenizer vocabulary {self.chars!r}")
      ids.append(i)
    if add_eos:
      ids.append(self.eos_id)
    return ids

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    """Ids to text: stops at the first eos, skips pad and bos.

    Ids outside the vocabulary become `UNKNOWN_CHAR` (one character each).
    """
    out = []
    for i in np.asarray(ids, dtype=np.int64).reshape(-1).tolist():
      if i == self.eos_id:
        break
      if i in (self.pad_id, self.bos_id):
        continue
      j = i - len(SPECIALS)
      out.append(self.chars[j] if 0 <= j < len(self.chars) else UNKNOWN_CHAR)
    return "".join(out)

  def encode_batch(self, texts: Sequence[str], max_len: int | None = None, *,
                   add_bos: bool = False, add_eos: bool = False,
                   pad_left: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Encodes and pads a batch; returns `(tokens [N,L] int32, mask [N,L] bool)`.

    `max_len=None` pads to the longest row. A row longer than `max_len` raises.
    """
    rows = [self.encode(t, add_bos=add_bos, add_eos=add_eos) for t in texts]
    return pad_rows(rows, max_len, pad_id=self.pad_id, pad_left=pad_left)


def pad_rows(rows: Sequence[Sequence[int]], max_len: int | None, *, pad_id: int,
             pad_left: bool) -> tuple[np.ndarray, np.ndarray]:
  """Pads ragged id lists into `(tokens [N,L] int32, mask [N,L] bool)`; raises if one is too long.

  `max_len=None` pads to the longest row; `pad_left` right-aligns the rows.
  """
  if max_len is None:
    max_len = max((len(r) for r in rows), default=0)
  tokens_NL = np.full((len(rows), max_len), pad_id, dtype=np.int32)
  mask_NL = np.zeros((len(rows), max_len), dtype=bool)
  for n, r in enumerate(rows):
    if len(r) > max_len:
      raise ValueError(f"Row {n} has {len(r)} tokens, more than max_len={max_len}")
    if not r:
      continue
    sl = slice(max_len - len(r), max_len) if pad_left else slice(0, len(r))
    tokens_NL[n, sl] = r
    mask_NL[n, sl] = True
  return tokens_NL, mask_NL


def encode_prompts(tokenizer: Any, prompts: Sequence[str], max_len: int, *,
                   add_bos: bool = True) -> tuple[np.ndarray, np.ndarray]:
  """Prompts for the sampler: bos + prompt, LEFT-padded to `max_len`.

  Args:
    tokenizer: `encode(text) -> list[int]` that adds no specials, `pad_id`, `bos_id`
      (None: no bos is added); or one with `encode_prompt` (see `prompt_ids`).
    prompts: N strings.
    max_len: P, the padded prompt length; a longer prompt raises ValueError.
    add_bos: prepend `tokenizer.bos_id`.

  Returns:
    `(tokens [N,P] int32, mask [N,P] bool)`; mask is False on padding.
  """
  rows = [prompt_ids(tokenizer, p, add_bos=add_bos) for p in prompts]
  return pad_rows(rows, max_len, pad_id=tokenizer.pad_id, pad_left=True)


def prompt_ids(tokenizer: Any, prompt: str, *, add_bos: bool = True) -> list[int]:
  """One prompt's ids as `encode_prompts` lays them out (before padding).

  A tokenizer with `encode_prompt(prompt) -> list[int]` (a checkpoint's prompt format,
  e.g. `credit.models.hf_tokenizer.TaskTokenizer`: chat template, its own specials) gives
  the whole row; otherwise the row is bos (when `add_bos` and `bos_id` is not None) +
  `encode(prompt)`.
  """
  if hasattr(tokenizer, "encode_prompt"):
    return list(tokenizer.encode_prompt(prompt))
  bos = [tokenizer.bos_id] if add_bos and tokenizer.bos_id is not None else []
  return bos + list(tokenizer.encode(prompt))


def encode_prompt_response(tokenizer: Any, prompts: Sequence[str], responses: Sequence[str],
                           max_prompt_len: int, max_response_len: int, *,
                           add_bos: bool = True) -> dict[str, np.ndarray]:
  """Prompt + response pairs (e.g. demonstrations for supervised warm-up) in sampler layout.

  The prompt block is `encode_prompts(...)` ([N,P], left-padded); the response
  block is response + eos, right-padded to R = `max_response_len`. This is the
  layout a sampler produces, so the same scoring code applies.

  Returns:
    dict with `tokens [N,P+R] int32`, `prompt_mask [N,P+R] bool`,
    `response_mask [N,P+R] bool` (response tokens including eos).
  """
  if len(prompts) != len(responses):
    raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
  p_tok, p_mask = encode_prompts(tokenizer, prompts, max_prompt_len, add_bos=add_bos)
  rows = [list(tokenizer.encode(r)) + [tokenizer.eos_id] for r in responses]
  r_tok, r_mask = pad_rows(rows, max_response_len, pad_id=tokenizer.pad_id, pad_left=False)
  zeros_p = np.zeros_like(p_mask)
  zeros_r = np.zeros_like(r_mask)
  return {
      "tokens": np.concatenate([p_tok, r_tok], axis=1),
      "prompt_mask": np.concatenate([p_mask, zeros_r], axis=1),
      "response_mask": np.concatenate([zeros_p, r_mask], axis=1),
  }


def decode_responses(tokenizer: Any, tokens: np.ndarray, response_mask: np.ndarray) -> list[str]:
  """Texts of the response tokens of each row, up to the first eos.

  Args:
    tokenizer: has `decode(ids) -> str` that stops at eos and writes no special tokens
      (`CharTokenizer`, `credit.models.hf_tokenizer.TaskTokenizer`).
    tokens: [N,T] int token ids.
    response_mask: [N,T] bool, True on generated tokens.

  Returns:
    N strings.
  """
  tokens = np.asarray(tokens)
  response_mask = np.asarray(response_mask, dtype=bool)
  if tokens.ndim != 2 or tokens.shape != response_mask.shape:
    raise ValueError(f"tokens {tokens.shape} and response_mask {response_mask.shape} "
                     "must both be [N,T]")
  return [tokenizer.decode(t[m]) for t, m in zip(tokens, response_mask)]


def token_flags(tokenizer: Any, ids: Sequence[int] | np.ndarray,
                char_flags: Sequence[bool] | np.ndarray) -> np.ndarray:
  """Per-token flags of one response from per-character flags of its decoded text.

  Token j covers the characters `[len(decode(ids[:j])), len(decode(ids[:j+1])))` of
  `text = decode(ids)`, and is flagged when any of them is. A token that adds no character
  (a special skipped by `decode`) is not flagged, except a final one after the whole text
  (the stop token), which takes the end flag `char_flags[-1]`. Exact when the decode of a
  prefix is a prefix of the decode (`CharTokenizer`: one token per character; byte-level
  BPE except inside a multi-byte character, whose bytes then share its flag); lengths are
  clipped to stay monotone otherwise. Costs O(L²) characters of decoding per row.

  Args:
    tokenizer: has `decode(ids) -> str` (stops at eos, writes no specials).
    ids: [L] the response's token ids (as under `response_mask`, stop token included).
    char_flags: [len(text) + 1] bool (a task's `flag_chars`).

  Returns:
    [L] bool.

  >>> tok = CharTokenizer()
  >>> token_flags(tok, tok.encode("115", add_eos=True), [0, 1, 1, 1]).tolist()
  [False, True, True, True]
  """
  ids = [int(i) for i in np.asarray(ids).reshape(-1)]
  flags = np.asarray(char_flags, bool).reshape(-1)
  n_chars = len(tokenizer.decode(ids))
  if flags.shape[0] != n_chars + 1:
    raise ValueError(f"{flags.shape[0]} character flags for a response of {n_chars} "
                     "characters; expected one per character and one for the end")
  out = np.zeros(len(ids), bool)
  start = 0
  for j in range(len(ids)):
    end = min(max(len(tokenizer.decode(ids[:j + 1])), start), n_chars)
    if end > start:
      out[j] = flags[start:end].any()
    elif j == len(ids) - 1 and start == n_chars:
      out[j] = flags[n_chars]
    start = end
  return out
