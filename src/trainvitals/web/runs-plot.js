// The runs as points (TensorBoard's hyperparameter scatter, W&B's sweep scatter): one point a
// run, across every page of the list's view, x a config value or a series' statistic, y a
// series' statistic; a point opens its run.

import { PLOT_CONFIG, PLOT_LAYOUT, plotlyReady, themed } from "./charts.js";
import { escapeHTML, formatNumber, runPath } from "./format.js";

// Runs plotted at most (the list's view, newest first unless it is sorted otherwise).
export const PLOT_RUNS = 1000;

// An axis from its key: "config:lr" (a config value), or a metric column's sort key
// ("last:loss", "min:val_loss"); its label; and a run's value on it (undefined: none).
export function plotAxis(key) {
  const at = key.indexOf(":");
  const kind = key.slice(0, at), name = key.slice(at + 1);
  if (kind === "config") return { key, label: name, value: (run) => run.config?.[name] };
  return {
    key,
    label: kind === "last" ? name : `${name} (${kind})`,
    value: (run) => {
      const summary = run.metrics?.[name];
      return summary && summary[kind] != null ? summary[kind] : undefined;
    },
  };
}

// Draws the runs on `plot` (a div); returns how many have a value on both axes.
export async function drawRunsPlot(plot, runs, x, y) {
  const Plotly = await plotlyReady();
  const shown = runs.filter((run) => x.value(run) !== undefined && y.value(run) !== undefined);
  const xs = shown.map((run) => x.value(run));
  const numeric = xs.every((value) => typeof value === "number");
  const layout = themed({
    ...structuredClone(PLOT_LAYOUT), height: 320, showlegend: false,
    xaxis: { ...structuredClone(PLOT_LAYOUT.xaxis), title: { text: escapeHTML(x.label) }, type: numeric ? "linear" : "category" },
    yaxis: { ...structuredClone(PLOT_LAYOUT.yaxis), title: { text: escapeHTML(y.label) } },
  });
  // plotly reads hover text as HTML: every name and value is escaped.
  const text = shown.map((run, i) => `${escapeHTML(run.name)}<br>${escapeHTML(x.label)}: ${escapeHTML(shownValue(xs[i]))}<br>${escapeHTML(y.label)}: ${escapeHTML(formatNumber(y.value(run)))}`);
  await Plotly.react(plot, [{
    type: "scatter", mode: "markers", x: numeric ? xs : xs.map(shownValue), y: shown.map((run) => y.value(run)),
    text, hovertemplate: "%{text}<extra></extra>", customdata: shown.map((run) => run.id),
    marker: { size: 9, opacity: 0.8 },
  }], layout, PLOT_CONFIG);
  if (!plot.dataset.clickable) {
    plot.on("plotly_click", (event) => { const id = event.points?.[0]?.customdata; if (id) location.hash = runPath(id); });
    plot.dataset.clickable = "true";
  }
  plot.dataset.points = String(shown.length);
  plot.setAttribute("aria-label", `${y.label} against ${x.label}: ${shown.length} runs`);
  return shown.length;
}

const shownValue = (value) => (typeof value === "number" ? formatNumber(value) : typeof value === "object" ? JSON.stringify(value) : String(value));
