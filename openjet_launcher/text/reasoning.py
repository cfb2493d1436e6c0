"""Qwen3.8's think block: where reasoning ends and the answer begins.

The generation prompt already opens the block (`<|im_start|>assistant\\n<think>\\n`), so the model
writes its reasoning, `</think>`, then the answer; with `enable_thinking=false` the prompt holds an
empty closed block and the output is all answer (spec qwen38.md §1.2). The rules, for a complete text:

* everything before `</think>` is reasoning, everything after is content;
* a `<think>` the model writes anyway (older Qwen3 templates had it emit one) is dropped, and in the
  content it opens a new think block: the text up to the next `</think>` is reasoning again
  (llama.cpp's XML tool-call parser collects such extra blocks the same way);
* a stray `</think>` in the content is dropped (llama.cpp does the same);
* both parts are stripped of surrounding whitespace, as llama.cpp does (`string_strip` of the
  reasoning, `consume_spaces` after `</think>`) and as our chat template does when it renders the
  turn back (`reasoning_content | trim`). vLLM's Qwen3 parser keeps the newlines, leaving a "\\n" at
  the end of the reasoning and "\\n\\n" at the start of the content.

`split_reasoning` states these rules for a complete text without tool calls; `OutputParser`
(output.py) applies them incrementally, together with tool calls, and must agree with it.
"""

from __future__ import annotations

import re

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

_THINK_TAG = re.compile(f"{re.escape(THINK_OPEN)}|{re.escape(THINK_CLOSE)}")


def split_reasoning(text: str, thinking: bool = True) -> tuple[str, str]:
    """(reasoning, content) of a complete output; `thinking` says whether the prompt opened the block."""
    parts: dict[bool, list[str]] = {True: [], False: []}
    in_think, start = thinking, 0
    for tag in _THINK_TAG.finditer(text):
        parts[in_think].append(text[start : tag.start()])
        in_think, start = tag.group() == THINK_OPEN, tag.end()
    parts[in_think].append(text[start:])
    return "".join(parts[True]).strip(), "".join(parts[False]).strip()
