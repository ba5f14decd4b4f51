"""The digest cache: a file unchanged since it was hashed is not read again; a changed
one is, whatever stays equal (size, mtime); a damaged cache file is ignored with a warning."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

import pytest

from tests.registry.conftest import NAME
from vllm_srun.compose.loader import LoadError
from vllm_srun.compose.registry import DigestCache, prepare, verify_package
from vllm_srun.compose.registry import digests as digests_module
from vllm_srun.compose.registry.digests import CACHE_FILE, SETTLE_NS, runtime_cache_root

HOUR_NS = 3600 * 10**9
LOGGER = "vllm_srun.compose.registry.digests"


def ahead() -> int:
    """A clock an hour ahead: every file written by the test has settled."""
    return time.time_ns() + HOUR_NS


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x01" * 4096)
    return path


@pytest.fixture
def cache_file(tmp_path: Path) -> Path:
    return tmp_path / "cache" / CACHE_FILE


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files the cache reads, in order."""
    seen: list[str] = []
    real = digests_module.sha256_file

    def recording(path: Path) -> str:
        seen.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(digests_module, "sha256_file", recording)
    return seen


def recorded(cache_file: Path, weights: Path) -> None:
    """Hash ``weights`` once through a cache and save it."""
    cache = DigestCache(cache_file, clock=ahead)
    cache.sha256(weights)
    cache.save()


def test_an_unchanged_file_is_answered_from_the_cache_of_an_earlier_start(
    cache_file, weights, hashed
):
    first = DigestCache(cache_file, clock=ahead)
    assert first.sha256(weights) == sha(b"\x01" * 4096)
    first.save()
    assert hashed == ["model.safetensors"]
    stat = weights.stat()
    assert json.loads(cache_file.read_text()) == {
        "version": 1,
        "files": {
            os.path.realpath(weights): {
                "device": stat.st_dev,
                "inode": stat.st_ino,
                "size": 4096,
                "mtime_ns": stat.st_mtime_ns,
                "ctime_ns": stat.st_ctime_ns,
                "sha256": sha(b"\x01" * 4096),
            }
        },
    }
    assert cache_file.stat().st_mode & 0o777 == 0o600

    second = DigestCache(cache_file)  # a new process: reads the file
    assert second.sha256(weights) == sha(b"\x01" * 4096)
    assert (second.hits, second.misses) == (1, 0)
    assert hashed == ["model.safetensors"]  # not read again


def test_a_same_size_rewrite_with_a_new_mtime_is_hashed_again(cache_file, weights, hashed):
    recorded(cache_file, weights)
    old = weights.stat()
    with open(weights, "r+b") as handle:  # in place: same inode, same size
        handle.write(b"\x02")
    os.utime(weights, ns=(old.st_atime_ns, old.st_mtime_ns + 1_000_000_000))
    assert weights.stat().st_ino == old.st_ino and weights.stat().st_size == old.st_size
    cache = DigestCache(cache_file, clock=ahead)
    assert cache.sha256(weights) == sha(b"\x02" + b"\x01" * 4095)
    assert (cache.hits, cache.misses) == (0, 1)
    assert hashed == ["model.safetensors", "model.safetensors"]


def test_a_rewrite_whose_mtime_is_set_back_is_caught_by_its_ctime(cache_file, weights):
    recorded(cache_file, weights)
    old = weights.stat()
    time.sleep(0.02)  # past the file system's timestamp tick, so the ctime moves
    with open(weights, "r+b") as handle:
        handle.write(b"\x03")
    os.utime(weights, ns=(old.st_atime_ns, old.st_mtime_ns))  # the mtime it had
    assert weights.stat().st_mtime_ns == old.st_mtime_ns
    assert weights.stat().st_ctime_ns != old.st_ctime_ns
    cache = DigestCache(cache_file, clock=ahead)
    assert cache.sha256(weights) == sha(b"\x03" + b"\x01" * 4095)
    assert cache.misses == 1


def test_a_file_replaced_by_another_is_hashed_again(cache_file, weights, tmp_path):
    recorded(cache_file, weights)
    old = weights.stat()
    other = tmp_path / "other"
    other.write_bytes(b"\x04" * 4096)
    os.utime(other, ns=(old.st_atime_ns, old.st_mtime_ns))
    os.replace(other, weights)  # same path, size and mtime; a new inode
    cache = DigestCache(cache_file, clock=ahead)
    assert cache.sha256(weights) == sha(b"\x04" * 4096)
    assert cache.misses == 1


def test_a_file_changed_just_now_is_hashed_but_not_recorded(cache_file, weights):
    cache = DigestCache(cache_file)  # the real clock: the file is younger than SETTLE_NS
    assert SETTLE_NS == 2_000_000_000
    assert cache.sha256(weights) == sha(b"\x01" * 4096)
    cache.save()
    assert not cache_file.exists()
    assert DigestCache(cache_file).sha256(weights) == sha(b"\x01" * 4096)


def test_a_file_that_changes_while_it_is_hashed_is_not_recorded(cache_file, weights, monkeypatch):
    real = digests_module.sha256_file

    def racing(path: Path) -> str:
        digest = real(path)
        with open(path, "ab") as handle:
            handle.write(b"\x05")  # grows while being read
        return digest

    monkeypatch.setattr(digests_module, "sha256_file", racing)
    cache = DigestCache(cache_file, clock=ahead)
    cache.sha256(weights)
    cache.save()
    assert not cache_file.exists()


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("{not json", "not JSON: Expecting property name enclosed in double quotes: "),
        ('{"version": 2, "files": {}}', "not a version 1 digest cache"),
        ('{"version": 1, "files": []}', "its files are not an object"),
        (
            '{"version": 1, "files": {"/m": {"device": 1, "inode": 2, "size": 3, '
            '"mtime_ns": 4, "ctime_ns": 5, "sha256": "XYZ"}}}',
            "the entry of /m is malformed",
        ),
    ],
)
def test_a_damaged_cache_file_is_ignored_with_a_warning_and_rewritten(
    cache_file, weights, caplog, content, why
):
    cache_file.parent.mkdir()
    cache_file.write_text(content)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        cache = DigestCache(cache_file, clock=ahead)
    [record] = [r for r in caplog.records if r.name == LOGGER]
    assert record.levelname == "WARNING"
    assert record.getMessage().startswith(f"the digest cache {cache_file} is ignored ({why}")
    assert record.getMessage().endswith(
        "): the model files are hashed again and the cache rewritten"
    )
    assert cache.sha256(weights) == sha(b"\x01" * 4096)
    cache.save()
    assert DigestCache(cache_file).sha256(weights) == sha(b"\x01" * 4096)
    assert list(json.loads(cache_file.read_text())["files"]) == [os.path.realpath(weights)]


def test_a_cache_that_cannot_be_written_is_a_warning_not_a_failure(tmp_path, weights, caplog):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    cache = DigestCache(blocker / CACHE_FILE, clock=ahead)
    assert cache.sha256(weights) == sha(b"\x01" * 4096)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        cache.save()
    [record] = [r for r in caplog.records if r.name == LOGGER]
    assert record.getMessage().startswith(f"cannot write the digest cache {blocker / CACHE_FILE}")


def test_saving_keeps_what_another_process_recorded(cache_file, tmp_path):
    one, two = tmp_path / "one.bin", tmp_path / "two.bin"
    one.write_bytes(b"1")
    two.write_bytes(b"2")
    first, second = DigestCache(cache_file, clock=ahead), DigestCache(cache_file, clock=ahead)
    first.sha256(one)
    second.sha256(two)
    first.save()
    second.save()
    files = json.loads(cache_file.read_text())["files"]
    assert {Path(p).name: e["sha256"] for p, e in files.items()} == {
        "one.bin": sha(b"1"),
        "two.bin": sha(b"2"),
    }


def test_verification_through_the_cache_still_refuses_a_tampered_file(
    package, entry, cache_file, hashed
):
    first = verify_package(package, entry=entry)
    cache = DigestCache(cache_file, clock=ahead)
    assert prepare(package, builtins={NAME: entry}, digest_cache=cache).verification == first
    hashed.clear()
    again = DigestCache(cache_file)
    assert prepare(package, builtins={NAME: entry}, digest_cache=again).verification == first
    assert hashed == [] and again.misses == 0 and again.hits == len(entry.files)

    weights = package / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    time.sleep(0.02)
    weights.write_bytes(bytes(data))  # same size, in place
    with pytest.raises(LoadError, match=r"^a file hash does not match: model\.safetensors of"):
        verify_package(package, entry=entry, digest=DigestCache(cache_file).sha256)
    assert hashed == ["model.safetensors"]


def test_the_cache_lives_in_the_runtime_cache_folder(tmp_path):
    assert runtime_cache_root({"VLLM_SRUN_CACHE_DIR": str(tmp_path), "XDG_CACHE_HOME": "/x"}) == (
        tmp_path
    )
    assert runtime_cache_root({"XDG_CACHE_HOME": "/x"}) == Path("/x/vllm-srun")
    assert runtime_cache_root({"VLLM_SRUN_CACHE_DIR": "", "XDG_CACHE_HOME": ""}) == (
        Path.home() / ".cache" / "vllm-srun"
    )


def test_prepare_uses_and_saves_the_runtime_cache_by_default(package, entry, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_SRUN_CACHE_DIR", str(tmp_path / "runtime"))
    made: list[DigestCache] = []
    real_init = DigestCache.__init__

    def ahead_init(self: DigestCache, file: Path | None, **kwargs: object) -> None:
        real_init(self, file, clock=ahead)
        made.append(self)

    monkeypatch.setattr(DigestCache, "__init__", ahead_init)
    prepare(package, builtins={NAME: entry})
    prepare(package, builtins={NAME: entry})
    assert [cache.file for cache in made] == [tmp_path / "runtime" / CACHE_FILE] * 2
    assert [(cache.hits, cache.misses) for cache in made] == [
        (0, len(entry.files)),
        (len(entry.files), 0),
    ]
