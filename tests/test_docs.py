"""The generated parts of the docs site (docs/gen_api.py, docs/gen_results.py): each page's
tables are made from what they describe, and a table that cannot be made fails here, in
`make test`, before `make docs` does. The examples of the pages are tests/test_readme.py's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from docs import gen_api, gen_results
from tests.conftest import REPO

PAGES = sorted((REPO / "docs").glob("*.md"))
DIRECTIVE = re.compile(r"^\s*<!-- (results|reference): .* -->$", re.M)


def test_the_pages_ask_for_tables():
    asked = [m.group(0).strip() for p in PAGES for m in DIRECTIVE.finditer(p.read_text())]
    assert "<!-- reference: settings -->" in asked
    assert "<!-- results: serving_cpu -->" in asked
    assert len(asked) >= 12


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_table_a_page_asks_for_is_made(page: Path):
    made = gen_results.expand(gen_api.expand(page.read_text()))
    assert not DIRECTIVE.search(made), "a directive was left in the page"


def test_the_serving_summary_is_the_runs():
    """The first rows as the README showed them by hand before the table was generated."""
    table = gen_results.serving_cpu().markdown()
    assert "| MiniLM (/embed) | fp32 | 277 | 174 (0.63) | 2.87 | 8.3 ms (5.4) |" in table
    assert "| BERT-base (/classify) | int8 | 100 | 77 (0.77) | 6.64 | 16.1 ms (16.7) |" in table
    assert "[serve-minilm-qa.md](benchmarks/results/serve-minilm-qa.md)" in table


def test_a_missing_result_fails_the_table():
    with pytest.raises(FileNotFoundError, match="no-such-run.md"):
        gen_results.expand("<!-- results: no-such-run.md 1 -->\n")
    with pytest.raises(ValueError, match="has 1 tables, not 3"):
        gen_results.md_table("finetune_quality.md", 3)
    with pytest.raises(KeyError, match="no results table"):
        gen_results.expand("<!-- results: no_such_summary -->\n")


def test_a_table_inside_a_list_item_stays_in_it():
    made = gen_results.expand("- item\n\n    <!-- results: finetune_speed -->\n")
    assert "\n    | batches | fp32 | bf16 |\n" in made


def test_the_settings_tables_hold_every_setting():
    from service.settings import Settings

    text = gen_api.settings()
    for name in Settings.model_fields:
        assert f"| `BERT_HEADS_{name.upper()}` | `--{name.replace('_', '-')}` |" in text


def test_the_metrics_table_holds_every_series():
    text = gen_api.metrics()
    for series in ("bert_heads_requests_total", "bert_heads_queue_depth", "bert_heads_model_info"):
        assert f"| `{series}` |" in text
    assert "`model`, `task`, `endpoint`, `status`" in text


def test_the_api_reference_has_every_route():
    text = gen_api.api()
    for path, ops in gen_api.openapi()["paths"].items():
        for method in ops:
            assert f"### `{method.upper()} {path}`" in text
    assert "| `top_k` | integer (1-10000) or null | `1` |" in text  # ClassifyRequest's field
