"""OpenAI Responses API models (`POST /v1/responses`, what Codex speaks) and their mapping to the chat
template's messages.

Strict like protocol/openai.py. `store`/`previous_response_id`: this server keeps nothing (store=false
semantics), so the whole conversation comes in `input` every time.

Mapping (`ResponsesRequest.for_template`): `instructions` and the leading system/developer messages ->
one system message (the template takes one, first); a run of output items (reasoning, an assistant
message, function calls) -> one assistant message with `reasoning_content`, `content` and `tool_calls`,
as the model wrote them in one turn, so a replayed history renders as it was generated and reuses the
cache; `function_call_output` -> a `tool` message.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from .base import RequestModel, ResponseModel
from .openai import (ChatTemplateKwargs, FunctionDef, FunctionToolChoice, ReasoningEffort, ResponseFormat,
                     arguments_object, check_forced_call, template_kwargs)

_ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
_MEDIA_PARTS = ("input_image", "input_file", "input_audio")


def _check_parts(parts: Any) -> Any:
    if not isinstance(parts, list):
        return parts
    for i, part in enumerate(parts):
        if not isinstance(part, dict):
            raise ValueError(f"content part {i} must be an object like {{\"type\": \"input_text\", \"text\": ...}}, "
                             f"not {type(part).__name__}")
        kind = part.get("type")
        if kind in _MEDIA_PARTS:
            raise ValueError(f"content part {i} is {kind}: this model reads text only")
        if kind not in ("input_text", "output_text"):
            raise ValueError(f"content part {i} has type {kind!r}; expected input_text or output_text")
    return parts


class TextPart(RequestModel):
    type: Literal["input_text", "output_text"]
    text: str


def _text(content: str | list[TextPart]) -> str:
    return content if isinstance(content, str) else "\n".join(p.text for p in content)


# ---------------------------------------------------------------------------------------------- items

class MessageItem(RequestModel):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextPart]

    @field_validator("content", mode="before")
    @classmethod
    def _parts(cls, content: Any) -> Any:
        return _check_parts(content)


class FunctionCallItem(RequestModel):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str

    @field_validator("arguments")
    @classmethod
    def _object(cls, arguments: str) -> str:
        arguments_object(arguments)
        return arguments


class FunctionCallOutputItem(RequestModel):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[TextPart]

    @field_validator("output", mode="before")
    @classmethod
    def _parts(cls, output: Any) -> Any:
        return _check_parts(output)


class SummaryText(RequestModel):
    type: Literal["summary_text"]
    text: str


class ReasoningText(RequestModel):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(RequestModel):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[SummaryText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None      # ours are never encrypted; a client's is opaque to us

    def text(self) -> str:
        parts = self.content if self.content else self.summary
        return "\n".join(p.text for p in parts)


InputItem = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem,
                      Field(discriminator="type")]


def _check_items(items: Any) -> Any:
    """Before the typed union: a message may leave out its type; clear messages for what we cannot take."""
    if not isinstance(items, list):
        return items
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"input item {i} must be an object, not {type(item).__name__}")
        kind = item.get("type", "message")
        if kind == "item_reference":
            raise ValueError(f"input item {i} is an item_reference: this server stores no items "
                             f"(store=false semantics); send the item itself")
        if kind not in _ITEM_TYPES:
            raise ValueError(f"input item {i} has type {kind!r}; this server takes {', '.join(_ITEM_TYPES)} items")
        out.append({**item, "type": kind})
    return out


# ---------------------------------------------------------------------------------------------- tools

class FunctionTool(FunctionDef):
    """Responses' flattened function tool: {type: "function", name, description, parameters, strict}."""
    type: Literal["function"]

    @model_validator(mode="before")
    @classmethod
    def _functions_only(cls, value: Any) -> Any:
        if isinstance(value, dict) and value.get("type") != "function":
            raise ValueError(f"tool type {value.get('type')!r} is not supported; this server runs function tools")
        return value

    def for_template(self) -> dict[str, Any]:
        fn = self.model_dump(exclude_none=True, exclude={"type", "strict"})
        return {"type": "function", "function": fn}


class ReasoningConfig(RequestModel):
    effort: ReasoningEffort | None = None
    summary: str | None = None          # accepted; the whole reasoning comes back as reasoning_text


class NamedToolChoice(RequestModel):
    """Responses' `{"type": "function", "name": ...}`: call that function."""
    type: Literal["function"]
    name: str


class TextConfig(RequestModel):
    format: ResponseFormat | None = None
    verbosity: str | None = None        # accepted; the model has no such control


# ------------------------------------------------------------------------------------------- requests

class ResponsesRequest(FunctionToolChoice, RequestModel):
    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    reasoning: ReasoningConfig | None = None
    text: TextConfig | None = None
    metadata: dict[str, str] | None = None
    chat_template_kwargs: ChatTemplateKwargs | None = None     # OpenJet extension, as on chat completions

    @field_validator("input", mode="before")
    @classmethod
    def _items(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("input must not be empty")
        return _check_items(value)

    @model_validator(mode="after")
    def _tool_choice_names_a_tool(self) -> "ResponsesRequest":
        check_forced_call(self.forced_call(), {t.name for t in self.tools or ()})
        return self

    def for_template(self) -> list[dict[str, Any]]:
        items = [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) else list(self.input)
        system = [self.instructions] if self.instructions else []
        while items and isinstance(items[0], MessageItem) and items[0].role in ("system", "developer"):
            system.append(_text(items.pop(0).content))
        messages: list[dict[str, Any]] = [{"role": "system", "content": "\n\n".join(system)}] if system else []
        turn: dict[str, Any] | None = None      # the assistant message the current run of output items builds

        def new_turn() -> dict[str, Any]:
            messages.append({"role": "assistant", "content": ""})
            return messages[-1]

        for item in items:
            if isinstance(item, ReasoningItem):
                if turn is None or turn["content"] or turn.get("tool_calls"):
                    turn = new_turn()
                turn["reasoning_content"] = "\n".join(filter(None, [turn.get("reasoning_content"), item.text()]))
            elif isinstance(item, MessageItem) and item.role == "assistant":
                if turn is None or turn.get("tool_calls"):
                    turn = new_turn()
                turn["content"] = "\n".join(filter(None, [turn["content"], _text(item.content)]))
            elif isinstance(item, FunctionCallItem):
                turn = turn or new_turn()
                turn.setdefault("tool_calls", []).append(
                    {"id": item.call_id, "type": "function",
                     "function": {"name": item.name,
                                  "arguments": arguments_object(item.arguments)}})
            elif isinstance(item, FunctionCallOutputItem):
                turn = None
                messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)})
            else:
                turn = None
                messages.append({"role": item.role, "content": _text(item.content)})
        return messages

    def _named_choice(self) -> str | None:
        return self.tool_choice.name if isinstance(self.tool_choice, NamedToolChoice) else None

    def template_kwargs(self) -> dict[str, Any]:
        return template_kwargs(self.chat_template_kwargs, self.reasoning.effort if self.reasoning else None)


# ------------------------------------------------------------------------------------------ responses

class OutputText(ResponseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []


class ReasoningTextOut(ResponseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItemOut(ResponseModel):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = []
    content: list[ReasoningTextOut]
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


class MessageItemOut(ResponseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    content: list[OutputText]


class FunctionCallOut(ResponseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


class InputTokensDetails(ResponseModel):
    cached_tokens: int = 0


class OutputTokensDetails(ResponseModel):
    reasoning_tokens: int = 0


class ResponseUsage(ResponseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseObject(ResponseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    model: str
    output: list[ReasoningItemOut | MessageItemOut | FunctionCallOut] = []
    usage: ResponseUsage | None = None
    incomplete_details: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    parallel_tool_calls: bool = True
    previous_response_id: None = None
    reasoning: dict[str, Any] | None = None
    store: bool = False
    temperature: float | None = None
    top_p: float | None = None
    tool_choice: Any = "auto"
    tools: list[dict[str, Any]] = []
    text: dict[str, Any] = {"format": {"type": "text"}}
    truncation: Literal["disabled"] = "disabled"
    metadata: dict[str, str] = {}
    timings: dict[str, Any] | None = None    # llama.cpp's, as chat completions give them; SDKs ignore it
