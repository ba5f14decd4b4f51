"""The image before the run: presence by ``image inspect`` (which also answers for
digest references, upstream issue #3277) and ``--image-pull-policy``."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence

from .errors import ContainerError
from .runtime import ContainerRuntime

PULL_POLICIES = ("always", "ifnotpresent", "never")
"""``--image-pull-policy`` values; ``always`` is the default."""

INSPECT_TIMEOUT_S = 60.0
"""Bound of one ``image inspect``, in seconds."""

Call = Callable[[Sequence[str], bool], int]
"""Runs argv (``True``: quietly, output discarded) and answers its exit status."""


def call(argv: Sequence[str], quiet: bool) -> int:
    """Run ``argv``; its exit status (``image inspect`` bounded by
    :data:`INSPECT_TIMEOUT_S`, a pull not: it prints its own progress)."""
    if quiet:
        try:
            return subprocess.run(
                list(argv),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=INSPECT_TIMEOUT_S,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            return 124
    return subprocess.run(list(argv), check=False).returncode


def ensure_image(runtime: ContainerRuntime, image: str, policy: str, run: Call = call) -> str:
    """Make ``image`` present as ``policy`` asks: ``always`` pulls; ``ifnotpresent``
    pulls only when ``image inspect`` fails; ``never`` only checks.

    Returns:
        What was done: ``pulled`` or ``present``.

    Raises:
        ContainerError: an unknown policy (``bad_flag``), an absent image under
            ``never`` (``image_not_present``), or a failed pull (``pull_failed``).
    """
    if policy not in PULL_POLICIES:
        raise ContainerError(
            f"--image-pull-policy must be one of {', '.join(PULL_POLICIES)}, not {policy!r}",
            "bad_flag",
        )
    if policy != "always" and run([runtime.executable, "image", "inspect", image], True) == 0:
        return "present"
    if policy == "never":
        raise ContainerError(
            f"image {image} is not present and --image-pull-policy never forbids pulling "
            f"it; pull it ({runtime.executable} pull {image}), build it (docs/deploy.md), or "
            "use --image-pull-policy ifnotpresent",
            "image_not_present",
        )
    code = run([runtime.executable, "pull", image], False)
    if code != 0:
        raise ContainerError(
            f"{runtime.executable} pull {image} failed (exit {code}); check the image name "
            "and your registry login, or use a local image with --image-pull-policy never",
            "pull_failed",
        )
    return "pulled"
