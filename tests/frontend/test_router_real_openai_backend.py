"""Router mode against a real OpenAI-compatible server (ROUTER-SPEC §4 (b), T7).

A random-weight one-layer Llama (WordLevel tokenizer, a chat template) is built locally
and served by ``HF_HUB_OFFLINE=1 transformers serve --force_model DIR``; a keywords-only
``vllm-sr serve --config`` (Router mode: no worker starts) routes to it, and the official
``openai`` client talks to the router with ``max_tokens`` 8.

What transformers 4.57's ``serve`` does (``commands/serving.py``): every
``/v1/chat/completions`` answer is ``text/event-stream`` (``chat.completion.chunk``
events), with ``stream`` true or not, and no ``data: [DONE]`` at the end. So the
non-streaming request gets no JSON ``chat.completion`` from it: the test checks the
router relays the backend's answer as it is (status, content type, events), which is
what the spec asks of it, and reads a JSON answer only if the server gives one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

from .router_real_support import RouterServed, TransformersServe, build_tiny_lm, served_in

pytestmark = pytest.mark.slow

KEY = "router-key"
MAX_TOKENS = 8

CONFIG = """
listeners:
  - {name: public, address: 127.0.0.1, port: {chat_port}, api_keys: [router-key]}
providers:
  defaults: {default_model: tiny}
  models:
    - name: tiny
      provider_model_id: tiny-llama
      backend_refs: [{endpoint: "{backend}"}]
routing:
  signals:
    keywords:
      - {name: greeting, keywords: [hello]}
  decisions:
    - name: greet
      rules: {operator: OR, conditions: [{type: keyword, name: greeting}]}
      modelRefs: [{model: tiny}]
"""

MESSAGES = [{"role": "user", "content": "hello how are you"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TransformersServe, Path]]:
    folder = tmp_path_factory.mktemp("tiny-lm")
    model = folder / "model"
    # transformers serve loads the forced model on the first request: it starts (tens of
    # seconds of imports on 2 cores) while the model is built.
    server = TransformersServe(model, folder)
    try:
        build_tiny_lm(model)
        seconds = server.wait_ready()
        print(f"\ntransformers serve ready {seconds:.1f} s after the model was built")
        yield server, model
    finally:
        server.close()


@pytest.fixture(scope="module")
def router(served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterServed]:
    backend, _ = served
    folder = tmp_path_factory.mktemp("router-openai-backend")
    config = CONFIG.replace("{backend}", backend.endpoint)
    server_iter = served_in(lambda: RouterServed(folder, config))
    for server in server_iter:
        assert server.workers() == []  # keywords only: no model worker
        yield server


def client(router: RouterServed) -> OpenAI:
    return OpenAI(
        base_url=f"http://127.0.0.1:{router.chat_port}/v1", api_key=KEY, timeout=60, max_retries=0
    )


def events(body: str) -> list[dict]:
    return [
        json.loads(line[len("data: ") :])
        for line in body.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


def test_t7_a_non_streaming_answer_is_relayed_as_the_server_gave_it(router, served):
    backend, model = served
    direct = httpx.post(
        f"http://{backend.endpoint}/v1/chat/completions",
        json={"model": "tiny-llama", "messages": MESSAGES, "max_tokens": MAX_TOKENS},
        timeout=60,
    )
    assert direct.status_code == 200, direct.text
    raw = client(router).chat.completions.with_raw_response.create(
        model="vllm-sr/auto",
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        extra_headers={"x-vsr-debug": "true"},
    )
    headers = raw.headers
    print(f"\nbackend content type {direct.headers['content-type']!r}; via the router {headers}")
    assert raw.http_response.status_code == 200
    assert headers["x-vsr-selected-decision"] == "greet"
    assert headers["x-vsr-selected-model"] == "tiny"
    assert headers["x-vsr-matched-keywords"] == "greeting"
    assert headers["x-vsr-response-path"] == "upstream"
    assert headers["content-type"] == direct.headers["content-type"]
    if direct.headers["content-type"].startswith("application/json"):
        completion = raw.parse()
        assert completion.object == "chat.completion"
        assert completion.choices[0].message.role == "assistant"
        assert completion.usage.completion_tokens <= MAX_TOKENS
        return
    # transformers 4.57: an event stream even without "stream": the router relays it.
    assert direct.headers["content-type"].startswith("text/event-stream")
    relayed = events(raw.http_response.text)
    assert relayed and all(e["object"] == "chat.completion.chunk" for e in relayed)
    assert relayed[0]["choices"][0]["delta"]["role"] == "assistant"
    assert relayed[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert relayed[0]["model"] == f"{model}@main"  # --force_model wins over tiny-llama
    pieces = [e["choices"][0]["delta"].get("content") for e in relayed[1:-1]]
    assert 1 <= len(pieces) <= MAX_TOKENS and all(isinstance(p, str) for p in pieces)
    assert "data: [DONE]" not in raw.http_response.text  # none from the server, none made up
    # The openai client hands back the text of a 200 that is not JSON.
    assert isinstance(raw.parse(), str)


def test_t7_a_stream_through_the_router_with_the_openai_client(router, served):
    _, model = served
    raw = client(router).chat.completions.with_raw_response.create(
        model="vllm-sr/auto",
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        stream=True,
        extra_headers={"x-vsr-debug": "true"},
    )
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.headers["x-vsr-selected-decision"] == "greet"
    assert raw.headers["x-vsr-selected-model"] == "tiny"
    assert raw.headers["x-vsr-matched-keywords"] == "greeting"
    chunks = list(raw.parse())
    print(f"\n{len(chunks)} chunks: {[c.choices[0].delta.content for c in chunks]}")
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert all(c.model == f"{model}@main" for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    content = [c.choices[0].delta.content for c in chunks[1:-1]]
    assert 1 <= len(content) <= MAX_TOKENS and all(isinstance(p, str) and p for p in content)


def test_t7_a_pass_through_stream_and_a_bad_key(router, served):
    """``model: tiny`` passes through undecided (only ``x-vsr-selected-model``); a wrong
    listener key is 401 before anything reaches the server."""
    stream = client(router).chat.completions.with_raw_response.create(
        model="tiny", messages=MESSAGES, max_tokens=MAX_TOKENS, stream=True
    )
    assert stream.headers["x-vsr-selected-model"] == "tiny"
    assert "x-vsr-selected-decision" not in stream.headers
    assert len(list(stream.parse())) >= 2
    bad = OpenAI(base_url=f"http://127.0.0.1:{router.chat_port}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as raised:
        bad.chat.completions.create(model="vllm-sr/auto", messages=MESSAGES, max_tokens=4)
    assert raised.value.response.json()["error"]["code"] == "invalid_api_key"
