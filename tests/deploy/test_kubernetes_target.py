"""``vllm-sr serve --target kubernetes``: the self-contained overlay it writes from any
directory renders and validates strict, runs MODEL... where it says (the router pod, or
the shared runtime with the frontend attached), and its refusals (the built wheel:
test_frontend_distribution.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_sr.cli import main
from vllm_sr.config.schema import load_config, parse_config
from vllm_sr.deploy.kubernetes import BUILTIN_MODELS
from vllm_srun.cli import build_parser as runtime_parser
from vllm_srun.serve.command import serve_config

from .conftest import MANIFESTS, by_kind, render, validate

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
        "note: the overlay creates the namespace vllm-sr, so kubectl delete -k "
        "vllm-sr-kubernetes deletes it and everything in it (--existing-namespace leaves it "
        "out)\n"
        f"router pod: vllm-sr runs {MINILM} on cuda:0\n"
        "its listener: http://vllm-sr.vllm-sr.svc.cluster.local:8899\n"
        "next: kubectl apply -k vllm-sr-kubernetes\n"
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
    assert container["resources"]["limits"] == {"cpu": "2", "memory": "7Gi", "nvidia.com/gpu": 1}
    assert container["resources"]["requests"] == {"cpu": "1", "memory": "3Gi"}
    # One GPU per pod: a rolling update would wait for a second free GPU.
    assert by_kind(documents, "Deployment", "vllm-sr")["spec"]["strategy"] == {"type": "Recreate"}
    assert "supplementalGroups" not in spec["securityContext"]
    assert kustomization["images"] == [{"name": f"{IMAGE}-cuda", "newTag": "latest"}]
    text = (moved / "kustomization.yaml").read_text()
    assert text.startswith("# Written by vllm-sr serve --target kubernetes")
    assert (
        "# The images the pods run. Pin a release: kustomize edit set image "
        f"{IMAGE}-cuda:TAG (or change newTag here).\nimages:\n"
    ) in text
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
    limits = {"cpu": "2", "memory": "7Gi", **({gpu: 1} if gpu else {})}
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
            f"next: kubectl apply -k {tmp_path / 'overlay'}",
        ]
        runtime = pod(documents, "model-runtime")
        (container,) = runtime["containers"]
        assert container["image"] == f"{IMAGE}{SUFFIX[platform]}:latest"
        assert container["resources"]["limits"] == limits
        assert runtime.get("tolerations") == tolerations
        groups = runtime["securityContext"].get("supplementalGroups")
        assert groups == ([44, 109] if platform == "rocm" else None)
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
        # The attached frontend downloads nothing: no claim of its own, a small emptyDir.
        models = next(v for v in frontend["volumes"] if v["name"] == "models")
        assert models == {"name": "models", "emptyDir": {"sizeLimit": "1Gi"}}
        claims = [d["metadata"]["name"] for d in documents if d["kind"] == "PersistentVolumeClaim"]
        assert claims == ["model-runtime-models"]
    else:
        assert out.splitlines()[2:] == [
            f"router pod: vllm-sr runs {EDGE} {MINILM} on {DEVICE[platform]}",
            "its listener: http://vllm-sr.routing.svc.cluster.local:8899",
            f"next: kubectl apply -k {tmp_path / 'overlay'}",
        ]
        assert [d["metadata"]["name"] for d in documents if d["kind"] == "Deployment"] == [
            "vllm-sr"
        ]
        (container,) = frontend["containers"]
        assert container["image"] == f"{IMAGE}{SUFFIX[platform]}:latest"
        assert container["resources"]["limits"] == limits
        assert frontend.get("tolerations") == tolerations
        strategy = by_kind(documents, "Deployment", "vllm-sr")["spec"].get("strategy")
        assert strategy == ({"type": "Recreate"} if gpu else None)
        groups = frontend["securityContext"].get("supplementalGroups")
        assert groups == ([44, 109] if platform == "rocm" else None)
        assert claim_of(documents, "vllm-sr")["spec"]["resources"]["requests"]["storage"] == "10Gi"
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
    from vllm_srun.plugins.host import load_catalog

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


STORAGE_UNIT = (
    "is not a Kubernetes quantity with a unit; give a size such as 20Gi (Ki, Mi, Gi, Ti, Pi; "
    "or k, M, G, T, P) [bad_flag]"
)
NOT_A_NAME = (
    "is neither a Hub repository ID nor a built-in model name (ASCII letters, digits, '.', "
    "'_' and '-', each part starting with a letter or digit); give owner/name@<40-hex "
    "commit>, a built-in name (vllm-srun models), or a local package as ./DIR or /DIR "
    "[bad_model]"
)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--port", "9000", MINILM],
         "--port applies to the docker target; leave it out with --target kubernetes [bad_flag]"),
        (["--image-pull-policy", "never", MINILM],
         "--image-pull-policy applies to the docker target; leave it out with --target "
         "kubernetes [bad_flag]"),
        (["-dp", "2", MINILM],
         "--target kubernetes does not take -dp (scale the Deployment's replicas instead) "
         "[bad_flag]"),
        ([], "--target kubernetes needs at least one MODEL; give a built-in model name, or a "
             "Hub repository pinned as MODEL@<40-hex commit> [bad_flag]"),
        (["--namespace", "Bad_NS", MINILM],
         "--namespace 'Bad_NS' is not a DNS-1123 label; give lower-case letters, digits and "
         "'-', at most 63 [bad_flag]"),
        (["--device", "cuda:0", MINILM],
         "--device cuda:0 needs --platform nvidia, whose image runs cuda [bad_flag]"),
        (["--platform", "cuda", "--device", "cuda:1", MINILM],
         "--device cuda:1: the pod gets one GPU, which it sees as index 0; give --device cuda:0 "
         "or leave --device out [bad_flag]"),
        (["--platform", "rocm", "--device", "rocm:1", MINILM],
         "--device rocm:1: the pod gets one GPU, which it sees as index 0; give --device rocm:0 "
         "or leave --device out [bad_flag]"),
        (["--platform", "cuda", "--device", "cpu", MINILM],
         "--device cpu with --platform cuda still asks the cluster for a GPU the pod would not "
         "use; give --platform cpu to run on the CPU [bad_flag]"),
        (["--storage", "20GB", MINILM], f"--storage '20GB' {STORAGE_UNIT}"),
        (["--storage", "20", MINILM], f"--storage '20' {STORAGE_UNIT}"),
        (["--storage", "0.5", MINILM], f"--storage '0.5' {STORAGE_UNIT}"),
        (["--storage", "1.", MINILM], f"--storage '1.' {STORAGE_UNIT}"),
        (["--storage", "0Gi", MINILM],
         "--storage 0Gi is outside what a model volume takes; give a size from 1Mi to 1Pi, "
         "such as 20Gi [bad_flag]"),
        (["--storage", "1025Ti", MINILM],
         "--storage 1025Ti is outside what a model volume takes; give a size from 1Mi to 1Pi, "
         "such as 20Gi [bad_flag]"),
        (["--image", "", MINILM],
         "--image '' is not an image reference; give [REGISTRY[:PORT]/]NAME[:TAG] in lower "
         "case, such as registry.local/vllm-sr-cuda:1.0 [bad_flag]"),
        (["--image", "bad image", MINILM],
         "--image 'bad image' is not an image reference; give [REGISTRY[:PORT]/]NAME[:TAG] in "
         "lower case, such as registry.local/vllm-sr-cuda:1.0 [bad_flag]"),
        (["BAAI/bge-small-en-v1.5@main"],
         "BAAI/bge-small-en-v1.5@main: revision 'main' is not a 40-hex commit; pin the full "
         "commit hash: BAAI/bge-small-en-v1.5@<40-hex commit> or --revision <40-hex commit> "
         "[unpinned_model]"),
        (["sentence-transformers/all-MiniLM-L6"],
         "sentence-transformers/all-MiniLM-L6 is not a built-in model (vllm-srun models); did "
         "you mean sentence-transformers/all-MiniLM-L6-v2? [unknown_model]"),
        ([f"org/mödel@{COMMIT}"], f"MODEL org/mödel@{COMMIT} {NOT_A_NAME}"),
        ([f"org/..@{COMMIT}"], f"MODEL org/..@{COMMIT} {NOT_A_NAME}"),
        ([f"org/-x@{COMMIT}"], f"MODEL org/-x@{COMMIT} {NOT_A_NAME}"),
        ([f"org/m\u0663@{COMMIT}"], f"MODEL org/m\u0663@{COMMIT} {NOT_A_NAME}"),
        (["org/x@"], "MODEL org/x@ ends with '@' but names no revision; give MODEL@<40-hex "
                     "commit> [bad_model]"),
        (["/nonexistent/pkg"],
         "MODEL /nonexistent/pkg: no such directory; give an existing package directory (and "
         "build it into an image), a built-in name or owner/name@<40-hex commit> "
         "[model_not_found]"),
        ([MINILM, MINILM], f"{MINILM} is given twice; name each model once [bad_flag]"),
        (["-e", MINILM],
         "--target kubernetes writes the frontend's pod itself; leave out -e [bad_flag]"),
        (["--output", "a\nb", MINILM],
         "--output 'a\\nb' is empty or holds a newline or another control character; give a "
         "plain directory name [bad_output]"),
    ],
)  # fmt: skip
def test_refusals(tmp_path, capsys, argv, message):
    code, out, err = write(tmp_path, capsys, *argv)
    assert (code, out) == (1, "")
    assert err == f"vllm-sr: {message}\n"
    assert not (tmp_path / "overlay").exists()


@pytest.mark.parametrize(
    "flag",
    [["--namespace", "x"], ["--shared-runtime"], ["--output", "o"], ["--storage", "1Gi"],
     ["--manifests", "m"], ["--force"], ["--existing-namespace"]],
)  # fmt: skip
@pytest.mark.parametrize("mode", [[], ["-e"]], ids=["docker", "engine"])
def test_kubernetes_flags_need_the_kubernetes_target(capsys, flag, mode):
    assert main(["serve", *mode, *flag, MINILM]) == 1
    assert capsys.readouterr().err == (
        f"vllm-sr: {flag[0]} applies to --target kubernetes; add --target kubernetes or leave "
        f"{flag[0]} out [bad_flag]\n"
    )


@pytest.mark.parametrize(
    "image",
    ["registry.local/vllm-sr:1.0", "localhost:5000/a/b-c__d", "ghcr.io/x/y@sha256:" + "a" * 64,
     "vllm-sr"],
)  # fmt: skip
def test_image_references(tmp_path, capsys, image):
    code, _, err = write(tmp_path, capsys, "--image", image, MINILM)
    assert (code, err) == (0, "")


def test_the_docker_target_refuses_a_bad_image(capsys):
    assert main(["serve", "--image", "Bad Image", MINILM]) == 1
    assert "--image 'Bad Image' is not an image reference" in capsys.readouterr().err


def test_a_local_directory_cannot_reach_a_cluster(tmp_path, capsys):
    package = tmp_path / "pkg"
    package.mkdir()
    code, _, err = write(tmp_path, capsys, str(package))
    assert code == 1
    assert err == (
        f"vllm-sr: MODEL {package} is a local package, which a cluster cannot mount; push it "
        "to a Hub repository, or build an image that holds it and pass --image [local_model]\n"
    )


def test_a_hub_id_that_is_also_a_folder_here_is_a_hub_id(tmp_path, capsys, monkeypatch):
    """As the runtime reads it: a bare owner/name is never a folder (./owner/name is)."""
    (tmp_path / "BAAI" / "bge-small-en-v1.5").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    code, _, err = write(tmp_path, capsys, f"BAAI/bge-small-en-v1.5@{COMMIT}")
    assert (code, err) == (0, "")
    shutil.rmtree(tmp_path / "overlay")
    code, _, err = write(tmp_path, capsys, "./BAAI/bge-small-en-v1.5")
    assert (code, "[local_model]" in err) == (1, True)


def test_the_model_name_rule_is_the_runtimes():
    from vllm_sr.names import is_repository_id
    from vllm_srun.plugins.models import MODEL_NAME_PATTERN

    names = [
        "org/model", "model", "BAAI/bge-small-en-v1.5", "a/b_c.d-e", "0rg/9", "org/mödel",
        "org/..", "org/-x", "org/.x", "org/_x", "-org/x", "org/m\u0663", "org/m\uff11",
        "org/x/y", "org/", "/x", "", "org x/y", "org/x y", "ORG/X", "o/x.", "o/x-",
    ]  # fmt: skip
    assert [is_repository_id(n) for n in names] == [
        MODEL_NAME_PATTERN.match(n) is not None for n in names
    ]


def test_existing_namespace_and_system_namespaces_are_not_created(tmp_path, capsys):
    for argv in (["--existing-namespace", "--namespace", "routing"], ["--namespace", "default"],
                 ["--namespace", "kube-system"]):  # fmt: skip
        code, out, err = write(tmp_path, capsys, *argv, MINILM)
        assert (code, err) == (0, "")
        assert "note:" not in out
        assert not (tmp_path / "overlay" / "namespace.yaml").exists()
        documents = render(tmp_path / "overlay")
        assert validate(documents) == []
        assert [d for d in documents if d["kind"] == "Namespace"] == []
        assert {d["metadata"]["namespace"] for d in documents} == {argv[-1]}
        shutil.rmtree(tmp_path / "overlay")


def test_printed_paths_are_quoted_as_written_and_tilde_expands(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert main(["serve", "--target", "kubernetes", "--output", "./my overlay", MINILM]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "wrote './my overlay/kustomization.yaml'"
    assert out[-1] == "next: kubectl apply -k './my overlay'"
    assert (tmp_path / "my overlay" / "kustomization.yaml").is_file()
    assert main(["serve", "--target", "kubernetes", "--output", "~/k8s", MINILM]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"next: kubectl apply -k {tmp_path / 'home' / 'k8s'}"
    assert (tmp_path / "home" / "k8s" / "kustomization.yaml").is_file()
    assert not (tmp_path / "~").exists()


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
        f"vllm-sr: no kustomize base at {tmp_path / 'none' / 'frontend'}; pass --manifests DIR, "
        "a folder holding runtime/, frontend/ and overlays/<platform>/ (a vllm-srun checkout's "
        "deploy/kubernetes), or reinstall vllm-sr, which ships them [no_manifests]\n"
    )


@pytest.mark.parametrize(
    ("shared", "missing", "listed"),
    [(False, "frontend/pvc.yaml", "frontend/kustomization.yaml lists pvc.yaml"),
     (True, "runtime/hpa.yaml", "runtime/kustomization.yaml lists hpa.yaml"),
     (True, "runtime", "overlays/cpu/kustomization.yaml lists ../../runtime")],
)  # fmt: skip
def test_incomplete_manifests_are_refused_and_nothing_is_written(
    tmp_path, capsys, shared, missing, listed
):
    mine = tmp_path / "mine"
    shutil.copytree(MANIFESTS, mine)
    gone = mine / missing
    shutil.rmtree(gone) if gone.is_dir() else gone.unlink()
    argv = ["--manifests", str(mine), *(["--shared-runtime"] if shared else []), MINILM]
    code, out, err = write(tmp_path, capsys, *argv)
    assert (code, out) == (1, "")
    if missing == "runtime":
        assert err.endswith("[no_manifests]\n")
    else:
        assert err == (
            f"vllm-sr: the bases are incomplete: {listed}, which is missing; pass --manifests "
            "DIR with complete bases (a vllm-srun checkout's deploy/kubernetes), or reinstall "
            "vllm-sr [incomplete_manifests]\n"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_force_replaces_only_our_files_and_refuses_a_folder_we_did_not_write(tmp_path, capsys):
    out = tmp_path / "overlay"
    out.mkdir()
    (out / "README.md").write_text("mine")
    (out / "kustomization.yaml").write_text("resources: [app.yaml]\n")
    code, _, err = write(tmp_path, capsys, "--force", MINILM)
    assert code == 1
    assert err == (
        f"vllm-sr: {out} holds files vllm-sr did not write (its kustomization.yaml does not "
        "start with 'Written by vllm-sr'), so --force leaves it alone; give an empty or new "
        "--output DIR [not_our_overlay]\n"
    )
    assert (out / "kustomization.yaml").read_text() == "resources: [app.yaml]\n"
    (out / "kustomization.yaml").unlink()
    code, _, err = write(tmp_path, capsys, "--force", MINILM)
    assert code == 1 and "[not_our_overlay]" in err
    (out / "README.md").unlink()
    assert write(tmp_path, capsys, MINILM)[0] == 0
    (out / "README.md").write_text("mine")
    (out / "base" / "frontend" / "notes.txt").write_text("mine too")
    code, _, err = write(tmp_path, capsys, "--force", "--shared-runtime", MINILM)
    assert code == 1
    assert err == (
        f"vllm-sr: {out}/base/frontend/notes.txt is not one of the bases vllm-sr writes, and "
        "--force replaces base/ whole; move it out of base/ and run again [not_our_overlay]\n"
    )
    assert (out / "base" / "frontend" / "notes.txt").read_text() == "mine too"
    (out / "base" / "frontend" / "notes.txt").unlink()
    code, _, err = write(tmp_path, capsys, "--force", "--shared-runtime", MINILM)
    assert (code, err) == (0, "")
    assert (out / "README.md").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md", "base", "config.yaml", "kustomization.yaml", "namespace.yaml",
    ]  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["overlay"]  # no temporary left
    assert validate(render(out)) == []


def test_a_failed_write_leaves_the_overlay_as_it_was(tmp_path, capsys, monkeypatch):
    assert write(tmp_path, capsys, "--namespace", "first", MINILM)[0] == 0
    before = {p: p.read_bytes() for p in (tmp_path / "overlay").rglob("*") if p.is_file()}
    import vllm_sr.deploy.kubernetes.write as kubernetes

    real = os.rename
    calls = []

    def failing(source, target):
        calls.append(target)
        if len(calls) == 6:  # after moving the old files aside, while placing the new ones
            raise OSError(28, "No space left on device")
        real(source, target)

    monkeypatch.setattr(kubernetes.os, "rename", failing)
    code, _, err = write(tmp_path, capsys, "--force", "--namespace", "second", MINILM)
    assert code == 1
    assert err == (
        f"vllm-sr: --output {tmp_path / 'overlay'} could not be written (No space left on "
        "device); fix that and run again [write_failed]\n"
    )
    after = {p: p.read_bytes() for p in (tmp_path / "overlay").rglob("*") if p.is_file()}
    assert after == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["overlay"]


def test_output_and_manifests_must_not_overlap(tmp_path, capsys):
    mine = tmp_path / "mine"
    shutil.copytree(MANIFESTS, mine)
    for output in (mine / "out", mine, tmp_path):
        code = main(["serve", "--target", "kubernetes", "--output", str(output), "--manifests",
                     str(mine), "--force", MINILM])  # fmt: skip
        assert code == 1
        assert capsys.readouterr().err == (
            f"vllm-sr: --output {output} and --manifests {mine} overlap; write the overlay "
            "outside the bases it copies [overlap]\n"
        )
    assert not (mine / "out").exists()


def test_output_paths_the_file_system_refuses(tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("")
    dangling = tmp_path / "link"
    dangling.symlink_to(tmp_path / "nowhere")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    cases = [
        (tmp_path / ("x" * 300), ": a file name is too long for this file system; give a shorter "
                                 "--output [file_name_too_long]"),
        (a_file / "out", " is under a file, not a directory; give a directory path "
                         "[output_under_file]"),
        (dangling, " is a symbolic link to nothing; remove it or give another --output "
                   "[dangling_symlink]"),
    ]  # fmt: skip
    if os.geteuid() != 0:  # root writes anywhere
        cases.append(
            (locked / "out", " cannot be written (Permission denied); give a directory you may "
                             "write to [unwritable_output]")
        )  # fmt: skip
    try:
        for output, message in cases:
            code = main(["serve", "--target", "kubernetes", "--output", str(output), MINILM])
            assert code == 1
            assert capsys.readouterr().err == f"vllm-sr: --output {output}{message}\n"
    finally:
        locked.chmod(0o700)


def test_an_unwritable_output_is_told(tmp_path, capsys, monkeypatch):
    import vllm_sr.deploy.kubernetes.write as kubernetes

    def refused(**_: object) -> str:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(kubernetes.tempfile, "mkdtemp", refused)
    code, _, err = write(tmp_path, capsys, MINILM)
    assert code == 1
    assert err == (
        f"vllm-sr: --output {tmp_path / 'overlay'} cannot be written (Permission denied); give "
        "a directory you may write to [unwritable_output]\n"
    )
    assert not (tmp_path / "overlay").exists()


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (f"org/mödel@{COMMIT}", f"MODEL org/mödel@{COMMIT} {NOT_A_NAME}"),
        ("org/..", f"MODEL org/.. {NOT_A_NAME}"),
        ("./nonexistent/pkg", "MODEL ./nonexistent/pkg: no such directory; give an existing "
                              "package directory, a built-in name or owner/name@<40-hex commit> "
                              "[model_not_found]"),
    ],
)  # fmt: skip
def test_the_container_path_checks_the_name_before_any_engine(
    fake_runtime, monkeypatch, capsys, model, message
):
    for name, value in fake_runtime.env().items():
        monkeypatch.setenv(name, value)
    assert main(["serve", model]) == 1
    assert capsys.readouterr().err == f"vllm-sr: {message}\n"
    assert fake_runtime.calls() == []


def test_serve_help_covers_the_targets(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "required for now" not in text
    assert "with --target kubernetes: the models the cluster serves" in text
    assert "with --target kubernetes, the cluster's" in text
