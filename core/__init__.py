"""vllm-srun: a model runtime for semantic routers, composed from plugins.

The runtime core lives here: the registry, placement, loading, the scheduler,
golden self-checks, the serve layer and the CLI (docs/architecture.md lists
every module). Plugin authors import only :mod:`vllm_srun.plugins`.
"""

from vllm_srun._version import __version__

__all__ = ["__version__"]
