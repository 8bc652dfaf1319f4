"""``/api/v1/tokens``: an admin makes, lists and revokes access tokens without a shell on the
server (what ``trainvitals token`` does with the database at hand).

An admin governs the tokens of its project: an admin of every project (``*``) all of them, an
admin of one project that project's tokens only, and it may make no token that sees more than
it does (another project, every project, or the ``metrics`` role, which is of every project).
A token it does not govern is answered as if there were none (404). A new token's secret is in
the answer that makes it and nowhere else: never listed, never logged, not cached.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from trainvitals.server.answers import (
    API_ERRORS,
    TOKEN_CONFLICT,
    NewTokenAnswer,
    TokenAnswer,
    TokensAnswer,
)
from trainvitals.server.auth import Admin
from trainvitals.server.deps import StateDep, StoreDep
from trainvitals.server.errors import StrictJSONRoute
from trainvitals.server.routes.runs import VISIBLE
from trainvitals.server.schemas import Name
from trainvitals.server.storage.tokens import (
    ALL_PROJECTS,
    Order,
    Principal,
    Revoked,
    Role,
    TokenInfo,
    token_id_of,
)
from trainvitals.server.store import Store

log = logging.getLogger("trainvitals.server")
router = APIRouter(prefix="/api/v1", responses=API_ERRORS, route_class=StrictJSONRoute)

#: Live tokens one project may hold (``*`` counts as one project): each token has caps of its
#: own (connections, runs a minute, bytes a day), and a project's admin holds at most this
#: many tokens' worth.
MAX_LIVE_TOKENS = 100
#: Tokens made for one project in a day (revoked ones, and the command's, included): revoked
#: tokens are kept as a record, and making and revoking in a loop must not grow the database
#: freely.
MAX_MADE_A_DAY = 200
DAY = 86_400.0
#: A token's id, as ``TokenStore.create`` makes it.
TokenId = Annotated[str, Path(pattern=r"^[0-9a-f]{12}$")]


class TokenRequest(BaseModel):
    """``POST /api/v1/tokens``."""

    model_config = ConfigDict(extra="forbid")

    #: Who or what will use it, as lists show it (say whose it is: ``alice's laptop``).
    name: str = Field(min_length=1, max_length=200, pattern=VISIBLE)
    #: The project it sees (as agents name it in their ``hello``), or ``*`` for every project.
    project: Name
    role: Role


def _answer(info: TokenInfo, who: Principal) -> TokenAnswer:
    return {
        "id": info.id,
        "name": info.name,
        "project": info.project,
        "role": info.role.value,
        "created_at": info.created_at,
        "revoked_at": info.revoked_at,
        "last_used_at": info.last_used_at,
        "current": info.id == who.token_id,
    }


def _governed(store: Store, who: Principal, token_id: str) -> TokenInfo:
    """The token, when ``who`` governs it (else a 404, as if there were none)."""
    info = store.tokens.get(token_id)
    if info is None or not who.may(Role.ADMIN, info.project):
        raise HTTPException(404, f"No token with id {token_id!r}")
    return info


def _manager(who: Admin, state: StateDep) -> Principal:
    # Without auth every request is an admin of every project: any local user or process
    # could make tokens that open a team's server sharing this database.
    if not state.settings.auth_required:
        raise HTTPException(
            403,
            "this server runs without auth: tokens are managed with 'trainvitals token', or "
            "here once the server requires them (serve --auth required)",
        )
    return who


#: An admin, on a server that requires tokens.
Manager = Annotated[Principal, Depends(_manager)]


@router.get("/tokens")
def list_tokens(
    who: Manager,
    store: StoreDep,
    revoked: Revoked = "include",
    order: Order = "made",
    limit: Annotated[int | None, Query(ge=1, le=1000)] = None,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
) -> TokensAnswer:
    """The tokens this admin governs in the order they were made (``order=newest``: the
    newest first; ``order=revoked``: the latest revoked first, then the live ones, newest
    first), revoked ones too unless ``revoked`` says ``hide`` (or ``only``), all of them or
    ``limit`` from ``offset``; with how many match, and how many are live, revoked, and tried
    after their revocation."""
    listed = store.tokens.list(
        who.projects, revoked=revoked, limit=limit, offset=offset, order=order
    )
    count = store.tokens.count(who.projects)
    total = {"include": count.live + count.revoked, "hide": count.live, "only": count.revoked}
    return {
        "tokens": [_answer(info, who) for info in listed],
        "total": total[revoked],
        "live": count.live,
        "revoked": count.revoked,
        "tried_after_revoke": count.tried_after_revoke,
    }


@router.post("/tokens", status_code=201, responses=TOKEN_CONFLICT)
def create_token(
    body: TokenRequest, who: Manager, store: StoreDep, response: Response
) -> NewTokenAnswer:
    """Make a token; the answer holds it, the only time it is shown."""
    if not who.may(Role.ADMIN, body.project):  # another project, or every project
        raise HTTPException(
            403, f"an admin of project {who.projects!r} makes tokens of that project only"
        )
    if body.role is Role.METRICS and body.project != ALL_PROJECTS:
        # A refusal, not a malformed request: the schema cannot say it.
        raise HTTPException(403, "the metrics role is of every project only (project '*')")
    if store.tokens.live_count(body.project) >= MAX_LIVE_TOKENS:
        raise HTTPException(
            409, f"project {body.project!r} has {MAX_LIVE_TOKENS} live tokens: revoke some first"
        )
    if store.tokens.made_since(body.project, time.time() - DAY) >= MAX_MADE_A_DAY:
        raise HTTPException(
            409, f"project {body.project!r} had {MAX_MADE_A_DAY} tokens made in the last day"
        )
    token = store.tokens.create(body.name, body.project, body.role.value)
    info = store.tokens.get(token_id_of(token))
    assert info is not None  # just made
    # An operator's record of who changed access, shown at the server's default log level.
    log.warning(
        "token %s (%r: %s on %r) made by token %s (%r)",
        info.id, info.name, info.role.value, info.project, who.token_id, who.name,
    )  # fmt: skip
    response.headers["Cache-Control"] = "no-store"
    return {**_answer(info, who), "token": token}


@router.delete("/tokens/{token_id}", responses=TOKEN_CONFLICT)
async def revoke_token(token_id: TokenId, who: Manager, state: StateDep) -> TokenAnswer:
    """Revoke a token: its browser sessions end, and its websockets open on any replica
    close (1008), so that an agent or a page using it is cut off now. Revoking one already
    revoked changes nothing but closes any of its websockets still open (one revoked by
    ``trainvitals token revoke``). The last live admin token of every project is kept (409),
    so that the server is never left without one."""
    store = state.store
    info = await asyncio.to_thread(_governed, store, who, token_id)
    if info.revoked_at is None:
        done = await asyncio.to_thread(store.tokens.revoke, token_id, keep_last_admin=True)
        info = await asyncio.to_thread(_governed, store, who, token_id)
        if not done and info.revoked_at is None:
            raise HTTPException(
                409,
                "this is the last live admin token of every project: make another first "
                "(trainvitals token create --project '*' --role admin)",
            )
        if done:
            log.warning(
                "token %s (%r: %s on %r) revoked by token %s (%r)",
                info.id, info.name, info.role.value, info.project, who.token_id, who.name,
            )  # fmt: skip
    state.hub.token_revoked(token_id)
    return _answer(info, who)
