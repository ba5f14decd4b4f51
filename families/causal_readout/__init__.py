"""The ``causal_readout`` family: decoder models answering System One decisions.

Recognises decoder packages (``config.json`` names a ``*ForCausalLM`` or
``*LMHeadModel`` architecture: Qwen3, Llama, Mistral, Gemma, Phi, GPT-2, ...)
and answers Choice, Noul and Score questions from the next-token logits of
one label token per option (see :mod:`.prompts` for the templates and labels,
:mod:`vllm_srun.plugins.decisions` for the schema and the readout maths).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vllm_srun.plugins import Family, hookimpl
from vllm_srun.plugins.hookspecs import RegisterFamily
from vllm_srun.plugins.package import PackageError
from vllm_srun.plugins.spec import ModelSpec

from . import package as packages
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

    def detect(self, package: Path) -> bool:
        """A ``config.json`` naming a causal LM architecture (reads configs only)."""
        return packages.detect(package)

    def verify(self, package: Path) -> None:
        """The files this family loads are present.

        Raises:
            PackageError: no weights, no tokenizer or one that cannot be read, a chat
                template that does not place the question exactly once, a bad
                ``calibration.json``.
        """
        packages.verify(package)
        try:
            Renderer(package)  # reads the tokenizer files and checks the chat template
        except (ValueError, OSError) as err:
            raise PackageError(str(err)) from err

    def describe(self, package: Path) -> ModelSpec:
        """The engine-facing spec: task ``causal_lm``, ``token_limit`` the model's limit."""
        return packages.describe(package).spec

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
        description = packages.describe(package)
        return ReadoutModel(
            description,
            Renderer(package),
            engine_model,
            max_model_len=getattr(spec, "max_model_len", None),
            shared_context=getattr(spec, "shared_context", None),
        )


@hookimpl
def register_families(register: RegisterFamily) -> None:
    """Register the ``causal_readout`` family."""
    register(CausalReadoutFamily())
