"""The finishing stage of one model: a thread that turns settled calls into answers.

:class:`Finisher` is a model's finishing thread (``finish:NAME``). Whichever thread
settles a request's rows (the forward thread, the event loop for a request with no rows,
the stop) puts its finishing there; the family's ``finish`` never runs on the forward
thread nor on the event loop. The thread finishes in order and hands the answers it
finished since it last woke to their event loop in one callback, so a forward of many
requests costs one wake of this thread and one of the loop (a thread pool's future per
request cost a third of the throughput of a tiny model at 32 connections).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

IDLE_CHECK_SECONDS = 0.05
"""How long :meth:`Finisher.finish_pending` waits at least for the thread to show it is idle."""

Finishing = tuple["asyncio.Future[Any] | None", Callable[[], Any], asyncio.AbstractEventLoop]
"""A future, what answers it (a body, or the exception it ends with) and its loop."""


class Finisher:
    """A model's finishing thread: :meth:`put` from any thread, answers on the loop.

    Args:
        name: the model ID (the thread is ``finish:NAME``).
    """

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[Finishing | threading.Event | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"finish:{name}", daemon=True)
        self._thread.start()

    def put(
        self,
        future: asyncio.Future[Any] | None,
        finish: Callable[[], Any],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """Run ``finish`` on the thread and give ``future`` its result on ``loop`` (an
        exception it returns is set as the future's exception)."""
        self._queue.put((future, finish, loop))

    def finish_pending(self, deadline: float) -> bool:
        """Wait until everything put so far is finished, or ``deadline``
        (``time.monotonic()``) passes (at least :data:`IDLE_CHECK_SECONDS`); whether it was."""
        if not self._thread.is_alive():
            return True
        marker = threading.Event()
        self._queue.put(marker)
        return marker.wait(max(IDLE_CHECK_SECONDS, deadline - time.monotonic()))

    def stop(self) -> None:
        """End the thread once what was put before is finished."""
        self._queue.put(None)

    def _run(self) -> None:
        while True:
            taken = [self._queue.get()]
            with contextlib.suppress(queue.Empty):
                while True:
                    taken.append(self._queue.get_nowait())
            answers: dict[asyncio.AbstractEventLoop, list[tuple[Any, Any]]] = {}
            for item in taken:
                if item is None:
                    _hand_over(answers)
                    return
                if isinstance(item, threading.Event):
                    _hand_over(answers)
                    answers = {}
                    item.set()
                    continue
                future, finish, loop = item
                answers.setdefault(loop, []).append((future, finish()))
            _hand_over(answers)


def _hand_over(answers: dict[asyncio.AbstractEventLoop, list[tuple[Any, Any]]]) -> None:
    """One callback per loop for the answers finished since the thread last woke."""
    for loop, answered in answers.items():
        with contextlib.suppress(RuntimeError):  # the loop closed: the shutdown answered
            loop.call_soon_threadsafe(_resolve, answered)


def _resolve(answered: list[tuple[asyncio.Future[Any] | None, Any]]) -> None:
    """(The event loop.) Each future gets its body or its exception."""
    for future, body in answered:
        if future is None or future.done():
            continue
        if isinstance(body, BaseException):
            future.set_exception(body)
        else:
            future.set_result(body)
