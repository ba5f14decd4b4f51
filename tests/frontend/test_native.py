"""A listener's native API (§1.9) over pools of fake workers: grants, api keys, every
error code and shape, model names both ways (bundles included), no worker text, the
shutdown hook."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import httpx
import pytest

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
    """A listener whose pools ``pub-<name>`` each have one fake worker ``<name>``."""
    clock = options.pop("clock", Clock())
    async with fake_workers(*names) as fakes:
        pools = {}
        for fake in fakes:
            worker = fake.worker(deployment=f"dep-{fake.name}")
            pools[f"pub-{fake.name}"] = ReplicaPool(
                f"dep-{fake.name}",
                [worker],
                public_name=f"pub-{fake.name}",
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
):
    """The listener's error: ``error`` only, or (``error_type``) Jev's ``detail`` too."""
    assert response.status_code == status, response.text
    message = code.replace("_", " ")
    expected: dict = {"error": {"code": code, "type": kind, "message": message}}
    if error_type is not None:
        expected["detail"] = {"error_type": error_type, "message": message}
    assert response.json() == expected
    assert response.headers["content-type"] == "application/json"
    assert response.headers["cache-control"] == "no-store"
    return True


GRANT = Grant("http", systemone=("pub-a",), runtime=("pub-a",))
AUTH = "authentication_error"


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
                await client.get("/v1/models"), 404, "runtime_not_published", "runtime_error"
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
            assert is_error(refused, 403, "model_not_allowed")
            refused = await client.post("/v1/embeddings", json={"model": "pub-a", "input": "x"})
            assert is_error(refused, 403, "model_not_allowed", "runtime_error")
            ok = await client.post("/v1/embeddings", json={"model": "pub-b", "input": "x"})
            assert ok.status_code == 200
            # Another listener over the same pools publishes only its own grant.
            other = Listener(Grant("two", systemone=("pub-b",)), pools)
            transport = httpx.ASGITransport(app=other.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://l") as two:
                refused = await two.post("/v1/systemone", json={"model": "pub-a", **QUESTION})
                assert is_error(refused, 403, "model_not_allowed")
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
            assert is_error(await post({"model": "other", **QUESTION}), 403, "model_not_allowed")
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
            code = "invalid_request" if mode == "400" else "internal_error"
            assert is_error(runtime, int(mode), code, "runtime_error")
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
