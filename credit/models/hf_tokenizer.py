"""Tokenizer for local Hugging Face model directories, on top of the `tokenizers` library.

Reads `tokenizer.json` (the fast-tokenizer file), special tokens from `tokenizer_config.json`
(plain strings or AddedToken dicts), extra end-of-sequence ids from `generation_config.json`, and
the chat template from `chat_template.jinja` (transformers v5) or `tokenizer_config.json`
`chat_template` (a string, or a list of named templates of which "default" is used). Templates are
rendered with jinja2 the way transformers does (sandboxed environment, trim_blocks, lstrip_blocks,
`raise_exception`, `tojson`, `strftime_now`).
"""
from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any, Sequence

import tokenizers


class ChatTemplateError(ValueError):
  """No chat template is available, or it raised while rendering."""


def _token_content(tok) -> str | None:
  if tok is None:
    return None
  if isinstance(tok, dict):
    return tok.get("content")
  return str(tok)


def _read_json(file: Path) -> dict:
  return json.loads(file.read_text()) if file.exists() else {}


class Tokenizer:
  """A `tokenizers.Tokenizer` plus special tokens and an optional chat template.

  Attributes:
    bos_token, eos_token, pad_token: strings or None.
    bos_token_id, eos_token_id, pad_token_id: ids or None. pad_token_id falls back to
      eos_token_id when the tokenizer defines no pad token (Llama).
    eos_token_ids: tuple of every id that ends a generation (eos_token_id plus
      generation_config.json's eos_token_id list).
    chat_template: the jinja source or None.
  """

  def __init__(self, tokenizer: tokenizers.Tokenizer, *, bos_token: str | None = None,
               eos_token: str | None = None, pad_token: str | None = None,
               chat_template: str | None = None, extra_eos_ids: Sequence[int] = ()):
    self.tokenizer = tokenizer
    self.bos_token, self.eos_token, self.pad_token = bos_token, eos_token, pad_token
    self.chat_template = chat_template
    self.bos_token_id = self._id(bos_token)
    self.eos_token_id = self._id(eos_token)
    pad_id = self._id(pad_token)
    self.pad_token_id = self.eos_token_id if pad_id is None else pad_id
    ids = [] if self.eos_token_id is None else [self.eos_token_id]
    ids += [i for i in extra_eos_ids if i not in ids]
    self.eos_token_ids = tuple(ids)

  def _id(self, token: str | None) -> int | None:
    if token is None:
      return None
    tid = self.tokenizer.token_to_id(token)
    if tid is None:
      raise ValueError(f"special token {token!r} is not in the vocabulary")
    return tid

  @property
  def vocab_size(self) -> int:
    return self.tokenizer.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
    """Token ids of `text` (post-processor specials such as BOS when add_special_tokens)."""
    return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

  def encode_batch(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[int]]:
    return [e.ids for e in self.tokenizer.encode_batch(list(texts),
                                                       add_special_tokens=add_special_tokens)]

  def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
    return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def decode_batch(self, batch: Sequence[Sequence[int]], *,
                   skip_special_tokens: bool = True) -> list[str]:
    return self.tokenizer.decode_batch([[int(i) for i in ids] for ids in batch],
                                       skip_special_tokens=skip_special_tokens)

  def apply_chat_template(self, messages: Sequence[dict[str, Any]], *,
                          add_generation_prompt: bool = True, tokenize: bool = False,
                          **kwargs) -> str | list[int]:
    """Render `messages` ([{"role": ..., "content": ...}, ...]) with the model's chat template.

    Returns the prompt text, or its ids (encoded without adding specials again: the template
    writes them) when `tokenize`. Extra keyword arguments (tools, enable_thinking, ...) reach
    the template. Raises ChatTemplateError when the directory has no template.
    """
    if not self.chat_template:
      raise ChatTemplateError("this tokenizer has no chat template (no chat_template.jinja and no "
                              "chat_template in tokenizer_config.json)")
    text = _compile(self.chat_template).render(
        messages=list(messages), add_generation_prompt=add_generation_prompt,
        bos_token=self.bos_token or "", eos_token=self.eos_token or "",
        pad_token=self.pad_token or "", **kwargs)
    return self.encode(text, add_special_tokens=False) if tokenize else text


_TEMPLATE_CACHE: dict[str, Any] = {}


def _compile(source: str):
  if source not in _TEMPLATE_CACHE:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
      raise ChatTemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
      return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                        sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    _TEMPLATE_CACHE[source] = env.from_string(source)
  return _TEMPLATE_CACHE[source]


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
  """Load `path/tokenizer.json` with its special tokens and chat template (see module doc)."""
  path = Path(path)
  tok_file = path / "tokenizer.json"
  if not tok_file.exists():
    raise FileNotFoundError(f"tokenizer.json not found in {path}")
  tok = tokenizers.Tokenizer.from_file(str(tok_file))
  cfg = _read_json(path / "tokenizer_config.json")
  template = None
  if (path / "chat_template.jinja").exists():
    template = (path / "chat_template.jinja").read_text()
  elif cfg.get("chat_template"):
    template = cfg["chat_template"]
    if isinstance(template, list):
      named = {t["name"]: t["template"] for t in template}
      template = named.get("default", next(iter(named.values()), None))
  gen = _read_json(path / "generation_config.json")
  extra = gen.get("eos_token_id")
  extra = [] if extra is None else ([extra] if isinstance(extra, int) else list(extra))
  return Tokenizer(tok, bos_token=_token_content(cfg.get("bos_token")),
                   eos_token=_token_content(cfg.get("eos_token")),
                   pad_token=_token_content(cfg.get("pad_token")),
                   chat_template=template, extra_eos_ids=extra)


class TaskTokenizer:
  """A checkpoint's `Tokenizer` in the interface of `credit.tasks`' batch helpers.

  Task prompts become the checkpoint's prompt format: `prompt_template.format(prompt=...)`,
  then, when `chat_template`, the chat template over `[system?, user]` with the generation
  prompt (the template writes its own special tokens); else the text with the tokenizer's
  post-processor specials (e.g. Llama's bos), as `AutoTokenizer(text)` would. Responses are
  encoded without specials (the batch helpers append `eos_id`), and decoded up to the first
  end-of-sequence id with special tokens skipped.

  Attributes:
    tokenizer: the wrapped `Tokenizer`.
    pad_id, eos_id: its pad and eos ids; bos_id is None (prompts carry their own specials).
    stop_ids: every id that ends a generation (`Tokenizer.eos_token_ids`).
  """

  bos_id = None

  def __init__(self, tokenizer: Tokenizer, *, chat_template: bool, system_prompt: str = "",
               prompt_template: str = "{prompt}"):
    if tokenizer.eos_token_id is None:
      raise ValueError("the tokenizer has no eos token (tokenizer_config.json eos_token)")
    if chat_template and not tokenizer.chat_template:
      raise ChatTemplateError("chat_template requested but the tokenizer has none")
    if system_prompt and not chat_template:
      raise ValueError("a system prompt needs the chat template")
    self.tokenizer = tokenizer
    self.chat_template = chat_template
    self.system_prompt = system_prompt
    self.prompt_template = prompt_template
    self.pad_id = tokenizer.pad_token_id
    self.eos_id = tokenizer.eos_token_id
    self.stop_ids = tokenizer.eos_token_ids

  @property
  def vocab_size(self) -> int:
    return self.tokenizer.vocab_size

  def prompt_text(self, prompt: str) -> str:
    """The rendered prompt (chat template applied when enabled)."""
    text = self.prompt_template.format(prompt=prompt)
    if not self.chat_template:
      return text
    messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
    return self.tokenizer.apply_chat_template(messages + [{"role": "user", "content": text}],
                                              add_generation_prompt=True)

  def encode_prompt(self, prompt: str) -> list[int]:
    """The whole prompt row for the sampler, specials included."""
    return self.tokenizer.encode(self.prompt_text(prompt),
                                 add_special_tokens=not self.chat_template)

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    """Ids of plain text (a response), no specials added; the character tokenizer's signature.

    `add_bos` adds nothing (bos_id is None: `encode_prompt` writes a prompt's own specials);
    `add_eos` appends `eos_id`.
    """
    del add_bos
    ids = list(self.tokenizer.encode(text, add_special_tokens=False))
    return ids + [self.eos_id] if add_eos else ids

  def decode(self, ids: Sequence[int]) -> str:
    """Text up to the first stop id, special tokens skipped."""
    ids = [int(i) for i in ids]
    for n, i in enumerate(ids):
      if i in self.stop_ids:
        ids = ids[:n]
        break
    return self.tokenizer.decode(ids, skip_special_tokens=True)
