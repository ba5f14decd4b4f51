from vllm_srun.plugins import GoldenReference
from vllm_srun.plugins.golden import golden_violations

REQUEST = {"surface": "embeddings", "body": {"input": "hello"}}


def test_answers_per_key_match_the_requests():
    ref = GoldenReference("m", (REQUEST,), {"cpu": ({"embedding": [0.1]},)}, {"cpu": 1e-5})
    assert ref.key == "m"
    assert golden_violations(ref) == []


def test_violations_name_the_problem():
    ref = GoldenReference(
        "", (REQUEST,), {"cpu": ({}, {}), "cuda": 5}, {"cuda": -1.0, "rocm": float("nan")}
    )
    assert golden_violations(ref) == [
        "golden reference model must be a non-empty string",
        "reference key 'cpu' has 2 answers for 1 requests",
        "reference key 'cuda' has int answers for 1 requests",
        "tolerance for 'cuda' must be a finite number >= 0",
        "tolerance for 'rocm' must be a finite number >= 0",
    ]


def test_malformed_shapes_stop_early():
    assert golden_violations(GoldenReference("m", (), {}, {})) == [
        "golden reference must have a non-empty tuple of requests"
    ]
    assert golden_violations(GoldenReference("m", (REQUEST,), None, {})) == [  # type: ignore[arg-type]
        "golden reference answers and tolerances must be mappings"
    ]
