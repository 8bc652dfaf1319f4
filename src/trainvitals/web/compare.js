// Runs side by side: #/compare?runs=ID,ID,... (a link that can be shared). Every chart draws
// one trace per run and series, each run in one colour on every chart, and a table of their
// configs marks the keys whose values differ.

import { getRun, getSeries } from "./api.js";
import { PLOT_CONFIG, PLOT_LAYOUT, chartOf, chartOrder, plotlyReady, themed } from "./charts.js";
import { escapeHTML, runPath, setTitle, statusBadge, healthBadge } from "./format.js";

// Colour-blind-friendly (Okabe–Ito), then more: a run's colour is its place in the address.
export const RUN_COLOURS = ["#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#7f3c8d", "#3b3b3b", "#b8860b", "#1b9e77"];
const DASHES = ["solid", "dot", "dash", "dashdot", "longdash"];
export const MAX_COMPARED = 10;
const POINTS = 1000; // per series and run: enough for an overview of several runs

export function comparePath(runIds) {
  return `#/compare?runs=${runIds.map(encodeURIComponent).join(",")}`;
}

const shown = (value) => (value === undefined ? "—" : typeof value === "object" ? JSON.stringify(value) : String(value));

export async function renderCompare(root, params) {
  setTitle("Compare");
  const ids = [...new Set((params.get("runs") ?? "").split(",").map((id) => id.trim()).filter(Boolean))].slice(0, MAX_COMPARED);
  if (!ids.length) {
    root.innerHTML = `<div class="page-head"><h1>Compare</h1></div>
      <p class="muted">Select runs in the <a href="#/">runs list</a> to compare them.</p>`;
    return () => {};
  }
  root.innerHTML = `<p class="muted">Loading ${escapeHTML(ids.length)} runs…</p>`;
  const [runs] = await Promise.all([Promise.all(ids.map((id) => getRun(id))), plotlyReady()]);
  const series = await Promise.all(runs.map((run) => getSeries(run.id, [], POINTS).then((answer) => answer.series)));
  setTitle(`Compare ${runs.length} runs`);

  const legend = runs.map((run, i) => `<li data-compared-run="${escapeHTML(run.id)}">
      <span class="swatch" style="background:${RUN_COLOURS[i % RUN_COLOURS.length]}"></span>
      <a href="${escapeHTML(runPath(run.id))}">${escapeHTML(run.name)}</a>
      ${statusBadge(run.status)}${healthBadge(run.health)} <span class="muted">${escapeHTML(run.project)}</span></li>`).join("");
  root.innerHTML = `
    <div class="page-head"><h1>Compare ${escapeHTML(runs.length)} runs</h1></div>
    <ul class="compared-runs">${legend}</ul>
    <details class="panel" open><summary>Configuration <span class="muted">(differing keys marked)</span></summary>
      <div class="table-scroll"><table class="kv config-compare" id="config-compare"></table></div></details>
    <div class="charts" id="charts"></div>`;
  drawConfig(root.querySelector("#config-compare"), runs);

  // chart id -> { spec, traces }
  const charts = new Map();
  runs.forEach((run, r) => {
    for (const [name, data] of Object.entries(series[r])) {
      const spec = chartOf(name);
      if (!spec) continue;
      if (!charts.has(spec.id)) charts.set(spec.id, { spec, names: [], traces: [] });
      const chart = charts.get(spec.id);
      if (!chart.names.includes(name)) chart.names.push(name);
      chart.traces.push({
        name: escapeHTML(`${run.name} · ${name}`), x: data.step, y: data.value, type: "scatter", mode: "lines",
        legendgroup: run.id, meta: run.id,
        line: { width: 1.4, color: RUN_COLOURS[r % RUN_COLOURS.length], dash: DASHES[chart.names.indexOf(name) % DASHES.length] },
      });
    }
  });
  const container = root.querySelector("#charts");
  const plots = [];
  for (const { spec, traces } of [...charts.values()].sort((a, b) => chartOrder(a.spec, b.spec))) {
    const card = document.createElement("section");
    card.className = "chart-card";
    card.dataset.chart = spec.id;
    card.dataset.traces = String(traces.length);
    card.innerHTML = `<h3></h3><div class="plot" role="img"></div>`;
    card.querySelector("h3").textContent = spec.title;
    card.querySelector(".plot").setAttribute("aria-label", `${spec.title} of ${runs.map((run) => run.name).join(", ")}`);
    container.appendChild(card);
    const layout = themed({ ...structuredClone(PLOT_LAYOUT), height: spec.height ?? PLOT_LAYOUT.height, showlegend: false });
    if (spec.log) layout.yaxis.type = "log";
    if (spec.bytes) Object.assign(layout.yaxis, { tickformat: ".4~s", ticksuffix: "B" });
    const plot = card.querySelector(".plot");
    Plotly.newPlot(plot, traces, layout, PLOT_CONFIG);
    plots.push(plot);
  }
  if (!plots.length) container.innerHTML = `<p class="muted">No points yet.</p>`;
  return () => { for (const plot of plots) Plotly.purge(plot); };
}

// Keys as rows, runs as columns; a row whose values are not all equal is marked.
function drawConfig(table, runs) {
  const keys = [...new Set(runs.flatMap((run) => Object.keys(run.config ?? {})))].sort();
  const head = `<tr><th>key</th>${runs.map((run, i) => `<th><span class="swatch" style="background:${RUN_COLOURS[i % RUN_COLOURS.length]}"></span>${escapeHTML(run.name)}</th>`).join("")}</tr>`;
  const rows = keys.map((key) => {
    const values = runs.map((run) => shown(run.config?.[key]));
    const differs = new Set(values).size > 1;
    return `<tr class="${differs ? "differs" : ""}" data-config-key="${escapeHTML(key)}" data-differs="${differs}">
      <th>${escapeHTML(key)}${differs ? ' <span class="visually-hidden">(differs)</span>' : ""}</th>
      ${values.map((value) => `<td>${escapeHTML(value)}</td>`).join("")}</tr>`;
  });
  table.innerHTML = head + (rows.join("") || `<tr><td class="muted">no config</td></tr>`);
}
