"""The ``vllm-srun serve`` command line: its options and the :class:`ServeConfig` they make.

Nothing here is written twice: the per-model options come from
:class:`~vllm_srun.engine_args.EngineArgs` and the process-wide ones from
:class:`ServeConfig`'s declarations (:func:`~vllm_srun.engine_args.add_arguments`),
so an option's default, check and help live on its field. Only the options
that choose the models (MODEL, ``--models``, ``--served-model-name``,
``--revision``) are written out below.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from vllm_srun.config import (
    ENTRY_KEYS,
    ConfigError,
    ModelConfig,
    ServeConfig,
    check_revision,
    process_fields,
    read_models_file,
)
from vllm_srun.engine_args import (
    add_arguments,
    add_engine_arguments,
    from_namespace,
    namespace_values,
    non_blank,
)

LISTEN_OPTIONS = ("host", "port", "uds")
"""The process options ``--help`` shows before the engine arguments; the others follow
``--revision``."""


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
    serve.add_argument(
        "--served-model-name", type=non_blank, help="the model ID the API reports (one MODEL)"
    )
    listen = [f for f in process_fields() if f.name in LISTEN_OPTIONS]
    add_arguments(serve, listen)
    add_engine_arguments(serve)
    serve.add_argument(
        "--revision", metavar="SHA", help="the 40-hex commit to load, for a single MODEL"
    )
    add_arguments(serve, [f for f in process_fields() if f.name not in LISTEN_OPTIONS])


def serve_config(args: argparse.Namespace) -> ServeConfig:
    """The :class:`~vllm_srun.config.ServeConfig` of parsed ``serve`` arguments.

    Raises:
        ConfigError: no model, a blank MODEL, both MODEL and --models,
            --served-model-name with several models, or a bad models file.
    """
    defaults = ModelConfig(model="", **dataclasses.asdict(from_namespace(args)))
    if args.models and args.model:
        raise ConfigError("give MODEL arguments or --models FILE, not both")
    if args.models:
        models = read_models_file(args.models, defaults)
    elif args.model:
        if any(not m.strip() for m in args.model):
            raise ConfigError(
                "a MODEL argument is blank; give a built-in model name, owner/name@COMMIT "
                "or a package directory"
            )
        models = [dataclasses.replace(defaults, model=m) for m in args.model]
    else:
        raise ConfigError(
            "name at least one MODEL (a built-in model name, owner/name@COMMIT or a package "
            "directory) or --models FILE"
        )
    if args.served_model_name is not None:
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
    return ServeConfig(models=models, **namespace_values(args, process_fields()))
