"""The error every step of the foreground engine container raises."""

from __future__ import annotations


class ContainerError(Exception):
    """The container cannot run as asked; the message says why and what to do.

    Attributes:
        code: a stable short name of the failure, for scripts and tests:
            ``no_container_runtime`` (no docker or podman command),
            ``daemon_unreachable`` (the daemon or Podman service down, its socket
            refused), ``image_not_present`` (not here under ``--image-pull-policy never``,
            or not in the registry), ``pull_refused`` (login, rate limit, network),
            ``pull_failed`` (another failed pull), ``port_in_use``, ``bad_flag``,
            ``bad_models_file``, ``bad_mount`` (a host path ``-v`` cannot take),
            ``runtime_failed`` (the CLI hangs, or failed otherwise).
    """

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code
