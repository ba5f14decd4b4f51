"""The request envelope: the body limit, ``Server-Timing``, the error documents, and
the requests in flight that the shutdown's :class:`~vllm_srun.service.drain.Drain` waits for.

Every error leaves as ``{"error": {"code", "message", "type", "param"}}`` (OpenAI's
``type`` and ``param`` beside the runtime's code and message) with the status of its
code; 429 and 503 carry ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vllm_srun.plugins.requests import validation_problems
from vllm_srun.plugins.responses import ErrorResponse
from vllm_srun.plugins.spec import RequestError, RequestErrorCode, clip
from vllm_srun.service.drain import SHUT_DOWN_MESSAGE, Drain
from vllm_srun.service.runtime import Runtime
from vllm_srun.service.timing import Timing

from . import jev
from .requests import ApiError, as_api_error, error_document, request_timing, validation_param
from .responses import Accounting, respond
from .schemas import JevErrorDocument

RETRY_AFTER = {429: {"retry-after": "1"}, 503: {"retry-after": "5"}}
"""429: the queue drains within a forward or two; 503: loading or draining takes longer."""


class BodyTooLarge(StarletteHTTPException):
    """The request body is over ``--max-request-bytes``.

    An HTTP exception, because FastAPI turns any other exception raised while it
    reads the body into a 400 ``There was an error parsing the body``; its own
    handler below still answers (it is looked up before ``HTTPException``'s).
    """

    def __init__(self) -> None:
        super().__init__(status_code=413)


access_log = logging.getLogger("vllm_srun.access")
"""One line per HTTP request: method, path, status, duration and client address,
never the request's text."""


def printable(value: str, limit: int = 200) -> str:
    """``value`` safe to put in one log line or one error message: control characters
    escaped (a ``%0a`` in a path cannot start a forged line), cut at ``limit``."""
    escaped = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in value)
    return clip(escaped, limit)


QUIET_PATHS = frozenset({"/health", "/health/live", "/metrics"})
"""Paths whose successful answers are logged at debug (health probes, metric scrapes)."""


def log_access(scope: Scope, status: int, started: float) -> None:
    """The access line of one answered request (``POST /v1/embeddings 200 12.3ms 10.0.0.7``)."""
    client = scope.get("client")
    address = client[0] if client else (scope.get("server") or ("unix",))[0]
    milliseconds = (time.perf_counter() - started) * 1000
    path = printable(str(scope.get("path", "-")))
    # probes and scrapes arrive every few seconds: at debug, so they never bury the requests
    quiet = path in QUIET_PATHS and (status < 500 or status == 503)  # 503: still loading
    level = logging.DEBUG if quiet else logging.INFO
    access_log.log(
        level,
        "%s %s %d %.1fms %s",
        scope.get("method", "-"),
        path,
        status,
        milliseconds,
        address,
        extra={
            "method": scope.get("method"),
            "path": path,
            "status": status,
            "duration_ms": round(milliseconds, 3),
            "client": address,
        },
    )


class Envelope:
    """ASGI middleware: the body limit before anything is buffered, ``Server-Timing``
    and the access log.

    Every request gets its :class:`~.requests.Timing` on arrival, in
    ``scope["state"]["timing"]`` (``request.state.timing`` for the routes and
    the error handlers). A ``Content-Length`` over the limit is answered 413
    without reading the body; a chunked body is cut off as soon as it passes
    the limit. Every response leaves with the full ``Server-Timing`` phase list
    (a response without its own gets the request's phases so far, zeros where a
    phase did not run); every request, refused ones included, gets one access
    line (:func:`log_access`).
    """

    def __init__(
        self,
        app: ASGIApp,
        max_request_bytes: int,
        refused: Callable[[str, int, float], None] | None = None,
        systemone_schema: str = "",
    ) -> None:
        self.app = app
        self.limit = max_request_bytes
        self.refused = refused
        self.schema = systemone_schema

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        timing = Timing(started=started)
        # A fresh state per request (a server may hand every request the same one), set
        # on the scope itself: Starlette's outermost error handler reads it too.
        scope["state"] = {**(scope.get("state") or {}), "timing": timing}
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await _too_large(send, self.limit, timing, jev.jev_path(scope["path"], self.schema))
                if self.refused is not None:
                    self.refused(scope.get("path", ""), 413, time.perf_counter() - started)
                log_access(scope, 413, started)
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
                log_access(scope, int(message["status"]), started)
                headers = list(message.get("headers", ()))
                if not any(k == b"server-timing" for k, _ in headers):
                    headers.append((b"server-timing", timing.header().encode()))
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, limited_receive, timed_send)


class InFlight:
    """ASGI middleware around the whole application: tells the process's
    :class:`~vllm_srun.service.drain.Drain` of every HTTP request (its arrival, the start
    of its response, the last byte of its answer), and answers 503 ``not_ready`` with
    ``Retry-After`` a request the drain cancelled when its grace ran out, whatever stage
    it was in (being read, tokenised, queued or in a forward).

    Args:
        app: the application (``build_app(runtime)``).
        drain: the process's drain (``runtime.drain``).
    """

    def __init__(self, app: ASGIApp, drain: Drain, systemone_schema: str = "") -> None:
        self.app = app
        self.drain = drain
        self.schema = systemone_schema

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        if scope["type"] != "http" or task is None:
            await self.app(scope, receive, send)
            return
        arrived = time.perf_counter()
        drain = self.drain
        drain.received(task)
        responding = False

        async def tracked_send(message: Message) -> None:
            nonlocal responding
            if message["type"] == "http.response.start":
                responding = True
                drain.responding(task)
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                drain.answered(task)  # before the last byte leaves: a client never sees both
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        except asyncio.CancelledError:
            if not drain.expired or responding:
                raise
            task.uncancel()  # cancelled by the drain: answer instead of dying
            timing = (scope.get("state") or {}).get("timing")
            shape = jev.jev_path(scope.get("path", ""), self.schema)
            await _shut_down(send, timing or Timing(started=arrived), shape)
        finally:
            drain.answered(task)


async def _send_error(
    send: Send,
    status: int,
    code: RequestErrorCode,
    message: str,
    headers: list[tuple[bytes, bytes]],
    timing: Timing,
    jev_shape: bool = False,
) -> None:
    """An error document sent straight through ASGI (before or after the application),
    with ``Server-Timing`` from ``timing`` (encoding the document is ``serialize``); on a
    ``jev`` route (``jev_shape``) with Jev's ``detail`` beside ``error``."""
    started = time.perf_counter()
    document: ErrorResponse | JevErrorDocument = error_document(status, code, message)
    if jev_shape:
        document = jev.JevError(status, code, message).body()
    body = orjson.dumps(document)
    timing.add("serialize", time.perf_counter() - started)
    start = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    start += [*headers, (b"server-timing", timing.header().encode())]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": body})


async def _shut_down(send: Send, timing: Timing, jev_shape: bool = False) -> None:
    """Answer 503 ``not_ready`` with ``Retry-After``: the grace period ran out."""
    headers = [(b"retry-after", RETRY_AFTER[503]["retry-after"].encode())]
    await _send_error(send, 503, "not_ready", SHUT_DOWN_MESSAGE, headers, timing, jev_shape)


async def _too_large(send: Send, limit: int, timing: Timing, jev_shape: bool = False) -> None:
    message = f"the body is over {limit} bytes"
    await _send_error(send, 413, "request_too_large", message, [], timing, jev_shape)


def validation_message(err: RequestValidationError) -> str:
    """One line per problem: where it is and what is wrong (worded as
    :func:`vllm_srun.plugins.requests.validation_problems` words it for every caller)."""
    return validation_problems(list(err.errors()))


def install_error_handlers(app: FastAPI, runtime: Runtime, accounting: Accounting) -> None:
    """Answer every failure with the error document (and count those refused before
    their route ran). On the System One routes of a process in the ``jev`` schema, a
    failure met before the route ran (a body over the limit, a wrong method) carries
    the Jev ``detail`` too."""

    def jev_route(request: Request) -> bool:
        return jev.jev_path(request.url.path, runtime.config.systemone_schema)

    def shaped(request: Request, error: ApiError) -> ApiError:
        return jev.as_jev(error) if jev_route(request) else error

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> Response:
        timing = request_timing(request)
        timing.parsed()  # refused while reading the body: that was the parse
        return respond(err.status, err.body(), timing, RETRY_AFTER.get(err.status))

    @app.exception_handler(RequestError)
    async def request_error(request: Request, err: RequestError) -> Response:
        return await api_error(request, as_api_error(err))

    @app.exception_handler(BodyTooLarge)
    async def body_too_large(request: Request, err: BodyTooLarge) -> Response:
        timing = request_timing(request)
        timing.parsed()
        accounting.refused(request.url.path, 413, time.perf_counter() - timing.started)
        limit = runtime.config.max_request_bytes
        error = ApiError("request_too_large", f"the body is over {limit} bytes")
        return respond(413, shaped(request, error).body(), timing)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> Response:
        timing = request_timing(request)
        timing.parsed()
        accounting.refused(request.url.path, 400, time.perf_counter() - timing.started)
        param = validation_param(list(err.errors()))
        error = ApiError("invalid_request", validation_message(err), param)
        return respond(400, error.body(), timing)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> Response:
        message = f"{request.method} {printable(request.url.path)}: {err.detail}"
        body: ErrorResponse | JevErrorDocument = error_document(
            err.status_code, "invalid_request", message
        )
        if jev_route(request):
            body = jev.JevError(err.status_code, "invalid_request", message).body()
        # a 405 names the methods the route takes (Allow), as HTTP requires
        return respond(err.status_code, body, request_timing(request), err.headers)

    @app.exception_handler(Exception)
    async def crashed(request: Request, err: Exception) -> Response:
        # Starlette answers this one outside the Envelope middleware, which would
        # otherwise add Server-Timing: set it here.
        error = ApiError("internal_error", f"{type(err).__name__}")
        return respond(500, error.body(), request_timing(request))
