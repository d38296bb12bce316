"""What `make docs` adds to docs/*.md as it builds the site (mkdocs.yml `hooks:`).

- the home page is README.md, its links into docs/ made relative to the site;
- api-reference.md is made from the service's OpenAPI schema (docs/gen_api.py);
- a `<!-- reference: settings -->` or `<!-- reference: metrics -->` line becomes that table
  (docs/gen_api.py), a `<!-- results: NAME -->` line a benchmark table (docs/gen_results.py);
- benchmarks/README.md and benchmarks/results (reports and plots) become pages under
  benchmarks/, so that a page's link to `../benchmarks/...`, which a forge follows from docs/,
  resolves on the site too (and `../README.md` is the home page);
- a code fence left open, or a closing fence with text after it, fails the build
  (docs/fences.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files, InclusionLevel

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the service, and docs/ as a namespace package

from docs import gen_api, gen_results  # noqa: E402
from docs.fences import code_blocks  # noqa: E402

BENCHMARKS = REPO / "benchmarks"


def on_files(files: Files, config: Any) -> Files:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "index.md", content=readme.replace("](docs/", "](")))
    files.append(File.generated(config, "api-reference.md", content=gen_api.api()))
    record = BENCHMARKS / "README.md"  # in the nav; the reports are reached through links
    results = BENCHMARKS / "results"
    for path in [record, *sorted(results.rglob("*.md")), *sorted(results.rglob("*.png"))]:
        inclusion = InclusionLevel.INCLUDED if path == record else InclusionLevel.NOT_IN_NAV
        where = path.relative_to(REPO).as_posix()
        files.append(File.generated(config, where, abs_src_path=str(path), inclusion=inclusion))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    code_blocks(markdown, page.file.src_uri)
    if page.file.src_uri.startswith("benchmarks/"):
        return markdown
    markdown = markdown.replace("](../benchmarks/", "](benchmarks/").replace(
        "](../README.md", "](index.md"
    )
    return gen_results.expand(gen_api.expand(markdown))
