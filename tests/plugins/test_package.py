"""The package readers families share: errors that name the file, a detect that never raises."""

from __future__ import annotations

import pytest

from vllm_srun.plugins import PackageError, read_config, read_json


def test_read_json_names_the_file_it_cannot_read(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    assert read_json(tmp_path / "config.json") == {"model_type": "bert"}
    (tmp_path / "broken.json").write_text('{"model_type": ')
    with pytest.raises(PackageError, match=r"^broken\.json cannot be read: Expecting value"):
        read_json(tmp_path / "broken.json")
    with pytest.raises(PackageError, match=r"^absent\.json cannot be read: .*No such file"):
        read_json(tmp_path / "absent.json")
    (tmp_path / "latin1.json").write_bytes(b'{"name": "caf\xe9"}')
    with pytest.raises(PackageError, match=r"^latin1\.json cannot be read: .*utf-8"):
        read_json(tmp_path / "latin1.json")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, None),
        ("{not json", None),
        ("[1, 2]", None),
        ('"bert"', None),
        ('{"model_type": "bert"}', {"model_type": "bert"}),
    ],
)
def test_read_config_is_an_object_or_none_and_never_raises(tmp_path, content, expected):
    if content is not None:
        (tmp_path / "config.json").write_text(content)
    assert read_config(tmp_path) == expected
