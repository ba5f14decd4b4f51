"""The example third-party accelerator, installed from source like a user would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "third_party_accelerator"
BIN = Path(sys.executable).parent


def pip_install(source: Path, target: Path) -> None:
    """Install a source tree into ``target`` without touching the source or the venv."""
    build = target.parent / f"src-{source.name}"
    shutil.copytree(source, build, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(build),
        ],
        check=True,
        capture_output=True,
    )


def vllm_srun(site: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_SRUN_")}
    environ.update(PYTHONPATH=str(site), **env)
    return subprocess.run(
        [str(BIN / "vllm-srun"), *args], capture_output=True, text=True, env=environ, timeout=120
    )


def listed_plugins(site: Path, **env: str) -> dict[str, Any]:
    """``vllm-srun plugins --json`` with ``site`` on the path: each plugin by name, in
    the listed order (the command must succeed)."""
    done = vllm_srun(site, "plugins", "--json", **env)
    assert done.returncode == 0, done.stderr
    return {p["name"]: p for p in json.loads(done.stdout)["plugins"]}


@pytest.fixture(scope="module")
def host_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("host") / "site"
    pip_install(EXAMPLE, site)
    return site


def test_installed_example_is_listed_with_its_distribution(host_site):
    plugins = listed_plugins(host_site)
    host = plugins["host"]
    assert host["distribution"] == "vllm-srun-host-accelerator"
    assert host["version"] == "0.1.0"
    assert host["entry_point"] == "vllm_srun_host.plugin"
    assert host["registered"]["accelerators"] == ["host"]
    assert host["error"] is None
    assert plugins["cpu"]["distribution"] == "vllm-srun"


def test_installed_example_is_a_device_with_its_own_key_prefix(host_site):
    done = vllm_srun(host_site, "devices")
    document = json.loads(done.stdout)
    [host] = [d for d in document["devices"] if d["accelerator"] == "host"]
    assert host["device"] == "host"
    assert host["reference_keys"][-1] == "host"
    assert host["reference_keys"][0].startswith("host:")
    assert document["auto_order"] == ["cpu"]  # only when named


def test_disabling_the_example_makes_it_vanish(host_site):
    assert "host" not in listed_plugins(host_site, VLLM_SRUN_DISABLE_PLUGINS="host")
    devices = vllm_srun(host_site, "devices", VLLM_SRUN_DISABLE_PLUGINS="host")
    assert "host" not in {d["accelerator"] for d in json.loads(devices.stdout)["devices"]}


def test_only_list_isolates_the_example(host_site):
    assert list(listed_plugins(host_site, VLLM_SRUN_PLUGINS="host")) == ["host"]


def test_the_example_passes_the_conformance_kit(host_site):
    done = vllm_srun(host_site, "plugins", "check", "host")
    assert done.returncode == 0, done.stdout
    assert done.stdout.splitlines()[-1] == "plugin host: conforms"


def test_the_examples_own_tests_pass(host_site):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_SRUN_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLE / "tests")],
        capture_output=True,
        text=True,
        env={**environ, "PYTHONPATH": str(host_site)},
        cwd=host_site,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


def write_distribution(root: Path, dist: str, module: str, plugin: str, source: str) -> Path:
    """A minimal source tree of a distribution declaring one vllm_srun plugin."""
    tree = root / dist
    tree.mkdir(parents=True)
    (tree / f"{module}.py").write_text(textwrap.dedent(source))
    (tree / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [build-system]
            requires = ["setuptools>=68"]
            build-backend = "setuptools.build_meta"
            [project]
            name = "{dist}"
            version = "0.0.1"
            [project.entry-points.vllm_srun]
            {plugin} = "{module}"
            [tool.setuptools]
            py-modules = ["{module}"]
            """
        )
    )
    return tree


def test_a_broken_plugin_is_reported_and_the_runtime_still_starts(tmp_path):
    site = tmp_path / "site"
    source = write_distribution(
        tmp_path / "src",
        "broken-plugin",
        "broken_plugin",
        "broken",
        "import a_dependency_that_is_not_installed\n",
    )
    pip_install(source, site)
    plugins = listed_plugins(site)
    assert plugins["broken"]["distribution"] == "broken-plugin"
    assert plugins["broken"]["error"] == (
        "ModuleNotFoundError: No module named 'a_dependency_that_is_not_installed'"
    )
    assert plugins["cpu"]["error"] is None
    devices = vllm_srun(site, "devices")
    assert devices.returncode == 0
    assert json.loads(devices.stdout)["auto_order"] == ["cpu"]
    check = vllm_srun(site, "plugins", "check", "broken")
    assert check.returncode == 1
    assert "FAIL import: ModuleNotFoundError" in check.stdout


def test_a_second_distribution_claiming_host_clashes(host_site, tmp_path):
    site = tmp_path / "site"
    shutil.copytree(host_site, site)
    source = write_distribution(
        tmp_path / "src",
        "other-host",
        "other_host",
        "otherhost",
        """
        import torch
        from vllm_srun.plugins import Accelerator, DeviceInfo, hookimpl

        class Impostor(Accelerator):
            name = "host"
            def available(self): return True
            def devices(self): return [DeviceInfo("host", None, "impostor", 1, 1, {})]
            def torch_device(self, index): return torch.device("cpu")
            def hardware_keys(self, device): return ["host"]
            def onnx_providers(self, device): return [("CPUExecutionProvider", {})]

        @hookimpl
        def register_accelerators(register):
            register(Impostor())
        """,
    )
    pip_install(source, site)
    document = json.loads(vllm_srun(site, "plugins", "--json").stdout)
    assert document["clashes"] == [
        {
            "layer": "accelerators",
            "name": "host",
            "plugins": [
                {"name": "host", "distribution": "vllm-srun-host-accelerator"},
                {"name": "otherhost", "distribution": "other-host"},
            ],
        }
    ]
    devices = json.loads(vllm_srun(site, "devices").stdout)
    assert "host" not in {d["accelerator"] for d in devices["devices"]}
    table = vllm_srun(site, "plugins").stdout
    assert "vllm-srun-host-accelerator" in table and "other-host" in table
