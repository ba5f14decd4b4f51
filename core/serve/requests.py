"""What one HTTP request carries through the serving runtime: its ``Server-Timing``
phases, the request-level errors and their statuses, and the model it names."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from vllm_srun.plugins.spec import RequestErrorCode, clip

STATUS_OF_CODE: dict[RequestErrorCode, int] = {
    "invalid_request": 400,
    "model_not_found": 404,
    "request_too_large": 413,
    "unsupported_surface": 422,
    "overloaded": 429,
    "internal_error": 500,
    "not_ready": 503,
}
"""The HTTP status of each request-level error code (DESIGN §5); the codes are the
plugin API's :data:`~vllm_srun.plugins.spec.RequestErrorCode`."""


class ClientGone(Exception):
    """The client disconnected while its request waited; its queued rows were dropped."""


class ApiError(Exception):
    """A request-level failure: an HTTP status with ``{"error": {"code", "message"}}``."""

    def __init__(self, code: RequestErrorCode, message: str) -> None:
        message = clip(message, MESSAGE_LIMIT)
        super().__init__(message)
        self.code: RequestErrorCode = code
        self.message = message
        self.status = STATUS_OF_CODE[code]

    def body(self) -> dict[str, Any]:
        """The error document."""
        return {"error": {"code": self.code, "message": self.message}}


@dataclass
class Timing:
    """``Server-Timing`` phases of one request, in seconds.

    Attributes:
        started: ``time.perf_counter()`` when the request arrived (phase durations).
        arrived: ``time.monotonic()`` when it arrived: ``options.deadline_ms``
            counts from here, so parsing and tokenising spend the deadline too.
    """

    started: float = field(default_factory=time.perf_counter)
    arrived: float = field(default_factory=time.monotonic)
    phases: dict[str, float] = field(default_factory=dict)

    def add(self, phase: str, seconds: float) -> None:
        """Accumulate ``seconds`` into ``phase``."""
        self.phases[phase] = self.phases.get(phase, 0.0) + seconds

    def header(self) -> str:
        """``parse;dur=0.12, tokenize;dur=0.31, ..., total;dur=2.4`` (milliseconds)."""
        total = time.perf_counter() - self.started
        order = ("parse", "tokenize", "queue", "forward", "post")
        parts = [f"{p};dur={self.phases.get(p, 0.0) * 1000:.3f}" for p in order]
        parts.append(f"total;dur={total * 1000:.3f}")
        return ", ".join(parts)


MESSAGE_LIMIT = 2000
"""Characters of an error message at most (problems past it are counted, not listed)."""


def requested_model(body: Any) -> str | None:
    """The ``model`` a request names (a dict's key or a typed request's attribute),
    or ``None`` when it names none or something that is not a string."""
    name = body.get("model") if isinstance(body, dict) else getattr(body, "model", None)
    return name if isinstance(name, str) else None
