"""``load_model`` resolves and verifies before any weight loads, and reports the identity."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
from safetensors.torch import load_file

from tests.registry.conftest import NAME, REVISION, digests, write_cache
from vllm_srun.compose.loader import LoadError, LoadOptions, load_model
from vllm_srun.compose.registry import identity
from vllm_srun.plugins.host import load_catalog


@pytest.fixture
def catalog(entry):
    """A freshly composed catalog whose ``models`` layer also holds the tiny built-in entry."""
    composed = load_catalog()
    composed.layers["models"][NAME] = entry
    return composed


def test_a_local_package_loads_with_its_computed_identity(package, tiny_package):
    (package / "README.md").write_text("# tiny\n")
    served = load_model(package / ".", LoadOptions(device="cpu"), catalog=load_catalog())
    card = served.card()
    files = digests(tiny_package)
    assert served.name == "package" and served.identity is None
    assert (card["repo"], card["revision"], card["verification"]) == (None, None, "local")
    assert card["model_sha256"] == identity(files)  # every loadable file, not the weights alone
    assert card["model_sha256"] != files["model.safetensors"]
    assert card["files"] == files
    assert card["extra_files"] == ["README.md"]
    assert card["licence"] is None
    weights = load_file(package / "model.safetensors")
    assert card["parameters"] == sum(t.numel() for t in weights.values() if t.is_floating_point())


def test_a_local_copy_of_a_built_in_model_reports_it_under_its_own_id(package, catalog):
    served = load_model(package, LoadOptions(device="cpu"), catalog=catalog)
    card = served.card()
    assert served.name == "package" and served.identity == NAME
    assert (card["repo"], card["revision"], card["verification"]) == (NAME, REVISION, "pinned")


def test_a_built_in_name_loads_from_the_cache_as_pinned(tiny_package, catalog, tmp_path):
    cache = tmp_path / "cache"
    write_cache(cache, NAME, REVISION, tiny_package)
    served = load_model(
        NAME, LoadOptions(device="cpu", cache_dir=cache, offline=True), catalog=catalog
    )
    card = served.card()
    assert served.name == NAME and served.identity == NAME
    assert (card["repo"], card["revision"], card["verification"]) == (NAME, REVISION, "pinned")
    assert (card["licence"], card["parameters"]) == ("apache-2.0", 1234)
    assert card["id"] == NAME and card["family"] == "task_heads"
    answer = served.answer("classify", {"input": ["Ada Lovelace lived in London"]})
    assert answer["model"] == NAME


def test_a_tampered_cache_fails_before_any_weight_loads(
    tiny_package, catalog, tmp_path, monkeypatch
):
    damaged = shutil.copytree(tiny_package, tmp_path / "damaged")
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\1")
    cache = tmp_path / "cache"
    write_cache(cache, NAME, REVISION, damaged)
    for engine in catalog.layer("engines").values():
        monkeypatch.setattr(
            type(engine), "load", lambda *a, **k: pytest.fail("weights loaded before the check")
        )
    with pytest.raises(LoadError, match=r"^a file hash does not match: model\.safetensors"):
        load_model(NAME, LoadOptions(device="cpu", cache_dir=cache, offline=True), catalog=catalog)


def test_a_repository_without_a_revision_fails_before_loading(catalog):
    with pytest.raises(LoadError, match=r"^a revision is required: someone/encoder"):
        load_model("someone/encoder", LoadOptions(device="cpu"), catalog=catalog)
    with pytest.raises(LoadError, match=r"^revision must be a 40-hex commit, not 'main'"):
        load_model("someone/encoder", LoadOptions(revision="main", device="cpu"), catalog=catalog)


def test_a_built_in_entry_names_its_family(tiny_package, catalog, tmp_path):
    cache = tmp_path / "cache"
    write_cache(cache, NAME, REVISION, tiny_package)
    catalog.layers["models"][NAME] = dataclasses.replace(
        catalog.layers["models"][NAME], family="absent_family"
    )
    with pytest.raises(LoadError, match=r"^no family named 'absent_family' is installed"):
        load_model(NAME, LoadOptions(device="cpu", cache_dir=cache, offline=True), catalog=catalog)
