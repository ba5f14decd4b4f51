"""What a family tells an engine about a model, and what an engine runs.

A family reads the package and fills a :class:`ModelSpec`; the engine never
parses a package format itself. An encoder engine model takes an
:class:`EncoderBatch` and returns one float32 tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

ENCODER_TASKS = ("encoder", "sequence_classification", "token_classification")
"""Encoder tasks: ``encoder`` yields hidden states, the others task logits."""


@dataclass(frozen=True)
class ModelSpec:
    """A model as a family describes it to engines.

    Attributes:
        package: the package directory.
        architecture: the transformers architecture (``BertForTokenClassification``).
        model_type: ``config.json``'s ``model_type`` (``bert``, ``modernbert``).
        task: one of :data:`ENCODER_TASKS`.
        hidden_layer: for ``encoder``, the hidden-states index to return
            (``None`` is the last layer; 0 the embeddings output).
        weights: safetensors files, relative to ``package``.
        onnx: the ONNX graph, relative to ``package``, when the package has one.
        dtype: the requested ``--dtype`` (``auto`` = ``released_dtype``).
        released_dtype: the precision the model was released in.
        weights_digest: a hex digest identifying the weights (the export cache key).
    """

    package: Path
    architecture: str
    model_type: str
    task: str
    hidden_layer: int | None = None
    weights: tuple[str, ...] = ()
    onnx: str | None = None
    dtype: str = "auto"
    released_dtype: str = "float32"
    weights_digest: str | None = None

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype weights run at: ``dtype``, or ``released_dtype`` under ``auto``."""
        name = self.released_dtype if self.dtype == "auto" else self.dtype
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
            name
        ]


@dataclass
class EncoderBatch:
    """Rows of token ids, right-padded to one length.

    Attributes:
        input_ids: int64 ``[rows, tokens]``.
        attention_mask: int64 ``[rows, tokens]``, 1 for real tokens, 0 for padding.
        token_type_ids: int64 ``[rows, tokens]`` (segment of a text pair), or
            ``None`` for single texts.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor | None = None


class EncoderModel(Protocol):
    """What an engine's ``load`` returns for an encoder task."""

    def encode(self, batch: EncoderBatch) -> torch.Tensor:
        """float32 ``[rows, tokens, hidden]`` hidden states, ``[rows, labels]``
        sequence logits or ``[rows, tokens, labels]`` token logits, on the CPU."""
        ...


ITEM_ERRORS = (
    "invalid_input",
    "max_length_exceeded",
    "scan_budget_exceeded",
    "invalid_model_output",
    "deadline_exceeded",
    "internal_error",
)
"""Codes of per-item failures: they stay in the item's place and never fail siblings."""


class RequestError(Exception):
    """A request the model cannot take at all (HTTP 400 ``invalid_request`` and friends).

    Attributes:
        code: ``invalid_request``, ``unsupported_surface`` or ``model_not_found``.
        message: what is wrong and how to fix it.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class WorkItem:
    """One row for the engine: token ids and the content key they are cached under.

    Attributes:
        input_ids: token ids, special tokens included.
        token_type_ids: segment ids (text pairs), or ``None``.
        key: a digest of the ids (and segments): equal rows share a key, so a
            batch computes them once and a result cache can reuse the output.
    """

    input_ids: tuple[int, ...]
    token_type_ids: tuple[int, ...] | None
    key: str

    @property
    def tokens(self) -> int:
        """Row length in tokens."""
        return len(self.input_ids)


@dataclass(frozen=True)
class RowError:
    """A row that produced no output: its input answers with this item error.

    Attributes:
        code: one of :data:`ITEM_ERRORS` (``deadline_exceeded``,
            ``internal_error``, ...).
        message: what happened and what to do.
    """

    code: str
    message: str


RowOutput = torch.Tensor | RowError
"""What ``finish`` receives per planned row: the engine's output, or why there is none."""


class Plan(Protocol):
    """A planned surface request: the rows to run (the rest is the family's own state)."""

    items: list[WorkItem]


class LoadedModel(Protocol):
    """What a family's ``load`` returns: three verbs per surface.

    ``plan`` validates and tokenises (raising :class:`RequestError` for a
    request it cannot take; per-input failures stay inside the plan),
    ``run`` computes one batch of rows from any requests, ``finish`` turns a
    plan and its rows' outputs into the response body.
    """

    surfaces: tuple[str, ...]

    def plan(self, surface: str, request: dict[str, object]) -> Plan:
        """Validate and tokenise a request for ``surface``."""
        ...

    def run(self, items: list[WorkItem]) -> list[torch.Tensor]:
        """One output per item, in order (float32, on the CPU)."""
        ...

    def finish(self, plan: Plan, outputs: list[RowOutput]) -> dict[str, object]:
        """The response body for a plan, given one output (or :class:`RowError`) per item.

        An input any of whose rows failed answers with that row's error in its
        place; its siblings answer normally.
        """
        ...
