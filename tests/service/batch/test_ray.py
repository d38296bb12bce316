"""The engine as a Ray Data stage on a local Ray: `Predictor` in a pool of two actors, as its
docstring shows it, over a small Parquet file, answers every row as the HTTP server does; and
`python -m service.batch ... --ray` writes the same folder as the single-process command.
Marked `ray` (`make test-ray`, which installs the extra): Ray is heavy and slow to start."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from service.batch.__main__ import main
from service.settings import Settings
from tests.service.batch.test_parity import close
from tests.service.conftest import serve

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.anyio]

TEXTS = [
    "john lives in paris and mary in rome",
    "the film was good",
    "",
    "Café naïve 🙂 São Paulo, and New-York's mayor (2024): 3.5%",
    "wonderful " * 40,
]
ROWS = 300


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    # 2 actors x 1 CPU, and one CPU for Ray Data's read tasks (see ray_stage.run_on_ray)
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True
    context.enable_progress_bars = False
    yield
    ray.shutdown()


@pytest.fixture
def files(tmp_path: Path, make_package: Callable[..., Path]) -> tuple[Path, Path, list]:
    models = tmp_path / "models"
    make_package(models, "token-classification")
    texts = [
        f"{TEXTS[i % len(TEXTS)]} {i}" if i % 7 else TEXTS[i % len(TEXTS)] for i in range(ROWS)
    ]
    texts[11] = None  # a bad row: its error, not an answer
    source = tmp_path / "small.parquet"
    pq.write_table(pa.table({"id": list(range(ROWS)), "sentence": texts}), source)
    return models, source, texts


async def test_two_actors_answer_as_the_http_server(local_ray: None, files: tuple) -> None:
    from service.batch.ray_stage import Predictor

    models, source, texts = files
    options = {"aggregation_strategy": "first"}
    ds = ray.data.read_parquet(str(source)).repartition(target_num_rows_per_block=64)
    ds = ds.map_batches(
        Predictor,
        fn_constructor_kwargs={
            "task": "ner",
            "model_dir": str(models),
            "model": "conll",
            "columns": {"text": "sentence"},
            "options": options,
            "settings": {"intra_op_threads": 1},
        },  # fmt: skip
        compute=ray.data.ActorPoolStrategy(size=2),
        num_cpus=1,
        batch_size=64,
        batch_format="pyarrow",
    )
    table = pa.concat_tables(list(ds.iter_batches(batch_format="pyarrow", batch_size=None)))
    assert table["id"].to_pylist() == list(range(ROWS))  # in input order
    assert table["error"].to_pylist()[11] == "text is null"
    assert table["error_type"].to_pylist()[11] == "validation"
    good = [i for i in range(ROWS) if texts[i] is not None]
    async with serve(
        Settings(model_dir=models, intra_op_threads=1, max_client_batch_size=ROWS)
    ) as served:
        body = {"inputs": [texts[i] for i in good], "model": "conll", **options}
        response = await served.client.post("/ner", json=body)
        assert response.status_code == 200, response.text
    close([table["entities"].to_pylist()[i] for i in good], response.json())


def test_the_ray_mode_writes_what_the_single_process_command_writes(
    local_ray: None, files: tuple, tmp_path: Path
) -> None:
    models, source, _ = files
    args = ["ner", "--model-dir", str(models), "--input", str(source), "--text-column",
            "sentence", "--keep", "id", "--part-rows", "100", "--intra-op-threads", "1", "--quiet"]  # fmt: skip
    assert main([*args, "--output", str(tmp_path / "one")]) == 0
    assert main([*args, "--output", str(tmp_path / "ray"), "--ray", "--ray-actors", "2"]) == 0
    one, on_ray = pq.read_table(tmp_path / "one"), pq.read_table(tmp_path / "ray")
    assert on_ray.schema == one.schema and on_ray["row"].equals(one["row"])
    close(on_ray.to_pylist(), one.to_pylist())  # Ray's batches are cut otherwise: within 1e-5
    assert (tmp_path / "ray" / "_errors.jsonl").read_text() == (
        tmp_path / "one" / "_errors.jsonl"
    ).read_text()
