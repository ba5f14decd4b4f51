import types

import pytest
import torch

from vllm_srun.plugins import Accelerator, DeviceInfo, hookimpl
from vllm_srun.plugins.host import discover
from vllm_srun.plugins.testing import assert_conforms, check_plugin

BUILTINS = sorted(d.name for d in discover({}) if d.distribution == "vllm-srun")


def test_there_are_builtins_to_check():
    assert {"cpu", "cuda", "rocm", "xpu", "npu", "mps"} <= set(BUILTINS)


@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_plugin_conforms_alone(name):
    report = assert_conforms(name)
    checks = [f.check for f in report.findings]
    assert checks[:3] == ["entry point", "import", "hookspecs"]
    assert any(c.startswith("contract ") for c in checks)


def test_the_cpu_plugin_is_exercised_on_its_real_device():
    report = check_plugin("cpu")
    checks = {f.check for f in report.findings}
    assert {"accelerator cpu: cpu reference_keys", "accelerator cpu: cpu onnx_providers"} <= checks


def module_with(acc_factory):
    module = types.ModuleType("kit_subject")

    @hookimpl
    def register_accelerators(register):
        register(acc_factory())

    module.register_accelerators = register_accelerators
    return module


class Misnamed(Accelerator):
    name = "misnamed"

    def available(self):
        return True

    def devices(self):
        return [DeviceInfo("other", 0, "x", 5, 9, {})]

    def torch_device(self, index):
        return "cpu"

    def hardware_keys(self, device):
        return ["misnamed", "wrong:prefix"]

    def onnx_providers(self, device):
        return ["CPUExecutionProvider"]


def test_the_kit_finds_each_behaviour_violation():
    report = check_plugin(module_with(Misnamed))
    assert not report.ok
    problems = {f.check: f.message for f in report.violations}
    assert problems == {
        "accelerator misnamed: other:0 info": "device belongs to 'other', not 'misnamed'",
        "accelerator misnamed: other:0 reference_keys": (
            "keys must be 'misnamed' or start with 'misnamed:': ['wrong:prefix']"
        ),
        "accelerator misnamed: other:0 torch_device": (
            "torch_device() returned 'cpu', not a torch.device"
        ),
        "accelerator misnamed: other:0 onnx_providers": (
            "each provider must be (name, options dict), got 'CPUExecutionProvider'"
        ),
    }
    with pytest.raises(AssertionError, match="4 violation"):
        assert_conforms(module_with(Misnamed))


class Empty(Misnamed):
    name = "empty"

    def devices(self):
        return []


class Raising(Misnamed):
    name = "raising"

    def available(self):
        raise RuntimeError("probe crashed")


def test_available_without_devices_and_raising_probes_are_violations():
    [empty] = check_plugin(module_with(Empty)).violations
    assert empty.message == "available() is True but devices() is empty"
    [raising] = check_plugin(module_with(Raising)).violations
    assert raising.message == "raised RuntimeError: probe crashed"


def test_free_memory_above_total_is_a_violation():
    class Leaky(Misnamed):
        name = "leaky"

        def devices(self):
            return [DeviceInfo("leaky", None, "x", 5, 9, {})]

        def hardware_keys(self, device):
            return ["leaky"]

        def torch_device(self, index):
            return torch.device("cpu")

        def onnx_providers(self, device):
            return [("CPUExecutionProvider", {})]

    [finding] = check_plugin(module_with(Leaky)).violations
    assert finding.message == "free memory 9 exceeds total 5"


def test_a_plugin_without_hooks_and_an_unknown_name_fail():
    assert check_plugin(types.ModuleType("nothing")).violations[0].message == (
        "nothing implements no vllm_srun hook; mark functions with @hookimpl from vllm_srun.plugins"
    )
    report = check_plugin("no_such_plugin")
    assert not report.ok
    assert (
        "no distribution declares a plugin named 'no_such_plugin'" in report.violations[0].message
    )


def test_the_kit_ignores_the_environment_filters(monkeypatch):
    monkeypatch.setenv("VLLM_SRUN_DISABLE_PLUGINS", "cpu")
    assert check_plugin("cpu").ok


def test_the_kit_checks_one_plugin_alone(make_distribution):
    """A clash elsewhere in the environment does not affect the plugin checked."""
    from ..conftest import accelerator_source

    make_distribution("twin-one", "twin_one", accelerator_source("twin"))
    make_distribution("twin-two", "twin_two", accelerator_source("twin"))
    assert check_plugin("twin_one").ok


def test_a_family_whose_models_give_no_probe_rows_passes_with_a_warning():
    from vllm_srun.families.task_heads import TaskHeadsFamily

    class Unprobed(TaskHeadsFamily):
        name = "unprobed"

        def load(self, package, spec, engine_model):
            model = super().load(package, spec, engine_model)
            model.probe_items = list  # no rows: the probes cannot vouch for batching
            return model

    module = types.ModuleType("unprobed_family")

    @hookimpl
    def register_families(register):
        register(Unprobed())

    module.register_families = register_families
    report = check_plugin(module)
    assert report.ok and not report.violations
    [warning] = report.warnings
    assert warning.check == "family unprobed: probe_items()"
    assert warning.message.startswith("yields no probe rows, so its models never batch rows")
    assert "WARN family unprobed: probe_items()" in report.to_text()
    assert report.to_text().endswith("plugin unprobed_family: conforms, 1 warning(s)")
    assert check_plugin("task_heads").warnings == []


def test_a_family_runs_its_fixture_through_an_engine_its_own_plugin_registers():
    """A family for a model no installed engine runs ships its engine: the kit checks the
    two together before the plugin is installed (its engine is not an installed one)."""
    import dataclasses

    from vllm_srun.engines.native import NativeEngine
    from vllm_srun.families.task_heads import TaskHeadsFamily

    class Custom(TaskHeadsFamily):
        name = "custom_family"

        def describe(self, package):
            return dataclasses.replace(super().describe(package), model_type="custom_bert")

    class CustomEngine(NativeEngine):
        name = "custom_engine"
        auto_priority = 99

        def supports(self, spec, device):
            if spec.model_type not in ("custom_bert", "bert"):  # load hands native a bert spec
                return "custom_engine runs custom_bert only"
            return super().supports(dataclasses.replace(spec, model_type="bert"), device)

        def load(self, spec, device, options):
            return super().load(dataclasses.replace(spec, model_type="bert"), device, options)

    module = types.ModuleType("custom_family_plugin")

    @hookimpl
    def register_families(register):
        register(Custom())

    @hookimpl
    def register_engines(register):
        register(CustomEngine())

    module.register_families = register_families
    module.register_engines = register_engines
    report = check_plugin(module)
    assert report.ok, report.to_text()
    assert "ok   family custom_family: classify through custom_engine: as specified" in (
        report.to_text()
    )


def test_an_engine_model_that_does_not_declare_its_members_fails_the_kit():
    """An engine model declares ``compute_dtype`` and ``libraries`` (the card's dtype and
    the forward-cost cache key read them); the kit names what is missing."""
    import dataclasses

    from vllm_srun.engines.native import NativeEngine
    from vllm_srun.families.task_heads import TaskHeadsFamily

    class Bare:  # encodes, and declares nothing else
        def __init__(self, inner):
            self.inner = inner

        def encode(self, batch):
            return self.inner.encode(batch)

    class Custom(TaskHeadsFamily):
        name = "bare_family"

        def describe(self, package):
            return dataclasses.replace(super().describe(package), model_type="bare_bert")

    class BareEngine(NativeEngine):
        name = "bare_engine"
        auto_priority = 99

        def supports(self, spec, device):
            if spec.model_type not in ("bare_bert", "bert"):
                return "bare_engine runs bare_bert only"
            return super().supports(dataclasses.replace(spec, model_type="bert"), device)

        def load(self, spec, device, options):
            return Bare(super().load(dataclasses.replace(spec, model_type="bert"), device, options))

    module = types.ModuleType("bare_engine_plugin")

    @hookimpl
    def register_families(register):
        register(Custom())

    @hookimpl
    def register_engines(register):
        register(BareEngine())

    module.register_families = register_families
    module.register_engines = register_engines
    report = check_plugin(module)
    assert not report.ok
    assert (
        "FAIL family bare_family: engine model: engine bare_engine's model lacks compute_dtype "
        "and libraries; declare them (vllm_srun.plugins.EncoderModel, DecoderModel)"
    ) in report.to_text()


def test_a_family_whose_run_gives_tensors_not_numpy_arrays_fails_the_kit():
    """Every row output a family's ``run`` gives is a float32 numpy array (RowOutput): an
    engine model that hands back torch tensors, or float64 arrays, is named."""
    import dataclasses

    import numpy as np

    from vllm_srun.engines.native import NativeEngine
    from vllm_srun.families.task_heads import TaskHeadsFamily

    class Wrapped:
        compute_dtype = "float32"
        libraries = ("torch",)

        def __init__(self, inner, convert):
            self.inner, self.convert = inner, convert

        def encode(self, batch):
            return self.convert(self.inner.encode(batch))

    def plugin(convert, name):
        class Custom(TaskHeadsFamily):
            def describe(self, package):
                return dataclasses.replace(super().describe(package), model_type=f"{name}_bert")

        Custom.name = f"{name}_family"

        class WrappingEngine(NativeEngine):
            auto_priority = 99

            def supports(self, spec, device):
                if spec.model_type not in (f"{name}_bert", "bert"):
                    return f"{name}_engine runs {name}_bert only"
                return super().supports(dataclasses.replace(spec, model_type="bert"), device)

            def load(self, spec, device, options):
                inner = super().load(dataclasses.replace(spec, model_type="bert"), device, options)
                return Wrapped(inner, convert)

        WrappingEngine.name = f"{name}_engine"
        module = types.ModuleType(f"{name}_plugin")

        @hookimpl
        def register_families(register):
            register(Custom())

        @hookimpl
        def register_engines(register):
            register(WrappingEngine())

        module.register_families = register_families
        module.register_engines = register_engines
        return module

    report = check_plugin(plugin(torch.from_numpy, "tensor"))
    assert not report.ok
    assert (
        "FAIL family tensor_family: run(): output 0 is a torch.Tensor; each row's output must "
        "be a float32 numpy array (convert an engine's tensors with .float().cpu().numpy())"
    ) in report.to_text()
    wide = check_plugin(plugin(lambda out: out.astype(np.float64), "wide"))
    assert "FAIL family wide_family: run(): output 0 is a float64 array;" in wide.to_text()
    assert check_plugin(plugin(lambda out: out, "plain")).ok
