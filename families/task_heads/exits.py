"""The exits of a task model: which layer a surface reads, at what dimension, of what modality.

An exit is a ``(layer, dimension)`` pair. ``layer`` counts the encoder's
transformer layers from 1 (the embedding layer would be 0), so the last layer
is the config's number of hidden layers; ``dimension`` is the size of what the
surface reads there. Every model of this family reads its last layer only, so
each surface has one exit:

- embeddings: the last layer at the pooled embedding's dimension (the hidden
  size; sentence-transformers' Pooling keeps it);
- rerank: a cross-encoder's last layer at its hidden size (its classifier
  reads that), a bi-encoder's embedding exit (the cosine of two embeddings).

A request naming another layer, or another rerank dimension, is refused
(:func:`check_layer`, :func:`check_rerank_exit`). The card's
``embedding.layers`` and ``rerank: {exits, default}`` come from
:func:`embedding_exits` and :func:`rerank_exits` too, so a card never lists an
exit a request is refused for.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_srun.plugins.cards import RerankExit
from vllm_srun.plugins.spec import RequestError

from .package import Description

TEXT_MODALITIES = ("text",)
"""What this family's models embed: text only (a tokenizer, no image or audio tower)."""


@dataclass(frozen=True)
class Exit:
    """One exit: the transformer ``layer`` read (1-based, the last is the layer count) and
    the ``dimension`` of what the surface reads there."""

    layer: int
    dimension: int

    def card(self) -> RerankExit:
        """``{"layer", "dimension"}``, as a ``rerank.exits`` entry of the card."""
        return {"layer": self.layer, "dimension": self.dimension}


def embedding_exits(description: Description) -> tuple[Exit, ...]:
    """The exits the embeddings surface reads: the last layer at the pooled dimension.

    Empty for a model without a pooled head.
    """
    if description.pooling is None:
        return ()
    return (Exit(description.layers, description.pooling.dimensions),)


def rerank_exits(description: Description) -> tuple[Exit, ...]:
    """The exits the rerank surface reads, the default first: a cross-encoder's last
    layer at its hidden size, else a bi-encoder's embedding exit (empty for a model
    that does not rerank)."""
    if any(head.kind == "relevance" for head in description.heads):
        return (Exit(description.layers, description.hidden_size),)
    return embedding_exits(description)


def embedding_layers(description: Description) -> tuple[int, ...]:
    """The layers the model's embeddings can be read at (the card's ``embedding.layers``),
    ascending; empty for a model that is not an embedder."""
    return tuple(sorted({found.layer for found in embedding_exits(description)}))


def embedding_modalities(description: Description) -> tuple[str, ...]:
    """What the model's embeddings read: ``("text",)`` for a pooled head, else nothing."""
    return TEXT_MODALITIES if description.pooling is not None else ()


def _layers(exits: tuple[Exit, ...]) -> str:
    return "[" + ", ".join(str(e.layer) for e in exits) + "]"


def check_layer(exits: tuple[Exit, ...], layer: int | None) -> Exit | None:
    """The exit a request's ``layer`` names: the first (the default) when ``None``, and
    ``None`` then only for a model that declares no exit.

    Raises:
        RequestError: ``invalid_request`` when ``layer`` is not an exit's layer
            (``layer 3 is not an exit of this model; its exits are [6]``).
    """
    if layer is None:
        return exits[0] if exits else None
    found = next((e for e in exits if e.layer == layer), None)
    if found is None:
        raise RequestError(
            "invalid_request",
            f"layer {layer} is not an exit of this model; its exits are {_layers(exits)}",
            "layer",
        )
    return found


def check_rerank_exit(
    exits: tuple[Exit, ...], layer: int | None, dimensions: int | None
) -> Exit | None:
    """The exit a rerank request's ``layer`` and ``dimensions`` name (the default exit for
    what it leaves out; ``None`` when it names neither and the model declares no exit).

    Raises:
        RequestError: ``invalid_request`` when ``layer`` is not an exit's layer, or
            ``dimensions`` is not that exit's dimension (rerank reads an exit whole).
    """
    chosen = check_layer(exits, layer)
    if dimensions is None:
        return chosen
    if chosen is None or dimensions != chosen.dimension:
        listed = ", ".join(f"layer {e.layer} at dimension {e.dimension}" for e in exits)
        where = "" if chosen is None else f" at layer {chosen.layer}"
        fix = "leave it out" if chosen is None else f"send {chosen.dimension} or leave it out"
        raise RequestError(
            "invalid_request",
            f"dimensions {dimensions} is not an exit of this model{where}; its exits are "
            f"[{listed}]: {fix}",
            "dimensions",
        )
    return chosen


__all__ = [
    "Exit",
    "check_layer",
    "check_rerank_exit",
    "embedding_exits",
    "embedding_layers",
    "embedding_modalities",
    "rerank_exits",
]
