"""The process plan: one worker per placement of each deployment in use, never regrouped.

For each managed placement it fixes the replica id, the process name, the socket
and models-file paths, the models file's content and the worker's command line;
for each attached placement, its endpoint and served name. The environment that
shapes the plan is read once, by :meth:`.environment.RuntimeEnvironment.from_environ`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.schema import Config, Deployment, Replica
from .environment import RuntimeEnvironment, cpu_threads, private_directory

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

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


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
