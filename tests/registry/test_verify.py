"""Verification before any weight loads: digests, links, unlisted files, computed identity."""

from __future__ import annotations

import dataclasses
import hashlib
import os

import pytest

from tests.registry.conftest import NAME, REVISION, digests, write_cache
from vllm_srun.compose.loader import LoadError
from vllm_srun.compose.registry import identity, prepare, verify_package
from vllm_srun.compose.registry.verify import count_parameters, is_loadable, link_root


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


def test_several_unlisted_files_are_all_named(package, entry):
    (package / "pytorch_model.bin").write_bytes(b"one")
    (package / "modeling_evil.py").write_bytes(b"two")
    with pytest.raises(LoadError) as raised:
        verify_package(package, entry=entry, source="the Hugging Face cache")
    assert str(raised.value) == (
        "the package holds a file the built-in table does not list: modeling_evil.py, "
        f"pytorch_model.bin in {NAME} from the Hugging Face cache would load unverified. "
        f"Remove them from {package.resolve()}, or serve a clean copy (a separate "
        "--cache-dir, or the mirror distribution)"
    )


def test_one_unlisted_file_says_remove_it(package, entry):
    (package / "scaler.pkl").write_bytes(b"pickle")
    with pytest.raises(LoadError) as raised:
        verify_package(package, entry=entry)
    assert str(raised.value) == (
        f"the package holds a file the built-in table does not list: scaler.pkl in {NAME} "
        f"would load unverified. Remove it from {package.resolve()}, or serve a clean copy "
        "(a separate --cache-dir, or the mirror distribution)"
    )


def test_several_missing_files_are_all_named(package, entry):
    (package / "vocab.txt").unlink()
    (package / "tokenizer.json").unlink()
    with pytest.raises(LoadError) as raised:
        verify_package(package, entry=entry)
    assert str(raised.value) == (
        f"a file the model needs is missing: tokenizer.json, vocab.txt of {NAME} (the copy is "
        "incomplete or damaged). Replace the package with an intact copy and start again"
    )


@pytest.mark.parametrize("source", ["", "mirror acme-tiny 1.0", "/srv/models/tiny"])
def test_a_mismatch_outside_the_cache_says_to_replace_the_package(package, entry, source):
    """The cache fix is only for the cache, the mirror fix only for an entry with a mirror."""
    (package / "vocab.txt").write_bytes(b"changed\n")
    changed = hashlib.sha256(b"changed\n").hexdigest()
    with pytest.raises(LoadError) as raised:
        verify_package(package, entry=entry, source=source)
    message = str(raised.value)
    where = f" from {source}" if source else ""
    assert message == (
        f"a file hash does not match: vocab.txt of {NAME}{where} has SHA-256 "
        f"{changed}, the built-in table pins "
        f"{entry.files['vocab.txt']}. The copy is damaged or the repository changed. "
        "Replace the package with an intact copy and start again"
    )


def test_parameters_count_float_and_bfloat_weights_only(tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file(
        {
            "dense.weight": torch.zeros(3, 4, dtype=torch.bfloat16),
            "dense.bias": torch.zeros(5, dtype=torch.float16),
            "norm.weight": torch.zeros(2, 3, dtype=torch.float32),
            "position_ids": torch.zeros(1, 7, dtype=torch.int64),
        },
        tmp_path / "model.safetensors",
    )
    assert count_parameters(tmp_path, {"model.safetensors": "0" * 64}) == 12 + 5 + 6
    assert count_parameters(tmp_path, {"onnx/model.onnx": "0" * 64}) is None


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
    found = verify_package(snapshot, entry=entry)
    assert found.status == "pinned"
    weights = hashlib.sha256((tiny_package / "model.safetensors").read_bytes()).hexdigest()
    assert found.model_sha256 == weights
    assert found.files == {
        name: hashlib.sha256((tiny_package / name).read_bytes()).hexdigest()
        for name in (
            "config.json",
            "model.safetensors",
            "special_tokens_map.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "vocab.txt",
        )
    }


def test_a_link_escaping_the_snapshot_is_refused(tiny_package, entry, tmp_path):
    snapshot = write_cache(tmp_path / "cache", NAME, REVISION, tiny_package)
    outside = tmp_path / "elsewhere" / "config.json"
    outside.parent.mkdir()
    outside.write_bytes((tiny_package / "config.json").read_bytes())  # same bytes, still refused
    (snapshot / "config.json").unlink()
    (snapshot / "config.json").symlink_to(outside)
    with pytest.raises(LoadError) as raised:
        verify_package(snapshot, entry=entry)
    assert str(raised.value) == (
        f"a link leaves the package: config.json points to {outside.resolve()}, outside "
        f"{(tmp_path / 'cache' / 'models--acme--tiny-ner').resolve()}. Links may only point "
        "inside the package directory (or, in the Hugging Face cache, inside the "
        "repository's models--owner--name folder); replace the link with the file itself or "
        "delete the model from the cache and start again"
    )


def test_a_link_into_another_repository_of_the_cache_is_refused(tiny_package, entry, tmp_path):
    other = write_cache(tmp_path / "cache", "acme/other", REVISION, tiny_package)
    snapshot = write_cache(tmp_path / "cache", NAME, REVISION, tiny_package)
    (snapshot / "vocab.txt").unlink()
    (snapshot / "vocab.txt").symlink_to(os.path.realpath(other / "vocab.txt"))
    with pytest.raises(LoadError, match=r"^a link leaves the package: vocab\.txt points to"):
        verify_package(snapshot, entry=entry)


def test_a_sibling_repository_of_the_cache_is_outside_the_repository(tiny_package, entry, tmp_path):
    """A relative link from one ``models--owner--name`` folder into a sibling one (here one
    whose name starts with the same letters) leaves the repository: refused, though the
    bytes are the ones the table pins."""
    cache = tmp_path / "cache"
    write_cache(cache, "acme/tiny-ner-v2", REVISION, tiny_package)
    snapshot = write_cache(cache, NAME, REVISION, tiny_package)
    blob = hashlib.sha256((tiny_package / "vocab.txt").read_bytes()).hexdigest()
    (snapshot / "vocab.txt").unlink()
    (snapshot / "vocab.txt").symlink_to(f"../../../models--acme--tiny-ner-v2/blobs/{blob}")
    assert (snapshot / "vocab.txt").read_bytes() == (tiny_package / "vocab.txt").read_bytes()
    with pytest.raises(LoadError) as raised:
        verify_package(snapshot, entry=entry, source="the Hugging Face cache")
    target = cache.resolve() / "models--acme--tiny-ner-v2" / "blobs" / blob
    assert str(raised.value).startswith(
        f"a link leaves the package: vocab.txt points to {target}, outside "
        f"{cache.resolve() / 'models--acme--tiny-ner'}. "
    )


def test_only_a_snapshot_inside_a_models_folder_may_link_into_its_parent(tmp_path):
    hub = tmp_path / "models--acme--x" / "snapshots" / "abc"
    dataset = tmp_path / "datasets--acme--x" / "snapshots" / "abc"
    refs = tmp_path / "models--acme--x" / "refs" / "abc"
    for folder in (hub, dataset, refs):
        folder.mkdir(parents=True)
    assert link_root(hub) == (tmp_path / "models--acme--x").resolve()
    assert link_root(dataset) == dataset.resolve()
    assert link_root(refs) == refs.resolve()
    # so a link from the dataset snapshot up into its own folder is refused
    (tmp_path / "datasets--acme--x" / "vocab.txt").write_text("a\n")
    (dataset / "vocab.txt").symlink_to("../../vocab.txt")
    with pytest.raises(LoadError, match=r"^a link leaves the package: vocab\.txt points to"):
        verify_package(dataset, entry=None)


def test_a_folder_linked_inside_the_repository_is_walked(tiny_package, tmp_path):
    snapshot = write_cache(tmp_path / "cache", NAME, REVISION, tiny_package)
    pooling = snapshot.parent.parent / "pooling"
    pooling.mkdir()
    (pooling / "config.json").write_bytes(b'{"pooling_mode_mean_tokens": true}')
    (snapshot / "1_Pooling").symlink_to("../../pooling", target_is_directory=True)
    found = verify_package(snapshot, entry=None, status="revision")
    assert found.status == "revision"
    assert sorted(found.files) == [
        "1_Pooling/config.json",
        "config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    assert (
        found.files["1_Pooling/config.json"]
        == hashlib.sha256(b'{"pooling_mode_mean_tokens": true}').hexdigest()
    )
    assert (
        found.files["vocab.txt"]
        == hashlib.sha256((tiny_package / "vocab.txt").read_bytes()).hexdigest()
    )


def test_each_real_folder_is_walked_once_even_through_links_back_up(package):
    for folder in ("a", "b"):
        (package / folder).mkdir()
        (package / folder / "config.json").write_text(folder)
        (package / folder / "up").symlink_to("..", target_is_directory=True)
    found = verify_package(package, entry=None)
    assert sorted(found.files) == [
        "a/config.json",
        "b/config.json",
        "config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    assert found.files["a/config.json"] == hashlib.sha256(b"a").hexdigest()
    assert found.files["b/config.json"] == hashlib.sha256(b"b").hexdigest()
    assert found.extra_files == ()


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
        ("models/2_Dense/config.json", True),
        ("a/b/tokenizer.json", True),
        ("tokenizer_config.json", True),
        ("README.md", False),
        ("LICENSE", False),
        (".gitattributes", False),
        ("data_config.json", False),
    ],
)
def test_loadable_files(path, loadable):
    assert is_loadable(path) is loadable
