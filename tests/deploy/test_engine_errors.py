"""The engine container's failures by cause: no engine, its daemon or socket not
reachable, the image missing, a pull refused. The real docker CLI (and podman) where
installed, with their sockets pointed at nothing under tmp; else the fake CLI playing
the engines' own messages."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from vllm_sr.cli import main
from vllm_sr.deploy.container import ContainerError
from vllm_sr.deploy.container.diagnose import Answer, reach_engine
from vllm_sr.deploy.container.images import ensure_image
from vllm_sr.deploy.container.runtime import ContainerRuntime

from .conftest import FakeRuntime

IMAGE = "ghcr.io/vllm-project/semantic-router/vllm-sr:latest"
PROBE = ["version", "--format", "{{.Server.Version}}"]
DOCKER = ContainerRuntime("docker", podman=False)
DOCKER_DOWN = (
    "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
    "Is the docker daemon running?"
)
START_DOCKER = (
    "  Start it (sudo systemctl start docker), point DOCKER_HOST at the socket it listens "
    "on, or use Podman, which runs without a daemon (--container-runtime podman)"
)


def lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    """What the user read on stderr, by line."""
    return capsys.readouterr().err.splitlines()


def only(tmp_path: Path, name: str, target: str | None) -> str:
    """A ``PATH`` of one directory holding ``name`` (a link to ``target``), or nothing."""
    directory = tmp_path / "only-bin"
    directory.mkdir(exist_ok=True)
    if target is not None:
        (directory / name).symlink_to(target)
    return str(directory)


@pytest.mark.parametrize("policy", ["always", "never"])
def test_the_real_docker_cli_without_a_daemon_says_the_daemon_is_not_reachable(
    tmp_path, monkeypatch, capsys, policy
):
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker CLI on PATH")
    if "podman" in Path(docker).resolve().name:
        pytest.skip("the docker command here is Podman's")
    socket = tmp_path / "no-daemon" / "docker.sock"
    for name in ("DOCKER_CONTEXT", "CONTAINER_RUNTIME", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", only(tmp_path, "docker", docker))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{socket}")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    monkeypatch.setenv("VLLM_SR_ENGINE_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["serve", "org/model", "--image-pull-policy", policy]) == 1
    assert lines(capsys) == [
        f"vllm-sr: the Docker daemon is not reachable at unix://{socket} (set by DOCKER_HOST)",
        f"  docker said: Cannot connect to the Docker daemon at unix://{socket}. Is the docker "
        "daemon running?",
        f"{START_DOCKER} [daemon_unreachable]",
    ]


def test_the_real_podman_without_its_service_says_the_service_is_not_reachable(
    tmp_path, monkeypatch, capsys
):
    podman = shutil.which("podman")
    if podman is None:
        pytest.skip("no podman on PATH")
    socket = tmp_path / "no-service" / "podman.sock"
    monkeypatch.delenv("CONTAINER_RUNTIME", raising=False)
    monkeypatch.setenv("PATH", only(tmp_path, "podman", podman))
    monkeypatch.setenv("CONTAINER_HOST", f"unix://{socket}")
    monkeypatch.setenv("VLLM_SR_ENGINE_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["serve", "org/model", "--container-runtime", "podman"]) == 1
    read = lines(capsys)
    assert read[0] == (
        f"vllm-sr: Podman's service is not reachable at unix://{socket} (set by CONTAINER_HOST)"
    )
    assert read[1].startswith("  podman said: Cannot connect to Podman.")
    assert f"dial unix {socket}: connect: no such file or directory" in read[2]
    assert read[-1] == (
        "  Start the service (systemctl --user start podman.socket, as root systemctl start "
        "podman.socket, or podman system service --time=0 &), or unset CONTAINER_HOST to run "
        "containers with the local podman, which needs no service [daemon_unreachable]"
    )


def test_a_down_docker_daemon_at_the_default_socket(fake_runtime: FakeRuntime, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_DAEMON_ERROR", DOCKER_DOWN)
    assert main(["serve", "org/model", "--image-pull-policy", "never"]) == 1
    assert lines(capsys) == [
        "vllm-sr: the Docker daemon is not reachable at unix:///var/run/docker.sock (the default)",
        f"  docker said: {DOCKER_DOWN}",
        f"{START_DOCKER} [daemon_unreachable]",
    ]
    assert fake_runtime.calls() == [["docker", "--version"], ["docker", *PROBE]]


def test_a_docker_socket_this_user_may_not_use(fake_runtime: FakeRuntime, monkeypatch, capsys):
    denied = (
        "permission denied while trying to connect to the Docker daemon socket at "
        'unix:///var/run/docker.sock: Get "http://%2Fvar%2Frun%2Fdocker.sock/v1.50/version": '
        "dial unix /var/run/docker.sock: connect: permission denied"
    )
    monkeypatch.setenv("FAKE_DAEMON_ERROR", denied)
    assert main(["serve", "org/model"]) == 1
    assert lines(capsys) == [
        "vllm-sr: this user may not use the Docker daemon's socket at "
        "unix:///var/run/docker.sock (the default)",
        f"  docker said: {denied}",
        "  Add yourself to the docker group (sudo usermod -aG docker $USER, then log in again), "
        "point DOCKER_HOST at a rootless Docker's socket, or use Podman, which runs without a "
        "daemon (--container-runtime podman) [daemon_unreachable]",
    ]


def test_a_remote_podman_without_its_service(fake_runtime: FakeRuntime, monkeypatch, capsys):
    monkeypatch.setenv(
        "FAKE_DAEMON_ERROR",
        "Cannot connect to Podman. Please verify your connection to the Linux system using "
        "`podman system connection list`, or try `podman machine init` and `podman machine "
        "start` to manage a new Linux VM\n"
        'Error: unable to connect to Podman socket: Get "http://d/v5.2.2/libpod/_ping": '
        "dial unix ///run/podman/podman.sock: connect: no such file or directory",
    )
    assert main(["serve", "org/model", "--container-runtime", "podman"]) == 1
    read = lines(capsys)
    assert read[0] == (
        "vllm-sr: Podman's service is not reachable at unix:///run/podman/podman.sock (the default)"
    )
    assert read[1].startswith("  podman said: Cannot connect to Podman.")
    assert read[2].startswith("    Error: unable to connect to Podman socket")
    assert read[3] == (
        "  Start the service (systemctl --user start podman.socket, as root systemctl start "
        "podman.socket, or podman system service --time=0 &), or check the connection podman "
        "uses (podman system connection list) [daemon_unreachable]"
    )


def test_no_engine_on_path(fake_runtime: FakeRuntime, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", only(tmp_path, "docker", None))
    assert main(["serve", "org/model"]) == 1
    assert lines(capsys) == [
        "vllm-sr: no container engine: neither docker nor podman is on PATH",
        "  Install Podman, which needs no daemon (sudo apt-get install podman, or dnf install "
        "podman) or Docker (https://docs.docker.com/engine/install/), or run the runtime "
        "without a container from a source checkout (vllm-srun serve MODEL) "
        "[no_container_runtime]",
    ]


def test_the_chosen_engine_is_not_installed(
    fake_runtime: FakeRuntime, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("PATH", only(tmp_path, "docker", str(fake_runtime.bin / "docker")))
    monkeypatch.setenv("CONTAINER_RUNTIME", "podman")
    assert main(["serve", "org/model"]) == 1
    assert lines(capsys) == [
        "vllm-sr: CONTAINER_RUNTIME podman: no podman command on PATH",
        "  Install Podman, which needs no daemon (sudo apt-get install podman, or dnf install "
        "podman), or choose docker (CONTAINER_RUNTIME=docker, or unset CONTAINER_RUNTIME) "
        "[no_container_runtime]",
    ]
    assert fake_runtime.calls() == []


def test_an_absent_image_gets_the_build_command_of_its_platform(fake_runtime: FakeRuntime, capsys):
    rocm = "vllm-sr-rocm:local"
    argv = ["serve", "org/model", "--platform", "amd", "--image", rocm]
    assert main([*argv, "--image-pull-policy", "never"]) == 1
    assert lines(capsys) == [
        f"vllm-sr: image {rocm} is not present and --image-pull-policy never forbids pulling it",
        f"  Pull it (docker pull {rocm}), build it in a checkout (docker build --build-arg "
        f"ACCELERATOR=rocm -t {rocm} .), or use --image-pull-policy ifnotpresent "
        "[image_not_present]",
    ]


def test_a_registry_without_the_image(fake_runtime: FakeRuntime, monkeypatch, capsys):
    said = (
        f"Error response from daemon: manifest for {IMAGE} not found: manifest unknown: "
        "manifest unknown"
    )
    monkeypatch.setenv("FAKE_PULL_ERROR", said)
    assert main(["serve", "org/model"]) == 1
    assert lines(capsys) == [
        said,  # docker's own stderr, shown as the pull ran
        f"vllm-sr: the registry ghcr.io has no image {IMAGE}",
        f"  docker said: {said}",
        f"  Check the image name and tag (--image), or build it yourself (docker build -t "
        f"{IMAGE} .) and pass --image {IMAGE} --image-pull-policy never [image_not_present]",
    ]
    assert [c[1] for c in fake_runtime.calls()] == ["--version", "version", "pull"]


def test_podman_pull_progress_passes_through_and_its_error_is_read(
    fake_runtime: FakeRuntime, monkeypatch, capsys
):
    monkeypatch.setenv(
        "FAKE_PULL_ERROR",
        f"Trying to pull {IMAGE}...\n"
        f"Error: initializing source docker://{IMAGE}: reading manifest latest in "
        "ghcr.io/vllm-project/semantic-router/vllm-sr: manifest unknown",
    )
    assert main(["serve", "org/model", "--container-runtime", "podman"]) == 1
    read = lines(capsys)
    assert read[0] == f"Trying to pull {IMAGE}..."
    assert read[2] == f"vllm-sr: the registry ghcr.io has no image {IMAGE}"
    assert read[3] == (
        f"  podman said: Error: initializing source docker://{IMAGE}: reading manifest "
        "latest in ghcr.io/vllm-project/semantic-router/vllm-sr: manifest unknown"
    )
    assert read[-1].endswith("--image-pull-policy never [image_not_present]")
    assert "podman build -t" in read[-1]


@pytest.mark.parametrize(
    ("image", "said", "expected"),
    [
        (
            IMAGE,
            'Error response from daemon: Head "https://ghcr.io/v2/vllm-project/semantic-router/'
            'vllm-sr/manifests/latest": unauthorized',
            [
                f"vllm-sr: the registry ghcr.io refused the pull of {IMAGE}",
                "  Log in (docker login ghcr.io) as an account that may read it, check the "
                f"image name, or build it yourself (docker build -t {IMAGE} .) and pass "
                f"--image {IMAGE} --image-pull-policy never [pull_refused]",
            ],
        ),
        (
            "someorg/vllm-sr:1",
            "Error response from daemon: toomanyrequests: You have reached your pull rate "
            "limit. You may increase the limit by authenticating and upgrading: "
            "https://www.docker.com/increase-rate-limit",
            [
                "vllm-sr: the registry docker.io refused the pull of someorg/vllm-sr:1: too "
                "many pulls",
                "  Log in (docker login docker.io) for a higher limit, wait and try again, or "
                "pull from a mirror (--image MIRROR/NAME:TAG) [pull_refused]",
            ],
        ),
        (
            IMAGE,
            'Error response from daemon: Get "https://ghcr.io/v2/": dial tcp: lookup ghcr.io '
            "on 127.0.0.53:53: no such host",
            [
                f"vllm-sr: the registry ghcr.io is not reachable to pull {IMAGE}",
                "  Check the network and the proxy the Docker daemon uses (HTTPS_PROXY in its "
                "service's environment), pull from a mirror (--image MIRROR/NAME:TAG), or load "
                "the image here (docker save on a machine that can pull it, docker load here) "
                "and pass --image-pull-policy never [pull_refused]",
            ],
        ),
    ],
    ids=["unauthorized", "rate-limit", "network"],
)
def test_a_refused_pull_gets_the_login_or_mirror(
    fake_runtime: FakeRuntime, monkeypatch, capsys, image, said, expected
):
    monkeypatch.setenv("FAKE_PULL_ERROR", said)
    assert main(["serve", "org/model", "--image", image]) == 1
    first, quoted, *rest = lines(capsys)[1:]
    assert [first, *rest] == expected
    assert quoted == f"  docker said: {said}"


def test_an_image_check_that_meets_a_down_daemon_names_the_daemon():
    def down(argv, quiet):
        return Answer(1, stderr=DOCKER_DOWN)

    with pytest.raises(ContainerError) as err:
        ensure_image(DOCKER, IMAGE, "never", run=down, environ={})
    assert err.value.code == "daemon_unreachable"
    assert str(err.value).startswith("the Docker daemon is not reachable")


def test_a_daemon_that_does_not_answer_in_time():
    with pytest.raises(ContainerError) as err:
        reach_engine(DOCKER, {}, run=lambda argv: Answer(124, timed_out=True))
    assert err.value.code == "daemon_unreachable"
    assert str(err.value).splitlines() == [
        "the Docker daemon at unix:///var/run/docker.sock (the default) did not answer within 10 s",
        "  Restart it (sudo systemctl restart docker), or use Podman, which runs without a "
        "daemon (--container-runtime podman)",
    ]


def test_another_probe_failure_is_quoted_not_guessed():
    with pytest.raises(ContainerError) as err:
        reach_engine(DOCKER, {}, run=lambda argv: Answer(2, stderr="unknown flag: --format"))
    assert err.value.code == "runtime_failed"
    assert str(err.value).splitlines() == [
        "`docker version --format {{.Server.Version}}` failed (exit 2)",
        "  docker said: unknown flag: --format",
    ]


def test_the_daemon_socket_comes_from_the_context_when_named():
    with pytest.raises(ContainerError) as err:
        reach_engine(
            DOCKER,
            {"DOCKER_CONTEXT": "rootless"},
            run=lambda argv: Answer(
                1,
                stderr="Cannot connect to the Docker daemon at "
                f"unix:///run/user/{os.getuid()}/docker.sock. Is the docker daemon running?",
            ),
        )
    assert str(err.value).splitlines()[0] == (
        f"the Docker daemon is not reachable at unix:///run/user/{os.getuid()}/docker.sock "
        "(docker context rootless)"
    )
