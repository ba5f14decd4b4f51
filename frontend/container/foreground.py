"""Running the engine container in the foreground: the leftover check, the run, the
signals it forwards and the exit status it ends with."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from types import FrameType

from .command import EngineContainer
from .diagnose import Answer, daemon_error
from .errors import ContainerError
from .runtime import ContainerRuntime

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""Signals forwarded to the container CLI (once) as a requested stop."""

STOPPED_CODES = frozenset({0, 130, 143, -signal.SIGINT, -signal.SIGTERM})
"""Exit statuses that mean the container stopped on request: 0, 128+SIGINT,
128+SIGTERM, or the CLI killed by either signal (Python's negative codes)."""

INSPECT_TIMEOUT_S = 60.0
"""Bound of ``container inspect`` and ``rm``, in seconds."""


def _quick(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=INSPECT_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", "timed out")


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
    answer = _quick(
        [runtime.executable, "container", "inspect", "--format", "{{.State.Running}}", name]
    )
    if answer.returncode != 0:
        failed = Answer(answer.returncode, answer.stdout, answer.stderr, answer.returncode == 124)
        down = daemon_error(runtime, environ if environ is not None else {}, failed)
        if down is not None:
            raise down
        return "none"
    if answer.stdout.strip().lower() == "true":
        raise ContainerError(
            f"engine container {name} already serves port {port}; stop it "
            f"({runtime.executable} stop {name}) or pass another --port",
            "port_in_use",
        )
    removed = _quick([runtime.executable, "rm", "-f", name])
    if removed.returncode != 0:
        raise ContainerError(
            f"a stopped container {name} is in the way and `{runtime.executable} rm -f {name}` "
            f"failed: {removed.stderr.strip()}",
            "runtime_failed",
        )
    return "removed"


def exit_status(code: int, requested: bool) -> int:
    """The exit status of ``vllm-sr``: 0 for a stop it was asked for (``code`` in
    :data:`STOPPED_CODES`), else the CLI's status (``128 + N`` for a death by signal N)."""
    if requested and code in STOPPED_CODES:
        return 0
    return 128 - code if code < 0 else code


def run_foreground(argv: Sequence[str]) -> int:
    """Run ``argv`` (the container CLI's ``run``) attached to this terminal until it ends.

    The first SIGINT or SIGTERM is forwarded to the CLI (which stops the container);
    later ones are not forwarded again. The handlers are restored before returning.

    Returns:
        :func:`exit_status` of the CLI's status.

    Raises:
        ContainerError: the CLI cannot be started (code ``no_container_runtime``).
    """
    requested: list[int] = []
    process: subprocess.Popen[bytes] | None = None

    def forward(signum: int, frame: FrameType | None) -> None:
        if requested:
            return
        requested.append(signum)
        print(
            f"vllm-sr: stopping the engine container ({signal.Signals(signum).name})",
            file=sys.stderr,
            flush=True,
        )
        if process is not None and process.poll() is None:
            process.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    try:
        try:
            process = subprocess.Popen(list(argv))
        except OSError as err:
            raise ContainerError(f"cannot run {argv[0]}: {err}", "no_container_runtime") from None
        if requested:  # a signal came before the CLI existed
            process.send_signal(requested[0])
        code = process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return exit_status(code, bool(requested))


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
    return run_foreground(argv)
