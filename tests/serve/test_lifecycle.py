"""A model's lifecycle in a serving process: loading, warming (golden), ready or failed, retries."""

from __future__ import annotations

import dataclasses
import threading
import time

from vllm_srun.compose.golden import reference_keys
from vllm_srun.compose.loader import LoadError, load_model
from vllm_srun.plugins import GoldenReference

from .conftest import make_client, wait_until

GOLDEN_REQUESTS = ({"surface": "embeddings", "body": {"input": ["golden text", "another one"]}},)
NO_MEMORY = "needs about 1.00 GiB, 0.50 GiB free; out of memory on cpu: free memory on it"


def with_reference(catalog, reference):
    layers = {**catalog.layers}
    layers["golden_references"] = {**layers["golden_references"], reference.model: reference}
    return dataclasses.replace(catalog, layers=layers)


def test_a_golden_mismatch_fails_its_model_while_another_stays_ready(
    make_runtime, controlled_loader, catalog, packages
):
    model = load_model(packages["pooled"], catalog=catalog)
    answer = model.answer("embeddings", dict(GOLDEN_REQUESTS[0]["body"]))
    recorded = {k: v for k, v in answer.items() if k != "model"}
    recorded["data"][1]["embedding"][5] += 0.01
    key = reference_keys(model)[0]
    reference = GoldenReference("fake/pooled", GOLDEN_REQUESTS, {key: (recorded,)}, {"cpu": 1e-5})

    def loader(path, options, **kwargs):
        served = controlled_loader(path, options, **kwargs)
        if options.name == "pooled":
            return dataclasses.replace(served, identity="fake/pooled")
        return served

    runtime = make_runtime(("pooled", "sequence"), loader=loader, load=False)
    runtime.catalog = with_reference(catalog, reference)
    runtime.start_loading().join(60)
    pooled, sequence = runtime.models["pooled"], runtime.models["sequence"]
    assert pooled.status == "failed" and pooled.served is None and pooled.service is None
    assert pooled.reason is not None
    assert pooled.reason.startswith(
        f"golden self-check failed against {key}: request 1 (embeddings) differs at "
        "data[1].embedding[5]: got "
    )
    assert pooled.reason.endswith("(tolerance 1e-05 for cpu)")
    assert sequence.status == "ready" and sequence.reason is None

    client = make_client(runtime)
    health = client.get("/health")
    assert health.status_code == 503
    assert health.json()["status"] == "degraded"
    assert health.json()["models"]["pooled"] == {"status": "failed", "reason": pooled.reason}
    cards = {card["id"]: card for card in client.get("/v1/models").json()["data"]}
    assert cards["pooled"]["golden"] == {
        "status": "failed",
        "checked": 1,
        "matched": 0,
        "reference": key,
    }
    assert cards["pooled"]["ready"] is False and cards["pooled"]["status"] == "failed"
    assert cards["pooled"]["accelerator_validated"] is False
    assert cards["pooled"]["engine"] == "native"  # the card keeps what the model was made of
    assert cards["sequence"]["golden"] == {  # the family's one generic request, run twice
        "status": "unverified",
        "checked": 1,
        "matched": 0,
        "reference": "",
    }
    assert cards["sequence"]["ready"] is True
    assert cards["sequence"]["accelerator_validated"] is False  # nothing recorded to match
    refused = client.post("/v1/embeddings", json={"model": "pooled", "input": "x"})
    assert refused.status_code == 503
    served = client.post("/v1/classify", json={"model": "sequence", "input": "still served"})
    assert served.status_code == 200


def test_a_matching_reference_makes_the_card_say_matched(
    make_runtime, controlled_loader, catalog, packages
):
    model = load_model(packages["pooled"], catalog=catalog)
    answer = model.answer("embeddings", dict(GOLDEN_REQUESTS[0]["body"]))
    recorded = {k: v for k, v in answer.items() if k != "model"}
    reference = GoldenReference("fake/pooled", GOLDEN_REQUESTS, {"cpu": (recorded,)}, {"cpu": 1e-5})

    def loader(path, options, **kwargs):
        return dataclasses.replace(
            controlled_loader(path, options, **kwargs), identity="fake/pooled"
        )

    runtime = make_runtime(("pooled",), loader=loader, load=False)
    runtime.catalog = with_reference(catalog, reference)
    runtime.start_loading().join(60)
    assert runtime.models["pooled"].status == "ready"
    [card] = make_client(runtime).get("/v1/models").json()["data"]
    assert card["golden"] == {
        "status": "matched",
        "checked": 1,
        "matched": 1,
        "reference": "cpu",
    }
    assert card["accelerator_validated"] is True  # its answers matched those recorded on cpu


def test_a_passing_cause_is_retried_with_doubling_waits_and_says_so(
    make_runtime, controlled_loader
):
    calls: list[tuple[float, str, str | None]] = []

    def loader(path, options, **kwargs):
        state = runtime.models["pooled"]
        calls.append((time.monotonic(), state.status, state.reason))
        if len(calls) < 3:
            raise LoadError(NO_MEMORY, retryable=True)
        return controlled_loader(path, options, **kwargs)

    runtime = make_runtime(("pooled",), loader=loader, load=False, load_retry_seconds=0.05)
    runtime.start_loading().join(30)
    state = runtime.models["pooled"]
    assert (state.status, state.reason, state.attempts) == ("ready", None, 3)
    assert [status for _, status, _ in calls] == ["loading"] * 3
    assert [reason for _, _, reason in calls] == [
        None,
        f"retrying after {NO_MEMORY} (attempt 2 of 5 in 0.05 s)",
        f"retrying after {NO_MEMORY} (attempt 3 of 5 in 0.1 s)",
    ]
    first_wait, second_wait = calls[1][0] - calls[0][0], calls[2][0] - calls[1][0]
    assert first_wait >= 0.05 and second_wait >= 0.1


def test_the_retry_delay_doubles_up_to_300_seconds(make_runtime):
    runtime = make_runtime(("pooled",), load=False)
    assert [runtime.retry_delay(n) for n in range(1, 9)] == [5, 10, 20, 40, 80, 160, 300, 300]


def test_a_final_cause_fails_at_once(make_runtime):
    calls = []

    def loader(path, options, **kwargs):
        calls.append(path)
        raise LoadError("a file hash does not match: model.safetensors")

    runtime = make_runtime(("pooled",), loader=loader, load_retry_seconds=0.01)
    state = runtime.models["pooled"]
    assert (state.status, state.reason) == (
        "failed",
        "a file hash does not match: model.safetensors",
    )
    assert len(calls) == 1 and state.attempts == 1


def test_a_cause_that_never_passes_fails_after_the_last_attempt(make_runtime):
    def loader(path, options, **kwargs):
        raise RuntimeError("CUDA error: out of memory")

    runtime = make_runtime(("pooled",), loader=loader, load_attempts=3, load_retry_seconds=0.01)
    state = runtime.models["pooled"]
    assert state.attempts == 3
    assert (state.status, state.reason) == (
        "failed",
        "loading raised RuntimeError: CUDA error: out of memory (gave up after 3 attempts)",
    )


def test_other_models_serve_while_one_waits_to_retry_and_shutdown_ends_the_wait(
    make_runtime, controlled_loader
):
    def loader(path, options, **kwargs):
        if options.name == "pooled":
            raise LoadError(NO_MEMORY, retryable=True)
        return controlled_loader(path, options, **kwargs)

    runtime = make_runtime(("pooled", "sequence"), loader=loader, load=False, load_retry_seconds=60)
    thread = runtime.start_loading()
    wait_until(lambda: runtime.models["sequence"].status == "ready", 30, "sequence to be ready")
    pooled = runtime.models["pooled"]
    assert pooled.status == "loading"
    assert pooled.reason == f"retrying after {NO_MEMORY} (attempt 2 of 5 in 60 s)"
    client = make_client(runtime)
    health = client.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "loading"
    answered = client.post("/v1/classify", json={"model": "sequence", "input": "serving"})
    assert answered.status_code == 200
    assert thread.is_alive()  # waiting to retry pooled

    started = time.monotonic()
    runtime.stop()
    thread.join(5)
    assert not thread.is_alive() and time.monotonic() - started < 5
    assert (pooled.status, pooled.reason) == ("failed", "the server shut down before it loaded")


def test_an_explicit_device_that_does_not_exist_fails_at_once(make_runtime, catalog):
    runtime = make_runtime(("pooled",), loader=load_model, device="cuda:1")
    state = runtime.models["pooled"]
    assert state.status == "failed" and state.attempts == 1
    assert state.reason is not None and state.reason.startswith("device not available: ")


def test_the_memory_budget_is_applied_and_final(make_runtime):
    runtime = make_runtime(("pooled",), loader=load_model, memory_budget_gib=1e-6)
    state = runtime.models["pooled"]
    assert state.status == "failed" and state.attempts == 1
    assert state.reason is not None
    assert state.reason.startswith("needs about 0.")
    assert "GiB, above --memory-budget 1e-06 GiB; raise --memory-budget" in state.reason


def test_warming_is_reported_while_the_golden_check_runs(make_runtime, controlled_loader):
    entered, release = threading.Event(), threading.Event()

    def loader(path, options, **kwargs):
        served = controlled_loader(path, options, **kwargs)
        real = served.answer

        def slow_answer(surface, body):
            entered.set()
            assert release.wait(10)
            return real(surface, body)

        served.answer = slow_answer  # type: ignore[method-assign]
        return served

    runtime = make_runtime(("pooled",), loader=loader, load=False)
    thread = runtime.start_loading()
    assert entered.wait(30)
    client = make_client(runtime)
    assert runtime.models["pooled"].status == "warming"
    health = client.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "warming"
    release.set()
    thread.join(30)
    assert client.get("/health").status_code == 200


def test_too_little_free_memory_is_a_passing_cause(make_runtime, catalog):
    from vllm_srun.accelerators.cpu import CpuAccelerator

    class CrowdedCpu(CpuAccelerator):
        def devices(self):
            return [dataclasses.replace(d, free_memory_bytes=1000) for d in super().devices()]

    layers = {**catalog.layers, "accelerators": {"cpu": CrowdedCpu()}}
    runtime = make_runtime(
        ("pooled",), loader=load_model, load=False, load_attempts=2, load_retry_seconds=0.01
    )
    runtime.catalog = dataclasses.replace(catalog, layers=layers)
    runtime.start_loading().join(30)
    state = runtime.models["pooled"]
    assert state.status == "failed" and state.attempts == 2
    assert state.reason is not None
    assert state.reason.startswith("needs about 0.")
    assert state.reason.endswith(
        "GiB, 9.3e-07 GiB free; out of memory on cpu: free memory on it, choose another "
        "device with --device, or serve a smaller model (gave up after 2 attempts)"
    )


def test_a_golden_check_that_raises_fails_only_its_model(make_runtime, controlled_loader):
    def loader(path, options, **kwargs):
        served = controlled_loader(path, options, **kwargs)
        if options.name == "pooled":
            control = served.loaded
            control.fail_run = RuntimeError("kernel exploded")
        return served

    runtime = make_runtime(("pooled", "sequence"), loader=loader)
    pooled = runtime.models["pooled"]
    assert pooled.status == "failed"
    assert pooled.reason == "golden self-check raised RuntimeError: kernel exploded"
    assert pooled.golden.card() == {
        "status": "failed",
        "checked": 2,  # the family's two generic requests were run, and raised
        "matched": 0,
        "reference": "",
    }
    assert runtime.models["sequence"].status == "ready"


def test_a_warm_up_that_raises_fails_only_its_model_before_its_self_check(
    make_runtime, controlled_loader
):
    def loader(path, options, **kwargs):
        served = controlled_loader(path, options, **kwargs)
        if options.name == "pooled":

            def warm():
                raise OSError("the pattern tables are unreadable")

            served.loaded.warm = warm
        return served

    runtime = make_runtime(("pooled", "sequence"), loader=loader)
    pooled = runtime.models["pooled"]
    assert (pooled.status, pooled.served) == ("failed", None)
    assert pooled.reason == "warming up raised OSError: the pattern tables are unreadable"
    assert pooled.golden.status == "pending"  # never reached
    assert runtime.models["sequence"].status == "ready"
