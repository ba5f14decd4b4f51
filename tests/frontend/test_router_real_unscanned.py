"""Router mode, T15: PII input that was not read in full (ROUTER-SPEC §2.4, §2.5).

Three ``vllm-sr serve --config`` processes for the module:

- ``rampart``: real Rampart (``arcjet/rampart-pii``, a managed ``vllm-srun`` worker)
  under ``input: {max_tokens: 64, overflow: reject}``, bound as ``pii_classifier``; two
  listeners: ``open`` (no request deadline; ``signal_timeout_ms`` 30 s) and ``hurried``
  (``timeout: 1.5s``, so the signals' deadline is 0.5 s). A padded prompt over 64 tokens is
  refused by the first read (``max_length_exceeded``) and read again in windows of the
  deployment's 64 tokens; past the model's scan budget (32768 content tokens) or past the
  deadline it is *unscanned*, and the rule matches whatever ``on_error`` says;
- ``allowing`` and ``blocking``: a steerable PII worker attached by endpoint
  (:class:`~.router_real_support.AttachedPii`), with ``on_unscanned: allow`` and
  ``on_error`` ``allow`` or ``block``: an unscanned input is handed to ``on_error``.

Measured here: Rampart reads ~12,500 content tokens in 64-token windows in ~3-4 s on 2
cores; the padded phone number is found with PHONE 0.99.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import free_ports
from .router_real_support import (
    AttachedPii,
    RouterServed,
    Threaded,
    metric_value,
    running_backend,
    served_in,
)
from .stub_backend import Running

pytestmark = pytest.mark.slow

PAD = "Please read these meeting notes about the quarterly budget review carefully. "
"""~12.5 Rampart tokens per repeat."""
PHONE = "Call me at 415-555-0132"
CLEAN_END = "Thanks, see you soon."

PROVIDERS = """
providers:
  defaults: {default_model: general}
  models:
    - name: general
      provider_model_id: served-general
      backend_refs: [{endpoint: "{backend}"}]
    - name: private-model
      provider_model_id: served-private
      backend_refs: [{endpoint: "{backend}"}]
"""

ROUTING = """
routing:
  signals:
    pii:
      - {name: contact_pii, threshold: 0.6, pii_types_allowed: [EMAIL]}
  decisions:
    - name: pii_guard
      rules: {operator: OR, conditions: [{type: pii, name: contact_pii}]}
      modelRefs: [{model: private-model}]
"""

RAMPART_CONFIG = (
    """
listeners:
  - {name: open, address: 127.0.0.1, port: {chat_port}, runtime: {models: [rampart-pii]}}
  - {name: hurried, address: 127.0.0.1, port: {hurried_port}, timeout: 1.5s}
"""
    + PROVIDERS
    + """
global:
  model_catalog:
    signal_timeout_ms: 30000
    deployments:
      pii:
        provider: model_runtime
        artifact: arcjet/rampart-pii
        public_name: rampart-pii
        device: cpu
        input: {max_tokens: 64, overflow: reject}
    bindings:
      pii_classifier: {deployment: pii, contract: token_spans.v1, head: token}
"""
    + ROUTING
)

ATTACHED_CONFIG = (
    """
listeners:
  - {name: open, address: 127.0.0.1, port: {chat_port}}
"""
    + PROVIDERS
    + """
global:
  model_catalog:
    signal_timeout_ms: 10000
    modules:
      classifier:
        pii: {on_unscanned: allow, on_error: {on_error}}
    deployments:
      pii:
        provider: model_runtime
        endpoint: "{attached}"
        served_name: fake-pii
        input: {max_tokens: 64, overflow: reject}
    bindings:
      pii_classifier: {deployment: pii, contract: token_spans.v1, head: token}
"""
    + ROUTING
)


@pytest.fixture(scope="module")
def backend() -> Iterator[Running]:
    yield from running_backend()


@pytest.fixture(scope="module")
def rampart(backend: Running, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterServed]:
    folder = tmp_path_factory.mktemp("router-unscanned-rampart")
    [hurried] = free_ports(1)
    config = RAMPART_CONFIG.replace("{backend}", backend.stub.endpoint).replace(
        "{hurried_port}", str(hurried)
    )

    def start() -> RouterServed:
        server = RouterServed(folder, config)
        server.hurried_port = hurried  # type: ignore[attr-defined]
        return server

    for server in served_in(start):
        # The first forward after the self-check is slow (~2 s): not in a measured request.
        assert server.ask("hello").status_code == 200
        yield server


def classify(server: RouterServed, text: str, options: dict[str, Any] | None = None) -> dict:
    """Rampart's own answer for ``text`` through the listener's runtime grant (the pool
    adds the deployment's ``input`` as options when the request chooses none)."""
    body: dict[str, Any] = {"model": "rampart-pii", "input": [text], "head": "token"}
    if options is not None:
        body["options"] = options
    answer = server.chat.post(f"http://127.0.0.1:{server.chat_port}/v1/classify", json=body)
    assert answer.status_code == 200, answer.text
    [result] = answer.json()["results"]
    return result


def test_t15_a_padded_prompt_is_read_again_in_windows(rampart: RouterServed) -> None:
    padded = PAD * 12 + PHONE
    first = classify(rampart, padded)  # the deployment's own reject at 64 tokens
    assert first["error"] == "max_length_exceeded", first
    again = classify(rampart, padded, {"overflow": "window", "window": {"tokens": 64}})
    print(f"\nthe window read: {again['input']}, spans {again['spans']}")
    assert again["input"]["truncated"] is False and again["input"]["windows"] >= 3
    [span] = again["spans"]
    assert (span["label"], span["text"]) == ("PHONE", "415-555-0132")
    assert span["start"] > len(PAD) * 5  # well past what one 64-token read holds

    found = rampart.preview(padded)
    assert found["signal_errors"] == {}  # read in full
    assert found["decision_result"]["matched_signals"] == {"pii": ["contact_pii"]}
    assert found["decision_result"]["decision_name"] == "pii_guard"

    clean = rampart.preview(PAD * 12 + CLEAN_END)
    assert clean["signal_errors"] == {}
    assert clean["decision_result"]["matched_signals"] == {}
    assert clean["selected_model"] == "general"

    answer = rampart.ask(padded)
    assert answer.headers["x-vsr-selected-decision"] == "pii_guard"
    assert answer.headers["x-vsr-matched-pii"] == "contact_pii"


def test_t15_past_the_models_scan_budget_the_rule_matches_unscanned(rampart: RouterServed) -> None:
    huge = PAD * 3000 + CLEAN_END  # ~37,500 content tokens, over the 32,768 budget
    refused = classify(rampart, huge, {"overflow": "window", "window": {"tokens": 64}})
    assert refused["error"] == "scan_budget_exceeded", refused
    preview = rampart.preview(huge)
    assert preview["signal_errors"] == {"pii:contact_pii": "scan_budget"}
    assert preview["decision_result"]["matched_signals"] == {"pii": ["contact_pii"]}
    assert preview["decision_result"]["decision_name"] == "pii_guard"
    answer = rampart.ask(huge)
    assert answer.headers["x-vsr-selected-decision"] == "pii_guard"
    assert answer.headers["x-vsr-matched-pii"] == "contact_pii"


def test_t15_a_scan_past_the_deadline_matches_unscanned(
    rampart: RouterServed, backend: Running
) -> None:
    """On the ``hurried`` listener (timeout 1.5 s: the signals' deadline is 0.5 s) a
    prompt whose windowed read takes seconds is abandoned at the deadline: the rule
    matches (unscanned, ``deadline``) and the late answer counts as ``timeout``. The
    prompt is as long as the scan budget allows (30,006 content tokens, 469 windows), so
    the read outlasts the deadline on faster machines too: CI's read 18,000 tokens in
    0.9 s. Last of the Rampart tests: the abandoned read keeps the worker busy a few
    seconds more."""
    before = metric_value(
        rampart.metrics(),
        "vsr_model_runtime_unknown_answers_total",
        deployment="pii",
        reason="timeout",
    )
    long_clean = PAD * 2500 + CLEAN_END  # 30,006 tokens, under the 32,768 budget
    since = len(backend.stub.requests)
    started = time.monotonic()
    answer = rampart.ask(long_clean, port=rampart.hurried_port)  # type: ignore[attr-defined]
    seconds = time.monotonic() - started
    print(f"\nhurried: answered in {seconds:.2f} s, {dict(answer.headers)}")
    assert answer.status_code == 200, answer.text
    assert seconds < 1.4  # the signals' deadline (0.5 s), not the read
    assert answer.headers["x-vsr-selected-decision"] == "pii_guard"
    assert answer.headers["x-vsr-matched-pii"] == "contact_pii"
    assert [s.body["model"] for s in backend.stub.requests[since:]] == ["served-private"]
    after = metric_value(
        rampart.metrics(),
        "vsr_model_runtime_unknown_answers_total",
        deployment="pii",
        reason="timeout",
    )
    assert after == before + 1


# -- on_unscanned: allow, on a steerable attached worker ---------------------------------------


def steered(text: str, options: dict[str, Any]) -> dict[str, Any]:
    """The attached worker's answer: over 64 tokens (``padded``) under ``reject`` is
    ``max_length_exceeded``; read in windows, ``budget`` texts exceed the scan budget,
    ``truncated`` ones come back truncated, the rest find a phone number."""
    if options.get("overflow") != "window" and text.startswith("padded"):
        return {"error": "max_length_exceeded", "message": "over 64 tokens"}
    if "budget" in text:
        return {"error": "scan_budget_exceeded", "message": "over the scan budget"}
    read = {"tokens": 200, "processed_tokens": 200, "truncated": False, "windows": 4}
    if "truncated" in text:
        read = {**read, "processed_tokens": 64, "truncated": True, "windows": 1}
    span = {"start": 0, "end": 12, "text": "415-555-0132", "label": "PHONE", "probability": 0.95}
    return {"input": read, "spans": [span] if "phone" in text else []}


@pytest.fixture(scope="module")
def attached() -> Iterator[AttachedPii]:
    worker = AttachedPii(answer=steered)
    server = Threaded(worker.app())
    worker.port = server.port
    try:
        yield worker
    finally:
        server.stop()


def attached_router(on_error: str, backend, attached, tmp_path_factory) -> Iterator[RouterServed]:
    folder = tmp_path_factory.mktemp(f"router-unscanned-{on_error}")
    config = (
        ATTACHED_CONFIG.replace("{backend}", backend.stub.endpoint)
        .replace("{attached}", attached.endpoint)
        .replace("{on_error}", on_error)
    )
    for server in served_in(lambda: RouterServed(folder, config)):
        # The attached pool is ready once its health was polled: a plain text classifies.
        deadline = time.monotonic() + 30
        while server.preview("padded phone")["signal_errors"]:
            assert time.monotonic() < deadline, server.output()
            time.sleep(0.2)
        yield server


@pytest.fixture(scope="module")
def allowing(backend, attached, tmp_path_factory) -> Iterator[RouterServed]:
    yield from attached_router("allow", backend, attached, tmp_path_factory)


@pytest.fixture(scope="module")
def blocking(backend, attached, tmp_path_factory) -> Iterator[RouterServed]:
    yield from attached_router("block", backend, attached, tmp_path_factory)


def test_t15_the_retry_reads_windows_of_the_deployments_limit(allowing, attached) -> None:
    seen = len(attached.seen)
    preview = allowing.preview("padded phone number at the end")
    assert preview["signal_errors"] == {}
    assert preview["decision_result"]["matched_signals"] == {"pii": ["contact_pii"]}
    first, retry = attached.seen[seen:]
    assert first["options"] == {"max_tokens": 64, "overflow": "reject"}
    assert retry["options"] == {"overflow": "window", "window": {"tokens": 64}}
    assert retry["input"] == ["padded phone number at the end"] and retry["head"] == "token"


@pytest.mark.parametrize(
    ("text", "code"),
    [("padded over the budget", "scan_budget"), ("padded and truncated phone", "input_limit")],
)
def test_t15_on_unscanned_allow_hands_it_to_on_error(allowing, blocking, text, code) -> None:
    allowed = allowing.preview(text)
    assert allowed["signal_errors"] == {"pii:contact_pii": code}
    assert allowed["decision_result"]["matched_signals"] == {}  # on_error: allow
    assert allowed["selected_model"] == "general"
    blocked = blocking.preview(text)
    assert blocked["signal_errors"] == {"pii:contact_pii": code}
    assert blocked["decision_result"]["matched_signals"] == {"pii": ["contact_pii"]}
    assert blocked["decision_result"]["decision_name"] == "pii_guard"
    answer = blocking.ask(text)
    assert answer.headers["x-vsr-selected-decision"] == "pii_guard"
    assert answer.headers["x-vsr-matched-pii"] == "contact_pii"
