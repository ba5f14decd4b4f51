"""The ``laya`` family: Laya-format System One decision models.

A Laya checkpoint (``laya`` on PyPI, Apache-2.0; the ``convaiinnovations/laya*``
repositories) is an encoder (ModernBERT or mmBERT) with a small decision head: each
question is one sequence holding the question, a ``[MASK]`` marker per option, and the
state (:mod:`.sequences`); the head scores each marker (:mod:`.head`); temperatures per
question type and option count turn the scores into probabilities
(:mod:`.checkpoint`). It answers Choice, Noul and Score (the types the format carries).

The encoder runs on an engine like any transformers encoder: the first load writes it
once as an ordinary package into the runtime's cache (:mod:`.conversion`). The head runs
here, in numpy, from ``model.safetensors``. Safetensors and JSON only: nothing pickled,
no code from the checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_srun.plugins import Family, hookimpl
from vllm_srun.plugins.hookspecs import RegisterFamily
from vllm_srun.plugins.package import PackageError, read_json
from vllm_srun.plugins.spec import ModelSpec

from . import checkpoint
from .builtin import register_models
from .conversion import Conversion, convert
from .fixture import FIXTURE_REQUEST, write_fixture

if TYPE_CHECKING:
    from .model import LayaModel
    from .sequences import Tokens

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
"""Requests a Laya model answers during warming: every question type, a text and an
object state."""

SPECIAL_ROLES = ("cls_token", "sep_token", "mask_token", "pad_token")
"""The tokenizer's special tokens a sequence needs (:mod:`.sequences`)."""


class LayaFamily(Family):
    """Laya checkpoints: an encoder and a marker-scoring decision head."""

    name = "laya"
    surfaces = ("decisions",)

    def __init__(self) -> None:
        self._conversions: dict[Path, Conversion] = {}

    def detect(self, package: Path) -> bool:
        """An ``rl_agent_config.json`` naming ``encoder`` and ``head_layers`` beside
        ``model.safetensors`` (reads the configuration only)."""
        return checkpoint.looks_like_checkpoint(package)

    def verify(self, package: Path) -> None:
        """The checkpoint's files are there and agree with each other.

        Raises:
            PackageError: a missing file, a malformed ``rl_agent_config.json`` or
                encoder configuration, a missing or misshapen head tensor, or a tokenizer
                without the special tokens a sequence needs.
        """
        for name in checkpoint.CHECKPOINT_FILES:
            if not (package / name).is_file():
                raise PackageError(f"the checkpoint has no {name}")
        config = checkpoint.read_config(package)
        encoder = read_json(package / checkpoint.ENCODER_CONFIG)
        width = encoder.get("hidden_size") if isinstance(encoder, dict) else None
        if type(width) is not int or width < 1:
            raise PackageError(f"{checkpoint.ENCODER_CONFIG} has no hidden_size")
        if config.parallel and encoder.get("model_type") != "modernbert":
            raise PackageError(
                "option_layout parallel needs a ModernBERT encoder (its per-layer attention "
                f"masks), not {encoder.get('model_type')!r}"
            )
        checkpoint.check_tensors(package, config, width)
        self.tokens(self.conversion(package).package)

    def conversion(self, package: Path) -> Conversion:
        """The checkpoint's encoder package in the cache (written on the first call, then
        remembered for this process).

        Raises:
            PackageError: it cannot be written.
        """
        key = package.resolve()
        known = self._conversions.get(key)
        if known is None or not known.package.is_dir():
            known = convert(key)
            self._conversions[key] = known
        return known

    def describe(self, package: Path) -> ModelSpec:
        """The engine-facing spec: the converted encoder (task ``encoder``, float32 as the
        package computes it; its weights are stored in float16), ``token_limit`` the
        checkpoint's ``max_len``; a parallel layout's batches carry attention groups."""
        config = checkpoint.read_config(package)
        converted = self.conversion(package).package
        encoder = read_json(converted / "config.json")
        return ModelSpec(
            package=converted,
            architecture=(encoder.get("architectures") or ["ModernBertModel"])[0],
            model_type=str(encoder.get("model_type")),
            task="encoder",
            weights=(checkpoint.WEIGHTS_FILE,),
            released_dtype="float32",
            token_limit=config.max_len,
            attention_groups=config.parallel,
        )

    def tokens(self, converted: Path) -> Tokens:
        """The sequence tokenizer of a converted package.

        Raises:
            PackageError: it cannot be read, or lacks a special token of :data:`SPECIAL_ROLES`.
        """
        from vllm_srun.plugins.tokenizing import load_encoder_tokenizer

        from .sequences import Tokens

        try:
            loaded = load_encoder_tokenizer(converted)
        except ValueError as err:
            raise PackageError(f"tokenizer/: {err}") from err
        ids: dict[str, int] = {}
        for role in SPECIAL_ROLES:
            text = loaded.special_tokens.get(role)
            found = None if text is None else loaded.backend.token_to_id(text)
            if found is None:
                raise PackageError(f"tokenizer/ has no {role}, which a Laya sequence needs")
            ids[role] = int(found)
        settings = read_json(converted / "tokenizer_config.json")
        backend = loaded.backend
        backend.encode_special_tokens = True  # request text is text
        return Tokens(
            backend=backend,
            cls_id=ids["cls_token"],
            sep_id=ids["sep_token"],
            mask_id=ids["mask_token"],
            pad_id=ids["pad_token"],
            mask_text=loaded.special_tokens["mask_token"],
            cut_left=isinstance(settings, dict) and settings.get("truncation_side") == "left",
        )

    def load(self, package: Path, spec: Any, engine_model: Any) -> LayaModel:
        """Wrap the engine's encoder with the checkpoint's tokenizer, head and temperatures.

        ``spec.max_model_len`` carries ``--max-model-len`` (the sequence budget).

        Raises:
            ValueError: ``max_model_len`` above the checkpoint's ``max_len``.
        """
        from .head import load_head
        from .model import LayaModel

        config = checkpoint.read_config(package)
        conversion = self.conversion(package)
        encoder = read_json(conversion.package / "config.json")
        weights = package / checkpoint.WEIGHTS_FILE
        head = load_head(weights, encoder["hidden_size"], config.head_layers)
        return LayaModel(
            config,
            self.tokens(conversion.package),
            head,
            engine_model,
            max_model_len=getattr(spec, "max_model_len", None),
            weights=conversion.card(),
        )

    def fixture(self, root: Path) -> tuple[Path, str, dict[str, Any]]:
        """A tiny random-weight checkpoint written under ``root``, and a decisions request."""
        return write_fixture(root), "decisions", dict(FIXTURE_REQUEST)

    def golden(self, package: Path) -> Sequence[Any]:
        """Golden requests: every question type, a text and an object state."""
        return GOLDEN_REQUESTS


def __getattr__(name: str) -> Any:
    """``LayaModel``, imported on first use: not paid to list the plugin (PEP 562)."""
    if name == "LayaModel":
        from .model import LayaModel

        return LayaModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@hookimpl
def register_families(register: RegisterFamily) -> None:
    """Register the ``laya`` family."""
    register(LayaFamily())


__all__ = ["LayaFamily", "register_families", "register_models"]
