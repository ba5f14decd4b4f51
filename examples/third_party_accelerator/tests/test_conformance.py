"""The example plugin's own tests: the vllm-srun conformance kit, by name and by module."""

import vllm_srun_host.plugin

from vllm_srun.plugins.testing import assert_conforms


def test_installed_entry_point_conforms():
    assert_conforms("host")


def test_module_conforms_before_install():
    assert_conforms(vllm_srun_host.plugin)
