"""``examples/router/config.yaml`` served as the README starts it (real MiniLM and Rampart
workers), asked the README's three Chat requests: each reaches the route the README
says. Only the ports change: the listener's to a free one, the backend's to a stub."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .router_real_support import RouterServed, running_backend, served_in
from .stub_backend import Running

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "router" / "config.yaml"


@pytest.fixture(scope="module")
def backend() -> Iterator[Running]:
    yield from running_backend()


@pytest.fixture(scope="module")
def router(backend: Running, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterServed]:
    text = EXAMPLE.read_text()
    assert text.count("port: 8899") == 1 and "127.0.0.1:8000" in text
    text = text.replace("port: 8899", "port: {chat_port}")
    text = text.replace("127.0.0.1:8000", backend.stub.endpoint)
    folder = tmp_path_factory.mktemp("router-example")
    yield from served_in(lambda: RouterServed(folder, text))


@pytest.mark.parametrize(
    ("text", "decision", "sent"),
    [
        ("Please debug this function", "coding", "coder-7b"),
        ("Integrate x^2 from 0 to 1", "math", "math-7b"),
        ("Call me at 415-555-0132", "pii_guard", None),
        ("Mail me at ada@example.com", "pii_guard", None),
        ("What a lovely day", None, "general-7b"),
    ],
)
def test_the_readme_requests_take_the_readme_routes(
    router: RouterServed, backend: Running, text: str, decision: str | None, sent: str | None
) -> None:
    before = len(backend.stub.requests)
    answer = router.ask(text)
    assert answer.status_code == 200, answer.text
    assert answer.headers.get("x-vsr-selected-decision") == decision
    if sent is None:  # the guard answers without a backend call
        assert answer.headers["x-vsr-fast-response"] == "true"
        assert len(backend.stub.requests) == before
    else:
        assert [r.body.get("model") for r in backend.stub.requests[before:]] == [sent]
