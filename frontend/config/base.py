"""What every mapping of ``config.yaml`` is built on: strict pydantic models and
problems reported in the operator's words."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticCustomError

REDACTED = "<redacted>"
"""What the configuration API (``GET /api/v1/config``, ``vllm-sr config get``) shows
instead of a credential. The API puts the saved credential back where a written document
keeps it; anywhere else it is a placeholder, never a credential (:func:`placeholder`)."""


def placeholder(where: str, value: str) -> PydanticCustomError | None:
    """The problem of a credential ``value`` (at ``where``) holding :data:`REDACTED`, or
    ``None``: a document shown by the configuration API and then read as it is (at start,
    on SIGHUP) would otherwise make the placeholder, a text everyone knows, the key."""
    if REDACTED not in value:
        return None
    return problem(
        f"{where} holds {REDACTED}, the placeholder the configuration API shows instead of "
        "a credential, not a credential: write the credential itself (only a document "
        "applied through the configuration API gets the saved one back there)"
    )


def problem(message: str) -> PydanticCustomError:
    """A validation error whose message is ``message`` as written (no prefix added)."""
    return PydanticCustomError("vllm_sr_config", message)


class Strict(BaseModel):
    """A mapping of the configuration: unknown keys refused, values never coerced."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=False)
