"""Placement: turn ``--device`` into an accelerator and one of its devices, and weigh
the model that goes there.

The core never names a built-in accelerator: it reads the accelerators layer of
the catalog, so a third-party accelerator is placed exactly like ``cuda``. The
memory estimates (:func:`model_bytes`, :func:`required_bytes`) follow the
troubleshooting guide: the weights at the served dtype, plus 10%, plus 2 GiB on
a GPU.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_srun.errors import LoadError
from vllm_srun.plugins import Accelerator, DeviceInfo
from vllm_srun.plugins.accelerator import WEIGHT_FORMATS
from vllm_srun.plugins.host import Catalog
from vllm_srun.plugins.spec import ModelSpec

_DEVICE_SPEC = re.compile(r"^(?P<name>[a-z][a-z0-9_]*)(?::(?P<index>\d+))?$")


GIB = 1 << 30
"""Bytes in a GiB: memory is reported in GiB, as ``--memory-budget`` takes it."""


class DeviceNotAvailable(Exception):
    """A ``--device`` names no usable device; the message says why and what to do."""


class NotEnoughMemory(Exception):
    """No device of the placement has the free memory a model needs (a passing cause).

    Attributes:
        need_bytes: what the model needs on the device, in bytes.
        free_bytes: the most free memory a candidate device had, in bytes.
        device: that device's string (``cuda:0``).
    """

    def __init__(self, need_bytes: int, free_bytes: int, device: str) -> None:
        super().__init__(
            f"needs about {gib(need_bytes)} GiB, {gib(free_bytes)} GiB free; out of memory on "
            f"{device}: free memory on it, choose another device with --device, or serve a "
            "smaller model"
        )
        self.need_bytes = need_bytes
        self.free_bytes = free_bytes
        self.device = device


def gib(size: int | float) -> str:
    """``size`` bytes in GiB: two decimals (``0.09``, ``12.50``), two significant
    digits below 0.01 GiB (``0.00031``) so a small model never reads as 0."""
    value = size / GIB
    return f"{value:.2f}" if value >= 0.01 or value == 0 else f"{value:.2g}"


def weight_formats(package: Path) -> list[str]:
    """The :data:`~vllm_srun.plugins.accelerator.WEIGHT_FORMATS` a package's weights use.

    Read from the safetensors headers (``F8_E4M3``/``F8_E5M2`` tensors are FP8) and
    ``config.json``'s ``quantization_config`` (``quant_method: fp8``; any setting
    naming ``nvfp4``, as ModelOpt and compressed-tensors packages do). A package
    whose files cannot be read says nothing here; its loading reports that.
    """
    found: set[str] = set()
    for weights in sorted(package.glob("*.safetensors")):
        try:
            with weights.open("rb") as handle:
                size = int.from_bytes(handle.read(8), "little")
                header = json.loads(handle.read(min(size, MAX_HEADER_BYTES)))
        except (OSError, ValueError):
            continue
        dtypes = {v.get("dtype") for v in header.values() if isinstance(v, dict)}
        if dtypes & {"F8_E4M3", "F8_E5M2"}:
            found.add("fp8")
    try:
        config = json.loads((package / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    quantization = config.get("quantization_config") if isinstance(config, dict) else None
    if isinstance(quantization, dict):
        if str(quantization.get("quant_method", "")).lower() == "fp8":
            found.add("fp8")
        if "nvfp4" in json.dumps(quantization).lower():
            found.add("nvfp4")
    return sorted(found)


MAX_HEADER_BYTES = 100 * 1024 * 1024
"""The largest safetensors header read (the format's own limit is 100 MB)."""


def refuse_weight_formats(package: Path, placement: Placement) -> None:
    """Refuse a package whose weight format the placed device cannot multiply.

    Raises:
        LoadError: the troubleshooting guide's sentence for the format, the
            device's reason, and what to serve instead (not retried).
    """
    for weight_format in weight_formats(package):
        reason = placement.accelerator.weight_format_refusal(placement.device, weight_format)
        if reason is not None:
            instead = "BF16 or int4" if weight_format == "fp8" else "BF16, FP8 or int4"
            raise LoadError(
                f"{WEIGHT_FORMATS[weight_format]} ({placement.device.device}: {reason}). Serve "
                f"it on such a GPU, or serve the {instead} package of the model instead"
            )


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


def place(
    catalog: Catalog,
    spec: str = "auto",
    required: Callable[[Placement], int] | None = None,
) -> Placement:
    """Resolve a ``--device`` value to a placement.

    Args:
        catalog: the composed plugins.
        spec: ``auto``, an accelerator name (its first device) or ``NAME:INDEX``.
        required: bytes a model needs on a candidate placement; a device whose
            free memory is known and below it is not used. Under ``auto`` the
            first usable accelerator's devices are tried in index order (a
            busy GPU makes way for the next GPU, never for another
            accelerator, so a model does not silently move to the CPU).

    Raises:
        DeviceNotAvailable: with the operator phrase ``device not available``
            and the fix, when the accelerator is not installed, cannot be used
            here, or has no such index.
        NotEnoughMemory: ``needs about X GiB, Y GiB free``: no candidate
            device has the memory ``required`` asks for (it may free up).
    """
    accelerators = catalog.layer("accelerators")
    if spec.strip() == "auto":
        for acc in auto_accelerators(accelerators):
            devices = _devices(acc)
            if devices:
                return _fitting([Placement(acc, d) for d in devices], required)
        raise DeviceNotAvailable(
            "device not available: no accelerator that --device auto tries is usable here; "
            "name one with --device or install the right PyTorch build"
        )
    name, index = parse_device_spec(spec)
    named = accelerators.get(name)
    if named is None:
        installed = ", ".join(sorted(accelerators)) or "none"
        raise DeviceNotAvailable(
            f"device not available: no accelerator plugin named {name!r} is installed "
            f"(installed: {installed}); see `vllm-srun plugins`"
        )
    if not _available(named):
        raise DeviceNotAvailable(
            f"device not available: {name} cannot be used on this machine; "
            "use --device auto, or install the PyTorch build for it"
        )
    devices = _devices(named)
    if index is None:
        if not devices:
            raise DeviceNotAvailable(f"device not available: {name} lists no device")
        return _fitting([Placement(named, devices[0])], required)
    for device in devices:
        # An unnumbered device (cpu, mps) also answers to index 0: users type cpu:0.
        if device.index == index or (device.index is None and index == 0):
            return _fitting([Placement(named, device)], required)
    listed = ", ".join(d.device for d in devices) or "none"
    raise DeviceNotAvailable(
        f"device not available: {spec} does not exist (this machine has {listed})"
    )


def _fitting(candidates: list[Placement], required: Callable[[Placement], int] | None) -> Placement:
    """The first candidate with enough free memory (unknown free memory counts as enough).

    Raises:
        NotEnoughMemory: naming the candidate with the most free memory.
    """
    if required is None:
        return candidates[0]
    best: tuple[int, int, Placement] | None = None
    for candidate in candidates:
        need = required(candidate)
        free = candidate.device.free_memory_bytes
        if free is None or free >= need:
            return candidate
        if best is None or free > best[1]:
            best = (need, free, candidate)
    assert best is not None
    raise NotEnoughMemory(best[0], best[1], best[2].device.device)


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


# -- memory estimates ---------------------------------------------------------------------
WEIGHT_OVERHEAD = 0.10
"""Memory a model takes beyond its weights, as a fraction of them ("plus 10%", the
troubleshooting guide's estimate of what a loaded model holds)."""

GPU_WORKSPACE_BYTES = 2 * GIB
"""Free memory a GPU needs beside the weights ("and 2 GiB", the troubleshooting guide):
the caching allocator's activations and kernel workspaces."""

BYTES_PER_ELEMENT = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per weight element at each ``--dtype``."""


def on_cpu(placement: Placement) -> bool:
    """Whether the placement runs on host memory
    (:meth:`~vllm_srun.plugins.Accelerator.host_memory`: by default, whether its torch
    device type is ``cpu``; the ``cpu`` accelerator says so without importing torch)."""
    return placement.accelerator.host_memory(placement.device)


def weight_bytes(spec: ModelSpec, cpu: bool) -> int:
    """Estimated bytes of a model's weights at the dtype it will run at.

    An ONNX graph counts its file size (graphs run at their exported
    precision); safetensors files count their size scaled from the released
    dtype to the one served (``--dtype``; under ``auto``, a float16 release
    runs as float32 on a CPU, as engines serve it there).
    """
    if spec.onnx is not None:
        graph = spec.package / spec.onnx
        return sum(p.stat().st_size for p in [graph, *graph.parent.glob(graph.name + "_data")])
    stored = sum((spec.package / name).stat().st_size for name in spec.weights)
    released = spec.released_dtype
    served = released if spec.dtype == "auto" else spec.dtype
    if cpu and served == "float16":
        served = "float32"
    return stored * BYTES_PER_ELEMENT.get(served, 4) // BYTES_PER_ELEMENT.get(released, 4)


def model_bytes(spec: ModelSpec, cpu: bool) -> int:
    """What a loaded model holds: :func:`weight_bytes` plus :data:`WEIGHT_OVERHEAD`."""
    return int(weight_bytes(spec, cpu) * (1 + WEIGHT_OVERHEAD))


def required_bytes(spec: ModelSpec, placement: Placement) -> int:
    """Free memory a placement needs: :func:`model_bytes`, plus
    :data:`GPU_WORKSPACE_BYTES` on a device that is not the CPU."""
    cpu = on_cpu(placement)
    return model_bytes(spec, cpu) + (0 if cpu else GPU_WORKSPACE_BYTES)


def free_now(placement: Placement) -> int | None:
    """The device's free memory enumerated again (after a failed allocation)."""
    try:
        for device in placement.accelerator.devices():
            if device.device == placement.device.device:
                return device.free_memory_bytes
    except Exception:
        pass
    return placement.device.free_memory_bytes
