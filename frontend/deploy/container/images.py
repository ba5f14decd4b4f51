"""The image before the run: presence by ``image inspect`` (which also answers for
digest references, upstream issue #3277) and ``--image-pull-policy``."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from .diagnose import SAID_LINES, Answer, ask, build_command, daemon_error, pull_error
from .errors import ContainerError
from .probe import kill_group, spawn
from .runtime import ContainerRuntime

PULL_POLICIES = ("always", "ifnotpresent", "never")
"""``--image-pull-policy`` values; ``always`` is the default."""

INSPECT_TIMEOUT_S = 60.0
"""Bound of one ``image inspect``, in seconds."""

PULL_STOP_S = 3.0
"""How long an interrupted pull may take to end after SIGTERM before SIGKILL, in seconds."""

Call = Callable[[Sequence[str], bool], Answer]
"""Runs argv (``True``: quietly, output captured) and answers how it ended."""


def call(argv: Sequence[str], quiet: bool) -> Answer:
    """Run ``argv``: quietly bounded by :data:`INSPECT_TIMEOUT_S` (``image inspect``),
    or unbounded with its output shown as it comes (a pull: Docker prints its progress
    on stdout, Podman on stderr, which is passed through and its tail kept).

    The pull runs in its own process group: interrupted (Ctrl-C, SIGTERM), the group
    gets SIGTERM, then SIGKILL after :data:`PULL_STOP_S`."""
    if quiet:
        return ask(argv, INSPECT_TIMEOUT_S)
    tail: deque[str] = deque(maxlen=SAID_LINES)
    pull = spawn(argv, stderr=subprocess.PIPE, text=True, errors="replace", process_group=0)
    with pull:
        assert pull.stderr is not None
        try:
            for line in pull.stderr:
                sys.stderr.write(line)
                sys.stderr.flush()
                tail.append(line)
            code = pull.wait()
        except BaseException:
            kill_group(pull, signal.SIGTERM)
            try:
                pull.wait(PULL_STOP_S)
            except subprocess.TimeoutExpired:
                kill_group(pull)
            raise
    return Answer(code, stderr="".join(tail))


def ensure_image(
    runtime: ContainerRuntime,
    image: str,
    policy: str,
    run: Call = call,
    *,
    environ: Mapping[str, str] | None = None,
    accelerator: str = "cpu",
) -> str:
    """Make ``image`` present as ``policy`` asks: ``always`` pulls; ``ifnotpresent``
    pulls only when ``image inspect`` fails; ``never`` only checks.

    Args:
        environ: names the socket in a daemon error (``DOCKER_HOST``/``CONTAINER_HOST``).
        accelerator: ``cpu``, ``rocm`` or ``cuda``: the build command a message gives.

    Returns:
        What was done: ``pulled`` or ``present``.

    Raises:
        ContainerError: an unknown policy (``bad_flag``), the daemon not reachable
            (``daemon_unreachable``), an absent image under ``never`` or one the
            registry does not have (``image_not_present``), a pull the registry refused
            or could not be reached for (``pull_refused``), another failed pull
            (``pull_failed``).
    """
    if policy not in PULL_POLICIES:
        raise ContainerError(
            f"--image-pull-policy must be one of {', '.join(PULL_POLICIES)}, not {policy!r}",
            "bad_flag",
        )
    env = environ if environ is not None else {}
    if policy != "always":
        inspected = run([runtime.executable, "image", "inspect", image], True)
        if inspected.code == 0:
            return "present"
        down = daemon_error(runtime, env, inspected)
        if down is not None:
            raise down
    if policy == "never":
        cli = runtime.executable
        raise ContainerError(
            f"image {image} is not present and --image-pull-policy never forbids pulling it\n"
            f"  Pull it ({cli} pull {image}), build it in a checkout "
            f"({build_command(runtime, image, accelerator)}), or use --image-pull-policy "
            "ifnotpresent",
            "image_not_present",
        )
    pulled = run([runtime.executable, "pull", image], False)
    if pulled.code != 0:
        raise pull_error(runtime, env, image, accelerator, pulled)
    return "pulled"
