// A chart's plotly figure, built from the chart's state at each redraw: its traces (each
// series' own arrays, smoothed where asked), its layout (the x-axis of the view, a y-range that
// outliers and the zoom cannot flatten, ticks that say their value) and its markings (each
// alert's line and label, an OOM forecast's projection).

import { SEVERITY_COLOURS } from "./alert-feed.js";
import { chartOf, smoothable, traceStyle } from "./chart-kinds.js";
import { formatBytes, formatDuration, plotText } from "./format.js";
import { PLOT_LAYOUT, themed } from "./plot.js";
import { byteTicks, clippedRange, debiasedEma, fullRange, logTicks, withFloor } from "./plotmath.js";

// Whether as many of the finite values are above zero as not (a log axis draws them).
function mostlyPositive(values) {
  let above = 0, others = 0;
  for (const v of values) {
    if (v == null || !Number.isFinite(v)) continue;
    if (v > 0) above += 1; else others += 1;
  }
  return above >= others;
}

// Whether the values (the finite ones) are all one, and there are some.
function steady(values) {
  let first = null;
  for (const v of values) {
    if (v == null || !Number.isFinite(v)) continue;
    if (first === null) first = v;
    else if (v !== first) return false;
  }
  return first !== null;
}

// The figure of one chart (its Chart), and what it keeps between redraws.
export class ChartFigure {
  constructor(chart) {
    this.chart = chart;
    this.traceNames = []; // the series key of each trace plotly was given, in order
    this.revision = 0; // plotly's datarevision: the arrays it was given grow in place
    this.byteTexts = new Map(); // series key -> its values as sizes, for the hover
  }

  // The traces to draw, each series' (smoothed: its raw points faint, under the smoothed line).
  traces() {
    const chart = this.chart;
    const traces = [];
    this.traceNames = [];
    const weight = chart.view.smoothing;
    for (const name of chart.data.series.keys()) {
      const { name: label = name, ...style } = chart.styleOf?.(name) ?? traceStyle(name);
      const source = chart.source(name);
      const visible = chart.visible.get(name) ?? style.visible ?? true;
      if (visible !== true && chart.picks(name)) continue; // not chosen: not drawn at all
      const data = chart.data.shown(name);
      // In steps, the series' own array (plotly reads, never writes it; datarevision says it grew).
      // A series hidden in the legend goes with its first point only, until it is shown: with
      // none, plotly would leave it out of the legend too, where it is shown again.
      const points = visible === true ? data.step.length : Math.min(1, data.step.length);
      const x = chart.view.xaxis === "step" && points === data.step.length ? data.step
        : data.step.slice(0, points).map((step, i) => chart.xOf(step, data.time[i], source));
      // plotly reads trace names as HTML (<b>, <a href>): a series name is text.
      const y = points === data.value.length ? data.value : data.value.slice(0, points);
      const trace = { legendgroup: name, ...style, name: plotText(label), x, y, type: "scatter", visible };
      // Sizes in binary units on hover too, as on the axis.
      if (chart.spec.bytes) Object.assign(trace, { text: this.bytesText(name, y), hovertemplate: "%{text}" });
      if (weight > 0 && smoothable(source.name)) {
        traces.push({ ...trace, opacity: 0.25, showlegend: false, hoverinfo: "skip", meta: "raw" });
        this.traceNames.push(name);
        traces.push({ ...trace, y: debiasedEma(y, weight), meta: "smoothed" });
      } else {
        traces.push(trace);
      }
      this.traceNames.push(name);
    }
    return traces;
  }

  // A series' values as sizes for its hover, kept and grown with the series' own array (a
  // live series is formatted a point at a time, not whole at each redraw).
  bytesText(name, y) {
    const kept = this.byteTexts.get(name);
    if (kept?.y !== y || kept.text.length > y.length) {
      const text = y.map(formatBytes);
      this.byteTexts.set(name, { y, text });
      return text;
    }
    for (let i = kept.text.length; i < y.length; i++) kept.text.push(formatBytes(y[i]));
    return kept.text;
  }

  // The layout for these traces.
  layout(traces) {
    const chart = this.chart;
    const layout = themed({ ...structuredClone(PLOT_LAYOUT), height: chart.spec.height ?? PLOT_LAYOUT.height, showlegend: chart.spec.legend !== false });
    layout.datarevision = ++this.revision;
    // Under the plot, a legend of any length pushes the plot up rather than covering it.
    // At the figure's foot (not the plot's, where the x-axis' title is), the plot's margin
    // made room for it.
    if (chart.spec.legend === "below") layout.legend = { orientation: "h", x: 0, y: 0, yref: "container", yanchor: "bottom" };
    layout.xaxis.title.text = chart.xTitle();
    if (chart.view.xaxis === "wall") layout.xaxis.type = "date";
    if (chart.xrange) Object.assign(layout.xaxis, { range: [...chart.xrange], autorange: false });
    const values = this.valuesInView(traces);
    // A log axis only for values mostly above zero (a learning rate gone negative is drawn
    // linear; a loss that dips below zero now and then stays log).
    const log = chart.log && mostlyPositive(values);
    if (log) layout.yaxis.type = "log";
    let range = this.yRange(values, log);
    // Values that do not change (a constant learning rate) get a range around them, not
    // plotly's ±1 with ticks in float32's noise (-0.00100000004749745282).
    if (!range && steady(values)) range = fullRange(values, log);
    if (chart.spec.bytes && !log) range = withFloor(range ?? fullRange(values));
    const quiet = Boolean(chart.spec.quiet) && values.length > 0 && values.every((v) => v === 0);
    if (quiet) range = [-0.1, 1];
    chart.card.dataset.quiet = String(quiet);
    layout.yaxis.range = range ?? undefined;
    layout.yaxis.autorange = !range;
    // Ticks that say their value: on a log axis the decades (and 2, 5) in full, bytes in binary
    // units; else plotly's, in scientific notation past a million, never an SI prefix.
    const ticks = quiet ? { tickvals: [0], ticktext: ["0"] }
      : log ? logTicks(range ?? fullRange(values, true)) : chart.spec.bytes ? byteTicks(range) : null;
    Object.assign(layout.yaxis, ticks ? { tickmode: "array", ...ticks } : { exponentformat: "e", dtick: log ? 1 : undefined },
      { hoverformat: ".4~g" });
    chart.card.dataset.clipped = String(Boolean(range) && !steady(values));
    chart.card.dataset.log = String(log);
    const { shapes, annotations } = this.markings();
    if (quiet) {
      annotations.push({ x: 0.5, xref: "paper", y: 0.55, yref: "paper", showarrow: false, text: plotText(chart.spec.quiet),
        font: { size: 13, color: getComputedStyle(document.documentElement).getPropertyValue("--muted").trim() || "#6b7280" } });
    }
    return { ...layout, shapes, annotations };
  }

  // The y values of the points in view (all of them, or the zoom's).
  valuesInView(traces) {
    const chart = this.chart;
    const values = [];
    const wall = chart.view.xaxis === "wall";
    const [lo, hi] = chart.xrange ? chart.xrange.map((x) => (wall ? Date.parse(x) : Number(x))) : [-Infinity, Infinity];
    for (const trace of traces) {
      if (trace.visible !== true) continue;
      trace.x.forEach((x, i) => {
        const at = wall ? x.getTime() : x;
        if (at >= lo && at <= hi) values.push(trace.y[i]);
      });
    }
    return values;
  }

  // With clipping on, a range for the values in view that outliers cannot flatten; zoomed,
  // the range of the points it shows (plotly's own would range them all); else plotly's (null).
  yRange(values, log) {
    const chart = this.chart;
    if (!chart.view.clip && !chart.xrange) return null;
    if (chart.view.clip) {
      const clipped = clippedRange(values, log);
      if (clipped || !chart.xrange) return clipped;
    }
    return fullRange(values, log);
  }

  // A line at each alert's step, and the projection of a firing oom_forecast about a series of
  // this chart; forecasts: how many of those.
  markings() {
    const chart = this.chart;
    const shapes = [], annotations = this.markerLabels();
    let forecasts = 0;
    for (const alert of chart.alerts) {
      if (alert.step == null) continue;
      const colour = SEVERITY_COLOURS[alert.severity] ?? "#8a93a6";
      const firing = alert.state === "firing";
      const x = chart.xOf(alert.step, alert.time, { run: alert.run_id });
      shapes.push({
        type: "line", xref: "x", yref: "paper", x0: x, x1: x, y0: 0, y1: 1,
        line: { color: colour, width: 1.5, dash: firing ? "solid" : "dot" }, opacity: firing ? 0.9 : 0.5,
      });
      const forecast = alert.evidence?.forecast;
      if (!firing || alert.rule !== "oom_forecast" || !forecast || chartOf(forecast.series)?.id !== chart.id) continue;
      const [s0, s1] = forecast.step, [v0, v1] = forecast.value, [t0, t1] = forecast.time;
      shapes.push({
        type: "line", xref: "x", yref: "y", x0: chart.xOf(s0, t0), x1: chart.xOf(s1, t1), y0: v0, y1: v1,
        line: { color: colour, width: 2, dash: "dash" },
      });
      const left = Math.max(0, t1 - Date.now() / 1000);
      annotations.push({
        x: chart.xOf(s1, t1), y: v1, xref: "x", yref: "y", ax: -36, ay: -28, arrowcolor: colour, arrowwidth: 1,
        text: `limit in ~${plotText(formatDuration(left))}`, font: { size: 11, color: colour },
        bgcolor: "rgba(255,255,255,0.85)",
      });
      forecasts += 1;
    }
    return { shapes, annotations, forecasts };
  }

  // The alerts' labels at the top of their lines, none over another: the labels of one rule
  // that would touch are one ("nonfinite ×3", its messages on hover), and a label that would
  // touch another rule's goes a row lower. Widths are guessed from the plot's width and the
  // x-axis' span (plotly has not laid them out yet).
  markerLabels() {
    const chart = this.chart;
    const marked = chart.alerts.filter((alert) => alert.step != null)
      .map((alert) => ({ alert, x: chart.xOf(alert.step, alert.time, { run: alert.run_id }) }))
      .map((mark) => ({ ...mark, at: Number(mark.x) }))
      .sort((a, b) => a.at - b.at);
    if (!marked.length) return [];
    const [lo, hi] = this.xSpan(marked.map((mark) => mark.at));
    const pixels = Math.max(100, chart.plot.clientWidth - 80) / (hi - lo || 1); // per x unit
    const width = (text) => (7 * text.length + 10) / pixels; // in x units, 10 px type
    const labels = [];
    for (const mark of marked) {
      const same = labels.find((label) => label.rule === mark.alert.rule && mark.at <= label.at + width(label.text()));
      if (same) { same.marks.push(mark); continue; }
      labels.push({ rule: mark.alert.rule, at: mark.at, marks: [mark],
        text() { return this.marks.length > 1 ? `${this.rule} ×${this.marks.length}` : this.rule; } });
    }
    const rows = []; // the right edge of each row's last label
    return labels.map((label) => {
      let row = rows.findIndex((edge) => edge < label.at);
      if (row < 0) row = rows.length;
      rows[row] = label.at + width(label.text());
      const { alert, x } = label.marks[0];
      return {
        x, xref: "x", y: 1, yref: "paper", xanchor: "left", yanchor: "top", yshift: -14 * row, showarrow: false,
        text: plotText(label.text()), hovertext: label.marks.map((mark) => plotText(mark.alert.message)).join("<br>"),
        font: { size: 10, color: SEVERITY_COLOURS[alert.severity] ?? "#8a93a6" },
      };
    });
  }

  // The x-axis' span: the zoom's, or from the first point of the chart's series (or mark) to
  // the last, in numbers (a date's milliseconds).
  xSpan(marks) {
    const chart = this.chart;
    if (chart.xrange) return chart.xrange.map((x) => (chart.view.xaxis === "wall" ? Date.parse(x) : Number(x)));
    const xs = [...marks];
    for (const [key, series] of chart.data.series) {
      const last = series.step.length - 1;
      if (last < 0) continue;
      const source = chart.source(key);
      xs.push(Number(chart.xOf(series.step[0], series.time[0], source)), Number(chart.xOf(series.step[last], series.time[last], source)));
    }
    return [Math.min(...xs), Math.max(...xs)];
  }
}
