"""POST /classify: texts or text pairs -> labels with scores, best first."""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service.routes._shape import ERRORS, answer, chars
from service.routes.deps import InferenceDep
from service.schemas import ClassifyRequest, ClassifyResponse
from service.tasks import classify

router = APIRouter(tags=["classification"])


@router.post("/classify", response_model=ClassifyResponse, responses=ERRORS)
async def classify_texts(body: ClassifyRequest, run: InferenceDep) -> JSONResponse:
    """One list of `{label, score}` per input (top_k of them; null = all labels)."""
    model = run.use("classification", body.model)
    package = model.package
    single = not isinstance(body.inputs, list)
    inputs: list[str | tuple[str, str]] = (
        [body.inputs] if isinstance(body.inputs, str) else body.inputs
    )
    run.check_sizes(inputs)
    prepared = await run.tokenize(
        lambda: classify.encode_pre(model.tokenizer, inputs, package.max_seq_length, body.truncate),
        chars(inputs),
    )
    run.count(truncated=prepared.truncated)
    outputs = await run.run(prepared.sequences)
    results = await run.postprocess(
        lambda: classify.encode_post(
            np.stack([out["logits"] for out in outputs]),
            package.labels or [],
            package.problem_type or "single_label",
            body.function_to_apply,
            body.top_k,
        ),
    )
    return answer(results, single)
