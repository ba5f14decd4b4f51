"""A stand-in OpenAI-compatible Chat backend for trying Router mode without an LLM: it
answers ``POST /v1/chat/completions`` (JSON, or SSE with ``"stream": true``) with a
message naming the ``model`` it was sent and the last user message, so you can see where
the router sent a request. Replace it with your vLLM (or any OpenAI-compatible server)
in ``backend_refs``.

    .venv/bin/python examples/router/echo_backend.py --port 8000
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def _reply(body: dict) -> str:
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    last = next((m.get("content") for m in reversed(messages) if m.get("role") == "user"), "")
    return f"[{body.get('model')}] you said: {last}"


async def chat(request: Request) -> Response:
    body = await request.json()
    created, text = int(time.time()), _reply(body)
    if body.get("stream") is True:

        async def events() -> AsyncIterator[bytes]:
            for index, word in enumerate(text.split(" ")):
                delta = {"content": word if index == 0 else " " + word}
                if index == 0:
                    delta["role"] = "assistant"
                chunk = {
                    "id": "chatcmpl-echo",
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": body.get("model"),
                    "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
                }
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            done = {
                "id": "chatcmpl-echo",
                "object": "chat.completion.chunk",
                "created": created,
                "model": body.get("model"),
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            }
            yield f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n".encode()

        return StreamingResponse(events(), media_type="text/event-stream")
    return JSONResponse(
        {
            "id": "chatcmpl-echo",
            "object": "chat.completion",
            "created": created,
            "model": body.get("model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
