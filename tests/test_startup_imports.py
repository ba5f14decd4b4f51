"""What a start imports: transformers' model base without scikit-learn and SciPy, whose
availability flags are restored afterwards (checked in a fresh interpreter)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

LEAN = """
import json, sys
from vllm_srun.loader import import_transformers_lean
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
