import inspect

from vllm_srun.plugins import hookspecs
from vllm_srun.plugins.host import LAYERS


def test_seven_hooks_each_take_only_a_register_callback():
    specs = {
        name: fn
        for name, fn in vars(hookspecs).items()
        if name.startswith("register_") and callable(fn)
    }
    assert sorted(specs) == [
        "register_accelerators",
        "register_engines",
        "register_families",
        "register_golden_references",
        "register_kernels",
        "register_models",
        "register_surface_extensions",
    ]
    for fn in specs.values():
        assert list(inspect.signature(fn).parameters) == ["register"]
        assert fn.__doc__


def test_every_hook_fills_exactly_one_layer():
    hooks = {layer.hook for layer in LAYERS}
    assert hooks == {n for n in vars(hookspecs) if n.startswith("register_")}
    assert [layer.name for layer in LAYERS] == [
        "families",
        "engines",
        "accelerators",
        "kernels",
        "golden_references",
        "models",
        "surface_extensions",
    ]


def test_project_name_is_the_entry_point_group():
    assert hookspecs.PROJECT_NAME == "vllm_srun"
