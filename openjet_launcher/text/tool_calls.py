"""Qwen3.8's XML tool calls: an incremental scanner for one call, and argument typing by JSON schema.

The model writes (spec qwen38.md §1.2; our chat template renders past calls the same way):

    <tool_call>
    <function=NAME>
    <parameter=ARG>
    VALUE
    </parameter>
    ...
    </function>
    </tool_call>

A value is raw text and may hold anything, tags included (a model writing a file about this very
format). So a `</parameter>` ends the value only when, after optional whitespace, it is followed by
`<parameter=`, `</function>` or `</tool_call>`: the structural rule of vLLM's `qwen3coder_tool_parser`.
The scanner decides only what the text seen so far decides (otherwise it asks for more), so a call
parses the same whatever the split of the output into deltas.

Typing, as vLLM's parser does (llama.cpp instead tries JSON on every value, which turns a string
parameter "123" into a number): a parameter whose schema type is `string`, or is unknown, keeps the
raw text minus the one newline the format writes on each side; any other type is `json.loads`ed,
falling back to the raw text with a warning. Python literals `True`/`False`/`None` are accepted for
boolean and null types, since Qwen's own template renders non-container values with `| string`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
PARAMETER_OPEN = "<parameter="
PARAMETER_CLOSE = "</parameter>"

AFTER_VALUE = (PARAMETER_OPEN, FUNCTION_CLOSE, TOOL_CALL_CLOSE)  # what a structural `</parameter>` is followed by
MAX_NAME_CHARS = 256  # a function or parameter name with no '>' within this many chars is garbage
_WS = " \t\r\n"
_NAME_FORBIDDEN = set("<>{}\"' \t\r\n")  # vLLM rejects these too: unrendered Jinja, stray tags, prose


@dataclass(frozen=True)
class ToolCall:
    """One parsed call in OpenAI's shape; `arguments` is a JSON object as a string."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class CallEnd:
    """The scanner found a complete call ending at `end` (just past `</tool_call>`)."""

    end: int
    name: str
    params: list[tuple[str, str]]  # (name, raw value between the tags), in the order written


@dataclass(frozen=True)
class Malformed:
    """Not a call. The text before `at` is plain content; scanning for content resumes at `at` (> 0)."""

    at: int
    reason: str


def call_opening(name: str | None) -> str:
    """The start of a call the prompt writes for the model to go on from (a forced call): up to the function's
    parameters, or, for a call of any function, up to where the model writes `=NAME>`. Both end where the
    qwen35 pre-tokenizer splits (`<function` is one pre-token, `=NAME` the next), so the model's next tokens
    are ones it writes in that place anyway."""
    if name is None:
        return f"{TOOL_CALL_OPEN}\n{FUNCTION_OPEN[:-1]}"
    return f"{TOOL_CALL_OPEN}\n{FUNCTION_OPEN}{name}>\n"


def index_tools(tools: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Function name -> its parameters schema, from a request's `tools`.

    Accepts OpenAI's `{"type": "function", "function": {"name", "parameters"}}`, the bare
    `{"name", "parameters"}` and Anthropic's `{"name", "input_schema"}`. Schema checks belong to the
    server (a bad tool is a 400 before prefill); here a missing schema only means untyped arguments.
    """
    index: dict[str, dict[str, Any]] = {}
    for tool in tools:
        fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            continue
        schema = fn.get("parameters", fn.get("input_schema"))
        index[fn["name"]] = dict(schema) if isinstance(schema, Mapping) else {}
    return index


def _skip_ws(text: str, pos: int) -> int:
    n = len(text)
    while pos < n and text[pos] in _WS:
        pos += 1
    return pos


def _expect(text: str, pos: int, tokens: tuple[str, ...]) -> tuple[str, str, int]:
    """After optional whitespace at `pos`, one of `tokens`.

    ("found", token, end) | ("more", "", 0) when the text so far is whitespace or a token's prefix |
    ("bad", "", j) with j the first non-whitespace position.
    """
    j = _skip_ws(text, pos)
    for token in tokens:
        if text.startswith(token, j):
            return "found", token, j + len(token)
    rest = text[j : j + max(map(len, tokens))]
    if any(token.startswith(rest) for token in tokens):  # also true for rest == ""
        return "more", "", 0
    return "bad", "", j


def starts_call(text: str, at: int) -> bool | None:
    """Whether the `<tool_call>` at `at` is followed, after whitespace, by `<function=`; None: not known yet."""
    status, _, _ = _expect(text, at + len(TOOL_CALL_OPEN), (FUNCTION_OPEN,))
    return None if status == "more" else status == "found"


def _read_name(text: str, start: int) -> tuple[str, str, int]:
    """The NAME of `<function=NAME>` / `<parameter=NAME>` starting at `start`.

    ("ok", name, end past '>') | ("more", "", 0) | ("bad", "", 0). A newline or '<' before the '>'
    is garbage as soon as it is seen: any later '>' would close a name holding it.
    """
    gt = text.find(">", start, start + MAX_NAME_CHARS + 1)
    raw = text[start:gt] if gt != -1 else text[start : start + MAX_NAME_CHARS + 1]
    if "<" in raw or "\n" in raw:
        return "bad", "", 0
    if gt == -1:
        return ("bad", "", 0) if len(raw) > MAX_NAME_CHARS else ("more", "", 0)
    name = raw.strip()
    if not name or any(c in _NAME_FORBIDDEN for c in name):
        return "bad", "", 0
    return "ok", name, gt + 1


class ToolCallScanner:
    """Walks one call in a buffer that starts with `<tool_call>` and only grows between calls.

    `advance(buf)` returns None (needs more text), a CallEnd or a Malformed; `at_end(buf)` gives the
    verdict when the output has ended inside the call. State is kept between calls, so each byte of a
    long value is looked at about once.
    """

    def __init__(self) -> None:
        self._stage = "open"  # open -> function name -> body <-> (parameter name -> value) ; close
        self._pos = len(TOOL_CALL_OPEN)
        self._name = ""
        self._params: list[tuple[str, str]] = []
        self._param = ""
        self._value_start = 0
        self._search_from = 0  # where to look for the next `</parameter>` of the current value

    def advance(self, buf: str) -> CallEnd | Malformed | None:
        while True:
            stage = self._stage
            if stage == "open":
                status, _, at = _expect(buf, self._pos, (FUNCTION_OPEN,))
                if status != "found":
                    return None if status == "more" else Malformed(at, "no <function=NAME> after <tool_call>")
                self._stage, self._pos = "function name", at
            elif stage in ("function name", "parameter name"):
                status, name, end = _read_name(buf, self._pos)
                if status == "more":
                    return None
                if status == "bad":
                    what = "function" if stage == "function name" else "parameter"
                    return Malformed(self._pos, f"no valid {what} name")
                if stage == "function name":
                    self._name, self._stage = name, "body"
                else:
                    self._param, self._stage = name, "value"
                    self._value_start = self._search_from = end
                self._pos = end
            elif stage == "body":
                status, token, at = _expect(buf, self._pos, AFTER_VALUE)
                if status == "more":
                    return None
                if status == "bad":
                    return Malformed(at, f"unexpected text inside <function={self._name}>")
                if token == TOOL_CALL_CLOSE:
                    return Malformed(at, f"</tool_call> before </function> in <function={self._name}>")
                self._stage = "parameter name" if token == PARAMETER_OPEN else "close"
                self._pos = at
            elif stage == "value":
                close = buf.find(PARAMETER_CLOSE, self._search_from)
                if close == -1:
                    self._search_from = max(self._search_from, len(buf) - len(PARAMETER_CLOSE) + 1)
                    return None
                status, _, _ = _expect(buf, close + len(PARAMETER_CLOSE), AFTER_VALUE)
                if status == "more":
                    self._search_from = close
                    return None
                if status == "bad":  # a literal `</parameter>` inside the value
                    self._search_from = close + 1
                    continue
                self._params.append((self._param, buf[self._value_start : close]))
                self._stage, self._pos = "body", close + len(PARAMETER_CLOSE)
            else:  # close
                status, _, at = _expect(buf, self._pos, (TOOL_CALL_CLOSE,))
                if status != "found":
                    return None if status == "more" else Malformed(at, "text between </function> and </tool_call>")
                return CallEnd(at, self._name, self._params)

    def at_end(self, buf: str) -> Malformed:
        where = f" in <function={self._name}>" if self._name else ""
        return Malformed(len(buf), f"output ended inside a tool call{where}")


def _schema_types(schema: Any, root: Mapping[str, Any], depth: int = 0) -> set[str]:
    """The JSON types a property schema admits; empty when the schema does not say."""
    if not isinstance(schema, Mapping) or depth > 8:
        return set()
    declared = schema.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return {t for t in declared if isinstance(t, str)}
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list):
            return set().union(*(_schema_types(s, root, depth + 1) for s in schema[key]))
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, Mapping) else None
        return _schema_types(target, root, depth + 1)
    if "properties" in schema:
        return {"object"}
    if "items" in schema:
        return {"array"}
    values = schema["enum"] if isinstance(schema.get("enum"), list) else [schema["const"]] if "const" in schema else []
    return {_json_type(v) for v in values}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _admits(types: set[str], value: Any) -> bool:
    kind = _json_type(value)
    if kind in types:
        return True
    if kind == "integer":
        return "number" in types
    return kind == "number" and "integer" in types and float(value).is_integer()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # json.loads would accept NaN/Infinity; json.dumps would then emit non-JSON


def _finite_float(text: str) -> float:
    """A JSON number as a float, refused where it overflows (1e400 would reach json.dumps as Infinity, not JSON)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} overflows a double")
    return value


_PYTHON_LITERALS = {"True": True, "False": False, "None": None}
_NOT_PARSED = object()

# The deepest JSON value taken as a tool call's arguments, on the way out (a parameter the model wrote) and in (a
# client's arguments: server.protocol.openai.arguments_object), and the default of the request body's own bound
# (ServerSettings.max_json_depth), so that what the server hands out it also takes back. Not where json.loads stops:
# that depends on the Python (3.11 raises RecursionError at ~1,000 levels, 3.12 parses them).
MAX_JSON_DEPTH = 64


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether a decoded JSON value holds containers more than `limit` levels deep (iterative: any depth)."""
    todo = [(value, 1)]
    while todo:
        v, depth = todo.pop()
        if isinstance(v, (dict, list)):
            if depth > limit:
                return True
            todo.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return False


def convert_argument(raw: str, schema: Any, root: Mapping[str, Any]) -> tuple[Any, str | None]:
    """A parameter's raw text -> (typed value, warning or None), by the property's schema."""
    text = raw[1:] if raw.startswith("\n") else raw
    text = text[:-1] if text.endswith("\n") else text
    types = _schema_types(schema, root)
    if not types or types == {"string"}:
        return text, None
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
        if nested_deeper_than(value, MAX_JSON_DEPTH):
            raise ValueError("nested too deeply")
    except (ValueError, RecursionError):  # RecursionError: nested ~1,000 deep on Python 3.11
        value = _PYTHON_LITERALS.get(text.strip(), _NOT_PARSED)
        if value is not _NOT_PARSED and not _admits(types, value):
            value = _NOT_PARSED
    if "string" in types:  # a union with string: typed only when the text is one of the other types
        return (value, None) if value is not _NOT_PARSED and _admits(types - {"string"}, value) else (text, None)
    if value is _NOT_PARSED:
        return text, f"is not valid JSON for type {'/'.join(sorted(types))}; passed as a string"
    if not _admits(types, value):
        wanted = "/".join(sorted(types))
        return value, f"is JSON of type {_json_type(value)} where the schema says {wanted}; passed as written"
    return value, None


def build_call(end: CallEnd, call_id: str, tools: Mapping[str, Mapping[str, Any]]) -> tuple[ToolCall, list[str]]:
    """Type a scanned call's arguments by its function's schema (`end.name` must be one of `tools`); warnings
    for what had to be guessed."""
    warnings: list[str] = []
    schema = tools[end.name]
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    arguments: dict[str, Any] = {}
    for name, raw in end.params:
        if name in arguments:
            warnings.append(f"tool call {end.name!r}: parameter {name!r} given twice; the last one is kept")
        if name not in properties:
            warnings.append(f"tool call {end.name!r}: parameter {name!r} is not in the schema; passed as a string")
        value, problem = convert_argument(raw, properties.get(name), schema)
        if problem:
            warnings.append(f"tool call {end.name!r}: parameter {name!r} {problem}")
        arguments[name] = value
    return ToolCall(call_id, end.name, json.dumps(arguments, ensure_ascii=False)), warnings

