"""A plain-text tool-call format: `name(arg1, arg2)`, and its parser.

A policy turn is one action: a tool call `lookup(ann boss)` or the final answer
`answer(bob)` (the answer is a tool named `ToolFormat.answer_tool`). A format may wrap the
call in markers, `ToolFormat("<tool>", "</tool>")` -> `<tool>calc(4*5)</tool>`, for
tokenizers that have those characters (the built-in character tasks use no markers).

`parse_action` never raises: text it cannot read, an unknown tool or a wrong number of
arguments gives an `Action` of kind "malformed" with a short `error` that environments
show as the observation "error: <error>", e.g.

>>> parse_action("foo(1)", ToolFormat(), {"lookup": 1}).error
'unknown tool foo; tools: lookup, answer'

Arguments are split at top-level `arg_sep` characters (not inside parentheses) and
stripped; the answer tool always takes the whole text between its parentheses as its one
argument (an answer may contain the separator). Tool names are lowercase letters and digits
starting with a letter; the name echoed in an error is cut to 8 characters, so error texts
keep to the characters of the action's tool list and the character tokenizer's vocabulary.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Mapping, NamedTuple

CALL = "call"
ANSWER = "answer"
MALFORMED = "malformed"
KINDS = (CALL, ANSWER, MALFORMED)

_CALL_RE = re.compile(r"([a-z][a-z0-9]*)\s*\((.*)\)", re.DOTALL)
_NAME_ECHO = 8  # characters of an unknown tool's name echoed in its error


@dataclasses.dataclass(frozen=True)
class ToolFormat:
  """How a tool call is written.

  Attributes:
    call_open, call_close: markers around the call ("" = none).
    answer_tool: the tool name of the final answer.
    arg_sep: the argument separator.
  """
  call_open: str = ""
  call_close: str = ""
  answer_tool: str = ANSWER
  arg_sep: str = ","

  def __post_init__(self):
    if _CALL_RE.fullmatch(f"{self.answer_tool}()") is None:
      raise ValueError(f"answer_tool must be lowercase letters/digits, got {self.answer_tool!r}")
    if len(self.arg_sep) != 1 or self.arg_sep in "()":
      raise ValueError(f"arg_sep must be one character other than parentheses, got "
                       f"{self.arg_sep!r}")

  def call(self, name: str, *args: str) -> str:
    """The action text of a call: `call("calc", "4*5")` -> "calc(4*5)"."""
    sep = self.arg_sep + (" " if self.arg_sep != " " else "")
    return f"{self.call_open}{name}({sep.join(args)}){self.call_close}"

  def answer(self, value: str) -> str:
    """The action text of the final answer `value`."""
    return self.call(self.answer_tool, value)


class Action(NamedTuple):
  """A parsed policy turn.

  Attributes:
    kind: "call" (a known tool with the right arity), "answer" (the answer tool) or
      "malformed" (anything else; `error` says why).
    name: the tool name ("" when none could be read).
    args: the stripped arguments.
    error: "" unless malformed: a short message for the observation.
  """
  kind: str
  name: str = ""
  args: tuple[str, ...] = ()
  error: str = ""

  @property
  def ok(self) -> bool:
    return self.kind != MALFORMED


def _split_args(inner: str, sep: str) -> tuple[str, ...] | None:
  """Top-level split of `inner` at `sep`; None when parentheses do not balance."""
  parts, depth, start = [], 0, 0
  for i, c in enumerate(inner):
    if c == "(":
      depth += 1
    elif c == ")":
      depth -= 1
      if depth < 0:
        return None
    elif c == sep and depth == 0:
      parts.append(inner[start:i])
      start = i + 1
  if depth != 0:
    return None
  parts.append(inner[start:])
  args = tuple(p.strip() for p in parts)
  return () if args == ("",) else args


def tool_list(tools: Mapping[str, int | None] | None, fmt: ToolFormat) -> str:
  """"lookup, answer": the tool names an error message offers."""
  names = [n for n in (tools or {}) if n != fmt.answer_tool]
  return ", ".join([*names, fmt.answer_tool])


def parse_action(text: str, fmt: ToolFormat = ToolFormat(),
                 tools: Mapping[str, int | None] | None = None) -> Action:
  """Reads one policy turn as a tool call or the answer; never raises.

  Args:
    text: the decoded turn (surrounding whitespace is ignored).
    fmt: the call format.
    tools: tool name -> number of arguments (None = any number); the answer tool is
      always known and takes one argument. None: any tool name is accepted.

  Returns:
    An `Action`; kind "malformed" with an `error` for text that is not one call, an
    unknown tool, a wrong number of arguments or an empty answer.
  """
  body = text.strip()
  if fmt.call_open or fmt.call_close:
    if not (body.startswith(fmt.call_open) and body.endswith(fmt.call_close)
            and len(body) >= len(fmt.call_open) + len(fmt.call_close)):
      return Action(MALFORMED, error=f"write {fmt.call_open}tool(args){fmt.call_close}")
    body = body[len(fmt.call_open):len(body) - len(fmt.call_close)].strip()
  m = _CALL_RE.fullmatch(body)
  if m is None:
    return Action(MALFORMED, error="write tool(args)")
  name, inner = m.group(1), m.group(2)
  if name == fmt.answer_tool:
    value = inner.strip()
    if not value or _split_args(value, fmt.arg_sep) is None:
      return Action(MALFORMED, name, error=f"write {fmt.answer_tool}(value)")
    return Action(ANSWER, name, (value,))
  args = _split_args(inner, fmt.arg_sep)
  if args is None:
    return Action(MALFORMED, name, error="unbalanced parentheses")
  if tools is not None:
    if name not in tools:
      shown = name[:_NAME_ECHO]
      return Action(MALFORMED, name, args,
                    f"unknown tool {shown}; tools: {tool_list(tools, fmt)}")
    arity = tools[name]
    if arity is not None and len(args) != arity:
      return Action(MALFORMED, name, args,
                    f"{name} takes {arity} arg{'s' if arity != 1 else ''}, got {len(args)}")
  return Action(CALL, name, args)


_QUERY_RE = re.compile(r"([a-z][a-z0-9]*)\s*\(")


def query_chars(text: str, fmt: ToolFormat = ToolFormat()) -> list[bool]:
  """[len(text) + 1] per-character flags of the query a turn issued: the characters between
  the parentheses of its first call to a tool other than the answer tool (none for an
  answer, or for text without a call; the last entry, the end of the text, is never
  flagged). The positions SD-Search distils on; an unclosed call flags to the end.

  >>> "".join("^" if f else "." for f in query_chars("lookup(ann boss)"))
  '.......^^^^^^^^..'
  >>> any(query_chars("answer(bob)"))
  False
  """
  flags = [False] * (len(text) + 1)
  m = _QUERY_RE.search(text)
  if m is None or m.group(1) == fmt.answer_tool:
    return flags
  start, depth = m.end(), 1
  end = len(text)
  for i in range(start, len(text)):
    depth += {"(": 1, ")": -1}.get(text[i], 0)
    if depth == 0:
      end = i
      break
  for i in range(start, end):
    flags[i] = True
  return flags
