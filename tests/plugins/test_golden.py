from vllm_srun.plugins import GoldenReference
from vllm_srun.plugins.golden import golden_violations

REQUEST = {"surface": "embeddings", "body": {"input": "hello"}}


def test_answers_per_key_match_the_requests():
    ref = GoldenReference("m", (REQUEST,), {"cpu": ({"embedding": [0.1]},)}, {"cpu": 1e-5})
    assert ref.key == "m"
    assert golden_violations(ref) == []


def test_violations_name_the_problem():
    ref = GoldenReference("", (), {"cpu": ({},)}, {"cuda": -1.0})
    assert golden_violations(ref) == [
        "golden reference model must be a non-empty string",
        "golden reference has no requests",
        "reference key 'cpu' has 1 answers for 0 requests",
        "tolerance for 'cuda' must be a number >= 0",
    ]
