"""Print the NanoGuard package folder that ``metatronnanoguard`` installed, without importing it.

``python -m vllm_srun_nanoguard.locate`` prints the folder holding ``model.pt`` and
``tokenizer.pkl``, which ``vllm-srun serve`` takes; it exits 1 with the install
command when the distribution is missing.
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

DISTRIBUTION = "metatronnanoguard"
"""The PyPI distribution that ships the released model."""

ASSETS = "nanoguard/assets"
"""Where its files lie inside the distribution."""


def package_folder() -> Path | None:
    """The installed package folder, or ``None`` when the distribution is not installed.

    Found through the distribution's metadata (``importlib.metadata``), so none of the
    distribution's own code runs.
    """
    try:
        distribution = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    folder = Path(str(distribution.locate_file(ASSETS)))
    return folder if (folder / "model.pt").is_file() else None


def main() -> int:
    """Print the folder; 1 with the fix when it is missing."""
    folder = package_folder()
    if folder is None:
        print(
            f"{DISTRIBUTION} is not installed; pip install --no-deps {DISTRIBUTION}==0.1.0",
            file=sys.stderr,
        )
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
