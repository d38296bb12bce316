"""Bodies built to break a parser get a clear 4xx, never a 500 (issue 48): JSON nested far
deeper than any request (pydantic-core refuses it; the standard library, which decides the
error message, would recurse past Python's limit); numbers past a double or past 4300 digits;
NaN and Infinity, which pydantic-core reads but JSON does not have; a key twice in one object
(parsers disagree on which counts: refused, naming the key); bytes that are not UTF-8; and the
same on the v2 infer route, with the protocol's 400. Content-Encoding is honoured (issue 49): a
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


# -- numbers, keys and bytes that JSON parsers disagree on (issue 48) ---------------------------

DIGITS_5000 = b"1" + b"0" * 4999  # past the 4300 digits Python and pydantic-core read
HOSTILE = [
    # (path, body, status, words in the error)
    ("/classify", b'{"inputs": "a", "top_k": 1e400}', 422, "top_k: the number is out of range"),
    ("/classify", b'{"inputs": "a", "top_k": 1' + b"0" * 4000 + b"}", 422, "less than or equal"),
    ("/classify", b'{"inputs": "a", "top_k": ' + DIGITS_5000 + b"}", 422, "more digits"),
    ("/classify", b'{"inputs": "a", "top_k": 2.5}', 422, "top_k: Input should be a valid integer"),
    ("/classify", b'{"inputs": "a", "top_k": NaN}', 422, "NaN is not a JSON number"),
    ("/classify", b'{"inputs": "a", "top_k": Infinity}', 422, "Infinity is not a JSON number"),
    ("/embed", b'{"inputs": "a", "dimensions": -Infinity}', 422, "-Infinity is not a JSON"),
    # a field the OpenAI shape ignores: still not JSON
    ("/v1/embeddings", b'{"input": "a", "temperature": NaN}', 422, "NaN is not a JSON number"),
    ("/classify", b'{"inputs": "a", "inputs": "b"}', 422, "the key 'inputs' appears twice"),
    ("/classify", b'{"inputs": "a", "top_k": 1, "top_k": 2}', 422, "'top_k' appears twice"),
    (
        "/qa",
        b'{"inputs": [{"question": "who?", "context": "anna", "context": "paris"}]}',
        422,
        "the key 'context' appears twice",
    ),
    ("/classify", b'{"inputs": "caf\xe9"}', 400, "not valid UTF-8"),  # Latin-1, not UTF-8
    ("/classify", b'\xff\xfe{"inputs": "a"}', 400, "not valid UTF-8"),
]


@pytest.mark.parametrize(("path", "body", "status", "words"), HOSTILE)
async def test_numbers_keys_and_bytes_json_parsers_disagree_on_are_a_clear_4xx(
    shared, path, body, status, words
):
    response = await shared.client.post(path, content=body, headers=JSON)
    assert response.status_code == status, response.text
    assert words in response.json()["error"], response.text


@pytest.mark.parametrize(
    "body",
    [
        b'{"inputs": "NaN and Infinity are fine words", "top_k": 2.0}',  # 2.0 is the integer 2
        b'{"inputs": "note: a colon, and another: here"}',  # colons that are not keys
        b'{"inputs": ["a {\\"inputs\\": 1, \\"inputs\\": 2} in a text"]}',  # JSON in a text
    ],
)
async def test_what_only_looks_hostile_is_served(shared, body):
    response = await shared.client.post("/classify", content=body, headers=JSON)
    assert response.status_code == 200, response.text


def v2_body(data: bytes, rest: bytes = b"") -> bytes:
    tensor = b'{"name": "text", "shape": [1], "datatype": "BYTES", "data": ' + data + b"}"
    return b'{"inputs": [' + tensor + b"]" + rest + b"}"


V2_HOSTILE = [
    (v2_body(b"[" * 1000 + b'"a"' + b"]" * 1000), "JSON nested too deeply"),
    (v2_body(b"[" * 150 + b'"a"' + b"]" * 150), "input 'text': element 0 is not text"),
    (v2_body(b'[["a", ["b"]]]'), "element 0 is not text"),
    (v2_body(b'["a", []]').replace(b"[1]", b"[2]"), "element 1 is not text"),
    (
        v2_body(b'["a"]').replace(
            b"]}]", b']}, {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["b"]}]'
        ),
        "input 'text' is given twice",
    ),
    (v2_body(b"[NaN]"), "NaN is not a JSON number"),
    (v2_body(b'["a"]', b', "parameters": {"truncate": Infinity}'), "Infinity is not a JSON"),
    (v2_body(b'["a"]', b', "id": "x", "id": "y"'), "the key 'id' appears twice"),
    (v2_body(b'["\xff"]'), "not valid UTF-8"),
    (v2_body(b'["\\ud800"]'), "element 0 holds a lone UTF-16 surrogate"),
    (v2_body(b'["a"]').replace(b"[1]", b"[1e400]"), "the number is out of range"),
    (v2_body(b'["a"]').replace(b"[1]", b"[" + DIGITS_5000 + b"]"), "more digits"),
    (v2_body(b'["a"]').replace(b"[1]", b'["1"]'), "shape[0]: Input should be a valid integer"),
]


@pytest.mark.parametrize(("body", "words"), V2_HOSTILE)
async def test_the_v2_infer_route_answers_the_same_bodies_with_the_protocols_400(
    shared, body, words
):
    response = await shared.client.post("/v2/models/sst2/infer", content=body, headers=JSON)
    assert response.status_code == 400, response.text
    assert list(response.json()) == ["error"] and words in response.json()["error"]
    ok = await shared.client.post("/v2/models/sst2/infer", content=v2_body(b'[["a"]]'))
    assert ok.status_code == 200, ok.text  # [N, 1] data, one level deep: served
