"""``--autotune-cache DIR``: Triton's and TorchInductor's caches under DIR, set at serve start
before any model loads, and shown on every card."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from vllm_srun.cli import build_parser
from vllm_srun.config import ModelConfig, ServeConfig
from vllm_srun.errors import LoadError
from vllm_srun.serve import autotune, main, status
from vllm_srun.serve.command import serve_config
from vllm_srun.service.runtime import Runtime

VARIABLES = ("TRITON_CACHE_DIR", "TRITON_CACHE_AUTOTUNING", "TORCHINDUCTOR_CACHE_DIR")


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    """No autotune variable set, and whatever a test sets undone afterwards."""
    for name in (*VARIABLES, autotune.ENV):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setattr(autotune, "_applied", None)


def started(config: ServeConfig, catalog, monkeypatch) -> tuple[dict, list[dict]]:
    """Run :func:`main.serve` with a server that returns once every model has left
    ``loading``: ``(the variables as the loader saw them, the cards)``."""
    seen: dict = {}

    def loader(model, options, **kwargs):
        seen.update({name: os.environ.get(name) for name in VARIABLES})
        raise LoadError("not loaded in this test")

    def run(server, sockets=None):
        server.runtime.start_loading()  # what the server's startup does once it listens
        deadline = time.monotonic() + 30
        while any(s.status == "loading" for s in server.runtime.models.values()):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        seen["cards"] = status.cards(server.runtime)

    monkeypatch.setattr(main, "Runtime", lambda cfg: Runtime(cfg, catalog=catalog, loader=loader))
    monkeypatch.setattr(main.DrainingServer, "run", run)
    config.port = 0  # any free port: the listener is bound before the server runs
    assert main.serve(config) == 0
    cards = seen.pop("cards")
    return seen, cards


def test_serve_points_triton_and_inductor_below_the_directory_before_models_load(
    tmp_path, monkeypatch, catalog
):
    root = tmp_path / "autotune"
    config = ServeConfig(models=[ModelConfig(model="/m/a", name="a")], autotune_cache=str(root))
    at_load, cards = started(config, catalog, monkeypatch)
    assert at_load == {
        "TRITON_CACHE_DIR": str(root / "triton"),
        "TRITON_CACHE_AUTOTUNING": "1",
        "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
    }
    assert (root / "triton").is_dir() and (root / "inductor").is_dir()
    [card] = cards
    assert card["status"] == "failed" and card["autotune_cache"] == str(root)


def test_the_environment_variable_is_the_default(tmp_path, monkeypatch, catalog):
    root = tmp_path / "from-env"
    monkeypatch.setenv(autotune.ENV, str(root))
    config = ServeConfig(models=[ModelConfig(model="/m/a", name="a")])
    at_load, [card] = started(config, catalog, monkeypatch)
    assert at_load["TORCHINDUCTOR_CACHE_DIR"] == str(root / "inductor")
    assert card["autotune_cache"] == str(root)


def test_without_the_option_or_the_variable_nothing_is_set(monkeypatch, catalog):
    config = ServeConfig(models=[ModelConfig(model="/m/a", name="a")])
    at_load, [card] = started(config, catalog, monkeypatch)
    assert at_load == dict.fromkeys(VARIABLES)
    assert card["autotune_cache"] is None
    assert autotune.apply(None, {}) is None


def test_the_option_wins_over_the_variable_and_a_relative_path_is_made_absolute(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    environ = {autotune.ENV: "/elsewhere", "TRITON_CACHE_DIR": "/old"}
    assert autotune.apply("cache", environ) == tmp_path / "cache"
    assert environ["TRITON_CACHE_DIR"] == str(tmp_path / "cache" / "triton")
    assert autotune.applied() == str(tmp_path / "cache")
    assert autotune.directory(None, {autotune.ENV: ""}) is None  # empty counts as unset


def test_a_directory_that_cannot_be_made_stops_the_start(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    config = ServeConfig(
        models=[ModelConfig(model="/m/a")], autotune_cache=str(blocker / "x"), port=0
    )
    assert main.serve(config) == 1  # before any model loads
    assert "--autotune-cache cannot be created" in capsys.readouterr().err


def test_the_command_line_option_reaches_the_config():
    config = serve_config(build_parser().parse_args(["serve", "./a", "--autotune-cache", "/c"]))
    assert config.autotune_cache == "/c"
    assert serve_config(build_parser().parse_args(["serve", "./a"])).autotune_cache is None


def test_every_card_has_the_field(make_runtime):
    runtime = make_runtime(heads=("sequence",))
    [card] = status.cards(runtime)
    assert "autotune_cache" in card and card["adapter"] is None


def test_help_names_the_option(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    help_text = capsys.readouterr().out
    assert "--autotune-cache DIR" in help_text and "VLLM_SRUN_AUTOTUNE_CACHE" in help_text
    assert "--base-path DIR" in help_text


def test_paths_are_strings(tmp_path):
    environ: dict[str, str] = {}
    autotune.apply(Path(tmp_path), environ)
    assert all(isinstance(v, str) for v in environ.values())
