"""Property-based fuzzing against the server's own OpenAPI schema (schemathesis over a live loopback server on a
scripted engine): for every operation a bounded, derandomized set of generated requests, valid and invalid
by the schema; none may get a 5xx, and the server answers correctly afterwards."""

from __future__ import annotations

import os

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402

from openjet_launcher.server import ServerSettings, create_app  # noqa: E402

from .conftest import LiveServer  # noqa: E402
from .scripted import ScriptedEngine  # noqa: E402

EXAMPLES = int(os.environ.get("OPENJET_FUZZ_EXAMPLES", 100))     # per operation; set higher for a long hunt


@pytest.fixture(scope="module")
def fuzzed(text_layer):
    tokenizer, template = text_layer
    engine = ScriptedEngine(tokenizer.n_vocab, tokenizer.encode("a b c d"))
    # A short context and output ceiling: generated max_tokens values are large, the answers need not be.
    settings_ = ServerSettings(model_id="m", n_ctx=512, max_tokens_ceiling=8, max_body_bytes=200_000)
    with LiveServer(create_app(engine, tokenizer, template, settings_)) as s:
        yield s


@pytest.fixture(scope="module")
def api_schema(fuzzed):
    return schemathesis.openapi.from_url(fuzzed.base + "/openapi.json")


def test_the_schema_describes_the_request_bodies(fuzzed):
    spec = httpx.get(fuzzed.base + "/openapi.json").json()
    for path in ("/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"):
        assert "requestBody" in spec["paths"][path]["post"], path


@pytest.mark.parametrize("mode", list(GenerationMode), ids=lambda m: m.value)
def test_no_generated_request_gets_a_5xx(api_schema, mode):
    """Valid (positive) and schema-violating (negative) requests for every operation. Strategies are drawn
    directly (not through schemathesis' pytest plugin, which breaks on pytest 9.2's node ids)."""
    operations = [result.ok() for result in api_schema.get_all_operations()]
    if mode is GenerationMode.NEGATIVE:          # nothing to violate in a request without a body
        operations = [op for op in operations if len(op.body)]
    assert len(operations) >= 7
    for operation in operations:
        @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=mode))
        def check(case):
            response = case.call(timeout=30)
            assert response.status_code < 500, (case.method, case.path, case.body, response.status_code,
                                                 response.text[:300])

        check()


def test_the_server_is_healthy_after_fuzzing(fuzzed):
    assert httpx.get(fuzzed.base + "/health").status_code == 200
    r = httpx.post(fuzzed.base + "/v1/completions", json={"prompt": "hello", "max_tokens": 4}, timeout=30)
    tok = fuzzed.core.tokenizer
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == tok.decode(tok.encode("a b c d")[:4])
