"""Router mode before the first request: what ``vllm-sr config validate`` refuses in a
v0.3 document (T1), which deployments ``vllm-sr serve --config`` starts and waits for
(T22), and that the Router-mode path never imports torch or transformers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml
from openai import OpenAI

from vllm_sr import cli

from .conftest import free_ports
from .router_support import VLLM_SR, ServedRouter, StubServer, wait_for, worker_command

pytestmark = pytest.mark.slow

# -- T1: a v0.3 document as upstream writes it ----------------------------------------------------

MIRROR = """
version: v0.3
listeners:
  - name: http-8899
    address: 0.0.0.0
    port: 8899
    timeout: 300s
    api_keys: []
providers:
  defaults:
    default_model: qwen3-8b
    reasoning_effort: medium
  models:
    - name: qwen3-8b
      reasoning:
        family: qwen3
      provider_model_id: qwen3-8b-instruct
      api_format: openai
      reliability:
        lb_policy: least_request
        retry_count: 2
      pricing: {currency: USD, prompt_per_1m: 0.18, completion_per_1m: 0.42}
      external_model_ids: {openai: qwen3-8b}
      backend_refs:
        - name: local-primary
          endpoint: 127.0.0.1:8000
          protocol: http
          weight: 80
          provider: vllm
          api_key_env: VLLM_SR_PRIMARY_API_KEY
    - name: remote-openai-reference
      provider_model_id: remote-openai-reference
      api_format: openai
      backend_refs:
        - name: remote-primary
          base_url: https://api.example.com/v1
          provider: openai
          auth_header: Authorization
          auth_prefix: Bearer
          extra_headers: {X-Tenant: reference-config}
          api_version: "2025-03-01"
          chat_path: /chat/completions
          api_key: static-demo-key
          weight: 100
    - name: qwen3-32b
      provider_model_id: qwen3-32b-instruct
      api_format: anthropic
      backend_refs:
        - {name: large-primary, provider: anthropic-compatible, endpoint: 127.0.0.1:8001}
evaluation:
  records:
    - {model: qwen3-8b, benchmark: vllm-sr/operator-rating@1.0.0, metrics: {score: 0.83}}
routing:
  strategy: priority
  model_bindings:
    classifier.content-risk: {deployment: content-risk, contract: label_scores.v1}
  modelCards:
    - {name: qwen3-8b, param_size: 8B}
  projections:
    partitions: []
  signals:
    keywords:
      - name: code_keywords
        operator: OR
        method: bm25
        keywords: ["code", "function", "debug"]
        case_sensitive: false
        bm25_threshold: 0.1
      - name: urgent_keywords
        operator: OR
        keywords: ["urgent", "asap"]
    domains:
      - name: business
        description: Business and management related queries.
        mmlu_categories: [business]
    safety:
      - {name: unsafe-content, labels: [safe, unsafe], threshold: 0.5}
    fact_check:
      - name: needs_fact_check
    reasks:
      - {name: likely_dissatisfied, threshold: 0.8, lookback_turns: 1}
    complexity:
      - {name: needs_reasoning, threshold: 0.1}
  decisions:
    - name: computer-science-remom-route
      priority: 170
      tier: 2
      output_contract_spec: {type: reference_selection}
      rules:
        operator: AND
        conditions:
          - {type: domain, name: business}
      modelRefs:
        - {model: qwen3-32b, use_reasoning: true, reasoning_effort: high, lora_name: cs-expert}
      algorithm:
        type: remom
      plugins:
        - type: memory
          configuration: {enabled: true, retrieval_limit: 6}
    - name: urgent-route
      priority: 145
      rules:
        operator: AND
        conditions:
          - {type: keyword, name: urgent_keywords}
      modelRefs:
        - {model: qwen3-8b}
      plugins:
        - type: response_cache
          configuration: {enabled: true, mode: exact, scope: tenant}
global:
  services:
    replay: {enabled: true}
"""

MIRROR_REFUSED = [
    "routing.projections",
    "routing.signals.safety",
    "routing.signals.fact_check",
    "routing.signals.reasks",
    "routing.signals.complexity",
    "routing.decisions[0].tier",
    "routing.decisions[0].output_contract_spec",
    "routing.decisions[0].modelRefs[0].lora_name",
    "routing.decisions[1].plugins[0].configuration.scope",
    "providers.models[0].reliability",
    "providers.models[0].backend_refs[0].provider",
    "providers.models[1].backend_refs[0].provider",
    "providers.models[1].backend_refs[0].api_version",
    "providers.models[2].api_format",
    "providers.models[2].backend_refs[0].provider",
    "providers.defaults.reasoning_effort",
    "providers.models[0].reasoning",
    "routing.signals.keywords[0].method",
    "routing.signals.keywords[0].bm25_threshold",
    "routing.decisions[0].algorithm.type",
    "routing.decisions[0].plugins[0].type",
    "routing.model_bindings",
    "evaluation",
    "global.services.replay",
]
"""Every key of :data:`MIRROR` outside the core, by its path."""


def test_a_v03_document_has_each_unsupported_key_listed_by_path(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(MIRROR)
    done = subprocess.run(
        [*VLLM_SR, "config", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    header, *problems = done.stderr.splitlines()
    assert header == f"vllm-sr: {path}: {len(MIRROR_REFUSED)} problems:"
    paths = [line.strip().split(": ", 1)[0] for line in problems]
    assert sorted(paths) == sorted(MIRROR_REFUSED)  # each once, none left out
    by_path = dict(line.strip().split(": ", 1) for line in problems)
    assert by_path["routing.signals.reasks"] == (
        "reasks signals are not supported by this vllm-sr; Router mode supports keywords, "
        "embeddings, domains, jailbreak, pii, context, decision, language"
    )
    assert by_path["providers.models[2].api_format"] == (
        "api_format anthropic is not supported by this vllm-sr; Router mode supports openai"
    )
    assert "not supported by this vllm-sr" in by_path["routing.decisions[0].algorithm.type"]
    assert "not supported by this vllm-sr" in by_path["routing.decisions[0].plugins[0].type"]


def small_document(**defaults: str) -> dict[str, Any]:
    return {
        "version": "v0.3",
        "providers": {
            "defaults": defaults,
            "models": [{"name": "local-chat", "backend_refs": [{"endpoint": "127.0.0.1:8000"}]}],
        },
    }


@pytest.mark.parametrize(
    ("defaults", "problem"),
    [
        ({"default_model": "local-chat"}, None),
        ({"model": "local-chat"}, None),
        (
            {"default_model": "local-chat", "model": "local-chat"},
            "providers.defaults: give providers.defaults.default_model (the v0.3 spelling) or "
            "providers.defaults.model, not both",
        ),
        (
            {"model": "gpt-nope"},
            'providers: providers.defaults.model "gpt-nope" does not reference '
            "providers.models[].name",
        ),
        (
            {"default_model": "gpt-nope"},
            'providers: providers.defaults.default_model "gpt-nope" does not reference '
            "providers.models[].name",
        ),
    ],
)
def test_the_default_model_takes_either_spelling_not_both(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    defaults: dict[str, str],
    problem: str | None,
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(small_document(**defaults)))
    code = cli.main(["config", "validate", str(path)])
    captured = capsys.readouterr()
    if problem is None:
        assert code == 0, captured.err
        assert captured.out.startswith(f"{path}: valid: ")
    else:
        assert code == 1
        assert captured.err == f"vllm-sr: {path}: {problem}\n"


# -- T22: the deployments a configuration needs ----------------------------------------------------


@pytest.fixture
def scripts() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="vsrr-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def domains_document(stub_endpoint: str, port: int) -> dict[str, Any]:
    """An unbound ``domains`` signal: its built-in question goes to the default decision
    deployment, which nothing declares (``serve`` adds ``primary``)."""
    return {
        "version": "v0.3",
        "listeners": [{"name": "chat", "address": "127.0.0.1", "port": port}],
        "providers": {
            "defaults": {"default_model": "chat"},
            "models": [{"name": "chat", "backend_refs": [{"endpoint": stub_endpoint}]}],
        },
        "routing": {
            "signals": {
                "domains": [
                    {"name": "math", "description": "Mathematics", "mmlu_categories": ["algebra"]},
                    {"name": "other", "description": "Anything else"},
                ],
                # Declared, referenced by no decision: nothing starts for it.
                "jailbreak": [{"name": "unused_guard"}],
            },
            "decisions": [
                {
                    "name": "math-route",
                    "rules": {
                        "operator": "AND",
                        "conditions": [{"type": "domain", "name": "math"}],
                    },
                    "modelRefs": [{"model": "chat"}],
                }
            ],
        },
    }


def test_an_unbound_domain_signal_starts_primary_and_waits_for_it(
    tmp_path: Path, scripts: Path
) -> None:
    (scripts / "primary.json").write_text(json.dumps({"health": "loading"}))
    stub = StubServer()
    [port] = free_ports(1)
    served = ServedRouter(
        tmp_path,
        domains_document(stub.stub.endpoint, port),
        {"VLLM_SRUN_COMMAND": " ".join(worker_command(scripts)), "VLLM_SRUN_DIR": str(scripts)},
    )
    listener = f"http://127.0.0.1:{port}"
    try:

        def worker() -> list[psutil.Process]:
            found = []
            for child in psutil.Process(served.process.pid).children():
                try:
                    command = child.cmdline()
                except psutil.NoSuchProcess:  # exited while it was listed
                    continue
                if "router_worker.py" in " ".join(command) and "serve" in command:
                    found.append(child)
            return found

        [started] = wait_for(worker, 30, "the primary worker")
        assert "primary" in " ".join(started.cmdline())
        # Loading: not ready, and Chat is not open yet.
        wait_for(lambda: served.get("/health"), 30, "the management API")
        assert served.ready_status() == 503
        startup = served.get("/startup-status")
        assert startup is not None and startup.json()["ready"] is False
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{listener}/v1/models", timeout=2)
        assert served.ready_status() == 503
        (scripts / "primary.json").write_text(json.dumps({"decisions": {"choice": "math"}}))
        served.wait_ready(30)
        [entry] = served.get("/api/v1/inventory/model-runtime").json()["deployments"]  # type: ignore[union-attr]
        assert (entry["name"], entry["state"]) == ("primary", "ready")
        assert len(worker()) == 1  # the unreferenced guard started nothing more

        chat = OpenAI(base_url=f"{listener}/v1", api_key="none", max_retries=0, timeout=30)
        raw = chat.chat.completions.with_raw_response.create(
            model="vllm-sr/auto",
            messages=[{"role": "user", "content": "integrate x^2 from 0 to 1"}],
            extra_headers={"x-vsr-debug": "true"},
        )
        assert raw.headers["x-vsr-selected-decision"] == "math-route"
        assert raw.headers["x-vsr-matched-domains"] == "math"
        assert raw.headers["x-vsr-selected-category"] == "math"
        assert raw.headers["x-vsr-selected-confidence"] == "0.9000"
        log = [json.loads(line) for line in (scripts / "primary.log").read_text().splitlines()]
        [asked] = [c["body"] for c in log if c["path"] == "/v1/decisions"]
        assert asked["state"] == "integrate x^2 from 0 to 1"
        assert asked["questions"] == {
            "domain": {
                "type": "choice",
                "instructions": "Which domain does this request belong to?",
                "choices": [
                    {"key": "math", "description": "Mathematics"},
                    {"key": "other", "description": "Anything else"},
                ],
            }
        }
    finally:
        served.close()
        stub.stop()


# -- no torch on the Router-mode path --------------------------------------------------------------


IMPORT_CHECK = textwrap.dedent(
    """
    import asyncio, json, sys
    import vllm_sr.cli, vllm_sr.frontend
    import vllm_sr.router.chat, vllm_sr.router.cache, vllm_sr.router.compose
    import vllm_sr.router.decisions, vllm_sr.router.forward, vllm_sr.router.metrics
    import vllm_sr.router.preview, vllm_sr.router.route, vllm_sr.router.selection
    import vllm_sr.router.signals.evaluate
    from vllm_sr.config.schema import parse_config
    from vllm_sr.router.compose import compose
    config = parse_config(json.loads(sys.argv[1]))
    router = compose(config, {}, {}, lambda deployment, reason: None)
    routed = asyncio.run(router.route([{"role": "user", "content": "debug this function"}]))
    assert routed.decision.name == "coding", routed
    loaded = sorted(m for m in ("torch", "transformers") if m in sys.modules)
    print(json.dumps(loaded))
    """
)


def test_router_mode_imports_neither_torch_nor_transformers() -> None:
    document = {
        "providers": {"models": [{"name": "chat", "backend_refs": [{"endpoint": "127.0.0.1:1"}]}]},
        "routing": {
            "signals": {"keywords": [{"name": "code", "keywords": ["debug"]}]},
            "decisions": [
                {
                    "name": "coding",
                    "rules": {"conditions": [{"type": "keyword", "name": "code"}]},
                    "modelRefs": [{"model": "chat"}],
                }
            ],
        },
    }
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_CHECK, json.dumps(document)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
