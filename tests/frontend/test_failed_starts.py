"""What a failed start leaves in ``VLLM_SRUN_DIR``: nothing of its own, and nothing of
another frontend's touched. Real ``vllm-sr serve -e`` processes on the misbehaving worker
command (``fake_worker.py``)."""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

import pytest

from .test_cli import fake_served
from .test_serve import wait_for

pytestmark = pytest.mark.slow


def listing(directory: Path) -> dict[str, tuple[int, int, int]]:
    """Each entry of ``directory``: its inode, mode and modification time (ns)."""
    found = {}
    for path in directory.iterdir():
        info = os.lstat(path)
        found[path.name] = (info.st_ino, info.st_mode, info.st_mtime_ns)
    return found


def test_a_worker_that_crashes_while_it_starts_leaves_nothing_behind(
    tmp_path: Path, rundir: Path
) -> None:
    server = fake_served(tmp_path, rundir, "bound-exit")
    try:
        assert server.process.wait(60) == 1
        assert (
            'startup failed: model_runtime deployment "primary": runtime process exited 3 '
            "times before it was ready: exit status 3: fake worker: crashed after binding its "
            "socket <socket>\n"  # its path is not shown (the Dashboard shows this reason)
        ) in server.err.read_text()
        assert listing(rundir) == {}  # no socket, no models file
    finally:
        server.close()


def test_a_second_frontend_on_the_same_directory_is_refused_and_touches_nothing(
    tmp_path: Path, rundir: Path
) -> None:
    first = fake_served(tmp_path, rundir, "ready")
    second = None
    try:
        first.wait_ready(30)
        before = listing(rundir)
        [socket_path] = [rundir / n for n, e in before.items() if stat.S_ISSOCK(e[1])]
        [models] = [rundir / n for n in before if n.endswith(".models.json")]
        assert len(before) == 2
        content = models.read_bytes()
        folder = tmp_path / "second"
        folder.mkdir()
        second = fake_served(folder, rundir, "ready")
        assert second.process.wait(60) == 1
        assert (
            f'startup failed: model_runtime deployment "primary": another process listens '
            f"on {socket_path}; give each frontend its own VLLM_SRUN_DIR\n"
        ) in second.err.read_text()
        assert listing(rundir) == before
        assert models.read_bytes() == content
        # The first one's worker, killed, starts again from its models file.
        [worker] = first.workers()
        worker.send_signal(signal.SIGKILL)

        def restarted() -> bool:
            [entry] = first.inventory()["deployments"]
            return entry["restarts"] == 1 and entry["ready_replicas"] == 1

        wait_for(restarted, 30, "the first frontend's worker restarted and ready")
        answer = first.get("/ready")
        assert answer is not None and answer.status_code == 200
    finally:
        if second is not None:
            second.close()
        first.close()
