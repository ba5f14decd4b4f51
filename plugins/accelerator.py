"""The accelerator contract: where a model can be placed and how to name it.

An accelerator plugin tells the runtime whether its hardware is usable here,
enumerates its devices with their memory and capabilities, maps a device to a
``torch.device`` and to ONNX Runtime execution providers, and names the golden
reference keys a device's answers are compared against.
"""

from __future__ import annotations

import abc
import ast
import glob
import importlib.util
import platform
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # torch is imported by what places a model, not by the plugin API
    import torch

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")
"""Names of plugin objects in every layer: lower-case, digits and underscores."""

DTYPES = ("auto", "float32", "bfloat16", "float16")
"""The ``--dtype`` values; ``auto`` is the precision the model was released in."""

ExecutionProvider = tuple[str, dict[str, Any]]
"""An ONNX Runtime execution provider: its name and its provider options."""


@dataclass(frozen=True)
class DeviceInfo:
    """One device of an accelerator, as enumerated at the time of the call.

    Attributes:
        accelerator: name of the accelerator that owns the device (``cuda``).
        index: device ordinal, or ``None`` for an accelerator with a single
            unnumbered device (``cpu``, ``mps``).
        name: human-readable device name (``NVIDIA H100 80GB HBM3``).
        total_memory_bytes: memory the device has, in bytes, or ``None`` when
            the platform does not say.
        free_memory_bytes: memory free at enumeration time, in bytes, or
            ``None`` when the platform does not say.
        capabilities: JSON-serialisable facts that decide numerics and golden
            keys (ISA, bf16 ``bf16_native``/``bf16_emulated``, LAPACK, compute
            capability, gfx arch, ...).
    """

    accelerator: str
    index: int | None
    name: str
    total_memory_bytes: int | None
    free_memory_bytes: int | None
    capabilities: Mapping[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> str:
        """The device string users type: ``cpu``, ``mps``, ``cuda:1``, ``npu:2``."""
        return self.accelerator if self.index is None else f"{self.accelerator}:{self.index}"

    def to_json(self) -> dict[str, Any]:
        """The device as the ``vllm-srun devices`` JSON object (without keys)."""
        return {
            "device": self.device,
            "accelerator": self.accelerator,
            "name": self.name,
            "total_memory_bytes": self.total_memory_bytes,
            "free_memory_bytes": self.free_memory_bytes,
            "capabilities": dict(self.capabilities),
        }


class Accelerator(abc.ABC):
    """Base class of accelerator plugins.

    Subclasses set :attr:`name` and :attr:`auto_priority` and implement the
    abstract methods. Probing must never raise because hardware or a driver is
    missing: :meth:`available` answers ``False`` instead.

    Class attributes:
        name: the accelerator's name, also the prefix of its device strings and
            of its golden reference keys.
        auto_priority: position in ``--device auto``: accelerators are tried in
            ascending order (the built-ins use rocm 10, cuda 20, cpu 1000);
            ``None`` means the accelerator is only used when named.
        golden_tolerance: the largest absolute difference a golden answer on
            this accelerator's devices may have from the recorded one, when the
            reference file sets none for the device class (its name). The
            default, 1e-3, suits GPUs, whose kernels reduce in an order that
            varies with the launch configuration and TF32/bf16 accumulation; a
            deterministic device should declare less (the CPU: 1e-5, the
            batch-invariance bound of DESIGN §6).
    """

    name: ClassVar[str]
    auto_priority: ClassVar[int | None] = None
    golden_tolerance: ClassVar[float] = 1e-3

    @abc.abstractmethod
    def available(self) -> bool:
        """Whether this process can use the accelerator now; never raises."""

    @abc.abstractmethod
    def devices(self) -> Sequence[DeviceInfo]:
        """The devices of this accelerator, in index order; empty when unavailable."""

    @abc.abstractmethod
    def torch_device(self, index: int | None) -> torch.device:
        """The ``torch.device`` for a device index (``None`` for unnumbered devices)."""

    def host_memory(self, device: DeviceInfo) -> bool:
        """Whether ``device`` computes in host memory, as a CPU does (its models weigh
        on the host's RAM, with no GPU workspace beside them).

        By default whether :meth:`torch_device` is a ``cpu`` device, which imports
        torch; an accelerator that knows without torch overrides it (the ``cpu``
        accelerator answers ``True``, so a model on ONNX Runtime is placed without
        torch).
        """
        return bool(self.torch_device(device.index).type == "cpu")

    def synchronize(self, index: int | None) -> None:  # noqa: B027 - optional hook
        """Wait for queued work on the device to finish; a no-op by default."""

    @abc.abstractmethod
    def hardware_keys(self, device: DeviceInfo) -> Sequence[str]:
        """Golden reference keys of the hardware, most specific first.

        Every key is the accelerator name or starts with ``name + ":"``; the
        last one is the bare name, the device-class fallback.
        """

    def reference_keys(self, device: DeviceInfo, dtype: str = "auto") -> list[str]:
        """Golden reference keys for a device at a dtype, most specific first.

        Args:
            device: a device of this accelerator.
            dtype: one of :data:`DTYPES`; any dtype but ``auto`` is appended to
                every key as ``@<dtype>``, because answers recorded at the
                released precision say nothing about another one.

        Raises:
            ValueError: ``dtype`` is not one of :data:`DTYPES`.
        """
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
        suffix = "" if dtype == "auto" else f"@{dtype}"
        return [key + suffix for key in self.hardware_keys(device)]

    @abc.abstractmethod
    def onnx_providers(self, device: DeviceInfo) -> list[ExecutionProvider]:
        """ONNX Runtime execution providers for the device, preferred first."""

    def weight_format_refusal(self, device: DeviceInfo, weight_format: str) -> str | None:
        """Why ``device`` cannot multiply weights of ``weight_format``, or ``None`` when it can.

        Args:
            device: a device of this accelerator.
            weight_format: one of :data:`WEIGHT_FORMATS` (``fp8``, ``nvfp4``).

        Returns:
            One clause naming the cause (``it is a CPU``, ``compute capability
            8.6``, ``Triton is missing``); the runtime puts it after the
            troubleshooting guide's sentence. By default a device has no
            matrix units for either format.
        """
        return f"{device.device} has no {weight_format.upper()} matrix units"


WEIGHT_FORMATS = {
    "fp8": "FP8 weights need an NVIDIA GPU of compute capability 8.9 or later or an AMD "
    "Instinct MI300 or MI350 series GPU",
    "nvfp4": "NVFP4 packages need FP4 tensor cores; serve NVFP4 packages on a Blackwell GPU",
}
"""Weight formats only some devices multiply, each with the troubleshooting guide's
sentence that refuses a package of it on another device."""


def slug(text: str) -> str:
    """Lower-case ``text`` with every run of other characters made one ``_``.

    Used to turn device names (``Ascend910B2``, ``Intel(R) Data Center GPU Max
    1550``) into golden reference key parts.
    """
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def torch_build() -> dict[str, Any] | None:
    """What the installed PyTorch was built for, without importing it: the values of
    ``torch.version`` (``cuda``, ``hip``, ``xpu``: a version string or ``None``),
    read from ``torch/version.py`` (literal assignments only). ``None`` when torch is
    not installed or the file cannot be read.

    An accelerator's :meth:`Accelerator.available` reads it while torch is not imported,
    so that ``--device auto`` on a machine whose PyTorch cannot reach the device (a CPU
    build, or no driver) does not import torch only to learn that.
    """
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        path = Path(next(iter(spec.submodule_search_locations))) / "version.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, StopIteration, UnicodeDecodeError):
        return None
    found: dict[str, Any] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and value is not None:
            try:
                found[target.id] = ast.literal_eval(value)
            except ValueError:
                continue
    return found


def device_nodes(*patterns: str) -> bool:
    """Whether any path matching one of ``patterns`` (globs such as ``/dev/nvidia[0-9]*``)
    exists: a device's driver is loaded. Always ``True`` off Linux, where the nodes are not
    where these patterns look (torch must answer there)."""
    if platform.system() != "Linux":
        return True
    return any(glob.glob(pattern) for pattern in patterns)


def torch_memory_info(
    backend: Any, index: int, total_fallback: int | None
) -> tuple[int | None, int | None]:
    """Free and total bytes of a torch device through ``backend.mem_get_info``.

    Args:
        backend: a torch device module with ``mem_get_info(index)`` returning
            ``(free_bytes, total_bytes)`` (``torch.cuda``, ``torch.xpu``,
            ``torch.npu``).
        index: device ordinal.
        total_fallback: total bytes from the device properties, used when the
            backend cannot report memory.

    Returns:
        ``(total_bytes, free_bytes)``; either may be ``None`` when unknown.
    """
    try:
        free, total = backend.mem_get_info(index)
    except Exception:
        return total_fallback, None
    return int(total), int(free)


def torch_devices(
    accelerator: str,
    backend: Any,
    capabilities: Callable[[Any, str], dict[str, Any]],
    *,
    name: Callable[[int, Any], str] | None = None,
    optional_properties: bool = False,
) -> list[DeviceInfo]:
    """Every device of a torch device module (``torch.cuda``, ``torch.xpu``, ``torch.npu``),
    the loop GPU accelerators share.

    For each ordinal below ``backend.device_count()``: the device properties
    (``backend.get_device_properties(index)``), its name (``props.name``
    unless ``name(index, props)`` says otherwise), its memory
    (:func:`torch_memory_info`, the properties' ``total_memory`` as the
    fallback total) and ``capabilities(props, name)``.

    Args:
        accelerator: the accelerator's name, as every :class:`DeviceInfo` carries it.
        backend: the torch device module.
        capabilities: the capability facts of one device (golden keys and
            numerics depend on them).
        name: the device name, when the properties do not carry it.
        optional_properties: a device whose properties cannot be read is
            still listed (``props`` is then ``None``, the total unknown);
            otherwise the error propagates.

    Returns:
        The devices in index order.
    """
    found = []
    for index in range(backend.device_count()):
        try:
            props = backend.get_device_properties(index)
        except Exception:
            if not optional_properties:
                raise
            props = None
        label = name(index, props) if name is not None else str(props.name)
        fallback = getattr(props, "total_memory", None)
        total, free = torch_memory_info(backend, index, None if fallback is None else int(fallback))
        found.append(DeviceInfo(accelerator, index, label, total, free, capabilities(props, label)))
    return found
