"""``vllm-sr``: the frontend that owns listeners, API keys and configuration, starts and
supervises ``vllm-srun`` workers (one process per replica), spreads requests over them and
tells operators what runs.

It reaches every worker, managed or attached, only over HTTP or a Unix socket, exactly
as it would reach a runtime on another host: nothing here imports ``vllm_srun``.
"""

from __future__ import annotations

from ._version import __version__

__all__ = ["API_MAJOR", "__version__"]

API_MAJOR = "2"
"""The runtime contract major this frontend speaks; a worker reporting another
``api_version`` major is ``incompatible``."""
