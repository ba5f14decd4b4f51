"""GGUF decoder packages: converted once into a transformers package in the cache.

A GGUF package is a folder holding one ``*.gguf`` file (llama.cpp's format:
weights, often block-quantised, plus the configuration and the tokenizer in
its metadata) and no ``config.json``. transformers reads it
(``from_pretrained(folder, gguf_file=name)``, which needs the ``gguf``
package) by dequantising every tensor to float32, which takes tens of seconds
for a 135 M model on two cores. So the first load converts it into an
ordinary package (``model.safetensors``, ``config.json``, the tokenizer
files and the chat template, written by ``save_pretrained``) under the
runtime's cache, in a folder named after the GGUF file's SHA-256, and every
later load reads that folder (about a second). The conversion writes
``conversion.json`` beside the files: the GGUF file and its digest, its
quantisation, the versions of transformers and gguf that converted it, and
the SHA-256 of every file written; a folder whose files no longer match it is
converted again.

The weights the engine then runs are the GGUF's quantised values expanded to
float32: the same numbers, none of the quantisation's speed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_srun.plugins import (
    intact_build,
    remembered_sha256,
    runtime_cache_dir,
    sha256_file,
)

log = logging.getLogger("vllm_srun.families.causal_readout")

GGUF_SUFFIX = ".gguf"
"""The file suffix of a GGUF file."""

GGUF_MAGIC = b"GGUF"
"""The first four bytes of every GGUF file (the GGUF specification, ggml's docs/gguf.md)."""

CONVERSION_RECORD = "conversion.json"
"""What a converted folder was made from, and the digest of each file it holds."""

CONVERSION_FORMAT = "1"
"""The version of the converted layout; part of the folder name, so a new layout converts
again."""


@dataclass(frozen=True)
class Conversion:
    """A GGUF package and the transformers package converted from it.

    Attributes:
        source: the GGUF file.
        package: the converted package folder in the cache.
        record: ``conversion.json`` of the folder (see :func:`card`).
        reused: whether the folder was already in the cache.
    """

    source: Path
    package: Path
    record: Mapping[str, Any]
    reused: bool

    def card(self) -> dict[str, object]:
        """The card's ``weights`` object: ``format`` ``gguf``, the file and its SHA-256,
        the quantisation (the file's ``general.file_type``, and tensor count per type),
        and how it was converted (dequantised to float32 by transformers, where it is kept)."""
        return {
            "format": "gguf",
            "file": self.record["gguf"]["file"],
            "sha256": self.record["gguf"]["sha256"],
            "quantisation": self.record["gguf"]["quantisation"],
            "tensor_types": dict(self.record["gguf"]["tensor_types"]),
            "conversion": {
                "to": "safetensors float32 (dequantised)",
                "by": dict(self.record["converter"]),
                "package": str(self.package),
                "reused": self.reused,
            },
        }


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """Where converted GGUF packages are kept: ``gguf`` under the runtime's cache
    (:func:`vllm_srun.plugins.runtime_cache_dir`), beside merged adapters."""
    return runtime_cache_dir(environ) / "gguf"


def gguf_file(package: Path) -> Path | None:
    """The package's GGUF file: the one top-level ``*.gguf`` file of a folder without
    ``config.json`` whose first bytes are the GGUF magic; ``None`` otherwise (reads 4 bytes)."""
    if not package.is_dir() or (package / "config.json").exists():
        return None
    found = sorted(p for p in package.glob(f"*{GGUF_SUFFIX}") if p.is_file())
    if len(found) != 1:
        return None
    try:
        with found[0].open("rb") as handle:
            magic = handle.read(len(GGUF_MAGIC))
    except OSError:
        return None
    return found[0] if magic == GGUF_MAGIC else None


def convert(package: Path, root: Path | None = None) -> Conversion:
    """The converted package of the GGUF package at ``package``, converting when the cache
    has no intact copy.

    Args:
        package: a folder :func:`gguf_file` recognises.
        root: where converted folders are kept (default :func:`cache_root`).

    Raises:
        ValueError: ``package`` is not a GGUF package; the ``gguf`` library is not
            installed; transformers cannot read the file (the message names the file
            and the cause).
    """
    source = gguf_file(package)
    if source is None:
        raise ValueError(
            f"{package} is not a GGUF package: it must hold exactly one *.gguf file and no "
            "config.json"
        )
    digest = remembered_sha256(source)
    base = root or cache_root()
    target = base / f"{digest}-{CONVERSION_FORMAT}"
    record = _intact(target)
    if record is not None:
        return Conversion(source, target, record, reused=True)
    _build(source, digest, base, target)
    record = _intact(target)
    if record is None:
        raise ValueError(f"the converted package {target} could not be read back")
    return Conversion(source, target, record, reused=False)


def _intact(target: Path) -> dict[str, Any] | None:
    """``conversion.json`` of ``target`` when every file it lists matches; a damaged
    folder is removed (and converted again) and ``None`` returned (:func:`intact_build`)."""
    return intact_build(
        target, CONVERSION_RECORD, "the converted GGUF package %s is damaged; converting again"
    )


def quantisation(source: Path) -> tuple[str, dict[str, int]]:
    """The file's ``general.file_type`` name (``Q4_1``) and its tensor count per type.

    Read with the ``gguf`` library's reader (``GGUFReader``); the name is
    llama.cpp's ``LlamaFileType`` without its ``MOSTLY_`` prefix (``ALL_F32`` for
    an unquantised file), ``unknown`` when the file states none.
    """
    import gguf

    reader = gguf.GGUFReader(str(source))
    counts: dict[str, int] = {}
    for tensor in reader.tensors:
        counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
    field = reader.fields.get("general.file_type")
    if field is None:
        return "unknown", dict(sorted(counts.items()))
    name = gguf.LlamaFileType(int(field.contents())).name
    return name.removeprefix("MOSTLY_"), dict(sorted(counts.items()))


def _build(source: Path, digest: str, base: Path, target: Path) -> None:
    """Convert into a fresh folder beside ``target``, then move it into place (another
    process that got there first wins; its folder holds the same conversion)."""
    try:
        import gguf
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as err:
        raise ValueError(
            f"a GGUF package needs the gguf library to be read ({err}); install it with "
            "pip install gguf"
        ) from err
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=base, prefix=f".{digest[:12]}-"))
    log.info("converting %s (SHA-256 %s) into %s once", source, digest, target)
    try:
        out = work / "package"
        folder, name = str(source.parent), source.name
        try:
            tokenizer = AutoTokenizer.from_pretrained(  # type: ignore[no-untyped-call]
                folder, gguf_file=name, trust_remote_code=False, local_files_only=True
            )
            model = AutoModelForCausalLM.from_pretrained(
                folder,
                gguf_file=name,
                trust_remote_code=False,
                local_files_only=True,
                dtype="float32",
            )
        except Exception as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise ValueError(
                f"transformers cannot read the GGUF file {source}: {type(err).__name__}: {first}"
            ) from err
        model.save_pretrained(str(out), safe_serialization=True)
        tokenizer.save_pretrained(str(out))
        del model
        quant, types = quantisation(source)
        files = {
            p.relative_to(out).as_posix(): sha256_file(p)
            for p in sorted(out.rglob("*"))
            if p.is_file()
        }
        record = {
            "format": CONVERSION_FORMAT,
            "gguf": {
                "file": source.name,
                "sha256": digest,
                "quantisation": quant,
                "tensor_types": types,
            },
            "converter": {"transformers": transformers.__version__, "gguf": _version(gguf)},
            "files": files,
        }
        (out / CONVERSION_RECORD).write_text(json.dumps(record, indent=2) + "\n")
        try:
            os.rename(out, target)
        except OSError:
            if _intact(target) is None:
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _version(module: Any) -> str:
    """A library's version, from its distribution's metadata when the module has none."""
    version = getattr(module, "__version__", None)
    if isinstance(version, str):
        return version
    import importlib.metadata

    try:
        return importlib.metadata.version(module.__name__)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
