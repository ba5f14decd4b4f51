"""The export cache's records: a cached graph is used only when its record verifies it, a
restart reads the record without hashing, and an export runs in a child process when this
process has not imported torch and transformers."""

from __future__ import annotations

import dataclasses
import json
import logging

import numpy as np
import pytest

from vllm_srun.compose.loader import EngineOptions, verified_weights_digest
from vllm_srun.engines.onnxruntime import OnnxRuntimeEngine, ensure_export, export_dir
from vllm_srun.engines.onnxruntime import export as ort_export
from vllm_srun.engines.onnxruntime.export import (
    GRAPH_FILE,
    RECORD_FILE,
    BuildError,
    check_build,
    run_builder,
    weights_digest,
)
from vllm_srun.plugins import DeviceInfo
from vllm_srun.plugins.spec import EncoderBatch, ModelSpec

from ..fixtures import padded_batch, spec_for, write_encoder

CPU = DeviceInfo("cpu", None, "cpu", None, None, {})
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning:optimum.*"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning:torch.onnx.*"),
    pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning"),
]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("VLLM_SRUN_CACHE_DIR", str(root))
    return root


@pytest.fixture
def spec(tmp_path):
    return spec_for(write_encoder(tmp_path, "bert", "encoder"), "encoder")


@pytest.fixture
def hashes(monkeypatch):
    """Every file the export cache hashes, by name, in order."""
    seen: list[str] = []
    real = ort_export._file_sha256

    def counted(path):
        seen.append(path.name)
        return real(path)

    monkeypatch.setattr(ort_export, "_file_sha256", counted)
    return seen


@pytest.mark.slow
def test_an_export_carries_a_record_that_verifies_it(cache, spec):
    graph = ensure_export(spec)
    record = json.loads((graph.parent / RECORD_FILE).read_text())
    assert record["version"] == 2 and record["kind"] == "export"
    assert record["weights_digest"] == weights_digest(spec)
    assert record["graph"] == GRAPH_FILE
    assert record["files"][GRAPH_FILE]["sha256"] == ort_export._file_sha256(graph)
    assert set(record["files"]) == {p.name for p in graph.parent.iterdir()} - {RECORD_FILE}
    assert set(record["libraries"]) == set(ort_export.BUILD_LIBRARIES)
    assert record["libraries"]["onnxruntime"] is not None
    assert check_build(graph.parent, weights_digest(spec), "export") is None
    assert check_build(graph.parent, "0" * 64, "export") == (
        "its record names other weights or another build"
    )


@pytest.mark.slow
def test_a_restart_reads_the_record_and_hashes_nothing(cache, spec, hashes, monkeypatch):
    monkeypatch.setattr(ort_export, "SETTLE_NS", 0)  # the files count as settled at once
    # the loader sets the weights digest from the digests verification keeps
    spec = dataclasses.replace(spec, weights_digest=weights_digest(spec))
    graph = ensure_export(spec)
    first = list(hashes)
    assert GRAPH_FILE in first  # the record is written from the bytes
    hashes.clear()
    assert ensure_export(spec) == graph
    assert OnnxRuntimeEngine().supports(spec, CPU) is None
    assert hashes == []


@pytest.mark.slow
def test_a_graph_that_differs_from_its_record_is_exported_again(cache, spec, caplog):
    graph = ensure_export(spec)
    good = graph.read_bytes()
    graph.write_bytes(good[:-8] + b"\0" * 8)  # same size, other bytes
    assert check_build(graph.parent, weights_digest(spec), "export") == (
        "model.onnx differs from its record"
    )
    with caplog.at_level(logging.WARNING, logger="vllm_srun.engines.onnxruntime"):
        again = ensure_export(spec)
    assert again == graph and again.read_bytes() != good[:-8] + b"\0" * 8
    assert "is not used (model.onnx differs from its record): building it again" in caplog.text
    assert check_build(graph.parent, weights_digest(spec), "export") is None


@pytest.mark.slow
def test_an_export_without_a_record_is_not_trusted(cache, spec, caplog):
    graph = ensure_export(spec)
    (graph.parent / RECORD_FILE).unlink()
    assert OnnxRuntimeEngine().supports(spec, CPU) is None  # optimum says it can export it
    with caplog.at_level(logging.WARNING, logger="vllm_srun.engines.onnxruntime"):
        ensure_export(spec)
    assert "is not used (it has no record.json)" in caplog.text
    assert (graph.parent / RECORD_FILE).is_file()


@pytest.mark.slow
def test_a_verified_export_is_supported_without_asking_optimum(cache, spec, monkeypatch):
    ensure_export(spec)

    def refuse(*args):
        raise AssertionError("optimum was asked")

    monkeypatch.setattr("vllm_srun.engines.onnxruntime.export_refusal", refuse)
    monkeypatch.setattr("vllm_srun.engines.onnxruntime.run_builder", refuse)
    assert OnnxRuntimeEngine().supports(spec, CPU) is None
    bf16 = ModelSpec(**{**spec.__dict__, "dtype": "bfloat16"})
    assert OnnxRuntimeEngine().supports(bf16, CPU) == (
        "onnxruntime exports float32 graphs; use --dtype float32 (or --engine native for bfloat16)"
    )


@pytest.mark.slow
def test_without_torch_here_the_export_and_the_check_run_in_a_child_process(
    cache, spec, monkeypatch
):
    """The child process (python -m vllm_srun.engines.onnxruntime.build) exports the same
    graph the in-process exporter writes; it answers optimum's refusals too."""
    monkeypatch.setattr(ort_export, "in_process", lambda: False)
    monkeypatch.setattr("vllm_srun.engines.onnxruntime.in_process", lambda: False)
    monkeypatch.setattr(ort_export, "export_onnx", None)  # never called in this process
    engine = OnnxRuntimeEngine()
    assert engine.supports(spec, CPU) is None
    xlnet = ModelSpec(spec.package, "XLNetModel", "xlnet", "encoder", weights=spec.weights)
    assert engine.supports(xlnet, CPU) == "optimum cannot export model type 'xlnet' to ONNX"
    loaded = engine.load(spec, CPU, {})
    assert loaded.graph == export_dir(spec) / GRAPH_FILE
    assert check_build(loaded.graph.parent, weights_digest(spec), "export") is None
    monkeypatch.undo()
    other = cache.parent / "in-process"
    monkeypatch.setenv("VLLM_SRUN_CACHE_DIR", str(other))
    here = OnnxRuntimeEngine().load(spec, CPU, {})
    batch = EncoderBatch(**padded_batch([5, 3]))
    assert np.array_equal(loaded.encode(batch), here.encode(batch))


def test_a_failed_build_says_what_the_child_said(tmp_path):
    with pytest.raises(BuildError, match=r"failed: .*Error: .*"):
        run_builder("export", str(tmp_path / "absent"), "encoder", str(tmp_path / "out"))
    with pytest.raises(BuildError, match="failed: "):
        run_builder("no-such-command")


def test_the_loader_s_weights_digest_is_the_export_cache_s(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(b"first")
    (tmp_path / "b.safetensors").write_bytes(b"second")
    files = {
        name: ort_export._file_sha256(tmp_path / name)
        for name in ("a.safetensors", "b.safetensors")
    }
    for weights in (("a.safetensors",), ("b.safetensors", "a.safetensors")):
        spec = ModelSpec(tmp_path, "BertModel", "bert", "encoder", weights=weights)
        assert verified_weights_digest(weights, files) == weights_digest(spec)
    assert verified_weights_digest(("c.safetensors",), files) is None
    assert verified_weights_digest((), files) is None


def test_engine_options_make_the_torch_device_on_first_read():
    made: list[int] = []
    options = EngineOptions({"threads": 2}, lambda: made.append(1) or "device")
    assert options["threads"] == 2 and options.get("providers") is None
    assert made == []
    assert sorted(options) == ["threads", "torch_device"] and len(options) == 2
    assert options.get("torch_device") == "device" and options["torch_device"] == "device"
    assert made == [1]


@pytest.mark.slow
def test_the_weights_beside_the_graph_give_the_same_bits(cache, spec, monkeypatch, tmp_path):
    """An export keeps its weights in model.onnx_data (ONNX Runtime maps them): the same
    graph and values as optimum's single file, so the same bits."""
    mapped = OnnxRuntimeEngine().load(spec, CPU, {})
    assert (mapped.graph.parent / ort_export.WEIGHTS_FILE).is_file()
    assert mapped.graph.stat().st_size < 64 * 1024  # the graph alone; the weights beside it
    monkeypatch.setattr(ort_export, "external_weights", lambda graph: None)
    monkeypatch.setenv("VLLM_SRUN_CACHE_DIR", str(tmp_path / "inline"))
    inline = OnnxRuntimeEngine().load(spec, CPU, {})
    assert not (inline.graph.parent / ort_export.WEIGHTS_FILE).exists()
    batch = EncoderBatch(**padded_batch([7, 3, 5]))
    assert np.array_equal(mapped.encode(batch), inline.encode(batch))
