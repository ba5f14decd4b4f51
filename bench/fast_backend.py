"""A fast stand-in OpenAI Chat backend for the router benchmark (bench/router_section.py).

A raw ASGI app under uvicorn (uvloop, httptools, no access log): every ``POST`` is read to
its end and answered with the same small ``chat.completion`` JSON, at once; ``GET
/health`` answers 200. What it costs per request is the floor a proxy in front of it
adds to.

    .venv/bin/python bench/fast_backend.py --port 8000

``--delay-ms N`` holds every answer N milliseconds first (without using the CPU): a
backend with a service time, as a real completion has one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

ANSWER = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1767225600,
        "model": "bench-7b",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13},
    },
    separators=(",", ":"),
).encode()
HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(ANSWER)).encode()),
]
HEALTH = b'{"ok":true}'
DELAY_SECONDS = 0.0
"""Seconds each answer is held (``--delay-ms``)."""


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answer every POST with :data:`ANSWER` (the body read first), anything else 200."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":  # pragma: no cover - no websockets here
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    if scope["method"] == "POST":
        if DELAY_SECONDS:
            await asyncio.sleep(DELAY_SECONDS)
        await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
        await send({"type": "http.response.body", "body": ANSWER})
        return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": HEALTH})


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="hold each answer this long")
    args = parser.parse_args()
    global DELAY_SECONDS
    DELAY_SECONDS = args.delay_ms / 1000
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
        lifespan="on",
    )


if __name__ == "__main__":
    main()
