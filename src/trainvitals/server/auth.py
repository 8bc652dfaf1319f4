"""Who a request speaks for, as FastAPI dependencies.

A request proves it with ``Authorization: Bearer <token>`` (agents, scripts) or the session
cookie a browser got by signing in with a token (``POST /api/v1/session``). Without auth
(``serve --auth off``, loopback only) every request speaks for :data:`LOCAL`, an admin of
every project, so the zero-setup local server stays zero-setup.

Routes then ask for a role (:data:`Reader`, :data:`Admin`): 403 for a role the token lacks;
a run or alert of a project the token does not see is answered as if it did not exist (404),
so a token learns nothing of other projects (:func:`check_project`).
"""

from __future__ import annotations

import hashlib
from typing import Annotated

from fastapi import Depends, HTTPException
from starlette.requests import HTTPConnection

from trainvitals.server.connections import SESSION
from trainvitals.server.deps import alert_not_found, get_state
from trainvitals.server.storage import AlertRow
from trainvitals.server.storage.tokens import ALL_PROJECTS, Principal, Role
from trainvitals.server.store import Store

SESSION_COOKIE = "tv_session"
#: Who every request is when auth is off.
LOCAL = Principal("local", "local", ALL_PROJECTS, Role.ADMIN)


def unauthenticated() -> HTTPException:
    return HTTPException(
        status_code=401,
        detail="a token is required: sign in, or send 'Authorization: Bearer <token>'",
        headers={"WWW-Authenticate": "Bearer"},
    )


def bearer(connection: HTTPConnection) -> str | None:
    header = connection.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def identify(connection: HTTPConnection) -> Principal | None:
    """The principal of a request or websocket, or None when it proves nothing."""
    state = get_state(connection)
    if not state.settings.auth_required:
        return LOCAL
    token = bearer(connection)
    if token is not None:
        return state.store.tokens.verify(token)
    cookie = connection.cookies.get(SESSION_COOKIE)
    return state.store.tokens.session(cookie) if cookie else None


def session_key(connection: HTTPConnection) -> str | None:
    """What the websockets a browser session opens are also held under (see
    :class:`~trainvitals.server.connections.OpenTokens`), so that signing out closes them; None
    for a request that proves itself with a token, or with nothing. Derived from the cookie, but
    not the digest the sessions table keeps."""
    cookie = connection.cookies.get(SESSION_COOKIE)
    if not cookie or bearer(connection) is not None:
        return None
    return SESSION + hashlib.sha256(b"live:" + cookie.encode()).hexdigest()[:32]


def principal(connection: HTTPConnection) -> Principal:
    found = identify(connection)
    if found is None:
        raise unauthenticated()
    return found


PrincipalDep = Annotated[Principal, Depends(principal)]


def _requiring(role: Role) -> object:
    """A dependency: the request's principal, which must hold ``role`` on some project."""

    def dependency(who: PrincipalDep) -> Principal:
        if not who.may(role):
            raise HTTPException(403, f"this token's role ({who.role}) may not {role} here")
        return who

    return Depends(dependency)


Reader = Annotated[Principal, _requiring(Role.READ)]
Admin = Annotated[Principal, _requiring(Role.ADMIN)]


def _scraper(who: PrincipalDep) -> Principal:
    # The metrics count every project's runs and name them: a token of one project is refused.
    if not who.may(Role.METRICS) or who.projects is not None:
        raise HTTPException(
            403, "metrics need a token of every project (--project '*') with role metrics or read"
        )
    return who


#: ``GET /metrics``: a token of every project with role ``metrics``, ``read`` or ``admin``.
Scraper = Annotated[Principal, Depends(_scraper)]


def check_project(who: Principal, role: Role, project: str, missing: HTTPException) -> None:
    """Answer ``missing`` (a 404) when ``who`` does not see ``project``, so a token learns
    nothing of other projects; 403 when it sees it without ``role``."""
    if who.project not in (ALL_PROJECTS, project):
        raise missing
    if not who.may(role, project):
        raise HTTPException(403, f"this token's role ({who.role}) may not {role} here")


class NoProject:
    """What a token asking for another project's list gets: nothing."""


NOTHING = NoProject()


def scoped(who: Principal, project: str | None) -> str | NoProject | None:
    """The project a list is filtered by: a token of one project lists that project only, and
    asking for another gives :data:`NOTHING`."""
    if who.projects is None:
        return project
    return who.projects if project in (None, who.projects) else NOTHING


def alert_for(store: Store, who: Principal, alert_id: str, role: Role) -> AlertRow:
    """The alert, when ``who`` holds ``role`` on its project (else as if there were none)."""
    alert = store.alerts.get_alert(alert_id)
    if alert is None:
        raise alert_not_found(alert_id)
    check_project(who, role, alert["project"], alert_not_found(alert_id))
    return alert
