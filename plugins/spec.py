"""What a family tells an engine about a model, and what an engine runs.

A family reads the package and fills a :class:`ModelSpec`; the engine never
parses a package format itself. An encoder engine model takes an
:class:`EncoderBatch` of numpy arrays and returns one float32 numpy array (an engine
that computes elsewhere converts at its own boundary); a decoder engine model
(:class:`DecoderModel`, native engines only) takes a left-padded torch
:class:`DecoderBatch` and returns next-token logits at each row's last position.

Importing this module imports numpy, never torch: torch appears in the decoder's
annotations only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, TypeAlias, get_args

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:  # torch is imported by what runs a decoder, not by the plugin API
    import torch

ENCODER_TASKS = ("encoder", "sequence_classification", "token_classification")
"""Encoder tasks: ``encoder`` yields hidden states, the others task logits."""

DECODER_TASKS = ("causal_lm",)
"""Decoder tasks: ``causal_lm`` yields next-token logits (:class:`DecoderModel`)."""


PICKLED_WEIGHTS = "pytorch_model*.bin"
"""Pickled weights a package may carry instead of safetensors (transformers' legacy name)."""


def weight_files(package: Path) -> tuple[str, ...]:
    """The weights files a native engine loads from ``package``, sorted.

    The ``*.safetensors`` files when there are any; otherwise the pickled
    ``pytorch_model*.bin`` files, which an engine may only read with
    ``torch.load(..., weights_only=True)`` (tensors and plain containers, never
    arbitrary objects: a pickle that needs more is refused).
    """
    safetensors = sorted(p.name for p in package.glob("*.safetensors"))
    if safetensors:
        return tuple(safetensors)
    return tuple(sorted(p.name for p in package.glob(PICKLED_WEIGHTS)))


def pickled(weights: tuple[str, ...]) -> bool:
    """Whether ``weights`` (from :func:`weight_files`) are pickles, not safetensors."""
    return bool(weights) and not any(name.endswith(".safetensors") for name in weights)


@dataclass(frozen=True)
class ModelSpec:
    """A model as a family describes it to engines.

    Attributes:
        package: the package directory.
        architecture: the transformers architecture (``BertForTokenClassification``).
        model_type: ``config.json``'s ``model_type`` (``bert``, ``modernbert``).
        task: one of :data:`ENCODER_TASKS` or :data:`DECODER_TASKS`.
        hidden_layer: for ``encoder``, the hidden-states index to return
            (``None`` is the last layer; 0 the embeddings output).
        weights: safetensors files, relative to ``package``.
        onnx: the ONNX graph, relative to ``package``, when the package has one.
        dtype: the requested ``--dtype`` (``auto`` = ``released_dtype``).
        released_dtype: the precision the model was released in.
        weights_digest: a hex digest identifying the weights (the export cache key).
        token_limit: the most tokens one row may hold as the package states it
            (a decoder's positions), or ``None`` when the family states none;
            the loader refuses a ``max_model_len`` above it.
        max_model_len: the ``--max-model-len`` load option (decision models),
            or ``None``.
        shared_context: the ``--enable-shared-context`` load option, or
            ``None`` for the family's default.
        profile: the numeric profile the model loads under (``--profile``;
            :mod:`vllm_srun.plugins.profiles`); the engine reads what it changes.
        int8_tolerant: whether the family measured that every head of the model
            keeps its quality under int8 dynamic quantisation of the weights
            (an engine may quantise under a ``max_speed`` profile only then).
        bf16_tolerant: whether the family measured that every head of the model
            keeps its quality when computed in bfloat16 (an engine may then run a
            float32 model in bfloat16 under ``max_speed`` with ``--dtype auto``, on
            a device whose ``bf16`` capability is ``bf16_native``).
        attention_groups: whether the family's batches carry position ids and attention
            groups (:class:`EncoderBatch`): an engine that cannot honour both refuses the
            spec in ``supports``.
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
    token_limit: int | None = None
    max_model_len: int | None = None
    shared_context: bool | None = None
    profile: str = "exact"
    int8_tolerant: bool = False
    bf16_tolerant: bool = False
    attention_groups: bool = False

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype weights run at: ``dtype``, or ``released_dtype`` under ``auto``."""
        import torch

        name = self.released_dtype if self.dtype == "auto" else self.dtype
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
            name
        ]


@dataclass
class EncoderBatch:
    """Rows of token ids, right-padded to one length: C-contiguous numpy arrays in host
    memory (:func:`~vllm_srun.plugins.collate.right_padded` builds them).

    Attributes:
        input_ids: int64 ``[rows, tokens]``.
        attention_mask: int64 ``[rows, tokens]``, 1 for real tokens, 0 for padding.
        token_type_ids: int64 ``[rows, tokens]`` (segment of a text pair), or
            ``None`` for single texts.
        position_ids: int64 ``[rows, tokens]`` position of each token, or ``None`` for
            ``0..tokens-1`` (only for a spec with ``attention_groups``).
        attention_groups: int64 ``[rows, tokens]``, or ``None`` (only for a spec with
            ``attention_groups``): a token of group ``g > 0`` neither attends to nor is
            attended by a token of another group ``h > 0``; group 0 tokens attend to and
            are seen by every real token. A local (sliding-window) attention layer
            measures its window in ``position_ids``.
    """

    input_ids: npt.NDArray[np.int64]
    attention_mask: npt.NDArray[np.int64]
    token_type_ids: npt.NDArray[np.int64] | None = None
    position_ids: npt.NDArray[np.int64] | None = None
    attention_groups: npt.NDArray[np.int64] | None = None


class EncoderModel(Protocol):
    """What an engine's ``load`` returns for an encoder task.

    Attributes:
        compute_dtype: the dtype its forwards compute in (``float32``, ``bfloat16``;
            an int8 graph still computes its output in ``float32``): the card's
            ``dtype``. ``None``: the requested ``--dtype``.
        libraries: the distributions whose code runs its forwards (``torch``,
            ``transformers``, ``onnxruntime``, a plugin's own): their versions are
            part of the key the forward-cost measurement is cached under.
    """

    @property
    def compute_dtype(self) -> str | None: ...

    @property
    def libraries(self) -> tuple[str, ...]: ...

    def encode(self, batch: EncoderBatch) -> npt.NDArray[np.float32]:
        """float32 ``[rows, tokens, hidden]`` hidden states, ``[rows, labels]``
        sequence logits or ``[rows, tokens, labels]`` token logits: a C-contiguous
        numpy array in host memory, whatever device computed it."""
        ...


@dataclass
class DecoderBatch:
    """Rows of token ids for a decoder, padded on the left to one length: torch
    tensors (decoders run on the native engine only;
    :func:`~vllm_srun.plugins.collate.left_padded` builds them).

    Each row's last column is its last real token, so the next-token logits of
    every row sit at position ``-1``. Padding may use any token id (a model
    without a pad token still batches): the mask hides it.

    Attributes:
        input_ids: int64 ``[rows, tokens]``, left-padded.
        attention_mask: int64 ``[rows, tokens]``, 0 for padding then 1 for real tokens.
        position_ids: int64 ``[rows, tokens]``, or ``None`` for the default
            :func:`decoder_positions` (real tokens numbered from 0, after the prefix).
        prefix_ids: int64 ``[prefix_tokens]`` shared by every row and preceding
            it (the rows continue from it), or ``None``. The engine computes the
            prefix's keys and values once and reuses them for every row.
        read_ids: int64 ``[rows, k]`` vocabulary ids whose logits to return per
            row, or ``None`` for the whole vocabulary.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor | None = None
    prefix_ids: torch.Tensor | None = None
    read_ids: torch.Tensor | None = None


def decoder_positions(attention_mask: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """Position ids of a left-padded batch: ``offset + clamp(cumsum(mask) - 1, min=0)``.

    Real tokens are numbered ``offset, offset + 1, ...`` whatever padding
    precedes them (as transformers' ``generate`` numbers them); padding gets
    ``offset``, which the mask hides anyway.

    Args:
        attention_mask: int ``[rows, tokens]``.
        offset: tokens before the rows (a shared prefix's length).

    Returns:
        int64 ``[rows, tokens]``.
    """
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.clamp(min=0) + offset


def undeclared_members(engine_model: object) -> list[str]:
    """Which of the members every engine model declares besides its forward
    (``compute_dtype``, ``libraries``: :class:`EncoderModel`) ``engine_model`` lacks, in
    that order; the loader and the conformance kit refuse a model that lacks any."""
    return [name for name in ("compute_dtype", "libraries") if not hasattr(engine_model, name)]


class DecoderModel(Protocol):
    """What an engine's ``load`` returns for a decoder task (``compute_dtype`` and
    ``libraries`` as :class:`EncoderModel` declares them)."""

    @property
    def compute_dtype(self) -> str | None: ...

    @property
    def libraries(self) -> tuple[str, ...]: ...

    def forward(self, batch: DecoderBatch) -> torch.Tensor:
        """Next-token logits at each row's last position, a float32 torch tensor on the
        CPU: ``[rows, k]`` at ``batch.read_ids``, or ``[rows, vocab]`` without them (the
        family converts it to numpy before :func:`~vllm_srun.plugins.collate.split_rows`)."""
        ...


ItemErrorCode = Literal[
    "invalid_input",
    "max_length_exceeded",
    "scan_budget_exceeded",
    "invalid_model_output",
    "deadline_exceeded",
    "internal_error",
]
"""Codes of per-item failures: they stay in the item's place and never fail siblings."""

ITEM_ERRORS: tuple[ItemErrorCode, ...] = get_args(ItemErrorCode)
"""Every :data:`ItemErrorCode`, in the order the contract lists them."""

RequestErrorCode = Literal[
    "invalid_request",
    "model_not_found",
    "request_too_large",
    "unsupported_surface",
    "overloaded",
    "internal_error",
    "not_ready",
]
"""Codes of request-level failures (the whole request answers an HTTP error).

A family raises ``invalid_request`` or ``unsupported_surface``; the runtime
raises the rest (``model_not_found`` 404, ``request_too_large`` 413,
``overloaded`` 429, ``not_ready`` 503, ``internal_error`` 500)."""

REQUEST_ERRORS: tuple[RequestErrorCode, ...] = get_args(RequestErrorCode)
"""Every :data:`RequestErrorCode`, in the order the contract lists them."""


ECHO_LIMIT = 200
"""Characters of a client's value an error message echoes at most."""

PROBLEMS_SHOWN = 5
"""Problems an error message lists before it counts the rest."""


MESSAGE_LIMIT = 2000
"""Characters of an error message at most, a request's or one item's (the names it
echoes are cut first, at :data:`ECHO_LIMIT`, so the cut rarely reaches the message)."""


def clip(value: str, limit: int = ECHO_LIMIT) -> str:
    """``value`` cut to ``limit`` characters, saying how many were left out: an error
    message never grows with what the client sent."""
    if len(value) <= limit:
        return value
    return f"{value[:limit]}... ({len(value) - limit} more characters)"


def listed(problems: Sequence[str], shown: int = PROBLEMS_SHOWN) -> str:
    """The first ``shown`` problems joined with ``; ``, then ``; and N more``."""
    head = "; ".join(problems[:shown])
    return f"{head}; and {len(problems) - shown} more" if len(problems) > shown else head


class RequestError(Exception):
    """A request the model cannot take at all (HTTP 400 ``invalid_request`` and friends).

    Attributes:
        code: a :data:`RequestErrorCode`; a family raises ``invalid_request``
            or ``unsupported_surface``.
        message: what is wrong and how to fix it.
        param: the request field at fault, dotted (``input``, ``dimensions``,
            ``options.window.tokens``): the error document's ``param`` (OpenAI's), or
            ``None`` when no one field is.
    """

    def __init__(self, code: RequestErrorCode, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code: RequestErrorCode = code
        self.message = message
        self.param = param


@dataclass(frozen=True)
class WorkItem:
    """One row for the engine: token ids and the content key they are cached under.

    Attributes:
        input_ids: token ids, special tokens included.
        token_type_ids: segment ids (text pairs), or ``None``.
        key: a digest of the ids (and segments): equal rows share a key, so a
            batch computes them once and a result cache can reuse the output.
        prefix: how many leading tokens the row shares with other rows of its
            request that its model computes once per forward (a decision
            state's prompt head; 0: none). The scheduler keeps rows sharing a
            prefix in one forward, and the key must cover it.
    """

    input_ids: tuple[int, ...]
    token_type_ids: tuple[int, ...] | None
    key: str
    prefix: int = 0

    @property
    def tokens(self) -> int:
        """Row length in tokens."""
        return len(self.input_ids)

    @classmethod
    def of(
        cls, input_ids: Sequence[int], token_type_ids: Sequence[int] | None = None, prefix: int = 0
    ) -> WorkItem:
        """A row keyed by what decides its output: the SHA-256 (hex) of its ids, segment ids
        and prefix length. A family whose output depends on more than the ids (a
        readout's label ids) builds its own key instead."""
        ids = tuple(int(i) for i in input_ids)
        types = None if token_type_ids is None else tuple(int(t) for t in token_type_ids)
        key = hashlib.sha256(repr((ids, types, prefix)).encode()).hexdigest()
        return cls(ids, types, key, prefix)


@dataclass(frozen=True)
class RowError:
    """A row that produced no output: its input answers with this item error.

    Attributes:
        code: one of :data:`ITEM_ERRORS` (``deadline_exceeded``,
            ``internal_error``, ...).
        message: what happened and what to do.
    """

    code: ItemErrorCode
    message: str


RowOutput: TypeAlias = npt.NDArray[np.float32] | RowError
"""What ``finish`` receives per planned row: the row's float32 numpy output (as
``run`` returned it), or why there is none."""
