"""The shutdown of a serving process, in one object: :class:`Drain`.

1. :meth:`Drain.begin` (the first signal, on the event loop): admission stops (a new
   request is refused ``not_ready``; the loader gives up) and the requests in flight
   now are taken as the ones received before the shutdown, still admitted;
2. :meth:`Drain.run`: they are answered as usual within ``--shutdown-grace-seconds``;
   when the grace runs out, each admitted call still waiting is answered ``not_ready``
   (:meth:`Runtime.abandon <vllm_srun.service.runtime.Runtime.abandon>`), and every
   request still unanswered is cancelled (its caller answers it);
3. :meth:`Drain.finish` (once the listener is closed): each model's planning,
   scheduling and finishing threads finish their work in what is left of the grace,
   then stop.

Requests are asyncio tasks: the HTTP layer reports each one's arrival
(:meth:`Drain.received`), the start of its response (:meth:`Drain.responding`) and its
end (:meth:`Drain.answered`). Call every method but :meth:`Drain.finish` on the loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Collection
from typing import Protocol

from vllm_srun.config import ServeConfig

from .metrics import Metrics

log = logging.getLogger("vllm_srun.serve")

EXPIRE_SECONDS = 2.0
"""After the grace period, how long the answers of cancelled requests may take to leave."""

ABANDON_SECONDS = 0.5
"""After the grace period, how long abandoned calls get to leave through their own
handlers (503, counted in the metrics) before the rest are cancelled."""

SHUT_DOWN_MESSAGE = (
    "the server shut down before this request was answered; retry on another replica"
)
"""The ``not_ready`` message of a request the shutdown's grace period did not cover."""

Request = asyncio.Task[object]


class Drained(Protocol):
    """What a drain stops: :class:`~vllm_srun.service.runtime.Runtime`."""

    accepting: bool
    config: ServeConfig
    metrics: Metrics

    def stop_admitting(self) -> None: ...

    def abandon(self, message: str) -> int: ...

    def stop(self, grace_seconds: float | None = None) -> bool: ...


class Drain:
    """The requests in flight, and the shutdown that answers them before the process ends.

    Args:
        runtime: the model set it stops.

    Attributes:
        draining: whether the shutdown began.
        drained: whether every request received before it was answered in time
            (``True`` until a shutdown says otherwise).
        expired: whether the grace ran out and unanswered requests were cancelled.
    """

    def __init__(self, runtime: Drained) -> None:
        self.runtime = runtime
        self.gauge = runtime.metrics.requests_in_flight
        self.active: dict[Request, bool] = {}  # request -> its response has started
        self.draining = False
        self.drained = True
        self.expired = False
        self.deadline: float | None = None
        self._closed = False
        # Set in each request's own context (and the tasks it starts) on arrival.
        self._before: contextvars.ContextVar[bool] = contextvars.ContextVar(
            "received_before_shutdown", default=False
        )

    # -- requests ---------------------------------------------------------------------------
    def received(self, request: Request) -> None:
        """A request arrived (call in its own task): in flight until :meth:`answered`."""
        self.active[request] = False
        self._before.set(not self._closed)
        self.gauge.set(len(self.active))

    def responding(self, request: Request) -> None:
        """The request's response started: a cancel can no longer answer it."""
        if request in self.active:
            self.active[request] = True

    def answered(self, request: Request) -> None:
        """The request is answered (or gone): no longer in flight."""
        if self.active.pop(request, None) is not None:
            self.gauge.set(len(self.active))

    def admits(self) -> bool:
        """Whether the request being answered may still be admitted: before the
        shutdown, or received before it began."""
        return self.runtime.accepting or self._before.get()

    # -- the shutdown -----------------------------------------------------------------------
    def remaining(self) -> float:
        """Seconds left of the grace period (the whole period before the shutdown)."""
        if self.deadline is None:
            return self.runtime.config.shutdown_grace_seconds
        return max(0.0, self.deadline - time.monotonic())

    def start_clock(self) -> None:
        """The grace period starts now (a signal arrived); it may be called off the loop."""
        if self.deadline is None:
            self.deadline = time.monotonic() + self.runtime.config.shutdown_grace_seconds

    def begin(self) -> set[Request]:
        """Stop admitting and take the requests in flight, in one step: a request is
        either among them or refused. Returns them."""
        self.start_clock()
        self.draining = True
        self.runtime.stop_admitting()
        self._closed = True
        return set(self.active)

    async def run(self, received: Collection[Request]) -> bool:
        """Wait for ``received`` within the grace; past it, abandon and cancel what is
        left. Returns (and keeps in :attr:`drained`) whether all were answered in time."""
        if received:
            log.info("answering %d request(s) in flight", len(received))
        if await wait(received, self.remaining()):
            return self.drained
        unanswered = sum(1 for request in received if not request.done())
        log.warning(
            "the grace period (%g s) ran out with %d request(s) unanswered: answering "
            "them 503 not_ready",
            self.runtime.config.shutdown_grace_seconds,
            unanswered,
        )
        if self.runtime.abandon(SHUT_DOWN_MESSAGE):
            await wait(received, ABANDON_SECONDS)
        self.expired = True
        cancelled = [request for request, responding in self.active.items() if not responding]
        for request in cancelled:
            request.cancel()
        await wait(cancelled, EXPIRE_SECONDS)
        self.drained = False
        return False

    def finish(self) -> bool:
        """Stop the model set in what is left of the grace (:meth:`Runtime.stop
        <vllm_srun.service.runtime.Runtime.stop>`); whether its work finished in time."""
        return self.runtime.stop(self.remaining())


async def wait(requests: Collection[Request], timeout: float) -> bool:
    """Wait up to ``timeout`` seconds until every one of ``requests`` is done; whether
    they all were."""
    if not requests:
        return True
    _, pending = await asyncio.wait(requests, timeout=max(0.0, timeout))
    return not pending
