"""One ``vllm-srun serve`` process, started as a user starts it, for the tests that read it
over HTTP as a user would."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


def free_port() -> int:
    """A TCP port nothing listens on now, on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def serving(
    argv: list[str],
    env: dict[str, str],
    log: Path,
    port: int,
    start_seconds: float,
    request_seconds: float,
) -> Iterator[httpx.Client]:
    """Run ``argv`` (a ``vllm-srun serve`` on ``port``), its output in ``log``, and yield a
    client (``request_seconds`` per request) once ``/health`` answers 200; stop the
    process (terminate, then kill) on the way out.

    Raises:
        AssertionError: the process ended, or ``/health`` did not answer 200 within
            ``start_seconds``; the message is the log's last 4000 characters.
    """
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=request_seconds)
    deadline = time.monotonic() + start_seconds
    try:
        while True:  # no event says ready: /health is what a user reads
            assert process.poll() is None, log.read_text(errors="replace")[-4000:]
            try:
                if client.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-4000:]
            time.sleep(0.2)
        yield client
    finally:
        client.close()
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
