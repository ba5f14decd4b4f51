"""jevcompat's report as an assertion message, for every test that runs the suite."""

from __future__ import annotations

from typing import Any


def failures(report: Any) -> str:
    """A jevcompat report as an assertion message: the summary, then each failed
    requirement with its findings' messages (and the exchange each came from), then what
    kept the run from a verdict and what was not tested."""
    lines = [
        f"jevcompat verdict {report.verdict!r} against {report.url} (model {report.model!r}): "
        f"{report.summary()}"
    ]
    if report.aborted:
        lines.append(f"aborted: {report.aborted}")
    for result in report.results:
        if result.status != "fail":
            continue
        lines.append(f"FAILED {result.level} {result.id} ({result.title}):")
        for finding in result.findings:
            where = f" at {finding.where}" if finding.where else ""
            lines.append(f"  - [{finding.case}] {finding.message}{where}")
            if finding.exchange is not None:
                exchange = report.exchanges[finding.exchange]
                lines.append(
                    f"    {exchange.method} {exchange.path} -> {exchange.status}: "
                    f"{str(exchange.response)[:300]}"
                )
    lines += [f"case error {case}: {error}" for case, error in report.case_errors]
    lines += [f"inconclusive: {note}" for note in report.inconclusive]
    lines += [
        f"not tested {r.level} {r.id}: {r.reason}" for r in report.results if r.status == "skip"
    ]
    return "\n".join(lines)
