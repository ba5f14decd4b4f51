from vllm_srun import __version__
from vllm_srun.plugins.host import discover
from vllm_srun.plugins.host.discovery import parse_plugin_list

from ..conftest import accelerator_source

BUILTIN_ACCELERATORS = ["cpu", "cuda", "mps", "npu", "rocm", "xpu"]


def _by_name(records):
    return {r.name: r for r in records}


def test_builtins_come_through_the_entry_point_group():
    found = _by_name(discover({}))
    for name in BUILTIN_ACCELERATORS:
        record = found[name]
        assert record.distribution == "vllm-srun"
        assert record.version == __version__
        assert record.entry_point == f"vllm_srun.accelerators.{name}"
        assert record.error is None
        assert record.obj.__name__ == f"vllm_srun.accelerators.{name}"


def test_only_list_loads_only_those_and_reports_unknown_names():
    found = _by_name(discover({"VLLM_SRUN_PLUGINS": "cpu, rocm,nosuch"}))
    assert sorted(found) == ["cpu", "nosuch", "rocm"]
    assert found["cpu"].error is None
    assert "no distribution declares a plugin named 'nosuch'" in found["nosuch"].error
    assert found["nosuch"].obj is None


def test_disable_list_leaves_plugins_out():
    found = _by_name(discover({"VLLM_SRUN_DISABLE_PLUGINS": "cpu,mps"}))
    assert "cpu" not in found and "mps" not in found
    assert "cuda" in found


def test_disable_wins_over_only():
    found = _by_name(
        discover({"VLLM_SRUN_PLUGINS": "cpu,cuda", "VLLM_SRUN_DISABLE_PLUGINS": "cpu"})
    )
    assert sorted(found) == ["cuda"]


def test_failed_import_is_recorded_and_the_rest_load(make_distribution):
    make_distribution("broken-dist", "broken", "import does_not_exist_anywhere\n", version="2.0")
    found = _by_name(discover({}))
    broken = found["broken"]
    assert broken.obj is None
    assert broken.distribution == "broken-dist" and broken.version == "2.0"
    assert broken.error == "ModuleNotFoundError: No module named 'does_not_exist_anywhere'"
    assert found["cpu"].error is None


def test_a_new_path_on_sys_path_is_scanned_again(make_distribution):
    assert "late" not in _by_name(discover({}))
    make_distribution("late-dist", "late", accelerator_source("late"))
    assert _by_name(discover({}))["late"].error is None


def test_parse_plugin_list():
    assert parse_plugin_list(None) is None
    assert parse_plugin_list("  ") is None
    assert parse_plugin_list("a, b,,c ") == ["a", "b", "c"]
    assert parse_plugin_list(",,,") is None


def test_a_list_of_only_commas_filters_nothing():
    assert "cpu" in _by_name(discover({"VLLM_SRUN_PLUGINS": ",,"}))


def test_disabling_an_unknown_name_is_a_warning(caplog):
    found = _by_name(discover({"VLLM_SRUN_DISABLE_PLUGINS": "nosuch"}))
    assert "cpu" in found
    assert (
        "VLLM_SRUN_DISABLE_PLUGINS names 'nosuch', which no distribution declares "
        "in entry-point group 'vllm_srun'"
    ) in caplog.text


def test_one_entry_point_declared_by_several_distributions_names_them_all(make_distribution):
    from vllm_srun.plugins.host import build_catalog

    make_distribution("dup-one", "cpu", None, target="vllm_srun.accelerators.cpu")
    found = [d for d in discover({}) if d.name == "cpu"]
    assert sorted(d.distribution for d in found) == ["dup-one", "vllm-srun"]
    catalog = build_catalog(found)
    errors = sorted(p.error for p in catalog.plugins)
    assert errors == [
        "plugin name 'cpu' is also declared by cpu (dup-one 1.0); neither is used",
        f"plugin name 'cpu' is also declared by cpu (vllm-srun {__version__}); neither is used",
    ]
