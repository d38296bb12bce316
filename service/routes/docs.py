"""GET /openapi.json, /docs (Swagger UI), /redoc and the pages' scripts, styles and icon, all
served by the service itself: the pages work where no CDN can be reached (FastAPI's own pages
load them from cdn.jsdelivr.net). The files come from the `fastapi-offline` package (MIT; it
ships Swagger UI 5, Apache-2.0, and ReDoc 2, MIT), read from its folder, never imported.

Behind the API key (when one is set) unless docs_public: a browser cannot send the key, so
an operator who wants the pages open to browsers says so.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse

from service.routes.deps import require_api_key

# name -> media type: the only files served from ASSETS_DIR (a name is looked up, never joined)
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
    "favicon.png": "image/png",
}
ASSETS_DIR = Path(str(files("fastapi_offline") / "static"))
ASSETS_URL = "/docs/assets"


async def _docs_key(request: Request) -> None:
    if not request.app.state.settings.docs_public:
        require_api_key(request)


router = APIRouter(include_in_schema=False, dependencies=[Depends(_docs_key)])


@router.get("/openapi.json")
async def openapi(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "")
    return get_swagger_ui_html(
        openapi_url=f"{root}/openapi.json",
        title=f"{request.app.title} - Swagger UI",
        swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
        swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
    )


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "")
    return get_redoc_html(
        openapi_url=f"{root}/openapi.json",
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
        redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
        with_google_fonts=False,  # its fonts are another CDN; the page falls back to the system's
    )


@router.get(ASSETS_URL + "/{name}")
async def asset(name: str) -> FileResponse:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise HTTPException(404, f"no docs asset {name!r}; there are {', '.join(ASSETS)}")
    # a day: the files change only with the fastapi-offline version
    headers = {"Cache-Control": "public, max-age=86400"}
    return FileResponse(ASSETS_DIR / name, media_type=media_type, headers=headers)
