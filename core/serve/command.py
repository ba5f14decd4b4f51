"""The ``vllm-srun serve`` command line: its options and the :class:`ServeConfig` they make.

The per-model options come from :class:`~vllm_srun.engine_args.EngineArgs`,
the process-wide ones default to :class:`ServeConfig`'s fields, so a default
is written once.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from vllm_srun.engine_args import (
    add_engine_arguments,
    from_namespace,
    non_negative_float,
    non_negative_int,
    positive_int,
)

from .config import (
    ENTRY_KEYS,
    ConfigError,
    ModelConfig,
    ServeConfig,
    check_revision,
    read_models_file,
)


class DefaultsHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help that shows an option's default when it has a real one (not ``None``/empty),
    and keeps the epilog's line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or default in (None, [], False)
            or default is argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"


def add_serve_parser(commands: Any) -> None:
    """``vllm-srun serve`` and its options (defaults as the command reference gives them)."""
    serve = commands.add_parser(
        "serve",
        help="serve models over HTTP",
        description="Serve one or more models over HTTP (FastAPI on uvicorn).",
        formatter_class=DefaultsHelpFormatter,
        epilog="A models file lists models with their own options:\n"
        "  models:\n    - model: sentence-transformers/all-MiniLM-L6-v2\n"
        "      name: embedder\n      device: cpu\n"
        f"Keys: model (required), {', '.join(k for k in ENTRY_KEYS if k != 'model')}; "
        "a key left out takes the command line's value.",
    )
    serve.add_argument(
        "model",
        nargs="*",
        metavar="MODEL",
        help="built-in model name (vllm-srun models), Hub repository owner/name@COMMIT, "
        "or local package directory",
    )
    serve.add_argument("--models", metavar="FILE", help="a models file instead of MODEL arguments")
    serve.add_argument("--served-model-name", help="the model ID the API reports (one MODEL)")
    serve.add_argument("--host", default=ServeConfig.host, help="listen address")
    serve.add_argument("--port", type=int, default=ServeConfig.port, help="listen port")
    serve.add_argument("--uds", metavar="PATH", help="listen on a Unix socket instead of TCP")
    add_engine_arguments(serve)
    serve.add_argument(
        "--revision", metavar="SHA", help="the 40-hex commit to load, for a single MODEL"
    )
    serve.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="Hugging Face cache directory (default: HF_HUB_CACHE)",
    )
    serve.add_argument(
        "--offline",
        action="store_true",
        help="use only files already in the cache or installed mirrors; never download",
    )
    serve.add_argument(
        "--accept-licence",
        metavar="ID",
        action="append",
        default=[],
        help="accept a restricted licence (repeatable)",
    )
    serve.add_argument(
        "--threads", type=positive_int, help="CPU threads of the process (default: all cores)"
    )
    serve.add_argument(
        "--max-queue",
        type=positive_int,
        default=ServeConfig.max_queue,
        help="requests queued per model before 429 (a decisions `states` entry counts as one)",
    )
    serve.add_argument(
        "--max-queued-tokens",
        type=positive_int,
        default=ServeConfig.max_queued_tokens,
        help="tokens queued per model before 429",
    )
    serve.add_argument(
        "--max-request-bytes",
        type=positive_int,
        default=ServeConfig.max_request_bytes,
        help="request body limit (413 above it)",
    )
    serve.add_argument(
        "--max-bundle-tasks",
        type=positive_int,
        default=ServeConfig.max_bundle_tasks,
        help="most tasks in one /v1/bundle request",
    )
    serve.add_argument(
        "--result-cache-entries",
        type=non_negative_int,
        default=ServeConfig.result_cache_entries,
        help="recent row results kept per model, by content (0 disables the cache)",
    )
    serve.add_argument(
        "--shutdown-grace-seconds",
        type=non_negative_float,
        default=ServeConfig.shutdown_grace_seconds,
        help="after SIGTERM, how long queued work may take to finish",
    )
    serve.add_argument(
        "--log-level",
        default=ServeConfig.log_level,
        choices=("debug", "info", "warning", "error"),
        help="log verbosity (request text is never logged)",
    )
    serve.add_argument(
        "--load-attempts",
        type=positive_int,
        default=ServeConfig.load_attempts,
        help="loads of a model before it counts as failed; final causes are not retried",
    )
    serve.add_argument(
        "--load-retry-seconds",
        type=non_negative_float,
        default=ServeConfig.load_retry_seconds,
        help="wait before the first reload of a model, then doubling, at most 300 s",
    )
    serve.add_argument(
        "--systemone-schema",
        choices=("vllm-sr/5.0", "vllm-sr/4.0"),
        default=ServeConfig.systemone_schema,
        help="the System One schema of /v1/systemone and /v1/systemone/batch; vllm-sr/4.0 "
        "also accepts the older request forms",
    )
    serve.add_argument(
        "--autotune-cache",
        metavar="DIR",
        default=ServeConfig.autotune_cache,
        help="keep compiled GPU kernels and kernel tuning across runs in DIR "
        "(default: $VLLM_SRUN_AUTOTUNE_CACHE)",
    )


def serve_config(args: argparse.Namespace) -> Any:
    """The :class:`~vllm_srun.serve.config.ServeConfig` of parsed ``serve`` arguments.

    Raises:
        ConfigError: no model, both MODEL and --models, --served-model-name
            with several models, or a bad models file.
    """
    defaults = ModelConfig(model="", **dataclasses.asdict(from_namespace(args)))
    if args.models and args.model:
        raise ConfigError("give MODEL arguments or --models FILE, not both")
    if args.models:
        models = read_models_file(args.models, defaults)
    elif args.model:
        models = [dataclasses.replace(defaults, model=m) for m in args.model]
    else:
        raise ConfigError(
            "name at least one MODEL (a built-in model name, owner/name@COMMIT or a package "
            "directory) or --models FILE"
        )
    if args.served_model_name:
        if len(models) != 1:
            raise ConfigError("--served-model-name applies to a single MODEL")
        models[0].name = args.served_model_name
    if args.revision is not None:
        if args.models or len(models) != 1:
            raise ConfigError(
                "--revision applies to a single MODEL; in a models file give each entry "
                "its own `revision`"
            )
        models[0].revision = check_revision(args.revision, "--revision")
    names = [m.served_name for m in models]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"two models share the ID {', '.join(duplicates)}; give each a name")
    return ServeConfig(
        models=models,
        host=args.host,
        port=args.port,
        uds=args.uds,
        threads=args.threads,
        max_queue=args.max_queue,
        max_queued_tokens=args.max_queued_tokens,
        max_request_bytes=args.max_request_bytes,
        max_bundle_tasks=args.max_bundle_tasks,
        result_cache_entries=args.result_cache_entries,
        shutdown_grace_seconds=args.shutdown_grace_seconds,
        log_level=args.log_level,
        cache_dir=args.cache_dir,
        offline=args.offline,
        accept_licences=tuple(args.accept_licence),
        load_attempts=args.load_attempts,
        load_retry_seconds=args.load_retry_seconds,
        systemone_schema=args.systemone_schema,
        autotune_cache=args.autotune_cache,
    )
