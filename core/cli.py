"""The ``vllm-srun`` command line.

Building the parser imports nothing heavy: ``vllm-srun --help`` and
``--version`` answer without importing torch, the plugins or the HTTP stack
(each command imports what it needs when it runs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from vllm_srun import __version__
from vllm_srun.config import ConfigError
from vllm_srun.engine_args import add_engine_arguments
from vllm_srun.serve.command import add_serve_parser, serve_config

if TYPE_CHECKING:
    from vllm_srun.plugins.host import Catalog

__all__ = ["build_parser", "devices_json", "main", "serve_config"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``vllm-srun`` and its subcommands."""
    parser = argparse.ArgumentParser(
        prog="vllm-srun",
        description="A model runtime for semantic routers, composed from plugins.",
    )
    parser.add_argument("--version", action="version", version=f"vllm-srun {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    plugins = commands.add_parser(
        "plugins", help="list the installed plugins, what each registered, and any error or clash"
    )
    plugins.add_argument("--json", action="store_true", help="print JSON instead of a table")
    plugin_commands = plugins.add_subparsers(dest="plugins_command", metavar="SUBCOMMAND")
    check = plugin_commands.add_parser(
        "check", help="run the conformance kit on one plugin alone (exit 1 on a violation)"
    )
    check.add_argument("name", help="the plugin's entry-point name")
    # `plugins --json check NAME` and `plugins check NAME --json` both work.
    check.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print the report as JSON"
    )

    commands.add_parser(
        "devices", help="print as JSON this machine's devices and the order --device auto tries"
    )
    models = commands.add_parser(
        "models", help="list the built-in models, their pinned revisions, licences and mirrors"
    )
    models.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_serve_parser(commands)
    add_golden_parser(commands)
    return parser


def add_golden_parser(commands: Any) -> None:
    """``vllm-srun golden record``: record a model's golden answers for this machine."""
    golden = commands.add_parser("golden", help="golden self-check references")
    actions = golden.add_subparsers(dest="golden_command", metavar="SUBCOMMAND")
    record = actions.add_parser(
        "record",
        help="run a model's golden requests here and store the answers under this "
        "device's first reference key",
        description="Load MODEL, run its golden requests twice (they must be well formed "
        "and equal) and write the answers into its golden reference file under the "
        "device's first reference key (see `vllm-srun devices`).",
    )
    record.add_argument(
        "model", metavar="MODEL", help="built-in model name or local package directory"
    )
    add_engine_arguments(record, only=("device", "dtype", "engine", "family"))
    record.add_argument(
        "--name",
        metavar="MODEL_ID",
        help="the built-in model whose golden reference to update (default: the model "
        "MODEL resolves to)",
    )
    record.add_argument(
        "--file",
        metavar="PATH",
        help="the reference file to write (default: the file the registered reference "
        "was read from)",
    )
    record.add_argument(
        "--offline", action="store_true", help="use only installed mirrors and the cache"
    )
    parity = actions.add_parser(
        "parity",
        help="measure whether an engine's answers equal a model's recorded golden answers "
        "on this device, and declare or withdraw its parity (what --engine auto reads)",
        description="Load MODEL on --engine under the exact profile, run the golden "
        "self-check against the answers recorded for this device, and write the result "
        "into the reference file's engine_parity: declared when every answer matched "
        "within the tolerance, withdrawn when one did not (exit 1).",
    )
    parity.add_argument(
        "model", metavar="MODEL", help="built-in model name or local package directory"
    )
    add_engine_arguments(parity, only=("device", "engine"))
    parity.add_argument(
        "--offline", action="store_true", help="use only installed mirrors and the cache"
    )


WAIT_POLICY = "PASSIVE"
"""The OpenMP wait policy a ``vllm-srun`` process gets unless its environment chooses
one (``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``).

PyTorch's CPU kernels run on an OpenMP thread team whose idle threads, by default,
spin for a while before they sleep. On a machine where other processes want the same
cores (a frontend beside its workers, two replicas on one host, a pod under a CPU
limit) the spinning threads take the cores from them. Measured on the 2-core
reference machine under other load (load average 9.5), MiniLM ``/v1/embeddings``
straight to one 2-thread worker, 6 s each, side by side: the default policy 1.8 and
10.5 req/s at c1 and c32 (31-280 ms of CPU per request), ``PASSIVE`` 18.9 and 123
req/s (2.7-24 ms of CPU per request). Idle threads then sleep at once, which costs
a wake-up per parallel region when the cores are free.
"""


def use_default_wait_policy(environ: MutableMapping[str, str] | None = None) -> None:
    """Set ``OMP_WAIT_POLICY`` to :data:`WAIT_POLICY` in ``environ`` (``os.environ``)
    unless it chooses a policy itself. It must run before torch is imported: the OpenMP
    runtime reads it once, when it loads."""
    env = os.environ if environ is None else environ
    if "OMP_WAIT_POLICY" not in env and "GOMP_SPINCOUNT" not in env:
        env["OMP_WAIT_POLICY"] = WAIT_POLICY


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``vllm-srun``; returns the process exit status."""
    use_default_wait_policy()
    try:
        return _dispatch(argv)
    except BrokenPipeError:
        # The reader went away (`vllm-srun devices | head`): not an error of ours.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


@contextlib.contextmanager
def _plugin_output_to_stderr() -> Iterator[TextIO]:
    """Route what plugins print to stderr; yields the real stdout for our own output.

    A plugin that prints while importing or probing must not corrupt the JSON
    that scripts read from stdout.
    """
    out = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        yield out


def _dispatch(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        from vllm_srun.serve.main import end_process, serve

        try:
            config = serve_config(args)
        except ConfigError as err:
            parser.error(str(err))
        code = serve(config)
        end_process(code)  # answered and closed: skip the interpreter teardown
        return code
    if args.command == "golden" and args.golden_command is None:
        parser.parse_args(["golden", "--help"])
    if args.command not in ("plugins", "devices", "models", "golden"):
        parser.print_help()
        return 2
    from vllm_srun.plugins.host import load_catalog

    with _plugin_output_to_stderr() as out:
        if args.command == "golden" and args.golden_command == "parity":
            return run_golden_parity(args, load_catalog(), out)
        if args.command == "golden":
            return run_golden_record(args, load_catalog(), out)
        if args.command == "devices":
            return run_devices(load_catalog(), out)
        if args.command == "models":
            return run_models(load_catalog(), as_json=args.json, out=out)
        if args.plugins_command == "check":
            return run_check(args.name, out, as_json=args.json)
        return run_plugins(load_catalog(), as_json=args.json, out=out)


def run_golden_record(args: argparse.Namespace, catalog: Catalog, out: TextIO) -> int:
    """``vllm-srun golden record``: load, run the golden requests, write the answers.

    Returns 0 and prints what was written; 1 with the reason on stderr when
    the model does not load, names no golden reference, or answers badly.
    """
    from vllm_srun.compose.golden import GoldenError, record
    from vllm_srun.compose.loader import LoadError, LoadOptions, load_model
    from vllm_srun.plugins import ReferenceFileError

    try:
        served = load_model(
            args.model,
            LoadOptions(
                device=args.device,
                dtype=args.dtype,
                engine=args.engine,
                family=args.family,
                offline=args.offline,
            ),
            catalog=catalog,
        )
        identity = args.name or served.identity
        if identity is None:
            raise GoldenError(
                f"{args.model} is not a built-in model; pass --name MODEL_ID to say whose "
                "golden reference to update"
            )
        done = record(served, catalog, identity, args.file)
    except (LoadError, GoldenError, ReferenceFileError) as err:
        sys.stderr.write(f"vllm-srun golden record: {err}\n")
        return 1
    tolerance = "no tolerance" if done.tolerance is None else f"tolerance {done.tolerance:g}"
    out.write(
        f"recorded {done.answers} golden answers of {done.model} under {done.key} "
        f"({tolerance}) in {done.path}\n"
    )
    return 0


def run_golden_parity(args: argparse.Namespace, catalog: Catalog, out: TextIO) -> int:
    """``vllm-srun golden parity``: load on the named engine, check, declare or withdraw.

    Returns 0 when the engine is at parity (declared); 1 when it is not (withdrawn, the
    first difference on stderr) or the model cannot be measured.
    """
    from vllm_srun.compose.golden import GoldenError, measure_parity
    from vllm_srun.compose.loader import LoadError, LoadOptions, load_model
    from vllm_srun.plugins import ReferenceFileError

    if args.engine == "auto":
        sys.stderr.write("vllm-srun golden parity: name the engine to measure with --engine\n")
        return 1
    try:
        served = load_model(
            args.model,
            LoadOptions(device=args.device, engine=args.engine, offline=args.offline),
            catalog=catalog,
        )
        found = measure_parity(served, catalog)
    except (LoadError, GoldenError, ReferenceFileError) as err:
        sys.stderr.write(f"vllm-srun golden parity: {err}\n")
        return 1
    result = found.result
    if not found.held:
        sys.stderr.write(
            f"vllm-srun golden parity: {found.engine} is not at parity for {served.identity}"
            f" ({result.reason}); its declaration, if any, was withdrawn from {found.path}\n"
        )
        return 1
    out.write(
        f"{found.engine} matched {result.matched} golden answers of {served.identity} on "
        f"{result.reference}: declared at parity in {found.path}\n"
    )
    return 0


def run_plugins(catalog: Catalog, *, as_json: bool, out: TextIO) -> int:
    """Print the plugin catalog as a table or as JSON."""
    if as_json:
        json.dump(catalog.to_json(), out, indent=2)
        out.write("\n")
        return 0
    rows = [("NAME", "DISTRIBUTION", "VERSION", "REGISTERED", "STATUS")]
    for plugin in catalog.plugins:
        registered = "; ".join(
            f"{layer}: {', '.join(sorted(names))}"
            for layer, names in plugin.registered.items()
            if names
        )
        if plugin.error is not None:
            status = f"error: {plugin.error}"
        elif plugin.refused:
            status = f"{len(plugin.refused)} refused"
        else:
            status = "ok"
        rows.append(
            (
                plugin.name,
                plugin.distribution or "-",
                plugin.version or "-",
                registered or "-",
                status,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        out.write("  ".join([*cells, row[4]]).rstrip() + "\n")
    refused = [(p, r) for p in catalog.plugins for r in p.refused]
    if refused:
        out.write("\nrefused:\n")
        for plugin, refusal in refused:
            out.write(f"  {plugin.name}: {refusal.layer} {refusal.name}: {refusal.reason}\n")
    if catalog.clashes:
        out.write("\nclashes (neither is used):\n")
        for clash in catalog.clashes:
            owners = " and ".join(p.label for p in clash.plugins)
            out.write(f"  {clash.layer} {clash.name!r}: {owners}\n")
    return 0


def run_models(catalog: Catalog, *, as_json: bool, out: TextIO) -> int:
    """Print the built-in models (the catalog's ``models`` layer) as a table or as JSON.

    JSON is a list of ``{name, family, revision, licence, licence_restricted,
    parameters, description, files, patterns, mirrors}``
    (:func:`vllm_srun.compose.registry.entry_json`), sorted by name; ``revision`` is
    ``null`` for a model that lives only in mirrors; ``files`` is empty and ``patterns``
    names what is fetched for a model pinned by its revision alone.
    """
    from vllm_srun.compose.registry import table

    models = table(catalog.layer("models"))
    if as_json:
        json.dump(models, out, indent=2)
        out.write("\n")
        return 0
    rows = [("NAME", "FAMILY", "REVISION", "LICENCE", "PARAMETERS", "MIRRORS")]
    for model in models:
        mirrors = ", ".join(f"{m['distribution']}=={m['version']}" for m in model["mirrors"])
        licence = model["licence"] + (" (accept)" if model["licence_restricted"] else "")
        parameters = model["parameters"]
        rows.append(
            (
                model["name"],
                model["family"],
                model["revision"] or "- (mirror only)",
                licence,
                f"{parameters / 1e6:.1f}M" if parameters else "-",
                mirrors or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        out.write("  ".join([*cells, row[-1]]).rstrip() + "\n")
    return 0


def _probe(name: str, acc: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One accelerator's state and its devices as JSON; a misbehaving plugin is an ``error``."""
    from vllm_srun.plugins import DeviceInfo

    state: dict[str, Any] = {"name": name, "available": False, "error": None}
    try:
        priority = type(acc).auto_priority
        state["auto_priority"] = priority if type(priority) is int else None
        state["available"] = acc.available() is True
        if not state["available"]:
            return state, []
        listed = acc.devices()
        if not isinstance(listed, Sequence) or not all(isinstance(d, DeviceInfo) for d in listed):
            raise TypeError(f"devices() returned {type(listed).__name__}, not DeviceInfo items")
        devices = []
        for device in listed:
            document = {**device.to_json(), "reference_keys": list(acc.reference_keys(device))}
            json.dumps(document, allow_nan=False)  # NaN, sets, tensors: refused here
            devices.append(document)
        return state, devices
    except (KeyboardInterrupt, MemoryError):
        raise
    except BaseException as err:
        state["error"] = f"{type(err).__name__}: {err}"
        return state, []


def devices_json(catalog: Catalog) -> dict[str, Any]:
    """The ``vllm-srun devices`` document: devices, auto order and every accelerator's state.

    ``auto`` is the device ``--device auto`` picks (the first of ``auto_order``, or
    ``None`` when no device is usable): a frontend planning managed workers reads it
    once instead of letting each worker resolve ``auto`` on its own.

    An accelerator whose probes raise or return malformed data is listed with
    an ``error`` and contributes no device; the document stays valid JSON.
    """
    from vllm_srun.compose.placement import auto_accelerators

    devices: list[dict[str, Any]] = []
    accelerators = []
    for name, acc in sorted(catalog.layer("accelerators").items()):
        state, listed = _probe(name, acc)
        accelerators.append(state)
        devices.extend(listed)
    usable = {d["accelerator"] for d in devices}
    ranked = [a for a in auto_accelerators(catalog.layer("accelerators")) if a.name in usable]
    rank = {acc.name: i for i, acc in enumerate(ranked)}
    devices.sort(key=lambda d: (rank.get(d["accelerator"], len(rank)), d["accelerator"]))
    order = [d["device"] for d in devices if d["accelerator"] in rank]
    return {
        "devices": devices,
        "auto": order[0] if order else None,
        "auto_order": order,
        "accelerators": accelerators,
    }


def run_devices(catalog: Catalog, out: TextIO) -> int:
    """Print :func:`devices_json` as JSON."""
    json.dump(devices_json(catalog), out, indent=2)
    out.write("\n")
    return 0


def run_check(name: str, out: TextIO, *, as_json: bool = False) -> int:
    """Run the conformance kit on one plugin; 0 when it conforms, else 1."""
    from vllm_srun.plugins.testing import check_plugin

    report = check_plugin(name)
    if as_json:
        json.dump(report.to_json(), out, indent=2)
        out.write("\n")
    else:
        out.write(report.to_text() + "\n")
    return 0 if report.ok else 1
