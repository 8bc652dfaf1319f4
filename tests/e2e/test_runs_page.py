"""The runs list in Chromium: search, filters, sort and pages done by the server, health
beside how a run ended, tab titles, and runs compared on one page (#17)."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from harness.browser import delete_before_its_points, erring_page, pumped
from harness.notify import agent
from harness.polling import wait_for
from harness.processes import ServerProcess
from harness.seed import seed_runs
from tests.e2e.test_charts import download
from tests.e2e.test_dashboard import expect
from trainvitals import Run, resolve

RUNS = 60  # more than a page (50)
STEPS = 30

#: The text colour of each cell of a table row, key first.
CELL_COLOURS = "(row) => [...row.children].map((cell) => getComputedStyle(cell).color)"


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    db = str(tmp_path_factory.mktemp("runs-page") / "runs.db")
    seed_runs(db, RUNS, steps=STEPS, also=("lr",))
    server = ServerProcess(db)
    try:
        yield server
    finally:
        server.stop()


def open_page(server: ServerProcess, browser: Any, path: str = "/", width: int = 1400) -> Any:
    page, _ = erring_page(browser, width)
    page.goto(server.url + path)
    return page


def names(page: Any) -> list[str]:
    return list(page.locator("tr.run-row td:nth-child(2) a").all_inner_texts())


def test_the_list_is_searched_sorted_and_paged_by_the_server(
    seeded: ServerProcess, browser: Any
) -> None:
    page = open_page(seeded, browser)
    expect(page).to_have_title("Runs · trainvitals")
    expect(page.locator("#page-range")).to_have_text(f"1\N{EN DASH}50 of {RUNS}")
    assert names(page)[:2] == ["run-00059", "run-00058"]
    page.locator("#next-page").click()
    expect(page.locator("#page-range")).to_have_text(f"51\N{EN DASH}{RUNS} of {RUNS}")
    assert names(page)[-1] == "run-00000" and "page=1" in page.evaluate("location.hash")

    page.locator("input[name=q]").fill("run-0001")
    expect(page.locator("#run-count")).to_have_text("10 runs")
    assert sorted(names(page)) == [f"run-{i:05d}" for i in range(10, 20)]
    page.locator("select[name=status]").select_option("crashed")
    expect(page.locator("#run-count")).to_have_text("5 runs")  # every other run crashed
    assert {s for s in page.locator("tr.run-row [data-status]").evaluate_all(
        "(badges) => badges.map((b) => b.dataset.status)")} == {"crashed"}  # fmt: skip

    page.locator("select[name=status]").select_option("")
    page.locator("input[name=q]").fill("")
    page.locator("button.sort[data-sort=name]").click()
    expect(page.locator("th[aria-sort=ascending]")).to_have_count(1)
    expect(page.locator("tr.run-row").first).to_contain_text("run-00000")
    page.locator("button.sort[data-sort=name]").click()
    expect(page.locator("tr.run-row").first).to_contain_text("run-00059")
    page.locator("input[name=cols]").fill("lr, batch")
    expect(page.locator("th[data-config-column=batch]")).to_have_count(1)
    expect(page.locator("tr.run-row").first.locator("td[data-config=batch]")).to_have_text("96")

    # The view is in the address: a reload (or a link) shows the same.
    page.reload()
    expect(page.locator("tr.run-row").first).to_contain_text("run-00059")
    expect(page.locator("input[name=cols]")).to_have_value("lr, batch")
    page.locator("tr.run-row").first.locator("a").click()
    expect(page).to_have_title("run-00059 · trainvitals")
    page.goto(seeded.url + "/#/alerts")
    expect(page).to_have_title("Alerts · trainvitals")
    assert not page.errors


def test_series_are_columns_of_the_list_and_its_sort_orders(
    seeded: ServerProcess, browser: Any
) -> None:
    """Metric columns, as W&B's runs table has them: a series' last value, or its least or
    greatest, each a sort order of the server's over every run (not only the page's); runs
    without the series are last either way; the view is in the address."""
    page = open_page(seeded, browser)
    expect(page.locator("#page-range")).to_have_text(f"1\N{EN DASH}50 of {RUNS}")
    # By default, the last loss and the best validation loss (none here).
    heads = page.locator("th[data-metric-column]")
    expect(heads).to_have_text(["loss", "val_loss (min)"])
    expect(page.locator("tr.run-row").first.locator("td.metric-cell")).to_have_text(["0.0303", "—"])
    assert page.evaluate("location.hash") in ("", "#/")
    page.locator("input[name=metrics]").fill("loss, min:loss, max:lr, nope")
    expect(heads).to_have_count(4)
    assert heads.all_inner_texts() == ["loss", "loss (min)", "lr (max)", "nope"]
    # run-00059 (i % 7 == 3): loss 1 / (s + 3) at steps 1..30, lr twice the loss.
    cells = page.locator("tr.run-row").first.locator("td.metric-cell")
    expect(cells).to_have_text(["0.0303", "0.0303", "0.5", "—"])
    assert cells.first.get_attribute("title") == "at step 30"

    page.locator("button.sort[data-sort='min:loss']").click()  # least first
    expect(page.locator("th[data-metric-column='min:loss']")).to_have_attribute(
        "aria-sort", "ascending"
    )
    # The least loss over all 60 runs is 1/36 (i % 7 == 6), newest first among equals:
    # run-00055 and run-00048 are on the first page, and so is no run of a larger loss.
    expect(page.locator("tr.run-row").first).to_contain_text("run-00055")
    assert names(page)[:2] == ["run-00055", "run-00048"]
    page.locator("button.sort[data-sort='max:lr']").click()  # greatest first
    expect(page.locator("tr.run-row").first).to_contain_text("run-00056")  # i % 7 == 0
    page.locator("button.sort[data-sort='last:nope']").click()  # no run has it: as started
    expect(page.locator("tr.run-row").first).to_contain_text("run-00059")
    page.locator("button.sort[data-sort='min:loss']").click()
    query = parse_qs(urlsplit(page.evaluate("location.hash")[1:]).query)
    assert query == {"metrics": ["loss, min:loss, max:lr, nope"], "sort": ["min:loss"],
                     "order": ["asc"]}  # fmt: skip
    page.reload()
    expect(page.locator("tr.run-row").first).to_contain_text("run-00055")
    expect(page.locator("input[name=metrics]")).to_have_value("loss, min:loss, max:lr, nope")

    # A hostile column name is text, in the heading and in the address.
    hostile = "<img src=x onerror=window.pwned=1>"
    page.locator("input[name=metrics]").fill(hostile)
    expect(page.locator("th[data-metric-column]")).to_have_count(1)
    expect(page.locator("th[data-metric-column]")).to_have_text(hostile)
    assert page.evaluate("window.pwned") is None and page.locator("img").count() == 0
    # Its sort's column gone, the list is sorted as it is by default again.
    query = parse_qs(urlsplit(page.evaluate("location.hash")[1:]).query)
    assert query == {"metrics": [hostile]}
    expect(page.locator("tr.run-row").first).to_contain_text("run-00059")
    assert not page.errors, page.errors


def test_the_runs_are_plotted_a_point_a_run_by_a_config_value_and_a_metric(
    seeded: ServerProcess, browser: Any
) -> None:
    """TensorBoard's hyperparameter scatter: every run of the view (not one page) a point, x a
    config column or a metric column, y a metric column; the axes kept in the address."""
    page = open_page(seeded, browser, "/#/?cols=lr&metrics=")  # no metric column
    page.locator("#runs-plot summary").click()
    note = page.locator("#runs-plot-note")
    expect(note).to_have_text("Add metric columns (loss, min:val_loss) to plot the runs by them.")
    page.locator("input[name=metrics]").fill("min:loss, max:lr")
    plot = page.locator("#runs-plot-area")
    expect(plot).to_have_attribute("data-points", str(RUNS))  # every page's runs
    expect(note).to_have_text(f"{RUNS} of {RUNS} runs")
    assert page.locator("#runs-plot [name=px] option").all_inner_texts() == [
        "lr", "loss (min)", "lr (max)",
    ]  # fmt: skip
    points = plot.evaluate("(p) => [p.data[0].x, p.data[0].y, p.data[0].customdata]")
    # run i: lr 0.001 * (1 + i % 7), least loss 1 / (30 + i % 7)
    by_run = {run: (x, y) for x, y, run in zip(*points, strict=True)}
    assert by_run["seed000003"] == (0.004, 1 / 33) and by_run["seed000013"] == (0.007, 1 / 36)
    query = parse_qs(urlsplit(page.evaluate("location.hash")[1:]).query)
    assert (query["px"], query["py"]) == (["config:lr"], ["min:loss"])
    page.locator("#runs-plot [name=py]").select_option("max:lr")
    expect(plot).to_have_attribute("aria-label", f"lr (max) against lr: {RUNS} runs")
    page.locator("#runs-plot [name=logx]").check()  # a learning rate's decades
    wait_for(lambda: plot.evaluate("(p) => p._fullLayout.xaxis.type") == "log", what="log x")
    assert parse_qs(urlsplit(page.evaluate("location.hash")[1:]).query)["plog"] == ["x"]
    again = open_page(seeded, browser, "/#/?" + urlsplit(page.evaluate("location.hash")[1:]).query)
    expect(again.locator("#runs-plot-area")).to_have_attribute(
        "aria-label", f"lr (max) against lr: {RUNS} runs"
    )  # the address draws the same plot
    assert not page.errors and not again.errors, (page.errors, again.errors)


#: The page position of a plotted run's point: (x, y) in CSS pixels.
POINT_AT = """(plot, id) => {
  const trace = plot.data[0], i = trace.customdata.indexOf(id);
  const { xaxis, yaxis } = plot._fullLayout, box = plot.getBoundingClientRect();
  const x = trace.x[i], at = xaxis.type === "category" ? xaxis.d2l(x) : x;
  const y = trace.y[i];
  return [box.left + xaxis._offset + xaxis.l2p(at), box.top + yaxis._offset + yaxis.l2p(y)];
}"""


def test_a_plotted_run_is_the_one_clicked_and_its_config_values_are_text(
    server: ServerProcess, browser: Any
) -> None:
    """Runs of a grid share their x: a click opens the run under the pointer, not the first at
    its x; a config value is a category shown as text (plotly reads markup in labels); a run
    whose loss turned NaN is a cross at the top, not left out."""
    hostile = '<a href="https://evil.example/">x</a>'
    ids = {}
    for name, opt, loss in (("low", "sgd", 0.1), ("high", "sgd", 0.9), ("odd", hostile, 0.5),
                            ("quoted", 'adam "beta"', 0.3),
                            ("diverged", 'adam "beta"', float("nan"))):  # fmt: skip
        run = Run(resolve(server=server.url, project="grid", run_name=name, config={"opt": opt}),
                  system_metrics=False, watchdog=False)  # fmt: skip
        run.start()
        run.log(1, {"loss": loss})
        assert run.finish()
        ids[name] = run.id
    page = open_page(server, browser, "/#/?cols=opt&metrics=loss&px=config%3Aopt&py=last%3Aloss")
    plot = page.locator("#runs-plot-area")
    expect(plot).to_have_attribute("data-points", "5")
    expect(plot).to_have_attribute("data-diverged", "1")
    expect(page.locator("#runs-plot-note")).to_contain_text("5 of 5 runs, 1 diverged")
    ticks = plot.locator(".xtick text").evaluate_all("(ts) => ts.map((t) => t.textContent)")
    assert sorted(ticks) == sorted([hostile, 'adam "beta"', "sgd"]), ticks
    assert plot.locator("a").count() == 0
    for name in ("low", "high"):  # both at x = sgd
        page.mouse.click(*plot.evaluate(POINT_AT, ids[name]))
        expect(page).to_have_title(f"{name} · trainvitals")
        page.go_back()
        expect(plot).to_have_attribute("data-points", "5")
    cross = plot.evaluate("(p) => [p.data[1].customdata, p.data[1].y, Math.max(...p.data[0].y)]")
    assert cross == [[ids["diverged"]], [0.9], 0.9]  # at the top of the finite ones
    assert not page.errors, page.errors


def test_a_run_that_blew_up_never_looks_like_a_clean_finish(
    seeded: ServerProcess, browser: Any
) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    # The server's health field (the worst alert a run raised), on the first run listed: the
    # server's own answer, fetched here and given to every list request of the page. (It was
    # fetched inside the route's handler, by a Playwright call nested in that dispatch; twice
    # under a full parallel run the page's list request then never completed. A handler that
    # only fulfils cannot hold it.)
    answer = seeded.get("/api/v1/runs?status=finished")
    answer["runs"][0]["health"] = {
        "worst": "critical",
        "rules": ["nonfinite", {"rule": "grad_explosion"}],
    }
    answer["runs"][1]["health"] = {"worst": None, "rules": []}
    # A stall that resolved before the run finished: raised once, over now.
    answer["runs"][2]["health"] = {"worst": "critical", "rules": ["stall"], "firing": []}
    page.route("**/api/v1/runs?*", lambda route: route.fulfill(json=answer))
    # Columns a Keras user asks for: the table keeps to the screen, no heading cut off.
    columns = "cols=learning_rate,batch_size&metrics=loss,min:val_loss,max:val_accuracy"
    page.goto(seeded.url + f"/#/?status=finished&{columns}")
    first = page.locator("tr.run-row").first
    expect(first.locator("[data-health=critical]")).to_have_text("critical: nonfinite +1")
    widths = page.locator(".runs-table").evaluate(
        "(table) => [table.scrollWidth, table.parentElement.clientWidth]"
    )
    assert widths[0] <= widths[1], widths
    # How long each ran, beside its last step.
    expect(first.locator("td.duration")).to_have_text(re.compile(r"^\d+(\.\d)? s$"))
    stalled = page.locator("tr.run-row").nth(2).locator("[data-health]")
    expect(stalled).to_have_attribute("title", "raised: stall (none firing now)")
    outlined = stalled.evaluate(
        "(b) => [getComputedStyle(b).backgroundColor, getComputedStyle(b).color]"
    )
    assert outlined[0] == "rgb(255, 255, 255)" and outlined[1] != outlined[0], outlined
    assert first.locator("[data-status]").get_attribute("data-status") == "finished"
    assert page.locator("tr.run-row").nth(1).locator("[data-health]").count() == 0
    colour = first.locator("[data-health]").evaluate("(b) => getComputedStyle(b).backgroundColor")
    assert colour != first.locator("[data-status]").evaluate(
        "(b) => getComputedStyle(b).backgroundColor"
    )


def test_open_pages_follow_a_run_live_its_health_and_its_points(
    server: ServerProcess, browser: Any
) -> None:
    runs = [
        Run(resolve(server=server.url, project="live", run_name=name),
            system_metrics=False, watchdog=False)
        for name in ("turns-bad", "steady")
    ]  # fmt: skip
    for run in runs:
        run.start()
        for step in range(1, 6):
            run.log(step, {"loss": 1.0 / step, "nonfinite/loss": 0.0})
    bad = runs[0]
    listed = open_page(server, browser)
    row = listed.locator("tr.run-row", has_text="turns-bad")
    expect(row.locator("[data-status]")).to_have_text("running")
    header = open_page(server, browser, f"/#/runs/{bad.id}")
    expect(header.locator("#run-name")).to_have_text("turns-bad")
    compared = open_page(server, browser, f"/#/compare?runs={runs[0].id},{runs[1].id}")
    loss = compared.locator('[data-chart="loss"]')
    expect(loss).to_have_attribute("data-drawn", "10")
    pages = (listed, header, compared)
    for page in pages:
        page.evaluate("window.notReloaded = true")
    assert row.locator("[data-health]").count() == 0
    assert header.locator("#run-status [data-health]").count() == 0

    # The run page's summary: a value selected to copy stays selected as the run steps.
    least = header.locator('#run-summary tr[data-summary="loss"] td').nth(2)
    expect(least).to_have_text("0.2")
    least.evaluate(SELECT_TEXT)
    # The health badge of a run turns critical where it is shown when a critical alert fires.
    bad.log(6, {"loss": math.nan, "nonfinite/loss": 1.0})
    expect(row.locator("[data-health]")).to_have_text("critical: nonfinite")
    expect(header.locator("#run-status [data-health]")).to_have_text("critical: nonfinite")
    expect(compared.locator(".compared-runs [data-health]")).to_have_text("critical: nonfinite")
    # The compare view's summary follows both runs, updated in place: a value selected stays.
    compared_loss = compared.locator('#summary-compare tr[data-summary="loss"] td')
    compared_loss.nth(1).evaluate(SELECT_TEXT)
    expect(compared_loss).to_have_text(["NaN", "0.2"], timeout=15_000)
    assert compared.evaluate("getSelection().toString()") == "0.2"
    # The run page's summary follows it: the last loss is NaN now, its least still 0.2.
    loss_summary = header.locator('#run-summary tr[data-summary="loss"] td')
    expect(loss_summary).to_have_text(["NaN", "6", "0.2", "1"], timeout=15_000)
    assert header.evaluate("getSelection().toString()") == "0.2"
    expect(row.locator("[data-status]")).to_have_text("running")  # the rest of the run kept
    # A point streamed after the compare view opened is drawn on its run's trace.
    runs[1].log(6, {"loss": 0.125})
    expect(loss).to_have_attribute("data-drawn", "12")
    steps = loss.locator(".plot").evaluate("(plot) => plot.data.map((t) => [t.legendgroup, t.x])")
    assert steps == [[bad.id, [1, 2, 3, 4, 5, 6]], [runs[1].id, [1, 2, 3, 4, 5, 6]]]
    for page in pages:
        assert page.evaluate("window.notReloaded") is True
        assert not page.errors, page.errors
    for run in runs:
        assert run.finish()


def test_compared_charts_have_a_legend_an_epoch_axis_and_layers_to_choose(
    server: ServerProcess, browser: Any
) -> None:
    """Which run and which series a line is, in a legend under the plot (not over its axis'
    title); the runs' gradient norms, each layer one tick away; epochs on the x-axis."""
    runs = []
    for name in ("wide", "deep"):
        run = Run(resolve(server=server.url, project="compared", run_name=name),
                  system_metrics=False, watchdog=False)  # fmt: skip
        run.start()
        for step in range(1, 41):
            values = {"loss": 1.0 / step, "grad/global_norm": 2.0, "host/rss": 300.0 * 2**20,
                      "grad/norm/d0/kernel": 1.0, "grad/norm/d1/kernel": 0.5}  # fmt: skip
            if step % 20 == 0:
                epoch = {"epoch": step // 20, "epoch/loss": 2.0 / step, "val_loss": 3.0 / step}
                values.update(epoch)
            run.log(step, values)
        assert run.finish()
        runs.append(run)
    page = open_page(server, browser, f"/#/compare?runs={runs[0].id},{runs[1].id}&x=epoch")
    loss = page.locator('[data-chart="loss"]')
    expect(loss).to_have_attribute("data-drawn", "88")
    entries = loss.locator(".legendtext").all_text_contents()
    series = ("loss", "epoch/loss", "val_loss")
    assert sorted(entries) == sorted(f"{r} · {s}" for r in ("wide", "deep") for s in series)
    dashes = loss.locator(".plot").evaluate("(plot) => plot.data.map((t) => [t.name, t.line.dash])")
    assert dict(dashes)["wide · val_loss"] == "dash" and dict(dashes)["wide · epoch/loss"] == "dot"
    boxes = loss.evaluate(
        """(card) => [card.querySelector('.g-xtitle'), card.querySelector('.legend')]
                        .map((el) => el.getBoundingClientRect()).map((r) => [r.top, r.bottom])"""
    )
    assert boxes[0][1] <= boxes[1][0], boxes  # the axis' title above the legend, apart
    # Epochs: epoch 2 ends at x = 2, on every run.
    assert loss.locator(".plot").evaluate("(plot) => plot.layout.xaxis.title.text") == "epoch"
    ends = loss.locator(".plot").evaluate("(plot) => plot.data.map((t) => t.x.at(-1))")
    assert ends == [pytest.approx(2)] * 6, ends
    # Each run's global norm; its layers in the list under the chart, named with their run.
    grad = page.locator('[data-chart="grad_norm"]')
    expect(grad.locator(".series-picker summary")).to_have_text("Layers: 0 of 4 drawn")
    drawn = grad.locator(".plot").evaluate("(plot) => plot.data.map((t) => t.name)")
    assert sorted(drawn) == ["deep · grad/global_norm", "wide · grad/global_norm"], drawn
    labels = grad.locator(".series-picker label").all_text_contents()
    assert [label.strip() for label in labels][:2] == ["deep · d0/kernel", "deep · d1/kernel"]
    grad.locator(".series-picker summary").click()
    grad.locator(".series-picker input").first.check()
    expect(grad.locator(".series-picker summary")).to_have_text("Layers: 1 of 4 drawn")
    # Bytes in binary units here too.
    memory = page.locator('[data-chart="host_memory"]')
    memory.scroll_into_view_if_needed()
    expect(memory.locator(".ytick text").first).to_have_text(re.compile(r" MiB$"))
    expect(page.locator('#summary-compare tr[data-summary="host/rss"] td').first).to_have_text(
        "300 MiB"
    )
    assert not page.errors, page.errors


#: Selects the text of an element, as a drag of the mouse over it would.
SELECT_TEXT = """(element) => {
  const range = document.createRange();
  range.selectNodeContents(element);
  getSelection().removeAllRanges();
  getSelection().addRange(range);
}"""


def test_a_live_list_updates_a_runs_row_in_place_keeping_a_selection_and_the_focus(
    server: ServerProcess, browser: Any
) -> None:
    """A live list is pushed every half second: a cell whose content did not change stays the
    same element, so a name being selected for copying, the keyboard on a ticked box and
    anything else holding on to the row survive the pushes."""
    run = Run(resolve(server=server.url, project="live", run_name="in-place"),
              system_metrics=False, watchdog=False)  # fmt: skip
    run.start()
    run.log(1, {"loss": 1.0})
    page = open_page(server, browser)
    row = page.locator(f"tr.run-row[data-run-id='{run.id}']")
    expect(row.locator("td.last-step")).to_have_text("1")
    link = row.locator("td:nth-child(2) a").element_handle()
    status = row.locator("[data-status]").element_handle()
    box = row.locator("input.select-run").element_handle()
    box.focus()
    page.keyboard.press("Space")
    expect(page.locator("#compare")).to_have_text("Compare 1 selected")
    link.evaluate(SELECT_TEXT)
    for step in range(2, 6):
        run.log(step, {"loss": 1.0 / step})
    expect(row.locator("td.last-step")).to_have_text("5")  # the changed cell is drawn anew
    assert link.evaluate("(a) => a.isConnected") and status.evaluate("(s) => s.isConnected")
    assert page.evaluate("getSelection().toString()") == "in-place"
    assert box.evaluate("(b) => b.isConnected && b.checked && document.activeElement === b")
    assert run.finish()
    expect(row.locator("[data-status]")).to_have_text("finished")
    assert link.evaluate("(a) => a.isConnected")
    assert not status.evaluate("(s) => s.isConnected")  # its cell changed, so it was replaced
    expect(page.locator("#compare")).to_have_text("Compare 1 selected")
    assert not page.errors, page.errors


def test_the_runs_one_process_made_are_listed_together_and_alone_by_its_link(
    server: ServerProcess, browser: Any
) -> None:
    """A loop of fits makes a run a fit: the runs one process made (the same ``process`` in
    their hellos) are listed together under a heading though another process's run began
    among them, and its link lists them alone, live; a run alone in its process is listed as
    any other (#46). The hello is hostile: its host is text on the page and in the address."""
    host = "<img src=x onerror=window.pwned=1>"
    loop = {"key": f"{host}/4242/1700000000.00", "started_at": 1_700_000_000.0}
    other = {"key": "node-8/99/1700000000.00", "started_at": 1_700_000_000.0}

    def fit(name: str, process: dict[str, Any]) -> None:
        host, pid, _ = process["key"].split("/")
        agent(server, name, "loop", name=name, host=host, pid=int(pid), process=process).close()

    for name, process in (("fold-0", loop), ("elsewhere", other), ("fold-1", loop),
                          ("fold-2", loop)):  # fmt: skip
        fit(name, process)
    page = open_page(server, browser)
    heading = page.locator("tr.process-row")
    expect(heading.locator("[data-process-runs]")).to_have_text("3 runs")
    expect(heading).to_contain_text(f"Process {host}:4242")
    rows = page.locator("#runs-body tr").evaluate_all(
        "(rows) => rows.map((r) => [r.className, r.querySelector('td:nth-child(2) a')?.text])"
    )
    assert rows == [
        ["group-row process-row", None],
        *[["run-row group-member process-member", f"fold-{i}"] for i in (2, 1, 0)],
        ["run-row", "elsewhere"],  # alone in its process: as any run
    ]

    heading.locator("a.group-filter").click()
    expect(page.locator("#run-count")).to_have_text("3 runs")
    assert parse_qs(urlsplit(page.evaluate("location.hash")[1:]).query) == {
        "process": [loop["key"]]}  # fmt: skip
    # Live: another process's new run is not listed, the loop's next fit is, under its heading.
    fit("elsewhere-2", other)
    fit("fold-3", loop)
    expect(heading.locator("[data-process-runs]")).to_have_text("4 runs")
    assert names(page) == ["fold-3", "fold-2", "fold-1", "fold-0"]
    expect(page.locator("#run-count")).to_have_text("4 runs")
    heading.locator("a.group-filter", has_text="every run").click()
    expect(page.locator("#run-count")).to_have_text("6 runs")
    assert page.evaluate("window.pwned") is None and page.locator("img").count() == 0
    assert not page.errors, page.errors


def test_metric_columns_follow_a_streaming_run(server: ServerProcess, browser: Any) -> None:
    """A metric column of a live run is read again as the run steps (every few seconds at
    most), a new run's as it comes, and a loss that turned NaN says so."""
    page = open_page(server, browser, "/#/?metrics=loss,min:loss")
    expect(page.locator("#run-count")).to_have_text("0 runs")
    run = Run(resolve(server=server.url, project="live", run_name="streaming"),
              system_metrics=False, watchdog=False)  # fmt: skip
    run.start()
    run.log(1, {"loss": 2.0})
    cells = page.locator(f"tr.run-row[data-run-id='{run.id}'] td.metric-cell")
    expect(cells).to_have_text(["2", "2"], timeout=15_000)
    run.log(2, {"loss": 0.5})
    run.log(3, {"loss": float("nan")})
    expect(cells).to_have_text(["NaN", "0.5"], timeout=15_000)
    assert cells.first.locator(".nonfinite").count() == 1

    # A view the server refuses is said above the list, which keeps its runs, still live.
    page.locator("input[name=metrics]").fill("x" * 300)
    failure = page.locator("#runs-error")
    expect(failure).to_be_visible()
    expect(failure).to_have_text(
        "Could not list the runs: 422: query.metric.0: String should have at most 256 characters"
    )
    run.log(4, {"loss": 0.25})
    row = page.locator(f"tr.run-row[data-run-id='{run.id}']")
    expect(row.locator("td.last-step")).to_have_text("4")
    expect(failure).to_be_visible()
    # The list keeps drawing the view it shows: its headings and its cells agree.
    expect(page.locator("th[data-metric-column]")).to_have_count(2)
    expect(row.locator("td.metric-cell")).to_have_count(2)
    page.locator("input[name=metrics]").fill("loss")
    expect(failure).to_be_hidden()
    expect(row.locator("td.metric-cell")).to_have_text(["0.25"])
    assert run.finish()
    assert not page.errors, page.errors


def test_selected_runs_are_compared_one_colour_each_on_every_chart(
    seeded: ServerProcess, browser: Any
) -> None:
    page = open_page(seeded, browser, "/#/?q=run-0000")
    expect(page.locator("#run-count")).to_have_text("10 runs")
    for name in ("run-00003", "run-00005"):
        page.locator("tr.run-row", has_text=name).locator("input.select-run").check()
    expect(page.locator("#compare")).to_have_text("Compare 2 selected")
    page.locator("#compare").click()
    expect(page).to_have_title("Compare 2 runs · trainvitals")
    assert page.evaluate("location.hash") == "#/compare?runs=seed000003,seed000005"
    loss = page.locator('[data-chart="loss"] .plot')
    alt = "loss of run-00003, run-00005: 2 series, 60 points"
    expect(loss).to_have_attribute("aria-label", alt)
    expect(page.locator('[data-chart="loss"]')).to_have_attribute("data-drawn", "60")
    traces = loss.evaluate(
        "(plot) => plot.data.map((t) => [t.legendgroup, t.line.color, t.x.length])"
    )
    assert [(run, length) for run, _, length in traces] == [("seed000003", 30), ("seed000005", 30)]
    colours = {run: colour for run, colour, _ in traces}
    assert len(set(colours.values())) == 2
    swatches = page.locator(".compared-runs .swatch").evaluate_all(
        "(spans) => spans.map((s) => getComputedStyle(s).backgroundColor)"
    )
    assert len(swatches) == 2
    # Each series' last value, a run a column; the least and greatest in the cell's title.
    summaries = page.locator("#summary-compare tr[data-summary]")
    assert summaries.evaluate_all("(rows) => rows.map((r) => r.dataset.summary)") == ["loss", "lr"]
    expect(summaries.first.locator("td")).to_have_text(["0.0303", "0.02857"])  # 1/33, 1/35
    assert summaries.nth(1).locator("td").first.get_attribute("title") == (
        "min 0.06061 · max 0.5 · last at step 30"
    )
    # The config table marks the keys that differ (lr and batch both do here).
    differs = page.locator("#config-compare tr[data-differs=true]").evaluate_all(
        "(rows) => rows.map((r) => r.dataset.configKey)"
    )
    assert differs == ["batch", "lr"]
    # A key that differs reads as strongly as its values (a muted key was easy to miss on the
    # marked row, in dark mode most).
    marked = page.locator('#config-compare tr[data-config-key="lr"]').evaluate(CELL_COLOURS)
    assert len(set(marked)) == 1, marked
    wanted = os.environ.get("TRAINVITALS_SCREENSHOT")
    if wanted:  # the README's picture of the compare view
        shot = Path(wanted).with_name("compare.png")
        page.screenshot(path=str(shot), full_page=True, animations="disabled", timeout=120_000)
    # A shared link opens the same view.
    again = open_page(seeded, browser, "/#/compare?runs=seed000003,seed000005")
    expect(again.locator('[data-chart="loss"]')).to_have_attribute("data-series", "2")
    assert not page.errors and not again.errors


def traces_of(page: Any, chart: str, fields: str) -> Any:
    """``[fields]`` of each trace a chart of the page draws (a JS array of ``t``'s fields)."""
    return page.locator(f'[data-chart="{chart}"] .plot').evaluate(
        f"(plot) => plot.data.map((t) => {fields})"
    )


def test_the_compare_views_config_shows_only_the_keys_that_differ_at_a_switch(
    seeded: ServerProcess, browser: Any
) -> None:
    """Runs 0 and 7 share their lr and differ in batch; the switch is kept in the address."""
    page = open_page(seeded, browser, "/#/compare?runs=seed000000,seed000007")
    rows = page.locator("#config-compare tr[data-config-key]")
    expect(page.locator("#config-differ")).to_have_text("(1 of 2 keys differ, marked)")
    expect(rows).to_have_count(2)
    shared = page.locator('#config-compare tr[data-config-key="lr"]').evaluate(CELL_COLOURS)
    assert shared[0] != shared[1], shared  # a shared key stays muted beside its values
    page.get_by_label("Only the keys that differ").check()
    expect(rows).to_have_count(1)
    assert rows.evaluate_all("(rows) => rows.map((r) => r.dataset.configKey)") == ["batch"]
    assert page.evaluate("location.hash") == "#/compare?runs=seed000000,seed000007&config=differing"

    again = open_page(seeded, browser, "/#/compare?runs=seed000000,seed000007&config=differing")
    expect(again.get_by_label("Only the keys that differ")).to_be_checked()
    expect(again.locator("#config-compare tr[data-config-key]")).to_have_count(1)
    again.get_by_label("Only the keys that differ").uncheck()
    expect(again.locator("#config-compare tr[data-config-key]")).to_have_count(2)
    assert again.evaluate("location.hash") == "#/compare?runs=seed000000,seed000007"
    assert not page.errors and not again.errors


def test_compared_runs_smooth_overlay_from_their_starts_and_zoom_together(
    seeded: ServerProcess, browser: Any
) -> None:
    page = open_page(seeded, browser, "/#/compare?runs=seed000003,seed000005")
    reads: list[str] = []
    page.on("request", lambda request: reads.append(request.url))
    for chart in ("loss", "lr"):
        expect(page.locator(f'[data-chart="{chart}"]')).to_have_attribute("data-drawn", "60")
    runs = ["seed000003", "seed000005"]
    colours = dict(traces_of(page, "loss", "[t.legendgroup, t.line.color]"))

    # Smoothing, the run page's: each run's trace smoothed, its raw one faint behind in its colour.
    page.locator(".chart-controls [name=smoothing]").fill("0.6")
    page.wait_for_function(
        """() => document.querySelector('[data-chart="lr"] .plot').data.length === 4"""
    )
    for chart in ("loss", "lr"):
        fields = "[t.legendgroup, t.meta, t.line.color, t.opacity ?? 1, t.y]"
        traces = traces_of(page, chart, fields)
        assert [trace[:4] for trace in traces] == [
            [run, role, colours[run], opacity]
            for run in runs for role, opacity in (("raw", 0.25), ("smoothed", 1))
        ]  # fmt: skip
        for raw, smoothed in zip(traces[::2], traces[1::2], strict=True):
            assert smoothed[4][0] == raw[4][0] and smoothed[4][1] != raw[4][1]
    expect(page.locator('[data-chart="loss"]')).to_have_attribute("data-drawn", "60")
    page.locator(".chart-controls [name=smoothing]").fill("0")

    # Time since start is each run's own: run 5 started 2 s after run 3, and both start at 1 s.
    page.locator(".chart-controls [name=xaxis]").select_option("relative")
    page.wait_for_function(
        """() => document.querySelector('[data-chart="loss"] .plot').layout.xaxis.title.text
                 === 'time since start (s)'"""
    )
    assert traces_of(page, "loss", "t.x.slice(0, 2)") == [[1, 2], [1, 2]]

    # A zoom in wall-clock time zooms every chart, and reads each run's own steps in view again.
    page.locator(".chart-controls [name=xaxis]").select_option("wall")
    page.wait_for_function(
        """() => document.querySelector('[data-chart="loss"] .plot').layout.xaxis.type === 'date'"""
    )
    reads.clear()
    zoom = page.evaluate(
        """() => { const plot = document.querySelector('[data-chart="loss"] .plot');
                   const at = (s) => { const d = new Date(s * 1000);
                                       const p = (n) => String(n).padStart(2, '0');
                                       return `${d.getFullYear()}-${p(d.getMonth() + 1)}-`
                                         + `${p(d.getDate())} ${p(d.getHours())}:`
                                         + `${p(d.getMinutes())}:${p(d.getSeconds())}`; };
                   const range = [at(1700000013), at(1700000023)];
                   Plotly.relayout(plot, {'xaxis.range[0]': range[0], 'xaxis.range[1]': range[1]});
                   return range; }"""
    )
    expect(page.locator("#charts")).to_have_attribute("data-detail", "8-20")
    lr = page.locator('[data-chart="lr"] .plot')
    assert lr.evaluate("(plot) => plot.layout.xaxis.range") == zoom
    ranged = []
    for url in reads:
        address = urlsplit(url)
        query = parse_qs(address.query)
        if address.path.endswith("/series"):
            ranged.append((address.path.split("/")[4], query["min_step"], query["max_step"]))
    assert sorted(ranged) == [("seed000003", ["10"], ["20"]), ("seed000005", ["8"], ["18"])]
    expect(page.locator(".chart-controls [name=reset-zoom]")).to_be_visible()

    # A double-click zooms every chart out to the overview.
    page.locator('[data-chart="lr"] .nsewdrag').dblclick()
    page.wait_for_function(
        """() => document.querySelector('[data-chart="loss"] .plot').layout.xaxis.autorange"""
    )
    expect(page.locator(".chart-controls [name=reset-zoom]")).to_be_hidden()
    assert page.locator("#charts").get_attribute("data-detail") is None
    assert not page.errors, page.errors


def test_a_compared_chart_downloads_every_runs_points_in_one_file(
    seeded: ServerProcess, browser: Any, tmp_path: Path
) -> None:
    """Each row names its run; zoomed, the steps in view (on a time axis, from the first step
    any run has in view to the last)."""
    page = open_page(seeded, browser, "/#/compare?runs=seed000005,seed000003")
    expect(page.locator('[data-chart="loss"]')).to_have_attribute("data-drawn", "60")
    name, lines = download(page, "loss", "csv", tmp_path)
    assert name == "compare-loss.csv"
    assert lines[0] == "run_id,run_name,name,step,time,value"
    rows = [line.split(",") for line in lines[1:]]
    assert [(r[0], r[1], r[2], int(r[3])) for r in rows] == [
        (run, f"run-0000{run[-1]}", "loss", step)
        for run in ("seed000005", "seed000003") for step in range(1, STEPS + 1)
    ]  # fmt: skip

    plot = "document.querySelector('[data-chart=\"loss\"] .plot')"
    page.evaluate(f"Plotly.relayout({plot}, {{'xaxis.range[0]': 4.6, 'xaxis.range[1]': 9.2}})")
    expect(page.locator("#charts")).to_have_attribute("data-detail", "4-10")
    _, lines = download(page, "loss", "jsonl", tmp_path)
    got = [(json.loads(line)["run_id"], json.loads(line)["step"]) for line in lines]
    assert got == [(run, step) for run in ("seed000005", "seed000003") for step in range(4, 11)]

    # In wall-clock time the runs' steps in view differ (run 5 started 2 s after run 3: 8-18
    # and 10-20): the file holds 8-20 of both.
    page.locator(".chart-controls [name=xaxis]").select_option("wall")
    page.wait_for_function(f"{plot}.layout.xaxis.type === 'date'")
    page.evaluate(
        f"""() => {{ const at = (s) => {{ const d = new Date(s * 1000);
                                         const p = (n) => String(n).padStart(2, '0');
                                         return `${{d.getFullYear()}}-${{p(d.getMonth() + 1)}}-`
                                           + `${{p(d.getDate())}} ${{p(d.getHours())}}:`
                                           + `${{p(d.getMinutes())}}:${{p(d.getSeconds())}}`; }};
                    Plotly.relayout({plot}, {{'xaxis.range[0]': at(1700000013),
                                              'xaxis.range[1]': at(1700000023)}}); }}"""
    )
    expect(page.locator("#charts")).to_have_attribute("data-detail", "8-20")
    _, lines = download(page, "loss", "csv", tmp_path)
    got = [(line.split(",")[0], int(line.split(",")[3])) for line in lines[1:]]
    assert got == [(run, step) for run in ("seed000005", "seed000003") for step in range(8, 21)]

    # The run page's chart filter works here too, on the compared runs' series names.
    page.goto(f"{seeded.url}/#/compare?runs=seed000005,seed000003&filter=LR")
    expect(page.locator(".chart-controls output[name=filter-count]")).to_have_text("1 of 2 charts")
    assert page.locator("#charts .chart-card:visible").evaluate_all(
        "(cards) => cards.map((card) => card.dataset.chart)"
    ) == ["lr"]
    assert not page.errors, page.errors


def test_nothing_from_a_run_is_run_as_html_in_the_list_or_compare(
    seeded: ServerProcess, browser: Any, tmp_path: Path
) -> None:
    hostile = '<img src=x onerror="window.pwned=1">'
    status, _ = seeded.send("PATCH", "/api/v1/runs/seed000001", {"name": hostile, "notes": hostile})
    assert status == 200
    status, _ = seeded.send("PATCH", "/api/v1/runs/seed000001", {"tags": ["<b>x</b>"]})
    assert status == 200
    page = open_page(seeded, browser, "/#/?q=" + json.dumps("onerror")[1:-1])
    expect(page.locator("tr.run-row")).to_have_count(1)
    expect(page.locator("tr.run-row a").first).to_have_text(hostile)
    expect(page.locator("tr.run-row .tag")).to_have_text("<b>x</b>")
    page.goto(seeded.url + "/#/compare?runs=seed000001,seed000002")
    expect(page.locator(".compared-runs li").first).to_contain_text(hostile)
    assert page.evaluate("window.pwned") is None
    assert (
        seeded.send("PATCH", "/api/v1/runs/seed000001", {"name": "run-00001", "tags": []})[0] == 200
    )


def test_a_run_archived_elsewhere_leaves_an_open_list_that_hides_archived_runs(
    server: ServerProcess, browser: Any
) -> None:
    seed_runs(server.db, 2, steps=5)
    hiding = open_page(server, browser, "/#/")
    showing = open_page(server, browser, "/#/?archived=include")
    for page in (hiding, showing):
        expect(page.locator("tr.run-row")).to_have_count(2)
    assert server.send("PATCH", "/api/v1/runs/seed000001", {"archived": True})[0] == 200
    # Pushed live: gone from the list that hides archived runs, marked in the other.
    expect(hiding.locator("tr.run-row")).to_have_count(1)
    expect(hiding.locator("#run-count")).to_have_text("1 run")
    expect(showing.locator("tr.run-row.archived")).to_have_count(1)
    expect(showing.locator("tr.run-row")).to_have_count(2)
    assert not hiding.errors and not showing.errors


def test_a_compare_link_to_a_run_not_there_yet_draws_it_once_it_comes(
    server: ServerProcess, browser: Any
) -> None:
    """A link made before its run's agent reached the server (as a run page waits for such a
    run): "not found" until the run's first summary, then drawn in its place, live."""
    seed_runs(server.db, 1, steps=5)
    late = Run(resolve(server=server.url, project="live", run_name="late", config={"lr": 0.5}),
               system_metrics=False, watchdog=False)  # fmt: skip
    page, errors = erring_page(browser)
    page.goto(server.url + f"/#/compare?runs=seed000000,{late.id}")
    legend = page.locator(".compared-runs li")
    expect(legend.nth(1).locator("[data-missing]")).to_have_text("not found")
    loss = page.locator('[data-chart="loss"]')
    expect(loss).to_have_attribute("data-series", "1")
    late.start()
    for step in range(1, 4):
        late.log(step, {"loss": 2.0 / step})
    expect(legend.nth(1)).to_contain_text("late")
    expect(legend.nth(1).locator("[data-status]")).to_have_text("running")
    expect(loss).to_have_attribute("data-series", "2")
    expect(page.locator('#config-compare tr[data-config-key="lr"] td')).to_have_text(
        ["0.001", "0.5"]
    )
    late.log(4, {"loss": 0.25})  # and followed live from there
    wait_for(
        lambda: (
            loss.locator(".plot").evaluate(
                f"(plot) => plot.data.find((t) => t.legendgroup === {late.id!r})?.x.length"
            )
            == 4
        ),
        what="the late run's four steps drawn",
    )
    assert late.finish()
    expect(legend.nth(1).locator("[data-status]")).to_have_text("finished")
    page.evaluate("0")
    assert not errors


def test_an_old_run_pushed_whole_takes_its_place_in_the_list_not_the_top(
    server: ServerProcess, browser: Any
) -> None:
    """A rename (or a run marked lost) pushes the whole summary of a run that may be old: on
    the first page of the newest-first list it goes where its start puts it, and a run of a
    later page stays off this one."""
    seed_runs(server.db, 52, steps=2)
    page = open_page(server, browser, "/#/")
    rows = page.locator("tr.run-row")
    expect(rows).to_have_count(50)
    expect(page.locator("#run-count")).to_have_text("52 runs")

    def rename(run: str, name: str) -> int:
        return server.send("PATCH", f"/api/v1/runs/{run}", {"name": name})[0]

    assert rename("seed000000", "oldest, renamed") == 200  # on the second page
    assert rename("seed000051", "newest, renamed") == 200  # pushed after it
    expect(rows.first).to_contain_text("newest, renamed")
    expect(rows).to_have_count(50)
    expect(page.locator("#run-count")).to_have_text("52 runs")
    assert "oldest, renamed" not in page.locator("#runs-body").inner_text()
    # The newest deleted: 49 listed of 51. The run of the next page renamed again is counted
    # there already: the page read again lists 50 (down to seed000001), and 51 runs still.
    assert server.send("DELETE", "/api/v1/runs/seed000051")[0] == 200
    expect(rows).to_have_count(49)
    expect(page.locator("#run-count")).to_have_text("51 runs")
    assert rename("seed000000", "oldest, renamed again") == 200
    expect(rows).to_have_count(50)
    expect(rows.last).to_contain_text("run-00001")
    expect(page.locator("#run-count")).to_have_text("51 runs")
    assert "oldest, renamed" not in page.locator("#runs-body").inner_text()

    # Runs that come to pass the filter by a rename: each in its place by its start.
    page.goto(server.url + "/#/?q=mark")
    expect(page.locator("#runs-body td.empty")).to_contain_text("No runs match")
    for i in (10, 30, 20):
        assert rename(f"seed0000{i}", f"mark {i}") == 200
    expect(rows).to_have_count(3)
    expect(rows).to_have_text([re.compile("mark 30"), re.compile("mark 20"), re.compile("mark 10")])
    expect(page.locator("#run-count")).to_have_text("3 runs")
    assert not page.errors


#: A page script that holds the live websocket back until ``__releaseLive()``: as a page whose
#: live stream opens only after its run was fetched (a slow proxy, a loaded server).
HOLD_LIVE = """
const Real = window.WebSocket;
const held = [];
window.__releaseLive = () => {
  window.__released = true;
  for (const open of held.splice(0)) open();
};
window.WebSocket = class {
  constructor(url) {
    this.readyState = 0;
    const open = () => {
      const socket = this.socket = new Real(url);
      socket.onopen = (event) => { this.readyState = 1; this.onopen?.(event); };
      socket.onmessage = (event) => this.onmessage?.(event);
      socket.onclose = (event) => { this.readyState = 3; this.onclose?.(event); };
    };
    if (url.includes("/api/v1/live") && !window.__released) held.push(open); else open();
  }
  send(data) { this.socket.send(data); }
  close() { this.socket?.close(); }
};
"""


def test_a_run_deleted_before_its_pages_live_stream_opened_says_so(
    server: ServerProcess, browser: Any
) -> None:
    seed_runs(server.db, 1, steps=5)
    page, errors = erring_page(browser)
    page.add_init_script(HOLD_LIVE)
    page.goto(server.url + "/#/runs/seed000000")
    expect(page.locator("#run-name")).to_have_text("run-00000")  # fetched, not yet live
    assert server.send("DELETE", "/api/v1/runs/seed000000")[0] == 200  # told to no one
    page.evaluate("window.__releaseLive()")
    expect(page.locator("[data-panel=deleted]")).to_contain_text("This run was deleted")
    assert not errors


def test_a_run_begun_while_the_list_loads_is_listed(server: ServerProcess, browser: Any) -> None:
    """The list's answer is read before a run begins; the run's first summary (the only one
    pushed whole) reaches the page before that answer does: the run is listed all the same,
    not dropped as one the answer lacked (a loaded CI host made this order)."""
    seed_runs(server.db, 1, steps=5)
    page, errors = erring_page(browser)
    frames: list[str] = []
    page.on("websocket", lambda ws: ws.on("framereceived", lambda data: frames.append(str(data))))
    held: list[tuple[Any, Any]] = []
    page.route("**/api/v1/runs?**", lambda route: held.append((route, route.fetch())), times=1)

    page.goto(server.url + "/")
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "live")
    wait_for(lambda: pumped(page, lambda: held), what="the list's answer, read and held")
    run = Run(resolve(server=server.url, project="vision", run_name="begun-meanwhile"),
              system_metrics=False, watchdog=False)  # fmt: skip
    run.start()
    try:
        wait_for(lambda: pumped(page, lambda: any(run.id in frame for frame in frames)),
                 what="the new run's summary pushed to the page")  # fmt: skip
        route, answer = held[0]
        route.fulfill(response=answer)
        expect(page.locator("tr.run-row")).to_have_count(2)
        expect(page.locator("tr.run-row a").first).to_have_text("begun-meanwhile")
        expect(page.locator("#run-count")).to_have_text("2 runs")
        assert not errors
    finally:
        run.finish()


def test_a_run_deleted_while_its_page_loads_says_so(server: ServerProcess, browser: Any) -> None:
    """Deleted between its summary's answer and its points' (a CI host was slow enough): the
    points' 404 is the deletion, said as one, not a failed page."""
    seed_runs(server.db, 1, steps=5)
    page, errors = erring_page(browser)
    delete_before_its_points(server, page, "seed000000")
    page.goto(server.url + "/#/runs/seed000000")
    expect(page.locator("[data-panel=deleted]")).to_contain_text("This run was deleted")
    expect(page.locator("#run-name")).to_have_text("run-00000")
    assert page.locator("#app > p.error").count() == 0
    assert not errors


def test_a_run_deleted_before_the_alert_feeds_first_read_answers_says_so(
    server: ServerProcess, browser: Any
) -> None:
    """The banner's alert feed, read as the app opens, answers after the run page drew and its
    run was deleted: the page reads the run's alerts again, and their 404 is the deletion, said
    as one, not an unhandled error (a CI host made this order)."""
    seed_runs(server.db, 1, steps=5)
    page, errors = erring_page(browser)
    held: list[Any] = []
    page.route(lambda url: "/api/v1/alerts?" in url, lambda route: held.append(route))
    asked: list[tuple[str, int]] = []
    page.on("response", lambda response: asked.append((response.url, response.status)))
    page.goto(server.url + "/#/runs/seed000000")
    expect(page.locator("#run-name")).to_have_text("run-00000")
    wait_for(lambda: pumped(page, lambda: len(held) == 1), what="the feed's first read")
    assert server.send("DELETE", "/api/v1/runs/seed000000")[0] == 200
    expect(page.locator("[data-panel=deleted]")).to_contain_text("This run was deleted")
    seen = len(asked)
    held[0].continue_()
    run = server.url + "/api/v1/runs/seed000000"

    def read_again() -> list[tuple[str, int]]:
        return [a for a in asked[seen:] if a[0].startswith(run)]

    wait_for(lambda: pumped(page, read_again), what="the run's alerts read again")
    assert read_again()[0] == (run + "/alerts", 404)
    # Then the run read, found gone; before, the 404 was left unhandled (a page error).
    wait_for(lambda: pumped(page, lambda: errors or len(read_again()) > 1), what="what follows")
    assert not errors
    assert read_again() == [(run + "/alerts", 404), (run, 404)]
    assert page.locator("#app > p.error").count() == 0


def test_a_run_deleted_while_its_live_streams_first_open_reads_it_says_so(
    server: ServerProcess, browser: Any
) -> None:
    """The stream opens while the page loads: its reload reads the run, still there, then asks for
    its points, and the run goes before they are read. Both loads' 404s are the deletion, said as
    one, and none is left unhandled (stop 37's CI host made this order)."""
    seed_runs(server.db, 1, steps=5)
    page, errors = erring_page(browser)
    page.add_init_script(HOLD_LIVE)
    held: list[Any] = []
    page.route("**/api/v1/runs/seed000000/series?**", lambda route: held.append(route))

    page.goto(server.url + "/#/runs/seed000000")
    wait_for(lambda: pumped(page, lambda: len(held) == 1), what="the load to ask for the points")
    page.evaluate("window.__releaseLive()")  # its first open reloads: the run is read again
    wait_for(lambda: pumped(page, lambda: len(held) == 2), what="the reload to ask for them")
    assert server.send("DELETE", "/api/v1/runs/seed000000")[0] == 200
    for route in held:
        route.continue_()
    expect(page.locator("[data-panel=deleted]")).to_contain_text("This run was deleted")
    expect(page.locator("#run-name")).to_have_text("run-00000")
    page.evaluate("0")
    assert not errors


def test_compared_runs_deleted_as_the_view_loads_or_later_are_marked_and_keep_their_traces(
    server: ServerProcess, browser: Any
) -> None:
    seed_runs(server.db, 2, steps=5)
    page, errors = erring_page(browser)
    delete_before_its_points(server, page, "seed000000")
    page.goto(server.url + "/#/compare?runs=seed000000,seed000001")
    loss = page.locator('[data-chart="loss"]')
    expect(loss).to_have_attribute("data-series", "1")  # the other run's, drawn
    legend = page.locator(".compared-runs li")
    expect(legend.nth(0).locator("[data-deleted]")).to_have_text("deleted")
    expect(legend.nth(1).locator("[data-status]")).to_have_text("crashed")
    heads = page.locator("#summary-compare thead th")
    expect(heads).to_have_text(["series", "run-00000 deleted", "run-00001"])
    # Deleted while the view is open: marked, its traces and summaries kept.
    assert server.send("DELETE", "/api/v1/runs/seed000001")[0] == 200
    expect(legend.nth(1).locator("[data-deleted]")).to_have_text("deleted")
    expect(heads).to_have_text(["series", "run-00000 deleted", "run-00001 deleted"])
    assert legend.nth(1).locator("[data-status]").count() == 0
    expect(loss).to_have_attribute("data-series", "1")
    expect(page.locator('#summary-compare tr[data-summary="loss"] td').nth(1)).not_to_have_text("—")
    page.evaluate("0")
    assert not errors


def test_a_compare_link_naming_runs_that_are_gone_shows_the_others(
    server: ServerProcess, browser: Any, tmp_path: Path
) -> None:
    """A shared link outlives a run it names (or names one that never was): the view opens
    with the runs that are there, each in its place and colour, and says which are not."""
    seed_runs(server.db, 22, steps=5)  # runs 0 and 21 have the same config
    assert server.send("DELETE", "/api/v1/runs/seed000001")[0] == 200
    page, errors = erring_page(browser)
    page.goto(server.url + "/#/compare?runs=seed000000,seed000001,nosuchrun,seed000021")
    loss = page.locator('[data-chart="loss"]')
    expect(loss).to_have_attribute("data-series", "2")
    legend = page.locator(".compared-runs li")
    expect(legend).to_have_count(4)
    expect(legend.locator("[data-missing]")).to_have_count(2)
    expect(legend.nth(1)).to_contain_text("seed000001")
    expect(legend.nth(1).locator("[data-missing]")).to_have_text("not found")
    expect(legend.nth(2).locator("[data-missing]")).to_have_text("not found")
    expect(legend.nth(3).locator("[data-status]")).to_have_text("crashed")
    # The runs still there keep the colours of their places in the link.
    colours = legend.locator(".swatch").evaluate_all("els => els.map(e => e.style.background)")
    assert colours[3] == "rgb(204, 121, 167)" and colours[0] == "rgb(0, 114, 178)"
    heads = page.locator("#summary-compare thead th")
    expect(heads).to_have_text(
        ["series", "run-00000", "seed000001 not found", "nosuchrun not found", "run-00021"]
    )
    # A run not found has no config: the two runs there agree, and no key differs.
    expect(page.locator("#config-differ")).to_have_text("(0 of 2 keys differ, marked)")
    # Nor points: a chart's file holds those of the runs there.
    _, lines = download(page, "loss", "csv", tmp_path)
    assert {line.split(",")[0] for line in lines[1:]} == {"seed000000", "seed000021"}
    assert page.locator("#app > p.error").count() == 0
    page.evaluate("0")
    assert not errors


def test_a_run_is_renamed_tagged_noted_archived_and_deleted_from_its_page(
    server: ServerProcess, browser: Any
) -> None:
    seed_runs(server.db, 2, steps=5)
    page = open_page(server, browser, "/#/runs/seed000001")
    expect(page).to_have_title("run-00001 · trainvitals")
    page.locator("#run-edit summary").click()
    page.locator(".edit-form input[name=name]").fill("lr 3e-4, warm-up")
    page.locator(".edit-form input[name=tags]").fill("baseline,  sweep-2 ,")
    page.locator(".edit-form textarea[name=notes]").fill("diverged after the warm-up\nretry lower")
    page.locator(".edit-form button[type=submit]").click()
    expect(page.locator(".edit-status")).to_have_text("Saved.")
    expect(page.locator("#run-name")).to_have_text("lr 3e-4, warm-up")
    expect(page).to_have_title("lr 3e-4, warm-up · trainvitals")
    expect(page.locator("#run-status .tag")).to_have_text(["baseline", "sweep-2"])
    expect(page.locator("#run-notes")).to_have_text("diverged after the warm-up\nretry lower")
    run = server.get("/api/v1/runs/seed000001")
    assert (run["name"], run["tags"]) == ("lr 3e-4, warm-up", ["baseline", "sweep-2"])

    page.locator(".edit-form input[name=tags]").fill('say "hi"')
    page.locator(".edit-form button[type=submit]").click()
    expect(page.locator(".edit-status")).to_contain_text("422")  # the server's reason, shown

    page.locator('[data-action="archive"]').click()
    expect(page.locator(".archived-badge")).to_have_count(1)
    page.goto(server.url + "/#/")
    expect(page.locator("tr.run-row")).to_have_count(1)
    page.locator("select[name=archived]").select_option("only")
    expect(page.locator("tr.run-row")).to_have_count(1)
    expect(page.locator("tr.run-row.archived")).to_contain_text("lr 3e-4, warm-up")

    # Deleted elsewhere: gone from the list already open, without a reload.
    page.locator("select[name=archived]").select_option("include")
    expect(page.locator("tr.run-row")).to_have_count(2)
    watching = open_page(server, browser, "/#/runs/seed000000")
    expect(watching.locator("#run-name")).to_have_text("run-00000")
    assert server.send("DELETE", "/api/v1/runs/seed000000")[0] == 200
    expect(page.locator("tr.run-row")).to_have_count(1)
    expect(watching.locator("[data-panel=deleted]")).to_contain_text("This run was deleted")
    expect(page.locator("#run-count")).to_have_text("1 run")

    page.goto(server.url + "/#/runs/seed000001")
    page.locator("#run-edit summary").click()
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator('[data-action="delete"]').click()
    expect(page).to_have_title("Runs · trainvitals")
    assert server.get_status("/api/v1/runs/seed000001")[0] == 404
    assert server.get("/api/v1/runs?archived=include")["total"] == 0
    assert not page.errors


def test_a_page_whose_server_did_not_answer_tries_again_by_itself(
    server: ServerProcess, browser: Any
) -> None:
    """The runs list's first two requests get no answer at all (a server restarting, a
    network blip): the page says so, then loads by itself, with no reload. An HTTP error is
    an answer, and stays on the page."""
    seed_runs(server.db, 1, steps=5)
    page, errors = erring_page(browser)
    page.route("**/api/v1/runs?**", lambda route: route.abort("connectionreset"), times=2)
    page.goto(server.url + "/")
    expect(page.locator("tr.run-row")).to_have_count(1)
    page.goto(server.url + "/#/?sort=nonsense")
    expect(page.locator("p.error")).to_contain_text("422")
    assert not errors
