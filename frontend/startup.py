"""Startup: waiting for the managed deployments, and what ``/startup-status`` says
meanwhile.

The frontend serves a configuration only once every managed deployment it uses is
ready. While it waits, :class:`StartupStatus` keeps the phase
(``loading_model_deployments``, ``initializing_models``, ``ready`` or ``error``) and
each deployment's state, and :func:`wait_for_deployments` prints the progress line
on every change. The wait ends at once on a condition a worker's supervisor
reports (:attr:`~.workers.supervisor.Supervisor.fatal`), or after
``VLLM_SRUN_READY_TIMEOUT`` with upstream's message.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .config.durations import format_duration
from .pool import ReplicaPool
from .workers.supervisor import Clock, RealClock, Supervisor
from .workers.worker import Worker

PHASES = ("loading_model_deployments", "initializing_models", "ready", "error")

TICK = 1.0
"""Seconds between re-reads of the workers while waiting (besides their changes)."""


class StartupFailed(Exception):
    """A managed deployment will not become ready; the message is upstream's."""


@dataclass
class DeploymentView:
    """One deployment in use: its pool (its workers and its state) and the supervisors
    of its managed workers.

    Attributes:
        name: the deployment.
        artifact: what it serves (``""`` for an attached deployment that does not say).
        managed: whether any worker is managed (only those are waited for).
        pool: its replica pool (the workers, in declaration order, and their state).
        supervisors: the supervisors of its managed workers.
    """

    name: str
    artifact: str
    managed: bool
    pool: ReplicaPool
    supervisors: list[Supervisor] = field(default_factory=list)

    @property
    def workers(self) -> tuple[Worker, ...]:
        return self.pool.workers

    @property
    def ready(self) -> bool:
        """Every managed worker is ready (an attached deployment: any worker)."""
        managed = [w for w in self.workers if w.managed]
        if managed:
            return all(w.ready for w in managed)
        return any(w.ready for w in self.workers)

    def state(self) -> tuple[str, str]:
        """The deployment's state and reason, as its pool says them."""
        return self.pool.state, self.pool.reason

    def processes(self) -> str:
        return ", ".join(w.process for w in self.workers if w.process)

    def fatal(self) -> str | None:
        return next((s.fatal for s in self.supervisors if s.fatal), None)


def progress_line(views: Sequence[DeploymentView], mode: str = "Router") -> str:
    """``Waiting for Router-managed model deployments, 0 of 1 ready: primary (owner/name)
    loading``, or the all-ready line; ``mode`` (``Router`` or ``Engine``) names who
    manages them."""
    managed = [v for v in views if v.managed]
    ready = [v for v in managed if v.ready]
    if len(ready) == len(managed):
        return (
            f"{mode}-managed model deployments are ready ({len(managed)}). "
            f"Starting {mode.lower()} services..."
        )
    pending = []
    for view in managed:
        if view.ready:
            continue
        state, reason = view.state()
        pending.append(f"{view.name} ({view.artifact}) {state}" + (f": {reason}" if reason else ""))
    return (
        f"Waiting for {mode}-managed model deployments, {len(ready)} of {len(managed)} ready: "
        + "; ".join(pending)
    )


class StartupStatus:
    """What ``/startup-status`` reports, and whether ``/ready`` may say yes."""

    def __init__(self, views: Sequence[DeploymentView]) -> None:
        self.views = list(views)
        self.preparing: tuple[int, list[DeploymentView]] | None = None
        """A reload's ``config_version`` and deployments while it prepares beside the
        serving ones (``/startup-status`` lists them under ``preparing``)."""
        self.phase = "loading_model_deployments"
        self.message = "waiting for the managed model deployments"
        self.updated_at = time.time()

    def set(self, phase: str, message: str) -> None:
        assert phase in PHASES, phase
        self.phase, self.message, self.updated_at = phase, message, time.time()

    @property
    def ready(self) -> bool:
        return self.phase == "ready"

    def unserved(self) -> str:
        """Why a managed deployment takes no request now, once started (``""`` when each
        has a ready replica): a stopped or stalled pool makes ``/ready`` 503 again."""
        for view in self.views:
            if view.managed and not view.pool.ready:
                state, reason = view.state()
                return f'model_runtime deployment "{view.name}" has no ready replica: {state}' + (
                    f": {reason}" if reason else ""
                )
        return ""

    @staticmethod
    def _entries(views: Sequence[DeploymentView]) -> list[dict[str, Any]]:
        entries = []
        for view in views:
            state, reason = view.state()
            entries.append(
                {
                    "name": view.name,
                    "artifact": view.artifact,
                    "process": view.processes(),
                    "state": state,
                    "ready": view.ready,
                    "reason": reason,
                }
            )
        return entries

    def document(self) -> dict[str, Any]:
        """The ``/startup-status`` JSON (upstream's keys), with ``preparing`` (the
        reload's ``config_version``, its managed deployments and those still pending)
        while a reload prepares."""
        managed = [v for v in self.views if v.managed]
        entries = self._entries(managed)
        stamp = datetime.fromtimestamp(self.updated_at, UTC)
        extra: dict[str, Any] = {}
        if self.preparing is not None:
            version, views = self.preparing
            coming = [v for v in views if v.managed]
            extra["preparing"] = {
                "config_version": version,
                "pending_models": [v.name for v in coming if not v.ready],
                "model_deployments": self._entries(coming),
            }
        return {
            "phase": self.phase,
            "ready": self.ready,
            "message": self.message,
            "downloading_model": None,
            "pending_models": [v.name for v in managed if not v.ready],
            "ready_models": sum(v.ready for v in managed),
            "total_models": len(managed),
            "model_deployments": entries,
            "embedding_provider": None,
            "updated_at": stamp.isoformat().replace("+00:00", "Z"),
            **extra,
        }


async def wait_for_deployments(
    views: Sequence[DeploymentView],
    *,
    timeout: float,
    source: str = "VLLM_SRUN_READY_TIMEOUT",
    clock: Clock | None = None,
    report: Callable[[str], None] | None = None,
    status: StartupStatus | None = None,
    mode: str = "Router",
) -> None:
    """Wait until every managed deployment is ready.

    Args:
        timeout: seconds the whole wait may take.
        source: what set the timeout, as the message names it.
        report: called with the progress line each time it changes.
        mode: ``Router`` or ``Engine``, as the progress line names the frontend.
        status: kept current (its message is the progress line).

    Raises:
        StartupFailed: a supervisor's wait-ending condition
            (``model_runtime deployment "<n>": <why>``), or the timeout
            (``model_runtime deployment "<n>" did not become ready within 10m0s
            (VLLM_SRUN_READY_TIMEOUT): <state>``).
    """
    clock = clock or RealClock()
    deadline = clock.monotonic() + timeout
    managed = [v for v in views if v.managed]
    shown = ""
    while True:
        line = progress_line(views, mode)
        if line != shown:
            shown = line
            if report is not None:
                report(line)
            if status is not None:
                status.set(status.phase, line)
        for view in managed:
            fatal = view.fatal()
            if fatal and not view.ready:
                raise StartupFailed(f'model_runtime deployment "{view.name}": {fatal}')
        if all(v.ready for v in managed):
            return
        left = deadline - clock.monotonic()
        if left <= 0:
            view = next(v for v in managed if not v.ready)
            state, reason = view.state()
            raise StartupFailed(
                f'model_runtime deployment "{view.name}" did not become ready within '
                f"{format_duration(timeout)} ({source}): {state}"
                + (f": {reason}" if reason else "")
            )
        await _next_change([w for v in managed for w in v.workers], min(TICK, left), clock)


async def _next_change(workers: list[Worker], seconds: float, clock: Clock) -> None:
    """Wait for any worker's next change, at most ``seconds``."""
    waiters = [asyncio.ensure_future(w.changed()) for w in workers]
    waiters.append(asyncio.ensure_future(clock.sleep(seconds)))
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*waiters, return_exceptions=True)
