"""deploy/kubernetes: every base and overlay renders with ``kubectl kustomize`` and
validates offline against the Kubernetes schemas; the probes name routes the runtime
and the frontend really serve; the container args are accepted by the real parsers."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from vllm_sr.api.management import build_management_app
from vllm_sr.cli import build_parser as frontend_parser
from vllm_sr.config.schema import parse_config
from vllm_sr.reload import ConfigSource, Reloads
from vllm_srun.cli import build_parser as runtime_parser
from vllm_srun.serve.command import serve_config

from .conftest import MANIFESTS, by_kind, render, validate

OVERLAYS = ("cpu", "rocm", "cuda")
GPU = {"cpu": None, "rocm": "amd.com/gpu", "cuda": "nvidia.com/gpu"}
DEVICE = {"cpu": "cpu", "rocm": "rocm:0", "cuda": "cuda:0"}
IMAGE = "ghcr.io/vllm-project/semantic-router/vllm-sr"
KINDS = [
    "ConfigMap",
    "Deployment",
    "Deployment",
    "HorizontalPodAutoscaler",
    "PersistentVolumeClaim",
    "PersistentVolumeClaim",
    "PodDisruptionBudget",
    "Service",
    "Service",
]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    """Each base and overlay, rendered once."""
    paths = {name: MANIFESTS / "overlays" / name for name in OVERLAYS}
    paths.update(runtime=MANIFESTS / "runtime", frontend=MANIFESTS / "frontend")
    return {name: render(path) for name, path in paths.items()}


def runtime_container(documents: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = by_kind(documents, "Deployment", "model-runtime")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container  # type: ignore[no-any-return]


def frontend_container(documents: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = by_kind(documents, "Deployment", "vllm-sr")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", [*OVERLAYS, "runtime", "frontend"])
def test_renders_and_validates_offline(rendered, name):
    assert validate(rendered[name]) == []


def test_the_schema_check_can_fail(rendered):
    service = yaml.safe_load(yaml.safe_dump(by_kind(rendered["cpu"], "Service", "vllm-sr")))
    service["spec"]["ports"][0]["port"] = "8899"
    service["spec"]["sessionAffinityTimeout"] = 3
    problems = validate([service])
    assert len(problems) == 1 and problems[0].startswith("Service/vllm-sr: ")


@pytest.mark.parametrize("name", OVERLAYS)
def test_overlay_images_gpus_and_devices(rendered, name):
    documents = rendered[name]
    assert sorted(d["kind"] for d in documents) == KINDS
    runtime = runtime_container(documents)
    suffix = "" if name == "cpu" else f"-{name}"
    assert runtime["image"] == f"{IMAGE}{suffix}:latest"
    assert frontend_container(documents)["image"] == f"{IMAGE}:latest"
    limits = runtime["resources"]["limits"]
    assert limits == {"cpu": "2", "memory": "7Gi", **({GPU[name]: 1} if GPU[name] else {})}
    args = runtime["args"]
    assert args[args.index("--device") + 1] == DEVICE[name]
    pod = by_kind(documents, "Deployment", "model-runtime")["spec"]["template"]["spec"]
    tolerations = [{"key": GPU[name], "operator": "Exists", "effect": "NoSchedule"}]
    assert pod.get("tolerations") == (tolerations if GPU[name] else None)


@pytest.mark.parametrize("name", OVERLAYS)
def test_runtime_args_are_accepted_by_vllm_srun_serve(rendered, name):
    container = runtime_container(rendered[name])
    assert container["command"] == ["vllm-srun"]
    config = serve_config(runtime_parser().parse_args(container["args"]))
    assert [m.model for m in config.models] == ["sentence-transformers/all-MiniLM-L6-v2"]
    assert [m.device for m in config.models] == [DEVICE[name]]
    assert (config.host, config.port) == ("0.0.0.0", 8100)
    assert container["ports"] == [{"name": "http", "containerPort": 8100, "protocol": "TCP"}]
    # The cache lies on the model volume, the claim the runtime base declares.
    assert config.cache_dir == "/app/models/model-runtime"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts == {"/app/models": "models", "/tmp": "tmp"}
    pod = by_kind(rendered[name], "Deployment", "model-runtime")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    claim = volumes["models"]["persistentVolumeClaim"]["claimName"]
    pvc = by_kind(rendered[name], "PersistentVolumeClaim", claim)
    assert pvc["spec"]["resources"]["requests"]["storage"] == "10Gi"


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_frontend_models_volume_is_a_claim_sized_like_the_runtimes(rendered, name):
    container = frontend_container(rendered[name])
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/app/models"] == "models"
    pod = by_kind(rendered[name], "Deployment", "vllm-sr")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "models")
    assert volume == {"name": "models", "persistentVolumeClaim": {"claimName": "vllm-sr-models"}}
    claim = by_kind(rendered[name], "PersistentVolumeClaim", "vllm-sr-models")
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "10Gi"}},
    }


def test_a_wrong_runtime_arg_is_refused_by_the_parser():
    with pytest.raises(SystemExit):
        runtime_parser().parse_args(["serve", "m", "--no-such-option"])


def probe_routes(container: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Each of the container's three probes: its HTTP path and named port."""
    return {
        kind: (container[kind]["httpGet"]["path"], container[kind]["httpGet"]["port"])
        for kind in ("startupProbe", "readinessProbe", "livenessProbe")
    }


def test_runtime_probes_name_routes_the_runtime_serves(rendered):
    container = runtime_container(rendered["cpu"])
    probes = probe_routes(container)
    assert probes == {
        "startupProbe": ("/health", "http"),
        "readinessProbe": ("/health", "http"),
        "livenessProbe": ("/health/live", "http"),
    }
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == 3600  # a first download

    from vllm_srun.config import ServeConfig
    from vllm_srun.plugins.host import load_catalog
    from vllm_srun.serve.app import build_app
    from vllm_srun.service.runtime import Runtime

    runtime = Runtime(ServeConfig(), catalog=load_catalog({}))
    try:
        client = TestClient(build_app(runtime))
        # No model yet: /health says so with 503 (ready only once every model is);
        # /health/live answers while HTTP is served.
        health = client.get("/health")
        assert (health.status_code, health.json()["status"]) == (503, "starting")
        live = client.get("/health/live")
        assert (live.status_code, live.json()["status"]) == (200, "alive")
        assert client.get("/healthz").status_code == 404
    finally:
        runtime.stop()


def test_frontend_probes_name_routes_the_management_api_serves(rendered):
    container = frontend_container(rendered["cpu"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8899, "management": 8080, "metrics": 9190}
    probes = probe_routes(container)
    assert probes == {
        "startupProbe": ("/health", "management"),
        "readinessProbe": ("/ready", "management"),
        "livenessProbe": ("/health", "management"),
    }
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["VLLM_SR_PUBLISH_MANAGEMENT_API"] == "true"  # 0.0.0.0:8080 for the kubelet
    assert env["VLLM_SR_PUBLISH_METRICS"] == "true"
    reloads = Reloads(None, ConfigSource(b"", parse_config), None)  # type: ignore[arg-type]
    source = SimpleNamespace(
        draining=False,
        status=SimpleNamespace(ready=True, phase="ready", unserved=lambda: ""),
        reloads=reloads,
    )
    client = TestClient(build_management_app(source))  # type: ignore[arg-type]
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").json() == {"ready": True, "phase": "ready"}
    assert client.get("/healthz").status_code == 404


@pytest.mark.parametrize("file", ["config.yaml", "attached.yaml"])
def test_frontend_args_and_configs_are_accepted_by_vllm_sr(rendered, file):
    documents = rendered["cpu"]
    container = frontend_container(documents)
    assert container["command"] == ["vllm-sr"]
    args = frontend_parser().parse_args(container["args"])
    assert (args.command, args.engine, args.config) == ("serve", True, "/etc/vllm-sr/config.yaml")
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert mount["mountPath"] == "/etc/vllm-sr"
    pod = by_kind(documents, "Deployment", "vllm-sr")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "config")
    config_map = by_kind(documents, "ConfigMap", volume["configMap"]["name"])
    config = parse_config(yaml.safe_load(config_map["data"][file]), file)
    (listener,) = config.listeners
    assert (listener.address, listener.port) == ("0.0.0.0", 8899)
    deployment = config.catalog.deployments["primary"]
    if file == "attached.yaml":
        service = by_kind(documents, "Service", "model-runtime")
        assert deployment.endpoint == f"http://model-runtime:{service['spec']['ports'][0]['port']}"
        # The runtime serves the model under its MODEL name, which the frontend asks for.
        assert deployment.served_name == "sentence-transformers/all-MiniLM-L6-v2"
    else:
        assert deployment.endpoint is None and deployment.device == "cpu"


@pytest.mark.parametrize("name", OVERLAYS)
def test_security_services_and_scale_out(rendered, name):
    documents = rendered[name]
    for deployment in (d for d in documents if d["kind"] == "Deployment"):
        pod = deployment["spec"]["template"]
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        labels = pod["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        for container in pod["spec"]["containers"]:
            assert container["securityContext"] == {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            }
            assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}
        service = by_kind(documents, "Service", deployment["metadata"]["name"])
        assert service["spec"]["selector"].items() <= labels.items()
        named = {p["name"] for c in pod["spec"]["containers"] for p in c["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= named
    hpa = by_kind(documents, "HorizontalPodAutoscaler", "model-runtime")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "model-runtime",
    }
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    pdb = by_kind(documents, "PodDisruptionBudget", "model-runtime")
    runtime = by_kind(documents, "Deployment", "model-runtime")
    assert pdb["spec"]["selector"] == runtime["spec"]["selector"]


def documented_overlay(tmp_path: Path, section: str) -> list[dict[str, Any]]:
    """The cpu overlay with the first YAML block of ``section`` of docs/deploy.md as its
    patches, rendered and validated."""
    docs = (MANIFESTS.parents[1] / "docs" / "deploy.md").read_text()
    patch = docs.split(section, 1)[1].split("```yaml\n", 1)[1].split("```")[0]
    overlay = tmp_path / "documented"
    overlay.mkdir()
    base = os.path.relpath(MANIFESTS / "overlays" / "cpu", overlay)  # kustomize: relative
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {base}\n" + patch
    )
    documents = render(overlay)
    assert validate(documents) == []
    return documents


def test_the_documented_attach_patch_selects_attached_yaml(tmp_path):
    documents = documented_overlay(tmp_path, "## Frontends attached")
    args = frontend_parser().parse_args(frontend_container(documents)["args"])
    assert args.config == "/etc/vllm-sr/attached.yaml"


def test_the_documented_volume_patch_resizes_the_claim(tmp_path):
    documents = documented_overlay(tmp_path, "## Sizing the model volume")
    claim = by_kind(documents, "PersistentVolumeClaim", "model-runtime-models")
    assert claim["spec"]["resources"]["requests"]["storage"] == "40Gi"
