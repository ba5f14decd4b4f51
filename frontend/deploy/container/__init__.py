"""The foreground engine container: ``vllm-sr serve MODEL... | --models FILE`` (no ``-e``).

It runs ``vllm-srun serve`` inside the platform's image with Docker or Podman, in
the foreground, published on ``--host:--port`` (127.0.0.1:8100), until Ctrl-C.

Modules: :mod:`.runtime` (which container CLI, and whether it is Podman),
:mod:`.probe` (bounded calls in their own process group, output decoded whatever its bytes),
:mod:`.diagnose` (the engine probed before the run, its failures named by cause),
:mod:`.mounts` (the model cache, local packages and the models file, their paths
inside the container), :mod:`.command` (the ``run`` argv: GPU pass-through, the
environment by name), :mod:`.images` (presence by ``image inspect``, the pull
policy), :mod:`.foreground` (the leftover-container check, the run, its signals
and exit status) and :mod:`.serve` (the serve flags into one run); every refusal is a
:class:`~.errors.ContainerError` with a ``code``.
"""

from __future__ import annotations

from .errors import ContainerError

__all__ = ["ContainerError"]
