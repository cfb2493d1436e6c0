"""The server's settings: limits (on by default), sampling defaults and what `/props` may show."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..text.tool_calls import MAX_JSON_DEPTH


@dataclass
class ServerSettings:
    model_id: str = "qwen3.8"             # the id /v1/models lists and responses carry
    engine_name: str = "reference"
    host: str = "127.0.0.1"
    port: int = 8080
    n_ctx: int = 4096                     # tokens one sequence may hold: prompt + generated
    api_key: str | None = field(default=None, repr=False)   # never in /props or logs
    n_draft: int = 0                      # MTP drafts per step for greedy requests (0 = plain decoding)
    max_top_k: int | None = None          # 32 on the GPU engine: its sampler keeps the top 32 logits
    # Limits (server/limits.py says how each is enforced)
    max_connections: int = 128            # simultaneous connections served; a request on one more is a 503
    request_timeout_s: float = 60.0       # a request's headers and body must arrive within this (slowloris)
    keep_alive_s: float = 5.0             # an idle keep-alive connection is closed after this
    max_inflight_bytes: int = 64 << 20    # request bodies held at once over all connections; more is a 503
    max_body_bytes: int = 8 << 20         # a larger request body is a 413
    max_json_depth: int = MAX_JSON_DEPTH  # deeper nesting is a 400 (tool-call arguments: always this bound)
    max_tokens_ceiling: int = 32768       # per-request cap on max_tokens (a larger ask is clamped)
    max_queue: int = 64                   # requests waiting for the engine; more is a 503
    stall_timeout_s: float = 60.0         # a stream reader that takes nothing for this long is gone
    max_pending_events: int = 64          # events generated ahead of a slow stream reader before it counts as stalled
    max_stop_strings: int = 16
    max_stop_chars: int = 256

    def public(self) -> dict:
        """Everything but the API key (whose presence alone is shown)."""
        out = asdict(self)
        out.pop("api_key")
        out["api_key_required"] = self.api_key is not None
        return out
