"""The models file (``vllm-srun serve --models FILE``) and the serve options it meets."""

from __future__ import annotations

import dataclasses
import textwrap

import pytest

from vllm_srun.cli import build_parser, main, serve_config
from vllm_srun.config import (
    ConfigError,
    ModelConfig,
    ServeConfig,
    process_fields,
    read_models_file,
)
from vllm_srun.serve.status import model_card
from vllm_srun.service.runtime import ModelState

DEFAULTS = ModelConfig(
    model="", device="cpu", engine="native", max_num_seqs=16, batch_window_ms=5.0, dtype="float32"
)


def models_file(tmp_path, text: str):
    path = tmp_path / "models.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_entries_take_the_defaults_and_override_their_own_keys(tmp_path):
    path = models_file(
        tmp_path,
        """
        models:
          - model: /models/a
          - model: /models/b
            name: b
            device: cuda:1
            max_num_seqs: 64
            batch_window_ms: 0
            memory_budget_gib: 4
            enable_shared_context: true
        """,
    )
    a, b = read_models_file(path, DEFAULTS)
    assert a == dataclasses.replace(DEFAULTS, model="/models/a")
    assert a.served_name == "/models/a"
    assert b == dataclasses.replace(
        DEFAULTS,
        model="/models/b",
        name="b",
        device="cuda:1",
        max_num_seqs=64,
        batch_window_ms=0,
        memory_budget_gib=4,
        enable_shared_context=True,
    )
    assert b.engine == "native" and b.dtype == "float32"  # from the defaults
    assert DEFAULTS.device == "cpu"  # the defaults are not changed


def test_an_unknown_key_names_the_key_and_the_entry(tmp_path):
    path = models_file(
        tmp_path,
        """
        models:
          - model: /models/a
          - model: /models/b
            colour: red
            max_batch: 4
        """,
    )
    with pytest.raises(ConfigError) as caught:
        read_models_file(path, DEFAULTS)
    message = str(caught.value)
    assert message.startswith(
        f"models file {path}, entry 2 (/models/b): unknown key colour, max_batch; an entry takes "
        "model, revision, name,"
    )


def test_a_profile_name_is_read_and_a_malformed_one_refused(tmp_path):
    """The router writes ``profile`` into the models file of the workers it manages; which
    names exist is the engines' say, checked at load (tests/serve/test_profiles.py)."""
    path = models_file(
        tmp_path,
        """
        models:
          - model: /models/a
            profile: max_speed
          - model: /models/b
        """,
    )
    a, b = read_models_file(path, DEFAULTS)
    assert (a.profile, b.profile) == ("max_speed", "exact")
    path = models_file(tmp_path, "models:\n  - model: /models/a\n    profile: Max-Speed\n")
    with pytest.raises(ConfigError) as caught:
        read_models_file(path, DEFAULTS)
    assert str(caught.value) == (
        f"models file {path}, entry 1 (/models/a): profile 'Max-Speed' is not a profile name: "
        "did you mean max_speed? a profile name is lower-case letters, digits and _, starting "
        "with a letter, at most 64 characters, such as exact, batching, max_speed: fix it or "
        "leave profile out"
    )
    path = models_file(tmp_path, "models:\n  - model: /models/a\n    profile: 1\n")
    with pytest.raises(ConfigError, match="profile must be str"):
        read_models_file(path, DEFAULTS)


def test_a_served_profile_is_the_card_s_profile():
    card = model_card(ModelState(ModelConfig(model="/models/a", profile="exact")))
    assert (card["profile"], card["numerics"], card["deviation_from_exact"]) == (
        "exact",
        "exact",
        None,
    )
    assert card["profiles"] == [
        {"name": "exact", "numerics": "exact", "description": "not loaded yet"}
    ]
    assert (card["ready"], card["status"], card["golden"]["status"]) == (
        False,
        "loading",
        "pending",
    )


def test_an_entry_without_model_is_an_error(tmp_path):
    path = models_file(tmp_path, "models:\n  - name: nameless\n")
    with pytest.raises(ConfigError, match=r"entry 1: `model` is required$"):
        read_models_file(path, DEFAULTS)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("max_num_seqs: '8'", "max_num_seqs must be int"),
        ("max_num_seqs: true", "max_num_seqs must be int"),
        ("max_num_seqs: 2.5", "max_num_seqs must be int"),
        ("batch_window_ms: fast", "batch_window_ms must be int or float"),
        ("enable_shared_context: 'yes'", "enable_shared_context must be bool"),
        ("name: 7", "name must be str"),
        ("memory_budget_gib: false", "memory_budget_gib must be int or float"),
    ],
)
def test_a_wrong_type_names_the_key_the_type_and_the_entry(tmp_path, entry, message):
    path = models_file(tmp_path, f"models:\n  - model: /models/a\n    {entry}\n")
    with pytest.raises(ConfigError) as caught:
        read_models_file(path, DEFAULTS)
    assert str(caught.value) == f"models file {path}, entry 1 (/models/a): {message}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("models: []\n", "needs a non-empty `models:` list"),
        ("- model: /models/a\n", "needs a non-empty `models:` list"),
        ("models: {model: /models/a}\n", "needs a non-empty `models:` list"),
        ("models: [/models/a]\n", "entry 1: an entry must be a mapping with `model`"),
        ("models: [\n", "cannot be read"),
    ],
)
def test_a_malformed_file_says_what_is_wrong(tmp_path, text, message):
    path = models_file(tmp_path, text)
    with pytest.raises(ConfigError, match=message):
        read_models_file(path, DEFAULTS)


def test_a_missing_file_cannot_be_read(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        read_models_file(tmp_path / "absent.yaml", DEFAULTS)


def test_serve_models_takes_the_command_line_defaults(tmp_path):
    path = models_file(
        tmp_path,
        """
        models:
          - model: /models/a
            name: a
          - model: /models/b
            name: b
            max_num_seqs: 4
        """,
    )
    args = build_parser().parse_args(
        [
            "serve",
            "--models",
            str(path),
            "--device",
            "cpu",
            "--max-num-seqs",
            "32",
            "--batch-window-ms",
            "7",
            "--max-queue",
            "9",
            "--uds",
            "/tmp/x.sock",
        ]
    )
    config = serve_config(args)
    assert isinstance(config, ServeConfig)
    assert [(m.name, m.device, m.max_num_seqs, m.batch_window_ms) for m in config.models] == [
        ("a", "cpu", 32, 7.0),
        ("b", "cpu", 4, 7.0),
    ]
    assert config.max_queue == 9 and config.uds == "/tmp/x.sock"


@pytest.mark.parametrize(
    ("argv", "text", "message"),
    [
        ([], "models:\n  - model: /m\n    colour: red\n", "unknown key colour"),
        ([], "models:\n  - name: x\n", "`model` is required"),
        ([], "models:\n  - model: /m\n    max_num_seqs: many\n", "max_num_seqs must be int"),
        (["/other"], "models:\n  - model: /m\n", "give MODEL arguments or --models FILE, not both"),
        ([], "models:\n  - model: /m\n  - model: /m\n", "two models share the ID /m"),
        ([], "models:\n  - model: /m\n    profile: Fast\n", "is not a profile name"),
        (
            ["--served-model-name", "x"],
            "models:\n  - model: /m\n  - model: /n\n",
            "--served-model-name applies to a single MODEL",
        ),
    ],
)
def test_vllm_srun_serve_reports_a_bad_models_file(tmp_path, capsys, argv, text, message):
    path = models_file(tmp_path, text)
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--models", str(path), *argv])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "vllm-srun: error: " in err and message in err


def test_vllm_srun_serve_without_a_model_is_an_error(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["serve"])
    assert exited.value.code == 2
    assert (
        "name at least one MODEL (a built-in model name, owner/name@COMMIT or a package "
        "directory) or --models FILE" in capsys.readouterr().err
    )


COMMIT = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"


def test_a_models_file_revision_is_applied_and_checked(tmp_path):
    path = models_file(
        tmp_path,
        f"""
        models:
          - model: sentence-transformers/all-MiniLM-L6-v2
          - model: someone/encoder
            revision: {COMMIT.upper()}
        """,
    )
    builtin, pinned = read_models_file(path, DEFAULTS)
    assert (builtin.revision, builtin.served_name) == (
        None,
        "sentence-transformers/all-MiniLM-L6-v2",
    )
    assert (pinned.revision, pinned.served_name) == (COMMIT, "someone/encoder")
    branch = models_file(tmp_path, "models:\n  - model: someone/encoder\n    revision: main\n")
    with pytest.raises(ConfigError) as raised:
        read_models_file(branch, DEFAULTS)
    assert str(raised.value) == (
        f"models file {branch}, entry 1 (someone/encoder): revision must be a 40-hex commit, "
        "not 'main': use the full commit hash (40 hexadecimal characters), not a branch, a tag "
        "or a short hash"
    )


def test_registry_options_reach_the_serve_config():
    args = build_parser().parse_args(
        [
            "serve",
            f"someone/encoder@{COMMIT}",
            "--cache-dir",
            "/srv/hf",
            "--offline",
            "--accept-licence",
            "llama3",
            "--accept-licence",
            "gemma",
        ]
    )
    config = serve_config(args)
    [model] = config.models
    assert model.model == f"someone/encoder@{COMMIT}"
    assert model.served_name == "someone/encoder"  # the @REV suffix is not part of the ID
    assert (config.cache_dir, config.offline, config.accept_licences) == (
        "/srv/hf",
        True,
        ("llama3", "gemma"),
    )
    plain = serve_config(build_parser().parse_args(["serve", "/models/a"]))
    assert (plain.cache_dir, plain.offline, plain.accept_licences) == (None, False, ())


def test_revision_is_for_a_single_model_and_a_commit():
    one = serve_config(
        build_parser().parse_args(["serve", "someone/encoder", "--revision", COMMIT])
    )
    assert one.models[0].revision == COMMIT
    with pytest.raises(ConfigError, match="--revision applies to a single MODEL"):
        serve_config(build_parser().parse_args(["serve", "a/b", "c/d", "--revision", COMMIT]))
    with pytest.raises(ConfigError) as raised:
        serve_config(build_parser().parse_args(["serve", "a/b", "--revision", "v1.0"]))
    assert str(raised.value).startswith("--revision: revision must be a 40-hex commit, not 'v1.0'")


def test_memory_budget_and_load_retries_reach_the_config(tmp_path):
    path = models_file(
        tmp_path,
        """
        models:
          - model: /models/a
            name: a
          - model: /models/b
            name: b
            memory_budget_gib: 2
        """,
    )
    argv = ["serve", "--models", str(path), "--memory-budget", "0.5"]
    config = serve_config(
        build_parser().parse_args([*argv, "--load-attempts", "3", "--load-retry-seconds", "0.25"])
    )
    assert [(m.name, m.memory_budget_gib) for m in config.models] == [("a", 0.5), ("b", 2)]
    assert (config.load_attempts, config.load_retry_seconds) == (3, 0.25)
    defaults = serve_config(build_parser().parse_args(["serve", "/models/a"]))
    assert (defaults.load_attempts, defaults.load_retry_seconds) == (5, 5.0)
    assert defaults.models[0].memory_budget_gib is None
    for bad in (["--memory-budget", "0"], ["--load-attempts", "0"], ["--load-retry-seconds", "-1"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "/models/a", *bad])


def test_decision_options_reach_every_model_unless_an_entry_overrides_them(tmp_path):
    from vllm_srun.cli import build_parser, serve_config

    path = tmp_path / "models.yaml"
    path.write_text(
        "models:\n  - model: /m/a\n  - model: /m/b\n    max_model_len: 64\n"
        "    enable_shared_context: true\n"
    )
    args = build_parser().parse_args(
        ["serve", "--models", str(path), "--max-model-len", "512", "--no-enable-shared-context"]
    )
    config = serve_config(args)
    assert [(m.max_model_len, m.enable_shared_context) for m in config.models] == [
        (512, False),
        (64, True),
    ]
    plain = serve_config(build_parser().parse_args(["serve", "/m/a"]))
    assert (plain.models[0].max_model_len, plain.models[0].enable_shared_context) == (None, None)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "/m/a", "--max-model-len", "0"])


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("max_model_len: 0", "max_model_len must be at least 1, not 0"),
        ("max_num_seqs: -5", "max_num_seqs must be at least 1, not -5"),
        ("memory_budget_gib: 0", "memory_budget_gib must be a number above 0, not 0"),
        ("batch_window_ms: -1", "batch_window_ms must be 0 or more, not -1"),
    ],
)
def test_models_file_values_out_of_range_are_refused_like_the_options(tmp_path, line, message):
    path = tmp_path / "models.yaml"
    path.write_text(f"models:\n  - model: /m/a\n    {line}\n")
    with pytest.raises(ConfigError, match=message):
        read_models_file(path, DEFAULTS)


@pytest.fixture
def never_serve(monkeypatch):
    """``vllm-srun serve`` fails instead of serving: a mistake that should stop the start
    fails its test rather than leave a server running."""
    from vllm_srun.serve import main as serve_main

    def refuse(config):
        raise AssertionError(f"vllm-srun serve started with {config}")

    monkeypatch.setattr(serve_main, "serve", refuse)


# -- mistakes YAML would accept silently ---------------------------------------------------
def test_a_key_given_twice_in_an_entry_names_the_entry_the_key_and_the_lines(tmp_path):
    # YAML keeps the last: `model` twice used to serve /models/b without a word.
    path = models_file(
        tmp_path,
        """
        models:
          - model: /models/a
            name: a
          - model: /models/b
            device: cpu
            model: /models/c
        """,
    )
    with pytest.raises(ConfigError) as caught:
        read_models_file(path, DEFAULTS)
    assert str(caught.value) == (
        f"models file {path}, entry 2 (/models/b): `model` is given twice (lines 5 and 7); "
        "YAML would keep only the last: give each key once in an entry"
    )


def test_a_second_models_list_is_refused(tmp_path):
    # YAML keeps the last: the first list's models used to be dropped.
    path = models_file(
        tmp_path,
        """
        models:
          - model: /models/a
        models:
          - model: /models/b
        """,
    )
    with pytest.raises(ConfigError) as caught:
        read_models_file(path, DEFAULTS)
    assert str(caught.value) == (
        f"models file {path}: `models:` is given twice (lines 2 and 4); YAML would keep only "
        "the last list: put every entry under one `models:`"
    )


def test_a_key_given_twice_deeper_is_refused_with_its_line(tmp_path):
    path = models_file(tmp_path, "models:\n  - model: /models/a\nextra: {a: 1, a: 2}\n")
    with pytest.raises(ConfigError, match=r"`a` is given twice in one mapping \(lines 3 and 3\)"):
        read_models_file(path, DEFAULTS)


def test_a_merge_key_may_still_be_overridden(tmp_path):
    path = models_file(
        tmp_path,
        """
        base: &base
          device: cpu
          max_num_seqs: 4
        models:
          - <<: *base
            model: /models/a
            max_num_seqs: 8
        """,
    )
    [entry] = read_models_file(path, DEFAULTS)
    assert (entry.device, entry.max_num_seqs) == ("cpu", 8)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('name: ""', "name is blank; give the model ID requests use, or leave name out"),
        ('name: "   "', "name is blank; give the model ID requests use, or leave name out"),
        ('revision: " "', "revision is blank; give the 40-hex commit, or leave revision out"),
        ('device: ""', "device is blank; give a value, or leave device out"),
        ("engine: '\t'", "engine is blank; give a value, or leave engine out"),
        ('family: ""', "family is blank; give a value, or leave family out"),
    ],
)
def test_a_blank_text_names_the_entry_the_key_and_the_fix(tmp_path, line, message):
    path = models_file(tmp_path, f"models:\n  - model: /models/a\n    {line}\n")
    with pytest.raises(ConfigError) as caught:
        read_models_file(path, DEFAULTS)
    assert str(caught.value).startswith(f"models file {path}, entry 1 (/models/a): {message}")


def test_a_blank_model_is_refused(tmp_path):
    path = models_file(tmp_path, 'models:\n  - model: "  "\n')
    with pytest.raises(ConfigError, match="model is blank; give a built-in model name"):
        read_models_file(path, DEFAULTS)


def test_an_unknown_dtype_is_refused_with_the_choices(tmp_path):
    path = models_file(tmp_path, "models:\n  - model: /models/a\n    dtype: float64\n")
    with pytest.raises(ConfigError) as caught:
        read_models_file(path, DEFAULTS)
    assert str(caught.value) == (
        f"models file {path}, entry 1 (/models/a): dtype must be one of auto, float32, "
        "bfloat16, float16, not 'float64'"
    )


def test_options_are_the_family_s_and_must_be_a_mapping(tmp_path):
    path = models_file(tmp_path, "models:\n  - model: /models/a\n    options: {threshold: 0.8}\n")
    [config] = read_models_file(path, DEFAULTS)
    assert config.options == {"threshold": 0.8}
    bad = models_file(tmp_path, "models:\n  - model: /models/a\n    options: [truncate]\n")
    with pytest.raises(ConfigError, match=r"entry 1 \(/models/a\): options must be dict"):
        read_models_file(bad, DEFAULTS)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("models:\n  - model: /m\n    model: /n\n", "`model` is given twice"),
        ("models:\n  - model: /m\nmodels:\n  - model: /n\n", "`models:` is given twice"),
        ("models:\n  - model: /m\n    name: ' '\n", "name is blank"),
    ],
)
def test_vllm_srun_serve_stops_on_a_silent_mistake(tmp_path, capsys, never_serve, text, message):
    path = models_file(tmp_path, text)
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--models", str(path)])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


# -- the command line ------------------------------------------------------------------------
@pytest.mark.parametrize("port", ["99999", "65536", "-1", "http"])
def test_a_port_outside_0_to_65535_is_refused(capsys, never_serve, port):
    with pytest.raises(SystemExit) as exited:
        main(["serve", "/models/a", "--port", port])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --port: must be a port number" in err
    if port != "http":
        assert f"from 0 to 65535 (0: any free port), not {port}" in err


@pytest.mark.parametrize("port", ["0", "1", "65535"])
def test_ports_0_to_65535_are_accepted(port):
    config = serve_config(build_parser().parse_args(["serve", "/models/a", "--port", port]))
    assert config.port == int(port)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["/models/a", "--served-model-name", " "], "argument --served-model-name: must not be"),
        (["/models/a", "--device", ""], "argument --device: must not be blank"),
        (["/models/a", "--uds", " "], "argument --uds: must not be blank"),
        (["/models/a", " "], "a MODEL argument is blank"),
    ],
)
def test_a_blank_value_on_the_command_line_is_refused(capsys, never_serve, argv, message):
    with pytest.raises(SystemExit) as exited:
        main(["serve", *argv])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_every_process_option_is_declared_once_on_serve_config(capsys):
    # The defaults and help of the command line are ServeConfig's declarations.
    config = serve_config(build_parser().parse_args(["serve", "/models/a"]))
    declared = ServeConfig()
    names = [f.name for f in process_fields()]
    assert names == [f.name for f in dataclasses.fields(ServeConfig) if f.name != "models"]
    for name in names:
        assert getattr(config, name) == getattr(declared, name), name
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for spec in process_fields():
        assert spec.metadata["rule"].help in text, spec.name
    assert "listen port (default: 8100)" in text
    assert "after SIGTERM, how long queued work may take to finish (default: 30.0)" in text
