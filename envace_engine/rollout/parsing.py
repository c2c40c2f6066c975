"""Parsers for what the policy writes: tool calls (act role) and rehearsal outputs (world role).

Both parsers take any string a model can emit and never raise: they return a value or a
structured ``ToolError`` whose ``code`` is one of the constants below (docs/parsing.md lists
them with examples). Lone surrogates are replaced before parsing and inside parsed JSON, so
everything returned encodes as UTF-8.

Accepted tool-call forms (tolerant, because small models drift from the exact format):

* ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call, several
  blocks in one reply; a block may hold a JSON list of calls;
* the JSON inside a ````` fenced block, with surrounding whitespace, or with a missing closing
  tag at the end of the reply;
* ``parameters`` instead of ``arguments``; arguments given as a JSON-encoded string; no
  arguments at all (an empty object);
* ``<function_call>`` / ``<tools>`` tags, and a reply that is nothing but a call object
  (optionally fenced) with no tag.

Search is done with ``str.find`` rather than backtracking regexes so that a long adversarial
reply costs linear time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from envace_engine.types import ToolCall, ToolError, ToolResult

# Tool-call parse errors (act role).
EMPTY_TOOL_CALL = "EMPTY_TOOL_CALL"
UNCLOSED_TOOL_CALL = "UNCLOSED_TOOL_CALL"
INVALID_JSON = "INVALID_JSON"
JSON_TOO_DEEP = "JSON_TOO_DEEP"
NOT_AN_OBJECT = "NOT_AN_OBJECT"
MISSING_NAME = "MISSING_NAME"
INVALID_ARGUMENTS = "INVALID_ARGUMENTS"
# Rehearsal-output parse errors (world role).
MISSING_EXECUTION_RESULT = "MISSING_EXECUTION_RESULT"
EMPTY_EXECUTION_RESULT = "EMPTY_EXECUTION_RESULT"
# Codes the world role itself may return inside <execution_result> (docs/method.md §2); the first
# three mean "the call is invalid", which ends a rehearsal-mode episode.
INVALID_TOOL_CALL_FORMAT = "INVALID_TOOL_CALL_FORMAT"
TOOL_NOT_AVAILABLE = "TOOL_NOT_AVAILABLE"
INVALID_PARAMETERS = "INVALID_PARAMETERS"
TOOL_EXECUTION_ERROR = "TOOL_EXECUTION_ERROR"
INVALID_CALL_CODES = frozenset({INVALID_TOOL_CALL_FORMAT, TOOL_NOT_AVAILABLE, INVALID_PARAMETERS})

CALL_TAGS = (("<tool_call>", "</tool_call>"), ("<function_call>", "</function_call>"))
RESULT_TAG = ("<execution_result>", "</execution_result>")
_SNIPPET = 200  # how much offending text an error keeps


@dataclass(frozen=True)
class ParsedReply:
    """An agent reply: its tool calls in order, any parse errors, and the text outside calls."""

    calls: tuple[ToolCall, ...]
    errors: tuple[ToolError, ...]
    content: str

    @property
    def ok(self) -> bool:
        """True when every call block parsed."""
        return not self.errors

    @property
    def is_final(self) -> bool:
        """A reply with no tool call and no error is the final answer of its user turn."""
        return not self.calls and not self.errors


@dataclass(frozen=True)
class ParsedRehearsal:
    """A world-role output: the simulated ``ToolResult``, or a parse ``error`` (then None)."""

    result: ToolResult | None
    error: ToolError | None = None


class _CallJson(BaseModel):
    """The JSON shape of one tool call as models write it (OpenAI/Hermes dialects)."""

    model_config = ConfigDict(extra="allow")

    name: str
    arguments: Any = None
    parameters: Any = None


def sanitize(text: str) -> str:
    """Replace lone surrogates (invalid in UTF-8) with U+FFFD; valid pairs become characters."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        # UTF-16 with surrogatepass joins well-formed pairs; lone halves decode as one U+FFFD each
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _sanitize_json(value: Any) -> Any:
    # json.loads turns "\ud800" escapes into lone surrogates: clean keys and strings too.
    if isinstance(value, str):
        return sanitize(value)
    if isinstance(value, list):
        return [_sanitize_json(v) for v in value]
    if isinstance(value, dict):
        return {sanitize(str(k)): _sanitize_json(v) for k, v in value.items()}
    return value


def _err(code: str, message: str, text: str) -> ToolError:
    return ToolError(code=code, message=message, text=text[:_SNIPPET])


def _strip_fence(text: str) -> str:
    """Remove a surrounding Markdown code fence (```json ... ```), if any."""
    body = text.strip()
    if body.startswith("```"):
        newline = body.find("\n")
        body = body[newline + 1 :] if newline >= 0 else body[3:]
        if body.rstrip().endswith("```"):
            body = body.rstrip()[:-3]
    return body.strip()


def load_json(text: str) -> tuple[Any, ToolError | None]:
    """Parse a JSON value tolerantly: fences stripped, trailing text after the value ignored."""
    body = _strip_fence(text)
    if not body:
        return None, _err(INVALID_JSON, "expected a JSON value, got nothing", text)
    try:
        return _sanitize_json(json.loads(body)), None
    except RecursionError:
        return None, _err(JSON_TOO_DEEP, "JSON nesting is too deep to parse", text)
    except json.JSONDecodeError as first:
        start = min((i for i in (body.find("{"), body.find("[")) if i >= 0), default=-1)
        if start >= 0:
            try:
                value, _ = json.JSONDecoder().raw_decode(body, start)
                return _sanitize_json(value), None
            except RecursionError:
                return None, _err(JSON_TOO_DEEP, "JSON nesting is too deep to parse", text)
            except json.JSONDecodeError:
                pass
        return None, _err(INVALID_JSON, f"not valid JSON: {first.msg} at {first.pos}", text)


def _to_call(obj: Any, raw: str) -> tuple[ToolCall | None, ToolError | None]:
    if not isinstance(obj, dict):
        kind = type(obj).__name__
        return None, _err(NOT_AN_OBJECT, f"a tool call must be a JSON object, got {kind}", raw)
    if "function" in obj and isinstance(obj["function"], dict) and "name" not in obj:
        obj = obj["function"]  # OpenAI's {"type": "function", "function": {...}} wrapper
    try:
        parsed = _CallJson.model_validate(obj)
    except ValidationError:
        return None, _err(MISSING_NAME, 'a tool call needs a string "name"', raw)
    if not parsed.name.strip():
        return None, _err(MISSING_NAME, 'a tool call needs a non-empty "name"', raw)
    args = parsed.arguments if parsed.arguments is not None else parsed.parameters
    if args is None:
        args = {}
    if isinstance(args, str):  # OpenAI encodes arguments as a JSON string
        args, error = load_json(args) if args.strip() else ({}, None)
        if error is not None:
            return None, _err(
                INVALID_ARGUMENTS, f'"arguments" string is not JSON: {error.message}', raw
            )
    if not isinstance(args, dict):
        kind = type(args).__name__
        return None, _err(INVALID_ARGUMENTS, f'"arguments" must be a JSON object, got {kind}', raw)
    return ToolCall(name=parsed.name.strip(), arguments=args, raw=raw), None


def _calls_from_block(block: str) -> tuple[list[ToolCall], list[ToolError]]:
    if not block.strip():
        return [], [_err(EMPTY_TOOL_CALL, "empty tool-call block", block)]
    value, error = load_json(block)
    if error is not None:
        return [], [error]
    items = value if isinstance(value, list) else [value]
    if not items:
        return [], [_err(EMPTY_TOOL_CALL, "empty list of tool calls", block)]
    calls: list[ToolCall] = []
    errors: list[ToolError] = []
    for item in items:
        call, call_error = _to_call(item, block.strip())
        if call is not None:
            calls.append(call)
        if call_error is not None:
            errors.append(call_error)
    return calls, errors


def _find_open(text: str, pos: int) -> tuple[int, str, str]:
    """The earliest opening call tag at or after ``pos``: (index, open tag, close tag)."""
    best = (-1, "", "")
    for open_tag, close_tag in CALL_TAGS:
        i = text.find(open_tag, pos)
        if i >= 0 and (best[0] < 0 or i < best[0]):
            best = (i, open_tag, close_tag)
    return best


def parse_tool_calls(text: str) -> ParsedReply:
    """Parse an agent reply into tool calls; never raises (see module docstring for forms)."""
    text = sanitize(text)
    calls: list[ToolCall] = []
    errors: list[ToolError] = []
    outside: list[str] = []
    pos = 0
    while True:
        start, open_tag, close_tag = _find_open(text, pos)
        if start < 0:
            outside.append(text[pos:])
            break
        outside.append(text[pos:start])
        body_start = start + len(open_tag)
        end = text.find(close_tag, body_start)
        unclosed = end < 0
        block = text[body_start:] if unclosed else text[body_start:end]
        found, found_errors = _calls_from_block(block)
        if unclosed and found_errors:
            found_errors = [_err(UNCLOSED_TOOL_CALL, f"{open_tag} without {close_tag}", block)]
        calls += found
        errors += found_errors
        if unclosed:
            break
        pos = end + len(close_tag)
    content = "".join(outside).strip()
    if not calls and not errors:
        calls = _bare_call(content)
        if calls:
            content = ""
    return ParsedReply(calls=tuple(calls), errors=tuple(errors), content=content)


def _bare_call(content: str) -> list[ToolCall]:
    """A reply that is only a call object (or list of them), untagged: accept it as calls."""
    body = _strip_fence(content)
    if not body.startswith(("{", "[")):
        return []
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, RecursionError):
        return []
    items = value if isinstance(value, list) else [value]
    looks_like_calls = items and all(
        isinstance(i, dict) and "name" in i and ("arguments" in i or "parameters" in i)
        for i in items
    )
    if not looks_like_calls:
        return []
    calls, errors = _calls_from_block(body)
    return [] if errors else calls


def parse_rehearsal(text: str) -> ParsedRehearsal:
    """Parse a world-role output ``<execution_result>JSON</execution_result>``; never raises.

    A JSON object with an ``error`` key is the world flagging an error: it becomes a
    ``ToolResult`` with ``error`` set (``{"error": {"code": C, "message": M}}`` or
    ``{"error": C, "message": M}``). Any other JSON value is the simulated result.
    """
    text = sanitize(text)
    open_tag, close_tag = RESULT_TAG
    start = text.find(open_tag)
    if start < 0:
        return ParsedRehearsal(None, _err(MISSING_EXECUTION_RESULT, f"no {open_tag} tag", text))
    body_start = start + len(open_tag)
    end = text.find(close_tag, body_start)
    block = text[body_start:] if end < 0 else text[body_start:end]
    if not block.strip():
        return ParsedRehearsal(None, _err(EMPTY_EXECUTION_RESULT, "empty execution result", block))
    value, error = load_json(block)
    if error is not None:
        return ParsedRehearsal(None, error)
    return ParsedRehearsal(result_from_json(value))


def result_from_json(value: Any) -> ToolResult:
    """Interpret a JSON value from the world role (or a simulator) as a ``ToolResult``."""
    if isinstance(value, dict) and "error" in value and value["error"] not in (None, False, ""):
        raw = value["error"]
        if isinstance(raw, dict):
            code = str(raw.get("code") or TOOL_EXECUTION_ERROR)
            message = str(raw.get("message", ""))
        else:
            code = str(raw) if str(raw).isupper() else TOOL_EXECUTION_ERROR
            message = str(value.get("message", "" if str(raw).isupper() else raw))
        return ToolResult(error=ToolError(code=code, message=message))
    return ToolResult(value=value)


def result_to_json(result: ToolResult) -> Any:
    """The JSON value a tool message shows for a result (inverse of ``result_from_json``)."""
    if result.error is not None:
        return {"error": {"code": result.error.code, "message": result.error.message}}
    return result.value
