"""The engine container's ``run`` command line.

The order and flags follow upstream ``engine_container.py`` as the frontend spec
digest (§1.2) records it: ``run --rm --init --name vllm-sr-engine-<port>``, the
user mapping, GPU pass-through, ``--dns``, the published port, the mounts, the
environment by name, then ``--entrypoint vllm-srun IMAGE serve ...``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from ...config.flags import PLATFORMS
from .mounts import MODELS_FILE, MODELS_VOLUME, RUNTIME_CACHE, Mount
from .runtime import ContainerRuntime

CONTAINER_PORT = 8100
"""The port ``vllm-srun serve`` listens on inside the container."""

IMAGES = {
    "cpu": "ghcr.io/vllm-project/semantic-router/vllm-sr:latest",
    "rocm": "ghcr.io/vllm-project/semantic-router/vllm-sr-rocm:latest",
    "cuda": "ghcr.io/vllm-project/semantic-router/vllm-sr-cuda:latest",
}
"""The platform images, by accelerator (upstream ``consts.py``)."""

PASSED_BY_NAME = ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE")
"""Variables handed to the container by name (``-e NAME``) when set here: their values
never appear on a command line."""

AMD_PASSTHROUGH = (
    "--device",
    "/dev/kfd",
    "--device",
    "/dev/dri",
    "--group-add",
    "video",
    "--cap-add",
    "SYS_PTRACE",
    "--security-opt",
    "seccomp=unconfined",
)
"""ROCm devices for the container (AMD's documented ``docker run`` flags)."""


def container_name(port: int) -> str:
    """The container's name: one engine container per host port."""
    return f"vllm-sr-engine-{port}"


def gpu_flags(platform: str, runtime: ContainerRuntime, environ: Mapping[str, str]) -> list[str]:
    """GPU pass-through for ``platform``: AMD's devices (off with
    ``VLLM_SR_AMD_GPU_PASSTHROUGH=0``), NVIDIA's by ``--gpus all --runtime nvidia`` on
    Docker or CDI ``--device nvidia.com/gpu=all`` on Podman (off with
    ``VLLM_SR_NVIDIA_GPU_PASSTHROUGH=0``); none on ``cpu``."""
    accelerator = PLATFORMS[platform]
    if accelerator == "rocm" and environ.get("VLLM_SR_AMD_GPU_PASSTHROUGH", "").strip() != "0":
        return list(AMD_PASSTHROUGH)
    if accelerator == "cuda" and environ.get("VLLM_SR_NVIDIA_GPU_PASSTHROUGH", "").strip() != "0":
        if runtime.podman:
            return ["--device", "nvidia.com/gpu=all"]
        return ["--gpus", "all", "--runtime", "nvidia"]
    return []


def user_flags(runtime: ContainerRuntime, uid: int | None, gid: int | None) -> list[str]:
    """Run as this user, so that the mounted cache stays this user's files: Docker and
    rootful Podman ``--user UID:GID`` (the image's own user could not write root's
    cache); rootless Podman ``--userns=keep-id``; hosts without user ids get nothing."""
    if uid is None or gid is None:
        return []
    if runtime.podman and uid != 0:
        return ["--userns=keep-id"]
    return ["--user", f"{uid}:{gid}"]


@dataclass
class EngineContainer:
    """One foreground engine container.

    Attributes:
        runtime: the container CLI.
        image: the image reference.
        platform: ``--platform`` as given (``cpu``, ``amd``/``rocm``, ``nvidia``/``cuda``).
        host: the host address the port is published on.
        port: the host port.
        cache: the host directory mounted at ``/app/models``.
        models: the MODEL arguments as the runtime inside sees them.
        models_file: the models file's mount, or ``None``.
        packages: local package mounts (read-only).
        runtime_args: ``vllm-srun serve`` options after ``--device`` (engine
            arguments, ``--revision``, ``--offline``), as argv words.
        device: the runtime's ``--device``.
        log_level: the runtime's ``--log-level`` (``debug|info|warning|error``).
        environ: where ``HF_*``, ``VLLM_SR_*_GPU_PASSTHROUGH`` and ``VLLM_SR_DNS`` are read.
        uid: this user's id (``None``: no user mapping).
        gid: this user's group id.
    """

    runtime: ContainerRuntime
    image: str
    platform: str
    host: str
    port: int
    cache: str
    models: list[str] = field(default_factory=list)
    models_file: Mount | None = None
    packages: list[Mount] = field(default_factory=list)
    runtime_args: list[str] = field(default_factory=list)
    device: str = "auto"
    log_level: str = "info"
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    uid: int | None = None
    gid: int | None = None

    @property
    def name(self) -> str:
        """The container's name (``vllm-sr-engine-<port>``)."""
        return container_name(self.port)

    def run_argv(self) -> list[str]:
        """The ``<runtime> run ...`` command line, executable first."""
        argv = [self.runtime.executable, "run", "--rm", "--init", "--name", self.name]
        argv += user_flags(self.runtime, self.uid, self.gid)
        argv += gpu_flags(self.platform, self.runtime, self.environ)
        for server in self.environ.get("VLLM_SR_DNS", "").split(","):
            if server.strip():
                argv += ["--dns", server.strip()]
        argv += ["-p", f"{self.host}:{self.port}:{CONTAINER_PORT}"]
        argv += ["-v", Mount(self.cache, MODELS_VOLUME, "z").flag()]
        for mount in self.packages:
            argv += ["-v", mount.flag()]
        if self.models_file is not None:
            argv += ["-v", self.models_file.flag()]
        for name in PASSED_BY_NAME:
            if name in self.environ:
                argv += ["-e", name]
        argv += ["--entrypoint", "vllm-srun", self.image, "serve", *self.models]
        if self.models_file is not None:
            argv += ["--models", MODELS_FILE]
        argv += ["--device", self.device, *self.runtime_args]
        argv += ["--host", "0.0.0.0", "--port", str(CONTAINER_PORT)]
        argv += ["--cache-dir", RUNTIME_CACHE, "--log-level", self.log_level]
        return argv
