"""The checked-in OpenAPI snapshot is the HTTP contract; it must equal what the app serves.

Regenerate after an intended change with::

    VLLM_SRUN_UPDATE_OPENAPI=1 pytest tests/serve/test_openapi.py
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from vllm_srun.config import ServeConfig
from vllm_srun.serve.app import ERROR_RESPONSES, build_app
from vllm_srun.service.runtime import Runtime

from .conftest import SNAPSHOT, snapshot

REGENERATE = "VLLM_SRUN_UPDATE_OPENAPI=1 pytest tests/serve/test_openapi.py"
SURFACES = ("/v1/embeddings", "/v1/classify", "/v1/rerank", "/v1/bundle")


@pytest.fixture(scope="module")
def served_openapi(catalog) -> dict[str, Any]:
    runtime = Runtime(ServeConfig(), catalog=catalog)
    try:
        app = build_app(runtime)
        document = app.openapi()
        routes = {
            (method, route.path.replace(":path}", "}"))  # OpenAPI drops the converter
            for route in app.routes
            for method in getattr(route, "methods", None) or ()
            if getattr(route, "include_in_schema", False)
        }
        return {"document": document, "routes": routes}
    finally:
        runtime.stop()


def test_the_snapshot_equals_the_served_openapi(served_openapi):
    document = served_openapi["document"]
    if os.environ.get("VLLM_SRUN_UPDATE_OPENAPI") == "1":
        SNAPSHOT.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    assert SNAPSHOT.exists(), f"{SNAPSHOT} is missing; create it with `{REGENERATE}`"
    checked_in = snapshot()
    if checked_in != document:

        def parts(doc: dict[str, Any]) -> dict[str, Any]:
            schemas = doc.get("components", {}).get("schemas", {})
            return {
                **{f"path {k}": v for k, v in doc.get("paths", {}).items()},
                **{f"schema {k}": v for k, v in schemas.items()},
            }

        old, new = parts(checked_in), parts(document)
        drift = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        if checked_in.get("info") != document.get("info"):
            drift.insert(0, "info")
        pytest.fail(
            "the HTTP contract drifted from tests/serve/openapi.json "
            f"({', '.join(drift) or 'top level'}). If the change is intended, "
            f"regenerate the snapshot with `{REGENERATE}` and commit it."
        )


def test_every_route_is_in_the_snapshot(served_openapi):
    paths = snapshot()["paths"]
    documented = {(method.upper(), path) for path, ops in paths.items() for method in ops}
    assert served_openapi["routes"] == documented
    assert set(paths) == {
        "/v1/embeddings",
        "/v1/classify",
        "/v1/rerank",
        "/v1/bundle",
        "/v1/decisions",
        "/v1/systemone",
        "/v1/systemone/batch",
        "/v1/models",
        "/v1/models/{model_id}",
        "/health",
        "/health/live",
        "/metrics",
    }


@pytest.mark.parametrize("path", SURFACES)
def test_surfaces_document_success_and_every_error(path):
    responses = snapshot()["paths"][path]["post"]["responses"]
    assert set(responses) == {"200", *(str(s) for s in ERROR_RESPONSES)}
    for status in ERROR_RESPONSES:
        schema = responses[str(status)]["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/ErrorResponse"}
    name = path.rsplit("/", 1)[1].capitalize()
    success = responses["200"]["content"]["application/json"]["schema"]
    assert success == {"$ref": f"#/components/schemas/{name}Response"}


def test_error_codes_in_the_snapshot_are_the_documented_ones():
    schemas = snapshot()["components"]["schemas"]
    assert schemas["ErrorResponse"]["required"] == ["error"]
    assert set(schemas["ErrorBody"]["properties"]["code"]["enum"]) == {
        "invalid_request",
        "model_not_found",
        "request_too_large",
        "unsupported_surface",
        "overloaded",
        "internal_error",
        "not_ready",
    }
    assert set(schemas["ItemError"]["properties"]["error"]["enum"]) == {
        "invalid_input",
        "max_length_exceeded",
        "scan_budget_exceeded",
        "invalid_model_output",
        "deadline_exceeded",
        "internal_error",
    }


def test_health_documents_200_and_503_and_metrics_is_text():
    paths = snapshot()["paths"]
    health = paths["/health"]["get"]["responses"]
    assert set(health) == {"200", "503"}
    for status in ("200", "503"):
        schema = health[status]["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/Health"}
    assert list(paths["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]


def test_the_document_uses_json_schema_keywords_only():
    found = []

    def walk(node, where):
        if isinstance(node, dict):
            found.extend(f"{where}.{k}" for k in node if k in ("gt", "ge", "lt", "le"))
            for key, value in node.items():
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{where}[{index}]")

    walk(snapshot(), "")
    assert found == []


def test_the_document_states_what_decisions_refuse():
    schemas = snapshot()["components"]["schemas"]
    request = schemas["DecisionsRequest"]["properties"]
    assert request["questions"]["minProperties"] == 1
    assert {"type": "string", "pattern": r"\S"} in request["state"]["anyOf"]
    assert schemas["InputOptions"]["properties"]["deadline_ms"]["anyOf"][0] == {
        "type": "number",
        "exclusiveMinimum": 0.0,
    }


def test_the_document_is_contract_2_3_and_names_the_runtime_version():
    from vllm_srun import __version__

    info = snapshot()["info"]
    assert info["version"] == "2.3.0"
    assert info["x-runtime-version"] == __version__
    assert __version__ in info["description"]


def test_the_2_3_card_types_are_integers_lists_and_booleans():
    """The router's Go client fails a whole decode on a JSON type mismatch: the
    documented types must be the contract's."""
    schemas = snapshot()["components"]["schemas"]

    def types(schema):
        if "anyOf" in schema:
            return {t for part in schema["anyOf"] for t in types(part)}
        if "$ref" in schema:
            return {schema["$ref"].rsplit("/", 1)[1]}
        return {schema.get("type")}

    embedding = schemas["EmbeddingCard"]["properties"]
    assert embedding["dimensions"]["type"] == "array"
    assert embedding["dimensions"]["items"] == {"type": "integer"}
    assert embedding["layers"]["items"] == {"type": "integer"}
    assert set(schemas["EmbeddingCard"]["required"]) >= {
        "dimensions",
        "layers",
        "modalities",
        "normalized",
        "pooling",
        "input_types",
    }
    golden = schemas["GoldenStatus"]["properties"]
    assert types(golden["checked"]) == types(golden["matched"]) == {"integer"}
    assert golden["status"]["enum"] == ["pending", "matched", "unverified", "failed"]
    head = schemas["HeadCard"]["properties"]
    assert types(head["overflow"]) == {"string"}
    assert head["reduction"]["anyOf"][0] == {"enum": ["max", "span_union"], "type": "string"}
    assert types(head["thresholds"]) == {"array", "null"}
    card = schemas["ModelCard"]["properties"]
    assert types(card["ready"]) == types(card["accelerator_validated"]) == {"boolean"}
    assert "ready" in schemas["ModelCard"]["required"]
    assert card["status"]["enum"] == [
        "starting",
        "loading",
        "warming",
        "ready",
        "degraded",
        "failed",
    ]
    assert types(card["rerank"]) == {"RerankCard", "null"}
    assert schemas["RerankCard"]["required"] == ["exits", "default"]
    limits = schemas["ModelLimits"]["properties"]
    for key in ("max_input_tokens", "max_inputs", "min_options", "max_options"):
        assert types(limits[key]) == {"integer", "null"}, key
    assert set(schemas["Health"]["properties"]) >= {
        "api_version",
        "status",
        "reason",
        "model",
        "models",
    }
    extension = "Extension (not in the 2.3 contract; a 2.3 client ignores it)"
    assert head["overflow_policies"]["description"].startswith(extension)
    assert embedding["max_tokens"]["description"].startswith(extension)


def test_openapi_yaml_serves_the_same_document(catalog):
    import yaml
    from fastapi.testclient import TestClient

    runtime = Runtime(ServeConfig(), catalog=catalog)
    try:
        client = TestClient(build_app(runtime))
        as_json = client.get("/openapi.json").json()
        response = client.get("/openapi.yaml")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/yaml")
        assert yaml.safe_load(response.text) == as_json == snapshot()
        assert list(yaml.safe_load(response.text)) == list(as_json)  # keys in the same order
    finally:
        runtime.stop()


def test_the_bundle_documents_each_task_body_with_its_surface_request():
    document = snapshot()
    body = document["paths"]["/v1/bundle"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/BundleRequest"
    }
    schemas = document["components"]["schemas"]
    task = schemas["BundleTask"]["properties"]
    for key, request in [
        ("embeddings", "EmbeddingsRequest"),
        ("classify", "ClassifyRequest"),
        ("rerank", "RerankRequest"),
        ("decisions", "DecisionsRequest"),
        ("systemone_batch", "SystemOneBatchRequest"),
    ]:
        assert {"$ref": f"#/components/schemas/{request}"} in task[key]["anyOf"], key
        assert request in schemas, request
    assert task["id"] == {
        "type": "string",
        "minLength": 1,
        "title": "Id",
        "description": "Names the task's result; not empty.",
    }
    assert schemas["BundleRequest"]["properties"]["tasks"]["minItems"] == 1


def test_the_document_describes_named_states_and_their_answers():
    schemas = snapshot()["components"]["schemas"]
    states = schemas["DecisionsRequest"]["properties"]["states"]["anyOf"]
    entry = {"$ref": "#/components/schemas/DecisionState"}
    assert {"type": "object", "additionalProperties": entry} in states
    assert {"type": "array", "items": entry} in states
    for holder in (schemas["DecisionsRequest"], schemas["DecisionState"]):
        assert {"type": "array", "items": {"type": "string"}} in holder["properties"]["images"][
            "anyOf"
        ]
    answered = schemas["DecisionsResponse"]["properties"]["states"]["anyOf"]
    named = {"$ref": "#/components/schemas/DecisionStateResponse"}
    assert {"type": "object", "additionalProperties": named} in answered
    response = schemas["DecisionStateResponse"]
    # required is a set in JSON Schema: the order follows the types' inheritance
    assert set(response["required"]) == {"model", "answers", "usage"}
    assert set(response["properties"]) == {"model", "answers", "usage", "meta"}
    answers = schemas["DecisionStateAnswers"]["required"]
    assert set(answers) == {"model", "answers", "usage", "index"}
