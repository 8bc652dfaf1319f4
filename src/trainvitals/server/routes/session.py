"""``/api/v1/session``: a browser signs in once with a token and gets a session cookie.

The cookie is HttpOnly (no script reads it), SameSite=Strict (no other site's page sends it)
and Secure when the server is reached over HTTPS. The token itself is never kept by the page.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, HTTPException, Request, Response
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from trainvitals.server.answers import API_ERRORS
from trainvitals.server.auth import SESSION_COOKIE, PrincipalDep, session_key
from trainvitals.server.deps import StateDep
from trainvitals.server.errors import StrictJSONRoute
from trainvitals.server.storage.tokens import Principal, Role

router = APIRouter(prefix="/api/v1", responses=API_ERRORS, route_class=StrictJSONRoute)


class SignIn(BaseModel):
    token: str = Field(min_length=1, max_length=200)


class Identity(TypedDict):
    """Who the session or token speaks for."""

    name: str
    project: str
    role: str
    auth: bool


def _identity(who: Principal, auth: bool) -> Identity:
    return {"name": who.name, "project": who.project, "role": who.role.value, "auth": auth}


@router.post("/session")
def sign_in(body: SignIn, request: Request, response: Response, state: StateDep) -> Identity:
    """Trade a token for a session cookie."""
    who = state.store.tokens.verify(body.token)
    if who is None:
        raise HTTPException(401, "unknown or revoked token")
    if not who.may(Role.READ):  # an agent's or a scraper's: every page would be refused
        raise HTTPException(
            403,
            f"a token with role {who.role} cannot use the dashboard: sign in with a read "
            "or admin token",
        )
    secret = state.store.tokens.open_session(who, state.settings.session_ttl)
    response.set_cookie(
        SESSION_COOKIE,
        secret,
        max_age=int(state.settings.session_ttl),
        httponly=True,
        samesite="strict",
        # Behind a proxy that ends TLS, the request itself may be plain http: the public
        # URL says where browsers are.
        secure=request.url.scheme == "https"
        or (state.settings.public_url or "").lower().startswith("https://"),
        path="/",
    )
    return _identity(who, True)


@router.get("/session")
def whoami(who: PrincipalDep, state: StateDep) -> Identity:
    """Who this request speaks for (401 when nobody: the page then asks for a token)."""
    return _identity(who, state.settings.auth_required)


@router.delete("/session")
async def sign_out(request: Request, response: Response, state: StateDep) -> dict[str, bool]:
    """End this browser's session: its cookie, and its live streams on every replica (on
    the event loop, where their closes are made)."""
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie:
        await asyncio.to_thread(state.store.tokens.close_session, cookie)
        session = session_key(request)
        if session is not None:  # its live stream closes, on every replica
            state.hub.token_revoked(session)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return {"signed_out": True}
