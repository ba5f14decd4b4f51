"""``--max-request-bytes``: 413 before the body is buffered, with or without Content-Length."""

from __future__ import annotations

import json

import pytest

from .conftest import make_client, timed_phases

LIMIT = 2048


def big_body() -> bytes:
    body = json.dumps({"model": "pooled", "input": ["good movie"] * 400}).encode()
    assert len(body) > LIMIT
    return body


def assert_too_large(response) -> None:
    assert response.status_code == 413, response.text
    assert response.json() == {
        "error": {
            "code": "request_too_large",
            "message": f"the body is over {LIMIT} bytes",
            "type": "invalid_request_error",
            "param": None,
        }
    }
    timing = timed_phases(response)
    assert timing["tokenize"] == timing["forward"] == 0  # refused before anything ran


@pytest.fixture
def limited(make_runtime):
    return make_runtime(("pooled",), max_request_bytes=LIMIT)


@pytest.mark.parametrize("path", ["/v1/embeddings", "/v1/classify", "/v1/rerank", "/v1/bundle"])
def test_a_content_length_over_the_limit_is_413(limited, path):
    client = make_client(limited)
    response = client.post(path, content=big_body(), headers={"content-type": "application/json"})
    assert "content-length" in response.request.headers
    assert_too_large(response)


@pytest.mark.parametrize("path", ["/v1/embeddings", "/v1/bundle"])
def test_a_chunked_body_over_the_limit_is_413(limited, path):
    body = big_body()
    chunks = (body[i : i + 256] for i in range(0, len(body), 256))
    response = make_client(limited).post(
        path, content=chunks, headers={"content-type": "application/json"}
    )
    assert "content-length" not in response.request.headers
    assert response.request.headers["transfer-encoding"] == "chunked"
    assert_too_large(response)


def test_a_body_at_the_limit_is_served(limited):
    prefix, suffix = b'{"model": "pooled", "options": {},  "input": "', b'"}'
    body = prefix + b"a " * ((LIMIT - len(prefix) - len(suffix)) // 2) + suffix
    assert len(body) == LIMIT
    client = make_client(limited)
    response = client.post(
        "/v1/embeddings", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200
    # 1000 words "a" between [CLS] and [SEP]: over the model's 48 tokens, answered per item
    # (refused from a prefix: tokenised only as far as the limit needs)
    assert response.json()["data"] == [
        {
            "object": "embedding",
            "index": 0,
            "error": "max_length_exceeded",
            "message": "input has at least 378 tokens (read as far as the limit needs); the "
            "limit is 48. Shorten it, or send options.overflow truncate (keep the beginning) "
            "or window",
        }
    ]
    assert response.json()["usage"] == {"prompt_tokens": 0, "total_tokens": 0}
    # one byte more is refused
    over = prefix + b"a " * ((LIMIT - len(prefix) - len(suffix)) // 2) + b" " + suffix
    assert len(over) == LIMIT + 1
    assert_too_large(
        client.post("/v1/embeddings", content=over, headers={"content-type": "application/json"})
    )


def read_response(sock) -> tuple[int, dict]:
    """Status and JSON body of one HTTP/1.1 response read off a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection without answering"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers["content-length"])
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk
        rest += chunk
    return int(lines[0].split()[1]), json.loads(rest[:length])


@pytest.mark.slow
def test_the_413_comes_before_the_body_is_sent(limited, live_server):
    """Over a real socket: the answer arrives while most of the body is still unsent."""
    server = live_server(limited)
    with server.connect() as sock:
        sock.sendall(
            b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 100000000\r\n\r\n" + b"[" + b" " * 100
        )
        status, body = read_response(sock)
    assert status == 413
    assert body == {
        "error": {
            "code": "request_too_large",
            "message": f"the body is over {LIMIT} bytes",
            "type": "invalid_request_error",
            "param": None,
        }
    }

    with server.connect() as sock:
        sock.sendall(
            b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        for _ in range(3):  # 3 KiB sent of a body that never ends
            sock.sendall(b"400\r\n" + b" " * 1024 + b"\r\n")
        status, body = read_response(sock)
    assert status == 413
    assert body == {
        "error": {
            "code": "request_too_large",
            "message": f"the body is over {LIMIT} bytes",
            "type": "invalid_request_error",
            "param": None,
        }
    }


@pytest.mark.parametrize("path", ["/v1/decisions", "/v1/systemone", "/v1/systemone/batch"])
def test_a_refused_decisions_body_is_counted_under_decisions(limited, path):
    client = make_client(limited)
    response = client.post(path, content=big_body(), headers={"content-type": "application/json"})
    assert_too_large(response)
    metrics = client.get("/metrics").text
    assert 'vllm_srun_requests_total{model="pooled",status="413",surface="decisions"} 1.0' in (
        metrics
    )


# -- --max-inputs: the card's limits.max_inputs ------------------------------------------------
def refusal(count: int, what: str = "inputs") -> dict:
    return {
        "error": {
            "code": "invalid_request",
            "message": f"the request holds {count} {what}; this server takes at most 3 in one "
            "request (limits.max_inputs, --max-inputs): split it into several requests",
            "type": "invalid_request_error",
            "param": None,
        }
    }


def test_max_inputs_is_on_the_cards_and_bounds_every_list_of_inputs(make_runtime):
    client = make_client(make_runtime(("pooled", "sequence", "relevance"), max_inputs=3))
    cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
    assert {name: card["limits"]["max_inputs"] for name, card in cards.items()} == dict.fromkeys(
        cards, 3
    )
    three, four = ["good"] * 3, ["good"] * 4
    for path, body in (
        ("/v1/embeddings", {"model": "pooled", "input": three}),
        ("/v1/embeddings", {"model": "pooled", "input": [[5, 6]] * 3}),
        ("/v1/classify", {"model": "sequence", "input": three}),
        ("/v1/rerank", {"model": "relevance", "query": "q", "documents": three}),
    ):
        assert client.post(path, json=body).status_code == 200, (path, body)
    for path, body, what in (
        ("/v1/embeddings", {"model": "pooled", "input": four}, "inputs"),
        ("/v1/embeddings", {"model": "pooled", "input": [[5, 6]] * 4}, "inputs"),
        (
            "/v1/embeddings",
            {"model": "pooled", "input": [{"type": "text", "text": "a"}] * 4},
            "inputs",
        ),
        ("/v1/classify", {"model": "sequence", "input": four}, "inputs"),
        ("/v1/rerank", {"model": "relevance", "query": "q", "documents": four}, "documents"),
    ):
        response = client.post(path, json=body)
        assert (response.status_code, response.json()) == (400, refusal(4, what)), path
    # in a bundle, only the task over the limit fails
    bundle = {
        "tasks": [
            {"id": "ok", "embeddings": {"model": "pooled", "input": three}},
            {"id": "big", "classify": {"model": "sequence", "input": four}},
        ]
    }
    results = client.post("/v1/bundle", json=bundle).json()["results"]
    assert [r["status"] for r in results] == [200, 400]
    assert results[1]["error"] == refusal(4)["error"]
