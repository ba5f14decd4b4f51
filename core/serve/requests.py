"""What one HTTP request carries through the serving runtime: its ``Server-Timing``
phases, the request-level errors and their statuses, and the model it names."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from vllm_srun.plugins.spec import MESSAGE_LIMIT, RequestErrorCode, clip

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

PARAM_OF_CODE: dict[str, str] = {"model_not_found": "model"}
"""The request field at fault of the codes that always name one (OpenAI's ``param``)."""


def error_type(status: int, code: str) -> str:
    """OpenAI's error ``type`` of an answer: ``server_error`` for a 5xx or
    ``overloaded`` (nothing the client's request did), else ``invalid_request_error``."""
    return "server_error" if status >= 500 or code == "overloaded" else "invalid_request_error"


def error_document(
    status: int, code: str, message: str, param: str | None = None
) -> dict[str, Any]:
    """``{"error": {"code", "message", "type", "param"}}``: the runtime's code and message,
    and OpenAI's ``type`` and ``param`` (the request field at fault, ``None`` when no one
    is), which OpenAI's SDKs read as ``APIStatusError.type`` and ``.param``."""
    error = {"code": code, "message": message, "type": error_type(status, code), "param": param}
    return {"error": error}


class ClientGone(Exception):
    """The client disconnected while its request waited; its queued rows were dropped."""


def validation_param(errors: list[Any]) -> str | None:
    """The field of pydantic's first problem, dotted (``input``, ``options.overflow``), as
    OpenAI's ``param`` names it; ``None`` for a problem with the body as a whole."""
    for error in errors:
        parts = [str(p) for p in error.get("loc", ()) if p != "body"]
        return clip(".".join(parts), 200) or None
    return None


class ApiError(Exception):
    """A request-level failure: an HTTP status with :func:`error_document`.

    Attributes:
        param: the request field at fault (OpenAI's ``param``), ``None`` when no one is.
    """

    def __init__(self, code: RequestErrorCode, message: str, param: str | None = None) -> None:
        message = clip(message, MESSAGE_LIMIT)
        super().__init__(message)
        self.code: RequestErrorCode = code
        self.message = message
        self.status = STATUS_OF_CODE[code]
        self.param = param if param is not None else PARAM_OF_CODE.get(code)

    def body(self) -> dict[str, Any]:
        """The error document."""
        return error_document(self.status, self.code, self.message, self.param)


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


def request_timing(request: Any) -> Timing:
    """The :class:`Timing` of an HTTP request (``request.state.timing``, which the
    envelope sets on arrival); a new one, set there, when there is none."""
    timing = getattr(request.state, "timing", None)
    if not isinstance(timing, Timing):
        timing = Timing()
        request.state.timing = timing
    return timing


def requested_model(body: Any) -> str | None:
    """The ``model`` a request names (a dict's key or a typed request's attribute),
    or ``None`` when it names none or something that is not a string."""
    name = body.get("model") if isinstance(body, dict) else getattr(body, "model", None)
    return name if isinstance(name, str) else None
