"""Request bodies read within a size limit (a listener's routes, Chat, the configuration
API): nothing past the limit is read into memory; and whether a text they carried can be
written on as UTF-8."""

from __future__ import annotations

from starlette.requests import Request


class BodyTooLarge(Exception):
    """A body over the limit (its ``Content-Length`` said so, or more bytes came)."""


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body of ``request``, at most ``limit`` bytes.

    Raises:
        BodyTooLarge: ``Content-Length`` is over ``limit``, or more than ``limit`` bytes
            arrive (reading stops there).
        ClientDisconnect: the client left while it was sent.
    """
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise BodyTooLarge(f"the body is over {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"the body is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def is_utf8(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8: a JSON ``\\ud800`` escape without its
    pair parses into a lone surrogate, which no UTF-8 text (an answer, a metrics label)
    can carry."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
