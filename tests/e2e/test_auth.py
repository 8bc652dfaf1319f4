"""A team server: tokens per project and role, on every route and both websockets (#15)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from harness.notify import HOOK_PATH, receiving
from harness.polling import wait_for
from harness.processes import (
    ServerProcess,
    create_token,
    ingest_refusal,
    stream,
    trainvitals,
)
from trainvitals.server.store import Store


@dataclass
class Team:
    server: ServerProcess
    db: str
    admin: str
    ingest_p: str
    read_p: str
    ingest_q: str


@pytest.fixture
def team(tmp_path: Path) -> Iterator[Team]:
    db = str(tmp_path / "team.db")
    tokens = {
        "admin": create_token(db, "*", "admin", "alice"),
        "ingest_p": create_token(db, "p", "ingest", "agents-p"),
        "read_p": create_token(db, "p", "read", "viewer-p"),
        "ingest_q": create_token(db, "q", "ingest", "agents-q"),
    }
    server = ServerProcess(db, args=["--auth", "required"])
    try:
        yield Team(server, db, **tokens)
    finally:
        server.stop()


def call(server: ServerProcess, path: str, token: str | None = None,
         method: str = "GET", body: object = None) -> tuple[int, object]:  # fmt: skip
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(server.url + path, data, headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_serve_refuses_to_open_up_without_tokens(tmp_path: Path) -> None:
    db = str(tmp_path / "x.db")
    off = trainvitals("serve", "--host", "0.0.0.0", "--port", "0", "--auth", "off", "--db", db)
    assert off.returncode == 2 and "loopback address only" in off.stderr
    bare = trainvitals("serve", "--host", "0.0.0.0", "--port", "0", "--db", db)
    assert bare.returncode == 2 and "no tokens" in bare.stderr


def test_without_auth_a_request_forwarded_from_elsewhere_is_refused(server: ServerProcess) -> None:
    """Auth off speaks for an admin of every project, so it answers this machine only: a
    proxy on this machine forwarding a client from elsewhere (uvicorn takes the address from
    X-Forwarded-For, sent from loopback) is refused, the client here is not."""
    assert server.get("/api/v1/session")["auth"] is False
    request = urllib.request.Request(
        server.url + "/api/v1/session", headers={"X-Forwarded-For": "203.0.113.5"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 403
    assert "answers this machine only" in refused.value.read().decode()
    url = server.url.replace("http", "ws") + "/api/v1/live"
    with pytest.raises(InvalidStatus) as closed:
        with connect(url, additional_headers={"X-Forwarded-For": "203.0.113.5"}):
            pass
    assert closed.value.response.status_code == 403


def test_tokens_are_listed_without_secrets_and_stored_hashed(tmp_path: Path) -> None:
    db = str(tmp_path / "t.db")
    made = trainvitals("token", "create", "--db", db, "--project", "p", "--role", "read",
                       "--name", "viewer")  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert "viewer" in made.stderr and "shown only now" in made.stderr
    token = made.stdout.strip()
    assert token not in made.stderr
    listed = trainvitals("token", "list", "--db", db)
    assert "viewer" in listed.stdout and token not in listed.stdout
    # tv_<id>_<secret>; the secret is URL-safe base64, which may itself hold "_".
    prefix, token_id, secret = token.split("_", 2)
    assert prefix == "tv" and len(secret) >= 40
    with sqlite3.connect(db) as conn:
        dump = "\n".join(conn.iterdump())
    assert secret not in dump
    assert trainvitals("token", "revoke", "--db", db, token_id).returncode == 0
    assert trainvitals("token", "revoke", "--db", db, token_id).returncode == 1
    # Presented after its revocation (here to the store, as a server does): refused, and marked.
    store = Store(db)
    try:
        assert store.tokens.verify(token) is None
        assert store.tokens.uses.wait()
    finally:
        store.dispose()
    listed = trainvitals("token", "list", "--db", db)
    assert listed.stdout.splitlines()[1].endswith(" ! viewer")
    assert "1 revoked token(s) presented after the revocation, and refused" in listed.stderr


def test_the_token_command_does_not_load_the_web_application(tmp_path: Path) -> None:
    """``trainvitals token`` needs the store only: it runs where FastAPI cannot be imported
    (and so does not pay for importing it, a third of its start-up)."""
    db = str(tmp_path / "t.db")
    code = (
        "import sys; sys.modules['fastapi'] = None; from trainvitals.cli import main; "
        f"sys.exit(main(['token', 'create', '--db', {db!r}, '--project', 'p', '--role', 'read']))"
    )
    made = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("tv_") and "read@p" in made.stderr


def test_every_route_needs_a_token_but_healthz(team: Team) -> None:
    server = team.server
    assert call(server, "/healthz")[0] == 200
    for path in ("/api/v1/runs", "/api/v1/alerts", "/api/v1/rules", "/api/v1/notify/channels"):
        assert call(server, path)[0] == 401, path
        assert call(server, path, "tv_0000_forged")[0] == 401, path
    assert call(server, "/api/v1/alerts/x/silence", method="POST", body={})[0] == 401
    # The API's description too: it is a reader's, as the API is.
    for path in ("/openapi.json", "/docs", "/redoc"):
        assert call(server, path)[0] == 401, path
        assert call(server, path, team.ingest_p)[0] == 403, path
    status, spec = call(server, "/openapi.json", team.read_p)
    assert status == 200 and "/api/v1/runs" in spec["paths"]  # type: ignore[index]


def test_roles_and_projects(team: Team) -> None:
    server = team.server
    run_p = stream(server, team.ingest_p, "p")
    run_q = stream(server, team.ingest_q, "q")
    # Ingest tokens stream; they do not read.
    assert call(server, "/api/v1/runs", team.ingest_p)[0] == 403
    # A reader of p sees p, and nothing of q, not even that it exists.
    status, answer = call(server, "/api/v1/runs", team.read_p)
    assert status == 200 and [r["id"] for r in answer["runs"]] == [run_p]  # type: ignore[index]
    assert call(server, f"/api/v1/runs/{run_q}", team.read_p)[0] == 404
    assert call(server, f"/api/v1/runs/{run_q}/series", team.read_p)[0] == 404
    assert call(server, "/api/v1/runs?project=q", team.read_p)[1] == {"runs": [], "total": 0}
    # Projects, for the alerts page's filter: a token of p knows of p only.
    assert call(server, "/api/v1/projects", team.admin) == (200, {"projects": ["p", "q"]})
    assert call(server, "/api/v1/projects", team.read_p) == (200, {"projects": ["p"]})
    assert call(server, "/api/v1/projects", team.ingest_p)[0] == 403
    assert call(server, "/api/v1/projects")[0] == 401
    alerts = wait_for(
        lambda: call(server, "/api/v1/alerts", team.admin)[1]["alerts"],  # type: ignore[index]
        what="the NaN alerts",
    )
    assert {a["project"] for a in alerts} == {"p", "q"}
    _, seen = call(server, "/api/v1/alerts", team.read_p)
    assert {a["project"] for a in seen["alerts"]} == {"p"}  # type: ignore[index]
    alert_p = next(a for a in alerts if a["project"] == "p")
    # Reading is not acknowledging; an admin acknowledges, under its token's name.
    ack = f"/api/v1/alerts/{alert_p['id']}/ack"
    assert call(server, ack, team.read_p, "POST", {"by": "mallory"})[0] == 403
    status, acked = call(server, ack, team.admin, "POST", {"by": "mallory"})
    assert status == 200 and acked["acknowledged_by"] == "alice"  # type: ignore[index]


def test_an_ingest_token_sends_runs_of_its_own_project_only(team: Team) -> None:
    url = team.server.url.replace("http", "ws") + "/api/v1/ingest"
    hello = {"type": "hello", "v": 1, "run_id": "r-q", "project": "q", "name": "n",
             "started_at": 1.0}  # fmt: skip
    # Without a token, or with a token that cannot send runs: refused before the upgrade.
    for headers, status in (({}, 401), ({"Authorization": f"Bearer {team.read_p}"}, 403)):
        with pytest.raises(InvalidStatus) as refused:
            with connect(url, additional_headers=headers):
                pass
        assert refused.value.response.status_code == status
    with connect(url, additional_headers={"Authorization": f"Bearer {team.ingest_p}"}) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            ws.send(json.dumps(hello))
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    assert "may not send runs of project 'q'" in closed.value.rcvd.reason


def test_a_run_keeps_its_project_even_for_a_hello_that_holds_its_secret(team: Team) -> None:
    """An ingest token of p, given a run of q and that run's secret, cannot write into it by
    naming p in its hello: the token's project check and the run's secret are two locks, not
    one. Nor can an admin token of every project move the run."""
    url = team.server.url.replace("http", "ws") + "/api/v1/ingest"
    hello = {"type": "hello", "v": 1, "run_id": "run-of-q", "project": "q", "name": "n",
             "started_at": 1.0, "run_secret": "the-secret-of-run-of-q"}  # fmt: skip
    loss = {"loss": {"step": [1], "time": [1.0], "value": [0.5]}}
    with connect(url, additional_headers={"Authorization": f"Bearer {team.ingest_q}"}) as ws:
        ws.send(json.dumps(hello))
        assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
        ws.send(json.dumps({"type": "points", "v": 1, "seq": 1, "series": loss}))
        assert json.loads(ws.recv(timeout=10)) == {"type": "ack", "seq": 1}
    injected = {"injected": {"step": [2], "time": [2.0], "value": [1.0]}}
    for token in (team.ingest_p, team.admin):
        with connect(url, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                ws.send(json.dumps({**hello, "project": "p"}))
                ws.send(json.dumps({"type": "points", "v": 1, "seq": 2, "series": injected}))
                ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        assert "is not of project 'p'" in closed.value.rcvd.reason
    status, run = call(team.server, "/api/v1/runs/run-of-q", team.admin)
    assert status == 200 and run["project"] == "q"  # type: ignore[index]
    assert sorted(run["series"]) == ["loss"]  # type: ignore[index]


def test_a_token_of_one_project_sees_its_own_channels_and_rules_only(tmp_path: Path) -> None:
    """The channels list and the rules route told a read token of p about q: the channels
    routed to q (with q's other project names, delivery counts and last error) and q's
    overrides."""
    db = str(tmp_path / "team.db")
    admin = create_token(db, "*", "admin", "alice")
    read_p = create_token(db, "p", "read", "viewer-p")
    ingest_q = create_token(db, "q", "ingest", "agents-q")
    (tmp_path / "rules.toml").write_text("[projects.q.loss_divergence]\nenabled = false\n")
    with receiving() as receiver:
        hook = receiver.url(HOOK_PATH)
        (tmp_path / "channels.toml").write_text(
            f'[[channels]]\nname = "all"\nkind = "webhook"\nurl = "{hook}"\n'
            f'[[channels]]\nname = "p-team"\nkind = "webhook"\nurl = "{hook}"\n'
            'projects = ["p", "acquisition-x"]\n'
            f'[[channels]]\nname = "q-team"\nkind = "webhook"\nurl = "{hook}"\n'
            'projects = ["q"]\n'
        )
        env = {"TRAINVITALS_NOTIFY": str(tmp_path / "channels.toml"),
               "TRAINVITALS_RULES": str(tmp_path / "rules.toml")}  # fmt: skip
        server = ServerProcess(db, extra_env=env, args=["--auth", "required"])
        try:
            stream(server, ingest_q, "q")  # a NaN: an alert of q, to "all" and "q-team"

            def channels(token: str) -> dict[str, Any]:
                status, answer = call(server, "/api/v1/notify/channels", token)
                assert status == 200, answer
                return {c["name"]: c for c in answer["channels"]}  # type: ignore[index]

            everyone = wait_for(
                lambda: (c := channels(admin))["all"]["delivered"] == 1 and c,
                what="the alert of q delivered to 'all'",
            )
            assert everyone["q-team"]["delivered"] == 1
            assert everyone["p-team"]["projects"] == ["acquisition-x", "p"]
            seen = channels(read_p)
            assert sorted(seen) == ["all", "p-team"]
            assert seen["p-team"]["projects"] == ["p"] and seen["all"]["projects"] is None
            assert seen["all"]["delivered"] == 0  # q's alert is not p's
            assert "acquisition-x" not in json.dumps(seen) and '"q' not in json.dumps(seen)

            def divergence(token: str, project: str) -> bool:
                status, answer = call(server, f"/api/v1/rules?project={project}", token)
                assert status == 200, answer
                return bool(answer["rules"]["loss_divergence"]["enabled"])  # type: ignore[index]

            assert divergence(admin, "q") is False
            assert divergence(read_p, "q") is True  # as for a project without overrides
        finally:
            server.stop()


def test_the_live_stream_needs_a_token_and_shows_its_project_only(team: Team) -> None:
    url = team.server.url.replace("http", "ws") + "/api/v1/live"
    # Refused before the upgrade: no websocket, no frame read. An agent's token reads nothing.
    for headers, status in (({}, 401), ({"Authorization": f"Bearer {team.ingest_p}"}, 403)):
        with pytest.raises(InvalidStatus) as refused, connect(url, additional_headers=headers):
            pass
        assert refused.value.response.status_code == status
    with connect(url, additional_headers={"Authorization": f"Bearer {team.read_p}"}) as ws:
        stream(team.server, team.ingest_q, "q")
        run_p = stream(team.server, team.ingest_p, "p")
        seen: set[str] = set()

        def saw_p() -> bool:
            message = json.loads(ws.recv(timeout=10))
            if message["type"] == "runs":
                seen.update(r["project"] for r in message["runs"])
            if message["type"] == "alert":
                seen.add(message["alert"]["project"])
            return any(r == "p" for r in seen)

        wait_for(saw_p, what=f"run {run_p} on the live stream")
    assert seen == {"p"}


def test_a_browser_signs_in_once_and_a_revoked_token_ends_its_session(team: Team) -> None:
    server = team.server
    request = urllib.request.Request(
        server.url + "/api/v1/session",
        json.dumps({"token": team.read_p}).encode(),
        {"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        cookie = response.headers["Set-Cookie"]
        assert json.loads(response.read())["name"] == "viewer-p"
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert "secure" not in cookie.lower()  # plain http here: a Secure cookie would not come back
    session = cookie.split(";", 1)[0]

    def with_cookie(path: str) -> int:
        req = urllib.request.Request(server.url + path, headers={"Cookie": session})
        try:
            with urllib.request.urlopen(req, timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    assert with_cookie("/api/v1/runs") == 200
    # An agent's token opens no session: every page would refuse it.
    status, answer = call(server, "/api/v1/session", None, "POST", {"token": team.ingest_p})
    assert status == 403 and "cannot use the dashboard" in answer["detail"]  # type: ignore[index]
    token_id = team.read_p.split("_")[1]
    assert trainvitals("token", "revoke", "--db", team.db, token_id).returncode == 0
    assert with_cookie("/api/v1/runs") == 401
    assert call(server, "/api/v1/runs", team.read_p)[0] == 401


def test_signing_out_closes_the_sessions_live_stream_and_no_other(team: Team) -> None:
    """A browser signed out (a shared machine) kept its live stream open, pushing its
    project's runs and alerts, until the page went away. Signing out now closes the streams of
    that session, and no other stream of the same token."""
    request = urllib.request.Request(
        team.server.url + "/api/v1/session", json.dumps({"token": team.read_p}).encode(),
        {"Content-Type": "application/json"}, method="POST",
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as response:
        session = response.headers["Set-Cookie"].split(";", 1)[0]
    url = team.server.url.replace("http", "ws") + "/api/v1/live"
    with (
        connect(url, additional_headers={"Cookie": session}) as signed_in,
        connect(url, additional_headers={"Authorization": f"Bearer {team.read_p}"}) as script,
    ):
        assert signed_in.ping().wait(10) and script.ping().wait(10)  # both open
        out = urllib.request.Request(
            team.server.url + "/api/v1/session", headers={"Cookie": session}, method="DELETE"
        )
        with urllib.request.urlopen(out, timeout=10) as response:
            assert json.loads(response.read()) == {"signed_out": True}
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                signed_in.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        # Not "this token was revoked": another tab of the browser says its session ended.
        assert closed.value.rcvd.reason == "this browser session was signed out"
        assert script.ping().wait(10)  # the token's own stream is still open
    with pytest.raises(InvalidStatus) as refused:
        with connect(url, additional_headers={"Cookie": session}):
            pass
    assert refused.value.response.status_code == 401


def token_id(token: str) -> str:
    return token.split("_")[1]


def test_the_session_cookie_is_secure_where_browsers_use_https(tmp_path: Path) -> None:
    """Behind a proxy that ends TLS, the request the server sees may be plain http: the
    cookie is Secure when the proxy says https (X-Forwarded-Proto, which deploy/nginx.conf
    sends), or when the public URL is https."""
    db = str(tmp_path / "team.db")
    token = create_token(db, "p", "read", "viewer")

    def cookie(server: ServerProcess, headers: dict[str, str]) -> str:
        body = json.dumps({"token": token}).encode()
        headers = {"Content-Type": "application/json", **headers}
        request = urllib.request.Request(server.url + "/api/v1/session", body, headers)
        with urllib.request.urlopen(request, timeout=10) as response:
            return str(response.headers["Set-Cookie"])

    behind = ServerProcess(db, args=["--auth", "required"])
    try:
        assert "Secure" in cookie(behind, {"X-Forwarded-Proto": "https"})
        assert "Secure" not in cookie(behind, {})
    finally:
        behind.stop()
    public = ServerProcess(
        db, args=["--auth", "required", "--public-url", "https://tv.example.org"]
    )
    try:
        assert "Secure" in cookie(public, {})
    finally:
        public.stop()
    conf = (Path(__file__).parents[2] / "deploy" / "nginx.conf").read_text()
    assert "proxy_set_header X-Forwarded-Proto $scheme;" in conf


def test_an_admin_makes_lists_and_revokes_tokens_without_a_shell(team: Team) -> None:
    server = team.server
    body = {"name": "bob's laptop", "project": "p", "role": "ingest"}
    request = urllib.request.Request(
        server.url + "/api/v1/tokens",
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {team.admin}"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 201
        assert response.headers["Cache-Control"] == "no-store"  # the secret is not kept
        made = json.loads(response.read())
    token = made.pop("token")
    assert token.startswith(f"tv_{made['id']}_")
    assert made == {
        "id": made["id"], "name": "bob's laptop", "project": "p", "role": "ingest",
        "created_at": made["created_at"], "revoked_at": None, "last_used_at": None,
        "current": False,
    }  # fmt: skip
    # The token works as one made by the command: it streams runs of p, and only streams.
    before = time.time()
    run = stream(server, token, "p")

    def last_used() -> dict[str, float | None]:
        rows = call(server, "/api/v1/tokens", team.admin)[1]["tokens"]  # type: ignore[index]
        return {t["name"]: t["last_used_at"] for t in rows}

    # When each was last used, to a minute (written off the requests' path: polled): bob's as
    # it streamed, before any request of its own; the admin's; the reader's never.
    wait_for(lambda: last_used()["bob's laptop"] is not None, what="bob's token's use")
    used = last_used()
    bob = used["bob's laptop"]
    assert bob is not None and before <= bob <= time.time()
    assert used["alice"] is not None and used["viewer-p"] is None
    assert call(server, f"/api/v1/runs/{run}", team.admin)[0] == 200
    assert call(server, "/api/v1/runs", token)[0] == 403
    # Listed, never with a secret; the admin's own token is marked.
    status, listed = call(server, "/api/v1/tokens", team.admin)
    assert status == 200
    rows = listed["tokens"]  # type: ignore[index]
    assert [(t["name"], t["current"]) for t in rows] == [
        ("alice", True), ("agents-p", False), ("viewer-p", False), ("agents-q", False),
        ("bob's laptop", False),
    ]  # fmt: skip
    text = json.dumps(listed)
    for secret in (token, team.admin, team.ingest_p, team.read_p, team.ingest_q):
        assert secret.split("_", 2)[2] not in text
    # The server says who made it, and never the secret.
    made_by = f"token {made['id']} (\"bob's laptop\": ingest on 'p') made by token"
    wait_for(lambda: made_by in server.output(), what="the log line of the token made")
    assert token.split("_", 2)[2] not in server.output()
    # Revoked: it no longer streams; a second revoke changes nothing.
    status, revoked = call(server, f"/api/v1/tokens/{made['id']}", team.admin, "DELETE")
    assert status == 200 and revoked["revoked_at"] is not None  # type: ignore[index]
    assert call(server, f"/api/v1/tokens/{made['id']}", team.admin, "DELETE") == (200, revoked)
    code, reason = ingest_refusal(server, token, "p")
    assert code == 401 and reason.startswith("a token is required")
    # The command sees what the API did.
    listed_by_command = trainvitals("token", "list", "--db", team.db).stdout
    assert "bob's laptop" in listed_by_command and token not in listed_by_command
    head, *lines = listed_by_command.splitlines()
    assert head.split() == ["id", "role", "project", "created", "revoked", "last", "used", "name"]
    viewer = next(line for line in lines if line.endswith("viewer-p"))
    assert viewer.split()[-2:] == ["-", "viewer-p"]  # never used


def test_a_project_admin_governs_its_own_projects_tokens_and_no_more(team: Team) -> None:
    server = team.server
    status, lead = call(server, "/api/v1/tokens", team.admin, "POST",
                        {"name": "lead-p", "project": "p", "role": "admin"})  # fmt: skip
    assert status == 201
    admin_p = lead["token"]  # type: ignore[index]
    # It lists the tokens of p only: not the admin of every project, not q's.
    _, listed = call(server, "/api/v1/tokens", admin_p)
    assert [t["name"] for t in listed["tokens"]] == ["agents-p", "viewer-p", "lead-p"]  # type: ignore[index]
    # It makes no token that sees more than it does.
    for body, code in (
        ({"name": "x", "project": "q", "role": "read"}, 403),
        ({"name": "x", "project": "*", "role": "read"}, 403),
        ({"name": "x", "project": "p", "role": "metrics"}, 403),
    ):
        assert call(server, "/api/v1/tokens", admin_p, "POST", body)[0] == code, body
    # Another project's token, or the admin of every project's, is not there for it.
    for other in (team.ingest_q, team.admin):
        status, answer = call(server, f"/api/v1/tokens/{token_id(other)}", admin_p, "DELETE")
        assert status == 404 and answer == {"detail": f"No token with id {token_id(other)!r}"}
    assert call(server, "/api/v1/projects", team.admin)[0] == 200  # still live
    stream(server, team.ingest_q, "q")
    # Its own project's tokens it revokes.
    status, answer = call(server, f"/api/v1/tokens/{token_id(team.read_p)}", admin_p, "DELETE")
    assert status == 200 and answer["name"] == "viewer-p"  # type: ignore[index]
    assert call(server, "/api/v1/runs", team.read_p)[0] == 401
    # Readers and agents manage no tokens; nobody does without a token.
    for token in (team.ingest_p, team.ingest_q, None):
        code = 401 if token is None else 403
        assert call(server, "/api/v1/tokens", token)[0] == code
        body = {"name": "x", "project": "p", "role": "admin"}
        assert call(server, "/api/v1/tokens", token, "POST", body)[0] == code
        assert call(server, f"/api/v1/tokens/{token_id(team.admin)}", token, "DELETE")[0] == code


def test_the_last_admin_token_of_every_project_is_kept(team: Team) -> None:
    server = team.server
    mine = f"/api/v1/tokens/{token_id(team.admin)}"
    status, answer = call(server, mine, team.admin, "DELETE")
    assert status == 409 and "last live admin token" in answer["detail"]  # type: ignore[index]
    assert call(server, "/api/v1/tokens", team.admin)[0] == 200  # kept, with its sessions
    _, second = call(server, "/api/v1/tokens", team.admin, "POST",
                     {"name": "bob", "project": "*", "role": "admin"})  # fmt: skip
    other = second["token"]  # type: ignore[index]
    assert call(server, mine, team.admin, "DELETE")[0] == 200  # one may leave when another stays
    assert call(server, "/api/v1/tokens", team.admin)[0] == 401
    assert call(server, f"/api/v1/tokens/{token_id(other)}", other, "DELETE")[0] == 409


#: Token requests the server refuses (422), each for another reason.
MALFORMED_TOKEN_REQUESTS = [
    {"name": "forged\nINFO token made", "project": "p", "role": "read"},  # a forged log line
    {"name": " ", "project": "p", "role": "read"},
    {"name": "x" * 201, "project": "p", "role": "read"},
    {"name": "x", "project": "", "role": "read"},
    {"name": "x", "project": "p\r", "role": "read"},
    {"name": "x", "project": "p", "role": "root"},
    {"name": "x", "project": "p", "role": "read", "hash": "00"},
    {"name": "x", "project": "p"},
    ["x", "p", "read"],
]


def test_a_malformed_token_request_is_refused_and_makes_nothing(team: Team) -> None:
    server = team.server
    for body in MALFORMED_TOKEN_REQUESTS:
        assert call(server, "/api/v1/tokens", team.admin, "POST", body)[0] == 422, body
    _, listed = call(server, "/api/v1/tokens", team.admin)
    assert len(listed["tokens"]) == 4  # type: ignore[index]
    for bad in ("..%2Ftokens", "ZZZZZZZZZZZZ", "0" * 13, "0" * 12):
        assert call(server, f"/api/v1/tokens/{bad}", team.admin, "DELETE")[0] in (404, 422), bad


def closed_with(ws: Any) -> tuple[int, str]:
    """The code and reason ``ws`` is closed with by the server (whatever it sends first)."""
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code, closed.value.rcvd.reason


def test_a_revoked_tokens_open_websockets_are_closed_at_once(team: Team) -> None:
    server = team.server
    base = server.url.replace("http", "ws")
    made = {}
    for name, role in (("agent", "ingest"), ("page", "read")):
        status, answer = call(server, "/api/v1/tokens", team.admin, "POST",
                              {"name": name, "project": "p", "role": role})  # fmt: skip
        assert status == 201
        made[name] = answer
    bearer = {n: {"Authorization": f"Bearer {m['token']}"} for n, m in made.items()}  # type: ignore[index]
    hello = {"type": "hello", "v": 1, "run_id": "r-revoked", "project": "p", "name": "n",
             "started_at": 1.0}  # fmt: skip
    with (
        connect(base + "/api/v1/ingest", additional_headers=bearer["agent"]) as agent,
        connect(base + "/api/v1/live", additional_headers=bearer["page"]) as page,
    ):
        agent.send(json.dumps(hello))
        assert json.loads(agent.recv(timeout=10))["type"] == "welcome"
        for m in made.values():
            path = f"/api/v1/tokens/{m['id']}"  # type: ignore[index]
            assert call(server, path, team.admin, "DELETE")[0] == 200
        assert closed_with(agent) == (1008, "this token was revoked")
        assert closed_with(page) == (1008, "this token was revoked")
    # A token revoked by the command (no server at hand) keeps what it has open until it is
    # revoked again here, which closes it.
    reader = {"Authorization": f"Bearer {team.read_p}"}
    with connect(base + "/api/v1/live", additional_headers=reader) as page:
        revoked = trainvitals("token", "revoke", "--db", team.db, token_id(team.read_p))
        assert revoked.returncode == 0
        assert call(server, "/api/v1/runs", team.read_p)[0] == 401
        status, _ = call(server, f"/api/v1/tokens/{token_id(team.read_p)}", team.admin, "DELETE")
        assert status == 200
        assert closed_with(page) == (1008, "this token was revoked")
    assert "open connection(s) closed" in server.output()


def test_a_projects_tokens_are_capped_live_and_by_the_day(team: Team) -> None:
    server = team.server
    body = {"name": "bulk", "project": "c", "role": "read"}
    made = [call(server, "/api/v1/tokens", team.admin, "POST", body) for _ in range(100)]
    assert {status for status, _ in made} == {201}
    status, answer = call(server, "/api/v1/tokens", team.admin, "POST", body)
    assert status == 409 and "100 live tokens" in answer["detail"]  # type: ignore[index]
    for _, one in made:
        assert call(server, f"/api/v1/tokens/{one['id']}", team.admin, "DELETE")[0] == 200  # type: ignore[index]
    again = [call(server, "/api/v1/tokens", team.admin, "POST", body) for _ in range(100)]
    assert {status for status, _ in again} == {201}
    one = again[0][1]["id"]  # type: ignore[index]
    assert call(server, f"/api/v1/tokens/{one}", team.admin, "DELETE")[0] == 200  # 99 live
    status, answer = call(server, "/api/v1/tokens", team.admin, "POST", body)
    assert status == 409 and "200 tokens made in the last day" in answer["detail"]  # type: ignore[index]
    # Another project is counted on its own.
    assert call(server, "/api/v1/tokens", team.admin, "POST", {**body, "project": "d"})[0] == 201


def test_tokens_are_not_managed_over_the_network_without_auth(tmp_path: Path) -> None:
    server = ServerProcess(str(tmp_path / "local.db"))  # loopback: auth off
    try:
        status, answer = call(server, "/api/v1/tokens", method="POST",
                              body={"name": "x", "project": "*", "role": "admin"})  # fmt: skip
        assert status == 403 and "without auth" in answer["detail"]  # type: ignore[index]
        assert call(server, "/api/v1/tokens")[0] == 403
    finally:
        server.stop()
