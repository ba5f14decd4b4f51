"""Where vllm-srun keeps what it builds once and reuses: one folder for the runtime and
every plugin (merged adapters, ONNX exports, converted GGUF packages, verified digests,
a third-party family's converted tokenizer), each in a subfolder of its own."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_srun.plugins.package import sha256_file

log = logging.getLogger(__name__)


def runtime_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The runtime's cache folder: ``$VLLM_SRUN_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/vllm-srun``, else ``~/.cache/vllm-srun`` (an empty variable counts
    as unset; ``~`` is expanded). Nothing is created.

    Args:
        environ: the environment to read (default ``os.environ``).
    """
    env = os.environ if environ is None else environ
    if env.get("VLLM_SRUN_CACHE_DIR"):
        return Path(env["VLLM_SRUN_CACHE_DIR"]).expanduser()
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "vllm-srun"
    return Path.home() / ".cache" / "vllm-srun"


def write_json_atomically(path: Path, document: Any) -> None:
    """Write ``document`` as JSON (indented, sorted keys; other values as ``str``) to
    ``path``, whole: into a temporary file of the same folder (mode 0600), then renamed
    over ``path``, so that a reader sees the old file or the new one, never half of one.
    The folder is created when missing.

    Raises:
        OSError: the folder or the file cannot be written (the temporary file is removed).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(document, out, indent=1, sort_keys=True, default=str)
        os.replace(temporary, path)  # mkstemp made it 0600
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def intact_build(folder: Path, record_name: str, damaged: str) -> dict[str, Any] | None:
    """The record of a folder built once into the cache, when the folder is whole.

    ``folder/record_name`` is a JSON object whose ``files`` maps each built file's
    path (relative to ``folder``) to its hex SHA-256. When every listed file is there
    with its digest (and it lists at least one), the record is returned. When the
    record is absent, ``None`` (nothing was built). When it is unreadable or
    malformed, or a file is missing or differs, the folder is damaged: ``damaged`` (a
    message with one ``%s`` for the folder) is logged as a warning, the folder
    removed, and ``None`` returned, so the caller builds it again. Never raises.
    """
    path = folder / record_name
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_bytes())
        files = record["files"]
        intact = bool(files) and all(  # a record listing no file vouches for nothing
            (folder / rel).is_file() and sha256_file(folder / rel) == digest
            for rel, digest in files.items()
        )
    except (ValueError, OSError, KeyError, TypeError, AttributeError):
        intact = False
    if not intact:
        log.warning(damaged, folder)
        shutil.rmtree(folder, ignore_errors=True)
        return None
    return dict(record)


def library_versions(names: tuple[str, ...]) -> dict[str, str | None]:
    """The installed version of each distribution in ``names`` (``None`` when absent),
    read from package metadata so that nothing is imported: part of the key a cached
    build or measurement is kept under."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


__all__ = ["intact_build", "library_versions", "runtime_cache_dir", "write_json_atomically"]
