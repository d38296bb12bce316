"""POST /qa: (question, context) -> answer spans of the context; long contexts are windowed
and the best span over all windows wins."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service.routes._shape import ERRORS, answer
from service.routes.deps import InferenceDep
from service.schemas import QaInput, QaRequest, QaResponse
from service.tasks import qa

router = APIRouter(tags=["question answering"])


@router.post("/qa", response_model=QaResponse, responses=ERRORS)
async def answer_questions(body: QaRequest, run: InferenceDep) -> JSONResponse:
    """`{answer, score, start, end}` per input (a list of top_k of them when top_k > 1;
    null when the context has no valid span)."""
    model = run.use("question-answering", body.model)
    if body.inputs is None:
        assert body.question is not None and body.context is not None  # schema-checked
        items, single = [QaInput(question=body.question, context=body.context)], True
    else:
        items, single = body.inputs, False
    pairs = [(item.question, item.context) for item in items]
    run.check_sizes(pairs)
    max_seq_len = min(body.max_seq_len, model.package.max_seq_length)
    doc_stride = min(128, max_seq_len // 2) if body.doc_stride is None else body.doc_stride
    prepared = await run.tokenize(
        lambda: [qa.encode_pre(model.tokenizer, q, c, max_seq_len, doc_stride) for q, c in pairs],
        sum(len(q) + len(c) for q, c in pairs),
    )
    run.count(windowed=sum(p.windowed for p in prepared))
    outputs = await run.run([row for p in prepared for row in p.sequences])

    def post() -> list[Any]:
        results: list[Any] = []
        at = 0
        for p in prepared:
            n = len(p.windows)
            spans = qa.encode_post(
                p,
                outputs[at : at + n],
                body.top_k,
                body.max_answer_len,
                body.handle_impossible_answer,
            )
            at += n
            results.append(spans if body.top_k > 1 else (spans[0] if spans else None))
        return results

    return answer(await run.postprocess(post), single)
