"""The error every step of the foreground engine container raises."""

from __future__ import annotations


class ContainerError(Exception):
    """The container cannot run as asked; the message says why and what to do.

    Attributes:
        code: a stable short name of the failure (``no_container_runtime``,
            ``image_not_present``, ``pull_failed``, ``port_in_use``, ``bad_flag``,
            ``bad_models_file``, ``runtime_failed``), for scripts and tests.
    """

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code
