"""NanoGuard's tokenizer: the package's pickle, read once without running it, then tiktoken.

The package ships its byte-pair encoding as ``tokenizer.pkl``: a pickled
``tiktoken.core.Encoding``, whose state is four plain values (``name``,
``pat_str``, ``mergeable_ranks`` bytes to rank, ``special_tokens`` text to id).
Unpickling it normally would import and call whatever the pickle names, so
:func:`read_pickled_encoding` reads it with an unpickler that resolves that one
class to an inert record and refuses every other global. :func:`converted`
writes the state once into a cache folder keyed by the pickle's SHA-256: the
ranks in tiktoken's plain ``.tiktoken`` format (one ``base64(token) rank`` line
per token) and the rest in ``encoding.json``; every later load reads those files
and never opens the pickle again.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import pickle
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_srun.plugins import PackageError, runtime_cache_dir

PICKLE = "tokenizer.pkl"
"""The package's pickled tokenizer."""

RANKS = "ranks.tiktoken"
"""The converted ranks, in tiktoken's ``.tiktoken`` format."""

SETTINGS = "encoding.json"
"""The converted name, split pattern, special tokens and the ranks file's SHA-256."""

BOS_TOKEN = "<|reserved_0|>"
"""The special token NanoGuard puts before every text (its scanner's ``BOS_TOKEN``)."""

PAD_TOKEN = "<|reserved_1|>"
"""The special token filling positions after the text (its scanner's ``PAD_TOKEN``)."""

ENCODING_CLASS = ("tiktoken.core", "Encoding")
"""The only global the pickle may name."""


class _EncodingRecord:
    """Stands in for ``tiktoken.core.Encoding`` while reading the pickle: keeps the state."""

    state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _OneClassUnpickler(pickle.Unpickler):
    """Resolves :data:`ENCODING_CLASS` to :class:`_EncodingRecord`, refuses other globals."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ENCODING_CLASS:
            return _EncodingRecord
        raise pickle.UnpicklingError(
            f"{PICKLE} names {module}.{name}; only {'.'.join(ENCODING_CLASS)} is read"
        )


@dataclass(frozen=True)
class EncodingState:
    """A byte-pair encoding as tiktoken's ``Encoding`` takes it.

    Attributes:
        name: the encoding's name.
        pattern: the regular expression that splits text before merging.
        ranks: token bytes to rank (the token id); lower ranks merge first.
        special_tokens: special token text to id.
    """

    name: str
    pattern: str
    ranks: Mapping[bytes, int]
    special_tokens: Mapping[str, int]

    @property
    def vocabulary(self) -> int:
        """One more than the highest id: the embedding rows the model needs."""
        return 1 + max([*self.ranks.values(), *self.special_tokens.values()])


def read_pickled_encoding(data: bytes) -> EncodingState:
    """The encoding state inside a pickled ``tiktoken.core.Encoding``, read without running it.

    Raises:
        PackageError: the bytes are not such a pickle, name another class, or hold a
            state of other types (naming what is wrong).
    """
    try:
        record = _OneClassUnpickler(io.BytesIO(data)).load()
    except Exception as err:
        raise PackageError(f"{PICKLE} cannot be read: {err}") from err
    state = getattr(record, "state", None) if isinstance(record, _EncodingRecord) else None
    if not isinstance(state, dict):
        raise PackageError(f"{PICKLE} must hold a pickled {'.'.join(ENCODING_CLASS)}")
    name, pattern = state.get("name"), state.get("pat_str")
    ranks, specials = state.get("mergeable_ranks"), state.get("special_tokens")
    if not isinstance(name, str) or not isinstance(pattern, str):
        raise PackageError(f"{PICKLE}: name and pat_str must be strings")
    if (
        not isinstance(ranks, dict)
        or not ranks
        or not all(type(k) is bytes and type(v) is int and v >= 0 for k, v in ranks.items())
    ):
        raise PackageError(f"{PICKLE}: mergeable_ranks must map token bytes to ranks 0 and up")
    if not isinstance(specials, dict) or not all(
        type(k) is str and type(v) is int and v >= 0 for k, v in specials.items()
    ):
        raise PackageError(f"{PICKLE}: special_tokens must map token text to ids 0 and up")
    for token in (BOS_TOKEN, PAD_TOKEN):
        if token not in specials:
            raise PackageError(f"{PICKLE}: the special token {token} is missing")
    return EncodingState(name, pattern, ranks, specials)


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """vllm-srun's cache folder (:func:`vllm_srun.plugins.runtime_cache_dir`)."""
    return runtime_cache_dir(environ)


def ranks_text(ranks: Mapping[bytes, int]) -> bytes:
    """``ranks`` in tiktoken's ``.tiktoken`` format: ``base64(token) rank`` lines, by rank."""
    ordered = sorted(ranks.items(), key=lambda item: item[1])
    return b"".join(base64.b64encode(token) + b" %d\n" % rank for token, rank in ordered)


def parse_ranks(data: bytes) -> dict[bytes, int]:
    """The inverse of :func:`ranks_text` (what ``tiktoken.load.load_tiktoken_bpe`` reads,
    here without its copy into a temporary cache).

    Raises:
        ValueError: a line that is not ``base64 rank``.
    """
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(data.splitlines(), start=1):
        if line:
            token, _, rank = line.partition(b" ")
            try:
                ranks[base64.b64decode(token, validate=True)] = int(rank)
            except ValueError as err:
                raise ValueError(f"{RANKS} line {number} is not 'base64 rank'") from err
    return ranks


def converted(package: Path, environ: Mapping[str, str] | None = None) -> Path:
    """The folder holding the package tokenizer's plain files, converting it on first use.

    The folder is ``<cache>/nanoguard/tokenizers/<SHA-256 of tokenizer.pkl>/``
    (:func:`cache_root`); it is written to a temporary sibling and renamed, so a
    reader never sees half a conversion and two processes may race harmlessly.

    Raises:
        PackageError: the pickle cannot be read (:func:`read_pickled_encoding`).
        OSError: the cache cannot be written.
    """
    data = (package / PICKLE).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    target = cache_root(environ) / "nanoguard" / "tokenizers" / digest
    if (target / SETTINGS).is_file():
        return target
    state = read_pickled_encoding(data)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=target.parent))
    ranks = ranks_text(state.ranks)
    (scratch / RANKS).write_bytes(ranks)
    settings = {
        "name": state.name,
        "pat_str": state.pattern,
        "special_tokens": dict(state.special_tokens),
        "ranks_sha256": hashlib.sha256(ranks).hexdigest(),
        "source_sha256": digest,
    }
    (scratch / SETTINGS).write_text(json.dumps(settings, indent=1, sort_keys=True) + "\n")
    try:
        scratch.rename(target)
    except OSError:  # another process converted it first
        for child in scratch.iterdir():
            child.unlink()
        scratch.rmdir()
    return target


class Tokenizer:
    """Text to NanoGuard token ids: the BOS token, then tiktoken's ordinary encoding.

    Special-token text inside a request (``<|reserved_0|>``) is encoded as plain text,
    as the scanner does (``encode_ordinary``).

    Args:
        folder: a folder :func:`converted` wrote.

    Raises:
        ValueError: the ranks file does not match its recorded SHA-256.
    """

    def __init__(self, folder: Path) -> None:
        import tiktoken  # a dependency of this distribution only; imported on load

        settings = json.loads((folder / SETTINGS).read_text())
        data = (folder / RANKS).read_bytes()
        if hashlib.sha256(data).hexdigest() != settings["ranks_sha256"]:
            raise ValueError(f"{folder / RANKS} does not match its SHA-256; delete {folder}")
        self.encoding = tiktoken.Encoding(
            settings["name"],
            pat_str=settings["pat_str"],
            mergeable_ranks=parse_ranks(data),
            special_tokens=settings["special_tokens"],
        )
        self.bos_id: int = settings["special_tokens"][BOS_TOKEN]
        self.pad_id: int = settings["special_tokens"][PAD_TOKEN]
        self.vocabulary: int = self.encoding.n_vocab

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids, the BOS id first (no limit applied)."""
        return [[self.bos_id, *self.encoding.encode_ordinary(text)] for text in texts]
