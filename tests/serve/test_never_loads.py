"""A serving process none of whose models can ever load exits 1 with the reasons; one that
serves any model keeps serving, degraded; passing causes are still retried first."""

from __future__ import annotations

import signal
import subprocess
import threading

import pytest

from vllm_srun.compose.loader import LoadError

from .conftest import wait_until
from .test_shutdown import Served, exits, free_port, vllm_srun

TYPO = "sentence-transformers/all-MiniLM-L6"
TYPO_REASON = (
    f"a revision is required: {TYPO} is not a built-in model (see vllm-srun models) "
    f"(did you mean {TYPO}-v2?). Give {TYPO}@<40-hex commit> or --revision <commit>, "
    "or a local copy's path (absolute, or starting ./)"
)
NO_MEMORY = "needs about 1.00 GiB, 0.50 GiB free; out of memory on cpu: free memory on it"


# -- the decision ---------------------------------------------------------------------------
def test_every_model_failed_for_good_is_the_only_state_that_cannot_serve(
    make_runtime, controlled_loader
):
    def loader(path, options, **kwargs):
        if options.name == "pooled":
            raise LoadError("a file hash does not match: model.safetensors")
        if options.name == "scores":
            raise LoadError(NO_MEMORY, retryable=True)
        return controlled_loader(path, options, **kwargs)

    # one model ready beside a failed one: degraded, still serving
    degraded = make_runtime(("pooled", "sequence"), loader=loader)
    assert degraded.models["pooled"].status == "failed"
    assert degraded.models["sequence"].status == "ready"
    assert degraded.cannot_serve() == []

    # a final cause and a passing one that outlasted its attempts: nothing will ever load
    settled = threading.Event()
    spent = make_runtime(
        ("pooled", "scores"), loader=loader, load=False, load_attempts=2, load_retry_seconds=0.01
    )
    spent.start_loading(on_settled=settled.set).join(30)
    assert settled.is_set()
    assert spent.cannot_serve() == [
        "model pooled: a file hash does not match: model.safetensors",
        f"model scores: {NO_MEMORY} (gave up after 2 attempts)",
    ]


def test_a_model_waiting_to_retry_a_passing_cause_keeps_the_process_up(make_runtime):
    def loader(path, options, **kwargs):
        if options.name == "pooled":
            raise LoadError("a file hash does not match: model.safetensors")
        raise LoadError(NO_MEMORY, retryable=True)

    settled = threading.Event()
    runtime = make_runtime(("pooled", "scores"), loader=loader, load=False, load_retry_seconds=60)
    thread = runtime.start_loading(on_settled=settled.set)
    scores = runtime.models["scores"]
    wait_until(lambda: scores.reason is not None, 30, "the second model's first attempt")
    assert runtime.models["pooled"].status == "failed"
    assert (scores.status, scores.reason) == (
        "loading",
        f"retrying after {NO_MEMORY} (attempt 2 of 5 in 60 s)",
    )
    assert runtime.cannot_serve() == []
    runtime.stop()
    thread.join(5)
    assert not thread.is_alive()
    assert not settled.is_set()  # a shutdown is not a settled load


# -- a real process ----------------------------------------------------------------------------
@pytest.mark.slow
def test_a_model_name_that_can_never_load_exits_1_naming_the_reason(tmp_path):
    log = tmp_path / "serve.log"
    command = [*vllm_srun(), "serve", TYPO, "--offline", "--port", str(free_port())]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        code = process.wait(120)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
        raise AssertionError(f"still serving after 120 s:\n{log.read_text()[-4000:]}") from None
    # each line without its time stamp (the first two words)
    lines = [line.split(" ", 2)[2] for line in log.read_text().splitlines() if line.strip()]
    assert code == 1, "\n".join(lines)
    assert f"ERROR vllm_srun.service.runtime: model {TYPO} failed to load: {TYPO_REASON}" in lines
    assert (
        "INFO vllm_srun.serve: every model failed to load and none will be tried again: stopping"
        in lines
    )
    # the last line names each model's reason (a supervisor quotes a worker's last line)
    assert lines[-1] == (
        "ERROR vllm_srun.serve: exiting with status 1: no model can be served: "
        f"model {TYPO}: {TYPO_REASON}"
    )


@pytest.mark.slow
def test_a_process_serving_one_model_beside_a_typo_keeps_serving(packages, tmp_path):
    server = Served(
        tmp_path, {"emb": (packages["pooled"], ""), "typo": (TYPO, "")}, args=("--offline",)
    )
    try:
        wait_until(
            lambda: (server.health() or {}).get("status") == "degraded", 120, "degraded health"
        )
        health = server.health()
        assert health is not None
        assert health["models"]["emb"]["status"] == "ready"
        assert health["models"]["typo"] == {"status": "failed", "reason": TYPO_REASON}
        body = {"model": "emb", "input": "still here"}
        assert server.client.post("/v1/embeddings", json=body).status_code == 200
        assert server.process.poll() is None  # degraded, not gone
        server.process.send_signal(signal.SIGTERM)
        assert exits(server, 30) == 0, server.output()
        assert "no model can be served" not in server.output()
    finally:
        server.close()
