"""What one HTTP request carries: its :class:`~vllm_srun.service.timing.Timing` (set
on arrival), the request-level errors and their statuses, and the model it names."""

from __future__ import annotations

from typing import Any, Literal

from vllm_srun.plugins.responses import ErrorResponse
from vllm_srun.plugins.spec import MESSAGE_LIMIT, RequestError, RequestErrorCode, clip
from vllm_srun.service.timing import Timing

from .schemas import JevErrorDocument

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


def error_type(status: int, code: str) -> Literal["invalid_request_error", "server_error"]:
    """OpenAI's error ``type`` of an answer: ``server_error`` for a 5xx or
    ``overloaded`` (nothing the client's request did), else ``invalid_request_error``."""
    return "server_error" if status >= 500 or code == "overloaded" else "invalid_request_error"


def error_document(
    status: int, code: RequestErrorCode, message: str, param: str | None = None
) -> ErrorResponse:
    """``{"error": {"code", "message", "type", "param"}}``: the runtime's code and message,
    and OpenAI's ``type`` and ``param`` (the request field at fault, ``None`` when no one
    is), which OpenAI's SDKs read as ``APIStatusError.type`` and ``.param``."""
    return {
        "error": {
            "code": code,
            "message": message,
            "type": error_type(status, code),
            "param": param,
        }
    }


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

    def body(self) -> ErrorResponse | JevErrorDocument:
        """The error document (the ``jev`` schema's adds Jev's ``detail``:
        :class:`~.jev.JevError`)."""
        return error_document(self.status, self.code, self.message, self.param)


def as_api_error(err: RequestError | ApiError) -> ApiError:
    """``err`` as an :class:`ApiError`: a service's or family's :class:`RequestError`
    gets the status of its code and its ``param`` (else the one its code always names)."""
    return err if isinstance(err, ApiError) else ApiError(err.code, err.message, err.param)


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
