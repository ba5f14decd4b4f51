"""The request envelope: the body limit, ``Server-Timing`` and the error documents.

Every error leaves as ``{"error": {"code", "message"}}`` with the status of
its code; 429 and 503 carry ``Retry-After``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vllm_srun.plugins.requests import validation_problems

from .requests import ApiError, Timing
from .responses import Accounting, respond
from .runtime import Runtime

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


def validation_message(err: RequestValidationError) -> str:
    """One line per problem: where it is and what is wrong (worded as
    :func:`vllm_srun.plugins.requests.validation_problems` words it for every caller)."""
    return validation_problems(list(err.errors()))


def install_error_handlers(app: FastAPI, runtime: Runtime, accounting: Accounting) -> None:
    """Answer every failure with the error document (and count those refused before
    their route ran)."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> Response:
        timing = getattr(request.state, "timing", None)
        return respond(err.status, err.body(), timing, RETRY_AFTER.get(err.status))

    @app.exception_handler(BodyTooLarge)
    async def body_too_large(request: Request, err: BodyTooLarge) -> Response:
        accounting.refused(request.url.path, 413, 0.0)
        limit = runtime.config.max_request_bytes
        return respond(413, ApiError("request_too_large", f"the body is over {limit} bytes").body())

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> Response:
        accounting.refused(request.url.path, 400, 0.0)
        return respond(400, ApiError("invalid_request", validation_message(err)).body())

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
