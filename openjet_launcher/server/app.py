"""The FastAPI application: routes of every API surface over one engine worker.

`create_app(engine, tokenizer, template, settings)`; `engine` may be a loaded Engine or a zero-argument
loader, run on the worker thread so the port answers (/health 503) while the model loads and warms up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse

from ..text.chat import ChatTemplate
from ..text.tokenizer import Tokenizer, TokenizerError
from .auth import APIKeyMiddleware
from .body import parse_request
from .core import ServerCore, n_valid_tokens
from .errors import APIError, EngineFailure, error_response, install_error_handlers
from .limits import LimitsMiddleware
from .metrics import Metrics
from .protocol.anthropic import CountTokensRequest, MessagesRequest
from .protocol.openai import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest, ModelCard, ModelList,
                              TokenizeRequest)
from .protocol.responses import ResponsesRequest
from .serving_chat import create_chat_completion
from .serving_completions import create_completion
from .serving_messages import register_messages
from .serving_responses import register_responses
from .settings import ServerSettings
from .worker import EngineWorker

log = logging.getLogger("openjet.server")

GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"})


def create_app(engine, tokenizer: Tokenizer, template: ChatTemplate | None,
               settings: ServerSettings | None = None, on_load_failed=None) -> FastAPI:
    """`on_load_failed(message)` is called on the worker thread when the loader raises, or when the engine breaks while
    serving (a reset after a failed request fails too): `serve` exits then."""
    settings = settings or ServerSettings()
    metrics = Metrics()
    worker = EngineWorker(engine, tokenizer, n_valid=n_valid_tokens(tokenizer), n_ctx=settings.n_ctx,
                          n_draft=settings.n_draft, max_queue=settings.max_queue, metrics=metrics,
                          on_load_failed=on_load_failed)
    core = ServerCore(worker, tokenizer, template, settings, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        worker.start()
        yield
        worker.stop()

    app = FastAPI(title="OpenJet", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.core = core

    def count_rejection(path: str) -> None:
        if path in GENERATION_PATHS:
            metrics.add(requests_rejected_total=1)

    def count_error(request: Request, e: Exception) -> None:
        # Every error answer on a generation path comes before its generation, except an accepted job's failure.
        if not isinstance(e, EngineFailure):
            count_rejection(request.url.path)

    install_error_handlers(app, count_error)
    app.add_middleware(LimitsMiddleware, max_inflight_bytes=settings.max_inflight_bytes,
                       max_body_bytes=settings.max_body_bytes, on_refused=count_rejection)
    if settings.api_key is not None and not settings.api_key.strip():  # an empty x-api-key header would match it
        raise ValueError("the API key is empty (only whitespace)")
    if settings.api_key:                   # added last: outermost, so a request without the key costs nothing
        app.add_middleware(APIKeyMiddleware, api_key=settings.api_key, on_refused=count_rejection)
    app.include_router(_routes(core))
    _describe_request_bodies(app, REQUEST_MODELS)
    return app


# Handlers parse their bodies themselves (server/body.py), so FastAPI cannot see the request models: the
# OpenAPI schema (for clients and the fuzz test) gets them from this table.
REQUEST_MODELS = {"/v1/chat/completions": ChatCompletionRequest, "/v1/completions": CompletionRequest,
                  "/tokenize": TokenizeRequest, "/detokenize": DetokenizeRequest,
                  "/v1/messages": MessagesRequest, "/v1/messages/count_tokens": CountTokensRequest,
                  "/v1/responses": ResponsesRequest}


def _describe_request_bodies(app: FastAPI, models: dict) -> None:
    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for path, model in models.items():
                operation = schema["paths"].get(path, {}).get("post")
                if operation is None:
                    continue
                prefix = model.__name__            # surfaces may reuse sub-model names (Tool, Message)
                body = model.model_json_schema(ref_template=f"#/components/schemas/{prefix}.{{model}}")
                components.update({f"{prefix}.{k}": v for k, v in body.pop("$defs", {}).items()})
                components[prefix] = body
                operation["requestBody"] = {"required": True, "content": {"application/json": {
                    "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


def _routes(core: ServerCore) -> APIRouter:
    r = APIRouter()
    s = core.settings

    @r.get("/health")
    async def health():
        if core.worker.load_error:
            return error_response(503, f"the model failed to load: {core.worker.load_error}")
        if core.worker.engine_error:
            return error_response(503, f"the engine failed and cannot serve: {core.worker.engine_error}")
        if not core.worker.ready.is_set():
            return JSONResponse({"status": "loading"}, status_code=503)
        return {"status": "ok"}

    @r.get("/v1/models")
    async def models():
        card = ModelCard(id=s.model_id, created=core.created,
                         meta={"n_ctx": s.n_ctx, "n_vocab": core.tokenizer.n_vocab, "engine": s.engine_name})
        return ModelList(data=[card]).model_dump(exclude_none=True)

    @r.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id != s.model_id:
            raise APIError(404, f"model {model_id!r} not found; this server serves {s.model_id!r}",
                           code="model_not_found")
        return ModelCard(id=s.model_id, created=core.created).model_dump(exclude_none=True)

    @r.post("/v1/chat/completions")
    async def chat(request: Request):
        return await create_chat_completion(core, request)

    @r.post("/v1/completions")
    async def completions(request: Request):
        return await create_completion(core, request)

    # The tokenizer runs in a thread, as for the generation routes: a megabyte of text takes it seconds, which on
    # the event loop froze every stream and /health (and made healthy readers look stalled).
    def piece(i: int) -> str | list[int]:
        """A token's text, or its bytes where they are not UTF-8 on their own (half a character), as llama.cpp's
        server gives them, instead of a replacement character."""
        raw = core.tokenizer.token_bytes(i)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return list(raw)

    @r.post("/tokenize")
    async def tokenize(request: Request):
        req = await parse_request(request, TokenizeRequest, s.max_body_bytes, s.max_json_depth)

        def run() -> dict:
            ids = core.tokenizer.encode(req.content, allow_special=req.parse_special)
            return {"tokens": [{"id": i, "piece": piece(i)} for i in ids] if req.with_pieces else ids}
        return await asyncio.to_thread(run)

    @r.post("/detokenize")
    async def detokenize(request: Request):
        req = await parse_request(request, DetokenizeRequest, s.max_body_bytes, s.max_json_depth)
        try:
            return {"content": await asyncio.to_thread(core.tokenizer.decode, req.tokens)}
        except TokenizerError as e:
            raise APIError(400, str(e), param="tokens") from None

    @r.get("/props")
    async def props():
        return {"model": s.model_id, "n_ctx": s.n_ctx, "engine": s.engine_name,
                "ready": core.worker.ready.is_set(), "settings": s.public(),
                "default_generation_settings": {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                                                "max_tokens": s.max_tokens_ceiling},
                "chat_template": core.template.source if core.template else None}

    @r.get("/metrics")
    async def metrics():
        w = core.worker
        text = core.metrics.render({"queue_depth": w.queue_depth, "requests_processing": w.busy,
                                    "ready": int(w.ready.is_set()), "n_ctx": s.n_ctx})
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    register_messages(r, core)
    register_responses(r, core)
    return r
