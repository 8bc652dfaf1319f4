"""An admin's access tokens in the dashboard (#/tokens), in Chromium against a team server:
made and shown once, listed without secrets, revoked; a reader is not offered the page."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from harness.polling import wait_for
from harness.processes import ServerProcess, create_token, ingest_refusal, stream
from tests.e2e.test_dashboard import expect

HOSTILE = "<img src=x onerror=window.owned=1>"


def sign_in(browser: Any, server: ServerProcess, token: str) -> Any:
    page = browser.new_context().new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.errors = errors
    page.goto(server.url + "/")
    page.locator("form.sign-in input[name=token]").fill(token)
    page.locator("form.sign-in button").click()
    expect(page.locator("#who")).to_be_visible()
    return page


def test_an_admin_makes_a_token_sees_it_once_and_revokes_it(browser: Any, tmp_path: Path) -> None:
    db = str(tmp_path / "team.db")
    lead = create_token(db, "p", "admin", "lead-p")
    viewer = create_token(db, "p", "read", HOSTILE)
    create_token(db, "*", "admin", "root")  # of every project: not the lead's to see
    server = ServerProcess(db, args=["--auth", "required"])
    try:
        page = sign_in(browser, server, lead)

        def lead_used() -> bool:  # a use is written off the request's path: polled
            listed = page.request.get(server.url + "/api/v1/tokens").json()["tokens"]
            return any(t["name"] == "lead-p" and t["last_used_at"] for t in listed)

        wait_for(lead_used, what="the lead's use")
        page.locator("#tokens-nav").click()
        expect(page).to_have_title("Tokens · trainvitals")
        rows = page.locator("tr.token-row")
        expect(rows).to_have_count(2)
        expect(rows.filter(has_text="lead-p").locator(".badge")).to_have_text("yours")
        expect(rows.filter(has_text=HOSTILE)).to_have_count(1)  # a name is text, never markup
        # When each was last used: the lead's as this page signed in, the viewer's never.
        expect(rows.filter(has_text="lead-p").locator("td[data-last-used]")).to_have_text(
            re.compile(r"^\d+ s ago$")
        )
        expect(rows.filter(has_text=HOSTILE).locator("td[data-last-used]")).to_have_text("never")
        assert page.evaluate("window.owned") is None
        project = page.locator("#token-form input[name=project]")
        assert project.input_value() == "p" and project.get_attribute("readonly") is not None
        assert page.locator("#token-form option").all_inner_texts()[-1].startswith("admin")

        page.locator("#token-form input[name=name]").fill("ci agents")
        page.locator("#token-form select[name=role]").select_option("ingest")
        page.locator("#token-form button[type=submit]").click()
        shown = page.locator("#new-token-value")
        expect(shown).to_have_value(re.compile(r"^tv_[0-9a-f]{12}_"))
        token = shown.input_value()
        expect(page.locator("#new-token-what")).to_have_text('Token "ci agents" (ingest on p)')
        expect(rows).to_have_count(3)
        made = rows.filter(has_text="ci agents")
        assert token not in made.inner_text()  # listed without its secret
        stream(server, token, "p")  # it works
        page.locator("#hide-token").click()  # done: it leaves the page
        expect(page.locator("#new-token")).to_be_hidden()
        expect(shown).to_have_value("")
        # On a phone the page never scrolls sideways (the table scrolls in its box).
        page.set_viewport_size({"width": 390, "height": 844})
        widths = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert widths[0] <= widths[1], widths

        page.once("dialog", lambda dialog: dialog.accept())
        made.locator("button[data-revoke]").click()
        expect(made.locator("[data-token-state]")).to_have_attribute("data-token-state", "revoked")
        expect(page.locator("#token-count")).to_have_text("2 live, 1 revoked")
        code, reason = ingest_refusal(server, token, "p")
        assert code == 401 and reason.startswith("a token is required")
        assert not page.errors, page.errors

        reader = sign_in(browser, server, viewer)
        expect(reader.locator("#tokens-nav")).to_be_hidden()
        reader.goto(server.url + "/#/tokens")
        expect(reader.locator("#app .error")).to_contain_text("403")
        assert reader.evaluate("window.owned") is None
        # Revoked while its page is open: that page asks to sign in again, at once.
        reader.goto(server.url + "/")
        expect(reader.locator("#live-indicator")).to_have_text("live")
        page.once("dialog", lambda dialog: dialog.accept())
        rows.filter(has_text=HOSTILE).locator("button[data-revoke]").click()
        expect(reader.locator("form.sign-in .error")).to_have_text("Your token was revoked.")
        expect(reader.locator("#live-indicator")).to_have_text("signed out")
        assert not reader.errors, reader.errors

        # A revoked token presented again is refused, and that attempt is its last use, marked:
        # a leak, or an agent still holding it, to look into.
        spare = create_token(db, "p", "ingest", "spare")
        page.reload()
        spare_row = rows.filter(has_text="spare")
        page.once("dialog", lambda dialog: dialog.accept())
        spare_row.locator("button[data-revoke]").click()
        expect(spare_row.locator("[data-token-state]")).to_have_attribute(
            "data-token-state", "revoked"
        )
        expect(spare_row.locator("td[data-last-used]")).to_have_text("never")
        code, _ = ingest_refusal(server, spare, "p")
        assert code == 401

        def tried() -> bool:
            listed = page.request.get(server.url + "/api/v1/tokens").json()["tokens"]
            return any(t["name"] == "spare" and t["last_used_at"] for t in listed)

        wait_for(tried, what="the revoked token's attempt noted")
        page.reload()
        expect(spare_row.locator("td[data-after-revoke]")).to_have_text(
            re.compile(r"^\d+ s ago \(after revoked\)$")
        )
        assert not page.errors, page.errors
    finally:
        server.stop()


def test_revoked_tokens_are_listed_a_page_at_a_time_after_the_live_ones(
    browser: Any, tmp_path: Path
) -> None:
    """Years of a team's tokens: the live ones, then the newest revoked ones, 50 at a time;
    the count line says how many were tried after their revocation. The API pages alike."""
    from sqlalchemy import update

    from trainvitals.server.storage.schema import tokens
    from trainvitals.server.storage.tokens import token_id_of
    from trainvitals.server.store import Store

    db = str(tmp_path / "team.db")
    store = Store(db)
    try:
        store.create_schema()
        lead = store.tokens.create("lead", "p", "admin", now=1000.0)
        live_1 = token_id_of(store.tokens.create("live-1", "p", "ingest", now=1001.0))
        store.tokens.create("live-2", "p", "read", now=1002.0)
        store.tokens.create("elsewhere", "q", "read", now=1003.0)  # not the lead's to see
        for i in range(60):
            old = token_id_of(store.tokens.create(f"old-{i:02d}", "p", "ingest", now=2000.0 + i))
            assert store.tokens.revoke(old, now=3000.0 + i)
        with store.engine.begin() as conn:  # old-07 presented after its revocation
            conn.execute(update(tokens).where(tokens.c.name == "old-07").values(last_used_at=4e3))
    finally:
        store.dispose()
    server = ServerProcess(db, args=["--auth", "required"])
    try:
        page = sign_in(browser, server, lead)

        def listed(query: str = "") -> Any:
            answer = page.request.get(server.url + "/api/v1/tokens" + query)
            assert answer.status == 200, answer.text()
            return answer.json()

        whole = listed()  # as before: every token, in the order made
        assert [t["name"] for t in whole["tokens"][:3]] == ["lead", "live-1", "live-2"]
        assert len(whole["tokens"]) == whole["total"] == 63
        assert (whole["live"], whole["revoked"], whole["tried_after_revoke"]) == (3, 60, 1)
        some = listed("?revoked=only&order=newest&limit=5&offset=5")
        assert [t["name"] for t in some["tokens"]] == [f"old-{i:02d}" for i in range(54, 49, -1)]
        assert some["total"] == 60
        latest = listed("?revoked=only&order=revoked&limit=2")["tokens"]  # the latest revoked
        assert [t["name"] for t in latest] == ["old-59", "old-58"]
        live = listed("?revoked=hide")["tokens"]
        assert [t["name"] for t in live] == ["lead", "live-1", "live-2"]
        for bad in ("?limit=0", "?limit=1001", "?offset=-1", "?revoked=all", "?order=oldest"):
            assert page.request.get(server.url + "/api/v1/tokens" + bad).status == 422, bad

        page.goto(server.url + "/#/tokens")
        rows = page.locator("tr.token-row")
        expect(rows).to_have_count(53)
        expect(page.locator("#token-count")).to_have_text(
            "3 live, 60 revoked, 1 tried after revocation"
        )
        expect(page.locator("#token-count .used-after-revoke")).to_have_count(1)  # in red
        names = rows.locator("td:first-child").all_inner_texts()
        assert [n.split()[0] for n in names[:4]] == ["live-2", "live-1", "lead", "old-59"]
        more = page.locator("#more-revoked")
        expect(more).to_have_text("Show 10 more revoked (10 not shown)")
        more.click()
        expect(rows).to_have_count(63)
        expect(more).to_be_hidden()
        expect(rows.filter(has_text="old-07").locator("td[data-after-revoke]")).to_have_count(1)

        # A token revoked between the page's two reads (live, then revoked) is drawn once, as
        # the latest revoked; read at once, in the order made, it stayed among the live ones.
        server.token = lead

        def revoke_first(route: Any) -> None:
            assert server.send("DELETE", f"/api/v1/tokens/{live_1}")[0] == 200
            route.continue_()

        page.route(lambda url: "revoked=only" in url, revoke_first, times=1)
        page.reload()
        expect(page.locator("#token-count")).to_have_text(
            "2 live, 61 revoked, 1 tried after revocation"
        )
        expect(rows).to_have_count(52)
        names = rows.locator("td:first-child").all_inner_texts()
        assert [n.split()[0] for n in names[:4]] == ["live-2", "lead", "live-1", "old-59"]
        expect(
            rows.filter(has_text="live-1").locator('[data-token-state="revoked"]')
        ).to_have_count(1)
        assert not page.errors, page.errors
    finally:
        server.stop()
