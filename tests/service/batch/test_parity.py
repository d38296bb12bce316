"""`python -m service.batch` answers every row as the HTTP endpoint answers the same input with
the same options, for every task the server runs, on real tiny packages through real ONNX
Runtime: the Parquet row read back equals the endpoint's JSON (scores within 1e-5: a row's
batch neighbours differ between the two doors), in input order, whichever order the rows ran.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from heads.tasks import TaskOptions, tokenize
from service.batch.run import Plan, run
from service.batch.tasks import TASKS
from service.settings import Settings
from tests.families import family_checkpoint, family_package
from tests.service.conftest import TASKS as BASE_TASKS
from tests.service.conftest import Service, serve

pytestmark = pytest.mark.anyio
pytest.importorskip("transformers")

TEXTS = [
    "the film was good",
    "johnsons parisians lived brilliantly in kyoto with maryanne",
    "john lives in paris and mary in rome",
    "",
    "Café naïve 🙂 São Paulo, and New-York's mayor (2024): 3.5%",
    "paris " * 40,  # longer than the window: truncated, windowed
    "a",
]
PAIRS = [("who lives in paris ?", "john lives in paris and mary in rome"),
         ("where does mary live ?", "mary lives in rome and works for the bank in london"),
         ("what ?", "the film was good " * 12)]  # fmt: skip
NLI = ["entailment", "neutral", "contradiction"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, make_package: Callable[..., Path]) -> Path:
    """One package per task: the service tests' four, and the masked-LM, NLI and cross-encoder
    packages of the HTTP tests of those endpoints."""
    from training.export import export_package

    root = tmp_path_factory.mktemp("batch-parity") / "models"
    root.mkdir()
    for task in BASE_TASKS:
        make_package(root, task)
    (root / "splade").symlink_to(family_package("bert", "embedding", pooling="splade"))
    (root / "fill").symlink_to(family_package("bert", "fill-mask"))
    nli = family_checkpoint("bert", "classification", labels=NLI, seed=1)
    export_package(nli, "classification", root / "nli", max_seq_length=48, verbose=False)
    cross = family_checkpoint("bert", "classification", labels=["score"])
    export_package(cross, "classification", root / "ce", max_seq_length=64, verbose=False)
    return root


@pytest.fixture(scope="module")
async def served(models: Path) -> AsyncIterator[Service]:
    async with serve(Settings(model_dir=models, intra_op_threads=1)) as s:
        yield s


def close(ours: Any, theirs: Any, where: str = "answer") -> None:
    """Equal, floats within 1e-5; a struct field that is null in Arrow may be absent in JSON."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict), where
        for key in ours.keys() | theirs.keys():
            close(ours.get(key), theirs.get(key), f"{where}.{key}")
    elif isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            close(a, b, f"{where}[{i}]")
    elif isinstance(theirs, float) and not isinstance(ours, str):
        assert math.isclose(ours, theirs, rel_tol=1e-5, abs_tol=1e-5), (where, ours, theirs)
    else:
        assert ours == theirs, (where, ours, theirs)


async def batch(
    models: Path, tmp_path: Path, task: str, model: str, columns: dict[str, list[Any]],
    options: dict[str, Any] | None = None,
) -> list[Any]:  # fmt: skip
    """The answer column of a batch run over `columns` (role -> values), in row order."""
    spec = TASKS[task]
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({f"c_{role}": values for role, values in columns.items()}), source)
    plan = Plan(spec, spec.options(options or {}), source, tmp_path / "out",
                {role: f"c_{role}" for role in columns}, part_rows=3, model=model,
                progress=False)  # fmt: skip
    summary = await run(plan, Settings(model_dir=models, intra_op_threads=1))
    assert summary.bad == 0, (tmp_path / "out" / "_errors.jsonl").read_text()
    table = pq.read_table(tmp_path / "out")
    assert table["row"].to_pylist() == list(range(len(next(iter(columns.values())))))
    return table[spec.output].to_pylist()


async def http(served: Service, path: str, body: dict[str, Any]) -> Any:
    response = await served.client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("options", [{}, {"top_k": None, "function_to_apply": "sigmoid"}])
async def test_classify(models: Path, served: Service, tmp_path: Path, options: dict) -> None:
    ours = await batch(models, tmp_path, "classify", "sst2", {"text": TEXTS}, options)
    close(ours, await http(served, "/classify", {"inputs": TEXTS, "model": "sst2", **options}))


async def test_classify_pairs(models: Path, served: Service, tmp_path: Path) -> None:
    columns = {"text": [q for q, _ in PAIRS], "pair": [c for _, c in PAIRS]}
    ours = await batch(models, tmp_path, "classify", "sst2", columns, {"top_k": 2})
    body = {"inputs": [list(p) for p in PAIRS], "model": "sst2", "top_k": 2}
    close(ours, await http(served, "/classify", body))


@pytest.mark.parametrize("options", [{}, {"aggregation_strategy": "none"},
                                     {"aggregation_strategy": "first", "stride": 4}])  # fmt: skip
async def test_ner(models: Path, served: Service, tmp_path: Path, options: dict) -> None:
    ours = await batch(models, tmp_path, "ner", "conll", {"text": TEXTS}, options)
    close(ours, await http(served, "/ner", {"inputs": TEXTS, "model": "conll", **options}))


@pytest.mark.parametrize("options", [{}, {"top_k": 3, "max_answer_len": 4, "doc_stride": 8}])
async def test_qa(models: Path, served: Service, tmp_path: Path, options: dict) -> None:
    columns = {"question": [q for q, _ in PAIRS], "context": [c for _, c in PAIRS]}
    ours = await batch(models, tmp_path, "qa", "squad", columns, options)
    body = {"inputs": [{"question": q, "context": c} for q, c in PAIRS], "model": "squad"}
    close(ours, await http(served, "/qa", body | options))


@pytest.mark.parametrize("options", [{}, {"normalize": False, "dimensions": 8}])
async def test_embed(models: Path, served: Service, tmp_path: Path, options: dict) -> None:
    ours = await batch(models, tmp_path, "embed", "minilm", {"text": TEXTS}, options)
    close(ours, await http(served, "/embed", {"inputs": TEXTS, "model": "minilm", **options}))
    table = pq.read_table(tmp_path / "out")
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 8 if options else 32)


@pytest.mark.parametrize("options", [{}, {"normalize": True, "return_tokens": True}])
async def test_embed_all(models: Path, served: Service, tmp_path: Path, options: dict) -> None:
    ours = await batch(models, tmp_path, "embed_all", "minilm", {"text": TEXTS}, options)
    close(ours, await http(served, "/embed_all", {"inputs": TEXTS, "model": "minilm", **options}))
    vectors = pa.list_(pa.list_(pa.float32(), 32))  # a row's (tokens, H) in one flat buffer
    kind = pq.read_table(tmp_path / "out").schema.field("token_embeddings").type
    assert (kind.field("embeddings").type if options else kind) == vectors


async def test_embed_sparse(models: Path, served: Service, tmp_path: Path) -> None:
    options = {"return_tokens": True}
    ours = await batch(models, tmp_path, "embed_sparse", "splade", {"text": TEXTS}, options)
    body = {"inputs": TEXTS, "model": "splade", **options}
    close(ours, await http(served, "/embed_sparse", body))


async def test_fill_mask(models: Path, served: Service, tmp_path: Path) -> None:
    texts = ["Paris is the [MASK] of France.", "A [MASK] sat on the [MASK].", "[MASK] 🙂 café"]
    ours = await batch(models, tmp_path, "fill-mask", "fill", {"text": texts}, {"top_k": 3})
    theirs = await http(served, "/fill-mask", {"inputs": texts, "model": "fill", "top_k": 3})
    # one list per mask: a one-mask text's answer is its only list
    close([a if len(a) > 1 else a[0] for a in ours], theirs)


async def test_rerank(models: Path, served: Service, tmp_path: Path) -> None:
    documents = [TEXTS[:4], ["the museum opened in 1990 " * 8, "paris"], [TEXTS[4]]]
    queries = ["where does john live?", "when did it open?", "what is this?"]
    options = {"allow_single_text": True}  # a tiny cross-encoder that reads single texts
    ours = await batch(models, tmp_path, "rerank", "ce",
                       {"query": queries, "documents": documents}, options)  # fmt: skip
    for query, docs, answer in zip(queries, documents, ours, strict=True):
        body = {"query": query, "texts": docs, "model": "ce", **options}
        close(answer, await http(served, "/rerank", body))


async def test_rerank_documents_as_single_texts(models: Path, served: Service, tmp_path: Path):
    queries, docs = ["where does john live?"] * 2, ["john lives in paris", "the film was good"]
    options = {"raw_scores": True, "allow_single_text": True}
    ours = await batch(models, tmp_path, "rerank", "ce", {"query": queries, "documents": docs},
                       options)  # fmt: skip
    for query, doc, answer in zip(queries, docs, ours, strict=True):
        body = {"query": query, "texts": [doc], "model": "ce", **options}
        close(answer, await http(served, "/rerank", body))


@pytest.mark.parametrize("options", [{"candidate_labels": "sports, politics ,money"},
                                     {"candidate_labels": ["sports", "cooking"], "multi_label": True,
                                      "hypothesis_template": "Das Thema ist {}."}])  # fmt: skip
async def test_zero_shot(models: Path, served: Service, tmp_path: Path, options: dict) -> None:
    ours = await batch(models, tmp_path, "zero-shot", "nli", {"text": TEXTS}, options)
    close(ours, await http(served, "/zero-shot", {"inputs": TEXTS, "model": "nli", **options}))


def test_every_task_the_server_runs_has_a_batch_task() -> None:
    """Every task's options (heads.tasks) but tokenize's and decode's (tools, not answers)."""
    tools = {tokenize.TokenizeOptions, tokenize.DecodeOptions}
    assert {t.request.OPTIONS for t in TASKS.values()} == set(TaskOptions.__subclasses__()) - tools
