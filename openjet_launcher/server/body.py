"""Reading a JSON request body defensively: size limit (413), strict JSON (no NaN or Infinity), bounded
nesting, lone UTF-16 surrogates (a JSON "\\ud800" escape) replaced by U+FFFD; then a model validates it."""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from .errors import APIError, escape_for_log, validation_message

M = TypeVar("M", bound=BaseModel)
_SURROGATE = re.compile("[\ud800-\udfff]")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")


async def read_body(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > max_bytes:
                raise APIError(413, f"request body of {int(declared)} bytes is over the limit of {max_bytes} bytes",
                               code="request_too_large")
        except ValueError:
            raise APIError(400, "invalid Content-Length header") from None
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise APIError(413, f"request body is over the limit of {max_bytes} bytes", code="request_too_large")
            chunks.append(chunk)
    except ClientDisconnect:    # gone, or closed by the arrival timer (limits.py): nobody reads this answer
        raise APIError(400, "the connection closed before the request body arrived", code="client_disconnected") \
            from None
    return b"".join(chunks)


def clean_json(value: Any, max_depth: int) -> Any:
    """Surrogates -> U+FFFD in every string (keys too); raises ValueError past `max_depth` levels."""
    def walk(v: Any, depth: int) -> Any:
        if isinstance(v, str):
            return _SURROGATE.sub("\ufffd", v) if _SURROGATE.search(v) else v
        if isinstance(v, (dict, list)):
            if depth >= max_depth:
                raise ValueError(f"JSON nested deeper than {max_depth} levels")
            if isinstance(v, dict):
                return {walk(k, depth): walk(x, depth + 1) for k, x in v.items()}
            return [walk(x, depth + 1) for x in v]
        return v
    return walk(value, 0)


def parse_json(raw: bytes, max_depth: int) -> Any:
    if not raw.strip():
        raise APIError(400, "the request body is empty: expected a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(400, f"the request body is not UTF-8 ({e.reason} at byte {e.start})") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise APIError(400, f"JSON nested deeper than {max_depth} levels") from None
    except ValueError as e:
        raise APIError(400, f"the request body is not valid JSON: {e}") from None
    try:
        return clean_json(value, max_depth)
    except ValueError as e:
        raise APIError(400, str(e)) from None


async def parse_request(request: Request, model: type[M], max_bytes: int, max_depth: int) -> M:
    raw = await read_body(request, max_bytes)
    try:
        value = parse_json(raw, max_depth)
    except APIError as e:
        # The Content-Type is not enforced (curl -d sends a form type with JSON); it only explains a failure.
        kind = request.headers.get("content-type", "")
        if kind and "json" not in kind.lower():
            e.message += f" (the Content-Type is {escape_for_log(kind, 80)!r}: send JSON as application/json)"
        raise
    if not isinstance(value, dict):
        raise APIError(400, f"the request body must be a JSON object, not {type(value).__name__}")
    try:
        return model.model_validate(value)
    except ValidationError as e:
        message, param = validation_message(e)
        raise APIError(400, message, param=param) from None
