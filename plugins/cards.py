"""The model cards of ``/v1/models``, as types: what a family's ``card`` returns and what
the runtime serves.

Each card is a :class:`typing.TypedDict` (the convention of
:mod:`vllm_srun.plugins.responses`): a family builds its part as a plain dict, mypy
checks its keys and their types against these classes, and the runtime's OpenAPI
document (``/openapi.json``) is generated from the same classes, so the card a family
writes and the card the document describes cannot drift apart.

A family returns a :class:`FamilyCard` (its surfaces, heads, embedding, rerank exits,
limits). The runtime adds identity, composition, probes, status and plugins, which makes
it the wire's :class:`ModelCard`. The router's Go client decodes the card: a value of
another JSON type (a float where an integer goes, one integer where a list goes) fails
its whole decode, so the types here are the contract's (wire contract 2.3). Keys the
contract does not have are marked "Extension" (a 2.3 client ignores them).

Why one module of 500-odd lines: it is the card's part of the contract, one class per
JSON shape with the descriptions the OpenAPI document shows, read top to bottom as one
document; the family's part and the runtime's are kept together so that the served
card visibly extends what a family writes.
"""

from __future__ import annotations

from typing import Annotated, Literal, NotRequired, Required

from pydantic import Field
from typing_extensions import TypedDict  # pydantic reads typing's TypedDict only from 3.12

from vllm_srun.plugins.profiles import Numerics, ProfileInfo
from vllm_srun.plugins.requests import Overflow
from vllm_srun.plugins.responses import closed, opened

EXTENSION = "Extension (not in the 2.3 contract; a 2.3 client ignores it): "
"""How a key the 2.3 contract does not have starts its description."""

CardStatus = Literal["starting", "loading", "warming", "ready", "degraded", "failed"]
"""A model's or the process's state."""

GoldenState = Literal["pending", "matched", "unverified", "failed"]
"""Where a model's golden self-check stands (:class:`GoldenStatus`)."""

PluginGroup = Literal["family", "engine", "accelerator", "kernel", "extension"]
"""What a plugin composing a model is to it (:class:`PluginInfo`)."""

Scalar = str | int | float | bool | None
"""One value of a flat settings object (``engine_args``)."""


# A type without ``closed`` or ``opened`` would take the config of the type it is nested in
# (pydantic), so every type here says which it is: ``closed`` for the shapes written
# exactly, ``opened`` for those the contract lets carry more.


# -- the family's part ------------------------------------------------------------------------
@closed
class Window(TypedDict):
    """How a head reads an input longer than the model's limit under ``overflow: window``."""

    tokens: Annotated[int, Field(description="Tokens per window, special tokens included.")]
    overlap: Annotated[int, Field(description="Content tokens two neighbouring windows share.")]


@opened
class HeadCard(TypedDict):
    """One output head of a model."""

    name: Annotated[
        str, Field(description="The head's name; a classify request selects it with head.")
    ]
    kind: Annotated[
        str,
        Field(
            description="sequence (one label, softmax), scores (sigmoid per label) or token "
            "(spans), as the contract lists; this runtime also has relevance (a "
            "cross-encoder's one logit) and pooled (an embedder's vectors)."
        ),
    ]
    labels: Annotated[list[str], Field(description="The labels, in the order results list them.")]
    inputs: Annotated[
        list[str],
        Field(
            description="What one input may carry: text, and pair for a head reading text pairs."
        ),
    ]
    default_threshold: Annotated[
        float | None,
        Field(
            description="The threshold a request that sends none gets (the models file's "
            "family option threshold), else null."
        ),
    ]
    thresholds: Annotated[
        list[float] | None,
        Field(
            description="The packaged per-label operating point (thresholds.json), in labels "
            "order, else null."
        ),
    ]
    operating_point_sha256: NotRequired[
        Annotated[
            str | None,
            Field(description="SHA-256 of the file the thresholds come from, else null."),
        ]
    ]
    overflow: Annotated[
        Overflow,
        Field(description="The policy a request that names none gets for an input over the limit."),
    ]
    overflow_policies: NotRequired[
        Annotated[
            list[Overflow],
            Field(description=EXTENSION + "every overflow policy a request may choose."),
        ]
    ]
    window: Annotated[Window | None, Field(description="The windows overflow: window reads.")]
    reduction: Annotated[
        Literal["max", "span_union"] | None,
        Field(
            description="How windows merge back: max (per label, over windows); null when the "
            "head merges otherwise (see window_reduction)."
        ),
    ]
    window_reduction: NotRequired[
        Annotated[
            str, Field(description=EXTENSION + "how windows merge back, in this runtime's words.")
        ]
    ]


@opened
class EmbeddingCard(TypedDict):
    """What an embedder's vectors are."""

    dimensions: Annotated[
        list[int],
        Field(
            description="The vector sizes the model declares: its full size, then any "
            "Matryoshka sizes its package declares (config.json matryoshka_dimensions)."
        ),
    ]
    layers: Annotated[
        list[int],
        Field(
            description="The layers vectors can be read at, numbered from 1 (the last is the "
            "number of hidden layers)."
        ),
    ]
    modalities: Annotated[list[str], Field(description="What it embeds: text.")]
    normalized: Annotated[bool, Field(description="Whether vectors have unit L2 norm.")]
    pooling: Annotated[
        str, Field(description="How token states become one vector: mean, cls, max...")
    ]
    input_types: Annotated[
        list[str],
        Field(description="The input_type values it tells apart; empty: not an instructed model."),
    ]
    max_tokens: NotRequired[
        Annotated[int, Field(description=EXTENSION + "its input limit in tokens.")]
    ]


@closed
class RerankExit(TypedDict):
    """One representation rerank may read: the hidden states after ``layer``,
    ``dimension`` floats wide."""

    layer: Annotated[int, Field(description="The layer read, numbered from 1.")]
    dimension: Annotated[int, Field(description="Floats per representation read there.")]


@closed
class RerankCard(TypedDict):
    """The representations rerank reads: a bi-encoder's embeddings, or a cross-encoder's
    hidden states."""

    exits: Annotated[
        list[RerankExit], Field(description="Every representation a request may name.")
    ]
    default: Annotated[RerankExit, Field(description="The one read when a request names none.")]


@opened
class ModelLimits(TypedDict, total=False):
    """A model's limits, all integers; each is absent where it does not apply."""

    max_input_tokens: Annotated[
        int | None,
        Field(description="The most tokens one input may have, special tokens included."),
    ]
    min_options: Annotated[int | None, Field(description="Decision models: fewest choice options.")]
    max_options: Annotated[int | None, Field(description="Decision models: most choice options.")]
    min_levels: Annotated[int | None, Field(description="Decision models: fewest score levels.")]
    max_levels: Annotated[int | None, Field(description="Decision models: most score levels.")]
    max_inputs: Annotated[
        int | None,
        Field(
            description="The most inputs or documents one classify, embeddings or rerank "
            "request may carry (--max-inputs); a larger one is 400 invalid_request, so a "
            "client splits it. Absent on a card that serves none of those surfaces."
        ),
    ]
    max_model_len: Annotated[
        int | None,
        Field(description=EXTENSION + "decision models: the --max-model-len in effect."),
    ]
    model_max_tokens: Annotated[
        int | None, Field(description=EXTENSION + "decision models: the model's own token limit.")
    ]


@opened
class DecisionsCard(TypedDict, total=False):
    """How a decision model reads its answers: ``method`` and ``numerics``, then what the
    family's method has (those of ``causal_readout`` below)."""

    method: Required[
        Annotated[str, Field(description="The family's readout method (causal_readout).")]
    ]
    numerics: Required[Annotated[Numerics, Field(description="exact or approximate.")]]
    template: Annotated[
        Literal["chat", "plain"],
        Field(description="How a question is rendered: the chat template, or plain text."),
    ]
    shared_context: Annotated[
        bool,
        Field(description="Whether a multi-question request's shared state is computed once."),
    ]
    calibrated: Annotated[bool, Field(description="Whether the package ships a calibration.")]
    readout: Annotated[str, Field(description="How option scores are read (letters, ...).")]
    temperature: Annotated[
        dict[str, float], Field(description="The softmax temperature per question type.")
    ]


@opened
class ExtensionCard(TypedDict):
    """A surface extension attached to the model: what it adds and how its answers are
    made. The extension adds keys of its own (its ``SurfaceModel.card()``), free-form."""

    name: Annotated[str, Field(description="The extension's name.")]
    surfaces: Annotated[list[str], Field(description="The surfaces it adds or augments.")]
    numerics: Annotated[
        str, Field(description="exact, or approximate (not the model's trained readout).")
    ]
    method: Annotated[str, Field(description="The method its answers come from, in one line.")]


class FamilyCard(TypedDict, total=False):
    """The family's part of a ``/v1/models`` card: what ``LoadedModel.card`` returns.

    The runtime adds identity, engine, device, probes, status and plugins (and ``[]``,
    ``null`` or ``{}`` for a key left out here), which makes it a :class:`ModelCard`.

    Keys:
        surfaces: the surfaces the model serves (required).
        question_types: ``choice``, ``noul``, ``score`` for a model answering decisions.
        modalities: what a decisions state may hold (``text``).
        heads: its output heads (:class:`HeadCard`).
        embedding: its pooled vectors (:class:`EmbeddingCard`), or ``None``.
        rerank: what rerank reads (:class:`RerankCard`), for a model serving rerank.
        limits: :class:`ModelLimits`: ``max_input_tokens`` (its input limit, special
            tokens included), and for decision models ``max_model_len`` and
            ``model_max_tokens``.
        decisions: how a decision model reads its answers (:class:`DecisionsCard`).
        extensions: the surface extensions attached (the runtime writes it:
            :class:`ExtensionCard`).
        weights: what the weights are when the family converted them from another
            format (a GGUF file: ``format``, ``quantisation``, the conversion), a JSON
            object of the family's own; absent for weights that load as they are.
    """

    surfaces: Required[list[str]]
    question_types: list[str]
    modalities: list[str]
    heads: list[HeadCard]
    embedding: EmbeddingCard | None
    rerank: RerankCard | None
    limits: ModelLimits
    decisions: DecisionsCard
    extensions: list[ExtensionCard]
    weights: dict[str, object]


# -- what the runtime adds --------------------------------------------------------------------
@opened
class GoldenStatus(TypedDict):
    """The golden self-check run while the model warms."""

    status: Annotated[
        GoldenState,
        Field(
            description="pending until the check ran; matched (answers agree with a "
            "reference recorded for this device), unverified (none recorded: the answers "
            "were only checked to be well formed and deterministic) or failed."
        ),
    ]
    checked: Annotated[int, Field(description="Golden cases run.")]
    matched: Annotated[
        int, Field(description="Golden cases that agreed with the recorded reference.")
    ]
    reference: Annotated[
        str | None,
        Field(
            description="The reference key compared; empty when none is recorded for this "
            "device; null before the check ran."
        ),
    ]


@opened
class PluginInfo(TypedDict):
    """A plugin composing the model."""

    group: Annotated[
        PluginGroup, Field(description="family, engine, accelerator, kernel or extension.")
    ]
    name: Annotated[str, Field(description="The object's name in its plugin layer.")]
    distribution: Annotated[
        str | None, Field(description="The distribution that declares the plugin.")
    ]
    version: Annotated[str | None, Field(description="That distribution's version.")]
    capabilities: Annotated[
        dict[str, object], Field(description="What the object declares about itself.")
    ]
    plugin: Annotated[str | None, Field(description=EXTENSION + "the plugin's entry-point name.")]


@closed
class Deviation(TypedDict):
    """How far an approximate profile's answers are from ``exact``."""

    max_abs: Annotated[
        float | None,
        Field(
            description="The largest absolute difference of any number in the golden "
            "answers from the recorded exact answers; null when nothing was compared."
        ),
    ]
    measured_on: Annotated[str, Field(description="What was compared: golden questions.")]
    golden_cases: Annotated[int, Field(description="Golden cases run.")]
    reference: Annotated[str | None, Field(description="The reference key compared.")]


@closed
class AdapterBase(TypedDict):
    """The base model an adapter package was merged into."""

    repo: str
    revision: Annotated[
        str | None, Field(description="Its 40-hex commit; null: the built-in model's own.")
    ]
    source: Annotated[str, Field(description="Where the base's bytes came from.")]
    verification: Annotated[str, Field(description="How the base's files were checked.")]
    base_sha256: Annotated[str, Field(description="The identity of the base's files.")]
    files: Annotated[dict[str, str], Field(description="Each base file's SHA-256.")]


@closed
class AdapterMerged(TypedDict):
    """The merged package the model was loaded from."""

    path: str
    reused: Annotated[bool, Field(description="Whether it was already in the cache.")]


@closed
class AdapterCard(TypedDict):
    """A PEFT adapter package the model was merged from."""

    package: Annotated[str, Field(description="The adapter package's folder.")]
    peft_type: str
    adapter_sha256: str
    base: AdapterBase
    merged: AdapterMerged


@opened
class ModelCard(TypedDict):
    """One served model: identity, what it answers, its limits, composition and state.
    Every field is present whatever the state (null or empty until known)."""

    id: Annotated[str, Field(description="The model ID requests use.")]
    object: Annotated[Literal["model"], Field(description="OpenAI's object type.")]
    created: Annotated[
        int, Field(description=EXTENSION + "when the runtime took the model on (Unix seconds).")
    ]
    owned_by: Annotated[
        str,
        Field(description="The repository's owner on the Hub, or vllm-srun for a local package."),
    ]
    family: str | None
    repo: Annotated[
        str | None, Field(description="The Hub repository, or null for a local package.")
    ]
    revision: Annotated[
        str | None, Field(description="The 40-hex commit, or null for a local package.")
    ]
    model_sha256: Annotated[
        str | None, Field(description="SHA-256 over the package's loadable files.")
    ]
    verification: Annotated[
        str | None, Field(description=EXTENSION + "how the files were checked.")
    ]
    surfaces: list[str]
    question_types: list[str]
    presets: Annotated[list[str], Field(description="Named request presets; none in this version.")]
    modalities: Annotated[
        list[str],
        Field(
            description="What a decisions state may hold (text); empty for a model without "
            "decisions."
        ),
    ]
    heads: list[HeadCard]
    embedding: EmbeddingCard | None
    rerank: Annotated[RerankCard | None, Field(description="Set on every model serving rerank.")]
    limits: ModelLimits
    licence: str | None
    profile: Annotated[str, Field(description="The numeric profile the model is served under.")]
    profiles: Annotated[
        list[ProfileInfo],
        Field(
            description="Every profile the model can be loaded under on its engine; a "
            "request may name only the one it was loaded with."
        ),
    ]
    numerics: Annotated[
        Numerics, Field(description=EXTENSION + "the numerics of the profile it is served under.")
    ]
    engine: str | None
    engine_reason: Annotated[
        str | None,
        Field(
            description=EXTENSION + "why the engine was chosen: named by --engine, or "
            "--engine auto's rule (an engine at parity with the golden reference under "
            "exact, else the first by rank); null until the model is loaded."
        ),
    ]
    accelerator: str | None
    accelerator_validated: Annotated[
        bool,
        Field(
            description="Whether this model's golden answers matched a reference recorded "
            "on this accelerator."
        ),
    ]
    device: str | None
    dtype: str | None
    parameters: int | None
    ready: Annotated[bool, Field(description="Whether the model answers requests now.")]
    status: CardStatus
    reason: Annotated[str | None, Field(description="Why it is failed, retrying or not ready.")]
    golden: GoldenStatus
    plugins: list[PluginInfo]
    # this runtime's own keys, present on every card
    extensions: Annotated[
        list[ExtensionCard],
        Field(description=EXTENSION + "the surface extensions attached to the model."),
    ]
    engine_args: Annotated[
        dict[str, Scalar],
        Field(description=EXTENSION + "the engine arguments in effect that the card shows."),
    ]
    options: Annotated[
        dict[str, object],
        Field(description=EXTENSION + "the family options of the models file entry."),
    ]
    adapter: Annotated[
        AdapterCard | None,
        Field(description=EXTENSION + "the PEFT adapter merged into the model, else null."),
    ]
    autotune_cache: Annotated[
        str | None,
        Field(description=EXTENSION + "the kernel autotune cache set up at serve start."),
    ]
    deviation_from_exact: Annotated[
        Deviation | None,
        Field(description=EXTENSION + "under an approximate profile, the measured deviation."),
    ]
    # this runtime's own keys, present once the model loaded
    source: NotRequired[
        Annotated[str, Field(description=EXTENSION + "where the package's bytes came from.")]
    ]
    files: NotRequired[
        Annotated[dict[str, str], Field(description=EXTENSION + "each checked file's SHA-256.")]
    ]
    extra_files: NotRequired[
        Annotated[list[str], Field(description=EXTENSION + "files present but not loaded.")]
    ]
    attention: NotRequired[
        Annotated[str | None, Field(description=EXTENSION + "the attention kernel.")]
    ]
    kernels: NotRequired[
        Annotated[dict[str, str], Field(description=EXTENSION + "the kernel chosen per slot.")]
    ]
    batch_invariance: NotRequired[
        Annotated[
            dict[str, object],
            Field(
                description=EXTENSION + "the load-time probe: the largest deviation of a row "
                "inside a batch, and how rows share forwards."
            ),
        ]
    ]
    forward_cost: NotRequired[
        Annotated[
            dict[str, object],
            Field(description=EXTENSION + "the load-time measurement of a forward's fixed cost."),
        ]
    ]
    decisions: NotRequired[
        Annotated[
            DecisionsCard, Field(description=EXTENSION + "how a decision model reads answers.")
        ]
    ]
    weights: NotRequired[
        Annotated[
            dict[str, object],
            Field(
                description=EXTENSION + "what the weights are when the family converted them "
                "from another format (GGUF)."
            ),
        ]
    ]


__all__ = [
    "EXTENSION",
    "AdapterBase",
    "AdapterCard",
    "AdapterMerged",
    "CardStatus",
    "DecisionsCard",
    "Deviation",
    "EmbeddingCard",
    "ExtensionCard",
    "FamilyCard",
    "GoldenState",
    "GoldenStatus",
    "HeadCard",
    "ModelCard",
    "ModelLimits",
    "PluginGroup",
    "PluginInfo",
    "ProfileInfo",
    "RerankCard",
    "RerankExit",
    "Scalar",
    "Window",
]
