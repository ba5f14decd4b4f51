"""Adapter packages: a PEFT adapter merged into the pinned base model it records.

An adapter package is the folder ``PeftModel.save_pretrained`` writes
(``adapter_config.json`` and ``adapter_model.safetensors``) plus
``base_model.json``, the record of its base model::

    {"repo": "owner/name", "revision": "<40-hex commit>",
     "files": {"config.json": "<sha256>", "model.safetensors": "<sha256>", ...}}

``repo`` is a Hub repository or a built-in model name, ``revision`` its commit
(``null`` only for a built-in model that lives in its mirror alone) and
``files`` the SHA-256 of every base file the merged model is made of: the
configuration, the safetensors weights, the tokenizer and the head or pooling
files (:func:`write_base_record` writes the record from a local copy).

:func:`prepare_adapter` is what the loader calls first: for an adapter package
it finds the base (``base_path``, checked file by file against the record;
else the registry's resolution of ``repo@revision``, which may download, and
the same check), merges the adapter into it with ``peft``
(``PeftModel.from_pretrained(base, adapter).merge_and_unload()``) and writes
the merged model as a normal package into the cache
(``$VLLM_SRUN_CACHE_DIR/adapters/<key>``, the key a digest of the adapter's
and the base's files), so a second start reuses it. The loader then loads that
package through the families like any other.

Why this module is over 400 lines: it is one pipeline (read the record, find
and check the base, merge, write the cache entry, reuse it) whose steps are
short, private to it and each other's only callers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_srun.compose.registry import prepare
from vllm_srun.compose.registry.resolve import looks_local
from vllm_srun.compose.registry.verify import (
    WEIGHT_AND_CODE_SUFFIXES,
    identity,
    is_loadable,
    link_root,
    package_files,
)
from vllm_srun.errors import LoadError
from vllm_srun.plugins import ModelEntry, intact_build, runtime_cache_dir, sha256_file
from vllm_srun.plugins.cards import AdapterCard

log = logging.getLogger("vllm_srun.compose.adapters")

ADAPTER_CONFIG = "adapter_config.json"
"""The PEFT configuration that marks a folder as an adapter package."""

ADAPTER_WEIGHTS = "adapter_model.safetensors"
"""The adapter's weights (PEFT's pickled ``adapter_model.bin`` is refused)."""

BASE_RECORD = "base_model.json"
"""The adapter package's record of its base model: repo, revision, file digests."""

MERGED_RECORD = "merged.json"
"""What a merged package in the cache was made of, and the digest of each file it holds."""

MERGE_FORMAT = "1"
"""The version of the merged layout; part of the cache key, so a new layout merges again."""

WEIGHT_SUFFIXES = tuple(sorted(WEIGHT_AND_CODE_SUFFIXES))
"""Base files the merged package never takes over: weights and graphs (the merged weights
replace them; an ONNX graph of the base would answer without the adapter) and code."""


# -- the record ------------------------------------------------------------------------------
@dataclass(frozen=True)
class BaseRecord:
    """An adapter package's base model, as ``base_model.json`` records it.

    Attributes:
        repo: a Hub repository ID or a built-in model name.
        revision: its 40-hex commit (``None``: the built-in model's own).
        files: relative POSIX path to SHA-256 of every base file the merge uses.
    """

    repo: str
    revision: str | None
    files: dict[str, str]

    def label(self) -> str:
        """``owner/name@<commit>`` (or the bare name without a revision)."""
        return f"{self.repo}@{self.revision}" if self.revision else self.repo

    def to_json(self) -> dict[str, Any]:
        """The record's JSON document."""
        return {
            "repo": self.repo,
            "revision": self.revision,
            "files": dict(sorted(self.files.items())),
        }


def read_base_record(adapter: Path) -> BaseRecord:
    """The base record of the adapter package at ``adapter``.

    Raises:
        LoadError: ``base_model.json`` is missing or malformed (the message says
            what it must hold).
    """
    path = adapter / BASE_RECORD
    shape = (
        f'{BASE_RECORD} must hold {{"repo": "owner/name", "revision": "<40-hex commit>", '
        '"files": {"<path>": "<sha256>", ...}} (vllm_srun.compose.adapters.write_base_record '
        "writes it from a local copy of the base)"
    )
    if not path.is_file():
        raise LoadError(
            f"the adapter package {adapter} records no base model: {BASE_RECORD} is missing. "
            + shape
        )
    try:
        document = json.loads(path.read_bytes())
    except (ValueError, OSError, RecursionError) as err:
        raise LoadError(f"{path} is not valid JSON ({err}); {shape}") from err
    if not isinstance(document, dict):
        raise LoadError(f"{path} is not a JSON object; {shape}")
    repo, revision, files = document.get("repo"), document.get("revision"), document.get("files")
    if not isinstance(repo, str) or not repo:
        raise LoadError(f"{path} names no base repository (`repo`); {shape}")
    if revision is not None and not isinstance(revision, str):
        raise LoadError(f"{path}: `revision` must be a 40-hex commit; {shape}")
    if (
        not isinstance(files, dict)
        or not files
        or not all(
            isinstance(k, str) and isinstance(v, str) and len(v) == 64 for k, v in files.items()
        )
    ):
        raise LoadError(f"{path}: `files` must map each base file to its SHA-256; {shape}")
    unsafe = sorted(k for k in files if k.startswith("/") or ".." in k.split("/"))
    if unsafe:
        raise LoadError(f"{path}: `files` names paths outside the base: {', '.join(unsafe)}")
    if "config.json" not in files or not any(k.endswith(".safetensors") for k in files):
        raise LoadError(
            f"{path}: the base must be recorded with its config.json and safetensors weights; "
            + shape
        )
    return BaseRecord(
        repo, revision.lower() if revision else None, {k: v.lower() for k, v in files.items()}
    )


def write_base_record(
    adapter: str | os.PathLike[str],
    base: str | os.PathLike[str],
    *,
    repo: str,
    revision: str | None,
) -> BaseRecord:
    """Write ``base_model.json`` into the adapter package: the digest of every file of the
    local base copy ``base`` that loading may read (configuration, weights, tokenizer,
    head and pooling files; README and the like are left out).

    Returns:
        The record written.
    """
    base_dir = Path(base).expanduser().resolve()
    files = {
        rel: sha256_file(path)
        for rel, path in package_files(base_dir, link_root(base_dir))
        if is_loadable(rel)
    }
    record = BaseRecord(repo, revision, files)
    target = Path(adapter) / BASE_RECORD
    target.write_text(json.dumps(record.to_json(), indent=2) + "\n", encoding="utf-8")
    return record


# -- the loaded adapter ----------------------------------------------------------------------
@dataclass(frozen=True)
class AdapterModel:
    """An adapter package merged into its base, ready for the family path.

    Attributes:
        name: the adapter package's folder name (the default model ID).
        adapter: the adapter package directory.
        package: the merged package directory in the cache.
        peft_type: ``LORA`` and the like, from ``adapter_config.json``.
        adapter_sha256: the SHA-256 of ``adapter_model.safetensors``.
        adapter_files: the digest of every adapter file the merge read.
        base: the base record.
        base_source: where the base's bytes came from (``--base-path DIR``, a mirror,
            the Hugging Face cache).
        base_verification: ``base_path`` (a local copy, every recorded hash matched) or
            the registry's status (``pinned``, ``revision``; the recorded hashes matched too).
        reused: whether the merged package was already in the cache.
    """

    name: str
    adapter: Path
    package: Path
    peft_type: str
    adapter_sha256: str
    adapter_files: dict[str, str]
    base: BaseRecord
    base_source: str
    base_verification: str
    reused: bool

    def card(self) -> AdapterCard:
        """The card's ``adapter`` field."""
        return {
            "package": str(self.adapter),
            "peft_type": self.peft_type,
            "adapter_sha256": self.adapter_sha256,
            "base": {
                "repo": self.base.repo,
                "revision": self.base.revision,
                "source": self.base_source,
                "verification": self.base_verification,
                "base_sha256": identity(self.base.files),
                "files": dict(sorted(self.base.files.items())),
            },
            "merged": {"path": str(self.package), "reused": self.reused},
        }


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """Where merged adapter packages are kept: ``adapters`` under the runtime's cache
    (:func:`vllm_srun.plugins.runtime_cache_dir`)."""
    return runtime_cache_dir(environ) / "adapters"


def is_adapter_package(model: str | os.PathLike[str]) -> bool:
    """Whether a MODEL argument is a local folder holding ``adapter_config.json``."""
    if not looks_local(model):
        return False
    return (Path(os.fspath(model)).expanduser() / ADAPTER_CONFIG).is_file()


def prepare_adapter(
    model: str | os.PathLike[str],
    *,
    base_path: str | os.PathLike[str] | None,
    revision: str | None,
    builtins: Mapping[str, ModelEntry],
    cache_dir: str | os.PathLike[str] | None = None,
    offline: bool = False,
    accept_licences: Iterable[str] = (),
    merged_root: Path | None = None,
) -> AdapterModel | None:
    """The merged package of an adapter package, or ``None`` for any other MODEL.

    Args:
        model: the MODEL argument.
        base_path: ``--base-path``: a local copy of the recorded base.
        revision: ``--revision`` (refused for an adapter package: its base is pinned).
        builtins, cache_dir, offline, accept_licences: how the registry resolves the
            recorded base when ``base_path`` is not given.
        merged_root: where merged packages are kept (default :func:`cache_root`).

    Raises:
        LoadError: ``base_path`` for a MODEL that is not an adapter package; a
            malformed package or record; a base file missing or whose hash differs
            from the record (naming the file, both digests and the fix); the base
            cannot be resolved (offline, not cached); the merge fails.
    """
    if not is_adapter_package(model):
        if base_path is not None:
            raise LoadError(
                f"base_path applies to adapter packages only: {os.fspath(model)} is not one (a "
                f"local folder with {ADAPTER_CONFIG} and {BASE_RECORD}); drop base_path for "
                "this model"
            )
        return None
    adapter = Path(os.fspath(model)).expanduser().resolve()
    if revision is not None:
        raise LoadError(
            f"--revision does not apply to the adapter package {adapter}: its base model's "
            f"revision is pinned in {BASE_RECORD}"
        )
    adapter_files, adapter_sha256 = _adapter_files(adapter)
    peft_type = _peft_type(adapter)
    record = read_base_record(adapter)
    if base_path is not None:
        base_dir = Path(base_path).expanduser().resolve()
        check_base_copy(base_dir, record, adapter, known={})
        source, verification = f"--base-path {base_dir}", "base_path"
    else:
        base_dir, source, verification = _resolve_base(
            record, adapter, builtins, cache_dir, offline, accept_licences
        )
    key = identity(
        {
            **{f"adapter/{rel}": digest for rel, digest in adapter_files.items()},
            **{f"base/{rel}": digest for rel, digest in record.files.items()},
            "format": MERGE_FORMAT,
        }
    )
    root = merged_root or cache_root()
    target = root / key
    reused = _intact(target)
    if not reused:
        _build(adapter, base_dir, record, root, target, adapter_files)
    return AdapterModel(
        name=adapter.name,
        adapter=adapter,
        package=target,
        peft_type=peft_type,
        adapter_sha256=adapter_sha256,
        adapter_files=adapter_files,
        base=record,
        base_source=source,
        base_verification=verification,
        reused=reused,
    )


def _adapter_files(adapter: Path) -> tuple[dict[str, str], str]:
    """The digests of the adapter files the merge reads, and the weights' digest."""
    present = dict(package_files(adapter, link_root(adapter)))  # refuses escaping links
    if ADAPTER_WEIGHTS not in present:
        pickled = (
            " (adapter_model.bin is a pickle and is not loaded)"
            if ("adapter_model.bin" in present)
            else ""
        )
        raise LoadError(
            f"the adapter package {adapter} has no {ADAPTER_WEIGHTS}{pickled}: save the adapter "
            "with PeftModel.save_pretrained(..., safe_serialization=True)"
        )
    files = {
        rel: sha256_file(present[rel])
        for rel in (ADAPTER_CONFIG, ADAPTER_WEIGHTS, BASE_RECORD)
        if rel in present
    }
    return files, files[ADAPTER_WEIGHTS]


def _peft_type(adapter: Path) -> str:
    try:
        config = json.loads((adapter / ADAPTER_CONFIG).read_bytes())
    except (ValueError, OSError, RecursionError) as err:
        raise LoadError(f"{adapter / ADAPTER_CONFIG} is not valid JSON ({err})") from err
    peft_type = config.get("peft_type") if isinstance(config, dict) else None
    if not isinstance(peft_type, str):
        raise LoadError(f"{adapter / ADAPTER_CONFIG} names no peft_type: it is not a PEFT adapter")
    return peft_type


def check_base_copy(
    base_dir: Path, record: BaseRecord, adapter: Path, *, known: Mapping[str, str]
) -> None:
    """Check every recorded base file in ``base_dir`` against the record.

    Args:
        known: digests already computed (the registry's), by relative path.

    Raises:
        LoadError: the folder does not exist; a link leaves it; a recorded file is
            missing (``a file the base model needs is missing``) or its digest differs
            (``a file hash does not match``, naming the file and both digests).
    """
    fix = (
        f"give --base-path (base_path) a complete copy of {record.repo} at revision "
        f"{record.revision or '(its pinned one)'}, or leave it out to fetch the pinned base"
    )
    if not base_dir.is_dir():
        raise LoadError(
            f"the base model folder {base_dir} does not exist (base of the adapter package "
            f"{adapter}); {fix}"
        )
    present = dict(package_files(base_dir, link_root(base_dir)))
    missing = sorted(
        rel for rel in record.files if rel not in present or not present[rel].is_file()
    )
    if missing:
        raise LoadError(
            f"a file the base model needs is missing: {', '.join(missing)} in {base_dir} "
            f"(the adapter package {adapter} records {record.label()}); {fix}"
        )
    for rel in sorted(record.files):
        got = known.get(rel) or sha256_file(present[rel])
        want = record.files[rel]
        if got != want:
            raise LoadError(
                f"a file hash does not match: {rel} in {base_dir} has SHA-256 {got}, the adapter "
                f"package {adapter} records {want} for its base {record.label()}. The copy is "
                f"damaged or another revision; {fix}"
            )


def _resolve_base(
    record: BaseRecord,
    adapter: Path,
    builtins: Mapping[str, ModelEntry],
    cache_dir: str | os.PathLike[str] | None,
    offline: bool,
    accept_licences: Iterable[str],
) -> tuple[Path, str, str]:
    """The recorded base through the registry (mirror, cache, download), checked against
    the record: ``(folder, source, verification status)``."""
    try:
        prepared = prepare(
            record.repo,
            builtins=builtins,
            revision=record.revision,
            cache_dir=cache_dir,
            offline=offline,
            accept_licences=accept_licences,
        )
    except LoadError as err:
        raise type(err)(
            f"{err} (the base model {record.label()} of the adapter package {adapter}; "
            "or give --base-path a local copy of it)",
            retryable=err.retryable,
        ) from err
    folder = prepared.source.path
    check_base_copy(folder, record, adapter, known=prepared.verification.files)
    return folder, prepared.source.origin, prepared.verification.status


# -- the merged package ----------------------------------------------------------------------
def _intact(target: Path) -> bool:
    """Whether ``target`` is a complete merged package whose files match its record; a
    damaged one is removed (and merged again) (:func:`intact_build`)."""
    damaged = "the merged adapter package %s is damaged; merging again"
    return intact_build(target, MERGED_RECORD, damaged) is not None


def _build(
    adapter: Path,
    base_dir: Path,
    record: BaseRecord,
    root: Path,
    target: Path,
    adapter_files: Mapping[str, str],
) -> None:
    """Merge into a fresh folder beside ``target``, then move it into place (another
    process that got there first wins; its package is the same)."""
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=root, prefix=f".{target.name[:12]}-"))
    try:
        merged = work / "merged"
        merge(adapter, base_dir, record, merged)
        files = {
            rel: sha256_file(path)
            for rel, path in package_files(merged, merged)
            if rel != MERGED_RECORD
        }
        document = {
            "format": MERGE_FORMAT,
            "adapter": {"package": str(adapter), "files": dict(sorted(adapter_files.items()))},
            "base": record.to_json(),
            "files": dict(sorted(files.items())),
        }
        (merged / MERGED_RECORD).write_text(json.dumps(document, indent=2) + "\n")
        try:
            os.rename(merged, target)
        except OSError:
            if not _intact(target):
                raise
    except LoadError:
        raise
    except Exception as err:
        raise LoadError(
            f"the adapter package {adapter} cannot be merged into its base {record.label()}: "
            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        ) from err
    finally:
        shutil.rmtree(work, ignore_errors=True)


def merge(adapter: Path, base_dir: Path, record: BaseRecord, out: Path) -> None:
    """Write the base with the adapter merged in as a package at ``out``.

    The base is loaded (the class its ``config.json`` names, float32) from the recorded
    files only, the adapter applied with ``PeftModel.from_pretrained`` and merged
    (``merge_and_unload``), and the result saved with ``save_pretrained`` (safetensors;
    cast back to the base's float16 or bfloat16 when it was released in one). The base's
    other recorded files (tokenizer, head and pooling files) are copied beside it;
    its weights, graphs and code never are.

    Raises:
        LoadError: the base names no transformers class; the adapter type cannot merge.
    """
    import torch
    import transformers
    from peft import PeftModel

    config = json.loads((base_dir / "config.json").read_bytes())
    architectures = config.get("architectures") or []
    name = architectures[0] if architectures else "AutoModel"
    model_class = getattr(transformers, name, None)
    if model_class is None or not hasattr(model_class, "from_pretrained"):
        raise LoadError(
            f"the base model {record.label()} names the architecture {name}, which transformers "
            "does not provide (remote code is never run): an adapter package needs a base "
            "transformers loads itself"
        )
    staging = out.parent / "base"
    for rel in record.files:  # only the recorded files are visible to the loader
        link = staging / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(base_dir / rel)
    base = model_class.from_pretrained(str(staging), dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, str(adapter), is_trainable=False)
    if not hasattr(peft_model, "merge_and_unload"):
        raise LoadError(
            f"the adapter package {adapter} is a {type(peft_model).__name__} adapter, which "
            "cannot be merged into its base: only adapters that merge (LoRA and its kin) are "
            "served"
        )
    merged = peft_model.merge_and_unload()
    released = config.get("torch_dtype") or config.get("dtype")
    if released in ("float16", "bfloat16"):
        merged = merged.to(getattr(torch, released))
    merged.save_pretrained(str(out), safe_serialization=True)
    for rel in sorted(record.files):
        if rel == "config.json" or rel.endswith(WEIGHT_SUFFIXES) or rel.endswith(".index.json"):
            continue
        copy = out / rel
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(base_dir / rel, copy)
        if sha256_file(copy) != record.files[rel]:  # changed since it was checked
            raise LoadError(
                f"a file hash does not match: {rel} of the base changed while it was copied"
            )
    with contextlib.suppress(OSError):
        shutil.rmtree(staging)


__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "BASE_RECORD",
    "AdapterModel",
    "BaseRecord",
    "cache_root",
    "check_base_copy",
    "is_adapter_package",
    "merge",
    "prepare_adapter",
    "read_base_record",
    "write_base_record",
]
