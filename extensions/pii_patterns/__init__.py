"""The ``pii_patterns`` plugin: validated pattern spans beside any token-span model.

Payment cards (Luhn), IBANs (mod-97), US SSNs, e-mail addresses, phone numbers,
IP addresses, URLs and dates of birth found by Presidio's predefined
recognizers (``presidio-analyzer``, run without its spaCy NLP engine) are
merged into the ``classify`` spans of every model with a token head
(:mod:`.surface`). Presidio is imported only when a qualifying model loads.
"""

from __future__ import annotations

from vllm_srun.plugins import hookimpl
from vllm_srun.plugins.hookspecs import RegisterSurfaceExtension

from .surface import PiiPatterns


@hookimpl
def register_surface_extensions(register: RegisterSurfaceExtension) -> None:
    """Register :class:`PiiPatterns`."""
    register(PiiPatterns())


__all__ = ["PiiPatterns", "register_surface_extensions"]
