"""The engine contract: run a described model on a placed device.

An engine never parses a package format: a family hands it a model spec and
reads back hidden states (encoders) or logits at gathered positions
(decoders). The spec's shape is defined by the families issue; an engine
receives it opaquely here.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, ClassVar

from vllm_srun.plugins.accelerator import DeviceInfo


class Engine(abc.ABC):
    """Base class of engine plugins.

    Class attributes:
        name: the engine's name, as ``--engine NAME`` selects it.
        auto_priority: position in ``--engine auto``, ascending (the built-in
            ``native`` comes first); ``None`` means only when named.
    """

    name: ClassVar[str]
    auto_priority: ClassVar[int | None] = None

    @abc.abstractmethod
    def supports(self, spec: Any, device: DeviceInfo) -> str | None:
        """``None`` when the engine can run ``spec`` on ``device``, else the reason it cannot."""

    @abc.abstractmethod
    def load(self, spec: Any, device: DeviceInfo, options: Mapping[str, Any]) -> Any:
        """Load ``spec`` onto ``device`` and return an engine model.

        The engine model exposes ``encode(batch)`` (encoders: hidden states or
        graph outputs) and/or ``forward(batch)`` (decoders: logits at gathered
        positions, with an optional shared prefix).
        """
