import types

import torch

from vllm_srun.plugins import Accelerator, DeviceInfo, DiscoveredPlugin, build_catalog, hookimpl


def make_accelerator(acc_name, priority=None):
    class Fake(Accelerator):
        name = acc_name
        auto_priority = priority

        def available(self):
            return True

        def devices(self):
            return [DeviceInfo(acc_name, None, "fake", 1, 1, {})]

        def torch_device(self, index):
            return torch.device("cpu")

        def hardware_keys(self, device):
            return [acc_name]

        def onnx_providers(self, device):
            return [("CPUExecutionProvider", {})]

    return Fake()


def plugin(name, *objects, dist="dist", hook="register_accelerators", error=None):
    module = types.ModuleType(f"plugin_{name}")

    def register_things(register):
        for obj in objects:
            register(obj() if callable(obj) and not isinstance(obj, Accelerator) else obj)

    register_things.__name__ = hook
    setattr(module, hook, hookimpl(register_things))
    return DiscoveredPlugin(name, f"plugin_{name}", dist, "1.0", None if error else module, error)


def test_objects_are_attributed_to_the_plugin_that_registered_them():
    catalog = build_catalog(
        [plugin("a", make_accelerator("alpha")), plugin("b", make_accelerator("beta"))]
    )
    assert sorted(catalog.layer("accelerators")) == ["alpha", "beta"]
    records = {p.name: p for p in catalog.plugins}
    assert records["a"].registered["accelerators"] == ["alpha"]
    assert records["a"].hooks == ["register_accelerators"]
    assert catalog.owner("accelerators", "beta") is records["b"]
    assert catalog.clashes == []


def test_same_name_from_two_distributions_is_a_clash_and_neither_is_used():
    first, second = make_accelerator("gpu"), make_accelerator("gpu")
    catalog = build_catalog(
        [
            plugin("one", first, dist="dist-one"),
            plugin("two", second, dist="dist-two"),
            plugin("three", make_accelerator("other"), dist="dist-three"),
        ]
    )
    assert "gpu" not in catalog.layer("accelerators")
    assert "other" in catalog.layer("accelerators")
    [clash] = catalog.clashes
    assert clash.to_json() == {
        "layer": "accelerators",
        "name": "gpu",
        "plugins": [
            {"name": "one", "distribution": "dist-one"},
            {"name": "two", "distribution": "dist-two"},
        ],
    }
    records = {p.name: p for p in catalog.plugins}
    assert records["one"].registered["accelerators"] == []
    [refusal] = records["one"].refused
    assert refusal.reason == "clash: also registered by two (dist-two 1.0); neither is used"
    assert (
        records["two"].refused[0].reason
        == "clash: also registered by one (dist-one 1.0); neither is used"
    )


def test_an_object_breaking_its_contract_is_refused_with_the_reason():
    catalog = build_catalog(
        [plugin("bad", object(), make_accelerator("Bad-Name"), make_accelerator("fine"))]
    )
    record = catalog.plugins[0]
    assert record.registered["accelerators"] == ["fine"]
    reasons = [r.reason for r in record.refused]
    assert reasons[0] == "object is not an instance of vllm_srun.plugins.accelerator.Accelerator"
    assert reasons[1] == "accelerator name 'Bad-Name' must match ^[a-z][a-z0-9_]*$"


def test_a_bool_is_not_an_auto_priority():
    catalog = build_catalog([plugin("p", make_accelerator("acc", priority=True))])
    assert (
        catalog.plugins[0].refused[0].reason
        == "accelerator auto_priority must be an int or None, not True"
    )


def test_a_name_registered_twice_by_one_plugin_keeps_the_first():
    catalog = build_catalog([plugin("p", make_accelerator("twice"), make_accelerator("twice"))])
    record = catalog.plugins[0]
    assert record.registered["accelerators"] == ["twice"]
    assert record.refused[0].reason == "accelerators name 'twice' registered twice by this plugin"


def test_a_hook_that_raises_loses_only_its_own_objects():
    def explode():
        raise RuntimeError("driver missing")

    catalog = build_catalog([plugin("boom", explode), plugin("ok", make_accelerator("fine"))])
    records = {p.name: p for p in catalog.plugins}
    assert (
        records["boom"].refused[0].reason
        == "register_accelerators raised RuntimeError: driver missing"
    )
    assert list(catalog.layer("accelerators")) == ["fine"]


def test_an_unknown_hook_is_a_plugin_error():
    catalog = build_catalog([plugin("typo", make_accelerator("x"), hook="register_acelerators")])
    record = catalog.plugins[0]
    assert record.error.startswith("implements unknown hook 'register_acelerators'; the hooks are ")
    assert catalog.layer("accelerators") == {}


def test_a_hookimpl_with_arguments_the_spec_lacks_is_a_plugin_error():
    module = types.ModuleType("wrong_args")

    @hookimpl
    def register_accelerators(register, extra):
        pass

    module.register_accelerators = register_accelerators
    catalog = build_catalog([DiscoveredPlugin("wrong", "wrong_args", "d", "1", module)])
    assert catalog.plugins[0].error.startswith("PluginValidationError")
    assert "extra" in catalog.plugins[0].error


def test_a_failed_import_stays_an_error_and_contributes_nothing():
    catalog = build_catalog(
        [plugin("gone", error="ImportError: nope"), plugin("ok", make_accelerator("fine"))]
    )
    records = {p.name: p for p in catalog.plugins}
    assert records["gone"].error == "ImportError: nope"
    assert records["gone"].hooks == []
    assert list(catalog.layer("accelerators")) == ["fine"]


def test_one_plugin_name_from_two_distributions_loads_neither():
    catalog = build_catalog(
        [
            plugin("same", make_accelerator("a"), dist="x"),
            plugin("same", make_accelerator("b"), dist="y"),
        ]
    )
    errors = sorted(p.error for p in catalog.plugins)
    assert errors == [
        "plugin name 'same' is also declared by same (x 1.0); neither is used",
        "plugin name 'same' is also declared by same (y 1.0); neither is used",
    ]
    assert catalog.layer("accelerators") == {}


def test_composition_is_idempotent():
    plugins = [plugin("a", make_accelerator("alpha"))]
    assert build_catalog(plugins).to_json() == build_catalog(plugins).to_json()


def test_json_shape_of_a_plugin_record():
    catalog = build_catalog([plugin("a", make_accelerator("alpha"))])
    assert catalog.to_json() == {
        "plugins": [
            {
                "name": "a",
                "distribution": "dist",
                "version": "1.0",
                "entry_point": "plugin_a",
                "hooks": ["register_accelerators"],
                "registered": {
                    "families": [],
                    "engines": [],
                    "accelerators": ["alpha"],
                    "kernels": [],
                    "golden_references": [],
                    "models": [],
                    "surface_extensions": [],
                },
                "refused": [],
                "error": None,
            }
        ],
        "clashes": [],
    }
