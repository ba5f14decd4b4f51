"""The overlay's content, :class:`ClusterOverlay`: the frontend's ``config.yaml``, the
container ``args`` and the ``kustomization.yaml`` with its patches over the bases, for one
of two layouts:

- managed (the default, as the deployment guide describes): the router pod ``vllm-sr``
  runs MODEL... itself as managed deployments of its ``config.yaml`` (``device: cuda:0``,
  ``rocm:0`` or ``cpu``), on the platform's image, with the GPU (``nvidia.com/gpu`` or
  ``amd.com/gpu``) in that pod's limits;
- shared (``--shared-runtime``): the runtime Deployment ``model-runtime`` serves MODEL...
  behind its Service, and the frontend attaches to it by
  ``http://model-runtime.<namespace>.svc.cluster.local:8100``.

Nothing here reads flags or touches files (:mod:`.flags`, :mod:`.write`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from ...workers.environment import LOG_LEVELS
from .checks import Model

FRONTEND_DEPLOYMENT = "vllm-sr"
"""The frontend (router) Deployment and Service of ``deploy/kubernetes/frontend``."""

FRONTEND_CLAIM = "vllm-sr-models"
"""The frontend pod's model volume claim."""

CONFIG_MAP = "vllm-sr-config"
"""The frontend's ConfigMap (``config.yaml`` at ``/etc/vllm-sr``)."""

CONFIG_PATH = "/etc/vllm-sr/config.yaml"

LISTENER_PORT = 8899
"""The frontend's listener (its Service's port ``http``)."""

RUNTIME_DEPLOYMENT = "model-runtime"
"""The runtime Deployment (and Service) of ``deploy/kubernetes/runtime``."""

RUNTIME_CLAIM = "model-runtime-models"
"""The runtime pod's model volume claim."""

RUNTIME_PORT = 8100
"""The runtime container's port (the Service's too)."""

CACHE_DIR = "/app/models/model-runtime"
"""The runtime's ``--cache-dir``: on the model volume (the PersistentVolumeClaim)."""

DEFAULT_NAMESPACE = "vllm-sr"
"""The overlay's namespace without ``--namespace``."""

DEFAULT_STORAGE = "10Gi"
"""The model volume claim's size without ``--storage`` (the bases' size)."""

IMAGE = "ghcr.io/vllm-project/semantic-router/vllm-sr"
"""The CPU image; the GPU images add ``-rocm`` or ``-cuda``."""

GPU_RESOURCES = {"rocm": "amd.com/gpu", "cuda": "nvidia.com/gpu"}
"""The extended resource (and taint) of each GPU platform's device plugin."""

ROCM_GROUPS = (44, 109)
"""The supplementary groups of a ROCm pod: ``video`` (44 on Debian and Ubuntu) and
``render`` (109 on Ubuntu 22.04; it varies by node), which own ``/dev/kfd`` and
``/dev/dri`` (the Docker path adds ``--group-add video``)."""


@dataclass
class ClusterOverlay:
    """The overlay's content.

    Attributes:
        platform: ``cpu``, ``rocm`` or ``cuda`` (accelerator names).
        models: MODEL... (the first is the default decision deployment ``primary``).
        namespace: the namespace the overlay creates and puts everything in.
        shared_runtime: the runtime Deployment serves the models and the frontend attaches
            to its Service (else the frontend pod runs them itself).
        device: the models' device (default ``cpu``, ``rocm:0`` or ``cuda:0``: the pod's
            one GPU).
        image: another image for the pod that runs the models, or ``None`` for the
            platform's.
        storage: the size of that pod's model volume claim.
        engine_args: the engine flags given, by config key (``max_num_seqs`` ...).
        systemone_schema: ``--systemone-schema``, or ``None``.
        offline: load only installed or cached models.
        log_level: ``--log-level`` as given (the runtime gets its own spelling).
        create_namespace: the overlay holds the Namespace object (so ``kubectl delete
            -k`` deletes it); false with ``--existing-namespace`` and for ``default`` and
            ``kube-*``.
    """

    platform: str
    models: list[Model]
    namespace: str = DEFAULT_NAMESPACE
    shared_runtime: bool = False
    device: str | None = None
    image: str | None = None
    storage: str = DEFAULT_STORAGE
    engine_args: dict[str, Any] = field(default_factory=dict)
    systemone_schema: str | None = None
    offline: bool = False
    log_level: str = "info"
    create_namespace: bool = True

    @property
    def model_device(self) -> str:
        """The device the models run on."""
        return self.device or ("cpu" if self.platform == "cpu" else f"{self.platform}:0")

    @property
    def model_image(self) -> str:
        """The image of the pod that runs the models."""
        suffix = "" if self.platform == "cpu" else f"-{self.platform}"
        return self.image or f"{IMAGE}{suffix}:latest"

    def runtime_endpoint(self) -> str:
        """The runtime Service's URL from any namespace."""
        return f"http://{RUNTIME_DEPLOYMENT}.{self.namespace}.svc.cluster.local:{RUNTIME_PORT}"

    def listener_url(self) -> str:
        """The frontend Service's listener URL from any namespace."""
        return f"http://{FRONTEND_DEPLOYMENT}.{self.namespace}.svc.cluster.local:{LISTENER_PORT}"

    def runtime_args(self) -> list[str]:
        """The runtime container's ``args`` (its command is ``vllm-srun``; shared layout)."""
        words: list[str] = []
        for name, value in self.engine_args.items():
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                words.append(flag if value else "--no-" + flag[2:])
            else:
                words += [flag, str(value)]
        if self.systemone_schema:
            words += ["--systemone-schema", self.systemone_schema]
        return [
            "serve",
            *(m.argument for m in self.models),
            "--device",
            self.model_device,
            *words,
            *(["--offline"] if self.offline else []),
            "--host",
            "0.0.0.0",
            "--port",
            str(RUNTIME_PORT),
            "--cache-dir",
            CACHE_DIR,
            "--log-level",
            LOG_LEVELS[self.log_level],
        ]

    def frontend_args(self) -> list[str]:
        """The frontend container's ``args`` (its command is ``vllm-sr``)."""
        offline = ["--offline"] if self.offline and not self.shared_runtime else []
        return ["serve", "-e", "--config", CONFIG_PATH, "--log-level", self.log_level, *offline]

    def deployment_names(self) -> list[str]:
        """Each model's deployment key: ``primary``, then the repository's name."""
        names: list[str] = []
        for index, model in enumerate(self.models):
            name = "primary" if index == 0 else model.name.rsplit("/", 1)[-1].lower()
            while name in names:
                name += f"-{index + 1}"
            names.append(name)
        return names

    def frontend_config(self) -> dict[str, Any]:
        """The frontend's ``config.yaml``: Engine mode, a deployment per model (managed on
        :attr:`model_device`, or attached to the runtime Service), the first the default
        decision deployment; the listener ``http`` on 0.0.0.0:8899 publishes the first on
        the System One API and every model on the runtime API."""
        deployments: dict[str, Any] = {}
        for key, model in zip(self.deployment_names(), self.models, strict=True):
            deployment: dict[str, Any] = {"provider": "model_runtime", "artifact": model.name}
            if self.shared_runtime:
                deployment["endpoint"] = self.runtime_endpoint()
                deployment["served_name"] = model.name
            else:
                if model.revision:
                    deployment["revision"] = model.revision
                deployment["device"] = self.model_device
                deployment.update(self.engine_args)
            if self.systemone_schema:
                deployment["systemone_schema"] = self.systemone_schema
            deployments[key] = deployment
        return {
            "global": {
                "router": {"enabled": False},
                "model_catalog": {
                    "deployments": deployments,
                    "system": {"decision_model": {"deployment": "primary"}},
                },
            },
            "listeners": [
                {
                    "name": "http",
                    "address": "0.0.0.0",
                    "port": LISTENER_PORT,
                    "systemone": {"models": [self.models[0].name]},
                    "runtime": {"models": [m.name for m in self.models]},
                }
            ],
        }

    def images(self) -> list[dict[str, str]]:
        """The ``images:`` entries: each image the overlay runs, at its tag (``latest``
        for the platform's images), for ``kustomize edit set image`` to pin."""
        used = [f"{IMAGE}:latest"] if self.shared_runtime else []
        used.append(self.model_image)
        entries: list[dict[str, str]] = []
        for image in dict.fromkeys(used):
            reference, _, digest = image.partition("@")
            slash = reference.rfind("/")
            colon = reference.rfind(":")
            name, tag = (
                (reference[:colon], reference[colon + 1 :])
                if colon > slash
                else (reference, "" if digest else "latest")
            )
            entry = {"name": name}
            if digest:
                entry["digest"] = digest
            if tag:
                entry["newTag"] = tag
            entries.append(entry)
        return entries

    def kustomization(self) -> dict[str, Any]:
        """The ``kustomization.yaml`` document over the bases copied under ``base/``."""
        patches: list[dict[str, Any]] = []
        frontend_ops: list[dict[str, Any]] = [_replace("containers/0/args", self.frontend_args())]
        if self.shared_runtime:
            resources = [f"base/overlays/{self.platform}"]
            runtime_ops = [_replace("containers/0/args", self.runtime_args())]
            if self.image:
                runtime_ops.append(_replace("containers/0/image", self.image))
            patches.append(_patch("apps", "Deployment", RUNTIME_DEPLOYMENT, runtime_ops))
            # The attached frontend downloads nothing: /app/models is a small emptyDir
            # and the base's claim vllm-sr-models is left out.
            patches.append({"patch": FRONTEND_WITHOUT_CLAIM})
            patches.append({"patch": DELETE_FRONTEND_CLAIM})
            claim = RUNTIME_CLAIM
        else:
            resources = ["base/frontend"]
            frontend_ops.append(_replace("containers/0/image", self.model_image))
            gpu = GPU_RESOURCES.get(self.platform)
            if gpu:
                frontend_ops += [
                    {
                        "op": "add",
                        "path": "/spec/template/spec/containers/0/resources/limits/"
                        + gpu.replace("/", "~1"),
                        "value": 1,
                    },
                    {
                        "op": "add",
                        "path": "/spec/template/spec/tolerations",
                        "value": [{"key": gpu, "operator": "Exists", "effect": "NoSchedule"}],
                    },
                    # One GPU per pod: a rolling update would need a second free GPU.
                    {"op": "add", "path": "/spec/strategy", "value": {"type": "Recreate"}},
                ]
                if self.platform == "rocm":
                    frontend_ops.append(
                        {
                            "op": "add",
                            "path": "/spec/template/spec/securityContext/supplementalGroups",
                            "value": list(ROCM_GROUPS),
                        }
                    )
            claim = FRONTEND_CLAIM
        frontend = _patch("apps", "Deployment", FRONTEND_DEPLOYMENT, frontend_ops)
        if self.platform == "rocm" and not self.shared_runtime:
            frontend["patch"] = ROCM_GROUPS_NOTE + frontend["patch"]
        patches.insert(0, frontend)
        storage = {"op": "replace", "path": "/spec/resources/requests/storage"}
        patches.append(
            _patch("", "PersistentVolumeClaim", claim, [{**storage, "value": self.storage}])
        )
        return {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "namespace": self.namespace,
            "resources": [*(["namespace.yaml"] if self.create_namespace else []), *resources],
            "configMapGenerator": [
                {"name": CONFIG_MAP, "behavior": "replace", "files": ["config.yaml"]}
            ],
            "patches": patches,
        }


FRONTEND_WITHOUT_CLAIM = f"""apiVersion: apps/v1
kind: Deployment
metadata:
  name: {FRONTEND_DEPLOYMENT}
spec:
  template:
    spec:
      volumes:
        - name: models
          persistentVolumeClaim: null
          emptyDir:
            sizeLimit: 1Gi
"""
"""The attached frontend's ``/app/models``: an emptyDir instead of the claim."""


DELETE_FRONTEND_CLAIM = f"""$patch: delete
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {FRONTEND_CLAIM}
"""
"""Leaves the frontend base's claim out of the shared layout."""


ROCM_GROUPS_NOTE = (
    "# supplementalGroups: video (44) and render (109) own /dev/kfd and /dev/dri on most\n"
    "# Debian and Ubuntu nodes, but the gids vary by node: check `getent group video render`\n"
    "# there and change them if they differ.\n"
)


def _replace(path: str, value: Any) -> dict[str, Any]:
    return {"op": "replace", "path": f"/spec/template/spec/{path}", "value": value}


def _patch(group: str, kind: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
    target = {"group": group, "version": "v1", "kind": kind, "name": name}
    if not group:
        del target["group"]
    return {"target": target, "patch": yaml.safe_dump(ops, sort_keys=False)}
