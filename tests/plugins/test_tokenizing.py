"""The shared tokenizer loader: no truncation or padding, clear errors naming the files."""

from __future__ import annotations

import pytest

from vllm_srun.plugins.tokenizing import load_fast_tokenizer

from ..fixtures import write_task_package


def test_the_backend_never_truncates_or_pads(tmp_path):
    package = write_task_package(tmp_path, "bert", "pooled")
    tokenizer, backend = load_fast_tokenizer(package)
    assert tokenizer.is_fast
    assert backend.truncation is None and backend.padding is None
    long = " ".join(["word"] * 400)
    assert len(backend.encode(long).ids) > 400  # past any max length the files may set


def test_a_broken_tokenizer_file_is_named(tmp_path):
    package = write_task_package(tmp_path, "bert", "pooled")
    text = (package / "tokenizer.json").read_text()
    (package / "tokenizer.json").write_text(text[: len(text) // 2])
    with pytest.raises(ValueError, match=r"^the tokenizer files \(tokenizer.json, "):
        load_fast_tokenizer(package)
