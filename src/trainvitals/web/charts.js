// One live plotly chart card: a metric's per-step, epoch-mean and validation series together,
// or a series group's (grad/, host/, gpu0/ ...). It holds its points (chart-data.js), draws
// them (chart-figure.js) with the alerts about them marked, follows what people do on it
// (chart-interaction.js), and places them on the page's x-axis: step, epoch, time since its
// run started, or wall-clock time. chart-kinds.js says which chart each series is drawn on.

import { ChartData } from "./chart-data.js";
import { ChartFigure } from "./chart-figure.js";
import { drawPicks, filterOut, listen } from "./chart-interaction.js";
import { traceStyle } from "./chart-kinds.js";
import { PLOT_CONFIG, cancelDraw, drawSoon, liveWait } from "./plot.js";
import { stepsBetween, timeAt } from "./plotmath.js";
import { GRAD_NORM_PREFIX } from "./series.js";

const LIVE_REDRAW_MS = 250; // the shortest time between two redraws for live points
const TOP_VARIABLES = 5; // per-variable gradient norms shown at first; the rest in the legend

// How every chart of a page draws: smoothing weight (0 to 0.99), the x-axis (step, time since
// the run started, or wall-clock time), whether outliers are left out of the y-range, and
// when the run started (for a series whose seriesOf gives no start of its own).
export const DEFAULT_VIEW = { smoothing: 0, xaxis: "step", clip: true, start: 0 };
export const X_TITLES = { step: "step", epoch: "epoch", relative: "time since start (s)", wall: "time" };

// One chart card. spec: { id, title, log, bytes, height }, as chartOf gives it, and alt (its
// text alternative's start; the title by default), legend (false: none; "below": under the
// plot) and pick(name) (the label of a series chosen in a list under the chart, titled
// pickTitle, null for the others; those not chosen are not drawn). Options:
// onTooLong(name) when a live trace grew long (reload it downsampled); onZoom(xrange, chart)
// when people zoom (null: zoomed out); onDownload(format, chart) offers CSV and JSON Lines;
// onDrawn(chart) after each redraw; onSeries(chart) when it gets a series it did not have;
// onLog(chart) when people switch its y-axis between log and linear (view.scales: chart id ->
// log or not, as the page's address gave it, over the spec's own); styleOf(name): a series'
// trace attributes (its label as name, line, ...) where the series' own name would not do
// (runs compared); seriesOf(key): what a series key stands for, { name, start } (the series'
// own name, and the time its run started, from which "time since start" counts for it: runs
// compared each start at 0), where the key is not the series' name (runs compared) or the runs
// started apart.
// Redraws are coalesced into one per animation frame, and wait while the chart is off screen.
export class Chart {
  constructor(container, spec, { onTooLong, onZoom, onDownload, onDrawn, onLog, onSeries, styleOf, seriesOf, epochsOf, pickLabel, view } = {}) {
    const { id, title, log = false } = spec;
    Object.assign(this, { spec, id, onTooLong, onZoom, onDownload, onDrawn, onLog, onSeries, styleOf, seriesOf, epochsOf, pickLabel });
    this.view = { ...DEFAULT_VIEW, ...view };
    this.log = this.view.scales?.get(id) ?? log;
    this.card = document.createElement("section");
    this.card.className = "chart-card";
    this.card.dataset.chart = id;
    this.card.innerHTML = `<div class="chart-head"><h3></h3><div class="chart-tools">
        <button type="button" data-tool="log" aria-pressed="false" title="logarithmic y-axis">log</button>
        ${onDownload ? `<button type="button" data-tool="csv" title="download every point as CSV">CSV</button>
        <button type="button" data-tool="jsonl" title="download every point as JSON Lines">JSONL</button>` : ""}
      </div></div>${spec.note ? '<p class="chart-note muted"></p>' : ""}<div class="plot" role="img"></div>
      ${spec.pick ? '<details class="series-picker"><summary></summary><div class="picks" role="group"></div></details>' : ""}`;
    this.card.querySelector("h3").textContent = title;
    if (spec.note) this.card.querySelector(".chart-note").textContent = spec.note;
    container.appendChild(this.card);
    this.plot = this.card.querySelector(".plot");
    this.data = new ChartData();
    this.figure = new ChartFigure(this);
    this.visible = new Map(); // series name -> plotly's visible (true or "legendonly")
    this.xrange = null; // the zoom, in the x-axis' units; null: everything
    this.alerts = [];
    this.drawnAlerts = JSON.stringify([]);
    this.frame = null;
    this.timer = null;
    this.lastDraw = -Infinity;
    this.drawCost = 0; // ms the last redraw took
    this.picked = ""; // what the series list shows, to redraw it only when that changed
    this.onScreen = true; // off screen, a redraw waits (the card is marked data-stale)
    Plotly.newPlot(this.plot, [], this.figure.layout([]), PLOT_CONFIG);
    listen(this);
    this.observer = new IntersectionObserver(([entry]) => {
      this.onScreen = entry.isIntersecting;
      if (this.onScreen && "stale" in this.card.dataset) this.schedule();
    });
    this.observer.observe(this.card);
    // A card shown again by the filter, or resized while it was hidden, takes its new width:
    // plotly's own window listener skips a plot it cannot measure, and nothing else would
    // tell it when the card comes back with no new points to draw.
    this.sized = new ResizeObserver(() => {
      const width = this.plot.clientWidth;
      if (width > 0 && this.plot._fullLayout && Math.abs(this.plot._fullLayout.width - width) > 1) {
        Plotly.Plots.resize(this.plot).catch(() => {}); // hidden again before its turn
      }
    });
    this.sized.observe(this.card);
    // The system switched between light and dark: the plot takes the page's new colours.
    this.scheme = matchMedia("(prefers-color-scheme: dark)");
    this.rethemed = () => this.schedule();
    this.scheme.addEventListener("change", this.rethemed);
    this.updateCount();
  }

  // series key -> { step, time, value }, as fetched and streamed.
  get series() { return this.data.series; }

  has(name) { return this.data.has(name); }

  // Replace (or create) a series with a full, possibly downsampled, copy.
  setSeries(name, data) {
    const fresh = !this.data.has(name);
    if (fresh && name.startsWith(GRAD_NORM_PREFIX)) {
      // The first variables to arrive are shown; showTopVariables() ranks them later.
      const shown = [...this.visible].filter(([n, v]) => n.startsWith(GRAD_NORM_PREFIX) && v === true).length;
      if (shown < TOP_VARIABLES) this.visible.set(name, true);
    }
    this.data.set(name, data);
    this.updateCount();
    this.schedule();
    if (fresh) this.onSeries?.(this);
  }

  // Append live points newer than what the series holds.
  extend(name, data) {
    if (!this.data.has(name)) { this.setSeries(name, data); return; }
    if (!this.data.append(name, data)) return;
    this.updateCount();
    this.schedule({ live: true });
    if (this.data.tooLong(name) && this.onTooLong) this.onTooLong(name);
  }

  updateCount() {
    const total = this.data.points;
    this.card.dataset.points = String(total);
    this.card.dataset.series = String(this.series.size);
    this.plot.setAttribute("aria-label", `${this.spec.alt ?? this.spec.title}: ${this.series.size} series, ${total} points`
      + (this.xrange ? ", zoomed" : ""));
  }

  setView(view) { this.view = { ...this.view, ...view }; this.schedule(); }

  // Shown or hidden by the page's chart filter (hidden, it is off screen: not redrawn until
  // shown again, at the width it has then).
  setShown(on) { filterOut(this.card, !on); }

  // The zoom of another chart of the page (the same x-axis), or none.
  setXRange(xrange) {
    if (JSON.stringify(xrange) === JSON.stringify(this.xrange)) return;
    this.xrange = xrange;
    if (!xrange) this.data.detail = null;
    this.schedule();
  }

  // The zoomed steps read again at full detail: { key: { min, max, points } }, each series'
  // points of its steps min to max (those of a series not in it stay as they are).
  setDetail(detail) { this.data.detail = detail; this.schedule(); }

  // The series' own name, its run, and the time that run started, for a series key.
  source(key) {
    const { name = key, start = this.view.start, run } = this.seriesOf?.(key) ?? {};
    return { name, start, run };
  }

  // The steps the zoom shows, { min, max }, as the longest of these series (all of the chart's
  // by default) has them; null when not zoomed, or when none of them has a point in view.
  stepRange(keys = null) {
    if (!this.xrange) return null;
    const [a, b] = this.xrange;
    if (this.view.xaxis === "step") return { min: Math.floor(a), max: Math.ceil(b) };
    const longest = this.data.longest(keys ?? [...this.series.keys()]);
    if (longest == null) return null;
    const { start, run } = this.source(longest);
    if (this.view.xaxis === "epoch") {
      const axis = this.epochsOf?.(run);
      return { min: Math.floor(axis ? axis.step(a) : a), max: Math.ceil(axis ? axis.step(b) : b) };
    }
    const seconds = (x) => (this.view.xaxis === "wall" ? Date.parse(x) / 1000 : start + Number(x));
    return stepsBetween(this.series.get(longest), seconds(a), seconds(b));
  }

  // x of a point in the view's x-axis (source: its run, and when that run started).
  xOf(step, time, { start = this.view.start, run } = {}) {
    if (this.view.xaxis === "relative") return time - start;
    if (this.view.xaxis === "wall") return new Date(time * 1000);
    if (this.view.xaxis === "epoch") return this.epochsOf?.(run)?.x(step) ?? step;
    return step;
  }

  // x of a step of series `key`'s run, its time read between that series' points (the
  // heatmap's columns, drawn on the gradient chart's axis).
  xAtStep(step, key) {
    const series = this.series.get(key);
    return this.xOf(step, series ? timeAt(series, step) : NaN, this.source(key));
  }

  // The x-axis' title; an epoch axis where no series of the chart has epochs (a custom loop)
  // is drawn in steps, and says so.
  xTitle() {
    const none = this.view.xaxis === "epoch" && ![...this.series.keys()].some((key) => this.epochsOf?.(this.source(key).run));
    return none ? "step (no epochs recorded)" : X_TITLES[this.view.xaxis];
  }

  // Show the per-variable gradient norms that reached the highest values; the others stay
  // one click away in the legend (a large model has hundreds).
  showTopVariables() {
    const peaks = this.data.peaks(GRAD_NORM_PREFIX);
    if (!peaks.length) return;
    peaks.forEach(([, name], i) => this.visible.set(name, i < TOP_VARIABLES ? true : "legendonly"));
    this.schedule();
  }

  // Series that must be seen (the layers an alert names), whatever their rank.
  showVariables(names) {
    const hidden = names.filter((name) => this.series.has(name) && this.visible.get(name) !== true);
    for (const name of hidden) this.visible.set(name, true);
    if (hidden.length) this.schedule();
  }

  // A vertical line at each alert's step in its severity's colour (dotted once resolved) and,
  // while an oom_forecast about a series of this chart fires, its projection up to the limit
  // labelled with the time left. Redrawn only when something changed.
  setAlerts(alerts) {
    const key = JSON.stringify(alerts.map((a) => [a.id, a.state, a.step, a.evidence?.forecast ?? null]));
    if (key === this.drawnAlerts) return;
    this.drawnAlerts = key;
    this.alerts = alerts;
    const forecasts = this.figure.markings().forecasts;
    this.card.dataset.alertMarkers = String(alerts.filter((a) => a.step != null).length);
    this.card.dataset.forecasts = String(forecasts);
    this.schedule();
  }

  // One redraw in the next animation frame, however many changes come before it; none while
  // the chart is off screen (it redraws when it comes back). Live points redraw at most every
  // LIVE_REDRAW_MS: a stream of hundreds of steps a second would otherwise hold the page.
  schedule({ live = false } = {}) {
    if (!this.onScreen) { this.card.dataset.stale = ""; return; } // redrawn when shown
    if (this.frame != null) return;
    if (this.timer != null) {
      if (live) return;
      clearTimeout(this.timer); // people wait for nobody
      this.timer = null;
    }
    const wait = live ? liveWait(this.lastDraw, this.drawCost, LIVE_REDRAW_MS) : 0;
    const queue = () => { this.timer = null; this.frame = true; drawSoon(this); };
    if (wait > 0) this.timer = setTimeout(queue, wait); else queue();
  }

  // Whether a series is drawn (else in the legend only, or, for a chart whose series are
  // picked, in its list only).
  isShown(name) {
    return (this.visible.get(name) ?? (this.styleOf?.(name) ?? traceStyle(name)).visible ?? true) === true;
  }

  draw() {
    this.frame = null;
    delete this.card.dataset.stale;
    const start = this.lastDraw = performance.now();
    const traces = this.figure.traces();
    Plotly.react(this.plot, traces, this.figure.layout(traces), PLOT_CONFIG);
    this.card.querySelector('[data-tool="log"]').setAttribute("aria-pressed", String(this.log));
    this.card.dataset.drawn = String(traces.reduce((n, t) => n + (t.meta === "raw" || t.visible !== true ? 0 : t.x.length), 0));
    drawPicks(this);
    this.drawCost = performance.now() - start;
    this.onDrawn?.(this);
  }

  // Whether a series is one to choose from the list (by its own name: runs compared key theirs).
  picks(key) { return this.spec.pick?.(this.source(key).name) != null; }

  destroy() {
    cancelDraw(this);
    clearTimeout(this.timer);
    this.scheme.removeEventListener("change", this.rethemed);
    this.observer.disconnect();
    this.sized.disconnect();
    Plotly.purge(this.plot);
    this.card.remove();
  }
}

