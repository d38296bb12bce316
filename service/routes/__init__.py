"""HTTP routes, one APIRouter per resource. An inference route picks the model, builds the
task's `Job` from the request, awaits its answer once, and shapes it; windows, strides, output
names and features live in heads.tasks, the request path in service.routes.inference.

The order of ROUTERS is the order of the OpenAPI page.
"""

from __future__ import annotations

from service.routes import (
    analyze,
    classify,
    docs,
    embed,
    masked_lm,
    models,
    ner,
    probes,
    qa,
    rerank,
    tokenize,
    v2,
    zero_shot,
)
from service.routes import metrics as metrics_route
from service.routes.inference import InferenceRoute

ROUTERS = [
    classify.router,
    zero_shot.router,
    ner.router,
    qa.router,
    embed.router,
    masked_lm.router,
    rerank.router,
    analyze.router,
    tokenize.router,
    models.router,
    models.control,
    probes.router,
    metrics_route.router,
    v2.open_router,
    v2.router,
    docs.router,  # not on the page: /openapi.json, /docs, /redoc and their assets
]


def inference_routes() -> list[InferenceRoute]:
    return [r for router in ROUTERS for r in router.routes if isinstance(r, InferenceRoute)]
