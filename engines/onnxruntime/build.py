"""The child process that builds ONNX graphs, so a server never imports torch for them.

``python -m vllm_srun.engines.onnxruntime.build COMMAND ...``, run by
:func:`~vllm_srun.engines.onnxruntime.export.run_builder`:

- ``check MODEL_TYPE TASK``: print ``{"refusal": null}`` when optimum can export the
  model type for the task, else ``{"refusal": "<why not>"}``
  (:func:`~vllm_srun.engines.onnxruntime.export.export_refusal`);
- ``export PACKAGE TASK OUTPUT``: export the package into the folder ``OUTPUT``
  (:func:`~vllm_srun.engines.onnxruntime.export.export_onnx`);
- ``optimize SOURCE OUTPUT [--int8]``: the ``max_speed`` graph of the export in
  ``SOURCE`` into ``OUTPUT`` (:func:`~vllm_srun.engines.onnxruntime.export.optimize_onnx`).

It exits 0 when done; on a failure it writes ``error: <the cause>`` as its last line
on stderr and exits 1 (2 for a command line it does not take).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

from vllm_srun.plugins.spec import ModelSpec

from .export import die_with_parent, export_onnx, export_refusal, optimize_onnx


def main(argv: list[str] | None = None) -> int:
    """Run one command (the module's list); returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m vllm_srun.engines.onnxruntime.build")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check")
    check.add_argument("model_type")
    check.add_argument("task")
    export = commands.add_parser("export")
    export.add_argument("package", type=Path)
    export.add_argument("task")
    export.add_argument("output", type=Path)
    optimize = commands.add_parser("optimize")
    optimize.add_argument("source", type=Path)
    optimize.add_argument("output", type=Path)
    optimize.add_argument("--int8", action="store_true")
    args = parser.parse_args(argv)
    die_with_parent()
    try:
        if args.command == "check":
            print(json.dumps({"refusal": export_refusal(args.model_type, args.task)}))
        elif args.command == "export":
            export_onnx(ModelSpec(args.package, "", "", args.task), args.output)
        else:
            optimize_onnx(args.source, args.output, args.int8)
    except Exception as err:
        traceback.print_exc()
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        sys.stderr.write(f"error: {type(err).__name__}: {first}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
