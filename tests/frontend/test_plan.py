"""The process plan (§1.4): replica ids, names, paths, command lines, threads, models
files, the environment's rules and ``auto`` asked once of the worker command."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_sr.config.schema import Replica, parse_config
from vllm_sr.workers.devices import Devices
from vllm_sr.workers.environment import (
    PlanError,
    RuntimeEnvironment,
    cpu_threads,
    private_directory,
    sweep_stale_directories,
)
from vllm_sr.workers.plan import needs_auto, plan_workers, replica_id, sanitized

from .conftest import FAKE_COMMAND, environment

SHA = "0123456789abcdef0123456789abcdef01234567"


def config_with(**primary):
    body = {"provider": "model_runtime", "artifact": "vllm-sr/Vela-2.0-4B", **primary}
    return parse_config({"global": {"model_catalog": {"deployments": {"primary": body}}}})


def test_replica_ids_hash_name_placement_and_ordinal():
    placement = Replica(device="rocm:0")
    text = '{"device":"rocm:0"}'
    expected = "r-" + hashlib.sha256(f"primary\0{text}\0{0}".encode()).hexdigest()[:12]
    assert replica_id("primary", placement, 0) == expected
    assert replica_id("primary", placement, 1) != expected
    assert replica_id("other", placement, 0) != expected
    assert len(expected) == 14


def test_one_process_per_placement_never_regrouped(rundir):
    config = config_with(
        revision=SHA,
        profile="exact",
        max_num_seqs=16,
        replicas=[{"device": "cpu"}, {"device": "cpu"}, {"endpoint": "http://gpu:8100"}],
    )
    env = environment(rundir, cache_dir="/cache", cores=8)
    first, second, attached = plan_workers(config, ["primary"], env)
    assert first.replica_id != second.replica_id
    assert first.replica_id == replica_id("primary", Replica(device="cpu"), 0)
    assert second.replica_id == replica_id("primary", Replica(device="cpu"), 1)
    assert first.process == f"primary-{first.replica_id}"
    assert first.served_name == "primary" and first.managed
    assert first.socket is not None and first.socket.parent == env.directory
    assert first.socket.name == f"{first.process}-{first.identity[:12]}.sock"
    assert first.models_file == env.directory / f"{first.process}-{first.identity[:12]}.models.json"
    assert first.endpoint == f"unix://{first.socket}"
    assert first.threads == 4  # half of 8 cores
    assert first.argv == [
        *FAKE_COMMAND,
        "serve",
        "--models",
        str(first.models_file),
        "--uds",
        str(first.socket),
        "--max-request-bytes",
        "67108864",
        "--max-bundle-tasks",
        "1024",
        "--max-queue",
        "1024",
        "--cache-dir",
        "/cache",
        "--threads",
        "4",
        "--shutdown-grace-seconds",
        "6",
        "--log-level",
        "info",
    ]
    assert first.models == {
        "models": [
            {
                "model": "vllm-sr/Vela-2.0-4B",
                "name": "primary",
                "revision": SHA,
                "device": "cpu",
                "profile": "exact",
                "max_num_seqs": 16,
            }
        ]
    }
    assert (attached.managed, attached.endpoint, attached.served_name) == (
        False,
        "http://gpu:8100",
        "primary",
    )
    assert attached.argv == [] and attached.process == ""


def test_the_models_file_is_private_and_carries_the_profile(rundir):
    [plan] = plan_workers(config_with(device="cpu"), ["primary"], environment(rundir))
    plan.write_models_file()
    assert plan.models_file is not None
    assert stat.S_IMODE(os.stat(plan.models_file).st_mode) == 0o600
    assert json.loads(plan.models_file.read_text())["models"][0]["profile"] == "exact"
    plan.write_models_file()  # a restart rewrites it in place
    assert stat.S_IMODE(os.stat(plan.models_file).st_mode) == 0o600


def test_the_runtime_accepts_the_models_file(rundir):
    """The real runtime reads what the frontend writes (profile included)."""
    from vllm_srun.config import ModelConfig, read_models_file

    [plan] = plan_workers(
        config_with(device="cpu", max_num_seqs=4, enable_shared_context=True),
        ["primary"],
        environment(rundir),
    )
    plan.write_models_file()
    [model] = read_models_file(plan.models_file, ModelConfig(model=""))
    assert (model.name, model.profile, model.max_num_seqs) == ("primary", "exact", 4)


def test_the_models_file_carries_a_configured_systemone_schema(rundir):
    """``systemone_schema`` reaches the worker's models-file entry when configured (and
    changes the worker's identity); unset, the entry is what it was before the key."""
    [plain] = plan_workers(config_with(device="cpu"), ["primary"], environment(rundir))
    assert "systemone_schema" not in plain.models["models"][0]
    for schema in ("jev", "vllm-sr/4.0", "vllm-sr/5.0"):
        config = config_with(device="cpu", systemone_schema=schema)
        [plan] = plan_workers(config, ["primary"], environment(rundir))
        assert plan.models == {
            "models": [
                {
                    "model": "vllm-sr/Vela-2.0-4B",
                    "name": "primary",
                    "device": "cpu",
                    "profile": "exact",
                    "systemone_schema": schema,
                }
            ]
        }
        assert plan.replica_id == plain.replica_id and plan.identity != plain.identity
    attached = config_with(endpoint="http://gpu:8100", systemone_schema="jev")
    [remote] = plan_workers(attached, ["primary"], environment(rundir))
    assert (remote.managed, remote.models, remote.argv) == (False, {}, [])


def test_the_runtime_accepts_a_systemone_schema_in_the_models_file(rundir):
    from vllm_srun.config import ModelConfig, read_models_file

    config = config_with(device="cpu", systemone_schema="jev")
    [plan] = plan_workers(config, ["primary"], environment(rundir))
    plan.write_models_file()
    [model] = read_models_file(plan.models_file, ModelConfig(model=""))
    assert (model.name, model.systemone_schema) == ("primary", "jev")


@pytest.mark.parametrize(
    ("cores", "override", "threads"),
    [(2, None, 1), (1, None, 1), (8, None, 4), (64, None, 16), (8, 6, 6), (8, 32, 8), (3, None, 1)],
)
def test_cpu_threads(cores, override, threads):
    assert cpu_threads(cores, override) == threads


def test_threads_only_for_cpu_workers(rundir):
    config = config_with(replicas=[{"device": "cuda:0"}, {"device": "cpu"}, {}])
    gpu, cpu, auto = plan_workers(config, ["primary"], environment(rundir, cores=6))
    assert gpu.threads is None and "--threads" not in gpu.argv
    assert cpu.threads == 3
    assert auto.threads is None and auto.device is None
    assert auto.models["models"][0]["device"] == "auto"
    # Once `auto` is known to mean the CPU, the worker is planned there, with threads.
    _, _, resolved = plan_workers(config, ["primary"], environment(rundir, cores=6), "cpu")
    assert resolved.device == "cpu" and resolved.threads == 3
    assert needs_auto(config, ["primary"])
    assert not needs_auto(config_with(device="cpu"), ["primary"])


def test_long_socket_paths_move_to_a_private_tmp_directory(rundir):
    deep = rundir / ("d" * 90)
    deep.mkdir()
    env = environment(deep)
    [plan] = plan_workers(config_with(device="cpu"), ["primary"], env)
    assert plan.socket is not None and len(str(plan.socket).encode()) <= 100
    digest = hashlib.sha256(str(env.directory).encode()).hexdigest()[:8]
    assert plan.socket.parent == Path(f"/tmp/vsr-{digest}")
    assert stat.S_IMODE(os.stat(plan.socket.parent).st_mode) == 0o700
    assert plan.models_file is not None and plan.models_file.parent == env.directory
    try:
        os.chown(plan.socket.parent, 4242, 4242)
        with pytest.raises(PlanError, match="belongs to another user"):
            plan_workers(config_with(device="cpu"), ["primary"], env)
    finally:
        os.rmdir(plan.socket.parent)


def test_sanitized_names():
    assert sanitized("vela domain/\u00e9:1") == "vela_domain___1"


def test_the_environment(tmp_path):
    directory = tmp_path / "srun"
    env = RuntimeEnvironment.from_environ(
        {
            "VLLM_SRUN_COMMAND": "python3 -m vllm_srun",
            "VLLM_SRUN_DIR": str(directory),
            "VLLM_SRUN_CACHE_DIR": "/models",
            "VLLM_SRUN_CPU_THREADS": "3",
        },
        log_level="warn",
    )
    assert env.command == ("python3", "-m", "vllm_srun")
    assert env.directory == directory and not env.created
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert (env.cache_dir, env.thread_override, env.log_level) == ("/models", 3, "warning")
    os.chmod(directory, 0o755)
    RuntimeEnvironment.from_environ({"VLLM_SRUN_DIR": str(directory)})
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700  # tightened
    default = RuntimeEnvironment.from_environ({})
    if default.created:
        default.directory.rmdir()
    assert default.directory.name == f"vllm-srun-{os.getpid()}"
    assert Path(default.command[0]).name == "vllm-srun"
    for bad in ("0", "-2", "two"):
        with pytest.raises(PlanError, match="VLLM_SRUN_CPU_THREADS must be a positive integer"):
            RuntimeEnvironment.from_environ(
                {"VLLM_SRUN_CPU_THREADS": bad, "VLLM_SRUN_DIR": str(directory)}
            )


def test_the_worker_directory_is_refused_when_not_a_private_directory(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(PlanError, match="is a symbolic link"):
        RuntimeEnvironment.from_environ({"VLLM_SRUN_DIR": str(link)})
    file = tmp_path / "file"
    file.write_text("")
    with pytest.raises(PlanError, match="not a directory"):
        private_directory(file, "VLLM_SRUN_DIR")
    os.chown(real, 4242, 4242)
    with pytest.raises(PlanError, match="belongs to another user"):
        private_directory(real, "VLLM_SRUN_DIR")


def test_auto_is_asked_once_of_the_worker_command(tmp_path, caplog):
    devices = Devices(FAKE_COMMAND)
    assert devices.auto() == "cpu" and devices.count("cuda") == 0
    counter = tmp_path / "count"
    script = tmp_path / "devices.sh"
    script.write_text(f'#!/bin/sh\necho x >> {counter}\necho \'{{"auto": "rocm:0"}}\'\n')
    script.chmod(0o755)
    once = Devices([str(script)])
    assert once.auto() == "rocm:0" and once.auto() == "rocm:0"
    assert counter.read_text() == "x\n"
    caplog.set_level(logging.WARNING, logger="vllm_sr.workers")
    broken = Devices([sys.executable, "-c", "import sys; sys.exit('no torch here')"])
    assert broken.auto() is None
    assert "auto_device_unresolved" in caplog.text and "no torch here" in caplog.text
    assert Devices([str(tmp_path / "missing")]).auto() is None


def test_worker_directories_left_by_killed_frontends_are_swept(tmp_path):
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead = tmp_path / f"vllm-srun-{int(finished.stdout)}"
    (dead / "nested").mkdir(parents=True)
    (dead / "nested" / "primary.json").write_text("{}")
    live = tmp_path / f"vllm-srun-{os.getppid()}"
    live.mkdir()
    mine = tmp_path / f"vllm-srun-{os.getpid()}"
    mine.mkdir()
    other = tmp_path / "vllm-srun-notapid"
    other.mkdir()
    linked = tmp_path / f"vllm-srun-{int(finished.stdout) + 1_000_000}"
    linked.symlink_to(live)
    assert sweep_stale_directories(tmp_path) == [dead]
    assert not dead.exists()
    assert live.is_dir() and mine.is_dir() and other.is_dir() and linked.is_symlink()
