"""``vllm-sr serve --target kubernetes --platform cpu|rocm|cuda [--namespace NS] MODEL...``:
a kustomize overlay that serves MODEL on the runtime Deployment of the platform's overlay
(``deploy/kubernetes/overlays/<platform>``), and the ``kubectl apply -k`` command.

The overlay is a directory with one ``kustomization.yaml`` (and a ``namespace.yaml``
with ``--namespace``); it refers to the checkout's manifests by a relative path, so
``kubectl kustomize`` renders it where it was written.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .config.flags import PLATFORMS, FlagError, check_device
from .container.serve import engine_argv
from .workers.plan import LOG_LEVELS

RUNTIME_DEPLOYMENT = "model-runtime"
"""The runtime Deployment (and Service) of ``deploy/kubernetes/runtime``."""

RUNTIME_PORT = 8100
"""The runtime container's port (the Service's too)."""

CACHE_DIR = "/app/models/model-runtime"
"""The runtime's ``--cache-dir``: on the model volume (the PersistentVolumeClaim)."""

NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""A DNS-1123 label (Kubernetes namespace names)."""

DOCKER_ONLY = {
    "image_pull_policy": "--image-pull-policy",
    "container_runtime": "--container-runtime",
    "startup_timeout": "--startup-timeout",
    "host": "--host",
    "port": "--port",
}
"""Serve flags of the local container that the Kubernetes target refuses."""

NOT_ON_KUBERNETES = {
    "config": "--config (the frontend's configuration is the ConfigMap of "
    "deploy/kubernetes/frontend)",
    "replicas": "-dp (the runtime Deployment scales by its replicas and HorizontalPodAutoscaler)",
    "device_ids": "--device-ids (the cluster allocates GPUs: amd.com/gpu or nvidia.com/gpu)",
    "profile": "--runtime-profile",
    "models": "--models (name the models as MODEL arguments)",
}
"""Serve flags the Kubernetes target has no use for, and why."""


class _Dumper(yaml.SafeDumper):
    """YAML with multi-line strings (the patch) as literal blocks."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


class TargetError(Exception):
    """The overlay cannot be written as asked; the message says why and what to do.

    Attributes:
        code: ``bad_flag``, ``no_manifests`` or ``local_model``.
    """

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class RuntimeOverlay:
    """The overlay's content.

    Attributes:
        platform: ``cpu``, ``rocm`` or ``cuda`` (accelerator names).
        models: MODEL arguments (Hub repositories or built-in names, ``@REVISION`` allowed).
        namespace: the namespace, or ``None`` for the one ``kubectl`` uses.
        device: the runtime's ``--device`` (default ``cpu``, ``rocm:0`` or ``cuda:0``:
            the pod's one GPU).
        image: another image for the runtime, or ``None`` for the overlay's.
        extra: more ``vllm-srun serve`` words (engine arguments, ``--revision``,
            ``--offline``).
        log_level: the runtime's ``--log-level``.
    """

    platform: str
    models: list[str]
    namespace: str | None = None
    device: str | None = None
    image: str | None = None
    extra: list[str] = field(default_factory=list)
    log_level: str = "info"

    def runtime_args(self) -> list[str]:
        """The runtime container's ``args`` (its command is ``vllm-srun``)."""
        device = self.device or ("cpu" if self.platform == "cpu" else f"{self.platform}:0")
        return [
            "serve",
            *self.models,
            "--device",
            device,
            *self.extra,
            "--host",
            "0.0.0.0",
            "--port",
            str(RUNTIME_PORT),
            "--cache-dir",
            CACHE_DIR,
            "--log-level",
            self.log_level,
        ]

    def kustomization(self, base: str) -> dict[str, Any]:
        """The ``kustomization.yaml`` document, ``base`` the relative path of the
        platform overlay."""
        ops: list[dict[str, Any]] = [
            {
                "op": "replace",
                "path": "/spec/template/spec/containers/0/args",
                "value": self.runtime_args(),
            }
        ]
        if self.image:
            ops.append(
                {
                    "op": "replace",
                    "path": "/spec/template/spec/containers/0/image",
                    "value": self.image,
                }
            )
        doc: dict[str, Any] = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
        }
        if self.namespace:
            doc["namespace"] = self.namespace
        doc["resources"] = [*(["namespace.yaml"] if self.namespace else []), base]
        doc["patches"] = [
            {
                "target": {
                    "group": "apps",
                    "version": "v1",
                    "kind": "Deployment",
                    "name": RUNTIME_DEPLOYMENT,
                },
                "patch": yaml.safe_dump(ops, sort_keys=False),
            }
        ]
        return doc


def overlay_from_args(args: argparse.Namespace) -> RuntimeOverlay:
    """The overlay the serve flags ask for.

    Raises:
        TargetError: a flag of the local container or of the frontend, no MODEL, a
            local package directory (a cluster cannot mount it), a bad namespace, or a
            ``--device`` the platform's image does not run (code ``bad_flag`` or
            ``local_model``).
    """
    for name, flag in DOCKER_ONLY.items():
        if getattr(args, name, None) is not None:
            raise TargetError(f"{flag} applies to the docker target", "bad_flag")
    for name, what in NOT_ON_KUBERNETES.items():
        if getattr(args, name, None) is not None:
            raise TargetError(f"--target kubernetes does not take {what}", "bad_flag")
    if args.engine:
        raise TargetError(
            "--target kubernetes writes the runtime's overlay for MODEL...; the frontend "
            "(-e) has its own base, deploy/kubernetes/frontend",
            "bad_flag",
        )
    if not args.model:
        raise TargetError(
            "--target kubernetes needs at least one MODEL (a Hub repository or built-in "
            "model name, MODEL@REVISION to pin it)",
            "bad_flag",
        )
    for model in args.model:
        if not model or model != model.strip():
            raise TargetError("MODEL must be a non-empty, trimmed artifact", "bad_flag")
        if Path(model).expanduser().is_dir():
            raise TargetError(
                f"MODEL {model} is a local directory, which a cluster cannot mount; push it "
                "to a Hub repository, or build an image that holds it and pass --image",
                "local_model",
            )
    namespace = args.namespace
    if namespace is not None and not NAMESPACE.fullmatch(namespace):
        raise TargetError(
            f"--namespace {namespace!r} is not a DNS-1123 label (lower-case letters, digits "
            "and '-', at most 63)",
            "bad_flag",
        )
    platform = PLATFORMS[args.platform]
    if args.device is not None:
        try:
            check_device(args.device, args.platform)
        except FlagError as err:
            raise TargetError(str(err), "bad_flag") from None
    extra = engine_argv(args)
    if args.revision is not None:
        if len(args.model) != 1:
            raise TargetError(
                "--revision applies to a single MODEL; use MODEL@REVISION for several", "bad_flag"
            )
        extra += ["--revision", args.revision]
    if args.offline:
        extra.append("--offline")
    return RuntimeOverlay(
        platform=platform,
        models=list(args.model),
        namespace=namespace,
        device=args.device,
        image=args.image,
        extra=extra,
        log_level=LOG_LEVELS[args.log_level],
    )


def write_overlay(overlay: RuntimeOverlay, output: Path, manifests: Path) -> Path:
    """Write the overlay into ``output`` (created) over
    ``manifests/overlays/<platform>``; the ``kustomization.yaml`` written.

    Raises:
        TargetError: ``manifests`` lacks the platform overlay (code ``no_manifests``).
    """
    base = manifests / "overlays" / overlay.platform
    if not (base / "kustomization.yaml").is_file():
        raise TargetError(
            f"no kustomize overlay at {base}: run from a vllm-srun checkout's top folder or "
            "pass --manifests DIR (its deploy/kubernetes)",
            "no_manifests",
        )
    output.mkdir(parents=True, exist_ok=True)
    relative = os.path.relpath(base.resolve(), output.resolve())
    if overlay.namespace:
        namespace = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": overlay.namespace},
        }
        (output / "namespace.yaml").write_text(yaml.safe_dump(namespace, sort_keys=False))
    else:
        (output / "namespace.yaml").unlink(missing_ok=True)
    target = output / "kustomization.yaml"
    target.write_text(
        "# Written by vllm-sr serve --target kubernetes; render: kubectl kustomize "
        f"{output}\n" + yaml.dump(overlay.kustomization(relative), Dumper=_Dumper, sort_keys=False)
    )
    return target
