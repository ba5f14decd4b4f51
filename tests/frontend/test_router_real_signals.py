"""Router mode with real signals on real workers (ROUTER-SPEC §4: T10, T17, T18, T19 and
the troubleshooting seeds' commands).

One ``vllm-sr serve --config`` (Router mode, no ``-e``) for the module starts two real
``vllm-srun`` workers from their installed mirrors (``--offline``):

- MiniLM (``sentence-transformers/all-MiniLM-L6-v2``) as ``primary``, the default
  decision deployment: it answers the ``request_kind`` Choice question through its
  similarity readout, and is bound as ``embedding`` (embedding rules and the semantic
  response cache);
- Rampart (``arcjet/rampart-pii``) bound as ``pii_classifier`` (``token_spans.v1``,
  head ``token``), also published on the listener's runtime grant so its raw spans can
  be read.

Chat goes to the scripted stub backend (``stub_backend.py``): each provider model has
its own ``provider_model_id``, so the backend's ``model`` says where a request went.

Measured on this machine (2 cores, CPU; printed by the tests with ``-s``):
- MiniLM ``request_kind`` on "integrate x^2 from 0 to 1": math 0.9922, chat 0.0078;
- Rampart: "Call me at 415-555-0132" PHONE 0.739; "My email is ruth@example.com"
  EMAIL 1.000 (the module's default PII threshold, 0.9, would miss that phone number:
  the rules set 0.6; Rampart also reads "Thanks for reading." as GIVEN_NAME 0.53 and
  "Lisbon" as CITY 0.64, so the texts here avoid such words);
- cosines (MiniLM, unit vectors) behind the embedding rules' thresholds: see
  :data:`EMBEDDING_CASES`.

The last test SIGKILLs the MiniLM worker (it must stay last: the module's router then
has no decision deployment until the supervisor restarts it).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest
import yaml

from .conftest import free_ports
from .router_real_support import RouterServed, metric_value, running_backend, served_in
from .stub_backend import Running

pytestmark = pytest.mark.slow

KEYS = ("key-a", "key-b")
SIGNAL_TIMEOUT_MS = 10000
WEATHER = [
    "What is the weather forecast for tomorrow?",
    "Will it rain today?",
    "How hot will it be this afternoon?",
]
COLD = ["Will it snow this weekend?", "Is it freezing cold outside right now?"]
COOKING = ["How do I bake bread at home?", "Give me a recipe for pasta sauce"]

MODELS = {
    "general": "served-general",
    "math-model": "served-math",
    "private-model": "served-private",
    "weather-model": "served-weather",
    "cooking-model": "served-cooking",
}


def embedding_rule(name: str, method: str, threshold: float, candidates: list[str]) -> dict:
    return {
        "name": name,
        "aggregation_method": method,
        "threshold": threshold,
        "candidates": candidates,
    }


def decision(name: str, priority: int, conditions: list[dict], model: str, **more) -> dict:
    return {
        "name": name,
        "priority": priority,
        "rules": {"operator": "OR", "conditions": conditions},
        "modelRefs": [{"model": model}],
        **more,
    }


def config(server: RouterServed, backend: str) -> str:
    """The module's configuration: listener ``public`` (open, Chat on the seeds' 8899
    plus the offset, and Rampart on its runtime grant) and ``keyed`` (two API keys)."""
    pii = {"threshold": 0.6, "pii_types_allowed": ["EMAIL"]}
    document = {
        "listeners": [
            {
                "name": "public",
                "address": "127.0.0.1",
                "port": server.chat_port,
                "runtime": {"models": ["rampart-pii"]},
            },
            {
                "name": "keyed",
                "address": "127.0.0.1",
                "port": server.keyed_port,  # type: ignore[attr-defined]
                "api_keys": list(KEYS),
            },
        ],
        "providers": {
            "defaults": {"default_model": "general"},
            "models": [
                {"name": name, "provider_model_id": served, "backend_refs": [{"endpoint": backend}]}
                for name, served in MODELS.items()
            ],
        },
        "global": {
            "model_catalog": {
                "signal_timeout_ms": SIGNAL_TIMEOUT_MS,
                "deployments": {
                    "primary": {
                        "provider": "model_runtime",
                        "artifact": "sentence-transformers/all-MiniLM-L6-v2",
                        "device": "cpu",
                    },
                    "rampart": {
                        "provider": "model_runtime",
                        "artifact": "arcjet/rampart-pii",
                        "public_name": "rampart-pii",
                        "device": "cpu",
                    },
                },
                "bindings": {
                    "embedding": {"deployment": "primary", "contract": "embedding.v1"},
                    "pii_classifier": {
                        "deployment": "rampart",
                        "contract": "token_spans.v1",
                        "head": "token",
                    },
                },
                "embeddings": {"semantic": {"embedding_config": {"top_k": 1}}},
            }
        },
        "routing": {
            "signals": {
                "decision": [
                    {
                        "name": "request_kind",
                        "question": {
                            "type": "choice",
                            "instructions": "What kind of request is this?",
                            "choices": [
                                {
                                    "key": "math",
                                    "description": "Mathematics: calculus, integrals, "
                                    "equations and arithmetic",
                                },
                                {
                                    "key": "chat",
                                    "description": "Casual conversation, greetings and small talk",
                                },
                            ],
                        },
                    }
                ],
                "pii": [
                    {"name": "contact_pii", **pii},
                    {"name": "history_pii", **pii, "include_history": True},
                ],
                "embeddings": [
                    embedding_rule("rain_max", "max", 0.8, WEATHER),
                    embedding_rule("weather_mean", "mean", 0.63, WEATHER),
                    embedding_rule("cold_any", "any", 0.62, COLD),
                    embedding_rule("cooking_mean", "mean", 0.45, COOKING),
                ],
            },
            "decisions": [
                decision(
                    "pii_guard", 300, [{"type": "pii", "name": "contact_pii"}], "private-model"
                ),
                decision(
                    "pii_history", 290, [{"type": "pii", "name": "history_pii"}], "private-model"
                ),
                decision(
                    "math",
                    200,
                    [{"type": "decision", "name": "request_kind", "label": "math"}],
                    "math-model",
                ),
                decision(
                    "weather",
                    100,
                    [
                        {"type": "embedding", "name": name}
                        for name in ("rain_max", "weather_mean", "cold_any")
                    ],
                    "weather-model",
                    plugins=[
                        {
                            "type": "response_cache",
                            "configuration": {
                                "mode": "semantic",
                                "semantic": {"similarity_threshold": 0.9},
                            },
                        }
                    ],
                ),
                decision(
                    "cooking", 100, [{"type": "embedding", "name": "cooking_mean"}], "cooking-model"
                ),
            ],
        },
    }
    return yaml.safe_dump(document, sort_keys=False)


MATH = "integrate x^2 from 0 to 1"
PHONE = "Call me at 415-555-0132"
EMAIL = "My email is ruth@example.com"


@pytest.fixture(scope="module")
def backend() -> Iterator[Running]:
    yield from running_backend()


@pytest.fixture(scope="module")
def router(backend: Running, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterServed]:
    folder = tmp_path_factory.mktemp("router-real-signals")
    [keyed_port] = free_ports(1)

    def configured(server: RouterServed) -> str:
        server.keyed_port = keyed_port  # type: ignore[attr-defined]
        return config(server, backend.stub.endpoint)

    yield from served_in(lambda: RouterServed(folder, configured))


def sent_models(backend: Running, since: int) -> list[str]:
    return [seen.body.get("model") for seen in backend.stub.requests[since:]]


# -- T10: a MiniLM Choice question routes ------------------------------------------------------


def test_t10_a_minilm_choice_question_routes_integrals_to_the_math_model(router, backend):
    preview = router.preview(MATH)
    values = preview["signal_values"]
    print(
        f"\nMiniLM request_kind on {MATH!r}: math {values['decision:request_kind:math']:.4f}, "
        f"chat {values['decision:request_kind:chat']:.4f}"
    )
    assert values["decision:request_kind:math"] > 0.9 > values["decision:request_kind:chat"]
    assert preview["decision_result"]["decision_name"] == "math"
    assert preview["decision_result"]["matched_signals"]["decision"] == [
        "request_kind",
        "request_kind:math",
    ]
    assert preview["selected_model"] == "math-model"
    assert preview["signal_errors"] == {}

    since = len(backend.stub.requests)
    answer = router.ask(MATH)
    assert answer.status_code == 200, answer.text
    assert sent_models(backend, since) == ["served-math"]
    assert answer.json()["model"] == "served-math"
    headers = answer.headers
    assert headers["x-vsr-selected-decision"] == "math"
    assert headers["x-vsr-selected-model"] == "math-model"
    assert headers["x-vsr-matched-decision-model"] == "request_kind:math"
    assert float(headers["x-vsr-selected-confidence"]) == pytest.approx(
        values["decision:request_kind:math"], abs=1e-4
    )
    # Without x-vsr-debug: the selection headers, no matched ones.
    quiet = router.ask(MATH, debug=False)
    assert quiet.headers["x-vsr-selected-decision"] == "math"
    assert "x-vsr-matched-decision-model" not in quiet.headers

    chat = router.preview("hello, how are you today?")
    assert chat["decision_result"]["matched_signals"]["decision"] == [
        "request_kind",
        "request_kind:chat",
    ]
    assert chat["selection_status"] == "fallback" and chat["selected_model"] == "general"


# -- T17: PII on Rampart -----------------------------------------------------------------------


def rampart_spans(router: RouterServed, text: str) -> list[tuple[str, str, float]]:
    """Rampart's own spans for ``text``, through the listener's runtime grant."""
    answer = router.chat.post(
        f"http://127.0.0.1:{router.chat_port}/v1/classify",
        json={"model": "rampart-pii", "input": [text], "head": "token"},
    )
    assert answer.status_code == 200, answer.text
    [result] = answer.json()["results"]
    return [(s["label"], s["text"], s["probability"]) for s in result["spans"]]


def test_t17_rampart_probabilities_behind_the_thresholds(router):
    phone = rampart_spans(router, PHONE)
    email = rampart_spans(router, EMAIL)
    print(f"\nRampart on {PHONE!r}: {phone}\nRampart on {EMAIL!r}: {email}")
    [(label, text, probability)] = phone
    assert (label, text) == ("PHONE", "415-555-0132")
    assert 0.6 + 0.1 <= probability < 0.9  # the rule's 0.6 holds it; the module's 0.9 would not
    assert [(label, text) for label, text, _ in email] == [("EMAIL", "ruth@example.com")]
    assert email[0][2] >= 0.5


def test_t17_an_allowed_email_does_not_match_a_phone_number_does(router, backend):
    email = router.preview(EMAIL)
    assert "pii" not in email["decision_result"]["matched_signals"]
    assert email["decision_result"]["decision_name"] != "pii_guard"
    assert email["signal_errors"] == {}

    phone = router.preview(PHONE)
    assert phone["decision_result"]["matched_signals"]["pii"] == ["contact_pii", "history_pii"]
    assert phone["decision_result"]["decision_name"] == "pii_guard"

    since = len(backend.stub.requests)
    answered = router.ask(PHONE)
    assert answered.status_code == 200, answered.text
    assert answered.headers["x-vsr-selected-decision"] == "pii_guard"
    assert answered.headers["x-vsr-matched-pii"] == "contact_pii,history_pii"
    assert sent_models(backend, since) == ["served-private"]
    quiet = router.ask(EMAIL)
    assert quiet.headers.get("x-vsr-selected-decision") != "pii_guard"
    assert "x-vsr-matched-pii" not in quiet.headers


def test_t17_include_history_reads_an_earlier_user_turn(router):
    turns = [
        {"role": "user", "content": PHONE},
        {"role": "assistant", "content": "Sure, noted."},
        {"role": "user", "content": "Will it rain tomorrow morning?"},
    ]
    preview = router.preview(messages=turns)
    matched = preview["decision_result"]["matched_signals"]
    assert matched["pii"] == ["history_pii"]  # contact_pii reads only the last user turn
    assert preview["decision_result"]["decision_name"] == "pii_history"
    answer = router.ask(turns)
    assert answer.headers["x-vsr-selected-decision"] == "pii_history"
    assert answer.headers["x-vsr-matched-pii"] == "history_pii"
    clean = [
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": "Sure, noted."},
        {"role": "user", "content": "Will it rain tomorrow morning?"},
    ]
    assert "pii" not in router.preview(messages=clean)["decision_result"]["matched_signals"]


# -- T19: embeddings: max, mean, any, top_k 1 --------------------------------------------------

EMBEDDING_CASES = [
    # text, the rules over their thresholds, the one emitted (top_k 1). Cosines measured:
    # rain_max 0.935, weather_mean 0.725, cold_any 0.696, cooking_mean 0.073
    ("Will it rain tomorrow morning?", {"rain_max", "weather_mean", "cold_any"}, "rain_max"),
    # rain_max 0.686 (< 0.8), weather_mean 0.662, cold_any 0.538
    ("What's the weather like today?", {"weather_mean"}, "weather_mean"),
    # rain_max 0.548, weather_mean 0.503, cold_any 0.665
    ("Do I need a warm coat, will it snow tonight?", {"cold_any"}, "cold_any"),
    # cooking_mean 0.498 (0.283 and 0.713)
    ("How do I make tomato sauce?", {"cooking_mean"}, "cooking_mean"),
]
THRESHOLDS = {"rain_max": 0.8, "weather_mean": 0.63, "cold_any": 0.62, "cooking_mean": 0.45}


@pytest.mark.parametrize(("text", "over", "emitted"), EMBEDDING_CASES)
def test_t19_embedding_rules_aggregate_and_top_k_emits_one(router, text, over, emitted):
    preview = router.preview(text)
    scores = {
        key.split(":", 1)[1]: value
        for key, value in preview["signal_confidences"].items()
        if key.startswith("embedding:")
    }
    print(f"\n{text!r}: " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(scores.items())))
    assert set(scores) == set(THRESHOLDS)  # the preview scores every rule
    assert {n for n, s in scores.items() if s >= THRESHOLDS[n]} == over
    for name, score in scores.items():  # no score sits on its threshold's edge
        assert abs(score - THRESHOLDS[name]) > 0.015, (name, score)
    assert preview["decision_result"]["matched_signals"]["embeddings"] == [emitted]
    assert preview["signal_errors"] == {}


def test_t19_mean_and_max_read_the_same_candidates_differently(router):
    scores = router.preview("Will it rain tomorrow morning?")["signal_confidences"]
    # weather_mean and rain_max share their three candidates: mean < max
    assert scores["embedding:weather_mean"] < scores["embedding:rain_max"] - 0.1


def test_t19_the_debug_header_names_the_one_rule_emitted(router, backend):
    since = len(backend.stub.requests)
    answer = router.ask("Will it rain tomorrow morning?")
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-vsr-selected-decision"] == "weather"
    assert answer.headers["x-vsr-matched-embeddings"] == "rain_max"
    assert sent_models(backend, since) == ["served-weather"]
    cooking = router.ask("How do I make tomato sauce?")
    assert cooking.headers["x-vsr-selected-decision"] == "cooking"
    assert cooking.headers["x-vsr-matched-embeddings"] == "cooking_mean"


# -- T18: the semantic response cache ----------------------------------------------------------


def test_t18_a_paraphrase_hits_another_system_prompt_or_key_does_not(router, backend):
    def ask(text: str, system: str, key: str) -> httpx.Response:
        turns = [{"role": "system", "content": system}, {"role": "user", "content": text}]
        return router.ask(turns, key=key, port=router.keyed_port)

    brief = "You answer in one short sentence."
    first = ask("Will it rain tomorrow morning?", brief, KEYS[0])
    assert first.status_code == 200, first.text
    assert first.headers["x-vsr-selected-decision"] == "weather"
    assert "x-vsr-cache-hit" not in first.headers

    calls = len(backend.stub.requests)
    hit = ask("Is it going to rain tomorrow morning?", brief, KEYS[0])
    assert hit.status_code == 200, hit.text
    assert hit.headers["x-vsr-cache-hit"] == "true"
    assert hit.headers["x-vsr-response-path"] == "cache"
    assert "x-vsr-selected-decision" not in hit.headers  # a hit gets no decision headers
    similarity = float(hit.headers["x-vsr-cache-similarity"])
    print(f"\ncache similarity of the paraphrase: {similarity:.4f}")
    assert 0.9 <= similarity < 1.0
    assert hit.content == first.content
    assert len(backend.stub.requests) == calls  # the backend was not called

    persona = ask("Is it going to rain tomorrow morning?", "You are a pirate.", KEYS[0])
    assert persona.status_code == 200
    assert "x-vsr-cache-hit" not in persona.headers
    assert len(backend.stub.requests) == calls + 1

    other_key = ask("Is it going to rain tomorrow morning?", brief, KEYS[1])
    assert other_key.status_code == 200
    assert "x-vsr-cache-hit" not in other_key.headers
    assert len(backend.stub.requests) == calls + 2

    # The entry the first key stored still answers that key.
    again = ask("Will it rain tomorrow morning?", brief, KEYS[0])
    assert again.headers["x-vsr-cache-hit"] == "true"
    assert len(backend.stub.requests) == calls + 2


# -- the troubleshooting seeds' commands -------------------------------------------------------


def shell(command: str) -> str:
    done = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, (command, done.stdout, done.stderr)
    return done.stdout


def seed(command: str, router: RouterServed) -> str:
    """A seed command with the ports moved by the router's offset."""
    return (
        command.replace("localhost:8899", f"localhost:{router.chat_port}")
        .replace("localhost:8080", f"localhost:{router.mgmt_port}")
        .replace("localhost:9190", f"localhost:{router.metrics_port}")
    )


DEBUG_CURL = """curl -s -D - -o /dev/null localhost:8899/v1/chat/completions \\
  -H 'content-type: application/json' -H 'x-vsr-debug: true' \\
  -d '{"model": "vllm-sr/auto", "messages": [{"role": "user", "content": "integrate x^2 from 0 to 1"}]}'"""  # noqa: E501

PREVIEW_JQ = """curl -s 'localhost:8080/api/v1/routing/preview?trace=true' \\
  -H 'content-type: application/json' \\
  -d '{"model": "vllm-sr/auto", "text": "integrate x^2 from 0 to 1"}' \\
  | jq '{decision: .decision_result.decision_name, matched: .decision_result.matched_signals, signal_errors}'"""  # noqa: E501

METRICS_GREP = "curl -s localhost:9190/metrics | grep '^vsr_model_runtime'"


def test_seed_debug_curl_shows_the_matched_headers(router):
    out = shell(seed(DEBUG_CURL, router))
    lines = {
        line.split(":", 1)[0].lower(): line.split(":", 1)[1].strip()
        for line in out.splitlines()
        if ":" in line
    }
    assert out.startswith("HTTP/1.1 200"), out
    assert lines["x-vsr-matched-decision-model"] == "request_kind:math"
    assert lines["x-vsr-selected-decision"] == "math"


def test_seed_preview_jq_prints_decision_matches_and_errors(router):
    printed = json.loads(shell(seed(PREVIEW_JQ, router)))
    assert printed == {
        "decision": "math",
        "matched": {"decision": ["request_kind", "request_kind:math"]},
        "signal_errors": {},
    }


def unknown_answers(text: str) -> float:
    """Every ``vsr_model_runtime_unknown_answers_total`` of ``primary``, whatever the reason."""
    return sum(
        metric_value(
            text, "vsr_model_runtime_unknown_answers_total", deployment="primary", reason=r
        )
        for r in ("timeout", "unavailable", "overloaded", "rejected", "failed")
    )


def test_zz_a_killed_minilm_worker_answers_unknown_within_the_deadline(router, backend):
    """SIGKILL the MiniLM worker: a routed request is still answered within the signal
    deadline (its signals unknown: the default model), the seeds' preview names the
    unknown signals, and the seeds' metrics grep shows the unknown answers counted. Last
    in the module: MiniLM is gone until the supervisor restarts it (tens of seconds)."""
    before = unknown_answers(router.metrics())
    minilm = router.worker_of("all-MiniLM-L6-v2")
    minilm.kill()
    minilm.wait(15)
    # A question never asked before: the pool's result cache holds the earlier answers to
    # MATH, and serves them until the frontend has seen the worker go (a few ms).
    started = time.monotonic()
    answer = router.ask("integrate 3x^2 + 2x from 1 to 4")
    seconds = time.monotonic() - started
    print(f"\nrouted with MiniLM killed in {seconds:.2f} s: {dict(answer.headers)}")
    assert answer.status_code == 200, answer.text
    assert seconds < SIGNAL_TIMEOUT_MS / 1000 + 5
    assert answer.headers["x-vsr-selected-model"] == "general"  # no decision matched
    assert "x-vsr-selected-decision" not in answer.headers
    # Once the frontend has seen the worker go, no cached answer stands in for it.
    gone_by = time.monotonic() + 10
    while metric_value(router.metrics(), "vsr_model_runtime_ready", deployment="primary") != 0:
        assert time.monotonic() < gone_by, "the frontend did not see the MiniLM worker go"
        time.sleep(0.05)
    # The preview names the unknown signals: unavailable (the socket is gone), or a
    # timeout should the restarted worker already accept connections while it loads.
    preview = json.loads(shell(seed(PREVIEW_JQ, router)))
    print(f"preview: {preview}")
    assert preview["decision"] is None
    errors = preview["signal_errors"]
    assert errors.pop("decision:request_kind") in ("decision_unavailable", "decision_timeout")
    assert errors == {
        f"embedding:{name}": "embedding_evaluation_failed"
        for name in ("cold_any", "cooking_mean", "rain_max", "weather_mean")
    }
    grep = shell(seed(METRICS_GREP, router))
    print(
        "\n".join(
            line
            for line in grep.splitlines()
            if "unknown_answers_total" in line or "_ready{" in line
        )
    )
    assert unknown_answers(grep) >= before + 2, grep  # the question and the embedding
    assert metric_value(grep, "vsr_model_runtime_ready", deployment="primary") == 0
