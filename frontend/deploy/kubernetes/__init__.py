"""``vllm-sr serve --target kubernetes --platform cpu|rocm|cuda [--namespace NS] MODEL...``:
a self-contained kustomize overlay that serves MODEL..., and the ``kubectl apply -k``
command.

Modules, each one step: :mod:`.checks` (a MODEL's name and pinned revision, ``--storage``,
``--image``), :mod:`.flags` (the serve flags into an overlay, the other targets' flags
refused), :mod:`.overlay` (:class:`~.overlay.ClusterOverlay`: the frontend's
``config.yaml``, the containers' ``args`` and the patches of either layout) and
:mod:`.write` (the bases copied under ``OUT/base`` and checked, the files written beside
``OUT`` and renamed into place). The bases themselves ship as package data,
``manifests/`` (``deploy/kubernetes`` of a checkout). Every refusal is a
:class:`~.errors.TargetError` with a ``code``.
"""

from __future__ import annotations

from .checks import BUILTIN_MODELS, Model, check_image, check_model_name
from .errors import TargetError
from .flags import DEFAULT_OUTPUT, KUBERNETES_ONLY, output_path, overlay_from_args
from .overlay import DEFAULT_NAMESPACE, ClusterOverlay
from .write import shipped_manifests, write_overlay

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_NAMESPACE",
    "DEFAULT_OUTPUT",
    "KUBERNETES_ONLY",
    "ClusterOverlay",
    "Model",
    "TargetError",
    "check_image",
    "check_model_name",
    "output_path",
    "overlay_from_args",
    "shipped_manifests",
    "write_overlay",
]
