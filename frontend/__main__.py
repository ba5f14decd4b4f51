"""``python -m vllm_sr`` runs the ``vllm-sr`` command."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())
