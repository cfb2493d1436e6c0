"""Limits that keep one client from starving the others, and where each is enforced.

Design note (the numbers live in ServerSettings; `serve --help` lists them).
* Connections: `LimitsProtocol` (uvicorn's h11 protocol, subclassed) decides when a connection opens: past
  max_connections open ones, its requests are answered 503 (in the endpoint's error format, with
  `Connection: close`) without reaching the app. Connections already served keep being served through a
  flood (uvicorn's own `limit_concurrency` would answer everyone 503 while too many are open); service
  resumes for newcomers as soon as others close.
* Time for a request to arrive: `LimitsProtocol` again, with one timer per request,
  started when the connection opens (or at the first byte of the next request on a kept-alive one) and
  stopped once the whole body is in. When it fires the client gets a 408 (if nothing was answered yet) and
  the connection is closed; a handler still reading the body sees a disconnect. One timer covers slow
  headers, slow bodies, and bodies the app never reads (after an early 401/413). It lives in the protocol
  because ASGI middleware never sees a request whose headers are incomplete.
* Idle keep-alive connections: uvicorn's `timeout_keep_alive`.
* A client that stops reading what it is sent: `LimitsProtocol` again. When the socket's write buffer stays full
  (asyncio's pause_writing) and none of it is taken for twice stall_timeout_s (the stream's own stall cancel comes
  first, worker.Channel), the connection is aborted: uvicorn's send() otherwise waits for it for ever, holding the
  connection, its body bytes in flight, and a graceful shutdown. A slow reader that keeps taking bytes is not cut.
* Bytes in flight: `LimitsMiddleware` (ASGI) counts the body bytes of every request from its arrival to its
  end (a declared Content-Length up front, chunked bodies as they come); past max_inflight_bytes the request
  is a 503 with `Connection: close`, so its unread body is not drained.
* Elsewhere: body size (413, body.py), max_tokens ceiling (core.token_budget), queue length (worker.submit),
  a stream reader that stops reading (worker.Channel).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import APIError, error_json, send_error
from .settings import ServerSettings

CLOSE = (b"connection", b"close")      # an over-limit answer closes its connection: its unread body is not drained


def uvicorn_options(settings: ServerSettings) -> dict:
    """Keyword arguments for uvicorn.Config / uvicorn.run that apply the connection-level limits."""
    protocol = type("LimitsProtocol", (LimitsProtocol,), {"request_timeout_s": settings.request_timeout_s,
                                                          "max_connections": settings.max_connections,
                                                          # after the stream's own stall cancel (worker.Channel:
                                                          # that frees the engine and counts the stall), a backstop
                                                          "write_stall_s": 2 * settings.stall_timeout_s})
    return {"http": protocol, "timeout_keep_alive": settings.keep_alive_s}


# ------------------------------------------------------------------------- connections, arrival timer

class LimitsProtocol(H11Protocol):
    request_timeout_s: float = 60.0
    max_connections: int = 128
    write_stall_s: float = 60.0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._arrival: asyncio.TimerHandle | None = None
        self._stalled: asyncio.TimerHandle | None = None
        self._stall_left = 0  # bytes waiting in the write buffer at the stall timer's last look

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stalled is None:
            self._stall_left = self.transport.get_write_buffer_size()
            self._stalled = self.loop.call_later(self.write_stall_s, self._write_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stop_stall_timer()

    def _stop_stall_timer(self) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    def _write_stalled(self) -> None:
        """write_stall_s with the buffer full: if the client took some of it meanwhile (a slow reader of a large
        body), wait again; if it took nothing, abort (close() would wait to flush the very bytes it does not read);
        connection_lost then marks the cycle disconnected, wakes its send() and its sends drop."""
        left = self.transport.get_write_buffer_size()
        if left < self._stall_left:
            self._stall_left = left
            self._stalled = self.loop.call_later(self.write_stall_s, self._write_stalled)
            return
        self._stalled = None
        self.transport.abort()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)     # self.connections now holds this one too
        if len(self.connections) > self.max_connections:
            self.app = self._over_limit
        self._watch_arrival()

    async def _over_limit(self, scope, receive, send) -> None:
        await send_error(send, scope["path"], 503, f"the server is serving {self.max_connections} connections "
                                                   f"already; retry later", "too_many_connections", [CLOSE])

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_arrival()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_arrival()

    def connection_lost(self, exc) -> None:
        self._stop_timer()
        self._stop_stall_timer()
        super().connection_lost(exc)

    def _arriving(self) -> bool:
        """A request is on its way: its body is coming, or bytes of its head came (uvicorn's keep-alive timer
        is off once any byte arrives) or the connection has just opened."""
        if self.transport.is_closing():
            return False
        state = self.conn.their_state
        return state is h11.SEND_BODY or (state is h11.IDLE and self.timeout_keep_alive_task is None)

    def _watch_arrival(self) -> None:
        if not self._arriving():
            self._stop_timer()
        elif self._arrival is None:            # started once per request: the deadline counts from its start
            self._arrival = self.loop.call_later(self.request_timeout_s, self._arrival_timeout)

    def _stop_timer(self) -> None:
        if self._arrival is not None:
            self._arrival.cancel()
            self._arrival = None

    def _arrival_timeout(self) -> None:
        self._arrival = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        waiting_head = self.conn.their_state is h11.IDLE
        if waiting_head or (cycle is not None and not cycle.response_started):
            path = None if waiting_head or cycle is None else cycle.scope["path"]
            body = error_json(path, 408, f"the request did not arrive within {self.request_timeout_s:g} s",
                              "request_timeout")
            self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                                 b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True          # the handler's receive() now says http.disconnect; its sends drop
            cycle.message_event.set()
        self.transport.close()


# ------------------------------------------------------------------------------------ bytes in flight

class InflightLimit(APIError):
    def __init__(self, limit: int):
        super().__init__(503, f"the server is holding {limit} bytes of request bodies already; retry later",
                         code="server_busy")


class LimitsMiddleware:
    """Pure ASGI: counts request body bytes over all connections (see the design note)."""

    def __init__(self, app, max_inflight_bytes: int, max_body_bytes: int,
                 on_refused: Callable[[str], object] = lambda path: None):
        self.app = app
        self.max_inflight = max_inflight_bytes
        self.max_body = max_body_bytes
        self.on_refused = on_refused           # hears the path of each request refused here (for the metrics)
        self.inflight = 0                      # bytes of the bodies of requests being served

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = _content_length(scope)
        held = declared if declared <= self.max_body else 0     # a larger one is a 413 without being read
        if self.inflight + held > self.max_inflight:
            self.on_refused(scope["path"])
            return await send_error(send, scope["path"], 503, InflightLimit(self.max_inflight).message,
                                    "server_busy", [CLOSE])
        self.inflight += held
        received, over = 0, False

        async def counted_receive():
            nonlocal held, received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                extra = min(received, self.max_body) - held        # past max_body body.py answers 413
                if extra > 0:
                    if self.inflight + extra > self.max_inflight:
                        over = True
                        raise InflightLimit(self.max_inflight)
                    self.inflight += extra
                    held += extra
            return message

        async def closing_send(message):
            if over and message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), CLOSE]}
            await send(message)

        try:
            await self.app(scope, counted_receive, closing_send)
        finally:
            self.inflight -= held


def _content_length(scope) -> int:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return max(0, int(value))
            except ValueError:
                return 0                        # body.py answers 400
    return 0
