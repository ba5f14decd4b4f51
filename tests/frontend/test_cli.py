"""The ``vllm-sr`` command line: Router mode refused, help, ``config validate|migrate``,
flag and environment refusals, and a whole run on the misbehaving worker command
(SIGTERM exits 0, leaving nothing behind; a readiness timeout exits 1)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from vllm_sr.cli import (
    ROUTER_MODE_NEEDS_CONFIG,
    build_parser,
    main,
    management_token,
    ready_timeout,
)
from vllm_sr.deploy.container.serve import engine_argv
from vllm_sr.deploy.kubernetes import overlay_from_args

from .conftest import FAKE_COMMAND, free_ports
from .fake_worker import JEV_DESCRIPTION, JEV_RELEASE_DATE
from .test_serve import VLLM_SR, Served, port_offset, wait_for

VALID = """
global:
  model_catalog:
    deployments:
      primary: {provider: model_runtime, artifact: fake/model, device: cpu}
listeners:
  - {name: http, address: 127.0.0.1, port: 8899, systemone: {models: [fake/model]}}
"""


def test_serve_without_engine_mode_needs_a_config(capsys):
    # With MODEL (or --models), serve without -e runs the engine container (tests/deploy);
    # with --config it starts Router mode (tests/frontend/test_router_*.py).
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert ROUTER_MODE_NEEDS_CONFIG in err
    assert "Router mode" in err and "--config config.yaml" in err and "-e (--engine)" in err


def test_help_names_the_default_model(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "sentence-transformers/all-MiniLM-L6-v2" in out
    assert "-dp N" in out and "--device-ids" in out and "--startup-timeout" in out


def test_config_validate(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text(VALID)
    assert main(["config", "validate", str(good)]) == 0
    assert "valid: 1 deployment(s), 1 listener(s); in use: primary" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text(VALID.replace("device: cpu", "device: cpu, replicas: [{device: cpu}]"))
    assert main(["config", "validate", str(bad)]) == 1
    assert capsys.readouterr().err == (
        f"vllm-sr: {bad}: global.model_catalog.deployments.primary: replicas cannot be combined "
        "with deployment device, endpoint or served_name\n"
    )


def test_config_migrate(tmp_path, capsys):
    old = tmp_path / "old.yaml"
    old.write_text(VALID.replace("device: cpu}", "device: cpu, candle: true}"))
    assert main(["config", "validate", str(old)]) == 1
    assert "run `vllm-sr config migrate FILE`" in capsys.readouterr().err
    assert main(["config", "migrate", "--write", str(old)]) == 0
    assert "removed global.model_catalog.deployments.primary.candle" in capsys.readouterr().err
    assert main(["config", "validate", str(old)]) == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-e", "--device-ids", "0"], "--device-ids requires a cuda or rocm execution platform"),
        (["-e", " x/y"], "MODEL must be a non-empty, trimmed artifact"),
    ],
)
def test_serve_flag_refusals(argv, message, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_SRUN_DIR", str(tmp_path / "run"))
    with pytest.raises(SystemExit) as caught:
        main(["serve", *argv])
    assert caught.value.code == 2
    assert capsys.readouterr().err == f"vllm-sr serve: {message}\n"


def test_the_ready_timeout():
    assert ready_timeout({}, None) == (600.0, "VLLM_SRUN_READY_TIMEOUT")
    assert ready_timeout({"VLLM_SRUN_READY_TIMEOUT": "1h30m"}, None) == (
        5400.0,
        "VLLM_SRUN_READY_TIMEOUT",
    )
    assert ready_timeout({"VLLM_SRUN_READY_TIMEOUT": "1h"}, 30) == (30.0, "--startup-timeout")
    with pytest.raises(ValueError, match="VLLM_SRUN_READY_TIMEOUT: '10' is not a Go duration"):
        ready_timeout({"VLLM_SRUN_READY_TIMEOUT": "10"}, None)


@pytest.mark.slow
def test_a_bad_environment_is_refused_before_anything_starts(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "vllm_sr", "serve", "-e"],
        capture_output=True,
        text=True,
        env={**os.environ, "VLLM_SRUN_CPU_THREADS": "0", "VLLM_SRUN_DIR": str(tmp_path)},
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "VLLM_SRUN_CPU_THREADS must be a positive integer" in done.stderr


def fake_served(tmp_path: Path, rundir: Path, mode: str, **env: str) -> Served:
    config = tmp_path / "config.yaml"
    [port] = free_ports(1)
    config.write_text(VALID.replace("port: 8899", f"port: {port}"))
    return Served(
        tmp_path,
        ["--config", str(config)],
        {
            "VLLM_SRUN_DIR": str(rundir),
            "VLLM_SRUN_COMMAND": " ".join(FAKE_COMMAND),
            "FAKE_WORKER_MODE": mode,
            **env,
        },
    )


@pytest.mark.slow
def test_sigterm_stops_the_workers_and_exits_0(tmp_path, rundir):
    server = fake_served(tmp_path, rundir, "ready")
    try:
        server.wait_ready(30)
        [worker] = server.workers()
        assert "--offline" not in worker.cmdline()  # a configured model may be downloaded
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) == 0, server.output()
        assert time.monotonic() - started < 15
        assert not psutil.pid_exists(worker.pid) or worker.status() == psutil.STATUS_ZOMBIE
        assert list(rundir.iterdir()) == []  # sockets and models files removed
    finally:
        server.close()


@pytest.mark.slow
def test_the_builtin_default_is_served_offline(tmp_path, rundir):
    """No MODEL, no --config: the built-in MiniLM comes from its installed mirror, so the
    workers never try a download (``--offline``); ``--offline`` asks it for any model."""
    env = {
        "VLLM_SRUN_DIR": str(rundir),
        "VLLM_SRUN_COMMAND": " ".join(FAKE_COMMAND),
        "FAKE_WORKER_MODE": "ready",
    }
    for args in ([], ["some/model", "--offline"]):
        server = Served(tmp_path, args, env)
        try:
            server.wait_ready(30)
            [worker] = server.workers()
            assert "--offline" in worker.cmdline()
            # The listener a fresh setup gets is named after the port it binds.
            port = 8899 + server.offset
            assert f" INFO vllm_sr: listener http-{port} serves on 127.0.0.1:{port}\n" in (
                server.err.read_text()
            )
            server.process.send_signal(signal.SIGTERM)
            assert server.process.wait(30) == 0, server.output()
        finally:
            server.close()


@pytest.mark.slow
def test_one_port_offset_moves_every_port_of_a_frontend(tmp_path, rundir):
    """Two frontends of one config file (listener ``http`` on 8899), each with its own
    ``VLLM_SR_PORT_OFFSET`` and worker directory, both serve: the offset moves the
    configured listener with the management API and the metrics, and the log says where."""
    config = tmp_path / "config.yaml"
    config.write_text(VALID)
    servers = []
    try:
        for name in ("a", "b"):
            folder = tmp_path / name
            folder.mkdir()
            env = {
                "VLLM_SRUN_DIR": str(rundir / name),
                "VLLM_SRUN_COMMAND": " ".join(FAKE_COMMAND),
                "FAKE_WORKER_MODE": "ready",
            }
            servers.append(Served(folder, ["--config", str(config)], env, unshift=False))
        for server in servers:
            server.wait_ready(30)
            port = 8899 + server.offset
            assert f" INFO vllm_sr: listener http serves on 127.0.0.1:{port}\n" in (
                server.err.read_text()
            )
            models = httpx.get(f"http://127.0.0.1:{port}/v1/systemone/models", timeout=5)
            assert models.status_code == 200
            assert [m["id"] for m in models.json()["data"]] == ["fake/model"]
    finally:
        for server in servers:
            server.close()


@pytest.mark.slow
def test_the_readiness_timeout_exits_1(tmp_path, rundir):
    server = fake_served(tmp_path, rundir, "never", VLLM_SRUN_READY_TIMEOUT="1s")
    try:
        assert server.process.wait(30) == 1
        err = server.err.read_text()
        assert (
            'Engine startup failed: model_runtime deployment "primary" did not become ready '
            "within 1s (VLLM_SRUN_READY_TIMEOUT): loading"
        ) in err
        assert "Waiting for Engine-managed model deployments, 0 of 1 ready: primary " in (
            server.out.read_text()
        )
        wait_for(lambda: list(rundir.glob("*.sock")) == [], 5, "the sockets removed")
    finally:
        server.close()


@pytest.mark.slow
def test_a_management_port_in_use_says_how_to_move_it(tmp_path, rundir):
    offset = port_offset()
    port = 8080 + offset
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        done = subprocess.run(
            [*VLLM_SR, "serve", "-e"],
            capture_output=True,
            text=True,
            env={
                **os.environ,
                "VLLM_SR_PORT_OFFSET": str(offset),
                "VLLM_SRUN_DIR": str(rundir),
                "VLLM_SRUN_COMMAND": " ".join(FAKE_COMMAND),
            },
            timeout=60,
            check=False,
        )
    assert done.returncode == 1
    assert (
        f"Engine startup failed: the management API cannot listen on 127.0.0.1:{port}: port "
        f"{port} is in use; stop what listens there, or set VLLM_SR_PORT_OFFSET=N to move "
        "every port of this frontend up by N (the management API from 8080, the metrics from "
        "9190, the listeners from their configured ports or 8899)\n"
    ) in done.stderr
    assert "Errno" not in done.stderr  # uvicorn's own record is not shown
    assert list(rundir.iterdir()) == []  # no worker was planned or started


def test_a_runtime_profile_that_is_not_a_name_names_the_flag(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["serve", "-e", "--runtime-profile", "MAX_SPEED"])
    assert caught.value.code == 2
    assert (
        "argument --runtime-profile: 'MAX_SPEED': profile must be a profile name (lower-case "
        "letters, digits and _, starting with a letter, at most 64 characters), such as exact, "
        "batching or max_speed"
    ) in capsys.readouterr().err


def test_a_systemone_schema_outside_the_list_names_the_flag(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["serve", "-e", "--systemone-schema", "jev2"])
    assert caught.value.code == 2
    assert (
        "argument --systemone-schema: invalid choice: 'jev2' (choose from 'vllm-sr/5.0', "
        "'vllm-sr/4.0', 'jev')"
    ) in capsys.readouterr().err


def test_the_engine_container_and_the_cluster_runtime_get_the_systemone_schema():
    args = build_parser().parse_args(
        ["serve", "some/model", "--systemone-schema", "jev", "--max-num-seqs", "4"]
    )
    assert engine_argv(args) == ["--max-num-seqs", "4", "--systemone-schema", "jev"]
    pinned = "some/model@" + "0" * 40
    args = build_parser().parse_args(
        ["serve", "--target", "kubernetes", pinned, "--systemone-schema", "vllm-sr/4.0"]
    )
    overlay = overlay_from_args(args)
    assert overlay.runtime_args()[4:6] == ["--systemone-schema", "vllm-sr/4.0"]
    deployment = overlay.frontend_config()["global"]["model_catalog"]["deployments"]["primary"]
    assert deployment["systemone_schema"] == "vllm-sr/4.0"
    assert engine_argv(build_parser().parse_args(["serve", "some/model"])) == []


@pytest.mark.slow
def test_systemone_schema_jev_reaches_the_worker_and_makes_a_jev_listener(tmp_path, rundir):
    """``--systemone-schema jev`` writes the default deployment's key, the managed
    worker's models file carries it, and the listener (its one System One model now
    answering in Jev) resolves ``jev-latest``, answers Jev's 422 and lists Jev's models."""
    [port] = free_ports(1)
    config = tmp_path / "config.yaml"
    keyed = "{name: http, address: 127.0.0.1, port: 8899, api_keys: [k-1],"
    config.write_text(
        VALID.replace("{name: http, address: 127.0.0.1, port: 8899,", keyed).replace(
            "port: 8899", f"port: {port}"
        )
    )
    server = Served(
        tmp_path,
        ["--config", str(config), "--systemone-schema", "jev"],
        {
            "VLLM_SRUN_DIR": str(rundir),
            "VLLM_SRUN_COMMAND": " ".join(FAKE_COMMAND),
            "FAKE_WORKER_MODE": "ready",
        },
    )
    listener = f"http://127.0.0.1:{port}"
    key = {"authorization": "Bearer k-1"}
    try:
        server.wait_ready(30)
        [worker] = server.workers()
        argv = worker.cmdline()
        models = json.loads(Path(argv[argv.index("--models") + 1]).read_text())["models"]
        assert models == [
            {
                "model": "fake/model",
                "name": "primary",
                "device": "cpu",
                "profile": "exact",
                "systemone_schema": "jev",
            }
        ]
        asked = httpx.post(
            f"{listener}/v1/systemone",
            json={"model": "jev-latest", "state": "x", "questions": {}, "echo": 7},
            headers=key,
            timeout=10,
        )
        assert asked.status_code == 200, asked.text
        assert asked.json() == {"model": "fake/model", "ok": True, "echo": 7}
        bad = httpx.post(f"{listener}/v1/systemone", content=b"{", headers=key, timeout=10)
        assert bad.status_code == 422
        assert bad.json() == {
            "error": {
                "code": "invalid_request",
                "type": "systemone_error",
                "message": "invalid request",
                "param": None,
            },
            "detail": [
                {"loc": ["body"], "msg": "the body is not JSON text", "type": "json_invalid"}
            ],
        }
        listed = httpx.get(f"{listener}/v1/models", headers=key, timeout=10)
        assert listed.status_code == 200
        entry = {"description": JEV_DESCRIPTION, "release_date": JEV_RELEASE_DATE}
        assert listed.json() == {
            "object": "list",
            "data": [],
            "models": [{"name": "fake/model", **entry}, {"name": "jev-latest", **entry}],
        }
        refused = httpx.get(f"{listener}/v1/models", timeout=10)
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"] == 'Bearer realm="vllm-semantic-router"'
        assert refused.json()["detail"] == {
            "error_type": "authentication_error",
            "message": "invalid api key",
        }
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) == 0, server.output()
    finally:
        server.close()


def test_config_validate_takes_config_like_apply(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text(VALID)
    assert main(["config", "validate", "--config", str(good)]) == 0
    assert f"{good}: valid: 1 deployment(s)" in capsys.readouterr().out
    assert main(["config", "validate"]) == 1
    assert capsys.readouterr().err == (
        "vllm-sr: config validate takes one config.yaml; give it as FILE or --config FILE "
        "[bad_flag]\n"
    )
    assert main(["config", "validate", str(good), "--config", str(good)]) == 1


@pytest.mark.parametrize(
    ("value", "token"),
    [("s3cret", "s3cret"), ("  s3cret\n", "s3cret"), ("", None), (" \n", None), (None, None)],
)
def test_the_management_token_is_read_trimmed(value: str | None, token: str | None) -> None:
    environ = {} if value is None else {"VSR_MGMT_TOKEN": value}
    assert management_token(environ) == token
