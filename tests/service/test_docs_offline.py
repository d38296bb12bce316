"""The docs pages work offline (issue 48): /docs (Swagger UI) and /redoc load every script,
style and icon from the service itself, never from a CDN, and the service answers each of
those URLs with the file and its content type."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.settings import Settings
from tests.service.conftest import serve

pytestmark = pytest.mark.anyio

# what a page makes the browser fetch: <script src>, <link href>, the spec's URL
REFERENCES = re.compile(r"""(?:src|href|spec-url)=["']([^"']+)["']|\burl:\s*'([^']+)'""")
CONTENT_TYPES = {
    ".js": "text/javascript",
    ".css": "text/css",
    ".png": "image/png",
    ".json": "application/json",
}


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_the_docs_pages_load_everything_from_the_service(tmp_path: Path, page: str) -> None:
    async with serve(Settings(model_dir=tmp_path), wait=False) as s:
        html = await s.client.get(page)
        assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
        urls = [a or b for a, b in REFERENCES.findall(html.text)]
        assert "/openapi.json" in urls and any(u.endswith(".js") for u in urls), urls
        assert "cdn" not in html.text and "fonts.googleapis" not in html.text
        for url in urls:
            assert url.startswith("/") and not url.startswith("//"), f"{url}: not this server"
            r = await s.client.get(url)
            assert r.status_code == 200, (url, r.text[:200])
            want = CONTENT_TYPES[Path(url).suffix]
            assert r.headers["content-type"].split(";")[0] == want, (url, r.headers)
            assert len(r.content) > 1000, url  # the file itself, not an error page
        assert (await s.client.get("/docs/assets/..%2F..%2Fsettings.py")).status_code == 404
        assert (await s.client.get("/docs/assets/nope.js")).status_code == 404
