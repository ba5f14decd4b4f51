"""The ``similarity_readout`` plugin: embedders answer System One questions zero-shot.

Any model served with a pooled head (an ``embedding`` on its card) gains the
``decisions`` surface: the state and every option are embedded by the model
itself, and the probabilities are the softmax of the cosine similarities over
a calibrated temperature (:mod:`.readout`).
"""

from __future__ import annotations

from vllm_srun.plugins import hookimpl
from vllm_srun.plugins.hookspecs import RegisterSurfaceExtension

from .readout import SimilarityReadout


@hookimpl
def register_surface_extensions(register: RegisterSurfaceExtension) -> None:
    """Register :class:`SimilarityReadout`."""
    register(SimilarityReadout())


__all__ = ["SimilarityReadout", "register_surface_extensions"]
