"""The HTTP/1.1 client the frontend reaches one worker with, over a Unix socket or TCP.

Every exchange with a worker (health probes, cards, the requests the pool forwards)
goes through a :class:`WorkerClient`, so the library underneath shows nowhere else.
That library is aiohttp: the frontend spends its CPU on this hop more than on anything
else, and on the 2-core reference machine aiohttp's client costs 0.20 ms of CPU per
exchange against 1.02 ms for ``httpx.AsyncClient`` over the same socket (1,500
sequential ``/v1/systemone`` exchanges each; ``bench/results/frontend.md``), a gap
larger than the whole 1 ms the frontend may add.

Connections are kept alive and reused, with no limit of their own: the replica pool
already bounds what one worker has in flight. An idle connection is dropped after
:data:`KEEPALIVE_SECONDS`, before the worker's own keep-alive timeout (uvicorn's 5 s)
closes it: a request never goes out on a connection the worker is closing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

KEEPALIVE_SECONDS = 4.0
"""How long an idle connection to a worker is kept for reuse (under uvicorn's default
``timeout_keep_alive`` of 5 s, which ``vllm-srun serve`` keeps)."""


class ConnectFailed(Exception):
    """No connection to the worker could be made: the request never left."""


class ExchangeBroken(Exception):
    """The connection broke (or the answer was unreadable) after the request may have
    reached the worker."""


class ExchangeTimedOut(Exception):
    """No whole answer within the exchange's timeout."""


@dataclass
class WireReply:
    """One worker answer, read whole.

    Attributes:
        status: the HTTP status.
        headers: the response headers, names lower-case (a repeated header keeps its
            last value).
        content: the body's bytes.
    """

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    content: bytes = b""

    def json(self) -> Any:
        """The body decoded as JSON.

        Raises:
            ValueError: the body is not JSON (or not UTF-8).
        """
        return json.loads(self.content)


def _split(endpoint: str) -> tuple[str | None, str]:
    """``(socket path or None, base URL)`` of ``endpoint``.

    Raises:
        ValueError: a scheme other than unix, http or https, or a relative socket path.
    """
    parts = urlsplit(endpoint)
    if parts.scheme == "unix":
        if not parts.path.startswith("/"):
            raise ValueError(f"endpoint {endpoint!r}: unix:// needs an absolute socket path")
        return parts.path, "http://worker"
    if parts.scheme in ("http", "https"):
        return None, endpoint.rstrip("/")
    raise ValueError(f"endpoint {endpoint!r} must use unix://, http:// or https://")


class WorkerClient:
    """Keep-alive HTTP/1.1 exchanges with the worker at ``endpoint``.

    Args:
        endpoint: ``unix:///abs.sock``, ``http://host:port`` or ``https://host:port``.

    Raises:
        ValueError: an endpoint of another scheme, or a relative socket path.

    The session is opened on the first exchange (it belongs to the running event loop)
    and closed by :meth:`aclose`.
    """

    def __init__(self, endpoint: str) -> None:
        self._socket, self._base = _split(endpoint)
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector: aiohttp.BaseConnector
            if self._socket is not None:
                connector = aiohttp.UnixConnector(
                    path=self._socket, limit=0, keepalive_timeout=KEEPALIVE_SECONDS
                )
            else:
                connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_SECONDS)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
            )
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> WireReply:
        """Send one request and read its whole answer.

        Args:
            method: ``GET`` or ``POST``.
            path: the absolute path (``/v1/systemone``).
            content: the body's bytes (sent as they are).
            headers: request headers.
            timeout: seconds for the whole exchange; ``None`` waits as long as it takes
                (callers bound it themselves).

        Raises:
            ConnectFailed: no connection could be made (the request never left).
            ExchangeBroken: the connection broke after the request may have left.
            ExchangeTimedOut: no whole answer within ``timeout``.
        """
        session = self._open()
        try:
            async with asyncio.timeout(timeout):
                async with session.request(
                    method, self._base + path, data=content, headers=headers
                ) as response:
                    body = await response.read()
                    kept = {name.lower(): value for name, value in response.headers.items()}
                    return WireReply(status=response.status, headers=kept, content=body)
        except TimeoutError as err:
            raise ExchangeTimedOut(f"no answer within {timeout:g} s") from err
        except aiohttp.ClientConnectorError as err:
            raise ConnectFailed("nothing accepts connections at the endpoint") from err
        except (aiohttp.ClientError, OSError) as err:
            raise ExchangeBroken(f"the exchange broke off ({type(err).__name__})") from err

    async def get(self, path: str, *, timeout: float | None = None) -> WireReply:
        """``GET path`` (see :meth:`request`)."""
        return await self.request("GET", path, timeout=timeout)

    async def post(
        self,
        path: str,
        content: bytes,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> WireReply:
        """``POST path`` with ``content`` (see :meth:`request`)."""
        return await self.request("POST", path, content=content, headers=headers, timeout=timeout)

    async def aclose(self) -> None:
        """Close the session and its connections (a later exchange opens a new one)."""
        if self._session is not None:
            await self._session.close()
            self._session = None
