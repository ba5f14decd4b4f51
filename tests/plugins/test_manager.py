import types

import torch

from vllm_srun.plugins import Accelerator, DeviceInfo, hookimpl
from vllm_srun.plugins.host import DiscoveredPlugin, build_catalog


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


HOOKS = (
    "register_families, register_engines, register_accelerators, register_kernels, "
    "register_golden_references, register_models, register_surface_extensions"
)


def by_name(catalog):
    return {p.name: p for p in catalog.plugins}


def test_a_twin_that_failed_to_import_still_makes_the_healthy_one_a_clash():
    catalog = build_catalog(
        [
            plugin("same", make_accelerator("a"), dist="healthy"),
            plugin("same", dist="broken", error="ImportError: no module named torch_xpu"),
        ]
    )
    healthy, broken = catalog.plugins
    assert healthy.error == (
        "plugin name 'same' is also declared by same (broken 1.0); neither is used"
    )
    assert broken.error == "ImportError: no module named torch_xpu"  # its own failure, kept
    assert healthy.hooks == [] and healthy.registered["accelerators"] == []
    assert catalog.layer("accelerators") == {}


def test_plugins_listing_names_both_twins_when_one_failed_to_import():
    from io import StringIO

    from vllm_srun.cli import run_plugins

    catalog = build_catalog(
        [
            plugin("same", make_accelerator("a"), dist="healthy"),
            plugin("same", dist="broken", error="ImportError: nope"),
        ]
    )
    out = StringIO()
    assert run_plugins(catalog, as_json=False, out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[1].split() == [
        "same", "healthy", "1.0", "-", "error:", "plugin", "name", "'same'", "is", "also",
        "declared", "by", "same", "(broken", "1.0);", "neither", "is", "used",
    ]  # fmt: skip
    assert lines[2].split() == ["same", "broken", "1.0", "-", "error:", "ImportError:", "nope"]


def test_each_twin_names_the_others_and_not_itself():
    catalog = build_catalog(
        [
            plugin("same", make_accelerator("a"), dist="x"),
            plugin("same", make_accelerator("b"), dist="y"),
            plugin("same", make_accelerator("c"), dist="z"),
        ]
    )
    errors = {p.distribution: p.error for p in catalog.plugins}
    assert errors == {
        "x": "plugin name 'same' is also declared by same (y 1.0), same (z 1.0); neither is used",
        "y": "plugin name 'same' is also declared by same (x 1.0), same (z 1.0); neither is used",
        "z": "plugin name 'same' is also declared by same (x 1.0), same (y 1.0); neither is used",
    }
    assert catalog.layer("accelerators") == {}


def test_a_clash_of_three_refuses_the_name_in_each_naming_the_other_two():
    catalog = build_catalog(
        [plugin(n, make_accelerator("gpu"), dist=f"dist-{n}") for n in ("one", "two", "three")]
    )
    [clash] = catalog.clashes
    assert [p.name for p in clash.plugins] == ["one", "two", "three"]
    refusals = {p.name: p.refused for p in catalog.plugins}
    assert refusals["two"][0].to_json() == {
        "layer": "accelerators",
        "name": "gpu",
        "reason": "clash: also registered by one (dist-one 1.0), three (dist-three 1.0); "
        "neither is used",
    }
    assert [r.reason for r in refusals["one"]] == [
        "clash: also registered by two (dist-two 1.0), three (dist-three 1.0); neither is used"
    ]
    assert catalog.owner("accelerators", "gpu") is None


def test_refusals_appear_in_the_json_listing():
    catalog = build_catalog([plugin("bad", make_accelerator("Bad-Name"))])
    assert catalog.to_json()["plugins"][0]["refused"] == [
        {
            "layer": "accelerators",
            "name": "Bad-Name",
            "reason": "accelerator name 'Bad-Name' must match ^[a-z][a-z0-9_]*$",
        }
    ]


def test_owner_of_an_unknown_layer_or_name_is_none():
    catalog = build_catalog([plugin("a", make_accelerator("alpha"))])
    assert catalog.owner("no_such_layer", "alpha") is None
    assert catalog.owner("accelerators", "beta") is None
    assert catalog.owner("accelerators", "alpha").name == "a"


def test_a_plugin_failing_validation_does_not_stop_the_next_from_registering():
    module = types.ModuleType("wrong_args")

    @hookimpl
    def register_accelerators(register, extra):
        pass

    module.register_accelerators = register_accelerators
    catalog = build_catalog(
        [
            DiscoveredPlugin("aaa_wrong", "wrong_args", "d", "1", module),
            plugin("ok", make_accelerator("fine")),
        ]
    )
    records = by_name(catalog)
    assert records["aaa_wrong"].error.startswith("PluginValidationError")
    assert records["ok"].error is None
    assert list(catalog.layer("accelerators")) == ["fine"]


def test_an_unknown_hook_message_lists_every_hook():
    catalog = build_catalog([plugin("typo", make_accelerator("x"), hook="register_acelerators")])
    assert catalog.plugins[0].error == (
        f"implements unknown hook 'register_acelerators'; the hooks are {HOOKS}"
    )


def test_every_problem_of_a_plugin_is_listed():
    module = types.ModuleType("three_problems")

    @hookimpl(wrapper=True)
    def register_accelerators(register):
        return (yield)

    @hookimpl
    def register_gpus(register):
        pass

    @hookimpl
    def register_tpus(register):
        pass

    module.register_accelerators = register_accelerators
    module.register_gpus = register_gpus
    module.register_tpus = register_tpus
    catalog = build_catalog([DiscoveredPlugin("three", "three_problems", "d", "1", module)])
    assert catalog.plugins[0].error == (
        "register_accelerators is a hook wrapper; implement it as a plain hook; "
        f"implements unknown hook 'register_gpus'; the hooks are {HOOKS}; "
        f"implements unknown hook 'register_tpus'; the hooks are {HOOKS}"
    )
    assert catalog.layer("accelerators") == {}


def test_a_hook_that_is_a_generator_or_async_is_a_plugin_error():
    generator = types.ModuleType("generator")
    asynchronous = types.ModuleType("asynchronous")

    @hookimpl
    def register_accelerators(register):
        yield register(make_accelerator("gen"))

    generator.register_accelerators = register_accelerators

    @hookimpl(specname="register_accelerators")
    async def register_async(register):
        register(make_accelerator("async"))

    asynchronous.register_async = register_async
    catalog = build_catalog(
        [
            plugin("aaa_first", make_accelerator("fine")),  # registered first: checked past it
            DiscoveredPlugin("generator", "generator", "d", "1", generator),
            DiscoveredPlugin("asynchronous", "asynchronous", "d", "1", asynchronous),
        ]
    )
    records = by_name(catalog)
    message = "register_accelerators must be a plain function, not a generator or async"
    assert records["generator"].error == message
    assert records["asynchronous"].error == message
    assert list(catalog.layer("accelerators")) == ["fine"]


def test_a_hook_wrapper_after_a_plain_plugin_is_still_an_error():
    wrapper = types.ModuleType("wrapping")

    @hookimpl(hookwrapper=True)
    def register_accelerators(register):
        yield

    wrapper.register_accelerators = register_accelerators
    catalog = build_catalog(
        [
            plugin("aaa_first", make_accelerator("fine")),
            DiscoveredPlugin("wrapping", "wrapping", "d", "1", wrapper),
        ]
    )
    assert by_name(catalog)["wrapping"].error == (
        "register_accelerators is a hook wrapper; implement it as a plain hook"
    )
    assert list(catalog.layer("accelerators")) == ["fine"]


def test_a_plugin_without_hooks_is_named_by_its_entry_point_else_by_its_name():
    empty = types.ModuleType("empty")
    catalog = build_catalog(
        [
            DiscoveredPlugin("with_target", "pkg.empty", "d", "1", empty),
            DiscoveredPlugin("no_target", "", "d", "1", empty),
        ]
    )
    hint = "implements no vllm_srun hook; mark functions with @hookimpl from vllm_srun.plugins"
    records = by_name(catalog)
    assert records["with_target"].error == f"pkg.empty {hint}"
    assert records["no_target"].error == f"no_target {hint}"


def test_load_catalog_reads_the_plugin_filter_from_the_environment_it_is_given(monkeypatch):
    from vllm_srun.plugins.host import load_catalog

    monkeypatch.delenv("VLLM_SRUN_PLUGINS", raising=False)
    monkeypatch.delenv("VLLM_SRUN_DISABLE_PLUGINS", raising=False)
    catalog = load_catalog({"VLLM_SRUN_PLUGINS": "cpu"})
    assert [p.name for p in catalog.plugins] == ["cpu"]
    assert list(catalog.layer("accelerators")) == ["cpu"]
