"""The ``vllm-sr`` command: ``serve``, ``config validate|migrate`` and ``instance``.

``vllm-sr serve [MODEL] -e`` starts the frontend in Engine mode: it applies the
serve flags to the configuration (``--config``, or a fresh one whose default
decision deployment serves the runtime's built-in MiniLM), starts one worker per
replica and serves the native API on the ``http-8899`` listener, the management
API on 127.0.0.1:8080 and the metrics on 127.0.0.1:9190.

``vllm-sr serve MODEL... | --models FILE`` without ``-e`` runs ``vllm-srun serve``
in the foreground in a Docker or Podman container (:mod:`vllm_sr.deploy.container`);
``--target kubernetes`` writes a kustomize overlay instead (:mod:`vllm_sr.deploy.kubernetes`).
Router mode (``serve`` without ``-e`` and without MODEL or ``--models``) does not
exist in this project yet and is refused.

Why one module of 800-odd lines: it is the ``vllm-sr`` command line, each flag declared
with its help and each command's entry turning the flags into calls of the modules that do
the work; ``serve`` is one command with three targets (Engine mode, the container, the
Kubernetes overlay), so its flags and the checks that keep each target's flags from the
others sit together, where apart they would drift.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from . import __version__, config_client
from .config.durations import format_duration, parse_duration
from .config.flags import (
    BOOTSTRAP_ADDRESS,
    BOOTSTRAP_PORT,
    ENGINE_FLAGS,
    PLATFORMS,
    FlagError,
    ServeOptions,
    bootstrap_listener,
    port_offset,
    shift_listener_ports,
)
from .config.in_use import deployments_in_use, managed_in_use, unserved_grants
from .config.schema import (
    DEFAULT_MODEL,
    PROFILE,
    PROFILE_MESSAGE,
    SYSTEMONE_SCHEMAS,
    Config,
    ConfigError,
    load_config,
    migrate_document,
    parse_config,
    read_document,
)
from .workers.environment import LOG_LEVELS, PlanError

ROUTER_MODE_NEEDS_CONFIG = (
    "vllm-sr serve without -e starts Router mode (signals, decisions and Chat routing) "
    "from a configuration: vllm-sr serve --config config.yaml; -e (--engine) starts "
    "Engine mode, which serves the native System One API: vllm-sr serve [MODEL] -e; "
    "vllm-sr serve MODEL... runs the runtime in a foreground container"
)

ROUTER_MODE_NEEDS_BACKENDS = (
    "Router mode needs providers.models with backend_refs (the Chat backends); start with "
    "-e for Engine mode"
)

CONTAINER_ONLY = {
    "models": "--models",
    "host": "--host",
    "port": "--port",
    "image": "--image",
    "image_pull_policy": "--image-pull-policy",
    "container_runtime": "--container-runtime",
}
"""Serve flags of the foreground engine container that the frontend (``-e``) refuses."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-sr",
        description="The vllm-sr frontend: listeners, API keys and configuration in front of "
        "vllm-srun workers it starts and supervises (one process per replica).",
    )
    parser.add_argument("--version", action="version", version=f"vllm-sr {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_serve(commands)
    config = commands.add_parser(
        "config", help="check or migrate a config.yaml; apply one to a running frontend"
    )
    config_commands = config.add_subparsers(dest="config_command", metavar="ACTION")
    validate = config_commands.add_parser("validate", help="check a config.yaml; exit 1 if bad")
    validate.add_argument("file", metavar="FILE", nargs="?", help="the config.yaml to check")
    validate.add_argument(
        "--config", dest="config_file", metavar="FILE", help="the same, as config apply takes it"
    )
    migrate = config_commands.add_parser(
        "migrate", help="print a config.yaml without the removed model execution fields"
    )
    migrate.add_argument("file", metavar="FILE")
    migrate.add_argument("--write", action="store_true", help="rewrite FILE in place")
    config_client.add_commands(config_commands)
    instance = commands.add_parser(
        "instance", help="ask a running frontend (its management API) about itself"
    )
    instance.add_argument(
        "--config",
        metavar="FILE",
        help="its config.yaml (default: the configuration `vllm-sr serve -e` makes without one)",
    )
    instance.add_argument(
        "action",
        choices=("status", "models"),
        help="status: mode, default deployment and phase; models: the published models' "
        "cards and readiness",
    )
    return parser


def _add_serve(commands: Any) -> None:
    serve = commands.add_parser(
        "serve",
        help="start the frontend (-e: Engine mode), or the runtime in a container (MODEL...)",
        description="Start the frontend. -e (--engine) starts Engine mode: the native System "
        "One API on the listeners, answered by managed or attached vllm-srun workers. "
        f"Without MODEL and without --config the default decision deployment `primary` "
        f"serves {DEFAULT_MODEL}, the runtime's built-in MiniLM, which answers System One "
        "questions through its similarity readout; a fresh setup publishes it on the "
        "listener http-8899 (127.0.0.1:8899). Without -e (the docker target), MODEL... or "
        "--models FILE runs "
        "vllm-srun serve in the foreground in a Docker or Podman container published on "
        "--host:--port (127.0.0.1:8100); Ctrl-C stops it. --target kubernetes writes a "
        "self-contained kustomize overlay whose router pod serves MODEL... instead (or the "
        "shared runtime Deployment, with --shared-runtime).",
        epilog="Environment: VLLM_SRUN_COMMAND (worker command, default vllm-srun), "
        "VLLM_SRUN_DIR (sockets and models files, 0700), VLLM_SRUN_CACHE_DIR (model cache "
        "of managed workers), VLLM_SRUN_CPU_THREADS (threads per CPU worker), "
        "VLLM_SRUN_READY_TIMEOUT (Go duration, default 10m), VLLM_SRUN_RESULT_CACHE (entries "
        "of a single-worker deployment's result cache, default 4096, 0 disables it), "
        "VLLM_SR_PORT_OFFSET (added to every port: 8080, 9190, 8899 and the configured "
        "listener ports), "
        "VLLM_SR_PUBLISH_MANAGEMENT_API=true (management API on 0.0.0.0), "
        "VLLM_SR_PUBLISH_METRICS=true (metrics on 0.0.0.0). Engine container: "
        "CONTAINER_RUNTIME, VLLM_SR_ENGINE_CACHE_DIR (its /app/models, default "
        "$XDG_CACHE_HOME/vllm-sr/models or ~/.cache/vllm-sr/models), HF_TOKEN, HF_ENDPOINT "
        "and HF_HUB_OFFLINE (passed by name), VLLM_SR_AMD_GPU_PASSTHROUGH=0, "
        "VLLM_SR_NVIDIA_GPU_PASSTHROUGH=0, VLLM_SR_DNS=a,b.",
    )
    serve.add_argument(
        "model",
        nargs="*",
        metavar="MODEL",
        help="with -e: the default decision deployment's artifact, a Hub repository "
        f"owner/name or a local package directory (default: the configured one, else "
        f"{DEFAULT_MODEL}); without -e: the models the engine container serves (Hub "
        "repository, built-in name or local package directory written ./DIR, /DIR or ~/DIR, "
        "mounted read-only; MODEL@REVISION pins one); with --target kubernetes: the models "
        "the cluster serves (built-in names, or Hub repositories pinned as "
        "MODEL@<40-hex commit>; no local packages)",
    )
    serve.add_argument(
        "-e",
        "--engine",
        action="store_true",
        help="start Engine mode here (the frontend and its workers); without it, MODEL... runs "
        "in a container (the docker target) or --target kubernetes writes an overlay",
    )
    serve.add_argument("--config", metavar="FILE", help="the config.yaml to serve")
    serve.add_argument(
        "-dp",
        dest="replicas",
        type=_positive_int,
        metavar="N",
        help="independent workers of the default deployment (writes its replicas)",
    )
    serve.add_argument(
        "--device-ids",
        metavar="IDS",
        help="host GPU indices for the workers (0 or 0,1); one index with -dp N puts every "
        "worker on that GPU",
    )
    serve.add_argument(
        "--platform",
        default="cpu",
        choices=tuple(PLATFORMS),
        help="the host's accelerators: cpu, amd/rocm or nvidia/cuda (default: cpu); with "
        "--target kubernetes, the cluster's (the image and the GPU resource of the pod that "
        "runs the models)",
    )
    serve.add_argument("--device", help="the default deployment's device: auto, cpu, cuda:N ...")
    serve.add_argument("--revision", metavar="SHA", help="the 40-hex commit of MODEL")
    serve.add_argument(
        "--runtime-profile",
        dest="profile",
        metavar="NAME",
        type=_profile_name,
        help="numeric profile of the default deployment's workers: exact (default, "
        "bit-identical), batching or max_speed (docs/profiles.md)",
    )
    serve.add_argument(
        "--systemone-schema",
        dest="systemone_schema",
        metavar="SCHEMA",
        choices=SYSTEMONE_SCHEMAS,
        help="the System One schema the default deployment's workers answer in: "
        f"{', '.join(SYSTEMONE_SCHEMAS)} (default: the configured one, else "
        f"{SYSTEMONE_SCHEMAS[0]}); jev is TypeSafe's Jev API, and a listener whose System "
        "One models all answer in it speaks Jev's errors and model list too "
        "(docs/frontend.md); without -e, the engine container's runtime gets it",
    )
    engine = serve.add_argument_group("engine arguments of the default deployment")
    engine.add_argument("--max-num-seqs", type=_positive_int, metavar="N")
    engine.add_argument("--max-num-batched-tokens", type=_positive_int, metavar="N")
    engine.add_argument("--batch-window-ms", type=_non_negative_float, metavar="MS")
    engine.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"))
    engine.add_argument(
        "--enable-shared-context", action=argparse.BooleanOptionalAction, default=None
    )
    serve.add_argument(
        "--offline",
        action="store_true",
        help="managed workers load only installed or cached models and never download "
        f"(always so for the built-in default {DEFAULT_MODEL}, which comes from its "
        "installed mirror, when neither MODEL nor --config is given); without -e the "
        "engine container's runtime gets --offline",
    )
    serve.add_argument(
        "--startup-timeout",
        type=_positive_int,
        metavar="SECONDS",
        help="bound of the readiness wait (default: VLLM_SRUN_READY_TIMEOUT, else 10m)",
    )
    serve.add_argument(
        "--log-level",
        default="info",
        choices=tuple(LOG_LEVELS),
        help="log level of the frontend and its workers, or of the engine container's "
        "runtime (default: info)",
    )
    _add_container_flags(serve)


def _add_container_flags(serve: argparse.ArgumentParser) -> None:
    from .deploy.container.images import PULL_POLICIES
    from .deploy.container.runtime import RUNTIMES

    box = serve.add_argument_group("engine container (MODEL... without -e)")
    box.add_argument("--models", metavar="FILE", help="a models file instead of MODEL arguments")
    box.add_argument("--host", help="host address the runtime is published on (127.0.0.1)")
    box.add_argument("--port", type=_port, help="host port the runtime is published on (8100)")
    box.add_argument(
        "--image",
        help="another image, [REGISTRY[:PORT]/]NAME[:TAG] (default: the platform's, "
        "ghcr.io/vllm-project/semantic-router/vllm-sr[-rocm|-cuda]:latest); with --target "
        "kubernetes, the image of the pod that runs the models",
    )
    box.add_argument(
        "--image-pull-policy",
        choices=PULL_POLICIES,
        help="always (default), ifnotpresent or never; presence by `image inspect`",
    )
    box.add_argument(
        "--container-runtime",
        choices=RUNTIMES,
        help="docker or podman (default: CONTAINER_RUNTIME, else detected)",
    )
    box.add_argument("--runtime", dest="legacy_runtime", choices=RUNTIMES, help=argparse.SUPPRESS)
    cluster = serve.add_argument_group(
        "Kubernetes (--target kubernetes MODEL...)",
        "Writes a self-contained kustomize overlay (the bases it uses are copied into it): "
        "by default the router pod vllm-sr runs MODEL... itself on the platform's image, with "
        "its GPU (nvidia.com/gpu or amd.com/gpu) in that pod; --shared-runtime serves them on "
        "the runtime Deployment model-runtime instead and attaches the frontend to its "
        "Service. A MODEL that is not built in (vllm-srun models) must be pinned: "
        "MODEL@<40-hex commit> or --revision.",
    )
    cluster.add_argument(
        "--target",
        choices=("docker", "kubernetes"),
        default="docker",
        help="docker: run here (default); kubernetes: write a kustomize overlay",
    )
    cluster.add_argument(
        "--namespace",
        help="the overlay's namespace (default: vllm-sr), created by it unless it is default, "
        "kube-* or --existing-namespace is given",
    )
    cluster.add_argument(
        "--existing-namespace",
        action="store_true",
        default=None,
        help="the namespace exists already: the overlay does not create it (so kubectl "
        "delete -k does not delete it)",
    )
    cluster.add_argument(
        "--output",
        metavar="DIR",
        help="where the overlay is written (default: vllm-sr-kubernetes; ~ is expanded); a "
        "directory that is not empty is refused without --force",
    )
    cluster.add_argument(
        "--force",
        action="store_true",
        default=None,
        help="replace an overlay vllm-sr wrote before in --output (only its files; a folder "
        "it did not write is refused)",
    )
    cluster.add_argument(
        "--shared-runtime",
        action="store_true",
        default=None,
        help="serve MODEL... on the shared runtime Deployment model-runtime (behind its "
        "Service, port 8100, with the GPU) and attach the frontend to it, instead of "
        "running them in the router pod",
    )
    cluster.add_argument(
        "--storage",
        metavar="SIZE",
        help="the model volume claim of the pod that runs MODEL..., a quantity with its unit "
        "from 1Mi to 1Pi such as 20Gi (default: 10Gi)",
    )
    cluster.add_argument(
        "--manifests",
        metavar="DIR",
        help="other kustomize bases (runtime/, frontend/, overlays/<platform>/) than the "
        "ones shipped with vllm-sr",
    )


def _port(text: str) -> int:
    if not text.strip().isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 1 to 65535, not {text!r}")
    return int(text)


def _profile_name(text: str) -> str:
    """``--runtime-profile``: a profile name, checked here so the flag is named."""
    if not PROFILE.match(text):
        shown = text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"
        raise argparse.ArgumentTypeError(f"{shown!r}: {PROFILE_MESSAGE}")
    return text


def _positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text!r}")
    return int(text)


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, not {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, not {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    """Run ``vllm-sr``; the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args, parser)
    if args.command == "config":
        if args.config_command == "validate":
            if (args.file is None) == (args.config_file is None):
                return _fail(
                    "config validate takes one config.yaml; give it as FILE or --config FILE "
                    "[bad_flag]"
                )
            return validate(args.file or args.config_file)
        if args.config_command == "migrate":
            return migrate(args.file, args.write)
        if args.config_command in ("apply", "get", "plan"):
            return config_client.run(args)
        parser.parse_args(["config", "--help"])
    if args.command == "instance":
        return instance(args.config, args.action)
    parser.print_help()
    return 2


def _fail(message: str) -> int:
    print(f"vllm-sr: {message}", file=sys.stderr, flush=True)
    return 1


def management_token(environ: Mapping[str, str]) -> str | None:
    """``VSR_MGMT_TOKEN`` without the spaces or newline a file or a secret mount leaves
    around it (a client sends the token trimmed), or ``None`` when unset or blank."""
    return (environ.get("VSR_MGMT_TOKEN") or "").strip() or None


def ready_timeout(environ: dict[str, str], startup_timeout: int | None) -> tuple[float, str]:
    """The readiness bound in seconds and what set it.

    Raises:
        ValueError: ``VLLM_SRUN_READY_TIMEOUT`` is not a positive Go duration.
    """
    if startup_timeout is not None:
        return float(startup_timeout), "--startup-timeout"
    text = environ.get("VLLM_SRUN_READY_TIMEOUT", "").strip()
    if not text:
        return 600.0, "VLLM_SRUN_READY_TIMEOUT"
    try:
        seconds = parse_duration(text)
    except ValueError as err:
        raise ValueError(f"VLLM_SRUN_READY_TIMEOUT: {err}") from None
    if seconds <= 0:
        raise ValueError(f"VLLM_SRUN_READY_TIMEOUT must be positive, not {text!r}")
    return seconds, "VLLM_SRUN_READY_TIMEOUT"


def serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``vllm-sr serve``: the frontend until a signal (0) or a failed startup (1); the
    engine container until it stops (0 on a requested stop); or the Kubernetes overlay."""
    if args.legacy_runtime is not None:
        print(
            "vllm-sr: --runtime is renamed to --container-runtime; --runtime keeps working "
            "for this release only",
            file=sys.stderr,
        )
        args.container_runtime = args.container_runtime or args.legacy_runtime
    if args.target == "kubernetes":
        return serve_kubernetes(args, parser)
    from .deploy.kubernetes import KUBERNETES_ONLY, TargetError, check_image

    for name, flag in KUBERNETES_ONLY.items():
        if getattr(args, name) is not None:
            return _fail(
                f"{flag} applies to --target kubernetes; add --target kubernetes or leave "
                f"{flag} out [bad_flag]"
            )
    if args.image is not None and not args.engine:
        try:
            check_image(args.image)
        except TargetError as err:
            return _fail(f"{err} [{err.code}]")
    router = not args.engine and args.config is not None and not args.model and not args.models
    if not args.engine and not router:
        if not args.model and not args.models:
            print(f"vllm-sr: {ROUTER_MODE_NEEDS_CONFIG}", file=sys.stderr)
            return 2
        return serve_container(args, parser)
    for name, flag in CONTAINER_ONLY.items():
        if getattr(args, name) is not None:
            parser.exit(
                2,
                f"vllm-sr serve: {flag} applies to the engine container (vllm-sr serve "
                "MODEL... without -e); the frontend reads its deployments from --config\n",
            )
    if len(args.model) > 1:
        parser.exit(
            2,
            "vllm-sr serve: -e takes one MODEL (the default decision deployment's artifact); "
            "declare more deployments in --config\n",
        )
    # Until the frontend takes SIGHUP (a reload), one that comes is only told about.
    previous = signal.signal(signal.SIGHUP, _hangup_while_starting)
    try:
        return _serve_frontend(args, parser, router)
    finally:
        signal.signal(signal.SIGHUP, previous)


def _serve_frontend(args: argparse.Namespace, parser: argparse.ArgumentParser, router: bool) -> int:
    """``vllm-sr serve`` in Router mode (``router``) or Engine mode (``-e``): the frontend
    until SIGTERM or SIGINT (0) or a failed startup (1)."""
    from .config.flags import apply_serve_options
    from .frontend import LOOPBACK, MANAGEMENT_PORT, METRICS_PORT, Frontend
    from .pool.cache import entries_from_environment
    from .reload import ConfigSource
    from .workers.devices import Devices
    from .workers.environment import RuntimeEnvironment, worker_command

    environ = dict(os.environ)
    try:
        document = read_document(args.config) if args.config else None
        offset = port_offset(environ)
        devices = Devices(worker_command(environ))
        engine_args = {
            name: getattr(args, name)
            for name in ENGINE_FLAGS
            if getattr(args, name, None) is not None
        }
        options = ServeOptions(
            model=args.model[0] if args.model else None,
            engine=not router,
            replicas=args.replicas,
            device_ids=args.device_ids,
            platform=args.platform,
            device=args.device,
            revision=args.revision,
            profile=args.profile,
            systemone_schema=args.systemone_schema,
            engine_args=engine_args or None,
        )
        given = document

        def served(document: dict[str, Any] | None) -> Config:
            """A document as served: its listeners' ports moved by the offset, the serve
            flags applied."""
            made = apply_serve_options(
                shift_listener_ports(document, offset),
                options,
                bootstrap=True,
                listener_port=BOOTSTRAP_PORT + offset,
                gpu_count=devices.count,
            )
            if router:
                made = with_router_listener(made, BOOTSTRAP_PORT + offset)
            return parse_config(made, args.config or "")

        def load(document: dict[str, Any] | None) -> Config:
            """A reload's document as served, flags and offset applied as at start."""
            try:
                return served(document)
            except FlagError as err:
                raise ConfigError(
                    [f"{err} (the serve flags and VLLM_SR_PORT_OFFSET of this frontend)"]
                ) from None

        config = served(given)
        config_source = ConfigSource(
            Path(args.config).read_bytes() if args.config else b"",
            load,
            Path(args.config).resolve() if args.config else None,
        )
        if router and not config.providers.models:
            return _fail(ROUTER_MODE_NEEDS_BACKENDS)
        if router and not config.router_enabled:
            return _fail(
                "global.router.enabled is false: this configuration is for Engine mode; start "
                "it with -e, or set global.router.enabled: true"
            )
        timeout, source = ready_timeout(environ, args.startup_timeout)
        result_cache = entries_from_environment(environ)
        # The built-in default is served from its installed mirror: nothing to download.
        offline = args.offline or (not args.model and args.config is None)
        env = RuntimeEnvironment.from_environ(environ, log_level=args.log_level, offline=offline)
    except FlagError as err:
        parser.exit(2, f"vllm-sr serve: {err}\n")
    except (ConfigError, PlanError, ValueError) as err:
        return _fail(str(err))
    logging.basicConfig(
        level=LOG_LEVELS[args.log_level].upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    published = environ.get("VLLM_SR_PUBLISH_MANAGEMENT_API", "").strip().lower() == "true"
    metrics_host = (
        "0.0.0.0"
        if environ.get("VLLM_SR_PUBLISH_METRICS", "").strip().lower() == "true"
        else LOOPBACK
    )
    frontend = Frontend(
        config,
        env,
        management=("0.0.0.0" if published else LOOPBACK, MANAGEMENT_PORT + offset),
        metrics_address=(metrics_host, METRICS_PORT + offset),
        ready_timeout=timeout,
        timeout_source=source,
        devices=devices,
        result_cache=result_cache,
        source=config_source,
        management_token=management_token(environ),
    )
    logging.getLogger("vllm_sr").info(
        "%s mode: deployments in use %s (managed: %s); ready within %s (%s)",
        "router" if router else "engine",
        ", ".join(deployments_in_use(config)) or "none",
        ", ".join(managed_in_use(config)) or "none",
        format_duration(timeout),
        source,
    )
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        return runner.run(frontend.run())


def _hangup_while_starting(_signum: int, _frame: Any) -> None:
    print(
        "vllm-sr: SIGHUP ignored: the frontend is still starting; send it again once it "
        "serves to reload the configuration",
        file=sys.stderr,
        flush=True,
    )


def with_router_listener(document: dict[str, Any], port: int) -> dict[str, Any]:
    """A Router-mode document with its Chat listener: the one it declares, else the default
    listener on 127.0.0.1 at ``port`` (8899 plus ``VLLM_SR_PORT_OFFSET``), named after it."""
    if document.get("listeners"):
        return document
    listener = {"name": bootstrap_listener(port), "address": BOOTSTRAP_ADDRESS, "port": port}
    return {**document, "listeners": [listener]}


def serve_container(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``vllm-sr serve MODEL... | --models FILE`` without ``-e``: the foreground engine
    container; 0 after a requested stop, 2 for bad flags, 1 when it cannot run."""
    from .deploy.container import ContainerError
    from .deploy.container.serve import serve_container as run_container
    from .deploy.kubernetes import TargetError, check_model_name
    from .names import looks_local

    # Before an engine is asked or an image pulled: a name the runtime would refuse, or a
    # local package that is not there, is told here.
    for model in args.model:
        try:
            if looks_local(model):
                if not Path(model).expanduser().exists():
                    return _fail(
                        f"MODEL {model}: no such directory; give an existing package "
                        "directory, a built-in name or owner/name@<40-hex commit> "
                        "[model_not_found]"
                    )
            elif model and model == model.strip():
                check_model_name(model)
        except TargetError as err:
            return _fail(f"{err} [{err.code}]")
    try:
        return run_container(args, dict(os.environ))
    except ContainerError as err:
        if err.code == "bad_flag":
            parser.exit(2, f"vllm-sr serve: {err}\n")
        return _fail(f"{err} [{err.code}]")


def serve_kubernetes(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``vllm-sr serve --target kubernetes ... MODEL...``: write the overlay and print
    where, the ``kubectl apply -k`` command (the next step) and the URLs; 1 with the
    refusal's code when it cannot (nothing is written then)."""
    import shlex

    from .deploy.kubernetes import (
        DEFAULT_NAMESPACE,
        DEFAULT_OUTPUT,
        TargetError,
        output_path,
        overlay_from_args,
        write_overlay,
    )

    try:
        overlay = overlay_from_args(args)
        output = output_path(args.output)
        manifests = Path(args.manifests).expanduser() if args.manifests else None
        # Paths print as written, but for ~ (a quoted ~ would not expand in a shell).
        given = args.output if args.output is not None else DEFAULT_OUTPUT
        shown = str(output) if given.startswith("~") else given
        write_overlay(overlay, output, manifests, force=bool(args.force), shown=shown)
    except TargetError as err:
        return _fail(f"{err} [{err.code}]")
    models = " ".join(m.argument for m in overlay.models)
    folder = shlex.quote(shown)
    print(f"wrote {shlex.quote(os.path.join(shown, 'kustomization.yaml'))}")
    if args.namespace is None:
        print(f"namespace: {DEFAULT_NAMESPACE} (the default; --namespace NS for another)")
    if overlay.create_namespace:
        print(
            f"note: the overlay creates the namespace {overlay.namespace}, so kubectl delete "
            f"-k {folder} deletes it and everything in it (--existing-namespace leaves it out)"
        )
    if overlay.shared_runtime:
        print(
            f"runtime: model-runtime serves {models} on {overlay.model_device} at "
            f"{overlay.runtime_endpoint()}"
        )
        print(f"frontend: vllm-sr attaches to it; its listener: {overlay.listener_url()}")
    else:
        print(f"router pod: vllm-sr runs {models} on {overlay.model_device}")
        print(f"its listener: {overlay.listener_url()}")
    print(f"next: kubectl apply -k {folder}")
    return 0


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (uvicorn's ``standard`` extra brings it:
    less CPU per request than asyncio's own), else asyncio's (``None``)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] installs it on Linux
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def validate(path: str) -> int:
    """``vllm-sr config validate FILE``: 0 and a summary, or 1 and every problem."""
    try:
        config = load_config(path)
    except ConfigError as err:
        return _fail(str(err))
    used = deployments_in_use(config)
    for warning in unserved_grants(config):
        print(f"warning: {warning}", file=sys.stderr)
    print(
        f"{path}: valid: {len(config.catalog.deployments)} deployment(s), "
        f"{len(config.listeners)} listener(s); in use: {', '.join(used) or 'none'}"
    )
    return 0


def migrate(path: str, write: bool) -> int:
    """``vllm-sr config migrate FILE``: the file without the removed fields."""
    try:
        document = read_document(path)
    except ConfigError as err:
        return _fail(str(err))
    migrated, removed = migrate_document(document)
    text = yaml.safe_dump(migrated, sort_keys=False, allow_unicode=True)
    for key in removed:
        print(f"removed {key}", file=sys.stderr)
    if write:
        with open(path, "w", encoding="utf-8") as out:
            out.write(text)
    else:
        sys.stdout.write(text)
    try:
        parse_config(migrated, path)
    except ConfigError as err:
        return _fail(f"migrated, but still not valid: {err}")
    return 0


def management_url(environ: dict[str, str] | None = None) -> str:
    """Where this host's frontend answers management calls (port 8080 + offset)."""
    from .frontend import MANAGEMENT_PORT

    return f"http://127.0.0.1:{MANAGEMENT_PORT + port_offset(environ)}"


def instance(path: str | None, action: str) -> int:
    """``vllm-sr instance [--config FILE] status|models``: without ``--config``, the
    instance is taken to run the configuration ``vllm-sr serve -e`` makes with no config
    (the ``http-8899`` listener publishing the built-in default)."""
    import urllib.request

    def fetch(route: str) -> dict[str, Any]:
        with urllib.request.urlopen(base + route, timeout=5.0) as answer:
            document = json.loads(answer.read())
        if not isinstance(document, dict):
            raise ValueError(f"{route} answered {type(document).__name__}, not a JSON object")
        return document

    try:
        if path is None:
            from .config.flags import apply_serve_options

            listener_port = BOOTSTRAP_PORT + port_offset()
            document = apply_serve_options(
                None, ServeOptions(), bootstrap=True, listener_port=listener_port
            )
            config = parse_config(document, "")
        else:
            config = load_config(path)
        base = management_url()
    except (ConfigError, FlagError) as err:
        return _fail(str(err))
    try:
        if action == "status":
            observed: dict[str, Any] | None = fetch("/api/v1/status")
        else:
            inventory = fetch("/api/v1/inventory/model-runtime")
    except (OSError, ValueError) as err:
        if action == "models":
            return _fail(f"Instance model inventory is unavailable: {base}: {err}")
        observed = None
    if action == "status":
        print(json.dumps(_status(config, observed), indent=2))
        return 0 if observed is not None else 1
    print(json.dumps(_models(config, inventory), indent=2))
    return 0


def _status(config: Config, observed: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "desired_mode": "router" if config.router_enabled else "engine",
        "observed_mode": observed.get("mode") if observed else None,
        "active_deployment": config.catalog.decision_deployment,
        "state": (observed or {}).get("phase", "stopped"),
        "ready": bool((observed or {}).get("ready")),
        "message": (observed or {}).get("message", "the instance's management API does not answer"),
    }


def _models(config: Config, inventory: dict[str, Any]) -> dict[str, Any]:
    entries = {e.get("name"): e for e in inventory.get("deployments") or []}
    data = []
    seen: set[tuple[str, str]] = set()
    for listener in config.listeners:
        for api, grant in (("systemone", listener.systemone), ("runtime", listener.runtime)):
            for public_id in grant.models:
                name = config.deployment_for_public_id(public_id)
                if name is None or (public_id, api) in seen:
                    continue
                seen.add((public_id, api))
                entry = entries.get(name, {})
                data.append(
                    {
                        "id": public_id,
                        "object": "model",
                        "api": api,
                        "deployment": name,
                        "ready": bool(entry.get("ready")),
                        "state": entry.get("state", "unavailable"),
                        "reason": entry.get("reason", ""),
                        **{
                            k: entry.get(k)
                            for k in (
                                "family",
                                "repo",
                                "revision",
                                "surfaces",
                                "heads",
                                "embedding",
                                "rerank",
                                "device",
                                "profile",
                                "engine",
                            )
                            if k in entry
                        },
                    }
                )
    return {"object": "list", "data": data}
