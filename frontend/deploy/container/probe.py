"""Bounded calls of the container CLI: output decoded whatever its bytes, each call in
its own process group (a hung wrapper's children go with it), and a CLI that cannot
run at all named as such."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
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
    signal then kept for :func:`spawn` to raise again once the child exists (raised
    inside ``Popen``, the caller could not kill a child it was never handed)."""
    if _held is None:
        return False
    _held.append(signum)
    return True


def _release_held() -> None:
    """Stop holding stop signals, and raise again the ones that came meanwhile."""
    global _held
    pending, _held = _held or [], None
    for signum in pending:
        signal.raise_signal(signum)


def spawn(argv: Sequence[str], **options: Any) -> subprocess.Popen[Any]:
    """Start ``argv`` (its command as :func:`resolved` finds it) with ``subprocess.Popen``
    ``options``, which must make it lead a process group (``start_new_session`` or
    ``process_group=0``). A stop signal arriving while it starts is held (:func:`hold`)
    and raised again once the child exists, after its group is killed: raised inside
    ``Popen``, it would leave a child nobody holds.

    Raises:
        ContainerError: the CLI cannot be started (:func:`cannot_run`), unless a stop
            signal came meanwhile (its exception then goes on instead).
    """
    global _held
    _held = []
    try:
        process = subprocess.Popen(resolved(argv), **options)
    except OSError as error:
        _release_held()
        raise cannot_run(argv[0], error) from None
    except BaseException:
        _held = None
        raise
    try:
        _release_held()
    except BaseException:
        end_group(process)
        raise
    return process


def end_group(process: subprocess.Popen[Any]) -> None:
    """Kill ``process``'s group, close its pipes and reap it."""
    kill_group(process)
    for pipe in (process.stdin, process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()
    process.wait()


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
    process = spawn(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=max(timeout, 0.1))
    except BaseException as stop:
        end_group(process)
        if isinstance(stop, subprocess.TimeoutExpired):
            return Answer(124, timed_out=True)
        raise
    return Answer(
        process.returncode,
        out.decode("utf-8", errors="replace"),
        err.decode("utf-8", errors="replace"),
    )
