"""A cache of verified SHA-256 digests, so a second start does not hash the weights again.

Hashing a package's files is the only part of verification that grows with
the model (about a second per GB). :class:`DigestCache` remembers each file's
digest keyed by what identifies its bytes without reading them: the resolved
path, device, inode, size, modification time and status-change time (both in
nanoseconds). Any write to a file changes its ``st_ctime_ns`` (the kernel sets
it; no call can set it back), a rewrite through a new file changes the inode,
so a changed file misses the cache and is hashed again.

Two precautions close the gaps of such keys (git's "racily clean" index
entries are the same problem):

- a digest is recorded only when the file's newest timestamp is at least
  :data:`SETTLE_NS` old when hashing starts: file-system timestamps come from
  a coarse clock, so a same-size rewrite within the same tick could keep
  every field of the key;
- the file is stat-ed again after hashing, and a file that changed meanwhile
  is not recorded.

The cache lives in the runtime's cache directory (:func:`runtime_cache_root`,
file :data:`CACHE_FILE`), written whole to a temporary file and renamed over
the old one, mode 0600. A cache file that cannot be read or parsed is ignored
with a warning (every file is hashed again) and rewritten at the next save.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vllm_srun.plugins import runtime_cache_dir, sha256_file
from vllm_srun.plugins.cache import write_json_atomically

log = logging.getLogger(__name__)

CACHE_FILE = "digests.json"
"""The digest cache's file name inside :func:`runtime_cache_root`."""

CACHE_VERSION = 1
"""The cache file's ``version``; a file of another version is ignored (with a warning)."""

SETTLE_NS = 2_000_000_000
"""How old (ns) a file's newest timestamp must be for its digest to be recorded: more
than the coarse clock tick file systems stamp with (a few ms), with room for a clock
step between processes."""

MAX_ENTRIES = 4096
"""Most files the cache remembers; the oldest-written entries go first beyond that."""

_SHA256 = re.compile(r"[0-9a-f]{64}")
_KEY_FIELDS = ("device", "inode", "size", "mtime_ns", "ctime_ns")


def runtime_cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """The runtime's cache directory (:func:`vllm_srun.plugins.runtime_cache_dir`), where
    the adapter and ONNX export caches live too."""
    return runtime_cache_dir(environ)


@dataclass(frozen=True)
class FileKey:
    """What identifies a file's bytes without reading them (links followed).

    Attributes:
        device, inode: ``st_dev`` and ``st_ino``.
        size: ``st_size`` in bytes.
        mtime_ns, ctime_ns: ``st_mtime_ns`` and ``st_ctime_ns`` (ns since the epoch).
    """

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, path: Path) -> FileKey:
        """The key of ``path`` now.

        Raises:
            OSError: the file cannot be stat-ed.
        """
        found = os.stat(path)
        return cls(found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)


class DigestCache:
    """SHA-256 digests of files, remembered by :class:`FileKey` across processes.

    Args:
        file: the cache file (``None``: remember within this object only).
        settle_ns: how old a file's newest timestamp must be to be recorded
            (:data:`SETTLE_NS`).
        clock: the wall clock in ns (``time.time_ns``; tests pass their own).

    Attributes:
        hits, misses: digests answered from the cache, and files hashed.
    """

    def __init__(
        self,
        file: Path | None,
        *,
        settle_ns: int = SETTLE_NS,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.file = file
        self.settle_ns = settle_ns
        self.clock = clock
        self.hits = 0
        self.misses = 0
        self._entries: dict[str, dict[str, Any]] = self._read() if file is not None else {}
        self._recorded: dict[str, dict[str, Any]] = {}

    @classmethod
    def default(cls) -> DigestCache:
        """The cache in :func:`runtime_cache_root` (file :data:`CACHE_FILE`)."""
        return cls(runtime_cache_root() / CACHE_FILE)

    def sha256(self, path: Path) -> str:
        """The SHA-256 of ``path``'s bytes: from the cache when its key is unchanged,
        else hashed (and recorded when the file has settled and did not change while
        it was read).

        Raises:
            OSError: the file cannot be stat-ed or read.
        """
        real = os.path.realpath(path)
        key = FileKey.of(Path(real))
        known = self._entries.get(real)
        if known is not None and all(known[name] == getattr(key, name) for name in _KEY_FIELDS):
            self.hits += 1
            return str(known["sha256"])
        self.misses += 1
        started = self.clock()
        digest = sha256_file(Path(real))
        settled = started - max(key.mtime_ns, key.ctime_ns) >= self.settle_ns
        if settled and FileKey.of(Path(real)) == key:
            entry = {**asdict(key), "sha256": digest}
            self._entries[real] = self._recorded[real] = entry
        else:
            self._entries.pop(real, None)
        return digest

    def save(self) -> None:
        """Write the digests recorded by this object, merged into the file's current
        entries (another process may have written since), when there are any.

        Entries of files that no longer exist are dropped, then the oldest beyond
        :data:`MAX_ENTRIES`. A failure to write is logged as a warning (the next
        start hashes again); it never raises.
        """
        if self.file is None or not self._recorded:
            return
        merged = self._read(quiet=True)
        for real in list(merged):
            if real not in self._recorded and not os.path.exists(real):
                del merged[real]
        for real in self._recorded:
            merged.pop(real, None)  # re-inserted last: newest
        merged.update(self._recorded)
        kept = dict(list(merged.items())[-MAX_ENTRIES:])
        document = {"version": CACHE_VERSION, "files": kept}
        try:
            write_json_atomically(self.file, document)
        except OSError as err:
            log.warning(
                "cannot write the digest cache %s (%s): the next start hashes the model "
                "files again; make the folder writable or set VLLM_SRUN_CACHE_DIR",
                self.file,
                err.strerror or err,
            )
            return
        self._recorded.clear()

    def _read(self, *, quiet: bool = False) -> dict[str, dict[str, Any]]:
        """The cache file's entries; ``{}`` when it is absent, or (with a warning unless
        ``quiet``) unreadable or malformed."""
        assert self.file is not None
        try:
            text = self.file.read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
            return {}  # never written (saving says why it cannot be)
        except (OSError, UnicodeDecodeError) as err:
            return self._ignored(str(err), quiet)
        try:
            document = json.loads(text)
        except ValueError as err:
            return self._ignored(f"not JSON: {err}", quiet)
        problem = _malformed(document)
        if problem is not None:
            return self._ignored(problem, quiet)
        files: dict[str, dict[str, Any]] = document["files"]
        return files

    def _ignored(self, why: str, quiet: bool) -> dict[str, dict[str, Any]]:
        if not quiet:
            log.warning(
                "the digest cache %s is ignored (%s): the model files are hashed again "
                "and the cache rewritten",
                self.file,
                why,
            )
        return {}


def _malformed(document: Any) -> str | None:
    """What is wrong with a parsed cache document, or ``None``."""
    if not isinstance(document, dict) or document.get("version") != CACHE_VERSION:
        return f"not a version {CACHE_VERSION} digest cache"
    files = document.get("files")
    if not isinstance(files, dict):
        return "its files are not an object"
    for path, entry in files.items():
        if (
            not isinstance(entry, dict)
            or not all(type(entry.get(name)) is int for name in _KEY_FIELDS)
            or not isinstance(entry.get("sha256"), str)
            or not _SHA256.fullmatch(entry["sha256"])
        ):
            return f"the entry of {path} is malformed"
    return None


__all__ = [
    "CACHE_FILE",
    "MAX_ENTRIES",
    "SETTLE_NS",
    "DigestCache",
    "FileKey",
    "runtime_cache_root",
]
