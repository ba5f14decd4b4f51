"""Build eval/pii.jsonl from eval/pii_marked.txt: code-point gold spans, each checked.

Run ``python eval/build_pii.py`` after editing the marked file; ``make eval`` and the
test suite read pii.jsonl and check every span's offsets against its text again.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).parent
MARK = re.compile(r"\[\[([A-Z_]+)\|([^\]]+)\]\]")


def parse(line: str) -> dict[str, object]:
    """One marked line as ``{"text", "spans": [{"start", "end", "label", "text"}]}``."""
    text, spans, cursor = "", [], 0
    for match in MARK.finditer(line):
        text += line[cursor : match.start()]
        start = len(text)
        text += match.group(2)
        spans.append(
            {"start": start, "end": len(text), "label": match.group(1), "text": match.group(2)}
        )
        cursor = match.end()
    text += line[cursor:]
    if "[[" in text or "]]" in text:
        raise ValueError(f"unbalanced mark in: {line}")
    for span in spans:
        if text[span["start"] : span["end"]] != span["text"]:  # type: ignore[misc,index]
            raise ValueError(f"offsets do not read back in: {line}")
    return {"text": text, "spans": spans}


def main() -> int:
    lines = (HERE / "pii_marked.txt").read_text(encoding="utf-8").splitlines()
    rows = [parse(line) for line in lines if line.strip() and not line.startswith("#")]
    with (HERE / "pii.jsonl").open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{len(rows)} texts, {sum(len(r['spans']) for r in rows)} spans")  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
