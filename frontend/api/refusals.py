"""The errors of a listener's native routes: their codes, their JSON shapes (the wire
contract's ``{"error": {"code", "type", "message"}}``, with Jev's ``detail`` where a Jev
client reads it), and the worker's 422 entries a Jev client may see.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.responses import Response

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
"""The wire contract's error codes: a worker's code among them is passed on (its
message never is)."""

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
        error_type: Jev's ``detail.error_type``, when every listener gives it (a 401);
            ``None``: only a Jev listener does, and it is the code.
        invalid: Jev's validation entries (``loc``, ``msg``, ``type``) of a request that
            is not valid: a Jev listener answers 422 with them; others ignore them.
    """

    def __init__(
        self,
        status: int,
        code: str,
        kind: str,
        headers: Mapping[str, str] | None = None,
        *,
        error_type: str | None = None,
        invalid: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(code)
        self.status, self.code, self.kind = status, code, kind
        self.headers = dict(headers or {})
        self.error_type = error_type
        self.invalid = invalid


def error_body(code: str, kind: str, error_type: str | None = None) -> dict[str, Any]:
    """``{"error": {"code", "type", "message"}}``; the message is the code in words. With
    ``error_type``, Jev's ``"detail": {"error_type", "message"}`` too."""
    message = code.replace("_", " ")
    body: dict[str, Any] = {"error": {"code": code, "type": kind, "message": message}}
    if error_type is not None:
        body["detail"] = {"error_type": error_type, "message": message}
    return body


def error_response(
    status: int,
    code: str,
    kind: str,
    headers: Mapping[str, str] | None = None,
    *,
    error_type: str | None = None,
) -> Response:
    return _error(status, error_body(code, kind, error_type), headers)


def validation_response(
    code: str, kind: str, entries: list[dict[str, Any]], headers: Mapping[str, str] | None = None
) -> Response:
    """Jev's 422: ``{"error": {code, type, message}, "detail": [{"loc", "msg", "type"}]}``."""
    body = {**error_body(code, kind), "detail": entries}
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
