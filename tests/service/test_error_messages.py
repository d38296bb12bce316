"""Error messages that say what to fix (issue 49): the field, the index, and the rule."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.anyio


async def error(service, path: str, body: dict, status: int = 422) -> str:
    response = await service.client.post(path, json=body)
    assert response.status_code == status, response.text
    return response.json()["error"]


async def test_decode_names_a_negative_id_and_its_place(shared):
    message = await error(shared, "/decode", {"ids": [101, -1, 102], "model": "minilm"})
    assert message == "ids: item 1 is -1: a token id is an integer of at least 0"
    nested = await error(shared, "/decode", {"ids": [[101], [102, "x"]], "model": "minilm"})
    assert nested == "ids: item [1][1] is a string: a token id is an integer of at least 0"
    assert await error(shared, "/decode", {"ids": 5, "model": "minilm"}) == (
        "ids: expected a list of token ids or a list of such lists, got a number"
    )


async def test_decode_names_where_an_id_past_the_vocabulary_is(shared):
    message = await error(shared, "/decode", {"ids": [101, 99999999, 102], "model": "minilm"})
    assert message.startswith("ids[1] is 99999999, outside this model's vocabulary")
    nested = await error(shared, "/decode", {"ids": [[101], [7, 8, 99999999]], "model": "minilm"})
    assert nested.startswith("ids[1][2] is 99999999")


async def test_embed_sparse_with_only_a_dense_model_says_so(shared):
    message = await error(shared, "/embed_sparse", {"inputs": "a text"}, status=404)
    assert "minilm is for other endpoints" in message, message
    assert "no embedding model that /embed_sparse serves is loaded" in message


async def test_the_404_lists_what_a_user_calls_not_the_internal_paths(tmp_path, make_package):
    from service.settings import Settings
    from tests.service.conftest import serve

    make_package(tmp_path, "classification")
    settings = Settings(model_dir=tmp_path, model_control="explicit", admin_key="k" * 16)
    async with serve(settings) as service:
        message = await error(service, "/clasify", {}, status=404)
    listed = message.split("the endpoints are ")[1].split(";")[0].split(", ")
    assert {"/classify", "/embed", "/models", "/health", "/metrics"} <= set(listed)
    assert not [p for p in listed if "{" in p or p.startswith("/v2")], listed
    assert message.endswith("the Open Inference Protocol is under /v2 (see /docs)")
