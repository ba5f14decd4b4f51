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
back). An error answer carries the code, a message (the code in words, or, where the
listener knows the fix, the fix: a route no grant publishes names the grant to add; a
model outside the grant lists the grant's models) and OpenAI's ``param``. A worker's
error text never reaches a client, but for the runtime routes' ``invalid_request`` and
``unsupported_surface`` (:data:`~.refusals.PASSED_MESSAGES`), whose message tells the
client what is wrong with its own request. Every refusal the listener answers itself
writes an access line (``vllm_sr.access``); a worker writes its own. Every answer says
``Cache-Control: no-store``. A 401 carries, beside ``error``, Jev's ``detail:
{"error_type": "authentication_error", "message"}`` on every listener.

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

Why one module of 600-odd lines: it is one :class:`Listener` (450 of them), whose System
One, runtime, bundle and Chat routes share one path: the publication read once and
counted in flight, the admission (stopping, grant, api key), the body read, a pool's
failures as refusals, and the answer in the listener's own or Jev's shapes; what follows
the class (the Chat fast path, a bundle's per-task results, the JSON answers) is the
small glue it serves through.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .. import pages
from ..bodies import BodyTooLarge, is_utf8, read_body
from ..pool import jsontext
from ..pool.pool import BadReply, Overloaded, PoolError, ReplicaPool, TooLarge
from ..pool.transport import TASK_SURFACES, Reply
from ..router.chat import ChatError, ListenerChat, unauthorized
from .published import Grant, Published
from .refusals import (
    AUTHENTICATION_ERROR,
    COMPACT,
    NO_STORE,
    RUNTIME,
    RUNTIME_ERROR_CODES,
    SYSTEMONE,
    Refusal,
    detail_entries,
    error_body,
    error_response,
    log_refusal,
    not_published,
    passed_message,
    validation_entry,
    validation_response,
)

REALM = 'Bearer realm="vllm-semantic-router"'
TIMEOUT_SECONDS = 30.0
"""How long a request waits for its worker's answer."""

MAX_REQUEST_BYTES = 48 * 1024 * 1024
"""The largest request body a listener reads (System One questions may carry images)."""

MAX_SYSTEMONE_RESPONSE_BYTES = 4 * 1024 * 1024
"""The largest System One answer passed on (a larger one is ``invalid_runtime_response``)."""

SYSTEMONE_ROUTES = ("/v1/systemone", "/v1/decisions", "/v1/systemone/batch")
"""The routes a ``systemone`` grant publishes (``GET /v1/systemone/models`` and
``GET /v1/models`` too)."""

RUNTIME_ROUTES = {
    "/v1/embeddings": "embeddings",
    "/v1/classify": "classify",
    "/v1/rerank": "rerank",
}
"""The runtime routes a ``runtime`` grant publishes (``/v1/bundle`` and ``GET /v1/models``
too), by surface."""


def _retry_headers(err: PoolError) -> dict[str, str]:
    return {"retry-after": str(err.retry_after)} if err.retry_after is not None else {}


class Listener:
    """One listener's app (:attr:`app`) over what it publishes (:attr:`published`).

    Every request reads :attr:`published` once, when it arrives; :meth:`publish` replaces
    it (a reload), so a request is answered entirely by the generation that admitted it.

    Args:
        grant: what the listener publishes.
        pools: the pools by public id.
        timeout: seconds a request waits for its worker.
        max_request_bytes: the largest body read (413 ``request_too_large`` beyond).
        chat: the Chat routes (Router mode; a listener has them for its whole life).
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
        self.published = Published(grant, pools, chat)
        self._older: list[Published] = []
        self.router_mode = chat is not None
        self.timeout = timeout
        self.max_request_bytes = max_request_bytes
        self._stopping = False
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.fastapi = self._build()
        self.app: ASGIApp = self.fastapi
        """What the listener's server serves: the FastAPI app, behind :class:`ChatFastPath`
        in Router mode."""
        if self.router_mode:
            self.app = ChatFastPath(self.fastapi, self._serve_chat)

    @property
    def grant(self) -> Grant:
        """The grant published now."""
        return self.published.grant

    def publish(self, published: Published) -> None:
        """Serve ``published`` from the next request on (requests in flight finish on the
        one that admitted them).

        Raises:
            ValueError: ``published`` adds or removes the Chat routes (a mode change needs
                a restart).
        """
        if (published.chat is not None) != self.router_mode:
            raise ValueError("the Chat routes come and go with Router mode: restart to change it")
        if published is not self.published:
            self._older.append(self.published)
            self.published = published

    async def retired(self) -> None:
        """Wait until the requests admitted under every earlier publication are answered."""
        older = list(self._older)
        await asyncio.gather(*(p.idle() for p in older))
        self._older = [p for p in self._older if p not in older]

    # -- lifecycle ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def _counted(self, published: Published) -> Iterator[None]:
        """A request in flight: counted by the listener (its drain) and by the
        publication that admitted it (a reload's retirement)."""
        published.enter()
        self._inflight += 1
        self._idle.clear()
        try:
            yield
        finally:
            published.leave()
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()

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

    # -- checks ------------------------------------------------------------------------------
    def _admit(
        self, request: Request, published: Published, granted: Sequence[str], kind: str
    ) -> None:
        unavailable = "systemone_unavailable" if kind == SYSTEMONE else "runtime_unavailable"
        if self._stopping:
            raise Refusal(503, unavailable, kind, {"retry-after": "1"})
        if not granted:
            raise not_published(kind, request.url.path)
        if not published.authorized(request):
            raise Refusal(
                401,
                "invalid_api_key",
                kind,
                {"www-authenticate": REALM},
                error_type=AUTHENTICATION_ERROR,
            )

    async def _read(self, request: Request, kind: str) -> tuple[bytes, dict[str, Any]]:
        """The body's bytes and its JSON object."""
        try:
            raw = await read_body(request, self.max_request_bytes)
        except BodyTooLarge:
            raise Refusal(413, "request_too_large", kind) from None
        try:
            body = json.loads(raw.decode())
        except (ValueError, RecursionError) as err:  # not UTF-8, not JSON, nested too deeply
            entries = validation_entry(["body"], "the body is not JSON text", "json_invalid")
            raise Refusal(400, "invalid_request", kind, invalid=entries) from err
        if not isinstance(body, dict):
            entries = validation_entry(["body"], "the body must be a JSON object", "dict_type")
            raise Refusal(400, "invalid_request", kind, invalid=entries)
        return raw, body

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

    @staticmethod
    def _failed(reply: Reply, kind: str, published: Published) -> Refusal:
        """A worker's non-2xx answer as the listener's own (same status; no worker text
        but a runtime route's :func:`~.refusals.passed_message`; a Jev listener keeps a
        422's well-formed validation entries)."""
        code, message, param = "systemone_request_failed", None, None
        if kind == RUNTIME:
            answer = reply.json()
            worker = _error_code(answer)
            code = worker if worker in RUNTIME_ERROR_CODES else "runtime_request_failed"
            message, param = passed_message(answer)
        headers = (
            {"retry-after": reply.headers["retry-after"]} if "retry-after" in reply.headers else {}
        )
        if kind == SYSTEMONE and reply.status == 422 and published.jev:
            entries = detail_entries(reply.json()) or validation_entry(
                ["body"], "the request is not valid", "value_error"
            )
            return Refusal(422, "invalid_request", kind, headers, invalid=entries, own=False)
        return Refusal(reply.status, code, kind, headers, message=message, param=param, own=False)

    @staticmethod
    def refused(refusal: Refusal, published: Published) -> Response:
        """The answer to ``refusal``: on a Jev listener's System One routes (and the
        routes it does not have), Jev's 422 for an invalid request, else the error with
        Jev's ``detail``; elsewhere the error, with ``detail`` only when the refusal always
        carries it (a 401)."""
        jev = refusal.kind == SYSTEMONE and published.jev
        if jev and refusal.invalid is not None:
            return validation_response(
                refusal.code, refusal.kind, refusal.invalid, refusal.headers, param=refusal.param
            )
        error_type = refusal.error_type or (refusal.code if jev else None)
        return error_response(
            refusal.status,
            refusal.code,
            refusal.kind,
            refusal.headers,
            message=refusal.message,
            param=refusal.param,
            error_type=error_type,
        )

    def _log(self, request: Request, status: int, code: str, started: float) -> None:
        log_refusal(request, status, code, started, self.grant.listener)

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
            started = time.perf_counter()  # routing refused it: nothing ran before
            kind = RUNTIME if _runtime_path(request.url.path) else SYSTEMONE
            published = self.published
            if exc.status_code == 405:
                refusal = Refusal(405, "method_not_allowed", kind, exc.headers)
            elif exc.status_code == 404:
                refusal = Refusal(404, "not_found", kind)
            else:
                refusal = Refusal(exc.status_code, "invalid_request", kind)
            self._log(request, refusal.status, refusal.code, started)
            return self.refused(refusal, published)

        Handler = Callable[[Request, Published], Awaitable[Response]]

        def route(path: str, method: str) -> Callable[[Handler], None]:
            def register(handler: Handler) -> None:
                async def endpoint(request: Request) -> Response:
                    started = time.perf_counter()
                    published = self.published
                    with self._counted(published):
                        try:
                            return await handler(request, published)
                        except Refusal as refusal:
                            if refusal.own:
                                self._log(request, refusal.status, refusal.code, started)
                            return self.refused(refusal, published)
                        except ClientDisconnect:
                            return Response(status_code=499)

                app.router.add_route(path, endpoint, methods=[method], include_in_schema=False)

            return register

        @route("/v1/systemone/models", "GET")
        async def systemone_models(request: Request, published: Published) -> Response:
            self._admit(request, published, published.grant.systemone, SYSTEMONE)
            data = [
                {"id": model, "object": "model", "api": "systemone", "routing": False}
                for model in published.grant.systemone
                if model in published.pools
            ]
            return _json(200, {"object": "list", "data": data})

        if self.router_mode:
            # In the route table for its methods (any other is 405); a served listener's
            # ChatFastPath reaches the same handler before FastAPI's stack.
            app.router.routes.append(
                Route(
                    "/v1/chat/completions",
                    _AsgiEndpoint(self._serve_chat),
                    methods=["POST"],
                    include_in_schema=False,
                )
            )

        @route("/v1/models", "GET")
        async def models(request: Request, published: Published) -> Response:
            grant = published.grant
            if published.chat is not None:  # Router mode: the Chat models
                return await self._chat(request, published, published.chat.models)
            if not grant.systemone:
                self._admit(request, published, grant.runtime, RUNTIME)
                return _json(200, {"object": "list", "data": published.runtime_cards()})
            # A System One grant adds Jev's model list; the cards stay the runtime grant's.
            kind = RUNTIME if grant.runtime else SYSTEMONE
            self._admit(request, published, grant.systemone, kind)
            data = published.runtime_cards() if grant.runtime else []
            return _json(200, {"object": "list", "data": data, "models": published.model_list()})

        for path in SYSTEMONE_ROUTES:
            route(path, "POST")(self._systemone_handler(path))
        for path, surface in RUNTIME_ROUTES.items():
            route(path, "POST")(self._runtime_handler(path, surface))
        route("/v1/bundle", "POST")(self._bundle)

        async def index(request: Request) -> Response:
            """What this listener is and the routes its grant publishes now (no key asked:
            it names routes only, never a model)."""
            published = self.published
            body = pages.listener_document(
                published.grant.listener, self.router_mode, published_routes(published)
            )
            return pages.answer(request, body, pages.LISTENER_LINKS)

        app.router.add_route("/", index, methods=["GET"], include_in_schema=False)
        return app

    async def _serve_chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /v1/chat/completions``, in flight until its answer is sent (a stream to
        its end: a shutdown or a reload waits for it). An exception that escapes the
        handler is logged and answered 500 ``internal_error``."""
        published = self.published
        assert published.chat is not None
        request = Request(scope, receive)
        with self._counted(published):
            try:
                response = await self._chat(request, published, published.chat.completions)
            except ClientDisconnect:
                return  # the client left: nobody to answer
            except Exception:
                logging.getLogger("vllm_sr.router").exception("a Chat request failed")
                failed = ChatError(500, "internal_error", "the router failed; retry")
                self._log(request, failed.status, failed.code, time.perf_counter())
                response = failed.response()
            await response(scope, receive, send)

    async def _chat(
        self,
        request: Request,
        published: Published,
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Response:
        """A Chat route: the listener's key checked, OpenAI's error envelope (and an access
        line) on failure."""
        started = time.perf_counter()
        try:
            if self._stopping:
                raise ChatError(
                    503,
                    "unavailable",
                    "the router is shutting down; retry",
                    headers={"retry-after": "1"},
                )
            if not published.authorized(request):
                raise unauthorized()
            return await handler(request)
        except ChatError as err:
            self._log(request, err.status, err.code, started)
            return err.response()

    def _systemone_handler(self, path: str) -> Callable[[Request, Published], Awaitable[Response]]:
        async def handler(request: Request, published: Published) -> Response:
            granted = published.grant.systemone
            self._admit(request, published, granted, SYSTEMONE)
            raw, body = await self._read(request, SYSTEMONE)
            model = body.get("model")
            if (
                isinstance(model, str)
                and model.strip()
                and body.get("routing") not in (None, False)
            ):
                raise Refusal(400, "systemone_routing_not_supported", SYSTEMONE)
            pool = published.pool(model, granted, SYSTEMONE)
            reply = await self._exchange(pool, "decisions", path, raw, SYSTEMONE)
            if not 200 <= reply.status < 300:
                raise self._failed(reply, SYSTEMONE, published)
            if len(reply.content) > MAX_SYSTEMONE_RESPONSE_BYTES:
                raise Refusal(502, "invalid_runtime_response", SYSTEMONE)
            return _raw(reply.status, reply.content)

        return handler

    def _runtime_handler(
        self, path: str, surface: str
    ) -> Callable[[Request, Published], Awaitable[Response]]:
        async def handler(request: Request, published: Published) -> Response:
            granted = published.grant.runtime
            self._admit(request, published, granted, RUNTIME)
            raw, body = await self._read(request, RUNTIME)
            pool = published.pool(body.get("model"), granted, RUNTIME)
            reply = await self._exchange(pool, surface, path, raw, RUNTIME)
            if not 200 <= reply.status < 300:
                raise self._failed(reply, RUNTIME, published)
            return _raw(reply.status, reply.content)

        return handler

    # -- bundles -----------------------------------------------------------------------------
    async def _bundle(self, request: Request, published: Published) -> Response:
        """Each task to its model's pool (tasks of one pool sent together, at most the
        pool's bundle cap at once); results in task order, each with its own status."""
        granted = published.grant.runtime
        self._admit(request, published, granted, RUNTIME)
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
        groups: dict[str, tuple[ReplicaPool, list[int]]] = {}
        for index, task in enumerate(tasks):
            surfaces = [k for k in TASK_SURFACES if isinstance(task, dict) and k in task]
            if (
                not isinstance(task, dict)
                or not isinstance(task.get("id"), str)
                or len(surfaces) != 1
                or not isinstance(task[surfaces[0]], dict)
            ):
                raise Refusal(400, "invalid_request", RUNTIME)
            if not is_utf8(task["id"]):
                raise Refusal(
                    400,
                    "invalid_request",
                    RUNTIME,
                    message=f"tasks[{index}].id holds a lone surrogate (\\ud800 to \\udfff "
                    "without its pair), which is not text; send the id as valid Unicode",
                    param=f"tasks.{index}.id",
                )
            try:
                pool = published.pool(task[surfaces[0]].get("model"), granted, RUNTIME)
            except Refusal as refusal:
                results[index] = _task_error(task["id"], refusal)
                continue
            groups.setdefault(pool.public_name, (pool, []))[1].append(index)
        sends = []
        for pool, indices in groups.values():
            cap = max(1, pool.bundle_limit)
            for at in range(0, len(indices), cap):
                chunk = indices[at : at + cap]
                parts = [text[spans[i][0] : spans[i][1]] for i in chunk]
                sub = '{"tasks":[' + ",".join(parts) + "]" + rest + "}"
                sends.append(self._bundle_part(pool, chunk, sub, tasks, results, published))
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
        published: Published,
    ) -> None:
        if pool.metrics is not None:
            pool.metrics.bundle(pool.deployment, len(chunk))
        try:
            reply = await self._exchange(pool, "bundle", "/v1/bundle", raw.encode(), RUNTIME)
        except Refusal as refusal:
            for i in chunk:
                results[i] = _task_error(tasks[i]["id"], refusal)
            return
        if not 200 <= reply.status < 300:
            failed = self._failed(reply, RUNTIME, published)
            for i in chunk:
                results[i] = _task_error(tasks[i]["id"], failed)
            return
        answered = _bundle_results(reply.content.decode())
        if answered is None or len(answered) != len(chunk):
            broken = Refusal(502, "invalid_runtime_response", RUNTIME)
            for i in chunk:
                results[i] = _task_error(tasks[i]["id"], broken)
            return
        for i, result in zip(chunk, answered, strict=True):
            results[i] = result


def published_routes(published: Published) -> list[str]:
    """The routes ``published`` answers (``"METHOD /path"``): Chat in Router mode, the
    System One routes with a System One grant, the runtime routes with a runtime grant,
    and ``GET /v1/models`` with any of them."""
    grant = published.grant
    routes = ["POST /v1/chat/completions"] if published.chat is not None else []
    if published.chat is not None or grant.systemone or grant.runtime:
        routes.append("GET /v1/models")
    if grant.systemone:
        routes.append("GET /v1/systemone/models")
        routes += [f"POST {path}" for path in SYSTEMONE_ROUTES]
    if grant.runtime:
        routes += [f"POST {path}" for path in (*RUNTIME_ROUTES, "/v1/bundle")]
    return routes


def _runtime_path(path: str) -> bool:
    return path in RUNTIME_ROUTES or path in ("/v1/bundle", "/v1/models")


class ChatFastPath:
    """A Router-mode listener's ASGI entry: ``POST /v1/chat/completions`` goes straight
    to its handler, every other request to the listener's FastAPI app.

    The Chat route is the router's hot path, and FastAPI's stack (its error, exception,
    exit-stack and routing layers) cost about a sixth of a routed request's CPU while
    adding nothing this route uses: its handler answers every error itself, in OpenAI's
    envelope.

    Args:
        app: the listener's FastAPI app.
        chat: the Chat route's ASGI handler (:meth:`Listener._serve_chat`).
    """

    def __init__(self, app: ASGIApp, chat: ASGIApp) -> None:
        self.app = app
        self.chat = chat

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] != "/v1/chat/completions"
            or scope["method"] != "POST"
        ):
            await self.app(scope, receive, send)
            return
        await self.chat(scope, receive, send)


class _AsgiEndpoint:
    """An ASGI handler as a Starlette route's endpoint: Starlette wraps a function or a
    method as a request-to-response handler, and mounts any other callable as it is."""

    def __init__(self, handler: ASGIApp) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.handler(scope, receive, send)


def _json(status: int, body: Any) -> Response:
    return _raw(status, json.dumps(body, ensure_ascii=False, separators=COMPACT).encode())


def _raw(status: int, content: bytes) -> Response:
    return Response(content, status_code=status, media_type="application/json", headers=NO_STORE)


def _error_code(body: Any) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else ""


def _task_error(task_id: str, refusal: Refusal) -> str:
    body = {
        "id": task_id,
        "status": refusal.status,
        **error_body(refusal.code, RUNTIME, message=refusal.message, param=refusal.param),
    }
    return json.dumps(body, ensure_ascii=False)


def _bundle_results(text: str) -> list[str] | None:
    """A worker bundle answer's results, each as its JSON text; a result's error keeps
    its code, but its message only as :func:`~.refusals.passed_message` allows. ``None``
    when the answer has no results list."""
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
                message, param = passed_message(result)
                result["error"] = error_body(code, RUNTIME, message=message, param=param)["error"]
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
    return Listener(grant, pools, timeout=timeout, max_request_bytes=max_request_bytes).fastapi
