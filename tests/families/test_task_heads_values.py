"""task_heads answers checked against independent references.

Every expected number here comes from a direct transformers forward over token
ids the Hugging Face tokenizer writes (windows cut by hand), or is computed by
hand; none comes from the family's own helpers. Expected token spans decode
those reference probabilities with ``plugins.spans.decode_spans``, which its
own tests pin.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil

import numpy as np
import pytest
import torch

from vllm_srun.compose.loader import load_model
from vllm_srun.families.task_heads.inputs import row_key
from vllm_srun.families.task_heads.readouts import (
    finish_embedding,
    l2_normalize,
    label_scores,
    merge_pooled,
    pool,
    sigmoid,
    softmax,
    token_probabilities,
)
from vllm_srun.plugins.host import load_catalog
from vllm_srun.plugins.requests import read_request
from vllm_srun.plugins.spec import RequestError, RowError

from ..fixtures import HEAD_LABELS, write_task_package

CLS, SEP = 2, 3  # the BERT-style fixture tokenizer's [CLS] and [SEP]
SINGLE_TOKEN_WORDS = ("good", "bad", "movie", "film", "the", "okay", "great", "love", "city")
"""Words the fixture tokenizer keeps whole: a text of n of them is n content tokens."""


def words(n: int, shift: int = 0) -> str:
    """``n`` whole-word tokens, varied so that a cut or a window shows in the answer."""
    return " ".join(SINGLE_TOKEN_WORDS[(i * 7 + shift) % len(SINGLE_TOKEN_WORDS)] for i in range(n))


@pytest.fixture(scope="module")
def catalog():
    return load_catalog({})


AUTO_CLASSES = {"pooled": "AutoModel", "token": "AutoModelForTokenClassification"}


def spread_weights(package, head: str) -> None:
    """Re-initialise a fixture's weights with a wider spread (std 0.5, seeded), so that
    different inputs get clearly different answers (the default std 0.02 answers
    nearly the same for every input)."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(package)
    config.initializer_range = 0.5
    torch.manual_seed(0)
    auto = getattr(transformers, AUTO_CLASSES.get(head, "AutoModelForSequenceClassification"))
    auto.from_config(config).save_pretrained(package, safe_serialization=True)


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
    """Fixture packages by key, written on first use: ``sequence``, ``scores``, ``pooled``,
    ``relevance``, ``token`` (BERT), ``roberta-sequence``, and ``pooled-plain`` (the
    pooled package without sentence-transformers' Normalize step)."""
    root = tmp_path_factory.mktemp("task-values")

    def write(key: str):
        if key == "pooled-plain":
            plain = root / "bert-pooled-plain"
            shutil.copytree(written["pooled"], plain)
            modules = json.loads((plain / "modules.json").read_text())
            (plain / "modules.json").write_text(
                json.dumps([m for m in modules if not m["type"].endswith(".Normalize")])
            )
            return plain
        model_type, _, head = key.rpartition("-")
        package = write_task_package(root, model_type or "bert", head)
        spread_weights(package, head)
        return package

    written = Lazy(write)
    return written


@pytest.fixture(scope="module")
def models(packages, catalog):
    return Lazy(lambda key: load_model(packages[key], catalog=catalog))


@pytest.fixture(scope="module")
def tokenizer(packages):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(packages["sequence"])


def content_ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def reference(packages):
    """transformers models of the fixture packages (eager attention), by key."""
    import transformers

    loaded = {}

    def get(key: str):
        if key not in loaded:
            head = key.removesuffix("-plain").removeprefix("roberta-")
            auto = getattr(
                transformers, AUTO_CLASSES.get(head, "AutoModelForSequenceClassification")
            )
            loaded[key] = auto.from_pretrained(packages[key], attn_implementation="eager").eval()
        return loaded[key]

    return get


def forward(model, ids: list[int], types: list[int] | None = None) -> torch.Tensor:
    """One row through a transformers model: logits, or the last hidden states."""
    kwargs = {"input_ids": torch.tensor([ids])}
    if types is not None:
        kwargs["token_type_ids"] = torch.tensor([types])
    with torch.inference_mode():
        out = model(**kwargs)
    value = out.logits if hasattr(out, "logits") else out.last_hidden_state
    return value[0].float()


def close(got, want, atol: float = 1e-5) -> bool:
    return torch.allclose(torch.tensor(got, dtype=torch.float32), want, atol=atol)


# -- readouts, on hand-computed numbers -------------------------------------------------------
def f32(values: object) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_mean_pool_divides_by_the_row_length():
    hidden = f32([[1.0, 2.0], [3.0, 6.0], [5.0, 10.0]])
    assert pool(hidden, "mean").tolist() == [3.0, 6.0]
    assert pool(f32([[2.0, 4.0]]), "mean").tolist() == [2.0, 4.0]
    empty = pool(np.zeros((0, 2), dtype=np.float32), "mean")
    assert empty.tolist() == [0.0, 0.0] and empty.dtype == np.float32


def test_cls_last_and_max_pooling_pick_the_right_values():
    hidden = f32([[1.0, -2.0], [7.0, 0.5], [-3.0, 4.0]])
    assert pool(hidden, "cls").tolist() == [1.0, -2.0]
    assert pool(hidden, "lasttoken").tolist() == [-3.0, 4.0]
    assert pool(hidden, "max").tolist() == [7.0, 4.0]
    assert all(pool(hidden, mode).dtype == np.float32 for mode in ("mean", "cls", "max"))
    with pytest.raises(ValueError, match="unknown pooling mode 'sum'"):
        pool(hidden, "sum")


def test_merged_windows_are_weighted_by_their_content_tokens():
    a, b, c = f32([1.0, 0.0]), f32([0.0, 1.0]), f32([4.0, 4.0])
    # (3 * a + 1 * b) / 4, not the plain mean (a + b) / 2
    assert merge_pooled([a, b], [3, 1]).tolist() == [0.75, 0.25]
    # (1 * a + 2 * b + 5 * c) / 8
    merged = merge_pooled([a, b, c], [1, 2, 5])
    assert merged.tolist() == [21 / 8, 22 / 8] and merged.dtype == np.float32
    assert merge_pooled([b], [7]).tolist() == [0.0, 1.0]


def test_a_window_without_content_still_counts_once_in_the_merge():
    a, b = f32([3.0, 0.0]), f32([0.0, 3.0])
    assert merge_pooled([a, b], [0, 2]).tolist() == [1.0, 2.0]


def test_finish_embedding_normalises_then_keeps_the_first_dimensions():
    vector = f32([3.0, 4.0, 12.0])
    assert np.allclose(finish_embedding(vector, True, None), f32([3, 4, 12]) / 13)
    assert np.allclose(finish_embedding(vector, True, 2), f32([0.6, 0.8]))
    assert np.allclose(finish_embedding(vector, True, 3), f32([3, 4, 12]) / 13)
    assert finish_embedding(vector, True, 2).dtype == np.float32
    assert finish_embedding(vector, False, None).tolist() == [3.0, 4.0, 12.0]
    assert finish_embedding(vector, False, 2).tolist() == [3.0, 4.0]
    zero = finish_embedding(np.zeros(4, dtype=np.float32), True, None)
    assert zero.tolist() == [0.0] * 4  # the eps keeps a zero vector finite, as torch's does


def test_l2_normalize_matches_torch_normalize():
    generator = np.random.default_rng(0)
    for scale in (1e-3, 1.0, 1e3):
        vectors = (generator.standard_normal((200, 384)) * scale).astype(np.float32)
        got = np.stack([l2_normalize(v) for v in vectors])
        want = torch.nn.functional.normalize(torch.from_numpy(vectors), dim=1).numpy()
        assert got.dtype == np.float32
        assert np.abs(got - want).max() <= 2e-7  # the norm's sum may round in another order


def test_asking_for_every_dimension_changes_no_bit():
    generator = np.random.default_rng(0)
    for _ in range(20):
        vector = generator.standard_normal(32).astype(np.float32)
        unit = l2_normalize(vector)
        assert np.array_equal(finish_embedding(vector, True, 32), unit)  # normalised once
        assert np.array_equal(finish_embedding(vector, False, 32), vector)


def test_label_scores_are_softmax_or_sigmoid_then_the_maximum_per_label():
    ln3 = math.log(3.0)
    one = label_scores([f32([0.0, ln3])], "sequence")
    assert np.allclose(one, f32([0.25, 0.75])) and one.dtype == np.float32
    two = label_scores([f32([0.0, ln3]), f32([ln3, 0.0])], "sequence")
    assert np.allclose(two, f32([0.75, 0.75]))  # not renormalised
    sig = label_scores([f32([0.0, ln3]), f32([-ln3, 2 * ln3])], "scores")
    assert np.allclose(sig, f32([0.5, 0.9])) and sig.dtype == np.float32


def test_softmax_and_sigmoid_match_torch_and_stay_finite_at_the_extremes():
    generator = np.random.default_rng(1)
    logits = (generator.standard_normal((64, 35)) * 8).astype(np.float32)
    assert np.abs(softmax(logits) - torch.softmax(torch.from_numpy(logits), -1).numpy()).max() < (
        1e-6
    )
    assert np.abs(sigmoid(logits) - torch.sigmoid(torch.from_numpy(logits)).numpy()).max() < 1e-6
    extreme = f32([-1000.0, -100.0, 0.0, 100.0, 1000.0])
    assert sigmoid(extreme).tolist() == torch.sigmoid(torch.from_numpy(extreme)).tolist()
    assert softmax(extreme).tolist() == [0.0, 0.0, 0.0, 0.0, 1.0]


def test_token_probabilities_come_from_the_most_central_window():
    # windows [0, 4) and [2, 6) over 6 tokens: tokens 0-2 from window 0, 3-5 from window 1
    # (token 2 sits 1 token from an edge of window 0 and at the edge of window 1; token 3
    # the other way round).
    first = np.zeros((6, 2), dtype=np.float32)  # row of [CLS] + 4 tokens + [SEP]
    second = np.zeros((6, 2), dtype=np.float32)
    for position in range(1, 5):
        first[position] = [0.0, float(position)]
        second[position] = [float(position), 0.0]
    rows = [first, second]
    content = [[1, 2, 3, 4], [1, 2, 3, 4]]
    got = token_probabilities(rows, content, [(0, 4), (2, 6)], 6)

    def pair_softmax(x0: float, x1: float) -> list[float]:
        e0, e1 = math.exp(x0), math.exp(x1)
        return [e0 / (e0 + e1), e1 / (e0 + e1)]

    want = [
        pair_softmax(0, 1),  # token 0: window 0, row position 1
        pair_softmax(0, 2),  # token 1: window 0, row position 2
        pair_softmax(0, 3),  # token 2: window 0, row position 3
        pair_softmax(2, 0),  # token 3: window 1, row position 2
        pair_softmax(3, 0),  # token 4: window 1, row position 3
        pair_softmax(4, 0),  # token 5: window 1, row position 4
    ]
    assert np.allclose(got, f32(want), atol=1e-6) and got.dtype == np.float32
    row = f32([[0.0, 3.0], [1.0, 0.0], [0.0, 9.0]])  # [CLS], one token, [SEP]
    single = token_probabilities([row], [[1]], [(0, 1)], 1)
    assert np.allclose(single, f32([pair_softmax(1, 0)]), atol=1e-6)
    empty = token_probabilities([np.zeros((2, 5), dtype=np.float32)], [[]], [(0, 0)], 0)
    assert empty.shape == (0, 5) and empty.dtype == np.float32


# -- heads against a direct transformers forward ----------------------------------------------
def test_mean_pooling_without_normalize_is_the_mean_of_the_hidden_states(
    models, reference, tokenizer
):
    model = models["pooled-plain"]
    assert model.card()["embedding"]["normalized"] is False
    text = words(9)
    [item] = model.answer("embeddings", {"input": text})["data"]
    hidden = forward(reference("pooled-plain"), [CLS, *content_ids(tokenizer, text), SEP])
    want = hidden.sum(dim=0) / hidden.shape[0]
    assert close(item["embedding"], want, atol=1e-6)
    assert abs(float(want.norm()) - 1.0) > 0.1  # a mean, not a unit vector
    [short] = model.answer("embeddings", {"input": text, "dimensions": 5})["data"]
    assert close(short["embedding"], want[:5], atol=1e-6)  # cut, not renormalised


def test_dimensions_of_the_full_size_answer_the_full_embedding(models):
    texts = ["good", words(5), words(9, shift=2), words(30, shift=1)]
    full = models["pooled"].answer("embeddings", {"input": texts})["data"]
    same = models["pooled"].answer("embeddings", {"input": texts, "dimensions": 32})["data"]
    assert [d["embedding"] for d in same] == [d["embedding"] for d in full]


def test_windowed_embedding_is_the_mean_of_the_window_means(models, reference, tokenizer):
    text = words(20)
    ids = content_ids(tokenizer, text)
    assert len(ids) == 20
    windows = [(0, 8), (4, 12), (8, 16), (12, 20)]  # 8 content tokens a window, step 4
    means = [
        forward(reference("pooled-plain"), [CLS, *ids[s:e], SEP]).mean(dim=0) for s, e in windows
    ]
    want = torch.stack(means).mean(dim=0)
    options = {"overflow": "window", "window": {"tokens": 10, "overlap": 4}}
    for key, expected in (
        ("pooled-plain", want),
        ("pooled", torch.nn.functional.normalize(want, dim=0)),
    ):
        [item] = models[key].answer("embeddings", {"input": text, "options": options})["data"]
        assert item["input"] == {
            "tokens": 22,
            "processed_tokens": 20 + 2 * 4,
            "truncated": False,
            "windows": 4,
        }
        assert close(item["embedding"], expected, atol=1e-6)


def test_sequence_probabilities_are_the_softmax_of_the_logits(models, reference, tokenizer):
    texts = [words(3), words(11, shift=2), "okay"]
    body = models["sequence"].answer("classify", {"input": texts})
    for text, result in zip(texts, body["results"], strict=True):
        logits = forward(reference("sequence"), [CLS, *content_ids(tokenizer, text), SEP])
        want = torch.softmax(logits, dim=-1)
        assert close(result["probabilities"], want)
        assert result["label"] == HEAD_LABELS["sequence"][int(want.argmax())]
    assert body["labels"] == list(HEAD_LABELS["sequence"])


def test_scores_are_the_sigmoid_of_the_logits(models, reference, tokenizer):
    texts = [words(3), words(11, shift=2)]
    body = models["scores"].answer("classify", {"input": texts})
    assert body["kind"] == "scores" and body["head"] == "scores"
    thresholds = (0.5, 0.4, 0.9)  # the fixture's thresholds.json
    for text, result in zip(texts, body["results"], strict=True):
        logits = forward(reference("scores"), [CLS, *content_ids(tokenizer, text), SEP])
        want = torch.sigmoid(logits)
        assert close(result["scores"], want)
        assert result["selected"] == [
            label
            for label, p, t in zip(HEAD_LABELS["scores"], want.tolist(), thresholds, strict=True)
            if p >= t
        ]


def test_a_score_equal_to_the_threshold_is_selected(models):
    model = models["scores"]
    [first] = model.answer("classify", {"input": "good movie"})["results"]
    score = first["scores"][1]
    [again] = model.answer("classify", {"input": "good movie", "options": {"threshold": score}})[
        "results"
    ]
    assert again["scores"] == first["scores"]
    want = [
        label for label, s in zip(HEAD_LABELS["scores"], first["scores"], strict=True) if s >= score
    ]
    assert "insult" in again["selected"] and again["selected"] == want


@pytest.mark.parametrize(("key", "kind"), [("sequence", "sequence"), ("scores", "scores")])
def test_windowed_answers_are_the_per_label_maximum_over_windows(
    models, reference, tokenizer, key, kind
):
    text = words(20, shift=3)
    ids = content_ids(tokenizer, text)
    windows = [(0, 8), (4, 12), (8, 16), (12, 20)]
    per_window = []
    for s, e in windows:
        logits = forward(reference(key), [CLS, *ids[s:e], SEP])
        per_window.append(
            torch.softmax(logits, dim=-1) if kind == "sequence" else torch.sigmoid(logits)
        )
    want = torch.stack(per_window).max(dim=0).values
    # the windows disagree: no single window's answer is the maximum on every label
    assert not any(torch.equal(w, want) for w in per_window)
    options = {"overflow": "window", "window": {"tokens": 10, "overlap": 4}}
    [result] = models[key].answer("classify", {"input": text, "options": options})["results"]
    values = result["probabilities"] if kind == "sequence" else result["scores"]
    assert close(values, want)
    assert result["input"]["windows"] == 4
    if kind == "sequence":
        assert result["label"] == HEAD_LABELS["sequence"][int(want.argmax())]


def test_text_pairs_run_with_segment_ids(models, reference, tokenizer):
    body = models["sequence"].answer(
        "classify", {"input": [{"text": "good movie", "text_pair": "bad film okay"}]}
    )
    first, second = content_ids(tokenizer, "good movie"), content_ids(tokenizer, "bad film okay")
    ids = [CLS, *first, SEP, *second, SEP]
    types = [0] * (len(first) + 2) + [1] * (len(second) + 1)
    want = torch.softmax(forward(reference("sequence"), ids, types), dim=-1)
    assert close(body["results"][0]["probabilities"], want)
    unsegmented = torch.softmax(forward(reference("sequence"), ids), dim=-1)
    assert not torch.allclose(want, unsegmented, atol=1e-4)
    assert body["results"][0]["input"]["tokens"] == 8


def test_cross_encoder_scores_are_the_sigmoid_of_the_pair_logit(models, reference, tokenizer):
    documents = ["bad film", "good movie okay", "the city"]
    body = models["relevance"].answer("rerank", {"query": "good", "documents": documents})
    query = content_ids(tokenizer, "good")
    want = {}
    for index, document in enumerate(documents):
        doc = content_ids(tokenizer, document)
        ids = [CLS, *query, SEP, *doc, SEP]
        types = [0] * (len(query) + 2) + [1] * (len(doc) + 1)
        logit = float(forward(reference("relevance"), ids, types)[0])
        want[index] = (logit, 1 / (1 + math.exp(-logit)))
    ranking = sorted(want, key=lambda i: -want[i][1])
    assert [r["index"] for r in body["results"]] == ranking
    for r in body["results"]:
        assert r["logit"] == pytest.approx(want[r["index"]][0], abs=1e-5)
        assert r["relevance_score"] == pytest.approx(want[r["index"]][1], abs=1e-5)
        assert "document" not in r


def test_bi_encoder_rerank_ranks_by_cosine_and_returns_each_document(models, reference, tokenizer):
    documents = ["the city", "good movie", "bad film okay", "good"]
    query = "good movie okay"

    def embed(text: str) -> torch.Tensor:
        hidden = forward(reference("pooled"), [CLS, *content_ids(tokenizer, text), SEP])
        return torch.nn.functional.normalize(hidden.mean(dim=0), dim=0)

    q = embed(query)
    cosines = [float(torch.dot(q, embed(d))) for d in documents]
    ranking = sorted(range(len(documents)), key=lambda i: -cosines[i])
    assert ranking != list(range(len(documents)))  # the ranking reorders the documents
    body = models["pooled"].answer(
        "rerank", {"query": query, "documents": documents, "return_documents": True}
    )
    assert [r["index"] for r in body["results"]] == ranking
    for r in body["results"]:
        assert r["document"] == documents[r["index"]]
        assert r["relevance_score"] == pytest.approx(cosines[r["index"]], abs=1e-5)
        assert r["logit"] == r["relevance_score"]
    top = models["pooled"].answer("rerank", {"query": query, "documents": documents, "top_n": 2})[
        "results"
    ]
    assert [r["index"] for r in top] == ranking[:2]
    assert all("document" not in r for r in top)


# -- overflow: limits and policies ------------------------------------------------------------
def classify(model, text, **options):
    body = {"input": text}
    if options:
        body["options"] = options
    return model.answer("classify", body)["results"]


def test_an_input_of_exactly_the_limit_runs_whole(models, reference, tokenizer):
    model = models["sequence"]  # limit 64: 62 content tokens beside [CLS] and [SEP]
    text = words(62)
    ids = [CLS, *content_ids(tokenizer, text), SEP]
    assert len(ids) == 64
    want = torch.softmax(forward(reference("sequence"), ids), dim=-1)
    whole = {"tokens": 64, "processed_tokens": 64, "truncated": False, "windows": 1}
    for overflow in ("reject", "truncate", "window"):
        [result] = classify(model, text, overflow=overflow)
        assert result["input"] == whole, overflow
        assert close(result["probabilities"], want)


def test_one_token_over_the_limit_is_rejected_cut_or_windowed(models, reference, tokenizer):
    model = models["sequence"]
    text = words(63)
    ids = content_ids(tokenizer, text)
    assert len(ids) == 63
    [rejected] = classify(model, text)
    assert rejected == {
        "index": 0,
        "error": "max_length_exceeded",
        "message": "input has 65 tokens; the limit is 64. Shorten it, or send "
        "options.overflow truncate (keep the beginning) or window",
    }
    [cut] = classify(model, text, overflow="truncate")
    assert cut["input"] == {"tokens": 65, "processed_tokens": 64, "truncated": True, "windows": 1}
    kept = torch.softmax(forward(reference("sequence"), [CLS, *ids[:62], SEP]), dim=-1)
    assert close(cut["probabilities"], kept)  # the beginning, inside [CLS] ... [SEP]
    [windowed] = classify(model, text, overflow="window")
    # 62 content tokens a window: [0, 62) and [1, 63)
    assert windowed["input"] == {
        "tokens": 65,
        "processed_tokens": 63 + 2 * 2,
        "truncated": False,
        "windows": 2,
    }
    per_window = [
        torch.softmax(forward(reference("sequence"), [CLS, *ids[s:e], SEP]), dim=-1)
        for s, e in ((0, 62), (1, 63))
    ]
    assert close(windowed["probabilities"], torch.stack(per_window).max(dim=0).values)


def test_a_string_and_a_one_element_list_answer_the_same(models):
    model = models["sequence"]
    for options in ({}, {"overflow": "truncate"}, {"overflow": "window"}):
        for text in ("good movie", words(70)):
            alone = model.answer("classify", {"input": text, "options": options})
            listed = model.answer("classify", {"input": [text], "options": options})
            assert alone == listed
            assert len(alone["results"]) == 1 and alone["results"][0]["index"] == 0


def test_max_tokens_lowers_the_limit_but_never_raises_it(models, tokenizer):
    model = models["sequence"]
    [fits] = classify(model, words(8), max_tokens=10)
    assert fits["input"] == {"tokens": 10, "processed_tokens": 10, "truncated": False, "windows": 1}
    [over] = classify(model, words(9), max_tokens=10)
    assert over["error"] == "max_length_exceeded"
    assert over["message"].startswith("input has 11 tokens; the limit is 10.")
    [cut] = classify(model, words(9), overflow="truncate", max_tokens=10)
    assert cut["input"] == {"tokens": 11, "processed_tokens": 10, "truncated": True, "windows": 1}
    [high] = classify(model, words(63), max_tokens=100)
    assert high["message"].startswith("input has 65 tokens; the limit is 64.")
    [kept] = classify(model, words(63), overflow="truncate", max_tokens=100)
    assert kept["input"]["processed_tokens"] == 64
    [smallest] = classify(model, words(5), overflow="truncate", max_tokens=3)
    assert smallest["input"] == {
        "tokens": 7,
        "processed_tokens": 3,
        "truncated": True,
        "windows": 1,
    }
    plan = model.loaded.plan(
        "classify",
        read_request(
            "classify", {"input": words(5), "options": {"overflow": "truncate", "max_tokens": 3}}
        ),
    )
    assert list(plan.items[0].input_ids) == [CLS, content_ids(tokenizer, words(5))[0], SEP]


def test_truncating_a_pair_cuts_the_longer_text_first(models, tokenizer):
    model = models["sequence"]
    first, second = words(6), words(3, shift=4)
    a, b = content_ids(tokenizer, first), content_ids(tokenizer, second)
    pair = [{"text": first, "text_pair": second}]

    def planned(max_tokens: int) -> list[int]:
        options = {"overflow": "truncate", "max_tokens": max_tokens}
        [item] = model.loaded.plan(
            "classify", read_request("classify", {"input": pair, "options": options})
        ).items
        return list(item.input_ids)

    # 3 special tokens; 9 content tokens -> budget 6: the longer first text loses 3
    assert planned(9) == [CLS, *a[:3], SEP, *b, SEP]
    # budget 5: 6+3 -> 3+3, a tie: the first text loses the token
    assert planned(8) == [CLS, *a[:2], SEP, *b, SEP]
    # budget 4: then the second text, now the longer
    assert planned(7) == [CLS, *a[:2], SEP, *b[:2], SEP]
    assert planned(12) == [CLS, *a, SEP, *b, SEP]
    [result] = model.answer(
        "classify", {"input": pair, "options": {"overflow": "truncate", "max_tokens": 7}}
    )["results"]
    assert result["input"] == {"tokens": 12, "processed_tokens": 7, "truncated": True, "windows": 1}


def test_window_rows_wrap_each_slice_in_the_model_envelope(models, packages):
    import transformers

    text = words(12)
    options = {"overflow": "window", "window": {"tokens": 8, "overlap": 2}}
    for key in ("sequence", "roberta-sequence"):
        tok = transformers.AutoTokenizer.from_pretrained(packages[key])
        ids = tok(text, add_special_tokens=False)["input_ids"]
        head, tail = [tok.cls_token_id], [tok.sep_token_id]
        plan = models[key].loaded.plan(
            "classify", read_request("classify", {"input": text, "options": options})
        )
        # 6 content tokens a window, step 4: [0, 6), [4, 10), [6, 12)
        assert [list(item.input_ids) for item in plan.items] == [
            head + ids[0:6] + tail,
            head + ids[4:10] + tail,
            head + ids[6:12] + tail,
        ]
        assert all(item.token_type_ids is None for item in plan.items)
        [encoded] = plan.inputs
        assert encoded.windows == [(0, 6), (4, 10), (6, 12)]
        assert encoded.row_content == [list(range(1, 7))] * 3
        assert encoded.processed_tokens == 12 + 2 * 3


def test_window_overlap_defaults_to_half_a_small_window(models):
    model = models["sequence"]
    # 10-token windows hold 8 content tokens: default overlap 4, step 4 over 20 tokens
    [result] = classify(model, words(20), overflow="window", window={"tokens": 10})
    assert result["input"]["windows"] == 4
    # windows of the model's limit hold 62 content tokens: overlap 31, step 31
    [two] = classify(model, words(93), overflow="window")
    assert two["input"]["windows"] == 2  # [0, 62), [31, 93)
    [three] = classify(model, words(94), overflow="window")
    assert three["input"]["windows"] == 3  # [0, 62), [31, 93), [32, 94)
    # one content token a window: overlap 0
    [tiny] = classify(model, words(5), overflow="window", window={"tokens": 3})
    assert tiny["input"]["windows"] == 5


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"window": {"tokens": 65}},
            "options.window.tokens 65 is above the model's limit 64",
        ),
        (
            {"window": {"tokens": 10, "overlap": 8}},
            "a window of 10 tokens holds 8 content tokens beside 2 special tokens, "
            "which must be more than the overlap 8",
        ),
        (
            {"window": {"tokens": 2}},
            "a window of 2 tokens has no room for content beside 2 special tokens; "
            "raise options.window.tokens",
        ),
        (
            {"window": {"overlap": -1}},
            "options.window.overlap: Input should be greater than or equal to 0",
        ),
        ({"window": {"overlap": 2.0}}, "options.window.overlap: Input should be a valid integer"),
        ({"window": {"overlap": True}}, "options.window.overlap: Input should be a valid integer"),
        (
            {"window": {"tokens": 0}},
            "options.window.tokens: Input should be greater than or equal to 1",
        ),
        ({"max_tokens": 0}, "options.max_tokens: Input should be greater than or equal to 1"),
        ({"max_tokens": "5"}, "options.max_tokens: Input should be a valid integer"),
        ({"max_tokens": True}, "options.max_tokens: Input should be a valid integer"),
        (
            {"window": [8]},
            "options.window: Input should be a valid dictionary or instance of WindowOptions",
        ),
    ],
)
def test_bad_window_settings_say_what_to_change(models, options, message):
    with pytest.raises(RequestError) as raised:
        classify(models["sequence"], words(3), overflow="window", **options)
    assert (raised.value.code, raised.value.message) == ("invalid_request", message)


def test_window_settings_at_their_bounds_are_accepted(models):
    model = models["sequence"]
    [full] = classify(model, words(70), overflow="window", window={"tokens": 64})
    assert full["input"]["windows"] == 2
    [most] = classify(model, words(20), overflow="window", window={"tokens": 10, "overlap": 7})
    assert most["input"]["windows"] == 12 + 1  # step 1: [0, 8) ... [12, 20)
    [none] = classify(model, words(16), overflow="window", window={"tokens": 10, "overlap": 0})
    assert none["input"]["windows"] == 2


def test_the_scan_budget_counts_content_tokens(models):
    model = models["sequence"]
    [at] = classify(model, words(40), overflow="window", max_tokens=40)
    assert at["input"] == {
        "tokens": 42,
        "processed_tokens": 40 + 2,
        "truncated": False,
        "windows": 1,
    }
    [over] = classify(model, words(41), overflow="window", max_tokens=40)
    assert over == {
        "index": 0,
        "error": "scan_budget_exceeded",
        "message": "input has 41 content tokens; the scan budget is 40. "
        "Raise options.max_tokens or shorten the input",
    }
    [pair] = model.answer(
        "classify",
        {"input": [{"text": "good", "text_pair": "bad"}], "options": {"overflow": "window"}},
    )["results"]
    assert pair["error"] == "invalid_input"
    assert pair["message"] == (
        "overflow window reads single texts only; send text pairs with reject or truncate"
    )


def test_truncate_needs_room_for_one_content_token(models):
    model = models["sequence"]
    with pytest.raises(RequestError) as single:
        classify(model, "good", overflow="truncate", max_tokens=2)
    assert (single.value.code, single.value.message) == (
        "invalid_request",
        "options.max_tokens 2 leaves no room beside 2 special tokens",
    )
    with pytest.raises(RequestError) as pair:
        model.answer(
            "classify",
            {
                "input": [{"text": "good", "text_pair": "bad"}],
                "options": {"overflow": "truncate", "max_tokens": 3},
            },
        )
    assert (pair.value.code, pair.value.message) == (
        "invalid_request",
        "options.max_tokens 3 leaves no room beside 3 special tokens",
    )
    # reject and window read max_tokens otherwise: no room check
    [empty] = classify(model, "", max_tokens=2)
    assert empty["input"] == {"tokens": 2, "processed_tokens": 2, "truncated": False, "windows": 1}


def test_an_unset_overflow_means_reject_and_a_null_one_is_refused(models):
    model = models["sequence"]
    for options in ({}, {"window": None}):
        [result] = model.answer("classify", {"input": words(63), "options": options})["results"]
        assert result["error"] == "max_length_exceeded"
    for overflow in (None, ""):
        with pytest.raises(RequestError) as raised:
            model.answer("classify", {"input": "x", "options": {"overflow": overflow}})
        assert raised.value.message == (
            "options.overflow: Input should be 'reject', 'truncate' or 'window'"
        )


def test_a_lone_surrogate_in_either_text_is_an_item_error(models):
    model = models["sequence"]
    body = model.answer(
        "classify",
        {
            "input": [
                {"text": "good", "text_pair": "ok \udc00"},
                {"text": "ab\ud800", "text_pair": "x"},
            ]
        },
    )
    assert body["results"][0] == {
        "index": 0,
        "error": "invalid_input",
        "message": "the text has a lone surrogate U+DC00 at code point 3; "
        "send valid Unicode (UTF-8)",
    }
    assert body["results"][1]["message"].startswith(
        "the text has a lone surrogate U+D800 at code point 2;"
    )
    assert body["usage"] == {"input_tokens": 0, "output_tokens": 0}


# -- responses --------------------------------------------------------------------------------
def task_model(model):
    """The family's TaskModel (under a surface extension, the host it wraps)."""
    return getattr(model.loaded, "host", model.loaded)


def finish_with_failures(model, surface, request, failures):
    """Plan and run ``request``, replace the outputs of rows ``failures`` by row errors."""
    loaded = task_model(model)
    plan = loaded.plan(surface, read_request(surface, request))
    outputs = loaded.run(plan.items)
    for row, code in failures.items():
        outputs[row] = RowError(code, f"row {row} failed")
    return loaded.finish(plan, outputs)


class FixedLogits:
    """An engine model answering the given ``[rows, labels]`` logits, whatever the rows."""

    def __init__(self, logits):
        self.logits = np.array(logits, dtype=np.float32)

    def encode(self, batch):
        assert batch.input_ids.shape[0] == self.logits.shape[0]
        return self.logits.copy()


class Nan:
    """An engine model whose outputs are NaN."""

    def __init__(self, real):
        self.real = real

    def encode(self, batch):
        return np.full_like(self.real.encode(batch), np.nan)


def with_engine(model, engine):
    from vllm_srun.families.task_heads.model import TaskModel

    loaded = task_model(model)
    return TaskModel(loaded.description, loaded.encoder, engine)


def answer(loaded, surface, request):
    plan = loaded.plan(surface, read_request(surface, request))
    return loaded.finish(plan, loaded.run(plan.items))


def test_cards_describe_each_head_kind(models):
    sequence = task_model(models["sequence"]).card()
    assert sequence == {
        "surfaces": ["classify"],
        "heads": [
            {
                "name": "sequence",
                "kind": "sequence",
                "labels": ["negative", "neutral", "positive"],
                "inputs": ["text", "pair"],
                "default_threshold": None,
                "thresholds": None,
                "operating_point_sha256": None,
                "overflow": "reject",
                "overflow_policies": ["reject", "truncate", "window"],
                "window": {"tokens": 64, "overlap": 31},
                "reduction": "max",
                "window_reduction": "max per label over windows",
            }
        ],
        "embedding": None,
        "rerank": None,
        "limits": {"max_input_tokens": 64},
    }
    scores = task_model(models["scores"]).card()["heads"][0]
    assert scores["inputs"] == ["text", "pair"] and scores["kind"] == "scores"
    assert scores["thresholds"] == [0.5, 0.4, 0.9] and scores["default_threshold"] is None
    digest = hashlib.sha256((models["scores"].package / "thresholds.json").read_bytes())
    assert scores["operating_point_sha256"] == digest.hexdigest()
    token = task_model(models["token"]).card()["heads"][0]
    assert token["inputs"] == ["text"]
    assert token["reduction"] is None
    assert token["window_reduction"] == "most-central window per token"
    pooled = task_model(models["pooled"]).card()
    assert pooled["surfaces"] == ["embeddings", "rerank"]
    assert pooled["heads"][0]["reduction"] is None
    assert pooled["heads"][0]["window_reduction"] == "content-token-weighted mean"
    assert json.dumps(pooled["heads"][0]["window"]) == '{"tokens": 48, "overlap": 23}'
    assert json.dumps(sequence["heads"][0]["window"]) == '{"tokens": 64, "overlap": 31}'

    assert pooled["embedding"] == {
        "dimensions": [32],
        "layers": [2],
        "modalities": ["text"],
        "normalized": True,
        "pooling": "mean",
        "input_types": [],
        "max_tokens": 48,
    }
    assert pooled["rerank"] == {
        "exits": [{"layer": 2, "dimension": 32}],
        "default": {"layer": 2, "dimension": 32},
    }
    relevance = task_model(models["relevance"]).card()
    assert relevance["surfaces"] == ["classify", "rerank"]  # a cross-encoder scores pairs on both
    [head] = relevance["heads"]
    assert (head["kind"], head["inputs"]) == ("relevance", ["text", "pair"])
    assert head["reduction"] == "max"
    assert relevance["rerank"] == pooled["rerank"]  # its last layer at its hidden size, 32


def test_a_family_threshold_option_is_the_default_threshold_of_scores_and_token_heads(models):
    model = task_model(models["scores"])
    with_option = type(model)(
        model.description, model.encoder, model.engine_model, defaults={"threshold": 0.25}
    )
    assert with_option.card()["heads"][0]["default_threshold"] == 0.25
    token = task_model(models["token"])
    with_option = type(token)(
        token.description, token.encoder, token.engine_model, defaults={"threshold": 1}
    )
    [head] = with_option.card()["heads"]
    assert head["default_threshold"] == 1.0 and isinstance(head["default_threshold"], float)


def test_responses_have_their_documented_shape(models):
    body = models["pooled"].answer("embeddings", {"input": ["good", words(47)]})
    assert body["object"] == "list" and set(body) == {"model", "object", "data", "usage"}
    assert [set(item) for item in body["data"]] == [
        {"object", "index", "embedding", "input"},
        {"object", "index", "error", "message"},
    ]
    assert body["data"][0]["object"] == "embedding" and body["data"][0]["index"] == 0
    # usage counts the tokens that ran: 3 for "good", nothing for the rejected input
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    classified = models["sequence"].answer("classify", {"input": ["good", words(4)]})
    assert set(classified) == {"model", "head", "kind", "labels", "results", "usage"}
    assert (classified["head"], classified["kind"]) == ("sequence", "sequence")
    assert classified["usage"] == {"input_tokens": 3 + 6, "output_tokens": 0}
    assert [r["index"] for r in classified["results"]] == [0, 1]
    reranked = models["relevance"].answer("rerank", {"query": "good", "documents": ["bad"]})
    assert set(reranked) == {"model", "results", "usage"}
    assert reranked["usage"] == {"input_tokens": 5, "output_tokens": 0}
    assert set(reranked["results"][0]) == {"index", "relevance_score", "logit", "input"}
    bi = models["pooled"].answer("rerank", {"query": "good", "documents": ["bad", "okay"]})
    assert bi["usage"] == {"input_tokens": 3 * 3, "output_tokens": 0}  # query counted
    with pytest.raises(RequestError, match="documents must be a non-empty list"):
        models["pooled"].answer("rerank", {"query": "good", "documents": []})


def test_a_batch_of_singles_and_pairs_answers_each_as_alone(models, reference, tokenizer):
    inputs = [words(5), {"text": "good", "text_pair": words(9, shift=1)}, {"text": "bad film"}]
    body = models["sequence"].answer("classify", {"input": inputs})
    good, pair = content_ids(tokenizer, "good"), content_ids(tokenizer, words(9, shift=1))
    rows = [
        ([CLS, *content_ids(tokenizer, words(5)), SEP], None),
        ([CLS, *good, SEP, *pair, SEP], [0] * 3 + [1] * 10),
        ([CLS, *content_ids(tokenizer, "bad film"), SEP], None),
    ]
    for (ids, types), result in zip(rows, body["results"], strict=True):
        want = torch.softmax(forward(reference("sequence"), ids, types), dim=-1)
        assert close(result["probabilities"], want)


def test_a_failed_row_answers_for_its_input_only(models):
    text = words(20)
    windowed = {"input": ["good", text, "bad"], "options": {"overflow": "window"}}
    windowed["options"]["window"] = {"tokens": 10, "overlap": 4}  # the middle input: rows 1-4
    body = finish_with_failures(models["pooled"], "embeddings", windowed, {2: "deadline_exceeded"})
    assert body["data"][1] == {
        "object": "embedding",
        "index": 1,
        "error": "deadline_exceeded",
        "message": "row 2 failed",
    }
    assert "embedding" in body["data"][0] and "embedding" in body["data"][2]
    classified = finish_with_failures(
        models["sequence"], "classify", windowed, {4: "internal_error"}
    )
    assert classified["results"][1] == {
        "index": 1,
        "error": "internal_error",
        "message": "row 4 failed",
    }
    assert "probabilities" in classified["results"][2]
    tokens = finish_with_failures(models["token"], "classify", windowed, {0: "internal_error"})
    assert tokens["results"][0]["error"] == "internal_error" and "spans" in tokens["results"][1]


def test_a_failed_cross_encoder_row_ranks_after_every_scored_document(models):
    request = {"query": "good", "documents": ["bad", "okay", "film"], "return_documents": True}
    body = finish_with_failures(models["relevance"], "rerank", request, {0: "deadline_exceeded"})
    assert [r["index"] for r in body["results"]][-1] == 0
    assert body["results"][-1] == {
        "index": 0,
        "error": "deadline_exceeded",
        "message": "row 0 failed",
    }
    assert [r["document"] for r in body["results"][:2]] == [
        request["documents"][r["index"]] for r in body["results"][:2]
    ]


def test_a_failed_query_row_fails_every_bi_encoder_document(models):
    request = {"query": "good", "documents": ["bad", "okay"]}
    body = finish_with_failures(models["pooled"], "rerank", request, {0: "deadline_exceeded"})
    assert body["results"] == [
        {"index": 0, "error": "deadline_exceeded", "message": "row 0 failed"},
        {"index": 1, "error": "deadline_exceeded", "message": "row 0 failed"},
    ]
    one = finish_with_failures(models["pooled"], "rerank", request, {1: "internal_error"})
    assert [r["index"] for r in one["results"]] == [1, 0]
    assert one["results"][1] == {"index": 0, "error": "internal_error", "message": "row 1 failed"}
    assert "relevance_score" in one["results"][0]


def test_bi_encoder_rerank_of_a_document_too_long_fails_that_document_only(models):
    body = models["pooled"].answer(
        "rerank", {"query": "good", "documents": [words(50), "okay"], "return_documents": True}
    )
    assert [r["index"] for r in body["results"]] == [1, 0]
    assert body["results"][1]["error"] == "max_length_exceeded"
    assert "document" not in body["results"][1] and body["results"][0]["document"] == "okay"
    with pytest.raises(RequestError) as raised:
        models["pooled"].answer("rerank", {"query": words(50), "documents": ["okay"]})
    assert raised.value.code == "invalid_request"
    assert raised.value.message.startswith("query: input has 52 tokens; the limit is 48.")
    cut = models["pooled"].answer(
        "rerank",
        {"query": words(50), "documents": ["okay"], "options": {"overflow": "truncate"}},
    )
    assert "relevance_score" in cut["results"][0]


def test_identical_query_and_document_score_one_at_most(models):
    body = models["pooled"].answer("rerank", {"query": words(7), "documents": [words(7), "bad"]})
    best = body["results"][0]
    assert best["index"] == 0 and best["relevance_score"] == pytest.approx(1.0, abs=1e-6)
    assert -1.0 <= body["results"][1]["relevance_score"] <= 1.0
    assert all(-1.0 <= r["relevance_score"] <= 1.0 for r in body["results"])


def test_rerank_ties_keep_the_document_order(models):
    documents = ["okay", "bad", "okay", "bad", "okay"]
    for key in ("pooled", "relevance"):
        body = models[key].answer("rerank", {"query": "good", "documents": documents})
        results = body["results"]
        scores = [r["relevance_score"] for r in results]
        assert scores == sorted(scores, reverse=True)
        groups = {}
        for r in results:
            groups.setdefault(documents[r["index"]], []).append(r["index"])
        assert groups == {"okay": [0, 2, 4], "bad": [1, 3]}


def test_cross_encoder_scores_saturate_without_overflow(models):
    loaded = with_engine(models["relevance"], FixedLogits([[-1000.0], [-700.0], [-699.0], [800.0]]))
    body = answer(loaded, "rerank", {"query": "q", "documents": ["a", "b", "c", "d"]})
    by_index = {r["index"]: r for r in body["results"]}
    assert by_index[3]["relevance_score"] == 1.0 and by_index[3]["logit"] == 800.0
    assert by_index[2]["relevance_score"] == pytest.approx(1 / (1 + math.exp(699)), rel=1e-9)
    assert by_index[2]["relevance_score"] > 0
    assert by_index[1]["relevance_score"] == 0.0 and by_index[0]["relevance_score"] == 0.0
    assert [r["index"] for r in body["results"]] == [3, 2, 0, 1]


@pytest.mark.parametrize(
    ("key", "surface", "request_body", "message"),
    [
        ("scores", "classify", {"input": ["okay"]}, "the model's output is not finite"),
        ("pooled", "rerank", {"query": "q", "documents": ["okay"]}, "the score is not finite"),
        ("relevance", "rerank", {"query": "q", "documents": ["okay"]}, "the logit is not finite"),
        ("pooled", "embeddings", {"input": ["okay"]}, "the embedding is not finite"),
    ],
)
def test_non_finite_outputs_are_item_errors(models, key, surface, request_body, message):
    loaded = with_engine(models[key], Nan(task_model(models[key]).engine_model))
    body = answer(loaded, surface, request_body)
    [item] = body.get("results") or body.get("data")
    assert (item["index"], item["error"], item["message"]) == (0, "invalid_model_output", message)


def reference_spans(text, offsets, logits, tags, **options):
    from vllm_srun.plugins.spans import decode_spans

    probabilities = torch.softmax(logits, dim=-1).numpy()
    return [s.to_json() for s in decode_spans(text, offsets, probabilities, tags, **options)]


def same_spans(got, want) -> bool:
    keys = ("start", "end", "text", "label")
    return [[s[k] for k in keys] for s in got] == [[s[k] for k in keys] for s in want] and all(
        abs(a["probability"] - b["probability"]) < 1e-5 for a, b in zip(got, want, strict=True)
    )


@pytest.mark.parametrize(
    "options",
    [{}, {"aggregation": "first"}, {"aggregation": "none", "threshold": 0.3}, {"threshold": 0.5}],
)
def test_token_spans_read_the_token_logits(models, reference, packages, options):
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(packages["token"])
    text = "dana whitfield from new york and london"
    encoded = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    logits = forward(reference("token"), [CLS, *ids, SEP])[1:-1]
    tags = list(HEAD_LABELS["token"])
    want = reference_spans(text, offsets, logits, tags, **options)
    assert want  # the fixture finds something to compare
    [result] = models["token"].answer("classify", {"input": text, "options": options})["results"]
    assert same_spans(result["spans"], want)


def test_windowed_token_spans_take_each_token_from_its_most_central_window(
    models, reference, packages
):
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(packages["token"])
    text = words(20, shift=5)
    encoded = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    windows = [(0, 8), (4, 12), (8, 16), (12, 20)]
    # a token goes to the window where it is farthest from an edge (ties: the earlier)
    chosen = [0] * 6 + [1] * 4 + [2] * 4 + [3] * 6
    rows = [forward(reference("token"), [CLS, *ids[s:e], SEP]) for s, e in windows]
    logits = torch.stack(
        [rows[w][1 + i - windows[w][0]] for i, w in enumerate(chosen)]  # +1: [CLS]
    )
    options = {"overflow": "window", "window": {"tokens": 10, "overlap": 4}, "threshold": 0.0}
    [result] = models["token"].answer("classify", {"input": text, "options": options})["results"]
    want = reference_spans(text, offsets, logits, list(HEAD_LABELS["token"]), threshold=0.0)
    assert want and same_spans(result["spans"], want)
    assert result["input"]["windows"] == 4


def test_scores_heads_select_only_when_asked_or_configured(models):
    from dataclasses import replace

    from vllm_srun.families.task_heads.model import TaskModel

    loaded = task_model(models["scores"])
    head = replace(loaded.description.heads[0], thresholds=None)
    bare = TaskModel(
        replace(loaded.description, heads=(head,)), loaded.encoder, loaded.engine_model
    )
    [plain] = answer(bare, "classify", {"input": "good movie"})["results"]
    assert "selected" not in plain and len(plain["scores"]) == 3
    [asked] = answer(bare, "classify", {"input": "good movie", "options": {"threshold": 0.5}})[
        "results"
    ]
    assert asked["selected"] == [
        label for label, s in zip(HEAD_LABELS["scores"], asked["scores"], strict=True) if s >= 0.5
    ]
    [none] = answer(bare, "classify", {"input": "good movie", "options": {"threshold": 1}})[
        "results"
    ]
    assert none["selected"] == []
    [every] = answer(bare, "classify", {"input": "good movie", "options": {"threshold": 0}})[
        "results"
    ]
    assert every["selected"] == ["toxic", "insult", "threat"]


def test_a_model_with_several_classify_heads_asks_which(models):
    from dataclasses import replace

    from vllm_srun.families.task_heads.model import TaskModel
    from vllm_srun.families.task_heads.package import Head

    loaded = task_model(models["sequence"])
    heads = (
        *loaded.description.heads,
        Head("second", "scores", ("x", "y", "z"), ("x", "y", "z")),
        Head("pooled", "pooled"),
    )
    multi = TaskModel(replace(loaded.description, heads=heads), loaded.encoder, loaded.engine_model)
    assert multi.surfaces == ("classify", "embeddings", "rerank")
    with pytest.raises(RequestError) as raised:
        multi.plan("classify", read_request("classify", {"input": "good"}))
    assert (raised.value.code, raised.value.message) == (
        "invalid_request",
        "name the head: one of sequence, second",
    )
    assert (
        multi.plan(
            "classify", read_request("classify", {"input": "good", "head": "second"})
        ).head.name
        == "second"
    )
    assert (
        multi.plan(
            "classify", read_request("classify", {"input": "good", "head": "sequence"})
        ).head.kind
        == "sequence"
    )
    with pytest.raises(RequestError) as raised:
        multi.plan("classify", read_request("classify", {"input": "good", "head": "pooled"}))
    assert raised.value.message == "unknown head 'pooled'; this model has sequence, second"


@pytest.mark.parametrize(
    ("key", "surface", "request_body", "code", "message"),
    [
        (
            "pooled",
            "classify",
            {"input": "x"},
            "unsupported_surface",
            "this model serves embeddings, rerank, not classify",
        ),
        ("sequence", "classify", [], "invalid_request", "the request must be a JSON object"),
        (
            "sequence",
            "classify",
            {"input": "x", "options": "window"},
            "invalid_request",
            "options: Input should be a valid dictionary or instance of ClassifyOptions",
        ),
        (
            "sequence",
            "classify",
            {"input": {"text": "x"}},
            "invalid_request",
            "input must be a string or a non-empty list",
        ),
        (
            "sequence",
            "classify",
            {"input": [{"text": "ok"}, {"text": "a", "text_pair": 3}]},
            "invalid_request",
            "input[1].text_pair must be a string",
        ),
        (
            "sequence",
            "classify",
            {"input": [{"text": "ok"}, {"text_pair": "b"}]},
            "invalid_request",
            "input[1] must be a string or {text, text_pair}",
        ),
        (
            "pooled",
            "embeddings",
            {"input": ["ok", {"text": "a"}]},
            "invalid_request",
            'input[1].type is missing; a content part is {"type": "text", "text": "..."} '
            "(or image_url, input_audio)",
        ),
        (
            "pooled",
            "embeddings",
            {"input": "x", "dimensions": True},
            "invalid_request",
            "dimensions: Input should be a valid integer",
        ),
        (
            "token",
            "classify",
            {"input": [{"text": "a"}, {"text": "b"}, {"text": "a", "text_pair": "b"}]},
            "invalid_request",
            "input[2] has a text_pair; the token head reads single texts",
        ),
        (
            "sequence",
            "classify",
            {"input": "x", "options": {"threshold": 1.5}},
            "invalid_request",
            "options.threshold: Input should be less than or equal to 1",
        ),
        (
            "sequence",
            "classify",
            {"input": "x", "options": {"threshold": -0.1}},
            "invalid_request",
            "options.threshold: Input should be greater than or equal to 0",
        ),
        (
            "sequence",
            "classify",
            {"input": "x", "options": {"threshold": "0.5"}},
            "invalid_request",
            "options.threshold: Input should be a valid number",
        ),
        (
            "sequence",
            "classify",
            {"input": "x", "options": {"threshold": True}},
            "invalid_request",
            "options.threshold: Input should be a valid number",
        ),
        (
            "sequence",
            "classify",
            {"input": "x", "options": {"aggregation": "mean"}},
            "invalid_request",
            "options.aggregation: Input should be 'max', 'first', 'average' or 'none'",
        ),
        (
            "sequence",
            "classify",
            {"input": "x", "head": "nope"},
            "invalid_request",
            "unknown head 'nope'; this model has sequence",
        ),
        (
            "sequence",
            "classify",
            {"input": "x", "head": ["sequence"]},
            "invalid_request",
            "head: Input should be a valid string",
        ),
        ("relevance", "rerank", {"documents": ["d"]}, "invalid_request", "query: Field required"),
        (
            "relevance",
            "rerank",
            {"query": "q", "documents": "d"},
            "invalid_request",
            "documents: Input should be a valid list",
        ),
        (
            "relevance",
            "rerank",
            {"query": "q", "documents": ["d", 1]},
            "invalid_request",
            "documents.1: Input should be a valid string",
        ),
        (
            "relevance",
            "rerank",
            {"query": "q", "documents": ["d"], "top_n": True},
            "invalid_request",
            "top_n: Input should be a valid integer",
        ),
        (
            "relevance",
            "rerank",
            {"query": "q", "documents": ["d"], "return_documents": 1},
            "invalid_request",
            "return_documents: Input should be a valid boolean",
        ),
    ],
)
def test_malformed_requests_say_what_is_wrong(models, key, surface, request_body, code, message):
    with pytest.raises(RequestError) as raised:
        task_model(models[key]).plan(surface, read_request(surface, request_body))
    assert (raised.value.code, raised.value.message) == (code, message)


def test_request_values_at_their_bounds_are_accepted(models):
    pooled = models["pooled"]
    for dimensions in (1, 32):
        [item] = pooled.answer("embeddings", {"input": "good", "dimensions": dimensions})["data"]
        assert len(item["embedding"]) == dimensions
    [item] = pooled.answer("embeddings", {"input": "good"})["data"]
    assert isinstance(item["embedding"], list)  # float unless asked
    plan = task_model(models["sequence"]).plan(
        "classify", read_request("classify", {"input": [{"text": "good"}], "options": None})
    )
    assert plan.options == {
        "threshold": None,
        "aggregation": "max",
        "windows": False,
        "tokens": False,
        "meta": None,
    }
    assert plan.items[0].token_type_ids is None  # {text} alone is a single text
    for threshold in (0, 1, 0.5):
        plan = task_model(models["sequence"]).plan(
            "classify",
            read_request("classify", {"input": "x", "options": {"threshold": threshold}}),
        )
        assert plan.options["threshold"] == threshold
    for aggregation in ("max", "first", "average", "none"):
        plan = task_model(models["token"]).plan(
            "classify",
            read_request("classify", {"input": "x", "options": {"aggregation": aggregation}}),
        )
        assert plan.options["aggregation"] == aggregation
    top = models["relevance"].answer("rerank", {"query": "q", "documents": ["a", "b"], "top_n": 1})
    assert len(top["results"]) == 1
    plan = task_model(models["relevance"]).plan(
        "rerank", read_request("rerank", {"query": "q", "documents": ["a"]})
    )
    assert plan.options == {"top_n": None, "return_documents": False, "meta": None}


def test_row_keys_differ_with_ids_or_segments():
    from vllm_srun.families.task_heads.inputs import row_key

    ids = [2, 40, 41, 3, 42, 3]
    keys = {
        row_key(ids, None),
        row_key(ids, [0, 0, 0, 0, 1, 1]),
        row_key(ids, [0, 0, 0, 1, 1, 1]),
        row_key([2, 40, 41, 3, 42, 4], None),
        row_key([2, 40, 41, 3, 42], None),
    }
    assert len(keys) == 5
    assert row_key(list(ids), None) == row_key(tuple(ids), None)
    assert row_key(ids, [0] * 6) == row_key(list(ids), [0] * 6)


def test_the_default_scan_budget_is_32768_content_tokens(models):
    loaded = task_model(models["sequence"])
    options = {"overflow": "window"}
    [at] = loaded.plan(
        "classify", read_request("classify", {"input": "good " * 32768, "options": options})
    ).inputs
    assert at.error is None and at.content_tokens == 32768
    assert len(at.rows) == 1 + -(-(32768 - 62) // 31)  # step 31 after the first window
    [over] = loaded.plan(
        "classify", read_request("classify", {"input": "good " * 32769, "options": options})
    ).inputs
    assert over.error == (
        "scan_budget_exceeded",
        "input has 32769 content tokens; the scan budget is 32768. "
        "Raise options.max_tokens or shorten the input",
    )
    assert over.rows == []


def test_cross_encoder_pairs_over_the_limit_fail_alone_and_rank_last(models):
    # with "good" and 3 special tokens: 65, 5, 66, 64 and 5 tokens
    documents = [words(61), "okay", words(62), words(60), "bad"]
    body = models["relevance"].answer(
        "rerank", {"query": "good", "documents": documents, "return_documents": True}
    )
    results = body["results"]
    assert sorted(r["index"] for r in results[:3]) == [1, 3, 4]
    assert all(r["document"] == documents[r["index"]] for r in results[:3])
    message = (
        "; the limit is 64. Shorten it, or send options.overflow truncate "
        "(keep the beginning) or window"
    )
    assert results[3:] == [
        {"index": 0, "error": "max_length_exceeded", "message": "input has 65 tokens" + message},
        {"index": 2, "error": "max_length_exceeded", "message": "input has 66 tokens" + message},
    ]
    assert body["usage"] == {"input_tokens": 5 + 64 + 5, "output_tokens": 0}
    cut = models["relevance"].answer(
        "rerank",
        {"query": "good", "documents": documents, "options": {"overflow": "truncate"}},
    )
    assert all("relevance_score" in r for r in cut["results"])


class HiddenByFirstToken:
    """A pooled engine model whose every hidden state is ``vectors[first content token]``."""

    def __init__(self, vectors):
        self.vectors = vectors

    def encode(self, batch):
        rows, width = batch.input_ids.shape
        first = [int(t) for t in batch.input_ids[:, 1]]
        stacked = np.stack([self.vectors[t] for t in first])[:, None, :]
        return np.ascontiguousarray(np.broadcast_to(stacked, (rows, width, stacked.shape[-1])))


def test_bi_encoder_cosines_are_clamped_to_plus_minus_one(models, tokenizer):
    # a vector whose normalised self-dot rounds above 1 in float32, read as the family reads
    # a row of [CLS] word [SEP] whose hidden states are all that vector
    generator = np.random.default_rng(0)
    for _ in range(1000):
        v = generator.standard_normal(32).astype(np.float32)
        unit = l2_normalize(pool(np.stack([v, v, v]), "mean"))
        if float(np.sum(unit * unit, dtype=np.float32)) > 1.0:
            break
    else:
        pytest.fail("no vector rounds above 1")
    assert float(np.sum(unit * -unit, dtype=np.float32)) < -1.0
    [good], [bad] = content_ids(tokenizer, "good"), content_ids(tokenizer, "bad")
    loaded = with_engine(models["pooled"], HiddenByFirstToken({good: v, bad: -v}))
    body = answer(loaded, "rerank", {"query": "good", "documents": ["bad", "good"]})
    used = {"tokens": 3, "processed_tokens": 3, "truncated": False, "windows": 1}
    assert body["results"] == [
        {"index": 1, "relevance_score": 1.0, "logit": 1.0, "input": used},
        {"index": 0, "relevance_score": -1.0, "logit": -1.0, "input": used},
    ]


class Recording:
    """An engine model that records each batch and answers zero logits ``[rows, labels]``."""

    def __init__(self, labels):
        self.labels = labels
        self.batches = []

    def encode(self, batch):
        self.batches.append(batch)
        return np.zeros((batch.input_ids.shape[0], self.labels), dtype=np.float32)


def test_rows_reach_the_engine_right_padded_with_the_pad_id(models, packages, tokenizer):
    import transformers

    engine = Recording(3)
    loaded = with_engine(models["sequence"], engine)
    good, film = content_ids(tokenizer, "good"), content_ids(tokenizer, words(4))
    plan = loaded.plan(
        "classify",
        read_request("classify", {"input": ["good", {"text": "good", "text_pair": words(4)}]}),
    )
    loaded.run(plan.items)
    [batch] = engine.batches
    assert batch.input_ids.tolist() == [
        [CLS, *good, SEP, 0, 0, 0, 0, 0],
        [CLS, *good, SEP, *film, SEP],
    ]
    assert batch.attention_mask.tolist() == [[1] * 3 + [0] * 5, [1] * 8]
    assert batch.token_type_ids.tolist() == [[0] * 8, [0] * 3 + [1] * 5]
    loaded.run(
        loaded.plan("classify", read_request("classify", {"input": ["good", words(3)]})).items
    )
    assert engine.batches[1].token_type_ids is None  # single texts: no segments
    roberta = Recording(3)
    tok = transformers.AutoTokenizer.from_pretrained(packages["roberta-sequence"])
    loaded = with_engine(models["roberta-sequence"], roberta)
    loaded.run(
        loaded.plan("classify", read_request("classify", {"input": ["good", words(3)]})).items
    )
    assert tok.pad_token_id == 1
    [good_id] = tok("good", add_special_tokens=False)["input_ids"]
    row = [tok.cls_token_id, good_id, tok.sep_token_id, 1, 1]  # padded to 5 tokens
    assert roberta.batches[0].input_ids[0].tolist() == row
    assert roberta.batches[0].attention_mask.dtype == np.int64
    assert batch.input_ids.dtype == np.int64
    assert all(isinstance(a, np.ndarray) for a in (batch.input_ids, batch.attention_mask))


def test_max_tokens_of_one_is_a_limit_not_a_bad_request(models):
    [result] = classify(models["sequence"], "good", max_tokens=1)
    assert result["error"] == "max_length_exceeded"
    assert result["message"].startswith("input has 3 tokens; the limit is 1.")


def test_a_tokenizer_without_a_pad_token_pads_with_id_0(tmp_path):
    from vllm_srun.families.task_heads.inputs import InputPolicy, TextEncoder

    from ..fixtures import write_tokenizer

    write_tokenizer(tmp_path, "roberta")  # its pad token <pad> is id 1
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["pad_token"] = None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    special = json.loads((tmp_path / "special_tokens_map.json").read_text())
    special.pop("pad_token")
    (tmp_path / "special_tokens_map.json").write_text(json.dumps(special))
    encoder = TextEncoder(tmp_path, 16)
    assert encoder.pad_id == 0
    assert (encoder.prefix, encoder.suffix) == ([0], [2])  # <s> ... </s>
    assert encoder.specials == (2, 3)  # the fixture's BERT template: <s> A </s> B </s>
    encoded = encoder.encode("good", "bad", InputPolicy())
    assert encoded.tokens == 5 and encoded.rows[0].token_type_ids is not None


def test_a_non_finite_document_fails_alone_in_either_rerank(models, tokenizer):
    nan = float("nan")
    cross = with_engine(models["relevance"], FixedLogits([[0.5], [nan], [2.0], [-1.0]]))
    body = answer(cross, "rerank", {"query": "q", "documents": ["a", "b", "c", "d"]})
    assert [r["index"] for r in body["results"]] == [2, 0, 3, 1]
    assert body["results"][3] == {
        "index": 1,
        "error": "invalid_model_output",
        "message": "the logit is not finite",
    }
    [good], [bad], [okay] = (content_ids(tokenizer, t) for t in ("good", "bad", "okay"))
    vectors = {
        good: np.ones(32, dtype=np.float32),
        bad: np.full(32, nan, dtype=np.float32),
        okay: -np.ones(32, dtype=np.float32),
    }
    bi = with_engine(models["pooled"], HiddenByFirstToken(vectors))
    body = answer(bi, "rerank", {"query": "good", "documents": ["bad", "okay", "good"]})
    assert [r["index"] for r in body["results"]] == [2, 1, 0]
    assert body["results"][2] == {
        "index": 0,
        "error": "invalid_model_output",
        "message": "the score is not finite",
    }


@pytest.mark.parametrize(
    ("model_type", "envelope", "pad", "spelled"),
    [("bert", ([2], [3]), 0, "[SEP] [CLS]"), ("roberta", ([0], [2]), 1, "</s> <s>")],
)
def test_the_encoder_reads_the_envelope_and_pad_id_and_reads_specials_as_text(
    tmp_path, model_type, envelope, pad, spelled
):
    import transformers

    from vllm_srun.families.task_heads.inputs import InputPolicy, TextEncoder

    from ..fixtures import write_tokenizer

    write_tokenizer(tmp_path, model_type)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert (tok.cls_token_id, tok.sep_token_id, tok.pad_token_id) == (
        *envelope[0],
        *envelope[1],
        pad,
    )
    encoder = TextEncoder(tmp_path, 32)
    assert (encoder.prefix, encoder.suffix, encoder.pad_id) == (*envelope, pad)
    [row] = encoder.encode(f"good {spelled} movie", None, InputPolicy()).rows
    specials = {*envelope[0], *envelope[1]}
    assert [i for i in row.input_ids if i in specials] == [*envelope[0], *envelope[1]]
    assert row.input_ids[0] == envelope[0][0] and row.input_ids[-1] == envelope[1][0]


def test_a_tokenizer_without_special_tokens_windows_bare_slices(tmp_path, tokenizer):
    from vllm_srun.families.task_heads.inputs import InputPolicy, TextEncoder

    from ..fixtures import write_tokenizer

    write_tokenizer(tmp_path, "bert")
    raw = json.loads((tmp_path / "tokenizer.json").read_text())
    raw["post_processor"] = None
    (tmp_path / "tokenizer.json").write_text(json.dumps(raw))
    encoder = TextEncoder(tmp_path, 16)
    assert (encoder.prefix, encoder.suffix, encoder.specials) == ([], [], (0, 0))
    text = words(6)
    ids = content_ids(tokenizer, text)
    policy = InputPolicy(overflow="window", window_tokens=4, window_overlap=2)
    encoded = encoder.encode(text, None, policy)
    assert [list(r.input_ids) for r in encoded.rows] == [ids[0:4], ids[2:6]]
    assert encoded.row_content == [[0, 1, 2, 3]] * 2


def test_a_tokenizer_with_only_a_leading_special_token_windows_with_it_alone(tmp_path, tokenizer):
    from tokenizers import Tokenizer, processors

    from vllm_srun.families.task_heads.inputs import InputPolicy, TextEncoder

    from ..fixtures import write_tokenizer

    write_tokenizer(tmp_path, "bert")
    raw = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    raw.post_processor = processors.TemplateProcessing(
        single="[CLS] $A", pair="[CLS] $A $B:1", special_tokens=[("[CLS]", CLS)]
    )
    raw.save(str(tmp_path / "tokenizer.json"))
    encoder = TextEncoder(tmp_path, 16)
    assert (encoder.prefix, encoder.suffix, encoder.specials) == ([CLS], [], (1, 1))
    text = words(6)
    ids = content_ids(tokenizer, text)
    policy = InputPolicy(overflow="window", window_tokens=5, window_overlap=2)
    encoded = encoder.encode(text, None, policy)
    assert [list(r.input_ids) for r in encoded.rows] == [[CLS, *ids[0:4]], [CLS, *ids[2:6]]]


def test_pair_rows_with_the_same_ids_but_other_segments_have_other_keys(tmp_path):
    from tokenizers import Tokenizer, processors

    from vllm_srun.families.task_heads.inputs import InputPolicy, TextEncoder

    from ..fixtures import write_tokenizer

    write_tokenizer(tmp_path, "bert")
    raw = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    # segments without special tokens: no [SEP] marks where the second text starts
    raw.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B:1")
    raw.save(str(tmp_path / "tokenizer.json"))
    encoder = TextEncoder(tmp_path, 16)
    [one] = encoder.encode("good movie", "okay", InputPolicy()).rows
    [two] = encoder.encode("good", "movie okay", InputPolicy()).rows
    assert one.input_ids == two.input_ids
    assert one.token_type_ids == (0, 0, 1) and two.token_type_ids == (0, 1, 1)
    assert one.key != two.key  # the scheduler computes (and caches) each on its own


# -- token ids as input ----------------------------------------------------------------------
def test_token_ids_run_as_the_row_they_are_under_each_overflow(models, tokenizer):
    loaded = task_model(models["pooled"])
    limit = loaded.encoder.limit
    assert limit < 72
    vocabulary = loaded.encoder.vocabulary
    assert vocabulary == len(tokenizer)
    ids = [CLS, *content_ids(tokenizer, words(70)), SEP]  # 72 ids
    assert len(ids) == 72

    def plan(body):
        return loaded.plan("embeddings", read_request("embeddings", body)).inputs

    [fits] = plan({"input": ids[:limit]})
    assert [list(r.input_ids) for r in fits.rows] == [ids[:limit]]
    assert (fits.tokens, fits.processed_tokens, fits.truncated) == (limit, limit, False)
    assert fits.error is None
    assert fits.windows == [(0, limit)] and fits.row_content == [list(range(limit))]
    assert fits.content_tokens == limit
    assert fits.rows[0].key == row_key(ids[:limit], None)  # rows are deduplicated by key
    [rejected] = plan({"input": ids})
    assert rejected.rows == [] and rejected.error == (
        "max_length_exceeded",
        f"input has 72 token ids; the limit is {limit}. Send fewer ids, or options.overflow "
        "truncate (keep the first ids); windows read texts only",
    )
    [cut] = plan({"input": ids, "options": {"overflow": "truncate"}})
    assert [list(r.input_ids) for r in cut.rows] == [ids[:limit]]
    assert (cut.tokens, cut.processed_tokens, cut.truncated) == (72, limit, True)
    assert cut.content_tokens == 72
    [lowered] = plan({"input": ids, "options": {"overflow": "truncate", "max_tokens": 10}})
    assert [list(r.input_ids) for r in lowered.rows] == [ids[:10]]
    [limited] = plan({"input": ids[:11], "options": {"max_tokens": 10}})
    assert limited.error[0] == "max_length_exceeded"
    assert limited.error[1].startswith("input has 11 token ids; the limit is 10.")
    [windowed] = plan({"input": ids, "options": {"overflow": "window"}})
    assert windowed.rows == [] and windowed.error[0] == "invalid_input"
    [short] = plan({"input": ids[:5], "options": {"overflow": "window"}})
    assert short.error is None and [list(r.input_ids) for r in short.rows] == [ids[:5]]
    with pytest.raises(RequestError) as raised:
        plan({"input": [[CLS, SEP], [CLS, vocabulary, SEP]]})
    assert raised.value.message == (
        f"input[1][1] is token id {vocabulary}; this model's vocabulary has ids 0 to "
        f"{vocabulary - 1}"
    )
    [last] = plan({"input": [CLS, vocabulary - 1, SEP]})
    assert last.error is None
