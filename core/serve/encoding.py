"""Request bodies sent compressed (``Content-Encoding``), read back within the body limit.

The Jev SDK (``typesafe-sdk``) compresses every body of 1 KiB or more with zstd where
Python can (3.14, or its ``zstd`` extra); other clients send gzip. ``zstd``, ``gzip``
and ``deflate`` are read, each through a decompressor that stops at the body limit, so a
small compressed body cannot expand past ``--max-request-bytes`` (a decompression bomb
is 413, never memory). zstd comes from the standard library's ``compression.zstd``
(3.14) or its backport ``backports.zstd``.
"""

from __future__ import annotations

import importlib
import zlib
from typing import Any

from .requests import ApiError

ENCODINGS = ("zstd", "gzip", "deflate", "identity")
"""The ``Content-Encoding`` values a body may be sent with."""


def _zstd() -> Any:
    try:
        zstd = importlib.import_module("compression.zstd")  # Python 3.14
    except ImportError:
        zstd = importlib.import_module("backports.zstd")
    return zstd


def decoded_body(raw: bytes, encoding: str | None, limit: int) -> bytes:
    """``raw`` decompressed as ``encoding`` says (no encoding, or ``identity``: as it is).

    Raises:
        ApiError: 413 ``request_too_large`` when the decoded body is over ``limit`` bytes;
            400 ``invalid_request`` for an encoding not in :data:`ENCODINGS`, several
            encodings, or bytes that are not what the encoding says.
    """
    name = (encoding or "identity").strip().lower()
    if name in ("", "identity"):
        return raw
    if "," in name or name not in ENCODINGS:
        raise ApiError(
            "invalid_request",
            f"Content-Encoding {encoding!r} is not read here; send the body as it is, or "
            "compressed with one of zstd, gzip, deflate",
        )
    try:
        if name == "zstd":
            decompressor = _zstd().ZstdDecompressor()
            body = bytes(decompressor.decompress(raw, max_length=limit + 1))
            whole = decompressor.eof
        else:
            wbits = 31 if name == "gzip" else 15
            inflater = zlib.decompressobj(wbits)
            body = inflater.decompress(raw, limit + 1)
            whole = inflater.eof
    except Exception as err:  # zlib.error, ZstdError: each codec raises its own kind
        raise ApiError(
            "invalid_request", f"the body is not valid {name} data ({type(err).__name__})"
        ) from err
    if len(body) > limit:
        raise ApiError("request_too_large", f"the body is over {limit} bytes once decompressed")
    if not whole:
        raise ApiError("invalid_request", f"the {name} body ends before its data does")
    return body
