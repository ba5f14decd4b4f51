"""When a request's signals must have answered (ROUTER-SPEC §2.4, after upstream's
``withSignalDeadline`` in ``pkg/classification``).

``T`` is ``global.model_catalog.signal_timeout_ms`` (0: none) and ``R`` the request's own
deadline (the listener's ``timeout`` from arrival; none when unset). Start from
``now + T``, or ``now + 45 s`` (upstream's ``DefaultSignalTimeout``) without ``T``. With
``R``, the deadline derived from it, ``R - max(1 s, (R - now) / 10)``, wins when there is
no ``T`` or when it is earlier; a deadline that is already past becomes ``R``.
"""

from __future__ import annotations

DEFAULT_SIGNAL_TIMEOUT = 45.0
"""Seconds the signals may take when neither ``signal_timeout_ms`` nor a request
deadline bounds them (upstream's ``DefaultSignalTimeout``)."""


def signal_deadline(
    now: float, timeout_ms: int = 0, request_deadline: float | None = None
) -> float:
    """The signals' deadline, on the clock ``now`` is read from (seconds).

    Args:
        now: when the signals start.
        timeout_ms: ``signal_timeout_ms``; 0 for none.
        request_deadline: the request's deadline ``R``, or ``None``.

    Upstream's test values: ``R - now`` = 120 s gives 108 s; with ``T`` = 5 s, 5 s; with
    ``T`` = 200 s, 108 s; ``R - now`` = 3 s gives 2 s; 0.5 s gives 0.5 s.
    """
    deadline = now + (timeout_ms / 1000 if timeout_ms > 0 else DEFAULT_SIGNAL_TIMEOUT)
    if request_deadline is not None:
        derived = request_deadline - max(1.0, (request_deadline - now) / 10)
        if timeout_ms <= 0 or derived < deadline:
            deadline = derived
        if deadline <= now:
            deadline = request_deadline
    return deadline
