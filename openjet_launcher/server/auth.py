"""API keys: `Authorization: Bearer KEY` or `x-api-key: KEY` on every path but /health (401 otherwise, in the
error format of the path's API surface). A pure ASGI middleware, so streaming responses pass through untouched."""

from __future__ import annotations

import hmac
from collections.abc import Callable

from .errors import send_error


class APIKeyMiddleware:
    OPEN_PATHS = frozenset({"/health"})

    def __init__(self, app, api_key: str, on_refused: Callable[[str], object] = lambda path: None):
        self.app = app
        self._key = api_key.strip().encode()  # header values arrive stripped: a key's stray newline matched none
        self.on_refused = on_refused           # hears the path of each request refused here (for the metrics)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in self.OPEN_PATHS or self._authorized(scope):
            return await self.app(scope, receive, send)
        self.on_refused(scope["path"])
        await send_error(send, scope["path"], 401, "a valid API key is required: send 'Authorization: Bearer KEY' "
                                                   "or 'x-api-key: KEY'", "invalid_api_key",
                         [(b"www-authenticate", b"Bearer")])

    def _authorized(self, scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                if hmac.compare_digest(value[7:].strip(), self._key):
                    return True
            elif name == b"x-api-key" and hmac.compare_digest(value.strip(), self._key):
                return True
        return False
