"""The HTTP surfaces: routes, request limits, errors and ``Server-Timing``."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vllm_srun import __version__
from vllm_srun.plugins.decisions import (
    DecisionsRequest,
    describe_path,
    loads_checked,
    non_finite,
    parse_body,
    parse_request,
)
from vllm_srun.plugins.spec import RequestError

from . import schemas
from .runtime import ApiError, ClientGone, Planned, Runtime, Timing, requested_model

SURFACE_REQUESTS = {
    "embeddings": schemas.EmbeddingsRequest,
    "classify": schemas.ClassifyRequest,
    "rerank": schemas.RerankRequest,
}
SURFACE_OF_PATH = {
    "/v1/embeddings": "embeddings",
    "/v1/classify": "classify",
    "/v1/rerank": "rerank",
    "/v1/decisions": "decisions",
    "/v1/systemone": "decisions",
    "/v1/bundle": "bundle",
}
"""The ``surface`` label of requests refused before their route ran (400, 413)."""

BUNDLE_SURFACES = (*SURFACE_REQUESTS, "decisions")
"""The surface keys a bundle task may carry (exactly one)."""

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": schemas.ErrorResponse} for status in (400, 404, 413, 422, 429, 500, 503)
}


CLIENT_CLOSED = 499
"""Status recorded for a request whose client went away (nginx's "client closed request")."""


class JSON(Response):
    """A JSON response rendered with orjson (no NaN can appear: families refuse it first)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        """Serialise ``content``.

        orjson refuses a lone surrogate (a client may send ``"\\ud800"`` as a
        key or a name that comes back in an answer or an error message); the
        standard encoder then writes it as the same ``\\ud800`` escape.
        """
        try:
            return orjson.dumps(content)
        except TypeError:
            return json.dumps(content, ensure_ascii=True, allow_nan=False).encode("ascii")


class BodyTooLarge(StarletteHTTPException):
    """The request body is over ``--max-request-bytes``.

    An HTTP exception, because FastAPI turns any other exception raised while it
    reads the body into a 400 ``There was an error parsing the body``; its own
    handler below still answers (it is looked up before ``HTTPException``'s).
    """

    def __init__(self) -> None:
        super().__init__(status_code=413)


class Envelope:
    """ASGI middleware: the body limit before anything is buffered, and ``Server-Timing``.

    A ``Content-Length`` over the limit is answered 413 without reading the
    body; a chunked body is cut off as soon as it passes the limit. Every
    response without its own ``Server-Timing`` gets ``total``.
    """

    def __init__(
        self,
        app: ASGIApp,
        max_request_bytes: int,
        refused: Callable[[str, int, float], None] | None = None,
    ) -> None:
        self.app = app
        self.limit = max_request_bytes
        self.refused = refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await _too_large(send, self.limit)
                if self.refused is not None:
                    self.refused(scope.get("path", ""), 413, time.perf_counter() - started)
                return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLarge()
            return message

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                if not any(k == b"server-timing" for k, _ in headers):
                    total = (time.perf_counter() - started) * 1000
                    headers.append((b"server-timing", f"total;dur={total:.3f}".encode()))
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, limited_receive, timed_send)


async def _too_large(send: Send, limit: int) -> None:
    body = orjson.dumps(
        {"error": {"code": "request_too_large", "message": f"the body is over {limit} bytes"}}
    )
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"server-timing", b"total;dur=0.000"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _validation_message(err: RequestValidationError) -> str:
    """One line per problem: where it is and what is wrong."""
    problems = []
    for error in err.errors():
        location = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
        if error.get("type") == "extra_forbidden":
            problems.append(f"{location}: not a field of this request (check the spelling)")
            continue
        if error.get("type") == "json_invalid":
            context = error.get("ctx", {}).get("error", "")
            problems.append(f"malformed JSON: {context}".rstrip(": "))
            continue
        problems.append(f"{location or 'body'}: {error.get('msg', 'invalid')}")
    return "; ".join(dict.fromkeys(problems)) or "invalid request"


def parse_decisions(raw: bytes) -> DecisionsRequest:
    """A ``/v1/decisions`` body validated from its raw bytes (duplicate keys included).

    Raises:
        ApiError: 400 ``invalid_request``: not JSON, not an object, malformed,
            or no valid question (the message lists each reason).
    """
    try:
        return parse_body(raw)
    except RequestError as err:
        raise ApiError(err.code, err.message) from err


def bundle_duplicates(raw: bytes) -> list[tuple[str | int, ...]]:
    """The paths of every key given twice in a bundle body (read once for all its tasks).

    Raises:
        ApiError: 400 ``invalid_request`` when the body nests too deeply to read.
    """
    try:
        return loads_checked(raw, constants=True)[1]
    except RequestError as err:
        raise ApiError(err.code, err.message) from err


def bundle_decisions(
    payload: dict[str, Any], index: int, duplicates: list[tuple[str | int, ...]]
) -> DecisionsRequest:
    """A bundle task's ``decisions`` body validated, with the duplicate keys found under it.

    Raises:
        ApiError: 400 ``invalid_request`` (for this task only): the task gives
            ``decisions`` twice, holds NaN or Infinity, or fails validation.
    """
    prefix = ("tasks", index, "decisions")
    try:
        if prefix in duplicates:
            raise RequestError(
                "invalid_request", f"tasks[{index}] has the key 'decisions' more than once"
            )
        where = non_finite(payload)
        if where is not None:
            raise RequestError(
                "invalid_request",
                f"tasks[{index}].decisions.{describe_path(where)}: NaN and Infinity are not "
                "JSON numbers",
            )
        own = [d[len(prefix) :] for d in duplicates if d[: len(prefix)] == prefix]
        return parse_request(payload, own)
    except RequestError as err:
        raise ApiError(err.code, err.message) from err


def _openapi_with_decisions(app: FastAPI) -> Any:
    """``app.openapi`` that also documents the raw-body ``/v1/decisions`` request."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = build()
        extra = schemas.DecisionsRequest.model_json_schema(
            ref_template="#/components/schemas/{model}"
        )
        components = document.setdefault("components", {}).setdefault("schemas", {})
        for name, schema in extra.pop("$defs", {}).items():
            components.setdefault(name, schema)
        components["DecisionsRequest"] = extra
        app.openapi_schema = document
        return document

    return openapi


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
        version=__version__,
        description="Model runtime for semantic routers: encoder task models behind one contract.",
    )

    def refused(path: str, status: int, seconds: float) -> None:
        """Count a request answered before its route ran (a bad body, one too large)."""
        surface = SURFACE_OF_PATH.get(path)
        if surface is not None:
            count(model_label({}), surface, status, seconds)

    app.add_middleware(
        Envelope, max_request_bytes=runtime.config.max_request_bytes, refused=refused
    )
    app.openapi = _openapi_with_decisions(app)  # type: ignore[method-assign]
    metrics = runtime.metrics

    def respond(
        status: int, body: Any, timing: Timing | None = None, extra: dict[str, str] | None = None
    ) -> JSON:
        headers = {"server-timing": timing.header()} if timing is not None else {}
        return JSON(body, status_code=status, headers={**headers, **(extra or {})})

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> Response:
        # 429: the queue drains within a forward or two; 503: loading or draining takes longer.
        retry = {429: {"retry-after": "1"}, 503: {"retry-after": "5"}}.get(err.status)
        return respond(err.status, err.body(), getattr(request.state, "timing", None), retry)

    @app.exception_handler(BodyTooLarge)
    async def body_too_large(request: Request, err: BodyTooLarge) -> Response:
        refused(request.url.path, 413, 0.0)
        limit = runtime.config.max_request_bytes
        return respond(413, ApiError("request_too_large", f"the body is over {limit} bytes").body())

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> Response:
        refused(request.url.path, 400, 0.0)
        return respond(400, ApiError("invalid_request", _validation_message(err)).body())

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> Response:
        message = f"{request.method} {request.url.path}: {err.detail}"
        return respond(err.status_code, {"error": {"code": "invalid_request", "message": message}})

    @app.exception_handler(Exception)
    async def crashed(request: Request, err: Exception) -> Response:
        # Starlette answers this one outside the Envelope middleware, which would
        # otherwise add Server-Timing: set it here.
        timing = getattr(request.state, "timing", None) or Timing()
        return respond(500, ApiError("internal_error", f"{type(err).__name__}").body(), timing)

    async def answer(
        surface: str, request: Request, body: Any, timing: Timing | None = None
    ) -> Response:
        if timing is None:
            timing = Timing()
            request.state.timing = timing
        payload = body.model_dump(exclude_none=True) if hasattr(body, "model_dump") else body
        timing.add("parse", time.perf_counter() - timing.started)
        name = model_label(payload)
        status = 200
        try:
            planned = await runtime.plan(surface, payload, timing)
            name = planned.state.name
            runtime.submit([planned], timing)
            result = await runtime.wait(planned, request.is_disconnected)
            return respond(200, result, timing)
        except ApiError as err:
            status = err.status
            raise
        except ClientGone:
            status = CLIENT_CLOSED
            return Response(status_code=CLIENT_CLOSED)  # nobody reads it; nothing to log
        except Exception:
            status = 500
            raise
        finally:
            count(name, surface, status, time.perf_counter() - timing.started)

    def model_label(payload: Any) -> str:
        """A request's ``model`` label: a served model's ID, never text the client chose."""
        name = requested_model(payload)
        if name is None and len(runtime.models) == 1:
            return next(iter(runtime.models))
        return name if name in runtime.models else "-"

    def count(name: str, surface: str, status: int, seconds: float) -> None:
        metrics.requests.labels(model=name, surface=surface, status=str(status)).inc()
        metrics.request_duration.labels(model=name, surface=surface).observe(seconds)

    @app.post(
        "/v1/embeddings",
        response_model=None,
        responses={200: {"model": schemas.EmbeddingsResponse}, **ERROR_RESPONSES},
    )
    async def embeddings(request: Request, body: schemas.EmbeddingsRequest) -> Response:
        """OpenAI-compatible embeddings."""
        return await answer("embeddings", request, body)

    @app.post(
        "/v1/classify",
        response_model=None,
        responses={200: {"model": schemas.ClassifyResponse}, **ERROR_RESPONSES},
    )
    async def classify(request: Request, body: schemas.ClassifyRequest) -> Response:
        """Label distributions, label scores or token spans of a head."""
        return await answer("classify", request, body)

    @app.post(
        "/v1/rerank",
        response_model=None,
        responses={200: {"model": schemas.RerankResponse}, **ERROR_RESPONSES},
    )
    async def rerank(request: Request, body: schemas.RerankRequest) -> Response:
        """Documents by descending relevance to a query."""
        return await answer("rerank", request, body)

    async def decide(request: Request) -> Response:
        timing = Timing()
        request.state.timing = timing
        try:
            raw = await request.body()
        except ClientDisconnect:
            count(model_label({}), "decisions", CLIENT_CLOSED, time.perf_counter() - timing.started)
            return Response(status_code=CLIENT_CLOSED)
        loop = asyncio.get_running_loop()
        try:
            parsed = await loop.run_in_executor(runtime.executor, parse_decisions, raw)
        except ApiError as err:
            count(model_label({}), "decisions", err.status, time.perf_counter() - timing.started)
            raise
        return await answer("decisions", request, parsed, timing)

    @app.post(
        "/v1/decisions",
        response_model=None,
        responses={200: {"model": schemas.DecisionsResponse}, **ERROR_RESPONSES},
        openapi_extra=DECISIONS_BODY,
    )
    async def decisions(request: Request) -> Response:
        """System One questions (Choice, Noul, Score) about a state."""
        return await decide(request)

    @app.post(
        "/v1/systemone",
        response_model=None,
        responses={200: {"model": schemas.DecisionsResponse}, **ERROR_RESPONSES},
        openapi_extra=DECISIONS_BODY,
    )
    async def systemone(request: Request) -> Response:
        """The same as ``/v1/decisions``."""
        return await decide(request)

    @app.post(
        "/v1/bundle",
        response_model=None,
        responses={200: {"model": schemas.BundleResponse}, **ERROR_RESPONSES},
    )
    async def bundle(request: Request, body: schemas.BundleRequest) -> Response:
        """Several surface requests in one call; results in task order, each with its status."""
        timing = Timing()
        request.state.timing = timing
        limit = runtime.config.max_bundle_tasks
        if len(body.tasks) > limit:
            refused(request.url.path, 413, time.perf_counter() - timing.started)
            raise ApiError(
                "request_too_large", f"the bundle has {len(body.tasks)} tasks; at most {limit}"
            )
        tasks: list[tuple[str, str, Any]] = []
        for index, task in enumerate(body.tasks):
            surfaces = [s for s in BUNDLE_SURFACES if getattr(task, s) is not None]
            if len(surfaces) != 1:
                refused(request.url.path, 400, time.perf_counter() - timing.started)
                raise ApiError(
                    "invalid_request",
                    f"tasks[{index}] ({task.id}) must have exactly one of "
                    f"{', '.join(BUNDLE_SURFACES)}",
                )
            value = getattr(task, surfaces[0])
            payload = value.model_dump(exclude_none=True) if hasattr(value, "model_dump") else value
            tasks.append((task.id, surfaces[0], payload))
        loop = asyncio.get_running_loop()
        duplicates: list[tuple[str | int, ...]] = []
        if any(t[1] == "decisions" for t in tasks):
            raw = await request.body()
            duplicates = await loop.run_in_executor(runtime.executor, bundle_duplicates, raw)
        timing.add("parse", time.perf_counter() - timing.started)
        default_deadline = body.options.deadline_ms if body.options else None

        async def plan_task(index: int, surface: str, payload: Any) -> Planned:
            if surface == "decisions":
                payload = await loop.run_in_executor(
                    runtime.executor, bundle_decisions, payload, index, duplicates
                )
            return await runtime.plan(surface, payload, timing)

        outcomes: list[Any] = await asyncio.gather(
            *(plan_task(i, surface, payload) for i, (_, surface, payload) in enumerate(tasks)),
            return_exceptions=True,
        )
        planned_tasks = [o if isinstance(o, Planned) else None for o in outcomes]
        groups: dict[str, list[Planned]] = {}
        for outcome in outcomes:
            if isinstance(outcome, Planned):
                if outcome.deadline_ms is None:
                    outcome.deadline_ms = default_deadline
                groups.setdefault(outcome.state.name, []).append(outcome)
        for group in groups.values():
            try:
                runtime.submit(group, timing)
            except ApiError as err:
                for planned in group:
                    outcomes[outcomes.index(planned)] = err
        results = []
        for (task_id, surface, _), outcome in zip(tasks, outcomes, strict=True):
            if isinstance(outcome, Planned):
                try:
                    outcome = await runtime.wait(outcome, request.is_disconnected)
                except ApiError as err:
                    outcome = err
                except ClientGone:
                    # The client went away: its tasks still queued go with it.
                    for other in outcomes:
                        if isinstance(other, Planned) and other.job is not None:
                            assert other.state.scheduler is not None
                            other.state.scheduler.cancel(other.job)
                    elapsed = time.perf_counter() - timing.started
                    for (_, surface, payload), plan in zip(tasks, planned_tasks, strict=True):
                        name = plan.state.name if plan is not None else model_label(payload)
                        count(name, surface, CLIENT_CLOSED, elapsed)
                    return Response(status_code=CLIENT_CLOSED)
            if isinstance(outcome, ApiError):
                results.append(
                    {"id": task_id, "status": outcome.status, "error": outcome.body()["error"]}
                )
            elif isinstance(outcome, BaseException):
                error = ApiError("internal_error", type(outcome).__name__)
                results.append({"id": task_id, "status": 500, "error": error.body()["error"]})
            else:
                results.append({"id": task_id, "status": 200, surface: outcome})
        elapsed = time.perf_counter() - timing.started
        for (_, surface, payload), plan, result in zip(tasks, planned_tasks, results, strict=True):
            name = plan.state.name if plan is not None else model_label(payload)
            count(name, surface, result["status"], elapsed)
        return respond(200, {"results": results}, timing)

    @app.get("/v1/models", response_model=None, responses={200: {"model": schemas.ModelsResponse}})
    async def models() -> Response:
        """Every model's card, the process limits and the active plugins."""
        plugins = [
            {"name": p.name, "distribution": p.distribution, "version": p.version, "error": p.error}
            for p in runtime.catalog.plugins
        ]
        return respond(
            200,
            {
                "object": "list",
                "api_version": schemas.API_VERSION,
                "limits": {
                    "max_bundle_tasks": runtime.config.max_bundle_tasks,
                    "max_request_bytes": runtime.config.max_request_bytes,
                },
                "plugins": plugins,
                "data": runtime.cards(),
            },
        )

    @app.get(
        "/health",
        response_model=None,
        responses={200: {"model": schemas.HealthResponse}, 503: {"model": schemas.HealthResponse}},
    )
    async def health() -> Response:
        """200 only when every model is ready; 503 with per-model states otherwise."""
        status, body = runtime.health()
        return respond(status, body)

    @app.get("/health/live", response_model=None, responses={200: {"model": schemas.LiveResponse}})
    async def live() -> Response:
        """200 while the process serves HTTP."""
        return respond(200, {"status": "alive", "api_version": schemas.API_VERSION})

    @app.get("/metrics", response_model=None, response_class=PlainTextResponse)
    async def prometheus() -> Response:
        """Prometheus text exposition."""
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
