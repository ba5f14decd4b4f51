"""The ``vllm-sr`` command (being built: issue 14)."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Run ``vllm-sr``; the exit status."""
    raise SystemExit("vllm-sr: the frontend is not built yet")
