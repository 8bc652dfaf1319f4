// Live plotly charts: one chart per metric (its per-step, epoch-mean and validation series
// together) and one per series group (grad/, host/, gpu0/ ...). New points are appended with
// Plotly.extendTraces; a chart is never redrawn from scratch while it streams. Alerts are
// marked on the charts of the series they are about.

import { SEVERITY_COLOURS } from "./alert-feed.js";
import { escapeHTML, formatDuration } from "./format.js";

const REFETCH_AT = 20000; // points in a trace before it is reloaded downsampled from the server

// System and vitals series share charts by what they measure: [pattern, chart title].
const GROUPS = [
  [/^grad\//, "gradient norm"],
  [/^nonfinite\//, "NaN/Inf count"],
  [/^host\/(rss|limit|available|swap_used)$/, "host memory"],
  [/^host\/cpu_percent$/, "host CPU %"],
  [/^host\/cpu_temp$/, "host CPU temperature (°C)"],
  [/^host\/disk_free$/, "disk free"],
  [/^(gpu\d+)\/(mem_used|mem_total|tf_current|tf_peak)$/, "$1 memory"],
  [/^(gpu\d+)\/util$/, "$1 utilisation %"],
  [/^(gpu\d+)\/temp$/, "$1 temperature (°C)"],
  [/^(gpu\d+)\/power$/, "$1 power (W)"],
  [/^(gpu\d+)\/clock_sm$/, "$1 SM clock (MHz)"],
  [/^(gpu\d+)\/(throttle|ecc_uncorrected|xid_errors)$/, "$1 throttle and errors"],
];
const LOG_SCALE = new Set(["step_time", "gradient norm"]);
const BYTES = /memory$|^disk free$|RSS by worker$/;
const TOP_VARIABLES = 5; // per-variable gradient norms shown at first; the rest in the legend

// The chart a series is drawn on; null for series not charted.
export function chartKey(name) {
  if (name === "epoch") return null;
  for (const [pattern, title] of GROUPS) {
    const match = name.match(pattern);
    if (match) return title.replace(/\$(\d)/g, (_, i) => match[Number(i)]);
  }
  let base = name;
  if (base.startsWith("val_")) base = base.slice(4);
  else if (base.startsWith("epoch/")) base = base.slice(6);
  return base;
}

// The charts an alert is marked on: the series it is about. The run page puts an alert whose
// charts are not drawn on the loss chart.
export function alertChartKeys(alert) {
  const device = /^gpu\d+$/.test(alert.subject ?? "") ? alert.subject : "host";
  switch (alert.rule) {
    case "nonfinite": return ["NaN/Inf count", "loss"];
    case "grad_explosion": case "grad_vanishing": return ["gradient norm"];
    case "loss_divergence": return ["loss"];
    case "oom_forecast": case "memory_pressure": {
      const series = alert.evidence?.forecast?.series;
      return [series ? chartKey(series) : `${device} memory`];
    }
    case "slowdown": return ["step_time"];
    case "thermal": return [device === "host" ? "host CPU temperature (°C)" : `${device} temperature (°C)`];
    case "hardware": return device === "host" ? [] : [`${device} throttle and errors`];
    default: return ["loss"];
  }
}

// Loss first, then metrics, step time, gradients, NaN/Inf, host, then GPUs.
export function chartOrder(a, b) {
  const rank = (key) => {
    if (key === "loss") return 0;
    if (key === "step_time") return 2;
    if (key === "gradient norm") return 3;
    if (key === "NaN/Inf count") return 4;
    if (key.startsWith("host") || key === "disk free") return 5;
    if (/^gpu\d+ /.test(key)) return 6;
    return 1;
  };
  return rank(a) - rank(b) || a.localeCompare(b);
}

function traceStyle(name, index) {
  if (name.startsWith("val_")) return { mode: "lines+markers", line: { width: 2, color: "#ea580c" }, marker: { size: 6 } };
  if (name.startsWith("epoch/")) return { mode: "lines+markers", line: { width: 2, dash: "dot", color: "#6b7280" }, marker: { size: 5 } };
  if (/\/(limit|mem_total)$/.test(name)) return { mode: "lines", line: { width: 2, dash: "dash", color: "#d64545" } };
  if (name.startsWith("grad/norm/")) return { mode: "lines", line: { width: 1 }, visible: "legendonly" };
  if (name === "host/available") return { mode: "lines", line: { width: 1.2 }, visible: "legendonly" };
  if (name === "grad/global_norm") return { mode: "lines", line: { width: 2, color: "#111827" } };
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

export class Chart {
  constructor(container, key, { onTooLong } = {}) {
    this.key = key;
    this.onTooLong = onTooLong;
    this.card = document.createElement("section");
    this.card.className = "chart-card";
    this.card.dataset.chart = key;
    this.card.innerHTML = `<h3></h3><div class="plot"></div>`;
    this.card.querySelector("h3").textContent = key === "step_time" ? "step time (s)" : key;
    container.appendChild(this.card);
    this.plot = this.card.querySelector(".plot");
    this.traces = new Map(); // series name -> { index, lastStep, length }
    this.drawnAlerts = JSON.stringify([[], []]);
    this.visibleVariables = 0;
    const layout = structuredClone(LAYOUT);
    if (LOG_SCALE.has(key)) Object.assign(layout.yaxis, { type: "log", dtick: 1 }); // a label per decade
    if (BYTES.test(key)) Object.assign(layout.yaxis, { tickformat: ".4~s", ticksuffix: "B" });
    if (key === "gradient norm") layout.height = 320;
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
      if (name.startsWith("grad/norm/") && this.visibleVariables < TOP_VARIABLES) {
        style.visible = true; // the first ones to arrive; showTopVariables() ranks them later
        this.visibleVariables += 1;
      }
      Plotly.addTraces(this.plot, { name, x, y, type: "scatter", ...style });
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
      if (!name.startsWith("grad/norm/")) continue;
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
      if (!firing || alert.rule !== "oom_forecast" || !forecast || chartKey(forecast.series) !== this.key) continue;
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
