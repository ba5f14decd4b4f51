"""``vllm-srun serve``: bind, compose the plugins, load models in the background, serve HTTP.

The listener is bound first, so a port in use or a bad ``--uds`` path ends
the command at once with a message saying what to do (exit 1); ``serving ...
on ...`` is logged only once the listener accepts. A Unix socket is created
mode 0600 (only the server's user may connect) and removed at exit.

Models start loading once the plugins are composed, while the HTTP app is built and
uvicorn starts (an ONNX Runtime session opens without holding the GIL, so the two
overlap). HTTP answers from the first moment (``/health/live`` 200, ``/health`` 503
with per-model states) while models load. SIGTERM (or SIGINT) starts the shutdown:

1. admission stops: ``/health`` answers 503, a new request 503 ``not_ready``;
2. every request received before the signal is answered as usual, within
   ``--shutdown-grace-seconds``: its tokenising, queueing and forwards go on;
3. when the grace period runs out, each request still unanswered gets 503
   ``not_ready`` with ``Retry-After``;
4. the listener closes, every model's threads stop (the drain's ``finish``), and the
   process exits 0 when every request was answered in time, else 1.

A process whose every model has failed for good (a cause that cannot pass, a
failed golden self-check, or load attempts spent: nothing in it will ever
load) stops the same way and exits 1, its last line naming each model's
reason; one that serves any model keeps serving, degraded.

A model still loading is abandoned. A thread still inside compiled code (a
model load, a forward) would make the interpreter's teardown abort the process
(``terminate called without an active exception``, SIGABRT), so the process
then ends with ``os._exit`` once its logs are flushed. A second signal exits
at once (1).

Why this module is over 400 lines: binding, the signal handling and the
drain are one sequence around uvicorn's server; each step hands the next
what it found (the socket, the signal's arrival, the requests in flight),
and read apart the order they must happen in would be lost.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import errno
import logging
import os
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn

from vllm_srun.config import ServeConfig
from vllm_srun.service.runtime import Runtime

from . import autotune
from .app import build_app
from .envelope import InFlight

log = logging.getLogger("vllm_srun.serve")

JOIN_SECONDS = 0.5
"""At exit, how long threads that are ending anyway (idle workers told to stop) may take."""

UDS_MODE = 0o600
"""The Unix socket's mode: only the server's user may connect."""


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""The text log line: time, level, logger, message."""


def _plain(record: logging.LogRecord) -> bool:
    """Drop uvicorn's ``color_message`` (its message with terminal colour codes): a
    JSON line would carry it as a field."""
    record.__dict__.pop("color_message", None)
    return True


def _one_line_warning(record: logging.LogRecord) -> bool:
    """A Python warning (logger ``py.warnings``) as one line: ``file:line: Category:
    message``, without the source line :func:`warnings.formatwarning` adds below it."""
    if record.name == "py.warnings":
        text = record.getMessage().strip()
        record.msg, record.args = (text.splitlines()[0] if text else text), ()
    return True


def configure_logging(level: str, log_format: str) -> None:
    """One handler on the root logger for every line (ours, uvicorn's, the access log,
    and Python warnings a library emits, such as urllib3's about SOCKS support: each a
    ``py.warnings`` line in the same format, never raw text on stderr).

    Args:
        level: ``debug``, ``info``, ``warning`` or ``error``.
        log_format: ``text`` (:data:`TEXT_FORMAT`) or ``json``: one object per line
            (python-json-logger), with ``time``, ``level``, ``logger``, ``message``
            and any fields the line carries (the access line's ``method``,
            ``path``, ``status``, ``duration_ms``, ``client``).
    """
    handler = logging.StreamHandler()
    if log_format == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(
            JsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s",
                rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            )
        )
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    handler.addFilter(_plain)
    handler.addFilter(_one_line_warning)
    logging.captureWarnings(True)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True


class BindError(Exception):
    """The listener cannot be bound; the message names the address, why, and what to do."""


def serve(config: ServeConfig) -> int:
    """Run the server until it is told to stop.

    Returns:
        The exit status: 0 when every request received was answered (a
        shutdown within its grace period), 1 when the listener could not be
        bound, every model failed for good, the grace period ran out, or a
        second signal cut the shutdown short. The command line then ends the process with
        :func:`end_process` (an in-process caller, a test, keeps its process).
    """
    configure_logging(config.log_level, config.log_format)
    try:
        listener = Listener.bind(config)
    except BindError as err:
        sys.stderr.write(f"vllm-srun serve: {err}\n")
        return 1
    early = _EarlySignals()
    try:
        # --threads reaches each engine's load (an engine on torch sets torch's threads, an
        # ONNX Runtime session its intra-op threads): torch is not imported for it here
        try:  # before any model loads, so before any kernel compiles
            cache = autotune.apply(config.autotune_cache)
        except OSError as err:
            sys.stderr.write(f"vllm-srun serve: --autotune-cache cannot be created: {err}\n")
            return 1
        if cache is not None:
            log.info("autotune cache: %s", cache)
        runtime = Runtime(config)
        settled = SettledLater()
        if not early.received:  # the models load while the app is built and uvicorn starts
            runtime.start_loading(on_settled=settled)
        inflight = InFlight(build_app(runtime), runtime.drain, runtime.config.systemone_schema)
        uv_config = uvicorn.Config(
            inflight,
            log_level=config.log_level,
            access_log=False,  # the envelope writes the access line (never request text)
            log_config=None,  # uvicorn logs through the root handler: one format
            loop="auto",
            http="auto",
            lifespan="off",
            timeout_graceful_shutdown=5,
        )
        server = DrainingServer(uv_config, runtime, listener.where, early.received, settled)
        server.run(sockets=[listener.socket])
        finished = runtime.drain.finish()
        code = 0 if runtime.drain.drained and finished and not server.gave_up else 1
        if server.gave_up:
            log.error(
                "exiting with status 1: no model can be served: %s", "; ".join(server.gave_up)
            )
    finally:
        listener.close()
        early.restore()
    return code


class SettledLater:
    """The loading thread's ``on_settled`` when loading starts before the server exists
    (:func:`serve`): the call is kept until :meth:`then` names what to run, and runs it
    then, or at once when it comes after."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._called = False
        self._target: Callable[[], None] | None = None

    def __call__(self) -> None:
        with self._lock:
            self._called, target = True, self._target
        if target is not None:
            target()

    def then(self, target: Callable[[], None]) -> None:
        """Run ``target`` when loading settles (now, if it has)."""
        with self._lock:
            self._target, called = target, self._called
        if called:
            target()


class _EarlySignals:
    """SIGTERM and SIGINT recorded while the process starts (plugins are discovered before
    uvicorn takes the signals over): the server then stops as soon as it starts, exit 0,
    instead of the process dying of the signal. Only the main thread can take signals
    over; elsewhere this does nothing."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._record)

    def _record(self, sig: int, frame: FrameType | None) -> None:
        self.received.append(sig)

    def restore(self) -> None:
        """Give the signals back to the handlers they had before."""
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


class Listener:
    """The bound listening socket of ``--host``/``--port`` or ``--uds``.

    Attributes:
        socket: the bound socket (uvicorn listens on it).
        where: the address as logs show it (``http://127.0.0.1:8100`` or the path).
        path: the Unix socket's path, or ``None`` for TCP.
    """

    def __init__(self, sock: socket.socket, where: str, path: str | None = None) -> None:
        self.socket = sock
        self.where = where
        self.path = path
        self._identity = _identity(path) if path is not None else None

    @classmethod
    def bind(cls, config: ServeConfig) -> Listener:
        """Bind ``--uds`` when given, else ``--host`` and ``--port``.

        Raises:
            BindError: the address is in use, not this machine's, not allowed,
                or (``--uds``) a path that is not a socket or cannot be created.
        """
        if config.uds is not None:
            return cls(_bind_unix(config.uds), config.uds, config.uds)
        sock = _bind_tcp(config.host, config.port)
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        return cls(sock, f"http://{shown}:{port}")

    def close(self) -> None:
        """Close the socket and remove the Unix socket file, when it is still the one
        this process created (a successor's socket is left alone)."""
        self.socket.close()
        if self.path is None or self._identity is None:
            return
        if _identity(self.path) == self._identity:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def _identity(path: str) -> tuple[int, int] | None:
    """The device and inode of ``path`` (not following a link), or ``None`` when absent."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


def _bind_tcp(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (as uvicorn binds one for its workers).

    Raises:
        BindError: the address is in use, not an address of this machine, or
            not allowed (a port below 1024 without privileges).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        where = f"cannot listen on {host}:{port}"
        if err.errno == errno.EADDRINUSE:
            raise BindError(
                f"{where}: the address is already in use (another process listens there; "
                f"`ss -ltnp 'sport = :{port}'` names it); stop it or choose another --port"
            ) from err
        if err.errno == errno.EACCES:
            raise BindError(
                f"{where}: permission denied (ports below 1024 need privileges); "
                "choose another --port"
            ) from err
        if err.errno == errno.EADDRNOTAVAIL or isinstance(err, socket.gaierror):
            raise BindError(
                f"{where}: {host} is not an address of this machine ({err.strerror or err}); "
                "choose another --host"
            ) from err
        raise BindError(f"{where}: {err.strerror or err}") from err
    return sock


def _bind_unix(path: str) -> socket.socket:
    """A Unix socket bound at ``path``, mode 0600. A stale socket file (no server
    answers on it) is replaced; a live one is left alone.

    Raises:
        BindError: another server listens at ``path``; ``path`` exists and is not
            a socket, or is a socket that cannot be tried or removed; or the
            socket cannot be created there.
    """
    where = f"cannot listen on {path}"
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise BindError(
                f"{where}: the path exists and is not a socket; remove it or choose "
                "another --uds path"
            )
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            stale = True  # left by a server that is gone
        except OSError as err:
            raise BindError(
                f"{where}: a socket is there and cannot be tried ({err.strerror or err}); "
                "remove it or choose another --uds path"
            ) from err
        else:
            stale = False
        finally:
            probe.close()
        if not stale:
            raise BindError(
                f"{where}: the address is already in use (another server listens on it); "
                "stop it or choose another --uds path"
            )
        try:
            os.unlink(path)
        except OSError as err:
            raise BindError(
                f"{where}: a stale socket is there and cannot be removed "
                f"({err.strerror or err}); remove it or choose another --uds path"
            ) from err
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # No other thread runs yet, so the process-wide umask can be narrowed for the bind:
    # the socket is never reachable by others, not even between bind and chmod.
    previous = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError as err:
        sock.close()
        raise BindError(f"{where}: {err.strerror or err}; choose another --uds path") from err
    finally:
        os.umask(previous)
    os.chmod(path, UDS_MODE)
    return sock


class DrainingServer(uvicorn.Server):
    """uvicorn's server, whose exit signal starts the runtime's
    :class:`~vllm_srun.service.drain.Drain` (:mod:`.main` describes the steps) instead
    of closing at once.

    Args:
        config: uvicorn's configuration.
        runtime: the models.
        where: the bound address, for the log.
        early_signals: signals received before the server took them over; any
            makes it stop as soon as it has started.

    Attributes:
        gave_up: each model's reason when the server stopped because every model
            failed for good (:meth:`Runtime.cannot_serve`); empty otherwise.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        runtime: Runtime,
        where: str,
        early_signals: list[int] | None = None,
        settled: SettledLater | None = None,
    ) -> None:
        super().__init__(config)
        self.runtime = runtime
        self.drain = runtime.drain
        self.where = where
        self.early_signals = early_signals if early_signals is not None else []
        self.settled_early = settled
        self.gave_up: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Start serving on the bound listener, then log it and start loading the models,
        or (:func:`serve` started them while the app was built) hear when they settle."""
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)
        if not self.started:
            return
        if self.early_signals:
            log.info("signal %d while starting: exiting", self.early_signals[0])
            self.handle_exit(self.early_signals[0], None)
            return
        log.info("serving %d model(s) on %s", len(self.runtime.models), self.where)
        if self.should_exit:
            return
        if self.runtime.started and self.settled_early is not None:
            self.settled_early.then(self._settled)
        else:
            self.runtime.start_loading(on_settled=self._settled)

    def _settled(self) -> None:
        """(The loading thread, once every model is ready or failed.) Stop the server when
        no model can ever be served."""
        reasons = self.runtime.cannot_serve()
        if reasons and self._loop is not None:
            self._loop.call_soon_threadsafe(self._give_up, reasons)

    def _give_up(self, reasons: list[str]) -> None:
        """Stop serving a process no model of which can ever load (nothing to drain: no
        request was admitted); :func:`serve` then returns 1."""
        if self.drain.draining:
            return
        log.info("every model failed to load and none will be tried again: stopping")
        self.gave_up = reasons
        self.drain.begin()
        self.should_exit = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """First signal: start the drain (in the background); a second one exits at once."""
        if self.drain.draining or self.drain.deadline is not None:
            log.warning("signal %d again: exiting now", sig)
            self.drain.drained = False
            self.force_exit = True
            self.should_exit = True
            return
        self.drain.start_clock()
        if self._loop is None:  # not serving yet: nothing was received
            self.drain.begin()
            self.should_exit = True
            return
        # A signal handler may interrupt the loop anywhere (even inside a lock the
        # metrics hold): the drain starts from the loop's next callback instead.
        self._loop.call_soon_threadsafe(self._start_drain, sig)

    def _start_drain(self, sig: int) -> None:
        log.info("signal %d: no new work; answering the requests received, then exiting", sig)
        received = self.drain.begin()
        self._drain_task = asyncio.get_running_loop().create_task(self._drain(received))

    async def _drain(self, received: set[asyncio.Task[object]]) -> None:
        await self.drain.run(received)
        self.should_exit = True


def end_process(code: int) -> None:
    """End the ``vllm-srun serve`` process now, with ``code``, skipping the interpreter's
    teardown.

    The teardown (collecting torch's and transformers' module graphs) took 5 s of a
    MiniLM runtime's exit on the 2-core reference machine, after the last request was
    answered and the listener closed: a frontend stopping its workers, or a Kubernetes
    rollout, waited on it for nothing. It can also abort: a daemon thread inside
    compiled code (a model still loading, a forward cut short) that returns to Python
    while the interpreter tears down is stopped by unwinding its C++ frames, which
    aborts the process (SIGABRT, ``terminate called without an active exception``).

    Threads about to end get :data:`JOIN_SECONDS`; then the ``atexit`` functions run
    (``weakref.finalize`` cleanups such as temporary folders are among them), the logs
    and standard streams are flushed, and ``os._exit`` ends the process.
    """
    others = [t for t in threading.enumerate() if t is not threading.current_thread()]
    deadline = time.monotonic() + JOIN_SECONDS
    for thread in others:
        thread.join(max(0.0, deadline - time.monotonic()))
    busy = sorted(t.name for t in others if t.is_alive())
    if busy:
        log.info("%s still running: exiting without waiting", ", ".join(busy))
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
