"""The errors of a listener's native routes: their codes, their JSON shapes (the wire
contract's ``{"error": {"code", "type", "message"}}`` and OpenAI's ``param``, which the
OpenAI SDKs read as ``APIStatusError.param``, with Jev's ``detail`` where a Jev client
reads it), the worker's 422 entries a Jev client may see,
and the access line of each refusal the listener answers itself.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..names import closest

SYSTEMONE = "systemone_error"
RUNTIME = "runtime_error"
"""The error ``type`` of the System One routes and of the runtime routes."""

RUNTIME_ERROR_CODES = frozenset(
    {
        "invalid_request",
        "model_not_found",
        "request_too_large",
        "unsupported_surface",
        "overloaded",
        "internal_error",
        "not_ready",
    }
)
"""The wire contract's error codes: a worker's code among them is passed on."""

PASSED_MESSAGES = frozenset({"invalid_request", "unsupported_surface"})
"""The worker codes whose ``message`` (and ``param``) a runtime route passes on: they say
what is wrong with the client's own request and how to fix it (an input over the model's
limit, a surface the model does not serve). Every other worker text stays behind."""

MAX_MESSAGE = 2000
"""Longest worker message passed on (the runtime's own limit; cut beyond)."""

MAX_PARAM = 200
"""Longest worker ``param`` passed on (a longer one is left out)."""

MAX_LISTED = 20
"""Most model names a ``model_not_allowed`` message lists (then ``and N more``)."""

RUNTIME_ROUTE_LIST = "/v1/embeddings, /v1/classify, /v1/rerank and /v1/bundle"
SYSTEMONE_ROUTE_LIST = "/v1/systemone, /v1/decisions and /v1/systemone/batch"

NO_STORE = {"cache-control": "no-store"}

AUTHENTICATION_ERROR = "authentication_error"
"""Jev's ``detail.error_type`` of a 401."""

MAX_DETAIL_ENTRIES = 32
"""Most ``detail`` entries of a worker's 422 passed on to a Jev client."""

MAX_DETAIL_TEXT = 512
"""Longest ``msg``, ``type`` or ``loc`` text of a passed-on entry (cut beyond)."""

MAX_DETAIL_LOC = 16
"""Most ``loc`` parts of a passed-on entry (cut beyond)."""

COMPACT = (",", ":")
"""JSON separators without spaces, as the runtime writes its answers."""


class Refusal(Exception):
    """An answer other than the worker's: status, code, error type, extra headers.

    Attributes:
        message: what is wrong and how to fix it; ``None``: the code in words.
        param: the request field at fault (OpenAI's ``param``), ``None`` when no one is.
        error_type: Jev's ``detail.error_type``, when every listener gives it (a 401);
            ``None``: only a Jev listener does, and it is the code.
        invalid: Jev's validation entries (``loc``, ``msg``, ``type``) of a request that
            is not valid: a Jev listener answers 422 with them; others ignore them.
        own: whether the listener refused the request itself (its access line is the
            listener's), not a worker (whose access line is the worker's).
    """

    def __init__(
        self,
        status: int,
        code: str,
        kind: str,
        headers: Mapping[str, str] | None = None,
        *,
        message: str | None = None,
        param: str | None = None,
        error_type: str | None = None,
        invalid: list[dict[str, Any]] | None = None,
        own: bool = True,
    ) -> None:
        super().__init__(code)
        self.status, self.code, self.kind = status, code, kind
        self.headers = dict(headers or {})
        self.message = message
        self.param = param
        self.error_type = error_type
        self.invalid = invalid
        self.own = own


def error_body(
    code: str,
    kind: str,
    error_type: str | None = None,
    *,
    message: str | None = None,
    param: str | None = None,
) -> dict[str, Any]:
    """``{"error": {"code", "type", "message", "param"}}``; the message, unless given, is the
    code in words; ``param`` the request field at fault, else ``null``. With
    ``error_type``, Jev's ``"detail": {"error_type", "message"}`` too."""
    message = message or code.replace("_", " ")
    error = {"code": code, "type": kind, "message": message, "param": param}
    body: dict[str, Any] = {"error": error}
    if error_type is not None:
        body["detail"] = {"error_type": error_type, "message": message}
    return body


def error_response(
    status: int,
    code: str,
    kind: str,
    headers: Mapping[str, str] | None = None,
    *,
    message: str | None = None,
    param: str | None = None,
    error_type: str | None = None,
) -> Response:
    body = error_body(code, kind, error_type, message=message, param=param)
    return _error(status, body, headers)


def validation_response(
    code: str,
    kind: str,
    entries: list[dict[str, Any]],
    headers: Mapping[str, str] | None = None,
    *,
    param: str | None = None,
) -> Response:
    """Jev's 422: ``{"error": {code, type, message, param}, "detail": [{"loc", "msg",
    "type"}]}``."""
    body = {**error_body(code, kind, param=param), "detail": entries}
    return _error(422, body, headers)


def _error(status: int, body: dict[str, Any], headers: Mapping[str, str] | None = None) -> Response:
    content = json.dumps(body, ensure_ascii=False, separators=COMPACT).encode()
    return Response(
        content,
        status_code=status,
        media_type="application/json",
        headers={**NO_STORE, **(headers or {})},
    )


def validation_entry(loc: list[str | int], msg: str, kind: str) -> list[dict[str, Any]]:
    """One validation entry, as a list."""
    return [{"loc": loc, "msg": msg, "type": kind}]


def _cut(text: str) -> str:
    return text if len(text) <= MAX_DETAIL_TEXT else text[:MAX_DETAIL_TEXT]


def detail_entries(body: Any) -> list[dict[str, Any]]:
    """The well-formed entries of a worker's 422 ``detail``, rebuilt from ``loc``, ``msg``
    and ``type`` alone: ``loc`` a non-empty list of text and integers whose first part is
    ``"body"``, ``msg`` and ``type`` text; at most :data:`MAX_DETAIL_ENTRIES` of them,
    ``loc`` cut to :data:`MAX_DETAIL_LOC` parts and every text to
    :data:`MAX_DETAIL_TEXT` characters. Nothing else of an entry is kept."""
    detail = body.get("detail") if isinstance(body, dict) else None
    entries: list[dict[str, Any]] = []
    for item in detail if isinstance(detail, list) else ():
        if len(entries) == MAX_DETAIL_ENTRIES:
            break
        if not isinstance(item, dict):
            continue
        loc, msg, kind = item.get("loc"), item.get("msg"), item.get("type")
        if not (isinstance(loc, list) and loc[:1] == ["body"]):
            continue
        if not (isinstance(msg, str) and isinstance(kind, str)):
            continue
        parts: list[str | int] = []
        for part in loc[:MAX_DETAIL_LOC]:
            if isinstance(part, str):
                parts.append(_cut(part))
            elif isinstance(part, int) and not isinstance(part, bool) and abs(part) < 2**53:
                parts.append(part)
            else:
                break
        else:
            entries.append({"loc": parts, "msg": _cut(msg), "type": _cut(kind)})
    return entries


# -- the listener's own refusals, worded -------------------------------------------------------
def not_published(kind: str, path: str) -> Refusal:
    """404 for a route the listener's grants do not publish, naming the grant that does."""
    if path == "/v1/models":
        message = (
            "this listener publishes no models: add runtime: {models: [<public id>]} or "
            "systemone: {models: [<public id>]} to it in the configuration "
            "(listeners[].runtime.models, listeners[].systemone.models; vllm-sr serve "
            "--config FILE, or vllm-sr config apply)"
        )
        return Refusal(404, "runtime_not_published", kind, message=message)
    if kind == SYSTEMONE:
        grant, what, routes = "systemone", "System One", SYSTEMONE_ROUTE_LIST
    else:
        grant, what, routes = "runtime", "runtime", RUNTIME_ROUTE_LIST
    message = (
        f"this listener publishes no {what} models: add {grant}: {{models: [<public id>]}} "
        f"to it in the configuration (listeners[].{grant}.models; vllm-sr serve --config "
        f"FILE, or vllm-sr config apply) to serve {routes}"
    )
    return Refusal(404, f"{grant}_not_published", kind, message=message)


def not_allowed(kind: str, model: str, names: Sequence[str]) -> Refusal:
    """403 for a model outside the grant: the grant's models (the ones this listener's
    keys may use, nothing else), the closest of them to ``model``, and the grant to
    publish another in."""
    grant, what = ("systemone", "System One") if kind == SYSTEMONE else ("runtime", "runtime")
    listed = ", ".join(names[:MAX_LISTED])
    if len(names) > MAX_LISTED:
        listed += f" and {len(names) - MAX_LISTED} more"
    near = closest(model, names)
    guess = f" (did you mean {near}?)" if near is not None else ""
    message = (
        f"model not published on this listener's {what} routes{guess}; its models are "
        f"{listed}. To publish another, add its public id to listeners[].{grant}.models "
        "in the configuration (vllm-sr serve --config FILE, or vllm-sr config apply)"
    )
    return Refusal(403, "model_not_allowed", kind, message=message, param="model")


def passed_message(body: Any) -> tuple[str | None, str | None]:
    """A worker error's message (cut to :data:`MAX_MESSAGE` characters) and ``param``
    (text of at most :data:`MAX_PARAM` characters) when its code is one of
    :data:`PASSED_MESSAGES`; ``(None, None)`` for any other answer."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or error.get("code") not in PASSED_MESSAGES:
        return None, None
    message, param = error.get("message"), error.get("param")
    if not isinstance(message, str) or not message.strip():
        return None, None
    if not isinstance(param, str) or not param or len(param) > MAX_PARAM:
        param = None
    return message[:MAX_MESSAGE], param


# -- access lines ------------------------------------------------------------------------------
access_log = logging.getLogger("vllm_sr.access")
"""One line per request a listener refuses itself (a worker logs the ones it answers)."""


def log_refusal(request: Request, status: int, code: str, started: float, listener: str) -> None:
    """The access line of a refusal, as a worker writes one per answered request
    (``POST /v1/embeddings 403 0.3ms 10.0.0.7``), then the listener and the code:
    ``(http-8899: model_not_allowed)``. Never the request's text; control characters of
    the path are escaped (a ``%0a`` cannot start a forged line)."""
    milliseconds = (time.perf_counter() - started) * 1000
    path = _printable(str(request.scope.get("path", "-")))
    client = request.client.host if request.client is not None else "-"
    access_log.info(
        "%s %s %d %.1fms %s (%s: %s)",
        request.method,
        path,
        status,
        milliseconds,
        client,
        listener or "-",
        code,
        extra={
            "method": request.method,
            "path": path,
            "status": status,
            "duration_ms": round(milliseconds, 3),
            "client": client,
            "listener": listener,
            "code": code,
        },
    )


def _printable(value: str, limit: int = 200) -> str:
    escaped = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in value)
    return escaped[:limit]
