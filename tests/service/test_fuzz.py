"""Schema fuzzing: schemathesis generates requests for every operation of the OpenAPI document,
valid ones (positive) and ones that break the schema (negative), and sends them to a real
uvicorn server with a tiny package of each task. No answer may be a 5xx, every answer must
conform to the document (status declared, content type, body schema), and a request that breaks
the schema must be refused with a 4xx.

Bounded for CI (FUZZ_EXAMPLES per operation and mode, 50 by default) and reproducible
(derandomized); for a deeper run: FUZZ_EXAMPLES=1000 pytest tests/service/test_fuzz.py -s.

Not checked: that every schema-valid request is accepted. Limits that only the settings know
(max_client_batch_size, max_text_chars, the model window with truncate=false) and model names
refuse some schema-valid requests with their documented 413, 422 or 404.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import hypothesis
import pytest
import requests
import schemathesis

from service.app import create_app
from service.settings import Settings
from tests.service.conftest import LiveServer, all_tasks

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "50"))
CONFIG = schemathesis.Config.from_dict(
    {
        "checks": {
            "positive_data_acceptance": {"enabled": False},  # see the module docstring
            # a request over the limits is refused with 413 before anything else is checked
            "negative_data_rejection": {"expected-statuses": ["4xx"]},
        }
    }
)
# The routes do not depend on the settings: the document of a default app is the served one.
SCHEMA = schemathesis.openapi.from_dict(create_app(Settings()).openapi(), config=CONFIG)
OPERATIONS = {op.label: op for op in (result.ok() for result in SCHEMA.get_all_operations())}
CASES = [
    (label, mode)
    for label, op in OPERATIONS.items()
    for mode in ("positive", "negative")
    if mode == "positive" or op.body
]
TALLY: Counter[tuple[str, int]] = Counter()  # (operation, status) -> requests


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, make_package: Callable[..., Path]
) -> Iterator[LiveServer]:
    models = all_tasks(tmp_path_factory.mktemp("fuzz") / "models", make_package)
    # small limits, so that generated requests reach them (and inference stays cheap)
    settings = Settings(
        model_dir=models, max_client_batch_size=8, max_text_chars=2000, payload_limit=100_000
    )
    server = LiveServer(create_app(settings)).start()
    yield server
    server.stop()
    statuses = Counter(status for (_, status) in TALLY.elements())
    server_errors = sum(n for status, n in statuses.items() if status >= 500)
    print(
        f"\nfuzzed {sum(statuses.values())} requests over {len(OPERATIONS)} operations: "
        f"{dict(sorted(statuses.items()))}; 5xx: {server_errors}"
    )


@pytest.mark.parametrize(("label", "mode"), CASES, ids=[f"{lb} {m}" for lb, m in CASES])
def test_every_answer_is_a_documented_non_5xx(server: LiveServer, label: str, mode: str) -> None:
    operation = OPERATIONS[label]
    session = requests.Session()
    generation = schemathesis.GenerationMode(mode)

    @hypothesis.settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate, hypothesis.Phase.shrink],
    )
    @hypothesis.given(case=operation.as_strategy(generation_mode=generation))
    def fuzz(case: schemathesis.Case) -> None:
        response = case.call(base_url=server.url, session=session, timeout=30)
        TALLY[label, response.status_code] += 1
        case.validate_response(response)

    fuzz()
