// Live plotly charts: one chart per metric (its per-step, epoch-mean and validation series
// together) and one per series group (grad/, host/, gpu0/ ...). New points are appended with
// Plotly.extendTraces; a chart is never redrawn from scratch while it streams. Alerts are
// marked on the charts of the series they are about.

import { SEVERITY_COLOURS } from "./alert-feed.js";
import { escapeHTML, formatDuration } from "./format.js";
import {
  EPOCH, EPOCH_PREFIX, GPU_CLOCK_SM, GPU_ECC_UNCORRECTED, GPU_MEM_TOTAL, GPU_MEM_USED, GPU_POWER, GPU_TEMP,
  GPU_TF_CURRENT, GPU_TF_PEAK, GPU_THROTTLE, GPU_UTIL, GPU_XID_ERRORS, GRAD_GLOBAL_NORM, GRAD_NORM_PREFIX,
  HOST_AVAILABLE, HOST_CPU_PERCENT, HOST_CPU_TEMP, HOST_DISK_FREE, HOST_LIMIT, HOST_RSS, HOST_SWAP_USED, LOSS,
  NONFINITE_PREFIX, STEP_TIME, VAL_PREFIX, gpuParts, isGpuDevice,
} from "./series.js";

const REFETCH_AT = 20000; // points in a trace before it is reloaded downsampled from the server

// A chart is found by its id, which never changes: the page's data-chart="<id>", the key that
// alerts are marked by. Its title is for people only. Charts sort by rank, then by title.
// System and vitals series share charts by what they measure.
const RANK = { loss: 0, metric: 1, stepTime: 2, grad: 3, nonfinite: 4, host: 5, gpu: 6 };
const HOST_MEMORY = new Set([HOST_RSS, HOST_LIMIT, HOST_AVAILABLE, HOST_SWAP_USED]);
const GROUPS = [
  {
    id: "grad_norm", title: "gradient norm", rank: RANK.grad, log: true, height: 320,
    holds: (name) => name === GRAD_GLOBAL_NORM || name.startsWith(GRAD_NORM_PREFIX),
  },
  { id: "nonfinite", title: "NaN/Inf count", rank: RANK.nonfinite, holds: (name) => name.startsWith(NONFINITE_PREFIX) },
  { id: "host_memory", title: "host memory", rank: RANK.host, bytes: true, holds: (name) => HOST_MEMORY.has(name) },
  { id: "host_cpu", title: "host CPU %", rank: RANK.host, holds: (name) => name === HOST_CPU_PERCENT },
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
  return { id: base, title: base, rank: base === LOSS ? RANK.loss : RANK.metric };
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

function traceStyle(name, index) {
  if (name.startsWith(VAL_PREFIX)) return { mode: "lines+markers", line: { width: 2, color: "#ea580c" }, marker: { size: 6 } };
  if (name.startsWith(EPOCH_PREFIX)) return { mode: "lines+markers", line: { width: 2, dash: "dot", color: "#6b7280" }, marker: { size: 5 } };
  if (name === HOST_LIMIT || gpuParts(name)?.field === GPU_MEM_TOTAL) {
    return { mode: "lines", line: { width: 2, dash: "dash", color: "#d64545" } };
  }
  if (name.startsWith(GRAD_NORM_PREFIX)) return { mode: "lines", line: { width: 1 }, visible: "legendonly" };
  if (name === HOST_AVAILABLE) return { mode: "lines", line: { width: 1.2 }, visible: "legendonly" };
  if (name === GRAD_GLOBAL_NORM) return { mode: "lines", line: { width: 2, color: "#111827" } };
  return { mode: "lines", line: { width: 1.2, color: PALETTE[index % PALETTE.length] } };
}

// The same colour for the same role on every chart: per step, epoch mean, validation.
const PALETTE = ["#2f6fed", "#9333ea", "#0d9488", "#db2777", "#65a30d", "#0891b2", "#ca8a04", "#4b5563"];

const LAYOUT = {
  margin: { l: 56, r: 16, t: 8, b: 36 },
  height: 260,
  showlegend: true,
  legend: { orientation: "h", y: 1.12, x: 0 },
  xaxis: { title: { text: "step" }, zeroline: false },
  yaxis: { zeroline: false, automargin: true },
  paper_bgcolor: "rgba(0,0,0,0)",
  plot_bgcolor: "rgba(0,0,0,0)",
  font: { family: "system-ui, sans-serif", size: 12 },
  hovermode: "x unified",
};

// The data of a self-hosted tool never leaves it: no "Share chart" button (recent plotly.js
// shows one by default) nor "Edit in Chart Studio" (older ones), and no server to send to.
const CONFIG = {
  responsive: true, displaylogo: false, showSendToCloud: false, showEditInChartStudio: false, plotlyServerURL: "",
};

// The compare view's plots look like these.
export { LAYOUT as PLOT_LAYOUT, CONFIG as PLOT_CONFIG };

// One chart card. spec: { id, title, log, bytes, height }, as chartOf gives it.
export class Chart {
  constructor(container, spec, { onTooLong } = {}) {
    const { id, title, log = false, bytes = false, height = LAYOUT.height } = spec;
    this.spec = spec;
    this.id = id;
    this.onTooLong = onTooLong;
    this.card = document.createElement("section");
    this.card.className = "chart-card";
    this.card.dataset.chart = id;
    this.card.innerHTML = `<h3></h3><div class="plot"></div>`;
    this.card.querySelector("h3").textContent = title;
    container.appendChild(this.card);
    this.plot = this.card.querySelector(".plot");
    this.traces = new Map(); // series name -> { index, lastStep, length }
    this.drawnAlerts = JSON.stringify([[], []]);
    this.visibleVariables = 0;
    const layout = { ...structuredClone(LAYOUT), height };
    if (log) Object.assign(layout.yaxis, { type: "log", dtick: 1 }); // a label per decade
    if (bytes) Object.assign(layout.yaxis, { tickformat: ".4~s", ticksuffix: "B" });
    Plotly.newPlot(this.plot, [], layout, CONFIG);
    this.updateCount();
  }

  has(name) { return this.traces.has(name); }

  // Replace (or create) a trace with a full, possibly downsampled, series.
  setSeries(name, data) {
    const x = data.step, y = data.value;
    const lastStep = x.length ? x[x.length - 1] : -Infinity;
    const existing = this.traces.get(name);
    if (existing) {
      Plotly.restyle(this.plot, { x: [x], y: [y] }, [existing.index]);
      Object.assign(existing, { lastStep, length: x.length });
    } else {
      const index = this.traces.size;
      const style = traceStyle(name, index);
      if (name.startsWith(GRAD_NORM_PREFIX) && this.visibleVariables < TOP_VARIABLES) {
        style.visible = true; // the first ones to arrive; showTopVariables() ranks them later
        this.visibleVariables += 1;
      }
      // plotly reads trace names as HTML (<b>, <a href>): a series name is text.
      Plotly.addTraces(this.plot, { name: escapeHTML(name), x, y, type: "scatter", ...style });
      this.traces.set(name, { index, lastStep, length: x.length });
    }
    this.updateCount();
  }

  // Append live points newer than what the trace holds.
  extend(name, data) {
    const trace = this.traces.get(name);
    if (!trace) { this.setSeries(name, data); return; }
    const x = [], y = [];
    for (let i = 0; i < data.step.length; i++) {
      if (data.step[i] > trace.lastStep) { x.push(data.step[i]); y.push(data.value[i]); }
    }
    if (!x.length) return;
    Plotly.extendTraces(this.plot, { x: [x], y: [y] }, [trace.index]);
    trace.lastStep = x[x.length - 1];
    trace.length += x.length;
    this.updateCount();
    if (trace.length > REFETCH_AT && this.onTooLong) this.onTooLong(name);
  }

  updateCount() {
    let total = 0;
    for (const trace of this.traces.values()) total += trace.length;
    this.card.dataset.points = String(total);
  }

  // Show the per-variable gradient norms that reached the highest values; the others stay
  // one click away in the legend (a large model has hundreds).
  showTopVariables() {
    const peaks = [];
    for (const [name, trace] of this.traces) {
      if (!name.startsWith(GRAD_NORM_PREFIX)) continue;
      const ys = this.plot.data[trace.index].y.filter((v) => v != null && isFinite(v));
      peaks.push([ys.length ? Math.max(...ys) : -Infinity, trace.index]);
    }
    peaks.sort((a, b) => b[0] - a[0]);
    if (!peaks.length) return;
    const top = new Set(peaks.slice(0, TOP_VARIABLES).map(([, index]) => index));
    const indices = peaks.map(([, index]) => index);
    Plotly.restyle(this.plot, { visible: indices.map((i) => (top.has(i) ? true : "legendonly")) }, indices);
    this.visibleVariables = top.size;
  }

  // A vertical line at each alert's step in its severity's colour (dotted once resolved) and,
  // while an oom_forecast about a series of this chart fires, its projection up to the limit
  // labelled with the time left. Redrawn only when something changed.
  setAlerts(alerts) {
    const shapes = [], annotations = [];
    let forecasts = 0;
    for (const alert of alerts) {
      if (alert.step == null) continue;
      const colour = SEVERITY_COLOURS[alert.severity] ?? "#8a93a6";
      const firing = alert.state === "firing";
      shapes.push({
        type: "line", xref: "x", yref: "paper", x0: alert.step, x1: alert.step, y0: 0, y1: 1,
        line: { color: colour, width: 1.5, dash: firing ? "solid" : "dot" }, opacity: firing ? 0.9 : 0.5,
      });
      annotations.push({
        x: alert.step, xref: "x", y: 1, yref: "paper", xanchor: "left", yanchor: "top", showarrow: false,
        text: escapeHTML(alert.rule), hovertext: escapeHTML(alert.message), font: { size: 10, color: colour },
      });
      const forecast = alert.evidence?.forecast;
      if (!firing || alert.rule !== "oom_forecast" || !forecast || chartOf(forecast.series)?.id !== this.id) continue;
      const [s0, s1] = forecast.step, [v0, v1] = forecast.value;
      shapes.push({
        type: "line", xref: "x", yref: "y", x0: s0, x1: s1, y0: v0, y1: v1,
        line: { color: colour, width: 2, dash: "dash" },
      });
      const left = Math.max(0, forecast.time[1] - Date.now() / 1000);
      annotations.push({
        x: s1, y: v1, xref: "x", yref: "y", ax: -36, ay: -28, arrowcolor: colour, arrowwidth: 1,
        text: `limit in ~${escapeHTML(formatDuration(left))}`, font: { size: 11, color: colour },
        bgcolor: "rgba(255,255,255,0.85)",
      });
      forecasts += 1;
    }
    const drawn = JSON.stringify([shapes, annotations]);
    if (drawn === this.drawnAlerts) return;
    this.drawnAlerts = drawn;
    Plotly.relayout(this.plot, { shapes, annotations });
    this.card.dataset.alertMarkers = String(shapes.length - forecasts);
    this.card.dataset.forecasts = String(forecasts);
  }

  destroy() { Plotly.purge(this.plot); this.card.remove(); }
}
