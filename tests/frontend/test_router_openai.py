"""Router mode end to end with the official ``openai`` client: one ``vllm-sr serve --config``
process (keyword routes, no model deployment) in front of the scripted stub backend
(ROUTER-SPEC §4 (a)).

- T3: a keyword route: the backend gets the ``provider_model_id``; the selection headers,
  and with ``x-vsr-debug: true`` the matched keywords;
- T6: no match goes to the default model without a decision header;
- T7: SSE relayed chunk by chunk (the first chunk long before the stub ends), ``[DONE]``;
  a backend hang-up mid-stream ends the stream with an SSE error event and no ``[DONE]``;
  a client that hangs up cancels the backend request;
- T8: pass-through of a provider model, the listener allow-list (403) and ``/v1/models``;
  an unknown model (400);
- T9: listener API keys (401 with ``WWW-Authenticate``; ``Api-Key``); the backend sees
  only its own credential;
- T18: ``system_prompt`` insert and replace, ``header_mutation``, ``response_cache`` exact;
- T20: the routing preview as the troubleshooting guide's ``curl | jq`` reads it;
- T22: a keyword-only configuration starts no worker and is ready at once;
- T23: the ``llm_*`` series with their labels; and no torch in the process.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest
from openai import AsyncOpenAI, OpenAI

from .conftest import free_ports
from .router_support import ServedRouter, StubServer, label_sets, metric, worker_command
from .stub_backend import Script

pytestmark = pytest.mark.slow

BACKEND_KEY = "bk-secret-0123"
LISTENER_KEY = "sk-good-4567"
AUTO = "vllm-sr/auto"

PIRATE = "You are a pirate."
BUTLER = "You are a butler."


def document(stub_endpoint: str, open_port: int, public_port: int) -> dict[str, Any]:
    """Two listeners (an open one, and a keyed one that serves only the auto model), two
    models on the stub (one by ``endpoint``, one by ``base_url``), keyword routes with
    each plugin."""

    def route(name: str, keyword: str, *plugins: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": name,
            "priority": 90,
            "rules": {"operator": "AND", "conditions": [{"type": "keyword", "name": keyword}]},
            "modelRefs": [{"model": "local-chat"}],
            "plugins": list(plugins),
        }

    return {
        "version": "v0.3",
        "listeners": [
            {"name": "open", "address": "127.0.0.1", "port": open_port, "timeout": "30s"},
            {
                "name": "public",
                "address": "127.0.0.1",
                "port": public_port,
                "api_keys": [LISTENER_KEY],
                "models": [AUTO],
            },
        ],
        "providers": {
            "defaults": {"default_model": "general-chat"},
            "models": [
                {
                    "name": "local-chat",
                    "provider_model_id": "served-model",
                    "backend_refs": [
                        {"name": "primary", "endpoint": stub_endpoint, "api_key_env": "BACKEND_KEY"}
                    ],
                },
                {
                    "name": "general-chat",
                    "backend_refs": [
                        {
                            "name": "general",
                            "base_url": f"http://{stub_endpoint}/v1",
                            "api_key_env": "BACKEND_KEY",
                        }
                    ],
                },
            ],
        },
        "routing": {
            "signals": {
                "keywords": [
                    {"name": "code", "operator": "OR", "keywords": ["debug", "function"]},
                    {"name": "pirate", "keywords": ["pirate"]},
                    {"name": "butler", "keywords": ["butler"]},
                    {"name": "mutate", "keywords": ["mutate"]},
                    {"name": "cacheable", "keywords": ["cacheable"]},
                ]
            },
            "decisions": [
                {
                    "name": "coding",
                    "priority": 100,
                    "rules": {
                        "operator": "AND",
                        "conditions": [{"type": "keyword", "name": "code"}],
                    },
                    "modelRefs": [{"model": "local-chat"}],
                },
                route(
                    "pirate-talk",
                    "pirate",
                    {"type": "system_prompt", "configuration": {"system_prompt": PIRATE}},
                ),
                route(
                    "butler-talk",
                    "butler",
                    {
                        "type": "system_prompt",
                        "configuration": {"system_prompt": BUTLER, "mode": "replace"},
                    },
                ),
                route(
                    "mutated",
                    "mutate",
                    {
                        "type": "header_mutation",
                        "configuration": {
                            "add": [{"name": "X-Tenant-Tier", "value": "premium"}],
                            "update": [{"name": "X-Route-Source", "value": "semantic-router"}],
                            "delete": ["X-Debug-Trace"],
                        },
                    },
                ),
                route(
                    "cached",
                    "cacheable",
                    {"type": "response_cache", "configuration": {"mode": "exact"}},
                ),
            ],
        },
    }


class Router:
    """The running router, its stub backend and clients on both listeners."""

    def __init__(self, served: ServedRouter, stub: StubServer, ports: list[int]) -> None:
        self.served = served
        self.stub = stub.stub
        self.open_url = f"http://127.0.0.1:{ports[0]}"
        self.public_url = f"http://127.0.0.1:{ports[1]}"
        self.open = OpenAI(
            base_url=f"{self.open_url}/v1", api_key="not-checked", max_retries=0, timeout=30
        )
        self.public = self.client(LISTENER_KEY)

    def client(self, key: str) -> OpenAI:
        return OpenAI(base_url=f"{self.public_url}/v1", api_key=key, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    folder = tmp_path_factory.mktemp("router-openai")
    scripts = Path(tempfile.mkdtemp(prefix="vsrr-", dir="/tmp"))
    stub = StubServer()
    ports = free_ports(2)
    served = ServedRouter(
        folder,
        document(stub.stub.endpoint, *ports),
        {
            "BACKEND_KEY": BACKEND_KEY,
            # Were a worker started, it would be this one (and it would log its requests).
            "VLLM_SRUN_COMMAND": " ".join(worker_command(scripts)),
            "VLLM_SRUN_DIR": str(scripts),
        },
    )
    try:
        served.wait_ready()
        served.ready_after = time.monotonic() - served.started  # type: ignore[attr-defined]
        served.scripts = scripts  # type: ignore[attr-defined]
        yield Router(served, stub, ports)
    finally:
        served.close()
        stub.stop()
        shutil.rmtree(scripts, ignore_errors=True)


@pytest.fixture(autouse=True)
def fresh_stub(router: Router) -> None:
    router.stub.reset()


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def vsr_headers(headers: httpx.Headers) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items() if k.lower().startswith("x-vsr-")}


def sse_events(raw: bytes) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order."""
    return [line[len("data: ") :] for line in raw.decode().split("\n") if line.startswith("data: ")]


# -- T22: nothing to start -------------------------------------------------------------------------


def test_a_keyword_only_configuration_starts_no_worker_and_is_ready_at_once(
    router: Router,
) -> None:
    served = router.served
    lines = served.out.read_text().splitlines()
    # No wait at all: the first progress line (after its time) is the last one.
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} "
        + re.escape("Router-managed model deployments are ready (0). Starting router services..."),
        lines[0],
    )
    assert not any("Waiting for" in line for line in lines)
    assert "deployments in use none (managed: none)" in served.err.read_text()
    assert psutil.Process(served.process.pid).children(recursive=True) == []
    assert list(served.scripts.iterdir()) == []  # type: ignore[attr-defined]
    inventory = served.get("/api/v1/inventory/model-runtime")
    assert inventory is not None and inventory.json()["deployments"] == []
    assert served.ready_after < 30  # type: ignore[attr-defined]


def test_the_router_process_never_loads_torch(router: Router) -> None:
    router.open.chat.completions.create(model=AUTO, messages=user("debug this function"))
    maps = Path(f"/proc/{router.served.process.pid}/maps")
    if not maps.exists():
        pytest.skip("no /proc here")
    mapped = maps.read_text()
    assert "libtorch" not in mapped and "/torch/" not in mapped


# -- T3: a keyword route ---------------------------------------------------------------------------


def test_a_keyword_route_rewrites_the_model_and_says_what_it_chose(router: Router) -> None:
    raw = router.open.chat.completions.with_raw_response.create(
        model=AUTO, messages=user("Please debug this function for me")
    )
    completion = raw.parse()
    assert raw.status_code == 200
    assert completion.choices[0].message.content == "answered by served-model"
    assert completion.model == "served-model"  # the backend's body, left as it wrote it
    [seen] = router.stub.requests
    assert seen.path == "/v1/chat/completions"
    assert seen.body["model"] == "served-model"
    assert seen.body["messages"] == user("Please debug this function for me")
    headers = vsr_headers(raw.headers)
    latency = headers.pop("x-vsr-routing-latency-ms")
    assert re.fullmatch(r"\d+\.\d{3}", latency), latency
    assert headers == {
        "x-vsr-schema-version": "2",
        "x-vsr-response-path": "upstream",
        "x-vsr-selected-recipe": "default",
        "x-vsr-selected-decision": "coding",
        "x-vsr-selected-algorithm": "static",
        "x-vsr-selected-model": "local-chat",
    }


def test_debug_adds_the_matched_keywords(router: Router) -> None:
    raw = router.open.chat.completions.with_raw_response.create(
        model=AUTO,
        messages=user("debug this function"),
        extra_headers={"x-vsr-debug": "True"},
    )
    assert raw.headers["x-vsr-matched-keywords"] == "code"
    assert raw.headers["x-vsr-selected-decision"] == "coding"
    assert raw.headers["x-vsr-selected-reasoning"] == "off"
    # The debug header is the client's own: it reaches the backend unchanged.
    [seen] = router.stub.requests
    assert seen.header("x-vsr-debug") == "True"


def test_every_auto_name_routes(router: Router) -> None:
    for name in ("auto", "MoM"):
        raw = router.open.chat.completions.with_raw_response.create(
            model=name, messages=user("debug it")
        )
        assert raw.headers["x-vsr-selected-decision"] == "coding"
    assert [s.body["model"] for s in router.stub.requests] == ["served-model"] * 2


# -- T6: the default model -------------------------------------------------------------------------


def test_no_match_goes_to_the_default_model_without_a_decision(router: Router) -> None:
    raw = router.open.chat.completions.with_raw_response.create(
        model=AUTO,
        messages=user("What is the capital of France?"),
        extra_headers={"x-vsr-debug": "true"},
    )
    assert raw.status_code == 200
    assert raw.parse().choices[0].message.content == "answered by general-chat"
    [seen] = router.stub.requests
    assert seen.path == "/v1/chat/completions"  # base_url + chat_path
    assert seen.body["model"] == "general-chat"  # no provider_model_id: the name
    assert raw.headers["x-vsr-selected-model"] == "general-chat"
    assert "x-vsr-selected-decision" not in raw.headers
    assert "x-vsr-selected-confidence" not in raw.headers
    assert not [h for h in raw.headers if h.lower().startswith("x-vsr-matched-")]


# -- T7: streaming ---------------------------------------------------------------------------------


def test_a_stream_is_relayed_chunk_by_chunk(router: Router) -> None:
    pause = 0.3
    router.stub.script = Script(chunk_pause=pause)
    started = time.monotonic()
    raw = router.open.chat.completions.with_raw_response.create(
        model=AUTO, messages=user("debug this function"), stream=True
    )
    # The headers come before the first chunk, with the selection in them.
    assert raw.status_code == 200
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.headers["x-vsr-selected-decision"] == "coding"
    assert raw.headers["x-vsr-selected-model"] == "local-chat"
    arrivals: list[tuple[float, str]] = []
    for line in raw.http_response.iter_lines():
        if line.startswith("data: "):
            arrivals.append((time.monotonic() - started, line[len("data: ") :]))
    events = [data for _, data in arrivals]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == (
        "Hello from the stub"
    )
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    # The stub pauses 0.3 s after each of its 4 pieces: relayed as written, the first
    # chunk is read about 1.2 s before [DONE] (a buffered relay would read them together).
    first, done = arrivals[0][0], arrivals[-1][0]
    assert done - first >= 2 * pause, arrivals
    assert router.stub.finished.is_set()


def test_the_openai_client_reads_the_stream(router: Router) -> None:
    stream = router.open.chat.completions.create(
        model=AUTO, messages=user("debug this function"), stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello from the stub"
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert router.stub.requests[0].body["stream"] is True


def test_a_backend_hang_up_mid_stream_ends_with_an_error_event_and_no_done(
    router: Router,
) -> None:
    router.stub.script = Script(hang_up="mid_stream")
    stream = router.open.chat.completions.create(
        model=AUTO, messages=user("debug this function"), stream=True
    )
    received = []
    with pytest.raises(openai.APIError) as raised:
        for chunk in stream:
            received.append(chunk.choices[0].delta.content)
    assert received == ["Hello", " from"]  # what the stub sent before it hung up
    assert raised.value.message == "the backend closed the stream before it ended"
    # The same on the wire: the chunks, one error event, no [DONE], no made-up finish.
    body = httpx.post(
        f"{router.open_url}/v1/chat/completions",
        json={"model": AUTO, "stream": True, "messages": user("debug this function")},
        timeout=30,
    )
    assert body.status_code == 200
    events = sse_events(body.content)
    assert "[DONE]" not in events
    assert json.loads(events[-1]) == {
        "error": {
            "message": "the backend closed the stream before it ended",
            "type": "upstream_error",
            "code": "upstream_error",
            "param": None,
        }
    }
    assert [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]] == [None, None]


def test_a_client_that_hangs_up_cancels_the_backend_request(router: Router) -> None:
    router.stub.script = Script(chunk_pause=0.5, chunks=tuple(f"w{i} " for i in range(40)))
    stream = router.open.chat.completions.create(
        model=AUTO, messages=user("debug this function"), stream=True
    )
    first = next(iter(stream))
    assert first.choices[0].delta.content == "w0 "
    stream.close()
    # The stub was 20 s from its end: its stream is cut off long before.
    assert router.stub.cancelled.wait(10), "the backend request was not cancelled"
    assert not router.stub.finished.is_set()


def test_async_clients_stream_and_complete_at_once(router: Router) -> None:
    async def scenario() -> tuple[list[str], list[str]]:
        async with AsyncOpenAI(
            base_url=f"{router.open_url}/v1", api_key="x", max_retries=0, timeout=30
        ) as client:

            async def streamed(index: int) -> str:
                stream = await client.chat.completions.create(
                    model=AUTO, messages=user(f"debug function {index}"), stream=True
                )
                return "".join([c.choices[0].delta.content or "" async for c in stream])

            async def whole(index: int) -> str:
                raw = await client.chat.completions.with_raw_response.create(
                    model=AUTO, messages=user(f"hello {index}")
                )
                assert "x-vsr-selected-decision" not in raw.headers
                return raw.parse().choices[0].message.content or ""

            streams = await asyncio.gather(*(streamed(i) for i in range(4)))
            wholes = await asyncio.gather(*(whole(i) for i in range(4)))
            return list(streams), list(wholes)

    streams, wholes = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert streams == ["Hello from the stub"] * 4
    assert wholes == ["answered by general-chat"] * 4


# -- T8: pass-through and the allow-list -----------------------------------------------------------


def test_a_provider_model_passes_through_undecided(router: Router) -> None:
    raw = router.open.chat.completions.with_raw_response.create(
        model="local-chat",
        messages=user("debug this function"),  # would match a route: nothing is evaluated
        extra_headers={"x-vsr-debug": "true"},
    )
    assert raw.status_code == 200
    [seen] = router.stub.requests
    assert seen.body["model"] == "served-model"
    assert vsr_headers(raw.headers) == {
        "x-vsr-schema-version": "2",
        "x-vsr-response-path": "upstream",
        "x-vsr-selected-model": "local-chat",
    }


def test_the_allow_list_refuses_other_models(router: Router) -> None:
    with pytest.raises(openai.PermissionDeniedError) as raised:
        router.public.chat.completions.create(model="local-chat", messages=user("hi"))
    response = raised.value.response
    assert response.status_code == 403
    assert response.json() == {
        "error": {
            "type": "invalid_request_error",
            "code": "model_not_allowed",
            "message": "this listener does not serve the requested model; its models are "
            "vllm-sr/auto. To serve another here, add it to listeners[].models in config.yaml",
            "param": "model",
        }
    }
    assert response.headers["x-vsr-response-path"] == "error"
    assert router.stub.requests == []
    # The allow-list's name the client most likely meant.
    with pytest.raises(openai.PermissionDeniedError) as raised:
        router.public.chat.completions.create(model="auto", messages=user("hi"))
    assert raised.value.body == {
        "type": "invalid_request_error",
        "code": "model_not_allowed",
        "message": "this listener does not serve the requested model (did you mean "
        "vllm-sr/auto?); its models are vllm-sr/auto. To serve another here, add it to "
        "listeners[].models in config.yaml",
        "param": "model",
    }
    # The auto model is served there.
    answer = router.public.chat.completions.create(model=AUTO, messages=user("debug it"))
    assert answer.choices[0].message.content == "answered by served-model"


def test_the_models_list_follows_the_allow_list(router: Router) -> None:
    assert [m.id for m in router.public.models.list()] == [AUTO]
    listed = router.open.models.list()
    assert [m.id for m in listed] == [AUTO, "auto", "MoM"]
    entry = listed.data[0].model_dump()
    assert entry["owned_by"] == "vllm-semantic-router"
    assert entry["routing"] == {
        "resolution": "virtual",
        "selectable": True,
        "default_route": True,
        "recipe": "default",
    }


def test_an_unknown_model_is_not_found(router: Router) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        router.open.chat.completions.create(model="gpt-nope", messages=user("hi"))
    assert raised.value.response.json() == {
        "error": {
            "type": "invalid_request_error",
            "code": "model_not_found",
            "message": "the requested model is not served",
            "param": "model",
        }
    }
    assert router.stub.requests == []


def test_a_lone_surrogate_is_a_bad_request_and_never_breaks_the_metrics(router: Router) -> None:
    url = f"{router.open_url}/v1/chat/completions"
    raw = b'{"model": "%s", "messages": [{"role": "user", "content": "hi \\ud800"}]}'
    for model in (AUTO.encode(), b"local-chat"):
        answer = httpx.post(url, content=raw % model, timeout=30)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["type"] == "invalid_request_error"
        assert "lone surrogate" in answer.json()["error"]["message"]
    paired = b'{"model": "local-chat", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}'
    assert httpx.post(url, content=paired, timeout=30).status_code == 200
    named = b'{"model": "x\\udc00", "messages": [{"role": "user", "content": "hi"}]}'
    assert httpx.post(url, content=named, timeout=30).status_code == 400
    assert httpx.get(router.served.metrics_url, timeout=10).status_code == 200


# -- T9: keys --------------------------------------------------------------------------------------


UNAUTHORIZED = {
    "message": "Unauthorized: missing or invalid API key",
    "type": "authentication_error",
    "code": "invalid_api_key",
}


def test_a_bad_key_is_refused_with_www_authenticate(router: Router) -> None:
    for call in (
        lambda c: c.chat.completions.create(model=AUTO, messages=user("debug it")),
        lambda c: c.models.list(),
    ):
        with pytest.raises(openai.AuthenticationError) as raised:
            call(router.client("sk-wrong"))
        response = raised.value.response
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == 'Bearer realm="vllm-semantic-router"'
        # §2.1's body, in §2.9's envelope (which adds "param": null).
        assert response.json() == {"error": {**UNAUTHORIZED, "param": None}}
    missing = httpx.post(
        f"{router.public_url}/v1/chat/completions",
        json={"model": AUTO, "messages": user("debug it")},
        timeout=10,
    )
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == 'Bearer realm="vllm-semantic-router"'
    assert router.stub.requests == []


def test_the_api_key_header_and_a_lowercase_bearer_work(router: Router) -> None:
    for headers in ({"Api-Key": LISTENER_KEY}, {"Authorization": f"bearer {LISTENER_KEY}"}):
        answer = httpx.post(
            f"{router.public_url}/v1/chat/completions",
            json={"model": AUTO, "messages": user("debug it")},
            headers=headers,
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
    assert len(router.stub.requests) == 2


def test_the_backend_sees_only_its_own_credential(router: Router) -> None:
    secrets = {
        "Cookie": "session=cookie-secret",
        "x-goog-api-key": "goog-secret",
        "X-Api-Key": "x-api-secret",
        "Proxy-Authorization": "Basic cHJveHktc2VjcmV0",
        "X-Auth-Token": "token-secret",
        "Api-Key": LISTENER_KEY,
        "x-authz-user": "mallory",
        "x-envoy-upstream-rq-timeout-ms": "1",
    }
    raw = router.public.chat.completions.with_raw_response.create(
        model=AUTO,
        messages=user("debug this function"),
        extra_headers={**secrets, "X-Custom": "kept"},
    )
    assert raw.status_code == 200
    [seen] = router.stub.requests
    names = [name.lower() for name, _ in seen.headers]
    assert seen.header("authorization") == f"Bearer {BACKEND_KEY}"
    assert names.count("authorization") == 1
    for name in secrets:
        assert name.lower() not in names, name
    values = " ".join(value for _, value in seen.headers)
    for secret in (LISTENER_KEY, "cookie-secret", "goog-secret", "x-api-secret", "token-secret"):
        assert secret not in values
    assert seen.header("x-custom") == "kept"
    assert seen.header("x-forwarded-proto") == "http"
    # One content type (the openai client sends its own; a second one makes aiohttp-based
    # servers answer 400), and no compression the router would relay to a client that
    # never asked for it.
    assert names.count("content-type") == 1 and seen.header("content-type") == "application/json"
    assert names.count("accept-encoding") == 1 and seen.header("accept-encoding") == "identity"
    assert uuid.UUID(seen.header("x-request-id") or "")  # added: the client sent none
    # A client's own request id is kept as it is.
    router.public.chat.completions.create(
        model=AUTO, messages=user("debug it"), extra_headers={"x-request-id": "req-42"}
    )
    again = router.stub.requests[-1]
    assert [v for n, v in again.headers if n.lower() == "x-request-id"] == ["req-42"]


# -- T18: plugins ----------------------------------------------------------------------------------


def test_system_prompt_insert_goes_before_the_existing_one(router: Router) -> None:
    raw = router.open.chat.completions.with_raw_response.create(
        model=AUTO,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "talk like a pirate"},
        ],
        extra_headers={"x-vsr-debug": "true"},
    )
    assert raw.headers["x-vsr-selected-decision"] == "pirate-talk"
    assert raw.headers["x-vsr-injected-system-prompt"] == "true"
    router.open.chat.completions.create(model=AUTO, messages=user("a pirate song"))
    first, second = router.stub.requests
    assert first.body["messages"] == [
        {"role": "system", "content": f"{PIRATE}\n\nBe brief."},
        {"role": "user", "content": "talk like a pirate"},
    ]
    assert second.body["messages"] == [
        {"role": "system", "content": PIRATE},
        {"role": "user", "content": "a pirate song"},
    ]


def test_system_prompt_replace_overwrites_the_first_system_message(router: Router) -> None:
    router.open.chat.completions.create(
        model=AUTO,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "act as a butler"},
            {"role": "system", "content": "A later system message."},
        ],
    )
    [seen] = router.stub.requests
    assert seen.body["messages"] == [
        {"role": "system", "content": BUTLER},
        {"role": "user", "content": "act as a butler"},
        {"role": "system", "content": "A later system message."},
    ]


def test_header_mutation_changes_the_backend_request(router: Router) -> None:
    raw = router.open.chat.completions.with_raw_response.create(
        model=AUTO,
        messages=user("mutate my headers"),
        extra_headers={"X-Debug-Trace": "1", "X-Route-Source": "client", "X-Other": "same"},
    )
    assert raw.headers["x-vsr-selected-decision"] == "mutated"
    [seen] = router.stub.requests
    names = [name.lower() for name, _ in seen.headers]
    assert "x-debug-trace" not in names
    assert seen.header("x-tenant-tier") == "premium"
    assert [v for n, v in seen.headers if n.lower() == "x-route-source"] == ["semantic-router"]
    assert seen.header("x-other") == "same"
    assert seen.header("authorization") == f"Bearer {BACKEND_KEY}"


def test_an_exact_cache_hit_skips_the_backend(router: Router) -> None:
    question = user("a cacheable question")
    first = router.open.chat.completions.with_raw_response.create(
        model=AUTO, messages=question, temperature=0.2
    )
    assert first.headers["x-vsr-response-path"] == "upstream"
    assert "x-vsr-cache-hit" not in first.headers
    assert len(router.stub.requests) == 1
    second = router.open.chat.completions.with_raw_response.create(
        model=AUTO, messages=question, temperature=0.2, extra_headers={"x-vsr-debug": "true"}
    )
    assert second.status_code == 200
    assert len(router.stub.requests) == 1  # answered from the cache
    assert vsr_headers(second.headers) == {
        "x-vsr-schema-version": "2",
        "x-vsr-response-path": "cache",
        "x-vsr-cache-hit": "true",
    }
    assert second.http_response.content == first.http_response.content
    # Another generation parameter is another request; so is a streamed one.
    router.open.chat.completions.create(model=AUTO, messages=question, temperature=0.7)
    assert len(router.stub.requests) == 2
    list(router.open.chat.completions.create(model=AUTO, messages=question, stream=True))
    assert len(router.stub.requests) == 3


# -- T20: the preview ------------------------------------------------------------------------------


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="needs curl and jq")
def test_the_troubleshooting_preview_command_works(router: Router) -> None:
    url = f"localhost:{8080 + router.served.offset}/api/v1/routing/preview"
    jq = (
        "jq '{decision: .decision_result.decision_name, "
        "matched: .decision_result.matched_signals, signal_errors}'"
    )
    # The troubleshooting guide's command, and the short form without a content type.
    commands = [
        f"curl -s '{url}?trace=true' -H 'content-type: application/json' "
        f"""-d '{{"model": "vllm-sr/auto", "text": "please debug this function"}}' | {jq}""",
        f"""curl -s -X POST {url}?trace=true -d '{{"text": "please debug this function"}}' """
        f"| {jq}",
    ]
    for command in commands:
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", command],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {
            "decision": "coding",
            "matched": {"keywords": ["code"]},
            "signal_errors": {},
        }
    assert router.stub.requests == []  # a preview never calls a backend


def test_the_preview_body_has_every_key_the_guide_reads(router: Router) -> None:
    answer = httpx.post(
        f"{router.served.mgmt_url}/api/v1/routing/preview?trace=true",
        json={"model": AUTO, "text": "a cacheable question"},
        timeout=10,
    )
    assert answer.status_code == 200
    body = answer.json()
    assert body["decision_result"]["decision_name"] == "cached"
    assert body["decision_result"]["matched_signals"] == {"keywords": ["cacheable"]}
    assert body["decision_result"]["plugins"] == ["response_cache"]
    assert body["signal_errors"] == {}
    assert body["selected_model"] == "local-chat"
    assert body["selection_status"] == "selected"
    assert body["original_text"] == "a cacheable question"
    assert body["requested_model"] == AUTO
    names = [entry["decision_name"] for entry in body["eval_trace"]]
    assert names == ["coding", "pirate-talk", "butler-talk", "mutated", "cached"]
    # Without trace, no eval_trace; nothing matched: the default model.
    plain = httpx.post(
        f"{router.served.mgmt_url}/api/v1/routing/preview", json={"text": "hello"}, timeout=10
    ).json()
    assert "eval_trace" not in plain
    assert plain["decision_result"]["decision_name"] is None
    assert (plain["selected_model"], plain["selection_status"]) == ("general-chat", "fallback")
    assert router.stub.requests == []


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"text": "hello", "temperature": 1}, 400, "INVALID_INPUT"),
        ({"text": "hello", "options": {"verbose": True}}, 400, "INVALID_INPUT"),
        ({"text": "   "}, 400, "INVALID_INPUT"),
        ("not json", 400, "INVALID_INPUT"),
        ({"text": "hello", "model": "gpt-nope"}, 400, "INVALID_ROUTING_MODEL"),
        ({"text": 5}, 400, "INVALID_INPUT"),
        ('{"text": "hello \\ud800"}', 400, "INVALID_INPUT"),
    ],
)
def test_preview_errors(router: Router, body: Any, status: int, code: str) -> None:
    content = body if isinstance(body, str) else json.dumps(body)
    answer = httpx.post(
        f"{router.served.mgmt_url}/api/v1/routing/preview", content=content, timeout=10
    )
    assert answer.status_code == status
    error = answer.json()["error"]
    assert set(error) == {"code", "message", "timestamp"}
    assert error["code"] == code
    assert "hello" not in error["message"]


# -- T23: the routing series -----------------------------------------------------------------------


SERIES = {
    "llm_model_requests_total": {"model"},
    "llm_request_errors_total": {"model", "reason"},
    "llm_model_routing_latency_seconds_count": set(),
    "llm_signal_extraction_total": {"signal_type", "signal_name"},
    "llm_signal_extraction_latency_seconds_count": {"signal_type"},
    "llm_signal_match_total": {"signal_type", "signal_name"},
    "llm_decision_evaluation_total": set(),
    "llm_decision_evaluation_latency_seconds_count": set(),
    "llm_decision_match_total": {"decision_name"},
    "llm_decision_confidence_count": {"decision_name"},
    "llm_plugin_execution_total": {"plugin_type", "decision_name", "status"},
    "llm_cache_plugin_hits_total": {"decision_name", "plugin_type"},
    "llm_cache_plugin_misses_total": {"decision_name", "plugin_type"},
    "llm_model_completion_latency_seconds_count": {"model"},
    "llm_model_ttft_seconds_count": {"model"},
    "llm_model_prompt_tokens_total": {"model"},
    "llm_model_completion_tokens_total": {"model"},
}


def test_the_routing_series_exist_with_their_labels(router: Router) -> None:
    before = router.served.metrics()
    client = router.open
    client.chat.completions.create(model=AUTO, messages=user("debug this function"))
    list(client.chat.completions.create(model=AUTO, messages=user("debug it"), stream=True))
    question = user("a cacheable metric question")
    client.chat.completions.create(model=AUTO, messages=question)
    client.chat.completions.create(model=AUTO, messages=question)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="gpt-nope", messages=user("hi"))
    text = router.served.metrics()
    for name, labels in SERIES.items():
        found = label_sets(text, name)
        assert found, f"{name} is missing"
        assert any(set(have) == labels for have in found), (name, found)

    def grew(name: str, by: float, **labels: str) -> None:
        assert metric(text, name, **labels) - metric(before, name, **labels) == by, (
            name,
            labels,
        )

    grew("llm_model_requests_total", 3, model="local-chat")  # the cache hit is not sent
    grew("llm_request_errors_total", 1, model="gpt-nope", reason="model_not_found")
    grew("llm_decision_evaluation_total", 4)
    grew("llm_decision_match_total", 2, decision_name="coding")
    grew("llm_decision_match_total", 2, decision_name="cached")
    grew("llm_signal_match_total", 2, signal_type="keyword", signal_name="code")
    grew("llm_cache_plugin_misses_total", 1, decision_name="cached", plugin_type="response_cache")
    grew("llm_cache_plugin_hits_total", 1, decision_name="cached", plugin_type="response_cache")
    grew(
        "llm_plugin_execution_total",
        1,
        plugin_type="response_cache",
        decision_name="cached",
        status="hit",
    )
    grew("llm_model_prompt_tokens_total", 7 * 2, model="local-chat")  # the JSON answers' usage
    grew("llm_model_completion_tokens_total", 3 * 2, model="local-chat")
    grew("llm_model_ttft_seconds_count", 1, model="local-chat")


def test_the_chat_fast_path_answers_a_handler_failure_500_and_passes_other_routes_on() -> None:
    """A Chat handler that raises is answered in OpenAI's envelope (never a dropped
    connection); any other request reaches the listener's FastAPI app."""
    from starlette.requests import Request

    from vllm_sr.api.native import Listener
    from vllm_sr.api.published import Grant
    from vllm_sr.router.cache import ResponseCache
    from vllm_sr.router.chat import ListenerChat
    from vllm_sr.router.forward import Backends

    async def broken(request: Request) -> Any:
        raise RuntimeError("a bug")

    async def exchange() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        chat = ListenerChat("l", (), None, lambda: None, Backends(), ResponseCache(0))
        chat.completions = broken  # type: ignore[method-assign]
        listener = Listener(Grant("l"), {}, chat=chat)
        transport = httpx.ASGITransport(app=listener.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://listener") as client:
            answers = (
                await client.post("/v1/chat/completions", json={"model": "auto"}),
                await client.get("/v1/chat/completions"),
                await client.post("/v1/embeddings", json={}),
            )
        assert listener.inflight == 0 and listener.published.admitted == 0
        return answers

    failed, other_method, other_path = asyncio.run(exchange())
    assert failed.status_code == 500
    assert failed.json() == {
        "error": {
            "type": "server_error",
            "code": "internal_error",
            "message": "the router failed; retry",
            "param": None,
        }
    }
    assert failed.headers["x-vsr-response-path"] == "error"
    assert other_method.status_code == 405  # FastAPI's route table: POST only
    assert other_path.json()["error"]["code"] == "runtime_not_published"
