"""config.yaml: every refusal with its key path and upstream's message, what the serve
flags write (§1.2) and which deployments are in use (§1.1)."""

from __future__ import annotations

import copy

import pytest

from vllm_sr.config.durations import format_duration, parse_duration
from vllm_sr.config.flags import (
    FlagError,
    ServeOptions,
    apply_serve_options,
    port_offset,
    shift_listener_ports,
)
from vllm_sr.config.in_use import deployments_in_use, managed_in_use
from vllm_sr.config.schema import (
    DEFAULT_MODEL,
    ConfigError,
    load_config,
    migrate_document,
    parse_config,
)

SHA = "0123456789abcdef0123456789abcdef01234567"
D = "global.model_catalog.deployments.primary"


def deployment(**fields):
    """A document with one deployment ``primary``."""
    body = {"provider": "model_runtime", "artifact": "vllm-sr/Vela-2.0-4B", **fields}
    return {"global": {"model_catalog": {"deployments": {"primary": body}}}}


def problems(document) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(document)
    return caught.value.problems


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"device": "cpu", "replicas": [{"device": "cpu"}]},
            f"{D}: replicas cannot be combined with deployment device, endpoint or served_name",
        ),
        (
            {"replicas": [{"device": "cpu"}] * 65},
            f"{D}: replicas must contain at most 64 worker placements",
        ),
        (
            {"replicas": [{"device": "cpu"}, {"endpoint": "http://h:1", "device": "cpu"}]},
            f"{D}: replica 1: an attached endpoint cannot set device",
        ),
        (
            {"replicas": [{"endpoint": "http://h:1", "served_name": " x"}]},
            f"{D}: replica 0: served_name must be a trimmed model name",
        ),
        (
            {"replicas": [{"endpoint": "http://h:1"}, {"endpoint": "http://h:1"}]},
            f"{D}: replica 1: duplicate attached worker",
        ),
        (
            {"replicas": [{"device": "cpu", "served_name": "x"}]},
            f"{D}: replica 0: served_name requires an attached endpoint",
        ),
        (
            {"replicas": [{"device": "CUDA0"}]},
            f"{D}: replica 0: device must be an accelerator name with an optional index, "
            "such as cpu, cuda:0 or rocm:1",
        ),
        (
            {"device": "cuda-0"},
            f"{D}.device: device must be an accelerator name with an optional index, "
            "such as cpu, cuda:0 or rocm:1",
        ),
        (
            {"endpoint": "ftp://h:1"},
            f"{D}.endpoint: endpoint must use unix://, http:// or https://",
        ),
        (
            {"replicas": [{"endpoint": "tcp://h:1"}]},
            f"{D}: replica 0: endpoint must use unix://, http:// or https://",
        ),
        (
            {"endpoint": "unix://run/x.sock"},
            f"{D}.endpoint: endpoint unix:// needs an absolute socket path "
            "(unix:///run/vllm-sr/runtime.sock)",
        ),
        ({"endpoint": "http://:8100"}, f"{D}.endpoint: endpoint needs a host"),
        (
            {"artifact": "not a repo"},
            f"{D}.artifact: artifact must be a Hub repository ID or an absolute package path",
        ),
        ({"revision": "main"}, f"{D}.revision: revision must be a 40-hex commit"),
        (
            {"artifact": "/models/vela", "revision": SHA},
            f"{D}: revision applies only to Hub repositories",
        ),
        (
            {"profile": "Max-Speed"},
            f"{D}.profile: profile must be a profile name (lower-case letters, digits and _, "
            "starting with a letter, at most 64 characters), such as exact, batching or "
            "max_speed",
        ),
        (
            {"input": {"overflow": "drop"}},
            f'{D}.input.overflow: unsupported input.overflow "drop"',
        ),
        (
            {"input": {"max_tokens": -1}},
            f"{D}.input.max_tokens: input.max_tokens must not be negative",
        ),
        (
            {"served_name": "vela"},
            f"{D}: served_name selects a model on an attached endpoint; a managed deployment "
            "is served under its own name",
        ),
        (
            {"endpoint": "http://h:1", "max_model_len": 4096},
            f"{D}: max_model_len applies only to a managed worker",
        ),
        (
            {"replicas": [{"device": "cpu"}], "max_model_len": 4096},
            f"{D}: max_model_len applies only to a managed worker",
        ),
        (
            {"endpoint": "http://h:1", "device": "cpu"},
            f"{D}: an attached endpoint cannot set device",
        ),
        ({"provider": "openai"}, f"{D}.provider: provider must be model_runtime"),
        (
            {"colour": "blue"},
            f"{D}.colour: unknown key colour; this mapping takes provider, "
            "artifact, revision, public_name, device, profile, input, endpoint, served_name, "
            "replicas, max_model_len, max_num_seqs, max_num_batched_tokens, batch_window_ms, "
            "dtype, enable_shared_context, systemone_schema",
        ),
        (
            {"systemone_schema": "jev/1"},
            f"{D}.systemone_schema: systemone_schema must be one of vllm-sr/5.0, "
            'vllm-sr/4.0, jev, not "jev/1"',
        ),
        ({"systemone_schema": 5}, f"{D}.systemone_schema: Input should be a valid string"),
    ],
)
def test_each_deployment_refusal_names_its_key_path(fields, expected):
    assert problems(deployment(**fields)) == [expected]


def test_a_managed_deployment_needs_an_artifact():
    document = {"global": {"model_catalog": {"deployments": {"x": {"provider": "model_runtime"}}}}}
    assert problems(document) == [
        "global.model_catalog.deployments.x: a managed model_runtime deployment requires "
        "artifact (a Hub repository or an absolute package path)"
    ]
    # An attached one need not say what it serves.
    document["global"]["model_catalog"]["deployments"]["x"]["endpoint"] = "unix:///run/r.sock"
    assert parse_config(document).catalog.deployments["x"].managed is False


@pytest.mark.parametrize(
    "decision_model",
    [{"deployment": "nowhere"}, "primary", {"deployment": "primary", "extra": 1}, {}],
)
def test_decision_model_has_exactly_one_shape(decision_model):
    document = deployment()
    document["global"]["model_catalog"]["system"] = {"decision_model": decision_model}
    [problem] = problems(document)
    assert problem.endswith("decision_model must be {deployment: <declared deployment key>}")


def test_unknown_keys_are_refused_at_every_level():
    document = deployment(replicas=[{"device": "cpu", "gpu": 1}])
    document["extra"] = True
    document["global"]["router"] = {"enabled": False, "mode": "engine"}
    document["listeners"] = [{"name": "http", "port": 8899, "systemone": {"models": [], "x": 1}}]
    found = problems(document)
    assert (
        f"{D}.replicas[0].gpu: unknown key gpu; this mapping takes device, endpoint, "
        "served_name" in found
    )
    assert any(p.startswith("extra: unknown key extra") for p in found)
    assert any(p.startswith("global.router.mode: unknown key mode") for p in found)
    assert any(p.startswith("listeners[0].systemone.x: unknown key x") for p in found)


def test_removed_fields_point_at_migrate(tmp_path):
    document = deployment(candle=True, use_nli=False)
    [problem] = problems(document)
    assert problem.startswith(f"{D}: removed model execution fields candle, use_nli")
    assert "run `vllm-sr config migrate FILE`" in problem
    migrated, removed = migrate_document(copy.deepcopy(document))
    assert removed == [f"{D}.candle", f"{D}.use_nli"]
    parse_config(migrated)


def test_values_are_never_coerced():
    found = problems({"listeners": [{"name": "http", "port": "8899"}]})
    assert found == ["listeners[0].port: Input should be a valid integer"]
    found = problems(deployment(replicas="cpu"))
    assert found == [f"{D}.replicas: Input should be a valid list"]


def test_bindings_and_listeners():
    document = deployment()
    document["global"]["model_catalog"]["bindings"] = {
        "domain_classifier": {"deployment": "primary", "contract": "labels.v2"}
    }
    assert problems(document) == [
        "global.model_catalog.bindings.domain_classifier.contract: contract must be one of "
        "decision.v1, label_distribution.v1, label_scores.v1, token_spans.v1, embedding.v1, "
        "relevance_scores.v1"
    ]
    document["global"]["model_catalog"]["bindings"] = {
        "safety.jailbreak": {"deployment": "other", "contract": "decision.v1"}
    }
    assert problems(document) == [
        "global.model_catalog: binding safety.jailbreak names deployment other, which is not "
        "declared under deployments"
    ]
    document["global"]["model_catalog"]["bindings"] = {
        "pii": {"deployment": "primary", "contract": "token_spans.v1"}
    }
    [problem] = problems(document)
    assert problem.startswith("global.model_catalog.bindings: unknown binding pii;")
    del document["global"]["model_catalog"]["bindings"]
    document["listeners"] = [
        {"name": "a", "port": 8899},
        {"name": "b", "address": "127.0.0.1", "port": 8899},
    ]
    assert problems(document) == [
        "listeners a and b both bind port 8899 (127.0.0.1 and 127.0.0.1); give each its own port"
    ]
    document["listeners"][1] = {"name": "b", "address": "0.0.0.0", "port": 8899}
    assert problems(document) == [
        "listeners a and b both bind port 8899 (127.0.0.1 and 0.0.0.0); give each its own port"
    ]
    document["listeners"][1] = {"name": "b", "address": "127.0.0.2", "port": 8899}
    assert [listener.name for listener in parse_config(document).listeners] == ["a", "b"]
    document["listeners"][1] = {"name": "a", "port": 8900, "api_keys": [""]}
    assert problems(document) == ["listeners[1].api_keys: api_keys must be trimmed, non-empty keys"]
    for key in ("clé", "a b", "a\nb"):
        document["listeners"][1] = {"name": "b", "port": 8900, "api_keys": ["ok-key", key]}
        [problem] = problems(document)
        assert problem.startswith("listeners[1].api_keys: api_keys must be printable ASCII")


def test_a_valid_file_loads(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(
        """
global:
  router: {enabled: false}
  model_catalog:
    deployments:
      primary:
        provider: model_runtime
        artifact: sentence-transformers/all-MiniLM-L6-v2
        replicas: [{device: cpu}, {device: cpu}, {endpoint: "unix:///run/r.sock"}]
      unused:
        provider: model_runtime
        artifact: /models/local
        public_name: local
    system:
      decision_model: {deployment: primary}
listeners:
  - name: http
    address: 127.0.0.1
    port: 8899
    api_keys: [secret]
    systemone: {models: [sentence-transformers/all-MiniLM-L6-v2, nothing/here]}
"""
    )
    config = load_config(path)
    primary = config.catalog.deployments["primary"]
    assert [p.device for p in primary.placements()] == ["cpu", "cpu", None]
    assert primary.public_id() == "sentence-transformers/all-MiniLM-L6-v2"
    assert config.catalog.deployments["unused"].public_id() == "local"
    assert deployments_in_use(config) == ["primary"]
    assert managed_in_use(config) == ["primary"]
    path.write_text("global: [1\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(path)
    with pytest.raises(ConfigError, match="cannot be read"):
        load_config(tmp_path / "missing.yaml")


def test_in_use_follows_grants_and_mode():
    document = deployment()
    catalog = document["global"]["model_catalog"]
    catalog["deployments"]["embedder"] = {
        "provider": "model_runtime",
        "artifact": "/models/e",
        "public_name": "emb",
    }
    catalog["deployments"]["remote"] = {"provider": "model_runtime", "endpoint": "http://h:1"}
    catalog["deployments"]["idle"] = {"provider": "model_runtime", "artifact": "a/idle"}
    catalog["bindings"] = {"embedding": {"deployment": "idle", "contract": "embedding.v1"}}
    document["listeners"] = [{"name": "x", "port": 1, "runtime": {"models": ["emb"]}}]
    document["global"]["router"] = {"enabled": False}
    config = parse_config(document)
    # Engine mode: the grants and the default decision deployment; bindings' consumers are off.
    assert deployments_in_use(config) == ["primary", "embedder"]
    # Router mode: only what the routes use; a binding nothing references starts nothing.
    document["global"]["router"] = {"enabled": True}
    assert deployments_in_use(parse_config(document)) == ["embedder"]
    document["providers"] = {
        "models": [{"name": "m", "backend_refs": [{"endpoint": "127.0.0.1:8000"}]}]
    }
    document["routing"] = {
        "signals": {"embeddings": [{"name": "near", "candidates": ["x"], "threshold": 0.5}]},
        "decisions": [
            {
                "name": "d",
                "rules": {"conditions": [{"type": "embedding", "name": "near"}]},
                "modelRefs": [{"model": "m"}],
            }
        ],
    }
    assert deployments_in_use(parse_config(document)) == ["embedder", "idle"]
    # an unbound domain signal asks the default decision deployment
    document["routing"]["signals"]["domains"] = [{"name": "math"}]
    document["routing"]["decisions"][0]["rules"] = {
        "conditions": [{"type": "domain", "name": "math"}]
    }
    assert deployments_in_use(parse_config(document)) == ["primary", "embedder"]


# -- serve flags (§1.2) --------------------------------------------------------------------------
def served(document=None, bootstrap=True, **options):
    return apply_serve_options(document, ServeOptions(**options), bootstrap=bootstrap)


def test_no_model_and_no_config_serves_the_builtin_minilm_on_a_local_listener():
    document = served()
    config = parse_config(document)
    assert config.router_enabled is False
    primary = config.catalog.deployments["primary"]
    assert primary.artifact == DEFAULT_MODEL == "sentence-transformers/all-MiniLM-L6-v2"
    assert config.catalog.decision_deployment == "primary"
    [listener] = config.listeners
    assert (listener.name, listener.address, listener.port) == ("http-8899", "127.0.0.1", 8899)
    assert listener.systemone.models == [DEFAULT_MODEL]
    assert managed_in_use(config) == ["primary"]


def test_model_replaces_the_artifact_and_drops_a_saved_revision():
    saved = deployment(revision=SHA, profile="exact")
    document = served(saved, bootstrap=False, model="vllm-sr/Vela-2.0-0.3B")
    primary = document["global"]["model_catalog"]["deployments"]["primary"]
    assert primary["artifact"] == "vllm-sr/Vela-2.0-0.3B" and "revision" not in primary
    assert saved["global"]["model_catalog"]["deployments"]["primary"]["revision"] == SHA
    same = served(saved, bootstrap=False, model="vllm-sr/Vela-2.0-4B")
    assert same["global"]["model_catalog"]["deployments"]["primary"]["revision"] == SHA
    assert "listeners" not in document


def test_a_configured_decision_deployment_is_the_one_flags_change():
    document = deployment()
    catalog = document["global"]["model_catalog"]
    catalog["deployments"]["kai"] = {"provider": "model_runtime", "artifact": "a/kai"}
    catalog["system"] = {"decision_model": {"deployment": "kai"}}
    result = served(document, bootstrap=False, model="a/lux", replicas=2)
    kai = result["global"]["model_catalog"]["deployments"]["kai"]
    assert kai["artifact"] == "a/lux"
    assert kai["replicas"] == [{"device": "auto"}, {"device": "auto"}]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"model": " x/y"}, "MODEL must be a non-empty, trimmed artifact"),
        ({"model": ""}, "MODEL must be a non-empty, trimmed artifact"),
        (
            {"device_ids": "0,a", "platform": "rocm"},
            "--device-ids must be comma-separated non-negative GPU indices",
        ),
        (
            {"device_ids": "-1", "platform": "rocm"},
            "--device-ids must be comma-separated non-negative GPU indices",
        ),
        (
            {"device_ids": "0,0", "platform": "rocm"},
            "--device-ids must be unique; use -dp to repeat workers on one GPU",
        ),
        (
            {"device_ids": "0,1", "replicas": 3, "platform": "cuda"},
            "--device-ids needs one GPU index or one index per replica; set -dp explicitly",
        ),
        ({"device_ids": "0"}, "--device-ids requires a cuda or rocm execution platform"),
        ({"device": "rocm:0"}, "--device rocm:0 needs --platform amd, whose image runs rocm"),
        ({"device": "cuda"}, "--device cuda needs --platform nvidia, whose image runs cuda"),
        (
            {"device": "mps"},
            "mps needs macOS's Metal, which no Linux container gets; engine mode runs on the "
            "CPU there",
        ),
        (
            {"device": "xpu:0"},
            "no router image runs xpu; use cpu, or rocm or cuda with --platform amd or nvidia",
        ),
        (
            {"replicas": 2, "platform": "nvidia"},
            "-dp 2 requires 2 available GPUs; use --device-ids explicitly to share a GPU",
        ),
        ({"model": "/"}, "A local MODEL needs an explicit public_name in --config"),
    ],
)
def test_flag_refusals(options, message):
    with pytest.raises(FlagError) as caught:
        served(**options)
    assert str(caught.value) == message


def test_device_ids_write_replicas():
    document = apply_serve_options(
        None,
        ServeOptions(platform="rocm", replicas=2, device_ids="0"),
        bootstrap=True,
        host_gpu=lambda _: True,
    )
    primary = document["global"]["model_catalog"]["deployments"]["primary"]
    assert primary["replicas"] == [{"device": "rocm:0"}, {"device": "rocm:0"}]
    assert "device" not in primary
    document = apply_serve_options(
        None,
        ServeOptions(platform="amd", device_ids="0,1"),
        bootstrap=True,
        host_gpu=lambda _: True,
    )
    primary = document["global"]["model_catalog"]["deployments"]["primary"]
    assert primary["replicas"] == [{"device": "rocm:0"}, {"device": "rocm:1"}]
    document = apply_serve_options(
        None,
        ServeOptions(platform="cuda", replicas=2),
        bootstrap=True,
        gpu_count=lambda accelerator: 4 if accelerator == "cuda" else 0,
        host_gpu=lambda _: True,
    )
    primary = document["global"]["model_catalog"]["deployments"]["primary"]
    assert primary["replicas"] == [{"device": "cuda:0"}, {"device": "cuda:1"}]


def test_written_placements_resize_in_declared_order():
    document = deployment(replicas=[{"device": "cpu:0"}, {"device": "cpu:1"}])
    grown = served(document, bootstrap=False, replicas=3)
    replicas = grown["global"]["model_catalog"]["deployments"]["primary"]["replicas"]
    assert replicas == [{"device": "cpu:0"}, {"device": "cpu:1"}, {"device": "cpu:0"}]
    shrunk = served(document, bootstrap=False, replicas=1)
    assert shrunk["global"]["model_catalog"]["deployments"]["primary"]["replicas"] == [
        {"device": "cpu:0"}
    ]
    single = served(deployment(device="cpu"), bootstrap=False, replicas=2)
    assert single["global"]["model_catalog"]["deployments"]["primary"] == {
        "provider": "model_runtime",
        "artifact": "vllm-sr/Vela-2.0-4B",
        "replicas": [{"device": "cpu"}, {"device": "cpu"}],
    }


def test_attached_defaults_are_not_changed_by_flags():
    attached = deployment(endpoint="http://gpu:8100")
    del attached["global"]["model_catalog"]["deployments"]["primary"]["artifact"]
    with pytest.raises(FlagError) as caught:
        served(attached, bootstrap=False, replicas=2)
    assert str(caught.value) == (
        "Attached deployments cannot be resized with serve flags; edit their endpoints in --config"
    )
    with pytest.raises(FlagError) as caught:
        served(attached, bootstrap=False, model="a/b")
    assert str(caught.value) == (
        "serve model overrides require a managed default deployment; attached endpoints "
        "belong in --config"
    )
    # A plain restart keeps it as it is.
    plain = served(attached, bootstrap=False)
    assert plain["global"]["model_catalog"]["deployments"]["primary"]["endpoint"] == (
        "http://gpu:8100"
    )


def test_systemone_schema_is_a_deployment_key():
    for schema in ("vllm-sr/5.0", "vllm-sr/4.0", "jev"):
        config = parse_config(deployment(systemone_schema=schema))
        primary = config.catalog.deployments["primary"]
        assert primary.systemone_schema == primary.served_systemone_schema == schema
    unset = parse_config(deployment()).catalog.deployments["primary"]
    assert (unset.systemone_schema, unset.served_systemone_schema) == (None, "vllm-sr/5.0")
    # An attached deployment declares the schema its runtime was started with.
    attached = deployment(endpoint="http://gpu:8100", systemone_schema="jev")
    del attached["global"]["model_catalog"]["deployments"]["primary"]["artifact"]
    assert parse_config(attached).catalog.deployments["primary"].served_systemone_schema == "jev"


def test_systemone_schema_flag_writes_the_default_deployment():
    document = served(None, systemone_schema="jev")
    primary = document["global"]["model_catalog"]["deployments"]["primary"]
    assert primary == {
        "provider": "model_runtime",
        "artifact": DEFAULT_MODEL,
        "device": "auto",
        "systemone_schema": "jev",
    }
    assert document["listeners"][0]["systemone"] == {"models": [DEFAULT_MODEL]}
    parse_config(document)
    # An authored default keeps everything else; another schema replaces its own.
    saved = served(deployment(systemone_schema="vllm-sr/4.0", device="cpu"), bootstrap=False)
    again = served(saved, bootstrap=False, systemone_schema="jev")
    assert again["global"]["model_catalog"]["deployments"]["primary"] == {
        "provider": "model_runtime",
        "artifact": "vllm-sr/Vela-2.0-4B",
        "device": "cpu",
        "systemone_schema": "jev",
    }
    with pytest.raises(FlagError) as caught:
        served(None, systemone_schema="jev2")
    assert str(caught.value) == (
        "--systemone-schema must be one of vllm-sr/5.0, vllm-sr/4.0, jev, not 'jev2'"
    )
    attached = deployment(endpoint="http://gpu:8100")
    del attached["global"]["model_catalog"]["deployments"]["primary"]["artifact"]
    with pytest.raises(FlagError) as caught:
        served(attached, bootstrap=False, systemone_schema="jev")
    assert str(caught.value) == (
        "serve model overrides require a managed default deployment; attached endpoints "
        "belong in --config"
    )


def test_engine_flags_and_profile_write_the_deployment(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    document = served(
        {"listeners": []},
        model=str(package),
        revision=None,
        profile="exact",
        device="cpu",
        engine_args={"max_num_seqs": 4, "enable_shared_context": True},
    )
    primary = document["global"]["model_catalog"]["deployments"]["primary"]
    assert primary["artifact"] == str(package.resolve())
    assert primary["device"] == "cpu" and primary["profile"] == "exact"
    assert primary["max_num_seqs"] == 4 and primary["enable_shared_context"] is True
    assert document["listeners"] == []  # a configuration's listeners are its own
    parse_config(document)


def test_the_decision_deployment_gpu_check():
    with pytest.raises(FlagError) as caught:
        served(deployment(device="rocm:0"), bootstrap=False)
    assert str(caught.value) == "the decision deployment device rocm requires --platform amd"
    with pytest.raises(FlagError) as caught:
        apply_serve_options(
            deployment(device="rocm:0"),
            ServeOptions(platform="amd"),
            bootstrap=False,
            host_gpu=lambda _: False,
        )
    assert str(caught.value) == (
        "the decision deployment device rocm requires a GPU, and this host shows no AMD GPU devices"
    )


def test_port_offset():
    assert port_offset({}) == 0
    assert port_offset({"VLLM_SR_PORT_OFFSET": "100"}) == 100
    assert port_offset({"VLLM_SR_PORT_OFFSET": "56345"}) == 56345
    for text in ("-1", "١٢"):
        with pytest.raises(FlagError, match="non-negative integer"):
            port_offset({"VLLM_SR_PORT_OFFSET": text})
    with pytest.raises(FlagError) as caught:
        port_offset({"VLLM_SR_PORT_OFFSET": "60000"})
    assert str(caught.value) == (
        "VLLM_SR_PORT_OFFSET 60000 moves the default ports past 65535 (9190 + offset); "
        "give at most 56345"
    )


def test_the_port_offset_moves_configured_listeners_and_names_the_fresh_one():
    given = {"listeners": [{"name": "a", "port": 8899}, {"name": "b", "port": 9000}]}
    moved = shift_listener_ports(given, 100)
    assert moved is not None
    assert [(x["name"], x["port"]) for x in moved["listeners"]] == [("a", 8999), ("b", 9100)]
    assert given["listeners"][0]["port"] == 8899  # the document given is not changed
    assert shift_listener_ports(given, 0) is given
    assert shift_listener_ports(None, 100) is None
    odd = {"listeners": [{"name": "c", "port": "8899"}, "x"]}
    assert shift_listener_ports(odd, 100) == odd  # left for the schema to refuse
    with pytest.raises(FlagError) as caught:
        shift_listener_ports({"listeners": [{"name": "a", "port": 65000}]}, 600)
    assert str(caught.value) == (
        "VLLM_SR_PORT_OFFSET 600 moves listener a from port 65000 to 65600, past 65535; give "
        "a smaller offset or a lower port"
    )
    fresh = apply_serve_options(None, ServeOptions(), bootstrap=True, listener_port=8999)
    [listener] = parse_config(fresh).listeners
    assert (listener.name, listener.port) == ("http-8999", 8999)


@pytest.mark.parametrize(
    ("text", "seconds", "shown"),
    [
        ("10m", 600, "10m0s"),
        ("30s", 30, "30s"),
        ("1h30m", 5400, "1h30m0s"),
        ("1.5s", 1.5, "1.5s"),
        ("500ms", 0.5, "500ms"),
        ("0", 0, "0s"),
        ("90s", 90, "1m30s"),
    ],
)
def test_go_durations(text, seconds, shown):
    assert parse_duration(text) == seconds
    assert format_duration(seconds) == shown


@pytest.mark.parametrize("text", ["10", "-1s", "1d", "", "m"])
def test_bad_go_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)
