"""Placement: turn ``--device`` into an accelerator and one of its devices.

The core never names a built-in accelerator: it reads the accelerators layer of
the catalog, so a third-party accelerator is placed exactly like ``cuda``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_srun.plugins import Accelerator, Catalog, DeviceInfo

_DEVICE_SPEC = re.compile(r"^(?P<name>[a-z][a-z0-9_]*)(?::(?P<index>\d+))?$")


class DeviceNotAvailable(Exception):
    """A ``--device`` names no usable device; the message says why and what to do."""


@dataclass(frozen=True)
class Placement:
    """An accelerator and the device of it a model is placed on."""

    accelerator: Accelerator
    device: DeviceInfo


def parse_device_spec(spec: str) -> tuple[str, int | None]:
    """Split ``cuda:1`` into ``("cuda", 1)`` and ``cpu`` into ``("cpu", None)``.

    Raises:
        DeviceNotAvailable: ``spec`` is not ``NAME`` or ``NAME:INDEX``.
    """
    match = _DEVICE_SPEC.match(spec.strip())
    if match is None:
        raise DeviceNotAvailable(
            f"device not available: {spec!r} is not a device; "
            "use auto, or an accelerator with an optional index such as cpu or cuda:1"
        )
    index = match.group("index")
    return match.group("name"), None if index is None else int(index)


def auto_accelerators(accelerators: Mapping[str, Any]) -> list[Accelerator]:
    """Accelerators ``--device auto`` tries, in order: available, with a priority, ascending."""
    ranked = [
        acc
        for acc in accelerators.values()
        if type(acc).auto_priority is not None and _available(acc)
    ]
    return sorted(ranked, key=lambda acc: (type(acc).auto_priority, acc.name))


def auto_order(catalog: Catalog) -> list[str]:
    """The device strings ``--device auto`` tries, in order (``["cuda:0", "cuda:1", "cpu"]``)."""
    return [
        d.device for acc in auto_accelerators(catalog.layer("accelerators")) for d in _devices(acc)
    ]


def place(catalog: Catalog, spec: str = "auto") -> Placement:
    """Resolve a ``--device`` value to a placement.

    Args:
        catalog: the composed plugins.
        spec: ``auto``, an accelerator name (its first device) or ``NAME:INDEX``.

    Raises:
        DeviceNotAvailable: with the operator phrase ``device not available``
            and the fix, when the accelerator is not installed, cannot be used
            here, or has no such index.
    """
    accelerators = catalog.layer("accelerators")
    if spec.strip() == "auto":
        for acc in auto_accelerators(accelerators):
            devices = _devices(acc)
            if devices:
                return Placement(acc, devices[0])
        raise DeviceNotAvailable(
            "device not available: no accelerator that --device auto tries is usable here; "
            "name one with --device or install the right PyTorch build"
        )
    name, index = parse_device_spec(spec)
    acc = accelerators.get(name)
    if acc is None:
        installed = ", ".join(sorted(accelerators)) or "none"
        raise DeviceNotAvailable(
            f"device not available: no accelerator plugin named {name!r} is installed "
            f"(installed: {installed}); see `vllm-srun plugins`"
        )
    if not _available(acc):
        raise DeviceNotAvailable(
            f"device not available: {name} cannot be used on this machine; "
            "use --device auto, or install the PyTorch build for it"
        )
    devices = _devices(acc)
    if index is None:
        if not devices:
            raise DeviceNotAvailable(f"device not available: {name} lists no device")
        return Placement(acc, devices[0])
    for device in devices:
        # An unnumbered device (cpu, mps) also answers to index 0: users type cpu:0.
        if device.index == index or (device.index is None and index == 0):
            return Placement(acc, device)
    listed = ", ".join(d.device for d in devices) or "none"
    raise DeviceNotAvailable(
        f"device not available: {spec} does not exist (this machine has {listed})"
    )


def _available(acc: Accelerator) -> bool:
    try:
        return bool(acc.available())
    except Exception:
        return False


def _devices(acc: Accelerator) -> list[DeviceInfo]:
    try:
        return list(acc.devices())
    except Exception:
        return []
