"""The shared tokenizer loaders: no truncation or padding, clear errors naming the files, and
the encoder loader (``tokenizers`` alone) equal to transformers' ``AutoTokenizer``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vllm_srun.compose.registry import prepare
from vllm_srun.plugins.host import load_catalog
from vllm_srun.plugins.tokenizing import load_encoder_tokenizer, load_fast_tokenizer

from ..fixtures import write_task_package


def test_the_backend_never_truncates_or_pads(tmp_path):
    package = write_task_package(tmp_path, "bert", "pooled")
    tokenizer, backend = load_fast_tokenizer(package)
    assert tokenizer.is_fast
    assert backend.truncation is None and backend.padding is None
    long = " ".join(["word"] * 400)
    assert len(backend.encode(long).ids) > 400  # past any max length the files may set
    encoder = load_encoder_tokenizer(package)
    assert encoder.loaded_by == "tokenizers"
    assert encoder.backend.truncation is None and encoder.backend.padding is None
    assert len(encoder.backend.encode(long).ids) > 400


def test_a_broken_tokenizer_file_is_named(tmp_path):
    package = write_task_package(tmp_path, "bert", "pooled")
    text = (package / "tokenizer.json").read_text()
    (package / "tokenizer.json").write_text(text[: len(text) // 2])
    with pytest.raises(ValueError, match=r"^the tokenizer files \(tokenizer.json, "):
        load_fast_tokenizer(package)
    with pytest.raises(ValueError, match=r"^the tokenizer files \(tokenizer.json, "):
        load_encoder_tokenizer(package)


# -- the encoder loader equals AutoTokenizer -----------------------------------------------

TEXTS = [
    "Hello, World! Café déjà vu — naïve résumé.",
    "call me at 212-555-0147 or jane.doe@example.org",
    "text that spells [SEP] and [CLS] and [PAD] [MASK] [UNK] tokens",
    "[SEP]",
    "中文字符 and 日本語 mixed with emoji 🙂👍🏽",
    "   leading and trailing spaces\tand\ttabs\n",
    "",
    "UPPERCASE AND MiXeD CaSe",
    " ".join(["antidisestablishmentarianism is a long word"] * 120),  # > 512 tokens
]
PAIRS = [
    ("what is the capital of France?", "Paris is the capital of France."),
    ("query [SEP] injected", "document with [CLS] inside"),
    ("", "an empty first text"),
    (" ".join(["long"] * 300), " ".join(["pair"] * 300)),
]


def _package(name: str) -> Path:
    catalog = load_catalog()
    return prepare(name, builtins=catalog.layer("models"), offline=True).source.path


@pytest.fixture(
    scope="module", params=["sentence-transformers/all-MiniLM-L6-v2", "arcjet/rampart-pii"]
)
def builtin_package(request: pytest.FixtureRequest) -> Path:
    return _package(request.param)


def _encodings(backend: Any) -> list[tuple[Any, ...]]:
    """What a family reads of every text and pair, special tokens on and off."""
    backend.encode_special_tokens = True  # request text is read as text
    found = []
    for text in TEXTS:
        for special in (True, False):
            e = backend.encode(text, add_special_tokens=special)
            found.append((e.ids, e.type_ids, e.offsets, e.special_tokens_mask, e.attention_mask))
    for first, second in PAIRS:
        e = backend.encode(first, second, add_special_tokens=True)
        found.append((e.ids, e.type_ids, e.offsets, e.special_tokens_mask, e.sequence_ids))
    for e in backend.encode_batch(TEXTS, add_special_tokens=False):
        found.append((e.ids, e.offsets))
    return found


def _assert_same(package: Path) -> None:
    tokenizer, reference = load_fast_tokenizer(package)
    encoder = load_encoder_tokenizer(package)
    assert encoder.backend.to_str() == reference.to_str()
    assert encoder.pad_id == tokenizer.pad_token_id
    assert encoder.special_tokens == {
        role: str(value)
        for role, value in tokenizer.special_tokens_map.items()
        if role != "additional_special_tokens"
    }
    assert _encodings(encoder.backend) == _encodings(reference)


def test_the_builtin_encoders_read_the_same_tokens_without_transformers(builtin_package):
    """MiniLM and Rampart: the same serialised tokenizer, pad id, special tokens, and the same
    ids, type ids, offsets and special-token masks of texts, pairs (one spelling ``[SEP]``)
    and texts longer than the model's limit."""
    encoder = load_encoder_tokenizer(builtin_package)
    assert encoder.loaded_by == "tokenizers"
    _assert_same(builtin_package)


def test_the_builtin_encoders_tokenise_as_transformers_calls_them(builtin_package):
    """The ids transformers' own call gives (text spelling special tokens split as text)."""
    tokenizer, _ = load_fast_tokenizer(builtin_package)
    backend = load_encoder_tokenizer(builtin_package).backend
    backend.encode_special_tokens = True
    for first, second in [(t, None) for t in TEXTS] + PAIRS:
        called = tokenizer(
            first,
            second,
            split_special_tokens=True,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
        )
        encoded = backend.encode(first, second)
        assert called["input_ids"] == encoded.ids
        assert called["token_type_ids"] == encoded.type_ids
        assert called["special_tokens_mask"] == encoded.special_tokens_mask
        assert [tuple(o) for o in called["offset_mapping"]] == encoded.offsets


def _copy_tokenizer(source: Path, target: Path) -> Path:
    target.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        if (source / name).is_file():
            shutil.copy(source / name, target / name)
    return target


def _edit(path: Path, change: dict[str, Any], drop: tuple[str, ...] = ()) -> None:
    document = json.loads(path.read_text()) if path.is_file() else {}
    document.update(change)
    for key in drop:
        document.pop(key, None)
    path.write_text(json.dumps(document))


VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any], tuple[str, ...]]] = {
    # name: (tokenizer_config changes, special_tokens_map changes, config keys dropped)
    "cased_config_over_uncased_file": ({"do_lower_case": False}, {}, ()),
    "strip_accents": ({"strip_accents": True}, {}, ()),
    "no_chinese_split": ({"tokenize_chinese_chars": False}, {}, ()),
    "class_defaults_only": ({}, {}, ("pad_token", "unk_token", "cls_token", "sep_token")),
    "new_additional_special_token": (
        {},
        {
            "additional_special_tokens": [
                {
                    "content": "<ent>",
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "single_word": False,
                }
            ],
            "mask_token": {
                "content": "[MASK]",
                "lstrip": True,
                "rstrip": False,
                "normalized": False,
                "single_word": False,
            },
        },
        (),
    ),
    "generic_class_without_pad": (
        {"tokenizer_class": "PreTrainedTokenizerFast"},
        {},
        ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"),
    ),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_configuration_variants_read_as_transformers_reads_them(tmp_path, variant):
    """What transformers changes after reading tokenizer.json (normaliser settings, special
    tokens from the maps, added tokens, class defaults) is repeated exactly."""
    config, specials, dropped = VARIANTS[variant]
    package = _copy_tokenizer(_package("sentence-transformers/all-MiniLM-L6-v2"), tmp_path / "p")
    _edit(package / "tokenizer_config.json", config, dropped)
    if specials:
        _edit(package / "special_tokens_map.json", specials)
    if dropped and (package / "special_tokens_map.json").is_file():
        _edit(package / "special_tokens_map.json", {}, dropped)
    assert load_encoder_tokenizer(package).loaded_by == "tokenizers"
    _assert_same(package)


def test_added_tokens_decoder_of_the_config_is_applied(tmp_path):
    """Rampart's config style (``added_tokens_decoder``): a new token there is added as
    transformers adds it, and ``special_tokens_map.json`` is then not read."""
    package = _copy_tokenizer(_package("arcjet/rampart-pii"), tmp_path / "p")
    config = json.loads((package / "tokenizer_config.json").read_text())
    size = len((package / "vocab.txt").read_text().splitlines())
    config["added_tokens_decoder"][str(size)] = {
        "content": "<person>",
        "lstrip": False,
        "normalized": True,
        "rstrip": False,
        "single_word": False,
        "special": False,
    }
    (package / "tokenizer_config.json").write_text(json.dumps(config))
    _edit(package / "special_tokens_map.json", {"pad_token": "[MASK]"})  # ignored, as there
    _assert_same(package)
    assert load_encoder_tokenizer(package).backend.token_to_id("<person>") == size


def test_another_tokenizer_class_goes_through_transformers(tmp_path):
    package = write_task_package(tmp_path, "roberta", "pooled")
    _edit(package / "tokenizer_config.json", {"tokenizer_class": "RobertaTokenizer"})
    assert load_encoder_tokenizer(package).loaded_by == "transformers"


def test_the_encoder_loader_imports_neither_transformers_nor_torch():
    package = _package("arcjet/rampart-pii")
    code = (
        "import sys; from pathlib import Path\n"
        "from vllm_srun.plugins.tokenizing import load_encoder_tokenizer\n"
        f"t = load_encoder_tokenizer(Path({str(package)!r}))\n"
        "print(t.loaded_by, sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["tokenizers", "[]"]
