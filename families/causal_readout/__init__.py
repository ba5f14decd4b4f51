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

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vllm_srun.plugins import Family, hookimpl
from vllm_srun.plugins.hookspecs import RegisterFamily
from vllm_srun.plugins.package import PackageError
from vllm_srun.plugins.spec import ModelSpec

from . import gguf
from . import package as packages
from .builtin import register_models
from .fixture import FIXTURE_REQUEST, write_fixture
from .model import ReadoutModel
from .prompts import Renderer

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

    def readable(self, package: Path) -> Path:
        """The folder the other steps read: the converted package of a GGUF package,
        else ``package`` itself."""
        converted = self.conversion(package)
        return package if converted is None else converted.package

    def verify(self, package: Path) -> None:
        """The files this family loads are present.

        Raises:
            PackageError: no weights, no tokenizer or one that cannot be read, a chat
                template that does not place the question exactly once, a bad
                ``calibration.json``, a GGUF file that cannot be converted.
        """
        package = self.readable(package)
        packages.verify(package)
        try:
            Renderer(package)  # reads the tokenizer files and checks the chat template
        except (ValueError, OSError) as err:
            raise PackageError(str(err)) from err

    def describe(self, package: Path) -> ModelSpec:
        """The engine-facing spec: task ``causal_lm``, ``token_limit`` the model's limit
        (``spec.package`` is the converted folder for a GGUF package)."""
        return packages.describe(self.readable(package)).spec

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
        converted = self.conversion(package)
        package = package if converted is None else converted.package
        description = packages.describe(package)
        return ReadoutModel(
            description,
            Renderer(package),
            engine_model,
            max_model_len=getattr(spec, "max_model_len", None),
            shared_context=getattr(spec, "shared_context", None),
            weights=converted.card() if converted is not None else None,
        )


__all__ = ["CausalReadoutFamily", "register_families", "register_models"]


@hookimpl
def register_families(register: RegisterFamily) -> None:
    """Register the ``causal_readout`` family."""
    register(CausalReadoutFamily())
