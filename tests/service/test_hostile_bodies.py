"""Bodies built to break a parser get a clear 4xx, never a 500 (issue 48): JSON nested far
deeper than any request (pydantic-core refuses it; the standard library, which decides the
error message, would recurse past Python's limit)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.anyio

DEEP = b'{"inputs": ' + b"[" * 1000 + b"]" * 1000 + b"}"


@pytest.mark.parametrize(
    "path", ["/classify", "/embed", "/ner", "/qa", "/v1/embeddings", "/tokenize"]
)
async def test_json_nested_a_thousand_deep_is_a_422(shared, path):
    response = await shared.client.post(
        path, content=DEEP, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    assert response.json() == {
        "error": "body: JSON nested too deeply (a request body is an object of a few levels)",
        "error_type": "validation",
    }
