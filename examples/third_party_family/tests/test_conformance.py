"""The vllm-srun conformance kit, on the installed entry point and on the module itself."""

import vllm_srun_nanoguard.plugin

from vllm_srun.plugins.testing import assert_conforms


def test_installed_entry_point_conforms():
    report = assert_conforms("nanoguard")
    assert not report.warnings


def test_module_conforms_before_install():
    report = assert_conforms(vllm_srun_nanoguard.plugin)
    assert "family nanoguard: classify through nanoguard_torch" in report.to_text()
