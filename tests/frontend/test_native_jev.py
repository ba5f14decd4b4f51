"""A listener in front of Jev-schema deployments (TypeSafe's Jev API, ``--systemone-schema
jev``): the alias ``jev-latest``, Jev's 422 validation answers (the listener's own and a
worker's, rebuilt), ``detail`` beside ``error``, Jev's model list on ``GET /v1/models``,
and the 401 every listener now gives; a vllm-sr listener's errors stay as they were."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from vllm_sr.api import native, refusals
from vllm_sr.api.published import Grant
from vllm_sr.api.refusals import detail_entries
from vllm_sr.pool.pool import MAX_INFLIGHT, ReplicaPool
from vllm_sr.workers.health import HealthPoller
from vllm_sr.workers.worker import Worker

from .pool_support import close_all, fake_workers, run
from .test_native import AUTH, QUESTION, SYSTEMONE_PATHS, is_error, not_allowed, served

JEV = Grant("http", systemone=("pub-a",), jev=("pub-a",))
"""A Jev listener: its one System One model serves the Jev schema."""


def is_invalid(response: httpx.Response, detail: list, code: str = "invalid_request") -> bool:
    """Jev's 422: the listener's ``error`` and the validation entries ``detail``."""
    assert response.status_code == 422, response.text
    error = {
        "code": code,
        "type": "systemone_error",
        "message": code.replace("_", " "),
        "param": "model" if code == "model_required" else None,
    }
    assert response.json() == {"error": error, "detail": detail}
    assert response.headers["content-type"] == "application/json"
    assert response.headers["cache-control"] == "no-store"
    return True


def is_jev_error(
    response: httpx.Response, status: int, code: str, message: str | None = None
) -> bool:
    """A Jev listener's other errors: ``error`` and ``detail: {error_type, message}``."""
    return is_error(response, status, code, error_type=code, message=message)


# -- the alias ---------------------------------------------------------------------------------
def test_jev_latest_names_the_one_systemone_model():
    async def scenario():
        for grant in (JEV, Grant("http", systemone=("pub-a",))):
            async with served(grant) as (client, fakes, *_):
                for path in SYSTEMONE_PATHS:
                    body = {"model": "jev-latest", **QUESTION}
                    response = await client.post(path, json=body)
                    assert response.status_code == 200, response.text
                    # The worker hears its own name; the client reads the public id.
                    assert response.json() == {"model": "pub-a", "worker": "a"}
                    sent_path, sent = fakes[0].received[-1]
                    assert sent_path == path
                    assert json.loads(sent) == {"model": "served-a", **QUESTION}

    run(scenario())


def test_jev_latest_among_several_names_the_one_jev_deployment():
    async def scenario():
        grant = Grant("http", systemone=("pub-a", "pub-b"), jev=("pub-b",))
        async with served(grant, ("a", "b")) as (client, fakes, *_):
            response = await client.post("/v1/systemone", json={"model": "jev-latest", **QUESTION})
            assert response.json() == {"model": "pub-b", "worker": "b"}
            assert fakes[0].received == [] and len(fakes[1].received) == 1
            # Not a Jev listener (pub-a answers in vllm-sr/5.0): its errors stay vllm-sr's.
            assert is_error(
                await client.post("/v1/systemone", content=b"{"), 400, "invalid_request"
            )

    run(scenario())


@pytest.mark.parametrize(
    ("grant", "jev_listener"),
    [
        (Grant("http", systemone=("pub-a", "pub-b")), False),
        (Grant("http", systemone=("pub-a", "pub-b"), jev=("pub-a", "pub-b")), True),
    ],
)
def test_jev_latest_is_an_unknown_model_when_it_names_no_single_model(grant, jev_listener):
    async def scenario():
        async with served(grant, ("a", "b")) as (client, fakes, *_):
            response = await client.post("/v1/systemone", json={"model": "jev-latest", **QUESTION})
            error_type = "model_not_allowed" if jev_listener else None
            message = not_allowed("pub-a, pub-b")  # no alias: it names no single model
            assert is_error(
                response, 403, "model_not_allowed", error_type=error_type, message=message
            )
            assert all(f.received == [] for f in fakes)

    run(scenario())


def test_a_published_jev_latest_is_its_own_model_and_the_alias_is_systemone_only():
    async def scenario():
        async with fake_workers("a", "b") as fakes:
            pools = {
                name: ReplicaPool(
                    f"dep-{fake.name}",
                    [fake.worker(deployment=f"dep-{fake.name}")],
                    public_name=name,
                    cache_entries=0,
                )
                for name, fake in (("pub-a", fakes[0]), ("jev-latest", fakes[1]))
            }
            grant = Grant("http", systemone=("pub-a", "jev-latest"), runtime=("pub-a",))
            listener = native.Listener(grant, pools)
            transport = httpx.ASGITransport(app=listener.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://l") as client:
                response = await client.post(
                    "/v1/systemone", json={"model": "jev-latest", **QUESTION}
                )
                assert response.json() == {"model": "jev-latest", "worker": "b"}
                runtime = await client.post(
                    "/v1/embeddings", json={"model": "jev-latest", "input": "x"}
                )
                message = not_allowed("pub-a", "runtime")
                assert is_error(runtime, 403, "model_not_allowed", "runtime_error", message=message)
            await close_all(*(w for p in pools.values() for w in p.workers))

    run(scenario())


# -- a Jev listener's errors -------------------------------------------------------------------
def test_a_jev_listener_answers_a_request_that_is_not_valid_422():
    async def scenario():
        grant = Grant("http", systemone=("pub-a", "pub-none"), runtime=("pub-a",), jev=("pub-a",))
        async with served(grant) as (client, fakes, *_):

            def post(body, path="/v1/systemone"):
                content = body if isinstance(body, bytes) else json.dumps(body).encode()
                return client.post(path, content=content)

            not_json = [
                {"loc": ["body"], "msg": "the body is not JSON text", "type": "json_invalid"}
            ]
            for path in SYSTEMONE_PATHS:
                assert is_invalid(await post(b"{not json", path), not_json)
            assert is_invalid(await post(b"\xff\xfe"), not_json)
            nested = b'{"model":"pub-a","state":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
            assert is_invalid(await post(nested), not_json)
            not_object = [
                {"loc": ["body"], "msg": "the body must be a JSON object", "type": "dict_type"}
            ]
            assert is_invalid(await post([1, 2]), not_object)
            missing = [{"loc": ["body", "model"], "msg": "model is required", "type": "missing"}]
            assert is_invalid(await post(QUESTION), missing, "model_required")
            assert is_invalid(await post({"model": None, **QUESTION}), missing, "model_required")
            not_text = [
                {"loc": ["body", "model"], "msg": "model must be text", "type": "string_type"}
            ]
            assert is_invalid(await post({"model": 3, **QUESTION}), not_text, "model_required")
            blank = [
                {"loc": ["body", "model"], "msg": "model must not be blank", "type": "value_error"}
            ]
            assert is_invalid(await post({"model": " ", **QUESTION}), blank, "model_required")
            # Every other refusal: the error, and Jev's detail beside it.
            unknown = await post({"model": "jevcompat-no-such-model", **QUESTION})
            message = not_allowed("pub-a, jev-latest")
            assert is_jev_error(unknown, 403, "model_not_allowed", message)
            assert is_jev_error(
                await post({"model": "pub-none", **QUESTION}), 404, "model_not_found"
            )
            routed = {"model": "pub-a", "routing": True, **QUESTION}
            assert is_jev_error(await post(routed), 400, "systemone_routing_not_supported")
            get = await client.get("/v1/systemone")
            assert is_jev_error(get, 405, "method_not_allowed")
            assert get.headers["allow"] == "POST"
            assert is_jev_error(await client.get("/v1/elsewhere"), 404, "not_found")
            # The runtime routes keep the vllm-sr shapes on any listener.
            runtime = await post(b"{not json", "/v1/embeddings")
            assert is_error(runtime, 400, "invalid_request", "runtime_error")
            runtime = await post({"input": "x"}, "/v1/embeddings")
            assert is_error(runtime, 400, "model_required", "runtime_error")
            assert fakes[0].received == []

    run(scenario())


def test_a_jev_listener_refusals_under_load_and_shutdown_carry_detail():
    async def scenario():
        async with served(JEV, max_request_bytes=100) as (client, fakes, pools, listener):
            big = {"model": "pub-a", "state": "x" * 200, "questions": {}}
            assert is_jev_error(
                await client.post("/v1/systemone", json=big), 413, "request_too_large"
            )
            fakes[0].mode = "500"
            failed = await client.post("/v1/systemone", json={"model": "pub-a", **QUESTION})
            assert is_jev_error(failed, 500, "systemone_request_failed")
            assert "SECRET" not in failed.text
            pools["pub-a"].workers[0].update("loading", "reading weights")
            unavailable = await client.post("/v1/systemone", json={"model": "pub-a", **QUESTION})
            assert is_jev_error(unavailable, 503, "systemone_unavailable")
            assert unavailable.headers["retry-after"] == "1"
            listener.stop()
            stopped = await client.post("/v1/systemone", json={"model": "pub-a", **QUESTION})
            assert is_jev_error(stopped, 503, "systemone_unavailable")

    run(scenario())


def test_a_jev_listener_says_overloaded_with_detail():
    async def scenario():
        async with served(JEV) as (client, fakes, *_):
            fakes[0].mode = "hang"
            body = {"model": "jev-latest", **QUESTION}
            held = [asyncio.create_task(client.post("/v1/systemone", json=body)) for _ in range(32)]
            await fakes[0].wait_received(MAX_INFLIGHT)
            response = await client.post("/v1/systemone", json=body)
            assert is_jev_error(response, 429, "overloaded")
            assert response.headers["retry-after"] == "1"
            fakes[0].gate.set()
            assert {r.status_code for r in await asyncio.gather(*held)} == {200}

    run(scenario())


def test_a_workers_422_reaches_a_jev_client_rebuilt():
    """Only well-formed entries, only ``loc``, ``msg`` and ``type``, cut to size; the
    worker's ``error`` text and every other key stay behind."""
    long = "m" * 600
    rejection = {
        "detail": [
            {"loc": ["body", "state"], "msg": "Field required", "type": "missing", "input": "S"},
            {"loc": ["body", "questions", "질문", 0], "msg": "bad", "type": "value_error"},
            {"loc": ["query", "x"], "msg": "elsewhere", "type": "missing"},
            {"loc": [], "msg": "no place", "type": "missing"},
            {"loc": "body", "msg": "not a list", "type": "missing"},
            {"loc": ["body", True], "msg": "a bool", "type": "missing"},
            {"loc": ["body", 1.5], "msg": "a float", "type": "missing"},
            {"loc": ["body", {"a": 1}], "msg": "an object", "type": "missing"},
            {"loc": ["body"], "msg": 5, "type": "missing"},
            {"loc": ["body"], "msg": "no type"},
            "SECRET entry",
            {"loc": ["body", *(f"p{i}" for i in range(20))], "msg": long, "type": "t" * 600},
        ],
        "error": {"code": "invalid_request", "message": "SECRET /srv/sock"},
        "trace": "SECRET",
    }
    expected = [
        {"loc": ["body", "state"], "msg": "Field required", "type": "missing"},
        {"loc": ["body", "questions", "질문", 0], "msg": "bad", "type": "value_error"},
        {
            "loc": ["body", *(f"p{i}" for i in range(15))],
            "msg": "m" * refusals.MAX_DETAIL_TEXT,
            "type": "t" * refusals.MAX_DETAIL_TEXT,
        },
    ]

    async def scenario():
        async with served(JEV) as (client, fakes, *_):
            fakes[0].mode = "422"
            fakes[0].rejection = rejection
            for path in SYSTEMONE_PATHS:
                response = await client.post(path, json={"model": "jev-latest", "state": "x"})
                assert is_invalid(response, expected)
                assert "SECRET" not in response.text and "input" not in response.text
            # Nothing well-formed: one entry of the listener's own.
            fakes[0].rejection = {"detail": "SECRET", "error": {"message": "SECRET"}}
            response = await client.post("/v1/systemone", json={"model": "pub-a", **QUESTION})
            generic = [{"loc": ["body"], "msg": "the request is not valid", "type": "value_error"}]
            assert is_invalid(response, generic)
            fakes[0].rejection = {"detail": [expected[0]] * (refusals.MAX_DETAIL_ENTRIES + 8)}
            response = await client.post("/v1/systemone", json={"model": "pub-a", **QUESTION})
            assert is_invalid(response, [expected[0]] * refusals.MAX_DETAIL_ENTRIES)

    run(scenario())


def test_a_vllm_sr_listener_keeps_its_errors():
    """The same refusals on a listener whose model answers in vllm-sr/5.0: ``error`` alone
    (a worker's 422 included), as before Jev."""

    async def scenario():
        async with served(Grant("http", systemone=("pub-a",))) as (client, fakes, *_):
            assert is_error(
                await client.post("/v1/systemone", content=b"{"), 400, "invalid_request"
            )
            assert is_error(
                await client.post("/v1/systemone", json=QUESTION), 400, "model_required"
            )
            other = await client.post("/v1/systemone", json={"model": "other", **QUESTION})
            message = not_allowed("pub-a, jev-latest")
            assert is_error(other, 403, "model_not_allowed", message=message)
            assert is_error(await client.get("/v1/elsewhere"), 404, "not_found")
            fakes[0].mode = "422"
            fakes[0].rejection = {"detail": [{"loc": ["body"], "msg": "SECRET", "type": "x"}]}
            failed = await client.post("/v1/systemone", json={"model": "pub-a", **QUESTION})
            assert is_error(failed, 422, "systemone_request_failed")
            assert "SECRET" not in failed.text

    run(scenario())


@pytest.mark.parametrize("grant", [JEV, Grant("http", systemone=("pub-a",), runtime=("pub-a",))])
def test_a_missing_or_wrong_key_is_an_authentication_error(grant):
    async def scenario():
        keyed = Grant(
            "http",
            api_keys=("key-1",),
            systemone=grant.systemone,
            runtime=grant.runtime,
            jev=grant.jev,
        )
        async with served(keyed) as (client, fakes, *_):
            body = {"model": "jev-latest", **QUESTION}
            for headers in ({}, {"Authorization": "Bearer jevcompat-wrong-key"}):
                for method, path in (("POST", "/v1/systemone"), ("GET", "/v1/models")):
                    response = await client.request(
                        method, path, json=body if method == "POST" else None, headers=headers
                    )
                    kind = "runtime_error" if method == "GET" and grant.runtime else None
                    assert is_error(
                        response, 401, "invalid_api_key", kind or "systemone_error", AUTH
                    )
                    realm = 'Bearer realm="vllm-semantic-router"'
                    assert response.headers["www-authenticate"] == realm
            ok = await client.post("/v1/systemone", json=body, headers={"Api-Key": "key-1"})
            assert ok.status_code == 200
            assert len(fakes[0].received) == 1

    run(scenario())


# -- the model list ----------------------------------------------------------------------------
def test_models_lists_the_systemone_ids_and_the_alias():
    async def scenario():
        grant = Grant("http", systemone=("pub-a", "pub-none", "pub-a"), jev=("pub-a",))
        async with served(grant) as (client, _, pools, _listener):
            worker = pools["pub-a"].workers[0]
            # No Jev list from the worker, no dates on its card: the fixed fallback.
            response = await client.get("/v1/models")
            assert response.status_code == 200
            assert response.headers["cache-control"] == "no-store"
            fallback = {"description": "System One model pub-a", "release_date": "1970-01-01"}
            assert response.json() == {
                "object": "list",
                "data": [],
                "models": [{"name": "pub-a", **fallback}, {"name": "jev-latest", **fallback}],
            }
            # The card's own, when it gives them (a date that is no date is left out).
            worker.update(
                "ready", "", {**worker.card, "description": "Card text", "release_date": "soon"}
            )
            listed = (await client.get("/v1/models")).json()["models"]
            assert listed[0] == {
                "name": "pub-a",
                "description": "Card text",
                "release_date": "1970-01-01",
            }
            # The worker's Jev list first.
            worker.listing = {
                "description": "MiniLM, read by similarity",
                "release_date": "2021-08-30",
            }
            listed = (await client.get("/v1/models")).json()["models"]
            entry = {"description": "MiniLM, read by similarity", "release_date": "2021-08-30"}
            assert listed == [{"name": "pub-a", **entry}, {"name": "jev-latest", **entry}]

    run(scenario())


def test_models_beside_the_runtime_cards_and_without_an_alias():
    async def scenario():
        grant = Grant("http", systemone=("pub-a", "pub-b"), runtime=("pub-b",))
        async with served(grant, ("a", "b")) as (client, _, pools, _listener):
            document = (await client.get("/v1/models")).json()
            card = pools["pub-b"].workers[0].card
            assert document == {
                "object": "list",
                "data": [{**card, "id": "pub-b", "ready": True}],
                "models": [
                    {
                        "name": "pub-a",
                        "description": "System One model pub-a",
                        "release_date": "1970-01-01",
                    },
                    {
                        "name": "pub-b",
                        "description": "System One model pub-b",
                        "release_date": "1970-01-01",
                    },
                ],
            }
        # A runtime grant alone: the cards, as before.
        async with served(Grant("http", runtime=("pub-a",))) as (client, *_):
            document = (await client.get("/v1/models")).json()
            assert set(document) == {"object", "data"}

    run(scenario())


def test_the_health_poller_keeps_the_workers_jev_listing():
    async def scenario():
        async with fake_workers("a") as [fake]:
            worker = Worker("dep", "r-000000000000", False, fake.endpoint, "x")
            await HealthPoller(worker).probe()
            assert worker.ready and worker.listing is None
            fake.listing = [
                {"name": "jev-latest", "description": "alias", "release_date": "2026-01-01"},
                {"name": "x", "description": "The model", "release_date": "2026-02-03", "n": 1},
            ]
            worker.forget_card()
            await HealthPoller(worker).probe()
            assert worker.listing == {"description": "The model", "release_date": "2026-02-03"}
            fake.listing = [{"name": "x", "description": 5, "release_date": "d" * 2000}]
            worker.forget_card()
            assert worker.listing is None
            await HealthPoller(worker).probe()
            assert worker.listing == {}
            await worker.aclose()

    run(scenario())


def test_detail_entries_of_anything_else_are_none():
    for body in (None, [], "x", {"detail": None}, {"detail": {"loc": ["body"]}}):
        assert detail_entries(body) == []
