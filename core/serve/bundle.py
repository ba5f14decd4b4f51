"""``POST /v1/bundle``: several surface requests in one call.

Each task names one surface; tasks are planned together (a decisions task's
raw JSON is checked for duplicate keys once for the whole body), submitted per
model as one admission, and answered in task order, each with its own status:
a task that fails never fails its siblings.
"""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from vllm_srun.plugins.decisions import (
    DecisionsRequest,
    describe_path,
    loads_checked,
    non_finite,
    parse_request,
)
from vllm_srun.plugins.requests import SurfaceRequest, TextRequest
from vllm_srun.plugins.spec import RequestError

from . import schemas
from .requests import ApiError, ClientGone, Timing
from .responses import CLIENT_CLOSED, Accounting, respond
from .runtime import Planned, Runtime
from .systemone import SCHEMAS, Shape, reshape, systemone_request

BUNDLE_SURFACES = ("embeddings", "classify", "rerank", "decisions", "systemone_batch")
"""The surface keys a bundle task may carry (exactly one); ``systemone_batch`` is a
``/v1/systemone/batch`` body, answered by the decisions surface."""

RAW_SURFACES = ("decisions", "systemone_batch")
"""Task keys whose body is validated from the raw JSON (duplicate keys included)."""


def bundle_duplicates(raw: bytes) -> list[tuple[str | int, ...]]:
    """The paths of every key given twice in a bundle body (read once for all its tasks).

    Raises:
        ApiError: 400 ``invalid_request`` when the body nests too deeply to read.
    """
    try:
        return loads_checked(raw, constants=True)[1]
    except RequestError as err:
        raise ApiError(err.code, err.message) from err


def bundle_decisions(
    payload: dict[str, Any],
    index: int,
    duplicates: list[tuple[str | int, ...]],
    key: str = "decisions",
    schema: str = SCHEMAS[0],
) -> tuple[DecisionsRequest, Shape | None]:
    """A bundle task's ``decisions`` (or ``systemone_batch``) body validated, with the
    duplicate keys found under it, and how its answer is reshaped.

    Raises:
        ApiError: 400 ``invalid_request`` (for this task only): the task gives
            its key twice, holds NaN or Infinity, or fails validation.
    """
    prefix = ("tasks", index, key)
    try:
        if prefix in duplicates:
            raise RequestError(
                "invalid_request", f"tasks[{index}] has the key {key!r} more than once"
            )
        where = non_finite(payload)
        if where is not None:
            raise RequestError(
                "invalid_request",
                f"tasks[{index}].{key}.{describe_path(where)}: NaN and Infinity are not "
                "JSON numbers",
            )
        own = [d[len(prefix) :] for d in duplicates if d[: len(prefix)] == prefix]
        if key == "systemone_batch":
            return systemone_request(payload, own, schema, batch=True)
        return parse_request(payload, own), None
    except RequestError as err:
        raise ApiError(err.code, err.message) from err


@dataclass
class Task:
    """One bundle task: its ``id``, its key (the surface, or ``systemone_batch``) and
    that key's request: typed (:mod:`vllm_srun.plugins.requests`), or a decisions
    body's JSON object, which is validated per task when the bundle is planned."""

    id: str
    key: str
    payload: TextRequest | dict[str, Any]
    shape: Shape | None = None

    @property
    def surface(self) -> str:
        """The surface that answers the task."""
        return "decisions" if self.key in RAW_SURFACES else self.key


def read_tasks(body: schemas.BundleRequest, limit: int) -> list[Task]:
    """The tasks of a validated bundle body.

    Raises:
        ApiError: 413 ``request_too_large`` above ``limit`` tasks; 400
            ``invalid_request`` for a task without exactly one surface.
    """
    if len(body.tasks) > limit:
        raise ApiError(
            "request_too_large", f"the bundle has {len(body.tasks)} tasks; at most {limit}"
        )
    tasks = []
    for index, task in enumerate(body.tasks):
        surfaces = [s for s in BUNDLE_SURFACES if getattr(task, s) is not None]
        if len(surfaces) != 1:
            raise ApiError(
                "invalid_request",
                f"tasks[{index}] ({task.id}) must have exactly one of {', '.join(BUNDLE_SURFACES)}",
            )
        tasks.append(Task(task.id, surfaces[0], getattr(task, surfaces[0])))
    return tasks


def submit_by_model(
    runtime: Runtime, outcomes: list[Any], deadline_ms: float | None, timing: Timing
) -> None:
    """Submit the planned tasks, one admission per model (all or nothing for it); a
    model's refusal (429, 503) replaces its tasks' outcomes with the error."""
    groups: dict[str, list[Planned]] = {}
    for outcome in outcomes:
        if isinstance(outcome, Planned):
            if outcome.deadline_ms is None:
                outcome.deadline_ms = deadline_ms
            groups.setdefault(outcome.state.name, []).append(outcome)
    for group in groups.values():
        try:
            runtime.submit(group, timing)
        except ApiError as err:
            for planned in group:
                outcomes[outcomes.index(planned)] = err


def task_result(task: Task, outcome: Any) -> dict[str, Any]:
    """A task's entry in ``results``: its answer with status 200, or its error."""
    if isinstance(outcome, ApiError):
        return {"id": task.id, "status": outcome.status, "error": outcome.body()["error"]}
    if isinstance(outcome, BaseException):
        error = ApiError("internal_error", type(outcome).__name__)
        return {"id": task.id, "status": 500, "error": error.body()["error"]}
    if task.shape is not None:
        outcome = reshape(outcome, task.shape)
    return {"id": task.id, "status": 200, task.key: outcome}


async def answer_bundle(
    runtime: Runtime, accounting: Accounting, request: Request, body: schemas.BundleRequest
) -> Response:
    """Plan, submit and answer every task of a bundle; results in task order.

    Raises:
        ApiError: as :func:`read_tasks` raises (the bundle as a whole is refused).
    """
    timing = Timing()
    request.state.timing = timing
    try:
        tasks = read_tasks(body, runtime.config.max_bundle_tasks)
    except ApiError as err:
        accounting.refused(request.url.path, err.status, time.perf_counter() - timing.started)
        raise
    loop = asyncio.get_running_loop()
    duplicates: list[tuple[str | int, ...]] = []
    if any(t.key in RAW_SURFACES for t in tasks):
        raw = await request.body()
        duplicates = await loop.run_in_executor(runtime.executor, bundle_duplicates, raw)
    timing.add("parse", time.perf_counter() - timing.started)

    async def plan_task(index: int, task: Task) -> Planned:
        request: SurfaceRequest
        if isinstance(task.payload, dict):
            schema = runtime.config.systemone_schema
            read = functools.partial(
                bundle_decisions, task.payload, index, duplicates, task.key, schema
            )
            request, task.shape = await loop.run_in_executor(runtime.executor, read)
        else:
            request = task.payload
        return await runtime.plan(task.surface, request, timing)

    outcomes: list[Any] = await asyncio.gather(
        *(plan_task(i, task) for i, task in enumerate(tasks)), return_exceptions=True
    )
    labels = [
        o.state.name if isinstance(o, Planned) else accounting.model_label(t.payload)
        for t, o in zip(tasks, outcomes, strict=True)
    ]
    submit_by_model(runtime, outcomes, body.options.deadline_ms if body.options else None, timing)
    results = []
    for task, outcome in zip(tasks, outcomes, strict=True):
        if isinstance(outcome, Planned):
            try:
                outcome = await runtime.wait(outcome, request.is_disconnected)
            except ApiError as err:
                outcome = err
            except ClientGone:
                # The client went away: its tasks still queued go with it.
                for other in outcomes:
                    if isinstance(other, Planned) and other.job is not None:
                        assert other.state.scheduler is not None
                        other.state.scheduler.cancel(other.job)
                elapsed = time.perf_counter() - timing.started
                for other_task, label in zip(tasks, labels, strict=True):
                    accounting.count(label, other_task.surface, CLIENT_CLOSED, elapsed)
                return Response(status_code=CLIENT_CLOSED)
        results.append(task_result(task, outcome))
    elapsed = time.perf_counter() - timing.started
    for task, label, result in zip(tasks, labels, results, strict=True):
        accounting.count(label, task.surface, result["status"], elapsed)
    return respond(200, {"results": results}, timing)
