"""Whether a worker answers, from what its exchanges show: the evidence a pool and a
health poller weigh before they stop sending it requests.

A worker that stops answering without dying (a stopped process, a hung forward, a handler
that accepts and never replies) still holds its connections and may still answer
``/health``. What gives it away is silence: exchanges outstanding and none answered for
far longer than this worker's own answers normally take. :class:`Liveness` keeps, per
worker, the exchanges it holds (when each was sent), when it last answered one, and the
times of its recent answers; :meth:`Liveness.suspect` is the rule:

    suspect  <=>  an exchange is outstanding, and no answer for
                  max(STALL_FLOOR_S, STALL_FACTOR * p99 of its last STALL_SAMPLES answers)
                  (STALL_DEFAULT_S until it answered STALL_MIN_SAMPLES)

Silence is counted from the later of its last answer and the oldest exchange it still
holds, so a worker that answers anything, however busy, is never suspect, and an idle one
is never suspect. Chosen from measurement (tests/frontend/test_liveness.py replays a
stopped replica under load): MiniLM's exchanges at 8 clients over two replicas on two
cores answer with a p99 of 0.2 to 0.4 s, so a stopped replica is suspect 0.5 to 0.8 s
after its last answer; a decoder whose answers take seconds is given seconds.
"""

from __future__ import annotations

import collections
import itertools
import math
import statistics
import time
from collections.abc import Callable

STALL_FLOOR_S = 0.5
"""The least silence that makes a worker suspect, in seconds (scheduling noise, a
collection pause)."""

STALL_FACTOR = 2.0
"""How many times its usual worst answer time (p99) a worker may be silent."""

STALL_DEFAULT_S = 1.0
"""The silence allowed before a worker answered :data:`STALL_MIN_SAMPLES` exchanges."""

STALL_SAMPLES = 100
"""How many recent answer times the p99 is taken over."""

STALL_MIN_SAMPLES = 20
"""Answers needed before the p99 is trusted."""

SUSPECT_PROBE_TIMEOUT = 0.75
"""How long a health probe of a suspect worker waits, in seconds: a live runtime
answers ``/health`` from its event loop in milliseconds; a stopped one never does."""


class Liveness:
    """The exchanges one worker holds and answered (shared by every pool holding it).

    Args:
        clock: monotonic seconds; tests inject their own.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.answered_at = -math.inf
        self._outstanding: dict[int, float] = {}
        self._tokens = itertools.count()
        self._answers: collections.deque[float] = collections.deque(maxlen=STALL_SAMPLES)
        self._worst: float | None = None  # the p99, computed once per new answer

    # -- what the pool reports ------------------------------------------------------------
    def sent(self) -> int:
        """An exchange was sent; the token to report its end with."""
        token = next(self._tokens)
        self._outstanding[token] = self.clock()
        return token

    def answered(self, token: int) -> None:
        """The exchange ``token`` got an answer (any HTTP status: the worker answers)."""
        now = self.clock()
        started = self._outstanding.pop(token, None)
        if started is not None:
            self._answers.append(now - started)
            self._worst = None
        self.answered_at = now

    def abandoned(self, token: int) -> None:
        """The exchange ``token`` ended without an answer (timed out, broken, cancelled)."""
        self._outstanding.pop(token, None)

    # -- what it says ---------------------------------------------------------------------
    @property
    def outstanding(self) -> int:
        """Exchanges sent and not yet answered or abandoned."""
        return len(self._outstanding)

    def usual_worst_s(self) -> float | None:
        """The p99 of its recent answer times in seconds, once it has enough of them."""
        if len(self._answers) < STALL_MIN_SAMPLES:
            return None
        if self._worst is None:  # every pool's choice asks: once per new answer, not per ask
            self._worst = statistics.quantiles(self._answers, n=100, method="inclusive")[98]
        return self._worst

    def stall_after(self) -> float:
        """Seconds of silence, with work outstanding, that make it suspect."""
        worst = self.usual_worst_s()
        if worst is None:
            return STALL_DEFAULT_S
        return max(STALL_FLOOR_S, STALL_FACTOR * worst)

    def silent_for(self, now: float | None = None) -> float:
        """Seconds since it last answered or was sent the oldest exchange it still holds,
        whichever is later; 0 while it holds none."""
        if not self._outstanding:
            return 0.0
        now = self.clock() if now is None else now
        return now - max(self.answered_at, min(self._outstanding.values()))

    def suspect(self, now: float | None = None) -> bool:
        """Work outstanding and silent past :meth:`stall_after` (the module's rule)."""
        return bool(self._outstanding) and self.silent_for(now) > self.stall_after()

    def until_suspect(self, now: float | None = None) -> float:
        """Seconds until it would be suspect if nothing is answered (0: it is)."""
        return max(0.0, self.stall_after() - self.silent_for(now))

    def answered_since(self, moment: float) -> bool:
        """Whether it answered an exchange at or after ``moment`` (monotonic seconds)."""
        return self.answered_at >= moment

    def why(self, now: float | None = None) -> str:
        """The evidence, as a reason an operator reads: silence and work outstanding."""
        worst = self.usual_worst_s()
        usual = (
            f"its answers take up to {worst:.2f} s (p99)"
            if worst is not None
            else "it has not answered enough requests yet to know its usual time"
        )
        plural = "s" if self.outstanding != 1 else ""
        return (
            f"no answer for {self.silent_for(now):.1f} s with {self.outstanding} "
            f"request{plural} outstanding; {usual}"
        )
