"""The base models every API surface shares: strict requests, lenient responses."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

# Strict types (a wrong type is a 400 the client can act on), unknown fields ignored, no NaN or infinities.
STRICT = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class RequestModel(BaseModel):
    model_config = STRICT


class ResponseModel(BaseModel):
    model_config = ConfigDict(extra="allow")
