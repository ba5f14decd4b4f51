"""Responses and request accounting shared by every route."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, cast

import orjson
from starlette.responses import Response

from vllm_srun.plugins.loaded import Answered
from vllm_srun.plugins.requests import EmbeddingsRequest, SurfaceRequest
from vllm_srun.plugins.responses import EmbeddingError, EmbeddingsResponse
from vllm_srun.service.metrics import Metrics
from vllm_srun.service.runtime import Runtime
from vllm_srun.service.timing import Timing

from .requests import ApiError, requested_model

CLIENT_CLOSED = 499
"""Status recorded for a request whose client went away (nginx's "client closed request")."""

SURFACE_OF_PATH = {
    "/v1/embeddings": "embeddings",
    "/v1/classify": "classify",
    "/v1/rerank": "rerank",
    "/v1/decisions": "decisions",
    "/v1/systemone": "decisions",
    "/v1/systemone/batch": "decisions",
    "/v1/bundle": "bundle",
}
"""The ``surface`` label of requests refused before their route ran (400, 413)."""


class JSON(Response):
    """A JSON response rendered with orjson (no NaN can appear: families refuse it first)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        """Serialise ``content``.

        orjson refuses a lone surrogate (a client may send ``"\\ud800"`` as a
        key or a name that comes back in an answer or an error message); the
        standard encoder then writes it as the same ``\\ud800`` escape.
        """
        try:
            return orjson.dumps(content)
        except TypeError:
            return json.dumps(content, ensure_ascii=True, allow_nan=False).encode("ascii")


def respond(
    status: int, body: Any, timing: Timing | None = None, extra: Mapping[str, str] | None = None
) -> JSON:
    """A JSON response with any ``extra`` headers and, given ``timing``, ``Server-Timing``:
    the time spent encoding ``body`` is its ``serialize`` phase, and the header
    is written once the body is encoded (so ``total`` covers it)."""
    started = time.perf_counter()
    response = JSON(body, status_code=status, headers=extra)
    if timing is not None:
        timing.add("serialize", time.perf_counter() - started)
        response.headers["server-timing"] = timing.header()
    return response


UNUSABLE_INPUT = ("invalid_input", "max_length_exceeded", "scan_budget_exceeded")
"""Item errors that say the client's input cannot be used (a 400 in OpenAI's plain form)."""

SDK_OVERFLOW = (
    '; from the OpenAI SDK, send options as extra_body={"options": {"overflow": "truncate"}}'
)
"""How a plain request's client sends ``options.overflow``: OpenAI's SDKs have no such
argument, and pass unknown fields only through ``extra_body``."""


def plain_embeddings_refusal(request: SurfaceRequest, body: Answered) -> ApiError | None:
    """The request-level error OpenAI gives where our contract answers an item error.

    An embeddings request in OpenAI's plain form (no ``options``) is answered
    the way OpenAI answers it: an unusable input fails the whole request with
    400 ``invalid_request`` naming the item and the limit, ``param: "input"``
    (OpenAI clients read every ``embedding`` as a vector and would hand their
    caller ``None``); an input over the limit is told how to send
    ``options.overflow`` from the OpenAI SDK (:data:`SDK_OVERFLOW`). Any other
    failed item is a 500. With ``options`` (the runtime contract), and in
    bundles (never an OpenAI client), item errors stay in their place.

    Args:
        request: the typed request.
        body: the answer, ``data`` holding one entry per input.
    """
    if not isinstance(request, EmbeddingsRequest) or not request.plain or "data" not in body:
        return None
    failed = [item for item in cast(EmbeddingsResponse, body)["data"] if "error" in item]
    if not failed:
        return None
    first = cast(EmbeddingError, failed[0])
    more = f" (and {len(failed) - 1} more inputs)" if len(failed) > 1 else ""
    if first["error"] in UNUSABLE_INPUT:
        hint = SDK_OVERFLOW if first["error"] == "max_length_exceeded" else ""
        message = f"input[{first['index']}]: {first['message']}{more}{hint}"
        return ApiError("invalid_request", message, "input")
    return ApiError("internal_error", f"input[{first['index']}]: {first['message']}{more}")


class Accounting:
    """Counts every answered request in ``/metrics`` under a served model's ID.

    Args:
        runtime: the models; a request naming none of them counts as ``-``
            (or as the only model, when one is served), never as text the
            client chose.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.metrics: Metrics = runtime.metrics

    def model_label(self, payload: Any) -> str:
        """A request's ``model`` label: a served model's ID, never text the client chose."""
        name = requested_model(payload)
        if name is None and len(self.runtime.models) == 1:
            return next(iter(self.runtime.models))
        return name if name in self.runtime.models else "-"

    def count(self, name: str, surface: str, status: int, seconds: float) -> None:
        """One request of ``surface`` answered ``status`` after ``seconds``."""
        self.metrics.requests.labels(model=name, surface=surface, status=str(status)).inc()
        self.metrics.request_duration.labels(model=name, surface=surface).observe(seconds)

    def refused(self, path: str, status: int, seconds: float) -> None:
        """Count a request answered before its route ran (a bad body, one too large)."""
        surface = SURFACE_OF_PATH.get(path)
        if surface is not None:
            self.count(self.model_label({}), surface, status, seconds)
