"""The SSE relay when a backend breaks off (ROUTER-SPEC §2.8): the bytes it sent before the
break reach the client, then one SSE error event, never ``[DONE]``. Deterministic: the
break is already known when the relay first reads (what happens on a loaded machine when
the last chunks and the reset arrive together)."""

from __future__ import annotations

import asyncio
import json
from unittest import mock

import aiohttp
from aiohttp.streams import StreamReader

from vllm_sr.router.forward import _relay

from .conftest import run


class Broken:
    """A streamed backend response whose connection broke after ``sent``."""

    def __init__(self, sent: list[bytes]) -> None:
        self.content = StreamReader(mock.Mock(), 2**16, loop=asyncio.get_running_loop())
        for data in sent:
            self.content.feed_data(data)
        self.content.set_exception(aiohttp.ClientPayloadError("Response payload is not completed"))
        self.closed = False

    def release(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_bytes_sent_before_a_break_are_relayed_before_the_error_event() -> None:
    first = b'data: {"choices": [{"delta": {"content": "Hel"}}]}\n\n'
    second = b'data: {"choices": [{"delta": {"content": "lo"}}]}\n\n'

    async def relayed() -> tuple[bytes, bool]:
        response = Broken([first, second])
        out = b"".join([chunk async for chunk in _relay(response, 5.0)])  # type: ignore[arg-type]
        return out, response.closed

    out, closed = run(relayed(), 10)
    assert out.startswith(first + second)
    events = [e for e in out.decode().split("\n\n") if e]
    assert len(events) == 3 and b"[DONE]" not in out
    assert json.loads(events[-1][len("data: ") :])["error"]["message"] == (
        "the backend closed the stream before it ended"
    )
    assert closed
