"""The configuration API's pieces without a frontend: merge patches, redaction, what needs
a restart, problem reasons, the file's atomic write with its backups, and the pool's
retirement of a worker."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest
import yaml

from vllm_sr.config.schema import parse_config
from vllm_sr.config_document import (
    REDACTED,
    RedactedUnknown,
    merge_patch,
    problem_reasons,
    redacted,
    restart_problems,
    runtime_hash,
    unredacted,
)
from vllm_sr.reload import BACKUPS_KEPT, ConfigSource


def listener(**changes: object) -> dict[str, object]:
    return {"name": "http", "address": "127.0.0.1", "port": 8899, **changes}


def test_a_merge_patch_merges_mappings_replaces_lists_and_removes_nulls() -> None:
    target = {"a": {"b": 1, "c": [1, 2]}, "d": 4, "e": {"f": 1}}
    patch = {"a": {"c": [3], "g": 5}, "d": None, "e": 7}
    assert merge_patch(target, patch) == {"a": {"b": 1, "c": [3], "g": 5}, "e": 7}
    assert target == {"a": {"b": 1, "c": [1, 2]}, "d": 4, "e": {"f": 1}}  # not changed


def test_credentials_are_redacted_and_nothing_else() -> None:
    mutation = {
        "type": "header_mutation",
        "configuration": {
            "add": [
                {"name": "Authorization", "value": "Bearer sk-plugin"},
                {"name": "x-tenant", "value": "blue"},
            ],
            "update": [{"name": "X-Upstream-Token", "value": "t-1"}],
        },
    }
    document = {
        "listeners": [{"name": "x", "api_keys": ["k1", "k2"], "port": 1}],
        "providers": {
            "models": [
                {
                    "backend_refs": [
                        {"api_key": "secret", "api_key_env": "ENV_NAME"},
                        {"extra_headers": {"x-api-key": "sk-extra"}},
                        {"base_url": "http://admin:sk-userinfo@host:8000/v1"},
                        {"base_url": "http://host:8000/v1"},
                    ]
                }
            ]
        },
        "routing": {"decisions": [{"name": "d", "plugins": [mutation]}]},
    }
    assert redacted(document) == {
        "listeners": [{"name": "x", "api_keys": [REDACTED, REDACTED], "port": 1}],
        "providers": {
            "models": [
                {
                    "backend_refs": [
                        {"api_key": REDACTED, "api_key_env": "ENV_NAME"},
                        {"extra_headers": {"x-api-key": REDACTED}},
                        {"base_url": f"http://admin:{REDACTED}@host:8000/v1"},
                        {"base_url": "http://host:8000/v1"},
                    ]
                }
            ]
        },
        "routing": {
            "decisions": [
                {
                    "name": "d",
                    "plugins": [
                        {
                            "type": "header_mutation",
                            "configuration": {
                                "add": [
                                    {"name": "Authorization", "value": REDACTED},
                                    {"name": "x-tenant", "value": "blue"},
                                ],
                                "update": [{"name": "X-Upstream-Token", "value": REDACTED}],
                            },
                        }
                    ],
                }
            ]
        },
    }


SAVED = {
    "listeners": [
        {"name": "a", "api_keys": ["ka1", "ka2"], "runtime": {"models": ["m1"]}},
        {"name": "b", "api_keys": ["kb1"]},
    ],
    "providers": {
        "models": [
            {
                "name": "chat",
                "backend_refs": [
                    {"name": "one", "api_key": "sk-one"},
                    {"name": "two", "base_url": "http://admin:pw@host:8000/v1"},
                ],
            }
        ]
    },
}


def test_a_document_read_redacted_and_written_back_keeps_every_credential() -> None:
    assert unredacted(redacted(SAVED), SAVED) == SAVED
    edited = redacted(SAVED)
    edited["listeners"] = [edited["listeners"][1], edited["listeners"][0]]  # reordered
    edited["listeners"][1]["runtime"] = {"models": ["m1", "m2"]}  # a grant added
    edited["listeners"][0]["api_keys"].append("kb2")  # a new key beside the kept one
    assert unredacted(edited, SAVED)["listeners"] == [
        {"name": "b", "api_keys": ["kb1", "kb2"]},
        {"name": "a", "api_keys": ["ka1", "ka2"], "runtime": {"models": ["m1", "m2"]}},
    ]
    refs = unredacted(redacted(SAVED), SAVED)["providers"]["models"][0]["backend_refs"]
    assert refs[1]["base_url"] == "http://admin:pw@host:8000/v1"


@pytest.mark.parametrize(
    ("path", "edit"),
    [
        (
            "listeners[2].api_keys[0]",
            lambda d: d["listeners"].append({"name": "c", "api_keys": [REDACTED]}),
        ),
        ("listeners[1].api_keys[1]", lambda d: d["listeners"][1]["api_keys"].append(REDACTED)),
        (
            "providers.models[0].backend_refs[1].base_url",
            lambda d: d["providers"]["models"][0]["backend_refs"][1].update(
                base_url=f"http://admin:{REDACTED}@elsewhere:8000/v1"
            ),
        ),
    ],
)
def test_a_placeholder_with_no_saved_credential_behind_it_is_refused(path, edit) -> None:
    edited = redacted(SAVED)
    edit(edited)
    with pytest.raises(RedactedUnknown) as refused:
        unredacted(edited, SAVED)
    assert str(refused.value).startswith(f"{path} is ")
    assert str(refused.value).endswith(
        "stands for a credential the saved configuration does not have there; write the "
        "credential itself"
    )


def test_listener_and_mode_changes_need_a_restart_grants_and_keys_do_not() -> None:
    active = parse_config({"listeners": [listener()]})
    live = parse_config({"listeners": [listener(api_keys=["k"], runtime={"models": ["m"]})]})
    assert restart_problems(active, live) == []
    moved = parse_config({"listeners": [listener(port=9000, timeout="5s")]})
    assert restart_problems(active, moved) == [
        "listeners.http.port: changing it needs a restart (8899 -> 9000)",
        "listeners.http.timeout: changing it needs a restart (None -> 5s)",
    ]
    renamed = parse_config({"listeners": [listener(name="other")]})
    assert restart_problems(active, renamed) == [
        "listeners: adding, removing or renaming a listener needs a restart "
        "(running: http; new: other)"
    ]
    engine = parse_config({"listeners": [listener()], "global": {"router": {"enabled": False}}})
    assert restart_problems(active, engine)[0].startswith("global.router.enabled: ")


def test_problems_become_reasons_with_their_key_paths() -> None:
    assert problem_reasons(
        ["listeners[0].port: must be at most 65535", "the configuration must be a mapping"],
        "INVALID_CONFIG",
    ) == [
        {"code": "INVALID_CONFIG", "path": "listeners[0].port", "message": "must be at most 65535"},
        {"code": "INVALID_CONFIG", "path": "", "message": "the configuration must be a mapping"},
    ]


def test_the_runtime_hash_follows_what_is_served_not_how_it_is_written() -> None:
    one = parse_config({"listeners": [listener()]})
    same = parse_config({"listeners": [{"port": 8899, "name": "http"}]})  # default address
    other = parse_config({"listeners": [listener(port=8900)]})
    assert runtime_hash(one) == runtime_hash(same) != runtime_hash(other)
    assert runtime_hash(one).startswith("sha256:") and len(runtime_hash(one)) == 71


def test_the_file_is_backed_up_then_replaced_keeping_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(b"listeners: []\n")
    path.chmod(0o640)
    source = ConfigSource(path.read_bytes(), parse_config, path)
    for n in range(BACKUPS_KEPT + 2):
        source.write(f"# version {n}\n".encode(), f"v{n:03d}")
    assert path.read_bytes() == f"# version {BACKUPS_KEPT + 1}\n".encode()
    assert path.stat().st_mode & 0o777 == 0o640
    backups = sorted((tmp_path / "config.yaml.backups").iterdir())
    assert len(backups) == BACKUPS_KEPT
    assert backups[-1].name == f"config.yaml.v{BACKUPS_KEPT + 1:03d}.bak"
    assert backups[-1].read_bytes() == f"# version {BACKUPS_KEPT}\n".encode()
    assert source.etag == f'"{hashlib.sha256(path.read_bytes()).hexdigest()}"'
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_retired_worker_takes_no_new_exchange_and_is_drained_when_idle() -> None:
    from vllm_sr.pool.pool import ReplicaPool

    from .pool_support import close_all, fake_workers, run

    async def scenario() -> None:
        async with fake_workers("a", "b") as (a, b):
            workers = [a.worker("d"), b.worker("d")]
            try:
                old = ReplicaPool("d", workers, public_name="pub", cache_entries=0)
                new = ReplicaPool(
                    "d", workers[:1], public_name="pub", previous=old, cache_entries=0
                )
                assert new.replicas()[0] is old.replicas()[0]  # one bookkeeping when kept
                old.retire(workers[1])
                for _ in range(4):
                    body = b'{"model":"pub","input":["x"]}'
                    reply = await old.exchange("embeddings", "/v1/embeddings", body, timeout=5)
                    assert reply.status == 200
                assert (len(a.bodies()), len(b.bodies())) == (4, 0)
                await asyncio.wait_for(old.drained(workers[1]), 1)
            finally:
                await close_all(*workers)

    run(scenario())


@pytest.mark.parametrize("text", ["[1, 2]", "a: [", "3"])
def test_a_document_that_is_not_a_mapping_is_invalid_config(text: str) -> None:
    from vllm_sr.config_document import ConfigRefused
    from vllm_sr.reload import Reloads

    reloads = Reloads(None, ConfigSource(b"", parse_config), None)  # type: ignore[arg-type]
    with pytest.raises(ConfigRefused) as caught:
        reloads.candidate(text, "replace")
    assert (caught.value.status, caught.value.code) == (400, "INVALID_CONFIG")
    assert caught.value.reasons


def test_a_grant_naming_no_deployment_is_a_warning() -> None:
    from vllm_sr.config.in_use import unserved_grants

    config = parse_config(
        {
            "global": {
                "model_catalog": {
                    "deployments": {"m": {"provider": "model_runtime", "artifact": "org/served"}}
                }
            },
            "listeners": [
                listener(
                    runtime={"models": ["org/served", "org/typo"]},
                    systemone={"models": ["jev-latest"]},
                )
            ],
        }
    )
    assert unserved_grants(config) == [
        "listeners.http.runtime.models[1]: no deployment answers to org/typo, so the "
        "listener does not publish it (set a deployment's public_name or artifact to it)"
    ]


def test_the_etag_follows_the_file_and_equal_bytes_are_not_written_again(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(b"listeners: []\n")
    source = ConfigSource(path.read_bytes(), parse_config, path)
    before = source.etag
    path.write_bytes(b"listeners: []  # edited by hand\n")
    assert source.etag != before  # a stale If-Match is 412, the hand edit is not lost
    source.write(path.read_bytes(), "v1")
    assert not (tmp_path / "config.yaml.backups").exists()  # nothing changed: no backup
    path.chmod(0o444)
    with pytest.raises(PermissionError):
        source.write(b"listeners: [] # new\n", "v2")
    assert path.read_bytes() == b"listeners: []  # edited by hand\n"


def test_a_document_of_nested_anchors_is_refused_before_it_expands() -> None:
    from vllm_sr.config_document import MAX_NODES, ConfigRefused, safe_yaml
    from vllm_sr.reload import Reloads

    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    bomb = "\n".join(lines)
    assert len(bomb) < 1000
    reloads = Reloads(None, ConfigSource(b"", parse_config), None)  # type: ignore[arg-type]
    with pytest.raises(ConfigRefused) as caught:
        reloads.candidate(bomb, "replace")
    assert caught.value.code == "INVALID_CONFIG"
    assert f"more than {MAX_NODES} values" in caught.value.message
    assert safe_yaml("a: &x {b: 1}\nc: *x") == {"a": {"b": 1}, "c": {"b": 1}}  # anchors work


def test_a_document_asking_for_the_other_mode_needs_a_restart() -> None:
    router = parse_config(
        {
            "listeners": [listener()],
            "providers": {"models": [{"name": "m", "backend_refs": [{"endpoint": "h:1"}]}]},
        }
    )
    written = {"global": {"router": {"enabled": False}}}
    problems = restart_problems(router, router, written)
    assert len(problems) == 1 and problems[0].startswith("global.router.enabled: false asks ")
    no_backends = parse_config({"listeners": [listener()]})
    assert restart_problems(router, no_backends)[0].startswith("providers.models: ")


BACKENDS = {
    "providers": {
        "models": [
            {
                "name": "chat",
                "backend_refs": [
                    {"endpoint": "a.internal:8000", "api_key": "sk-a"},
                    {"endpoint": "b.internal:8000", "api_key": "sk-b"},
                    {"name": "named", "base_url": "https://c.internal/v1", "api_key": "sk-c"},
                ],
            }
        ]
    },
}


def refs_of(document: dict[str, object]) -> list[dict[str, object]]:
    return document["providers"]["models"][0]["backend_refs"]  # type: ignore[index, no-any-return]


def test_a_backend_without_a_name_keeps_its_own_key_when_reordered_or_its_sibling_removed() -> None:
    edited = redacted(BACKENDS)
    refs_of(edited).reverse()
    assert refs_of(unredacted(edited, BACKENDS)) == [
        {"name": "named", "base_url": "https://c.internal/v1", "api_key": "sk-c"},
        {"endpoint": "b.internal:8000", "api_key": "sk-b"},
        {"endpoint": "a.internal:8000", "api_key": "sk-a"},
    ]
    edited = redacted(BACKENDS)
    del refs_of(edited)[0]
    assert [r["api_key"] for r in refs_of(unredacted(edited, BACKENDS))] == ["sk-b", "sk-c"]
    assert unredacted(redacted(BACKENDS), BACKENDS) == BACKENDS  # named and unnamed mixed


@pytest.mark.parametrize(
    ("index", "change", "message"),
    [
        (
            2,
            {"base_url": "https://collector.example/v1"},
            "providers.models[0].backend_refs[2].api_key is '<redacted>': the saved credential "
            "there is not sent to a new destination (base_url https://c.internal/v1 -> "
            "https://collector.example/v1); write the credential itself",
        ),
        (
            0,
            {"endpoint": "collector.example:80"},
            "providers.models[0].backend_refs[0].api_key is '<redacted>': <redacted> stands "
            "for a credential the saved configuration does not have there; write the "
            "credential itself",
        ),
        (
            1,
            {"protocol": "https"},
            "providers.models[0].backend_refs[1].api_key is '<redacted>': <redacted> stands "
            "for a credential the saved configuration does not have there; write the "
            "credential itself",
        ),
    ],
)
def test_a_kept_key_is_never_sent_to_another_destination(index, change, message) -> None:
    edited = redacted(BACKENDS)
    refs_of(edited)[index].update(change)
    with pytest.raises(RedactedUnknown) as refused:
        unredacted(edited, BACKENDS)
    assert str(refused.value) == message


def test_repeated_names_keep_their_own_values_and_a_patch_keeps_unwritten_destinations() -> None:
    headers = [
        {"name": "Authorization", "value": "Bearer one"},
        {"name": "Authorization", "value": "Bearer two"},
    ]
    saved = {
        "routing": {
            "decisions": [
                {
                    "name": "d",
                    "plugins": [{"type": "header_mutation", "configuration": {"add": headers}}],
                }
            ]
        }
    }
    assert unredacted(redacted(saved), saved) == saved
    attached = {"global": {"model_catalog": {"deployments": {"x": {"endpoint": "http://h:1"}}}}}
    patch = {"global": {"model_catalog": {"deployments": {"x": {"served_name": "y"}}}}}
    assert unredacted(patch, attached, patch=True) == patch


def test_a_document_written_back_with_placeholders_is_saved_with_the_keys(tmp_path: Path) -> None:
    from vllm_sr.reload import Reloads

    saved = {"listeners": [listener(api_keys=["k-1", "k-2"])], **BACKENDS}
    text = yaml.safe_dump(saved).encode()
    reloads = Reloads(None, ConfigSource(text, parse_config), None)  # type: ignore[arg-type]
    shown = redacted(saved)
    refs_of(shown).reverse()
    candidate = reloads.candidate(yaml.safe_dump(shown), "replace")
    assert REDACTED.encode() not in candidate.text
    written = yaml.safe_load(candidate.text)
    assert written["listeners"][0]["api_keys"] == ["k-1", "k-2"]
    assert [(r.get("endpoint") or r.get("base_url"), r["api_key"]) for r in refs_of(written)] == [
        ("https://c.internal/v1", "sk-c"),
        ("b.internal:8000", "sk-b"),
        ("a.internal:8000", "sk-a"),
    ]
    patched = reloads.candidate(json.dumps({"listeners": redacted(saved)["listeners"]}), "merge")
    assert REDACTED.encode() not in patched.text
    assert yaml.safe_load(patched.text)["listeners"][0]["api_keys"] == ["k-1", "k-2"]


class Unstartable:
    """A frontend serving ``config`` whose next generation cannot be planned (an apply's
    activation fails at once, nothing started)."""

    def __init__(self, config: object) -> None:
        from types import SimpleNamespace

        self.active = SimpleNamespace(config=config, version=1)
        self.preparing = None
        self.status = SimpleNamespace(preparing=None)

    async def compose(self, config: object, previous: object) -> object:
        from vllm_sr.workers.environment import PlanError

        raise PlanError("no worker is started in this test")


def test_two_applies_with_one_etag_at_once_write_once_and_the_other_is_412() -> None:
    from vllm_sr.config_document import ConfigRefused
    from vllm_sr.reload import Reloads

    document = {"listeners": [listener()]}
    config = parse_config(document)
    source = ConfigSource(yaml.safe_dump(document).encode(), parse_config)
    reloads = Reloads(Unstartable(config), source, None)  # type: ignore[arg-type]
    reloads.active_hash = reloads.generated_hash = runtime_hash(config)
    etag = source.etag

    async def both() -> list[object]:
        patches = [{"listeners": [listener(runtime={"models": [m]})]} for m in ("one", "two")]
        applies = [reloads.apply(json.dumps(p), "merge", etag) for p in patches]
        return await asyncio.gather(*applies, return_exceptions=True)

    first, second = asyncio.run(both())
    assert isinstance(first, tuple) and first[0] == 503  # written, then not activated
    assert first[1]["status"] == "activation_failed"
    assert isinstance(second, ConfigRefused)
    assert (second.status, second.code) == (412, "CONFIG_CHANGED")
    assert yaml.safe_load(source.text)["listeners"][0]["runtime"] == {"models": ["one"]}


@pytest.mark.parametrize("mode", ["replace", "merge"])
def test_a_document_nested_past_the_limit_is_refused_not_an_internal_error(mode: str) -> None:
    from vllm_sr.config_document import MAX_DEPTH, ConfigRefused
    from vllm_sr.reload import Reloads

    text = yaml.safe_dump({"listeners": [listener()]}).encode()
    reloads = Reloads(None, ConfigSource(text, parse_config), None)  # type: ignore[arg-type]

    def pricing(depth: int) -> str:  # a value the schema takes as it is, nested depth deep
        nested = "[" * depth + "]" * depth
        model = f"{{name: m, backend_refs: [{{endpoint: 'h:1'}}], pricing: {nested}}}"
        return f"providers: {{models: [{model}]}}"

    # pricing sits 4 levels down: the document is 4 + depth deep
    assert reloads.candidate(pricing(MAX_DEPTH - 4), mode).config.providers.models[0].pricing
    for depth in (MAX_DEPTH - 3, 300, 450, 5000):  # 300 and 450 used to be 500s
        with pytest.raises(ConfigRefused) as caught:
            reloads.candidate(pricing(depth), mode)
        assert (caught.value.status, caught.value.code) == (400, "INVALID_CONFIG")
        assert caught.value.message == (
            f"the document is not YAML: the document nests more than {MAX_DEPTH} levels deep"
            + ("" if depth == 5000 else " (its aliases followed)")
        )


PLACEHOLDER_MESSAGE = (
    "holds <redacted>, the placeholder the configuration API shows instead of a credential, "
    "not a credential: write the credential itself (only a document applied through the "
    "configuration API gets the saved one back there)"
)


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        (
            {"listeners": [listener(api_keys=["k", REDACTED])]},
            "listeners[0].api_keys: api_keys[1]",
        ),
        (
            {
                "listeners": [listener()],
                "providers": {
                    "models": [
                        {"name": "m", "backend_refs": [{"endpoint": "h:1", "api_key": REDACTED}]}
                    ]
                },
            },
            "providers.models[0].backend_refs[0]: api_key",
        ),
        (
            {
                "listeners": [listener()],
                "providers": {
                    "models": [
                        {
                            "name": "m",
                            "backend_refs": [{"base_url": f"http://admin:{REDACTED}@h:1/v1"}],
                        }
                    ]
                },
            },
            "providers.models[0].backend_refs[0]: base_url",
        ),
        (
            {
                "listeners": [listener()],
                "global": {
                    "model_catalog": {
                        "deployments": {
                            "a": {
                                "provider": "model_runtime",
                                "artifact": "org/a",
                                "endpoint": f"https://u:{REDACTED}@h:1",
                            }
                        }
                    }
                },
            },
            "global.model_catalog.deployments.a.endpoint: endpoint",
        ),
    ],
)
def test_a_placeholder_is_never_taken_as_a_credential(document, problem) -> None:
    from vllm_sr.config.schema import ConfigError

    with pytest.raises(ConfigError) as refused:
        parse_config(document)
    assert refused.value.problems == [f"{problem} {PLACEHOLDER_MESSAGE}"]


def test_a_file_written_from_config_get_and_reread_on_sighup_keeps_no_placeholder_key(
    tmp_path: Path,
) -> None:
    """``vllm-sr config get`` copied over the file, then SIGHUP: the file read is the
    document itself, with no saved key behind its placeholders. It used to make the listener's
    key the text ``<redacted>``."""
    from vllm_sr.config_document import ConfigRefused
    from vllm_sr.reload import Reloads

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"listeners": [listener(api_keys=["real-key"])]}))
    reloads = Reloads(None, ConfigSource(path.read_bytes(), parse_config, path), None)  # type: ignore[arg-type]
    shown = redacted(yaml.safe_load(path.read_text()))
    path.write_text(yaml.safe_dump(shown))
    with pytest.raises(ConfigRefused) as refused:
        reloads.candidate(path.read_text(), "replace")
    assert (refused.value.status, refused.value.code) == (400, "INVALID_CONFIG")
    assert refused.value.reasons == [
        {
            "code": "INVALID_CONFIG",
            "path": "listeners[0].api_keys",
            "message": f"api_keys[0] {PLACEHOLDER_MESSAGE}",
        }
    ]


def test_the_saved_document_written_back_with_placeholders_changes_nothing() -> None:
    """``vllm-sr config get`` applied back as it is, or an empty merge patch: the same
    document, so the file keeps its bytes (comments included) and nothing is to apply."""
    from vllm_sr.reload import Reloads

    text = b"# the team's listener\nlisteners:\n  - name: http  # public\n    port: 8899\n"
    text += b"    api_keys: [k-1]\n"
    reloads = Reloads(None, ConfigSource(text, parse_config), None)  # type: ignore[arg-type]
    reloads.active_hash = runtime_hash(parse_config(yaml.safe_load(text)))
    shown = json.dumps(redacted(yaml.safe_load(text)))
    for sent, mode in [(shown, "replace"), ("{}", "merge"), (shown, "merge")]:
        candidate = reloads.candidate(sent, mode)
        assert (candidate.changed, candidate.text) == (False, text), (sent, mode)
    commented = reloads.candidate("# a comment of its own\n" + text.decode(), "replace")
    assert commented.changed and commented.text.startswith(b"# a comment of its own\n")
