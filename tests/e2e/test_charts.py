"""The run page's charts in Chromium: smoothing, log axes, x-axis in steps or time, an
outlier-proof y-range, zooms synced across charts and read again at full detail, and
downloads of the series (#17)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from harness.processes import ServerProcess
from harness.seed import seed_runs
from tests.e2e.test_dashboard import expect
from trainvitals import Run, resolve
from trainvitals.server.routes.series import MAX_POINTS_LIMIT

STEPS = 3000
T0 = 1.7e9


def loss_at(step: int) -> float:
    # Noisy and falling, then ten steps of an explosion: 1e30 would flatten everything else.
    return 1e30 if step > STEPS - 10 else 1.0 / math.sqrt(step) + 0.1 * math.sin(step)


#: Bytes free on a disk that barely changes: its ticks must still read apart.
DISK_FREE = 81.33e9

#: The learning rate as the agent reads it from a float32 variable (0.001 is not one).
LR = 0.0010000000474974513

#: Steps in an epoch of the run that explodes (its "epoch" series ends one every EPOCH steps).
EPOCH = 500

#: The points of the long run: more than the series route gives at most (its max_points cap).
LONG = MAX_POINTS_LIMIT + 500


@pytest.fixture(scope="module")
def charted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    """A server with a run of STEPS steps that explodes at its end, streamed by the agent, and
    a run of LONG loss points written straight into its database (``seed000000``)."""
    db = str(tmp_path_factory.mktemp("charts") / "charts.db")
    seed_runs(db, 1, steps=LONG)
    server = ServerProcess(db)
    try:
        run = Run(resolve(server=server.url, project="charts", run_name="explodes"),
                  system_metrics=False, watchdog=False,
                  env={"host": {"memory_limit": 25276502016, "cpu_count": 2},
                       "variable_order": [f"mlp/d_{i}/<kernel>" for i in range(30)]})  # fmt: skip
        run.start()
        for step in range(1, STEPS + 1):
            values = {"loss": loss_at(step), "grad/global_norm": 1.0 + step % 7, "lr": LR,
                      "host/disk_free": DISK_FREE + 4096.0 * (step % 100)}  # fmt: skip
            if step % EPOCH == 0:
                values["epoch"] = step // EPOCH
            run.log(step, values, time_=T0 + 0.5 * step)
        assert run.finish()
        yield server, run.id
    finally:
        server.stop()


def plot(page: Any, chart: str, expression: str) -> Any:
    return page.evaluate(
        f"""() => {{ const plot = document.querySelector('[data-chart="{chart}"] .plot');
                     return {expression}; }}"""
    )


def texts(page: Any, chart: str, ticks: str) -> list[str]:
    """The labels of a chart's ticks ("ytick", "xtick"), plotly's minus sign written "-"."""
    found: list[str] = page.locator(f'[data-chart="{chart}"] .{ticks} text').evaluate_all(
        "(texts) => texts.map((text) => text.textContent.replaceAll('\u2212', '-'))"
    )
    return found


def drawn(page: Any, chart: str = "loss") -> int:
    """The points the chart draws, once it draws every point it holds."""
    page.wait_for_function(
        f"""() => {{ const card = document.querySelector('[data-chart="{chart}"]');
                     return card && card.dataset.drawn > 0
                            && card.dataset.drawn === card.dataset.points; }}"""
    )
    return int(page.locator(f'[data-chart="{chart}"]').get_attribute("data-drawn"))


def run_page(browser: Any, server: ServerProcess, run_id: str) -> tuple[Any, list[str]]:
    """A new page on the run's page, and the errors it raises, as they come."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{server.url}/#/runs/{run_id}")
    return page, errors


def test_charts_smooth_switch_axes_clip_outliers_and_zoom_together(
    charted: tuple[ServerProcess, str], browser: Any
) -> None:
    server, run_id = charted
    page, errors = run_page(browser, server, run_id)
    loss = page.locator('[data-chart="loss"]')
    assert 1900 < drawn(page) <= 2000  # downsampled from 3000

    # Bytes in binary units, as alerts write them; a disk that loses a few kilobytes of its
    # 75 GiB is a flat line on a range of a few percent of it, not a cliff; no two ticks alike.
    drawn(page, "disk_free")
    ticks = texts(page, "disk_free", "ytick")
    assert len(ticks) >= 3 and len(set(ticks)) == len(ticks), ticks
    assert all(re.fullmatch(r"7[56](\.\d)? GiB", tick) for tick in ticks), ticks
    assert plot(page, "disk_free", "plot.data[0].text[0]") == "75.7 GiB"  # on hover too
    low, high = plot(page, "disk_free", "plot.layout.yaxis.range")
    assert high - low >= 0.02 * DISK_FREE
    numbers = page.evaluate(
        """async () => { const f = await import('/static/format.js');
                         const { byteTicks } = await import('/static/plotmath.js');
                         return [[22073950208, 1536, 100, 5 * 2 ** 40].map(f.formatBytes),
                                 [1.5e12, 1.5438e17, 1.2e-5, 0.1234567, 7]
                                   .map((v) => f.formatNumber(v)),
                                 f.formatTicks([9e-4, 1e-3, 1.1e-3]), f.formatTicks([0, 1.5e12]),
                                 [154382015388604832, 4.23, 37.4].map(f.formatRatio),
                                 byteTicks([0, 25e9]).ticktext]; }"""
    )
    assert numbers == [
        ["20.6 GiB", "1.5 KiB", "100 B", "5 TiB"],
        ["1500000000000", "1.544e17", "1.2e-5", "0.1235", "7"],
        ["9e-4", "1e-3", "1.1e-3"], ["0", "1.5e12"],
        ["1.5e17x", "4.2x", "37x"],
        ["0 GiB", "5 GiB", "10 GiB", "15 GiB", "20 GiB"],
    ]  # fmt: skip

    # The Summary and the Environment write bytes as the axes do, the bytes in the title.
    disk = page.locator('#run-summary [data-summary="host/disk_free"] td').first
    expect(disk).to_have_text("75.7 GiB")
    limit = page.locator("#run-env [data-bytes]")
    expect(limit).to_have_text("23.5 GiB")
    assert limit.get_attribute("title") == "25276502016 bytes"
    # The model's 30 variable paths fold behind their count, escaped.
    order = page.locator("#run-env tr", has=page.locator("th", has_text="variable_order"))
    order = order.locator("details")  # argv folds too when pytest is given many arguments
    expect(order.locator("summary")).to_have_text("30 items")
    assert "mlp/d_29/<kernel>" in (order.locator("code").text_content() or "")

    # The learning rate (a float32 0.001, all along) is a line on a range around it, its ticks
    # its values in full, log or linear: not plotly's ±1 and -0.00100000004749745282.
    drawn(page, "lr")
    rate = page.locator('[data-chart="lr"]')
    assert plot(page, "lr", "plot.data[0].mode") == "lines"
    for switch in ("log", "linear"):
        ticks = texts(page, "lr", "ytick")
        values = [float(tick) for tick in ticks]
        assert len(values) >= 2 and all(0.0005 < value < 0.002 for value in values), ticks
        assert all(len(tick) <= 7 for tick in ticks), ticks
        if switch == "log":
            rate.locator('[data-tool="log"]').click()
            expect(rate).to_have_attribute("data-log", "false")

    # The explosion does not flatten the loss: its y-range holds the bulk of the values.
    expect(loss).to_have_attribute("data-clipped", "true")
    top = plot(page, "loss", "plot.layout.yaxis.range[1]")
    assert 1.0 < top < 10.0
    page.locator(".chart-controls [name=clip]").uncheck()
    expect(loss).to_have_attribute("data-clipped", "false")
    assert plot(page, "loss", "plot.layout.yaxis.autorange") is True
    # Up to 1e30, in scientific notation: never an SI prefix ("1.5T" reads as a size).
    ticks = texts(page, "loss", "ytick")
    assert all(re.fullmatch(r"[\d.]+(e\+\d+)?", tick) for tick in ticks), ticks
    assert any("e+" in tick for tick in ticks), ticks
    page.locator(".chart-controls [name=clip]").check()

    # Log or linear, per chart.
    loss.locator('[data-tool="log"]').click()
    expect(loss.locator('[data-tool="log"]')).to_have_attribute("aria-pressed", "true")
    assert plot(page, "loss", "plot.layout.yaxis.type") == "log"
    assert plot(page, "grad_norm", "plot.layout.yaxis.type") == "log"  # its own default

    # Each tick says its value: no power of ten in view, round values in full, not a lone 2
    # and 5 whose decade nobody can tell. The y-axis dragged alone (plotly keeps that range)
    # takes its ticks along; reset, the data's again.
    def ticks_after(relayout: str, expected: list[str]) -> None:
        # On screen: a chart out of view redraws only once it comes back (the run's critical
        # alert above the charts can push this one below the fold). A redraw still pending
        # then (the chart back on screen, an alert marker, the clip just toggled) puts the
        # data's range back after the drag: the drag is made again until its ticks show.
        page.locator('[data-chart="grad_norm"]').scroll_into_view_if_needed()
        page.wait_for_function(
            f"""(expected) => {{
                const plot = document.querySelector('[data-chart="grad_norm"] .plot');
                const ticks = [...plot.querySelectorAll('.ytick text')].map((t) => t.textContent);
                if (JSON.stringify(ticks) === JSON.stringify(expected)) return true;
                Plotly.relayout(plot, {relayout});
                return false;
            }}""",
            arg=expected,
            polling=200,
        )

    drawn(page, "grad_norm")
    in_full = ["0.2", "0.4", "0.6", "0.8"]
    ticks_after("{'yaxis.range': [Math.log10(0.19), Math.log10(0.85)]}", in_full)
    ticks_after("{'yaxis.range[0]': -5, 'yaxis.range[1]': 3}", ["1e-4", "1e-2", "1", "1e2"])
    ticks_after("{'yaxis.autorange': true}", ["1", "2", "5"])  # 1 to 7
    spacing = page.evaluate(
        """async () => { const { logTicks } = await import('/static/plotmath.js');
                         const log = Math.log10;
                         return [logTicks([log(0.8), log(0.2)]), logTicks([log(2e-5), log(6e-5)]),
                                 logTicks([log(0.023), log(0.17)]),
                                 logTicks([-2, 0.5]), logTicks([-20, 3]), logTicks(null)]
                           .map((ticks) => ticks?.ticktext ?? null); }"""
    )
    assert spacing == [
        ["0.2", "0.4", "0.6", "0.8"], ["2e-5", "3e-5", "4e-5", "5e-5", "6e-5"],
        ["0.03", "0.05", "0.1"],  # a step time's: not 0.04 to 0.16 crowding the top
        ["0.01", "0.02", "0.05", "0.1", "0.2", "0.5", "1", "2"],
        ["1e-20", "1e-16", "1e-12", "1e-8", "1e-4", "1"], None,
    ]  # fmt: skip
    loss.locator('[data-tool="log"]').click()
    expect(loss.locator('[data-tool="log"]')).to_have_attribute("aria-pressed", "false")

    # TensorBoard's debiased EMA, the raw series faint behind it.
    page.locator(".chart-controls [name=smoothing]").fill("0.9")
    expect(page.locator(".chart-controls output[name=smoothing-value]")).to_have_text("0.90")
    wait_traces = "plot.data.map((t) => [t.meta ?? null, t.opacity ?? 1, t.y.slice(0, 3)])"
    page.wait_for_function(
        """() => document.querySelector('[data-chart="loss"] .plot').data.length === 2"""
    )
    traces = plot(page, "loss", wait_traces)
    assert [(meta, opacity) for meta, opacity, _ in traces] == [("raw", 0.25), ("smoothed", 1)]
    raw, smoothed = traces[0][2], traces[1][2]
    expected, last = [], 0.0
    for n, value in enumerate(raw, start=1):
        last = 0.9 * last + 0.1 * value
        expected.append(last / (1 - 0.9**n))
    assert smoothed == pytest.approx(expected) and smoothed[0] == pytest.approx(raw[0])
    page.locator(".chart-controls [name=smoothing]").fill("0")
    expect(page.locator(".chart-controls output[name=smoothing-value]")).to_have_text("0.00")

    # A zoom on one chart zooms the others and reads its steps again at full detail.
    page.evaluate(
        """() => Plotly.relayout(document.querySelector('[data-chart="loss"] .plot'),
                                 {'xaxis.range[0]': 1000, 'xaxis.range[1]': 1100})"""
    )
    expect(page.locator("#charts")).to_have_attribute("data-detail", "1000-1100")
    assert plot(page, "grad_norm", "plot.layout.xaxis.range") == [1000, 1100]
    in_view = "plot.data[0].x.filter((x) => x >= 1000 && x <= 1100).length"
    page.wait_for_function(
        f"""() => {{ const plot = document.querySelector('[data-chart="loss"] .plot');
                     return {in_view} === 101; }}"""
    )
    zoomed_top = plot(page, "loss", "plot.layout.yaxis.range[1]")
    assert zoomed_top < top  # the y-range follows the zoom
    page.locator(".chart-controls [name=reset-zoom]").click()
    page.wait_for_function(
        """() => document.querySelector('[data-chart="grad_norm"] .plot').layout.xaxis.autorange"""
    )

    # Time since the start, the epoch, or wall-clock time, instead of steps: every chart.
    charts = ["loss", "lr", "grad_norm", "disk_free"]

    def x_axis(title: str) -> None:
        for chart in charts:
            page.locator(f'[data-chart="{chart}"]').scroll_into_view_if_needed()
            page.wait_for_function(
                f"""(title) => document.querySelector('[data-chart="{chart}"] .plot')
                                   .layout.xaxis.title.text === title""",
                arg=title,
            )

    page.locator(".chart-controls [name=xaxis]").select_option("relative")
    x_axis("time since start (s)")
    start = server.get(f"/api/v1/runs/{run_id}")["started_at"]
    for chart in charts:
        first_x = plot(page, chart, "plot.data[0].x[0]")
        assert first_x == pytest.approx(T0 + 0.5 - start)
    # Keras's epochs: epoch 2 ends at x = 2, its steps between 1 and 2.
    page.locator(".chart-controls [name=xaxis]").select_option("epoch")
    x_axis("epoch")
    expect(page).to_have_url(re.compile(r"x=epoch"))
    for chart in charts:
        xs = plot(page, chart, "plot.data[0].x")
        assert xs[0] == pytest.approx(1 / EPOCH, abs=0.01), chart
        assert xs[-1] == pytest.approx(STEPS / EPOCH, abs=0.01), chart
        assert len(xs) > 100 and all(a <= b for a, b in pairwise(xs)), chart
    page.locator(".chart-controls [name=xaxis]").select_option("wall")
    page.wait_for_function(
        """() => document.querySelector('[data-chart="loss"] .plot').layout.xaxis.type === 'date'"""
    )
    assert not errors, errors


@pytest.mark.parametrize(("scheme", "ink"), [("light", "#1d2330"), ("dark", "#e5e7eb")])
def test_the_global_norm_is_drawn_in_the_pages_ink_light_or_dark(
    charted: tuple[ServerProcess, str], browser: Any, scheme: str, ink: str
) -> None:
    server, run_id = charted
    page = browser.new_page(color_scheme=scheme)
    page.goto(f"{server.url}/#/runs/{run_id}")
    drawn(page, "grad_norm")
    colours = plot(
        page, "grad_norm", "Object.fromEntries(plot.data.map((t) => [t.name, t.line.color]))"
    )
    assert colours["grad/global_norm"] == ink  # near-black on a dark page could not be seen


def test_the_charts_view_is_in_the_address_a_link_draws_them_the_same(
    charted: tuple[ServerProcess, str], browser: Any
) -> None:
    server, run_id = charted
    page, errors = run_page(browser, server, run_id)
    drawn(page)
    controls = page.locator(".chart-controls")
    controls.locator("[name=xaxis]").select_option("wall")
    controls.locator("[name=smoothing]").fill("0.6")
    controls.locator("[name=clip]").uncheck()
    expect(page).to_have_url(f"{server.url}/#/runs/{run_id}?x=wall&smooth=0.60&clip=0")
    assert page.evaluate("history.length") == 2  # the page and its view: no entry per change

    # Opened from the link in a fresh browser (nothing remembered), the charts are drawn so.
    fresh = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    fresh.on("pageerror", lambda exc: errors.append(str(exc)))
    fresh.goto(page.url)
    drawn(fresh)
    fresh_controls = fresh.locator(".chart-controls")
    expect(fresh_controls.locator("[name=xaxis]")).to_have_value("wall")
    expect(fresh_controls.locator("output[name=smoothing-value]")).to_have_text("0.60")
    expect(fresh_controls.locator("[name=clip]")).not_to_be_checked()
    assert plot(fresh, "loss", "plot.layout.xaxis.type") == "date"
    expect(fresh.locator('[data-chart="loss"]')).to_have_attribute("data-clipped", "false")
    assert plot(fresh, "loss", "plot.data.map((t) => t.meta)") == ["raw", "smoothed"]

    # What the address says otherwise is ignored: the default view, nothing run from it.
    fresh.goto(f"{server.url}/#/runs/{run_id}?x=%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E"
               "&smooth=lots&clip=2")  # fmt: skip
    drawn(fresh)
    expect(fresh_controls.locator("[name=xaxis]")).to_have_value("step")
    expect(fresh_controls.locator("[name=clip]")).to_be_checked()
    assert plot(fresh, "loss", "plot.layout.xaxis.type") == "linear"
    assert not errors, errors
    fresh.context.close()


def test_each_charts_log_switch_is_in_the_address_and_a_link_draws_it_the_same(
    charted: tuple[ServerProcess, str], browser: Any
) -> None:
    server, run_id = charted
    page, errors = run_page(browser, server, run_id)
    drawn(page, "grad_norm")

    def log_switch(on: Any, chart: str) -> Any:
        return on.locator(f'[data-chart="{chart}"] [data-tool="log"]')

    log_switch(page, "loss").click()  # linear by default
    log_switch(page, "grad_norm").click()  # log by default
    expect(page).to_have_url(f"{server.url}/#/runs/{run_id}?log=loss&lin=grad_norm")

    fresh = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    fresh.on("pageerror", lambda exc: errors.append(str(exc)))
    fresh.goto(page.url)
    drawn(fresh)
    drawn(fresh, "grad_norm")
    expect(log_switch(fresh, "loss")).to_have_attribute("aria-pressed", "true")
    expect(log_switch(fresh, "grad_norm")).to_have_attribute("aria-pressed", "false")
    assert plot(fresh, "loss", "plot.layout.yaxis.type") == "log"
    assert plot(fresh, "grad_norm", "plot._fullLayout.yaxis.type") == "linear"
    # Switched back to its own default, a chart leaves the address.
    log_switch(fresh, "loss").click()
    expect(fresh).to_have_url(f"{server.url}/#/runs/{run_id}?lin=grad_norm")

    # Ids that do not decode, name no chart, or carry markup change nothing and run nothing.
    fresh.goto(f"{server.url}/#/runs/{run_id}?log=%25E0%25A4,%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E"
               "&lin=nope")  # fmt: skip
    expect(log_switch(fresh, "grad_norm")).to_have_attribute("aria-pressed", "true")
    expect(log_switch(fresh, "loss")).to_have_attribute("aria-pressed", "false")
    drawn(fresh, "grad_norm")
    assert fresh.locator("#app img").count() == 0
    assert not errors, errors
    fresh.context.close()


def shown_charts(page: Any) -> list[str]:
    return list(page.locator("#charts .chart-card:visible").evaluate_all(
        "(cards) => cards.map((card) => card.dataset.chart)"))  # fmt: skip


def test_the_chart_filter_shows_the_charts_it_names_and_a_link_keeps_it(
    charted: tuple[ServerProcess, str], browser: Any
) -> None:
    """TensorBoard's tag filter: |-separated words, any case, matched against each chart's
    name and its series' names; kept in the address; Enter does not leave the page."""
    server, run_id = charted
    page, errors = run_page(browser, server, run_id)
    drawn(page, "grad_norm")
    every = shown_charts(page)
    assert every == ["loss", "lr", "grad_norm", "disk_free"], every
    box = page.locator(".chart-controls input[name=filter]")
    box.fill("LOSS | disk")
    expect(page.locator(".chart-controls output[name=filter-count]")).to_have_text(
        f"2 of {len(every)} charts"
    )
    assert shown_charts(page) == ["loss", "disk_free"]
    expect(page).to_have_url(re.compile(r"\?filter=LOSS\+%7C\+disk$"))
    box.press("Enter")
    expect(box).to_have_value("LOSS | disk")
    assert shown_charts(page) == ["loss", "disk_free"]
    box.fill("global_norm")  # a series' name (grad/global_norm) finds its chart
    expect(page.locator(".chart-controls output[name=filter-count]")).to_have_text(
        f"1 of {len(every)} charts"
    )
    assert shown_charts(page) == ["grad_norm"]
    # A chart drawn, then hidden while the window changed size, takes the new width once
    # shown, though nothing new came for it to draw (the run has ended).
    page.set_viewport_size({"width": 900, "height": 1000})
    box.fill("")
    fits_its_card(page, "loss")

    # A link opens with the filter; a chart hidden while the window changed size takes the
    # new width once shown.
    fresh = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    fresh.on("pageerror", lambda exc: errors.append(str(exc)))
    fresh.goto(f"{server.url}/#/runs/{run_id}?filter=nothing-is-called-this")
    expect(fresh.locator(".chart-controls output[name=filter-count]")).to_have_text(
        f"0 of {len(every)} charts"
    )
    expect(fresh.locator(".chart-controls input[name=filter]")).to_have_value(
        "nothing-is-called-this"
    )
    fresh.set_viewport_size({"width": 900, "height": 1000})
    fresh.locator(".chart-controls input[name=filter]").fill("")
    expect(fresh.locator(".chart-controls output[name=filter-count]")).to_have_text("")
    assert shown_charts(fresh) == every
    drawn(fresh)
    fits_its_card(fresh, "loss")
    assert "filter" not in fresh.url

    # A series that arrives later can bring its chart into the filter: val_loss is drawn on
    # the loss chart, which "val_" hid while it held the loss alone.
    live = Run(resolve(server=server.url, project="charts", run_name="validates"),
               system_metrics=False, watchdog=False)  # fmt: skip
    live.start()
    try:
        live.log(1, {"loss": 0.9})
        fresh.goto(f"{server.url}/#/runs/{live.id}?filter=val_")
        expect(fresh.locator(".chart-controls output[name=filter-count]")).to_have_text(
            "0 of 1 chart"
        )
        live.log(2, {"val_loss": 0.8})
        expect(fresh.locator(".chart-controls output[name=filter-count]")).to_have_text(
            "1 of 1 chart"
        )
        expect(fresh.locator('[data-chart="loss"]')).to_be_visible()
    finally:
        live.finish()
    assert not errors, errors
    fresh.context.close()


def fits_its_card(page: Any, chart: str) -> None:
    """Wait until a chart's plot is as wide as its card (plotly resizes after a short wait
    of its own)."""
    page.wait_for_function(
        """(chart) => { const card = document.querySelector(`[data-chart="${chart}"]`);
                        const width = card.querySelector('.plot')._fullLayout.width;
                        return width > card.clientWidth * 0.9 && width <= card.clientWidth; }""",
        arg=chart,
    )


def download(page: Any, chart: str, tool: str, folder: Path) -> tuple[str, list[str]]:
    """Click a chart's download button: the file's suggested name and its lines. The file is
    streamed by the export route, not built in the page from the (capped) series route."""
    with page.expect_download() as started:
        page.locator(f'[data-chart="{chart}"] [data-tool="{tool}"]').click()
    assert "/export?" in started.value.url and f"format={tool}" in started.value.url
    path = folder / started.value.suggested_filename
    started.value.save_as(path)
    return started.value.suggested_filename, path.read_text().splitlines()


def test_a_chart_downloads_its_series_at_full_resolution(
    charted: tuple[ServerProcess, str], browser: Any, tmp_path: Path
) -> None:
    server, run_id = charted
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{server.url}/#/runs/{run_id}")
    drawn(page)
    name, lines = download(page, "loss", "csv", tmp_path)
    assert name == "explodes-loss.csv"
    assert lines[0] == "name,step,time,value" and len(lines) == STEPS + 1
    assert lines[1].split(",") == ["loss", "1", str(T0 + 0.5), str(loss_at(1))]
    name, lines = download(page, "loss", "jsonl", tmp_path)
    assert name == "explodes-loss.jsonl"
    assert [json.loads(line)["step"] for line in lines] == list(range(1, STEPS + 1))

    # Zoomed, the download holds the steps in view.
    page.evaluate(
        """() => Plotly.relayout(document.querySelector('[data-chart="loss"] .plot'),
                                 {'xaxis.range[0]': 1000, 'xaxis.range[1]': 1100})"""
    )
    expect(page.locator("#charts")).to_have_attribute("data-detail", "1000-1100")
    _, lines = download(page, "loss", "csv", tmp_path)
    assert [int(line.split(",")[1]) for line in lines[1:]] == list(range(1000, 1101))

    # A series longer than the series route's cap comes whole.
    page.evaluate("location.hash = '#/runs/seed000000'")
    expect(page.locator("#run-name")).to_have_text("run-00000")
    drawn(page)
    _, lines = download(page, "loss", "csv", tmp_path)
    assert len(lines) == 1 + LONG and lines[-1].startswith(f"loss,{LONG},")
    # Nothing is offered that would send the data elsewhere; plotly's PNG download stays.
    titles = page.evaluate(
        """() => [...document.querySelectorAll('[data-chart="loss"] .modebar-btn')]
                 .map((button) => button.getAttribute('data-title'))"""
    )
    assert any("png" in title.lower() for title in titles)
    assert not [title for title in titles if "Share" in title or "Chart Studio" in title]


def test_every_layer_is_on_the_heatmap_and_the_one_an_alert_names_is_marked(
    server: ServerProcess, browser: Any
) -> None:
    layers = [f"dense_{i}/kernel" for i in range(26)] + ["sigmoid_0/kernel"]
    run = Run(resolve(server=server.url, project="charts", run_name="deep"),
              system_metrics=False, watchdog=False)  # fmt: skip
    run.start()
    for step in range(1, 201):
        norms = {f"grad/norm/{name}": 10.0 ** -(i % 9) for i, name in enumerate(layers)}
        norms["grad/norm/sigmoid_0/kernel"] = 1e-12  # the layer that vanishes
        run.log(step, {"loss": 1.0 / step, "grad/global_norm": 1.0, "nonfinite/loss": 0.0, **norms})
    assert run.finish()
    vanishing = {
        "id": "v1", "run_id": run.id, "project": "charts", "run_name": "deep",
        "rule": "grad_vanishing", "subject": "", "severity": "warning", "state": "firing",
        "message": "Gradients vanish in the early layers", "hint": "", "step": 150,
        "time": 1.7e9, "resolved_time": None, "count": 1, "updated_time": 1.7e9,
        "evidence": {"early_variable": "sigmoid_0/kernel", "ratio": 1e-12},
    }  # fmt: skip
    # Alerts a few steps apart, marked on the loss chart: their labels must not pile up.
    close = [{**vanishing, "id": f"n{step}", "rule": rule, "step": step, "message": f"at {step}"}
             for step, rule in ((100, "stall"), (101, "stall"), (102, "stall"),
                                (103, "loss_divergence"))]  # fmt: skip
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    # The detection issue's alert, as the server will send it for this run.
    page.route(f"**/api/v1/runs/{run.id}/alerts*",
               lambda route: route.fulfill(json={"alerts": [vanishing, *close]}))  # fmt: skip
    page.goto(f"{server.url}/#/runs/{run.id}")
    heatmap = page.locator('[data-chart="grad_heatmap"]')
    expect(heatmap).to_have_attribute("data-layers", "27")
    # Norms every 10 steps, and every step for the last 12 (as the agent sends them after a
    # jump): columns narrower than 10 steps left every tenth one empty, a stripe down the map.
    empty = page.evaluate(
        """async () => { const { heatmapCells } = await import('/static/heatmap.js');
            const step = [];
            for (let s = 10; s <= 880; s += 10) step.push(s);
            for (let s = 885; s <= 896; s++) step.push(s);
            const { x, z } = heatmapCells([{ step, value: step.map(() => 1) }], 1, 896);
            return z[0].flatMap((cell, i) => (cell == null ? [x[i]] : [])); }"""
    )
    assert empty == [], empty
    expect(heatmap).to_have_attribute("data-marked", "sigmoid_0/kernel")
    # One label for the alerts of one rule that would touch, another rule's a row lower: none
    # over another (four labels were drawn on one spot, garbled).
    expect(page.locator('[data-chart="loss"]')).to_have_attribute("data-alert-markers", "4")
    labels = page.locator('[data-chart="loss"] .annotation')
    expect(labels).to_have_count(2)
    assert sorted(labels.all_text_contents()) == ["loss_divergence", "stall \u00d73"]
    first, second = labels.evaluate_all(
        """(labels) => labels.map((el) => { const r = el.getBoundingClientRect();
                                            return [r.left, r.top, r.right, r.bottom]; })"""
    )
    apart = first[2] <= second[0] or second[2] <= first[0]
    assert apart or first[3] <= second[1] or second[3] <= first[1], (first, second)
    # Counts that stay 0 say so, not four flat lines on -1 to 1.
    nonfinite = page.locator('[data-chart="nonfinite"]')
    expect(nonfinite).to_have_attribute("data-quiet", "true")
    expect(nonfinite.locator(".annotation")).to_have_text("no NaN/Inf so far")
    assert texts(page, "nonfinite", "ytick") == ["0"]
    rows = plot(page, "grad_heatmap", "plot.data[0].y")
    assert rows == layers
    assert plot(page, "grad_heatmap", "plot.data[0].z.length") == 27
    ticks = plot(page, "grad_heatmap", "plot.layout.yaxis.ticktext")
    assert ticks[-1] == "<b>▶ sigmoid_0/kernel</b>" and ticks[0] == "dense_0/kernel"
    # Its columns follow the x-axis the charts are on, as the gradient chart above it does.
    page.locator(".chart-controls [name=xaxis]").select_option("relative")
    page.wait_for_function(
        """() => document.querySelector('[data-chart="grad_heatmap"] .plot')
                 .layout.xaxis.title.text === 'time since start (s)'"""
    )
    heat_x = plot(page, "grad_heatmap", "plot.data[0].x")
    line_x = plot(page, "grad_norm", "plot.data[0].x")
    assert line_x[0] - 1 <= heat_x[0] < heat_x[-1] <= line_x[-1] + 1, (heat_x, line_x)
    page.locator(".chart-controls [name=xaxis]").select_option("step")
    # The chart filter hides the heatmap with its chart, also when it is made after the
    # filter was applied (a page opened with one).
    filtered = browser.new_page(viewport={"width": 1400, "height": 1000})
    filtered.goto(f"{server.url}/#/runs/{run.id}?filter=loss")
    expect(filtered.locator('[data-chart="grad_heatmap"]')).to_have_attribute("data-layers", "27")
    expect(filtered.locator('[data-chart="grad_heatmap"]')).to_be_hidden()
    expect(filtered.locator('[data-chart="grad_norm"]')).to_be_hidden()
    filtered.locator(".chart-controls input[name=filter]").fill("")
    expect(filtered.locator('[data-chart="grad_heatmap"]')).to_be_visible()
    filtered.close()
    # On the line chart, the named layer is shown although its norm ranks last.
    page.wait_for_function(
        """() => document.querySelector('[data-chart="grad_norm"] .plot').data
                 .some((t) => t.name === 'grad/norm/sigmoid_0/kernel' && t.visible === true)"""
    )
    # Only the layers drawn go to plotly; the others are one tick away in the list under it.
    grad = page.locator('[data-chart="grad_norm"]')
    picker = grad.locator(".series-picker")
    expect(picker.locator("summary")).to_have_text("Layers: 6 of 27 drawn")
    assert len(plot(page, "grad_norm", "plot.data")) == 7  # with the global norm
    picker.locator("summary").click()
    picker.locator('input[data-series="grad/norm/dense_25/kernel"]').check()
    expect(picker.locator("summary")).to_have_text("Layers: 7 of 27 drawn")
    page.wait_for_function(
        """() => document.querySelector('[data-chart="grad_norm"] .plot').data
                 .some((t) => t.name === 'grad/norm/dense_25/kernel')"""
    )
    # At 1400 px its legend is under the plot and its x-axis' title, over neither, and twelve
    # decades of norms are labelled a few decades apart, no label on another.
    boxes = grad.evaluate(
        """(card) => {
             const box = (el) => { const r = el.getBoundingClientRect();
                                   return [r.left, r.top, r.right, r.bottom]; };
             return { plot: box(card.querySelector('.nsewdrag')),
                      legend: box(card.querySelector('.legend')),
                      title: box(card.querySelector('.g-xtitle')),
                      ticks: [...card.querySelectorAll('.ytick text')].map(box) }; }"""
    )
    assert boxes["legend"][1] >= boxes["plot"][3]  # its top under the plot's bottom
    assert boxes["legend"][1] >= boxes["title"][3]  # and under the x-axis' title
    ticks = sorted(boxes["ticks"], key=lambda b: b[1])
    assert 3 <= len(ticks) <= 8
    assert all(upper[3] <= lower[1] for upper, lower in pairwise(ticks))
    assert len(plot(page, "grad_norm", "plot._fullLayout.yaxis.tickvals")) == len(ticks)
