"""The OpenAPI page at ``/docs``, served with no request leaving the server (design §17).

FastAPI's default page loads Swagger UI's script and CSS from a CDN, so it stays blank offline.
Here the Swagger UI files come from the ``swagger-ui-bundle-v2`` package (Swagger UI 5, which
renders the OpenAPI 3.1 document FastAPI writes; Apache-2.0, its licence ships in the package),
mounted at ``/docs-assets``, and ``/docs`` is FastAPI's own page pointed at them. ReDoc (also
CDN-only) is not served.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.requests import Request

ASSETS = "/docs-assets"


def serve_docs_offline(app: FastAPI) -> None:
    """Serve ``/docs`` (Swagger UI) from files in the installed package; ``app`` must have been
    made with ``docs_url=None, redoc_url=None``. Raises ImportError naming the package when the
    ``serve`` extra is not installed."""
    from swagger_ui_bundle import swagger_ui_path

    app.mount(ASSETS, StaticFiles(directory=swagger_ui_path), name="docs-assets")

    def docs(request: Request) -> HTMLResponse:
        """Swagger UI over ``/openapi.json``, every asset from this server."""
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} — API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
        )

    # a plain route, as FastAPI's own /docs: the token middleware guards it (design §16)
    app.add_route("/docs", docs, include_in_schema=False)
