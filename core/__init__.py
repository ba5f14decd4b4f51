"""vllm-srun: a model runtime for semantic routers, composed from plugins.

The runtime core lives here (placement, CLI; later the registry, lifecycle,
scheduler and serve layer). Plugin authors import only
:mod:`vllm_srun.plugins`.
"""

from vllm_srun._version import __version__

__all__ = ["__version__"]
