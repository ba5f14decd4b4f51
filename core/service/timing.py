"""A request's phase timings: what each stage of answering it took.

The service records ``tokenize`` (planning), ``queue``, ``forward`` and ``post`` (finish);
the HTTP layer records ``parse`` and ``serialize`` and writes them all as ``Server-Timing``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

PHASES = ("parse", "tokenize", "queue", "forward", "post", "serialize")
"""The ``Server-Timing`` phases, in header order (``total`` follows them)."""


@dataclass
class Timing:
    """``Server-Timing`` phases of one request, in seconds.

    The phases run one after another, so together they never exceed ``total``:

    - ``parse``: from arrival (the envelope) until the body is read and validated;
    - ``tokenize``: planning (the family's ``plan``); a bundle reports the time
      its tasks took to plan together, not the sum of each;
    - ``queue``, ``forward``, ``post``: the answered job's wait for the worker,
      its forwards and its ``finish``; a bundle reports those of the job
      answered last (:meth:`answered` keeps the latest);
    - ``serialize``: encoding the response body;
    - ``total``: from arrival until the header is written.

    A phase that did not run (an early error) is reported as 0.

    Attributes:
        started: ``time.perf_counter()`` when the request arrived (phase durations).
        arrived: ``time.monotonic()`` when it arrived: ``options.deadline_ms``
            counts from here, so parsing and tokenising spend the deadline too.
    """

    started: float = field(default_factory=time.perf_counter)
    arrived: float = field(default_factory=time.monotonic)
    phases: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, phase: str, seconds: float) -> None:
        """Accumulate ``seconds`` into ``phase``."""
        with self.lock:
            self.phases[phase] = self.phases.get(phase, 0.0) + seconds

    def parsed(self) -> None:
        """Record ``parse`` as the time from arrival until now, once (later calls keep
        the first)."""
        with self.lock:
            self.phases.setdefault("parse", time.perf_counter() - self.started)

    def answered(self, queue: float | None, forward: float, post: float) -> None:
        """Record a job's answer: its ``queue`` wait (``None``: never dispatched),
        ``forward`` and ``post`` seconds, replacing any earlier job's (called from
        the model's worker thread; in a bundle the job answered last stays)."""
        with self.lock:
            self.phases["queue"] = queue or 0.0
            self.phases["forward"] = forward
            self.phases["post"] = post

    def header(self) -> str:
        """``parse;dur=0.12, tokenize;dur=0.31, ..., serialize;dur=0.02, total;dur=2.4``
        (milliseconds, every phase of :data:`PHASES` whether it ran or not)."""
        total = time.perf_counter() - self.started
        with self.lock:
            parts = [f"{p};dur={self.phases.get(p, 0.0) * 1000:.3f}" for p in PHASES]
        parts.append(f"total;dur={total * 1000:.3f}")
        return ", ".join(parts)
