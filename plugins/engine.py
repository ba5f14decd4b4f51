"""The engine contract: run a described model on a placed device.

An engine never parses a package format: a family describes the package as a
:class:`~vllm_srun.plugins.spec.ModelSpec`, and the engine reads back hidden
states (encoders) or logits at gathered positions (decoders).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from vllm_srun.plugins.accelerator import DeviceInfo
from vllm_srun.plugins.kernel import Kernel, select_kernel
from vllm_srun.plugins.profiles import EXACT, Profile
from vllm_srun.plugins.spec import DecoderModel, EncoderModel, ModelSpec


class Engine(abc.ABC):
    """Base class of engine plugins.

    Class attributes:
        name: the engine's name, as ``--engine NAME`` selects it.
        auto_priority: position in ``--engine auto``, ascending (the built-in
            ``native`` comes first); ``None`` means only when named.
        kernel_slots: the op slots (``attention``) whose implementation this
            engine takes from the kernel registry; the runtime asks
            :meth:`select_kernels` for them and passes the choice to
            :meth:`load` as ``options["kernels"]``. An engine that runs a
            whole graph (no slots) leaves it empty.
        profiles: the numeric profiles (:class:`~vllm_srun.plugins.Profile`) this
            engine runs, each with what it changes here; ``exact`` by default. The
            runtime passes the chosen one to :meth:`load` as ``options["profile"]``
            (and in ``spec.profile``); a third party adds a profile by declaring it.
    """

    name: ClassVar[str]
    auto_priority: ClassVar[int | None] = None
    kernel_slots: ClassVar[tuple[str, ...]] = ()
    profiles: ClassVar[tuple[Profile, ...]] = (EXACT,)

    def profile(self, name: str) -> Profile | None:
        """The declared profile called ``name``, or ``None`` when this engine has none."""
        return next((p for p in self.profiles if p.name == name), None)

    def auto_rank(self, spec: ModelSpec, device: DeviceInfo) -> int | None:
        """Where ``--engine auto`` tries this engine for ``spec`` on ``device``, ascending.

        ``None`` when the engine runs only when named (its class
        :attr:`auto_priority` is ``None``). Otherwise the ``auto_priority`` of the
        declared profile ``spec.profile`` when that sets one, else the class's.
        Override it when the engine's speed under a profile depends on the device
        (the native engine ranks first under ``max_speed`` where it can compute in
        bfloat16); ties are broken by engine name.
        """
        own = type(self).auto_priority
        if own is None:
            return None
        declared = self.profile(spec.profile)
        return declared.auto_priority if declared and declared.auto_priority is not None else own

    def select_kernels(
        self, kernels: Iterable[Kernel], accelerator: str, profile: str = "exact"
    ) -> dict[str, Kernel]:
        """The implementation of each of :attr:`kernel_slots` on ``accelerator``.

        The default takes, per slot, a bit-exact implementation made for the
        accelerator, else the slot's reference (:func:`select_kernel`); under a
        profile whose ``kernels`` are ``fastest``, a faster one when registered.
        ``profile`` is a profile's name (its kernel policy is looked up in
        :attr:`profiles`; an undeclared name keeps the bit-exact policy).

        Raises:
            LookupError: a slot has no implementation the profile admits.
        """
        available = list(kernels)
        declared = self.profile(profile)
        policy = "exact" if declared is None or declared.kernels == "bit_exact" else "fastest"
        return {
            slot: select_kernel(available, slot, accelerator, policy) for slot in self.kernel_slots
        }

    @abc.abstractmethod
    def supports(self, spec: ModelSpec, device: DeviceInfo) -> str | None:
        """``None`` when the engine can run ``spec`` on ``device``, else the reason it cannot."""

    @abc.abstractmethod
    def load(
        self, spec: ModelSpec, device: DeviceInfo, options: Mapping[str, Any]
    ) -> EncoderModel | DecoderModel:
        """Load ``spec`` onto ``device`` and return an engine model.

        The engine model exposes ``encode(batch)`` (encoders: hidden states or
        graph outputs) and/or ``forward(batch)`` (decoders: logits at gathered
        positions, with an optional shared prefix).
        """
