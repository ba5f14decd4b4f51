"""The Laya checkpoint format: what the files are, and what ``rl_agent_config.json`` says.

A Laya checkpoint (as the ``laya`` package's ``save_checkpoint`` writes it, and as the
Hub repositories ``convaiinnovations/laya*`` hold it) is a folder of:

- ``rl_agent_config.json``: the settings (:class:`AgentConfig`);
- ``model.safetensors``: every tensor of the decision model, stored in float16: the
  encoder's under ``encoder.`` (a transformers model, ModernBERT for the published
  checkpoints) and the decision head's (:data:`HEAD_PREFIXES`, read by :mod:`.head`);
- ``encoder/config.json``: the encoder's transformers configuration;
- ``tokenizer/``: the encoder's tokenizer (``tokenizer.json`` and its configuration).

Nothing in it is code and nothing is pickled. This module reads the configuration and the
safetensors header only; :mod:`.conversion` and :mod:`.head` read the tensors.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_srun.plugins.package import PackageError, read_json

CONFIG_FILE = "rl_agent_config.json"
WEIGHTS_FILE = "model.safetensors"
ENCODER_CONFIG = "encoder/config.json"
TOKENIZER_DIR = "tokenizer"
CHECKPOINT_FILES = (CONFIG_FILE, WEIGHTS_FILE, ENCODER_CONFIG, f"{TOKENIZER_DIR}/tokenizer.json")
"""The files every checkpoint must hold."""

ENCODER_PREFIX = "encoder."
"""The prefix of the encoder's tensors in ``model.safetensors``."""

HEAD_PREFIXES = ("head.", "type_emb.", "scorer.", "act_head.", "temperature")
"""Names of the decision head's tensors in ``model.safetensors`` (``act_head`` and the
``temperature`` buffer are stored but not read: the act head's answer is no part of a
System One answer, and the temperatures come from the configuration)."""

QUESTION_TYPES = ("choice", "score", "noul")
"""The question types in the order of the head's type embedding rows and of
``rl_agent_config.json``'s ``temperature`` list (the ``laya`` package's ``QTYPES``)."""

LAYOUTS = ("sequential", "parallel")
"""``rl_agent_config.json``'s ``option_layout`` values; absent means ``sequential``, the
layout every published checkpoint was trained on."""

TEMPERATURE_RANGE = (0.5, 5.0)
"""The temperatures the ``laya`` package applies (``TEMP_MIN``, ``TEMP_MAX``): a shipped
value outside is clamped to the nearer bound, one that is not a number (or a boolean)
becomes 1.0. Answers apply the same, so they equal the package's."""

DEFAULT_MAX_LEN = 512
DEFAULT_HEAD_MAX_LEN = 192
"""The package's defaults for ``max_len`` (tokens in one question's sequence) and
``head_max_len`` (the share of it the question and its options are given)."""


def option_bucket(count: int) -> str:
    """The option-count bucket a temperature is fitted for: ``2``, ``3-5``, ``6-10`` or
    ``11+`` (``temperature_by_options`` keys are ``<type>:<bucket>``)."""
    if count <= 2:
        return "2"
    if count <= 5:
        return "3-5"
    return "6-10" if count <= 10 else "11+"


def applied_temperature(value: Any) -> float:
    """The temperature the package applies for a shipped ``value``
    (:data:`TEMPERATURE_RANGE`; a number in a string counts, as ``float()`` reads it)."""
    if isinstance(value, bool):
        return 1.0
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 1.0
    if not math.isfinite(number):
        return 1.0
    low, high = TEMPERATURE_RANGE
    return min(high, max(low, number))


@dataclass(frozen=True)
class AgentConfig:
    """``rl_agent_config.json``, checked.

    Attributes:
        encoder: the Hub repository the encoder was trained from (informational).
        head_layers: transformer layers in the decision head (0 or more).
        max_len: the most tokens one question's sequence holds (question, options, state).
        head_max_len: the tokens the question and its options may take before they are cut.
        layout: :data:`LAYOUTS`.
        temperature: the applied temperature per question type (:data:`QUESTION_TYPES`).
        by_options: the applied temperature per ``<type>:<bucket>`` (:func:`option_bucket`).
        shipped: the ``temperature`` and ``temperature_by_options`` values as shipped.
    """

    encoder: str
    head_layers: int
    max_len: int
    head_max_len: int
    layout: str
    temperature: dict[str, float]
    by_options: dict[str, float]
    shipped: dict[str, Any] = field(default_factory=dict, compare=False)

    def temperature_for(self, kind: str, options: int) -> float:
        """The temperature of a ``kind`` question with ``options`` options: the bucket's
        when the checkpoint fitted one, else the type's."""
        return self.by_options.get(f"{kind}:{option_bucket(options)}", self.temperature[kind])

    @property
    def parallel(self) -> bool:
        """Whether options are laid out in parallel (each blind to the others)."""
        return self.layout == "parallel"


def _count(settings: dict[str, Any], key: str, default: int, least: int) -> int:
    value = settings.get(key, default)
    if type(value) is not int or value < least:
        raise PackageError(f"{CONFIG_FILE}: {key} must be an integer of at least {least}")
    return value


def read_config(package: Path) -> AgentConfig:
    """Read and check ``rl_agent_config.json`` of ``package``.

    Raises:
        PackageError: the file is missing or malformed, or a value is out of range
            (the message names the key).
    """
    settings = read_json(package / CONFIG_FILE)
    if not isinstance(settings, dict):
        raise PackageError(f"{CONFIG_FILE} must be a JSON object")
    if "encoder" not in settings or "head_layers" not in settings:
        raise PackageError(f"{CONFIG_FILE} lacks encoder or head_layers: not a Laya checkpoint")
    layout = settings.get("option_layout", "sequential")
    if layout not in LAYOUTS:
        raise PackageError(f"{CONFIG_FILE}: option_layout must be sequential or parallel")
    max_len = _count(settings, "max_len", DEFAULT_MAX_LEN, 8)
    head_max_len = _count(settings, "head_max_len", DEFAULT_HEAD_MAX_LEN, 1)
    shipped = settings.get("temperature", [1.0, 1.0, 1.0])
    if not isinstance(shipped, list) or len(shipped) != len(QUESTION_TYPES):
        raise PackageError(f"{CONFIG_FILE}: temperature must be a list of 3 numbers")
    buckets = settings.get("temperature_by_options") or {}
    if not isinstance(buckets, dict):
        raise PackageError(f"{CONFIG_FILE}: temperature_by_options must be an object")
    return AgentConfig(
        encoder=str(settings["encoder"]),
        head_layers=_count(settings, "head_layers", 2, 0),
        max_len=max_len,
        head_max_len=head_max_len,
        layout=str(layout),
        temperature={
            kind: applied_temperature(value)
            for kind, value in zip(QUESTION_TYPES, shipped, strict=True)
        },
        by_options={str(k): applied_temperature(v) for k, v in buckets.items()},
        shipped={"temperature": shipped, "temperature_by_options": buckets},
    )


def looks_like_checkpoint(package: Path) -> bool:
    """Whether ``package`` holds a Laya checkpoint: an ``rl_agent_config.json`` object
    naming ``encoder`` and ``head_layers`` beside ``model.safetensors`` (reads the
    configuration only; never raises)."""
    try:
        if not (package / WEIGHTS_FILE).is_file():
            return False
        settings = json.loads((package / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(settings, dict) and "encoder" in settings and "head_layers" in settings


def tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in a safetensors file, read from its header (8 bytes of
    length, then JSON), without reading a tensor.

    Raises:
        PackageError: the header cannot be read.
    """
    try:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > 100_000_000:
                raise ValueError(f"a header of {length} bytes")
            header = json.loads(handle.read(length))
        return {
            name: tuple(int(n) for n in entry["shape"])
            for name, entry in header.items()
            if name != "__metadata__"
        }
    except (OSError, ValueError, KeyError, TypeError, struct.error) as err:
        raise PackageError(f"{path.name} is not a readable safetensors file: {err}") from err


def head_shapes(width: int, head_layers: int) -> dict[str, tuple[int, ...]]:
    """The shape of every head tensor :mod:`.head` reads, for an encoder of ``width``
    (the ``laya`` package's ``DecisionModel``: a pre-norm transformer layer of feed-forward
    width ``4 * width`` per head layer, the type embedding, the scorer)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for layer in range(head_layers):
        prefix = f"head.layers.{layer}."
        shapes |= {
            prefix + "self_attn.in_proj_weight": (3 * width, width),
            prefix + "self_attn.in_proj_bias": (3 * width,),
            prefix + "self_attn.out_proj.weight": (width, width),
            prefix + "self_attn.out_proj.bias": (width,),
            prefix + "linear1.weight": (4 * width, width),
            prefix + "linear1.bias": (4 * width,),
            prefix + "linear2.weight": (width, 4 * width),
            prefix + "linear2.bias": (width,),
            prefix + "norm1.weight": (width,),
            prefix + "norm1.bias": (width,),
            prefix + "norm2.weight": (width,),
            prefix + "norm2.bias": (width,),
        }
    return shapes | {
        "type_emb.weight": (len(QUESTION_TYPES), width),
        "scorer.0.weight": (width,),
        "scorer.0.bias": (width,),
        "scorer.1.weight": (width, width),
        "scorer.1.bias": (width,),
        "scorer.3.weight": (1, width),
        "scorer.3.bias": (1,),
    }


def check_tensors(package: Path, config: AgentConfig, width: int) -> None:
    """The weights hold an encoder and every head tensor at its shape.

    Raises:
        PackageError: naming the first missing or misshapen tensor.
    """
    shapes = tensor_shapes(package / WEIGHTS_FILE)
    if not any(name.startswith(ENCODER_PREFIX) for name in shapes):
        raise PackageError(f"{WEIGHTS_FILE} holds no encoder.* tensors")
    for name, shape in head_shapes(width, config.head_layers).items():
        if name not in shapes:
            raise PackageError(f"{WEIGHTS_FILE} lacks the head tensor {name}")
        if shapes[name] != shape:
            raise PackageError(
                f"{WEIGHTS_FILE}: {name} is {list(shapes[name])}, the head needs {list(shape)} "
                f"for an encoder of width {width}"
            )
    extra = f"head.layers.{config.head_layers}.norm1.weight"
    if extra in shapes:
        raise PackageError(
            f"{WEIGHTS_FILE} holds more head layers than {CONFIG_FILE}'s head_layers "
            f"({config.head_layers})"
        )
