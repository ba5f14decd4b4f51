"""A Chat request sent to its OpenAI-compatible backend, the answer relayed as it comes
(ROUTER-SPEC §2.2, §2.8).

**Headers in.** Hop-by-hop headers (``Connection`` and those it lists), ``Host``,
``Content-Length``, and everything that carries a caller's credential or steers Envoy
are removed: ``Authorization``, ``Api-Key``, ``Cookie``, ``Proxy-Authorization``,
``X-Api-Key``, any name ending ``-api-key`` or ``-token``, ``x-authz-*``, ``x-envoy-*``.
A backend sees only the credential its ``backend_refs`` entry names. ``x-request-id``
(a UUID) is added when absent, and ``x-forwarded-proto``. Everything else goes on
unchanged, in order, repeats kept.

**Answers.** A JSON answer is relayed with its status and content type. A streamed one
(``text/event-stream``) is relayed chunk by chunk as the backend writes it, bytes
untouched (a chunk may end inside a UTF-8 character or an event; nothing is decoded
and re-encoded); a client that hangs up cancels the backend request. A backend that
cannot be reached within :data:`CONNECT_TIMEOUT` is 503 with Envoy's text; one that
sends no headers within the listener's timeout is 504 ``upstream request timeout``; a
stream that stalls that long, or breaks off, ends with an SSE ``error`` event and the
connection closes: never a made-up ``finish_reason`` or ``[DONE]``. Nothing is retried.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

import aiohttp

CONNECT_TIMEOUT = 10.0
"""Seconds to connect to a backend."""

DEFAULT_TIMEOUT = 300.0
"""Seconds a backend may take to send its headers, or pause a stream, when the listener
sets no ``timeout``."""

UNREACHABLE = (
    "upstream connect error or disconnect/reset before headers. reset reason: remote "
    "connection failure"
)
"""Envoy's text for a backend that could not be reached (what clients of the upstream
router read)."""

TIMED_OUT = "upstream request timeout"

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)

CREDENTIALS = frozenset(
    {"authorization", "api-key", "cookie", "x-api-key", "host", "content-length"}
)
"""Request headers never passed on: credentials, and what the router's own request
states anew (``Host``, ``Content-Length``)."""

REPLACED = frozenset({"content-type", "accept-encoding"})
"""Request headers the router sets itself on every backend request: one
``Content-Type: application/json`` (a repeated one makes some servers answer 400), and
``Accept-Encoding: identity`` (the router reads JSON answers and relays streams as they
come; a compressed answer would reach a client that never asked for it)."""

MAX_ANSWER_BYTES = 64 * 1024 * 1024
"""The largest JSON (non-streamed) backend answer relayed; a larger one is 502."""

TOO_LARGE = "upstream answer too large"

CHUNK_BYTES = 64 * 1024


def forwarded_headers(
    incoming: Iterable[tuple[str, str]], *, scheme: str = "http"
) -> list[tuple[str, str]]:
    """The client's headers as the backend receives them (see the module docstring),
    before the backend's own credential and the decision's header changes."""
    pairs = list(incoming)
    listed = {
        token.strip().lower()
        for name, value in pairs
        if name.lower() == "connection"
        for token in value.split(",")
    }
    kept = []
    for name, value in pairs:
        lower = name.lower()
        if (
            lower in HOP_BY_HOP
            or lower in listed
            or lower in CREDENTIALS
            or lower in REPLACED
            or lower.endswith(("-api-key", "-token"))
            or lower.startswith(("x-authz-", "x-envoy-"))
        ):
            continue
        kept.append((name, value))
    names = {name.lower() for name, _ in kept}
    if "x-request-id" not in names:
        kept.append(("x-request-id", str(uuid.uuid4())))
    if "x-forwarded-proto" not in names:
        kept.append(("x-forwarded-proto", scheme))
    kept.append(("accept-encoding", "identity"))
    return kept


class BackendUnreachable(Exception):
    """No connection to the backend (503, :data:`UNREACHABLE`)."""


class BackendTimeout(Exception):
    """No response headers in time (504, :data:`TIMED_OUT`)."""


class BackendTooLarge(Exception):
    """A JSON answer over :data:`MAX_ANSWER_BYTES` (502, :data:`TOO_LARGE`)."""


@dataclass
class Answer:
    """A backend's answer.

    Attributes:
        status: its HTTP status.
        content_type: its ``Content-Type``.
        body: the whole body (JSON answers and every non-2xx answer).
        stream: the body's chunks as they come (a 2xx streamed answer), else ``None``.
        backend_seconds: seconds until the headers arrived.
        content_encoding: its ``Content-Encoding`` (a backend that compressed although
            asked not to), relayed with it; ``""`` for none.
    """

    status: int
    content_type: str
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None
    backend_seconds: float = 0.0
    content_encoding: str = ""


def sse_error(message: str, kind: str = "upstream_error") -> bytes:
    """An SSE event carrying an OpenAI-style error, to end a broken stream with."""
    event = {"error": {"message": message, "type": kind, "code": kind, "param": None}}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


class Backends:
    """The HTTP client every Chat request to a backend goes through (one connection pool)."""

    def __init__(self, connect_timeout: float = CONNECT_TIMEOUT) -> None:
        self.connect_timeout = connect_timeout
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=None, sock_connect=self.connect_timeout, sock_read=None
                ),
                auto_decompress=False,
            )
        return self._session

    async def close(self) -> None:
        """Close every connection."""
        if self._session is not None:
            await self._session.close()

    async def send(
        self,
        url: str,
        headers: list[tuple[str, str]],
        body: bytes,
        *,
        stream: bool,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> Answer:
        """POST ``body`` to ``url`` and return the answer (a 2xx streamed answer as
        chunks still arriving: the caller must consume or close :attr:`Answer.stream`).

        Raises:
            BackendUnreachable: no connection within the connect timeout.
            BackendTimeout: no response headers within ``timeout``.
            BackendTooLarge: a JSON answer over :data:`MAX_ANSWER_BYTES`.
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        request = self._client().post(url, data=body, headers=headers, allow_redirects=False)
        try:
            async with asyncio.timeout(timeout):
                response = await request.__aenter__()
        except TimeoutError as err:
            raise BackendTimeout(TIMED_OUT) from err
        except (aiohttp.ClientError, OSError) as err:  # a connect timeout included
            raise BackendUnreachable(UNREACHABLE) from err
        waited = loop.time() - started
        content_type = response.headers.get("content-type", "application/json")
        encoding = response.headers.get("content-encoding", "")
        encoding = "" if encoding.strip().lower() == "identity" else encoding
        streamed = stream and 200 <= response.status < 300
        if not streamed:
            try:
                async with asyncio.timeout(timeout):
                    content = await _read_limited(response)
            except BackendTooLarge:
                response.close()
                raise
            except TimeoutError as err:
                response.close()
                raise BackendTimeout(TIMED_OUT) from err
            except (aiohttp.ClientError, OSError) as err:
                response.close()
                raise BackendUnreachable(UNREACHABLE) from err
            finally:
                response.release()
            return Answer(response.status, content_type, content, None, waited, encoding)
        relay = _relay(response, timeout)
        return Answer(response.status, content_type, b"", relay, waited, encoding)


async def _read_limited(response: aiohttp.ClientResponse) -> bytes:
    """The whole answer, at most :data:`MAX_ANSWER_BYTES`.

    Raises:
        BackendTooLarge: it says or turns out to be longer.
    """
    length = response.content_length
    if length is not None and length > MAX_ANSWER_BYTES:
        raise BackendTooLarge(TOO_LARGE)
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await response.content.read(CHUNK_BYTES)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise BackendTooLarge(TOO_LARGE)
        chunks.append(chunk)


async def _relay(response: aiohttp.ClientResponse, idle: float) -> AsyncIterator[bytes]:
    """The chunks of a streamed answer as they arrive; a stall of ``idle`` seconds or a
    broken connection ends it with an SSE error event. Closing the iterator (the client
    hung up) closes the backend connection."""
    try:
        while True:
            try:
                async with asyncio.timeout(idle):
                    chunk = await response.content.readany()
            except TimeoutError:
                yield sse_error(TIMED_OUT, "timeout")
                return
            except (aiohttp.ClientError, OSError):
                left = _unread(response)
                if left:
                    yield left
                yield sse_error("the backend closed the stream before it ended")
                return
            if not chunk:
                response.release()  # the whole answer was read: the connection is reusable
                return
            yield chunk
    finally:
        response.close()  # a no-op after release(); drops a connection left mid-answer


def _unread(response: aiohttp.ClientResponse) -> bytes:
    """What a backend sent before it broke off and the relay has not read yet: aiohttp
    raises the break on the next read even while it still holds bytes that came before
    it, and those are the client's too."""
    buffered = getattr(response.content, "_buffer", None)
    try:
        return b"".join(buffered) if buffered else b""
    except TypeError:  # pragma: no cover - another aiohttp's internals
        return b""
