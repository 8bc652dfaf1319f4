// Per-layer gradient norms as a heatmap (layer × step, log colour) under the gradient norm
// chart: every layer at once, however many, where a legend of lines would cover the plot and
// "the top five" would hide the one that matters. The layers an alert names are marked.

import { PLOT_CONFIG, PLOT_LAYOUT, cancelDraw, drawSoon, liveWait, themed } from "./plot.js";
import { plotText } from "./format.js";
import { GRAD_NORM_PREFIX } from "./series.js";

const COLUMNS = 300; // step buckets: each cell shows the largest norm of its steps
const ROW_PX = 14;
const REDRAW_MS = 2000; // the shortest time between two redraws while points stream (an overview)
const NARROW_PX = 560; // a card narrower (a phone) shortens the layers' names, its colour bar under the map
const SHORT_NAME = 14; // characters of a layer's name kept on a narrow card (its end: the layer and kind)

// A layer's name as a narrow card shows it: its end, where the names of a model's layers
// differ ("…dense_3/kernel"); the hover says it whole.
function shortName(name) {
  return name.length <= SHORT_NAME ? name : `…${name.slice(-(SHORT_NAME - 1))}`;
}

// The variables an alert about gradients names: the early layer that vanishes, the layers
// that explode.
export function alertLayers(alert) {
  if (alert.rule !== "grad_explosion" && alert.rule !== "grad_vanishing") return [];
  const evidence = alert.evidence ?? {};
  const named = [];
  if (typeof evidence.early_variable === "string") named.push(evidence.early_variable);
  if (Array.isArray(evidence.layers)) {
    for (const layer of evidence.layers) if (typeof layer?.variable === "string") named.push(layer.variable);
  }
  return named;
}

// z[layer][bucket]: log10 of the largest finite positive norm in the bucket, null for none.
export function heatmapCells(layers, first, last, columns = COLUMNS) {
  // No more columns than the best-sampled layer has points, and none narrower than its usual
  // step between norms: norms taken every few steps would otherwise leave stripes of empty
  // cells (the agent sends them every 10 steps, and every step for a while after a jump: those
  // points counted alone made columns of 9 steps, and every tenth one empty).
  columns = Math.max(1, Math.min(columns, ...layers.map(({ step }) => step.length)));
  const gap = Math.min(...layers.map(({ step }) => usualGap(step)));
  const width = Math.max(1, Math.ceil((last - first + 1) / columns), Number.isFinite(gap) ? gap : 1);
  const count = Math.max(1, Math.ceil((last - first + 1) / width));
  const z = layers.map(({ step, value }) => {
    const row = new Array(count).fill(null);
    for (let i = 0; i < step.length; i++) {
      const v = value[i];
      if (v == null || !(v > 0) || !Number.isFinite(v)) continue;
      const at = Math.min(count - 1, Math.floor((step[i] - first) / width));
      const log = Math.log10(v);
      if (row[at] == null || log > row[at]) row[at] = log;
    }
    return row;
  });
  const x = Array.from({ length: count }, (_, i) => first + i * width + (width - 1) / 2);
  return { x, z };
}

// The median step between a layer's norms (Infinity with fewer than two).
function usualGap(steps) {
  const gaps = [];
  for (let i = 1; i < steps.length; i++) if (steps[i] > steps[i - 1]) gaps.push(steps[i] - steps[i - 1]);
  if (!gaps.length) return Infinity;
  gaps.sort((a, b) => a - b);
  return gaps[Math.floor(gaps.length / 2)];
}

export class GradHeatmap {
  constructor(container, after) {
    this.card = document.createElement("section");
    this.card.className = "chart-card chart-wide";
    this.card.dataset.chart = "grad_heatmap";
    this.card.innerHTML = `<div class="chart-head"><h3>gradient norm by layer (log₁₀)</h3></div><div class="plot" role="img"></div>`;
    container.insertBefore(this.card, after?.nextSibling ?? null);
    this.plot = this.card.querySelector(".plot");
    this.marked = [];
    this.drawn = "";
    this.series = new Map();
    this.xrange = null;
    this.axis = { title: "step", key: "step", x: (step) => step };
    this.queued = false;
    this.timer = null;
    this.lastDraw = -Infinity;
    this.drawCost = 0;
  }

  // The gradient chart's series changed: redrawn in a frame of its own, at most every two
  // seconds (less often when it is slow to draw); a zoom, or another x-axis, at once.
  // axis: the gradient chart's x-axis, { title, key (changes with it), x(step) }.
  update(series, xrange = null, axis = this.axis) {
    const zoomed = JSON.stringify(xrange) !== JSON.stringify(this.xrange) || axis.key !== this.axis.key;
    this.series = series;
    this.xrange = xrange;
    this.axis = axis;
    if (zoomed && this.timer != null) { clearTimeout(this.timer); this.timer = null; }
    if (this.queued || this.timer != null) return;
    const wait = zoomed ? 0 : liveWait(this.lastDraw, this.drawCost, REDRAW_MS);
    const queue = () => { this.timer = null; this.queued = true; drawSoon(this); };
    if (wait > 0) this.timer = setTimeout(queue, wait); else queue();
  }

  setAlerts(alerts) {
    this.marked = [...new Set(alerts.flatMap(alertLayers))];
  }

  // The gradient chart's series (a Map of name -> {step, value}): only grad/norm/* are drawn.
  draw() {
    this.queued = false;
    const start = this.lastDraw = performance.now();
    const { series, xrange, axis } = this;
    // Layers in natural order (dense_2 before dense_10), as a model lists them mostly.
    const names = [...series.keys()].filter((name) => name.startsWith(GRAD_NORM_PREFIX))
      .sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
    if (names.length < 2) { this.card.hidden = true; return; }
    this.card.hidden = false;
    const layers = names.map((name) => series.get(name));
    let first = Infinity, last = -Infinity;
    for (const { step } of layers) {
      if (step.length) { first = Math.min(first, step[0]); last = Math.max(last, step[step.length - 1]); }
    }
    if (!Number.isFinite(first)) return;
    const key = `${names.length}:${first}:${last}:${this.marked.join()}:${JSON.stringify(xrange)}:${axis.key}:${this.card.clientWidth < NARROW_PX}`;
    if (key === this.drawn) return;
    this.drawn = key;
    const cells = heatmapCells(layers, first, last);
    const { z } = cells;
    const x = cells.x.map(axis.x);
    const short = names.map((name) => name.slice(GRAD_NORM_PREFIX.length));
    const marked = new Set(this.marked);
    // plotly reads tick labels and hover text as HTML: names are escaped (the rows' names too, which
    // the hover shows); the layers an alert names are bold.
    const rows = short.map(plotText);
    // On a phone the names took the card's width and left the map ~90 px.
    const narrow = this.card.clientWidth < NARROW_PX;
    const labels = narrow ? short.map((name) => plotText(shortName(name))) : rows;
    const ticktext = short.map((name, i) => (marked.has(name) ? `<b>▶ ${labels[i]}</b>` : labels[i]));
    const layout = themed({
      ...structuredClone(PLOT_LAYOUT),
      height: Math.max(200, 60 + ROW_PX * names.length + (narrow ? 40 : 0)),
      showlegend: false,
      margin: { ...PLOT_LAYOUT.margin, l: 12 },
    });
    Object.assign(layout.yaxis, { automargin: true, tickvals: rows, ticktext, tickfont: { size: 10 }, autorange: "reversed" });
    if (xrange) Object.assign(layout.xaxis, { range: [...xrange], autorange: false });
    layout.xaxis.title = { text: axis.title };
    if (x[0] instanceof Date) layout.xaxis.type = "date";
    Plotly.react(this.plot, [{
      type: "heatmap", x, y: rows, z, colorscale: "Viridis", hoverongaps: false,
      colorbar: narrow
        ? { title: { text: "log₁₀", side: "right" }, thickness: 8, orientation: "h", y: 0, yref: "container", yanchor: "bottom", len: 1 }
        : { title: { text: "log₁₀" }, thickness: 10 },
      customdata: z.map((row) => row.map((_, i) => Math.round(cells.x[i]))),
      hovertemplate: "%{y}<br>step %{customdata}<br>norm 10^%{z:.2f}<extra></extra>",
    }], layout, PLOT_CONFIG);
    this.card.dataset.layers = String(names.length);
    this.card.dataset.marked = [...marked].filter((name) => short.includes(name)).join(",");
    this.plot.setAttribute("aria-label", `gradient norm of ${names.length} layers by step`
      + (marked.size ? `; named by an alert: ${[...marked].join(", ")}` : ""));
    this.drawCost = performance.now() - start;
  }

  destroy() { cancelDraw(this); clearTimeout(this.timer); Plotly.purge(this.plot); this.card.remove(); }
}
