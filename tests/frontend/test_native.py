"""A listener's native API (§1.9) over pools of fake workers: grants, api keys, every
error code and shape, model names both ways (bundles included), no worker text, the
shutdown hook."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response

from vllm_sr.api import published
from vllm_sr.api.native import Listener
from vllm_sr.api.published import Grant
from vllm_sr.pool.pool import MAX_INFLIGHT, ReplicaPool

from .pool_support import Clock, close_all, fake_workers, run

QUESTION = {"state": "x", "questions": {"q": {"type": "noul", "instructions": "?"}}}
SYSTEMONE_PATHS = ("/v1/systemone", "/v1/decisions", "/v1/systemone/batch")
RUNTIME_PATHS = ("/v1/embeddings", "/v1/classify", "/v1/rerank", "/v1/bundle")


@contextlib.asynccontextmanager
async def served(
    grant: Grant, names: tuple[str, ...] = ("a",), **options
) -> AsyncIterator[tuple[httpx.AsyncClient, list, dict[str, ReplicaPool], Listener]]:
    """A listener whose pools ``pub-<name>`` (or ``public[name]``) each have one fake
    worker ``<name>``."""
    clock = options.pop("clock", Clock())
    public = options.pop("public", {})
    async with fake_workers(*names) as fakes:
        pools = {}
        for fake in fakes:
            worker = fake.worker(deployment=f"dep-{fake.name}")
            name = public.get(fake.name, f"pub-{fake.name}")
            pools[name] = ReplicaPool(
                f"dep-{fake.name}",
                [worker],
                public_name=name,
                cache_entries=0,
                clock=clock,
            )
        listener = Listener(grant, pools, **options)
        transport = httpx.ASGITransport(app=listener.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://listener") as client:
            yield client, fakes, pools, listener
        await close_all(*(w for p in pools.values() for w in p.workers))


def is_error(
    response: httpx.Response,
    status: int,
    code: str,
    kind: str = "systemone_error",
    error_type: str | None = None,
    *,
    message: str | None = None,
    param: str | None = None,
):
    """The listener's error: ``error`` only, or (``error_type``) Jev's ``detail`` too;
    its message ``message``, else the worded one of :data:`WORDED`, else the code in
    words; its ``param`` ``param``, else the one of :data:`PARAMS`, else ``None``."""
    assert response.status_code == status, response.text
    message = message or WORDED.get(code) or code.replace("_", " ")
    param = param or PARAMS.get(code)
    expected: dict = {"error": {"code": code, "type": kind, "message": message, "param": param}}
    if error_type is not None:
        expected["detail"] = {"error_type": error_type, "message": message}
    assert response.json() == expected
    assert response.headers["content-type"] == "application/json"
    assert response.headers["cache-control"] == "no-store"
    return True


GRANT = Grant("http", systemone=("pub-a",), runtime=("pub-a",))
AUTH = "authentication_error"

WORDED = {
    "systemone_not_published": (
        "this listener publishes no System One models: add systemone: {models: [<public id>]} "
        "to it in the configuration (listeners[].systemone.models; vllm-sr serve --config "
        "FILE, or vllm-sr config apply) to serve /v1/systemone, "
        "/v1/decisions and /v1/systemone/batch"
    ),
    "runtime_not_published": (
        "this listener publishes no runtime models: add runtime: {models: [<public id>]} "
        "to it in the configuration (listeners[].runtime.models; vllm-sr serve --config "
        "FILE, or vllm-sr config apply) to serve /v1/embeddings, "
        "/v1/classify, /v1/rerank and /v1/bundle"
    ),
}
"""The refusals that always say the same fix."""

PARAMS = {"model_required": "model", "model_not_allowed": "model", "model_not_found": "model"}
"""The refusals whose ``param`` (OpenAI's: the field at fault) is always the same."""

NO_MODELS = (
    "this listener publishes no models: add runtime: {models: [<public id>]} or "
    "systemone: {models: [<public id>]} to it in the configuration "
    "(listeners[].runtime.models, listeners[].systemone.models; vllm-sr serve "
    "--config FILE, or vllm-sr config apply)"
)


def not_allowed(names: str, grant: str = "systemone", near: str = "") -> str:
    """A ``model_not_allowed`` message: the grant's models, the one meant (``near``)."""
    what = "System One" if grant == "systemone" else grant
    guess = f" (did you mean {near}?)" if near else ""
    return (
        f"model not published on this listener's {what} routes{guess}; its models are "
        f"{names}. To publish another, add its public id to listeners[].{grant}.models "
        "in the configuration (vllm-sr serve --config FILE, or vllm-sr config apply)"
    )


def test_the_models_list_names_granted_ids_that_resolve():
    async def scenario():
        grant = Grant("http", systemone=("pub-a", "pub-none"))
        async with served(grant) as (client, *_):
            response = await client.get("/v1/systemone/models")
            assert response.status_code == 200
            assert response.json() == {
                "object": "list",
                "data": [{"id": "pub-a", "object": "model", "api": "systemone", "routing": False}],
            }
            assert response.headers["cache-control"] == "no-store"

    run(scenario())


def test_a_runtime_grant_lists_its_cards_under_the_public_ids():
    async def scenario():
        grant = Grant("http", runtime=("pub-b", "pub-a", "pub-none"))
        async with served(grant, ("a", "b")) as (client, _, pools, _listener):
            pools["pub-b"].workers[0].update("loading", "weights")
            response = await client.get("/v1/models")
            assert response.status_code == 200
            assert response.headers["cache-control"] == "no-store"
            listed = response.json()
            assert listed["object"] == "list"
            assert listed["data"][0] == {"id": "pub-b", "object": "model", "ready": False}
            served_card = pools["pub-a"].workers[0].card
            assert listed["data"][1] == {**served_card, "id": "pub-a", "ready": True}
            assert len(listed["data"]) == 2
            assert b", " not in response.content and b": " not in response.content
            refused = await client.get("/v1/systemone/models")
            assert is_error(refused, 404, "systemone_not_published")
            assert b'{"error":{"code":' in refused.content

    run(scenario())


def test_a_listener_without_a_grant_publishes_nothing():
    async def scenario():
        async with served(Grant("http")) as (client, fakes, *_):
            assert is_error(
                await client.get("/v1/systemone/models"), 404, "systemone_not_published"
            )
            assert is_error(
                await client.get("/v1/models"),
                404,
                "runtime_not_published",
                "runtime_error",
                message=NO_MODELS,
            )
            for path in SYSTEMONE_PATHS:
                response = await client.post(path, json={"model": "pub-a", **QUESTION})
                assert is_error(response, 404, "systemone_not_published")
            for path in RUNTIME_PATHS:
                response = await client.post(path, json={"model": "pub-a", "input": "x"})
                assert is_error(response, 404, "runtime_not_published", "runtime_error")
            assert fakes[0].received == []

    run(scenario())


def test_grants_never_cross_between_surfaces_or_listeners():
    async def scenario():
        grant = Grant("one", systemone=("pub-a",), runtime=("pub-b",))
        async with served(grant, ("a", "b")) as (client, _, pools, _):
            ok = await client.post("/v1/systemone", json={"model": "pub-a", **QUESTION})
            assert ok.status_code == 200
            refused = await client.post("/v1/systemone", json={"model": "pub-b", **QUESTION})
            # The listener's own grant for that route, nothing of another.
            assert is_error(
                refused, 403, "model_not_allowed", message=not_allowed("pub-a, jev-latest")
            )
            refused = await client.post("/v1/embeddings", json={"model": "pub-a", "input": "x"})
            message = not_allowed("pub-b", "runtime")
            assert is_error(refused, 403, "model_not_allowed", "runtime_error", message=message)
            ok = await client.post("/v1/embeddings", json={"model": "pub-b", "input": "x"})
            assert ok.status_code == 200
            # Another listener over the same pools publishes only its own grant.
            other = Listener(Grant("two", systemone=("pub-b",)), pools)
            transport = httpx.ASGITransport(app=other.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://l") as two:
                refused = await two.post("/v1/systemone", json={"model": "pub-a", **QUESTION})
                message = not_allowed("pub-b, jev-latest")
                assert is_error(refused, 403, "model_not_allowed", message=message)
                listed = (await two.get("/v1/systemone/models")).json()["data"]
                assert [m["id"] for m in listed] == ["pub-b"]

    run(scenario())


@pytest.mark.parametrize(
    ("headers", "allowed"),
    [
        ({"Authorization": "Bearer key-2"}, True),
        ({"authorization": "bearer key-1"}, True),
        ({"Api-Key": "key-2"}, True),
        ({"Authorization": "Bearer wrong", "Api-Key": "key-1"}, True),
        ({}, False),
        ({"Authorization": "Bearer key-3"}, False),
        ({"Authorization": "Basic key-1"}, False),
        ({"Authorization": "key-1"}, False),
        ({"Api-Key": "key-1x"}, False),
        ({"Authorization": "Bearer "}, False),
    ],
)
def test_api_keys_by_bearer_or_api_key(headers, allowed):
    async def scenario():
        grant = Grant("http", api_keys=("key-1", "key-2"), systemone=("pub-a",))
        async with served(grant) as (client, fakes, *_):
            for method, path in (("GET", "/v1/systemone/models"), ("POST", "/v1/systemone")):
                body = {"model": "pub-a", **QUESTION} if method == "POST" else None
                response = await client.request(method, path, json=body, headers=headers)
                if allowed:
                    assert response.status_code == 200, response.text
                else:
                    # Jev's detail beside the error, on every listener.
                    assert is_error(response, 401, "invalid_api_key", error_type=AUTH)
                    realm = 'Bearer realm="vllm-semantic-router"'
                    assert response.headers["www-authenticate"] == realm
            assert len(fakes[0].received) == (1 if allowed else 0)

    run(scenario())


def test_every_presented_key_meets_every_listener_key_in_constant_time(monkeypatch):
    calls = []

    def compare(a, b):
        calls.append((a, b))
        return a == b

    monkeypatch.setattr(published.hmac, "compare_digest", compare)

    async def scenario():
        grant = Grant("http", api_keys=("k1", "k2", "k3"), systemone=("pub-a",))
        async with served(grant) as (client, *_):
            headers = {"Authorization": "Bearer k1"}
            assert (await client.get("/v1/systemone/models", headers=headers)).status_code == 200
            # No early exit on the first match: all three keys were compared.
            assert calls == [(b"k1", b"k1"), (b"k1", b"k2"), (b"k1", b"k3")]
            calls.clear()
            headers = {"Authorization": "Bearer x", "Api-Key": "k3"}
            assert (await client.get("/v1/systemone/models", headers=headers)).status_code == 200
            assert len(calls) == 6

    run(scenario())


def test_request_errors_have_their_codes_and_shape():
    async def scenario():
        grant = Grant("http", systemone=("pub-a", "pub-none"), runtime=("pub-a",))
        async with served(grant) as (client, fakes, *_):

            def post(body, path="/v1/systemone", **kw):
                content = body if isinstance(body, bytes) else json.dumps(body).encode()
                return client.post(path, content=content, **kw)

            assert is_error(await post(b"{not json"), 400, "invalid_request")
            assert is_error(await post(b"\xff\xfe"), 400, "invalid_request")
            assert is_error(await post([1, 2]), 400, "invalid_request")
            nested = b'{"model":"pub-a","state":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
            assert is_error(await post(nested), 400, "invalid_request")
            assert is_error(await post(QUESTION), 400, "model_required")
            assert is_error(await post({"model": "  ", **QUESTION}), 400, "model_required")
            assert is_error(await post({"model": 3, **QUESTION}), 400, "model_required")
            routed = {"model": "pub-a", "routing": True, **QUESTION}
            assert is_error(await post(routed), 400, "systemone_routing_not_supported")
            other = await post({"model": "other", **QUESTION})
            message = not_allowed("pub-a, jev-latest")
            assert is_error(other, 403, "model_not_allowed", message=message)
            assert is_error(await post({"model": "pub-none", **QUESTION}), 404, "model_not_found")
            assert is_error(await client.get("/v1/systemone"), 405, "method_not_allowed")
            assert is_error(await client.post("/v1/systemone/models"), 405, "method_not_allowed")
            get = await client.get("/v1/embeddings")
            assert is_error(get, 405, "method_not_allowed", "runtime_error")
            assert is_error(await client.get("/v1/elsewhere"), 404, "not_found")
            runtime = await post({"input": "x"}, "/v1/embeddings")
            assert is_error(runtime, 400, "model_required", "runtime_error")
            assert fakes[0].received == []

    run(scenario())


def test_a_body_over_the_listener_limit_is_refused():
    async def scenario():
        async with served(GRANT, max_request_bytes=100) as (client, fakes, *_):
            big = {"model": "pub-a", "state": "x" * 200, "questions": {}}
            assert is_error(await client.post("/v1/systemone", json=big), 413, "request_too_large")

            async def chunks():
                yield b'{"model":"pub-a","state":"'
                yield b"x" * 200
                yield b'"}'

            streamed = await client.post("/v1/systemone", content=chunks())
            assert is_error(streamed, 413, "request_too_large")
            assert fakes[0].received == []

    run(scenario())


@pytest.mark.parametrize("mode", ["500", "400", "429"])
def test_a_worker_error_keeps_its_status_never_its_text(mode):
    """Never its text, but a runtime route's ``invalid_request``: the worker's word on
    what is wrong with the client's own request."""

    async def scenario():
        clock = Clock()
        async with served(GRANT, clock=clock) as (client, fakes, *_):
            fakes[0].mode = mode
            response = await client.post("/v1/systemone", json={"model": "pub-a", **QUESTION})
            assert is_error(response, int(mode), "systemone_request_failed")
            assert "SECRET" not in response.text and "sock" not in response.text
            if mode == "429":
                assert response.headers["retry-after"] == "2"
            clock.advance(1)  # past a 500's back-off
            runtime = await client.post("/v1/embeddings", json={"model": "pub-a", "input": "x"})
            if mode == "400":
                message = "SECRET /srv/sock trace"
                assert is_error(runtime, 400, "invalid_request", "runtime_error", message=message)
            else:
                assert is_error(runtime, int(mode), "internal_error", "runtime_error")
                assert "SECRET" not in runtime.text

    run(scenario())


def test_a_worker_answer_that_is_not_json_is_invalid_runtime_response():
    async def scenario():
        async with served(GRANT) as (client, fakes, *_):
            fakes[0].mode = "garbage"
            response = await client.post("/v1/decisions", json={"model": "pub-a", **QUESTION})
            assert is_error(response, 502, "invalid_runtime_response")
            assert "html" not in response.text

    run(scenario())


def test_overloaded_and_unavailable_say_when_to_retry():
    async def scenario():
        async with served(GRANT) as (client, fakes, pools, _):
            fakes[0].mode = "hang"
            body = {"model": "pub-a", **QUESTION}
            held = [asyncio.create_task(client.post("/v1/systemone", json=body)) for _ in range(32)]
            await fakes[0].wait_received(MAX_INFLIGHT)
            response = await client.post("/v1/systemone", json=body)
            assert is_error(response, 429, "overloaded")
            assert response.headers["retry-after"] == "1"
            runtime = await client.post("/v1/embeddings", json={"model": "pub-a", "input": "x"})
            assert is_error(runtime, 429, "overloaded", "runtime_error")
            fakes[0].gate.set()
            assert {r.status_code for r in await asyncio.gather(*held)} == {200}
            pools["pub-a"].workers[0].update("loading", "reading weights")
            response = await client.post("/v1/systemone", json=body)
            assert is_error(response, 503, "systemone_unavailable")
            assert response.headers["retry-after"] == "1"
            runtime = await client.post("/v1/embeddings", json={"model": "pub-a", "input": "x"})
            assert is_error(runtime, 503, "runtime_unavailable", "runtime_error")

    run(scenario())


def test_model_names_are_rewritten_both_ways_and_the_rest_stays_raw():
    async def scenario():
        async with served(GRANT) as (client, fakes, *_):
            text = '{ "state" : {"b": 1, "a": 2, "a": 3},\n "model":"pub-a", "n": 1e5 }'
            for path in SYSTEMONE_PATHS:
                response = await client.post(path, content=text.encode())
                assert response.status_code == 200, response.text
                assert response.json()["model"] == "pub-a"
                assert response.headers["cache-control"] == "no-store"
                sent_path, sent = fakes[0].received[-1]
                assert sent_path == path
                # Only the selector changed: key order, the repeated key, 1e5 and the
                # spacing reach the worker as the client wrote them.
                assert sent.decode() == text.replace('"pub-a"', '"served-a"')
            states = {"model": "pub-a", "states": [{"state": "y"}], **QUESTION}
            answer = (await client.post("/v1/decisions", json=states)).json()
            assert answer["states"] == [{"index": 0, "model": "pub-a"}]

    run(scenario())


def test_a_bundle_goes_per_pool_and_answers_in_task_order():
    async def scenario():
        grant = Grant("http", runtime=("pub-a", "pub-b", "pub-c"), systemone=("pub-a",))
        async with served(grant, ("a", "b")) as (client, fakes, pools, _):
            a, b = fakes
            pools["pub-a"].workers[0].limits = {"max_bundle_tasks": 2}
            tasks = [
                {"id": "1", "decisions": {"model": "pub-a", **QUESTION}},
                {"id": "2", "embeddings": {"model": "pub-b", "input": "x"}},
                {"id": "3", "classify": {"model": "pub-x", "input": ["x"]}},
                {"id": "4", "classify": {"model": "pub-a", "input": ["x"]}},
                {"id": "5", "rerank": {"query": "q", "documents": ["d"]}},
                {"id": "6", "systemone_batch": {"model": "pub-a", "states": ["s"]}},
                {"id": "7", "embeddings": {"model": "pub-c", "input": "x"}},
            ]
            body = {"tasks": tasks, "options": {"deadline_ms": 500}}
            response = await client.post("/v1/bundle", json=body)
            assert response.status_code == 200, response.text
            results = response.json()["results"]
            assert [r["id"] for r in results] == [str(i) for i in range(1, 8)]
            assert [r["status"] for r in results] == [200, 200, 403, 200, 400, 200, 404]
            assert results[0]["decisions"] == {"model": "pub-a", "worker": "a"}
            assert results[1]["embeddings"] == {"model": "pub-b", "worker": "b"}
            assert results[3]["classify"] == {"model": "pub-a", "worker": "a"}
            assert results[5]["systemone_batch"] == {"model": "pub-a", "worker": "a"}
            assert results[2]["error"]["code"] == "model_not_allowed"
            assert results[4]["error"]["code"] == "model_required"
            assert results[6]["error"]["code"] == "model_not_found"
            # a's three tasks went in two bundles (its cap is 2), b's in one; each task
            # under the worker's own name, the bundle options with every part.
            sent_a = [json.loads(body) for _, body in a.received]
            assert [[t["id"] for t in s["tasks"]] for s in sent_a] == [["1", "4"], ["6"]]
            assert {
                s["tasks"][0][next(iter(set(s["tasks"][0]) - {"id"}))]["model"] for s in sent_a
            } == {"served-a"}
            assert all(s["options"] == {"deadline_ms": 500} for s in sent_a)
            [sent_b] = [json.loads(body) for _, body in b.received]
            assert sent_b["tasks"] == [
                {"id": "2", "embeddings": {"model": "served-b", "input": "x"}}
            ]

    run(scenario())


def test_a_bundle_part_that_fails_fails_only_its_tasks():
    async def scenario():
        grant = Grant("http", runtime=("pub-a", "pub-b"))
        async with served(grant, ("a", "b")) as (client, fakes, pools, _):
            fakes[0].mode = "500"
            pools["pub-b"].workers[0].update("loading", "")
            tasks = [
                {"id": "x", "embeddings": {"model": "pub-a", "input": "x"}},
                {"id": "y", "embeddings": {"model": "pub-b", "input": "x"}},
            ]
            results = (await client.post("/v1/bundle", json={"tasks": tasks})).json()["results"]
            assert [(r["id"], r["status"], r["error"]["code"]) for r in results] == [
                ("x", 500, "internal_error"),
                ("y", 503, "runtime_unavailable"),
            ]
            assert "SECRET" not in json.dumps(results)
            bad = await client.post("/v1/bundle", json={"tasks": []})
            assert is_error(bad, 400, "invalid_request", "runtime_error")
            two = {"id": "z", "embeddings": {"model": "pub-a"}, "rerank": {"model": "pub-a"}}
            bad = await client.post("/v1/bundle", json={"tasks": [two]})
            assert is_error(bad, 400, "invalid_request", "runtime_error")

    run(scenario())


def test_stop_answers_new_requests_503_and_lets_the_others_finish():
    async def scenario():
        async with served(GRANT) as (client, fakes, _, listener):
            fakes[0].mode = "hang"
            body = {"model": "pub-a", **QUESTION}
            held = asyncio.create_task(client.post("/v1/systemone", json=body))
            await fakes[0].wait_received(1)
            assert listener.inflight == 1
            listener.stop()
            refused = await client.post("/v1/systemone", json=body)
            assert is_error(refused, 503, "systemone_unavailable")
            refused = await client.post("/v1/embeddings", json={"model": "pub-a", "input": "x"})
            assert is_error(refused, 503, "runtime_unavailable", "runtime_error")
            drained = asyncio.create_task(listener.drained())
            await asyncio.sleep(0)
            assert not drained.done()
            fakes[0].gate.set()
            assert (await held).status_code == 200
            await asyncio.wait_for(drained, 5)
            assert listener.inflight == 0

    run(scenario())


# -- refusals that say the fix, and leave an access line ---------------------------------------
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def test_a_model_outside_the_grant_is_told_the_grants_models_and_the_one_it_meant():
    """The runtime takes ``all-MiniLM-L6-v2`` for ``sentence-transformers/all-MiniLM-L6-v2``;
    the listener names the granted id instead of a bare 403, and lists the models of this
    listener's grant for that route only, after the key check."""

    async def scenario():
        grant = Grant(
            "http",
            api_keys=("key-1",),
            systemone=("pub-s",),
            runtime=(MINILM, "pub-b", "pub-none"),
        )
        names = ("a", "b", "s", "c")  # pub-c: a deployment no grant of this listener names
        async with served(grant, names, public={"a": MINILM}) as (client, fakes, *_):
            keyed = {"Authorization": "Bearer key-1"}
            short = {"model": "all-MiniLM-L6-v2", "input": "x"}
            anonymous = await client.post("/v1/embeddings", json=short)
            assert is_error(anonymous, 401, "invalid_api_key", "runtime_error", error_type=AUTH)
            refused = await client.post("/v1/embeddings", json=short, headers=keyed)
            assert is_error(
                refused,
                403,
                "model_not_allowed",
                "runtime_error",
                message="model not published on this listener's runtime routes (did you mean "
                "sentence-transformers/all-MiniLM-L6-v2?); its models are "
                "sentence-transformers/all-MiniLM-L6-v2, pub-b. To publish another, add its "
                "public id to listeners[].runtime.models in the configuration (vllm-sr serve "
                "--config FILE, or vllm-sr config apply)",
            )
            far = await client.post(
                "/v1/classify", json={"model": "gpt-4o", "input": ["x"]}, headers=keyed
            )
            assert is_error(
                far,
                403,
                "model_not_allowed",
                "runtime_error",
                message="model not published on this listener's runtime routes; its models are "
                "sentence-transformers/all-MiniLM-L6-v2, pub-b. To publish another, add its "
                "public id to listeners[].runtime.models in the configuration (vllm-sr serve "
                "--config FILE, or vllm-sr config apply)",
            )
            upper = await client.post(
                "/v1/systemone", json={"model": "PUB-S", **QUESTION}, headers=keyed
            )
            assert is_error(
                upper,
                403,
                "model_not_allowed",
                message="model not published on this listener's System One routes (did you mean "
                "pub-s?); its models are pub-s, jev-latest. To publish another, add its public "
                "id to listeners[].systemone.models in the configuration (vllm-sr serve "
                "--config FILE, or vllm-sr config apply)",
            )
            for text in (anonymous.text, refused.text, far.text, upper.text):
                assert "pub-c" not in text and "key-1" not in text and "served-" not in text
            assert all(f.received == [] for f in fakes)

    run(scenario())


def test_a_route_no_grant_publishes_names_the_grant_that_would():
    """Embeddings on a System One listener: 404 naming ``listeners[].runtime.models``."""

    async def scenario():
        async with served(Grant("http", systemone=("pub-a",))) as (client, fakes, *_):
            response = await client.post("/v1/embeddings", json={"model": "pub-a", "input": "x"})
            assert response.status_code == 404
            assert response.headers["content-type"] == "application/json"
            assert response.headers["cache-control"] == "no-store"
            assert response.json() == {
                "error": {
                    "code": "runtime_not_published",
                    "type": "runtime_error",
                    "message": "this listener publishes no runtime models: add runtime: "
                    "{models: [<public id>]} to it in the configuration "
                    "(listeners[].runtime.models; vllm-sr serve --config FILE, or vllm-sr "
                    "config apply) to serve /v1/embeddings, /v1/classify, /v1/rerank and "
                    "/v1/bundle",
                    "param": None,
                }
            }
            assert fakes[0].received == []

    run(scenario())


def test_a_workers_explanation_of_the_clients_request_reaches_the_client():
    """Classify on a model that only embeds: the runtime's 422 ``unsupported_surface``
    message passes on (alone and in a bundle); any other worker text stays behind."""
    cannot = {
        "error": {
            "code": "unsupported_surface",
            "message": "this model serves embeddings, not classify",
        }
    }

    async def scenario():
        async with served(Grant("http", runtime=("pub-a",))) as (client, fakes, *_):
            fakes[0].mode = "422"
            fakes[0].rejection = cannot
            response = await client.post("/v1/classify", json={"model": "pub-a", "input": ["x"]})
            message = "this model serves embeddings, not classify"
            assert is_error(response, 422, "unsupported_surface", "runtime_error", message=message)
            fakes[0].rejection = {"error": {"code": "unsupported_surface", "message": "m" * 3000}}
            long = await client.post("/v1/classify", json={"model": "pub-a", "input": ["x"]})
            assert is_error(long, 422, "unsupported_surface", "runtime_error", message="m" * 2000)
            for hidden in (
                {"error": {"code": "unsupported_surface", "message": 5}},
                {"error": {"code": "not_ready", "message": "SECRET /srv/models failed"}},
                {"error": {"code": "nonsense", "message": "SECRET"}},
            ):
                fakes[0].rejection = hidden
                answer = await client.post("/v1/classify", json={"model": "pub-a", "input": ["x"]})
                assert answer.status_code == 422
                error = answer.json()["error"]
                assert error["message"] == error["code"].replace("_", " ")
            fakes[0].mode = "ok"

            def bundle_answer(path: str, body: bytes) -> bytes:
                results = [{"id": "c", "status": 422, **cannot}]
                results.append(
                    {"id": "d", "status": 503, "error": {"code": "not_ready", "message": "SECRET"}}
                )
                return json.dumps({"results": results}).encode()

            fakes[0].answer = bundle_answer  # type: ignore[method-assign]
            tasks = [
                {"id": "c", "classify": {"model": "pub-a", "input": ["x"]}},
                {"id": "d", "embeddings": {"model": "pub-a", "input": "x"}},
            ]
            results = (await client.post("/v1/bundle", json={"tasks": tasks})).json()["results"]
            assert results == [
                {
                    "id": "c",
                    "status": 422,
                    "error": {
                        "code": "unsupported_surface",
                        "type": "runtime_error",
                        "message": message,
                        "param": None,
                    },
                },
                {
                    "id": "d",
                    "status": 503,
                    "error": {
                        "code": "not_ready",
                        "type": "runtime_error",
                        "message": "not ready",
                        "param": None,
                    },
                },
            ]

    run(scenario())


def test_every_refusal_of_the_listener_writes_an_access_line(caplog):
    """One ``vllm_sr.access`` line per refusal the listener answers itself, as a worker
    writes one per request it answers; a worker's answer (a success or its own error)
    leaves the worker's line only."""

    async def scenario():
        grant = Grant("http-8899", api_keys=("key-1",), systemone=("pub-a",))
        keyed = {"Authorization": "Bearer key-1"}
        async with served(grant) as (client, fakes, _, listener):
            await client.post("/v1/embeddings", json={"model": "pub-a", "input": "x"})
            await client.post("/v1/systemone", json={"model": "pub-a", **QUESTION})
            await client.post("/v1/systemone", json={"model": "other", **QUESTION}, headers=keyed)
            await client.get("/v1/elsewhere%0aforged")
            await client.get("/v1/systemone")
            ok = await client.post(
                "/v1/systemone", json={"model": "pub-a", **QUESTION}, headers=keyed
            )
            assert ok.status_code == 200
            fakes[0].mode = "500"
            failed = await client.post(
                "/v1/systemone", json={"model": "pub-a", **QUESTION}, headers=keyed
            )
            assert failed.status_code == 500
            listener.stop()
            await client.post("/v1/systemone", json={"model": "pub-a", **QUESTION}, headers=keyed)

    with caplog.at_level(logging.INFO, logger="vllm_sr.access"):
        run(scenario())
    records = [r for r in caplog.records if r.name == "vllm_sr.access"]
    lines = [re.sub(r" \d+\.\dms ", " <ms> ", r.getMessage()) for r in records]
    assert lines == [
        "POST /v1/embeddings 404 <ms> 127.0.0.1 (http-8899: runtime_not_published)",
        "POST /v1/systemone 401 <ms> 127.0.0.1 (http-8899: invalid_api_key)",
        "POST /v1/systemone 403 <ms> 127.0.0.1 (http-8899: model_not_allowed)",
        "GET /v1/elsewhere\\nforged 404 <ms> 127.0.0.1 (http-8899: not_found)",
        "GET /v1/systemone 405 <ms> 127.0.0.1 (http-8899: method_not_allowed)",
        "POST /v1/systemone 503 <ms> 127.0.0.1 (http-8899: systemone_unavailable)",
    ]
    assert all(r.levelno == logging.INFO for r in records)
    first = records[0]
    assert (first.method, first.path, first.status, first.client) == (
        "POST",
        "/v1/embeddings",
        404,
        "127.0.0.1",
    )
    assert (first.listener, first.code) == ("http-8899", "runtime_not_published")
    assert first.duration_ms >= 0


def test_a_chat_refusal_writes_an_access_line(caplog):
    """Router mode: the Chat routes' own refusals (a bad key, Chat without a router, a
    handler that failed) leave their lines too."""
    from vllm_sr.router.cache import ResponseCache
    from vllm_sr.router.chat import ListenerChat
    from vllm_sr.router.forward import Backends

    async def broken(request: Request) -> Response:
        raise RuntimeError("a bug")

    async def scenario():
        chat = ListenerChat("chat", (), None, lambda: None, Backends(), ResponseCache(0))
        listener = Listener(Grant("chat", api_keys=("key-1",)), {}, chat=chat)
        transport = httpx.ASGITransport(app=listener.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://listener") as client:
            body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
            assert (await client.post("/v1/chat/completions", json=body)).status_code == 401
            keyed = {"Api-Key": "key-1"}
            engine = await client.post("/v1/chat/completions", json=body, headers=keyed)
            assert engine.status_code == 404
            chat.completions = broken  # type: ignore[method-assign]
            failed = await client.post("/v1/chat/completions", json=body, headers=keyed)
            assert failed.status_code == 500

    with caplog.at_level(logging.INFO, logger="vllm_sr.access"):
        run(scenario())
    lines = [
        re.sub(r" \d+\.\dms ", " <ms> ", r.getMessage())
        for r in caplog.records
        if r.name == "vllm_sr.access"
    ]
    assert lines == [
        "POST /v1/chat/completions 401 <ms> 127.0.0.1 (chat: invalid_api_key)",
        "POST /v1/chat/completions 404 <ms> 127.0.0.1 (chat: not_found)",
        "POST /v1/chat/completions 500 <ms> 127.0.0.1 (chat: internal_error)",
    ]


# -- what an OpenAI SDK client reads -----------------------------------------------------------
def test_the_openai_sdk_reads_code_type_and_param_from_a_listener():
    """The real ``openai`` client (over the listener's ASGI app): ``code``, ``type`` and
    ``param`` of the listener's own refusals and of a worker's explanation passed on."""
    import httpx2
    import openai

    async def scenario():
        grant = Grant("http", runtime=(MINILM,))
        async with served(grant, public={"a": MINILM}) as (_, fakes, pools, listener):
            bare = Listener(Grant("bare", systemone=(MINILM,)), pools)
            errors = []
            for app in (listener.app, bare.app):
                transport = httpx2.ASGITransport(app=app)
                http = httpx2.AsyncClient(transport=transport, base_url="http://listener/v1")
                async with openai.AsyncOpenAI(
                    base_url="http://listener/v1", api_key="k", max_retries=0, http_client=http
                ) as sdk:
                    short = sdk.embeddings.create(model="all-MiniLM-L6-v2", input="x")
                    with pytest.raises(openai.APIStatusError) as raised:
                        await short
                    errors.append(raised.value)
                    if app is listener.app:
                        fakes[0].mode = "422"
                        fakes[0].rejection = {
                            "error": {
                                "code": "unsupported_surface",
                                "message": "this model serves embeddings, not classify",
                                "type": "invalid_request_error",
                                "param": "model",
                            }
                        }
                        body = {"model": MINILM, "input": ["x"]}
                        with pytest.raises(openai.UnprocessableEntityError) as raised:
                            await sdk.post("/classify", body=body, cast_to=object)
                        errors.append(raised.value)
            return errors

    not_allowed_error, cannot_classify, not_published = run(scenario())
    assert isinstance(not_allowed_error, openai.PermissionDeniedError)
    assert (not_allowed_error.status_code, not_allowed_error.code) == (403, "model_not_allowed")
    assert (not_allowed_error.type, not_allowed_error.param) == ("runtime_error", "model")
    assert not_allowed_error.body == {
        "code": "model_not_allowed",
        "type": "runtime_error",
        "message": not_allowed(MINILM, "runtime", near=MINILM),
        "param": "model",
    }
    assert not_allowed_error.response.headers["cache-control"] == "no-store"
    assert cannot_classify.body == {
        "code": "unsupported_surface",
        "type": "runtime_error",
        "message": "this model serves embeddings, not classify",
        "param": "model",
    }
    assert isinstance(not_published, openai.NotFoundError)
    assert (not_published.code, not_published.type, not_published.param) == (
        "runtime_not_published",
        "runtime_error",
        None,
    )
    assert not_published.body == {
        "code": "runtime_not_published",
        "type": "runtime_error",
        "message": WORDED["runtime_not_published"],
        "param": None,
    }


def test_a_bundle_task_id_with_a_lone_surrogate_is_a_400_not_a_crash():
    """A breaker's find: ``"id": "\\ud800"`` made the listener answer a plain-text 500
    and close the connection; the runtime itself answers 400."""

    async def scenario():
        async with served(Grant("http", runtime=("pub-a",)), ("a",)) as (client, fakes, *_):
            raw = b'{"tasks":[{"id":"\\ud800","embeddings":{"model":"pub-a","input":"x"}}]}'
            response = await client.post(
                "/v1/bundle", content=raw, headers={"content-type": "application/json"}
            )
            assert response.status_code == 400
            error = response.json()["error"]
            assert (error["code"], error["param"]) == ("invalid_request", "tasks.0.id")
            assert error["message"].startswith("tasks[0].id holds a lone surrogate")
            assert fakes[0].received == []
            after = await client.post("/v1/embeddings", json={"model": "pub-a", "input": "x"})
            assert after.status_code == 200

    run(scenario())
