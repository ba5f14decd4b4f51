"""``vllm-sr serve --target kubernetes``: the overlay it writes renders and validates,
and serves the given models with args ``vllm-srun serve`` accepts."""

from __future__ import annotations

import os

import pytest
import yaml

from vllm_sr.cli import main
from vllm_srun.cli import build_parser as runtime_parser
from vllm_srun.serve.command import serve_config

from .conftest import MANIFESTS, by_kind, render, validate

EDGE = "vllm-sr/d3-edge@" + "0123456789abcdef" * 2 + "01234567"


def write(tmp_path, capsys, *argv: str) -> tuple[int, str]:
    out = tmp_path / "overlay"
    target = ["--target", "kubernetes", "--output", str(out), "--manifests", str(MANIFESTS)]
    code = main(["serve", *target, *argv])
    return code, capsys.readouterr().out


@pytest.mark.parametrize(
    ("platform", "image", "gpu", "device"),
    [
        ("cpu", "vllm-sr", None, "cpu"),
        ("rocm", "vllm-sr-rocm", "amd.com/gpu", "rocm:0"),
        ("cuda", "vllm-sr-cuda", "nvidia.com/gpu", "cuda:0"),
    ],
)
def test_the_overlay_renders_validates_and_serves_the_models(
    tmp_path, capsys, platform, image, gpu, device
):
    code, out = write(
        tmp_path, capsys, "--platform", platform, "--namespace", "routing",
        "--max-num-seqs", "64", EDGE, "sentence-transformers/all-MiniLM-L6-v2",
    )  # fmt: skip
    assert code == 0
    overlay = tmp_path / "overlay"
    assert out == (
        f"wrote {overlay / 'kustomization.yaml'}\n"
        f"kubectl apply -k {overlay}\n"
        "attach routers and frontends by endpoint: "
        "http://model-runtime.routing.svc.cluster.local:8100\n"
    )
    documents = render(overlay)
    assert validate(documents) == []
    namespace = by_kind(documents, "Namespace", "routing")
    assert namespace["apiVersion"] == "v1"
    assert {d["metadata"].get("namespace") for d in documents if d["kind"] != "Namespace"} == {
        "routing"
    }
    deployment = by_kind(documents, "Deployment", "model-runtime")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"ghcr.io/vllm-project/semantic-router/{image}:latest"
    assert container["args"] == [
        "serve", EDGE, "sentence-transformers/all-MiniLM-L6-v2", "--device", device,
        "--max-num-seqs", "64", "--host", "0.0.0.0", "--port", "8100",
        "--cache-dir", "/app/models/model-runtime", "--log-level", "info",
    ]  # fmt: skip
    config = serve_config(runtime_parser().parse_args(container["args"]))
    assert [(m.model, m.device, m.max_num_seqs) for m in config.models] == [
        (EDGE, device, 64),
        ("sentence-transformers/all-MiniLM-L6-v2", device, 64),
    ]
    limits = container["resources"]["limits"]
    assert limits.get(gpu) == (1 if gpu else None)


def test_another_image_and_no_namespace(tmp_path, capsys):
    code, out = write(tmp_path, capsys, "--image", "registry.local/vllm-sr:1.0", "org/model")
    assert code == 0
    assert not (tmp_path / "overlay" / "namespace.yaml").exists()
    kustomization = yaml.safe_load((tmp_path / "overlay" / "kustomization.yaml").read_text())
    assert "namespace" not in kustomization
    base = os.path.relpath(MANIFESTS / "overlays" / "cpu", tmp_path / "overlay")
    assert kustomization["resources"] == [base]
    documents = render(tmp_path / "overlay")
    assert validate(documents) == []
    (container,) = by_kind(documents, "Deployment", "model-runtime")["spec"]["template"]["spec"][
        "containers"
    ]
    assert container["image"] == "registry.local/vllm-sr:1.0"
    assert "http://model-runtime.<namespace>.svc.cluster.local:8100" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--port", "9000", "a/b"], "--port applies to the docker target"),
        (["--image-pull-policy", "never", "a/b"],
         "--image-pull-policy applies to the docker target"),
        (["--container-runtime", "podman", "a/b"],
         "--container-runtime applies to the docker target"),
        (
            ["-dp", "2", "a/b"],
            "--target kubernetes does not take -dp (the runtime Deployment scales by its "
            "replicas and HorizontalPodAutoscaler)",
        ),
        ([], "--target kubernetes needs at least one MODEL (a Hub repository or built-in model "
             "name, MODEL@REVISION to pin it)"),
        (["--namespace", "Bad_NS", "a/b"], "--namespace 'Bad_NS' is not a DNS-1123 label "
                                          "(lower-case letters, digits and '-', at most 63)"),
        (["--device", "cuda:0", "a/b"], "--device cuda:0 needs --platform nvidia, whose image "
                                        "runs cuda"),
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


def test_without_the_manifests(tmp_path, capsys):
    code = main(
        ["serve", "--target", "kubernetes", "--output", str(tmp_path / "o"), "--manifests",
         str(tmp_path / "none"), "a/b"]
    )  # fmt: skip
    assert code == 1
    assert capsys.readouterr().err == (
        f"vllm-sr: no kustomize overlay at {tmp_path / 'none' / 'overlays' / 'cpu'}: run from "
        "a vllm-srun checkout's top folder or pass --manifests DIR (its deploy/kubernetes) "
        "[no_manifests]\n"
    )
