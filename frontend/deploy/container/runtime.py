"""Which container CLI runs the engine container: ``--container-runtime``,
``CONTAINER_RUNTIME``, or detected (Docker first, unless its CLI is Podman's)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .errors import ContainerError
from .probe import ask

RUNTIMES = ("docker", "podman")
"""The container CLIs ``--container-runtime`` and ``CONTAINER_RUNTIME`` accept."""

INSTALL = {
    "docker": "Docker (https://docs.docker.com/engine/install/)",
    "podman": "Podman, which needs no daemon (sudo apt-get install podman, or dnf install podman)",
}
"""How each engine is installed, as a message says it."""

PROBE_TIMEOUT_S = 10.0
"""Bound of the probes together (``--version``, then the server's version), in seconds."""


@dataclass(frozen=True)
class ContainerRuntime:
    """The container CLI to call.

    Attributes:
        executable: the command run (``docker`` or ``podman``, found on ``PATH``).
        podman: whether it is Podman, including a ``docker`` command that is Podman's
            CLI (Podman takes NVIDIA GPUs by CDI, and runs rootless with ``keep-id``).
    """

    executable: str
    podman: bool


def version_says_podman(executable: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether ``<executable> --version`` names Podman (``podman-docker`` installs a
    ``docker`` command that is Podman).

    Raises:
        ContainerError: the command cannot run (``no_container_runtime``) or does not
            answer within ``timeout`` seconds (``runtime_failed``).
    """
    answer = ask([executable, "--version"], timeout)
    if answer.timed_out:
        name = os.path.basename(executable)
        raise ContainerError(
            f"`{name} --version` did not answer within {PROBE_TIMEOUT_S:g} s; check the "
            f"{name} command ({shutil.which(executable) or executable}), or choose the other "
            "engine (--container-runtime)",
            "runtime_failed",
        )
    return "podman" in (answer.stdout + answer.stderr).lower()


def _say(line: str) -> None:
    print(f"vllm-sr: {line}", file=sys.stderr, flush=True)


def detect_runtime(
    requested: str | None,
    environ: Mapping[str, str],
    *,
    which: Callable[[str], str | None] = shutil.which,
    says_podman: Callable[[str], bool] = version_says_podman,
    platform_name: str = os.name,
    say: Callable[[str], None] = _say,
) -> ContainerRuntime:
    """The container CLI to use.

    Args:
        requested: ``--container-runtime`` (``docker`` or ``podman``), or ``None``.
        environ: read for ``CONTAINER_RUNTIME`` when ``requested`` is ``None``.
        which: finds an executable on ``PATH`` (``shutil.which``).
        says_podman: whether a ``docker`` executable is Podman's CLI.
        platform_name: ``os.name``; native Windows (``nt``) is refused.
        say: prints a line: a detected ``docker`` that cannot run falls back to
            ``podman``, and says so.

    Raises:
        ContainerError: native Windows, an unknown ``CONTAINER_RUNTIME``, the chosen
            CLI not on ``PATH`` or not able to run, or neither CLI on ``PATH`` (code
            ``no_container_runtime``); see :func:`version_says_podman`.
    """
    if platform_name == "nt":
        raise ContainerError(
            "the engine container needs Linux or macOS; on Windows run vllm-sr inside WSL 2",
            "no_container_runtime",
        )
    chosen = requested
    source = "--container-runtime"
    if chosen is None and environ.get("CONTAINER_RUNTIME", "").strip():
        chosen = environ["CONTAINER_RUNTIME"].strip().lower()
        source = "CONTAINER_RUNTIME"
        if chosen not in RUNTIMES:
            raise ContainerError(
                f"CONTAINER_RUNTIME must be docker or podman, not {environ['CONTAINER_RUNTIME']!r}",
                "bad_flag",
            )
    if chosen is not None:
        if which(chosen) is None:
            other = next(r for r in RUNTIMES if r != chosen)
            choose = (
                f"--container-runtime {other}"
                if source == "--container-runtime"
                else f"CONTAINER_RUNTIME={other}, or unset CONTAINER_RUNTIME"
            )
            raise ContainerError(
                f"{source} {chosen}: no {chosen} command on PATH\n"
                f"  Install {INSTALL[chosen]}, or choose {other} ({choose})",
                "no_container_runtime",
            )
        return ContainerRuntime(chosen, chosen == "podman" or says_podman(chosen))
    if which("docker") is not None:
        try:
            return ContainerRuntime("docker", says_podman("docker"))
        except ContainerError as err:
            if err.code != "no_container_runtime" or which("podman") is None:
                raise
            says_podman("podman")  # it runs, or its own error is raised
            say(f"{str(err).split('; ')[0]}; using podman instead")
            return ContainerRuntime("podman", True)
    if which("podman") is not None:
        return ContainerRuntime("podman", True)
    raise ContainerError(
        "no container engine: neither docker nor podman is on PATH\n"
        f"  Install {INSTALL['podman']} or {INSTALL['docker']}, or run the runtime without "
        "a container from a source checkout (vllm-srun serve MODEL)",
        "no_container_runtime",
    )
