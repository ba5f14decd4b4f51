"""A listener's native API: System One for the models it grants, and (beyond upstream)
the runtime surfaces for the models its ``runtime`` grant names.

- ``GET /v1/systemone/models``; ``POST /v1/systemone``, ``/v1/decisions`` (its alias) and
  ``/v1/systemone/batch``, for the public ids of ``listeners[].systemone.models``;
- ``POST /v1/embeddings``, ``/v1/classify``, ``/v1/rerank`` and ``/v1/bundle`` for those of
  ``listeners[].runtime.models`` (each bundle task names a granted model; tasks of
  several deployments are split per pool and answered in task order).

- ``GET /v1/models``: the runtime grant's cards (``data``) and, with a System One grant,
  the Jev model list (``models``: ``name``, ``description``, ``release_date``) of its
  System One ids and of the alias ``jev-latest``.

``api_keys`` are read from ``Authorization: Bearer <key>`` or ``Api-Key: <key>`` and
compared in constant time; no keys means an open listener. Requests reach the pools as
the client sent them, ``model`` aside (the public id in, the worker's name out, and
back); a worker's error text never reaches a client: an error answer carries the code
and a message that is that code in words. Every answer says ``Cache-Control: no-store``.
A 401 carries, beside ``error``, Jev's ``detail: {"error_type": "authentication_error",
"message"}`` on every listener.

``model: "jev-latest"`` (the Jev SDKs' default), when the grant does not publish that id
itself, names the grant's one System One model, or, of several, the one deployment
serving the Jev schema; otherwise it is an unknown model.

A Jev listener (every System One deployment of its grant serves the Jev schema,
``Grant.jev``) answers in Jev's error shapes: every error carries ``detail:
{"error_type": <code>, "message": <code in words>}`` beside ``error``, and a request that
is not valid (a body that is not a JSON object, no ``model``) answers 422 ``{"error",
"detail": [{"loc": ["body", ...], "msg", "type"}]}``. A worker's 422 is passed on the
same way, its ``detail`` entries rebuilt: only well-formed ones (``loc`` a list of text
and integers starting ``"body"``, ``msg`` and ``type`` text), at most
:data:`MAX_DETAIL_ENTRIES`, each cut to :data:`MAX_DETAIL_TEXT` characters. This is the
one exception to "worker text never reaches a client": those entries say what is wrong
with the client's own request (which field, why), which a Jev client needs to fix it;
nothing else of the worker's answer (its ``error`` message, any other key, the input it
echoed) is passed on.

Grants never union across listeners: each listener app sees its own grant only.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from ..pool import jsontext
from ..pool.pool import BadReply, Overloaded, PoolError, ReplicaPool, TooLarge
from ..pool.transport import TASK_SURFACES, Reply
from ..router.chat import ChatError, ListenerChat, unauthorized

SYSTEMONE = "systemone_error"
RUNTIME = "runtime_error"
"""The error ``type`` of the System One routes and of the runtime routes."""

REALM = 'Bearer realm="vllm-semantic-router"'
TIMEOUT_SECONDS = 30.0
"""How long a request waits for its worker's answer."""

MAX_REQUEST_BYTES = 48 * 1024 * 1024
"""The largest request body a listener reads (System One questions may carry images)."""

MAX_SYSTEMONE_RESPONSE_BYTES = 4 * 1024 * 1024
"""The largest System One answer passed on (a larger one is ``invalid_runtime_response``)."""

RUNTIME_ERROR_CODES = frozenset(
    {
        "invalid_request",
        "model_not_found",
        "request_too_large",
        "unsupported_surface",
        "overloaded",
        "internal_error",
        "not_ready",
    }
)
"""The wire contract's error codes: a worker's code among them is passed on (its
message never is)."""

RUNTIME_ROUTES = {
    "/v1/embeddings": "embeddings",
    "/v1/classify": "classify",
    "/v1/rerank": "rerank",
}
"""The runtime routes a ``runtime`` grant publishes (``/v1/bundle`` and ``GET /v1/models``
too), by surface."""

NO_STORE = {"cache-control": "no-store"}

JEV_ALIAS = "jev-latest"
"""The model name the Jev SDKs send by default."""

AUTHENTICATION_ERROR = "authentication_error"
"""Jev's ``detail.error_type`` of a 401."""

MAX_DETAIL_ENTRIES = 32
"""Most ``detail`` entries of a worker's 422 passed on to a Jev client."""

MAX_DETAIL_TEXT = 512
"""Longest ``msg``, ``type`` or ``loc`` text of a passed-on entry (cut beyond)."""

MAX_DETAIL_LOC = 16
"""Most ``loc`` parts of a passed-on entry (cut beyond)."""

UNKNOWN_RELEASE_DATE = "1970-01-01"
"""The ``release_date`` the model list gives a model whose worker says none (the Unix
epoch: the date is not known)."""

RELEASE_DATE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")

COMPACT = (",", ":")
"""JSON separators without spaces, as the runtime writes its answers."""


@dataclass(frozen=True)
class Grant:
    """What one listener publishes, and to whom.

    Attributes:
        listener: the listener's name (for logs).
        api_keys: the keys a client must present (none: open).
        systemone: public ids published on the System One routes.
        runtime: public ids published on the runtime routes.
        jev: the ids of ``systemone`` whose deployment serves the Jev schema.
    """

    listener: str = ""
    api_keys: tuple[str, ...] = ()
    systemone: tuple[str, ...] = ()
    runtime: tuple[str, ...] = ()
    jev: tuple[str, ...] = ()


class Refusal(Exception):
    """An answer other than the worker's: status, code, error type, extra headers.

    Attributes:
        error_type: Jev's ``detail.error_type``, when every listener gives it (a 401);
            ``None``: only a Jev listener does, and it is the code.
        invalid: Jev's validation entries (``loc``, ``msg``, ``type``) of a request that
            is not valid: a Jev listener answers 422 with them; others ignore them.
    """

    def __init__(
        self,
        status: int,
        code: str,
        kind: str,
        headers: Mapping[str, str] | None = None,
        *,
        error_type: str | None = None,
        invalid: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(code)
        self.status, self.code, self.kind = status, code, kind
        self.headers = dict(headers or {})
        self.error_type = error_type
        self.invalid = invalid


def error_body(code: str, kind: str, error_type: str | None = None) -> dict[str, Any]:
    """``{"error": {"code", "type", "message"}}``; the message is the code in words. With
    ``error_type``, Jev's ``"detail": {"error_type", "message"}`` too."""
    message = code.replace("_", " ")
    body: dict[str, Any] = {"error": {"code": code, "type": kind, "message": message}}
    if error_type is not None:
        body["detail"] = {"error_type": error_type, "message": message}
    return body


def error_response(
    status: int,
    code: str,
    kind: str,
    headers: Mapping[str, str] | None = None,
    *,
    error_type: str | None = None,
) -> Response:
    return _error(status, error_body(code, kind, error_type), headers)


def validation_response(
    code: str, kind: str, entries: list[dict[str, Any]], headers: Mapping[str, str] | None = None
) -> Response:
    """Jev's 422: ``{"error": {code, type, message}, "detail": [{"loc", "msg", "type"}]}``."""
    body = {**error_body(code, kind), "detail": entries}
    return _error(422, body, headers)


def _error(status: int, body: dict[str, Any], headers: Mapping[str, str] | None = None) -> Response:
    content = json.dumps(body, ensure_ascii=False, separators=COMPACT).encode()
    return Response(
        content,
        status_code=status,
        media_type="application/json",
        headers={**NO_STORE, **(headers or {})},
    )


def validation_entry(loc: list[str | int], msg: str, kind: str) -> list[dict[str, Any]]:
    """One validation entry, as a list."""
    return [{"loc": loc, "msg": msg, "type": kind}]


def _cut(text: str) -> str:
    return text if len(text) <= MAX_DETAIL_TEXT else text[:MAX_DETAIL_TEXT]


def detail_entries(body: Any) -> list[dict[str, Any]]:
    """The well-formed entries of a worker's 422 ``detail``, rebuilt from ``loc``, ``msg``
    and ``type`` alone: ``loc`` a non-empty list of text and integers whose first part is
    ``"body"``, ``msg`` and ``type`` text; at most :data:`MAX_DETAIL_ENTRIES` of them,
    ``loc`` cut to :data:`MAX_DETAIL_LOC` parts and every text to
    :data:`MAX_DETAIL_TEXT` characters. Nothing else of an entry is kept."""
    detail = body.get("detail") if isinstance(body, dict) else None
    entries: list[dict[str, Any]] = []
    for item in detail if isinstance(detail, list) else ():
        if len(entries) == MAX_DETAIL_ENTRIES:
            break
        if not isinstance(item, dict):
            continue
        loc, msg, kind = item.get("loc"), item.get("msg"), item.get("type")
        if not (isinstance(loc, list) and loc[:1] == ["body"]):
            continue
        if not (isinstance(msg, str) and isinstance(kind, str)):
            continue
        parts: list[str | int] = []
        for part in loc[:MAX_DETAIL_LOC]:
            if isinstance(part, str):
                parts.append(_cut(part))
            elif isinstance(part, int) and not isinstance(part, bool) and abs(part) < 2**53:
                parts.append(part)
            else:
                break
        else:
            entries.append({"loc": parts, "msg": _cut(msg), "type": _cut(kind)})
    return entries


def _retry_headers(err: PoolError) -> dict[str, str]:
    return {"retry-after": str(err.retry_after)} if err.retry_after is not None else {}


class Listener:
    """One listener's app (:attr:`app`) over the pools it may reach.

    Args:
        grant: what the listener publishes.
        pools: the pools by public id (read on every request, so a new configuration
            generation may replace them in place).
        timeout: seconds a request waits for its worker.
        max_request_bytes: the largest body read (413 ``request_too_large`` beyond).
    """

    def __init__(
        self,
        grant: Grant,
        pools: Mapping[str, ReplicaPool],
        *,
        timeout: float = TIMEOUT_SECONDS,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        chat: ListenerChat | None = None,
    ) -> None:
        self.grant = grant
        self.pools = pools
        self.chat = chat
        self.timeout = timeout
        self.max_request_bytes = max_request_bytes
        self._keys = tuple(key.encode() for key in grant.api_keys)
        self._stopping = False
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.app = self._build()

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def inflight(self) -> int:
        """Requests being answered now."""
        return self._inflight

    def stop(self) -> None:
        """Answer every new request 503; the ones in flight finish."""
        self._stopping = True

    async def drained(self) -> None:
        """Wait until no request is in flight (after :meth:`stop`, until all finished)."""
        await self._idle.wait()

    # -- what the grant publishes ---------------------------------------------------------------
    def systemone_models(self) -> list[str]:
        """The System One ids of the grant that name a deployment, in grant order, once."""
        return [m for m in dict.fromkeys(self.grant.systemone) if m in self.pools]

    @property
    def jev(self) -> bool:
        """Whether this is a Jev listener: it publishes System One models and every one of
        them serves the Jev schema."""
        published = self.systemone_models()
        return bool(published) and all(m in self.grant.jev for m in published)

    def alias_target(self) -> str | None:
        """The public id ``jev-latest`` names here: the grant's one System One model, or,
        of several, the one serving the Jev schema; ``None`` when that is not one model
        (or the grant publishes ``jev-latest`` itself)."""
        if JEV_ALIAS in self.grant.systemone:
            return None
        published = self.systemone_models()
        if len(published) == 1:
            return published[0]
        jev = [m for m in published if m in self.grant.jev]
        return jev[0] if len(jev) == 1 else None

    # -- checks ------------------------------------------------------------------------------
    def authorized(self, request: Request) -> bool:
        """Whether the request presents one of the listener's keys (always, with none).

        Every presented key is compared with every listener key in constant time, with no
        early exit, so the time taken says nothing of which key came close.
        """
        if not self._keys:
            return True
        presented: list[bytes] = []
        scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            presented.append(token.strip().encode())
        api_key = request.headers.get("api-key", "").strip()
        if api_key:
            presented.append(api_key.encode())
        matched = False
        for candidate in presented:
            for key in self._keys:
                matched |= hmac.compare_digest(candidate, key)
        return matched

    def _admit(self, request: Request, published: Sequence[str], kind: str) -> None:
        unavailable = "systemone_unavailable" if kind == SYSTEMONE else "runtime_unavailable"
        if self._stopping:
            raise Refusal(503, unavailable, kind, {"retry-after": "1"})
        if not published:
            code = "systemone_not_published" if kind == SYSTEMONE else "runtime_not_published"
            raise Refusal(404, code, kind)
        if not self.authorized(request):
            raise Refusal(
                401,
                "invalid_api_key",
                kind,
                {"www-authenticate": REALM},
                error_type=AUTHENTICATION_ERROR,
            )

    async def _read(self, request: Request, kind: str) -> tuple[bytes, dict[str, Any]]:
        """The body's bytes and its JSON object."""
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_request_bytes:
            raise Refusal(413, "request_too_large", kind)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_request_bytes:
                raise Refusal(413, "request_too_large", kind)
            chunks.append(chunk)
        raw = b"".join(chunks)
        try:
            body = json.loads(raw.decode())
        except (ValueError, RecursionError) as err:  # not UTF-8, not JSON, nested too deeply
            entries = validation_entry(["body"], "the body is not JSON text", "json_invalid")
            raise Refusal(400, "invalid_request", kind, invalid=entries) from err
        if not isinstance(body, dict):
            entries = validation_entry(["body"], "the body must be a JSON object", "dict_type")
            raise Refusal(400, "invalid_request", kind, invalid=entries)
        return raw, body

    def _pool(self, model: Any, granted: Sequence[str], kind: str) -> ReplicaPool:
        if not isinstance(model, str) or not model.strip():
            if model is None:
                entries = validation_entry(["body", "model"], "model is required", "missing")
            elif not isinstance(model, str):
                entries = validation_entry(["body", "model"], "model must be text", "string_type")
            else:
                entries = validation_entry(
                    ["body", "model"], "model must not be blank", "value_error"
                )
            raise Refusal(400, "model_required", kind, invalid=entries)
        if kind == SYSTEMONE and model == JEV_ALIAS and model not in granted:
            model = self.alias_target() or model
        if model not in granted:
            raise Refusal(403, "model_not_allowed", kind)
        pool = self.pools.get(model)
        if pool is None:
            raise Refusal(404, "model_not_found", kind)
        return pool

    async def _exchange(
        self, pool: ReplicaPool, surface: str, path: str, raw: bytes, kind: str
    ) -> Reply:
        unavailable = "systemone_unavailable" if kind == SYSTEMONE else "runtime_unavailable"
        try:
            return await pool.exchange(surface, path, raw, timeout=self.timeout)
        except Overloaded as err:
            raise Refusal(429, "overloaded", kind, _retry_headers(err)) from err
        except TooLarge as err:
            raise Refusal(413, "request_too_large", kind) from err
        except BadReply as err:
            raise Refusal(502, "invalid_runtime_response", kind) from err
        except PoolError as err:
            raise Refusal(503, unavailable, kind, _retry_headers(err)) from err
        except ValueError as err:  # checked already; a body the scanner refuses
            raise Refusal(400, "invalid_request", kind) from err

    def _failed(self, reply: Reply, kind: str) -> Refusal:
        """A worker's non-2xx answer as the listener's own (same status, no worker text;
        a Jev listener keeps a 422's well-formed validation entries)."""
        code = "systemone_request_failed"
        if kind == RUNTIME:
            worker = _error_code(reply.json())
            code = worker if worker in RUNTIME_ERROR_CODES else "runtime_request_failed"
        headers = (
            {"retry-after": reply.headers["retry-after"]} if "retry-after" in reply.headers else {}
        )
        if kind == SYSTEMONE and reply.status == 422 and self.jev:
            entries = detail_entries(reply.json()) or validation_entry(
                ["body"], "the request is not valid", "value_error"
            )
            return Refusal(422, "invalid_request", kind, headers, invalid=entries)
        return Refusal(reply.status, code, kind, headers)

    def refused(self, refusal: Refusal) -> Response:
        """The answer to ``refusal``: on a Jev listener's System One routes (and the
        routes it does not have), Jev's 422 for an invalid request, else the error with
        Jev's ``detail``; elsewhere the error, with ``detail`` only when the refusal always
        carries it (a 401)."""
        jev = refusal.kind == SYSTEMONE and self.jev
        if jev and refusal.invalid is not None:
            return validation_response(refusal.code, refusal.kind, refusal.invalid, refusal.headers)
        error_type = refusal.error_type or (refusal.code if jev else None)
        return error_response(
            refusal.status, refusal.code, refusal.kind, refusal.headers, error_type=error_type
        )

    def model_list(self) -> list[dict[str, str]]:
        """Jev's model list: each System One id of the grant that names a deployment, then
        ``jev-latest`` when it names one of them (with that model's description and
        date)."""
        listed = [{"name": m, **self._listing(m)} for m in self.systemone_models()]
        target = self.alias_target()
        if target is not None:
            listed.append({"name": JEV_ALIAS, **self._listing(target)})
        return listed

    def _listing(self, model: str) -> dict[str, str]:
        """A model's ``description`` and ``release_date``: from a worker's Jev model list
        (a ready worker's first), else from its card, else ``System One model <id>`` and
        :data:`UNKNOWN_RELEASE_DATE`."""
        pool = self.pools[model]
        workers = sorted(pool.workers, key=lambda w: not w.ready)
        found: dict[str, str] = {}
        for source in [w.listing for w in workers] + [w.card for w in workers]:
            for key in ("description", "release_date"):
                value = (source or {}).get(key)
                if key not in found and isinstance(value, str) and value.strip():
                    if key == "release_date" and not RELEASE_DATE.match(value):
                        continue
                    found[key] = value
        return {
            "description": found.get("description", f"System One model {model}"),
            "release_date": found.get("release_date", UNKNOWN_RELEASE_DATE),
        }

    def runtime_cards(self) -> list[dict[str, Any]]:
        """The model cards of the runtime grant, in grant order, each under its public id:
        the card a ready replica reported (its ``id`` the public one, ``ready`` true), or,
        while no replica is ready, ``{"id", "object": "model", "ready": false}``. A granted
        id with no deployment behind it is left out."""
        cards = []
        for model in self.grant.runtime:
            pool = self.pools.get(model)
            if pool is None:
                continue
            card = next((w.card for w in pool.workers if w.ready and w.card is not None), None)
            if card is None:
                cards.append({"id": model, "object": "model", "ready": False})
            else:
                cards.append({**card, "id": model, "ready": True})
        return cards

    # -- the app -----------------------------------------------------------------------------
    def _build(self) -> FastAPI:
        app = FastAPI(
            title=f"vllm-sr listener {self.grant.listener}".strip(),
            docs_url=None,
            redoc_url=None,
            openapi_url=None,
        )
        app.state.listener = self

        @app.exception_handler(StarletteHTTPException)
        async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
            kind = RUNTIME if _runtime_path(request.url.path) else SYSTEMONE
            if exc.status_code == 405:
                return self.refused(Refusal(405, "method_not_allowed", kind, exc.headers))
            if exc.status_code == 404:
                return self.refused(Refusal(404, "not_found", kind))
            return self.refused(Refusal(exc.status_code, "invalid_request", kind))

        def route(
            path: str, method: str
        ) -> Callable[[Callable[[Request], Awaitable[Response]]], None]:
            def register(handler: Callable[[Request], Awaitable[Response]]) -> None:
                async def endpoint(request: Request) -> Response:
                    self._inflight += 1
                    self._idle.clear()
                    try:
                        return await handler(request)
                    except Refusal as refusal:
                        return self.refused(refusal)
                    except ClientDisconnect:
                        return Response(status_code=499)
                    finally:
                        self._inflight -= 1
                        if self._inflight == 0:
                            self._idle.set()

                app.router.add_route(path, endpoint, methods=[method], include_in_schema=False)

            return register

        @route("/v1/systemone/models", "GET")
        async def systemone_models(request: Request) -> Response:
            self._admit(request, self.grant.systemone, SYSTEMONE)
            data = [
                {"id": model, "object": "model", "api": "systemone", "routing": False}
                for model in self.grant.systemone
                if model in self.pools
            ]
            return _json(200, {"object": "list", "data": data})

        if self.chat is not None:
            chat = self.chat

            @route("/v1/chat/completions", "POST")
            async def chat_completions(request: Request) -> Response:
                return await self._chat(request, chat.completions)

        @route("/v1/models", "GET")
        async def models(request: Request) -> Response:
            if self.chat is not None:  # Router mode: the Chat models
                return await self._chat(request, self.chat.models)
            if not self.grant.systemone:
                self._admit(request, self.grant.runtime, RUNTIME)
                return _json(200, {"object": "list", "data": self.runtime_cards()})
            # A System One grant adds Jev's model list; the cards stay the runtime grant's.
            kind = RUNTIME if self.grant.runtime else SYSTEMONE
            self._admit(request, self.grant.systemone, kind)
            data = self.runtime_cards() if self.grant.runtime else []
            return _json(200, {"object": "list", "data": data, "models": self.model_list()})

        for path in ("/v1/systemone", "/v1/decisions", "/v1/systemone/batch"):
            route(path, "POST")(self._systemone_handler(path))
        for path, surface in RUNTIME_ROUTES.items():
            route(path, "POST")(self._runtime_handler(path, surface))
        route("/v1/bundle", "POST")(self._bundle)
        return app

    async def _chat(
        self, request: Request, handler: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        """A Chat route: the listener's key checked, OpenAI's error envelope on failure."""
        try:
            if self._stopping:
                raise ChatError(
                    503,
                    "unavailable",
                    "the router is shutting down; retry",
                    headers={"retry-after": "1"},
                )
            if not self.authorized(request):
                raise unauthorized()
            return await handler(request)
        except ChatError as err:
            return err.response()

    def _systemone_handler(self, path: str) -> Callable[[Request], Awaitable[Response]]:
        async def handler(request: Request) -> Response:
            self._admit(request, self.grant.systemone, SYSTEMONE)
            raw, body = await self._read(request, SYSTEMONE)
            model = body.get("model")
            if (
                isinstance(model, str)
                and model.strip()
                and body.get("routing") not in (None, False)
            ):
                raise Refusal(400, "systemone_routing_not_supported", SYSTEMONE)
            pool = self._pool(model, self.grant.systemone, SYSTEMONE)
            reply = await self._exchange(pool, "decisions", path, raw, SYSTEMONE)
            if not 200 <= reply.status < 300:
                raise self._failed(reply, SYSTEMONE)
            if len(reply.content) > MAX_SYSTEMONE_RESPONSE_BYTES:
                raise Refusal(502, "invalid_runtime_response", SYSTEMONE)
            return _raw(reply.status, reply.content)

        return handler

    def _runtime_handler(self, path: str, surface: str) -> Callable[[Request], Awaitable[Response]]:
        async def handler(request: Request) -> Response:
            self._admit(request, self.grant.runtime, RUNTIME)
            raw, body = await self._read(request, RUNTIME)
            pool = self._pool(body.get("model"), self.grant.runtime, RUNTIME)
            reply = await self._exchange(pool, surface, path, raw, RUNTIME)
            if not 200 <= reply.status < 300:
                raise self._failed(reply, RUNTIME)
            return _raw(reply.status, reply.content)

        return handler

    # -- bundles -----------------------------------------------------------------------------
    async def _bundle(self, request: Request) -> Response:
        """Each task to its model's pool (tasks of one pool sent together, at most the
        pool's bundle cap at once); results in task order, each with its own status."""
        self._admit(request, self.grant.runtime, RUNTIME)
        raw, body = await self._read(request, RUNTIME)
        text = raw.decode()
        tasks = body.get("tasks")
        if not isinstance(tasks, list) or not tasks:
            raise Refusal(400, "invalid_request", RUNTIME)
        found = jsontext.document(text)
        tasks_span = jsontext.member(found, "tasks")
        assert tasks_span is not None  # tasks is a non-empty list
        spans = jsontext.elements(text, tasks_span[0])[0]
        # Every other member goes with each part as the client wrote it.
        rest = "".join(
            f",{json.dumps(key, ensure_ascii=False)}:{text[start:end]}"
            for key, start, end in found
            if key != "tasks"
        )
        results: list[str | None] = [None] * len(tasks)
        groups: dict[str, list[int]] = {}
        for index, task in enumerate(tasks):
            surfaces = [k for k in TASK_SURFACES if isinstance(task, dict) and k in task]
            if (
                not isinstance(task, dict)
                or not isinstance(task.get("id"), str)
                or len(surfaces) != 1
                or not isinstance(task[surfaces[0]], dict)
            ):
                raise Refusal(400, "invalid_request", RUNTIME)
            try:
                pool = self._pool(task[surfaces[0]].get("model"), self.grant.runtime, RUNTIME)
            except Refusal as refusal:
                results[index] = _task_error(task["id"], refusal.status, refusal.code)
                continue
            groups.setdefault(pool.public_name, []).append(index)
        sends = []
        for public, indices in groups.items():
            pool = self.pools[public]
            cap = max(1, pool.bundle_limit)
            for at in range(0, len(indices), cap):
                chunk = indices[at : at + cap]
                parts = [text[spans[i][0] : spans[i][1]] for i in chunk]
                sub = '{"tasks":[' + ",".join(parts) + "]" + rest + "}"
                sends.append(self._bundle_part(pool, chunk, sub, tasks, results))
        await asyncio.gather(*sends)
        content = '{"results":[' + ",".join(r or "null" for r in results) + "]}"
        return _raw(200, content.encode())

    async def _bundle_part(
        self,
        pool: ReplicaPool,
        chunk: list[int],
        raw: str,
        tasks: list[Any],
        results: list[str | None],
    ) -> None:
        if pool.metrics is not None:
            pool.metrics.bundle(pool.deployment, len(chunk))
        try:
            reply = await self._exchange(pool, "bundle", "/v1/bundle", raw.encode(), RUNTIME)
        except Refusal as refusal:
            for i in chunk:
                results[i] = _task_error(tasks[i]["id"], refusal.status, refusal.code)
            return
        if not 200 <= reply.status < 300:
            failed = self._failed(reply, RUNTIME)
            for i in chunk:
                results[i] = _task_error(tasks[i]["id"], failed.status, failed.code)
            return
        answered = _bundle_results(reply.content.decode())
        if answered is None or len(answered) != len(chunk):
            for i in chunk:
                results[i] = _task_error(tasks[i]["id"], 502, "invalid_runtime_response")
            return
        for i, result in zip(chunk, answered, strict=True):
            results[i] = result


def _runtime_path(path: str) -> bool:
    return path in RUNTIME_ROUTES or path in ("/v1/bundle", "/v1/models")


def _json(status: int, body: Any) -> Response:
    return _raw(status, json.dumps(body, ensure_ascii=False, separators=COMPACT).encode())


def _raw(status: int, content: bytes) -> Response:
    return Response(content, status_code=status, media_type="application/json", headers=NO_STORE)


def _error_code(body: Any) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else ""


def _task_error(task_id: str, status: int, code: str) -> str:
    body = {"id": task_id, "status": status, **error_body(code, RUNTIME)}
    return json.dumps(body, ensure_ascii=False)


def _bundle_results(text: str) -> list[str] | None:
    """A worker bundle answer's results, each as its JSON text; a result's error keeps
    its code but never its message. ``None`` when the answer has no results list."""
    try:
        span = jsontext.member(jsontext.document(text), "results")
        if span is None or text[span[0]] != "[":
            return None
        pieces = []
        for start, end in jsontext.elements(text, span[0])[0]:
            piece = text[start:end]
            result = json.loads(piece)
            if isinstance(result, dict) and "error" in result:
                code = _error_code(result)
                code = code if code in RUNTIME_ERROR_CODES else "runtime_request_failed"
                result["error"] = error_body(code, RUNTIME)["error"]
                piece = json.dumps(result, ensure_ascii=False)
            pieces.append(piece)
        return pieces
    except ValueError:
        return None


def listener_app(
    grant: Grant,
    pools: Mapping[str, ReplicaPool],
    *,
    timeout: float = TIMEOUT_SECONDS,
    max_request_bytes: int = MAX_REQUEST_BYTES,
) -> FastAPI:
    """The FastAPI app of one listener (its :class:`Listener` is ``app.state.listener``)."""
    return Listener(grant, pools, timeout=timeout, max_request_bytes=max_request_bytes).app
