"""Go durations (``10m``, ``30s``, ``1h30m``, ``1.5s``, ``500ms``): how upstream's
environment variables (``VLLM_SRUN_READY_TIMEOUT``) give a time, and how its messages
print one (``10m0s``)."""

from __future__ import annotations

import re

UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
"""Each Go duration unit in seconds."""

_PART = re.compile(r"([0-9]*\.?[0-9]*)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Seconds in a Go duration (``1h30m``, ``2.5s``, ``0``).

    Raises:
        ValueError: not a Go duration (a bare number other than 0, an unknown unit,
            a negative value).
    """
    value = text.strip()
    if value in ("0", "+0"):
        return 0.0
    if value.startswith("-"):
        raise ValueError(f"duration {text!r} is negative")
    value = value.removeprefix("+")
    if not value:
        raise ValueError("duration is empty; give a Go duration such as 10m or 90s")
    total, at = 0.0, 0
    while at < len(value):
        match = _PART.match(value, at)
        if match is None or match.group(1) in ("", "."):
            raise ValueError(
                f"{text!r} is not a Go duration; give a number and a unit (h, m, s, ms), "
                "such as 10m, 90s or 1h30m"
            )
        total += float(match.group(1)) * UNITS[match.group(2)]
        at = match.end()
    return total


def format_duration(seconds: float) -> str:
    """``seconds`` as Go prints a duration: ``10m0s``, ``1h30m0s``, ``1.5s``, ``500ms``."""
    nanos = round(seconds * 1e9)
    if nanos == 0:
        return "0s"
    sign = "-" if nanos < 0 else ""
    nanos = abs(nanos)
    if nanos < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if nanos >= size:
                return sign + _fraction(nanos, size) + unit
    hours, rest = divmod(nanos, 3600 * 1_000_000_000)
    minutes, rest = divmod(rest, 60 * 1_000_000_000)
    text = _fraction(rest, 1_000_000_000) + "s"
    if hours or minutes:
        text = f"{minutes}m" + text
    if hours:
        text = f"{hours}h" + text
    return sign + text


def _fraction(value: int, size: int) -> str:
    whole, part = divmod(value, size)
    if not part:
        return str(whole)
    digits = str(part).rjust(len(str(size)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"
