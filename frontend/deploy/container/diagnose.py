"""Why a container CLI call failed, in terms a user can act on.

:func:`reach_engine` asks the engine for its server version before anything runs,
so that a daemon (or Podman service) that is down is named as such; the other
functions read the stderr of ``image inspect``, ``pull`` and ``container inspect``
and turn it into a :class:`~.errors.ContainerError` whose code names the cause:
``daemon_unreachable``, ``image_not_present`` or ``pull_refused``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence

from .errors import ContainerError
from .probe import Answer, ask
from .runtime import PROBE_TIMEOUT_S, ContainerRuntime

__all__ = ["Answer", "ask", "daemon_error", "pull_error", "reach_engine", "said"]

SAID_LINES = 6
"""The last lines of the engine's stderr a message quotes."""

DOCKER_SOCKET = "unix:///var/run/docker.sock"
"""Where the docker CLI looks without ``DOCKER_HOST`` or a context."""

PODMAN_HINT = "or use Podman, which runs without a daemon (--container-runtime podman)"

_DAEMON_DOWN = re.compile(
    r"cannot connect to the docker daemon|is the docker daemon running|error during connect"
    r"|cannot connect to podman|unable to connect to podman",
    re.IGNORECASE,
)
_SOCKET_DENIED = re.compile(
    r"permission denied while trying to connect to the docker daemon"
    r"|dial unix \S+: connect: permission denied",
    re.IGNORECASE,
)
_AUTH = re.compile(
    r"unauthorized|denied|authentication required|incorrect username or password",
    re.IGNORECASE,
)
_RATE = re.compile(r"toomanyrequests|too many requests|rate limit", re.IGNORECASE)
_NETWORK = re.compile(
    r"no such host|i/o timeout|network is unreachable|connection refused|connection reset"
    r"|tls handshake timeout|client\.timeout exceeded|proxyconnect|x509:|certificate",
    re.IGNORECASE,
)
_NOT_FOUND = re.compile(
    r"manifest unknown|not found|name unknown|no such image|image not known|does not exist",
    re.IGNORECASE,
)
_ERROR_LINE = re.compile(r"error|cannot connect|permission denied", re.IGNORECASE)
_SOCKET_AT = re.compile(r"daemon(?: socket)? at ((?:unix|tcp|ssh|npipe|fd)://\S+?)[.:]?(?=\s|$)")
_DIAL_UNIX = re.compile(r"dial unix (/\S+?):")
_PANIC = re.compile(r"^panic: ")
HOST_SCHEMES = {"docker": ("unix", "tcp", "ssh"), "podman": ("unix", "tcp", "ssh")}
"""The address schemes the CLI's ``DOCKER_HOST`` / ``CONTAINER_HOST`` may name here."""


def said(runtime: ContainerRuntime, stderr: str) -> str:
    """The engine's own words, quoted on their own lines: from its first error line
    when there is one (Podman's pull progress shares stderr), at most the last
    :data:`SAID_LINES`; of a Go panic, its ``panic:`` line only."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    panics = [line for line in lines if _PANIC.match(line)]
    errors = [i for i, line in enumerate(lines) if _ERROR_LINE.match(line)]
    # A Go panic: its message, not the stack frames under it.
    lines = panics[:1] or lines[errors[0] if errors else 0 :][-SAID_LINES:]
    if not lines:
        return ""
    name = os.path.basename(runtime.executable)
    return f"\n  {name} said: " + "\n    ".join(lines)


def _socket(runtime: ContainerRuntime, environ: Mapping[str, str], stderr: str) -> str:
    """The socket the engine tried and what chose it, e.g. ``unix:///x.sock
    (set by DOCKER_HOST)``: from its message, else from the environment or the default."""
    variable = "CONTAINER_HOST" if runtime.podman else "DOCKER_HOST"
    found = _SOCKET_AT.search(stderr)
    dialled = _DIAL_UNIX.search(stderr)
    if found:
        where = found.group(1)
    elif dialled:
        where = "unix:///" + dialled.group(1).lstrip("/")
    elif environ.get(variable):
        where = environ[variable]
    elif runtime.podman:
        uid = os.getuid() if hasattr(os, "getuid") else 0
        where = (
            f"unix:///run/user/{uid}/podman/podman.sock"
            if uid
            else "unix:///run/podman/podman.sock"
        )
    else:
        where = DOCKER_SOCKET
    if environ.get(variable):
        return f"{where} (set by {variable})"
    if not runtime.podman and environ.get("DOCKER_CONTEXT"):
        return f"{where} (docker context {environ['DOCKER_CONTEXT']})"
    return f"{where} (the default)"


def host_error(
    runtime: ContainerRuntime, environ: Mapping[str, str], answer: Answer
) -> ContainerError | None:
    """The ``daemon_unreachable`` error of a ``CONTAINER_HOST`` (Podman) or ``DOCKER_HOST``
    (Docker) that is set but empty (Podman) or of a scheme the CLI cannot use (``fd://`` makes
    the docker CLI panic), else ``None``."""
    variable = "CONTAINER_HOST" if runtime.podman else "DOCKER_HOST"
    value = environ.get(variable)
    if value is None or (not value and not runtime.podman):  # docker reads "" as unset
        return None
    scheme = value.partition("://")[0].lower() if "://" in value else ""
    if scheme in HOST_SCHEMES["podman" if runtime.podman else "docker"]:
        return None
    default = "unix:///run/podman/podman.sock" if runtime.podman else DOCKER_SOCKET
    shown = f"{variable}={value!r}" if value else f"{variable} is set but empty"
    return ContainerError(
        f"{shown}: not an address {os.path.basename(runtime.executable)} can use "
        f"(unix://, tcp:// or ssh://){said(runtime, answer.stderr)}\n"
        f"  Unset {variable}, or set it to {default}",
        "daemon_unreachable",
    )


def daemon_error(
    runtime: ContainerRuntime, environ: Mapping[str, str], answer: Answer
) -> ContainerError | None:
    """The ``daemon_unreachable`` error ``answer`` shows (the daemon or Podman service
    down, its socket refused to this user, or no answer in time), else ``None``."""
    where = _socket(runtime, environ, answer.stderr)
    quoted = said(runtime, answer.stderr)
    if runtime.podman:
        unset = (
            "unset CONTAINER_HOST to run containers with the local podman, which needs no service"
            if environ.get("CONTAINER_HOST")
            else "check the connection podman uses (podman system connection list)"
        )
        fix = (
            "Start the service (systemctl --user start podman.socket, as root systemctl start "
            f"podman.socket, or podman system service --time=0 &), or {unset}"
        )
        if answer.timed_out:
            return ContainerError(
                f"Podman's service at {where} did not answer within {PROBE_TIMEOUT_S:g} s\n  {fix}",
                "daemon_unreachable",
            )
        if _DAEMON_DOWN.search(answer.stderr) or _SOCKET_DENIED.search(answer.stderr):
            return ContainerError(
                f"Podman's service is not reachable at {where}{quoted}\n  {fix}",
                "daemon_unreachable",
            )
        return None
    if answer.timed_out:
        return ContainerError(
            f"the Docker daemon at {where} did not answer within {PROBE_TIMEOUT_S:g} s\n"
            f"  Restart it (sudo systemctl restart docker), {PODMAN_HINT}",
            "daemon_unreachable",
        )
    if _SOCKET_DENIED.search(answer.stderr):
        return ContainerError(
            f"this user may not use the Docker daemon's socket at {where}{quoted}\n"
            "  Add yourself to the docker group (sudo usermod -aG docker $USER, then log in "
            f"again), point DOCKER_HOST at a rootless Docker's socket, {PODMAN_HINT}",
            "daemon_unreachable",
        )
    if _DAEMON_DOWN.search(answer.stderr):
        return ContainerError(
            f"the Docker daemon is not reachable at {where}{quoted}\n"
            "  Start it (sudo systemctl start docker), point DOCKER_HOST at the socket it "
            f"listens on, {PODMAN_HINT}",
            "daemon_unreachable",
        )
    return None


def reach_engine(
    runtime: ContainerRuntime,
    environ: Mapping[str, str],
    run: Callable[[Sequence[str]], Answer] = lambda argv: ask(argv, PROBE_TIMEOUT_S),
) -> None:
    """Ask the engine for its server version (``<cli> version --format
    {{.Server.Version}}``, bounded by :data:`PROBE_TIMEOUT_S`); local Podman answers
    itself, Docker and remote Podman ask their daemon.

    Raises:
        ContainerError: the daemon or service is not reachable (``daemon_unreachable``),
            or the engine failed otherwise (``runtime_failed``, its message quoted).
    """
    argv = [runtime.executable, "version", "--format", "{{.Server.Version}}"]
    answer = run(argv)
    if answer.code == 0:
        return
    error = host_error(runtime, environ, answer) or daemon_error(runtime, environ, answer)
    if error is not None:
        raise error
    raise ContainerError(
        f"`{' '.join(argv)}` failed (exit {answer.code}){said(runtime, answer.stderr)}",
        "runtime_failed",
    )


def registry_of(image: str) -> str:
    """The registry host of an image reference (``docker.io`` for a bare name)."""
    first, slash, _ = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def build_command(runtime: ContainerRuntime, image: str, accelerator: str) -> str:
    """The Dockerfile's build command for ``image`` (run in a checkout's top folder)."""
    arg = "" if accelerator == "cpu" else f"--build-arg ACCELERATOR={accelerator} "
    return f"{os.path.basename(runtime.executable)} build {arg}-t {image} ."


def pull_error(
    runtime: ContainerRuntime,
    environ: Mapping[str, str],
    image: str,
    accelerator: str,
    answer: Answer,
) -> ContainerError:
    """What a failed ``pull`` of ``image`` means: ``daemon_unreachable``, ``pull_refused``
    (login, rate limit, network), ``image_not_present`` (the registry has no such
    image), else ``pull_failed``; each with the engine's words and the fix."""
    down = daemon_error(runtime, environ, answer)
    if down is not None:
        return down
    cli = os.path.basename(runtime.executable)
    registry = registry_of(image)
    build = build_command(runtime, image, accelerator)
    quoted = said(runtime, answer.stderr)
    local = f"build it yourself ({build}) and pass --image {image} --image-pull-policy never"
    if _RATE.search(answer.stderr):
        return ContainerError(
            f"the registry {registry} refused the pull of {image}: too many pulls{quoted}\n"
            f"  Log in ({cli} login {registry}) for a higher limit, wait and try again, or "
            "pull from a mirror (--image MIRROR/NAME:TAG)",
            "pull_refused",
        )
    if _AUTH.search(answer.stderr):
        return ContainerError(
            f"the registry {registry} refused the pull of {image}{quoted}\n"
            f"  Log in ({cli} login {registry}) as an account that may read it, check the "
            f"image name, or {local}",
            "pull_refused",
        )
    if _NETWORK.search(answer.stderr):
        proxy = (
            "the proxy the Docker daemon uses (HTTPS_PROXY in its service's environment)"
            if not runtime.podman
            else "HTTPS_PROXY"
        )
        return ContainerError(
            f"the registry {registry} is not reachable to pull {image}{quoted}\n"
            f"  Check the network and {proxy}, pull from a mirror (--image MIRROR/NAME:TAG), "
            f"or load the image here ({cli} save on a machine that can pull it, {cli} load "
            "here) and pass --image-pull-policy never",
            "pull_refused",
        )
    if _NOT_FOUND.search(answer.stderr):
        return ContainerError(
            f"the registry {registry} has no image {image}{quoted}\n"
            f"  Check the image name and tag (--image), or {local}",
            "image_not_present",
        )
    return ContainerError(
        f"{cli} pull {image} failed (exit {answer.code}){quoted}\n"
        f"  Check the image name and the registry, or {local}",
        "pull_failed",
    )
