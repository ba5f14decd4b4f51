"""The frontend as its Kubernetes pod starts it: the variables the manifest sets put the
management API and the metrics on 0.0.0.0, where the kubelet and the Service reach them."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

import vllm_sr.frontend
from vllm_sr.cli import main

from .conftest import MANIFESTS, by_kind, render


class Recorded:
    """Stands in for :class:`vllm_sr.frontend.Frontend`: keeps its arguments, serves nothing."""

    seen: ClassVar[dict[str, Any]] = {}

    def __init__(self, config: Any, env: Any, **kwargs: Any) -> None:
        Recorded.seen = {"config": config, **kwargs}

    async def run(self) -> int:
        return 0


@pytest.fixture
def pod_env(monkeypatch) -> dict[str, str]:
    """The frontend container's ``env`` from the rendered cpu overlay, set here."""
    documents = render(MANIFESTS / "overlays" / "cpu")
    deployment = by_kind(documents, "Deployment", "vllm-sr")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    for name in ("VLLM_SR_PORT_OFFSET", "VLLM_SRUN_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(vllm_sr.frontend, "Frontend", Recorded)
    return env


@pytest.mark.parametrize("published", [True, False])
def test_management_and_metrics_addresses(pod_env, monkeypatch, tmp_path, published):
    config = tmp_path / "config.yaml"
    config.write_text((MANIFESTS / "frontend" / "config.yaml").read_text())
    if published:
        for name in ("VLLM_SR_PUBLISH_MANAGEMENT_API", "VLLM_SR_PUBLISH_METRICS"):
            monkeypatch.setenv(name, pod_env[name])
    else:
        monkeypatch.delenv("VLLM_SR_PUBLISH_MANAGEMENT_API", raising=False)
        monkeypatch.delenv("VLLM_SR_PUBLISH_METRICS", raising=False)
    monkeypatch.setenv("VLLM_SRUN_DIR", str(tmp_path / "srun"))
    assert main(["serve", "-e", "--config", str(config)]) == 0
    host = "0.0.0.0" if published else "127.0.0.1"
    assert Recorded.seen["management"] == (host, 8080)
    assert Recorded.seen["metrics_address"] == (host, 9190)
    (listener,) = Recorded.seen["config"].listeners
    assert (listener.address, listener.port) == ("0.0.0.0", 8899)
