"""Schema fuzzing (issue 48), CI's short run (`make fuzz`): benchmarks.fuzz's cases through
pytest, one test per operation and generation mode (and per model for the v2 infer route),
against `python -m service` on tiny packages of every task. schemathesis generates requests
the published OpenAPI document admits and requests it refuses; no answer may be a 5xx or
differ from the document, a refused request must get a 4xx, and an admitted one a 2xx unless
the server's state or a rule between fields refuses it (benchmarks.fuzz.REFUSALS).

Reproducible (seed FUZZ_SEED, 0) and bounded (FUZZ_EXAMPLES per case, 20): 2-4 minutes on
2 cores. The longer run with its tables: `python -m benchmarks.fuzz` (results/fuzz.md).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator

import pytest
import schemathesis

from benchmarks import fuzz
from service.app import create_app
from service.settings import Settings

pytestmark = pytest.mark.fuzz

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "20"))
SEED = int(os.environ.get("FUZZ_SEED", "0"))
# The cases, named before the server starts: the routes do not depend on the settings, so the
# document of a default app is the one served; the versions are only known once it is up.
IDS = [
    t.id
    for t in fuzz.targets(
        schemathesis.openapi.from_dict(create_app(Settings()).openapi()),
        dict.fromkeys(fuzz.MODELS, "?"),
    )
]
STATUSES: Counter[int | None] = Counter()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict]]:
    models = fuzz.build_models(tmp_path_factory.mktemp("fuzz") / "models")
    with fuzz.live_server(models) as url:
        found = fuzz.targets(fuzz.load_schema(url), fuzz.model_versions(url))
        yield url, {t.id: t for t in found}
    print(f"\nfuzzed {sum(STATUSES.values())} requests: {dict(STATUSES)}")


@pytest.mark.parametrize("case", IDS)
def test_every_answer_is_documented_and_every_refusal_has_a_reason(
    server: tuple[str, dict[str, fuzz.Target]], case: str
) -> None:
    url, targets = server
    outcomes = fuzz.run_target(targets[case], url, EXAMPLES, SEED)
    STATUSES.update(o.status for o in outcomes)
    failures = [
        f"{kind}: {detail}\n    {o.request}"
        for o in outcomes
        for kind, detail in o.findings
        if kind in fuzz.KINDS
    ]
    assert not failures, f"{len(failures)} of {len(outcomes)} requests:\n" + "\n".join(failures)


def test_the_cases_cover_every_operation() -> None:
    operations = set(create_app(Settings()).openapi()["paths"])
    assert {i.split(" ")[1] for i in IDS} == operations
