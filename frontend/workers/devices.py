"""What ``auto`` means on this host, asked once of the worker command itself.

``<VLLM_SRUN_COMMAND> devices`` prints the host's devices as the runtime sees them;
its ``"auto"`` key is the device ``--device auto`` picks. The frontend asks once per
lifetime (at most 2 minutes) and plans ``auto`` placements on that device, so a CPU
worker gets its thread budget. When the question fails, each worker resolves
``auto`` itself and the log says ``auto_device_unresolved``.
"""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("vllm_sr.workers")

DEVICES_TIMEOUT = 120.0
"""Longest wait for ``<command> devices``, in seconds."""


class Devices:
    """The ``devices`` document of one worker command, asked for at most once.

    Args:
        command: the worker command (``VLLM_SRUN_COMMAND``, split).
        timeout: seconds the question may take.
    """

    def __init__(self, command: Sequence[str], timeout: float = DEVICES_TIMEOUT) -> None:
        self.command = list(command)
        self.timeout = timeout
        self._document: dict[str, Any] | None = None
        self._asked = False
        self.problem = ""

    def document(self) -> dict[str, Any] | None:
        """The parsed document, or ``None`` when the command failed (``problem`` says why)."""
        if not self._asked:
            self._asked = True
            self._document, self.problem = query(self.command, self.timeout)
            if self._document is None:
                log.warning(
                    "auto_device_unresolved: %s devices: %s; each worker resolves auto itself",
                    " ".join(self.command),
                    self.problem,
                )
        return self._document

    def auto(self) -> str | None:
        """The device ``auto`` picks here, or ``None`` when unknown."""
        document = self.document()
        value = document.get("auto") if document else None
        return value if isinstance(value, str) and value else None

    def count(self, accelerator: str) -> int:
        """How many devices of ``accelerator`` (``cuda``, ``rocm``) the runtime sees."""
        document = self.document()
        listed = document.get("devices") if document else None
        if not isinstance(listed, list):
            return 0
        return sum(1 for d in listed if isinstance(d, dict) and d.get("accelerator") == accelerator)


def query(command: Sequence[str], timeout: float) -> tuple[dict[str, Any] | None, str]:
    """Run ``<command> devices``; its JSON document, or ``None`` and why not."""
    try:
        done = subprocess.run(
            [*command, "devices"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError as err:
        return None, f"cannot run: {err.strerror}"
    except PermissionError as err:
        return None, f"cannot run: {err.strerror}"
    except subprocess.TimeoutExpired:
        return None, f"no answer within {timeout:g} s"
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return None, f"exit status {done.returncode}: {lines[-1] if lines else 'no output'}"
    try:
        document = json.loads(done.stdout)
    except ValueError:
        return None, "printed something other than a JSON document"
    if not isinstance(document, dict):
        return None, "printed something other than a JSON object"
    return document, ""
