"""Kernels: named op slots with a pure-torch reference and faster implementations.

Each implementation is marked bit-exact or not. The default ``exact`` profile
selects only bit-exact implementations, so the answer a model gives never
depends on which accelerator library happens to be installed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from vllm_srun.plugins.accelerator import NAME_PATTERN

PROFILES = ("exact", "fastest")
"""Kernel selection policies: ``exact`` admits bit-exact implementations only;
``fastest`` prefers an implementation that is not the reference (a fused kernel),
made for the accelerator first, and falls back to the reference."""


@dataclass(frozen=True)
class Kernel:
    """One implementation of an op slot.

    Attributes:
        slot: the op slot (``attention``).
        name: the implementation's name within the slot (``eager``, ``sdpa``).
        implementation: the callable itself, or an engine-specific token (for
            example a transformers ``attn_implementation`` string).
        bit_exact: whether it equals the slot's reference bit for bit.
        reference: whether it is the slot's pure-torch reference (runs on every
            accelerator and is bit-exact by definition).
        accelerators: accelerators it runs on; empty means every one.
    """

    slot: str
    name: str
    implementation: Callable[..., Any] | str
    bit_exact: bool
    reference: bool = False
    accelerators: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """The kernel's registry name, ``<slot>.<name>``."""
        return f"{self.slot}.{self.name}"

    def runs_on(self, accelerator: str) -> bool:
        """Whether the implementation runs on the named accelerator."""
        return not self.accelerators or accelerator in self.accelerators


def kernel_violations(kernel: Kernel) -> list[str]:
    """Reasons ``kernel`` breaks the kernel contract (empty when it conforms)."""
    problems = []
    for part in ("slot", "name"):
        value = getattr(kernel, part)
        if not isinstance(value, str) or not NAME_PATTERN.match(value):
            problems.append(f"kernel {part} {value!r} must match {NAME_PATTERN.pattern}")
    if type(kernel.bit_exact) is not bool or type(kernel.reference) is not bool:
        problems.append("kernel bit_exact and reference must be bools")
    if not isinstance(kernel.accelerators, tuple) or not all(
        type(a) is str for a in kernel.accelerators
    ):
        problems.append("kernel accelerators must be a tuple of accelerator names")
    if not (callable(kernel.implementation) or isinstance(kernel.implementation, str)):
        problems.append("kernel implementation must be a callable or a string")
    if kernel.reference and (not kernel.bit_exact or kernel.accelerators):
        problems.append("a reference kernel must be bit_exact and run on every accelerator")
    return problems


def select_kernel(
    kernels: Iterable[Kernel], slot: str, accelerator: str, profile: str = "exact"
) -> Kernel:
    """Choose the implementation of ``slot`` to run on ``accelerator``.

    Under ``exact`` the choice is a bit-exact implementation made for this
    accelerator when one exists, else the slot's reference. Under ``fastest``
    it is a non-reference implementation (one made for this accelerator first,
    then one for every accelerator, by name), else the reference.

    Raises:
        ValueError: ``profile`` is unknown.
        LookupError: the slot has no implementation that the profile admits.
    """
    if profile not in PROFILES:
        raise ValueError(f"unknown kernel profile {profile!r}; use one of {', '.join(PROFILES)}")
    if profile == "fastest":
        faster = [
            k for k in kernels if k.slot == slot and k.runs_on(accelerator) and not k.reference
        ]
        if faster:
            return min(faster, key=lambda k: (not k.accelerators, k.name))
    candidates = [k for k in kernels if k.slot == slot and k.runs_on(accelerator) and k.bit_exact]
    specific = sorted((k for k in candidates if k.accelerators), key=lambda k: k.name)
    if specific:
        return specific[0]
    for kernel in candidates:
        if kernel.reference:
            return kernel
    raise LookupError(f"no bit-exact {slot!r} kernel for accelerator {accelerator!r}")
