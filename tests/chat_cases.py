"""Conversations and the prompt pieces they render to under spec §1.2, shared by test_chat_template.py
(the real Qwen3.5 template and ours) and test_vocab.py (our template in the synthetic vocabularies)."""

from __future__ import annotations

TOOLS_INSTRUCTION = (
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested "
    "within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function call, "
    "but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current knowledge and "
    "do not tell the user about function calls\n</IMPORTANT>"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city, in °C",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
WEATHER_LINE = (  # json.dumps defaults: ", " and ": ", keys in order, non-ASCII kept
    '{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city, in °C", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}'
)
NOW = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
NOW_LINE = '{"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}'

SYSTEM_USER = [{"role": "system", "content": "  You are terse.\n"}, {"role": "user", "content": "\nHi there  "}]
HISTORY = [
    {"role": "user", "content": "First question"},
    {"role": "assistant", "content": "First answer", "reasoning_content": "first thoughts"},
    {"role": "user", "content": "Second question"},
    {"role": "assistant", "content": "Second answer", "reasoning_content": "\nsecond thoughts\n"},
    {"role": "user", "content": "Third question"},
]
TOOL_TURNS = [
    {"role": "user", "content": "Weather in Berlin and Paris for 3 days?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "I need the weather tool twice.",
        "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Berlin", "days": 3}}},
            {"function": {"name": "get_weather", "arguments": {"city": "Paris", "opts": {"unit": "C"}, "at": [8, 20]}}},
        ],
    },
    {"role": "tool", "content": '{"temp": 11}'},
    {"role": "tool", "content": ' {"temp": 14} '},
]  # fmt: skip
TOOL_TURNS_TEXT = (  # the assistant turn comes after the last real query, so it keeps its thinking
    "<|im_start|>user\nWeather in Berlin and Paris for 3 days?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nI need the weather tool twice.\n</think>\n\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nBerlin\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
    "</function>\n</tool_call>\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    '<parameter=opts>\n{"unit": "C"}\n</parameter>\n<parameter=at>\n[8, 20]\n</parameter>\n</function>\n</tool_call>'
    "<|im_end|>\n"
    '<|im_start|>user\n<tool_response>\n{"temp": 11}\n</tool_response>\n'
    '<tool_response>\n{"temp": 14}\n</tool_response><|im_end|>\n'
)
GENERATE = "<|im_start|>assistant\n<think>\n"
GENERATE_NO_THINKING = "<|im_start|>assistant\n<think>\n\n</think>\n\n"

REASONING_LOW = (
    "Reasoning effort is set to low. Keep your thinking brief and focused, moving directly to the conclusion "
    "without unnecessary elaboration."
)
