"""The serve flags of ``--target kubernetes`` into a :class:`~.overlay.ClusterOverlay`:
the flags of the other targets refused, each MODEL checked and pinned, the namespace,
device, storage and image checked; and ``--output`` as a path."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from ...config.flags import ENGINE_FLAGS, PLATFORMS, FlagError, check_device
from ...names import looks_local
from .checks import check_image, check_model_name, check_storage, pin
from .errors import TargetError
from .overlay import DEFAULT_NAMESPACE, DEFAULT_STORAGE, ClusterOverlay

NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""A DNS-1123 label (Kubernetes namespace names)."""

SYSTEM_NAMESPACE = re.compile(r"default|kube-.*")
"""Namespaces a cluster has of its own: the overlay never creates (so never deletes) them."""

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
