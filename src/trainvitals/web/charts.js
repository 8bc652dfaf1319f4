// Live plotly charts: one chart per metric (its per-step, epoch-mean and validation series
// together) and one per series group (grad/, host/, gpu0/ ...). New points are appended to the
// series' arrays, which plotly is handed as they are (Plotly.react, datarevision): no copy
// per redraw, and redraws spaced by what they cost. Alerts are marked on the charts of the
// series they are about.

import { SEVERITY_COLOURS } from "./alert-feed.js";
import { escapeHTML, formatBytes, formatDuration, plotText } from "./format.js";
import { byteTicks, clippedRange, debiasedEma, fullRange, logTicks, stepsBetween, timeAt, withDetail, withFloor } from "./plotmath.js";
import {
  EPOCH, EPOCH_PREFIX, GPU_CLOCK_SM, GPU_ECC_UNCORRECTED, GPU_MEM_TOTAL, GPU_MEM_USED, GPU_POWER, GPU_TEMP,
  GPU_TF_CURRENT, GPU_TF_PEAK, GPU_THROTTLE, GPU_UTIL, GPU_XID_ERRORS, GRAD_GLOBAL_NORM, GRAD_NORM_PREFIX,
  HOST_AVAILABLE, HOST_CPU_PERCENT, HOST_CPU_TEMP, HOST_DISK_FREE, HOST_LIMIT, HOST_RSS, HOST_RSS_ANON, HOST_RSS_FILE,
  HOST_SWAP_USED, HOST_WORKING_SET, LOSS,
  LOSS_SCALE, LR, NONFINITE_PREFIX, STEP_TIME, VAL_PREFIX, gpuParts, isGpuDevice,
} from "./series.js";

const REFETCH_AT = 20000; // points in a trace before it is reloaded downsampled from the server
const LIVE_REDRAW_MS = 250; // the shortest time between two redraws for live points
// ... and at least this many times what its last redraw took: a chart slow to draw (many
// series, a slow machine) redraws less often, so live drawing never takes the page over.
const LIVE_REDRAW_COST = 10;

// A chart is found by its id, which never changes: the page's data-chart="<id>", the key that
// alerts are marked by. Its title is for people only. Charts sort by rank, then by title.
// System and vitals series share charts by what they measure.
const RANK = { loss: 0, metric: 1, stepTime: 2, grad: 3, nonfinite: 4, host: 5, gpu: 6 };
const HOST_MEMORY = new Set([
  HOST_WORKING_SET, HOST_RSS, HOST_RSS_ANON, HOST_RSS_FILE, HOST_LIMIT, HOST_AVAILABLE, HOST_SWAP_USED,
]);
const GROUPS = [
  {
    id: "grad_norm", title: "gradient norm", rank: RANK.grad, log: true, height: 340, legend: "below",
    holds: (name) => name === GRAD_GLOBAL_NORM || name.startsWith(GRAD_NORM_PREFIX),
    // A model has tens to hundreds of layers: they are chosen in a list under the chart (which
    // Tab reaches), and only those chosen go to plotly, whose legend lists the few drawn.
    pick: (name) => (name.startsWith(GRAD_NORM_PREFIX) ? name.slice(GRAD_NORM_PREFIX.length) : null), pickTitle: "Layers",
  },
  // The optimizer's own state, read in the train step: not a Keras running mean.
  { id: LR, title: "learning rate", rank: RANK.stepTime, log: true, holds: (name) => name === LR },
  { id: LOSS_SCALE, title: "loss scale", rank: RANK.stepTime, log: true, holds: (name) => name === LOSS_SCALE },
  // Counts that stay 0 in a healthy run: said in words, not four flat lines on -1 to 1.
  {
    id: "nonfinite", title: "NaN/Inf count", rank: RANK.nonfinite, holds: (name) => name.startsWith(NONFINITE_PREFIX),
    quiet: "no NaN/Inf so far",
  },
  { id: "host_memory", title: "host memory", rank: RANK.host, bytes: true, holds: (name) => HOST_MEMORY.has(name) },
  { id: "host_cpu", title: "process CPU % (100: one core)", rank: RANK.host, holds: (name) => name === HOST_CPU_PERCENT },
  { id: "host_cpu_temp", title: "host CPU temperature (°C)", rank: RANK.host, holds: (name) => name === HOST_CPU_TEMP },
  { id: "disk_free", title: "disk free", rank: RANK.host, bytes: true, holds: (name) => name === HOST_DISK_FREE },
];
// Each GPU's charts: id "<device>_<kind>" ("gpu0_memory"), title "<device> <title>".
const GPU_GROUPS = [
  { kind: "memory", title: "memory", bytes: true, fields: [GPU_MEM_USED, GPU_MEM_TOTAL, GPU_TF_CURRENT, GPU_TF_PEAK] },
  { kind: "util", title: "utilisation %", fields: [GPU_UTIL] },
  { kind: "temp", title: "temperature (°C)", fields: [GPU_TEMP] },
  { kind: "power", title: "power (W)", fields: [GPU_POWER] },
  { kind: "clock", title: "SM clock (MHz)", fields: [GPU_CLOCK_SM] },
  { kind: "errors", title: "throttle and errors", fields: [GPU_THROTTLE, GPU_ECC_UNCORRECTED, GPU_XID_ERRORS] },
];
const TOP_VARIABLES = 5; // per-variable gradient norms shown at first; the rest in the legend

function gpuChart(device, kind) {
  const group = GPU_GROUPS.find((g) => g.kind === kind);
  return { id: `${device}_${kind}`, title: `${device} ${group.title}`, rank: RANK.gpu, bytes: Boolean(group.bytes) };
}

// The chart a series is drawn on, as { id, title, rank, log, bytes, height }; null for series
// not charted. A metric's chart holds its per-step, epoch-mean and validation series.
export function chartOf(name) {
  if (name === EPOCH) return null;
  const group = GROUPS.find((g) => g.holds(name));
  if (group) return group;
  const gpu = gpuParts(name);
  const gpuGroup = gpu && GPU_GROUPS.find((g) => g.fields.includes(gpu.field));
  if (gpuGroup) return gpuChart(gpu.device, gpuGroup.kind);
  let base = name;
  if (base.startsWith(VAL_PREFIX)) base = base.slice(VAL_PREFIX.length);
  else if (base.startsWith(EPOCH_PREFIX)) base = base.slice(EPOCH_PREFIX.length);
  if (base === STEP_TIME) return { id: STEP_TIME, title: "step time (s)", rank: RANK.stepTime, log: true };
  if (base === LOSS) return { id: base, title: base, rank: RANK.loss };
  // Keras reports its metrics at each batch as the running mean since the epoch began.
  return { id: base, title: base, rank: RANK.metric, note: "per step: Keras's running mean over the epoch" };
}

// The ids of the charts an alert is marked on: the series it is about. The run page puts an
// alert whose charts are not drawn on the loss chart.
export function alertChartIds(alert) {
  const device = isGpuDevice(alert.subject) ? alert.subject : null;
  switch (alert.rule) {
    case "nonfinite": return ["nonfinite", LOSS];
    case "grad_explosion": case "grad_vanishing": return ["grad_norm"];
    case "loss_divergence": return [LOSS];
    case "oom_forecast": case "memory_pressure": {
      const series = alert.evidence?.forecast?.series;
      if (series) return [chartOf(series)?.id ?? LOSS];
      return [device ? gpuChart(device, "memory").id : "host_memory"];
    }
    case "slowdown": return [STEP_TIME];
    case "thermal": return [device ? gpuChart(device, "temp").id : "host_cpu_temp"];
    case "hardware": return device ? [gpuChart(device, "errors").id] : [];
    default: return [LOSS];
  }
}

// Of two charts' specs, the one shown first: loss, then metrics, step time, gradients,
// NaN/Inf, host, then GPUs.
export function chartOrder(a, b) {
  return a.rank - b.rank || a.title.localeCompare(b.title);
}

// A series' colour follows from its name, never from the order series arrived in: the loss
// is the same blue on every run's page.
function colourOf(name) {
  if (name === LOSS) return PALETTE[0];
  let hash = 0;
  for (const c of name) hash = (hash * 31 + c.codePointAt(0)) >>> 0;
  return PALETTE[1 + (hash % (PALETTE.length - 1))];
}

function traceStyle(name) {
  if (name.startsWith(VAL_PREFIX)) return { mode: "lines+markers", line: { width: 2, color: "#ea580c" }, marker: { size: 6 } };
  if (name.startsWith(EPOCH_PREFIX)) return { mode: "lines+markers", line: { width: 2, dash: "dot", color: "#6b7280" }, marker: { size: 5 } };
  if (name === HOST_LIMIT || gpuParts(name)?.field === GPU_MEM_TOTAL) {
    return { mode: "lines", line: { width: 2, dash: "dash", color: "#d64545" } };
  }
  // Counts taken now and then (the weights are checked every few steps): steps, not ramps.
  if (name.startsWith(NONFINITE_PREFIX)) return { mode: "lines+markers", line: { width: 1.2, shape: "hv", color: colourOf(name) }, marker: { size: 4 } };
  if (name.startsWith(GRAD_NORM_PREFIX)) return { mode: "lines", line: { width: 1, color: colourOf(name) }, visible: "legendonly" };
  if (name === HOST_AVAILABLE) return { mode: "lines", line: { width: 1.2, color: colourOf(name) }, visible: "legendonly" };
  if (name === GRAD_GLOBAL_NORM) { // above the layers, in the page's ink: dark on light, light on dark
    const ink = getComputedStyle(document.documentElement).getPropertyValue("--ink").trim();
    return { mode: "lines", line: { width: 2, color: ink || "#1d2330" } };
  }
  return { mode: "lines", line: { width: 1.2, color: colourOf(name) } };
}

// Smoothing is for noisy per-step series; epoch means, validation points, limits and counts
// are drawn as they are.
function smoothable(name) {
  return !name.startsWith(VAL_PREFIX) && !name.startsWith(EPOCH_PREFIX) && !name.startsWith(NONFINITE_PREFIX)
    && name !== HOST_LIMIT && gpuParts(name)?.field !== GPU_MEM_TOTAL;
}

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

// The same colour for the same role on every chart: per step, epoch mean, validation.
const PALETTE = ["#2f6fed", "#9333ea", "#0d9488", "#db2777", "#65a30d", "#0891b2", "#ca8a04", "#4b5563"];

const LAYOUT = {
  margin: { l: 56, r: 16, t: 8, b: 36 },
  height: 260,
  showlegend: true,
  legend: { orientation: "h", y: 1.12, x: 0 },
  xaxis: { title: { text: "step", standoff: 6 }, zeroline: false, automargin: true },
  yaxis: { zeroline: false, automargin: true },
  paper_bgcolor: "rgba(0,0,0,0)",
  plot_bgcolor: "rgba(0,0,0,0)",
  font: { family: "system-ui, sans-serif", size: 12 },
  hovermode: "x unified",
  // Upright at the plot's right: along the top it covered the legend (and, wrapped, the
  // chart's own buttons).
  modebar: { orientation: "v" },
};

// The data of a self-hosted tool never leaves it: no "Share chart" button (recent plotly.js
// shows one by default) nor "Edit in Chart Studio" (older ones), and no server to send to.
const CONFIG = {
  responsive: true, displaylogo: false, showSendToCloud: false, showEditInChartStudio: false, plotlyServerURL: "",
};

// plotly.js, loaded the first time a page draws charts: the runs list opens without parsing
// its 3.5 MB.
let plotly = null;
export function plotlyReady() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  plotly ??= new Promise((resolve, reject) => {
    const script = document.createElement("script");
    script.src = "/static/vendor/plotly.min.js";
    script.onload = () => resolve(window.Plotly);
    script.onerror = () => { plotly = null; reject(new Error("could not load /static/vendor/plotly.min.js")); };
    document.head.appendChild(script);
  });
  return plotly;
}

// The layout in the page's colours (light or dark, as the system prefers).
export function themed(layout) {
  const style = getComputedStyle(document.documentElement);
  const ink = style.getPropertyValue("--ink").trim(), line = style.getPropertyValue("--line").trim();
  if (ink) layout.font = { ...layout.font, color: ink };
  if (line) for (const axis of [layout.xaxis, layout.yaxis]) Object.assign(axis, { gridcolor: line, linecolor: line });
  return layout;
}

// The heatmap looks like the charts.
export { LAYOUT as PLOT_LAYOUT, CONFIG as PLOT_CONFIG };

// Charts (anything with a draw()) waiting to redraw, drawn in animation frames: as many in one frame as fit in
// FRAME_BUDGET_MS (at least one), the rest in the next, so redraws never add up to a long task.
const pending = new Set();
const FRAME_BUDGET_MS = 12;

export function drawSoon(chart) {
  if (!pending.size) requestAnimationFrame(drawPending);
  pending.add(chart);
}

export function cancelDraw(chart) { pending.delete(chart); }

// How long a live redraw waits: until `every` ms after the last one, and LIVE_REDRAW_COST
// times what that one took (cost, in ms).
export function liveWait(last, cost, every) {
  return last + Math.max(every, LIVE_REDRAW_COST * cost) - performance.now();
}

function drawPending() {
  const start = performance.now();
  for (const chart of pending) {
    pending.delete(chart);
    chart.draw();
    if (performance.now() - start > FRAME_BUDGET_MS) break;
  }
  if (pending.size) requestAnimationFrame(drawPending);
}

// plotly's legend entries answer the mouse only (its toolbar's are buttons): each entry of a
// series the chart draws is made a checkbox that Tab reaches, named, that Enter and Space
// tick. Called after each plot (plotly keeps the entries' nodes; new ones get the same).
// legend: { has(name), shown(name), toggle(name) }.
function legendByKeys(plot, legend) {
  for (const entry of plot.querySelectorAll(".legend .traces")) {
    const name = entry.querySelector(".legendtext")?.textContent;
    if (name == null || !legend.has(name)) continue;
    entry.dataset.series = name;
    entry.setAttribute("tabindex", "0");
    entry.setAttribute("role", "checkbox");
    entry.setAttribute("aria-checked", String(legend.shown(name)));
    entry.setAttribute("aria-label", `draw ${name}`);
  }
  if (plot.dataset.keyboard) return;
  plot.dataset.keyboard = "true";
  plot.addEventListener("keydown", (event) => {
    const entry = event.target.closest?.(".legend .traces[data-series]");
    if (!entry || (event.key !== "Enter" && event.key !== " ")) return;
    event.preventDefault();
    legend.toggle(entry.dataset.series);
  });
}

// A card hidden by the chart filter, or shown again. A class, not the hidden attribute: a card
// may hide itself for reasons of its own (the heatmap, until it has two layers).
export function filterOut(card, out) { card.classList.toggle("filtered-out", out); }

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
// The range a plotly relayout event gives an axis ("xaxis", "yaxis"), or null when none.
function rangeIn(event, axis) {
  if (event[`${axis}.range[0]`] != null) return [event[`${axis}.range[0]`], event[`${axis}.range[1]`]];
  return Array.isArray(event[`${axis}.range`]) ? [...event[`${axis}.range`]] : null;
}

export class Chart {
  constructor(container, spec, { onTooLong, onZoom, onDownload, onDrawn, onLog, onSeries, styleOf, seriesOf, epochsOf, pickLabel, view } = {}) {
    const { id, title, log = false, height = LAYOUT.height } = spec;
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
    this.series = new Map(); // series name -> { step, time, value }, as fetched and streamed
    this.detail = null; // { key: { min, max, points } }: a zoom's steps read at full detail
    this.visible = new Map(); // series name -> plotly's visible (true or "legendonly")
    this.xrange = null; // the zoom, in the x-axis' units; null: everything
    this.alerts = [];
    this.drawnAlerts = JSON.stringify([]);
    this.traceNames = [];
    this.frame = null;
    this.timer = null;
    this.lastDraw = -Infinity;
    this.drawCost = 0; // ms the last redraw took
    this.revision = 0; // plotly's datarevision: the arrays it was given grow in place
    this.picked = ""; // what the series list shows, to redraw it only when that changed
    this.onScreen = true; // off screen, a redraw waits (the card is marked data-stale)
    this.card.querySelector('[data-tool="log"]').addEventListener("click", () => {
      this.log = !this.log;
      this.onLog?.(this);
      this.schedule();
    });
    for (const format of ["csv", "jsonl"]) {
      this.card.querySelector(`[data-tool="${format}"]`)?.addEventListener("click", () => this.onDownload(format, this));
    }
    this.card.querySelector(".picks")?.addEventListener("change", (event) => {
      const name = event.target.dataset?.series;
      if (name == null) return;
      this.visible.set(name, event.target.checked ? true : "legendonly");
      this.schedule();
    });
    Plotly.newPlot(this.plot, [], this.layout([]), CONFIG);
    this.plot.on("plotly_relayout", (event) => this.zoomed(event));
    // Once plotly has drawn (its legend too, which can come after react returns).
    if (spec.legend !== false) {
      const legend = {
        has: (name) => this.series.has(name),
        shown: (name) => this.isShown(name),
        toggle: (name) => { this.visible.set(name, this.isShown(name) ? "legendonly" : true); this.schedule(); },
      };
      this.plot.on("plotly_afterplot", () => legendByKeys(this.plot, legend));
    }
    this.plot.on("plotly_restyle", ([update, indices]) => {
      if (!update || !("visible" in update)) return;
      indices.forEach((index, i) => {
        const name = this.traceNames[index];
        const value = Array.isArray(update.visible) ? update.visible[i] : update.visible;
        if (name != null) this.visible.set(name, value);
      });
      this.schedule(); // a series shown from the legend gets its points
    });
    this.observer = new IntersectionObserver(([entry]) => {
      this.onScreen = entry.isIntersecting;
      if (this.onScreen && "stale" in this.card.dataset) this.schedule();
    });
    this.observer.observe(this.card);
    // The system switched between light and dark: the plot takes the page's new colours.
    this.scheme = matchMedia("(prefers-color-scheme: dark)");
    this.rethemed = () => this.schedule();
    this.scheme.addEventListener("change", this.rethemed);
    this.updateCount();
  }

  has(name) { return this.series.has(name); }

  // Replace (or create) a series with a full, possibly downsampled, copy.
  setSeries(name, data) {
    const fresh = !this.series.has(name);
    if (fresh && name.startsWith(GRAD_NORM_PREFIX)) {
      // The first variables to arrive are shown; showTopVariables() ranks them later.
      const shown = [...this.visible].filter(([n, v]) => n.startsWith(GRAD_NORM_PREFIX) && v === true).length;
      if (shown < TOP_VARIABLES) this.visible.set(name, true);
    }
    this.series.set(name, { step: [...data.step], time: [...data.time], value: [...data.value] });
    this.updateCount();
    this.schedule();
    if (fresh) this.onSeries?.(this);
  }

  // Append live points newer than what the series holds.
  extend(name, data) {
    const series = this.series.get(name);
    if (!series) { this.setSeries(name, data); return; }
    const last = series.step.length ? series.step[series.step.length - 1] : -Infinity;
    let added = 0;
    for (let i = 0; i < data.step.length; i++) {
      if (data.step[i] > last) {
        series.step.push(data.step[i]); series.time.push(data.time[i]); series.value.push(data.value[i]);
        added += 1;
      }
    }
    if (!added) return;
    this.updateCount();
    this.schedule({ live: true });
    if (series.step.length > REFETCH_AT && this.onTooLong) this.onTooLong(name);
  }

  updateCount() {
    let total = 0;
    for (const series of this.series.values()) total += series.step.length;
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
    if (!xrange) this.detail = null;
    this.schedule();
  }

  // The zoomed steps read again at full detail: { key: { min, max, points } }, each series'
  // points of its steps min to max (those of a series not in it stay as they are).
  setDetail(detail) { this.detail = detail; this.schedule(); }

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
    const held = (keys ?? [...this.series.keys()]).filter((key) => this.series.has(key));
    const longest = held.sort((p, q) => this.series.get(q).step.length - this.series.get(p).step.length)[0];
    if (longest == null) return null;
    const { start, run } = this.source(longest);
    if (this.view.xaxis === "epoch") {
      const axis = this.epochsOf?.(run);
      return { min: Math.floor(axis ? axis.step(a) : a), max: Math.ceil(axis ? axis.step(b) : b) };
    }
    const seconds = (x) => (this.view.xaxis === "wall" ? Date.parse(x) / 1000 : start + Number(x));
    return stepsBetween(this.series.get(longest), seconds(a), seconds(b));
  }

  zoomed(event) {
    const zoomedTo = rangeIn(event, "xaxis");
    // The y-axis dragged alone: plotly keeps the range it was dragged to, and a log axis' tick
    // spacing must follow it (a step of 0.2 over ten decades would be thousands of ticks).
    const computed = this.plot.layout.yaxis.tickmode === "array"; // ticks of ours (log, bytes)
    if (computed && !zoomedTo && !event["xaxis.autorange"]) {
      const yrange = rangeIn(event, "yaxis");
      const ticks = yrange && (this.plot.layout.yaxis.type === "log" ? logTicks(yrange) : byteTicks(yrange));
      if (ticks) Plotly.relayout(this.plot, { "yaxis.tickvals": ticks.tickvals, "yaxis.ticktext": ticks.ticktext });
      else if (event["yaxis.autorange"]) this.schedule(); // back to the data's range and ticks
    }
    let xrange;
    if (event["xaxis.autorange"] || event["autosize"]) xrange = null;
    else if (zoomedTo) xrange = zoomedTo;
    else return; // not a zoom (our own shapes, a resize)
    if (xrange === null && event["autosize"] && this.xrange) return;
    this.xrange = xrange;
    if (!xrange) this.detail = null;
    this.updateCount();
    this.schedule(); // the y-range follows the zoom
    this.onZoom?.(xrange, this);
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

  shown(name) {
    const whole = this.series.get(name);
    const detail = this.detail?.[name];
    return detail ? withDetail(whole, detail.points, detail.min, detail.max) : whole;
  }

  // Show the per-variable gradient norms that reached the highest values; the others stay
  // one click away in the legend (a large model has hundreds).
  showTopVariables() {
    const peaks = [];
    for (const [name, series] of this.series) {
      if (!name.startsWith(GRAD_NORM_PREFIX)) continue;
      const ys = series.value.filter((v) => v != null && isFinite(v));
      peaks.push([ys.length ? Math.max(...ys) : -Infinity, name]);
    }
    if (!peaks.length) return;
    peaks.sort((a, b) => b[0] - a[0]);
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
    const forecasts = this.markings().forecasts;
    this.card.dataset.alertMarkers = String(alerts.filter((a) => a.step != null).length);
    this.card.dataset.forecasts = String(forecasts);
    this.schedule();
  }

  markings() {
    const shapes = [], annotations = this.markerLabels();
    let forecasts = 0;
    for (const alert of this.alerts) {
      if (alert.step == null) continue;
      const colour = SEVERITY_COLOURS[alert.severity] ?? "#8a93a6";
      const firing = alert.state === "firing";
      const x = this.xOf(alert.step, alert.time, { run: alert.run_id });
      shapes.push({
        type: "line", xref: "x", yref: "paper", x0: x, x1: x, y0: 0, y1: 1,
        line: { color: colour, width: 1.5, dash: firing ? "solid" : "dot" }, opacity: firing ? 0.9 : 0.5,
      });
      const forecast = alert.evidence?.forecast;
      if (!firing || alert.rule !== "oom_forecast" || !forecast || chartOf(forecast.series)?.id !== this.id) continue;
      const [s0, s1] = forecast.step, [v0, v1] = forecast.value, [t0, t1] = forecast.time;
      shapes.push({
        type: "line", xref: "x", yref: "y", x0: this.xOf(s0, t0), x1: this.xOf(s1, t1), y0: v0, y1: v1,
        line: { color: colour, width: 2, dash: "dash" },
      });
      const left = Math.max(0, t1 - Date.now() / 1000);
      annotations.push({
        x: this.xOf(s1, t1), y: v1, xref: "x", yref: "y", ax: -36, ay: -28, arrowcolor: colour, arrowwidth: 1,
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
    const marked = this.alerts.filter((alert) => alert.step != null)
      .map((alert) => ({ alert, x: this.xOf(alert.step, alert.time, { run: alert.run_id }) }))
      .map((mark) => ({ ...mark, at: Number(mark.x) }))
      .sort((a, b) => a.at - b.at);
    if (!marked.length) return [];
    const [lo, hi] = this.xSpan(marked.map((mark) => mark.at));
    const pixels = Math.max(100, this.plot.clientWidth - 80) / (hi - lo || 1); // per x unit
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
    if (this.xrange) return this.xrange.map((x) => (this.view.xaxis === "wall" ? Date.parse(x) : Number(x)));
    const xs = [...marks];
    for (const [key, series] of this.series) {
      const last = series.step.length - 1;
      if (last < 0) continue;
      const source = this.source(key);
      xs.push(Number(this.xOf(series.step[0], series.time[0], source)), Number(this.xOf(series.step[last], series.time[last], source)));
    }
    return [Math.min(...xs), Math.max(...xs)];
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

  traces() {
    const traces = [];
    this.traceNames = [];
    const weight = this.view.smoothing;
    for (const name of this.series.keys()) {
      const { name: label = name, ...style } = this.styleOf?.(name) ?? traceStyle(name);
      const source = this.source(name);
      const visible = this.visible.get(name) ?? style.visible ?? true;
      if (visible !== true && this.picks(name)) continue; // not chosen: not drawn at all
      const data = this.shown(name);
      // In steps, the series' own array (plotly reads, never writes it; datarevision says it grew).
      // A series hidden in the legend goes with its first point only, until it is shown: with
      // none, plotly would leave it out of the legend too, where it is shown again.
      const points = visible === true ? data.step.length : Math.min(1, data.step.length);
      const x = this.view.xaxis === "step" && points === data.step.length ? data.step
        : data.step.slice(0, points).map((step, i) => this.xOf(step, data.time[i], source));
      // plotly reads trace names as HTML (<b>, <a href>): a series name is text.
      const y = points === data.value.length ? data.value : data.value.slice(0, points);
      const trace = { legendgroup: name, ...style, name: plotText(label), x, y, type: "scatter", visible };
      // Sizes in binary units on hover too, as on the axis.
      if (this.spec.bytes) Object.assign(trace, { text: this.bytesText(name, y), hovertemplate: "%{text}" });
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
    this.byteTexts ??= new Map();
    const kept = this.byteTexts.get(name);
    if (kept?.y !== y || kept.text.length > y.length) {
      const text = y.map(formatBytes);
      this.byteTexts.set(name, { y, text });
      return text;
    }
    for (let i = kept.text.length; i < y.length; i++) kept.text.push(formatBytes(y[i]));
    return kept.text;
  }

  layout(traces) {
    const layout = themed({ ...structuredClone(LAYOUT), height: this.spec.height ?? LAYOUT.height, showlegend: this.spec.legend !== false });
    layout.datarevision = ++this.revision;
    // Under the plot, a legend of any length pushes the plot up rather than covering it.
    // At the figure's foot (not the plot's, where the x-axis' title is), the plot's margin
    // made room for it.
    if (this.spec.legend === "below") layout.legend = { orientation: "h", x: 0, y: 0, yref: "container", yanchor: "bottom" };
    layout.xaxis.title.text = this.xTitle();
    if (this.view.xaxis === "wall") layout.xaxis.type = "date";
    if (this.xrange) Object.assign(layout.xaxis, { range: [...this.xrange], autorange: false });
    const values = this.valuesInView(traces);
    // A log axis only for values mostly above zero (a learning rate gone negative is drawn
    // linear; a loss that dips below zero now and then stays log).
    const log = this.log && mostlyPositive(values);
    if (log) layout.yaxis.type = "log";
    let range = this.yRange(values, log);
    // Values that do not change (a constant learning rate) get a range around them, not
    // plotly's ±1 with ticks in float32's noise (-0.00100000004749745282).
    if (!range && steady(values)) range = fullRange(values, log);
    if (this.spec.bytes && !log) range = withFloor(range ?? fullRange(values));
    const quiet = Boolean(this.spec.quiet) && values.length > 0 && values.every((v) => v === 0);
    if (quiet) range = [-0.1, 1];
    this.card.dataset.quiet = String(quiet);
    layout.yaxis.range = range ?? undefined;
    layout.yaxis.autorange = !range;
    // Ticks that say their value: on a log axis the decades (and 2, 5) in full, bytes in binary
    // units; else plotly's, in scientific notation past a million, never an SI prefix.
    const ticks = quiet ? { tickvals: [0], ticktext: ["0"] }
      : log ? logTicks(range ?? fullRange(values, true)) : this.spec.bytes ? byteTicks(range) : null;
    Object.assign(layout.yaxis, ticks ? { tickmode: "array", ...ticks } : { exponentformat: "e", dtick: log ? 1 : undefined },
      { hoverformat: ".4~g" });
    this.card.dataset.clipped = String(Boolean(range) && !steady(values));
    this.card.dataset.log = String(log);
    const { shapes, annotations } = this.markings();
    if (quiet) {
      annotations.push({ x: 0.5, xref: "paper", y: 0.55, yref: "paper", showarrow: false, text: plotText(this.spec.quiet),
        font: { size: 13, color: getComputedStyle(document.documentElement).getPropertyValue("--muted").trim() || "#6b7280" } });
    }
    return { ...layout, shapes, annotations };
  }

  // The y values of the points in view (all of them, or the zoom's).
  valuesInView(traces) {
    const values = [];
    const wall = this.view.xaxis === "wall";
    const [lo, hi] = this.xrange ? this.xrange.map((x) => (wall ? Date.parse(x) : Number(x))) : [-Infinity, Infinity];
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
    if (!this.view.clip && !this.xrange) return null;
    if (this.view.clip) {
      const clipped = clippedRange(values, log);
      if (clipped || !this.xrange) return clipped;
    }
    return fullRange(values, log);
  }

  draw() {
    this.frame = null;
    delete this.card.dataset.stale;
    const start = this.lastDraw = performance.now();
    const traces = this.traces();
    Plotly.react(this.plot, traces, this.layout(traces), CONFIG);
    this.card.querySelector('[data-tool="log"]').setAttribute("aria-pressed", String(this.log));
    this.card.dataset.drawn = String(traces.reduce((n, t) => n + (t.meta === "raw" || t.visible !== true ? 0 : t.x.length), 0));
    this.drawPicks();
    this.drawCost = performance.now() - start;
    this.onDrawn?.(this);
  }

  // Whether a series is one to choose from the list (by its own name: runs compared key theirs).
  picks(key) { return this.spec.pick?.(this.source(key).name) != null; }

  pickColour(key) { return (this.styleOf?.(key) ?? traceStyle(key)).line?.color ?? colourOf(key); }

  // The list of the series to choose from (pick), each with its colour, those drawn ticked.
  drawPicks() {
    const picks = this.card.querySelector(".picks");
    if (!picks) return;
    const label = (name) => this.pickLabel?.(name) ?? this.spec.pick(name);
    const names = [...this.series.keys()].filter((name) => this.picks(name))
      .sort((a, b) => label(a).localeCompare(label(b), undefined, { numeric: true }));
    const shown = names.filter((name) => this.visible.get(name) === true);
    const key = JSON.stringify([names, shown]);
    if (key === this.picked) return;
    this.picked = key;
    this.card.querySelector(".series-picker summary").textContent = `${this.spec.pickTitle}: ${shown.length} of ${names.length} drawn`;
    const drawn = new Set(shown);
    picks.innerHTML = names.map((name) => `<label><input type="checkbox" data-series="${escapeHTML(name)}"${drawn.has(name) ? " checked" : ""}>
      <span class="swatch" style="background:${this.pickColour(name)}"></span>${escapeHTML(label(name))}</label>`).join("");
  }

  destroy() {
    cancelDraw(this);
    clearTimeout(this.timer);
    this.scheme.removeEventListener("change", this.rethemed);
    this.observer.disconnect();
    Plotly.purge(this.plot);
    this.card.remove();
  }
}
