"""HTTP errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`, or Anthropic's on its paths;
never a traceback."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import OpenJetError
from ..sampling import SamplingError
from ..text.chat import ChatTemplateError

log = logging.getLogger("openjet.server")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
          429: "rate_limit_error", 500: "server_error", 503: "service_unavailable"}

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def escape_for_log(text: object, limit: int = 500) -> str:
    """Request text made safe for a console: control characters (ANSI escapes, newlines, bidi overrides)
    as \\xNN / \\uNNNN, cut to `limit` characters."""
    s = str(text)
    if len(s) > limit:
        s = s[:limit] + f"...({len(s) - limit} more chars)"
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                        else f"\\u{ord(m.group()):04x}", s)


class APIError(Exception):
    """An error answered to the client as is."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or _TYPES.get(status, "invalid_request_error")

    def body(self) -> dict:
        return error_body(self.status, self.message, param=self.param, code=self.code, type=self.type)


class EngineFailure(APIError):
    """A job the worker accepted failed while generating (the worker counts it as failed, not as rejected)."""


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None,
               type: str | None = None) -> dict:
    return {"error": {"message": message, "type": type or _TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def error_response(status: int, message: str, **kw) -> JSONResponse:
    return JSONResponse(error_body(status, message, **kw), status_code=status)


# Anthropic's surface answers errors in its own shape: {"type": "error", "error": {"type", "message"}}.
ANTHROPIC_PATH = "/v1/messages"
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
                    429: "rate_limit_error", 500: "api_error", 503: "overloaded_error", 529: "overloaded_error"}


def anthropic_error_body(status: int, message: str) -> dict:
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def is_anthropic_path(path: str | None) -> bool:
    return bool(path) and (path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/"))


def error_json(path: str | None, status: int, message: str, code: str | None = None) -> bytes:
    """An error body in the format of the API surface `path` belongs to, for answers given before the app's
    exception handlers (ASGI middleware, the connection protocol); `path` None (no request yet) is OpenAI's."""
    if is_anthropic_path(path):
        return json.dumps(anthropic_error_body(status, message)).encode()
    return json.dumps(error_body(status, message, code=code)).encode()


async def send_error(send, path: str | None, status: int, message: str, code: str,
                     headers: list[tuple[bytes, bytes]] = ()) -> None:
    """Answer an ASGI request with `error_json` (and `headers`) from outside the app."""
    body = error_json(path, status, message, code)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


def _in_endpoint_shape(handler):
    """An exception handler whose OpenAI-shaped answer is re-shaped on Anthropic's paths, so every error
    there (validation, limits, 404/405, engine failures) reads as Anthropic's SDK expects."""
    async def handle(request, e):
        response = await handler(request, e)
        if not (isinstance(response, JSONResponse) and is_anthropic_path(request.url.path)):
            return response
        message = json.loads(response.body).get("error", {}).get("message", "error")
        headers = {k: v for k, v in response.headers.items() if k not in ("content-length", "content-type")}
        return JSONResponse(anthropic_error_body(response.status_code, message), status_code=response.status_code,
                            headers=headers)
    return handle


_SCALAR_BRANCHES = frozenset({"str", "int", "float", "bool", "bytes", "none"})


def _is_branch(part: object) -> bool:
    """Whether a part of an error's location names a member of a union (`str`, `list[int]`, a model's class
    name) rather than a field or an index."""
    return isinstance(part, str) and (part in _SCALAR_BRANCHES or "[" in part or part[:1].isupper())


def _union_root(loc: tuple) -> tuple:
    """The location of the field an error is about, up to its first union member."""
    return next((loc[:i] for i, part in enumerate(loc) if _is_branch(part)), loc)


def _field(loc: tuple) -> tuple:
    """An error's location without its union members: the place in the request as the client wrote it."""
    return tuple(part for part in loc if not _is_branch(part))


def validation_message(e: ValidationError | RequestValidationError) -> tuple[str, str | None]:
    """The first problem of a validation error as one line, and its location as the `param`.

    A field of several types (a string or a list of parts) fails once per type. The problem reported is the one
    of the type that applies: a message of our own validators first (they speak of the value as sent), else the
    type that got furthest into the value; when no type applies, the types it could have been."""
    errors = [(x, tuple(p for p in x.get("loc", ()) if p != "body")) for x in e.errors()]
    if not errors:
        return "invalid request", None
    roots = list(dict.fromkeys(_union_root(loc) for _, loc in errors))      # the fields with problems
    alternatives = [(x, loc) for x, loc in errors if _union_root(loc) == roots[0]]
    best, loc = max(alternatives, key=lambda a: (a[0].get("type") == "value_error", len(a[1])))
    msg = best.get("msg", "invalid value")
    if best.get("type") != "value_error":
        others = [x.get("msg", "") for x, other in alternatives
                  if x is not best and len(other) == len(loc) and _field(other) == _field(loc)]
        msg = " or ".join([msg, *dict.fromkeys(m.removeprefix("Input should be ") for m in others)])
    extra = f" (and {len(roots) - 1} more problems)" if len(roots) > 1 else ""
    where = ".".join(map(str, _field(loc)))
    return (f"{where}: {msg}{extra}" if where else msg + extra), (where or None)


def install_error_handlers(app: FastAPI, on_error: Callable[[Request, Exception], object] = lambda request, e: None
                           ) -> None:
    """The app's error answers; `on_error` hears of each (for the metrics)."""
    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def _request_validation(request: Request, e: RequestValidationError):
        message, param = validation_message(e)
        return error_response(400, message, param=param)

    @app.exception_handler(ValidationError)
    async def _validation(request: Request, e: ValidationError):
        message, param = validation_message(e)
        return error_response(400, message, param=param)

    @app.exception_handler(ChatTemplateError)
    async def _template(request: Request, e: ChatTemplateError):
        return error_response(400, str(e), code="chat_template_error")

    @app.exception_handler(SamplingError)
    async def _sampling(request: Request, e: SamplingError):
        return error_response(400, str(e), code="invalid_sampling_parameter")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException):
        return JSONResponse(error_body(e.status_code, str(e.detail)), status_code=e.status_code,
                            headers=getattr(e, "headers", None))

    @app.exception_handler(OpenJetError)
    async def _openjet(request: Request, e: OpenJetError):
        log.error("request failed: %s", escape_for_log(e))
        return error_response(500, str(e))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception):
        log.exception("unexpected error on %s", escape_for_log(request.url.path))
        return error_response(500, f"internal error ({type(e).__name__})")

    def reported(handler):
        async def handle(request, e):
            on_error(request, e)
            return await handler(request, e)
        return handle

    for exc_class, handler in list(app.exception_handlers.items()):
        app.exception_handlers[exc_class] = reported(_in_endpoint_shape(handler))
