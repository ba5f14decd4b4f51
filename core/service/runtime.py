"""The model set: every served model's state, its loading with retries, and its stop.

:class:`Runtime` holds one :class:`ModelState` per configured model. A background
thread loads them (resolve, verify, compose, warm up, golden self-check; a passing
failure is retried later); a model that is ready gets its
:class:`~vllm_srun.service.model.ModelService`, which answers its requests.
:meth:`Runtime.resolve` names the service a request reaches, or why none does.

Nothing here knows HTTP: failures are
:class:`~vllm_srun.plugins.spec.RequestError` exceptions with the contract's codes.

Why this module is about 400 lines: the model states are read and changed by the
loading thread (with its retries), by resolving requests and by the stop, under one
discipline; the answering itself (:mod:`.model`) and the shutdown sequence
(:mod:`.drain`) live apart.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import heapq
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_srun.compose.golden import PENDING, GoldenResult
from vllm_srun.compose.golden import check as check_golden
from vllm_srun.compose.loader import (
    LoadError,
    LoadOptions,
    ServedCard,
    ServedModel,
    is_retryable,
    load_model,
)
from vllm_srun.config import ModelConfig, ServeConfig
from vllm_srun.plugins.host import Catalog, load_catalog
from vllm_srun.plugins.spec import RequestError, clip

from .drain import Drain
from .metrics import Metrics
from .model import ModelService, finish_pending

log = logging.getLogger(__name__)

MAX_RETRY_SECONDS = 300.0
"""Longest wait between two loads of a model (the command reference: "then doubling,
at most 300 s")."""


@dataclass
class ModelState:
    """One served model: its configuration, lifecycle state and, once ready, its service.

    Attributes:
        config: the model's options.
        status: ``loading`` (resolve, verify, load; also while waiting to retry
            a passing cause), ``warming`` (the model's and its extensions' warm-up,
            then the golden self-check), ``ready`` or ``failed``.
        reason: why it is failed, retrying (``retrying after ...``) or
            unverified; ``None`` otherwise.
        served: the loaded model while it warms or serves.
        service: what answers its requests once it is ready.
        attempts: loads started so far.
        golden: the golden self-check's result (:data:`vllm_srun.compose.golden.PENDING`
            until it ran).
        details: the card fields of a model that loaded and then failed its
            self-check (its weights are released, its card keeps them).
        created: when the runtime took the model on (Unix seconds; OpenAI's
            ``created`` on the card).
    """

    config: ModelConfig
    created: int = field(default_factory=lambda: int(time.time()))
    status: str = "loading"
    reason: str | None = None
    served: ServedModel | None = None
    service: ModelService | None = None
    attempts: int = 0
    golden: GoldenResult = PENDING
    details: ServedCard | None = None

    @property
    def name(self) -> str:
        """The model ID requests use."""
        return self.config.served_name


class Runtime:
    """Everything a serving process holds: its models, their services, metrics, limits.

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
        self._loading: threading.Thread | None = None
        self.stopping = threading.Event()
        self.drain = Drain(self)
        # Planning runs on one thread per model (ModelService.planner): tokenising
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
        """Load every model in a background thread; HTTP serves meanwhile. Once only: a
        second call returns the thread the first started (``on_settled`` is the first's).

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
        if self._loading is not None:  # started already: the one loading thread
            return self._loading
        self.started = True
        thread = threading.Thread(
            target=self._load_all, args=(on_settled,), name="model-loader", daemon=True
        )
        thread.start()
        self._loading = thread
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
                state.served = state.service = None
                continue
            if retry_in is not None:
                heapq.heappush(pending, (time.monotonic() + retry_in, order, state))
        for _, _, state in pending:
            if state.status == "loading":
                state.status, state.reason = "failed", "the server shut down before it loaded"
        if on_settled is not None and not self.stopping.is_set():
            on_settled()

    def load(self, state: ModelState) -> float | None:
        """One attempt to load a model, check it and start its service.

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
        state.service = ModelService(
            state.name,
            served,
            limits,
            self.metrics.for_model(state.name),
            profile=cfg.profile,
            revision=cfg.revision,
            max_inputs=self.config.max_inputs,
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

        In order: :meth:`stop_admitting`; the parsing thread finishes what it was
        given; then each model's service (:meth:`ModelService.stop
        <vllm_srun.service.model.ModelService.stop>`) plans what it was given (no
        planning is cancelled while there is time), drains its scheduler's queue and
        finishes the answers. Work still queued when the grace period runs out is
        answered ``internal_error`` and planning not yet started is cancelled.

        Args:
            grace_seconds: how long all of it may take, in seconds (default:
                ``--shutdown-grace-seconds``).

        Returns:
            Whether everything finished within the grace period.
        """
        grace = self.config.shutdown_grace_seconds if grace_seconds is None else grace_seconds
        deadline = time.monotonic() + grace
        self.stop_admitting()
        finished = finish_pending(self.executor, deadline)
        for service in self.services():
            finished = service.stop(deadline) and finished
        self.executor.shutdown(wait=False, cancel_futures=not finished)
        return finished

    def abandon(self, message: str) -> int:
        """Answer every admitted request still waiting ``not_ready`` with ``message`` (the
        shutdown's grace period ran out). Call on the event loop's thread.

        Returns:
            How many requests were answered so.
        """
        return sum(service.abandon(message) for service in self.services())

    def services(self) -> list[ModelService]:
        """The services of the models that are ready (or were, before a stop)."""
        return [state.service for state in self.models.values() if state.service is not None]

    # -- resolving --------------------------------------------------------------------------
    def served_state(self, name: str) -> ModelState:
        """The state of the model ``name`` names, whatever its status.

        ``name`` is a served model ID, or one of the other names the router's client
        uses (:func:`other_names`): the ID's basename (``all-MiniLM-L6-v2`` for
        ``sentence-transformers/all-MiniLM-L6-v2``), the model's repository, or the
        repository's basename. A served ID always wins.

        Raises:
            RequestError: ``model_not_found`` naming the served models; or, for a
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
            raise RequestError(
                "model_not_found",
                f"model {clip(name)!r} is ambiguous: it names {both}; use the full model ID",
            )
        served = ", ".join(self.models) or "none"
        raise RequestError(
            "model_not_found", f"model {clip(name)!r} is not served here (served: {served})"
        )

    def resolve(self, name: str | None) -> ModelService:
        """The service of the model a request names (optional while one model is served).

        ``name`` is looked up as :meth:`served_state` does (the ID, its basename, the
        repository).

        Raises:
            RequestError: ``model_not_found`` (an ambiguous name too); ``not_ready``
                while it loads, after it failed, or while the process shuts down
                (unless the request was received before, :meth:`Drain.admits
                <vllm_srun.service.drain.Drain.admits>`).
        """
        if not self.drain.admits():
            raise RequestError("not_ready", "the server is shutting down; retry on another replica")
        if name is None:
            if len(self.models) != 1:
                names = ", ".join(self.models)
                raise RequestError("invalid_request", f"name the model: one of {names}")
            state = next(iter(self.models.values()))
        else:
            state = self.served_state(name)
        if state.status != "ready" or state.service is None:
            why = f": {state.reason}" if state.reason else ""
            if state.status == "failed":  # the form the frontend and the router print
                raise RequestError("not_ready", f"model {state.name} failed to load{why}")
            raise RequestError("not_ready", f"model {state.name} is {state.status}{why}")
        return state.service


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
