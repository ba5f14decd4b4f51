"""The environment a worker plan reads, read once: the worker command, the CPU budget
and threads per CPU worker, the private worker directory and the runtime log level.

:meth:`RuntimeEnvironment.from_environ` reads ``VLLM_SRUN_COMMAND``, ``VLLM_SRUN_DIR``,
``VLLM_SRUN_CACHE_DIR`` and ``VLLM_SRUN_CPU_THREADS``, and touches the filesystem: it
creates the worker directory 0700 and removes the ones killed frontends left behind.
:mod:`.plan` turns a configuration and this environment into the workers.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

MAX_THREADS = 16
"""Most default threads of one CPU worker."""

LOG_LEVELS = {
    "debug": "debug",
    "info": "info",
    "warn": "warning",
    "warning": "warning",
    "error": "error",
    "dpanic": "error",
    "panic": "error",
    "fatal": "error",
}
"""``--log-level`` values and the runtime level each becomes (upstream's mapping)."""


class PlanError(Exception):
    """The environment or a path keeps workers from being planned; the message says what
    to do."""


def default_command() -> list[str]:
    """``vllm-srun``: from ``PATH``, else the one installed beside this Python."""
    if shutil.which("vllm-srun") is None:
        beside = Path(sys.executable).with_name("vllm-srun")
        if beside.exists():
            return [str(beside)]
    return ["vllm-srun"]


def worker_command(environ: dict[str, str]) -> tuple[str, ...]:
    """``VLLM_SRUN_COMMAND`` split on spaces, else :func:`default_command`."""
    text = environ.get("VLLM_SRUN_COMMAND", "").strip()
    return tuple(text.split()) if text else tuple(default_command())


def cpu_budget() -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS has no affinity masks
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def _cgroup_quota() -> float | None:
    """CPUs the cgroup quota allows (v2 ``cpu.max``, v1 ``cfs_quota_us``), or ``None``."""
    with contextlib.suppress(OSError, ValueError):
        text = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if text and text[0] != "max":
            return int(text[0]) / int(text[1])
        return None
    with contextlib.suppress(OSError, ValueError):
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        if quota > 0 and period > 0:
            return quota / period
    return None


def cpu_threads(cores: int, override: int | None) -> int:
    """Threads of one CPU worker: ``VLLM_SRUN_CPU_THREADS`` when given, else half the
    budget (at least 1, at most 16); never more than the budget."""
    wanted = override if override else max(1, min(MAX_THREADS, cores // 2))
    return min(cores, wanted)


def private_directory(path: Path, what: str) -> Path:
    """``path`` as a directory only this user can use: created 0700, or an existing one
    of ours tightened to 0700.

    Raises:
        PlanError: ``path`` is a symbolic link, not a directory, or belongs to another
            user (``what`` names it in the message).
    """
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    except OSError as err:
        raise PlanError(f"{what} {path} cannot be created: {err.strerror}") from None
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise PlanError(f"{what} {path} is a symbolic link; give a real directory")
    if not stat.S_ISDIR(info.st_mode):
        raise PlanError(f"{what} {path} exists and is not a directory")
    if info.st_uid != os.getuid():
        raise PlanError(
            f"{what} {path} exists and belongs to another user; remove it or give "
            "VLLM_SRUN_DIR a directory of your own"
        )
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale_directories(parent: Path) -> list[Path]:
    """Remove the worker directories (``vllm-srun-<pid>``) that frontends killed before
    they could clean up left in ``parent``: only real directories of this user whose
    ``<pid>`` no longer runs. Returns what was removed. A directory that cannot be
    removed is left as it is (the sweep never stops a start).
    """
    removed = []
    for entry in parent.glob("vllm-srun-*"):
        pid = entry.name.removeprefix("vllm-srun-")
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        try:
            info = os.lstat(entry)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue
        shutil.rmtree(entry, ignore_errors=True)
        if not entry.exists():
            removed.append(entry)
    return removed


@dataclass(frozen=True)
class RuntimeEnvironment:
    """What the environment says about managed workers.

    Attributes:
        command: the worker command (``VLLM_SRUN_COMMAND``, space-split).
        directory: sockets and models files (``VLLM_SRUN_DIR``, 0700; else its own
            ``<tmp>/vllm-srun-<pid>``, where the ones frontends killed by SIGKILL left
            behind are swept first: :func:`sweep_stale_directories`).
        created: whether the frontend made ``directory`` (its own temp dir, removed at exit).
        cache_dir: the managed runtimes' model cache (``VLLM_SRUN_CACHE_DIR``).
        thread_override: ``VLLM_SRUN_CPU_THREADS``.
        cores: the CPU budget of this process.
        log_level: the runtime log level workers get.
        offline: managed workers get ``--offline``: they load only what is installed
            (a built-in model's mirror) or cached, and never download.
    """

    command: tuple[str, ...]
    directory: Path
    created: bool = False
    cache_dir: str | None = None
    thread_override: int | None = None
    cores: int = 1
    log_level: str = "info"
    offline: bool = False

    @classmethod
    def from_environ(
        cls,
        environ: dict[str, str] | None = None,
        *,
        log_level: str = "info",
        offline: bool = False,
    ) -> RuntimeEnvironment:
        """Read and check the environment; creates the worker directory.

        Raises:
            PlanError: a non-positive ``VLLM_SRUN_CPU_THREADS``, an empty command, or a
                ``VLLM_SRUN_DIR`` that is a symlink or not ours.
        """
        env = dict(os.environ if environ is None else environ)
        command = worker_command(env)
        override = None
        threads = env.get("VLLM_SRUN_CPU_THREADS", "").strip()
        if threads:
            if not threads.isdigit() or int(threads) < 1:
                raise PlanError(
                    f"VLLM_SRUN_CPU_THREADS must be a positive integer (threads per CPU "
                    f"worker), not {threads!r}"
                )
            override = int(threads)
        given = env.get("VLLM_SRUN_DIR", "").strip()
        if given:
            directory = private_directory(Path(given).expanduser().absolute(), "VLLM_SRUN_DIR")
            created = False
        else:
            parent = Path(tempfile.gettempdir())
            sweep_stale_directories(parent)
            own = parent / f"vllm-srun-{os.getpid()}"
            created = not own.exists()
            directory = private_directory(own, "the worker directory")
        level = LOG_LEVELS.get(log_level.lower())
        if level is None:
            raise PlanError(f"--log-level must be one of {', '.join(LOG_LEVELS)}")
        return cls(
            command=command,
            directory=directory,
            created=created,
            cache_dir=env.get("VLLM_SRUN_CACHE_DIR", "").strip() or None,
            thread_override=override,
            cores=cpu_budget(),
            log_level=level,
            offline=offline,
        )
