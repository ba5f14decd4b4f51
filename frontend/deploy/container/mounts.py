"""What the engine container mounts: the model cache, local packages (read-only) and a
rewritten copy of the models file, with the paths the runtime sees inside."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ...config.flags import FlagError, check_device, check_model
from .errors import ContainerError

MODELS_VOLUME = "/app/models"
"""The image's model volume (``VOLUME /app/models``)."""

RUNTIME_CACHE = f"{MODELS_VOLUME}/model-runtime"
"""The runtime's ``--cache-dir`` inside the container."""

PACKAGES_DIR = "/app/packages"
"""Where local packages and the models file appear inside the container."""

MODELS_FILE = f"{PACKAGES_DIR}/models.yaml"
"""The models file's path inside the container."""


def engine_cache_dir(environ: Mapping[str, str], home: Path | None = None) -> Path:
    """The host directory mounted at ``/app/models``: ``VLLM_SR_ENGINE_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/vllm-sr/models``, else ``~/.cache/vllm-sr/models``."""
    given = environ.get("VLLM_SR_ENGINE_CACHE_DIR", "").strip()
    if given:
        return Path(given).expanduser().absolute()
    xdg = environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else (home or Path.home()) / ".cache"
    return (base / "vllm-sr" / "models").absolute()


def check_mountable(path: str, what: str, fix: str) -> None:
    """Refuse a host ``path`` holding ``:``: ``-v HOST:CONTAINER:OPTIONS`` splits on it
    (``--mount`` would take it, but Docker's gives no SELinux relabel).

    Raises:
        ContainerError: the path, ``what`` it is and ``fix`` (code ``bad_mount``).
    """
    if ":" in path:
        raise ContainerError(
            f"{what} {path} cannot be mounted: a host path with ':' breaks -v; {fix}",
            "bad_mount",
        )


@dataclass(frozen=True)
class Mount:
    """One ``-v HOST:CONTAINER:OPTIONS`` bind mount."""

    host: str
    container: str
    options: str

    def flag(self) -> str:
        """The ``-v`` value (``:z`` relabels for SELinux hosts; Docker ignores it elsewhere)."""
        return f"{self.host}:{self.container}:{self.options}"


@dataclass
class Packages:
    """Local package directories, each mounted once, read-only, at
    ``/app/packages/<i>/<basename>``."""

    mounts: list[Mount] = field(default_factory=list)
    _by_host: dict[str, str] = field(default_factory=dict)

    def inside(self, directory: str) -> str:
        """The container path of the (absolute) host ``directory``, mounting it once."""
        if directory not in self._by_host:
            check_mountable(
                directory,
                "the package directory",
                f"move it, or link it to a path without ':' (ln -s '{directory}' /tmp/model) "
                "and give that",
            )
            target = f"{PACKAGES_DIR}/{len(self.mounts)}/{Path(directory).name}"
            self.mounts.append(Mount(directory, target, "ro,z"))
            self._by_host[directory] = target
        return self._by_host[directory]


def container_model(model: str, packages: Packages) -> str:
    """``MODEL`` as the runtime inside sees it: a local package directory becomes its
    mount path; a Hub repository or built-in name (``@REVISION`` included) is kept.

    Raises:
        ContainerError: a blank or untrimmed MODEL (code ``bad_flag``).
    """
    try:
        artifact = check_model(model)
    except FlagError as err:
        raise ContainerError(str(err), "bad_flag") from None
    if Path(artifact).is_absolute() and Path(artifact).is_dir():
        return packages.inside(artifact)
    return artifact


def rewrite_models_file(
    path: str, platform: str, packages: Packages, *, directory: Callable[[], str] | None = None
) -> Mount:
    """A copy of the models file ``path`` whose local ``model:`` paths name their mounts,
    every ``device:`` checked against ``platform``, mounted read-only at
    ``/app/packages/models.yaml``.

    Relative ``model:`` paths are read from the current directory, as ``vllm-srun serve
    --models`` reads them.

    Args:
        path: the models file.
        platform: ``--platform`` (``cpu``, ``amd``/``rocm``, ``nvidia``/``cuda``).
        packages: collects the package mounts.
        directory: makes the private directory the copy is written to (a fresh
            ``tempfile.mkdtemp`` by default).

    Raises:
        ContainerError: an unreadable file, one without a ``models`` list of entries with
            a ``model``, or a device the image cannot run (code ``bad_models_file``).
    """
    try:
        document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ContainerError(f"--models {path}: cannot read it: {err}", "bad_models_file") from None
    entries = document.get("models") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ContainerError(
            f"--models {path}: needs a non-empty `models:` list of entries, each with `model:`",
            "bad_models_file",
        )
    copied: list[Any] = []
    for index, entry in enumerate(entries):
        where = f"--models {path}: models[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("model"), str):
            raise ContainerError(f"{where}: an entry needs a `model:` string", "bad_models_file")
        entry = dict(entry)
        try:
            entry["model"] = container_model(entry["model"], packages)
        except ContainerError as err:
            raise ContainerError(f"{where}: {err}", "bad_models_file") from None
        device = entry.get("device")
        if device is not None:
            try:
                check_device(str(device), platform)
            except FlagError as err:
                raise ContainerError(f"{where}: {err}", "bad_models_file") from None
        copied.append(entry)
    out_dir = Path(directory() if directory else tempfile.mkdtemp(prefix="vllm-sr-engine-"))
    copy = out_dir / "models.yaml"
    copy.write_text(
        yaml.safe_dump({**document, "models": copied}, sort_keys=False), encoding="utf-8"
    )
    # The container's user is not this one under every runtime: the copy must be readable.
    os.chmod(copy, 0o644)
    check_mountable(str(copy), "the models file's copy", "set TMPDIR to a folder without ':'")
    return Mount(str(copy), MODELS_FILE, "ro,z")
