"""A Laya checkpoint's encoder as an ordinary transformers package, written once to the cache.

An engine loads a transformers model from a folder holding ``config.json`` and its
weights under the model's own names. A Laya checkpoint keeps the encoder's configuration
in ``encoder/config.json`` and its tensors inside ``model.safetensors`` under
``encoder.``, beside the head's. So the first load writes, under the runtime's cache
(``laya/<key>-<format>``, the key a SHA-256 over the source files' digests):

- ``model.safetensors``: the ``encoder.*`` tensors under their own names, as stored
  (float16 for published checkpoints);
- ``config.json``: ``encoder/config.json`` with ``reference_compile`` off (as the
  ``laya`` package loads it: no ``torch.compile`` of the encoder) and, for a configuration
  saved by transformers 5, its ``rope_parameters`` carried over to the
  ``global_rope_theta`` / ``local_rope_theta`` that transformers 4 reads (the package
  does the same: multilingual checkpoints' local layers use 160000, not 4's default 10000);
- the tokenizer's files, ``tokenizer_config.json`` made readable by transformers 4 (a
  ``TokenizersBackend`` class, or none, becomes ``PreTrainedTokenizerFast``; a list of
  ``extra_special_tokens`` becomes an object), as the package rewrites it;
- ``conversion.json``: the source files' digests, the format, and the SHA-256 of every
  file written; a folder whose files no longer match is written again.

Nothing in the checkpoint's own folder is changed.
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
from vllm_srun.plugins.package import PackageError

from .checkpoint import ENCODER_CONFIG, ENCODER_PREFIX, TOKENIZER_DIR, WEIGHTS_FILE

log = logging.getLogger("vllm_srun.families.laya")

RECORD = "conversion.json"
"""What a converted folder was made from, and the digest of each file it holds."""

FORMAT = "1"
"""The converted layout's version; part of the folder name, so a new layout converts again."""


@dataclass(frozen=True)
class Conversion:
    """A checkpoint and its converted encoder package.

    Attributes:
        package: the converted folder (what the engine loads and the tokenizer is read from).
        record: its ``conversion.json``.
        reused: whether the folder was already in the cache.
    """

    package: Path
    record: Mapping[str, Any]
    reused: bool

    def card(self) -> dict[str, object]:
        """The card's ``weights``: the encoder's tensors, where they were written, and the
        digests of the checkpoint files they were written from."""
        return {
            "format": "laya",
            "encoder": {
                "from": f"{WEIGHTS_FILE} ({ENCODER_PREFIX}*), {ENCODER_CONFIG}",
                "package": str(self.package),
                "reused": self.reused,
            },
            "sources": dict(self.record["sources"]),
        }


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """Where converted encoders are kept: ``laya`` under the runtime's cache."""
    return runtime_cache_dir(environ) / "laya"


def source_files(package: Path) -> list[str]:
    """The checkpoint files a conversion reads (relative POSIX paths, sorted): the weights,
    the encoder's configuration and every tokenizer file."""
    tokenizer = package / TOKENIZER_DIR
    names = [WEIGHTS_FILE, ENCODER_CONFIG]
    names += [p.relative_to(package).as_posix() for p in tokenizer.iterdir() if p.is_file()]
    return sorted(names)


def convert(package: Path, root: Path | None = None) -> Conversion:
    """The converted encoder package of the checkpoint at ``package``, written when the
    cache holds no intact copy.

    Raises:
        PackageError: a file cannot be read, or the folder cannot be written.
    """
    import hashlib

    try:
        sources = {name: remembered_sha256(package / name) for name in source_files(package)}
    except OSError as err:
        raise PackageError(f"a checkpoint file cannot be read: {err}") from err
    key = hashlib.sha256()
    for name, digest in sorted(sources.items()):
        key.update(f"{name}\0{digest}\n".encode())
    base = root or cache_root()
    target = base / f"{key.hexdigest()}-{FORMAT}"
    record = _intact(target)
    if record is not None:
        return Conversion(target, record, reused=True)
    try:
        _build(package, sources, base, target)
    except OSError as err:
        raise PackageError(f"the encoder cannot be written to {base}: {err}") from err
    record = _intact(target)
    if record is None:
        raise PackageError(f"the converted encoder {target} could not be read back")
    return Conversion(target, record, reused=False)


def _intact(target: Path) -> dict[str, Any] | None:
    return intact_build(target, RECORD, "the converted Laya encoder %s is damaged; writing again")


def encoder_config(raw: dict[str, Any]) -> dict[str, Any]:
    """``encoder/config.json`` as transformers 4 should read it (see the module)."""
    config = dict(raw, reference_compile=False)
    rope = config.get("rope_parameters")
    if isinstance(rope, dict):
        flat = rope.get("rope_theta")
        for layer_type, name in (
            ("full_attention", "global_rope_theta"),
            ("sliding_attention", "local_rope_theta"),
        ):
            params = rope.get(layer_type)
            theta = params.get("rope_theta") if isinstance(params, dict) else flat
            if theta is not None:
                config[name] = float(theta)
    return config


def tokenizer_config(raw: dict[str, Any]) -> dict[str, Any]:
    """``tokenizer_config.json`` as transformers 4 reads it (see the module)."""
    config = dict(raw)
    if config.get("tokenizer_class") in (None, "TokenizersBackend"):
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config.pop("backend", None)
        config.pop("is_local", None)
    extra = config.get("extra_special_tokens")
    if isinstance(extra, list):
        config["extra_special_tokens"] = {f"extra_{i}": token for i, token in enumerate(extra)}
    return config


def _build(package: Path, sources: dict[str, str], base: Path, target: Path) -> None:
    """Write into a fresh folder beside ``target``, then move it into place (another
    process that got there first wins: its folder holds the same conversion)."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=base, prefix=".laya-"))
    log.info("writing the encoder of %s into %s once", package, target)
    try:
        out = work / "package"
        out.mkdir()
        tensors = {}
        with safe_open(str(package / WEIGHTS_FILE), "np") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if name.startswith(ENCODER_PREFIX):
                    tensors[name.removeprefix(ENCODER_PREFIX)] = handle.get_tensor(name)
        save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
        del tensors
        raw = json.loads((package / ENCODER_CONFIG).read_text(encoding="utf-8"))
        (out / "config.json").write_text(json.dumps(encoder_config(raw), indent=2) + "\n")
        for name in sources:
            if not name.startswith(TOKENIZER_DIR + "/"):
                continue
            source = package / name
            copied = out / source.name
            if source.name == "tokenizer_config.json":
                config = tokenizer_config(json.loads(source.read_text(encoding="utf-8")))
                copied.write_text(json.dumps(config, indent=2) + "\n")
            else:
                shutil.copyfile(source, copied)
        files = {p.relative_to(out).as_posix(): sha256_file(p) for p in sorted(out.iterdir())}
        record = {"format": FORMAT, "sources": sources, "files": files}
        (out / RECORD).write_text(json.dumps(record, indent=2) + "\n")
        try:
            os.rename(out, target)
        except OSError:
            if _intact(target) is None:
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
