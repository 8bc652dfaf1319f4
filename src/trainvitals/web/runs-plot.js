// The runs as points (TensorBoard's hyperparameter scatter, W&B's sweep scatter): one point a
// run, across every page of the list's view, x a config value or a series' statistic, y a
// series' statistic; a point opens its run.

import { listRuns } from "./api.js";
import { escapeHTML, formatNumber, plotText, runPath, summaryText } from "./format.js";
import { PLOT_CONFIG, PLOT_LAYOUT, plotlyReady, themed } from "./plot.js";
import { configKeys, metricColumns, requestOf } from "./runs-view.js";

// Runs plotted at most (the list's view, newest first unless it is sorted otherwise): under
// SQLite's oldest limit of 999 parameters a statement, which the list's lookups by run id use.
export const PLOT_RUNS = 900;
// How often, at most, an open plot of the runs is read again while they stream (ms).
const PLOT_REFRESH = 15000;

// The panel the runs page puts above its list; RunsPlotPanel wires it.
export const RUNS_PLOT_PANEL = `
  <details class="panel runs-plot" id="runs-plot"><summary>Plot the runs <span class="muted">a point a run, every page</span></summary>
    <div class="filters plot-axes"><label>x <select name="px"></select></label>
      <label><input type="checkbox" name="logx"> log</label>
      <label>y <select name="py"></select></label>
      <label><input type="checkbox" name="logy"> log</label>
      <span class="muted" id="runs-plot-note" role="status"></span></div>
    <div class="plot" id="runs-plot-area"></div>
  </details>`;

// The plot of the runs, while its panel is open: its axes are the list's columns (config
// values and metric columns for x, metric columns for y), its runs every page of the view,
// read again when the view or an axis changes, and at most every PLOT_REFRESH ms while the
// runs stream. page: the runs page, whose state keeps the axes (px, py, plog), whose view
// shown it plots, and whose keepInAddress() puts them in the address.
export class RunsPlotPanel {
  constructor(panel, page) {
    Object.assign(this, { panel, page });
    this.area = panel.querySelector("#runs-plot-area");
    this.note = panel.querySelector("#runs-plot-note");
    [this.xSelect, this.ySelect] = ["px", "py"].map((name) => panel.querySelector(`[name=${name}]`));
    [this.logX, this.logY] = ["logx", "logy"].map((name) => panel.querySelector(`[name=${name}]`));
    panel.open = Boolean(page.state.py);
    this.logX.checked = page.state.plog.includes("x");
    this.logY.checked = page.state.plog.includes("y");
    this.plotted = { key: null, at: 0 }; // the last plot's request and axes, and when
    this.plotting = false; // a plot on its way (another is asked for at its end when due)
    this.gone = false; // the page was left: nothing more is drawn
    panel.addEventListener("toggle", () => {
      if (panel.open) this.refresh();
      else { Object.assign(page.state, { px: "", py: "", plog: "" }); page.keepInAddress(); }
    });
    for (const control of [this.xSelect, this.ySelect, this.logX, this.logY]) {
      control.addEventListener("change", () => {
        this.axesChosen(); // before draw() fills the lists from the state
        this.refresh();
      });
    }
  }

  // The plot drawn again when due, a failure said in its note.
  refresh() {
    this.draw().catch((error) => { this.note.textContent = `Could not plot the runs: ${error.message}`; });
  }

  // The axes the controls show, into the view's state.
  axesChosen() {
    Object.assign(this.page.state, {
      px: this.xSelect.value, py: this.ySelect.value, plog: `${this.logX.checked ? "x" : ""}${this.logY.checked ? "y" : ""}`,
    });
  }

  // What a plot of the view shown reads and draws: the same key, the same plot.
  key() {
    const { state, shown } = this.page;
    return JSON.stringify([requestOf(shown, PLOT_RUNS, 0), state.px, state.py, state.plog]);
  }

  async draw() {
    const { panel, page, area, note, xSelect, ySelect } = this;
    if (!panel.open || this.gone) return;
    const metrics = metricColumns(page.shown).map(({ sort }) => sort);
    fillAxis(xSelect, [...configKeys(page.shown).map((key) => `config:${key}`), ...metrics], page.state.px);
    fillAxis(ySelect, metrics, page.state.py);
    if (!metrics.length) {
      note.textContent = "Add metric columns (loss, min:val_loss) to plot the runs by them.";
      area.hidden = true;
      return;
    }
    this.axesChosen();
    page.keepInAddress();
    const key = this.key();
    if (this.plotting || (key === this.plotted.key && Date.now() - this.plotted.at < PLOT_REFRESH)) return;
    this.plotting = true;
    try {
      const listed = await listRuns(requestOf(page.shown, PLOT_RUNS, 0));
      if (this.gone || !panel.open || this.key() !== key) return; // another view: asked for below
      this.plotted = { key, at: Date.now() };
      const log = { x: this.logX.checked, y: this.logY.checked };
      const { drawn, diverged } = await drawRunsPlot(area, listed.runs, plotAxis(xSelect.value), plotAxis(ySelect.value), log);
      if (this.gone) return;
      area.hidden = false;
      const cut = listed.total > PLOT_RUNS ? ` (the first ${PLOT_RUNS})` : "";
      const crossed = diverged ? `, ${diverged} diverged (NaN or Inf: a red cross at the top)` : "";
      note.textContent = `${drawn} of ${listed.total} runs${cut}${crossed}${drawn < listed.runs.length ? "; the others lack a value" : ""}`;
    } finally {
      this.plotting = false;
      // The view or an axis changed while it was on its way (or failed): that one now.
      if (!this.gone && this.key() !== key) this.refresh();
    }
  }

  destroy() {
    this.gone = true;
    window.Plotly?.purge(this.area);
  }
}

// An axis' choices, keys as their labels, the one chosen selected (else the first).
function fillAxis(select, keys, chosen) {
  const html = keys.map((key) => `<option value="${escapeHTML(key)}">${escapeHTML(plotAxis(key).label)}</option>`).join("");
  if (select.drawn !== html) { select.innerHTML = html; select.drawn = html; } // an open list stays
  if (select.value !== chosen) select.value = keys.includes(chosen) ? chosen : (keys[0] ?? "");
}

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
