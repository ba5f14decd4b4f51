"""The ``task_heads`` family: encoder task models from Hugging Face packages.

Recognises encoder packages by ``config.json`` (and sentence-transformers
files) and serves their heads: ``sequence`` label distributions, ``scores``
per label, ``token`` spans, ``pooled`` embeddings and ``relevance``
(cross-encoders, or the cosine of a bi-encoder's embeddings).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from vllm_srun.plugins import Family, hookimpl
from vllm_srun.plugins.hookspecs import RegisterFamily
from vllm_srun.plugins.package import PackageError
from vllm_srun.plugins.requests import AGGREGATIONS
from vllm_srun.plugins.spec import ModelSpec

from . import package as packages
from .builtin import register_models
from .fixture import FIXTURE_REQUEST, write_fixture
from .inputs import TextEncoder
from .references import generic_requests, register_golden_references

if TYPE_CHECKING:
    from .model import TaskModel

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "sentencepiece.bpe.model", "spm.model")


class TaskHeadsFamily(Family):
    """Encoders with task heads: classify, embeddings and rerank."""

    name = "task_heads"
    surfaces = ("classify", "embeddings", "rerank")
    options: ClassVar[Mapping[str, str]] = {
        "threshold": "the default options.threshold of classify requests (0 to 1): the "
        "lowest probability a token span or a selected label keeps",
        "aggregation": "the default options.aggregation of token heads (max, first, average, none)",
    }

    def check_options(self, options: Mapping[str, Any]) -> None:
        """Known keys only; ``threshold`` a number from 0 to 1, ``aggregation`` one of
        :data:`~vllm_srun.plugins.requests.AGGREGATIONS`.

        Raises:
            ValueError: naming the option and what it takes.
        """
        super().check_options(options)
        threshold = options.get("threshold")
        if threshold is not None and (
            type(threshold) not in (int, float) or not 0 <= threshold <= 1
        ):
            raise ValueError(f"option threshold must be a number from 0 to 1, not {threshold!r}")
        aggregation = options.get("aggregation")
        if aggregation is not None and aggregation not in AGGREGATIONS:
            raise ValueError(
                f"option aggregation must be one of {', '.join(AGGREGATIONS)}, not {aggregation!r}"
            )

    def detect(self, package: Path) -> bool:
        """An encoder ``config.json`` (BERT, RoBERTa, XLM-R, DistilBERT, ModernBERT, ...)."""
        return packages.detect(package)

    def verify(self, package: Path) -> None:
        """The files this family loads are present.

        Raises:
            PackageError: no weights (safetensors, pickled ``pytorch_model*.bin`` or an
                ONNX graph) or no tokenizer.
        """
        spec = packages.describe(package).spec
        if not spec.weights and spec.onnx is None:
            raise PackageError(
                "the package has no weights: neither safetensors (or pickled "
                "pytorch_model*.bin) nor an ONNX graph"
            )
        if not any((package / name).is_file() for name in TOKENIZER_FILES):
            raise PackageError("the package has no tokenizer (tokenizer.json or vocab)")

    def describe(self, package: Path) -> ModelSpec:
        """The engine-facing spec of the package (see :mod:`.package`).

        ``int8_tolerant`` stays false for every head: measured on MiniLM's pooled head
        (``tests/families/test_profiles_quality.py``), int8 dynamic quantisation of the
        fused graph gives a least cosine to ``exact`` of 0.980 and a top-10 neighbour
        overlap of 0.86, below the 0.999 and 0.95 ``max_speed`` asks; the fused float32
        graph meets both, so ``max_speed`` runs it without quantisation. ``bf16_tolerant``
        is true for the pooled head only (:data:`.package.BF16_TOLERANT_TASKS`): in
        bfloat16 MiniLM keeps a least cosine of 0.9999 and an overlap of 0.98.
        """
        return packages.describe(package).spec

    def golden(self, package: Path) -> tuple[dict[str, Any], ...]:
        """Generic golden requests, one per head (see :mod:`.references`), which a
        package that is not built in answers twice during warming: well formed and equal."""
        return generic_requests(package)

    def fixture(self, root: Path) -> tuple[Path, str, dict[str, Any]]:
        """A tiny BERT token classifier written under ``root``, and a classify request."""
        return write_fixture(root), "classify", dict(FIXTURE_REQUEST)

    def load(
        self,
        package: Path,
        spec: Any,
        engine_model: Any,
        options: Mapping[str, Any] | None = None,
    ) -> TaskModel:
        """Wrap the engine's model with the package's tokenizer and heads; ``options``
        (checked by :meth:`check_options`) set the classify defaults."""
        from .model import TaskModel  # imports torch: not paid to list the plugin

        description = packages.describe(package)
        encoder = TextEncoder(package, description.max_tokens)
        return TaskModel(description, encoder, engine_model, defaults=dict(options or {}))


def __getattr__(name: str) -> Any:
    """``TaskModel``, imported on first use: its module imports torch (PEP 562)."""
    if name == "TaskModel":
        from .model import TaskModel

        return TaskModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@hookimpl
def register_families(register: RegisterFamily) -> None:
    """Register the ``task_heads`` family."""
    register(TaskHeadsFamily())


__all__ = [
    "TaskHeadsFamily",
    "register_families",
    "register_golden_references",
    "register_models",
]
