"""The per-model scheduler: admission, batching, deadlines, result cache, cancellation.

One worker thread per model forms forwards from the rows of every queued
request, so the event loop never runs a forward:

- **admission** (:meth:`ModelScheduler.submit`): a model's unanswered requests
  and their tokens are bounded (``--max-queue``, ``--max-queued-tokens``);
  over a bound, :class:`Overloaded` is raised at once for the whole request
  (all of its jobs, or none). A request larger than a bound still runs when
  nothing else is queued.
- **batching**: a forward holds at most ``--max-num-seqs`` rows and
  ``--max-num-batched-tokens`` padded tokens (rows times the longest row). A
  worker that was idle dispatches a lone request at once; otherwise it waits
  up to ``--batch-window-ms`` after the oldest queued request for company.
  Rows are taken round-robin over queued requests, so a short request is not
  stuck behind a long one.
- **length split**: when the model's cost per forward is known
  (:attr:`SchedulerLimits.forward_overhead_tokens`), the rows taken are sorted
  by length and run as the consecutive groups that cost the fewest padded
  tokens plus that overhead per forward (:func:`split_by_length`; under ``exact``
  each group padded to a fixed edge of its longest row, :class:`ExactShapes`); a
  request whose rows are all done is answered before the next group runs.
- **deadlines**: queued rows of a request past its deadline answer
  ``deadline_exceeded``; **cancellation** drops a request's queued rows.
- **result cache**: outputs are kept by row content key (LRU,
  ``--result-cache-entries``, 0 disables); equal rows inside one forward are
  computed once and mapped back to every position.
- **failures**: a forward that raises fails only the rows of that forward
  (``internal_error``); the model keeps serving.

The bounds and the planning of forwards (:class:`SchedulerLimits`,
:func:`plan_forwards`, :func:`split_by_length`) are pure functions in
:mod:`vllm_srun.compose.batching`, re-exported here; this module is the running part:
the queue, the worker thread and the cache.

Why this module is about 400 lines: :class:`ModelScheduler` is one piece of
state under one lock (the queue, the unanswered counts, the jobs being settled,
the cache), and admission, the worker, cancellation and shutdown each keep its
invariants; apart, each would have to know the others' bookkeeping.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vllm_srun.compose.batching import ExactShapes, SchedulerLimits, plan_forwards, split_by_length
from vllm_srun.plugins.spec import RowError, RowOutput, WorkItem

log = logging.getLogger(__name__)

RunRows = Callable[[list[WorkItem]], list[Any]]


class Overloaded(Exception):
    """The model's queue is full; the request was not admitted (HTTP 429 ``overloaded``)."""


class Stopped(Exception):
    """The scheduler no longer admits work (shutting down; HTTP 503 ``not_ready``)."""


@dataclass(eq=False)
class Job:
    """One request (or one bundle task) waiting for its rows.

    Attributes:
        items: the rows the request needs.
        on_done: called once, on the worker thread, with one output or
            :class:`RowError` per item, when every row is settled.
        deadline: the scheduler's clock (``time.monotonic()`` unless it was
            given another) after which queued rows expire, or ``None``.
        weight: how many requests it counts as against ``--max-queue`` (a
            decisions request counts each of its ``states`` entries).
    """

    items: list[WorkItem]
    on_done: Callable[[list[RowOutput]], None]
    deadline: float | None = None
    weight: int = 1
    enqueued: float = field(default_factory=time.monotonic)
    outputs: list[RowOutput | None] = field(init=False)
    next_row: int = 0
    pending: int = field(init=False)
    cancelled: bool = False
    dispatched_at: float | None = None
    forward_seconds: float = 0.0
    done: bool = False

    def __post_init__(self) -> None:
        self.outputs = [None] * len(self.items)
        self.pending = len(self.items)

    @property
    def tokens(self) -> int:
        """Tokens the job holds in the queue."""
        return sum(item.tokens for item in self.items)


class SchedulerMetrics:
    """Hooks the scheduler reports through; the default does nothing."""

    def queued(self, rows: int) -> None:
        """Rows now waiting."""

    def dispatched(self, queue_seconds: float) -> None:
        """A job's first row entered a forward ``queue_seconds`` after admission."""

    def forward(self, rows: int, seconds: float) -> None:
        """A forward of ``rows`` rows took ``seconds``."""

    def cache(self, outcome: str) -> None:
        """A row was a cache ``hit`` or ``miss``."""


class ModelScheduler:
    """Queue and worker of one model.

    Args:
        name: the model ID (thread name, logs).
        run: computes one forward: rows in, one output per row out.
        limits: queue bounds, batch bounds and cache size.
        metrics: where counts and durations go.
        clock: the monotonic clock, in seconds, that admission times, the
            batch window and deadlines are read from (tests pass a fake one);
            the grace of :meth:`stop` is real time.
    """

    def __init__(
        self,
        name: str,
        run: RunRows,
        limits: SchedulerLimits,
        metrics: SchedulerMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.run = run
        self.limits = limits
        self.metrics = metrics or SchedulerMetrics()
        self.clock = clock
        self._cond = threading.Condition()
        self._queue: collections.deque[Job] = collections.deque()
        self._unanswered = 0
        self._unanswered_tokens = 0
        self._queued_rows = 0
        self._stopping = False
        self._idle = True
        self._cache: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._ready: list[Job] = []
        self._thread = threading.Thread(target=self._work, name=f"scheduler:{name}", daemon=True)
        self._thread.start()

    # -- admission ---------------------------------------------------------------------------
    def submit(self, jobs: list[Job]) -> None:
        """Admit every job of one request, or none.

        Raises:
            Overloaded: a bound would be exceeded while other work is queued, or
                the request alone counts as more requests than ``max_queue``
                (a decisions request with more states than the queue holds;
                the token bound is waived for a request that finds nothing queued).
            Stopped: the scheduler is shutting down.
        """
        with self._cond:
            if self._stopping:
                raise Stopped(f"model {self.name} is shutting down")
            refusal = self._refusal(jobs)
            if refusal is not None:
                raise refusal
            self._enqueue(jobs)
        self._answer_ready()

    def submit_each(self, jobs: list[Job]) -> list[Overloaded | None]:
        """Admit each job as its own request, in order (a bundle's tasks: each one is
        admitted or refused as it would be alone, the ones before it queued).

        Returns:
            For each job, ``None`` when admitted, else why it was refused.

        Raises:
            Stopped: the scheduler is shutting down (nothing is admitted).
        """
        refused: list[Overloaded | None] = []
        with self._cond:
            if self._stopping:
                raise Stopped(f"model {self.name} is shutting down")
            for job in jobs:
                refusal = self._refusal([job])
                refused.append(refusal)
                if refusal is None:
                    self._enqueue([job])
        self._answer_ready()
        return refused

    def _refusal(self, jobs: list[Job]) -> Overloaded | None:
        """Why one request made of ``jobs`` cannot be admitted now, or ``None``; the
        caller holds the lock."""
        tokens = sum(job.tokens for job in jobs)
        entries = sum(job.weight for job in jobs)
        if entries > self.limits.max_queue:
            return Overloaded(
                f"the request counts as {entries} requests (a decisions `states` entry counts "
                f"as one) against --max-queue {self.limits.max_queue} of model {self.name}; "
                "split it into smaller requests, or raise --max-queue"
            )
        busy = self._unanswered > 0
        if busy and (
            self._unanswered + entries > self.limits.max_queue
            or self._unanswered_tokens + tokens > self.limits.max_queued_tokens
        ):
            return Overloaded(
                f"model {self.name} has {self._unanswered} requests and "
                f"{self._unanswered_tokens} tokens queued (limits {self.limits.max_queue} "
                f"and {self.limits.max_queued_tokens}); retry later"
            )
        return None

    def _enqueue(self, jobs: list[Job]) -> None:
        """Queue admitted jobs and wake the worker; the caller holds the lock."""
        now = self.clock()
        for job in jobs:
            job.enqueued = now
            self._unanswered += job.weight
            self._unanswered_tokens += job.tokens
            if not job.items:
                self._settle(job)
                continue
            self._queue.append(job)
            self._queued_rows += len(job.items)
        self.metrics.queued(self._queued_rows)
        self._cond.notify_all()

    def cancel(self, job: Job) -> None:
        """Drop the job's queued rows (its client went away); rows in a forward finish."""
        with self._cond:
            if job.done or job.cancelled:
                return
            job.cancelled = True
            undispatched = len(job.items) - job.next_row
            self._queued_rows -= undispatched
            job.pending -= undispatched
            job.next_row = len(job.items)
            if job.pending == 0:
                self._settle(job)
            self.metrics.queued(self._queued_rows)

    @property
    def unanswered(self) -> int:
        """Admitted requests not yet answered (a job counts its ``weight``)."""
        with self._cond:
            return self._unanswered

    def stop(self, grace_seconds: float) -> bool:
        """Stop admitting, let queued work finish for up to ``grace_seconds``.

        Returns whether everything finished in time; what is still queued then
        answers ``internal_error``.
        """
        deadline = time.monotonic() + grace_seconds
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            while self._unanswered and time.monotonic() < deadline:
                self._cond.wait(timeout=max(0.0, deadline - time.monotonic()))
            finished = self._unanswered == 0
            for job in list(self._queue):
                self._fail_rest(job, RowError("internal_error", "the server shut down"))
        self._answer_ready()
        self._thread.join(timeout=1.0)
        return finished

    # -- the worker --------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._idle = True
                    self._cond.wait()
                if not self._queue:
                    return
                lone = self._idle and len(self._queue) == 1
                self._idle = False
                if not lone and self.limits.max_num_seqs > 1 and self.limits.batch_window_ms > 0:
                    until = self._queue[0].enqueued + self.limits.batch_window_ms / 1000
                    while (
                        self._queued_rows < self.limits.max_num_seqs
                        and not self._stopping
                        and (wait := until - self.clock()) > 0
                    ):
                        self._cond.wait(timeout=wait)
                batch = self._take()
            self._answer_ready()
            if batch:
                self._forward(batch)
                self._answer_ready()

    def _take(self) -> list[tuple[Job, int]]:
        """Rows for one forward, round-robin over queued jobs, within the batch bounds."""
        now = self.clock()
        expired = RowError(
            "deadline_exceeded", "the request's deadline passed before this input ran"
        )
        for job in list(self._queue):
            if job.deadline is not None and now > job.deadline:
                self._fail_rest(job, expired)
        picked: list[tuple[Job, int]] = []
        longest = 0
        jobs = [j for j in self._queue if j.next_row < len(j.items)]
        if not self.limits.cross_request_batching:
            jobs = jobs[:1]
        while jobs:
            progressed = False
            for job in list(jobs):
                if job.next_row >= len(job.items):
                    jobs.remove(job)
                    continue
                row = job.items[job.next_row]
                if not self.limits.fits(len(picked), longest, row):
                    jobs = []
                    break
                picked.append((job, job.next_row))
                job.next_row += 1
                longest = max(longest, row.tokens)
                progressed = True
                if job.dispatched_at is None:
                    job.dispatched_at = now
                    self.metrics.dispatched(now - job.enqueued)
            if not progressed:
                break
        self._queued_rows -= len(picked)
        self._queue = collections.deque(j for j in self._queue if j.next_row < len(j.items))
        self.metrics.queued(self._queued_rows)
        return picked

    def _forward(self, batch: list[tuple[Job, int]]) -> None:
        """Serve rows from the cache, run the rest (each distinct row once), settle jobs.

        The distinct rows run as the groups :meth:`SchedulerLimits.groups` chooses;
        after each group, every job whose rows are all settled is answered.
        """
        positions: dict[str, list[tuple[Job, int]]] = {}
        for job, index in batch:
            positions.setdefault(job.items[index].key, []).append((job, index))
        hits: dict[str, RowOutput] = {}
        to_run: list[WorkItem] = []
        for key, places in positions.items():
            cached = self._cache_get(key)
            if cached is not None:
                hits[key] = cached
            else:
                job, index = places[0]
                to_run.append(job.items[index])
        if hits:
            self._settle_rows(positions, hits, 0.0)
        for group in self.limits.groups(to_run):
            started = time.perf_counter()
            try:
                outputs = self.run(group)
                if len(outputs) != len(group):
                    raise RuntimeError(f"{len(outputs)} outputs for {len(group)} rows")
            except Exception as err:
                log.exception("model %s: a forward of %d rows failed", self.name, len(group))
                failure = RowError("internal_error", f"the forward failed: {type(err).__name__}")
                outputs = [failure] * len(group)
            elapsed = time.perf_counter() - started
            self.metrics.forward(len(group), elapsed)
            results: dict[str, RowOutput] = {}
            for item, output in zip(group, outputs, strict=True):
                results[item.key] = output
                if not isinstance(output, RowError):
                    self._cache_put(item.key, output)
            self._settle_rows(positions, results, elapsed)
            self._answer_ready()

    def _settle_rows(
        self,
        positions: dict[str, list[tuple[Job, int]]],
        results: dict[str, RowOutput],
        elapsed: float,
    ) -> None:
        """Give every position of the keys in ``results`` its output; settle finished jobs."""
        with self._cond:
            touched = {job for key in results for job, _ in positions[key]}
            for job in touched:
                job.forward_seconds += elapsed
            for key, output in results.items():
                for job, index in positions[key]:
                    job.outputs[index] = output
                    job.pending -= 1
                    if job.pending == 0:
                        self._settle(job)

    # -- bookkeeping (under the lock) --------------------------------------------------------
    def _fail_rest(self, job: Job, error: RowError) -> None:
        undispatched = range(job.next_row, len(job.items))
        for index in undispatched:
            job.outputs[index] = error
        self._queued_rows -= len(undispatched)
        job.pending -= len(undispatched)
        job.next_row = len(job.items)
        if job.pending == 0:
            self._settle(job)

    def _settle(self, job: Job) -> None:
        """The job has every row: free its capacity and queue its answer (unless cancelled).

        Called under the lock; the answer itself runs in :meth:`_answer_ready`,
        outside it, so a slow ``finish`` never blocks admission.
        """
        if job.done:
            return
        job.done = True
        if job in self._queue:
            self._queue.remove(job)
        self._unanswered -= job.weight
        self._unanswered_tokens -= job.tokens
        if not job.cancelled:
            self._ready.append(job)
        self._cond.notify_all()

    def _answer_ready(self) -> None:
        """Call ``on_done`` of every settled job, outside the lock."""
        with self._cond:
            ready, self._ready = self._ready, []
        for job in ready:
            try:
                job.on_done([o for o in job.outputs if o is not None])
            except Exception:
                log.exception("model %s: answering a request failed", self.name)

    def _cache_get(self, key: str) -> Any:
        if self.limits.result_cache_entries <= 0:
            return None
        found = self._cache.get(key)
        if found is None:
            self.metrics.cache("miss")
            return None
        self._cache.move_to_end(key)
        self.metrics.cache("hit")
        return found

    def _cache_put(self, key: str, output: Any) -> None:
        if self.limits.result_cache_entries <= 0:
            return
        self._cache[key] = output
        self._cache.move_to_end(key)
        while len(self._cache) > self.limits.result_cache_entries:
            self._cache.popitem(last=False)


__all__ = [
    "ExactShapes",
    "Job",
    "ModelScheduler",
    "Overloaded",
    "RunRows",
    "SchedulerLimits",
    "SchedulerMetrics",
    "Stopped",
    "plan_forwards",
    "split_by_length",
]
