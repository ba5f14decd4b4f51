"""One exchange with one worker: the ``model`` selector rewritten both ways, the payload
otherwise left as it came, the worker's ``Server-Timing`` read.

The frontend publishes a deployment under its public id (``vllm-sr/Vela-2.0-0.3B``);
each worker serves it under its own name (the models-file ``name``, or an attached
worker's ``served_name``). Only ``model`` changes on the way in (to the worker's name)
and on the way out (back to the public id): at the top of a surface request and
answer, in each entry of a decisions answer's ``states``, and in every task and
result of a bundle (per task surface).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..workers.client import ConnectFailed, ExchangeBroken, ExchangeTimedOut
from ..workers.worker import Worker
from . import jsontext

TASK_SURFACES = {
    "decisions": "decisions",
    "systemone_batch": "decisions",
    "classify": "classify",
    "embeddings": "embeddings",
    "rerank": "rerank",
}
"""A bundle task's surface key and the surface that answers it (a ``systemone_batch``
task is a ``/v1/systemone/batch`` body, answered by the decisions surface)."""

INPUT_SURFACES = ("classify", "embeddings", "rerank")
"""The surfaces whose ``options`` take ``max_tokens`` and ``overflow`` (a deployment's
``input`` defaults go to these)."""

INPUT_CHOICES = ("max_tokens", "overflow")
"""The ``options`` a request may choose its input handling with."""

JSON_HEADERS = {"content-type": "application/json"}
"""The headers every forwarded request carries."""

KEPT_HEADERS = ("content-type", "retry-after")
"""The worker's response headers an answer keeps (nothing else of the worker shows)."""


class TransportError(Exception):
    """The worker could not be reached, or its answer could not be read.

    Attributes:
        sent: whether the request may have reached the worker (``False`` only when the
            connection was never made: another worker may take it).
    """

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class ExchangeTimeout(Exception):
    """The exchange outlasted the caller's timeout."""


class InvalidReply(Exception):
    """A 2xx answer that is not a JSON object."""


@dataclass
class Reply:
    """A worker's answer, its ``model`` already the public id.

    Attributes:
        status: the worker's HTTP status.
        content: the answer's bytes (a 2xx answer's ``model`` selectors rewritten,
            every other byte as the worker sent it).
        headers: the worker headers kept (:data:`KEPT_HEADERS`), lower-case names.
        seconds: the exchange's duration.
        server_ms: the worker's ``Server-Timing`` durations (``total`` and phases), in ms.
        cached: served from the result cache, not by a worker.
    """

    status: int
    content: bytes
    headers: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    server_ms: dict[str, float] = field(default_factory=dict)
    cached: bool = False

    def json(self) -> Any:
        """The answer decoded (``None`` when it is not JSON)."""
        try:
            return json.loads(self.content)
        except ValueError:
            return None


def _bundle_objects(text: str, found: list[tuple[str, int, int]], key: str) -> list[int]:
    """Where each surface object of a bundle's ``tasks`` or ``results`` starts."""
    span = jsontext.member(found, key)
    if span is None or text[span[0] : span[0] + 1] != "[":
        return []
    starts = []
    for start, _ in jsontext.elements(text, span[0])[0]:
        if not jsontext.is_object(text, start):
            continue
        for name, value, _ in jsontext.members(text, start)[0]:
            if name in TASK_SURFACES and jsontext.is_object(text, value):
                starts.append(value)
    return starts


def _bundle_tasks(text: str, found: list[tuple[str, int, int]]) -> list[tuple[str, int]]:
    """Each bundle task's surface (``TASK_SURFACES``' value) and where its object starts."""
    span = jsontext.member(found, "tasks")
    if span is None or text[span[0] : span[0] + 1] != "[":
        return []
    tasks = []
    for start, _ in jsontext.elements(text, span[0])[0]:
        if not jsontext.is_object(text, start):
            continue
        for name, value, _ in jsontext.members(text, start)[0]:
            if name in TASK_SURFACES and jsontext.is_object(text, value):
                tasks.append((TASK_SURFACES[name], value))
    return tasks


def input_edits(text: str, start: int, defaults: Mapping[str, Any]) -> list[jsontext.Edit]:
    """Edits that give the request object at ``start`` the ``options`` of ``defaults``
    (``max_tokens``, ``overflow``), only when it chooses none of them itself: no
    ``options.max_tokens``, no ``options.overflow`` and no ``truncate`` (the embeddings
    spelling of overflow). An ``options`` that is not an object is left to the worker.
    """
    given = {k: v for k, v in defaults.items() if k in INPUT_CHOICES}
    found, _ = jsontext.members(text, start)
    if not given or not found or jsontext.member(found, "truncate") is not None:
        return []
    pieces = ",".join(
        f"{json.dumps(k)}:{json.dumps(v, ensure_ascii=False)}" for k, v in given.items()
    )
    span = jsontext.member(found, "options")
    if span is None:
        return [(start + 1, start + 1, f'"options":{{{pieces}}},')]
    if text[span[0] : span[1]] == "null":
        return [(span[0], span[1], f"{{{pieces}}}")]
    if not jsontext.is_object(text, span[0]):
        return []
    options, _ = jsontext.members(text, span[0])
    if any(jsontext.member(options, k) is not None for k in INPUT_CHOICES):
        return []
    at = span[0] + 1
    return [(at, at, pieces + ("," if options else ""))]


def request_for(
    surface: str, raw: bytes, name: str, input_defaults: Mapping[str, Any] | None = None
) -> bytes:
    """The request ``raw`` with its ``model`` selector(s) set to ``name`` (added where
    missing); a bundle's tasks each get ``name`` under their surface key. A classify,
    embeddings or rerank request (or bundle task) that chooses no input handling gets
    ``input_defaults`` as its ``options`` (:func:`input_edits`).

    Raises:
        ValueError: not a JSON object (or not UTF-8).
    """
    text = raw.decode()
    found = jsontext.document(text)
    start = len(text) - len(text.lstrip())
    objects = _bundle_tasks(text, found) if surface == "bundle" else [(surface, start)]
    edits: list[jsontext.Edit] = []
    for task_surface, at in objects:
        if input_defaults and task_surface in INPUT_SURFACES:
            edits += input_edits(text, at, input_defaults)
        edits += jsontext.model_edits(text, at, name, insert=True)
    return jsontext.apply(text, edits).encode()


def _answer_edits(text: str, start: int, public: str) -> list[jsontext.Edit]:
    edits = jsontext.model_edits(text, start, public, insert=False)
    span = jsontext.member(jsontext.members(text, start)[0], "states")
    if span is None:
        return edits
    if text[span[0]] == "{":
        entries = [value for _, value, _ in jsontext.members(text, span[0])[0]]
    elif text[span[0]] == "[":
        entries = [value for value, _ in jsontext.elements(text, span[0])[0]]
    else:
        entries = []
    for at in entries:
        if jsontext.is_object(text, at):
            edits += jsontext.model_edits(text, at, public, insert=False)
    return edits


def answer_for(surface: str, raw: bytes, public: str) -> bytes:
    """A worker's answer ``raw`` with every ``model`` set to ``public``: the answer's,
    its decisions ``states``' entries', a bundle's per result surface.

    Raises:
        ValueError: not a JSON object (or not UTF-8).
    """
    text = raw.decode()
    found = jsontext.document(text)
    if surface == "bundle":
        edits = [
            edit
            for at in _bundle_objects(text, found, "results")
            for edit in _answer_edits(text, at, public)
        ]
    else:
        edits = _answer_edits(text, len(text) - len(text.lstrip()), public)
    return jsontext.apply(text, edits).encode()


def server_timing(header: str | None) -> dict[str, float]:
    """The durations of a ``Server-Timing`` header (``parse;dur=0.021, ..., total;dur=5.1``),
    in ms by metric name; entries without a readable ``dur`` are skipped."""
    timings: dict[str, float] = {}
    if not header:
        return timings
    for entry in header.split(","):
        name, *params = (part.strip() for part in entry.split(";"))
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "dur" and name:
                with contextlib.suppress(ValueError):
                    timings[name] = float(value.strip().strip('"'))
    return timings


async def send(
    worker: Worker,
    surface: str,
    path: str,
    payload: bytes,
    *,
    public_name: str,
    timeout: float,
) -> Reply:
    """POST ``payload`` (already :func:`request_for` the worker) to ``worker`` at ``path``;
    the answer under ``public_name``.

    Raises:
        ExchangeTimeout: no whole answer within ``timeout`` seconds.
        TransportError: the worker was not reached, or its answer broke off.
        InvalidReply: a 2xx answer that is not a JSON object.
    """
    started = time.perf_counter()
    try:
        response = await worker.client.post(path, payload, headers=JSON_HEADERS, timeout=timeout)
    except ExchangeTimedOut as err:
        raise ExchangeTimeout(str(err)) from err
    except ConnectFailed as err:
        raise TransportError("the worker was not reached", sent=False) from err
    except ExchangeBroken as err:
        raise TransportError("the worker's answer broke off", sent=True) from err
    seconds = time.perf_counter() - started
    content = response.content
    if 200 <= response.status < 300:
        try:
            content = answer_for(surface, content, public_name)
        except ValueError as err:
            raise InvalidReply("the worker's answer is not a JSON object") from err
    headers = {k: response.headers[k] for k in KEPT_HEADERS if k in response.headers}
    return Reply(
        status=response.status,
        content=content,
        headers=headers,
        seconds=seconds,
        server_ms=server_timing(response.headers.get("server-timing")),
    )
