"""Bounded calls of the container CLI: output decoded whatever its bytes, each call in
its own process group (a hung wrapper's children go with it), and a CLI that cannot
run at all named as such."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ContainerError


@dataclass(frozen=True)
class Answer:
    """One container CLI call: its exit status, output, and whether it timed out."""

    code: int
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False


def cannot_run(executable: str, err: OSError) -> ContainerError:
    """The ``no_container_runtime`` error of a CLI the OS will not start (a script
    whose ``#!`` interpreter is missing, a binary for another machine)."""
    name = os.path.basename(executable)
    path = shutil.which(executable) or executable
    why = err.strerror or str(err)
    if isinstance(err, FileNotFoundError) and os.path.exists(path):
        why += " (its #! interpreter is missing?)"
    return ContainerError(
        f"the {name} command {path} cannot run: {why}; reinstall {name} or put a "
        f"working one first on PATH",
        "no_container_runtime",
    )


def resolved(argv: Sequence[str]) -> list[str]:
    """``argv`` with its command as found on ``PATH``: a broken first match is then an
    error, not passed over for the next one (``execvp`` skips one that fails with ENOENT,
    as a script with a missing ``#!`` interpreter does)."""
    return [shutil.which(argv[0]) or argv[0], *argv[1:]]


_held: list[int] | None = None
"""Stop signals that arrived while a child was being started (``None``: none is)."""


def hold(signum: int) -> bool:
    """Called by a stop-signal handler: ``True`` when a child is being started, the
    signal then kept for :func:`starting` to deliver once the child exists (raised
    inside ``Popen``, the caller could not kill a child it was never handed)."""
    if _held is None:
        return False
    _held.append(signum)
    return True


@contextlib.contextmanager
def starting() -> Iterator[None]:
    """Start a child inside: a stop signal arriving meanwhile is held (:func:`hold`)
    and raised again on leaving, when the caller holds the child to clean it up."""
    global _held
    _held = []
    try:
        yield
    finally:
        pending, _held = _held, None
        for signum in pending:
            signal.raise_signal(signum)


def kill_group(process: subprocess.Popen[Any], sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to ``process``'s process group (it leads one: ``start_new_session``)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def ask(argv: Sequence[str], timeout: float) -> Answer:
    """Run ``argv`` with its output captured (undecodable bytes replaced), bounded by
    ``timeout`` seconds; on a timeout or an interruption its whole process group is
    killed.

    Raises:
        ContainerError: the CLI cannot be started (:func:`cannot_run`).
    """
    process: subprocess.Popen[bytes] | None = None
    try:
        with starting():
            try:
                process = subprocess.Popen(
                    resolved(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
            except OSError as error:
                raise cannot_run(argv[0], error) from None
        out, err = process.communicate(timeout=max(timeout, 0.1))
    except BaseException as stop:
        if process is None:
            raise
        kill_group(process)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
        process.wait()
        if isinstance(stop, subprocess.TimeoutExpired):
            return Answer(124, timed_out=True)
        raise
    return Answer(
        process.returncode,
        out.decode("utf-8", errors="replace"),
        err.decode("utf-8", errors="replace"),
    )
