"""HTTP routes, one APIRouter per resource; each route only parses, calls a task module's
`encode_pre`, runs the rows through the batcher, calls `encode_post`, and shapes the answer.

The order of ROUTERS is the order of the OpenAPI page.
"""

from __future__ import annotations

from service.routes import classify, embed, models, ner, probes, qa
from service.routes import metrics as metrics_route

ROUTERS = [
    classify.router,
    ner.router,
    qa.router,
    embed.router,
    models.router,
    probes.router,
    metrics_route.router,
]
