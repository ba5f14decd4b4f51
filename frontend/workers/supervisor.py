"""Supervision: keep each managed worker process running, and stop it cleanly.

A :class:`Supervisor` owns one process (one replica). It clears a stale socket (a
socket another frontend's worker answers on ends the start, touching nothing), writes
the models file, starts ``vllm-srun serve --uds`` in its own process group,
re-logs its output line by line under its process name and polls its health. When
the process exits it is started again after a back-off of 1 s, doubling up to 60 s
and back to 1 s after 2 minutes of stable running. A process whose every model
failed is recycled (SIGTERM, SIGKILL 10 s later, then restarted with the same
back-off). Stopping sends SIGTERM to the process group and SIGKILL after 10 s.

No orphans: the child asks the kernel for SIGTERM when the frontend dies, however
it dies (``PR_SET_PDEATHSIG`` on Linux), and checks its parent is still there once
asked, so a frontend killed with SIGKILL leaves no worker behind.

What ends a readiness wait at once is kept in :attr:`Supervisor.fatal`: the
command cannot run; 3 exits, each within 30 s, before the worker was ever ready;
every model failed to load 3 times in a row; a model failed in a process that is
not recycled; an ``incompatible`` worker; a socket another frontend's worker answers
on. Clocks and sleeps are injectable
(:class:`Clock`), so the back-off is tested without waiting for it.

Why one module of 400-odd lines: :class:`Supervisor` is one process's life (clear the
socket, start, re-log, watch, back off, recycle, stop) as one loop over one state, and
:attr:`Supervisor.fatal` is set from each step of it; the plan it starts, the health poll
and the worker it reports through already live in :mod:`.plan`, :mod:`.health` and
:mod:`.worker`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import re
import signal
import socket
import stat
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from .health import HealthPoller
from .plan import ReplicaPlan
from .worker import Worker

log = logging.getLogger("vllm_sr.workers")
runtime_log = logging.getLogger("vllm_sr.runtime")

WORKER_LINE = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) (.*)", re.S
)
"""A worker's own log line (``<time> <LEVEL> <logger>: <message>``): re-logged without
its time (the frontend's line has one) at its level."""

FIRST_BACKOFF = 1.0
"""Seconds before the first restart."""

MAX_BACKOFF = 60.0
"""Longest wait between restarts."""

STABLE_RUN = 120.0
"""A process that ran this long (seconds) restarts after :data:`FIRST_BACKOFF` again."""

QUICK_EXIT = 30.0
"""An exit this soon (seconds) after the start, before the worker was ever ready,
counts towards :data:`QUICK_EXITS`."""

QUICK_EXITS = 3
"""Quick exits before ready that end a readiness wait."""

FAILED_LOADS = 3
"""Recycles in a row of a process whose every model failed that end a readiness wait."""

KILL_GRACE = 10.0
"""Seconds between SIGTERM and SIGKILL."""

TAIL_LINES = 20
"""Output lines kept of the current process, for the messages about its exit."""

PR_SET_PDEATHSIG = 1


class Clock(Protocol):
    """Time as the supervisor reads and waits for it."""

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class RealClock:
    """The event loop's time."""

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def _death_signal_setup(parent: int) -> Callable[[], None]:
    """The child's setup before ``exec``: SIGTERM when the parent dies, and exit at once
    when it already has (the parent died between fork and this call)."""
    libc_name = ctypes.util.find_library("c") if sys.platform.startswith("linux") else None

    def setup() -> None:
        if libc_name:
            libc = ctypes.CDLL(libc_name, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return setup


def worker_line(line: str) -> tuple[int, str]:
    """The level and text a worker's output line is re-logged with: a log line of its own
    (:data:`WORKER_LINE`) at its level, without its time; any other line at INFO, as is."""
    match = WORKER_LINE.fullmatch(line)
    if match is None:
        return logging.INFO, line
    return logging.getLevelNamesMapping()[match.group(1)], match.group(2)


def describe_exit(code: int | None) -> str:
    """``exit status 1`` or ``killed by SIGKILL``."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"exit status {code}"


def clear_socket(path: Path) -> None:
    """Make ``path`` free for a new worker: remove a stale socket nobody listens on.

    Two frontends may share ``VLLM_SRUN_DIR``: a socket something still answers on is
    left alone.

    Raises:
        OSError: ``path`` exists and is not a socket, or another process listens on it
            (the message says which).
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise OSError(
            f"{path} exists and is not a socket; remove it, or give VLLM_SRUN_DIR a "
            "directory of its own"
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    except OSError:
        pass
    finally:
        probe.close()
    raise OSError(f"another process listens on {path}; give each frontend its own VLLM_SRUN_DIR")


def remove_stale_socket(path: Path) -> None:
    """Remove ``path`` if it is a socket nobody listens on (what a worker that crashed
    left); anything else, a socket another frontend's worker answers on included, stays."""
    with contextlib.suppress(OSError):
        clear_socket(path)


class Supervisor:
    """Keeps one managed worker process running.

    Args:
        plan: the worker's plan (command line, socket, models file).
        worker: the :class:`~.worker.Worker` its state and card go to.
        clock: time and sleeps of the back-off.
        recycle: restart a process whose every model failed (upstream does; off, a
            failed model ends a readiness wait at once).
        kill_grace: seconds between SIGTERM and SIGKILL.
        poller: keyword arguments for each process's :class:`~.health.HealthPoller`.
        environ: the process environment (default: this process's).
    """

    def __init__(
        self,
        plan: ReplicaPlan,
        worker: Worker,
        *,
        clock: Clock | None = None,
        recycle: bool = True,
        kill_grace: float = KILL_GRACE,
        poller: dict[str, Any] | None = None,
        environ: dict[str, str] | None = None,
    ) -> None:
        self.plan = plan
        self.worker = worker
        self.clock = clock or RealClock()
        self.recycle = recycle
        self.kill_grace = kill_grace
        self.poller_options = poller or {}
        self.environ = environ
        self.fatal: str | None = None
        self.process: asyncio.subprocess.Process | None = None
        self.pid: int | None = None
        self.backoff = FIRST_BACKOFF
        self.quick_exits = 0
        self.failed_loads = 0
        self.ever_ready = False
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._stopping = asyncio.Event()
        self._recycle = asyncio.Event()
        self._failed: dict[str, str] = {}
        self._task: asyncio.Task[None] | None = None
        self._wrote_models = False
        """The models file is this supervisor's (it wrote it): :meth:`stop` removes it."""

    # -- the loop ------------------------------------------------------------------------------
    def start(self) -> asyncio.Task[None]:
        """Run :meth:`run` as a task (once)."""
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"supervise {self.plan.process}")
        return self._task

    async def run(self) -> None:
        """Start the process, and again after each exit, until :meth:`stop`."""
        while not self._stopping.is_set():
            started = self.clock.monotonic()
            how = await self._run_once()
            if self._stopping.is_set():
                break
            ran = self.clock.monotonic() - started
            if ran >= STABLE_RUN:
                self.backoff = FIRST_BACKOFF
            self._judge(how, ran)
            wait = self.backoff
            self.backoff = min(self.backoff * 2, MAX_BACKOFF)
            self.worker.restarts += 1
            self.worker.forget_card()
            self.worker.update("restarting", f"{how}; restarting in {wait:g} s")
            log.warning(
                "runtime_process_exited: %s %s; restarting in %g s", self.plan.process, how, wait
            )
            await self._sleep_unless_stopped(wait)
        self.worker.update("stopped", "")

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        sleeper = asyncio.ensure_future(self.clock.sleep(seconds))
        stopper = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleeper, stopper):
                task.cancel()
            await asyncio.gather(sleeper, stopper, return_exceptions=True)

    def _judge(self, how: str, ran: float) -> None:
        """Count a quick exit or a failed load; set :attr:`fatal` when a limit is reached."""
        if how.startswith("cannot run"):
            return  # :attr:`fatal` says so already
        if how.startswith("every model failed"):
            self.failed_loads += 1
            if self.failed_loads >= FAILED_LOADS and self.fatal is None:
                failures = ", ".join(f"{m}: {r}" for m, r in self._failed.items())
                self.fatal = (
                    f"every model failed to load {self.failed_loads} times in a row: {{{failures}}}"
                )
            return
        if not self.ever_ready and ran < QUICK_EXIT:
            self.quick_exits += 1
            if self.quick_exits >= QUICK_EXITS and self.fatal is None:
                last = next((line for line in reversed(self.tail) if line.strip()), "")
                for path, shown in (
                    (self.plan.socket, "<socket>"),
                    (self.plan.models_file, "<models file>"),
                ):
                    if path is not None:  # the reason is shown where paths are not
                        last = last.replace(str(path), shown)
                detail = f"{how}: {last}" if last else how
                self.fatal = (
                    f"runtime process exited {self.quick_exits} times before it was ready: {detail}"
                )

    async def _run_once(self) -> str:
        """One life of the process; how it ended (``exit status 1``, ``every model failed
        to load: ...``, ``cannot run: ...``)."""
        plan = self.plan
        self.tail.clear()
        self._recycle.clear()
        self._failed = {}
        if plan.socket is not None:
            try:  # first: a socket another frontend's worker answers on means touch nothing
                clear_socket(plan.socket)
            except OSError as err:
                self.fatal = str(err)
                self.worker.update("failed", self.fatal)
                log.error("%s: %s", plan.process, self.fatal)
                return f"cannot run: {err}"
        try:
            plan.write_models_file()
            self._wrote_models = True
            process = await asyncio.create_subprocess_exec(
                *plan.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_death_signal_setup(os.getpid()),
                env=self.environ,
            )
        except OSError as err:
            text = err.strerror if isinstance(err.strerror, str) else str(err)
            problem = f"{' '.join(plan.argv[:1])}: {text}" if err.strerror else str(err)
            if isinstance(err, FileNotFoundError | PermissionError) and err.strerror:
                problem += " (set VLLM_SRUN_COMMAND to the vllm-srun command)"
            self.fatal = f"runtime command cannot run: {problem}"
            self.worker.update("failed", self.fatal)
            log.error("%s: %s", plan.process, self.fatal)
            return f"cannot run: {problem}"
        self.process, self.pid = process, process.pid
        if self.fatal and self.fatal.startswith("runtime command cannot run"):
            self.fatal = None
        log.info("runtime_process_started: %s pid %d", plan.process, process.pid)
        self.worker.update("starting", "")
        poller = HealthPoller(
            self.worker, on_health=self._on_health, starting=True, **self.poller_options
        )
        tasks = [
            asyncio.create_task(self._relog(process), name=f"log {plan.process}"),
            asyncio.create_task(poller.run(), name=f"health {plan.process}"),
            asyncio.create_task(self._watch_ready(), name=f"ready {plan.process}"),
        ]
        exited = asyncio.create_task(process.wait())
        recycle = asyncio.create_task(self._recycle.wait())
        stop = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({exited, recycle, stop}, return_when=asyncio.FIRST_COMPLETED)
            if exited.done() and not self._failed:
                how = describe_exit(process.returncode)
            elif exited.done() or recycle.done():
                failures = "; ".join(
                    f"model {m} failed to load: {r}" for m, r in self._failed.items()
                )
                log.warning(
                    "runtime_process_%s: %s every model failed (%d in a row): %s",
                    "exited" if exited.done() else "recycled",
                    plan.process,
                    self.failed_loads + 1,
                    failures,
                )
                tasks[1].cancel()  # no probe of a process being stopped
                if not exited.done():  # a runtime that gave up has exited already
                    await self.terminate()
                how = f"every model failed to load: {failures}"
            else:
                tasks[1].cancel()
                await self.terminate()
                how = "stopped"
        finally:
            for task in (exited, recycle, stop, *tasks[1:]):
                task.cancel()
            await asyncio.gather(exited, recycle, stop, *tasks[1:], return_exceptions=True)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2.0):  # the last lines of output
                    await asyncio.shield(tasks[0])
            tasks[0].cancel()
            await asyncio.gather(tasks[0], return_exceptions=True)
            self.process = None
        return how

    async def _watch_ready(self) -> None:
        """Reset the quick-exit and failed-load counts once the worker is ready."""
        while True:
            if self.worker.ready:
                self.ever_ready = True
                self.quick_exits = 0
                self.failed_loads = 0
                if self.fatal and not self.fatal.startswith("runtime command"):
                    self.fatal = None
            if self.worker.state == "incompatible":
                self.fatal = f"model runtime is incompatible: {self.worker.reason}"
            elif self.worker.state == "failed" and not self.recycle:
                self.fatal = (
                    f"model runtime is not ready: model {self.worker.served_name} failed to "
                    f"load: {self.worker.reason}"
                )
            await self.worker.changed()

    def _on_health(self, document: dict[str, Any]) -> None:
        """Ask for a recycle when every model of the process failed."""
        models = document.get("models")
        if not isinstance(models, dict) or not models:
            return
        states = {name: m for name, m in models.items() if isinstance(m, dict)}
        if states and all(m.get("status") == "failed" for m in states.values()):
            self._failed = {name: str(m.get("reason") or "") for name, m in states.items()}
            if self.recycle:
                self._recycle.set()

    async def _relog(self, process: asyncio.subprocess.Process) -> None:
        """Each line the process writes, logged under its process name (one time on each
        line: the worker's own is dropped, its level kept; see :func:`worker_line`)."""
        assert process.stdout is not None
        while True:
            raw = await process.stdout.readline()
            if not raw:
                return
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            self.tail.append(line)
            level, text = worker_line(line)
            runtime_log.log(level, "%s: %s", self.plan.process, text)

    # -- stopping ------------------------------------------------------------------------------
    async def terminate(self) -> None:
        """SIGTERM to the process group; SIGKILL after :attr:`kill_grace` seconds."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        self._signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(self.kill_grace):
                await process.wait()
        except TimeoutError:
            log.warning(
                "runtime_process_killed: %s did not stop within %g s of SIGTERM",
                self.plan.process,
                self.kill_grace,
            )
            self._signal(signal.SIGKILL)
            await process.wait()

    def _signal(self, sig: signal.Signals) -> None:
        process = self.process
        if process is None or process.returncode is not None:
            return
        try:
            os.killpg(process.pid, sig)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(sig)

    async def stop(self) -> None:
        """Stop supervising: terminate the process (SIGTERM, SIGKILL after the grace),
        wait for the loop to end, close the worker's connections, and remove what this
        supervisor left: the socket of a worker that crashed, the models file it wrote."""
        self._stopping.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        else:
            await self.terminate()
        await self.worker.aclose()
        if self.pid is not None and self.plan.socket is not None:
            remove_stale_socket(self.plan.socket)  # a worker that crashed leaves its socket
        if self._wrote_models and self.plan.models_file is not None:
            with contextlib.suppress(FileNotFoundError):
                self.plan.models_file.unlink()
