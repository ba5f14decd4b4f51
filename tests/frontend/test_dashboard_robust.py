"""The Dashboard page against a hostile document, a frontend that stops answering, a huge
configuration and a configuration changed by someone else meanwhile: headless Chromium
(Playwright) on a Router-mode frontend in this process (the steerable worker).

- every text the document carries (names, labels, reasons, rejections) is shown as text,
  never parsed as HTML;
- one read of ``/api/v1/dashboard`` at a time, and a read not answered within 5 s is a
  problem the page shows (it keeps what it showed, saying when it was read);
- a document equal to the last one is not rendered again (the page stays usable with
  hundreds of deployments);
- a change is applied only onto the document it was built from: a change planned in two
  tabs is applied once, the second tab shows 412 ``CONFIG_CHANGED`` and cannot apply it
  again; a configuration changed between a tab's read and its plan is not applicable;
- a deployment that cannot load is shown failed while the old one serves, and an add
  under an existing deployment's name is refused before it is planned (a merge would
  rewrite that deployment).

Without Chromium (``apt-get install chromium``) the module is skipped.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .conftest import free_ports
from .router_support import StubServer, ThreadedFrontend
from .test_dashboard_browser import CHROMIUM, CHROMIUM_FLAGS
from .test_reload import router_document

pytestmark = pytest.mark.slow

from playwright.sync_api import Browser, Page, Route, expect, sync_playwright  # noqa: E402

expect.set_options(timeout=30_000)

KEY = "robust-key"
HOSTILE = '<img src=x onerror="window.injected=1"><b>'


@pytest.fixture(scope="module")
def served() -> Iterator[ThreadedFrontend]:
    stub = StubServer()
    [port] = free_ports(1)
    document = router_document(stub.stub.endpoint, port)
    document["listeners"][0]["api_keys"] = [KEY]
    frontend = ThreadedFrontend(document).start()
    try:
        frontend.wait_ready()
        yield frontend
    finally:
        frontend.stop()
        stub.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert CHROMIUM is not None  # test_dashboard_browser skips the module without it
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield launched
        finally:
            launched.close()


def open_page(browser: Browser, served: ThreadedFrontend, key: str = KEY) -> Page:
    """A fresh tab of the Dashboard, the key already given (as the key form keeps it)."""
    context = browser.new_context()
    context.add_init_script(f"sessionStorage.setItem('vllm-sr-dashboard-key', {json.dumps(key)})")
    page = context.new_page()
    page.goto(f"{served.mgmt_url}/dashboard")
    return page


def document(served: ThreadedFrontend) -> dict[str, Any]:
    answer = httpx.get(f"{served.mgmt_url}/api/v1/dashboard", headers={"Api-Key": KEY}, timeout=10)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def serve_document(page: Page, body: dict[str, Any]) -> dict[str, str]:
    """Answer the page's reads with ``body`` (a document the frontend did not write).
    Setting the returned holder's ``text`` answers later reads with another document,
    leaving no moment in which the frontend's own document reaches the page."""
    holder = {"text": json.dumps(body)}
    page.route(
        "**/api/v1/dashboard",
        lambda route: route.fulfill(
            status=200, content_type="application/json", body=holder["text"]
        ),
    )
    return holder


def poisoned(value: Any) -> Any:
    """``value`` with :data:`HOSTILE` before every string in it."""
    if isinstance(value, dict):
        return {key: poisoned(item) for key, item in value.items()}
    if isinstance(value, list):
        return [poisoned(item) for item in value]
    return HOSTILE + value if isinstance(value, str) else value


def test_every_text_of_a_hostile_document_is_shown_as_text(browser, served) -> None:
    body = poisoned(document(served))
    body["config"]["activation_status"] = "failed"
    body["config"]["last_rejection"] = {"error": HOSTILE + "rejected"}
    body["figures"][HOSTILE + "figure"] = {"ready": 1, "requests": {HOSTILE: 2}}
    page = open_page(browser, served)
    serve_document(page, body)
    page.reload()
    expect(page.locator("#decisions")).to_contain_text(HOSTILE + "coding")
    expect(page.locator("#activation")).to_contain_text(HOSTILE + "rejected")
    expect(page.locator("#figures")).to_contain_text(f"{HOSTILE}figure")
    expect(page.locator("#deployments")).to_contain_text(HOSTILE + "primary")
    expect(page.locator("#listeners")).to_contain_text(HOSTILE + "chat")
    assert page.locator("img, b").count() == 0  # nothing parsed as markup
    assert page.evaluate("window.injected") is None
    page.context.close()


def test_reads_never_overlap_and_a_read_left_unanswered_is_shown_within_5_s(
    browser, served
) -> None:
    page = open_page(browser, served)
    expect(page.locator("#phase")).to_have_text("ready: serving")
    read_at = page.locator("#refreshed").inner_text()
    held: list[Route] = []
    most = 0

    def hold(route: Route) -> None:
        nonlocal most
        held.append(route)
        most = max(most, sum(1 for r in held if r is not None))

    page.route("**/api/v1/dashboard", hold)
    started = time.monotonic()
    expect(page.locator("#connection")).to_contain_text(
        "the frontend does not answer (no answer within 5 s); retrying every second; what is "
        "shown was read at ",
        timeout=15_000,
    )
    assert 4.5 < time.monotonic() - started < 12
    assert most == 1 and len(held) == 1  # the next read waits for this one to end
    expect(page.locator("#phase")).to_have_text("ready: serving")  # what it showed, kept
    assert page.locator("#refreshed").inner_text() != "never" and read_at
    page.unroute("**/api/v1/dashboard")
    expect(page.locator("#connection")).to_be_hidden(timeout=15_000)  # answered again
    page.context.close()


def test_an_unchanged_document_is_not_rendered_again_even_with_hundreds_of_deployments(
    browser, served
) -> None:
    real = document(served)
    big = copy.deepcopy(real)
    entry = real["deployments"][0]
    big["deployments"] = [{**copy.deepcopy(entry), "name": f"d-{i:03d}"} for i in range(400)]
    page = open_page(browser, served)
    answering = serve_document(page, big)
    page.reload()
    expect(page.locator(".deployment")).to_have_count(400)
    page.evaluate("document.querySelector('.deployment').dataset.mark = 'kept'")
    first = page.locator("#refreshed").inner_text()
    expect(page.locator("#refreshed")).not_to_have_text(first)  # read again since
    assert page.locator('.deployment[data-mark="kept"]').count() == 1  # not rebuilt
    page.select_option("#scale-deployment", "d-200")
    changed = copy.deepcopy(big)
    changed["deployments"][0]["ready_replicas"] = 0
    answering["text"] = json.dumps(changed)
    expect(page.locator('.deployment[data-deployment="d-000"] .ready-count')).to_have_text(
        " 0/1 ready"
    )
    assert page.locator('.deployment[data-mark="kept"]').count() == 0  # rendered anew
    assert page.locator("#scale-deployment").input_value() == "d-200"  # the pick kept
    page.context.close()


def plan_scale(page: Page, replicas: int) -> None:
    page.select_option("#scale-deployment", "primary")
    page.fill("#scale-replicas", str(replicas))
    page.click("#scale-plan")
    expect(page.locator("#change-summary")).to_have_text(
        f"Scale primary to {replicas} replica{'s' if replicas > 1 else ''}"
    )


def test_a_change_planned_in_two_tabs_is_applied_once_the_other_shows_412(browser, served) -> None:
    first, second = open_page(browser, served), open_page(browser, served)
    for page in (first, second):
        expect(
            page.locator('.deployment[data-deployment="primary"][data-generation="active"]')
        ).to_have_count(1)
    plan_scale(first, 2)
    plan_scale(second, 2)
    for page in (first, second):
        expect(page.locator("#change-plan")).to_have_text("Plan: valid, changes the configuration")
    first.click("#change-apply")
    expect(first.locator("#change-status")).to_have_attribute("data-status", "active")
    second.click("#change-apply")
    expect(second.locator("#change-status")).to_have_text(
        "refused: CONFIG_CHANGED: The router config changed since it was read; refetch and "
        "retry with the latest ETag (someone else changed the configuration since this was "
        "planned; plan the change again)"
    )
    expect(second.locator("#change-apply")).to_be_disabled()
    expect(
        second.locator(
            '.deployment[data-deployment="primary"][data-generation="active"] .ready-count'
        )
    ).to_have_text(" 2/2 ready")
    # Back to one replica, planned and applied from the second tab.
    plan_scale(second, 1)
    second.click("#change-apply")
    expect(second.locator("#change-status")).to_have_attribute("data-status", "active")
    first.context.close()
    second.context.close()


def test_a_configuration_changed_between_the_read_and_the_plan_is_not_applicable(
    browser, served
) -> None:
    page = open_page(browser, served)
    expect(
        page.locator('.deployment[data-deployment="primary"][data-generation="active"]')
    ).to_have_count(1)
    mgmt = httpx.Client(base_url=served.mgmt_url, timeout=30)
    primary = mgmt.get("/api/v1/config").json()["global"]["model_catalog"]["deployments"]
    keywords = {"routing": {"signals": {"keywords": [{"name": "code", "keywords": ["fix"]}]}}}

    def change_first(route: Route) -> None:
        """Someone else applies a change after the page read the document, before its
        plan arrives."""
        etag = mgmt.get("/api/v1/config").headers["etag"]
        done = mgmt.patch(
            "/api/v1/config", json={"yaml": json.dumps(keywords)}, headers={"If-Match": etag}
        )
        assert done.status_code == 200, done.text
        route.continue_()

    page.route("**/api/v1/config/plan", change_first)
    plan_scale(page, 2)
    expect(page.locator("#change-plan")).to_have_text(
        "Plan: valid, changes the configuration; the configuration changed while this was "
        "planned: plan again"
    )
    expect(page.locator("#change-apply")).to_be_disabled()
    saved = mgmt.get("/api/v1/config").json()
    assert saved["routing"]["signals"]["keywords"] == [{"name": "code", "keywords": ["fix"]}]
    assert saved["global"]["model_catalog"]["deployments"] == primary  # not scaled
    mgmt.close()
    page.context.close()


def test_a_key_no_request_header_can_carry_is_refused_by_the_form(browser, served) -> None:
    page = open_page(browser, served, key="")
    expect(page.locator("#key-form")).to_be_visible()
    page.fill("#key", "clé→")
    page.click("#key-form button")
    expect(page.locator("#connection")).to_have_text(
        "this key cannot be sent in a request header (a character outside Latin-1, or a line "
        "break); check what was pasted"
    )
    page.fill("#key", f"  {KEY} ")  # pasted with spaces around it
    page.click("#key-form button")
    expect(page.locator("#key-form")).to_be_hidden()
    expect(page.locator("#mode")).to_have_text("Router")
    page.context.close()


def test_a_deployment_that_cannot_load_is_shown_failed_and_the_old_one_keeps_serving(
    browser, served
) -> None:
    page = open_page(browser, served)
    expect(page.locator("#add-listener")).to_have_value("chat")
    page.fill("#add-name", "broken")
    page.fill("#add-artifact", "broken/model")  # the steerable worker exits 1 loading it
    page.click("#add-plan")
    expect(page.locator("#change-plan")).to_have_text("Plan: valid, changes the configuration")
    patch = json.loads(page.locator("#change-patch").inner_text())
    assert patch["listeners"][0]["api_keys"] == ["<redacted>"]
    page.click("#change-apply")
    expect(page.locator("#change-status")).to_have_attribute("data-status", "failed")
    status = page.locator("#change-status").inner_text()
    assert status.startswith(
        'failed: model_runtime deployment "broken": runtime process exited 3 times before it '
        "was ready: exit status 1: "
    ), status
    assert status.endswith("; the previous configuration keeps serving"), status
    expect(page.locator("#activation .badge")).to_have_text("failed")
    expect(
        page.locator(
            '.deployment[data-deployment="primary"][data-generation="active"] .ready-count'
        )
    ).to_have_text(" 1/1 ready")
    expect(page.locator('.deployment[data-deployment="broken"]')).to_have_count(0)
    mgmt = httpx.Client(base_url=served.mgmt_url, timeout=30)
    saved = mgmt.get("/api/v1/config")
    assert saved.json()["listeners"][0]["api_keys"] == ["<redacted>"]
    # The saved file keeps the real key (not the placeholder): back to what served.
    assert served.frontend.reloads.source.document()["listeners"][0]["api_keys"] == [KEY]
    revert = {
        "global": {"model_catalog": {"deployments": {"broken": None}}},
        "listeners": [{**saved.json()["listeners"][0], "runtime": {"models": []}}],
    }
    done = mgmt.patch(
        "/api/v1/config",
        json={"yaml": json.dumps(revert)},
        headers={"If-Match": saved.headers["etag"]},
    )
    assert done.status_code == 200, done.text
    mgmt.close()
    page.context.close()


def test_adding_under_the_name_of_a_deployment_is_refused_before_planning(browser, served) -> None:
    page = open_page(browser, served)
    expect(page.locator("#add-listener")).to_have_value("chat")
    planned: list[str] = []
    page.on("request", lambda r: planned.append(r.url) if r.url.endswith("/plan") else None)
    page.fill("#add-name", "primary")  # a merge would have rewritten primary's artifact
    page.fill("#add-artifact", "org/other")
    page.click("#add-plan")
    expect(page.locator("#change-summary")).to_have_text(
        "primary is already a deployment: give the new one another name (Scale and Remove "
        "change the existing one)"
    )
    expect(page.locator("#change-apply")).to_be_disabled()
    assert planned == []
    page.context.close()


def test_a_bound_deployment_is_not_removed_and_a_plan_needing_a_restart_not_applied(
    browser, served
) -> None:
    page = open_page(browser, served)
    expect(page.locator("#remove-deployment")).to_have_value("primary")
    page.click("#remove-plan")
    expect(page.locator("#change-plan")).to_contain_text("Plan refused: INVALID_CONFIG: ")
    expect(page.locator("#change-reasons li")).to_have_text(
        ["binding embedding names deployment primary, which is not declared under deployments"]
    )
    expect(page.locator("#change-apply")).to_be_disabled()

    def needs_restart(route: Route) -> None:
        """The frontend's plan of the same change, as if it needed a restart."""
        answer = route.fetch()
        plan = answer.json()
        plan |= {"valid": True, "changed": True, "restart_required": True}
        plan["reasons"] = [
            {"code": "RESTART_REQUIRED", "path": "listeners.chat.port", "message": "restart"}
        ]
        route.fulfill(response=answer, json=plan)

    page.route("**/api/v1/config/plan", needs_restart)
    page.select_option("#scale-deployment", "primary")
    page.fill("#scale-replicas", "3")
    page.click("#scale-plan")
    expect(page.locator("#change-plan")).to_have_text(
        "Plan: valid, changes the configuration; needs a restart (not applied from here)"
    )
    expect(page.locator("#change-reasons li")).to_have_text(["restart"])
    expect(page.locator("#change-apply")).to_be_disabled()
    page.context.close()
