"""The dashboard: static files of ``trainvitals.web`` and the plotly.js that ships with the
``plotly`` package, so the dashboard works on clusters with no internet."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter, FastAPI, HTTPException
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse

from trainvitals.server.auth import Reader
from trainvitals.server.deps import StateDep
from trainvitals.server.errors import RETRY_AFTER
from trainvitals.server.writer import WriterState

router = APIRouter()

WEB_DIR = Path(str(resources.files("trainvitals.web")))


def plotly_js() -> Path:
    return Path(str(resources.files("plotly"))) / "package_data" / "plotly.min.js"


@router.get("/", include_in_schema=False)
def index() -> FileResponse:
    return FileResponse(WEB_DIR / "index.html", headers={"Cache-Control": "no-cache"})


@router.get("/static/vendor/plotly.min.js", include_in_schema=False)
def plotly() -> FileResponse:
    path = plotly_js()
    if not path.is_file():
        raise HTTPException(500, "plotly.min.js is missing: reinstall with 'trainvitals[server]'")
    return FileResponse(
        path, media_type="text/javascript", headers={"Cache-Control": "public, max-age=86400"}
    )


def guarded_docs(app: FastAPI) -> None:
    """Serve ``/openapi.json``, ``/docs`` and ``/redoc`` to a token (or session) with role
    ``read`` only: with auth required, the API's description is not for anyone who reaches
    the port."""

    @app.get("/openapi.json", include_in_schema=False)
    def openapi(who: Reader) -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False)
    def swagger(who: Reader) -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - API")

    @app.get("/redoc", include_in_schema=False)
    def redoc(who: Reader) -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title=f"{app.title} - API")


@router.get("/healthz", responses={503: {"description": "the database cannot store now"}})
def healthz(state: StateDep) -> JSONResponse:
    """``{"status": "ok", "writer": "ok"}`` while the server stores what it receives; 503 with
    ``"status": "unavailable"`` while its database cannot (the writer retrying a failed
    transaction, or refusing writes until the database answers), so that a load balancer or
    a Kubernetes readiness probe sends agents elsewhere. No token needed; no detail of the
    database (docs/operations.md#health)."""
    writer = state.writer.state
    if writer is WriterState.OK:
        return JSONResponse({"status": "ok", "writer": writer.name.lower()})
    return JSONResponse(
        {"status": "unavailable", "writer": writer.name.lower()},
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER), "Cache-Control": "no-store"},
    )
