"""The held-out evaluation sets (eval/): shape, gold offsets, and no overlap with fitting data."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EVAL = REPO / "eval"
LABELLED = REPO / "extensions" / "similarity_readout" / "calibration" / "labelled.jsonl"
RAMPART_KINDS = {
    "GIVEN_NAME", "SURNAME", "EMAIL", "PHONE", "URL", "TAX_ID", "BANK_ACCOUNT",
    "ROUTING_NUMBER", "GOVERNMENT_ID", "PASSPORT", "DRIVERS_LICENSE", "BUILDING_NUMBER",
    "STREET_NAME", "SECONDARY_ADDRESS", "CITY", "STATE", "ZIP_CODE",
}  # fmt: skip


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def test_every_gold_span_reads_back_its_text_in_code_points():
    pii = rows(EVAL / "pii.jsonl")
    assert len(pii) == 63
    spans = [(row["text"], span) for row in pii for span in row["spans"]]
    assert len(spans) == 133
    for text, span in spans:
        assert text[span["start"] : span["end"]] == span["text"]
        assert span["text"] == span["text"].strip()


def test_the_marked_file_rebuilds_pii_jsonl_exactly():
    sys.path.insert(0, str(EVAL))
    try:
        import build_pii
    finally:
        sys.path.remove(str(EVAL))
    marked = (EVAL / "pii_marked.txt").read_text("utf-8").splitlines()
    built = [build_pii.parse(line) for line in marked if line.strip() and not line.startswith("#")]
    assert built == rows(EVAL / "pii.jsonl")


def test_the_pii_set_covers_every_kind_the_runtime_claims():
    from vllm_srun.extensions.pii_patterns.recognizers import RECOGNIZERS

    claimed = RAMPART_KINDS | {r.label for r in RECOGNIZERS}
    found = Counter(span["label"] for row in rows(EVAL / "pii.jsonl") for span in row["spans"])
    assert set(found) == claimed
    assert len(claimed) == 22


def test_the_decisions_set_has_every_type_and_enough_option_sets():
    decisions = rows(EVAL / "decisions.jsonl")
    assert len(decisions) == 135
    assert Counter(r["question"]["type"] for r in decisions) == {
        "choice": 48,
        "noul": 48,
        "score": 39,
    }
    assert len({r["set"] for r in decisions}) == 10


def test_no_held_out_state_is_in_the_calibration_set():
    fitted = {r["state"].casefold() for r in rows(LABELLED)}
    held_out = {r["state"].casefold() for r in rows(EVAL / "decisions.jsonl")}
    assert not fitted & held_out
