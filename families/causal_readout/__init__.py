"""The ``causal_readout`` family: decoder models answering System One decisions.

Recognises decoder packages (``config.json`` names a ``*ForCausalLM`` or
``*LMHeadModel`` architecture: Qwen3, Llama, Mistral, Gemma, Phi, GPT-2, ...)
and answers Choice, Noul and Score questions from the next-token logits of
one label token per option (see :mod:`.prompts` for the templates and labels,
:mod:`vllm_srun.plugins.decisions` for the schema and the readout maths).

A GGUF package (one ``*.gguf`` file, no ``config.json``) is a decoder too: it
is converted once into an ordinary package in the cache (:mod:`.gguf`) and
every step below reads that package; the card's ``weights`` says so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_srun.plugins import Family, GoldenReference, hookimpl, read_reference_file
from vllm_srun.plugins.hookspecs import RegisterFamily, RegisterGoldenReference
from vllm_srun.plugins.package import PackageError
from vllm_srun.plugins.spec import ModelSpec

from . import gguf
from . import package as packages
from .builtin import register_models
from .fixture import FIXTURE_REQUEST, write_fixture
from .prompts import Renderer

if TYPE_CHECKING:
    from .model import ReadoutModel

GOLDEN_REQUESTS: tuple[dict[str, Any], ...] = (
    {"surface": "decisions", "body": FIXTURE_REQUEST},
    {
        "surface": "decisions",
        "body": {
            "state": {"order": 42, "status": "late", "items": ["book", "lamp"]},
            "questions": {
                "late": {
                    "type": "noul",
                    "instructions": "Is the order late?",
                    "criteria": {"false": "on time", "true": "late"},
                },
                "priority": {
                    "type": "choice",
                    "instructions": "How should this order be handled?",
                    "choices": [
                        {"key": "wait", "description": "Wait for the carrier"},
                        {"key": "resend", "description": "Send the items again"},
                        {"key": "refund", "description": None},
                    ],
                },
            },
        },
    },
)
"""Requests a decision model answers during warming (every question type, text and object
states); their answers are deterministic for a given model, device and dtype."""


CALIBRATION_DIR = Path(__file__).with_name("calibration")
"""The family's measured calibrations of built-in GGUF models (package data): one JSON file
each, ``calibration.json``'s shape plus ``gguf_sha256``, the file it was measured on."""


def shipped_calibration(digest: str, directory: Path = CALIBRATION_DIR) -> Path | None:
    """The shipped calibration file measured on the GGUF file with SHA-256 ``digest``."""
    for path in sorted(directory.glob("*.json")):
        try:
            table = json.loads(path.read_bytes())
        except (ValueError, OSError):
            continue
        if isinstance(table, dict) and table.get("gguf_sha256") == digest:
            return path
    return None


class CausalReadoutFamily(Family):
    """Decoders answering decisions from label-token logits."""

    name = "causal_readout"
    surfaces = ("decisions",)

    def __init__(self) -> None:
        self._conversions: dict[Path, gguf.Conversion] = {}

    def detect(self, package: Path) -> bool:
        """A ``config.json`` naming a causal LM architecture, or a GGUF package (reads
        configs and a GGUF file's first bytes only)."""
        return packages.detect(package) or gguf.gguf_file(package) is not None

    def conversion(self, package: Path) -> gguf.Conversion | None:
        """The converted package of a GGUF package (converted on the first call, then
        remembered for this process), or ``None`` for any other package.

        Raises:
            PackageError: the GGUF file cannot be converted (the message says why).
        """
        key = package.resolve()
        if gguf.gguf_file(key) is None:
            return None
        known = self._conversions.get(key)
        if known is None or not (known.package / gguf.CONVERSION_RECORD).is_file():
            try:
                known = gguf.convert(key)
            except (ValueError, OSError) as err:
                raise PackageError(str(err)) from err
            self._conversions[key] = known
        return known

    def readable(self, package: Path) -> tuple[Path, Path | None]:
        """The folder the other steps read (the converted package of a GGUF package, else
        ``package`` itself) and the shipped calibration that applies to it, if any."""
        converted = self.conversion(package)
        if converted is None:
            return package, None
        return converted.package, shipped_calibration(str(converted.record["gguf"]["sha256"]))

    def verify(self, package: Path) -> None:
        """The files this family loads are present.

        Raises:
            PackageError: no weights, no tokenizer or one that cannot be read, a chat
                template that does not place the question exactly once, a bad
                ``calibration.json``, a GGUF file that cannot be converted.
        """
        package, calibration = self.readable(package)
        packages.verify(package, calibration)
        try:
            Renderer(package)  # reads the tokenizer files and checks the chat template
        except (ValueError, OSError) as err:
            raise PackageError(str(err)) from err

    def describe(self, package: Path) -> ModelSpec:
        """The engine-facing spec: task ``causal_lm``, ``token_limit`` the model's limit
        (``spec.package`` is the converted folder for a GGUF package)."""
        return packages.describe(*self.readable(package)).spec

    def fixture(self, root: Path) -> tuple[Path, str, dict[str, Any]]:
        """A tiny Qwen3 with a chat template written under ``root``, and a decisions request."""
        return write_fixture(root), "decisions", dict(FIXTURE_REQUEST)

    def golden(self, package: Path) -> Sequence[Any]:
        """Golden requests: one per question type, a text and an object state."""
        return GOLDEN_REQUESTS

    def load(self, package: Path, spec: Any, engine_model: Any) -> ReadoutModel:
        """Wrap the engine's decoder with the package's tokenizer and calibration.

        ``spec.max_model_len`` and ``spec.shared_context`` carry the load options.

        Raises:
            ValueError: ``max_model_len N is above the model's limit``.
        """
        from .model import ReadoutModel  # imported on first use: not paid to list the plugin

        converted = self.conversion(package)
        package, calibration = self.readable(package)
        description = packages.describe(package, calibration)
        return ReadoutModel(
            description,
            Renderer(package),
            engine_model,
            max_model_len=getattr(spec, "max_model_len", None),
            shared_context=getattr(spec, "shared_context", None),
            weights=converted.card() if converted is not None else None,
        )


GOLDEN_DIR = Path(__file__).with_name("golden")
"""The built-in decoders' golden references (package data; ``vllm-srun golden record``)."""


def golden_references(directory: Path = GOLDEN_DIR) -> list[GoldenReference]:
    """Every reference file in ``directory``, sorted by file name.

    Raises:
        ReferenceFileError: a file cannot be read.
    """
    return [read_reference_file(path) for path in sorted(directory.glob("*.json"))]


@hookimpl
def register_golden_references(register: RegisterGoldenReference) -> None:
    """Register the built-in decoders' golden references (``golden/*.json``)."""
    for reference in golden_references():
        register(reference)


def __getattr__(name: str) -> Any:
    """``ReadoutModel``, imported on first use: not paid to list the plugin (PEP 562)."""
    if name == "ReadoutModel":
        from .model import ReadoutModel

        return ReadoutModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CausalReadoutFamily",
    "register_families",
    "register_golden_references",
    "register_models",
]


@hookimpl
def register_families(register: RegisterFamily) -> None:
    """Register the ``causal_readout`` family."""
    register(CausalReadoutFamily())
