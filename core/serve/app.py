"""The HTTP surfaces: the routes, each handing its validated request to the runtime.

The request envelope (body limit, ``Server-Timing``, error documents) lives in
:mod:`.envelope`, bundles in :mod:`.bundle`, responses and request accounting
in :mod:`.responses`, the pages (``GET /``, ``/docs``, ``/redoc``) in :mod:`.pages`.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any, cast

import yaml
from fastapi import FastAPI, Request
from starlette.requests import ClientDisconnect
from starlette.responses import PlainTextResponse, Response

from vllm_srun import __version__
from vllm_srun.plugins.cards import ModelCard
from vllm_srun.plugins.decisions.answers import AnsweredDecisions, DecisionsResponse
from vllm_srun.plugins.requests import (
    ClassifyRequest,
    EmbeddingsRequest,
    RerankRequest,
    SurfaceRequest,
)
from vllm_srun.plugins.responses import (
    ClassifyResponse,
    EmbeddingsResponse,
    ErrorResponse,
    RerankResponse,
)
from vllm_srun.plugins.spec import RequestError
from vllm_srun.service.model import ClientGone
from vllm_srun.service.runtime import Runtime

from . import jev, schemas
from .bundle import answer_bundle
from .encoding import decoded_body
from .envelope import Envelope, install_error_handlers
from .pages import install_pages
from .requests import ApiError, as_api_error, request_timing
from .responses import CLIENT_CLOSED, Accounting, plain_embeddings_refusal, respond
from .status import cards, health_document, model_card
from .systemone import SCHEMAS, Shape, read_systemone, reshape

RETRY_AFTER_HEADER = {
    "Retry-After": {
        "description": "Extension (a 2.3 client ignores it): seconds to wait before retrying.",
        "schema": {"type": "integer"},
    }
}
"""How the 429 and 503 answers document their ``Retry-After`` header."""

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse}
    | ({"headers": RETRY_AFTER_HEADER} if status in (429, 503) else {})
    for status in (400, 404, 413, 422, 429, 500, 503)
}


RAW_BODIES = (schemas.DecisionsRequest, schemas.SystemOneBatchRequest, schemas.BundleRequest)
"""Request bodies the routes read from their raw bytes, documented from these models
(a bundle's task bodies with the surface request schemas)."""


def _openapi_with_decisions(app: FastAPI) -> Any:
    """``app.openapi`` that also documents the raw-body requests (:data:`RAW_BODIES`), and
    names the runtime's own version beside the contract's (``info.x-runtime-version``)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = build()
        document["info"]["x-runtime-version"] = __version__
        components = document.setdefault("components", {}).setdefault("schemas", {})
        for model in RAW_BODIES:
            extra = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, schema in extra.pop("$defs", {}).items():
                components.setdefault(name, schema)
            components[model.__name__] = extra
        app.openapi_schema = document
        return document

    return openapi


SYSTEMONE_BATCH_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/SystemOneBatchRequest"}}
        },
    }
}

BUNDLE_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/BundleRequest"}}},
    }
}

SYSTEMONE_ERRORS: dict[int | str, dict[str, Any]] = {  # type: ignore[assignment]
    status: {
        "model": ErrorResponse | schemas.JevError,
        "description": "This runtime's error document; in the jev schema, Jev's detail "
        "object beside it.",
    }
    | ({"headers": RETRY_AFTER_HEADER} if status in (429, 503) else {})
    for status in (400, 404, 413, 429, 500, 502, 503, 504)
} | {
    422: {
        "model": ErrorResponse | schemas.JevValidationError,
        "description": "unsupported_surface; in the jev schema, a malformed body or an "
        "invalid question (Jev's detail list).",
    }
}
"""How the System One routes document their failures, in either schema."""

DECISIONS_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/DecisionsRequest"}}
        },
    }
}


def build_app(runtime: Runtime) -> FastAPI:
    """The FastAPI application serving ``runtime``'s models."""
    app = FastAPI(
        title="vllm-srun",
        version=schemas.API_VERSION,  # the wire contract; the runtime's own is x-runtime-version
        description=(
            "Model runtime for semantic routers: encoder task models behind one contract "
            f"(wire contract {schemas.API_VERSION}, served by vllm-srun {__version__})."
        ),
        docs_url=None,  # /docs and /redoc with their files served here (.pages), not a CDN's
        redoc_url=None,
    )

    accounting = Accounting(runtime)
    count, model_label = accounting.count, accounting.model_label
    app.add_middleware(
        Envelope,
        max_request_bytes=runtime.config.max_request_bytes,
        refused=accounting.refused,
        systemone_schema=runtime.config.systemone_schema,
    )
    install_error_handlers(app, runtime, accounting)
    app.openapi = _openapi_with_decisions(app)  # type: ignore[method-assign]
    install_pages(app, runtime)
    metrics = runtime.metrics

    async def answer(
        surface: str,
        request: Request,
        body: SurfaceRequest,
        shape: Shape | None = None,
    ) -> Response:
        timing = request_timing(request)
        timing.parsed()
        name = model_label(body)
        status = 200
        try:
            service = runtime.resolve(body.model)
            name = service.name
            call = await service.plan(surface, body, timing)
            service.admit([call])
            result = await service.answer(call, request.is_disconnected)
            refusal = plain_embeddings_refusal(body, result)
            if refusal is not None:
                raise refusal
            if shape is not None:  # only a decisions request has a shape
                return respond(200, reshape(cast(AnsweredDecisions, result), shape), timing)
            return respond(200, result, timing)
        except (ApiError, RequestError) as caught:
            err = as_api_error(caught)
            if shape is not None and shape.schema == jev.SCHEMA:
                err = jev.as_jev(err)
            status = err.status
            raise err from None
        except ClientGone:
            status = CLIENT_CLOSED
            return Response(status_code=CLIENT_CLOSED)  # nobody reads it; nothing to log
        except asyncio.CancelledError:
            status = 503  # cut off at the end of the shutdown grace: answered 503 not_ready
            raise
        except Exception:
            status = 500
            raise
        finally:
            count(name, surface, status, time.perf_counter() - timing.started)

    @app.post(
        "/v1/embeddings",
        response_model=None,
        responses={200: {"model": EmbeddingsResponse}, **ERROR_RESPONSES},
    )
    async def embeddings(request: Request, body: EmbeddingsRequest) -> Response:
        """OpenAI-compatible embeddings."""
        return await answer("embeddings", request, body)

    @app.post(
        "/v1/classify",
        response_model=None,
        responses={200: {"model": ClassifyResponse}, **ERROR_RESPONSES},
    )
    async def classify(request: Request, body: ClassifyRequest) -> Response:
        """Label distributions, label scores or token spans of a head."""
        return await answer("classify", request, body)

    @app.post(
        "/v1/rerank",
        response_model=None,
        responses={200: {"model": RerankResponse}, **ERROR_RESPONSES},
    )
    async def rerank(request: Request, body: RerankRequest) -> Response:
        """Documents by descending relevance to a query."""
        return await answer("rerank", request, body)

    async def decide(request: Request, systemone: bool = False, batch: bool = False) -> Response:
        """Read a decisions body from its raw bytes and answer it: ``/v1/decisions`` always in
        the current schema, the System One routes in the schema of the model the body names
        (:func:`~.systemone.target`)."""
        timing = request_timing(request)
        try:
            raw = await request.body()
        except ClientDisconnect:
            count(model_label({}), "decisions", CLIENT_CLOSED, time.perf_counter() - timing.started)
            return Response(status_code=CLIENT_CLOSED)
        loop = asyncio.get_running_loop()
        schema = runtime.config.systemone_schema if systemone else SCHEMAS[0]
        encoding = request.headers.get("content-encoding")
        if encoding is not None:
            limit = runtime.config.max_request_bytes
            try:
                raw = await loop.run_in_executor(
                    runtime.executor, decoded_body, raw, encoding, limit
                )
            except ApiError as err:
                count(
                    model_label({}), "decisions", err.status, time.perf_counter() - timing.started
                )
                raise (jev.as_jev(err) if schema == jev.SCHEMA else err) from None
        read = functools.partial(
            read_systemone, raw, runtime if systemone else None, schema, batch=batch
        )
        try:
            parsed, shape = await loop.run_in_executor(runtime.executor, read)
        except ApiError as err:
            count(model_label({}), "decisions", err.status, time.perf_counter() - timing.started)
            raise
        return await answer("decisions", request, parsed, shape)

    @app.post(
        "/v1/decisions",
        response_model=None,
        responses={200: {"model": DecisionsResponse}, **ERROR_RESPONSES},
        openapi_extra=DECISIONS_BODY,
    )
    async def decisions(request: Request) -> Response:
        """System One questions (Choice, Noul, Score) about a state."""
        return await decide(request)

    @app.post(
        "/v1/systemone",
        response_model=None,
        responses={
            200: {"model": DecisionsResponse | schemas.JevSystemOneResponse},
            **SYSTEMONE_ERRORS,
        },
        openapi_extra=DECISIONS_BODY,
    )
    async def systemone(request: Request) -> Response:
        """The same as ``/v1/decisions``, in the schema of the model it names (its
        models-file ``systemone_schema``, else ``--systemone-schema``)."""
        return await decide(request, systemone=True)

    @app.post(
        "/v1/systemone/batch",
        response_model=None,
        responses={
            200: {"model": schemas.SystemOneBatchResponse | schemas.JevBatchResponse},
            **SYSTEMONE_ERRORS,
        },
        openapi_extra=SYSTEMONE_BATCH_BODY,
    )
    async def systemone_batch(request: Request) -> Response:
        """The same questions about each of 1 to 64 states; one answer block per state."""
        return await decide(request, systemone=True, batch=True)

    @app.post(
        "/v1/bundle",
        response_model=None,
        responses={200: {"model": schemas.BundleResponse}, **ERROR_RESPONSES},
        openapi_extra=BUNDLE_BODY,
    )
    async def bundle(request: Request) -> Response:
        """Several surface requests in one call; results in task order, each with its status."""
        return await answer_bundle(runtime, accounting, request)

    @app.get("/v1/models", response_model=None, responses={200: {"model": schemas.ModelList}})
    async def models() -> Response:
        """Every model's card, the process limits and the active plugins; ``models`` lists
        the decision models as Jev clients read them (:func:`~.jev.models_list`)."""
        body: schemas.ModelList = {
            "object": "list",
            "api_version": schemas.API_VERSION,
            "limits": {
                "max_bundle_tasks": runtime.config.max_bundle_tasks,
                "max_request_bytes": runtime.config.max_request_bytes,
            },
            "plugins": [
                {
                    "name": p.name,
                    "distribution": p.distribution,
                    "version": p.version,
                    "error": p.error,
                }
                for p in runtime.catalog.plugins
            ],
            "data": cards(runtime),
            "models": jev.models_list(runtime),
        }
        return respond(200, body)

    @app.get(
        "/v1/models/{model_id:path}",
        response_model=None,
        responses={200: {"model": ModelCard}, 404: {"model": ErrorResponse}},
    )
    async def model(model_id: str) -> Response:
        """One model's card (OpenAI's retrieve-model call)."""
        return respond(
            200,
            model_card(runtime.served_state(model_id), runtime.catalog, runtime.config.max_inputs),
        )

    @app.get(
        "/health",
        response_model=None,
        responses={200: {"model": schemas.Health}, 503: {"model": schemas.Health}},
    )
    async def health() -> Response:
        """200 only when every model is ready; 503 with per-model states otherwise."""
        code, body = health_document(runtime)
        return respond(code, body)

    @app.get("/health/live", response_model=None, responses={200: {"model": schemas.Liveness}})
    async def live() -> Response:
        """200 while the process serves HTTP."""
        body: schemas.Liveness = {"status": "alive", "api_version": schemas.API_VERSION}
        return respond(200, body)

    @app.get("/openapi.yaml", include_in_schema=False)
    async def openapi_yaml() -> Response:
        """The OpenAPI document of ``/openapi.json``, as YAML (keys in the same order)."""
        text = yaml.safe_dump(app.openapi(), sort_keys=False, allow_unicode=True)
        return Response(text, media_type="application/yaml")

    @app.get("/metrics", response_model=None, response_class=PlainTextResponse)
    async def prometheus() -> Response:
        """Prometheus text exposition."""
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
