"""Anthropic Messages API models (`POST /v1/messages`, `/v1/messages/count_tokens`) and their mapping to
the chat template's messages.

Requests are strict like the OpenAI ones (protocol/openai.py): a wrong type is a 400, unknown fields
(`metadata`, `cache_control`, `citations`, `service_tier`...) are ignored. The model reads text only, so
image and document blocks are a 400 that says so.

Mapping (`MessagesRequest.for_template`): `system` -> a system message; an assistant message's thinking,
text and tool_use blocks -> one assistant message with `reasoning_content`, `content` and `tool_calls`
(arguments as objects, as the template wants them); a user message's tool_result blocks -> `tool`
messages and its text blocks -> user messages, in the order written (the template merges consecutive
tool results into one turn).

A conversation that ends with an assistant message is a prefill: the answer continues that message's text
(Anthropic's documented behaviour; the response holds only the new text). An empty final assistant message
(which Anthropic allows) has nothing to continue and is left out.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from .base import RequestModel, ResponseModel
from .openai import ChatTemplateKwargs, ForcedCall, check_forced_call, check_schema, template_kwargs

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_\-]{1,128}$")
_TEXT_ONLY = ("image", "document", "search_result", "container_upload")


def _check_blocks(blocks: Any, allowed: tuple[str, ...]) -> Any:
    """Before the typed union: clear messages for non-objects, media blocks and unknown block types."""
    if not isinstance(blocks, list):
        return blocks
    for i, block in enumerate(blocks):
        if not isinstance(block, dict):
            raise ValueError(f"content block {i} must be an object like {{\"type\": \"text\", \"text\": ...}}, "
                             f"not {type(block).__name__}")
        kind = block.get("type")
        if kind in _TEXT_ONLY:
            raise ValueError(f"content block {i} is a {kind} block: this model reads text only")
        if kind not in allowed:
            raise ValueError(f"content block {i} has type {kind!r}; expected one of {', '.join(allowed)}")
    return blocks


# ------------------------------------------------------------------------------------------- blocks in

class TextBlockIn(RequestModel):
    type: Literal["text"]
    text: str


class ThinkingBlockIn(RequestModel):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlockIn(RequestModel):
    type: Literal["redacted_thinking"]
    data: str | None = None


class ToolUseBlockIn(RequestModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlockIn(RequestModel):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlockIn] | None = None
    is_error: bool | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_blocks(cls, content: Any) -> Any:
        return _check_blocks(content, ("text",))

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "\n".join(b.text for b in self.content)


Block = Annotated[TextBlockIn | ThinkingBlockIn | RedactedThinkingBlockIn | ToolUseBlockIn | ToolResultBlockIn,
                  Field(discriminator="type")]
_USER_BLOCKS = ("text", "tool_result")
_ASSISTANT_BLOCKS = ("text", "thinking", "redacted_thinking", "tool_use")


class MessageIn(RequestModel):
    role: Literal["user", "assistant"]
    content: str | list[Block]

    @model_validator(mode="before")
    @classmethod
    def _blocks_of_the_role(cls, value: Any) -> Any:
        if isinstance(value, dict):
            role = value.get("role")
            _check_blocks(value.get("content"), _ASSISTANT_BLOCKS if role == "assistant" else _USER_BLOCKS)
        return value

    def is_empty(self) -> bool:
        return not self.content

    def for_template(self) -> list[dict[str, Any]]:
        if isinstance(self.content, str):
            return [{"role": self.role, "content": self.content}]
        if self.role == "assistant":
            return [self._assistant()]
        out: list[dict[str, Any]] = []
        texts: list[str] = []
        for block in self.content:
            if isinstance(block, TextBlockIn):
                texts.append(block.text)
                continue
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": block.text()})
        if texts or not out:
            out.append({"role": "user", "content": "\n".join(texts)})
        return out

    def _assistant(self) -> dict[str, Any]:
        thinking = [b.thinking for b in self.content if isinstance(b, ThinkingBlockIn)]
        texts = [b.text for b in self.content if isinstance(b, TextBlockIn)]
        calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input}}
                 for b in self.content if isinstance(b, ToolUseBlockIn)]
        message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
        if thinking:
            message["reasoning_content"] = "\n".join(thinking)
        if calls:
            message["tool_calls"] = calls
        return message


# ---------------------------------------------------------------------------------------------- tools

class ToolIn(RequestModel):
    type: Literal["custom"] | None = None     # server tools (bash_..., web_search_...) are not ours to run
    name: str
    description: str | None = None
    input_schema: dict[str, Any]

    @model_validator(mode="before")
    @classmethod
    def _custom_only(cls, value: Any) -> Any:
        if isinstance(value, dict) and value.get("type") not in (None, "custom"):
            raise ValueError(f"tool type {value.get('type')!r} is a server tool; this server runs client tools "
                             f"only (a name, a description and an input_schema)")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _TOOL_NAME.match(name):
            raise ValueError("a tool name is 1 to 128 letters, digits, '_' or '-'")
        return name

    @field_validator("input_schema")
    @classmethod
    def _schema(cls, schema: dict[str, Any]) -> dict[str, Any]:
        check_schema(schema, "input_schema")
        if schema.get("type") != "object":
            raise ValueError("input_schema must be a JSON schema of type 'object'")
        return schema

    def for_template(self) -> dict[str, Any]:
        fn: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            fn["description"] = self.description
        fn["parameters"] = self.input_schema
        return {"type": "function", "function": fn}


class ToolChoice(RequestModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> "ToolChoice":
        if self.type == "tool" and not self.name:
            raise ValueError("tool_choice of type 'tool' needs the tool's name")
        return self


class ThinkingConfig(RequestModel):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=1)   # accepted; the engine has no thinking budget


# ------------------------------------------------------------------------------------------- requests

class CountTokensRequest(RequestModel):
    """What decides the prompt: the conversation, the system text, the tools and thinking."""
    model: str
    messages: list[MessageIn] = Field(min_length=1)
    system: str | list[TextBlockIn] | None = None
    tools: list[ToolIn] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    chat_template_kwargs: ChatTemplateKwargs | None = None     # OpenJet extension, as on chat completions

    @field_validator("system", mode="before")
    @classmethod
    def _system_blocks(cls, system: Any) -> Any:
        return _check_blocks(system, ("text",))

    @model_validator(mode="after")
    def _choice_names_a_tool(self) -> "CountTokensRequest":
        check_forced_call(self.forced_call(), {t.name for t in self.tools or ()})
        return self

    @model_validator(mode="after")
    def _content_not_empty(self) -> "CountTokensRequest":
        for i, m in enumerate(self.messages):
            if m.is_empty() and not (m.role == "assistant" and i == len(self.messages) - 1):
                raise ValueError(f"messages.{i}: all messages must have non-empty content except for the "
                                 f"optional final assistant message")
        return self

    def _conversation(self) -> list[MessageIn]:
        """The messages, without an empty final assistant message (nothing to continue)."""
        last = self.messages[-1]
        return self.messages[:-1] if last.role == "assistant" and last.is_empty() else self.messages

    def for_template(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        if self.system:
            text = self.system if isinstance(self.system, str) else "\n".join(b.text for b in self.system)
            messages.append({"role": "system", "content": text})
        for m in self._conversation():
            messages.extend(m.for_template())
        return messages

    def continues_answer(self) -> bool:
        """The conversation ends with the start of the assistant's answer (a prefill) for the model to continue."""
        conversation = self._conversation()
        return bool(conversation) and conversation[-1].role == "assistant"

    def forced_call(self) -> ForcedCall | None:
        c = self.tool_choice
        if c is None or c.type not in ("any", "tool"):
            return None
        return ForcedCall(c.name if c.type == "tool" else None)

    def tools_for_template(self) -> list[dict[str, Any]] | None:
        if not self.tools or (self.tool_choice is not None and self.tool_choice.type == "none"):
            return None
        return [t.for_template() for t in self.tools]

    def template_kwargs(self) -> dict[str, Any]:
        kwargs = template_kwargs(self.chat_template_kwargs)
        if self.thinking is not None:      # absent: the model's own default (Qwen3.8 thinks)
            kwargs.setdefault("enable_thinking", self.thinking.type != "disabled")
        return kwargs


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    stop_sequences: list[str] | None = None
    metadata: dict[str, Any] | None = None

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, stops: list[str] | None) -> list[str] | None:
        if stops is not None and any(not s for s in stops):
            raise ValueError("stop sequences must not be empty")
        return stops


# ------------------------------------------------------------------------------------------ responses

class TextBlock(ResponseModel):
    type: Literal["text"] = "text"
    text: str


class ThinkingBlock(ResponseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""       # nothing to sign: Claude's signatures guard its own thinking


class ToolUseBlock(ResponseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class Usage(ResponseModel):
    """Anthropic's split: `input_tokens` were prefilled, `cache_read_input_tokens` were reused."""
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class MessageResponse(ResponseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextBlock | ThinkingBlock | ToolUseBlock]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None
    stop_sequence: str | None = None
    usage: Usage
    timings: dict[str, Any] | None = None    # llama.cpp's, as chat completions give them; SDKs ignore it


class CountTokensResponse(ResponseModel):
    input_tokens: int
