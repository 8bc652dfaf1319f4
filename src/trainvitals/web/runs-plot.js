// The runs as points (TensorBoard's hyperparameter scatter, W&B's sweep scatter): one point a
// run, across every page of the list's view, x a config value or a series' statistic, y a
// series' statistic; a point opens its run.

import { PLOT_CONFIG, PLOT_LAYOUT, plotlyReady, themed } from "./plot.js";
import { formatNumber, plotText, runPath, summaryText } from "./format.js";

// Runs plotted at most (the list's view, newest first unless it is sorted otherwise): under
// SQLite's oldest limit of 999 parameters a statement, which the list's lookups by run id use.
export const PLOT_RUNS = 900;

// An axis from its key: "config:lr" (a config value), or a metric column's sort key
// ("last:loss", "min:val_loss"); its label; and a run's value on it (undefined: none).
export function plotAxis(key) {
  const at = key.indexOf(":");
  const kind = key.slice(0, at), name = key.slice(at + 1);
  if (kind === "config") {
    return { key, label: name, value: (run) => (run.config && Object.hasOwn(run.config, name) ? run.config[name] : undefined) };
  }
  return {
    key,
    label: kind === "last" ? name : `${name} (${kind})`,
    value: (run) => {
      const summary = run.metrics?.[name];
      return summary && summary[kind] != null ? summary[kind] : undefined;
    },
    // "NaN", "+Inf" or "−Inf" for a run whose last value is not finite (it diverged).
    nonfinite: (run) => {
      const summary = run.metrics?.[name];
      return kind === "last" && summary?.nonfinite ? summaryText(summary, "last") : undefined;
    },
  };
}

// Draws the runs on `plot` (a div), each axis on a log scale when its `log` says so (and its
// values are numbers); a run whose last y is NaN or ±Inf (it diverged) is a red cross at the
// top. Returns how many runs are drawn, and how many of them diverged.
export async function drawRunsPlot(plot, runs, x, y, log = { x: false, y: false }) {
  const Plotly = await plotlyReady();
  const shown = runs.filter((run) => x.value(run) !== undefined && y.value(run) !== undefined);
  const diverged = runs.filter((run) => x.value(run) !== undefined && y.nonfinite?.(run));
  const xs = shown.map((run) => x.value(run));
  const numeric = [...xs, ...diverged.map((run) => x.value(run))].every((value) => typeof value === "number");
  const ys = shown.map((run) => y.value(run));
  const top = ys.length ? Math.max(...ys) : 1;
  const base = structuredClone(PLOT_LAYOUT);
  const layout = themed({
    ...base, height: 320, showlegend: false,
    // The nearest point, not the first of those at its x: runs of a grid share their x.
    hovermode: "closest",
    // A zoom survives the redraws of a live list, until an axis changes.
    uirevision: `${x.key}|${y.key}|${log.x}|${log.y}`,
    xaxis: {
      ...base.xaxis, title: { text: plotText(x.label) },
      type: numeric ? (log.x ? "log" : "linear") : "category", categoryorder: "category ascending",
    },
    yaxis: { ...base.yaxis, title: { text: plotText(y.label) }, type: log.y ? "log" : "linear" },
  });
  // plotly reads labels and hover text as HTML: every name and value is escaped.
  const text = shown.map((run, i) => `${plotText(run.name)}<br>${plotText(x.label)}: ${plotText(shownValue(xs[i]))}<br>${plotText(y.label)}: ${plotText(formatNumber(y.value(run)))}`);
  const xOf = (values) => (numeric ? values : values.map((value) => plotText(shownValue(value))));
  const bad = getComputedStyle(document.documentElement).getPropertyValue("--bad").trim() || "#c53030";
  const crosses = diverged.map((run) => x.value(run));
  await Plotly.react(plot, [{
    type: "scatter", mode: "markers", x: xOf(xs), y: ys, text, hovertemplate: "%{text}<extra></extra>",
    customdata: shown.map((run) => run.id), marker: { size: 9, opacity: 0.75 },
  }, {
    type: "scatter", mode: "markers", x: xOf(crosses), y: crosses.map(() => top),
    text: diverged.map((run, i) => `${plotText(run.name)}<br>${plotText(x.label)}: ${plotText(shownValue(crosses[i]))}<br>${plotText(y.label)}: ${plotText(y.nonfinite(run))} (diverged)`),
    hovertemplate: "%{text}<extra></extra>", customdata: diverged.map((run) => run.id),
    marker: { size: 11, symbol: "x", color: bad }, cliponaxis: false,
  }], layout, PLOT_CONFIG);
  if (!plot.dataset.clickable) {
    plot.on("plotly_click", (event) => { const id = event.points?.[0]?.customdata; if (id) location.hash = runPath(id); });
    plot.dataset.clickable = "true";
  }
  plot.dataset.points = String(shown.length + diverged.length);
  plot.dataset.diverged = String(diverged.length);
  const crossed = diverged.length ? `, ${diverged.length} diverged` : "";
  plot.setAttribute("aria-label", `${y.label} against ${x.label}: ${shown.length + diverged.length} runs${crossed}`);
  return { drawn: shown.length + diverged.length, diverged: diverged.length };
}

// A value as the plot shows it (categories keep every digit: two settings never merge).
const shownValue = (value) => (typeof value === "object" ? JSON.stringify(value) : String(value));
