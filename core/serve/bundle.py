"""``POST /v1/bundle``: several surface requests in one call.

The route reads the raw body itself (:func:`read_bundle`, on the parsing
thread): only a malformed bundle is refused as a whole (400 ``invalid_request``:
not a JSON object, no ``tasks`` or not an array of task objects, an empty one, a
task without a non-empty string ``id`` or without exactly one surface key, an
unknown key; 413 ``request_too_large`` above ``--max-bundle-tasks``). Each
task's own body then goes through one path, :func:`read_task`, whatever its
surface: a body that fails validation becomes that task's 400 with the message
its surface route gives, and its siblings are still answered. Tasks are planned
together, submitted per model as one admission, and answered in task order,
each with the status it would have had alone.

Why one module of 400-odd lines: a bundle is one request read, planned, admitted and
answered in task order, and every step reads and writes the same :class:`Task` records;
the surfaces' own reading and answering are the other serve modules'.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from pydantic import Field, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from vllm_srun.plugins.decisions import describe_path, loads_checked, non_finite
from vllm_srun.plugins.decisions.answers import AnsweredDecisions
from vllm_srun.plugins.loaded import Answered
from vllm_srun.plugins.requests import (
    TEXT_REQUESTS,
    Strict,
    SurfaceRequest,
    TextRequest,
    validation_problems,
)
from vllm_srun.plugins.spec import RequestError
from vllm_srun.service.model import Call, ClientGone, ModelService
from vllm_srun.service.runtime import Runtime
from vllm_srun.service.timing import Timing

from . import schemas
from .jev import SCHEMA as JEV
from .requests import ApiError, as_api_error, error_document, request_timing, validation_param
from .responses import CLIENT_CLOSED, Accounting, respond
from .systemone import SCHEMAS, Shape, reshape, systemone_request

BUNDLE_SURFACES = ("embeddings", "classify", "rerank", "decisions", "systemone_batch")
"""The surface keys a bundle task may carry (exactly one); ``systemone_batch`` is a
``/v1/systemone/batch`` body, answered by the decisions surface."""

RAW_SURFACES = ("decisions", "systemone_batch")
"""Task keys whose body is validated from the raw JSON (duplicate keys included)."""

Path = tuple[str | int, ...]

INLINE_BYTES = 16384
"""Bodies up to this size are read on the event loop, as FastAPI reads a typed route's
body (well under a millisecond; a hop to the parsing thread would cost more); larger
ones on the parsing thread, so a huge bundle never stalls other requests."""


class RawTask(Strict):
    """A task as the bundle itself is checked: its ``id`` and its surface keys, each
    body left unread (:func:`read_task` reads it). The contract's
    :class:`~.schemas.BundleTask` documents the bodies."""

    id: str = Field(min_length=1)
    embeddings: Any = None
    classify: Any = None
    rerank: Any = None
    decisions: Any = None
    systemone_batch: Any = None


class RawBundle(Strict):
    """A bundle body as it is checked before its tasks are read."""

    tasks: list[RawTask] = Field(min_length=1)
    options: schemas.BundleOptions | None = None


@dataclass
class Task:
    """One bundle task.

    Attributes:
        id: the task's ``id``.
        key: its surface key (a surface, or ``systemone_batch``).
        payload: that key's JSON value, as sent.
        request: the typed request read from it (``None`` until read, or when
            it failed: ``error``).
        error: why the body was refused (this task's status and error).
        shape: how a decisions answer is reshaped (:func:`~.systemone.reshape`).
    """

    id: str
    key: str
    payload: Any
    request: SurfaceRequest | None = None
    error: ApiError | None = None
    shape: Shape | None = None

    @property
    def surface(self) -> str:
        """The surface that answers the task."""
        return "decisions" if self.key in RAW_SURFACES else self.key


@dataclass
class Bundle:
    """A bundle whose tasks are read: each with its request or its error."""

    tasks: list[Task]
    deadline_ms: float | None


def _kind(value: Any) -> str:
    """What a JSON value is, as a message names it (``a string``, ``null``, ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "a string" if isinstance(value, str) else "an array"


def _loads(raw: bytes) -> Any:
    """The body's JSON value (``NaN`` and ``Infinity`` read as floats, as every typed
    route reads them; the surfaces refuse them where a number must be finite).

    Raises:
        ApiError: 400 ``invalid_request`` worded as the typed routes word it.
    """
    if not raw:
        raise ApiError("invalid_request", "the body is empty; send a JSON object")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as err:
        raise ApiError("invalid_request", f"malformed JSON: {err.msg}") from err
    except (ValueError, UnicodeDecodeError) as err:
        raise ApiError("invalid_request", f"malformed JSON: {err}") from err
    except RecursionError as err:
        raise ApiError(
            "invalid_request", "the body nests arrays or objects too deeply to read"
        ) from err


NOT_JSON = "the body must be a JSON object; send it with content-type: application/json"
"""The refusal of a body not sent as JSON (worded as the typed routes word it)."""


def sent_as_json(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` announces JSON (``application/json`` or
    ``application/*+json``), the bodies the typed routes read as JSON: a bundle
    without it is refused as they refuse theirs."""
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def read_bundle(raw: bytes, limit: int, schema: str) -> Bundle:
    """Check a bundle body and read each task's request (a large body off the event loop:
    :data:`INLINE_BYTES`).

    Args:
        raw: the body bytes.
        limit: ``--max-bundle-tasks``.
        schema: ``--systemone-schema``, which ``systemone_batch`` tasks follow (in
            ``vllm-sr/5.0`` when it is ``jev``: a bundle answers in this runtime's shapes).

    Returns:
        The tasks in order, each with its typed request or, when its body fails
        validation, its own error (:func:`read_task`); and ``options.deadline_ms``.

    Raises:
        ApiError: the bundle as a whole is malformed: 413 ``request_too_large``
            above ``limit`` tasks; 400 ``invalid_request`` for a body that is not
            a JSON object, ``tasks`` missing, not an array of objects or empty,
            a task without a non-empty string ``id``, an unknown key, bad
            ``options``, or a task without exactly one surface key.
    """
    value = _loads(raw)
    if not isinstance(value, dict):
        raise ApiError("invalid_request", NOT_JSON)
    tasks = value.get("tasks")
    if isinstance(tasks, list) and len(tasks) > limit:
        raise ApiError("request_too_large", f"the bundle has {len(tasks)} tasks; at most {limit}")
    for index, task in enumerate(tasks if isinstance(tasks, list) else ()):
        if not isinstance(task, dict):
            raise ApiError(
                "invalid_request",
                f"tasks[{index}] must be an object {{id, <surface>: request}}, not {_kind(task)}",
            )
    try:
        bundle = RawBundle.model_validate(value)
    except ValidationError as err:
        raise ApiError("invalid_request", validation_problems(err.errors())) from err
    read = []
    for index, task in enumerate(bundle.tasks):
        keys = [k for k in BUNDLE_SURFACES if getattr(task, k) is not None]
        if len(keys) != 1:
            raise ApiError(
                "invalid_request",
                f"tasks[{index}] ({task.id}) must have exactly one of {', '.join(BUNDLE_SURFACES)}",
            )
        read.append(Task(task.id, keys[0], getattr(task, keys[0])))
    duplicates: list[Path] = []
    if any(task.key in RAW_SURFACES for task in read):
        try:
            duplicates = loads_checked(raw, constants=True)[1]
        except RequestError as err:
            raise ApiError(err.code, err.message) from err
    for index, task in enumerate(read):
        read_task(task, index, duplicates, schema)
    deadline = bundle.options.deadline_ms if bundle.options is not None else None
    return Bundle(read, deadline)


def read_task(task: Task, index: int, duplicates: list[Path], schema: str) -> None:
    """Read one task's body into ``task.request`` (and ``task.shape``), or its refusal
    into ``task.error``: the one path of every surface.

    A typed surface (embeddings, classify, rerank) is validated as its route
    validates it (the same model, the same message; the request's own rules
    and the model run when it is planned, as on the route); a decisions or
    ``systemone_batch`` body as ``/v1/decisions`` or ``/v1/systemone/batch``
    reads it, duplicate keys (``duplicates``, paths in the whole bundle)
    included.
    """
    try:
        if task.key in RAW_SURFACES:
            task.request, task.shape = _raw_request(task, index, duplicates, schema)
        else:
            task.request = _typed_request(task.key, task.payload)
    except RequestError as err:
        task.error = ApiError(err.code, err.message)
    except ApiError as err:
        task.error = err


def _typed_request(surface: str, payload: Any) -> TextRequest:
    """A typed surface's body validated as its route validates it.

    Raises:
        RequestError: ``invalid_request``: the body is not an object.
        ApiError: ``invalid_request`` with the route's message and ``param``.
    """
    if not isinstance(payload, Mapping):
        raise RequestError("invalid_request", "the request must be a JSON object")
    try:
        return TEXT_REQUESTS[surface].model_validate(payload)
    except ValidationError as err:
        problems = err.errors()
        message = validation_problems(problems)
        raise ApiError("invalid_request", message, validation_param(problems)) from err


def _raw_request(
    task: Task, index: int, duplicates: list[Path], schema: str
) -> tuple[SurfaceRequest, Shape]:
    """A ``decisions`` (or ``systemone_batch``) body validated, with the duplicate keys
    found under it, and how its answer is reshaped.

    Raises:
        RequestError: ``invalid_request``: the task gives its key twice, holds NaN
            or Infinity, or fails validation.
    """
    prefix = ("tasks", index, task.key)
    if prefix in duplicates:
        raise RequestError(
            "invalid_request", f"tasks[{index}] has the key {task.key!r} more than once"
        )
    if not isinstance(task.payload, dict):
        raise RequestError("invalid_request", "the request must be a JSON object")
    where = non_finite(task.payload)
    if where is not None:
        raise RequestError(
            "invalid_request",
            f"tasks[{index}].{task.key}.{describe_path(where)}: NaN and Infinity are not "
            "JSON numbers",
        )
    own = [d[len(prefix) :] for d in duplicates if d[: len(prefix)] == prefix]
    batch = task.key == "systemone_batch"
    # A bundle is this runtime's own surface: its tasks answer in this runtime's shapes
    # (a task's failure stays in its place), the Jev schema's included.
    own_schema = schema if batch and schema != JEV else SCHEMAS[0]
    return systemone_request(task.payload, own, own_schema, batch=batch)


def admit_by_model(outcomes: list[Any], deadline_ms: float | None) -> None:
    """Admit the planned tasks, each admitted or refused as it would be alone (one
    admission per model, so a model's tasks queue together); a refusal (429, 503)
    replaces that task's outcome with the error."""
    groups: dict[ModelService, list[Call]] = {}
    for outcome in outcomes:
        if isinstance(outcome, Call):
            if outcome.deadline_ms is None:
                outcome.deadline_ms = deadline_ms
            groups.setdefault(outcome.service, []).append(outcome)
    for service, group in groups.items():
        for call, refusal in zip(group, service.admit_each(group), strict=True):
            if refusal is not None:
                outcomes[outcomes.index(call)] = refusal


def task_result(task: Task, outcome: Answered | BaseException) -> schemas.BundleResult:
    """A task's entry in ``results``: its answer with status 200 under the task's key, or
    its error."""
    if isinstance(outcome, (ApiError, RequestError)):
        error = as_api_error(outcome)
    elif isinstance(outcome, BaseException):
        error = ApiError("internal_error", type(outcome).__name__)
    else:
        error = None
    if error is not None:
        document = error_document(error.status, error.code, error.message, error.param)
        return {"id": task.id, "status": error.status, "error": document["error"]}
    answer: object = outcome
    if task.shape is not None:  # a decisions or systemone_batch task
        answer = reshape(cast(AnsweredDecisions, outcome), task.shape)
    # The task's key names its surface, and the answer is that surface's response.
    return cast(schemas.BundleResult, {"id": task.id, "status": 200, task.key: answer})


async def answer_bundle(runtime: Runtime, accounting: Accounting, request: Request) -> Response:
    """Read, plan, submit and answer every task of a bundle; results in task order.

    ``Server-Timing``: ``parse`` until every task is read, ``tokenize`` the
    time the tasks took to plan (together, not summed), ``queue``,
    ``forward`` and ``post`` those of the task answered last, then
    ``serialize``; so the phases never add up to more than ``total``.

    Raises:
        ApiError: as :func:`read_bundle` raises (the bundle as a whole is refused).
    """
    timing = request_timing(request)
    loop = asyncio.get_running_loop()
    try:
        raw = await request.body()
    except ClientDisconnect:
        accounting.refused(request.url.path, CLIENT_CLOSED, time.perf_counter() - timing.started)
        return Response(status_code=CLIENT_CLOSED)
    read = functools.partial(
        read_bundle, raw, runtime.config.max_bundle_tasks, runtime.config.systemone_schema
    )
    try:
        if raw and not sent_as_json(request.headers.get("content-type")):
            raise ApiError("invalid_request", NOT_JSON)
        if len(raw) <= INLINE_BYTES:
            bundle = read()
        else:
            bundle = await loop.run_in_executor(runtime.executor, read)
    except ApiError as err:
        timing.parsed()
        accounting.refused(request.url.path, err.status, time.perf_counter() - timing.started)
        raise
    timing.parsed()
    tasks = bundle.tasks

    async def plan_task(task: Task) -> Call | ApiError:
        if task.request is None:
            assert task.error is not None
            return task.error
        # Tasks plan concurrently (one planning thread per model): their own
        # tokenize times overlap, so the bundle times the whole stage instead; from
        # admission on, each task counts its deadline and its phases in the bundle's.
        service = runtime.resolve(task.request.model)
        call = await service.plan(task.surface, task.request, Timing())
        call.timing = timing
        return call

    planning = time.perf_counter()
    outcomes: list[Any] = await asyncio.gather(
        *(plan_task(task) for task in tasks), return_exceptions=True
    )
    timing.add("tokenize", time.perf_counter() - planning)
    labels = [
        o.model if isinstance(o, Call) else accounting.model_label(t.payload)
        for t, o in zip(tasks, outcomes, strict=True)
    ]
    admit_by_model(outcomes, bundle.deadline_ms)
    results = []
    for task, outcome in zip(tasks, outcomes, strict=True):
        if isinstance(outcome, Call):
            try:
                outcome = await outcome.service.answer(outcome, request.is_disconnected)
            except RequestError as err:
                outcome = err
            except ClientGone:
                # The client went away: its tasks still queued go with it.
                for other in outcomes:
                    if isinstance(other, Call):
                        other.service.cancel(other)
                elapsed = time.perf_counter() - timing.started
                for other_task, label in zip(tasks, labels, strict=True):
                    accounting.count(label, other_task.surface, CLIENT_CLOSED, elapsed)
                return Response(status_code=CLIENT_CLOSED)
        results.append(task_result(task, outcome))
    elapsed = time.perf_counter() - timing.started
    for task, label, result in zip(tasks, labels, results, strict=True):
        accounting.count(label, task.surface, result["status"], elapsed)
    return respond(200, {"results": results}, timing)
