"""POST /ner: texts -> entities with character offsets; long texts are windowed, never cut."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service.errors import InputError
from service.routes._shape import ERRORS, answer, as_list, chars
from service.routes.deps import InferenceDep
from service.schemas import NerRequest, NerResponse
from service.tasks import ner

router = APIRouter(tags=["token classification"])


@router.post("/ner", response_model=NerResponse, responses=ERRORS)
async def recognize_entities(body: NerRequest, run: InferenceDep) -> JSONResponse:
    """Per input a list of `{entity_group, score, word, start, end}` (`word` is
    `text[start:end]`); aggregation_strategy "none" gives one entry per token."""
    model = run.use("token-classification", body.model)
    package = model.package
    texts, single = as_list(body.inputs)
    run.check_sizes(texts)
    room = package.max_seq_length - 2
    stride = room // 4 if body.stride is None else body.stride
    if stride >= room:
        raise InputError(f"stride ({stride}) must be smaller than the window's {room} text tokens")
    prepared = await run.tokenize(
        lambda: [ner.encode_pre(model.tokenizer, t, package.max_seq_length, stride) for t in texts],
        chars(texts),
    )
    run.count(windowed=sum(p.windowed for p in prepared))
    outputs = await run.run([row for p in prepared for row in p.sequences])

    def post() -> list[list[dict]]:
        results, at = [], 0
        for p in prepared:
            n = len(p.windows)
            labels = package.labels or []
            results.append(
                ner.encode_post(
                    p, outputs[at : at + n], labels, body.aggregation_strategy, body.ignore_labels
                )
            )
            at += n
        return results

    return answer(await run.postprocess(post), single)
