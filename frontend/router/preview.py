"""``POST /api/v1/routing/preview[?trace=true]`` on the management listener: what the router
would do with a request, without calling a backend (ROUTER-SPEC §3.1).

The body is strict JSON ``{"text", "messages"?, "model"?, "options"?: {"trace",
"return_probabilities"}}`` (an unknown field is 400 ``INVALID_INPUT``). Every configured
signal is evaluated (not only those the decisions reference), the decisions ranked and
the selection previewed. At most ``max_concurrency`` previews run at once (one more is
429 ``OVERLOADED``, nothing queues), each within ``request_timeout_seconds`` (else 504
``REQUEST_TIMEOUT``). An unresolved ``fail_request`` decision answers 503 with the whole
preview and ``decision_error``.
"""

from __future__ import annotations

import asyncio
import datetime
import json
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from .decisions import used_signals
from .route import Routed, Router
from .texts import lone_surrogate

PREVIEW_FIELDS = ("text", "messages", "model", "options")
OPTION_FIELDS = ("trace", "return_probabilities")


class PreviewError(Exception):
    """A preview answered with an error: ``{"error": {"code", "message", "timestamp"}}``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def response(self) -> Response:
        stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        body = {"error": {"code": self.code, "message": self.message, "timestamp": stamp}}
        return Response(json.dumps(body), self.status, media_type="application/json")


def read_preview(raw: bytes, query_trace: bool) -> tuple[list[dict[str, Any]], str, str, bool]:
    """The messages, original text, requested model and trace flag of a preview body.

    Raises:
        PreviewError: 400 ``INVALID_INPUT``: not JSON, an unknown field, an empty text.
    """
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise PreviewError(400, "INVALID_INPUT", "the body is not JSON") from None
    if not isinstance(body, dict):
        raise PreviewError(400, "INVALID_INPUT", "the body must be a JSON object")
    if lone_surrogate(raw, body):
        raise PreviewError(
            400, "INVALID_INPUT", "the body has a \\u escape of half a UTF-16 pair; send text"
        )
    unknown = [k for k in body if k not in PREVIEW_FIELDS]
    if unknown:
        raise PreviewError(
            400,
            "INVALID_INPUT",
            f"unknown field {unknown[0]}; a preview takes {', '.join(PREVIEW_FIELDS)}",
        )
    options = body.get("options") or {}
    if not isinstance(options, dict) or [k for k in options if k not in OPTION_FIELDS]:
        raise PreviewError(400, "INVALID_INPUT", f"options takes {', '.join(OPTION_FIELDS)} only")
    text = body.get("text")
    messages = body.get("messages")
    if messages is not None:
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise PreviewError(400, "INVALID_INPUT", "messages must be an array of {role, content}")
    elif text is not None and not isinstance(text, str):
        raise PreviewError(400, "INVALID_INPUT", "text must be a string: the text to route")
    elif not isinstance(text, str) or not text.strip():
        raise PreviewError(400, "INVALID_INPUT", "text is empty; give the text to route")
    else:
        messages = [{"role": "user", "content": text}]
    model = body.get("model", "vllm-sr/auto")
    if not isinstance(model, str):
        raise PreviewError(400, "INVALID_ROUTING_MODEL", "model must be a model name")
    trace = query_trace or options.get("trace") is True
    original = text if isinstance(text, str) else ""
    return messages, original, model, trace


def preview_body(routed: Routed, original: str, model: str, trace: bool) -> dict[str, Any]:
    """The preview document of a routed request (ROUTER-SPEC §3.1's shape)."""
    results = routed.results
    decision = routed.decision
    matched: dict[str, list[str]] = {}
    for kind, names in sorted(results.matched.items()):
        listed = sorted(names)
        if listed:
            matched[kind] = listed
    result: dict[str, Any] = {
        "decision_name": decision.name if decision is not None else None,
        "algorithm": "static" if decision is not None else None,
        "plugins": [p.type for p in decision.plugins] if decision is not None else [],
        "used_signals": used_signals(decision) if decision is not None else {},
        "matched_signals": matched,
        "unmatched_signals": {},
    }
    if decision is not None:
        unmatched = {
            kind: [n for n in names if n not in results.matched.get(kind, set())]
            for kind, names in used_signals(decision).items()
        }
        result["unmatched_signals"] = {k: v for k, v in unmatched.items() if v}
    body: dict[str, Any] = {
        "original_text": original,
        "requested_model": model,
        "recipe": "default",
        "decision_result": result,
    }
    if trace:
        body["eval_trace"] = [o.trace for o in routed.ranking.outcomes]
    recommended = [ref.model for ref in decision.modelRefs] if decision is not None else []
    if routed.status == "fallback" and routed.model is not None:
        recommended = [routed.model.name]
    body.update(
        recommended_models=recommended,
        selected_model=routed.model.name if routed.model is not None else None,
        selection_status=routed.status,
        selection_method="static" if routed.status == "selected" else routed.status,
        metrics=results.metrics,
        signal_confidences=results.confidences,
        signal_values=results.values,
        signal_errors=results.errors,
        applied_unknown_policies=routed.ranking.policies,
    )
    return body


class Preview:
    """The preview endpoint over the serving generation's router.

    Args:
        router: the serving generation's router, or ``None`` (Engine mode).
        max_concurrency: previews at once (``services.api.routing_preview.max_concurrency``).
        timeout: seconds per preview (``request_timeout_seconds``).
    """

    def __init__(
        self, router: Callable[[], Router | None], max_concurrency: int = 16, timeout: float = 120.0
    ) -> None:
        self.router = router
        self.max_concurrency = max_concurrency
        self.timeout = timeout
        self._running = 0

    async def handle(self, request: Request) -> Response:
        try:
            return await self._handle(request)
        except PreviewError as err:
            return err.response()

    async def _handle(self, request: Request) -> Response:
        router = self.router()
        if router is None:
            raise PreviewError(404, "NOT_FOUND", "routing preview needs Router mode")
        raw = await request.body()
        query_trace = request.query_params.get("trace", "").lower() == "true"
        messages, original, model, trace = read_preview(raw, query_trace)
        if not router.is_auto(model) and router.providers.find(model) is None:
            raise PreviewError(400, "INVALID_ROUTING_MODEL", f"unknown model {model}")
        if self._running >= self.max_concurrency:
            raise PreviewError(
                429, "OVERLOADED", f"more than {self.max_concurrency} previews at once; retry"
            )
        self._running += 1
        try:
            routed = await asyncio.wait_for(router.route(messages, every_signal=True), self.timeout)
        except TimeoutError:
            raise PreviewError(
                504, "REQUEST_TIMEOUT", "routing preview exceeded its request deadline"
            ) from None
        finally:
            self._running -= 1
        body = preview_body(routed, original, model, trace)
        if routed.failed is not None:
            body["decision_error"] = (
                f"decision {routed.failed.name} could not be resolved because a signal "
                "evaluator failed: decision unresolved"
            )
            return Response(json.dumps(body), 503, media_type="application/json")
        return Response(json.dumps(body), 200, media_type="application/json")
