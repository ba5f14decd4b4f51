"""The Chat routes of a Router-mode listener: ``POST /v1/chat/completions`` and
``GET /v1/models`` (ROUTER-SPEC §2.1, §2.8-§2.11).

Checks run in order: the listener's API key (401 ``invalid_api_key`` with
``WWW-Authenticate``), the body (413 over :data:`MAX_BODY_BYTES`, 400 for JSON that is
not an object with ``messages``), the listener's ``models`` allow-list (403
``model_not_allowed``), then the model: an auto name is routed, a
``providers.models[].name`` passes through undecided, anything else is 400
``model_not_found``. Errors use OpenAI's envelope ``{"error": {"type", "code", "message",
"param"}}`` and never quote the request's text.

Every answer carries ``x-vsr-schema-version: 2`` and ``x-vsr-response-path``; a routed
2xx answer from a backend carries the ``x-vsr-selected-*`` headers, and with
``x-vsr-debug: true`` the ``x-vsr-matched-*`` ones.

Why one module of 400-odd lines: it is the Chat routes' answer, read in the order the
checks above run, every way out (an error, a fast response, a cached or a backend's
answer) carrying the same headers and metrics; the routing, the selection, the forwarding
and the cache it calls already live in modules of their own.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..bodies import BodyTooLarge, read_body
from ..names import closest
from .cache import ResponseCache
from .decisions import headers_value
from .forward import (
    DEFAULT_TIMEOUT,
    TIMED_OUT,
    TOO_LARGE,
    UNREACHABLE,
    Answer,
    Backends,
    BackendTimeout,
    BackendTooLarge,
    BackendUnreachable,
    forwarded_headers,
)
from .metrics import RoutingMetrics
from .route import Routed, Router
from .selection import backend_credential, choose_backend, rewrite
from .texts import lone_surrogate

MAX_BODY_BYTES = 10 * 1024 * 1024
"""The largest Chat request body read (413 above)."""

SCHEMA_VERSION = "2"
REALM = 'Bearer realm="vllm-semantic-router"'
UNAUTHORIZED = "Unauthorized: missing or invalid API key"

MATCHED_HEADERS = {
    "keywords": "x-vsr-matched-keywords",
    "embeddings": "x-vsr-matched-embeddings",
    "domains": "x-vsr-matched-domains",
    "language": "x-vsr-matched-language",
    "context": "x-vsr-matched-context",
    "jailbreak": "x-vsr-matched-jailbreak",
    "pii": "x-vsr-matched-pii",
    "decision": "x-vsr-matched-decision-model",
}
"""The debug header listing each signal list's matched rules."""


def error_body(status: int, code: str, message: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error envelope; the ``type`` follows the status."""
    if status == 401:
        kind = "authentication_error"
    elif status >= 500:
        kind = "server_error"
    else:
        kind = "invalid_request_error"
    return {"error": {"type": kind, "code": code, "message": message, "param": param}}


class ChatError(Exception):
    """A Chat request answered with an error (status, code, message, headers)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param
        self.headers = dict(headers or {})

    def response(self) -> Response:
        body = json.dumps(error_body(self.status, self.code, self.message, self.param))
        headers = {
            "x-vsr-schema-version": SCHEMA_VERSION,
            "x-vsr-response-path": "error",
            **self.headers,
        }
        return Response(body, self.status, headers, media_type="application/json")


def unauthorized() -> ChatError:
    """The answer to a Chat request without a valid listener key (401 with
    ``WWW-Authenticate``)."""
    return ChatError(401, "invalid_api_key", UNAUTHORIZED, headers={"www-authenticate": REALM})


def debug_requested(request: Request) -> bool:
    """Whether the request asked for the debug headers (``x-vsr-debug: true``)."""
    return request.headers.get("x-vsr-debug", "").strip().lower() == "true"


def fast_response(message: str, stream: bool, now: float | None = None) -> tuple[bytes, str]:
    """A ``fast_response`` answer: a ``chat.completion`` from the model ``router``, or its
    ``chat.completion.chunk`` events then ``[DONE]``; and its content type."""
    created = int(now if now is not None else time.time())
    ident = f"chatcmpl-fast-{created}"
    if not stream:
        body = {
            "id": ident,
            "object": "chat.completion",
            "created": created,
            "model": "router",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": message},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }
        return json.dumps(body).encode(), "application/json"
    base = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": "router"}
    first = {
        **base,
        "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": message}, "finish_reason": None}
        ],
    }
    last = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    events = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in (first, last))
    return events + b"data: [DONE]\n\n", "text/event-stream"


@dataclass
class ListenerChat:
    """What one listener's Chat routes need.

    The listener checks the API key before it hands a request here
    (:func:`unauthorized` is its answer).

    Attributes:
        name: the listener's name.
        allowed: the Chat allow-list (empty: every model).
        timeout: the listener's ``timeout`` in seconds, or ``None``.
        router: the serving generation's router (read per request: a reload swaps it).
        backends: the backends' HTTP client.
        cache: the response cache.
        metrics: the routing metrics, or ``None``.
    """

    name: str
    allowed: tuple[str, ...]
    timeout: float | None
    router: Callable[[], Router | None]
    backends: Backends
    cache: ResponseCache
    metrics: RoutingMetrics | None = None

    # -- GET /v1/models ----------------------------------------------------------------------
    async def models(self, request: Request) -> Response:
        """The Chat models: the auto names, and the provider models when configured."""
        router = self._router()
        created = int(time.time())
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm-semantic-router",
                "description": "Intelligent Router for Mixture-of-Models",
                "routing": {
                    "resolution": "virtual",
                    "selectable": True,
                    "default_route": True,
                    "recipe": "default",
                },
            }
            for name in router.auto
        ]
        if router.include_config_models:
            data += [
                {
                    "id": model.name,
                    "object": "model",
                    "created": created,
                    "owned_by": "upstream-endpoint",
                    "routing": {"resolution": "passthrough", "selectable": False},
                }
                for model in router.providers.models
            ]
        if self.allowed:
            data = [item for item in data if item["id"] in self.allowed]
        body = json.dumps({"object": "list", "data": data}).encode()
        return Response(
            body, 200, {"x-vsr-schema-version": SCHEMA_VERSION}, media_type="application/json"
        )

    def _not_allowed(self, model: str) -> str:
        """What a model outside the allow-list is told: the listener's models (the
        allow-list, nothing else), the one meant, and where an operator adds another."""
        near = closest(model, self.allowed)
        guess = f" (did you mean {near}?)" if near is not None else ""
        return (
            f"this listener does not serve the requested model{guess}; its models are "
            f"{', '.join(self.allowed)}. To serve another here, add it to listeners[].models "
            "in config.yaml"
        )

    def _router(self) -> Router:
        router = self.router()
        if router is None:
            raise ChatError(404, "not_found", "Chat is not served in Engine mode")
        return router

    # -- POST /v1/chat/completions -----------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        """Route and forward one Chat request (see the module docstring)."""
        arrived = time.monotonic()
        router = self._router()
        body = await self._body(request)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise ChatError(400, "invalid_request_error", "model is required", param="model")
        if self.allowed and model not in self.allowed:
            raise ChatError(403, "model_not_allowed", self._not_allowed(model), param="model")
        stream = body.get("stream") is True
        timeout = self.timeout or DEFAULT_TIMEOUT
        request_deadline = arrived + self.timeout if self.timeout else None
        if not router.is_auto(model):
            chosen = router.providers.find(model)
            if chosen is None:
                if self.metrics is not None:
                    self.metrics.unserved(model)
                raise ChatError(
                    400, "model_not_found", "the requested model is not served", param="model"
                )
            rewritten = rewrite(body, None, chosen, None, router.providers)
            answer = await self._forward(request, rewritten, stream, timeout)
            headers = {"x-vsr-selected-model": chosen.name}
            return self._respond(answer, headers, stream)
        routed = await router.route(body["messages"], request_deadline=request_deadline)
        if self.metrics is not None:
            self.metrics.routed(routed)
        applied = routed.ranking.policies
        policy_headers = {"x-vsr-applied-unknown-policy": headers_value(applied)} if applied else {}
        if routed.failed is not None:
            self._error_metric(model, "decision_unresolved")
            raise ChatError(
                503,
                "decision_unresolved",
                f"decision {routed.failed.name} could not be resolved because a signal "
                "evaluator failed: decision unresolved",
                headers=policy_headers,
            )
        decision = routed.decision
        if decision is not None:
            fast = decision.plugin("fast_response")
            if fast is not None:
                content, media = fast_response(str(fast.configuration["message"]), stream)
                headers = {
                    "x-vsr-schema-version": SCHEMA_VERSION,
                    "x-vsr-response-path": "fast_response",
                    "x-vsr-selected-decision": decision.name,
                    "x-vsr-fast-response": "true",
                    **policy_headers,
                }
                if self.metrics is not None:
                    self.metrics.plugin("fast_response", decision.name, "success")
                return Response(content, 200, headers, media_type=media)
        if routed.model is None:
            self._error_metric(model, "no_route")
            raise ChatError(400, "no_route", "no route matched the request", headers=policy_headers)
        cache_plugin = decision.plugin("response_cache") if decision is not None else None
        scope = self._scope(request)
        if (
            cache_plugin is not None
            and not stream
            and cache_plugin.configuration.get("enabled", True)
        ):
            hit = await self.cache.lookup(router, routed, body, scope, cache_plugin)
            if self.metrics is not None:
                self.metrics.cache(decision.name if decision else "", hit is not None)
            if hit is not None:
                headers = {
                    "x-vsr-schema-version": SCHEMA_VERSION,
                    "x-vsr-response-path": "cache",
                    "x-vsr-cache-hit": "true",
                }
                if debug_requested(request) and hit.similarity is not None:
                    headers["x-vsr-cache-similarity"] = f"{hit.similarity:.4f}"
                return Response(hit.body, 200, headers, media_type="application/json")
        rewritten = rewrite(body, decision, routed.model, routed.ref, router.providers)
        answer = await self._forward(request, rewritten, stream, timeout)
        if cache_plugin is not None and not stream and 200 <= answer.status < 300:
            await self.cache.store(router, routed, body, scope, cache_plugin, answer.body)
        headers = self._routed_headers(
            request, routed, rewritten.reasoning, rewritten.injected_prompt
        )
        headers.update(policy_headers)
        return self._respond(answer, headers, stream, routed_only=True)

    def _scope(self, request: Request) -> str:
        """The response cache's caller scope: the listener and the key presented."""
        scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
        key = token.strip() if scheme.lower() == "bearer" else request.headers.get("api-key", "")
        return f"{self.name}\x00{key}"

    async def _body(self, request: Request) -> dict[str, Any]:
        try:
            raw = await read_body(request, MAX_BODY_BYTES)
        except BodyTooLarge as err:
            raise ChatError(413, "request_too_large", str(err)) from None
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            raise ChatError(
                400, "invalid_request_error", "the body is not JSON; send a JSON object"
            ) from None
        if not isinstance(body, dict):
            raise ChatError(400, "invalid_request_error", "the body must be a JSON object")
        if lone_surrogate(raw, body):
            raise ChatError(
                400,
                "invalid_request_error",
                "the body has a \\u escape of half a UTF-16 pair (a lone surrogate), "
                "which is not text; send the character itself or both halves",
            )
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ChatError(
                400, "invalid_request_error", "messages must be a non-empty array", param="messages"
            )
        return body

    async def _forward(
        self, request: Request, rewritten: Any, stream: bool, timeout: float
    ) -> Answer:
        ref = choose_backend(rewritten.model.backend_refs)
        headers = forwarded_headers(
            request.headers.items(), scheme=request.scope.get("scheme", "http")
        )
        headers = [(n, v) for n, v in headers if n.lower() not in rewritten.delete_headers]
        replaced = {n.lower() for n in rewritten.set_headers} | {
            n.lower() for n in ref.extra_headers
        }
        headers = [(n, v) for n, v in headers if n.lower() not in replaced]
        headers += list(ref.extra_headers.items()) + list(rewritten.set_headers.items())
        credential = backend_credential(ref)
        if credential is not None:
            headers = [(n, v) for n, v in headers if n.lower() != credential[0].lower()]
            headers.append(credential)
        headers.append(("content-type", "application/json"))  # the client's was left out
        content = json.dumps(rewritten.body, ensure_ascii=False).encode()
        model = rewritten.model.name
        if self.metrics is not None:
            self.metrics.sent(model)
        try:
            answer = await self.backends.send(
                ref.url, headers, content, stream=stream, timeout=timeout
            )
        except BackendUnreachable:
            self._error_metric(model, "upstream_5xx")
            return Answer(503, "text/plain", UNREACHABLE.encode())
        except BackendTimeout:
            self._error_metric(model, "timeout")
            return Answer(504, "text/plain", TIMED_OUT.encode())
        except BackendTooLarge:
            self._error_metric(model, "upstream_5xx")
            return Answer(502, "text/plain", TOO_LARGE.encode())
        if answer.status >= 500:
            self._error_metric(model, "upstream_5xx")
        if self.metrics is not None:
            self.metrics.backend(model, answer)
        return answer

    def _error_metric(self, model: str, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.error(model, reason)

    def _routed_headers(
        self, request: Request, routed: Routed, reasoning: bool, injected: bool
    ) -> dict[str, str]:
        """The selection headers of a routed answer, and the debug ones when asked for."""
        headers: dict[str, str] = {"x-vsr-selected-recipe": "default"}
        if routed.decision is not None:
            headers["x-vsr-selected-decision"] = routed.decision.name
        confidence = routed.confidence
        if confidence is not None:
            headers["x-vsr-selected-confidence"] = f"{confidence:.4f}"
        headers["x-vsr-selected-algorithm"] = "static"
        if routed.model is not None:
            headers["x-vsr-selected-model"] = routed.model.name
        headers["x-vsr-routing-latency-ms"] = f"{routed.seconds * 1000:.3f}"
        if debug_requested(request):
            domain = routed.results.labels.get("domain")
            if domain:
                headers["x-vsr-selected-category"] = str(domain)
            headers["x-vsr-selected-reasoning"] = "on" if reasoning else "off"
            if injected:
                headers["x-vsr-injected-system-prompt"] = "true"
            for kind, header in MATCHED_HEADERS.items():
                names = sorted(routed.results.matched.get(kind, ()))
                if kind == "decision":
                    names = _decision_references(names)
                if names:
                    headers[header] = ",".join(names)
            tokens = routed.results.labels.get("context_tokens")
            if tokens is not None:
                headers["x-vsr-context-token-count"] = str(tokens)
        return headers

    def _respond(
        self, answer: Answer, headers: dict[str, str], stream: bool, routed_only: bool = False
    ) -> Response:
        """The backend's answer with the router's headers (selection headers on 2xx only)."""
        ok = 200 <= answer.status < 300
        sent = {"x-vsr-schema-version": SCHEMA_VERSION, "x-vsr-response-path": "upstream"}
        if ok or not routed_only:
            sent.update(headers if ok else {})
        if "x-vsr-applied-unknown-policy" in headers:
            sent["x-vsr-applied-unknown-policy"] = headers["x-vsr-applied-unknown-policy"]
        if answer.content_encoding:
            sent["content-encoding"] = answer.content_encoding
        if answer.stream is not None:
            return StreamingResponse(
                _closing(answer.stream), answer.status, sent, media_type=answer.content_type
            )
        return Response(answer.body, answer.status, sent, media_type=answer.content_type)


def _decision_references(names: list[str]) -> list[str]:
    """A decision rule matched as ``n`` and, for a Choice, ``n:key``: the header lists
    ``n:key`` when there is one, else ``n``."""
    keyed = {name.split(":", 1)[0] for name in names if ":" in name}
    return [n for n in names if ":" in n or n not in keyed]


async def _closing(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Relay ``chunks``; closing this iterator (the client hung up) closes theirs."""
    try:
        async for chunk in chunks:
            yield chunk
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()
