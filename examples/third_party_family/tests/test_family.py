"""Recognising, checking and describing NanoGuard packages."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest
import torch
from vllm_srun_nanoguard.engine import NanoGuardEngine
from vllm_srun_nanoguard.family import NanoGuardFamily

from vllm_srun.plugins import DeviceInfo, EncoderBatch, PackageError

CPU = DeviceInfo("cpu", None, "cpu", None, None, {})


@pytest.fixture
def copy(package, tmp_path):
    return shutil.copytree(package, tmp_path / "copy")


def test_detect_needs_both_files_and_nanoguards_tensors(package, copy, tmp_path):
    family = NanoGuardFamily()
    assert family.detect(package)
    (copy / "tokenizer.pkl").unlink()
    assert not family.detect(copy)
    other = tmp_path / "other"
    other.mkdir()
    torch.save({"model_state_dict": {"w": torch.zeros(1)}, "config": {}}, other / "model.pt")
    shutil.copy(package / "tokenizer.pkl", other)
    assert not family.detect(other)
    (other / "model.pt").write_text("not a zip")
    assert not family.detect(other)


def test_describe_is_a_float32_sequence_classifier(package):
    spec = NanoGuardFamily().describe(package)
    assert (spec.architecture, spec.model_type, spec.task) == (
        "NanoGuardClassifier",
        "nanoguard",
        "sequence_classification",
    )
    assert (spec.weights, spec.released_dtype, spec.token_limit) == (("model.pt",), "float32", 32)


def rewrite_config(copy, **changes):
    checkpoint = torch.load(copy / "model.pt", weights_only=True)
    checkpoint["config"].update(changes)
    torch.save(checkpoint, copy / "model.pt")


def test_verify_refuses_a_tokenizer_larger_than_the_embedding(copy):
    rewrite_config(copy, vocab_size=100)
    with pytest.raises(PackageError) as caught:
        NanoGuardFamily().verify(copy)
    assert str(caught.value) == "tokenizer.pkl has ids up to 259; model.pt embeds 100 tokens"


def test_verify_refuses_grouped_query_attention(copy):
    rewrite_config(copy, n_kv_head=1)
    with pytest.raises(PackageError, match="n_kv_head 1 differs from n_head 2"):
        NanoGuardFamily().verify(copy)


def test_verify_refuses_a_pickle_that_needs_more_than_weights_only(copy):
    checkpoint = {"model_state_dict": {}, "config": {}, "extra": PackageError("x")}
    torch.save(checkpoint, copy / "model.pt")
    with pytest.raises(PackageError, match=r"does not load with torch.load\(weights_only=True\)"):
        NanoGuardFamily().verify(copy)


def test_the_engine_runs_nanoguard_only(package):
    engine = NanoGuardEngine()
    spec = NanoGuardFamily().describe(package)
    assert engine.supports(spec, CPU) is None
    other = spec.__class__(package, "BertModel", "bert", "encoder", weights=("model.pt",))
    assert engine.supports(other, CPU) == "nanoguard_torch runs NanoGuardClassifier only"
    half = spec.__class__(**{**spec.__dict__, "dtype": "float16"})
    assert engine.supports(half, CPU) == (
        "float16 runs on GPUs only; use --dtype float32 or bfloat16 on a CPU"
    )


def test_the_engine_takes_numpy_and_answers_the_networks_logits_as_numpy(package):
    spec = NanoGuardFamily().describe(package)
    module = NanoGuardEngine().load(spec, CPU, {})
    ids = np.array([[256, 104, 105] + [257] * 29, [256] + [120] * 31], dtype=np.int64)
    mask = (ids != 257).astype(np.int64)
    logits = module.encode(EncoderBatch(ids, mask))
    assert isinstance(logits, np.ndarray) and logits.dtype == np.float32
    assert logits.shape == (2, 2) and logits.flags.c_contiguous
    with torch.inference_mode():
        direct = module.network(torch.tensor(ids), torch.tensor(mask), mask_keys=False)
    assert logits.tobytes() == direct.numpy().tobytes()  # the same bits: only the type changes


def test_the_engine_runs_bfloat16_and_answers_float32_logits(package):
    spec = dataclasses.replace(NanoGuardFamily().describe(package), dtype="bfloat16")
    module = NanoGuardEngine().load(spec, CPU, {})
    assert module.network.cls_head.weight.dtype == torch.bfloat16
    ids = np.array([[256, 104, 105] + [257] * 29], dtype=np.int64)
    logits = module.encode(EncoderBatch(ids, (ids != 257).astype(np.int64)))
    assert isinstance(logits, np.ndarray) and logits.dtype == np.float32
    assert logits.shape == (1, 2) and bool(np.isfinite(logits).all())
