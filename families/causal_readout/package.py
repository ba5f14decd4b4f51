"""Reading a decoder package: whether it is one, its limit, its calibration.

Only configuration files are read here (``config.json``, ``calibration.json``,
``tokenizer_config.json``); no weights and no tokenizer load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_srun.plugins.decisions import QUESTION_TYPES
from vllm_srun.plugins.package import PackageError, read_config, read_json
from vllm_srun.plugins.spec import ModelSpec, weight_files

CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
"""Architecture name endings of decoders (``Qwen3ForCausalLM``, ``GPT2LMHeadModel``)."""

ENCODER_MODEL_TYPES = frozenset(
    {
        "bert",
        "bert-generation",
        "camembert",
        "electra",
        "ernie",
        "modernbert",
        "roberta",
        "roberta-prelayernorm",
        "roformer",
        "xlm-roberta",
        "xlm-roberta-xl",
    }
)
"""Encoders transformers also offers a causal LM head for; they are not decision models."""

POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""``config.json`` keys that state how many positions a decoder has, most common first."""

LARGE_MODEL_MAX_LENGTH = 1_000_000
"""transformers writes ``model_max_length`` of about 1e30 when a tokenizer has no limit."""

CALIBRATION_FILE = "calibration.json"
"""Optional per-type softmax temperatures and the readout:
``{"temperature": {"choice": t, "noul": t, "score": t}, "readout": "letters"}``."""

READOUT_NAMES = ("letters", "letters_cf", "option_sum", "option_mean")
"""The readouts ``calibration.json`` may name (:data:`.model.READOUTS` explains them)."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
"""Files any of which makes a tokenizer transformers can load without remote code."""


@dataclass(frozen=True)
class Description:
    """Everything the family knows about a decoder package before loading it.

    Attributes:
        spec: the engine-facing spec (task ``causal_lm``, ``token_limit`` set).
        token_limit: the model's own limit in tokens (positions, and the
            tokenizer's ``model_max_length`` when it states a smaller one).
        temperatures: per question type, the softmax temperature (1.0 when
            ``calibration.json`` says nothing for it).
        calibrated: whether the package has ``calibration.json``.
        config: ``config.json``.
        readout: how option scores are read (``letters`` unless ``calibration.json``
            names another of :data:`READOUT_NAMES`).
    """

    spec: ModelSpec
    token_limit: int
    temperatures: dict[str, float] = field(default_factory=dict)
    calibrated: bool = False
    config: dict[str, Any] = field(default_factory=dict)
    readout: str = "letters"


def _architecture(config: Any) -> str | None:
    if not isinstance(config, dict):
        return None
    architectures = config.get("architectures")
    if not isinstance(architectures, list):
        return None
    return next(
        (a for a in architectures if isinstance(a, str) and a.endswith(CAUSAL_SUFFIXES)), None
    )


def detect(package: Path) -> bool:
    """Whether ``package`` is a decoder: ``config.json`` names a ``*ForCausalLM`` or
    ``*LMHeadModel`` architecture of a model type that is not an encoder."""
    config = read_config(package)
    return (
        config is not None
        and _architecture(config) is not None
        and config.get("model_type") not in ENCODER_MODEL_TYPES
    )


def _token_limit(package: Path, config: dict[str, Any]) -> int:
    """The smallest of the model's positions and the tokenizer's ``model_max_length``."""
    sources = [config, config.get("text_config") or {}]
    positions = next(
        (
            source[key]
            for source in sources
            if isinstance(source, dict)
            for key in POSITION_KEYS
            if isinstance(source.get(key), int) and source[key] > 0
        ),
        None,
    )
    if positions is None:
        raise PackageError(
            "config.json states no position limit (max_position_embeddings or n_positions)"
        )
    limits: list[int] = [positions]
    tok = package / "tokenizer_config.json"
    if tok.is_file():
        value = read_json(tok).get("model_max_length")
        if isinstance(value, int | float) and 0 < value < LARGE_MODEL_MAX_LENGTH:
            limits.append(int(value))
    return min(limits)


def read_temperatures(
    package: Path, calibration: Path | None = None
) -> tuple[dict[str, float], bool, str]:
    """Per-type temperatures (1.0 where it says nothing) and the readout (``letters``
    unless it names another) from ``calibration.json``.

    Args:
        package: the package directory.
        calibration: a calibration file to read instead of the package's own (the
            family's shipped calibration of a built-in model).

    Raises:
        PackageError: the file is not ``{"temperature": {type: number > 0}}`` with an
            optional ``"readout"`` of :data:`READOUT_NAMES`.
    """
    temperatures = dict.fromkeys(QUESTION_TYPES, 1.0)
    path = calibration or package / CALIBRATION_FILE
    if not path.is_file():
        return temperatures, False, "letters"
    table = read_json(path)
    readout = table.get("readout", "letters") if isinstance(table, dict) else "letters"
    if readout not in READOUT_NAMES:
        raise PackageError(
            f"{CALIBRATION_FILE}: readout {readout!r} is not one of {', '.join(READOUT_NAMES)}"
        )
    values = table.get("temperature") if isinstance(table, dict) else None
    if not isinstance(values, dict):
        raise PackageError(
            f'{CALIBRATION_FILE} must be {{"temperature": {{"choice": t, "noul": t, "score": t}}}}'
        )
    for kind, value in values.items():
        if kind not in QUESTION_TYPES:
            raise PackageError(
                f"{CALIBRATION_FILE}: {kind!r} is not a question type ({', '.join(QUESTION_TYPES)})"
            )
        if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
            raise PackageError(
                f"{CALIBRATION_FILE}: the {kind} temperature must be a number above 0, "
                f"not {value!r}"
            )
        temperatures[kind] = float(value)
    return temperatures, True, str(readout)


def describe(package: Path, calibration: Path | None = None) -> Description:
    """Describe a decoder package (``calibration``: see :func:`read_temperatures`).

    Raises:
        PackageError: not a decoder, no position limit, or a malformed
            ``calibration.json`` (the message says which).
    """
    config = read_json(package / "config.json")
    architecture = _architecture(config)
    if architecture is None or config.get("model_type") in ENCODER_MODEL_TYPES:
        raise PackageError("config.json names no causal LM architecture (*ForCausalLM)")
    limit = _token_limit(package, config)
    temperatures, calibrated, readout = read_temperatures(package, calibration)
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    spec = ModelSpec(
        package=package,
        architecture=architecture,
        model_type=str(config.get("model_type", "")),
        task="causal_lm",
        weights=weight_files(package),
        released_dtype=dtype if dtype in ("float32", "bfloat16", "float16") else "float32",
        token_limit=limit,
    )
    return Description(spec, limit, temperatures, calibrated, config, readout)


def verify(package: Path, calibration: Path | None = None) -> None:
    """The files this family loads are present and readable (``calibration``: see
    :func:`read_temperatures`).

    Raises:
        PackageError: no weights (safetensors, or pickled ``pytorch_model*.bin``), no
            tokenizer, or a bad ``calibration.json``.
    """
    description = describe(package, calibration)
    if not description.spec.weights:
        raise PackageError(
            "the package has no weights (*.safetensors, or pickled pytorch_model*.bin)"
        )
    if not any((package / name).is_file() for name in TOKENIZER_FILES):
        raise PackageError(
            "the package has no tokenizer (tokenizer.json, tokenizer.model or vocab.json)"
        )
