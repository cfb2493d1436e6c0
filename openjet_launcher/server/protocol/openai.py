"""OpenAI request and response models: chat completions, completions, models, errors.

Requests are strict (pydantic strict mode: "1" is not a number, 1 is not a boolean, NaN and infinities
are rejected) so that a wrong type is a 400 the client can act on; unknown top-level fields are ignored,
as every OpenAI-compatible server does (clients send `user`, `metadata`, `parallel_tool_calls`...).
Strings have already had lone UTF-16 surrogates replaced by U+FFFD (server/body.py) before validation.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ...text.chat import RESERVED_TEMPLATE_KWARGS
from ...text.tool_calls import MAX_JSON_DEPTH, nested_deeper_than
from .base import RequestModel, ResponseModel

_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_SCHEMA_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}


# ------------------------------------------------------------------------------------------- messages

def text_of_content(content: str | list | None) -> str | None:
    """A message's text: a string as is, the text parts of a list joined with newlines."""
    if content is None or isinstance(content, str):
        return content
    return "\n".join(part["text"] for part in content)


def arguments_object(arguments: str) -> dict[str, Any]:
    """A tool call's arguments string decoded: a JSON object (blank, only whitespace, means none: {}); ValueError
    saying what is wrong otherwise (the chat and Responses validators' words). The body's depth check cannot see inside
    the string: MAX_JSON_DEPTH bounds it, whatever the Python."""
    too_deep = f"arguments are nested too deeply (more than {MAX_JSON_DEPTH} levels)"
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"arguments must be a JSON object encoded as a string ({e.msg})") from None
    except RecursionError:
        raise ValueError(too_deep) from None
    if not isinstance(value, dict):
        raise ValueError("arguments must be a JSON object encoded as a string")
    if nested_deeper_than(value, MAX_JSON_DEPTH):
        raise ValueError(too_deep)
    return value


class ToolCallFunction(RequestModel):
    name: str
    arguments: str = "{}"

    def decoded_arguments(self) -> dict[str, Any]:
        return arguments_object(self.arguments)


class ToolCallIn(RequestModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction

    @field_validator("function")
    @classmethod
    def _arguments_are_an_object(cls, f: ToolCallFunction) -> ToolCallFunction:
        f.decoded_arguments()
        return f


_TEXT_PARTS = {"type": "array", "items": {"type": "object", "required": ["text"], "properties": {
    "type": {"enum": ["text", "input_text"]}, "text": {"type": "string"}}}}


def _message_schema(schema: dict[str, Any]) -> None:
    """The OpenAPI schema states what the validators check: content parts are text objects, and every role
    but assistant (whose message may carry only tool calls) needs content."""
    schema["properties"]["content"] = {"anyOf": [{"type": "string"}, _TEXT_PARTS, {"type": "null"}]}
    schema["anyOf"] = [
        {"properties": {"role": {"enum": ["system", "developer", "user", "tool"]},
                        "content": {"anyOf": [{"type": "string"}, _TEXT_PARTS]}}, "required": ["content"]},
        {"properties": {"role": {"const": "assistant"}}}]


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False, json_schema_extra=_message_schema)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[Any] | None = None
    name: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    @field_validator("content")
    @classmethod
    def _text_parts(cls, content: Any) -> Any:
        if not isinstance(content, list):
            return content
        for i, part in enumerate(content):
            if not isinstance(part, dict):
                raise ValueError(f"content part {i} must be an object like {{\"type\": \"text\", \"text\": ...}}, "
                                 f"not {type(part).__name__}")
            kind = part.get("type", "text")
            if kind not in ("text", "input_text"):
                raise ValueError(f"content part {i} has type {kind!r}: this model reads text only")
            if not isinstance(part.get("text"), str):
                raise ValueError(f"content part {i} needs a string 'text'")
        return content

    @model_validator(mode="after")
    def _content_required(self) -> "ChatMessage":
        if self.role != "assistant" and self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        return self

    def for_template(self) -> dict[str, Any]:
        """The dict the chat template reads: text parts joined, tool-call arguments decoded."""
        out: dict[str, Any] = {k: v for k, v in self.model_dump(exclude_none=True).items()
                               if isinstance(v, (str, int, float, bool, list, dict))}
        out["content"] = text_of_content(self.content) or ""
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.function.name,
                                               "arguments": c.function.decoded_arguments()}}
                                 for c in self.tool_calls]
        return out


# ---------------------------------------------------------------------------------------------- tools

def check_schema(schema: Any, where: str, depth: int = 0) -> None:
    """A light JSON-schema sanity check, enough to turn garbage into a 400 before any prefill."""
    if depth > 32:
        raise ValueError(f"{where}: schema nested too deeply")
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise ValueError(f"{where}: a schema must be an object, not {type(schema).__name__}")
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for k in kinds:
        if k not in _SCHEMA_TYPES:
            raise ValueError(f"{where}.type: unknown JSON schema type {k!r}")
    props = schema.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            raise ValueError(f"{where}.properties must be an object")
        for name, sub in props.items():
            check_schema(sub, f"{where}.properties.{name}", depth + 1)
    required = schema.get("required")
    if required is not None and not (isinstance(required, list) and all(isinstance(r, str) for r in required)):
        raise ValueError(f"{where}.required must be a list of strings")
    if "items" in schema and not isinstance(schema["items"], (dict, bool, list)):
        raise ValueError(f"{where}.items must be a schema")
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            if not isinstance(schema[key], list):
                raise ValueError(f"{where}.{key} must be a list of schemas")
            for i, sub in enumerate(schema[key]):
                check_schema(sub, f"{where}.{key}.{i}", depth + 1)


class FunctionDef(RequestModel):
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _FUNCTION_NAME.match(name):
            raise ValueError("a function name is 1 to 64 letters, digits, '_', '.' or '-'")
        return name

    @field_validator("parameters")
    @classmethod
    def _parameters(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        if schema is not None:
            check_schema(schema, "parameters")
            if schema.get("type", "object") != "object":
                raise ValueError("parameters must be a JSON schema of type 'object'")
        return schema


class Tool(RequestModel):
    type: Literal["function"]
    function: FunctionDef

    def for_template(self) -> dict[str, Any]:
        return {"type": "function", "function": self.function.model_dump(exclude_none=True)}


@dataclass(frozen=True)
class ForcedCall:
    """A tool_choice that requires a call: of the function `name`, or of any of the request's tools (None)."""
    name: str | None = None


def check_forced_call(forced: ForcedCall | None, tool_names: set[str]) -> None:
    """A forced call needs tools, and a named one a tool of that name."""
    if forced is None:
        return
    if not tool_names:
        raise ValueError("tool_choice requires a tool call, but the request has no tools")
    if forced.name is not None and forced.name not in tool_names:
        raise ValueError(f"tool_choice names {forced.name!r}, which is not among the tools "
                         f"({', '.join(sorted(tool_names))})")


class FunctionName(RequestModel):
    name: str


class NamedToolChoice(RequestModel):
    """Chat completions' `{"type": "function", "function": {"name": ...}}`: call that function."""
    type: Literal["function"]
    function: FunctionName


class FunctionToolChoice:
    """What chat completions and Responses share about `tools` and a `tool_choice` of "none", "auto", "required"
    or a named function: the tools the template sees and the call the request forces. A request class mixing it
    in says where its named choice keeps the name (_named_choice); it has `tools` and `tool_choice` fields."""

    def _named_choice(self) -> str | None:
        raise NotImplementedError

    def tools_for_template(self) -> list[dict[str, Any]] | None:
        if not self.tools or self.tool_choice == "none":
            return None
        return [t.for_template() for t in self.tools]

    def forced_call(self) -> ForcedCall | None:
        name = self._named_choice()
        if name is not None:
            return ForcedCall(name)
        return ForcedCall() if self.tool_choice == "required" else None


# ------------------------------------------------------------------------------------------- requests

class StreamOptions(RequestModel):
    include_usage: bool = False


class ChatTemplateKwargs(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)
    enable_thinking: bool | None = None
    preserve_thinking: bool | None = None
    reasoning_effort: str | None = None      # the template's own values (xhigh | medium | low), passed as is

    @model_validator(mode="after")
    def _no_reserved_names(self) -> "ChatTemplateKwargs":
        clash = sorted(RESERVED_TEMPLATE_KWARGS & set(self.model_extra or ()))
        if clash:
            raise ValueError(f"{clash[0]!r} is set by the server, not by chat_template_kwargs (reserved: "
                             f"{', '.join(sorted(RESERVED_TEMPLATE_KWARGS))})")
        return self


# OpenAI's reasoning efforts -> the Qwen3.8 template's (xhigh | medium | low); "none" turns thinking off.
REASONING_EFFORT = {"minimal": "low", "low": "low", "medium": "medium", "high": "xhigh", "xhigh": "xhigh"}
ReasoningEffort = Literal[("none", *REASONING_EFFORT)]


def template_kwargs(kwargs: ChatTemplateKwargs | None, effort: ReasoningEffort | None = None) -> dict[str, Any]:
    """The chat template's kwargs: the request's chat_template_kwargs, which win, and an OpenAI reasoning
    effort mapped onto the template's (chat completions' `reasoning_effort`, Responses' `reasoning.effort`)."""
    out = kwargs.model_dump(exclude_none=True) if kwargs else {}
    if effort == "none":
        out.setdefault("enable_thinking", False)
    elif effort is not None:
        out.setdefault("reasoning_effort", REASONING_EFFORT[effort])
    return out


class ResponseFormat(RequestModel):
    """`response_format` (Responses: `text.format`): plain text only, there is no constrained decoding."""
    type: str

    @field_validator("type")
    @classmethod
    def _text_only(cls, kind: str) -> str:
        if kind != "text":
            raise ValueError(f"{kind!r}: structured output (json_object, json_schema) is not supported; "
                             f"only type 'text'")
        return kind


class SamplingFields(RequestModel):
    """Fields both chat completions and completions take."""
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    stop: str | list[str] | None = None
    n: int | None = Field(None, ge=1, le=1)   # one choice per request
    logprobs: bool | int | None = None        # chat's flag, completions' count: neither is supported
    top_logprobs: int | None = None
    # Fields that would change the output and are not implemented: refused rather than ignored (an empty map is no bias)
    logit_bias: dict[str, float] | None = None

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        if bias:
            raise ValueError("logit_bias is not supported")
        return bias

    @field_validator("logprobs", "top_logprobs")
    @classmethod
    def _no_logprobs(cls, v: bool | int | None) -> bool | int | None:
        if v is not None and v is not False:
            raise ValueError("logprobs are not supported")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, stop: str | list[str] | None) -> list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop
        if stops is not None and any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops

    @field_validator("seed")
    @classmethod
    def _seed(cls, seed: int | None) -> int | None:
        if seed is not None and not -(2**63) <= seed < 2**64:
            raise ValueError("seed must fit in 64 bits")
        # The generator takes seeds >= 0: a negative one is its 64-bit two's complement (same seed, same tokens).
        return None if seed is None else seed % 2**64


class ChatCompletionRequest(FunctionToolChoice, SamplingFields):
    # Qwen's template needs a user message (the schema says so; the template's error is the 400).
    messages: list[ChatMessage] = Field(min_length=1, json_schema_extra={
        "contains": {"type": "object", "properties": {"role": {"const": "user"}}, "required": ["role"]}})
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # false: at most one tool call in the answer
    chat_template_kwargs: ChatTemplateKwargs | None = None
    reasoning_effort: ReasoningEffort | None = None     # chat_template_kwargs.reasoning_effort wins
    response_format: ResponseFormat | None = None
    continue_final_message: bool = False     # vLLM's: the last (assistant) message is the answer's start
    # The deprecated function-calling fields: refused (a client of them expects `function_call` back), not dropped
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None

    def messages_for_template(self) -> list[dict[str, Any]]:
        """The messages as the template reads them, the leading system and developer messages as one system turn
        (Qwen's own template knows no `developer` role; the Responses API's instructions are folded the same way)."""
        messages = [m.for_template() for m in self.messages]
        lead = 0
        while lead < len(messages) and messages[lead]["role"] in ("system", "developer"):
            lead += 1
        if lead > 1 or (lead and messages[0]["role"] == "developer"):
            text = "\n\n".join(m["content"] for m in messages[:lead] if m["content"])
            messages[:lead] = [{"role": "system", "content": text}]
        return messages

    @field_validator("functions", "function_call")
    @classmethod
    def _deprecated_functions(cls, v: object) -> object:
        if v is not None:
            raise ValueError("the deprecated functions / function_call fields are not supported: send the "
                             "functions as tools ({\"type\": \"function\", \"function\": ...}) and tool_choice")
        return v

    @model_validator(mode="after")
    def _tool_choice_names_a_tool(self) -> "ChatCompletionRequest":
        check_forced_call(self.forced_call(), {t.function.name for t in self.tools or ()})
        return self

    def _named_choice(self) -> str | None:
        return self.tool_choice.function.name if isinstance(self.tool_choice, NamedToolChoice) else None


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str]
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=1)  # the best of several samples: one is all there is, as for n

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, prompt: str | list) -> str | list:
        if isinstance(prompt, list):
            if not prompt:
                raise ValueError("prompt must not be empty")
            if isinstance(prompt[0], str):
                if len(prompt) != 1:
                    raise ValueError("one prompt per request")
                return prompt[0]
        return prompt

    @field_validator("echo", "suffix")
    @classmethod
    def _unsupported(cls, v: Any, info) -> Any:
        if v:
            raise ValueError(f"{info.field_name} is not supported")
        return v


class TokenizeRequest(RequestModel):
    content: str
    add_special: bool = False        # Qwen adds no BOS: accepted for llama.cpp compatibility
    parse_special: bool = True       # llama.cpp's default: special-token texts become their ids
    with_pieces: bool = False


class DetokenizeRequest(RequestModel):
    tokens: list[int]


# ------------------------------------------------------------------------------------------ responses

class ErrorInfo(ResponseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(ResponseModel):
    error: ErrorInfo


class ModelCard(ResponseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "openjet"
    meta: dict[str, Any] | None = None


class ModelList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class PromptTokensDetails(ResponseModel):
    cached_tokens: int = 0


class Usage(ResponseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class ToolCallOut(ResponseModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class AssistantMessage(ResponseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(ResponseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: None = None


class ChatCompletionResponse(ResponseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    timings: dict[str, Any] | None = None


class DeltaMessage(ResponseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChatChunkChoice(ResponseModel):
    index: int = 0
    delta: DeltaMessage
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(ResponseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    timings: dict[str, Any] | None = None


class CompletionChoice(ResponseModel):
    index: int = 0
    text: str
    finish_reason: str | None = None
    logprobs: None = None


class CompletionResponse(ResponseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    timings: dict[str, Any] | None = None
