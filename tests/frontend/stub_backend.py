"""A scripted OpenAI-compatible Chat backend for Router-mode tests (ROUTER-SPEC §4 (a)).

It records every request (path, headers, body) and answers ``POST .../chat/completions``
with a ``chat.completion`` (or its SSE chunks when ``stream`` is true) whose content
names the ``model`` it was sent. A script changes the next answers: a status and body, a
delay before the headers, a pause between stream chunks, or a hang-up (before the
headers, or mid-stream). It runs in a thread of the test process on a free port.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Script:
    """How the backend answers.

    Attributes:
        status: the status of a non-2xx answer (with ``body``), or ``None``.
        body: the body of that answer.
        delay: seconds before the headers.
        chunk_pause: seconds between stream chunks.
        chunks: content pieces a streamed answer sends.
        hang_up: ``before_headers`` or ``mid_stream`` to drop the connection there.
    """

    status: int | None = None
    body: dict[str, Any] | None = None
    delay: float = 0.0
    chunk_pause: float = 0.0
    chunks: tuple[str, ...] = ("Hello", " from", " the", " stub")
    hang_up: str | None = None


@dataclass
class Seen:
    """One request the backend received."""

    path: str
    headers: list[tuple[str, str]]
    body: dict[str, Any]

    def header(self, name: str) -> str | None:
        return next((v for n, v in self.headers if n.lower() == name.lower()), None)


@dataclass
class StubBackend:
    """The backend and what it saw (:attr:`requests`); :attr:`script` steers it."""

    script: Script = field(default_factory=Script)
    requests: list[Seen] = field(default_factory=list)
    port: int = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _chat(self, request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw) if raw else {}
        self.requests.append(Seen(request.url.path, list(request.headers.items()), body))
        script = self.script
        if script.delay:
            await asyncio.sleep(script.delay)
        if script.hang_up == "before_headers":
            transport = request.scope.get("transport")
            raise ConnectionAbortedError("hang up") if transport is None else _abort(transport)
        if script.status is not None:
            return Response(
                json.dumps(script.body or {}), script.status, media_type="application/json"
            )
        model = body.get("model")
        created = int(time.time())
        if body.get("stream") is True:
            return StreamingResponse(
                self._events(model, created, script), media_type="text/event-stream"
            )
        answer = {
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": f"answered by {model}"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
        }
        return Response(json.dumps(answer), 200, media_type="application/json")

    async def _events(self, model: Any, created: int, script: Script):  # type: ignore[no-untyped-def]
        for index, piece in enumerate(script.chunks):
            delta: dict[str, Any] = {"content": piece}
            if index == 0:
                delta["role"] = "assistant"
            event = {
                "id": "chatcmpl-stub",
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
            }
            yield b"data: " + json.dumps(event).encode() + b"\n\n"
            if script.hang_up == "mid_stream" and index == 1:
                raise ConnectionResetError("hang up mid-stream")
            if script.chunk_pause:
                await asyncio.sleep(script.chunk_pause)
        last = {
            "id": "chatcmpl-stub",
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        }
        yield b"data: " + json.dumps(last).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/chat/completions", self._chat, methods=["POST"]),
            ]
        )


def _abort(transport: Any) -> Response:
    transport.abort()
    raise ConnectionAbortedError("hang up")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Running:
    """A :class:`StubBackend` served by uvicorn in a thread until :meth:`stop`."""

    def __init__(self, stub: StubBackend | None = None) -> None:
        self.stub = stub or StubBackend()
        self.stub.port = free_port()
        config = uvicorn.Config(
            self.stub.app(),
            host="127.0.0.1",
            port=self.stub.port,
            log_level="error",
            lifespan="off",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the stub backend did not start within 10 s")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
