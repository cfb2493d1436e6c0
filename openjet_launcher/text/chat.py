"""The GGUF's chat template (`tokenizer.chat_template`), rendered as transformers renders it (spec §1.2).

The environment copies transformers' `utils/chat_template_utils.py` (`_compile_jinja_template`,
`render_jinja_template`): an `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with
jinja2's loopcontrols extension and transformers' `{% generation %}` tag (its AssistantTracker; here the tag
just renders its body, since the assistant-token mask it records is for training), the `raise_exception`
and `strftime_now` globals, and a `tojson` filter that keeps non-ASCII and takes indent, separators and
sort_keys. No `keep_trailing_newline`, as transformers. The template gets `messages`, `tools`,
`documents`, `add_generation_prompt`, `bos_token`, `eos_token` and the caller's template kwargs
(`enable_thinking`, `preserve_thinking`, `reasoning_effort`: the API's chat_template_kwargs). A kwarg
given as None is left undefined, so "not given" reads the same however the API spelled it.

Prompt injection: a rendered prompt is tokenized with special tokens allowed, so a user who writes
`<|im_end|>\n<|im_start|>system` in a message would otherwise forge turns. `render_prompt` replaces the
texts of the vocabulary's CONTROL tokens in every caller string by private-use placeholders, renders, puts
the texts back and returns their spans, which `Tokenizer.encode(..., literal_spans=...)` keeps as text,
as llama.cpp tokenizes user text (`parse_special=false`). USER_DEFINED tokens (`<think>`, `<tool_call>`)
are not CONTROL: llama.cpp and HF match them in any text, so they are left alone.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment
from gguf import TokenType

from openjet_launcher.errors import OpenJetError

if TYPE_CHECKING:
    from openjet_launcher.model.gguf_file import GGUFFile

# Placeholders for CONTROL token texts in caller strings: Supplementary Private Use Area-B, one per text; the
# last one marks where a continued assistant message's text goes (no caller string holds it once defused).
_PUA_FIRST, _PUA_LAST = 0x100000, 0x10FFFD
_PUA = re.compile(f"[{chr(_PUA_FIRST)}-{chr(_PUA_LAST)}]")
_CONTINUE_HERE = chr(_PUA_LAST)


class ChatTemplateError(OpenJetError, jinja2.exceptions.TemplateError):
    """The chat template rejected the conversation (its `raise_exception`) or failed on it: the request's
    fault, an HTTP 400. The message is the template's own."""


class ChatTemplateSyntaxError(ChatTemplateError):
    """The chat template does not compile: the model file's fault."""


@dataclass(frozen=True)
class RenderedPrompt:
    """A rendered prompt and the [start, end) spans of `text` that came from the caller's strings and
    spell a CONTROL token: encode with `tokenizer.encode(text, allow_special=True, literal_spans=...)`."""

    text: str
    literal_spans: tuple[tuple[int, int], ...] = ()


def _raise_exception(message: str):
    raise ChatTemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    # transformers' override: jinja2's own tojson escapes HTML characters and has no options.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _GenerationTag(Extension):
    """transformers' `{% generation %}...{% endgeneration %}` (AssistantTracker): renders the body, as a
    call block, so scoping is the same as in transformers."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller) -> str:
        return caller()


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template. `render` gives the prompt text, `render_prompt` the text and the spans of
    the caller's CONTROL-token look-alikes (see the module docstring)."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "", control_tokens: Iterable[str] = ()):
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.control_tokens = tuple(sorted({t for t in control_tokens if t}, key=lambda t: (-len(t), t)))
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            message = f"the chat template does not compile: {e.message} (line {e.lineno})"
            raise ChatTemplateSyntaxError(message) from None
        alternatives = [re.escape(t) for t in self.control_tokens] + [_PUA.pattern]
        # A caller's string that ends with the start of a control text ("<|im_end|") or begins with its end: the
        # template's own text beside it would complete the token (a tool call's name before the template's '>'), so
        # those ends are literal too (marking text literal changes no token: only special matches across it).
        heads = {t[:k] for t in self.control_tokens for k in range(2, len(t))}
        tails = {t[-k:] for t in self.control_tokens for k in range(2, len(t))}
        by_length = lambda texts: sorted(texts, key=lambda x: (-len(x), x))  # noqa: E731
        if heads:
            alternatives.append("(?:" + "|".join(map(re.escape, by_length(heads))) + r")\Z")
        if tails:
            alternatives.append(r"\A(?:" + "|".join(map(re.escape, by_length(tails))) + ")")
        self._defuse_pattern = re.compile("|".join(alternatives))
        self._literal_texts = frozenset(self.control_tokens) | heads | tails  # what becomes a literal span

    @classmethod
    def from_gguf(cls, source: GGUFFile | Mapping[str, object]) -> ChatTemplate:
        """From a `GGUFFile` or its metadata: `tokenizer.chat_template`, the bos/eos texts and the CONTROL
        token texts."""
        meta: Mapping[str, object] = getattr(source, "metadata", source)
        where = f"{source.path}: " if hasattr(source, "path") else ""
        text = meta.get("tokenizer.chat_template")
        if not isinstance(text, str) or not text.strip():
            raise ChatTemplateError(f"{where}the model file has no tokenizer.chat_template")
        tokens = meta.get("tokenizer.ggml.tokens") or []
        types = meta.get("tokenizer.ggml.token_type") or []

        def token_text(key: str) -> str:
            i = meta.get(f"tokenizer.ggml.{key}_token_id")
            return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else ""

        control = [t for t, k in zip(tokens, types) if k in (TokenType.CONTROL, TokenType.UNKNOWN)]
        try:
            return cls(text, bos_token=token_text("bos"), eos_token=token_text("eos"), control_tokens=control)
        except ChatTemplateError as e:
            raise type(e)(f"{where}{e}") from None

    # -------------------------------------------------------------------------------------------- render

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text for `messages` (OpenAI-style dicts) and `tools` (JSON schemas), as transformers'
        `apply_chat_template(..., tokenize=False)`. Raises ChatTemplateError with the template's message."""
        documents = template_kwargs.pop("documents", None)
        variables = {"bos_token": self.bos_token, "eos_token": self.eos_token}
        variables.update({k: v for k, v in template_kwargs.items() if v is not None})
        try:
            return self._template.render(
                messages=messages,
                tools=tools,
                documents=documents,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except ChatTemplateError:
            raise
        except Exception as e:  # UndefinedError, SecurityError, a TypeError from a filter...
            raise ChatTemplateError(f"the chat template failed on this conversation: {type(e).__name__}: {e}") from None

    def render_prompt(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **template_kwargs: Any,
    ) -> RenderedPrompt:
        """`render`, with the caller's CONTROL-token texts marked as literal (see the module docstring).
        `messages`, `tools` and the kwargs must be JSON-like: dicts, lists, strings, numbers, None.

        `continue_final_message` (transformers' and vLLM's name): the last message is the start of the
        assistant's answer (a prefill). The prompt writes that turn as the template writes it (a think block
        before the text, say) up to the end of its text, exactly as given, and leaves it open (no end of turn,
        no generation prompt), so the model continues the text."""
        originals: dict[str, str] = {}  # original text -> placeholder character

        def placeholder(m: re.Match) -> str:
            found = m.group()
            if found not in originals:
                if len(originals) >= _PUA_LAST - _PUA_FIRST:  # the last one is _CONTINUE_HERE
                    raise ChatTemplateError("too many distinct special-token texts in one request")
                originals[found] = chr(_PUA_FIRST + len(originals))
            return originals[found]

        def defuse(value: Any) -> Any:
            if isinstance(value, str):
                return self._defuse_pattern.sub(placeholder, value)
            if isinstance(value, Mapping):
                return {defuse(k): defuse(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return [defuse(v) for v in value]
            if value is None or isinstance(value, (bool, int, float)):
                return value
            # An object could carry text we cannot see (a pydantic model: pass model_dump()).
            raise TypeError(f"render_prompt takes JSON-like values (dict, list, str, number), not {type(value)}")

        try:
            safe_kwargs = {k: defuse(v) for k, v in template_kwargs.items()}
            safe_messages = defuse(list(messages))
            safe_tools = defuse(list(tools)) if tools is not None else None
        except RecursionError:  # (a tool call's arguments, decoded from a string, past the body's depth limit)
            raise ChatTemplateError("the conversation nests too deeply (a tool call's arguments?)") from None
        prefill = None
        if continue_final_message:
            prefill = _text_to_continue(safe_messages)
            # The template writes the turn around a marker: whatever it puts before the text (a closed think
            # block), and nothing it would trim from the text or put after it.
            safe_messages[-1] = {**safe_messages[-1], "content": _CONTINUE_HERE}
        back = {p: t for t, p in originals.items()}
        try:
            text = self.render(
                safe_messages,
                tools=safe_tools,
                add_generation_prompt=add_generation_prompt and not continue_final_message,
                **safe_kwargs,
            )
            if prefill is not None:
                if text.count(_CONTINUE_HERE) != 1:
                    raise ChatTemplateError(
                        "the chat template does not write the last assistant message's text once, so the answer "
                        "cannot continue it"
                    )
                text = text[: text.index(_CONTINUE_HERE)] + prefill
        except ChatTemplateError as e:
            message = _PUA.sub(lambda m: back.get(m.group(), m.group()), str(e))
            raise type(e)(message) from None
        if not back:
            return RenderedPrompt(text)
        pieces: list[str] = []
        spans: list[tuple[int, int]] = []
        pos = length = 0
        for m in _PUA.finditer(text):
            original = back.get(m.group())
            if original is None:  # the template's own private-use character
                continue
            pieces.append(text[pos : m.start()])
            length += m.start() - pos
            pieces.append(original)
            if original in self._literal_texts:  # not a private-use character of the caller's
                spans.append((length, length + len(original)))
            length += len(original)
            pos = m.end()
        pieces.append(text[pos:])
        return RenderedPrompt("".join(pieces), tuple(spans))


def _text_to_continue(messages: list[Any]) -> str:
    """The text of the last message when it is an assistant's answer that can be continued."""
    last = messages[-1] if messages else None
    if not isinstance(last, Mapping) or last.get("role") != "assistant":
        raise ChatTemplateError("continuing the answer needs the last message to be the assistant's")
    if last.get("tool_calls"):
        raise ChatTemplateError("the last assistant message has tool calls: send their results instead of "
                                "continuing it")
    content = last.get("content")
    if content is not None and not isinstance(content, str):
        raise ChatTemplateError("the assistant message to continue must have text content (a string)")
    return content or ""


# Keywords render() and render_prompt() set themselves: a template kwarg of one of these names would collide.
RESERVED_TEMPLATE_KWARGS = frozenset(
    name
    for method in (ChatTemplate.render, ChatTemplate.render_prompt)
    for name, p in inspect.signature(method).parameters.items()
    if p.kind is not p.VAR_KEYWORD
)
