"""The errors a model load raises, and which of them can pass.

:class:`LoadError` carries the operator phrase the troubleshooting guide
uses (``needs about X GiB``, ``a file hash does not match``, ...) and whether
the runtime should try again; :func:`is_retryable` also recognises the torch
and driver errors that mean a device is full or busy for now.
"""

from __future__ import annotations

import sys

RETRYABLE_RUNTIME_MESSAGES = ("out of memory", "busy")
"""A ``RuntimeError`` whose message holds one of these is a passing cause: CUDA and HIP
report an exhausted or busy device (``CUDA error: out of memory``, ``all CUDA-capable
devices are busy or unavailable``) as plain ``RuntimeError``."""


class LoadError(Exception):
    """A model cannot be loaded; the message starts with the operator phrase.

    Args:
        message: the reason (``needs about 3.20 GiB, 1.10 GiB free on cuda:0; ...``).
        retryable: whether the cause can pass (no device with enough free memory,
            a busy device, an interrupted download): the runtime loads the model
            again (``--load-attempts``); other causes fail the model at once.
    """

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


def is_retryable(err: BaseException) -> bool:
    """Whether a load failure can pass: a retryable :class:`LoadError`, a torch
    out-of-memory error, or a ``RuntimeError`` saying the device is out of memory or busy."""
    if isinstance(err, LoadError):
        return err.retryable
    torch = sys.modules.get("torch")  # a torch error exists only once torch is imported
    if torch is not None and isinstance(err, torch.OutOfMemoryError):
        return True
    if isinstance(err, RuntimeError):
        message = str(err).lower()
        return any(phrase in message for phrase in RETRYABLE_RUNTIME_MESSAGES)
    return False


__all__ = ["RETRYABLE_RUNTIME_MESSAGES", "LoadError", "is_retryable"]
