"""bench/mutate.py's bookkeeping: the fingerprint that says whether a mutation result is
still current, and results kept in the older format."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mutate():
    spec = importlib.util.spec_from_file_location("bench_mutate", REPO / "bench" / "mutate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


CODE = b'''"""A module."""

LIMIT = 3
"""How many."""


class Box:
    """A box."""

    def size(self, x):
        """Its size."""
        # twice the input
        return x * 2
'''


def test_comments_and_docstrings_leave_the_fingerprint_alone(mutate):
    reworded = (
        CODE.replace(b'"""A module."""', b'"""A module.\n\nWhy it is long: a reason."""')
        .replace(b'"""How many."""\n', b"")
        .replace(b"# twice the input", b"# doubled")
        .replace(b'        """Its size."""\n', b"")
    )
    assert mutate.fingerprint({"m.py": CODE}) == mutate.fingerprint({"m.py": reworded})


@pytest.mark.parametrize(
    "changed",
    [CODE.replace(b"x * 2", b"x * 3"), CODE.replace(b"LIMIT = 3", b"LIMIT = 4")],
)
def test_a_code_change_changes_the_fingerprint(mutate, changed):
    assert mutate.fingerprint({"m.py": CODE}) != mutate.fingerprint({"m.py": changed})


def test_code_moved_to_another_file_changes_the_fingerprint(mutate):
    """Its mutants are named after the file's module, so the old names no longer hold."""
    assert mutate.fingerprint({"a.py": CODE}) != mutate.fingerprint({"b.py": CODE})


def test_an_old_byte_digest_of_unchanged_source_reads_as_current(mutate, tmp_path, monkeypatch):
    monkeypatch.setattr(mutate, "STAGE", tmp_path / "no-stage")
    source = mutate.MODULES["windows"][0][0]
    digest = hashlib.sha256((REPO / source).read_bytes()).hexdigest()
    kept = mutate.upgraded("windows", {"codes": {"m": 1}, "source_sha256": digest})
    assert kept == {"codes": {"m": 1}, "fingerprint": mutate.source_fingerprint("windows")}
    stale = mutate.upgraded("windows", {"codes": {"m": 1}, "source_sha256": "0" * 64})
    assert stale["fingerprint"] is None


def test_an_old_result_takes_its_fingerprint_from_the_stage(mutate, tmp_path, monkeypatch):
    monkeypatch.setattr(mutate, "STAGE", tmp_path)
    source = mutate.MODULES["windows"][0][0]
    staged = tmp_path / "windows" / mutate.staged_path(source)
    staged.parent.mkdir(parents=True)
    staged.write_bytes(CODE)
    kept = mutate.upgraded("windows", {"codes": {"m": 1}, "source_sha256": "0" * 64})
    assert kept["fingerprint"] == mutate.fingerprint({source: CODE})
