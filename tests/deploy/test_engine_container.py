"""``vllm-sr serve MODEL... | --models FILE`` without -e: the foreground engine container,
run against a fake docker/podman that records its argv."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from vllm_sr.cli import ROUTER_MODE_NEEDS_BACKENDS, ROUTER_MODE_NEEDS_CONFIG, main
from vllm_sr.deploy.container import ContainerError
from vllm_sr.deploy.container.command import gpu_flags, user_flags
from vllm_sr.deploy.container.foreground import exit_status
from vllm_sr.deploy.container.mounts import engine_cache_dir
from vllm_sr.deploy.container.runtime import ContainerRuntime, detect_runtime

from .conftest import FakeRuntime

CPU_IMAGE = "ghcr.io/vllm-project/semantic-router/vllm-sr:latest"
ROCM_IMAGE = "ghcr.io/vllm-project/semantic-router/vllm-sr-rocm:latest"
INSPECT = ["container", "inspect", "--format", "{{.State.Running}}"]
PROBE = ["version", "--format", "{{.Server.Version}}"]
"""The engine asked for its server version before anything runs (its daemon answers)."""
USER = f"{os.getuid()}:{os.getgid()}"
KEEP_ID = ["--userns=keep-id"] if os.getuid() != 0 else ["--user", USER]
"""Rootless Podman keeps this user's id in the container; rootful Podman runs as root."""


def tail() -> list[str]:
    """The runtime's listen and cache words inside the container (always the same)."""
    return ["--host", "0.0.0.0", "--port", "8100", "--cache-dir", "/app/models/model-runtime"]


def test_default_run_pulls_then_runs_the_exact_command(fake_runtime: FakeRuntime, tmp_path):
    assert main(["serve", "vllm-sr/d3-edge"]) == 0
    cache = tmp_path / "cache"
    assert cache.is_dir()
    assert fake_runtime.calls() == [
        ["docker", "--version"],
        ["docker", *PROBE],
        ["docker", "pull", CPU_IMAGE],
        ["docker", *INSPECT, "vllm-sr-engine-8100"],
        [
            "docker", "run", "--rm", "--init", "--name", "vllm-sr-engine-8100",
            "--user", USER,
            "-p", "127.0.0.1:8100:8100",
            "-v", f"{cache}:/app/models:z",
            "--entrypoint", "vllm-srun", CPU_IMAGE,
            "serve", "vllm-sr/d3-edge", "--device", "auto",
            *tail(), "--log-level", "info",
        ],
    ]  # fmt: skip


def test_flags_reach_the_runtime_and_secrets_pass_by_name(
    fake_runtime: FakeRuntime, tmp_path, monkeypatch
):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("VLLM_SR_DNS", "10.0.0.2, 10.0.0.3")
    monkeypatch.setenv("FAKE_IMAGE_PRESENT", "1")
    code = main(
        [
            "serve", "org/model", "--revision", "A" * 40, "--host", "0.0.0.0", "--port",
            "9000", "--device", "cpu", "--max-num-seqs", "16", "--dtype", "float32",
            "--no-enable-shared-context", "--image", "vllm-sr:local",
            "--image-pull-policy", "ifnotpresent", "--log-level", "warn", "--offline",
        ]
    )  # fmt: skip
    assert code == 0
    calls = fake_runtime.calls()
    assert calls[:4] == [
        ["docker", "--version"],
        ["docker", *PROBE],
        ["docker", "image", "inspect", "vllm-sr:local"],
        ["docker", *INSPECT, "vllm-sr-engine-9000"],
    ]
    assert calls[4] == [
        "docker", "run", "--rm", "--init", "--name", "vllm-sr-engine-9000", "--user", USER,
        "--dns", "10.0.0.2", "--dns", "10.0.0.3",
        "-p", "0.0.0.0:9000:8100",
        "-v", f"{tmp_path / 'cache'}:/app/models:z",
        "-e", "HF_TOKEN", "-e", "HF_HUB_OFFLINE",
        "--entrypoint", "vllm-srun", "vllm-sr:local",
        "serve", "org/model", "--device", "cpu",
        "--max-num-seqs", "16", "--dtype", "float32", "--no-enable-shared-context",
        "--revision", "a" * 40, "--offline",
        *tail(), "--log-level", "warning",
    ]  # fmt: skip
    assert not any("hf_secret_value" in word for call in calls for word in call)


def test_local_packages_and_the_models_file_are_mounted_and_rewritten(
    fake_runtime: FakeRuntime, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    package = tmp_path / "pkgs" / "my-classifier"
    package.mkdir(parents=True)
    models = tmp_path / "models.yaml"
    models.write_text(
        "models:\n"
        "  - {model: ./pkgs/my-classifier, name: mine, device: cpu}\n"
        "  - {model: vllm-sr/d3-edge, device: auto, max_num_seqs: 4}\n"
        f"  - {{model: {package}, name: again}}\n"
    )
    assert main(["serve", "--models", str(models), "--image-pull-policy", "always"]) == 0
    run = fake_runtime.calls()[-1]
    mounts = [run[i + 1] for i, word in enumerate(run) if word == "-v"]
    copy = Path(mounts[2].split(":")[0])
    assert mounts == [
        f"{tmp_path / 'cache'}:/app/models:z",
        f"{package}:/app/packages/0/my-classifier:ro,z",
        f"{copy}:/app/packages/models.yaml:ro,z",
    ]
    assert run[run.index("serve") :] == [
        "serve", "--models", "/app/packages/models.yaml", "--device", "auto",
        *tail(), "--log-level", "info",
    ]  # fmt: skip
    (seen,) = [e["models_yaml"] for e in fake_runtime.entries() if "models_yaml" in e]
    assert not copy.exists()  # removed once the container stopped
    assert yaml.safe_load(seen) == {
        "models": [
            {"model": "/app/packages/0/my-classifier", "name": "mine", "device": "cpu"},
            {"model": "vllm-sr/d3-edge", "device": "auto", "max_num_seqs": 4},
            {"model": "/app/packages/0/my-classifier", "name": "again"},
        ]
    }


def test_a_local_model_argument_is_mounted_read_only(fake_runtime: FakeRuntime, tmp_path):
    package = tmp_path / "adapter"
    package.mkdir()
    assert main(["serve", str(package), "org/other"]) == 0
    run = fake_runtime.calls()[-1]
    assert f"{package}:/app/packages/0/adapter:ro,z" in run
    start = run.index("serve")
    assert run[start : start + 3] == ["serve", "/app/packages/0/adapter", "org/other"]


def test_amd_gpus_pass_through_with_docker(fake_runtime: FakeRuntime, tmp_path):
    assert main(["serve", "org/model", "--platform", "amd", "--device", "rocm:1"]) == 0
    assert fake_runtime.calls()[-1] == [
        "docker", "run", "--rm", "--init", "--name", "vllm-sr-engine-8100", "--user", USER,
        "--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video",
        "--cap-add", "SYS_PTRACE", "--security-opt", "seccomp=unconfined",
        "-p", "127.0.0.1:8100:8100", "-v", f"{tmp_path / 'cache'}:/app/models:z",
        "--entrypoint", "vllm-srun", ROCM_IMAGE, "serve", "org/model", "--device", "rocm:1",
        *tail(), "--log-level", "info",
    ]  # fmt: skip


def test_nvidia_gpus_by_cdi_on_podman(fake_runtime: FakeRuntime, monkeypatch):
    monkeypatch.setenv("CONTAINER_RUNTIME", "podman")
    assert main(["serve", "org/model", "--platform", "nvidia"]) == 0
    calls = fake_runtime.calls()
    assert calls[:2] == [
        ["podman", *PROBE],
        ["podman", "pull", "ghcr.io/vllm-project/semantic-router/vllm-sr-cuda:latest"],
    ]
    run = calls[-1]
    assert run[: 8 + len(KEEP_ID)] == [
        "podman", "run", "--rm", "--init", "--name", "vllm-sr-engine-8100",
        *KEEP_ID, "--device", "nvidia.com/gpu=all",
    ]  # fmt: skip


def test_a_docker_command_that_is_podman_gets_cdi(fake_runtime: FakeRuntime, monkeypatch):
    monkeypatch.setenv("FAKE_DOCKER_IS_PODMAN", "1")
    assert main(["serve", "org/model", "--platform", "cuda", "--container-runtime", "docker"]) == 0
    run = fake_runtime.calls()[-1]
    assert run[: 8 + len(KEEP_ID)] == [
        "docker", "run", "--rm", "--init", "--name", "vllm-sr-engine-8100",
        *KEEP_ID, "--device", "nvidia.com/gpu=all",
    ]  # fmt: skip


def test_user_mapping():
    docker = ContainerRuntime("docker", podman=False)
    podman = ContainerRuntime("podman", podman=True)
    assert user_flags(docker, 1000, 100) == ["--user", "1000:100"]
    assert user_flags(podman, 1000, 100) == ["--userns=keep-id"]
    # Rootful: the image's user 65532 could not write root's cache (deploy/image-check.sh).
    assert user_flags(podman, 0, 0) == ["--user", "0:0"]
    assert user_flags(docker, None, None) == []


def test_gpu_pass_through_switches():
    docker = ContainerRuntime("docker", podman=False)
    assert gpu_flags("nvidia", docker, {}) == ["--gpus", "all", "--runtime", "nvidia"]
    assert gpu_flags("cuda", docker, {"VLLM_SR_NVIDIA_GPU_PASSTHROUGH": "0"}) == []
    assert gpu_flags("rocm", docker, {"VLLM_SR_AMD_GPU_PASSTHROUGH": "0"}) == []
    assert gpu_flags("cpu", docker, {}) == []


@pytest.mark.parametrize(
    ("policy", "present", "expected"),
    [
        ("always", "1", [["pull"]]),
        ("ifnotpresent", "1", [["image", "inspect"]]),
        ("ifnotpresent", "0", [["image", "inspect"], ["pull"]]),
        ("never", "1", [["image", "inspect"]]),
    ],
)
def test_pull_policy(fake_runtime: FakeRuntime, monkeypatch, policy, present, expected):
    monkeypatch.setenv("FAKE_IMAGE_PRESENT", present)
    assert main(["serve", "org/model", "--image-pull-policy", policy]) == 0
    steps = fake_runtime.calls()[2:-2]
    assert steps == [["docker", *words, CPU_IMAGE] for words in expected]


def test_never_pull_refuses_an_absent_image(fake_runtime: FakeRuntime, capsys):
    assert main(["serve", "org/model", "--image-pull-policy", "never"]) == 1
    assert capsys.readouterr().err.splitlines()[-2:] == [
        f"vllm-sr: image {CPU_IMAGE} is not present and --image-pull-policy never forbids "
        "pulling it",
        f"  Pull it (docker pull {CPU_IMAGE}), build it in a checkout (docker build -t "
        f"{CPU_IMAGE} .), or use --image-pull-policy ifnotpresent [image_not_present]",
    ]
    assert fake_runtime.calls() == [
        ["docker", "--version"],
        ["docker", *PROBE],
        ["docker", "image", "inspect", CPU_IMAGE],
    ]


def test_a_failed_pull_stops_before_the_run(fake_runtime: FakeRuntime, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_PULL_EXIT", "1")
    assert main(["serve", "org/model"]) == 1
    assert capsys.readouterr().err.splitlines()[-2:] == [
        f"vllm-sr: docker pull {CPU_IMAGE} failed (exit 1)",
        "  Check the image name and the registry, or build it yourself (docker build -t "
        f"{CPU_IMAGE} .) and pass --image {CPU_IMAGE} --image-pull-policy never [pull_failed]",
    ]
    assert [c[1] for c in fake_runtime.calls()] == ["--version", "version", "pull"]


def test_a_running_engine_container_already_serves_the_port(
    fake_runtime: FakeRuntime, monkeypatch, capsys
):
    monkeypatch.setenv("FAKE_CONTAINER", "running")
    assert main(["serve", "org/model", "--port", "8200"]) == 1
    assert capsys.readouterr().err == (
        "vllm-sr: engine container vllm-sr-engine-8200 already serves port 8200; stop it "
        "(docker stop vllm-sr-engine-8200) or pass another --port [port_in_use]\n"
    )
    assert [c[1] for c in fake_runtime.calls()] == ["--version", "version", "pull", "container"]


def test_a_stopped_leftover_is_removed(fake_runtime: FakeRuntime, monkeypatch):
    monkeypatch.setenv("FAKE_CONTAINER", "exited")
    assert main(["serve", "org/model"]) == 0
    assert fake_runtime.calls()[4:6] == [
        ["docker", "rm", "-f", "vllm-sr-engine-8100"],
        fake_runtime.calls()[5],
    ]
    assert fake_runtime.calls()[5][1] == "run"


def test_the_container_status_is_the_exit_status(fake_runtime: FakeRuntime, monkeypatch):
    monkeypatch.setenv("FAKE_RUN_EXIT", "3")
    assert main(["serve", "org/model"]) == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "a/b", "--models", "m.yaml"], "give MODEL arguments or --models, not both"),
        (
            ["serve", "a/b", "c/d", "--revision", "a" * 40],
            "--revision applies to a single MODEL; use MODEL@REVISION for several",
        ),
        (["serve", "a/b", "--revision", "main"], "--revision must be a 40-hex commit, not 'main'"),
        (["serve", "a/b@abc"], "MODEL a/b@abc: the revision after @ must be a 40-hex commit"),
        (
            ["serve", "a/b", "--host", "1.2.3.4;rm"],
            "--host must be an IPv4 address of this machine (127.0.0.1, 0.0.0.0, ...), not "
            "'1.2.3.4;rm': the container's port is published on it",
        ),
        (
            ["serve", "a/b", "--device", "rocm:0"],
            "--device rocm:0 needs --platform amd, whose image runs rocm",
        ),
        (
            ["serve", "a/b", "--device", "mps"],
            "mps needs macOS's Metal, which no Linux container gets; engine mode runs on the "
            "CPU there",
        ),
        (
            ["serve", "a/b", "-dp", "2"],
            "-dp applies to the frontend (vllm-sr serve -e); the engine container (vllm-sr "
            "serve MODEL... without -e) serves its MODEL arguments or --models",
        ),
        (
            ["serve", "-e", "--image", "x"],
            "--image applies to the engine container (vllm-sr serve MODEL... without -e); the "
            "frontend reads its deployments from --config",
        ),
    ],
)
def test_refusals(fake_runtime: FakeRuntime, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"vllm-sr serve: {message}\n"
    assert fake_runtime.calls() == []


def test_models_file_devices_are_checked(fake_runtime: FakeRuntime, tmp_path, capsys):
    models = tmp_path / "models.yaml"
    models.write_text("models:\n  - {model: a/b, device: 'cuda:0'}\n")
    assert main(["serve", "--models", str(models)]) == 1
    assert capsys.readouterr().err == (
        f"vllm-sr: --models {models}: models[0]: --device cuda:0 needs --platform nvidia, "
        "whose image runs cuda [bad_models_file]\n"
    )


def test_serve_without_a_config_or_model_names_router_mode_and_engine_mode(
    fake_runtime: FakeRuntime, capsys
):
    assert main(["serve"]) == 2
    assert capsys.readouterr().err == f"vllm-sr: {ROUTER_MODE_NEEDS_CONFIG}\n"
    assert fake_runtime.calls() == []


def test_router_mode_without_chat_backends_is_refused(fake_runtime: FakeRuntime, capsys, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("listeners:\n  - {name: http, port: 8899}\n")
    assert main(["serve", "--config", str(config)]) == 1
    assert ROUTER_MODE_NEEDS_BACKENDS in capsys.readouterr().err
    assert fake_runtime.calls() == []


def test_the_old_runtime_flag_warns(fake_runtime: FakeRuntime, capsys):
    assert main(["serve", "a/b", "--runtime", "podman"]) == 0
    assert capsys.readouterr().err.startswith(
        "vllm-sr: --runtime is renamed to --container-runtime; --runtime keeps working for "
        "this release only\n"
    )
    assert fake_runtime.calls()[0][0] == "podman"


def test_runtime_detection():
    def which(*present: str):
        return lambda name: f"/usr/bin/{name}" if name in present else None

    def never(executable: str) -> bool:
        return False

    def always(executable: str) -> bool:
        return True

    both = which("docker", "podman")
    assert detect_runtime(None, {}, which=both, says_podman=never) == ContainerRuntime(
        "docker", False
    )
    assert detect_runtime(None, {}, which=both, says_podman=always) == ContainerRuntime(
        "docker", True
    )
    assert detect_runtime(None, {}, which=which("podman"), says_podman=never) == (
        ContainerRuntime("podman", True)
    )
    assert detect_runtime(
        None, {"CONTAINER_RUNTIME": "Podman"}, which=both, says_podman=never
    ) == ContainerRuntime("podman", True)
    with pytest.raises(ContainerError) as err:
        detect_runtime(None, {}, which=which(), says_podman=never)
    assert err.value.code == "no_container_runtime"
    assert str(err.value).startswith("no container engine: neither docker nor podman is on PATH")
    with pytest.raises(ContainerError) as err:
        detect_runtime("podman", {}, which=which("docker"), says_podman=never)
    assert str(err.value).splitlines() == [
        "--container-runtime podman: no podman command on PATH",
        "  Install Podman, which needs no daemon (sudo apt-get install podman, or dnf install "
        "podman), or choose docker (--container-runtime docker)",
    ]
    with pytest.raises(ContainerError) as err:
        detect_runtime(None, {"CONTAINER_RUNTIME": "lxc"}, which=both, says_podman=never)
    assert str(err.value) == "CONTAINER_RUNTIME must be docker or podman, not 'lxc'"
    with pytest.raises(ContainerError) as err:
        detect_runtime(None, {}, which=both, says_podman=never, platform_name="nt")
    assert "WSL 2" in str(err.value)


def test_engine_cache_dir(tmp_path):
    assert engine_cache_dir({}, home=tmp_path) == tmp_path / ".cache" / "vllm-sr" / "models"
    assert engine_cache_dir({"XDG_CACHE_HOME": "/x/cache"}, home=tmp_path) == Path(
        "/x/cache/vllm-sr/models"
    )
    assert engine_cache_dir(
        {"XDG_CACHE_HOME": "/x/cache", "VLLM_SR_ENGINE_CACHE_DIR": "/data/m"}, home=tmp_path
    ) == Path("/data/m")


@pytest.mark.parametrize(
    ("code", "requested", "status"),
    [(0, True, 0), (130, True, 0), (143, True, 0), (-15, True, 0), (-2, True, 0),
     (143, False, 143), (-15, False, 143), (1, True, 1), (0, False, 0)],
)  # fmt: skip
def test_exit_status(code, requested, status):
    assert exit_status(code, requested) == status
