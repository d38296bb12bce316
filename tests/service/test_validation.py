"""Bad input never gets a 5xx: each case gets its documented 4xx and the error body
`{"error", "error_type"}` (see service.schemas for the rules)."""

from __future__ import annotations

import json

import pytest

from tests.service.conftest import Service

pytestmark = pytest.mark.anyio

LONG_QUESTION = " ".join(["who"] * 100)  # 100 tokens, the window is 64
CONTEXT = "john lives in paris."

# (endpoint, JSON body, status, error_type, a word the message must contain)
CASES = [
    ("/classify", {"inputs": []}, 422, "validation", "empty"),
    ("/classify", {"inputs": 5}, 422, "validation", "inputs"),
    ("/classify", {"inputs": ["a", 7]}, 422, "validation", "item 1"),
    ("/classify", {"inputs": None}, 422, "validation", "null"),
    ("/classify", {"inputs": [["a", "b", "c"]]}, 422, "validation", "pair"),
    ("/classify", {"inputs": {"text": "a"}}, 422, "validation", "object"),
    ("/classify", {}, 422, "validation", "missing"),
    ("/classify", [], 422, "validation", "body"),
    ("/classify", {"inputs": "a", "top_k": 0}, 422, "validation", "top_k"),
    ("/classify", {"inputs": "a", "top-k": 2}, 422, "validation", "unknown field"),
    (
        "/classify",
        {"inputs": "a", "function_to_apply": "relu"},
        422,
        "validation",
        "function_to_apply",
    ),
    ("/classify", {"inputs": "a " * 100, "truncate": False}, 422, "validation", "max_seq_length"),
    ("/classify", {"inputs": "x" * 100_000}, 413, "payload_too_large", "max_text_chars"),
    ("/classify", {"inputs": ["a"] * 65}, 413, "payload_too_large", "max_client_batch_size"),
    ("/classify", {"inputs": "a", "model": "nope"}, 404, "model_not_found", "nope"),
    (
        "/qa",
        {"question": "", "context": "Anna lives in Oslo."},
        422,
        "validation",
        "question is empty",
    ),
    (
        "/qa",
        {"question": "  ", "context": "Anna lives in Oslo."},
        422,
        "validation",
        "question is empty",
    ),
    ("/qa", {"question": "Where?", "context": ""}, 422, "validation", "context is empty"),
    ("/classify", {"inputs": "a", "model": "minilm"}, 422, "validation", "embedding"),
    (
        "/ner",
        {"inputs": "a", "aggregation_strategy": "bogus"},
        422,
        "validation",
        "aggregation_strategy",
    ),
    ("/ner", {"inputs": "a", "stride": 62}, 422, "validation", "stride"),
    ("/ner", {"inputs": " ".join(["paris"] * 20_000)}, 413, "payload_too_large", "max_text_chars"),
    ("/ner", {"inputs": "a", "model": "sst2"}, 422, "validation", "classification"),
    ("/qa", {"question": LONG_QUESTION, "context": CONTEXT}, 422, "validation", "question"),
    ("/qa", {"question": "who?"}, 422, "validation", "context"),
    ("/qa", {"question": "who?", "context": CONTEXT, "inputs": []}, 422, "validation", "either"),
    ("/qa", {"inputs": []}, 422, "validation", "empty"),
    ("/qa", {"inputs": [{"question": "who?"}]}, 422, "validation", "context"),
    ("/qa", {"question": "who?", "context": ""}, 422, "validation", "context"),
    (
        "/qa",
        {"question": "who?", "context": "paris " * 80, "doc_stride": 200},
        422,
        "validation",
        "doc_stride",
    ),
    (
        "/qa",
        {"question": "who?", "context": CONTEXT, "max_answer_len": 0},
        422,
        "validation",
        "max_answer_len",
    ),
    (
        "/qa",
        {"question": "who?", "context": CONTEXT, "max_answer_len": 10**30},
        422,
        "validation",
        "max_answer_len",
    ),
    ("/qa", {"question": "who?", "context": CONTEXT, "top_k": 10**6}, 422, "validation", "top_k"),
    ("/classify", {"inputs": "a", "top_k": 10**30}, 422, "validation", "top_k"),
    ("/embed", {"inputs": [[1, 2]]}, 422, "validation", "item 0"),
    ("/embed", {"inputs": "a", "normalize": "maybe"}, 422, "validation", "normalize"),
    ("/v1/embeddings", {"input": [[1, 2, 3]]}, 422, "validation", "input"),
    ("/v1/embeddings", {"input": "a", "dimensions": 999}, 422, "validation", "dimensions"),
    ("/embed", {"inputs": "a", "dimensions": 999}, 422, "validation", "between 1 and"),
    ("/classify", {"inputs": "a", "truncation_direction": "up"}, 422, "validation", "truncation"),
    (
        "/v1/embeddings",
        {"input": "a", "encoding_format": "int8"},
        422,
        "validation",
        "encoding_format",
    ),
]


def assert_error(response, status: int, error_type: str, word: str = "") -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "error_type"}
    assert body["error_type"] == error_type
    assert word.lower() in body["error"].lower()


@pytest.mark.parametrize(("path", "body", "status", "error_type", "word"), CASES)
async def test_bad_input_gets_a_4xx_that_says_what_to_fix(
    shared: Service, path: str, body: object, status: int, error_type: str, word: str
) -> None:
    assert_error(await shared.client.post(path, json=body), status, error_type, word)


@pytest.mark.parametrize("path", ["/classify", "/ner", "/embed"])
async def test_a_lone_surrogate_is_refused(shared: Service, path: str) -> None:
    # JSON allows the escape "\ud800"; Python decodes it into a str that cannot be UTF-8 encoded
    for raw in (b'{"inputs": "ab\\ud800c"}', b'{"inputs": ["ok", "\\udfff"]}'):
        r = await shared.client.post(
            path, content=raw, headers={"content-type": "application/json"}
        )
        assert_error(r, 422, "validation", "surrogate")


async def test_a_lone_surrogate_in_a_question_is_refused(shared: Service) -> None:
    raw = json.dumps(
        {"question": "\ud800?", "context": CONTEXT}
    ).encode()  # ensure_ascii escapes it
    r = await shared.client.post("/qa", content=raw, headers={"content-type": "application/json"})
    assert_error(r, 422, "validation", "surrogate")


# each text, and one the tokenizer reads alike
SAME_AS = {"": "", "   ": "", "\t\n": "", "a\x00b\x07c": "abc", "\u200b\ufeff": "",
           "e\u0301": "e", "😀 paris": "\u2603 paris"}  # fmt: skip


@pytest.mark.parametrize("text", list(SAME_AS))
async def test_empty_whitespace_and_control_characters_are_served(
    shared: Service, text: str
) -> None:
    # answered as the text the tokenizer makes of it: control and zero-width characters
    # dropped, accents stripped (uncased), an unknown symbol read as [UNK] like any other
    same_as = SAME_AS[text]
    for path, body in [("/classify", {"top_k": None}), ("/embed", {})]:
        r = await shared.client.post(path, json={"inputs": [text], **body})
        assert r.status_code == 200, r.text
        want = (await shared.client.post(path, json={"inputs": [same_as], **body})).json()
        assert r.json() == want  # the same rows: the same answer, to the bit
        other = (await shared.client.post(path, json={"inputs": ["paris"], **body})).json()
        assert r.json() != other  # the stand-in answers another text otherwise
    r = await shared.client.post(
        "/ner", json={"inputs": text, "aggregation_strategy": "none", "ignore_labels": []}
    )
    assert r.status_code == 200
    for token in r.json():
        assert text[token["start"] : token["end"]] == token["word"]


async def test_bytes_that_are_not_utf8(shared: Service) -> None:
    json_header = {"content-type": "application/json"}
    r = await shared.client.post(
        "/classify", content=b'{"inputs": "\xff\xfe"}', headers=json_header
    )
    assert_error(r, 400, "bad_request")
    # a surrogate encoded as UTF-8 bytes (CESU-8) is not UTF-8 either
    r = await shared.client.post(
        "/classify", content=b'{"inputs": "a\xed\xa0\x80"}', headers=json_header
    )
    assert r.status_code in (400, 422) and r.json()["error_type"] in ("bad_request", "validation")


async def test_invalid_json_and_wrong_content_type(shared: Service) -> None:
    r = await shared.client.post(
        "/classify", content=b'{"inputs": ', headers={"content-type": "application/json"}
    )
    assert_error(r, 422, "validation", "not valid JSON")
    r = await shared.client.post(
        "/classify", content=b'{"inputs": "a"}', headers={"content-type": "text/plain"}
    )
    assert r.status_code == 422


async def test_a_10_mb_body_is_refused_before_it_is_read(shared: Service) -> None:
    body = json.dumps({"inputs": ["x" * 1000] * 10_000}).encode()
    assert len(body) > 10_000_000
    r = await shared.client.post(
        "/classify", content=body, headers={"content-type": "application/json"}
    )
    assert_error(r, 413, "payload_too_large", "payload_limit")

    async def chunks():  # no Content-Length: the limit counts streamed bytes
        for _ in range(100):
            yield b"x" * 100_000

    r = await shared.client.post(
        "/embed", content=chunks(), headers={"content-type": "application/json"}
    )
    assert_error(r, 413, "payload_too_large")


async def test_unknown_routes_and_methods_use_the_error_body(shared: Service) -> None:
    # the fix in the message: the endpoints there are, or the method the path takes
    r = await shared.client.post("/clasify", json={"inputs": "a"})
    assert_error(r, 404, "not_found", "POST /clasify")
    for endpoint in ("/classify", "/ner", "/qa", "/embed", "/v1/embeddings", "/models"):
        assert endpoint in r.json()["error"]
    assert_error(await shared.client.get("/nope"), 404, "not_found", "the endpoints are")
    r = await shared.client.get("/classify")
    assert_error(r, 405, "method_not_allowed", "GET /classify is not allowed")
    assert "takes POST" in r.json()["error"] and r.headers["allow"] == "POST"
    r = await shared.client.post("/models")
    assert_error(r, 405, "method_not_allowed", "takes GET")


async def test_errors_are_counted_by_reason(service: Service) -> None:
    await service.client.post("/classify", json={"inputs": []})
    await service.client.post("/classify", json={"inputs": "a", "model": "minilm"})
    text = await service.metrics()
    assert 'bert_heads_request_failures_total{model="",reason="validation",task=""} 2.0' in text
    assert (
        'bert_heads_requests_total{endpoint="/classify",model="",status="422",task=""} 2.0' in text
    )
