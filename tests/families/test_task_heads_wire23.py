"""The task_heads family's part of wire contract 2.3: the exits each surface reads
(:mod:`vllm_srun.families.task_heads.exits`), per-token label probabilities, classify
windows, rerank ``input`` and the surfaces' own ``meta`` keys, on tiny fixtures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vllm_srun.compose.loader import load_model
from vllm_srun.families.task_heads.exits import (
    Exit,
    check_layer,
    check_rerank_exit,
    embedding_exits,
    embedding_modalities,
    rerank_exits,
)
from vllm_srun.families.task_heads.model import TaskModel
from vllm_srun.families.task_heads.package import describe
from vllm_srun.families.task_heads.readouts import label_probabilities
from vllm_srun.plugins.host import load_catalog
from vllm_srun.plugins.requests import read_request
from vllm_srun.plugins.spec import RequestError

from ..fixtures import ENCODER_CONFIGS, write_task_package

LONG = " ".join(["good movie"] * 60)  # 120 content tokens


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """``package(model_type, head)``: a fixture package, written once."""
    root = tmp_path_factory.mktemp("wire23")
    written: dict[tuple[str, str], Path] = {}

    def get(model_type: str, head: str) -> Path:
        if (model_type, head) not in written:
            written[model_type, head] = write_task_package(root, model_type, head)
        return written[model_type, head]

    return get


@pytest.fixture(scope="module")
def catalog():
    return load_catalog({})


@pytest.fixture(scope="module")
def loaded(package, catalog):
    """BERT fixtures by head, loaded once; the family's TaskModel of each."""
    cache: dict[str, TaskModel] = {}

    def get(head: str) -> TaskModel:
        if head not in cache:
            served = load_model(package("bert", head), catalog=catalog)
            cache[head] = getattr(served.loaded, "host", served.loaded)
        return cache[head]

    return get


def answer(model, surface, body):
    plan = model.plan(surface, read_request(surface, body))
    return model.finish(plan, model.run(plan.items))


# -- exits -----------------------------------------------------------------------------------
@pytest.mark.parametrize("model_type", list(ENCODER_CONFIGS))
def test_each_architecture_declares_its_last_layer_as_the_exit(package, model_type):
    # every fixture has 2 layers of 32 (DistilBERT spells them n_layers and dim)
    pooled = describe(package(model_type, "pooled"))
    assert pooled.layers == 2
    assert embedding_exits(pooled) == rerank_exits(pooled) == (Exit(2, 32),)
    assert embedding_modalities(pooled) == ("text",)
    relevance = describe(package(model_type, "relevance"))
    assert rerank_exits(relevance) == (Exit(2, 32),)
    assert embedding_exits(relevance) == () and embedding_modalities(relevance) == ()
    sequence = describe(package(model_type, "sequence"))
    assert rerank_exits(sequence) == embedding_exits(sequence) == ()


def test_exit_checks_answer_the_default_and_name_the_exits_when_refusing():
    exits = (Exit(6, 384),)
    assert Exit(6, 384).card() == {"layer": 6, "dimension": 384}
    assert check_layer(exits, None) == check_layer(exits, 6) == Exit(6, 384)
    assert check_layer((), None) is None
    with pytest.raises(RequestError) as raised:
        check_layer(exits, 3)
    assert (raised.value.code, raised.value.message) == (
        "invalid_request",
        "layer 3 is not an exit of this model; its exits are [6]",
    )
    with pytest.raises(RequestError, match=r"its exits are \[\]$"):
        check_layer((), 6)
    two = (Exit(12, 768), Exit(6, 384))
    assert check_layer(two, None) == Exit(12, 768) and check_layer(two, 6) == Exit(6, 384)
    with pytest.raises(RequestError, match=r"its exits are \[12, 6\]$"):
        check_layer(two, 3)
    assert check_rerank_exit(two, None, None) == Exit(12, 768)
    assert check_rerank_exit(two, 6, 384) == Exit(6, 384)
    assert check_rerank_exit(two, None, 768) == Exit(12, 768)
    assert check_rerank_exit((), None, None) is None
    with pytest.raises(RequestError) as raised:
        check_rerank_exit(two, 6, 768)
    assert raised.value.message == (
        "dimensions 768 is not an exit of this model at layer 6; its exits are "
        "[layer 12 at dimension 768, layer 6 at dimension 384]: send 384 or leave it out"
    )
    with pytest.raises(RequestError) as raised:
        check_rerank_exit((), None, 32)
    assert raised.value.message == (
        "dimensions 32 is not an exit of this model; its exits are []: leave it out"
    )


def test_embeddings_dimensions_are_bounded_by_the_exit(loaded):
    pooled = loaded("pooled")
    body = answer(pooled, "embeddings", {"input": "good", "layer": 2, "dimensions": 32})
    assert len(body["data"][0]["embedding"]) == 32
    with pytest.raises(RequestError, match="dimensions must be an integer from 1 to 32, not 33"):
        pooled.plan("embeddings", read_request("embeddings", {"input": "a", "dimensions": 33}))


# -- per-token label probabilities -----------------------------------------------------------
def test_label_probabilities_add_each_labels_b_and_i_tags():
    tags = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")
    probabilities = np.array(
        [[0.5, 0.1, 0.2, 0.15, 0.05], [0.0, 0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0]],
        dtype=np.float32,
    )
    got = label_probabilities(probabilities, tags, ("PER", "LOC"))
    assert got.dtype == np.float32 and got.shape == (3, 2)
    # each sum is one float32 addition of the two tags' probabilities, bit for bit
    p = probabilities
    assert np.array_equal(got, np.stack([p[:, 1] + p[:, 2], p[:, 3] + p[:, 4]], axis=1))
    assert np.allclose(got, [[0.3, 0.2], [1.0, 0.0], [0.0, 0.0]])
    # the labels' order is the response's, whatever the tags' order
    swapped = label_probabilities(probabilities, tags, ("LOC", "PER"))
    assert np.array_equal(swapped, got[:, ::-1])
    empty = np.zeros((0, 5), dtype=np.float32)
    assert label_probabilities(empty, tags, ("PER", "LOC")).shape == (0, 2)


def test_return_tokens_is_planned_for_token_heads_only(loaded):
    asked = {"input": "dana", "options": {"return_tokens": True}}
    assert loaded("token").plan("classify", read_request("classify", asked)).options["tokens"]
    assert (
        not loaded("sequence").plan("classify", read_request("classify", asked)).options["tokens"]
    )
    unasked = read_request("classify", {"input": "dana", "options": {"return_tokens": False}})
    assert not loaded("token").plan("classify", unasked).options["tokens"]
    body = answer(loaded("token"), "classify", asked)
    [token] = body["results"][0]["tokens"]
    assert (token["start"], token["end"]) == (0, 4) and len(token["probabilities"]) == 2


# -- classify windows ------------------------------------------------------------------------
def test_a_cross_encoder_lists_each_windows_score(loaded):
    relevance = loaded("relevance")
    options = {"overflow": "window", "window": {"tokens": 20, "overlap": 4}}
    body = answer(relevance, "classify", {"input": [LONG, "good"], "options": options})
    long, short = body["results"]
    assert len(long["windows"]) == 9 and all(len(w["scores"]) == 1 for w in long["windows"])
    assert long["scores"] == [max(w["scores"][0] for w in long["windows"])]
    assert short["windows"] == [{"start": 0, "end": 1, "scores": short["scores"]}]
    # a pair cannot be windowed: it fails alone, without windows
    pair = answer(
        relevance, "classify", {"input": [{"text": "a", "text_pair": "b"}], "options": options}
    )
    assert set(pair["results"][0]) == {"index", "error", "message"}


def test_windows_follow_the_overflow_policy_not_the_input_length(loaded):
    sequence = loaded("sequence")
    for overflow, listed in (("window", True), ("truncate", False), ("reject", False)):
        body = answer(sequence, "classify", {"input": "good", "options": {"overflow": overflow}})
        assert ("windows" in body["results"][0]) is listed, overflow


# -- rerank input and meta -------------------------------------------------------------------
def test_rerank_results_report_the_tokens_each_score_read(loaded):
    cross = answer(loaded("relevance"), "rerank", {"query": "good", "documents": ["bad", "a b c"]})
    by_index = {r["index"]: r["input"] for r in cross["results"]}
    # [CLS] good [SEP] bad [SEP] and [CLS] good [SEP] a b c [SEP]
    assert by_index == {
        0: {"tokens": 5, "processed_tokens": 5, "truncated": False, "windows": 1},
        1: {"tokens": 7, "processed_tokens": 7, "truncated": False, "windows": 1},
    }
    bi = answer(loaded("pooled"), "rerank", {"query": "good", "documents": ["bad", "a b c"]})
    by_index = {r["index"]: r["input"]["tokens"] for r in bi["results"]}
    assert by_index == {0: 3, 1: 5}  # the document's own row, the query not in it
    assert bi["usage"] == {"input_tokens": 3 + 3 + 5, "output_tokens": 0}


def test_each_surface_adds_its_own_meta_keys_when_asked(loaded):
    meta = {"return_meta": True}
    classified = answer(loaded("scores"), "classify", {"input": "a", "options": meta})
    assert classified["meta"] == {"head": "scores"}
    embedded = answer(loaded("pooled"), "embeddings", {"input": "a", "options": meta})
    assert embedded["meta"] == {  # model_sha256 null: the runtime gives the served model's
        "representation": {
            "model_sha256": None,
            "layer": 2,
            "dimension": 32,
            "normalized": True,
            "modality": "text",
        }
    }
    reranked = answer(
        loaded("relevance"), "rerank", {"query": "q", "documents": ["d"], "options": meta}
    )
    assert reranked["meta"] == {}
    for model, surface, body in (
        ("scores", "classify", {"input": "a"}),
        ("pooled", "embeddings", {"input": "a", "options": {"return_meta": False}}),
        ("relevance", "rerank", {"query": "q", "documents": ["d"], "options": {}}),
    ):
        assert "meta" not in answer(loaded(model), surface, body), surface
    # every answer gets its own copy: changing one never changes the next
    plan = loaded("scores").plan(
        "classify", read_request("classify", {"input": "a", "options": meta})
    )
    first = loaded("scores").finish(plan, loaded("scores").run(plan.items))
    first["meta"]["head"] = "changed"
    assert loaded("scores").finish(plan, loaded("scores").run(plan.items))["meta"] == {
        "head": "scores"
    }


# -- a huge input under reject is read only as far as its budget needs ------------------------
def test_a_huge_input_over_its_budget_is_refused_from_a_prefix(loaded):
    pooled = loaded("pooled")
    limit = pooled.description.max_tokens
    huge = "good movie " * 200_000  # 2.2 million characters, 400,000 tokens
    body = answer(pooled, "embeddings", {"input": [huge, "good"], "options": {}})
    refused, kept = body["data"]
    assert refused["error"] == "max_length_exceeded"
    read = int(refused["message"].split()[4])
    assert refused["message"].startswith(f"input has at least {read} tokens (read as far as")
    assert limit < read < 1_000  # read in part: a prefix, not its 400,000 tokens
    assert "embedding" in kept
    # a text over the limit but short of the prefix is counted whole: an exact count
    over = "good " * limit
    body = answer(pooled, "embeddings", {"input": over, "options": {}})
    assert body["data"][0]["message"].startswith(f"input has {limit + 2} tokens; the limit")
    # truncate still reads the input and keeps its beginning
    body = answer(pooled, "embeddings", {"input": huge, "options": {"overflow": "truncate"}})
    assert body["data"][0]["input"]["truncated"] is True
