"""Hostile and odd plugins: each is reported, none crashes composition or hides another."""

import types

import pytest
import torch

from vllm_srun.plugins import Accelerator, GoldenReference, Kernel, ModelEntry, hookimpl
from vllm_srun.plugins.host import DiscoveredPlugin, build_catalog, discover

from .test_manager import make_accelerator, plugin


def by_name(catalog):
    return {p.name: p for p in catalog.plugins}


def test_a_name_that_raises_or_is_not_a_str_is_refused():
    class Raising(type(make_accelerator("x"))):
        @property
        def name(self):
            raise RuntimeError("no name")

    listy = make_accelerator("listy")
    listy.name = ["x"]
    shouty = make_accelerator("quiet")
    shouty.name = "CPU!! Bad Name"
    catalog = build_catalog([plugin("p", Raising(), listy, shouty, make_accelerator("fine"))])
    record = by_name(catalog)["p"]
    assert record.registered["accelerators"] == ["fine"]
    reasons = [r.reason for r in record.refused]
    assert reasons == [
        "malformed: checking it raised RuntimeError: no name",
        "accelerator name ['x'] must match ^[a-z][a-z0-9_]*$",
        "accelerator name 'CPU!! Bad Name' must match ^[a-z][a-z0-9_]*$",
    ]


def test_a_virtual_subclass_without_the_attributes_is_refused():
    class Pretender:
        name = "pretender"

    Accelerator.register(Pretender)
    catalog = build_catalog([plugin("p", Pretender())])
    assert catalog.layer("accelerators") == {}
    [refusal] = catalog.plugins[0].refused
    assert refusal.name == "pretender"
    assert refusal.reason == (
        "missing methods of Accelerator: available, devices, hardware_keys, onnx_providers, "
        "torch_device"
    )


def test_malformed_data_objects_are_refused_not_raised():
    golden = GoldenReference("m", ({},), None, {})  # type: ignore[arg-type]
    model = ModelEntry("m", "f", 5, {"w": "x"}, "mit")  # type: ignore[arg-type]
    catalog = build_catalog(
        [
            plugin("g", golden, hook="register_golden_references"),
            plugin("m", model, hook="register_models"),
        ]
    )
    records = by_name(catalog)
    assert (
        records["g"].refused[0].reason == "golden reference answers and tolerances must be mappings"
    )
    assert (
        records["m"].refused[0].reason.startswith("revision must be a 40-hex commit string, not 5")
    )


def test_system_exit_in_a_hook_is_a_refusal():
    def leave():
        raise SystemExit(4)

    catalog = build_catalog([plugin("quitter", leave), plugin("ok", make_accelerator("fine"))])
    assert (
        by_name(catalog)["quitter"].refused[0].reason
        == "register_accelerators raised SystemExit: 4"
    )
    assert list(catalog.layer("accelerators")) == ["fine"]


def test_a_hostile_plugin_object_does_not_break_its_neighbours():
    class Hostile:
        def __eq__(self, other):
            if other is self:
                return True
            raise RuntimeError("eq")

        __hash__ = object.__hash__

        @hookimpl
        def register_accelerators(self, register):
            register(make_accelerator("hostile"))

    catalog = build_catalog(
        [
            DiscoveredPlugin("aaa", "x:Hostile", "d", "1", Hostile()),
            plugin("ok", make_accelerator("fine")),
        ]
    )
    assert sorted(catalog.layer("accelerators")) == ["fine", "hostile"]
    assert all(p.error is None for p in catalog.plugins)


def test_a_module_declared_twice_is_a_clash_not_a_blamed_builtin():
    [cpu] = discover({}, only=["cpu"])
    copy = DiscoveredPlugin("aa_dupcpu", cpu.entry_point, "hostile", "1", cpu.obj)
    catalog = build_catalog([copy, cpu])
    assert all(p.error is None for p in catalog.plugins)
    [clash] = catalog.clashes
    assert (clash.name, [p.name for p in clash.plugins]) == ("cpu", ["aa_dupcpu", "cpu"])


@pytest.mark.parametrize(
    ("source", "error"),
    [
        ("raise SystemExit(3)\n", "SystemExit: 3"),
        ("assert False, 'boom'\n", "AssertionError: boom"),
        ("raise GeneratorExit('odd')\n", "GeneratorExit: odd"),
    ],
)
def test_base_exceptions_at_import_are_import_errors(make_distribution, source, error):
    make_distribution("leaver", "leaver", source)
    found = {d.name: d for d in discover({})}
    assert found["leaver"].error == error
    assert found["cpu"].error is None


@pytest.mark.filterwarnings("ignore:The use of `x.T`:UserWarning")
def test_hook_wrappers_generators_and_non_plugins_are_errors():
    wrapper = types.ModuleType("wrapping")

    @hookimpl(wrapper=True)
    def register_accelerators(register):
        return (yield)

    wrapper.register_accelerators = register_accelerators
    catalog = build_catalog(
        [
            DiscoveredPlugin("wrapping", "wrapping", "d", "1", wrapper),
            DiscoveredPlugin("number", "x:number", "d", "1", 42),
            DiscoveredPlugin("array", "x:arr", "d", "1", torch.arange(3)),
        ]
    )
    records = by_name(catalog)
    assert records["wrapping"].error == (
        "register_accelerators is a hook wrapper; implement it as a plain hook"
    )
    for name in ("number", "array"):
        assert "implements no vllm_srun hook" in records[name].error


def test_a_flood_of_refusals_is_counted_not_listed():
    catalog = build_catalog([plugin("flood", *[object() for _ in range(5000)])])
    refused = catalog.plugins[0].refused
    assert len(refused) == 21
    assert refused[-1].reason == "and 4980 more refused objects"


def test_an_attribute_that_raises_does_not_hide_the_hooks_after_it():
    class Plugin:
        @property
        def a_broken_attribute(self):  # listed before register_accelerators
            raise RuntimeError("lazy import failed")

        @hookimpl
        def register_accelerators(self, register):
            register(make_accelerator("after"))

    catalog = build_catalog([DiscoveredPlugin("p", "x:Plugin", "d", "1", Plugin())])
    assert catalog.plugins[0].error is None
    assert list(catalog.layer("accelerators")) == ["after"]


def test_a_module_attribute_that_raises_on_every_lookup_does_not_break_its_plugin():
    class LazyProxy:  # a lazily loaded submodule, say: any attribute lookup raises
        def __getattr__(self, attr):
            raise RuntimeError(f"cannot load {attr}")

    module = types.ModuleType("with_proxy")
    module.lazy = LazyProxy()

    @hookimpl
    def register_accelerators(register):
        register(make_accelerator("proxied"))

    module.register_accelerators = register_accelerators
    catalog = build_catalog([DiscoveredPlugin("proxy", "with_proxy", "d", "1", module)])
    assert catalog.plugins[0].error is None
    assert list(catalog.layer("accelerators")) == ["proxied"]


def test_an_object_without_a_name_is_refused_under_its_type_name():
    class Gadget:
        pass

    catalog = build_catalog([plugin("p", object(), Gadget())])
    assert [(r.name, r.reason) for r in catalog.plugins[0].refused] == [
        ("object", "object is not an instance of vllm_srun.plugins.accelerator.Accelerator"),
        (
            "test_an_object_without_a_name_is_refused_under_its_type_name.<locals>.Gadget",
            "test_an_object_without_a_name_is_refused_under_its_type_name.<locals>.Gadget "
            "is not an instance of vllm_srun.plugins.accelerator.Accelerator",
        ),
    ]


def test_a_registry_name_that_is_not_a_non_empty_str_is_refused():
    class NumberedKernel(Kernel):
        @property
        def key(self):
            return 7

    class BlankKernel(Kernel):
        @property
        def key(self):
            return ""

    numbered = NumberedKernel("attention", "numbered", "eager", bit_exact=True)
    blank = BlankKernel("attention", "blank", "eager", bit_exact=True)
    good = Kernel("attention", "good", "eager", bit_exact=True)
    catalog = build_catalog([plugin("k", numbered, blank, good, hook="register_kernels")])
    assert list(catalog.layer("kernels")) == ["attention.good"]
    assert [r.to_json() for r in catalog.plugins[0].refused] == [
        {
            "layer": "kernels",
            "name": "numbered",
            "reason": "registry name must be a non-empty str, not int",
        },
        {
            "layer": "kernels",
            "name": "blank",
            "reason": "registry name must be a non-empty str, not str",
        },
    ]


def test_a_hook_that_raises_is_one_refusal_of_the_whole_layer():
    def explode():
        raise RuntimeError("driver missing")

    catalog = build_catalog([plugin("boom", explode)])
    assert [r.to_json() for r in catalog.plugins[0].refused] == [
        {
            "layer": "accelerators",
            "name": "*",
            "reason": "register_accelerators raised RuntimeError: driver missing",
        }
    ]


def test_every_broken_rule_of_one_object_is_in_its_reason():
    catalog = build_catalog([plugin("p", make_accelerator("Bad", priority=True))])
    [refusal] = catalog.plugins[0].refused
    assert refusal.reason == (
        "accelerator name 'Bad' must match ^[a-z][a-z0-9_]*$; "
        "accelerator auto_priority must be an int or None, not True"
    )


def test_twenty_refusals_are_all_listed_and_the_twenty_first_is_counted():
    twenty = build_catalog([plugin("twenty", *[object() for _ in range(20)])])
    assert len(twenty.plugins[0].refused) == 20
    assert all(r.name == "object" for r in twenty.plugins[0].refused)
    flood = build_catalog([plugin("flood", *[object() for _ in range(21)])])
    refused = flood.plugins[0].refused
    assert len(refused) == 21
    assert refused[-1].to_json() == {
        "layer": "accelerators",
        "name": "*",
        "reason": "and 1 more refused objects",
    }
