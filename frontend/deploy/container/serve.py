"""``vllm-sr serve MODEL... | --models FILE`` without ``-e``: the serve flags made into
one :class:`~.command.EngineContainer`, then its image, then the run."""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Mapping

from ...config.flags import ENGINE_FLAGS, PLATFORMS, FlagError, check_device
from ...workers.environment import LOG_LEVELS
from .command import IMAGES, EngineContainer
from .diagnose import reach_engine
from .errors import ContainerError
from .foreground import Interrupted, interruptible, start
from .images import ensure_image
from .mounts import (
    Packages,
    check_mountable,
    container_model,
    engine_cache_dir,
    rewrite_models_file,
)
from .probe import ask
from .runtime import PROBE_TIMEOUT_S, ContainerRuntime, detect_runtime, version_says_podman

DEFAULT_HOST = "127.0.0.1"
"""Where the runtime's port is published by default: this machine only."""

DEFAULT_PORT = 8100
"""The host port by default (the runtime's own default port)."""

FRONTEND_ONLY = {
    "config": "--config",
    "replicas": "-dp",
    "device_ids": "--device-ids",
    "startup_timeout": "--startup-timeout",
    "profile": "--runtime-profile",
}
"""Serve flags of the frontend (``-e``) that the engine container does not take."""

REVISION = re.compile(r"[0-9a-fA-F]{40}")


def engine_argv(args: argparse.Namespace) -> list[str]:
    """The engine flags given (``--max-num-seqs`` ...) and ``--systemone-schema`` as
    ``vllm-srun serve`` words (the runtime takes both under the same names)."""
    words: list[str] = []
    for name in ENGINE_FLAGS:
        value = getattr(args, name, None)
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            words.append(flag if value else "--no-" + flag[2:])
        else:
            words += [flag, str(value)]
    schema = getattr(args, "systemone_schema", None)
    if schema is not None:
        words += ["--systemone-schema", schema]
    return words


def check_flags(args: argparse.Namespace) -> None:
    """Refuse what the engine container cannot do.

    Raises:
        ContainerError: frontend-only flags, MODEL with ``--models``, a ``--revision``
            for several models or a malformed one, a ``--device`` the image does not run,
            or a GPU platform on macOS (code ``bad_flag``).
    """
    for name, flag in FRONTEND_ONLY.items():
        if getattr(args, name, None) is not None:
            raise ContainerError(
                f"{flag} applies to the frontend (vllm-sr serve -e); the engine container "
                "(vllm-sr serve MODEL... without -e) serves its MODEL arguments or --models",
                "bad_flag",
            )
    if args.model and args.models:
        raise ContainerError("give MODEL arguments or --models, not both", "bad_flag")
    if args.host is not None:
        try:
            ipaddress.IPv4Address(args.host)
        except ValueError:
            raise ContainerError(
                f"--host must be an IPv4 address of this machine (127.0.0.1, 0.0.0.0, ...), "
                f"not {args.host!r}: the container's port is published on it",
                "bad_flag",
            ) from None
    for model in args.model or ():
        _, at, revision = model.partition("@")
        if at and not os.path.exists(model) and not REVISION.fullmatch(revision):
            raise ContainerError(
                f"MODEL {model}: the revision after @ must be a 40-hex commit", "bad_flag"
            )
    if args.revision is not None:
        if args.models or len(args.model) != 1:
            raise ContainerError(
                "--revision applies to a single MODEL; use MODEL@REVISION for several",
                "bad_flag",
            )
        if not REVISION.fullmatch(args.revision):
            raise ContainerError(
                f"--revision must be a 40-hex commit, not {args.revision!r}", "bad_flag"
            )
    if args.device is not None:
        try:
            check_device(args.device, args.platform)
        except FlagError as err:
            raise ContainerError(str(err), "bad_flag") from None
    if sys.platform == "darwin" and PLATFORMS[args.platform] != "cpu":
        raise ContainerError(
            "macOS runs --platform cpu only: no container there reaches a GPU", "bad_flag"
        )


def plan_container(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    runtime: ContainerRuntime,
    *,
    uid: int | None = None,
    gid: int | None = None,
    workdir: str | None = None,
) -> EngineContainer:
    """The engine container the flags describe (nothing is run; the models file copy
    is written into ``workdir``, a fresh temporary directory when ``None``).

    Raises:
        ContainerError: see :func:`check_flags` and
            :func:`~.mounts.rewrite_models_file`.
    """
    check_flags(args)
    packages = Packages()
    models = [container_model(m, packages) for m in args.model]
    models_file = None
    if args.models:
        made = (lambda: workdir) if workdir else None
        models_file = rewrite_models_file(args.models, args.platform, packages, directory=made)
    extra = engine_argv(args)
    if args.revision is not None:
        extra += ["--revision", args.revision.lower()]
    if args.offline:
        extra.append("--offline")
    cache = str(engine_cache_dir(environ))
    check_mountable(cache, "the engine cache", "set VLLM_SR_ENGINE_CACHE_DIR to a path without ':'")
    return EngineContainer(
        runtime=runtime,
        image=args.image or IMAGES[PLATFORMS[args.platform]],
        platform=args.platform,
        host=args.host or DEFAULT_HOST,
        port=args.port or DEFAULT_PORT,
        cache=cache,
        models=models,
        models_file=models_file,
        packages=packages.mounts,
        runtime_args=extra,
        device=args.device or "auto",
        log_level=LOG_LEVELS[args.log_level],
        environ=environ,
        uid=uid,
        gid=gid,
    )


def serve_container(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """Run the engine container for ``vllm-sr serve`` until it stops.

    Returns:
        0 after a requested stop (SIGINT/SIGTERM), 128 + N after signal N before the
        container ran (the probes and the pull stopped, one line said), else the
        container CLI's status.

    Raises:
        ContainerError: any refusal of the steps above, with its code.
    """
    check_flags(args)
    try:
        with interruptible():
            return _serve(args, environ)
    except Interrupted as stop:
        name = signal.Signals(stop.signum).name
        print(
            f"vllm-sr: {name} before the engine container started: stopped, nothing runs",
            file=sys.stderr,
            flush=True,
        )
        return 128 + stop.signum


def _serve(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    # The two probes (--version, the server's version) share one bound.
    deadline = time.monotonic() + PROBE_TIMEOUT_S

    def left() -> float:
        return deadline - time.monotonic()

    runtime = detect_runtime(
        args.container_runtime,
        environ,
        says_podman=lambda executable: version_says_podman(executable, left()),
    )
    reach_engine(runtime, environ, run=lambda argv: ask(argv, left()))
    getuid = getattr(os, "getuid", None)
    getgid = getattr(os, "getgid", None)
    # The models file's copy lives as long as the container: removed when it stops.
    with tempfile.TemporaryDirectory(prefix="vllm-sr-engine-") as workdir:
        container = plan_container(
            args,
            environ,
            runtime,
            uid=getuid() if getuid else None,
            gid=getgid() if getgid else None,
            workdir=workdir,
        )
        os.makedirs(container.cache, exist_ok=True)
        ensure_image(
            runtime,
            container.image,
            args.image_pull_policy or "always",
            environ=environ,
            accelerator=PLATFORMS[args.platform],
        )
        return start(container)
