"""The process plan: one worker per placement of each deployment in use, never regrouped.

For each managed placement it fixes the replica id, the process name, the socket
and models-file paths, the models file's content and the worker's command line;
for each attached placement, its endpoint and served name. The environment that
shapes the plan (``VLLM_SRUN_COMMAND``, ``VLLM_SRUN_DIR``, ``VLLM_SRUN_CACHE_DIR``,
``VLLM_SRUN_CPU_THREADS``) is read once, by :meth:`RuntimeEnvironment.from_environ`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import stat
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.schema import Config, Deployment, Replica

MANAGED_REQUEST_BYTES = 67_108_864
"""``--max-request-bytes`` of a managed worker: 64 MiB, the pool's own body limit."""

MANAGED_BUNDLE_TASKS = 1024
"""``--max-bundle-tasks`` of a managed worker."""

MANAGED_QUEUE = MANAGED_BUNDLE_TASKS
"""``--max-queue`` of a managed worker: room for one whole bundle of
:data:`MANAGED_BUNDLE_TASKS` tasks (each task counts as one request in the worker's
queue; the runtime's default of 256 refused a bigger bundle's last tasks even when
idle). Other requests cannot fill it: the pool sends one worker at most 32 at a time."""

WORKER_SHUTDOWN_GRACE = 6.0
"""``--shutdown-grace-seconds`` of a managed worker. After SIGTERM a worker drains for
this long, then needs up to about 3 s more to answer what is left and exit: the
whole stays inside the frontend's 10 s before SIGKILL, so a drain is never cut."""

SOCKET_PATH_LIMIT = 100
"""Longest socket path (bytes) used as is; a longer one moves to ``/tmp/vsr-<8 hex>``
(``sun_path`` holds 108 bytes on Linux, 104 on macOS)."""

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

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


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


@dataclass
class ReplicaPlan:
    """One worker of a deployment, as planned.

    Attributes:
        deployment: the logical deployment.
        replica_id: ``r-`` and 12 hex digits (:func:`replica_id`).
        managed: started by the frontend (else attached).
        endpoint: ``unix:///...sock`` for a managed worker, the configured one attached.
        served_name: the model's name on the worker (a managed worker's is the
            deployment name).
        process: ``<deployment>-<replica_id>`` (managed), else ``""``.
        device: the device the worker is placed on (``auto`` resolved when it could be),
            ``None`` attached.
        threads: ``--threads`` of a CPU worker.
        socket: the managed worker's socket path.
        models_file: the managed worker's models file.
        models: the models file's content.
        argv: the managed worker's command line.
        identity: sha256 of what makes the worker (name, replica, endpoint, served name,
            models, command, cache, threads): equal identities are the same worker.
    """

    deployment: str
    replica_id: str
    managed: bool
    endpoint: str
    served_name: str
    process: str = ""
    device: str | None = None
    threads: int | None = None
    socket: Path | None = None
    models_file: Path | None = None
    models: dict[str, Any] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    identity: str = ""

    def write_models_file(self) -> None:
        """Write the models file, mode 0600 from its creation (replacing an older one)."""
        if self.models_file is None:
            return
        temporary = self.models_file.with_suffix(".tmp")
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            json.dump(self.models, out, indent=2)
            out.write("\n")
        os.replace(temporary, self.models_file)


def replica_id(name: str, placement: Replica, ordinal: int) -> str:
    """``"r-"`` and the first 12 hex digits of sha256(name NUL json(placement) NUL ordinal).

    ``ordinal`` counts earlier placements identical to this one, so two workers on one
    GPU get different ids, and an id stays the same while its placement does.
    """
    text = json.dumps(placement.key(), separators=(",", ":"))
    digest = hashlib.sha256(f"{name}\0{text}\0{ordinal}".encode()).hexdigest()
    return "r-" + digest[:12]


def sanitized(name: str) -> str:
    """``name`` with every character outside ``[A-Za-z0-9_.-]`` replaced by ``_``."""
    return _UNSAFE.sub("_", name)


def socket_directory(directory: Path) -> Path:
    """The directory long socket paths move to: ``/tmp/vsr-<8 hex of sha256(directory)>``,
    created 0700.

    Raises:
        PlanError: it exists and is not ours (a symlink, not a directory, another owner).
    """
    digest = hashlib.sha256(str(directory).encode()).hexdigest()[:8]
    return private_directory(Path("/tmp") / f"vsr-{digest}", "the socket directory")


def plan_deployment(
    name: str,
    deployment: Deployment,
    env: RuntimeEnvironment,
    auto_device: str | None = None,
) -> list[ReplicaPlan]:
    """The workers of one deployment, one per placement, in declaration order.

    Args:
        auto_device: what ``auto`` resolves to on this host (``None``: each worker
            resolves it itself).

    Raises:
        PlanError: the fallback socket directory is not ours.
    """
    plans = []
    seen: dict[str, int] = {}
    for placement in deployment.placements():
        text = json.dumps(placement.key(), sort_keys=True)
        ordinal = seen.get(text, 0)
        seen[text] = ordinal + 1
        rid = replica_id(name, placement, ordinal)
        if placement.attached:
            assert placement.endpoint is not None
            plans.append(
                ReplicaPlan(
                    deployment=name,
                    replica_id=rid,
                    managed=False,
                    endpoint=placement.endpoint,
                    served_name=placement.served_name or name,
                )
            )
            continue
        plans.append(_managed(name, deployment, placement, rid, env, auto_device))
    return plans


def _managed(
    name: str,
    deployment: Deployment,
    placement: Replica,
    rid: str,
    env: RuntimeEnvironment,
    auto_device: str | None,
) -> ReplicaPlan:
    device = placement.device or "auto"
    if device == "auto" and auto_device:
        device = auto_device
    threads = None
    if device.split(":", 1)[0] == "cpu":
        threads = cpu_threads(env.cores, env.thread_override)
    entry: dict[str, Any] = {"model": deployment.artifact, "name": name}
    if deployment.revision:
        entry["revision"] = deployment.revision
    entry["device"] = device
    entry["profile"] = deployment.profile
    entry.update(deployment.engine_args())
    if deployment.systemone_schema is not None:
        # Only when configured: a worker of the default schema gets the same file as before.
        entry["systemone_schema"] = deployment.systemone_schema
    models = {"models": [entry]}
    process = f"{name}-{rid}"
    identity = hashlib.sha256(
        json.dumps(
            {
                "name": name,
                "replica": rid,
                "served_name": name,
                "models": models,
                "command": list(env.command),
                "cache_dir": env.cache_dir,
                "threads": threads,
                "offline": env.offline,
            },
            sort_keys=True,
        ).encode()
    ).hexdigest()
    base = f"{sanitized(process)}-{identity[:12]}"
    socket = env.directory / f"{base}.sock"
    if len(str(socket).encode()) > SOCKET_PATH_LIMIT:
        short = socket_directory(env.directory)
        socket = short / f"{base}.sock"
        if len(str(socket).encode()) > SOCKET_PATH_LIMIT:
            socket = short / f"{rid}-{identity[:12]}.sock"
    models_file = env.directory / f"{base}.models.json"
    argv = [
        *env.command,
        "serve",
        "--models",
        str(models_file),
        "--uds",
        str(socket),
        "--max-request-bytes",
        str(MANAGED_REQUEST_BYTES),
        "--max-bundle-tasks",
        str(MANAGED_BUNDLE_TASKS),
        "--max-queue",
        str(MANAGED_QUEUE),
    ]
    if env.cache_dir:
        argv += ["--cache-dir", env.cache_dir]
    if threads is not None:
        argv += ["--threads", str(threads)]
    if env.offline:
        argv.append("--offline")
    argv += [
        "--shutdown-grace-seconds",
        f"{WORKER_SHUTDOWN_GRACE:g}",
        "--log-level",
        env.log_level,
    ]
    return ReplicaPlan(
        deployment=name,
        replica_id=rid,
        managed=True,
        endpoint=f"unix://{socket}",
        served_name=name,
        process=process,
        device=None if device == "auto" else device,
        threads=threads,
        socket=socket,
        models_file=models_file,
        models=models,
        argv=argv,
        identity=identity,
    )


def plan_workers(
    config: Config,
    names: list[str],
    env: RuntimeEnvironment,
    auto_device: str | None = None,
) -> list[ReplicaPlan]:
    """Every worker of the deployments ``names`` (the deployments in use)."""
    plans: list[ReplicaPlan] = []
    for name in names:
        plans += plan_deployment(name, config.catalog.deployments[name], env, auto_device)
    return plans


def needs_auto(config: Config, names: list[str]) -> bool:
    """Whether a managed worker of ``names`` is placed on ``auto``."""
    return any(
        (p.device or "auto") == "auto"
        for name in names
        for p in config.catalog.deployments[name].managed_placements()
    )
