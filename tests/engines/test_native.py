"""The native engine equals the transformers reference bit for bit on the same batch.

Its encoder takes int64 numpy batches and answers float32 numpy arrays; the references
run the same ids through transformers in torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_srun.engines.native import NativeEngine
from vllm_srun.plugins import DeviceInfo, select_kernel
from vllm_srun.plugins.host import discover
from vllm_srun.plugins.host.catalog import build_catalog
from vllm_srun.plugins.spec import EncoderBatch, ModelSpec

from ..fixtures import (
    ENCODER_CONFIGS,
    TASK_AUTO_CLASSES,
    padded_batch,
    spec_for,
    torch_batch,
    write_encoder,
)

CPU = DeviceInfo("cpu", None, "cpu", None, None, {})
TASKS = list(TASK_AUTO_CLASSES)


def reference(package, task, batch, attention="eager"):
    import transformers

    model = getattr(transformers, TASK_AUTO_CLASSES[task]).from_pretrained(
        package, attn_implementation=attention
    )
    model.eval()
    names = model.forward.__code__.co_varnames
    inputs = {k: v for k, v in torch_batch(batch).items() if k in names}
    with torch.inference_mode():
        out = model(**inputs)
    return (out.last_hidden_state if task == "encoder" else out.logits).float().numpy()


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("model_type", list(ENCODER_CONFIGS))
def test_native_equals_transformers_bit_for_bit(tmp_path, model_type, task):
    package = write_encoder(tmp_path, model_type, task)
    pad = 1 if model_type in ("roberta", "xlm-roberta") else 0
    batch = padded_batch([7, 3, 5], pad_id=pad)
    engine = NativeEngine()
    spec = spec_for(package, task)
    assert engine.supports(spec, CPU) is None
    loaded = engine.load(spec, CPU, {"attention": "eager"})
    got = loaded.encode(EncoderBatch(**batch))
    want = reference(package, task, batch)
    assert isinstance(got, np.ndarray) and got.flags.c_contiguous
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.array_equal(got, want)


def test_an_intermediate_layer(tmp_path):
    import transformers

    package = write_encoder(tmp_path, "bert", "encoder")
    batch = padded_batch([4, 6])
    loaded = NativeEngine().load(spec_for(package, "encoder", hidden_layer=1), CPU, {})
    model = transformers.AutoModel.from_pretrained(package, attn_implementation="eager").eval()
    with torch.inference_mode():
        want = model(**torch_batch(batch), output_hidden_states=True).hidden_states[1]
    assert np.array_equal(loaded.encode(EncoderBatch(**batch)), want.numpy())


def test_the_exact_profile_selects_eager_attention_never_sdpa():
    [native] = discover({}, only=["native"])
    kernels = build_catalog([native]).layer("kernels")
    assert kernels["attention.sdpa"].bit_exact is False
    assert select_kernel(kernels.values(), "attention", "cpu").implementation == "eager"


def test_sdpa_rounds_differently_but_stays_close(tmp_path):
    package = write_encoder(tmp_path, "bert", "encoder")
    batch = padded_batch([9, 4, 6])
    engine = NativeEngine()
    eager = engine.load(spec_for(package, "encoder"), CPU, {"attention": "eager"})
    sdpa = engine.load(spec_for(package, "encoder"), CPU, {"attention": "sdpa"})
    a, b = eager.encode(EncoderBatch(**batch)), sdpa.encode(EncoderBatch(**batch))
    mask = batch["attention_mask"].astype(bool)
    assert np.allclose(a[mask], b[mask], rtol=1e-5, atol=1e-5)


def test_refusals_name_the_reason(tmp_path):
    package = write_encoder(tmp_path, "bert", "encoder")
    engine = NativeEngine()
    assert engine.supports(spec_for(package, "encoder", weights=()), CPU) == (
        "the package has no weights (*.safetensors or pytorch_model*.bin)"
    )
    remote = ModelSpec(
        package, "Custom", "my-custom-type", "encoder", weights=("model.safetensors",)
    )
    assert "has no built-in model type 'my-custom-type' (remote code is never run)" in (
        engine.supports(remote, CPU)
    )
    assert engine.supports(spec_for(package, "encoder", dtype="float16"), CPU) == (
        "float16 runs on GPUs only; use --dtype float32 or bfloat16 on a CPU"
    )
    assert engine.supports(object(), CPU) == "native runs encoder and decoder model specs only"
    with pytest.raises(ValueError, match="has no weights"):
        engine.load(spec_for(package, "encoder", weights=()), CPU, {})


def test_bfloat16_dtype_policy(tmp_path):
    package = write_encoder(tmp_path, "bert", "encoder")
    loaded = NativeEngine().load(spec_for(package, "encoder", dtype="bfloat16"), CPU, {})
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    assert loaded.encode(EncoderBatch(**padded_batch([3]))).dtype == np.float32
    assert not loaded.model.training


def test_a_float16_release_runs_in_float32_on_a_cpu_under_auto(tmp_path):
    package = write_encoder(tmp_path, "bert", "encoder")
    spec = spec_for(package, "encoder", released_dtype="float16")
    engine = NativeEngine()
    assert engine.supports(spec, CPU) is None
    loaded = engine.load(spec, CPU, {})
    assert next(loaded.model.parameters()).dtype == torch.float32


def test_pickled_weights_load_only_through_weights_only_and_equal_safetensors(tmp_path):
    import shutil

    import transformers

    from vllm_srun.plugins.spec import weight_files

    package = write_encoder(tmp_path / "safe", "bert", "sequence_classification")
    legacy = tmp_path / "legacy"
    shutil.copytree(package, legacy)
    (legacy / "model.safetensors").unlink()
    model = transformers.AutoModelForSequenceClassification.from_pretrained(package)
    model.save_pretrained(legacy, safe_serialization=False)
    assert weight_files(legacy) == ("pytorch_model.bin",)
    batch = padded_batch([5, 3])
    engine = NativeEngine()
    want = engine.load(spec_for(package, "sequence_classification"), CPU, {})
    spec = spec_for(legacy, "sequence_classification", weights=weight_files(legacy))
    got = engine.load(spec, CPU, {})
    assert np.array_equal(got.encode(EncoderBatch(**batch)), want.encode(EncoderBatch(**batch)))

    state = torch.load(legacy / "pytorch_model.bin", weights_only=True)
    torch.save(state, legacy / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    old_format = engine.load(spec, CPU, {})  # the pre-zip format loads too (without mmap)
    old = old_format.encode(EncoderBatch(**batch))
    assert np.array_equal(old, want.encode(EncoderBatch(**batch)))

    class Payload:  # a pickle that would run code when loaded without weights_only
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"bert.embeddings.word_embeddings.weight": Payload()}, legacy / "pytorch_model.bin")
    refused = r"pickled weights refused: pytorch_model.bin does not load"
    with pytest.raises(ValueError, match=refused):
        engine.load(spec, CPU, {})
