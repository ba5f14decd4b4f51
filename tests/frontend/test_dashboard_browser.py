"""The Dashboard in a real browser: headless Chromium (Debian's ``chromium``), driven by
Playwright, against real ``vllm-sr serve`` processes.

- **Engine mode** (``vllm-sr serve -e``), real MiniLM workers, a listener with an API key:
  the page asks for a key, then shows Engine mode and MiniLM ready with nothing requested
  beyond 127.0.0.1; scaling MiniLM from 1 to 2 replicas from the page brings the second
  replica up ready; a worker killed with SIGKILL shows as not ready, then ready again, with
  no reload of the page; a deployment added from an artifact and published on the
  listener's runtime grant answers there (with the listener's key still in force), and is
  removed again.
- **Router mode** (``vllm-sr serve``) on the steerable worker and a stub backend: the
  routes and signals are shown, and the preview box shows the decision of a keyword route.

The tests take a screenshot of the page in each mode into ``$VLLM_SR_SCREENSHOTS`` (``make
screenshots`` sets it to ``docs/images``), else into a temporary folder. Without Chromium
(``apt-get install chromium``) the module is skipped, and says so.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from .router_real_support import MINILM, RouterServed
from .router_support import StubServer, worker_command
from .test_reload import router_document
from .test_serve import VLLM_SRUN

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("VLLM_SR_CHROMIUM") or shutil.which("chromium")
"""Debian's Chromium (``VLLM_SR_CHROMIUM`` names another executable)."""

CHROMIUM_FLAGS = [
    "--no-sandbox",  # CI runs the tests as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",  # no calls home from a machine with no network
    "--disable-component-update",
    "--disable-sync",
]

UI_TIMEOUT_MS = 60_000
"""How long the page may take to show what a test waits for (a replica's restart on a
shared 2-core machine takes a few seconds; the margin is for a busy box)."""

ACTIVATION_TIMEOUT_MS = 180_000
"""A change that starts a MiniLM worker (its first start exports the ONNX graph: ~20 s)."""

KEY = "dash-key"

if CHROMIUM is None:
    pytest.skip(
        "Chromium is not installed (apt-get install chromium); the browser tests run when it is",
        allow_module_level=True,
    )

from playwright.sync_api import Browser, Page, expect, sync_playwright  # noqa: E402

expect.set_options(timeout=UI_TIMEOUT_MS)

SCREENSHOTS = Path(os.environ.get("VLLM_SR_SCREENSHOTS") or tempfile.mkdtemp(prefix="vsr-shots-"))


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield launched
        finally:
            launched.close()


class Opened:
    """A page of the Dashboard with every URL it requested."""

    def __init__(self, browser: Browser, url: str) -> None:
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.page: Page = self.context.new_page()
        self.page.set_default_timeout(UI_TIMEOUT_MS)
        self.requested: list[str] = []
        self.page.on("request", lambda request: self.requested.append(request.url))
        self.page.goto(url)

    def elsewhere(self) -> list[str]:
        """The URLs requested of any host but 127.0.0.1 (``data:`` URLs are not requests
        of a host)."""
        return [u for u in self.requested if urlsplit(u).hostname not in ("127.0.0.1", None)]

    def screenshot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / name
        self.page.screenshot(path=str(path), full_page=True)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        return path

    def close(self) -> None:
        self.context.close()


def replica_rows(page: Page, deployment: str, state: str | None = None) -> Any:
    where = f'.deployment[data-deployment="{deployment}"][data-generation="active"]'
    row = "tr[data-replica]" + (f'[data-state="{state}"]' if state else "")
    return page.locator(f"{where} {row}")


# -- Engine mode ---------------------------------------------------------------------------------

ENGINE_CONFIG = f"""
listeners:
  - name: http
    address: 127.0.0.1
    port: {{chat_port}}
    api_keys: [{KEY}]
    runtime: {{models: [{MINILM}]}}
global:
  model_catalog:
    deployments:
      primary:  # the default decision deployment's name (its default artifact is MiniLM)
        provider: model_runtime
        artifact: {MINILM}
        device: cpu
"""


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterServed]:
    folder = tmp_path_factory.mktemp("dashboard-engine")
    served = RouterServed(folder, ENGINE_CONFIG, {"VLLM_SRUN_COMMAND": VLLM_SRUN}, ("-e",))
    try:
        served.wait_ready()
        yield served
    finally:
        served.close()


@pytest.fixture(scope="module")
def engine_page(browser: Browser, engine: RouterServed) -> Iterator[Opened]:
    opened = Opened(browser, f"http://127.0.0.1:{engine.mgmt_port}/dashboard")
    try:
        yield opened
    finally:
        opened.close()


def test_the_page_asks_for_the_key_then_shows_engine_mode_and_minilm_ready(
    engine_page: Opened,
) -> None:
    page = engine_page.page
    expect(page.locator("#connection")).to_contain_text("UNAUTHORIZED")
    page.fill("#key", KEY)
    page.click("#key-form button")
    expect(page.locator("#mode")).to_have_text("Engine")
    expect(page.locator("#key-form")).to_be_hidden()
    expect(page.locator("#phase")).to_have_text("ready: serving")
    expect(page.locator("#activation .badge")).to_have_text("active")
    section = page.locator('.deployment[data-deployment="primary"]')
    expect(section.locator(".ready-count")).to_have_text(" 1/1 ready")
    expect(section.locator(".facts")).to_contain_text(f"{MINILM}")
    expect(section.locator(".facts")).to_contain_text("published on http (runtime)")
    expect(replica_rows(page, "primary", "ready")).to_have_count(1)
    expect(page.locator('#figures tr[data-deployment="primary"] .ready')).to_have_text("yes")
    expect(page.locator("#routing-section")).to_be_hidden()
    assert engine_page.elsewhere() == []
    assert any(u.endswith("/api/v1/dashboard") for u in engine_page.requested)


def test_scaling_minilm_from_one_to_two_replicas_from_the_page(
    engine_page: Opened, engine: RouterServed
) -> None:
    page = engine_page.page
    page.select_option("#scale-deployment", "primary")
    page.fill("#scale-replicas", "2")
    page.click("#scale-plan")
    expect(page.locator("#change-summary")).to_have_text("Scale primary to 2 replicas")
    expect(page.locator("#change-plan")).to_have_text("Plan: valid, changes the configuration")
    assert json.loads(page.locator("#change-patch").inner_text()) == {
        "global": {
            "model_catalog": {
                "deployments": {
                    "primary": {"device": None, "replicas": [{"device": "cpu"}, {"device": "cpu"}]}
                }
            }
        }
    }
    page.click("#change-apply")
    expect(page.locator("#change-status")).to_have_attribute(
        "data-status", "active", timeout=ACTIVATION_TIMEOUT_MS
    )
    section = page.locator('.deployment[data-deployment="primary"][data-generation="active"]')
    expect(section.locator(".ready-count")).to_have_text(" 2/2 ready")
    expect(replica_rows(page, "primary", "ready")).to_have_count(2)
    expect(page.locator("#config-version")).to_have_text("2")
    assert len(engine.workers()) == 2
    saved = yaml.safe_load(engine.config.read_text())
    assert saved["global"]["model_catalog"]["deployments"]["primary"]["replicas"] == [
        {"device": "cpu"},
        {"device": "cpu"},
    ]
    assert saved["listeners"][0]["api_keys"] == [KEY]
    engine_page.screenshot("dashboard-engine.png")
    assert engine_page.elsewhere() == []


def test_a_killed_worker_shows_as_restarting_then_ready_without_a_reload(
    engine_page: Opened, engine: RouterServed
) -> None:
    page = engine_page.page
    expect(replica_rows(page, "primary", "ready")).to_have_count(2)
    # Every state a replica row shows from now on, and a mark a reload would lose.
    page.evaluate(
        """() => {
        window.dashboardMark = "kept";
        window.statesSeen = [];
        const seen = () => document.querySelectorAll(
            '.deployment[data-deployment="primary"] tr[data-replica]').forEach(
            (row) => window.statesSeen.push(row.dataset.replica + " " + row.dataset.state));
        new MutationObserver(seen).observe(document.getElementById("deployments"),
            {childList: true, subtree: true});
    }"""
    )
    victim = engine.workers()[0]
    victim.send_signal(signal.SIGKILL)
    restarted = page.locator(
        '.deployment[data-deployment="primary"] tr[data-replica][data-state="ready"]'
    ).filter(has=page.locator("td.restarts", has_text="1"))
    expect(restarted).to_have_count(1)
    expect(replica_rows(page, "primary", "ready")).to_have_count(2)
    replica = restarted.get_attribute("data-replica")
    seen = page.evaluate("window.statesSeen")
    states = [line.split(" ", 1)[1] for line in seen if line.startswith(f"{replica} ")]
    assert any(s != "ready" for s in states), seen
    assert states[-1] == "ready"
    assert page.evaluate("window.dashboardMark") == "kept"  # the same page, never reloaded
    expect(page.locator('#figures tr[data-deployment="primary"] .restarts')).to_have_text("1")


def test_a_deployment_added_and_published_from_the_page_answers_then_is_removed(
    engine_page: Opened, engine: RouterServed
) -> None:
    page = engine_page.page
    page.fill("#add-name", "minilm-b")
    page.fill("#add-artifact", MINILM)
    page.fill("#add-public-name", "minilm-b")
    page.fill("#add-device", "cpu")
    page.select_option("#add-listener", "http")
    page.select_option("#add-grant", "runtime")
    page.click("#add-plan")
    expect(page.locator("#change-summary")).to_have_text(
        f"Add minilm-b ({MINILM}) and publish minilm-b on http's runtime grant"
    )
    expect(page.locator("#change-plan")).to_have_text("Plan: valid, changes the configuration")
    patch = json.loads(page.locator("#change-patch").inner_text())
    assert patch["listeners"][0]["api_keys"] == ["<redacted>"]  # as GET /api/v1/config showed
    assert patch["listeners"][0]["runtime"] == {"models": [MINILM, "minilm-b"]}
    page.click("#change-apply")
    expect(page.locator("#change-status")).to_have_attribute(
        "data-status", "active", timeout=ACTIVATION_TIMEOUT_MS
    )
    added = page.locator('.deployment[data-deployment="minilm-b"]')
    expect(added.locator(".ready-count")).to_have_text(" 1/1 ready")
    expect(added.locator(".facts")).to_contain_text("published on http (runtime)")
    saved = yaml.safe_load(engine.config.read_text())
    assert saved["listeners"][0]["api_keys"] == [KEY]  # the saved key, not the placeholder
    embed = {"model": "minilm-b", "input": ["a sentence"]}
    url = f"http://127.0.0.1:{engine.chat_port}/v1/embeddings"
    answer = httpx.post(url, json=embed, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["data"][0]["embedding"]) == 384
    assert httpx.post(url, json=embed, timeout=30).status_code == 401

    page.select_option("#remove-deployment", "minilm-b")
    page.click("#remove-plan")
    expect(page.locator("#change-summary")).to_have_text(
        "Remove minilm-b and its grants of minilm-b"
    )
    expect(page.locator("#change-plan")).to_have_text("Plan: valid, changes the configuration")
    page.click("#change-apply")
    expect(page.locator("#change-status")).to_have_attribute(
        "data-status", "active", timeout=ACTIVATION_TIMEOUT_MS
    )
    expect(page.locator('.deployment[data-deployment="minilm-b"]')).to_have_count(0)
    gone = httpx.post(url, json=embed, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert gone.status_code == 403, gone.text
    saved = yaml.safe_load(engine.config.read_text())
    assert "minilm-b" not in saved["global"]["model_catalog"]["deployments"]
    assert saved["listeners"][0] == {
        "name": "http",
        "address": "127.0.0.1",
        "port": 8899,  # the file's port: vllm-sr adds VLLM_SR_PORT_OFFSET
        "api_keys": [KEY],
        "runtime": {"models": [MINILM]},
    }
    assert engine_page.elsewhere() == []


def test_a_failed_add_is_shown_as_saved_not_serving_and_removed_from_the_page(
    engine_page: Opened, engine: RouterServed
) -> None:
    """A model that cannot load (a Hub repository not in the cache, offline): the
    activation fails, the previous configuration keeps serving, and the page says the
    saved file holds what failed and offers to remove it."""
    page = engine_page.page
    page.fill("#add-name", "missing")
    page.fill("#add-artifact", "vllm-sr-tests/not-in-the-cache")
    page.fill("#add-public-name", "missing")
    page.fill("#add-device", "cpu")
    page.click("#add-plan")
    expect(page.locator("#change-summary")).to_have_text(
        "Add missing (vllm-sr-tests/not-in-the-cache) and publish missing on http's runtime grant"
    )
    expect(page.locator("#change-plan")).to_have_text("Plan: valid, changes the configuration")
    page.click("#change-apply")
    expect(page.locator("#change-status")).to_have_attribute(
        "data-status", "failed", timeout=ACTIVATION_TIMEOUT_MS
    )
    expect(page.locator("#change-status")).to_contain_text('model_runtime deployment "missing"')
    expect(page.locator("#activation .badge")).to_have_text("failed")
    expect(page.locator("#saved-only")).to_contain_text(
        "In the saved configuration but not serving: missing. The last change failed: the "
        "previous configuration keeps serving, and a restart would start the saved one."
    )
    expect(replica_rows(page, "primary", "ready")).to_have_count(2)  # still serving
    page.select_option("#remove-deployment", "missing")
    page.click("#remove-plan")
    expect(page.locator("#change-summary")).to_have_text("Remove missing and its grants of missing")
    expect(page.locator("#change-plan")).to_have_text("Plan: valid, changes the configuration")
    page.click("#change-apply")
    expect(page.locator("#change-status")).to_have_attribute(
        "data-status", "active", timeout=ACTIVATION_TIMEOUT_MS
    )
    expect(page.locator("#saved-only")).to_have_count(0)
    expect(page.locator("#activation .badge")).to_have_text("active")
    saved = yaml.safe_load(engine.config.read_text())
    assert "missing" not in saved["global"]["model_catalog"]["deployments"]
    assert saved["listeners"][0]["runtime"] == {"models": [MINILM]}


# -- Router mode ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterServed]:
    folder = tmp_path_factory.mktemp("dashboard-router")
    scripts = Path(tempfile.mkdtemp(prefix="vsrd-", dir="/tmp"))
    stub = StubServer()

    def config(served: RouterServed) -> str:
        document = router_document(stub.stub.endpoint, served.chat_port)
        return yaml.safe_dump(document, sort_keys=False)

    served = RouterServed(
        folder,
        config,
        {"VLLM_SRUN_COMMAND": " ".join(worker_command(scripts)), "VLLM_SRUN_DIR": str(scripts)},
    )
    try:
        served.wait_ready()
        yield served
    finally:
        served.close()
        stub.stop()
        shutil.rmtree(scripts, ignore_errors=True)


@pytest.fixture
def router_page(browser: Browser, router: RouterServed) -> Iterator[Opened]:
    """A fresh page of the Router-mode frontend's Dashboard, for one test."""
    opened = Opened(browser, f"http://127.0.0.1:{router.mgmt_port}/dashboard")
    try:
        yield opened
    finally:
        opened.close()


def test_router_mode_shows_routes_signals_and_previews_a_keyword_route(
    router_page: Opened,
) -> None:
    page = router_page.page
    expect(page.locator("#mode")).to_have_text("Router")
    expect(page.locator("#routing-section")).to_be_visible()
    coding = page.locator('#decisions tr[data-decision="coding"] td')
    expect(coding).to_have_text(["coding", "100", "keyword:code", "a-chat"])
    expect(page.locator('#signals tr[data-signal="embeddings:rain"] td')).to_have_text(
        ["embeddings", "rain", "primary"]
    )
    expect(page.locator('#signals tr[data-signal="keywords:code"] td')).to_have_text(
        ["keywords", "code", "the router itself"]
    )
    expect(page.locator('.deployment[data-deployment="primary"] .ready-count')).to_have_text(
        " 1/1 ready"
    )
    page.fill("#preview-text", "Please debug this function")
    page.click("#preview-run")
    expect(page.locator("#preview-decision")).to_have_text("coding")
    expect(page.locator("#preview-matched")).to_have_text("keywords: code")
    expect(page.locator("#preview-errors")).to_have_text("none")
    expect(page.locator("#preview-model")).to_have_text("a-chat (selected)")
    router_page.screenshot("dashboard-router.png")
    assert router_page.elsewhere() == []


def test_a_change_the_configuration_refuses_is_shown_and_cannot_be_applied(
    router_page: Opened, router: RouterServed
) -> None:
    page = router_page.page
    expect(page.locator("#mode")).to_have_text("Router")
    page.fill("#scale-replicas", "0")  # the form's own bounds keep it from planning
    page.click("#scale-plan")
    assert page.locator("#scale-replicas").evaluate("input => input.validity.rangeUnderflow")
    expect(page.locator("#change")).to_be_hidden()
    page.fill("#add-name", "broken")
    page.fill("#add-artifact", "not a repository")
    page.click("#add-plan")
    expect(page.locator("#change-plan")).to_contain_text("Plan refused: INVALID_CONFIG: ")
    expect(page.locator("#change-reasons")).to_contain_text(
        "artifact must be a Hub repository ID or an absolute package path"
    )
    expect(page.locator("#change-apply")).to_be_disabled()
    saved = yaml.safe_load(router.config.read_text())
    assert "broken" not in saved["global"]["model_catalog"]["deployments"]
