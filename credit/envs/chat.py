"""How the turns of an episode become tokens: the tokenizer's chat template, or a plain one.

A multi-turn episode is laid out as

    prompt | action 0 | observation 0 | action 1 | observation 1 | ...

where the policy writes each action (up to and including its stop token) and everything
else is context. A `TurnTemplate` says what the context blocks are:

* `prompt_ids(prompt)`: the first context, specials included, ending where the policy's
  first turn starts (a chat template's generation prompt);
* `action_ids(action)`: a policy turn as the policy writes it, closing stop token included
  (used for demonstrations; sampled turns are what the policy drew);
* `observation_ids(observation, max_tokens)`: everything between a policy turn's stop
  token and the next policy turn: the template's closing of the assistant turn, the tool
  message with the observation, and the next generation prompt. When it does not fit in
  `max_tokens`, the observation's own tokens are cut and the template's tokens are kept;
* `observation_text(ids)`: the observation's own text in such a block (for transcripts).

`turn_template(tokenizer)` gives the template of a tokenizer:

* a tokenizer with a chat template in use (`credit.models.hf_tokenizer.TaskTokenizer` with
  `chat_template=True`): `ChatTurns`, which renders with the tokenizer's own template
  (`apply_chat_template`), observations in the template's tool role when it has one;
* any other (the character tokenizer, a checkpoint tokenizer without its template):
  `PlainTurns`: bos + prompt, action + eos, the observation's text as is. These are the
  bytes the multi-turn engine has always produced, so existing recipes are unchanged.

`response_mask` covers exactly the tokens of the policy's turns and `obs_mask` exactly the
observation blocks, template tokens included (they never receive policy gradient).

>>> from credit.tasks import CharTokenizer
>>> t = turn_template(CharTokenizer())
>>> t.prompt_ids("hi"), t.action_ids("a"), t.observation_ids("ok", 8)
([1, 35, 36], [28, 2], [42, 38])
"""
from __future__ import annotations

import weakref
from typing import Any, Protocol, Sequence

__all__ = ["ChatTurns", "PlainTurns", "TurnTemplate", "turn_template"]

# Stand-ins rendered through the template to find where its own tokens end and a message's
# content begins (a template only ever copies content, so these strings come back verbatim).
_USER = "USER_CONTENT_6d1f"
_ASSISTANT = "ASSISTANT_CONTENT_9b27"
_OBSERVATION = "OBSERVATION_CONTENT_c3e8"
# Roles tried for observations, in order: the first the template renders the content under.
OBSERVATION_ROLES = ("tool", "observation", "ipython", "user")


class TurnTemplate(Protocol):
  """The token blocks of an episode (see the module docstring)."""

  def prompt_ids(self, prompt: str) -> list[int]: ...

  def action_ids(self, action: str) -> list[int]: ...

  def observation_ids(self, observation: str, max_tokens: int) -> list[int]: ...

  def observation_text(self, ids: Sequence[int]) -> str: ...


class PlainTurns:
  """No template: bos (when the tokenizer has one) + prompt, action + eos, the observation's
  own tokens (cut to `max_tokens`). A tokenizer with `encode_prompt` (a checkpoint's prompt
  format without its chat template) gives its own prompt row."""

  def __init__(self, tokenizer: Any):
    self.tokenizer = tokenizer

  def prompt_ids(self, prompt: str) -> list[int]:
    tok = self.tokenizer
    if hasattr(tok, "encode_prompt"):
      return list(tok.encode_prompt(prompt))
    bos = [] if getattr(tok, "bos_id", None) is None else [tok.bos_id]
    return bos + list(tok.encode(prompt))

  def action_ids(self, action: str) -> list[int]:
    return list(self.tokenizer.encode(action)) + [self.tokenizer.eos_id]

  def observation_ids(self, observation: str, max_tokens: int) -> list[int]:
    return list(self.tokenizer.encode(observation))[:max(0, max_tokens)]

  def observation_text(self, ids: Sequence[int]) -> str:
    return self.tokenizer.decode(list(ids))


class ChatTurns:
  """Turns rendered with a tokenizer's chat template.

  The blocks are found once, by rendering stand-in conversations with the template:

  * the prompt: `[system?, user(prompt)]` with the generation prompt (the tokenizer's
    `encode_prompt`, its prompt template and system prompt applied);
  * an assistant turn: the template's text after the assistant content up to the first
    stop token (`stop_ids`) is the end of the turn (ChatML: `<|im_end|>`); the policy
    writes it, so it is in the action block;
  * an observation: `[user, assistant, <role>(observation)]` with the generation prompt; the
    text after the assistant's stop token splits at the observation into a head
    ("\\n<|im_start|>tool\\n") and a tail ("<|im_end|>\\n<|im_start|>assistant\\n"). The role is
    the first of `roles` whose message the template renders with its content.

  Each piece is encoded on its own (template text with its special tokens, the content as
  plain text), so the observation's tokens can be cut without cutting the template's.

  Raises:
    ValueError: the tokenizer has no chat template, its assistant turns do not end in a
      stop token, or it renders no observation role.
  """

  def __init__(self, tokenizer: Any, *, roles: Sequence[str] = OBSERVATION_ROLES):
    base = getattr(tokenizer, "tokenizer", None)
    if base is None or not getattr(base, "chat_template", None):
      raise ValueError("ChatTurns needs a tokenizer with a chat template "
                       "(credit.models.hf_tokenizer.TaskTokenizer over a template)")
    self.tokenizer = tokenizer
    self._base = base
    stops = tuple(getattr(tokenizer, "stop_ids", None) or (tokenizer.eos_id,))
    stop_texts = {base.decode([s], skip_special_tokens=False): s for s in stops}
    user = [{"role": "user", "content": _USER}]
    turn = user + [{"role": "assistant", "content": _ASSISTANT}]
    closing = self._after(self._render(turn, False), _ASSISTANT)
    self.stop_id, rest = self._stop(closing, stop_texts)
    self.role, head, tail = None, "", ""
    for role in roles:
      try:
        text = self._render(turn + [{"role": role, "content": _OBSERVATION}], True)
      except Exception:  # pylint: disable=broad-except  # a template may refuse a role
        continue
      after = self._after(text, _ASSISTANT)
      if _OBSERVATION in after and after.startswith(closing):
        between = after[len(closing):]
        self.role = role
        head, tail = between.split(_OBSERVATION, 1)
        break
    if self.role is None:
      raise ValueError(f"the chat template renders no observation message in any of the roles "
                       f"{tuple(roles)}")
    self.observation_head = rest + head
    self.observation_tail = tail
    self._head_ids = self._encode(self.observation_head)
    self._tail_ids = self._encode(self.observation_tail)

  def _render(self, messages, generation_prompt: bool) -> str:
    return self._base.apply_chat_template(messages, add_generation_prompt=generation_prompt)

  @staticmethod
  def _after(text: str, marker: str) -> str:
    if marker not in text:
      raise ValueError(f"the chat template does not copy message content ({marker!r} missing "
                       "from its rendering)")
    return text[text.rindex(marker) + len(marker):]

  @staticmethod
  def _stop(closing: str, stop_texts: dict) -> tuple[int, str]:
    for text, sid in stop_texts.items():
      if text and text in closing:
        i = closing.index(text)
        if closing[:i].strip() == "":
          return sid, closing[i + len(text):]
    raise ValueError(f"the chat template closes an assistant turn with {closing!r}, which "
                     f"does not start with a stop token ({sorted(stop_texts)})")

  def _encode(self, text: str) -> list[int]:
    return list(self._base.encode(text, add_special_tokens=False)) if text else []

  def prompt_ids(self, prompt: str) -> list[int]:
    return list(self.tokenizer.encode_prompt(prompt))

  def action_ids(self, action: str) -> list[int]:
    return list(self.tokenizer.encode(action)) + [self.stop_id]

  def observation_ids(self, observation: str, max_tokens: int) -> list[int]:
    fixed = len(self._head_ids) + len(self._tail_ids)
    room = max(0, max_tokens)
    content = self._encode(observation)
    if room < fixed:  # not even the template fits: cut the whole block
      return (self._head_ids + content + self._tail_ids)[:room]
    return self._head_ids + content[:room - fixed] + self._tail_ids

  def observation_text(self, ids: Sequence[int]) -> str:
    """The observation's own text in a block `observation_ids` made (template tokens
    removed)."""
    ids = [int(i) for i in ids]
    h, t = len(self._head_ids), len(self._tail_ids)
    if len(ids) >= h + t and ids[:h] == self._head_ids and ids[len(ids) - t:] == self._tail_ids:
      ids = ids[h:len(ids) - t]
    return self._base.decode(ids, skip_special_tokens=True)


def turn_template(tokenizer: Any) -> TurnTemplate:
  """The `TurnTemplate` of a tokenizer: `ChatTurns` when it renders prompts with a chat
  template (`chat_template` is True), its own when it is one already, else `PlainTurns`."""
  if all(hasattr(tokenizer, m) for m in ("prompt_ids", "action_ids", "observation_ids",
                                      "observation_text")):
    return tokenizer
  if getattr(tokenizer, "chat_template", None) is True:
    if tokenizer not in _CHAT_TURNS:  # rendered once per tokenizer
      _CHAT_TURNS[tokenizer] = ChatTurns(tokenizer)
    return _CHAT_TURNS[tokenizer]
  return PlainTurns(tokenizer)


_CHAT_TURNS: "weakref.WeakKeyDictionary[Any, ChatTurns]" = weakref.WeakKeyDictionary()
