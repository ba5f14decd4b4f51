"""transformers' model base is imported lean whenever something first imports it, and the
hook that does so imports nothing itself (a model on ONNX Runtime never pays for it)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

HOOKED = """
import json, sys
from vllm_srun.compose.loader import import_transformers_lean_when_needed
import_transformers_lean_when_needed()
import_transformers_lean_when_needed()  # idempotent
installed = "transformers" in sys.modules
import transformers.models.bert.modeling_bert  # a model class, as the native engine loads it
from transformers.utils import import_utils
import transformers.modeling_utils as base
print(json.dumps({
    "imported_by_the_hook": installed,
    "skipped": [m for m in ("sklearn", "scipy") if m in sys.modules],
    "flags": [import_utils._sklearn_available, import_utils._scipy_available],
    "hooks_left": [type(f).__name__ for f in sys.meta_path if "Lean" in type(f).__name__],
    "source": bool(base.__loader__.get_source("transformers.modeling_utils")),
}))
"""


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("sklearn") is None or importlib.util.find_spec("scipy") is None,
    reason="scikit-learn and SciPy are not installed: nothing to skip",
)
def test_the_hook_imports_the_model_base_lean_only_when_it_is_imported():
    done = subprocess.run(
        [sys.executable, "-c", HOOKED], capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "imported_by_the_hook": False,
        "skipped": [],
        "flags": [True, True],
        "hooks_left": [],
        "source": True,
    }
