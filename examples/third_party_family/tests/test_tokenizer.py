"""The pickled tokenizer: read without running it, converted once, encoded by tiktoken."""

from __future__ import annotations

import collections
import hashlib
import json
import pickle

import pytest
from vllm_srun_nanoguard.tokenizer import (
    RANKS,
    SETTINGS,
    Tokenizer,
    converted,
    parse_ranks,
    ranks_text,
    read_pickled_encoding,
)

from vllm_srun.plugins import PackageError


def test_the_fixture_pickle_reads_as_its_encoding_state(package):
    state = read_pickled_encoding((package / "tokenizer.pkl").read_bytes())
    assert state.name == "fixture"
    assert len(state.ranks) == 256 and state.ranks[b"a"] == 97
    assert dict(state.special_tokens) == {
        "<|reserved_0|>": 256,
        "<|reserved_1|>": 257,
        "<|reserved_2|>": 258,
        "<|reserved_3|>": 259,
    }
    assert state.vocabulary == 260


def test_a_pickle_naming_another_global_is_refused_before_it_runs():
    data = pickle.dumps(collections.OrderedDict(a=1))
    with pytest.raises(PackageError) as caught:
        read_pickled_encoding(data)
    assert str(caught.value) == (
        "tokenizer.pkl cannot be read: tokenizer.pkl names collections.OrderedDict; "
        "only tiktoken.core.Encoding is read"
    )


def test_a_pickle_of_plain_data_is_not_an_encoding():
    with pytest.raises(PackageError, match=r"must hold a pickled tiktoken\.core\.Encoding"):
        read_pickled_encoding(pickle.dumps({"name": "x"}))


def test_ranks_round_trip_in_tiktoken_format():
    ranks = {b"\x00": 0, b" the": 1, b"\xff\xfe": 2}
    text = ranks_text(ranks)
    assert text == b"AA== 0\nIHRoZQ== 1\n//4= 2\n"
    assert parse_ranks(text) == ranks
    with pytest.raises(ValueError, match="line 1 is not 'base64 rank'"):
        parse_ranks(b"not-base64! 0\n")


def test_conversion_is_keyed_by_the_pickles_digest_and_done_once(package, cache):
    digest = hashlib.sha256((package / "tokenizer.pkl").read_bytes()).hexdigest()
    folder = converted(package)
    assert folder == cache / "nanoguard" / "tokenizers" / digest
    settings = json.loads((folder / SETTINGS).read_text())
    assert settings["source_sha256"] == digest
    assert settings["special_tokens"]["<|reserved_1|>"] == 257
    assert (folder / RANKS).read_bytes().splitlines()[97] == b"YQ== 97"
    written = (folder / SETTINGS).stat().st_mtime_ns
    assert converted(package) == folder
    assert (folder / SETTINGS).stat().st_mtime_ns == written


def test_tokenizer_puts_bos_first_and_reads_special_text_as_text(package):
    tokenizer = Tokenizer(converted(package))
    assert (tokenizer.bos_id, tokenizer.pad_id, tokenizer.vocabulary) == (256, 257, 260)
    assert tokenizer.encode(["hi", ""]) == [[256, 104, 105], [256]]
    assert tokenizer.encode(["<|reserved_1|>"])[0][:3] == [256, 60, 124]


def test_a_tampered_ranks_file_is_refused(package):
    folder = converted(package)
    ranks = folder / RANKS
    original = ranks.read_bytes()
    try:
        ranks.write_bytes(original.replace(b"YQ== 97", b"YQ== 98"))
        with pytest.raises(ValueError, match="does not match its SHA-256"):
            Tokenizer(folder)
    finally:
        ranks.write_bytes(original)
