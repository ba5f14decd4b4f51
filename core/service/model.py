"""One ready model's answering: plan, schedule, finish, in three stated places.

A request to one model passes through :class:`ModelService`:

1. **plan** (:meth:`ModelService.plan`, awaited on the event loop): the request's own
   rules, ``--max-inputs`` and the family's ``plan`` (validation, tokenising) run on the
   model's planning thread (``plan``, one per model: a huge request stalls only its own
   model's planning), giving a :class:`Call`;
2. **schedule** (:meth:`ModelService.admit`, :meth:`ModelService.admit_each`): the call's
   rows join the model's :class:`~vllm_srun.service.scheduler.ModelScheduler`, whose
   worker thread (``scheduler:NAME``) runs every forward;
3. **finish** (the family's ``finish``, the answer's ``meta`` and the ``queue``,
   ``forward`` and ``post`` timings) runs on the model's finishing thread
   (``finish:NAME``, :class:`~vllm_srun.service.finish.Finisher`), never on the
   forward thread nor the event loop, whichever thread settled the call's rows; the
   answers it finished since it last woke reach the event loop in one callback, each
   through its call's future.

:meth:`ModelService.answer` awaits that body; :meth:`ModelService.cancel` drops a call's
queued rows. Failures are :class:`~vllm_srun.plugins.spec.RequestError` exceptions
with the contract's codes (the HTTP layer gives them their statuses).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from vllm_srun.compose.batching import SchedulerLimits
from vllm_srun.compose.loader import ServedModel
from vllm_srun.plugins.decisions import DecisionsRequest
from vllm_srun.plugins.loaded import Answered, answered
from vllm_srun.plugins.requests import SurfaceBody, SurfaceRequest
from vllm_srun.plugins.responses import ResponseMeta
from vllm_srun.plugins.spec import RequestError, RowOutput, clip

from .finish import Finisher
from .scheduler import Job, ModelScheduler, Overloaded, SchedulerMetrics, Stopped
from .timing import Timing

log = logging.getLogger(__name__)

IDLE_CHECK_SECONDS = 0.05
"""How long :meth:`ModelService.stop` waits at least for the planning thread to show it
is idle."""

Body = Answered
"""An answer body as the family's ``finish`` builds it, with ``model`` (and ``meta``)."""


class ClientGone(Exception):
    """The caller went away while its call waited; its queued rows were dropped."""


@dataclass(eq=False)
class Call:
    """One request planned for one model: what is admitted, answered or cancelled.

    Attributes:
        service: the model answering it.
        surface: ``embeddings``, ``classify``, ``rerank`` or ``decisions``.
        plan: the family's plan (its ``items`` are the rows; ``queue_entries`` its
            weight against ``--max-queue``).
        timing: where the call's phases are recorded.
        deadline_ms: ``options.deadline_ms``, counted from ``timing.arrived``
            (``None``: none; a bundle sets its own before admission).
        meta: whether the answer carries ``meta``.
        profile: the profile it is answered in.
    """

    service: ModelService
    surface: str
    plan: Any
    timing: Timing
    deadline_ms: float | None = None
    meta: bool = False
    profile: str = "exact"
    job: Job | None = None
    future: asyncio.Future[Body] | None = None

    @property
    def model(self) -> str:
        """The model ID answering it."""
        return self.service.name


class ModelService:
    """Plans, schedules and finishes the requests of one ready model.

    Args:
        name: the model ID requests use.
        served: the composed model.
        limits: the scheduler's bounds (the served model's, with the process's queue
            bounds and cache size).
        metrics: where the scheduler reports.
        profile: the profile the model was loaded under.
        revision: the configured revision (``meta`` of a model without a prepared package).
        max_inputs: ``--max-inputs``.
    """

    def __init__(
        self,
        name: str,
        served: ServedModel,
        limits: SchedulerLimits,
        metrics: SchedulerMetrics,
        *,
        profile: str,
        revision: str | None,
        max_inputs: int,
    ) -> None:
        self.name = name
        self.served = served
        self.profile = profile
        self.revision = revision
        self.max_inputs = max_inputs
        self.planner = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="plan"
        )
        self.finisher = Finisher(name)
        self.scheduler = ModelScheduler(name, served.run_rows, limits, metrics)
        # The futures of admitted calls not yet answered (event-loop thread only).
        self._waiting: set[asyncio.Future[Body]] = set()

    # -- plan -------------------------------------------------------------------------------
    async def plan(self, surface: str, request: SurfaceRequest, timing: Timing) -> Call:
        """Check and plan ``request`` on the model's planning thread (``tokenize`` phase).

        Raises:
            RequestError: ``invalid_request`` (another profile than the loaded one, the
                request's own rules, over ``--max-inputs``), or the family's refusal.
        """
        meta, profile = meta_options(request)
        if profile is not None and profile != self.profile:
            offered = ", ".join(p.name for p in self.served.profiles)
            loaded = self.profile
            raise RequestError(
                "invalid_request",
                f"options.profile {clip(profile)!r} is not how model {self.name} was loaded: "
                f"it was loaded with profile {loaded}; send {loaded} or leave options.profile "
                f"out, or load the model with another profile (--profile NAME or models-file "
                f"`profile: NAME`; it can load under {offered})",
            )
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            if isinstance(request, SurfaceBody):
                request.check()
                self.check_input_count(request)
            plan = await loop.run_in_executor(
                self.planner, self.served.loaded.plan, surface, request
            )
        finally:
            timing.add("tokenize", time.perf_counter() - started)
        return Call(
            self,
            surface,
            plan,
            timing,
            request.deadline_ms,
            meta=meta,
            profile=profile or self.profile,
        )

    def check_input_count(self, request: SurfaceBody) -> None:
        """A classify, embeddings or rerank request holds at most ``--max-inputs`` inputs
        (documents); the card's ``limits.max_inputs`` says so, and a client splits above it.

        Raises:
            RequestError: ``invalid_request`` naming the count, the limit and the fix.
        """
        count, limit = request.input_count, self.max_inputs
        if count > limit:
            what = "documents" if request.surface == "rerank" else "inputs"
            raise RequestError(
                "invalid_request",
                f"the request holds {count} {what}; this server takes at most {limit} in one "
                f"request (limits.max_inputs, --max-inputs): split it into several requests",
            )

    # -- schedule ---------------------------------------------------------------------------
    def admit(self, calls: list[Call]) -> None:
        """Admit the calls of one request at once, or none (on the event loop).

        Raises:
            RequestError: ``overloaded`` or ``not_ready`` (shutting down).
        """
        jobs = self._jobs(calls)
        try:
            self.scheduler.submit(jobs)
        except Overloaded as err:
            raise RequestError("overloaded", str(err)) from err
        except Stopped as err:
            raise RequestError("not_ready", str(err)) from err

    def admit_each(self, calls: list[Call]) -> list[RequestError | None]:
        """Admit each call as its own request, in order (a bundle's tasks: each gets the
        answer it would have had alone, the ones before it queued).

        Returns:
            For each, ``None`` when admitted, else its ``overloaded`` or ``not_ready`` error.
        """
        jobs = self._jobs(calls)
        try:
            refused = self.scheduler.submit_each(jobs)
        except Stopped as err:
            return [RequestError("not_ready", str(err)) for _ in calls]
        return [None if r is None else RequestError("overloaded", str(r)) for r in refused]

    def _jobs(self, calls: list[Call]) -> list[Job]:
        """Give each call its future and its job."""
        loop = asyncio.get_running_loop()
        jobs = []
        for call in calls:
            timing = call.timing
            deadline = (
                None if call.deadline_ms is None else timing.arrived + call.deadline_ms / 1000
            )
            call.future = loop.create_future()
            self._waiting.add(call.future)
            call.future.add_done_callback(self._waiting.discard)
            call.job = Job(
                list(call.plan.items),
                self._on_settled(call, loop),
                deadline=deadline,
                weight=max(1, call.plan.queue_entries),
            )
            jobs.append(call.job)
        return jobs

    def _on_settled(
        self, call: Call, loop: asyncio.AbstractEventLoop
    ) -> Callable[[list[RowOutput]], None]:
        """The job's completion: hand its outputs to the finishing thread."""

        def settled(outputs: list[RowOutput]) -> None:
            self.finisher.put(call.future, functools.partial(self._finish, call, outputs), loop)

        return settled

    # -- finish -----------------------------------------------------------------------------
    def _finish(self, call: Call, outputs: list[RowOutput]) -> Body | RequestError:
        """(The finishing thread.) The family's answer to ``call``, or why it failed."""
        job = call.job
        assert job is not None
        started = time.perf_counter()
        answer: Body | RequestError
        try:
            body = answered(self.served.loaded.finish(call.plan, outputs), self.name)
            if call.meta:
                body["meta"] = self.response_meta(call, job, body.get("meta"))
            answer = body
        except Exception as err:
            log.exception("model %s: finishing a response failed", self.name)
            answer = RequestError(
                "internal_error", f"finishing the response failed: {type(err).__name__}"
            )
        queued = None if job.dispatched_at is None else job.dispatched_at - job.enqueued
        call.timing.answered(queued, job.forward_seconds, time.perf_counter() - started)
        return answer

    # -- answer -----------------------------------------------------------------------------
    async def answer(self, call: Call, disconnected: Callable[[], Awaitable[bool]]) -> Body:
        """The answer of an admitted call; a caller that goes away cancels its queued rows.

        Raises:
            RequestError: ``internal_error`` (finishing failed), ``not_ready`` (the
                shutdown's grace ran out, :meth:`abandon`).
            ClientGone: ``disconnected()`` said so while it waited.
        """
        assert call.future is not None and call.job is not None
        while True:
            done, _ = await asyncio.wait({call.future}, timeout=0.25)
            if done:
                return call.future.result()
            if await disconnected():
                self.cancel(call)
                raise ClientGone()

    def cancel(self, call: Call) -> None:
        """Drop the call's queued rows (rows in a forward finish); it is never answered."""
        if call.job is not None:
            self.scheduler.cancel(call.job)

    # -- meta -------------------------------------------------------------------------------
    def identity_meta(self, profile: str) -> ResponseMeta:
        """The model's identity in every ``meta``: the fields its ``/v1/models`` card
        gives them (``model_id`` is the card's ``id``; ``revision`` the 40-hex commit,
        ``null`` for a local package), the ``profile`` the request was answered in and its
        ``numerics``."""
        served = self.served
        prepared = served.prepared
        revision = self.revision if prepared is None else prepared.revision
        digest = None if prepared is None else prepared.verification.model_sha256
        return {
            "model_id": self.name,
            "revision": revision,
            "model_sha256": digest,
            "profile": profile,
            "numerics": served.profile.numerics,
            "engine": served.engine.name,
            "accelerator": served.placement.accelerator.name,
            "device": served.placement.device.device,
        }

    def response_meta(self, call: Call, job: Job, own: ResponseMeta | None) -> ResponseMeta:
        """The ``meta`` of an answer that asked for it (``options.return_meta``).

        The model's identity (:meth:`identity_meta`), then this call's ``queue_ms`` (from
        admission to its first forward) and ``compute_ms`` (the forwards its rows ran in),
        both float milliseconds, then the answering family's or extension's own ``meta``
        keys (``own``: classify ``head``, embeddings ``representation``, a decisions
        readout's method and questions), which win over the identity's (a zero-shot
        readout says ``numerics: approximate``). A ``representation`` whose
        ``model_sha256`` is null gets the model's.
        """
        identity = self.identity_meta(call.profile)
        queued = 0.0 if job.dispatched_at is None else job.dispatched_at - job.enqueued
        meta: ResponseMeta = {
            **identity,
            "queue_ms": round(max(0.0, queued) * 1000, 3),
            "compute_ms": round(job.forward_seconds * 1000, 3),
        }
        if own is not None:
            meta.update(own)
        representation = meta.get("representation")
        if representation is not None and representation.get("model_sha256") is None:
            meta["representation"] = {**representation, "model_sha256": identity["model_sha256"]}
        return meta

    # -- shutdown ---------------------------------------------------------------------------
    def abandon(self, message: str) -> int:
        """Answer every admitted call still waiting ``not_ready`` with ``message`` (the
        shutdown's grace ran out); on the event loop's thread. Returns how many."""
        abandoned = 0
        for future in list(self._waiting):
            if not future.done():
                future.set_exception(RequestError("not_ready", message))
                # its waiter may already be cancelled (answered 503 by the HTTP layer):
                # mark the exception seen, so asyncio does not log it as lost
                future.add_done_callback(lambda done: done.exception())
                abandoned += 1
        return abandoned

    def stop(self, deadline: float) -> bool:
        """Plan what was given, drain the queue, finish what settled, by ``deadline``
        (``time.monotonic()``), then stop the three threads; whether all of it was in
        time. Rows still queued then answer ``internal_error``; planning not yet started
        is cancelled."""
        finished = finish_pending(self.planner, deadline)
        finished = self.scheduler.stop(max(0.0, deadline - time.monotonic())) and finished
        finished = self.finisher.finish_pending(deadline) and finished
        self.planner.shutdown(wait=False, cancel_futures=not finished)
        self.finisher.stop()
        return finished


def meta_options(request: SurfaceRequest) -> tuple[bool, str | None]:
    """Whether ``request`` asks for ``meta`` (``options.return_meta``) and the profile it
    names (``options.profile``; ``None`` when it names none)."""
    if isinstance(request, DecisionsRequest):
        return request.return_meta, request.profile
    options = request.options
    if options is None:
        return False, None
    return options.meta, options.profile


def finish_pending(executor: concurrent.futures.ThreadPoolExecutor, deadline: float) -> bool:
    """Wait until ``executor`` has run everything submitted to it so far, or ``deadline``
    (``time.monotonic()``) passes; whether it did. The executors have one thread, so a
    no-op submitted now runs only after everything before it."""
    try:
        marker = executor.submit(lambda: None)
    except RuntimeError:  # already shut down: nothing more will run there
        return True
    try:
        # At least IDLE_CHECK_SECONDS: an idle executor must not count as unfinished
        # because the deadline had already passed when it was asked.
        marker.result(timeout=max(IDLE_CHECK_SECONDS, deadline - time.monotonic()))
    except concurrent.futures.TimeoutError:
        return False
    return True
