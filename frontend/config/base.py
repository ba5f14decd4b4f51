"""What every mapping of ``config.yaml`` is built on: strict pydantic models and
problems reported in the operator's words."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticCustomError


def problem(message: str) -> PydanticCustomError:
    """A validation error whose message is ``message`` as written (no prefix added)."""
    return PydanticCustomError("vllm_sr_config", message)


class Strict(BaseModel):
    """A mapping of the configuration: unknown keys refused, values never coerced."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=False)
