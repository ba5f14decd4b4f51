"""The ``native`` engine: encoder and decoder models in PyTorch through transformers.

Encoders (:class:`NativeEncoder`) return hidden states or task logits;
decoders (:class:`NativeDecoder`, ``AutoModelForCausalLM``) return next-token
logits at the last position of left-padded rows, optionally continuing a
shared prefix whose keys and values are computed once.

Weights load from safetensors, or from pickled ``pytorch_model*.bin`` only
through ``torch.load(weights_only=True)`` (a pickle needing more is refused),
with ``trust_remote_code`` off, in eval and inference mode. Attention comes
from the kernel registry: ``eager`` is the pure-torch reference and the
default; ``sdpa`` is registered as not bit-exact (its fused kernels round
differently, within about 1e-6), so ``exact`` and ``batching`` never pick it
and ``max_speed`` does (:attr:`NativeEngine.profiles`).

A spec with ``attention_groups`` (a family whose rows hold parts that must not see each
other, such as the options of a Laya checkpoint's parallel layout) runs on ModernBERT
encoders: each batch's position ids and groups become the per-layer attention masks
(:func:`grouped_masks`), handed to transformers' ModernBERT in place of the ones it builds
from the padding mask.

Under ``max_speed`` a float32 model whose family vouches for bfloat16
(``spec.bf16_tolerant``) runs in bfloat16 when ``--dtype`` is ``auto`` and the
device computes bfloat16 natively (AVX512-BF16 or AMX on a CPU): on the
reference CPU that is 1.6x the float32 forward of MiniLM, against 1.1x for the
fused float32 ONNX graph (bench/results/profiles.md), so the engine then asks
``--engine auto`` to try it first (:meth:`NativeEngine.auto_rank`).
"""

from __future__ import annotations

import inspect
import threading
import zipfile
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from vllm_srun.plugins import BATCHING, EXACT, MAX_SPEED, DeviceInfo, Engine, Kernel, hookimpl
from vllm_srun.plugins.hookspecs import RegisterEngine, RegisterKernel
from vllm_srun.plugins.spec import (
    DecoderBatch,
    EncoderBatch,
    ModelSpec,
    decoder_positions,
    pickled,
)

if TYPE_CHECKING:
    import torch

# transformers is imported where it is used: importing it costs seconds, and
# `vllm-srun plugins` should not pay that to list this engine.
TASK_CLASSES = {
    "encoder": "AutoModel",
    "sequence_classification": "AutoModelForSequenceClassification",
    "token_classification": "AutoModelForTokenClassification",
    "causal_lm": "AutoModelForCausalLM",
}


GROUPED_MODEL_TYPES = ("modernbert",)
"""Model types whose attention masks the engine can set per layer type from a batch's
attention groups (:func:`grouped_masks`): ModernBERT's global and sliding-window layers."""

BFLOAT16_RANK = 4
"""``--engine auto`` rank of the native engine where it computes in bfloat16 under
``max_speed``: ahead of the ONNX Runtime engine's fused float32 graph (5)."""


def computes_bfloat16(spec: ModelSpec, device: DeviceInfo) -> bool:
    """Whether the native engine runs ``spec`` in bfloat16 on ``device``: under
    ``max_speed``, ``--dtype auto``, a float32 release whose family measured that its
    heads keep their quality in bfloat16 (``spec.bf16_tolerant``), on a device whose
    ``bf16`` capability is ``bf16_native`` (the accelerator plugin's verdict)."""
    return (
        spec.profile == MAX_SPEED.name
        and spec.dtype == "auto"
        and spec.released_dtype == "float32"
        and spec.bf16_tolerant
        and device.capabilities.get("bf16") == "bf16_native"
    )


def grouped_masks(
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    groups: torch.Tensor,
    window: int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Additive attention masks ``[rows, 1, tokens, tokens]`` (0 where a query may attend
    to a key, the dtype's lowest number where not) for global and sliding-window layers.

    A query attends to every real key (``attention_mask`` 1) except the keys of another
    group when both groups are above 0 (:class:`~vllm_srun.plugins.spec.EncoderBatch`);
    a sliding-window layer also needs ``|position_q - position_k| <= window``.

    Args:
        attention_mask, position_ids, groups: int64 ``[rows, tokens]``.
        window: the sliding layers' reach either side, in positions.
        dtype: the model's dtype.
    """
    import torch

    query, key = groups[:, :, None], groups[:, None, :]
    apart = (query > 0) & (key > 0) & (query != key)
    allowed = attention_mask.bool()[:, None, :] & ~apart
    near = (position_ids[:, :, None] - position_ids[:, None, :]).abs() <= window
    lowest = torch.finfo(dtype).min

    def additive(keep: torch.Tensor) -> torch.Tensor:
        return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, lowest)

    return additive(allowed)[:, None], additive(allowed & near)[:, None]


def dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32``: the name ``--dtype`` and the card use."""
    return str(dtype).removeprefix("torch.")


class NativeEncoder:
    """A loaded transformers encoder; :meth:`encode` runs one batch.

    Attributes:
        compute_dtype: the dtype its weights and activations run at (``float32``,
            ``bfloat16``); the card's ``dtype``.
        libraries: what its forwards run on: torch and transformers.
    """

    libraries = ("torch", "transformers")

    def __init__(self, model: Any, spec: ModelSpec, device: torch.device) -> None:
        self.model = model
        self.spec = spec
        self.device = device
        self.compute_dtype = dtype_name(model.dtype)
        self.accepts_token_type_ids = (
            "token_type_ids" in inspect.signature(model.forward).parameters
        )
        self._masks = threading.Lock()  # a grouped forward sets its masks on the model

    def encode(self, batch: EncoderBatch) -> npt.NDArray[np.float32]:
        """Run the batch (int64 numpy arrays, moved to the model's device here).

        Returns:
            A C-contiguous float32 numpy array in host memory, shaped as
            :class:`~vllm_srun.plugins.spec.EncoderModel` says.
        """
        import torch

        def on_device(array: npt.NDArray[np.int64]) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64)).to(self.device)

        inputs = {
            "input_ids": on_device(batch.input_ids),
            "attention_mask": on_device(batch.attention_mask),
        }
        if self.accepts_token_type_ids and batch.token_type_ids is not None:
            inputs["token_type_ids"] = on_device(batch.token_type_ids)
        want_layer = self.spec.task == "encoder" and self.spec.hidden_layer is not None
        with torch.inference_mode():
            if batch.attention_groups is not None:
                out = self._grouped(batch, inputs, on_device, want_layer)
            else:
                out = self.model(**inputs, output_hidden_states=want_layer, return_dict=True)
        if self.spec.task != "encoder":
            result = out.logits
        elif want_layer:
            result = out.hidden_states[self.spec.hidden_layer]
        else:
            result = out.last_hidden_state
        hidden: npt.NDArray[np.float32] = np.ascontiguousarray(result.float().cpu().numpy())
        return hidden

    def _grouped(
        self, batch: EncoderBatch, inputs: dict[str, Any], on_device: Any, want: bool
    ) -> Any:
        """A ModernBERT forward with the batch's position ids and group masks
        (:func:`grouped_masks`): transformers 4's ModernBERT builds its masks from the
        padding mask alone, so the engine sets them for this call."""
        assert batch.attention_groups is not None
        positions = batch.position_ids
        if positions is None:
            positions = np.broadcast_to(np.arange(batch.input_ids.shape[1]), batch.input_ids.shape)
        position_ids = on_device(positions)
        base = getattr(self.model, self.model.base_model_prefix, self.model)
        full, sliding = grouped_masks(
            inputs["attention_mask"],
            position_ids,
            on_device(batch.attention_groups),
            base.config.local_attention // 2,
            self.model.dtype,
        )
        with self._masks:
            base._update_attention_mask = lambda *args, **kwargs: (full, sliding)
            try:
                return self.model(
                    **inputs, position_ids=position_ids, output_hidden_states=want, return_dict=True
                )
            finally:
                del base._update_attention_mask


class NativeDecoder:
    """A loaded transformers causal LM; :meth:`forward` reads next-token logits.

    Rows are left-padded (:class:`~vllm_srun.plugins.spec.DecoderBatch`), so
    every row's next-token logits sit at the last column; position ids are
    explicit (:func:`~vllm_srun.plugins.spec.decoder_positions` unless the
    batch brings its own), so padding never shifts a row's positions. Only the
    last position goes through the LM head (``logits_to_keep=1``) when the
    model accepts it.

    Attributes:
        compute_dtype: the dtype its weights and activations run at; the card's ``dtype``.
        libraries: what its forwards run on: torch and transformers.
    """

    libraries = ("torch", "transformers")

    def __init__(self, model: Any, spec: ModelSpec, device: torch.device) -> None:
        self.model = model
        self.spec = spec
        self.device = device
        self.compute_dtype = dtype_name(model.dtype)
        parameters = inspect.signature(model.forward).parameters
        self.keep = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}

    def _last(self, **inputs: Any) -> Any:
        out = self.model(**inputs, **self.keep, return_dict=True)
        return out.logits[:, -1, :], out

    def forward(self, batch: DecoderBatch) -> torch.Tensor:
        """Next-token logits of each row, float32 on the CPU.

        Without ``prefix_ids`` the rows run as they are. With it, the prefix
        runs once (one row, positions ``0..P-1``), its cache is repeated for
        every row, and the rows continue from position ``P`` with a mask of
        ``[ones(P), attention_mask]``: padding between the prefix and a row's
        first real token is hidden.

        Returns:
            ``[rows, k]`` logits at ``read_ids``, or ``[rows, vocab]`` without them.
        """
        import torch

        ids = batch.input_ids.to(self.device)
        mask = batch.attention_mask.to(self.device)
        with torch.inference_mode():
            if batch.prefix_ids is None or batch.prefix_ids.numel() == 0:
                positions = batch.position_ids
                if positions is None:
                    positions = decoder_positions(mask)
                logits, _ = self._last(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=positions.to(self.device),
                    use_cache=False,
                )
            else:
                prefix = batch.prefix_ids.to(self.device).reshape(1, -1)
                length = prefix.shape[1]
                _, out = self._last(
                    input_ids=prefix,
                    attention_mask=torch.ones_like(prefix),
                    position_ids=torch.arange(length, device=self.device).unsqueeze(0),
                    use_cache=True,
                )
                cache = out.past_key_values
                cache.batch_repeat_interleave(ids.shape[0])
                full_mask = torch.cat(
                    [
                        torch.ones((ids.shape[0], length), dtype=mask.dtype, device=self.device),
                        mask,
                    ],
                    dim=1,
                )
                positions = batch.position_ids
                if positions is None:
                    positions = decoder_positions(mask, offset=length)
                logits, _ = self._last(
                    input_ids=ids,
                    attention_mask=full_mask,
                    position_ids=positions.to(self.device),
                    past_key_values=cache,
                    use_cache=True,
                )
            if batch.read_ids is not None:
                logits = logits.gather(1, batch.read_ids.to(self.device))
        read: torch.Tensor = logits.float().cpu()
        return read


class NativeEngine(Engine):
    """PyTorch through transformers; tried first by ``--engine auto``."""

    name = "native"
    auto_priority = 10
    kernel_slots = ("attention",)
    profiles = (
        EXACT.described(
            EXACT.description + " Native: eager attention, the transformers reference."
        ),
        BATCHING.described(
            BATCHING.description + " Native: eager attention, the transformers reference."
        ),
        MAX_SPEED.described(
            "Native: PyTorch scaled-dot-product attention (fused kernels, not bit-exact) "
            "in place of eager, and bfloat16 compute for a float32 model whose family "
            "vouches for it on a device with native bfloat16 (then tried before "
            "onnxruntime under --engine auto); answers are approximate, their deviation "
            "from exact measured at load on the golden questions."
        ),
    )

    def auto_rank(self, spec: ModelSpec, device: DeviceInfo) -> int | None:
        """:data:`BFLOAT16_RANK` where it would compute ``spec`` in bfloat16
        (:func:`computes_bfloat16`), else the declared order."""
        if isinstance(spec, ModelSpec) and computes_bfloat16(spec, device):
            return BFLOAT16_RANK
        return super().auto_rank(spec, device)

    def supports(self, spec: Any, device: DeviceInfo) -> str | None:
        """``None`` when transformers has the model type built in and the package has weights
        (safetensors, or pickles read only with ``weights_only=True``)."""
        if not isinstance(spec, ModelSpec):
            return "native runs encoder and decoder model specs only"
        if spec.task not in TASK_CLASSES:
            return f"native does not run task {spec.task!r}"
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

        if spec.model_type not in CONFIG_MAPPING_NAMES:
            return (
                f"transformers {transformers.__version__} has no built-in model type "
                f"{spec.model_type!r} (remote code is never run)"
            )
        if spec.task == "causal_lm":
            from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

            if spec.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
                return (
                    f"transformers {transformers.__version__} has no causal LM for model type "
                    f"{spec.model_type!r}"
                )
        if not spec.weights:
            return "the package has no weights (*.safetensors or pytorch_model*.bin)"
        if spec.dtype == "float16" and device.accelerator == "cpu":
            return "float16 runs on GPUs only; use --dtype float32 or bfloat16 on a CPU"
        if spec.attention_groups and (
            spec.model_type not in GROUPED_MODEL_TYPES or spec.task == "causal_lm"
        ):
            return (
                f"native sets attention groups on {', '.join(GROUPED_MODEL_TYPES)} encoders "
                f"only, not {spec.model_type!r}"
            )
        return None

    def load(
        self, spec: Any, device: DeviceInfo, options: Mapping[str, Any]
    ) -> NativeEncoder | NativeDecoder:
        """Load ``spec`` in eval mode: a :class:`NativeDecoder` for ``causal_lm``,
        a :class:`NativeEncoder` otherwise; in bfloat16 where :func:`computes_bfloat16`
        says so, else at ``spec.torch_dtype`` (float32 for a float16 release on a CPU).

        Options:
            torch_device: the ``torch.device`` to run on (default CPU).
            threads: torch's CPU threads (``torch.set_num_threads``, process-wide;
                ``None``: torch's default, one per core).
            kernels: the runtime's choice per slot (:meth:`select_kernels`);
                the ``attention`` kernel's implementation is the transformers
                ``attn_implementation``.
            attention: an ``attn_implementation`` to use instead (tests and
                direct use); ``eager``, the reference, when neither is given.

        Raises:
            ValueError: :meth:`supports` refuses the spec.
            OSError: the package's files cannot be read.
        """
        import torch

        reason = self.supports(spec, device)
        if reason is not None:
            raise ValueError(reason)
        threads = options.get("threads")
        if threads:  # --threads: torch's intra-op threads (process-wide, as torch has them)
            torch.set_num_threads(int(threads))
        import transformers

        target = options.get("torch_device", torch.device("cpu"))
        dtype = torch.bfloat16 if computes_bfloat16(spec, device) else spec.torch_dtype
        if dtype == torch.float16 and device.accelerator == "cpu":
            dtype = torch.float32  # released in float16, served under auto on a CPU
        model_class = getattr(transformers, TASK_CLASSES[spec.task])
        legacy = pickled(spec.weights)
        if legacy:
            check_pickles(spec.package, spec.weights)
        model = model_class.from_pretrained(
            str(spec.package),
            trust_remote_code=False,
            local_files_only=True,
            use_safetensors=not legacy,
            attn_implementation=_attention(options),
            dtype=dtype,
        )
        model.to(target).eval()
        if spec.task == "causal_lm":
            return NativeDecoder(model, spec, target)
        return NativeEncoder(model, spec, target)


def _attention(options: Mapping[str, Any]) -> str:
    """The ``attn_implementation`` of the load options (see :meth:`NativeEngine.load`)."""
    if "attention" in options:
        return str(options["attention"])
    chosen = options.get("kernels", {}).get("attention")
    return "eager" if chosen is None else str(chosen.implementation)


def check_pickles(package: Any, names: tuple[str, ...]) -> None:
    """Refuse pickled weights that need more than ``torch.load(weights_only=True)``.

    ``weights_only`` unpickles tensors, numbers, strings and plain containers
    only, so a pickle that would build another object (and run its code) fails
    here, before transformers opens it (which also loads with ``weights_only``).

    Raises:
        ValueError: ``pickled weights refused: NAME ...`` naming the file.
    """
    import torch

    for name in names:
        try:
            path = package / name
            # mmap avoids a second copy of the tensors, but only the zip format supports it.
            torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
        except Exception as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ValueError(
                f"pickled weights refused: {name} does not load with "
                f"torch.load(weights_only=True) ({first}); convert it to safetensors"
            ) from err


@hookimpl
def register_engines(register: RegisterEngine) -> None:
    """Register the ``native`` engine."""
    register(NativeEngine())


@hookimpl
def register_kernels(register: RegisterKernel) -> None:
    """Register attention: ``eager`` (reference) and ``sdpa`` (not bit-exact)."""
    register(Kernel("attention", "eager", "eager", bit_exact=True, reference=True))
    register(Kernel("attention", "sdpa", "sdpa", bit_exact=False))
