"""The serving runtime: models with their states and schedulers, and how a request is answered.

Data flows one way: the route parses and validates, :meth:`Runtime.plan`
tokenises off the event loop, the model's scheduler admits and batches,
its worker thread runs the forward and the family's ``finish``, and the
answer comes back to the event loop through a future.

Why this module is over 400 lines: the model states it holds are read and
changed by three things that must agree under one lock discipline (loading
with retries, answering, and the shutdown that drains both); spread over
modules, each would reach into the others' state. The parts that need no
state (scheduling, loading one model, the cards) live elsewhere.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import heapq
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_srun.compose.golden import PENDING, GoldenResult
from vllm_srun.compose.golden import check as check_golden
from vllm_srun.compose.loader import LoadError, LoadOptions, ServedModel, is_retryable, load_model
from vllm_srun.plugins import Catalog, load_catalog
from vllm_srun.plugins.decisions import DecisionsRequest
from vllm_srun.plugins.requests import SurfaceBody, SurfaceRequest
from vllm_srun.plugins.spec import RequestError, RowOutput, clip
from vllm_srun.scheduler import Job, ModelScheduler, Overloaded, Stopped

from .config import ModelConfig, ServeConfig
from .metrics import Metrics
from .requests import ApiError, ClientGone, Timing

log = logging.getLogger(__name__)

RECEIVED_BEFORE_SHUTDOWN: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "received_before_shutdown", default=False
)
"""Whether the request being answered (in its own task) was received before the shutdown
began: set by the HTTP layer (:class:`vllm_srun.serve.envelope.InFlight`). Such a
request is still admitted while the process drains; any other gets 503."""

IDLE_CHECK_SECONDS = 0.05
"""How long :meth:`Runtime.stop` waits at least for an executor to show it is idle."""

MAX_RETRY_SECONDS = 300.0
"""Longest wait between two loads of a model (the command reference: "then doubling,
at most 300 s")."""


@dataclass
class ModelState:
    """One served model: its configuration, lifecycle state and, once ready, its scheduler.

    Attributes:
        config: the model's options.
        status: ``loading`` (resolve, verify, load; also while waiting to retry
            a passing cause), ``warming`` (the model's and its extensions' warm-up,
            then the golden self-check), ``ready`` or ``failed``.
        reason: why it is failed, retrying (``retrying after ...``) or
            unverified; ``None`` otherwise.
        served: the loaded model while it warms or serves.
        scheduler: its scheduler once ready.
        attempts: loads started so far.
        golden: the golden self-check's result (:data:`vllm_srun.compose.golden.PENDING`
            until it ran).
        details: the card fields of a model that loaded and then failed its
            self-check (its weights are released, its card keeps them).
        planner: the model's planning thread (validation and tokenising): one
            per model, so a huge request stalls only its own model's planning.
        created: when the runtime took the model on (Unix seconds; OpenAI's
            ``created`` on the card).
    """

    config: ModelConfig
    created: int = field(default_factory=lambda: int(time.time()))
    status: str = "loading"
    reason: str | None = None
    served: ServedModel | None = None
    scheduler: ModelScheduler | None = None
    attempts: int = 0
    golden: GoldenResult = PENDING
    details: dict[str, Any] | None = None
    planner: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="plan"
        )
    )

    @property
    def name(self) -> str:
        """The model ID requests use."""
        return self.config.served_name


@dataclass
class Planned:
    """A surface request planned for one model, ready to submit."""

    state: ModelState
    surface: str
    plan: Any
    deadline_ms: float | None = None
    job: Job | None = None
    future: asyncio.Future[dict[str, Any]] | None = None
    meta: bool = False
    profile: str = "exact"


class Runtime:
    """Everything a serving process holds: models, schedulers, metrics, limits.

    Args:
        config: the ``serve`` options and models.
        catalog: the composed plugins (discovered when omitted).
        loader: how a model is loaded (tests pass a fake).
    """

    def __init__(
        self,
        config: ServeConfig,
        catalog: Catalog | None = None,
        loader: Callable[..., ServedModel] = load_model,
    ) -> None:
        self.config = config
        self.catalog = catalog or load_catalog()
        self.loader = loader
        self.metrics = Metrics()
        self.models = {m.served_name: ModelState(m) for m in config.models}
        self.accepting = True
        self.started = False
        self.stopping = threading.Event()
        # The futures of submitted requests not yet answered (event-loop thread only):
        # what abandon() answers 503 when the shutdown's grace period runs out.
        self._waiting: set[asyncio.Future[dict[str, Any]]] = set()
        # Planning runs on one thread per model (ModelState.planner): tokenising
        # releases the GIL and takes well under a millisecond per text, and every
        # extra Python thread contends for the GIL with the forwards (measured: c32
        # throughput 85 -> 92-95 req/s from 4 planning threads to 1). This one
        # parses raw decisions bodies, before the model they name is known.
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="parse"
        )
        for name in self.models:
            self.metrics.model_ready.labels(model=name).set(0)

    # -- lifecycle --------------------------------------------------------------------------
    def start_loading(self, on_settled: Callable[[], None] | None = None) -> threading.Thread:
        """Load every model in a background thread; HTTP serves meanwhile.

        The thread loads the models in order and keeps a schedule of retries:
        a model whose load failed for a passing cause waits (status
        ``loading``, reason ``retrying after ...``) while the thread loads the
        others, and loads again when its time comes. The thread ends once
        every model is ready or failed, or promptly on :meth:`stop`.

        Args:
            on_settled: called on the loading thread when it ends with every model
                ready or failed (not when :meth:`stop` ended it): the moment
                :meth:`cannot_serve` is final.
        """
        self.started = True
        thread = threading.Thread(
            target=self._load_all, args=(on_settled,), name="model-loader", daemon=True
        )
        thread.start()
        return thread

    def cannot_serve(self) -> list[str]:
        """Why this process will never answer a request: ``model NAME: reason`` for each
        model when every one has failed (a cause that cannot pass, a failed golden
        self-check, or a passing cause that outlasted ``--load-attempts``); empty
        while any model is ready or still loading, warming or waiting to retry."""
        states = list(self.models.values())
        if not states or any(state.status != "failed" for state in states):
            return []
        return [f"model {state.name}: {state.reason}" for state in states]

    def retry_delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based): ``--load-retry-seconds``
        doubling each time, at most :data:`MAX_RETRY_SECONDS`."""
        return float(min(self.config.load_retry_seconds * 2 ** (attempt - 1), MAX_RETRY_SECONDS))

    def _load_all(self, on_settled: Callable[[], None] | None = None) -> None:
        # (due time, model order, state): the next load is the earliest due.
        pending = [(0.0, order, state) for order, state in enumerate(self.models.values())]
        while pending and not self.stopping.is_set():
            due, order, state = pending[0]
            if self.stopping.wait(max(0.0, due - time.monotonic())):
                break
            heapq.heappop(pending)
            try:
                retry_in = self.load(state)
            except Exception as err:  # a bug must not stall the models after this one
                log.exception("model %s: loading it raised", state.name)
                state.status = "failed"
                state.reason = f"loading raised {type(err).__name__}: {err}"
                state.served = state.scheduler = None
                continue
            if retry_in is not None:
                heapq.heappush(pending, (time.monotonic() + retry_in, order, state))
        for _, _, state in pending:
            if state.status == "loading":
                state.status, state.reason = "failed", "the server shut down before it loaded"
        if on_settled is not None and not self.stopping.is_set():
            on_settled()

    def load(self, state: ModelState) -> float | None:
        """One attempt to load a model, check it and start its scheduler.

        Returns:
            Seconds to wait before the next attempt when the load failed for
            a passing cause and attempts remain (the state stays ``loading``
            with reason ``retrying after <cause> (attempt N of M in S s)``);
            ``None`` once the model is ``ready`` or ``failed``.
        """
        cfg = state.config
        state.attempts += 1
        state.status = "loading"
        try:
            served = self.loader(
                cfg.model,
                LoadOptions(
                    **dataclasses.asdict(cfg.engine_args()),
                    name=state.name,
                    revision=cfg.revision,
                    threads=self.config.threads,
                    cache_dir=self.config.cache_dir,
                    offline=self.config.offline,
                    accept_licences=self.config.accept_licences,
                    family_options=dict(cfg.options),
                ),
                catalog=self.catalog,
            )
        except Exception as err:
            cause = (
                str(err)
                if isinstance(err, LoadError)
                else f"loading raised {type(err).__name__}: {err}"
            )
            if not is_retryable(err):
                state.status, state.reason = "failed", cause
                log.error(
                    "model %s failed to load: %s",
                    state.name,
                    cause,
                    exc_info=not isinstance(err, LoadError),
                )
                return None
            attempts = self.config.load_attempts
            if state.attempts >= attempts:
                suffix = f" (gave up after {attempts} attempts)" if attempts > 1 else ""
                state.status, state.reason = "failed", cause + suffix
                log.error("model %s failed to load: %s", state.name, state.reason)
                return None
            delay = self.retry_delay(state.attempts)
            state.reason = (
                f"retrying after {cause} (attempt {state.attempts + 1} of {attempts} "
                f"in {delay:g} s)"
            )
            log.warning("model %s: %s", state.name, state.reason)
            return delay
        state.status, state.reason, state.served = "warming", None, served
        try:
            served.loaded.warm()
        except Exception as err:
            state.status, state.served = "failed", None
            state.reason = f"warming up raised {type(err).__name__}: {err}"
            log.exception("model %s failed to warm up", state.name)
            return None
        result = check_golden(served, self.catalog)
        state.golden = result
        if result.status == "failed":
            state.status, state.reason = "failed", result.reason
            state.details, state.served = served.card(), None
            log.error("model %s failed its golden self-check: %s", state.name, result.reason)
            return None
        if self.stopping.is_set():
            state.status, state.reason = "failed", "the server shut down before it was ready"
            state.served = None
            return None
        limits = dataclasses.replace(
            served.limits(),
            max_queue=self.config.max_queue,
            max_queued_tokens=self.config.max_queued_tokens,
            result_cache_entries=self.config.result_cache_entries,
        )
        state.served = served
        state.scheduler = ModelScheduler(
            state.name, served.run_rows, limits, self.metrics.for_model(state.name)
        )
        state.status, state.reason = "ready", None
        self.metrics.model_ready.labels(model=state.name).set(1)
        log.info(
            "model %s is ready on %s (%s), golden %s%s",
            state.name,
            served.placement.device.device,
            served.engine.name,
            result.status,
            f" against {result.reference}" if result.reference else "",
        )
        return None

    def stop_admitting(self) -> None:
        """Refuse new requests from now on (503 ``not_ready``; ``/health`` says shutting
        down) and tell the loader to give up: it loads no further model, and a model it
        is loading now is not started. Requests already received keep being planned
        and answered. Idempotent."""
        self.accepting = False
        self.stopping.set()  # a loader waiting to retry a model gives up at once
        for state in self.models.values():
            self.metrics.model_ready.labels(model=state.name).set(0)

    def stop(self, grace_seconds: float | None = None) -> bool:
        """Stop admitting, let the work already received finish, then stop the threads.

        In order: :meth:`stop_admitting`; the planning threads finish what they
        were given (a request being tokenised still reaches its scheduler: no
        planning is cancelled while there is time); each scheduler drains its
        queue; the planning executors shut down. Work still queued when the
        grace period runs out is answered by the scheduler (``internal_error``
        rows) and planning not yet started is cancelled.

        Args:
            grace_seconds: how long all of it may take, in seconds (default:
                ``--shutdown-grace-seconds``).

        Returns:
            Whether everything finished within the grace period.
        """
        grace = self.config.shutdown_grace_seconds if grace_seconds is None else grace_seconds
        deadline = time.monotonic() + grace
        self.stop_admitting()
        executors = [self.executor, *(state.planner for state in self.models.values())]
        # A list, not a generator: every executor gets its chance, not only up to the first.
        finished = all([_finish_pending(executor, deadline) for executor in executors])
        for state in self.models.values():
            if state.scheduler is not None:
                remaining = max(0.0, deadline - time.monotonic())
                finished = state.scheduler.stop(remaining) and finished
        for executor in executors:
            executor.shutdown(wait=False, cancel_futures=not finished)
        return finished

    def abandon(self, message: str) -> int:
        """Answer every submitted request still waiting 503 ``not_ready`` with ``message``
        (the shutdown's grace period ran out). Call on the event loop's thread.

        Returns:
            How many requests were answered so.
        """
        abandoned = 0
        for future in list(self._waiting):
            if not future.done():
                future.set_exception(ApiError("not_ready", message))
                # its waiter may already be cancelled (answered 503 by the envelope):
                # mark the exception seen, so asyncio does not log it as lost
                future.add_done_callback(lambda done: done.exception())
                abandoned += 1
        return abandoned

    # -- health -----------------------------------------------------------------------------
    # -- answering --------------------------------------------------------------------------
    def served_state(self, name: str) -> ModelState:
        """The state of the model ``name`` names, whatever its status.

        ``name`` is a served model ID, or one of the other names the router's client
        uses (:func:`other_names`): the ID's basename (``all-MiniLM-L6-v2`` for
        ``sentence-transformers/all-MiniLM-L6-v2``), the model's repository, or the
        repository's basename. A served ID always wins.

        Raises:
            ApiError: 404 ``model_not_found`` naming the served models; or, for a
                name that fits several models, naming each of them.
        """
        state = self.models.get(name)
        if state is not None:
            return state
        fits = [s for s in self.models.values() if name in other_names(s)]
        if len(fits) == 1:
            return fits[0]
        if fits:
            both = " and ".join(s.name for s in fits)
            raise ApiError(
                "model_not_found",
                f"model {clip(name)!r} is ambiguous: it names {both}; use the full model ID",
            )
        served = ", ".join(self.models) or "none"
        raise ApiError(
            "model_not_found", f"model {clip(name)!r} is not served here (served: {served})"
        )

    def resolve(self, name: str | None) -> ModelState:
        """The model a request names (optional while one model is served).

        ``name`` is looked up as :meth:`served_state` does (the ID, its basename, the
        repository).

        Raises:
            ApiError: 404 ``model_not_found`` (an ambiguous name too); 503
                ``not_ready`` while it loads, after it failed, or while the
                process shuts down (unless the request was received before,
                :data:`RECEIVED_BEFORE_SHUTDOWN`).
        """
        if not self.accepting and not RECEIVED_BEFORE_SHUTDOWN.get():
            raise ApiError("not_ready", "the server is shutting down; retry on another replica")
        if name is None:
            if len(self.models) != 1:
                names = ", ".join(self.models)
                raise ApiError("invalid_request", f"name the model: one of {names}")
            state = next(iter(self.models.values()))
        else:
            state = self.served_state(name)
        if state.status != "ready" or state.scheduler is None:
            why = f": {state.reason}" if state.reason else ""
            if state.status == "failed":  # the form the frontend and the router print
                raise ApiError("not_ready", f"model {state.name} failed to load{why}")
            raise ApiError("not_ready", f"model {state.name} is {state.status}{why}")
        return state

    def check_input_count(self, request: SurfaceBody) -> None:
        """A classify, embeddings or rerank request holds at most ``--max-inputs`` inputs
        (documents); the card's ``limits.max_inputs`` says so, and a client splits above it.

        Raises:
            RequestError: ``invalid_request`` naming the count, the limit and the fix.
        """
        count, limit = request.input_count, self.config.max_inputs
        if count > limit:
            what = "documents" if request.surface == "rerank" else "inputs"
            raise RequestError(
                "invalid_request",
                f"the request holds {count} {what}; this server takes at most {limit} in one "
                f"request (limits.max_inputs, --max-inputs): split it into several requests",
            )

    async def plan(self, surface: str, request: SurfaceRequest, timing: Timing) -> Planned:
        """Resolve the model and plan the request off the event loop.

        Args:
            surface: the surface (``embeddings``, ``decisions``, ...).
            request: the typed request, validated for shape (a decisions
                request parsed from the raw body).

        Raises:
            ApiError: 400/404/422/503 as :meth:`resolve`, the request's own
                rules (:meth:`~vllm_srun.plugins.requests.SurfaceBody.check`)
                and the family's plan say.
        """
        state = self.resolve(request.model)
        served = state.served
        assert served is not None
        meta, profile = meta_options(request)
        loaded = state.config.profile
        if profile is not None and profile != loaded:
            offered = ", ".join(p.name for p in served.profiles)
            raise ApiError(
                "invalid_request",
                f"options.profile {clip(profile)!r} is not how model {state.name} was loaded: it "
                f"was loaded with profile {loaded}; send {loaded} or leave options.profile out, "
                f"or load the model with another profile (--profile NAME or models-file "
                f"`profile: NAME`; it can load under {offered})",
            )
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            if isinstance(request, SurfaceBody):
                request.check()
                self.check_input_count(request)
            plan = await loop.run_in_executor(state.planner, served.loaded.plan, surface, request)
        except RequestError as err:
            raise ApiError(err.code, err.message) from err
        finally:
            timing.add("tokenize", time.perf_counter() - started)
        return Planned(
            state,
            surface,
            plan,
            request.deadline_ms,
            meta=meta,
            profile=profile or loaded,
        )

    def submit(self, planned: list[Planned], timing: Timing) -> None:
        """Admit planned requests of one model at once (each gets a job and a future).

        Raises:
            ApiError: 429 ``overloaded`` or 503 ``not_ready``; nothing is admitted then.
        """
        scheduler = self._jobs(planned, timing)
        try:
            scheduler.submit([item.job for item in planned if item.job is not None])
        except Overloaded as err:
            raise ApiError("overloaded", str(err)) from err
        except Stopped as err:
            raise ApiError("not_ready", str(err)) from err

    def submit_each(self, planned: list[Planned], timing: Timing) -> list[ApiError | None]:
        """Admit planned requests of one model each as its own request, in order (a
        bundle's tasks: each gets the status it would have had alone).

        Returns:
            For each, ``None`` when admitted, else its 429 ``overloaded`` or 503
            ``not_ready`` error.
        """
        scheduler = self._jobs(planned, timing)
        try:
            refused = scheduler.submit_each([item.job for item in planned if item.job is not None])
        except Stopped as err:
            return [ApiError("not_ready", str(err)) for _ in planned]
        return [None if r is None else ApiError("overloaded", str(r)) for r in refused]

    def _jobs(self, planned: list[Planned], timing: Timing) -> ModelScheduler:
        """Give each planned request its future and job; the model's scheduler."""
        loop = asyncio.get_running_loop()
        for item in planned:
            deadline = (
                None if item.deadline_ms is None else timing.arrived + item.deadline_ms / 1000
            )
            item.future = loop.create_future()
            self._waiting.add(item.future)
            item.future.add_done_callback(self._waiting.discard)
            item.job = Job(
                list(item.plan.items),
                self._answerer(item, loop, timing),
                deadline=deadline,
                weight=max(1, item.plan.queue_entries),
            )
        scheduler = planned[0].state.scheduler
        assert scheduler is not None
        return scheduler

    def _answerer(
        self, item: Planned, loop: asyncio.AbstractEventLoop, timing: Timing
    ) -> Callable[[list[RowOutput]], None]:
        """The job's completion: finish on the worker thread, hand the body to the loop."""
        served = item.state.served
        assert served is not None

        def on_done(outputs: list[RowOutput]) -> None:
            job = item.job
            assert job is not None
            started = time.perf_counter()
            try:
                body: Any = {"model": item.state.name, **served.loaded.finish(item.plan, outputs)}
                if item.meta:
                    body["meta"] = response_meta(item, job, body.get("meta"))
            except Exception as err:
                log.exception("model %s: finishing a response failed", item.state.name)
                body = ApiError(
                    "internal_error", f"finishing the response failed: {type(err).__name__}"
                )
            queued = None if job.dispatched_at is None else job.dispatched_at - job.enqueued
            timing.answered(queued, job.forward_seconds, time.perf_counter() - started)
            with contextlib.suppress(RuntimeError):  # the loop closed: the shutdown answered it
                loop.call_soon_threadsafe(_resolve, item.future, body)

        return on_done

    async def wait(
        self, item: Planned, disconnected: Callable[[], Awaitable[bool]]
    ) -> dict[str, Any]:
        """The answer of a submitted request; a client that goes away cancels its queued rows."""
        assert item.future is not None and item.job is not None
        while True:
            done, _ = await asyncio.wait({item.future}, timeout=0.25)
            if done:
                return item.future.result()
            if await disconnected():
                assert item.state.scheduler is not None
                item.state.scheduler.cancel(item.job)
                raise ClientGone()


def other_names(state: ModelState) -> set[str]:
    """The names besides its ID that a model answers to: the ID's basename, its
    repository (the card's ``repo`` once known; before, the configured MODEL when
    it names a repository rather than a directory) and that repository's basename."""
    repo: Any = None
    if state.served is not None:
        repo = getattr(state.served.prepared, "repo", None)
    elif state.details is not None:
        repo = state.details.get("repo")
    elif not state.config.model.startswith(("/", ".", "~")):
        configured = state.config.model.partition("@")[0]
        repo = None if Path(configured).is_dir() else configured
    names = {state.name.rsplit("/", 1)[-1]}
    if isinstance(repo, str) and repo:
        names |= {repo, repo.rsplit("/", 1)[-1]}
    return names - {state.name, ""}


def meta_options(request: SurfaceRequest) -> tuple[bool, str | None]:
    """Whether ``request`` asks for ``meta`` (``options.return_meta``) and the profile it
    names (``options.profile``; ``None`` when it names none)."""
    if isinstance(request, DecisionsRequest):
        return request.return_meta, request.profile
    options = request.options
    if options is None:
        return False, None
    return options.meta, options.profile


def identity_meta(state: ModelState, profile: str) -> dict[str, Any]:
    """The model's identity in every ``meta``: the fields its ``/v1/models`` card gives
    them (``model_id`` is the card's ``id``; ``revision`` the 40-hex commit, ``null`` for
    a local package), the ``profile`` the request was answered in and its ``numerics``."""
    served = state.served
    assert served is not None
    prepared = served.prepared
    revision = state.config.revision if prepared is None else prepared.revision
    digest = None if prepared is None else prepared.verification.model_sha256
    return {
        "model_id": state.name,
        "revision": revision,
        "model_sha256": digest,
        "profile": profile,
        "numerics": served.profile.numerics,
        "engine": served.engine.name,
        "accelerator": served.placement.accelerator.name,
        "device": served.placement.device.device,
    }


def response_meta(item: Planned, job: Job, own: Any) -> dict[str, Any]:
    """The ``meta`` of an answer that asked for it (``options.return_meta``).

    The model's identity (:func:`identity_meta`), then this request's ``queue_ms`` (from
    admission to its first forward) and ``compute_ms`` (the forwards its rows ran in),
    both float milliseconds, then the answering family's or extension's own ``meta``
    keys (``own``: classify ``head``, embeddings ``representation``, a decisions
    readout's method and questions), which win over the identity's (a zero-shot readout
    says ``numerics: approximate``). A ``representation`` without ``model_sha256`` gets
    the model's.
    """
    identity = identity_meta(item.state, item.profile)
    queued = 0.0 if job.dispatched_at is None else job.dispatched_at - job.enqueued
    meta: dict[str, Any] = {
        **identity,
        "queue_ms": round(max(0.0, queued) * 1000, 3),
        "compute_ms": round(job.forward_seconds * 1000, 3),
    }
    if isinstance(own, Mapping):
        meta.update(own)
    representation = meta.get("representation")
    if isinstance(representation, Mapping) and "model_sha256" not in representation:
        meta["representation"] = {"model_sha256": identity["model_sha256"], **representation}
    return meta


def _finish_pending(executor: concurrent.futures.ThreadPoolExecutor, deadline: float) -> bool:
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


def _resolve(future: asyncio.Future[Any] | None, body: Any) -> None:
    if future is None or future.done():
        return
    if isinstance(body, BaseException):
        future.set_exception(body)
    else:
        future.set_result(body)
