"""Adapter packages (``--base-path``): a PEFT LoRA adapter on a tiny generated base, merged
into it and served; the base checked against the hashes the package records.

The expected answers come from transformers and peft directly
(``PeftModel.from_pretrained(base, adapter).merge_and_unload()``, a forward per text,
mean pooling and L2 normalisation by hand), never from the runtime's helpers.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from tests.fixtures import write_task_package
from vllm_srun.compose import adapters
from vllm_srun.compose.adapters import BASE_RECORD, read_base_record, write_base_record
from vllm_srun.compose.loader import LoadOptions, load_model
from vllm_srun.config import ModelConfig, ServeConfig
from vllm_srun.errors import LoadError
from vllm_srun.plugins.host import load_catalog
from vllm_srun.serve.app import build_app
from vllm_srun.service.runtime import Runtime

from .conftest import REVISION, write_cache

with warnings.catch_warnings():  # starlette's notice about httpx2 is not ours to act on
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

BASE_REPO = "tiny-org/bert-pooled"
TEXTS = ["the movie was good", "a terrible film", "dana lives in new york"]


@pytest.fixture(scope="module")
def catalog():
    return load_catalog({})


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """``(base, adapter)``: a tiny sentence-transformers-style BERT embedder (wide weights,
    so that answers differ clearly) and a LoRA adapter on its query and value projections,
    with non-zero B matrices (a fresh LoRA merges to the base unchanged), saved by
    ``save_pretrained`` with its ``base_model.json``."""
    import transformers
    from peft import LoraConfig, get_peft_model

    root = tmp_path_factory.mktemp("adapters")
    base = write_task_package(root, "bert", "pooled")
    config = transformers.AutoConfig.from_pretrained(base)
    config.initializer_range = 0.5
    torch.manual_seed(0)
    transformers.AutoModel.from_config(config).save_pretrained(base, safe_serialization=True)
    model = transformers.AutoModel.from_pretrained(base)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["query", "value"])
    torch.manual_seed(1)
    peft_model = get_peft_model(model, lora)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.3)
    adapter = root / "my-adapter"
    peft_model.save_pretrained(adapter, safe_serialization=True)
    write_base_record(adapter, base, repo=BASE_REPO, revision=REVISION)
    return base, adapter


@pytest.fixture(autouse=True)
def merged_cache(tmp_path, monkeypatch) -> Path:
    """Each test merges into a cache of its own."""
    cache = tmp_path / "vllm-srun-cache"
    monkeypatch.setenv("VLLM_SRUN_CACHE_DIR", str(cache))
    return cache / "adapters"


@pytest.fixture
def merges(monkeypatch) -> list[Path]:
    """The merged packages written (one entry per merge)."""
    made: list[Path] = []
    real = adapters.merge

    def counted(adapter, base_dir, record, out):
        made.append(out)
        real(adapter, base_dir, record, out)

    monkeypatch.setattr(adapters, "merge", counted)
    return made


def peft_merged(base: Path, adapter: Path):
    """The base with the adapter merged in, by transformers and peft (eager attention)."""
    import transformers
    from peft import PeftModel

    model = transformers.AutoModel.from_pretrained(base, attn_implementation="eager")
    return PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().eval()


def reference_embeddings(base: Path, adapter: Path, texts: list[str]) -> torch.Tensor:
    """What transformers and peft answer: the merged model's mean-pooled, L2-normalised
    last hidden states, one text at a time."""
    import transformers

    merged = peft_merged(base, adapter)
    tokenizer = transformers.AutoTokenizer.from_pretrained(base)
    rows = []
    for text in texts:
        encoded = tokenizer(text, return_tensors="pt")
        with torch.inference_mode():
            hidden = merged(**encoded).last_hidden_state[0]
        rows.append(torch.nn.functional.normalize(hidden.mean(dim=0), dim=0))
    return torch.stack(rows)


def embeddings(body: dict) -> torch.Tensor:
    return torch.tensor([item["embedding"] for item in body["data"]])


def test_base_model_json_records_every_loadable_base_file(built):
    base, adapter = built
    record = read_base_record(adapter)
    assert (record.repo, record.revision) == (BASE_REPO, REVISION)
    assert {"config.json", "model.safetensors", "tokenizer.json", "vocab.txt"} <= set(record.files)
    assert {"modules.json", "1_Pooling/config.json", "sentence_bert_config.json"} <= set(
        record.files
    )
    assert record.files["model.safetensors"] == adapters.sha256_file(base / "model.safetensors")


def test_an_adapter_served_with_base_path_answers_what_peft_merged_answers(built, catalog):
    base, adapter = built
    config = ServeConfig(
        models=[ModelConfig(model=str(adapter), name="adapted", base_path=str(base), device="cpu")]
    )
    runtime = Runtime(config, catalog=catalog)
    try:
        runtime.start_loading().join(300)
        client = TestClient(build_app(runtime))
        card = client.get("/v1/models/adapted").json()
        assert card["status"] == "ready", card["reason"]
        body = client.post("/v1/embeddings", json={"model": "adapted", "input": TEXTS}).json()
    finally:
        runtime.stop()
    want = reference_embeddings(base, adapter, TEXTS)
    got = embeddings(body)
    assert torch.allclose(got, want, atol=1e-6), (got - want).abs().max()
    plain = load_model(str(base), LoadOptions(device="cpu"), catalog=catalog)
    alone = embeddings(plain.answer("embeddings", {"input": TEXTS}))
    assert (alone - got).abs().max() > 1e-2  # the adapter changes the answers
    assert card["engine_args"]["base_path"] == str(base)
    assert card["adapter"]["package"] == str(adapter)
    assert card["adapter"]["peft_type"] == "LORA"
    assert card["adapter"]["adapter_sha256"] == adapters.sha256_file(
        adapter / "adapter_model.safetensors"
    )
    assert card["adapter"]["base"]["repo"] == BASE_REPO
    assert card["adapter"]["base"]["revision"] == REVISION
    assert card["adapter"]["base"]["verification"] == "base_path"
    assert card["adapter"]["base"]["source"] == f"--base-path {base}"
    assert card["adapter"]["base"]["files"] == read_base_record(adapter).files
    assert card["surfaces"][0] == "embeddings"


def test_the_merged_weights_are_peft_merged_weights_bit_for_bit(built, catalog):
    from safetensors.torch import load_file

    base, adapter = built
    served = load_model(str(adapter), LoadOptions(base_path=str(base)), catalog=catalog)
    saved = load_file(served.package / "model.safetensors")
    want = peft_merged(base, adapter).state_dict()
    assert set(saved) <= set(want)
    assert all(torch.equal(saved[k], want[k]) for k in saved)
    changed = [k for k in saved if "query" in k or "value" in k]
    before = load_file(base / "model.safetensors")
    assert changed and all(not torch.equal(saved[k], before[k]) for k in changed if "weight" in k)


def test_the_merged_package_holds_the_base_tokenizer_and_pooling_files_and_no_other_weights(
    built, catalog
):
    base, adapter = built
    (base / "onnx").mkdir(exist_ok=True)  # a graph of the base would answer without the adapter
    try:
        (base / "onnx" / "model.onnx").write_bytes(b"not a graph")
        write_base_record(adapter, base, repo=BASE_REPO, revision=REVISION)
        served = load_model(str(adapter), LoadOptions(base_path=str(base)), catalog=catalog)
    finally:
        shutil.rmtree(base / "onnx")
        write_base_record(adapter, base, repo=BASE_REPO, revision=REVISION)
    merged = served.package
    files = sorted(p.relative_to(merged).as_posix() for p in merged.rglob("*") if p.is_file())
    assert "onnx/model.onnx" not in files
    assert [f for f in files if f.endswith(".safetensors")] == ["model.safetensors"]
    for name in ("modules.json", "1_Pooling/config.json", "sentence_bert_config.json", "vocab.txt"):
        assert (merged / name).read_bytes() == (base / name).read_bytes(), name
    assert served.name == "my-adapter"  # the adapter folder's name, not the cache key


def test_a_base_file_whose_hash_differs_is_refused_with_both_digests(built, catalog, tmp_path):
    base, adapter = built
    copy = Path(shutil.copytree(base, tmp_path / "base"))
    with open(copy / "model.safetensors", "ab") as handle:
        handle.write(b"\0")
    got = adapters.sha256_file(copy / "model.safetensors")
    want = read_base_record(adapter).files["model.safetensors"]
    with pytest.raises(LoadError) as caught:
        load_model(str(adapter), LoadOptions(base_path=str(copy)), catalog=catalog)
    message = str(caught.value)
    assert message.startswith("a file hash does not match: model.safetensors in ")
    assert got in message and want in message
    assert f"{BASE_REPO}@{REVISION}" in message
    assert "--base-path" in message and not caught.value.retryable


def test_a_missing_base_file_is_named(built, catalog, tmp_path):
    base, adapter = built
    copy = Path(shutil.copytree(base, tmp_path / "base"))
    (copy / "1_Pooling" / "config.json").unlink()
    with pytest.raises(
        LoadError, match=r"a file the base model needs is missing: 1_Pooling/config"
    ):
        load_model(str(adapter), LoadOptions(base_path=str(copy)), catalog=catalog)


def test_a_missing_base_without_base_path_offline_fails_clearly(built, catalog, tmp_path):
    _, adapter = built
    hf_cache = tmp_path / "hf"
    options = LoadOptions(offline=True, cache_dir=str(hf_cache))
    with pytest.raises(LoadError) as caught:
        load_model(str(adapter), options, catalog=catalog)
    message = str(caught.value)
    assert message.startswith(f"{BASE_REPO} at {REVISION} is not in the Hugging Face cache")
    assert "downloads are off (--offline)" in message
    assert f"the base model {BASE_REPO}@{REVISION} of the adapter package {adapter}" in message
    assert "give --base-path a local copy" in message
    assert not caught.value.retryable


def test_without_base_path_the_base_comes_from_the_registry_and_is_checked(
    built, catalog, tmp_path
):
    base, adapter = built
    hf_cache = tmp_path / "hf"
    write_cache(hf_cache, BASE_REPO, REVISION, base)
    options = LoadOptions(offline=True, cache_dir=str(hf_cache))
    served = load_model(str(adapter), options, catalog=catalog)
    card = served.card()["adapter"]["base"]
    assert card["verification"] == "revision"
    assert card["source"].startswith("the Hugging Face cache")
    want = reference_embeddings(base, adapter, TEXTS[:1])
    assert torch.allclose(
        embeddings(served.answer("embeddings", {"input": TEXTS[:1]})), want, atol=1e-6
    )
    # another revision's bytes in the cache are refused like a bad --base-path
    other = Path(shutil.copytree(base, tmp_path / "other"))
    (other / "vocab.txt").write_text((other / "vocab.txt").read_text() + "extra\n")
    shutil.rmtree(hf_cache)
    write_cache(hf_cache, BASE_REPO, REVISION, other)
    with pytest.raises(LoadError, match=r"^a file hash does not match: vocab.txt in .*hf/models--"):
        load_model(str(adapter), options, catalog=catalog)


def test_the_second_load_reuses_the_merged_package(built, catalog, merges, merged_cache):
    base, adapter = built
    options = LoadOptions(base_path=str(base))
    first = load_model(str(adapter), options, catalog=catalog)
    assert len(merges) == 1 and first.card()["adapter"]["merged"]["reused"] is False
    assert first.package.parent == merged_cache
    weights = first.package / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    second = load_model(str(adapter), options, catalog=catalog)
    assert len(merges) == 1  # no second merge
    assert second.package == first.package and weights.stat().st_mtime_ns == stamp
    assert second.card()["adapter"]["merged"] == {"path": str(first.package), "reused": True}
    assert [p.name for p in merged_cache.iterdir()] == [first.package.name]  # no leftovers
    request = {"input": TEXTS}
    assert second.answer("embeddings", request) == first.answer("embeddings", request)


def test_a_damaged_merged_package_is_merged_again(built, catalog, merges):
    base, adapter = built
    options = LoadOptions(base_path=str(base))
    first = load_model(str(adapter), options, catalog=catalog)
    answer = first.answer("embeddings", {"input": TEXTS})
    with open(first.package / "model.safetensors", "ab") as handle:
        handle.write(b"\0")
    again = load_model(str(adapter), options, catalog=catalog)
    assert len(merges) == 2 and again.card()["adapter"]["merged"]["reused"] is False
    assert again.answer("embeddings", {"input": TEXTS}) == answer


def test_another_adapter_or_base_is_another_merged_package(built, catalog, tmp_path):
    base, adapter = built
    first = load_model(str(adapter), LoadOptions(base_path=str(base)), catalog=catalog)
    other = Path(shutil.copytree(adapter, tmp_path / "other-adapter"))
    config = json.loads((other / "adapter_config.json").read_text())
    config["lora_alpha"] = 16  # twice the scale: other weights
    (other / "adapter_config.json").write_text(json.dumps(config))
    second = load_model(str(other), LoadOptions(base_path=str(base)), catalog=catalog)
    assert second.package != first.package
    request = {"input": TEXTS[:1]}
    assert second.answer("embeddings", request) != first.answer("embeddings", request)


def test_base_path_for_a_package_that_is_not_an_adapter_is_refused(built, catalog):
    base, _ = built
    with pytest.raises(LoadError, match=r"^base_path applies to adapter packages only"):
        load_model(str(base), LoadOptions(base_path=str(base)), catalog=catalog)


def test_an_adapter_without_a_base_record_says_what_to_write(built, catalog, tmp_path):
    _, adapter = built
    bare = Path(shutil.copytree(adapter, tmp_path / "bare"))
    (bare / BASE_RECORD).unlink()
    with pytest.raises(LoadError, match=r"records no base model: base_model.json is missing"):
        load_model(str(bare), LoadOptions(), catalog=catalog)
    (bare / BASE_RECORD).write_text(json.dumps({"repo": BASE_REPO, "files": {"../x": "0" * 64}}))
    with pytest.raises(LoadError, match=r"paths outside the base: \.\./x"):
        load_model(str(bare), LoadOptions(), catalog=catalog)


def test_base_path_is_an_option_a_models_file_key_and_on_the_card(tmp_path):
    from vllm_srun.cli import build_parser
    from vllm_srun.engine_args import EngineArgs
    from vllm_srun.serve.command import serve_config

    config = serve_config(build_parser().parse_args(["serve", "./a", "--base-path", "/m/base"]))
    assert config.models[0].base_path == "/m/base"
    models = tmp_path / "models.yaml"
    models.write_text("models:\n  - model: ./a\n    base_path: /m/other\n  - model: ./b\n")
    config = serve_config(build_parser().parse_args(["serve", "--models", str(models)]))
    assert [m.base_path for m in config.models] == ["/m/other", None]
    assert EngineArgs(base_path="/m/x").card()["base_path"] == "/m/x"
    assert dataclasses.asdict(config.models[0].engine_args())["base_path"] == "/m/other"
