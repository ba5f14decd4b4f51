"""The ``native`` engine: encoder models in PyTorch through transformers.

Weights load from safetensors only, with ``trust_remote_code`` off, in eval
and inference mode. Attention comes from the kernel registry: ``eager`` is the
pure-torch reference and the default; ``sdpa`` is registered as not bit-exact
(its fused kernels round differently), so the ``exact`` profile never picks it.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from vllm_srun.plugins import DeviceInfo, Engine, Kernel, hookimpl
from vllm_srun.plugins.spec import EncoderBatch, ModelSpec

# transformers is imported where it is used: importing it costs seconds, and
# `vllm-srun plugins` should not pay that to list this engine.
TASK_CLASSES = {
    "encoder": "AutoModel",
    "sequence_classification": "AutoModelForSequenceClassification",
    "token_classification": "AutoModelForTokenClassification",
}


class NativeEncoder:
    """A loaded transformers encoder; :meth:`encode` runs one batch."""

    def __init__(self, model: Any, spec: ModelSpec, device: torch.device) -> None:
        self.model = model
        self.spec = spec
        self.device = device
        self.accepts_token_type_ids = (
            "token_type_ids" in inspect.signature(model.forward).parameters
        )

    def encode(self, batch: EncoderBatch) -> torch.Tensor:
        """Run the batch; returns float32 on the CPU (shapes as :class:`EncoderModel`)."""
        inputs = {
            "input_ids": batch.input_ids.to(self.device),
            "attention_mask": batch.attention_mask.to(self.device),
        }
        if self.accepts_token_type_ids and batch.token_type_ids is not None:
            inputs["token_type_ids"] = batch.token_type_ids.to(self.device)
        want_layer = self.spec.task == "encoder" and self.spec.hidden_layer is not None
        with torch.inference_mode():
            out = self.model(**inputs, output_hidden_states=want_layer, return_dict=True)
        if self.spec.task != "encoder":
            result = out.logits
        elif want_layer:
            result = out.hidden_states[self.spec.hidden_layer]
        else:
            result = out.last_hidden_state
        return result.float().cpu()


class NativeEngine(Engine):
    """PyTorch through transformers; tried first by ``--engine auto``."""

    name = "native"
    auto_priority = 10

    def supports(self, spec: Any, device: DeviceInfo) -> str | None:
        """``None`` when transformers has the model type built in and weights are safetensors."""
        if not isinstance(spec, ModelSpec):
            return "native runs encoder model specs only"
        if spec.task not in TASK_CLASSES:
            return f"native does not run task {spec.task!r}"
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

        if spec.model_type not in CONFIG_MAPPING_NAMES:
            return (
                f"transformers {transformers.__version__} has no built-in model type "
                f"{spec.model_type!r} (remote code is never run)"
            )
        if not spec.weights:
            return "the package has no safetensors weights"
        if spec.dtype == "float16" and device.accelerator == "cpu":
            return "float16 runs on GPUs only; use --dtype float32 or bfloat16 on a CPU"
        return None

    def load(self, spec: Any, device: DeviceInfo, options: Mapping[str, Any]) -> NativeEncoder:
        """Load ``spec`` in eval mode.

        Options:
            torch_device: the ``torch.device`` to run on (default CPU).
            attention: the transformers ``attn_implementation`` the selected
                attention kernel names (default ``eager``).

        Raises:
            ValueError: :meth:`supports` refuses the spec.
            OSError: the package's files cannot be read.
        """
        reason = self.supports(spec, device)
        if reason is not None:
            raise ValueError(reason)
        import transformers

        target = options.get("torch_device", torch.device("cpu"))
        dtype = spec.torch_dtype
        if dtype == torch.float16 and device.accelerator == "cpu":
            dtype = torch.float32  # released in float16, served under auto on a CPU
        model_class = getattr(transformers, TASK_CLASSES[spec.task])
        model = model_class.from_pretrained(
            str(spec.package),
            trust_remote_code=False,
            local_files_only=True,
            use_safetensors=True,
            attn_implementation=options.get("attention", "eager"),
            dtype=dtype,
        )
        model.to(target).eval()
        return NativeEncoder(model, spec, target)


@hookimpl
def register_engines(register: Any) -> None:
    """Register the ``native`` engine."""
    register(NativeEngine())


@hookimpl
def register_kernels(register: Any) -> None:
    """Register attention: ``eager`` (reference) and ``sdpa`` (not bit-exact)."""
    register(Kernel("attention", "eager", "eager", bit_exact=True, reference=True))
    register(Kernel("attention", "sdpa", "sdpa", bit_exact=False))
