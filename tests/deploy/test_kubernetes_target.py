"""``vllm-sr serve --target kubernetes``: the self-contained overlay it writes from any
directory renders and validates strict, runs MODEL... where it says (the router pod, or
the shared runtime with the frontend attached), and its refusals."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_sr.cli import main
from vllm_sr.config.schema import load_config, parse_config
from vllm_sr.kubernetes import BUILTIN_MODELS
from vllm_srun.cli import build_parser as runtime_parser
from vllm_srun.serve.command import serve_config

from .conftest import MANIFESTS, ROOT, by_kind, render, validate

COMMIT = "0123456789abcdef" * 2 + "01234567"
EDGE = f"vllm-sr/d3-edge@{COMMIT}"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MINILM_COMMIT = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"
IMAGE = "ghcr.io/vllm-project/semantic-router/vllm-sr"
GPU = {"cpu": None, "rocm": "amd.com/gpu", "cuda": "nvidia.com/gpu"}
DEVICE = {"cpu": "cpu", "rocm": "rocm:0", "cuda": "cuda:0"}
SUFFIX = {"cpu": "", "rocm": "-rocm", "cuda": "-cuda"}


def write(tmp_path: Path, capsys: Any, *argv: str) -> tuple[int, str, str]:
    """``vllm-sr serve --target kubernetes --output tmp_path/overlay ARGV``: the exit
    status, stdout and stderr."""
    out = tmp_path / "overlay"
    code = main(["serve", "--target", "kubernetes", "--output", str(out), *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def pod(documents: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return by_kind(documents, "Deployment", name)["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def frontend_config(documents: list[dict[str, Any]]) -> dict[str, Any]:
    """The frontend's config.yaml from the ConfigMap its pod mounts."""
    volume = next(v for v in pod(documents, "vllm-sr")["volumes"] if v["name"] == "config")
    config_map = by_kind(documents, "ConfigMap", volume["configMap"]["name"])
    assert list(config_map["data"]) == ["config.yaml"]
    return yaml.safe_load(config_map["data"]["config.yaml"])  # type: ignore[no-any-return]


def claim_of(documents: list[dict[str, Any]], deployment: str) -> dict[str, Any]:
    volume = next(v for v in pod(documents, deployment)["volumes"] if v["name"] == "models")
    return by_kind(documents, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])


def test_from_an_empty_directory_the_cuda_router_pod_runs_the_model(tmp_path, capsys, monkeypatch):
    """The issue's check: from an empty directory, MiniLM on cuda; the overlay renders and
    validates strict, and the pod that runs the model has nvidia.com/gpu."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    code = main(["serve", "--target", "kubernetes", "--platform", "cuda", MINILM])
    captured = capsys.readouterr()
    assert (code, captured.err) == (0, "")
    assert captured.out == (
        "wrote vllm-sr-kubernetes/kustomization.yaml\n"
        "namespace: vllm-sr (the default; --namespace NS for another)\n"
        "kubectl apply -k vllm-sr-kubernetes\n"
        f"router pod: vllm-sr runs {MINILM} on cuda:0\n"
        "its listener: http://vllm-sr.vllm-sr.svc.cluster.local:8899\n"
    )
    # Self-contained: moved anywhere, it renders the same (nothing outside it is read).
    moved = tmp_path / "elsewhere" / "overlay"
    shutil.copytree(empty / "vllm-sr-kubernetes", moved)
    shutil.rmtree(empty / "vllm-sr-kubernetes")
    kustomization = yaml.safe_load((moved / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["namespace.yaml", "base/frontend"]
    documents = render(moved)
    assert validate(documents) == []
    named = sorted((d["kind"], d["metadata"]["name"]) for d in documents)
    assert named[0][0] == "ConfigMap" and named[0][1].startswith("vllm-sr-config-")
    assert named[1:] == [
        ("Deployment", "vllm-sr"),
        ("Namespace", "vllm-sr"),
        ("PersistentVolumeClaim", "vllm-sr-models"),
        ("Service", "vllm-sr"),
    ]
    assert {d["metadata"].get("namespace") for d in documents if d["kind"] != "Namespace"} == {
        "vllm-sr"
    }
    spec = pod(documents, "vllm-sr")
    (container,) = spec["containers"]
    assert container["image"] == f"{IMAGE}-cuda:latest"
    assert container["resources"]["limits"] == {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": 1}
    assert spec["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert container["command"] == ["vllm-sr"]
    assert container["args"] == [
        "serve", "-e", "--config", "/etc/vllm-sr/config.yaml", "--log-level", "info",
    ]  # fmt: skip
    config = frontend_config(documents)
    assert config["global"]["model_catalog"]["deployments"] == {
        "primary": {"provider": "model_runtime", "artifact": MINILM, "device": "cuda:0"}
    }
    assert claim_of(documents, "vllm-sr")["spec"]["resources"]["requests"]["storage"] == "10Gi"


@pytest.mark.parametrize("platform", ["cpu", "rocm", "cuda"])
@pytest.mark.parametrize("shared", [False, True], ids=["managed", "shared"])
def test_every_platform_and_layout_renders_and_validates(tmp_path, capsys, platform, shared):
    code, out, err = write(
        tmp_path, capsys, "--platform", platform, "--namespace", "routing",
        "--max-num-seqs", "64", *(["--shared-runtime"] if shared else []), EDGE, MINILM,
    )  # fmt: skip
    assert (code, err) == (0, "")
    documents = render(tmp_path / "overlay")
    assert validate(documents) == []
    assert "<namespace>" not in out
    assert by_kind(documents, "Namespace", "routing")["apiVersion"] == "v1"
    gpu = GPU[platform]
    limits = {"cpu": "2", "memory": "7Gi" if shared else "4Gi", **({gpu: 1} if gpu else {})}
    tolerations = [{"key": gpu, "operator": "Exists", "effect": "NoSchedule"}] if gpu else None
    config = frontend_config(documents)
    deployments = config["global"]["model_catalog"]["deployments"]
    frontend = pod(documents, "vllm-sr")
    if shared:
        endpoint = "http://model-runtime.routing.svc.cluster.local:8100"
        assert out.splitlines()[2:] == [
            f"runtime: model-runtime serves {EDGE} {MINILM} on {DEVICE[platform]} at {endpoint}",
            "frontend: vllm-sr attaches to it; its listener: "
            "http://vllm-sr.routing.svc.cluster.local:8899",
        ]
        runtime = pod(documents, "model-runtime")
        (container,) = runtime["containers"]
        assert container["image"] == f"{IMAGE}{SUFFIX[platform]}:latest"
        assert container["resources"]["limits"] == limits
        assert runtime.get("tolerations") == tolerations
        assert container["args"] == [
            "serve", EDGE, MINILM, "--device", DEVICE[platform], "--max-num-seqs", "64",
            "--host", "0.0.0.0", "--port", "8100", "--cache-dir", "/app/models/model-runtime",
            "--log-level", "info",
        ]  # fmt: skip
        served = serve_config(runtime_parser().parse_args(container["args"]))
        assert [(m.model, m.device, m.max_num_seqs) for m in served.models] == [
            (EDGE, DEVICE[platform], 64),
            (MINILM, DEVICE[platform], 64),
        ]
        # The frontend attaches to the runtime's Service and starts no worker of its own.
        assert deployments == {
            "primary": {"provider": "model_runtime", "artifact": "vllm-sr/d3-edge",
                        "endpoint": endpoint, "served_name": "vllm-sr/d3-edge"},
            "all-minilm-l6-v2": {"provider": "model_runtime", "artifact": MINILM,
                                 "endpoint": endpoint, "served_name": MINILM},
        }  # fmt: skip
        service = by_kind(documents, "Service", "model-runtime")
        assert service["spec"]["ports"][0]["port"] == 8100
        assert frontend["containers"][0]["image"] == f"{IMAGE}:latest"
        assert "tolerations" not in frontend
    else:
        assert out.splitlines()[2:] == [
            f"router pod: vllm-sr runs {EDGE} {MINILM} on {DEVICE[platform]}",
            "its listener: http://vllm-sr.routing.svc.cluster.local:8899",
        ]
        assert [d["metadata"]["name"] for d in documents if d["kind"] == "Deployment"] == [
            "vllm-sr"
        ]
        (container,) = frontend["containers"]
        assert container["image"] == f"{IMAGE}{SUFFIX[platform]}:latest"
        assert container["resources"]["limits"] == limits
        assert frontend.get("tolerations") == tolerations
        assert deployments == {
            "primary": {"provider": "model_runtime", "artifact": "vllm-sr/d3-edge",
                        "revision": COMMIT, "device": DEVICE[platform], "max_num_seqs": 64},
            "all-minilm-l6-v2": {"provider": "model_runtime", "artifact": MINILM,
                                 "device": DEVICE[platform], "max_num_seqs": 64},
        }  # fmt: skip
    assert config["listeners"] == [
        {
            "name": "http",
            "address": "0.0.0.0",
            "port": 8899,
            "systemone": {"models": ["vllm-sr/d3-edge"]},
            "runtime": {"models": ["vllm-sr/d3-edge", MINILM]},
        }
    ]
    parsed = parse_config(config, "config.yaml")
    assert parsed.catalog.decision_deployment == "primary"
    assert claim_of(documents, "vllm-sr")["spec"]["resources"]["requests"]["storage"] == "10Gi"


@pytest.mark.parametrize("shared", [False, True], ids=["managed", "shared"])
def test_the_written_config_passes_the_frontends_loader(tmp_path, capsys, shared):
    code, _, _ = write(tmp_path, capsys, *(["--shared-runtime"] * shared), MINILM)
    assert code == 0
    written = tmp_path / "overlay" / "config.yaml"
    config = load_config(written)
    (deployment,) = config.catalog.deployments.values()
    assert deployment.managed is not shared
    assert main(["config", "validate", str(written)]) == 0
    capsys.readouterr()


def test_storage_sizes_the_claim_of_the_pod_that_runs_the_models(tmp_path, capsys):
    code, _, _ = write(tmp_path, capsys, "--storage", "20Gi", MINILM)
    assert code == 0
    documents = render(tmp_path / "overlay")
    assert validate(documents) == []
    assert claim_of(documents, "vllm-sr")["spec"]["resources"]["requests"]["storage"] == "20Gi"
    shutil.rmtree(tmp_path / "overlay")
    code, _, _ = write(tmp_path, capsys, "--shared-runtime", "--storage", "1.5Ti", MINILM)
    assert code == 0
    documents = render(tmp_path / "overlay")
    assert validate(documents) == []
    runtime_claim = claim_of(documents, "model-runtime")
    assert runtime_claim["metadata"]["name"] == "model-runtime-models"
    assert runtime_claim["spec"]["resources"]["requests"]["storage"] == "1.5Ti"
    assert claim_of(documents, "vllm-sr")["spec"]["resources"]["requests"]["storage"] == "10Gi"


def test_another_image_and_offline_reach_the_pod_that_runs_the_models(tmp_path, capsys):
    code, _, _ = write(
        tmp_path, capsys, "--image", "registry.local/vllm-sr:1.0", "--offline",
        "--log-level", "warn", MINILM,
    )  # fmt: skip
    assert code == 0
    documents = render(tmp_path / "overlay")
    (container,) = pod(documents, "vllm-sr")["containers"]
    assert container["image"] == "registry.local/vllm-sr:1.0"
    assert container["args"] == [
        "serve", "-e", "--config", "/etc/vllm-sr/config.yaml", "--log-level", "warn",
        "--offline",
    ]  # fmt: skip


def test_an_unpinned_model_that_is_not_built_in_is_refused(tmp_path, capsys):
    code, out, err = write(tmp_path, capsys, MINILM, "BAAI/bge-small-en-v1.5")
    assert (code, out) == (1, "")
    assert err == (
        "vllm-sr: BAAI/bge-small-en-v1.5 is not a built-in model (vllm-srun models) and has no "
        "revision, so the runtime in the cluster would refuse to load it; pin it as "
        "BAAI/bge-small-en-v1.5@<40-hex commit> or with --revision <40-hex commit> "
        "[unpinned_model]\n"
    )
    assert not (tmp_path / "overlay").exists()


@pytest.mark.parametrize(
    ("argv", "artifact", "revision"),
    [
        ([f"BAAI/bge-small-en-v1.5@{COMMIT.upper()}"], "BAAI/bge-small-en-v1.5", COMMIT),
        (["BAAI/bge-small-en-v1.5", "--revision", COMMIT], "BAAI/bge-small-en-v1.5", COMMIT),
        ([f"{MINILM}@{MINILM_COMMIT}"], MINILM, MINILM_COMMIT),
        (["arcjet/rampart-pii"], "arcjet/rampart-pii", None),
    ],
)
def test_pinned_and_built_in_models_pass_without_a_word(tmp_path, capsys, argv, artifact, revision):
    code, _, err = write(tmp_path, capsys, *argv)
    assert (code, err) == (0, "")
    config = load_config(tmp_path / "overlay" / "config.yaml")
    deployment = config.catalog.deployments["primary"]
    assert (deployment.artifact, deployment.revision) == (artifact, revision)


def test_the_frontends_built_in_names_are_the_runtimes_table():
    from vllm_srun.plugins import load_catalog

    assert set(load_catalog({}).layer("models")) == BUILTIN_MODELS


def test_a_second_run_needs_force(tmp_path, capsys):
    assert write(tmp_path, capsys, "--namespace", "first", MINILM)[0] == 0
    before = (tmp_path / "overlay" / "kustomization.yaml").read_text()
    code, out, err = write(tmp_path, capsys, "--namespace", "second", MINILM)
    assert (code, out) == (1, "")
    assert err == (
        f"vllm-sr: {tmp_path / 'overlay'} is not empty (an overlay written before?); pass "
        "--force to replace the overlay there, or --output DIR for another directory "
        "[overlay_exists]\n"
    )
    assert (tmp_path / "overlay" / "kustomization.yaml").read_text() == before
    # --force replaces it: the managed overlay becomes a shared one, no stale base left.
    code, _, err = write(tmp_path, capsys, "--force", "--shared-runtime", "--namespace", "second",
                         MINILM)  # fmt: skip
    assert (code, err) == (0, "")
    documents = render(tmp_path / "overlay")
    assert validate(documents) == []
    assert by_kind(documents, "Namespace", "second")
    assert sorted(p.name for p in (tmp_path / "overlay" / "base").iterdir()) == [
        "frontend", "overlays", "runtime",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--port", "9000", MINILM], "--port applies to the docker target"),
        (["--image-pull-policy", "never", MINILM],
         "--image-pull-policy applies to the docker target"),
        (["--container-runtime", "podman", MINILM],
         "--container-runtime applies to the docker target"),
        (["-dp", "2", MINILM],
         "--target kubernetes does not take -dp (scale the Deployment's replicas instead)"),
        ([], "--target kubernetes needs at least one MODEL (a built-in model name, or a Hub "
             "repository pinned as MODEL@<40-hex commit>)"),
        (["--namespace", "Bad_NS", MINILM], "--namespace 'Bad_NS' is not a DNS-1123 label "
                                           "(lower-case letters, digits and '-', at most 63)"),
        (["--device", "cuda:0", MINILM], "--device cuda:0 needs --platform nvidia, whose image "
                                         "runs cuda"),
        (["--storage", "20GB", MINILM], "--storage '20GB' is not a positive Kubernetes quantity: "
                                        "give a size such as 20Gi (Ki, Mi, Gi, Ti; or k, M, G, T)"),
        (["--storage", "0Gi", MINILM], "--storage '0Gi' is not a positive Kubernetes quantity: "
                                       "give a size such as 20Gi (Ki, Mi, Gi, Ti; or k, M, G, T)"),
        (["BAAI/bge-small-en-v1.5@main"], "BAAI/bge-small-en-v1.5@main: revision 'main' is not a "
                                          "40-hex commit; pin the full commit hash: "
                                          "BAAI/bge-small-en-v1.5@<40-hex commit> or --revision "
                                          "<40-hex commit>"),
        ([MINILM, MINILM], f"{MINILM} is given twice; name each model once"),
        (["-e", MINILM], "--target kubernetes writes the frontend's pod itself; leave out -e"),
    ],
)  # fmt: skip
def test_refusals(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        write(tmp_path, capsys, *argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"vllm-sr serve: {message}\n"
    assert not (tmp_path / "overlay").exists()


def test_a_local_directory_cannot_reach_a_cluster(tmp_path, capsys):
    package = tmp_path / "pkg"
    package.mkdir()
    with pytest.raises(SystemExit):
        write(tmp_path, capsys, str(package))
    assert "is a local directory, which a cluster cannot mount" in capsys.readouterr().err


def test_other_manifests(tmp_path, capsys):
    mine = tmp_path / "mine"
    shutil.copytree(MANIFESTS, mine)
    deployment = mine / "frontend" / "deployment.yaml"
    deployment.write_text(deployment.read_text().replace('cpu: "2"', 'cpu: "3"'))
    code, _, _ = write(tmp_path, capsys, "--manifests", str(mine), MINILM)
    assert code == 0
    (container,) = pod(render(tmp_path / "overlay"), "vllm-sr")["containers"]
    assert container["resources"]["limits"]["cpu"] == "3"
    code, _, err = write(tmp_path, capsys, "--force", "--manifests", str(tmp_path / "none"), MINILM)
    assert code == 1
    assert err == (
        f"vllm-sr: no kustomize base at {tmp_path / 'none' / 'frontend'}: pass --manifests DIR, "
        "a folder holding runtime/, frontend/ and overlays/<platform>/ (a vllm-srun checkout's "
        "deploy/kubernetes), or reinstall vllm-sr, which ships them [no_manifests]\n"
    )


@pytest.mark.slow
def test_the_wheel_ships_the_manifests_and_its_command_writes_the_overlay(tmp_path):
    """Built as a wheel, vllm-sr carries every YAML of deploy/kubernetes; unpacked (no
    checkout beside it) and run from an empty directory, it writes an overlay that renders
    and validates strict."""
    source = tmp_path / "source"
    for folder in ("core", "plugins", "families", "engines", "accelerators", "extensions",
                   "frontend", "deploy/kubernetes"):  # fmt: skip
        shutil.copytree(
            ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         str(source), "-w", str(tmp_path / "wheel")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    expected = {
        f"vllm_sr/manifests/{p.relative_to(MANIFESTS).as_posix()}"
        for p in MANIFESTS.rglob("*.yaml")
    }
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert expected <= names
        assert "vllm_sr/manifests/frontend/pvc.yaml" in names
        archive.extractall(tmp_path / "installed")
    empty = tmp_path / "empty"
    empty.mkdir()
    script = (
        "import vllm_sr, sys; print(vllm_sr.__file__, file=sys.stderr); "
        "from vllm_sr.cli import main; raise SystemExit(main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, "serve", "--target", "kubernetes", "--platform", "cuda",
         MINILM],
        cwd=empty, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "installed")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == str(tmp_path / "installed" / "vllm_sr" / "__init__.py")
    documents = render(empty / "vllm-sr-kubernetes")
    assert validate(documents) == []
    (container,) = pod(documents, "vllm-sr")["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
