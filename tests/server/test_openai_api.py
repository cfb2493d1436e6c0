"""The OpenAI surface on the tiny synthetic model, through the real `openai` SDK against a live server."""

from __future__ import annotations

import httpx
import openai
import pytest


MESSAGES = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def client(tiny_server):
    return openai.OpenAI(base_url=tiny_server.base + "/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_health_props_and_metrics(tiny_server):
    assert httpx.get(tiny_server.base + "/health").json() == {"status": "ok"}
    props = httpx.get(tiny_server.base + "/props").json()
    assert props["n_ctx"] == 1024 and "api_key" not in props["settings"]
    metrics = httpx.get(tiny_server.base + "/metrics").text
    assert "openjet_requests_total" in metrics and "openjet_queue_depth 0" in metrics


def test_chat_completion_has_usage_and_timings(client):
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason in ("length", "stop")
    assert r.usage.completion_tokens <= 6 and r.usage.prompt_tokens > 10
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    timings = r.model_extra["timings"]
    assert timings["predicted_n"] == r.usage.completion_tokens
    assert timings["prompt_n"] + timings["cache_n"] == r.usage.prompt_tokens
    # thinking is on by default: the tiny model's random text is reasoning
    assert (choice.message.model_extra.get("reasoning_content") or "") + (choice.message.content or "")


def test_streamed_chat_follows_the_chunk_rules_and_equals_the_complete_answer(client):
    kwargs = dict(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0)
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    with_choices = [c for c in chunks if c.choices]
    assert [c.choices[0].finish_reason for c in with_choices[:-1]] == [None] * (len(with_choices) - 1)
    assert with_choices[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == whole.usage.completion_tokens
    reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in with_choices)
    content = "".join(c.choices[0].delta.content or "" for c in with_choices)
    assert reasoning == (whole.choices[0].message.model_extra.get("reasoning_content") or "")
    assert content == (whole.choices[0].message.content or "")


def test_stream_without_include_usage_has_no_usage_chunk(client):
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3, stream=True))
    assert all(c.choices for c in chunks)


def test_completions_stream_and_not(client):
    r = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason in ("length", "stop") and r.usage.completion_tokens <= 5
    streamed = list(client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=5,
                                              temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == r.choices[0].text
    assert streamed[-1].choices[0].finish_reason == r.choices[0].finish_reason


def test_seeded_sampling_repeats(client):
    kwargs = dict(model="tiny", prompt="abc", max_tokens=8, temperature=0.9, seed=5, extra_body={"top_k": 20})
    assert client.completions.create(**kwargs).choices[0].text == client.completions.create(**kwargs).choices[0].text


def test_tokenize_detokenize_round_trip(tiny_server):
    ids = httpx.post(tiny_server.base + "/tokenize", json={"content": "Hello world<|im_end|>"}).json()["tokens"]
    assert len(ids) >= 3
    text = httpx.post(tiny_server.base + "/detokenize", json={"tokens": ids}).json()["content"]
    assert text == "Hello world<|im_end|>"


def test_tokenize_gives_a_half_characters_bytes_and_runs_off_the_event_loop(tiny_server, monkeypatch):
    """A token holding half of a UTF-8 character comes back as its bytes (llama.cpp's form), not U+FFFD, and the
    pieces join to the text; the tokenizer runs in a thread (on the event loop a megabyte of text froze every stream
    and /health for seconds)."""
    import asyncio

    tokenizer = tiny_server.core.tokenizer
    real_encode, on_loop = tokenizer.encode, []

    def encode(*a, **kw):
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return real_encode(*a, **kw)
    monkeypatch.setattr(tokenizer, "encode", encode)
    pieces = httpx.post(tiny_server.base + "/tokenize",
                        json={"content": "\U0001F600x", "with_pieces": True}).json()["tokens"]
    assert on_loop == [False]
    joined = b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode() for p in pieces)
    assert joined.decode() == "\U0001F600x"
    assert all("\ufffd" not in p["piece"] for p in pieces if isinstance(p["piece"], str))
    assert [p["piece"] for p in pieces] == [[0xF0, 0x9F], [0x98, 0x80], "x"]   # the tiny model splits the emoji


def test_speculative_greedy_matches_plain_and_reports_drafts(tiny_server, client):
    # tiny_server runs with n_draft=2: greedy requests speculate; penalties switch it off (same tokens)
    r = client.completions.create(model="tiny", prompt="The sea", max_tokens=12, temperature=0)
    plain = client.completions.create(model="tiny", prompt="The sea", max_tokens=12, temperature=0,
                                      extra_body={"presence_penalty": 0.0, "frequency_penalty": 1e-9})
    assert r.model_extra["timings"]["draft_n"] > 0
    assert plain.model_extra["timings"]["draft_n"] == 0
    assert r.choices[0].text == plain.choices[0].text


def test_a_greedy_request_drafts_only_what_its_remaining_tokens_can_use(tiny_server, client):
    """A cycle emits its kept drafts and one token of its own: with one token left after the first, a plain step
    (a 1-draft cycle there could only cost); the text is the same either way."""
    r = client.completions.create(model="tiny", prompt="The sea", max_tokens=2, temperature=0)
    longer = client.completions.create(model="tiny", prompt="The sea", max_tokens=12, temperature=0)
    assert r.model_extra["timings"]["draft_n"] == 0 and r.usage.completion_tokens == 2
    assert longer.choices[0].text.startswith(r.choices[0].text)


def test_conversation_reuse_prefills_only_the_new_tokens_and_equals_a_fresh_run(tiny_server, client):
    first = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10, temperature=0)
    reply = first.choices[0].message
    turn2 = MESSAGES + [{"role": "assistant", "content": reply.content or "",
                         "reasoning_content": reply.model_extra.get("reasoning_content") or ""},
                        {"role": "user", "content": "And now in French."}]
    reused = client.chat.completions.create(model="tiny", messages=turn2, max_tokens=10, temperature=0)
    t = reused.model_extra["timings"]
    # Reused up to the checkpoint before the first prompt's last token: there itself, or where the engine's chunked
    # prefill keeps its checkpoints (the CUDA engine: the last multiple of its stride; worker.Slot.load_prompt)
    reusable = first.usage.prompt_tokens - 1
    g = tiny_server.core.worker.slots[0].engine.prefill_checkpoint_stride
    assert t["cache_n"] >= (reusable // g * g if g else reusable) > 0
    assert t["prompt_n"] == reused.usage.prompt_tokens - t["cache_n"]
    tiny_server.core.worker.slots[0].reset()          # the worker is idle between requests
    fresh = client.chat.completions.create(model="tiny", messages=turn2, max_tokens=10, temperature=0)
    assert fresh.model_extra["timings"]["cache_n"] == 0
    assert fresh.choices[0].message == reused.choices[0].message
