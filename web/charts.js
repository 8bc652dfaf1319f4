// Live plotly charts: one chart per metric (its per-step, epoch-mean and validation series
// together) and one per series group (grad/, host/, gpu0/ ...). New points are appended with
// Plotly.extendTraces; a chart is never redrawn from scratch while it streams.

const REFETCH_AT = 20000; // points in a trace before it is reloaded downsampled from the server

// The chart a series is drawn on; null for series not charted.
export function chartKey(name) {
  if (name === "epoch") return null;
  let base = name;
  if (base.startsWith("val_")) base = base.slice(4);
  else if (base.startsWith("epoch/")) base = base.slice(6);
  return base.includes("/") ? base.split("/")[0] : base;
}

// Loss first, then metrics, then step time, then the groups of system series.
export function chartOrder(a, b) {
  const rank = (key) => (key === "loss" ? 0 : key === "step_time" ? 2 : key.match(/^(grad|nonfinite|host|gpu\d*)$/) ? 3 : 1);
  return rank(a) - rank(b) || a.localeCompare(b);
}

// The same colour for the same role on every chart: per step, epoch mean, validation.
const PALETTE = ["#2f6fed", "#9333ea", "#0d9488", "#db2777", "#65a30d", "#0891b2", "#ca8a04", "#4b5563"];

function traceStyle(name, index) {
  if (name.startsWith("val_")) return { mode: "lines+markers", line: { width: 2, color: "#ea580c" }, marker: { size: 6 } };
  if (name.startsWith("epoch/")) return { mode: "lines+markers", line: { width: 2, dash: "dot", color: "#6b7280" }, marker: { size: 5 } };
  return { mode: "lines", line: { width: 1.2, color: PALETTE[index % PALETTE.length] } };
}

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
    const layout = structuredClone(LAYOUT);
    if (key === "step_time") Object.assign(layout.yaxis, { type: "log", dtick: 1 }); // a label per decade
    Plotly.newPlot(this.plot, [], layout, { responsive: true, displaylogo: false });
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
      Plotly.addTraces(this.plot, { name, x, y, type: "scatter", ...traceStyle(name, index) });
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

  destroy() { Plotly.purge(this.plot); this.card.remove(); }
}
