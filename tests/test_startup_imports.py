"""What a start imports: transformers' model base without scikit-learn and SciPy, whose
availability flags are restored afterwards (checked in a fresh interpreter)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

LEAN = """
import json, sys
from vllm_srun.compose.loader import import_transformers_lean
import_transformers_lean()
from transformers.utils import import_utils
import transformers.models.bert.modeling_bert  # a model class, as the native engine loads
print(json.dumps({
    "imported": [m for m in ("transformers.modeling_utils", "transformers.generation.utils")
                 if m in sys.modules],
    "skipped": [m for m in ("sklearn", "scipy") if m in sys.modules],
    "flags": [import_utils._sklearn_available, import_utils._scipy_available],
}))
"""


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("sklearn") is None or importlib.util.find_spec("scipy") is None,
    reason="scikit-learn and SciPy are not installed: nothing to skip",
)
def test_the_model_base_is_imported_without_sklearn_and_scipy_and_the_flags_come_back():
    done = subprocess.run([sys.executable, "-c", LEAN], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "imported": ["transformers.modeling_utils", "transformers.generation.utils"],
        "skipped": [],
        "flags": [True, True],
    }


API_WITHOUT_TORCH = """
import importlib, io, json, pkgutil, sys, contextlib
import vllm_srun.plugins
api = sorted(
    info.name
    for info in pkgutil.walk_packages(vllm_srun.plugins.__path__, "vllm_srun.plugins.")
    if info.name != "vllm_srun.plugins.testing"  # the conformance kit checks torch devices
)
for name in api:
    importlib.import_module(name)
after_api = "torch" in sys.modules
from vllm_srun.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(["plugins", "--json"])
listed = json.loads(out.getvalue())
print(json.dumps({
    "api": len(api),
    "torch_after_api": after_api,
    "code": code,
    "listed": [
        [p["name"], p["registered"]["surface_extensions"], p["error"]] for p in listed["plugins"]
    ],
    "torch_after_plugins": "torch" in sys.modules,
}))
"""


def test_the_plugin_api_and_the_plugins_listing_import_no_torch():
    # Every module of the plugin API, then `vllm-srun plugins` composing a catalog of a
    # plugin that needs no torch: torch (about 1.2 s) stays unimported.
    env = {**os.environ, "VLLM_SRUN_PLUGINS": "pii_patterns"}
    argv = [sys.executable, "-c", API_WITHOUT_TORCH]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, env=env)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["api"] >= 20
    assert found == {
        "api": found["api"],
        "torch_after_api": False,
        "code": 0,
        "listed": [["pii_patterns", ["pii_patterns"], None]],
        "torch_after_plugins": False,
    }


CATALOG_WITHOUT_TORCH = """
import json, sys
from vllm_srun.plugins.host import load_catalog
catalog = load_catalog()
print(json.dumps({
    "plugins": sorted(p.name for p in catalog.plugins),
    "errors": [p.name for p in catalog.plugins if p.error is not None],
    "imported": [m for m in ("torch", "transformers", "onnxruntime") if m in sys.modules],
}))
"""


def test_composing_every_built_in_plugin_imports_no_torch():
    # The built-in accelerators, engines, families and extensions import torch (about
    # 1.2 s), transformers and onnxruntime only in the methods that use them, so
    # `vllm-srun plugins` lists them all without paying for it.
    selection = ("VLLM_SRUN_PLUGINS", "VLLM_SRUN_DISABLE_PLUGINS")
    env = {k: v for k, v in os.environ.items() if k not in selection}
    argv = [sys.executable, "-c", CATALOG_WITHOUT_TORCH]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, env=env)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "plugins": [
            "causal_readout",
            "cpu",
            "cuda",
            "laya",
            "mps",
            "native",
            "npu",
            "onnxruntime",
            "pii_patterns",
            "rocm",
            "similarity_readout",
            "task_heads",
            "xpu",
        ],
        "errors": [],
        "imported": [],
    }
