"""``vllm-sr serve --target kubernetes``: a self-contained kustomize overlay (see
:mod:`.overlay`)."""

from __future__ import annotations
