"""The committed OpenAPI document is the app's: a route, body or answer changed without
regenerating docs/openapi.json (`memq serve --openapi > docs/openapi.json`) fails here."""

from __future__ import annotations

import json
from pathlib import Path

from memq.server.app import openapi_document

DOCUMENT = Path(__file__).resolve().parent.parent / "docs" / "openapi.json"


def test_the_committed_openapi_document_matches_the_app() -> None:
    committed = DOCUMENT.read_text(encoding="utf-8")
    assert json.loads(committed) == json.loads(openapi_document()), (
        "docs/openapi.json drifted from the app: run `memq serve --openapi > docs/openapi.json`"
    )
    assert committed == openapi_document()  # byte-identical, so a diff shows only real changes


def test_every_keyed_operation_documents_its_problem_answers() -> None:
    spec = json.loads(openapi_document())
    operations = [(p, m, op) for p, ops in spec["paths"].items() for m, op in ops.items()]
    assert len(operations) >= 15
    for path, method, operation in operations:
        for status in ("401", "403", "422"):
            content = operation["responses"][status]["content"]
            assert list(content) == ["application/problem+json"], (method, path, status)
        if path not in ("/healthz", "/readyz"):
            assert operation["security"] == [{"HTTPBearer": []}], (method, path)
