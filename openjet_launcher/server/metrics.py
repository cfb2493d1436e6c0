"""Counters for `/metrics` (Prometheus text format), updated by the worker and the handlers."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields


@dataclass
class Metrics:
    requests_total: int = 0             # generation requests accepted by the worker
    requests_failed_total: int = 0
    requests_cancelled_total: int = 0   # client gone or stream reader stalled
    requests_stalled_total: int = 0
    requests_rejected_total: int = 0    # generation requests answered 4xx/5xx before generating (not those
                                        # the connection limits refuse before HTTP: limits.LimitsProtocol)
    prompt_tokens_total: int = 0        # tokens prefilled (new)
    prompt_tokens_reused_total: int = 0 # tokens kept from the previous request (conversation reuse)
    generated_tokens_total: int = 0
    draft_tokens_total: int = 0
    draft_tokens_accepted_total: int = 0
    prompt_seconds_total: float = 0.0
    decode_seconds_total: float = 0.0
    last_prompt_tokens_per_second: float = 0.0
    last_predicted_tokens_per_second: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **deltas: float) -> None:
        with self._lock:
            for k, v in deltas.items():
                setattr(self, k, getattr(self, k) + v)

    def set(self, **values: float) -> None:
        with self._lock:
            for k, v in values.items():
                setattr(self, k, v)

    def render(self, gauges: dict[str, float]) -> str:
        """Prometheus exposition text: every counter, then the gauges given (queue depth, busy slots)."""
        lines = []
        with self._lock:
            for f in fields(self):
                if f.name.startswith("_"):
                    continue
                kind = "counter" if f.name.endswith("_total") else "gauge"
                name = f"openjet_{f.name}"
                lines += [f"# TYPE {name} {kind}", f"{name} {getattr(self, f.name)}"]
        for k, v in gauges.items():
            lines += [f"# TYPE openjet_{k} gauge", f"openjet_{k} {v}"]
        return "\n".join(lines) + "\n"
