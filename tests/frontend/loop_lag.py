"""How late this process's event loop runs: the allowance a timing bound adds for a
machine too busy to run the test when it asked to (``make test`` shares 2 cores among
processes loading models). On a quiet machine it is a few milliseconds, so a bound
keeps its power: a pool that waited for a 5 s probe would still fail it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

TICK_S = 0.02
"""How often the watcher asks to run, in seconds."""


class LoopLag:
    """The worst lateness of a :data:`TICK_S` sleep seen so far, in seconds."""

    def __init__(self) -> None:
        self.worst = 0.0

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time()
            await asyncio.sleep(TICK_S)
            self.worst = max(self.worst, loop.time() - asked - TICK_S)


@contextlib.asynccontextmanager
async def watching() -> AsyncIterator[LoopLag]:
    """Watch the running loop's lateness while the block runs."""
    lag = LoopLag()
    task = asyncio.create_task(lag._watch())
    try:
        yield lag
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
