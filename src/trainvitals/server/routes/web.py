"""The dashboard: static files of ``trainvitals.web`` and the plotly.js that ships with the
``plotly`` package, so the dashboard works on clusters with no internet."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse

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


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}
