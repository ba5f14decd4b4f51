"""The answer builders of the plugin API write the wire's shapes (checked against the
types /openapi.json is generated from)."""

import json
import math

from pydantic import TypeAdapter

from vllm_srun.plugins import (
    RowError,
    embeddings_answer,
    input_usage,
    item_error,
    usage,
)
from vllm_srun.plugins.responses import EmbeddingsResponse


def test_input_usage_defaults_to_one_whole_row():
    assert input_usage(7) == {"tokens": 7, "processed_tokens": 7, "truncated": False, "windows": 1}
    assert input_usage(900, 520, True, 2) == {
        "tokens": 900,
        "processed_tokens": 520,
        "truncated": True,
        "windows": 2,
    }


def test_an_embeddings_answer_keeps_every_input_in_its_place():
    answer = embeddings_answer(
        [
            ([0.6, 0.8], input_usage(4)),
            RowError("max_length_exceeded", "the input has 90 tokens; this model reads 64"),
            ([math.nan, 1.0], input_usage(5)),
            ("AACAPwAAAEA=", input_usage(3)),
        ]
    )
    assert answer == {
        "object": "list",
        "data": [
            {
                "object": "embedding",
                "index": 0,
                "embedding": [0.6, 0.8],
                "input": {"tokens": 4, "processed_tokens": 4, "truncated": False, "windows": 1},
            },
            {
                "object": "embedding",
                "index": 1,
                "error": "max_length_exceeded",
                "message": "the input has 90 tokens; this model reads 64",
            },
            {
                "object": "embedding",
                "index": 2,
                "error": "invalid_model_output",
                "message": "the embedding is not finite",
            },
            {
                "object": "embedding",
                "index": 3,
                "embedding": "AACAPwAAAEA=",
                "input": {"tokens": 3, "processed_tokens": 3, "truncated": False, "windows": 1},
            },
        ],
        "usage": {"prompt_tokens": 7, "total_tokens": 7},
    }
    json.dumps(answer, allow_nan=False)  # a NaN never reaches the body
    wire = TypeAdapter(EmbeddingsResponse)
    wire.validate_python({"model": "m", **answer}, strict=True)


def test_the_small_builders():
    assert item_error(2, "invalid_input", "empty") == {
        "index": 2,
        "error": "invalid_input",
        "message": "empty",
    }
    assert usage(12) == {"input_tokens": 12, "output_tokens": 0}
