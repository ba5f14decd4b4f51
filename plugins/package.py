"""Reading a model package's files: what every family's ``detect`` and ``describe`` share.

A family reads the package format (configuration, tokenizer, heads) and
never loads weights itself. These helpers read its JSON files with errors that
name the file, so an operator knows which one to fix.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

HASH_CHUNK_BYTES = 1 << 20
"""How much of a file :func:`sha256_file` reads at a time (1 MiB)."""


class PackageError(Exception):
    """A package a family cannot serve; the message names the file or the missing part
    and what to do."""


def sha256_file(path: Path) -> str:
    """Lower-case hex SHA-256 of a file's bytes (read in 1 MiB chunks; links followed).

    Raises:
        OSError: the file cannot be read.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


_REMEMBERED: dict[tuple[str, int, int], str] = {}


def remembered_sha256(path: Path) -> str:
    """:func:`sha256_file`, remembered for this process by the file's resolved path, size
    and modification time: a family that converts a package keys its cache by its source
    files' digests at every load, and a file changed in place is hashed again.

    Raises:
        OSError: the file cannot be read.
    """
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _REMEMBERED:
        _REMEMBERED[key] = sha256_file(path)
    return _REMEMBERED[key]


def read_json(path: Path) -> Any:
    """The parsed JSON of ``path``.

    Raises:
        PackageError: ``<name> cannot be read: <reason>`` (missing, unreadable,
            not valid UTF-8 or JSON).
    """
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise PackageError(f"{path.name} cannot be read: {err}") from err


def read_config(package: Path) -> dict[str, Any] | None:
    """``package/config.json`` as an object, or ``None`` when it is absent, unreadable or
    not an object: what a cheap ``detect`` reads (it never raises)."""
    path = package / "config.json"
    if not path.is_file():
        return None
    try:
        config = read_json(path)
    except PackageError:
        return None
    return config if isinstance(config, dict) else None


__all__ = ["PackageError", "read_config", "read_json"]
