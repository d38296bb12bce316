"""Bodies built to break a parser get a clear 4xx, never a 500 (issue 48): JSON nested far
deeper than any request (pydantic-core refuses it; the standard library, which decides the
error message, would recurse past Python's limit). Content-Encoding is honoured (issue 49): a
gzip body is decoded, one that is not gzip a 400, one that expands past the payload limit a
413, another encoding a 415 (the header was ignored: a non-gzip body marked gzip answered 200)."""

from __future__ import annotations

import gzip
import json

import pytest

pytestmark = pytest.mark.anyio

JSON = {"content-type": "application/json"}
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


async def test_a_gzip_body_is_decoded_and_answers_as_the_plain_one(shared):
    body = json.dumps({"inputs": ["a fine film", "a dull film"], "model": "sst2"}).encode()
    plain = await shared.client.post("/classify", content=body, headers=JSON)
    zipped = await shared.client.post(
        "/classify", content=gzip.compress(body), headers={**JSON, "content-encoding": "gzip"}
    )
    assert plain.status_code == zipped.status_code == 200
    assert zipped.json() == plain.json()


@pytest.mark.parametrize(
    "encoding, body, status, words",
    [
        ("gzip", b'{"inputs": "not gzip"}', 400, "Content-Encoding is gzip but the body is not"),
        ("br", b'{"inputs": "x"}', 415, "Content-Encoding 'br' is not supported"),
        ("gzip", gzip.compress(b" " * (3 << 20)), 413, "expands past the payload limit"),
    ],
)
async def test_a_body_that_does_not_match_its_encoding_is_refused(
    shared, encoding, body, status, words
):
    response = await shared.client.post(
        "/classify", content=body, headers={**JSON, "content-encoding": encoding}
    )
    assert response.status_code == status, response.text
    assert words in response.json()["error"]
