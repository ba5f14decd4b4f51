"""The engine container against a broken or slow engine and an impatient user: output
that is not UTF-8, an engine that cannot run or hangs, a host variable it cannot use,
host paths with ':', Ctrl-C before the start and a second stop signal; and the image
check's cleanup and its stop on SIGTERM (with a fake podman)."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import vllm_sr.deploy.container.serve as serve_module
from vllm_sr.cli import main
from vllm_sr.deploy.container.diagnose import said
from vllm_sr.deploy.container.foreground import Interrupted, interruptible
from vllm_sr.deploy.container.images import call
from vllm_sr.deploy.container.probe import ask
from vllm_sr.deploy.container.runtime import ContainerRuntime

from .conftest import ROOT, FakeRuntime
from .test_engine_signals import WAIT_S, read_until

DOCKER = ContainerRuntime("docker", podman=False)


def lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    """What the user read on stderr, by line."""
    return capsys.readouterr().err.splitlines()


def script(directory: Path, name: str, body: str) -> Path:
    """An executable ``name`` in ``directory`` holding ``body``."""
    directory.mkdir(exist_ok=True)
    path = directory / name
    path.write_bytes(body.encode("utf-8", errors="surrogateescape"))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def gone(pid: int) -> bool:
    """Whether ``pid`` has ended (no process, or a zombie nobody reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state == "Z"


# --- 2. output that is not UTF-8 ---------------------------------------------------------


def test_output_that_is_not_utf8_is_quoted_not_a_crash(tmp_path, monkeypatch, capsys):
    bin_dir = tmp_path / "bin"
    script(
        bin_dir,
        "docker",
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then printf "Docker version \\377\\n"; exit 0; fi\n'
        'printf "Error: \\377 broken\\n" >&2; exit 1\n',
    )
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("CONTAINER_RUNTIME", raising=False)
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setenv("VLLM_SR_ENGINE_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["serve", "org/model"]) == 1
    assert lines(capsys) == [
        "vllm-sr: `docker version --format {{.Server.Version}}` failed (exit 1)",
        "  docker said: Error: \ufffd broken [runtime_failed]",
    ]


def test_every_call_decodes_with_replacement(tmp_path):
    noisy = script(
        tmp_path / "bin", "noisy", "#!/bin/sh\nprintf 'a\\377b\\n'; printf 'c\\376\\n' >&2\n"
    )
    answer = ask([str(noisy)], 5)
    assert (answer.code, answer.stdout, answer.stderr) == (0, "a\ufffdb\n", "c\ufffd\n")


# --- 3. an engine that cannot run ----------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (
            "#!/nonexistent/interpreter\n",
            "No such file or directory (its #! interpreter is missing?)",
        ),
        ("\x7fELF not really a binary\n", "Exec format error"),
    ],
)
def test_an_engine_that_cannot_run_is_named_with_the_os_error(
    tmp_path, monkeypatch, capsys, body, why
):
    docker = script(tmp_path / "bin", "docker", body)
    monkeypatch.setenv("PATH", str(docker.parent))
    monkeypatch.delenv("CONTAINER_RUNTIME", raising=False)
    assert main(["serve", "org/model"]) == 1
    assert lines(capsys) == [
        f"vllm-sr: the docker command {docker} cannot run: {why}; reinstall docker or put "
        "a working one first on PATH [no_container_runtime]"
    ]


def test_a_detected_docker_that_cannot_run_falls_back_to_podman(
    fake_runtime: FakeRuntime, monkeypatch, capsys
):
    docker = fake_runtime.bin / "docker"
    docker.write_text("#!/nonexistent/interpreter\n")
    assert main(["serve", "org/model"]) == 0
    err = lines(capsys)
    assert err[0] == (
        f"vllm-sr: the docker command {docker} cannot run: No such file or directory (its #! "
        "interpreter is missing?); using podman instead"
    )
    assert [call[:2] for call in fake_runtime.calls()][:2] == [
        ["podman", "--version"],
        ["podman", "version"],
    ]
    assert any(call[:2] == ["podman", "run"] for call in fake_runtime.calls())


def test_a_chosen_engine_that_cannot_run_does_not_fall_back(fake_runtime: FakeRuntime, capsys):
    docker = fake_runtime.bin / "docker"
    docker.write_text("#!/nonexistent/interpreter\n")
    assert main(["serve", "org/model", "--container-runtime", "docker"]) == 1
    assert lines(capsys)[-1].endswith("[no_container_runtime]")
    assert fake_runtime.calls() == []


# --- 5. an engine that hangs ---------------------------------------------------------------


@pytest.mark.parametrize("hangs", ["--version", "version"])
def test_a_hung_engine_costs_one_bound_and_its_children_go_too(
    tmp_path, monkeypatch, capsys, hangs
):
    pids = tmp_path / "child.pid"
    script(
        tmp_path / "bin",
        "docker",
        "#!/bin/sh\n"
        f'if [ "$1" = "{hangs}" ]; then /bin/sleep 30 & echo $! > {pids}; wait; fi\n'
        'if [ "$1" = --version ]; then echo "Docker version 27"; fi\n'
        "exit 0\n",
    )
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv("CONTAINER_RUNTIME", raising=False)
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)
    monkeypatch.setattr(serve_module, "PROBE_TIMEOUT_S", 1.0)
    monkeypatch.setenv("VLLM_SR_ENGINE_CACHE_DIR", str(tmp_path / "cache"))
    started = time.monotonic()
    assert main(["serve", "org/model"]) == 1
    assert time.monotonic() - started < 2.5
    read = lines(capsys)
    if hangs == "--version":
        assert read == [
            "vllm-sr: `docker --version` did not answer within 10 s; check the docker command "
            f"({tmp_path}/bin/docker), or choose the other engine (--container-runtime) "
            "[runtime_failed]"
        ]
    else:
        assert read == [
            "vllm-sr: the Docker daemon at unix:///var/run/docker.sock (the default) did not "
            "answer within 10 s",
            "  Restart it (sudo systemctl restart docker), or use Podman, which runs without a "
            "daemon (--container-runtime podman) [daemon_unreachable]",
        ]
    child = int(pids.read_text())
    deadline = time.monotonic() + 5
    while not gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(child), "the hung wrapper's child outlived the probe"


# --- 6. a host variable the CLI cannot use -----------------------------------------------


def test_a_go_panic_is_quoted_by_its_panic_line():
    stderr = (
        "panic: runtime error: invalid memory address or nil pointer dereference\n"
        "[signal SIGSEGV: segmentation violation code=0x1 addr=0x58 pc=0x8c9f80]\n\n"
        "goroutine 1 [running]:\n"
        "github.com/docker/cli/vendor/github.com/docker/docker/client.(*Client).ClientVersion()\n"
        "\t/go/src/github.com/docker/cli/client.go:318\n"
    )
    assert said(DOCKER, stderr) == (
        "\n  docker said: panic: runtime error: invalid memory address or nil pointer dereference"
    )


@pytest.mark.parametrize("host", ["fd://", "npipe:////./pipe/docker_engine"])
def test_a_docker_host_the_cli_cannot_use(tmp_path, monkeypatch, capsys, host):
    docker = shutil.which("docker")
    if docker is None or "podman" in Path(docker).resolve().name:
        pytest.skip("no docker CLI on PATH")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").symlink_to(docker)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("DOCKER_HOST", host)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    for name in ("CONTAINER_RUNTIME", "DOCKER_CONTEXT"):
        monkeypatch.delenv(name, raising=False)
    assert main(["serve", "org/model"]) == 1
    read = lines(capsys)
    assert read[0] == (
        f"vllm-sr: DOCKER_HOST={host!r}: not an address docker can use (unix://, tcp:// or ssh://)"
    )
    assert read[1].startswith("  docker said: ")
    assert "goroutine" not in "\n".join(read)
    assert read[-1] == (
        "  Unset DOCKER_HOST, or set it to unix:///var/run/docker.sock [daemon_unreachable]"
    )


def test_an_empty_container_host(tmp_path, monkeypatch, capsys):
    podman = shutil.which("podman")
    if podman is None:
        pytest.skip("no podman on PATH")
    monkeypatch.setenv("CONTAINER_HOST", "")
    monkeypatch.delenv("CONTAINER_RUNTIME", raising=False)
    assert main(["serve", "org/model", "--container-runtime", "podman"]) == 1
    assert lines(capsys) == [
        "vllm-sr: CONTAINER_HOST is set but empty: not an address podman can use (unix://, "
        "tcp:// or ssh://)",
        '  podman said: Error: unable to create connection. "" is not a supported schema',
        "  Unset CONTAINER_HOST, or set it to unix:///run/podman/podman.sock [daemon_unreachable]",
    ]


# --- 7. host paths with ':' ----------------------------------------------------------------


def test_a_package_directory_with_a_colon_is_refused_before_the_run(
    fake_runtime: FakeRuntime, tmp_path, capsys
):
    package = tmp_path / "my:dir"
    package.mkdir()
    assert main(["serve", str(package)]) == 1
    assert lines(capsys) == [
        f"vllm-sr: the package directory {package} cannot be mounted: a host path with ':' "
        f"breaks -v; move it, or link it to a path without ':' (ln -s '{package}' /tmp/model) "
        "and give that [bad_mount]"
    ]
    assert not any(call[1] in ("pull", "run") for call in fake_runtime.calls())


def test_an_engine_cache_with_a_colon_is_refused(
    fake_runtime: FakeRuntime, tmp_path, monkeypatch, capsys
):
    cache = tmp_path / "a:b"
    monkeypatch.setenv("VLLM_SR_ENGINE_CACHE_DIR", str(cache))
    assert main(["serve", "org/model"]) == 1
    assert lines(capsys) == [
        f"vllm-sr: the engine cache {cache} cannot be mounted: a host path with ':' breaks -v; "
        "set VLLM_SR_ENGINE_CACHE_DIR to a path without ':' [bad_mount]"
    ]
    assert not cache.exists()


# --- 4. Ctrl-C before the start; 8. a second stop signal -----------------------------------


def start_vllm_sr(tmp_path: Path, fake: FakeRuntime, **extra: str) -> subprocess.Popen[str]:
    """``vllm-sr serve org/model`` with ``fake``'s CLIs (and ``extra`` variables)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("FAKE_", "HF_", "CONTAINER_", "DOCKER_", "VLLM_SR_"))
    }
    env.update(fake.env(VLLM_SR_ENGINE_CACHE_DIR=str(tmp_path / "cache"), **extra))
    return subprocess.Popen(
        [sys.executable, "-m", "vllm_sr", "serve", "org/model"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_for(path: Path) -> str:
    deadline = time.monotonic() + WAIT_S
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"no {path}"
        time.sleep(0.05)
    return path.read_text().strip()


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "step"), [(signal.SIGINT, "pull"), (signal.SIGTERM, "version")])
def test_a_stop_signal_before_the_container_stops_the_step_and_says_so(tmp_path, sig, step):
    fake = FakeRuntime(tmp_path)
    real = fake.bin / "docker"
    real.rename(fake.bin / "real-docker")
    child = tmp_path / "child.pid"
    script(
        fake.bin,
        "docker",
        "#!/bin/sh\n"
        f'if [ "$1" = {step} ]; then sleep 60 & echo $! > {child}; wait; exit 1; fi\n'
        f'exec {fake.bin}/real-docker "$@"\n',
    )
    process = start_vllm_sr(tmp_path, fake)
    try:
        pid = int(wait_for(child))
        process.send_signal(sig)
        _, err = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 128 + sig
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (
        f"vllm-sr: {sig.name} before the engine container started: stopped, nothing runs"
    )
    deadline = time.monotonic() + 5
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(pid), f"the {step} step's child outlived vllm-sr"


@pytest.mark.slow
@pytest.mark.parametrize("quiet", [True, False], ids=["probe", "pull"])
def test_a_stop_signal_while_the_child_starts_is_held_until_it_can_be_killed(
    tmp_path, monkeypatch, quiet
):
    """The race of the test above, made certain: the signal lands inside ``Popen``,
    after the child exists but before the caller holds it. It is held and raised
    again once the caller can kill the child's group, so no child outlives it."""
    child = tmp_path / "child.pid"
    engine = script(tmp_path, "engine", f"#!/bin/sh\nsleep 60 & echo $! > {child}\nwait\n")
    real_popen = subprocess.Popen

    def popen_then_signal(*args, **kwargs):
        process = real_popen(*args, **kwargs)
        wait_for(child)
        signal.raise_signal(signal.SIGTERM)  # delivered before Popen returns
        return process

    monkeypatch.setattr(subprocess, "Popen", popen_then_signal)
    with pytest.raises(Interrupted) as raised, interruptible():
        call([str(engine), "version"], quiet)
    assert raised.value.signum == signal.SIGTERM
    pid = int(child.read_text())
    deadline = time.monotonic() + 5
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(pid), "the child started when the signal came outlived the call"


def test_a_second_stop_signal_kills_the_container_and_says_so(tmp_path):
    fake = FakeRuntime(tmp_path)
    process = start_vllm_sr(tmp_path, fake, FAKE_RUN_STUBBORN="1")
    try:
        read_until(process, "fake-container: running", WAIT_S)
        process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + WAIT_S
        while {"ignored": "SIGTERM"} not in fake.entries():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=15)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0
    assert err.splitlines()[-2:] == [
        "vllm-sr: stopping the engine container (SIGTERM)",
        "vllm-sr: second SIGINT: killing the engine container (docker kill vllm-sr-engine-8100)",
    ]
    assert fake.calls()[-1] == ["docker", "kill", "vllm-sr-engine-8100"]


# --- 1. the image check: only what it made, a prompt stop -----------------------------------

FAKE_PODMAN = """#!/bin/sh
echo "$*" >> {log}
case "$1 $2" in
  "image exists") [ "$3" = localhost/base:test ] || [ "$3" = localhost/theirs:1 ]; exit $? ;;
  "images -a")
    [ -e {dir}/removed ] || echo sha256:made1
    exit 0 ;;
esac
case "$1" in
  build) sleep 300 & echo $! > {dir}/build-child; wait ;;
  rmi) touch {dir}/removed ;;
esac
exit 0
"""


@pytest.fixture
def image_check(tmp_path: Path):
    """deploy/image-check.sh with a fake podman; skipped unless root (it refuses others)."""
    if os.geteuid() != 0:
        pytest.skip("image-check.sh runs as root")
    log = tmp_path / "podman.log"
    script(tmp_path / "bin", "podman", FAKE_PODMAN.format(log=log, dir=tmp_path))
    vllm_sr = script(tmp_path / "bin", "vllm-sr", "#!/bin/sh\nexit 0\n")
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "IMAGE_CHECK_BASE": "localhost/base:test",
        "IMAGE_CHECK_WHEELS": "",
        "IMAGE_CHECK_PORT": "18177",
        "VLLM_SR": str(vllm_sr),
    }
    env.pop("IMAGE_CHECK_TAG", None)
    return tmp_path, log, env


@pytest.mark.slow
def test_the_image_check_stops_its_build_on_sigterm_and_removes_only_its_images(image_check):
    tmp_path, log, env = image_check
    process = subprocess.Popen(
        [str(ROOT / "deploy" / "image-check.sh")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        child = int(wait_for(tmp_path / "build-child"))
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 143
    assert time.monotonic() - started < 5
    assert gone(child), "the build's child outlived the script"
    calls = log.read_text().splitlines()
    build = next(call for call in calls if call.startswith("build "))
    run = f"{process.pid}-"
    assert f"--label vllm-sr-image-check={run}" in build
    assert f"-t localhost/vllm-sr:image-check-{run}" in build
    assert "--iidfile" in build
    assert f"images -a -q --no-trunc --filter label=vllm-sr-image-check={run}" in "\n".join(calls)
    rmis = [call for call in calls if call.startswith("rmi")]
    assert rmis == ["rmi sha256:made1"]
    assert "image-check: removed the 1 images this run built (the image and its stages)" in out


def test_the_image_check_refuses_a_tag_it_did_not_build(image_check):
    _, log, env = image_check
    done = subprocess.run(
        [str(ROOT / "deploy" / "image-check.sh")],
        env={**env, "IMAGE_CHECK_TAG": "localhost/theirs:1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "image-check: FAILED: an image localhost/theirs:1 is already there and this run did "
        "not build it: pass --replace to tag over it (it stays, untagged), or set "
        "IMAGE_CHECK_TAG to another"
    ]
    assert not any(call.startswith(("build", "rmi")) for call in log.read_text().splitlines())
