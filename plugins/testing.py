"""The conformance kit: check one plugin alone against the vllm-srun contracts.

Use it from a plugin's own test suite::

    from vllm_srun.plugins.testing import assert_conforms

    def test_conforms():
        assert_conforms("host")          # an installed entry-point name
        assert_conforms(my_plugin_module)  # or the module itself, before installing

or from the shell: ``vllm-srun plugins check NAME`` (exit status 1 on a
violation). The plugin is registered in a plugin manager of its own with
nothing else, so a check never depends on what else is installed. The kit
checks that the plugin imports, that its hook implementations match the
hookspecs, that every object it registers satisfies its layer's contract with
a name unique in that layer, how accelerators behave when probed, and that
each family serves its own fixture through a surface (with an installed
engine, on the CPU), its ``run`` giving one float32 numpy array per row.

Importing the kit does not import torch; only the check of an accelerator's
``torch_device`` does.
"""

from __future__ import annotations

import functools
import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vllm_srun.plugins.accelerator import DeviceInfo
from vllm_srun.plugins.host.catalog import Catalog, build_catalog
from vllm_srun.plugins.host.discovery import DiscoveredPlugin, discover
from vllm_srun.plugins.loaded import LoadedModel
from vllm_srun.plugins.requests import read_request
from vllm_srun.plugins.spec import RowOutput, undeclared_members


@dataclass
class Finding:
    """The outcome of one check: ``ok`` and what was found; a ``warning`` passes the
    check but says what the plugin loses (it never fails the report)."""

    check: str
    ok: bool
    message: str
    warning: bool = False


@dataclass
class ConformanceReport:
    """Every finding of the kit on one plugin."""

    plugin: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def violations(self) -> list[Finding]:
        """The findings that failed."""
        return [f for f in self.findings if not f.ok]

    @property
    def ok(self) -> bool:
        """Whether the plugin passed every check."""
        return not self.violations

    @property
    def warnings(self) -> list[Finding]:
        """The findings that passed with a warning."""
        return [f for f in self.findings if f.warning]

    def add(self, check: str, ok: bool, message: str, warning: bool = False) -> None:
        """Record one finding."""
        self.findings.append(Finding(check, ok, message, warning and ok))

    def to_json(self) -> dict[str, Any]:
        """The report as JSON: ``{"plugin", "ok", "findings": [{"check", "ok", "warning",
        "message"}]}``."""
        return {
            "plugin": self.plugin,
            "ok": self.ok,
            "findings": [
                {"check": f.check, "ok": f.ok, "warning": f.warning, "message": f.message}
                for f in self.findings
            ],
        }

    def to_text(self) -> str:
        """One line per finding (``ok``, ``WARN`` or ``FAIL``), then a verdict line."""
        lines = [
            f"{'FAIL' if not f.ok else 'WARN' if f.warning else 'ok  '} {f.check}: {f.message}"
            for f in self.findings
        ]
        verdict = "conforms" if self.ok else f"{len(self.violations)} violation(s)"
        if self.ok and self.warnings:
            verdict += f", {len(self.warnings)} warning(s)"
        lines.append(f"plugin {self.plugin}: {verdict}")
        return "\n".join(lines)


def _resolve(
    plugin: str | DiscoveredPlugin | Any, report: ConformanceReport
) -> DiscoveredPlugin | None:
    if isinstance(plugin, DiscoveredPlugin):
        return plugin
    if not isinstance(plugin, str):
        name = getattr(plugin, "__name__", type(plugin).__name__)
        return DiscoveredPlugin(name, name, None, None, plugin)
    # An empty environment: VLLM_SRUN_PLUGINS / _DISABLE_PLUGINS never hide the plugin checked.
    found = discover({}, only=[plugin])
    if len(found) > 1:
        owners = ", ".join(f"{d.distribution} {d.version}" for d in found)
        report.add(
            "entry point", False, f"{plugin!r} is declared by several distributions: {owners}"
        )
        return None
    if found[0].obj is not None:
        report.add("entry point", True, f"{found[0].entry_point} from {found[0].distribution}")
    return found[0]


def check_plugin(plugin: str | DiscoveredPlugin | Any) -> ConformanceReport:
    """Run the conformance kit on one plugin.

    Args:
        plugin: an installed plugin's entry-point name, a
            :class:`~vllm_srun.plugins.host.discovery.DiscoveredPlugin`, or the plugin
            module (or object) itself.

    Returns:
        The report; never raises because the plugin misbehaves.
    """
    label = (
        plugin
        if isinstance(plugin, str)
        else getattr(plugin, "name", None) or getattr(plugin, "__name__", type(plugin).__name__)
    )
    report = ConformanceReport(str(label))
    discovered = _resolve(plugin, report)
    if discovered is None:
        return report
    if discovered.error is not None:
        report.add("import", False, discovered.error)
        return report
    report.add("import", True, f"imported {discovered.entry_point}")

    catalog = build_catalog([discovered])
    record = catalog.plugins[0]
    if record.error is not None:
        report.add("hookspecs", False, record.error)
        return report
    report.add("hookspecs", True, f"implements {', '.join(record.hooks)}")

    for refusal in record.refused:
        report.add(f"contract {refusal.layer}", False, f"{refusal.name}: {refusal.reason}")
    registered = {layer: names for layer, names in record.registered.items() if names}
    if not registered and not record.refused:
        report.add("contracts", False, "its hooks register nothing")
    for layer, names in registered.items():
        report.add(f"contract {layer}", True, ", ".join(sorted(names)))

    _check_behaviour(catalog, report)
    return report


def assert_conforms(plugin: str | DiscoveredPlugin | Any) -> ConformanceReport:
    """Run :func:`check_plugin` and raise ``AssertionError`` listing any violation."""
    report = check_plugin(plugin)
    if not report.ok:
        raise AssertionError(report.to_text())
    return report


def _check_behaviour(catalog: Catalog, report: ConformanceReport) -> None:
    for name, accelerator in catalog.layer("accelerators").items():
        for check, problem in _accelerator_problems(accelerator):
            report.add(f"accelerator {name}: {check}", problem is None, problem or "as specified")
    own_engines = list(catalog.layer("engines").values())
    for name, family in catalog.layer("families").items():
        for check, problem in _family_problems(family, own_engines):
            warning = problem is not None and problem.startswith(WARNING)
            report.add(
                f"family {name}: {check}",
                problem is None or warning,
                (problem or "as specified").removeprefix(WARNING),
                warning=warning,
            )


CPU = DeviceInfo("cpu", None, "cpu", None, None, {})


WARNING = "warning: "
"""Prefix of a family finding that passes with a warning."""


def _family_problems(family: Any, own_engines: list[Any]) -> list[tuple[str, str | None]]:
    """Run the family's own fixture through a surface with an installed engine on the CPU
    (or one the checked plugin registers itself: a family may ship the engine it needs).

    A problem starting with :data:`WARNING` passes with a warning: the model
    works but loses something (no probe rows: no cross-request batching).
    """
    with tempfile.TemporaryDirectory(prefix="vllm-srun-kit-") as tmp:
        try:
            fixture = family.fixture(Path(tmp))
        except Exception as err:
            return [("fixture()", f"raised {type(err).__name__}: {err}")]
        if fixture is None:
            return [("fixture()", "provides no fixture; return (package, surface, request)")]
        package, surface, request = fixture
        steps: list[tuple[str, str | None]] = [("fixture()", None)]
        try:
            if surface not in family.surfaces:
                return [*steps, ("fixture surface", f"{surface!r} is not in surfaces")]
            if not family.detect(package):
                return [*steps, ("detect()", "does not recognise its own fixture")]
            family.verify(package)
            spec = family.describe(package)
            steps.append(("detect, verify, describe", None))
            engine, reasons = _engine_for(spec, own_engines)
            if engine is None:
                return [*steps, ("engine", "no installed engine runs the fixture: " + reasons)]
            kernels = engine.select_kernels(_installed_kernels(), CPU.accelerator)
            engine_model = engine.load(spec, CPU, {"kernels": kernels})
            undeclared = undeclared_members(engine_model)
            if undeclared:
                problem = (
                    f"engine {engine.name}'s model lacks {' and '.join(undeclared)}; declare "
                    "them (vllm_srun.plugins.EncoderModel, DecoderModel)"
                )
                return [*steps, ("engine model", problem)]
            loaded = family.load(package, spec, engine_model)
            if not isinstance(loaded, LoadedModel):
                return [*steps, ("load()", "must return a vllm_srun.plugins.LoadedModel")]
            plan = loaded.plan(surface, read_request(surface, request))
            outputs: list[RowOutput] = list(loaded.run(list(plan.items)))
            wrong = _outputs_problem(outputs, len(plan.items))
            if wrong is not None:
                return [*steps, ("run()", wrong)]
            body = loaded.finish(plan, outputs)
            json.dumps(body, allow_nan=False)
            steps.append((f"{surface} through {engine.name}", None))
            steps.append(
                (
                    "probe_items()",
                    None
                    if loaded.probe_items()
                    else WARNING + "yields no probe rows, so its models never batch rows of "
                    "different requests together (each request runs in forwards of its own); "
                    "return rows of several lengths from probe_items()",
                )
            )
        except Exception as err:
            steps.append(("fixture run", f"raised {type(err).__name__}: {err}"))
        return steps


def _outputs_problem(outputs: list[Any], rows: int) -> str | None:
    """Why ``run``'s ``outputs`` for ``rows`` rows break the contract (one float32 numpy
    array per row, :data:`~vllm_srun.plugins.spec.RowOutput`), or ``None``."""
    if len(outputs) != rows:
        return f"returned {len(outputs)} outputs for {rows} rows; return one per row"
    for index, output in enumerate(outputs):
        if not isinstance(output, np.ndarray) or output.dtype != np.float32:
            kind = (
                f"a {output.dtype} array"
                if isinstance(output, np.ndarray)
                else f"a {type(output).__module__}.{type(output).__qualname__}"
            )
            return (
                f"output {index} is {kind}; each row's output must be a float32 numpy array "
                "(convert an engine's tensors with .float().cpu().numpy())"
            )
    return None


def _installed_kernels() -> list[Any]:
    """Every kernel the installed plugins register (an engine picks its own from them)."""
    return list(build_catalog(discover({})).layer("kernels").values())


def _engine_for(spec: Any, own_engines: list[Any]) -> tuple[Any, str]:
    """The first engine (by ``auto`` order) that accepts ``spec`` on the CPU, among the
    installed ones and ``own_engines`` (the checked plugin's, which win a name they share:
    before it is installed, the plugin's engines are not among the installed ones)."""
    engines = dict(build_catalog(discover({})).layer("engines"))
    engines.update((e.name, e) for e in own_engines)
    ranks = {name: engine.auto_rank(spec, CPU) for name, engine in engines.items()}
    reasons = []
    for _, name in sorted((rank, name) for name, rank in ranks.items() if rank is not None):
        engine = engines[name]
        reason = engine.supports(spec, CPU)
        if reason is None:
            return engine, ""
        reasons.append(f"{engine.name}: {reason}")
    return None, "; ".join(reasons) or "none installed"


def _accelerator_problems(acc: Any) -> list[tuple[str, str | None]]:
    """``(check, problem or None)`` for each behaviour of an accelerator."""
    results: list[tuple[str, str | None]] = []

    def run(check: str, fn: Callable[[], str | None]) -> None:
        try:
            results.append((check, fn()))
        except Exception as err:
            results.append((check, f"raised {type(err).__name__}: {err}"))

    available: list[bool] = []

    def probe() -> str | None:
        value = acc.available()
        if not isinstance(value, bool):
            return f"available() returned {value!r}, not a bool"
        available.append(value)
        return None

    run("available()", probe)
    if not available:
        return results
    devices: list[DeviceInfo] = []

    def enumerate_devices() -> str | None:
        listed = acc.devices()
        if not isinstance(listed, Sequence) or not all(isinstance(d, DeviceInfo) for d in listed):
            return "devices() must return a sequence of DeviceInfo"
        if available[0] and not listed:
            return "available() is True but devices() is empty"
        if not available[0] and listed:
            return "available() is False but devices() lists devices"
        devices.extend(listed)
        return None

    run("devices()", enumerate_devices)
    per_device: tuple[tuple[str, Callable[[Any, DeviceInfo], str | None]], ...] = (
        ("info", _device_problem),
        ("reference_keys", _keys_problem),
        ("torch_device", _torch_device_problem),
        ("onnx_providers", _providers_problem),
    )
    for device in devices:
        for check, problem in per_device:
            run(f"{device.device} {check}", functools.partial(problem, acc, device))
    return results


def _device_problem(acc: Any, device: DeviceInfo) -> str | None:
    if device.accelerator != acc.name:
        return f"device belongs to {device.accelerator!r}, not {acc.name!r}"
    for label, value in (("total", device.total_memory_bytes), ("free", device.free_memory_bytes)):
        if value is not None and (type(value) is not int or value < 0):
            return f"{label}_memory_bytes must be a non-negative int or None, not {value!r}"
    total, free = device.total_memory_bytes, device.free_memory_bytes
    if total is not None and free is not None and free > total:
        return f"free memory {free} exceeds total {total}"
    try:
        json.dumps(device.to_json(), allow_nan=False)
    except (TypeError, ValueError) as err:
        return f"device info is not JSON-serialisable: {err}"
    return None


def _keys_problem(acc: Any, device: DeviceInfo) -> str | None:
    keys = acc.reference_keys(device, "auto")
    if not keys or not all(isinstance(k, str) for k in keys):
        return "reference_keys() must return a non-empty list of strings"
    bad = [k for k in keys if k != acc.name and not k.startswith(acc.name + ":")]
    if bad:
        return f"keys must be {acc.name!r} or start with {acc.name + ':'!r}: {bad}"
    if keys[-1] != acc.name:
        return f"the last key must be the bare name {acc.name!r}, not {keys[-1]!r}"
    if any("@" in k for k in keys):
        return "keys at dtype auto carry no @dtype suffix"
    typed = acc.reference_keys(device, "bfloat16")
    if typed != [k + "@bfloat16" for k in keys]:
        return f"at dtype bfloat16 every key must end in '@bfloat16', got {typed}"
    return None


def _torch_device_problem(acc: Any, device: DeviceInfo) -> str | None:
    import torch  # an accelerator's torch_device is for the native engine: check it with torch

    value = acc.torch_device(device.index)
    if not isinstance(value, torch.device):
        return f"torch_device() returned {value!r}, not a torch.device"
    return None


def _providers_problem(acc: Any, device: DeviceInfo) -> str | None:
    providers = acc.onnx_providers(device)
    if not providers:
        return "onnx_providers() must name at least one execution provider"
    for entry in providers:
        if not (
            isinstance(entry, tuple)
            and len(entry) == 2
            and isinstance(entry[0], str)
            and isinstance(entry[1], dict)
        ):
            return f"each provider must be (name, options dict), got {entry!r}"
    return None


__all__ = [
    "ConformanceReport",
    "Finding",
    "assert_conforms",
    "check_plugin",
]
