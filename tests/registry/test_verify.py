"""Verification before any weight loads: digests, links, unlisted files, computed identity."""

from __future__ import annotations

import dataclasses
import hashlib
import os

import pytest

from tests.registry.conftest import NAME, REVISION, digests, write_cache
from vllm_srun.loader import LoadError
from vllm_srun.registry import identity, prepare, verify_package
from vllm_srun.registry.verify import is_loadable, link_root


def test_an_intact_package_is_pinned_with_its_weights_digest(package, entry):
    (package / "README.md").write_text("# tiny\n")
    (package / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    (package / "LICENSE").write_text("Apache-2.0\n")
    found = verify_package(package, entry=entry)
    weights = hashlib.sha256((package / "model.safetensors").read_bytes()).hexdigest()
    assert found.status == "pinned"
    assert found.model_sha256 == weights
    assert found.files == dict(entry.files)
    assert found.extra_files == (".gitattributes", "LICENSE", "README.md")
    assert found.identity == identity(entry.files)
    assert found.card() == {
        "model_sha256": weights,
        "verification": "pinned",
        "files": dict(sorted(entry.files.items())),
        "extra_files": [".gitattributes", "LICENSE", "README.md"],
    }


def test_a_tampered_byte_is_a_hash_mismatch_naming_the_file(package, entry):
    weights = package / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(LoadError) as raised:
        verify_package(package, entry=entry, source="the Hugging Face cache (/c)")
    message = str(raised.value)
    assert message.startswith(
        f"a file hash does not match: model.safetensors of {NAME} from the Hugging Face "
        f"cache (/c) has SHA-256 {hashlib.sha256(bytes(data)).hexdigest()}, the built-in "
        f"table pins {entry.files['model.safetensors']}."
    )
    assert message.endswith(
        "Delete that model from the cache (hf cache delete, or remove its "
        "models--acme--tiny-ner folder) and start again"
    )
    assert getattr(raised.value, "retryable", False) is False  # final


def test_a_changed_tokenizer_file_is_caught_too(package, entry):
    (package / "vocab.txt").write_text((package / "vocab.txt").read_text() + "extra\n")
    with pytest.raises(LoadError, match=r"^a file hash does not match: vocab\.txt of acme"):
        verify_package(package, entry=entry)


@pytest.mark.parametrize("extra", ["pytorch_model.bin", "onnx/model.onnx", "modeling_evil.py"])
def test_an_unlisted_loadable_file_is_refused(package, entry, extra):
    (package / extra).parent.mkdir(exist_ok=True)
    (package / extra).write_bytes(b"not in the table")
    with pytest.raises(LoadError) as raised:
        verify_package(package, entry=entry)
    assert str(raised.value).startswith(
        f"the package holds a file the built-in table does not list: {extra} in {NAME} "
        "would load unverified. Remove it from"
    )


def test_an_unlisted_config_the_family_reads_is_refused(package, entry):
    (package / "thresholds.json").write_text('{"PER": 0.9}')
    with pytest.raises(LoadError, match=r"does not list: thresholds\.json"):
        verify_package(package, entry=entry)


def test_a_missing_listed_file_is_an_error(package, entry):
    (package / "tokenizer.json").unlink()
    with pytest.raises(LoadError) as raised:
        verify_package(package, entry=entry)
    assert str(raised.value).startswith(
        f"a file the model needs is missing: tokenizer.json of {NAME} (the copy is "
        "incomplete or damaged)."
    )


def test_a_snapshot_may_link_into_its_blobs(tiny_package, entry, tmp_path):
    snapshot = write_cache(tmp_path / "cache", NAME, REVISION, tiny_package)
    assert (snapshot / "config.json").is_symlink()
    assert link_root(snapshot) == (tmp_path / "cache" / "models--acme--tiny-ner").resolve()
    assert verify_package(snapshot, entry=entry).status == "pinned"


def test_a_link_escaping_the_snapshot_is_refused(tiny_package, entry, tmp_path):
    snapshot = write_cache(tmp_path / "cache", NAME, REVISION, tiny_package)
    outside = tmp_path / "elsewhere" / "config.json"
    outside.parent.mkdir()
    outside.write_bytes((tiny_package / "config.json").read_bytes())  # same bytes, still refused
    (snapshot / "config.json").unlink()
    (snapshot / "config.json").symlink_to(outside)
    with pytest.raises(LoadError) as raised:
        verify_package(snapshot, entry=entry)
    assert str(raised.value).startswith(
        f"a link leaves the package: config.json points to {outside.resolve()}, outside "
        f"{(tmp_path / 'cache' / 'models--acme--tiny-ner').resolve()}."
    )


def test_a_link_into_another_repository_of_the_cache_is_refused(tiny_package, entry, tmp_path):
    other = write_cache(tmp_path / "cache", "acme/other", REVISION, tiny_package)
    snapshot = write_cache(tmp_path / "cache", NAME, REVISION, tiny_package)
    (snapshot / "vocab.txt").unlink()
    (snapshot / "vocab.txt").symlink_to(os.path.realpath(other / "vocab.txt"))
    with pytest.raises(LoadError, match=r"^a link leaves the package: vocab\.txt points to"):
        verify_package(snapshot, entry=entry)


def test_a_linked_folder_leaving_a_local_package_is_refused(package, tmp_path):
    (tmp_path / "outside").mkdir()
    (package / "1_Pooling").symlink_to(tmp_path / "outside", target_is_directory=True)
    with pytest.raises(LoadError, match=r"^a link leaves the package: 1_Pooling points to"):
        verify_package(package, entry=None)


def test_a_local_package_gets_a_computed_identity(package, tiny_package):
    (package / "README.md").write_text("notes")
    found = verify_package(package, entry=None)
    files = digests(tiny_package)
    assert found.status == "local"
    assert found.files == files
    assert found.extra_files == ("README.md",)
    # not built in: model_sha256 is the identity over every loadable file, so a changed
    # pooling config or vocabulary is another model even with the same weights
    assert found.model_sha256 == found.identity == identity(files)
    (package / "vocab.txt").write_text((package / "vocab.txt").read_text() + "extra\n")
    assert verify_package(package, entry=None).model_sha256 != found.model_sha256
    expected = hashlib.sha256(
        "".join(f"{path}\0{files[path]}\n" for path in sorted(files)).encode()
    ).hexdigest()
    assert found.identity == expected
    (package / "vocab.txt").write_text("changed")
    assert verify_package(package, entry=None).identity != expected


def test_a_local_package_with_two_weight_files_reports_the_identity(package, tiny_package):
    (package / "onnx").mkdir()
    (package / "onnx" / "model.onnx").write_bytes(b"graph")
    found = verify_package(package, entry=None)
    assert found.model_sha256 == found.identity == identity(found.files)
    assert "onnx/model.onnx" in found.files


def test_a_local_copy_of_a_built_in_model_is_that_model(package, entry):
    prepared = prepare(package, builtins={NAME: entry})
    assert prepared.verification.status == "pinned"
    assert (prepared.repo, prepared.revision, prepared.licence, prepared.parameters) == (
        NAME,
        REVISION,
        "apache-2.0",
        1234,
    )
    other = dataclasses.replace(entry, files={**entry.files, "vocab.txt": "0" * 64})
    local = prepare(package, builtins={NAME: other})
    assert (local.verification.status, local.repo, local.revision) == ("local", None, None)
    assert local.parameters == local.card()["parameters"] > 0  # counted from the weights


@pytest.mark.parametrize(
    ("path", "loadable"),
    [
        ("model.safetensors", True),
        ("onnx/model_q4.onnx", True),
        ("model.onnx_data", True),
        ("onnx/model.onnx.data", True),
        ("pytorch_model.bin", True),
        ("weights.pt", True),
        ("custom.py", True),
        ("scaler.pkl", True),
        ("model.gguf", True),
        ("sentencepiece.bpe.model", True),
        ("1_Pooling/config.json", True),
        ("tokenizer_config.json", True),
        ("README.md", False),
        ("LICENSE", False),
        (".gitattributes", False),
        ("data_config.json", False),
    ],
)
def test_loadable_files(path, loadable):
    assert is_loadable(path) is loadable
