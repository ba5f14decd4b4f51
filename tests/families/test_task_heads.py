"""The task_heads family on tiny fixtures of every supported architecture and head."""

from __future__ import annotations

import base64
import struct

import numpy as np
import pytest
import torch

from vllm_srun.compose.loader import LoadError, LoadOptions, load_model
from vllm_srun.families.task_heads.exits import Exit, rerank_exits
from vllm_srun.families.task_heads.package import (
    MATRYOSHKA_KEY,
    describe,
    embedding_dimensions,
)
from vllm_srun.plugins import PackageError
from vllm_srun.plugins.host import load_catalog
from vllm_srun.plugins.requests import read_request
from vllm_srun.plugins.spec import RequestError

from ..fixtures import ENCODER_CONFIGS, HEAD_LABELS, write_task_package

HEADS = ("sequence", "scores", "token", "pooled", "relevance")


@pytest.fixture(scope="module")
def catalog():
    return load_catalog({})


class Lazy(dict):
    """A mapping that makes each value on first use (a test loads only the models it reads)."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def __missing__(self, key):
        value = self[key] = self.make(key)
        return value


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """``(model_type, head)`` -> a fixture package, written on first use."""
    root = tmp_path_factory.mktemp("task-packages")
    return Lazy(lambda key: write_task_package(root, *key))


@pytest.fixture(scope="module")
def models(packages, catalog):
    """``(model_type, head)`` -> the loaded fixture package, loaded on first use."""
    return Lazy(lambda key: load_model(packages[key], catalog=catalog))


TEXTS = ["good movie", "the food was terrible and the price was bad", "okay"]


@pytest.mark.parametrize("model_type", list(ENCODER_CONFIGS))
@pytest.mark.parametrize("head", HEADS)
def test_every_fixture_keeps_the_exact_promise(models, model_type, head):
    """Under `exact` (the default) a fixture batches across requests only when its
    batched rows are the same bits as alone; otherwise it answers one by one."""
    model = models[(model_type, head)]
    probe = model.batch_invariance
    assert probe["tolerance"] == 0.0
    if probe["cross_request_batching"]:
        assert probe["max_abs_deviation"] == 0.0
    else:
        assert probe["method"] == "one_by_one" and probe["max_abs_deviation"] > 0.0
    assert model.engine.name == "native"
    assert model.card()["batch_invariance"] == probe


@pytest.mark.parametrize("model_type", list(ENCODER_CONFIGS))
@pytest.mark.parametrize("head", HEADS)
def test_every_fixture_passes_the_batching_probe(packages, catalog, model_type, head):
    model = load_model(
        packages[(model_type, head)], LoadOptions(profile="batching"), catalog=catalog
    )
    probe = model.batch_invariance
    assert probe["tolerance"] == 1e-5
    assert probe["max_abs_deviation"] <= 1e-5
    assert probe["cross_request_batching"] is True
    assert model.card()["batch_invariance"] == probe


@pytest.mark.parametrize("model_type", list(ENCODER_CONFIGS))
def test_sequence_head_is_a_softmax_in_id2label_order(models, model_type):
    model = models[(model_type, "sequence")]
    body = model.answer("classify", {"input": TEXTS})
    assert body["kind"] == "sequence" and body["labels"] == list(HEAD_LABELS["sequence"])
    for result in body["results"]:
        probabilities = result["probabilities"]
        assert abs(sum(probabilities) - 1) < 1e-6
        assert result["label"] == body["labels"][probabilities.index(max(probabilities))]


@pytest.mark.parametrize("model_type", ["bert", "modernbert"])
def test_a_row_alone_and_in_a_batch_agree(models, model_type):
    model = models[(model_type, "sequence")]
    together = model.answer("classify", {"input": TEXTS})["results"]
    for index, text in enumerate(TEXTS):
        [alone] = model.answer("classify", {"input": [text]})["results"]
        diff = max(
            abs(a - b)
            for a, b in zip(alone["probabilities"], together[index]["probabilities"], strict=True)
        )
        assert diff <= 1e-5
        assert alone["label"] == together[index]["label"]


def test_scores_head_is_sigmoid_with_package_thresholds(models):
    model = models[("bert", "scores")]
    body = model.answer("classify", {"input": TEXTS})
    thresholds = (0.5, 0.4, 0.9)
    for result in body["results"]:
        assert all(0 <= s <= 1 for s in result["scores"])
        assert result["selected"] == [
            label
            for label, s, t in zip(body["labels"], result["scores"], thresholds, strict=True)
            if s >= t
        ]
    overridden = model.answer("classify", {"input": TEXTS, "options": {"threshold": 0.0}})
    assert overridden["results"][0]["selected"] == list(HEAD_LABELS["scores"])


def test_sequence_results_carry_no_selected(models):
    [result] = models[("bert", "sequence")].answer("classify", {"input": "okay"})["results"]
    assert "selected" not in result and "scores" not in result


def test_token_head_spans_are_code_point_slices(models):
    model = models[("bert", "token")]
    text = "dana whitfield from new york"
    body = model.answer("classify", {"input": text, "options": {"threshold": 0.0}})
    assert body["labels"] == ["PER", "LOC"]
    for span in body["results"][0]["spans"]:
        assert text[span["start"] : span["end"]] == span["text"]
        assert span["label"] in ("PER", "LOC")
        assert span["text"] == span["text"].strip()


def test_pooled_head_matches_a_manual_mean_pool(models, packages):
    import transformers

    model = models[("bert", "pooled")]
    [item] = model.answer("embeddings", {"input": "good movie"})["data"]
    ids = list(
        model.loaded.plan("embeddings", read_request("embeddings", {"input": "good movie"}))
        .items[0]
        .input_ids
    )
    reference = transformers.AutoModel.from_pretrained(
        packages[("bert", "pooled")], attn_implementation="eager"
    ).eval()
    with torch.inference_mode():
        hidden = reference(input_ids=torch.tensor([ids])).last_hidden_state[0]
    want = torch.nn.functional.normalize(hidden.mean(dim=0), dim=0)
    got = torch.tensor(item["embedding"])
    assert torch.allclose(got, want, atol=1e-6)
    assert item["input"] == {
        "tokens": len(ids),
        "processed_tokens": len(ids),
        "truncated": False,
        "windows": 1,
    }


def test_dimensions_truncate_and_renormalise(models):
    model = models[("bert", "pooled")]
    full = torch.tensor(model.answer("embeddings", {"input": "okay"})["data"][0]["embedding"])
    short = torch.tensor(
        model.answer("embeddings", {"input": "okay", "dimensions": 8})["data"][0]["embedding"]
    )
    assert short.shape == (8,)
    assert abs(float(short.norm()) - 1) < 1e-6
    assert torch.allclose(short, torch.nn.functional.normalize(full[:8], dim=0), atol=1e-6)


def test_base64_is_little_endian_float32(models):
    model = models[("bert", "pooled")]
    floats = model.answer("embeddings", {"input": "okay"})["data"][0]["embedding"]
    encoded = model.answer("embeddings", {"input": "okay", "encoding_format": "base64"})
    raw = base64.b64decode(encoded["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(floats)}f", raw)) == pytest.approx(floats, abs=0)


def test_cross_encoder_rerank_orders_by_sigmoid_score(models):
    model = models[("bert", "relevance")]
    body = model.answer(
        "rerank",
        {
            "query": "search",
            "documents": ["good movie", "bad food", "okay", "good movie"],
            "top_n": 10,
            "return_documents": True,
        },
    )
    results = body["results"]
    assert len(results) == 4
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    for r in results:
        assert r["relevance_score"] == pytest.approx(
            1 / (1 + torch.exp(torch.tensor(-r["logit"])).item())
        )
        assert r["document"] == ["good movie", "bad food", "okay", "good movie"][r["index"]]
    duplicates = [r for r in results if r["document"] == "good movie"]
    assert [r["index"] for r in duplicates] == [0, 3]  # ties by index


def test_bi_encoder_rerank_is_the_cosine_of_embeddings(models):
    model = models[("bert", "pooled")]
    body = model.answer(
        "rerank", {"query": "good", "documents": ["good movie", "okay"], "top_n": 1}
    )
    [best] = body["results"]
    q = torch.tensor(model.answer("embeddings", {"input": "good"})["data"][0]["embedding"])
    d = torch.tensor(
        model.answer("embeddings", {"input": ["good movie", "okay"]})["data"][best["index"]][
            "embedding"
        ]
    )
    assert best["relevance_score"] == pytest.approx(float(torch.dot(q, d)), abs=1e-6)


def test_pairs_reach_the_model_with_segment_ids(models):
    model = models[("bert", "sequence")]
    plan = model.loaded.plan(
        "classify",
        read_request("classify", {"input": [{"text": "good movie", "text_pair": "okay"}]}),
    )
    [item] = plan.items
    assert item.token_type_ids is not None and 1 in item.token_type_ids
    single = model.answer("classify", {"input": [{"text": "good movie", "text_pair": "okay"}]})
    assert single["results"][0]["input"]["tokens"] == len(item.input_ids)


def test_limits_take_the_smallest_source_with_the_roberta_offset(packages):
    assert (
        describe(packages[("roberta", "sequence")]).max_tokens == 64
    )  # 66 positions - (pad 1 + 1)
    assert describe(packages[("bert", "sequence")]).max_tokens == 64
    assert describe(packages[("bert", "pooled")]).max_tokens == 48  # sentence-transformers


def test_overflow_reject_truncate_and_window(models):
    model = models[("bert", "sequence")]
    long_text = " ".join(["good movie"] * 60)
    [rejected] = model.answer("classify", {"input": [long_text]})["results"]
    assert rejected["error"] == "max_length_exceeded"
    assert rejected["message"].startswith("input has 122 tokens; the limit is 64.")
    [cut] = model.answer("classify", {"input": [long_text], "options": {"overflow": "truncate"}})[
        "results"
    ]
    assert cut["input"] == {"tokens": 122, "processed_tokens": 64, "truncated": True, "windows": 1}
    [lowered] = model.answer(
        "classify", {"input": [long_text], "options": {"overflow": "truncate", "max_tokens": 10}}
    )["results"]
    assert lowered["input"]["processed_tokens"] == 10
    [windowed] = model.answer(
        "classify",
        {
            "input": [long_text],
            "options": {"overflow": "window", "window": {"tokens": 32, "overlap": 8}},
        },
    )["results"]
    assert windowed["input"]["windows"] == 6  # 30 content tokens a window, step 22
    assert windowed["input"]["processed_tokens"] == 120 + 2 * 6
    [budget] = model.answer(
        "classify", {"input": [long_text], "options": {"overflow": "window", "max_tokens": 50}}
    )["results"]
    assert budget["error"] == "scan_budget_exceeded"


def test_one_bad_input_never_fails_its_siblings(models):
    model = models[("bert", "pooled")]
    body = model.answer("embeddings", {"input": ["okay", " ".join(["good"] * 80), ""]})
    assert "embedding" in body["data"][0] and "embedding" in body["data"][2]
    assert body["data"][1]["error"] == "max_length_exceeded"
    assert body["data"][1]["object"] == "embedding" and body["data"][1]["index"] == 1


@pytest.mark.parametrize(
    ("surface", "request_body", "code", "message"),
    [
        (
            "embeddings",
            {"input": []},
            "invalid_request",
            "input must be a string or a non-empty list",
        ),
        (
            "embeddings",
            {"input": "x", "dimensions": 0},
            "invalid_request",
            "dimensions: Input should be greater than or equal to 1",
        ),
        (
            "embeddings",
            {"input": "x", "dimensions": 33},
            "invalid_request",
            "dimensions must be an integer from 1 to 32, not 33",
        ),
        (
            "embeddings",
            {"input": "x", "encoding_format": "hex"},
            "invalid_request",
            "encoding_format: Input should be 'float' or 'base64'",
        ),
        (
            "embeddings",
            {"input": ["a", 1]},
            "invalid_request",
            'input[1] must be a string or a content part {"type": "text", "text": "..."}',
        ),
        (
            "classify",
            {"input": "x"},
            "unsupported_surface",
            "this model serves embeddings, rerank, not classify",
        ),
        (
            "rerank",
            {"query": "q", "documents": ["d"], "top_n": 0},
            "invalid_request",
            "top_n: Input should be greater than or equal to 1",
        ),
        (
            "embeddings",
            {"input": "x", "options": {"overflow": "cut"}},
            "invalid_request",
            "options.overflow: Input should be 'reject', 'truncate' or 'window'",
        ),
    ],
)
def test_bad_requests_name_what_is_wrong(models, surface, request_body, code, message):
    with pytest.raises(RequestError) as caught:
        models[("bert", "pooled")].answer(surface, request_body)
    assert (caught.value.code, caught.value.message) == (code, message)


def test_classify_head_selection(models):
    model = models[("bert", "token")]
    with pytest.raises(RequestError, match="unknown head 'nope'; this model has token"):
        model.answer("classify", {"input": "x", "head": "nope"})
    with pytest.raises(RequestError, match=r"options\.aggregation: Input should be 'max'"):
        model.answer("classify", {"input": "x", "options": {"aggregation": "mean"}})
    with pytest.raises(RequestError, match=r"input\[0\] has a text_pair; the token head reads"):
        model.answer("classify", {"input": [{"text": "a", "text_pair": "b"}]})
    with pytest.raises(RequestError, match="head: Input should be a valid string"):
        model.answer("classify", {"input": "x", "head": ["token"]})


def test_the_card_describes_heads_embedding_and_limits(models):
    card = models[("bert", "pooled")].card()
    assert card["family"] == "task_heads" and card["engine"] == "native"
    assert card["device"] == "cpu" and card["attention"] == "eager"
    assert card["embedding"] == {
        "dimensions": [32],
        "layers": [2],
        "modalities": ["text"],
        "normalized": True,
        "pooling": "mean",
        "input_types": [],
        "max_tokens": 48,
    }
    assert card["rerank"] == {
        "exits": [{"layer": 2, "dimension": 32}],
        "default": {"layer": 2, "dimension": 32},
    }
    assert card["heads"][0]["kind"] == "pooled"
    token = models[("bert", "token")].card()["heads"][0]
    assert (token["name"], token["labels"]) == ("token", ["PER", "LOC"])


@pytest.mark.parametrize("model_type", ["distilbert", "roberta"])
def test_the_layers_and_exits_come_from_the_config_whatever_its_spelling(models, model_type):
    """DistilBERT says n_layers and dim; the others num_hidden_layers and hidden_size."""
    pooled = models[(model_type, "pooled")]
    assert pooled.loaded.exits() == (Exit(2, 32),)
    assert pooled.loaded.embedding_layers() == (2,)
    assert pooled.card()["embedding"]["layers"] == [2]
    cross = models[(model_type, "relevance")]
    assert cross.loaded.exits() == (Exit(2, 32),)
    assert cross.loaded.embedding_layers() == ()  # a cross-encoder embeds nothing
    assert cross.card()["rerank"]["default"] == {"layer": 2, "dimension": 32}
    assert models[(model_type, "sequence")].loaded.exits() == ()


def test_declared_matryoshka_sizes_join_the_full_size(packages, tmp_path):
    import json
    import shutil

    package = tmp_path / "matryoshka"
    shutil.copytree(packages[("bert", "pooled")], package)
    config = json.loads((package / "config.json").read_text())
    (package / "config.json").write_text(json.dumps({**config, MATRYOSHKA_KEY: [8, 16, 32, 8]}))
    description = describe(package)
    assert embedding_dimensions(description.pooling) == (32, 16, 8)  # full size first
    assert rerank_exits(description) == (Exit(2, 32),)
    for bad in ([64], [0], "16", [], [16.0], [True]):
        (package / "config.json").write_text(json.dumps({**config, MATRYOSHKA_KEY: bad}))
        with pytest.raises(PackageError, match="must be a list of integers from 1 to the"):
            describe(package)
    (package / "config.json").write_text(
        json.dumps({k: v for k, v in config.items() if k != "num_hidden_layers"})
    )
    with pytest.raises(PackageError, match="states no number of hidden layers"):
        describe(package)


def test_family_choice_errors(tmp_path, catalog):
    (tmp_path / "config.json").write_text(
        '{"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]}'
    )
    with pytest.raises(LoadError, match="no family recognizes the package"):
        load_model(tmp_path, catalog=catalog)
    with pytest.raises(LoadError, match="no family named 'nope' is installed"):
        load_model(tmp_path, LoadOptions(family="nope"), catalog=catalog)


def test_engine_choice_lists_every_reason(packages, catalog, tmp_path):
    import shutil

    package = tmp_path / "no-weights"
    shutil.copytree(packages[("bert", "sequence")], package)
    (package / "model.safetensors").unlink()
    with pytest.raises(LoadError, match=r"neither safetensors .* nor an ONNX graph"):
        load_model(package, catalog=catalog)
    with pytest.raises(
        LoadError, match="float16 runs on GPUs only: --dtype float16 cannot be served on cpu"
    ):
        load_model(
            packages[("bert", "sequence")],
            LoadOptions(engine="native", dtype="float16"),
            catalog=catalog,
        )
    with pytest.raises(LoadError, match="device not available"):
        load_model(packages[("bert", "sequence")], LoadOptions(device="cuda:3"), catalog=catalog)


class NanEngine:
    """An engine model whose every output is NaN."""

    def __init__(self, real):
        self.real = real

    def encode(self, batch):
        return np.full_like(self.real.encode(batch), np.nan)


@pytest.mark.parametrize(
    ("head", "surface", "request_body"),
    [
        ("sequence", "classify", {"input": ["okay"]}),
        ("token", "classify", {"input": ["okay"]}),
        ("pooled", "embeddings", {"input": ["okay"]}),
        ("relevance", "rerank", {"query": "q", "documents": ["okay"]}),
    ],
)
def test_a_non_finite_output_is_an_item_error_never_nan_in_json(
    packages, catalog, head, surface, request_body
):
    import json

    model = load_model(packages[("bert", head)], catalog=catalog)
    family_model = getattr(model.loaded, "host", model.loaded)  # under a surface extension
    family_model.engine_model = NanEngine(family_model.engine_model)
    body = model.answer(surface, request_body)
    json.dumps(body, allow_nan=False)
    items = body.get("results") or body.get("data")
    assert items[0]["error"] == "invalid_model_output"


def test_a_lone_surrogate_is_an_item_error_beside_good_siblings(models):
    body = models[("bert", "pooled")].answer("embeddings", {"input": ["okay", "\ud800 x"]})
    assert "embedding" in body["data"][0]
    assert body["data"][1]["error"] == "invalid_input"
    assert body["data"][1]["message"].startswith("the text has a lone surrogate U+D800")


def test_text_spelling_a_special_token_is_read_as_text(models):
    model = models[("bert", "sequence")]
    [item] = model.loaded.plan(
        "classify", read_request("classify", {"input": "good [SEP] movie"})
    ).items
    assert item.input_ids.count(3) == 1  # [SEP] (id 3) only closes the row
    assert item.input_ids[-1] == 3


@pytest.mark.parametrize(
    ("request_body", "message"),
    [
        (None, "the request must be a JSON object"),
        ({"input": "x", "options": []}, "options: Input should be a valid dictionary"),
        (
            {"input": "x", "options": {"window": 0}},
            r"options\.window: Input should be a valid dict",
        ),
        (
            {"input": "x", "options": {"overflow": "window", "window": {"tokens": 2}}},
            "a window of 2 tokens has no room for content beside 2 special tokens",
        ),
        (
            {"input": ["", "hi"], "options": {"overflow": "truncate", "max_tokens": 2}},
            "options.max_tokens 2 leaves no room beside 2 special tokens",
        ),
    ],
)
def test_malformed_options_are_request_errors(models, request_body, message):
    with pytest.raises(RequestError, match=message):
        models[("bert", "sequence")].answer("classify", request_body)


def test_tiny_windows_stay_linear(models):
    model = models[("bert", "sequence")]
    text = "good " * 4000
    options = {"overflow": "window", "window": {"tokens": 3, "overlap": 0}}
    plan = model.loaded.plan(
        "classify", read_request("classify", {"input": text, "options": options})
    )
    assert len(plan.items) == 4000
    assert all(item.tokens == 3 for item in plan.items)


def test_rerank_top_n_counts_failed_documents_and_cosines_stay_in_range(models):
    model = models[("bert", "pooled")]
    body = model.answer(
        "rerank", {"query": "good", "documents": ["good", " ".join(["x"] * 80)], "top_n": 1}
    )
    assert [r["index"] for r in body["results"]] == [0]
    assert -1.0 <= body["results"][0]["relevance_score"] <= 1.0
    with pytest.raises(RequestError, match="return_documents: Input should be a valid boolean"):
        model.answer("rerank", {"query": "q", "documents": ["d"], "return_documents": "no"})


def test_a_model_that_needs_lapack_fails_with_the_operator_phrase(packages, catalog, monkeypatch):
    from vllm_srun.engines.native import NativeEngine

    def no_lapack(self, spec, device, options):
        raise RuntimeError(
            "Calling torch.linalg.cholesky on a CPU tensor requires compiling PyTorch with LAPACK."
        )

    monkeypatch.setattr(NativeEngine, "load", no_lapack)
    with pytest.raises(LoadError) as raised:
        load_model(packages[("bert", "sequence")], LoadOptions(engine="native"), catalog=catalog)
    assert str(raised.value).startswith("built without LAPACK: the model needs LAPACK on cpu")
    assert raised.value.retryable is False


def test_family_options_set_the_classify_defaults_and_bad_ones_fail_the_load(
    packages, catalog, models
):
    package = packages[("bert", "token")]
    plain = models[("bert", "token")].loaded
    strict = load_model(
        package,
        LoadOptions(family_options={"threshold": 0.99, "aggregation": "first"}),
        catalog=catalog,
    ).loaded
    request = read_request("classify", {"input": "dana from paris"})
    readout = ("threshold", "aggregation")

    def family_options(model, asked):
        """The family's own plan's options, under the plans of extensions that augment
        classify (pii_patterns wraps every token model's)."""
        plan = model.plan("classify", asked)
        while hasattr(plan, "inner"):
            plan = plan.inner
        return plan.options

    planned = family_options(plain, request)
    assert {k: planned[k] for k in readout} == {"threshold": None, "aggregation": "max"}
    planned = family_options(strict, request)
    assert {k: planned[k] for k in readout} == {"threshold": 0.99, "aggregation": "first"}
    asked = read_request("classify", {"input": "x", "options": {"threshold": 0.1}})
    assert family_options(strict, asked)["threshold"] == 0.1  # the request wins
    for options, message in (
        (
            {"overflow": "truncate"},
            "family task_heads has no option overflow; it takes "
            "threshold, aggregation; fix `options` in the models file",
        ),
        (
            {"threshold": 2},
            "option threshold must be a number from 0 to 1, not 2; fix "
            "`options` in the models file",
        ),
        (
            {"aggregation": "mean"},
            "option aggregation must be one of max, first, average, "
            "none, not 'mean'; fix `options` in the models file",
        ),
    ):
        with pytest.raises(LoadError) as raised:
            load_model(package, LoadOptions(family_options=options), catalog=catalog)
        assert str(raised.value) == message
