"""Running the engine container in the foreground: the leftover check, the run, the
signals it forwards and the exit status it ends with; a stop signal before the run."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import FrameType

from .command import EngineContainer
from .diagnose import daemon_error
from .errors import ContainerError
from .probe import ask, hold, resolved
from .runtime import ContainerRuntime

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""Signals forwarded to the container CLI (once) as a requested stop."""

STOPPED_CODES = frozenset({0, 130, 143, -signal.SIGINT, -signal.SIGTERM})
"""Exit statuses that mean the container stopped on request: 0, 128+SIGINT,
128+SIGTERM, or the CLI killed by either signal (Python's negative codes)."""

KILLED_CODES = frozenset({137, -signal.SIGKILL})
"""Exit statuses of a container (or CLI) killed after a second stop signal."""

INSPECT_TIMEOUT_S = 60.0
"""Bound of ``container inspect``, ``rm`` and ``kill``, in seconds."""


class Interrupted(BaseException):
    """A stop signal (SIGINT, SIGTERM) before the container ran."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def interruptible() -> Iterator[None]:
    """Inside, SIGINT and SIGTERM raise :class:`Interrupted` (later ones are ignored
    while it unwinds: the children's cleanup is bounded); the handlers are restored."""

    def stop(signum: int, frame: FrameType | None) -> None:
        if hold(signum):  # raised again once the child being started exists
            return
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def clear_leftover(
    runtime: ContainerRuntime, name: str, port: int, environ: Mapping[str, str] | None = None
) -> str:
    """Refuse a running container of the same name; remove a stopped leftover.

    Returns:
        ``none`` (no such container) or ``removed`` (a stopped one was removed).

    Raises:
        ContainerError: the daemon is not reachable (code ``daemon_unreachable``), the
            container is running (``port_in_use``), or the leftover cannot be removed
            (``runtime_failed``).
    """
    answer = ask(
        [runtime.executable, "container", "inspect", "--format", "{{.State.Running}}", name],
        INSPECT_TIMEOUT_S,
    )
    if answer.code != 0:
        down = daemon_error(runtime, environ if environ is not None else {}, answer)
        if down is not None:
            raise down
        return "none"
    if answer.stdout.strip().lower() == "true":
        raise ContainerError(
            f"engine container {name} already serves port {port}; stop it "
            f"({runtime.executable} stop {name}) or pass another --port",
            "port_in_use",
        )
    removed = ask([runtime.executable, "rm", "-f", name], INSPECT_TIMEOUT_S)
    if removed.code != 0:
        raise ContainerError(
            f"a stopped container {name} is in the way and `{runtime.executable} rm -f {name}` "
            f"failed: {removed.stderr.strip()}",
            "runtime_failed",
        )
    return "removed"


def exit_status(code: int, requested: bool, killed: bool = False) -> int:
    """The exit status of ``vllm-sr``: 0 for a stop it was asked for (``code`` in
    :data:`STOPPED_CODES`, or :data:`KILLED_CODES` after a second signal), else the
    CLI's status (``128 + N`` for a death by signal N)."""
    if requested and (code in STOPPED_CODES or (killed and code in KILLED_CODES)):
        return 0
    return 128 - code if code < 0 else code


def run_foreground(argv: Sequence[str], kill_argv: Sequence[str] | None = None) -> int:
    """Run ``argv`` (the container CLI's ``run``) attached to this terminal until it ends.

    The first SIGINT or SIGTERM is forwarded to the CLI (which stops the container).
    A second one stops the wait: ``kill_argv`` (``<cli> kill NAME``) kills the
    container, and the CLI is killed when that fails; later ones are ignored. The
    handlers are restored before returning.

    Returns:
        :func:`exit_status` of the CLI's status.

    Raises:
        ContainerError: the CLI cannot be started (code ``no_container_runtime``).
    """
    requested: list[int] = []
    process: subprocess.Popen[bytes] | None = None

    def forward(signum: int, frame: FrameType | None) -> None:
        requested.append(signum)
        name = signal.Signals(signum).name
        if len(requested) == 1:
            print(f"vllm-sr: stopping the engine container ({name})", file=sys.stderr, flush=True)
            if process is not None and process.poll() is None:
                process.send_signal(signum)
        elif len(requested) == 2 and process is not None:
            force(name)

    def force(name: str) -> None:
        assert process is not None
        how = shlex.join(kill_argv) if kill_argv else f"SIGKILL to {argv[0]}"
        print(
            f"vllm-sr: second {name}: killing the engine container ({how})",
            file=sys.stderr,
            flush=True,
        )
        killed = False
        if kill_argv:
            try:
                killed = ask(kill_argv, INSPECT_TIMEOUT_S).code == 0
            except ContainerError:
                killed = False
        if not killed and process.poll() is None:
            process.kill()

    previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    try:
        try:
            process = subprocess.Popen(resolved(argv))
        except OSError as err:
            raise ContainerError(f"cannot run {argv[0]}: {err}", "no_container_runtime") from None
        if requested:  # a signal came before the CLI existed
            process.send_signal(requested[0])
        code = process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return exit_status(code, bool(requested), killed=len(requested) > 1)


def start(container: EngineContainer) -> int:
    """Clear a leftover container, print the command and run it in the foreground.

    Raises:
        ContainerError: see :func:`clear_leftover` and :func:`run_foreground`.
    """
    clear_leftover(container.runtime, container.name, container.port, container.environ)
    argv = container.run_argv()
    print(
        f"vllm-sr: engine container on http://{container.host}:{container.port} "
        f"(Ctrl-C stops it): {shlex.join(argv)}",
        file=sys.stderr,
        flush=True,
    )
    return run_foreground(argv, [container.runtime.executable, "kill", container.name])
