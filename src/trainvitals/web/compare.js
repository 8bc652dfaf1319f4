// Runs side by side: #/compare?runs=ID,ID,... (a link that can be shared). Every chart draws
// one trace per run and series, each run in one colour on every chart, live as the runs
// stream, and a table of their configs marks the keys whose values differ. The charts take
// the run page's controls (smoothing, x-axis, clipping) and zoom together as its charts do;
// in time since start, each run counts from its own start.

import { download, exportRunsPath, getRun, getSeries } from "./api.js";
import { chartOf } from "./chart-kinds.js";
import { CHART_CONTROLS, ChartSet, replaceQuery } from "./chart-set.js";
import { Chart } from "./charts.js";
import { DELETED_BADGE, escapeHTML, healthBadge, runPath, setTitle, statusBadge, summaryOrder, summaryText, summaryValue } from "./format.js";
import { withSummary } from "./live.js";
import { plotlyReady } from "./plot.js";
import { EPOCH_PREFIX, VAL_PREFIX } from "./series.js";
import { syncCells, syncRows } from "./rows.js";

// Colour-blind-friendly (Okabe–Ito), then more: a run's colour is its place in the address.
export const RUN_COLOURS = ["#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#7f3c8d", "#3b3b3b", "#b8860b", "#1b9e77"];
const DASHES = ["solid", "dashdot", "longdash", "dot", "dash"];
const ROLES = new RegExp(`^(${VAL_PREFIX}|${EPOCH_PREFIX})`);
export const MAX_COMPARED = 10;
const POINTS = 1000; // per series and run: enough for an overview of several runs
const SUMMARY_REFRESH = 5000; // ms: the summary table read again at most this often while runs step

export function comparePath(runIds) {
  return `#/compare?runs=${runIds.map(encodeURIComponent).join(",")}`;
}

const shown = (value) => (value === undefined ? "—" : typeof value === "object" ? JSON.stringify(value) : String(value));

export async function renderCompare(root, live, params) {
  setTitle("Compare");
  const ids = [...new Set((params.get("runs") ?? "").split(",").map((id) => id.trim()).filter(Boolean))].slice(0, MAX_COMPARED);
  if (!ids.length) {
    root.innerHTML = `<div class="page-head"><h1>Compare</h1></div>
      <p class="muted">Select runs in the <a href="#/">runs list</a> to compare them.</p>`;
    return () => {};
  }
  root.innerHTML = `<p class="muted">Loading ${escapeHTML(ids.length)} runs…</p>`;
  // Followed live as a run's page is: from before the history loads, so no point falls between.
  let view = null;
  const following = live.follow(ids, {
    onMessage: (message) => view.onLive(message),
    onReconnect: () => view?.onReconnect().catch((error) => console.warn("trainvitals: could not reload the compared runs:", error)),
  });
  try {
    const [runs] = await Promise.all([Promise.all(ids.map(readCompared)), plotlyReady()]);
    view = new CompareView(root, runs, params);
    await view.reload();
  } catch (error) {
    following.stop();
    view?.destroy();
    throw error;
  }
  following.start();
  return () => { following.stop(); view.destroy(); };
}

// A run the link names, or, where there is no such run (deleted since the link was made, or
// never there), a stand-in that keeps its place (so the others keep their colours) and says so.
async function readCompared(id) {
  try {
    return await getRun(id);
  } catch (error) {
    if (error.status !== 404) throw error;
    return { id, name: id, project: "", config: {}, metrics: {}, deleted: true, missing: true };
  }
}

// A compared run that is gone: deleted while the view is open, or not found when it opened.
const goneBadge = (run) => (run.missing ? NOT_FOUND_BADGE : DELETED_BADGE);
const NOT_FOUND_BADGE = '<span class="badge deleted-badge" data-deleted data-missing>not found</span>';

// The compared runs' charts: one Chart per chart id (as a run's page has), whose series are
// the traces "<run id>\n<series>", each drawn in its run's colour and its series' dash.
class CompareView {
  constructor(root, runs, params) {
    this.root = root;
    this.runs = runs;
    this.set = new ChartSet({ seriesOf: (key) => this.seriesOf(key), params });
    this.dashes = new Map(); // chart id -> its series names, in the order their dashes go
    this.traces = new Map(); // trace key -> { r: the run's place, name: the series }
    this.reloading = new Set();
    this.stepped = new Set(); // the runs that stepped since their summaries were read
    this.summaryDue = null;
    this.summaryRows = new Map(); // series name -> its row, kept while it is drawn
    this.destroyed = false;
    setTitle(`Compare ${runs.length} runs`);
    root.innerHTML = `
      <div class="page-head"><h1>Compare ${escapeHTML(runs.length)} runs</h1></div>
      <ul class="compared-runs"></ul>
      <details class="panel" open><summary>Configuration <span class="muted" id="config-differ"></span></summary>
        <label class="config-only"><input type="checkbox" name="only-differing"> Only the keys that differ</label>
        <div class="table-scroll"><table class="kv config-compare" id="config-compare"></table></div></details>
      <details class="panel" open><summary>Summary <span class="muted">each series' last value; its least and greatest on hover</span></summary>
        <div class="table-scroll"><table class="kv config-compare summary-compare" id="summary-compare">
          <thead><tr></tr></thead><tbody></tbody></table></div></details>
      ${CHART_CONTROLS}
      <div class="charts" id="charts"></div>`;
    this.chartsRoot = root.querySelector("#charts");
    this.set.mount(root.querySelector(".chart-controls"), this.chartsRoot);
    this.drawLegend();
    // Only the keys that differ, when the switch (kept in the address: config=differing) says.
    const only = root.querySelector("[name=only-differing]");
    only.checked = params.get("config") === "differing";
    const draw = () => drawConfig(root.querySelector("#config-compare"), root.querySelector("#config-differ"), runs, only.checked);
    this.drawConfig = draw;
    only.addEventListener("change", () => {
      replaceQuery((query) => (only.checked ? query.set("config", "differing") : query.delete("config")));
      draw();
    });
    draw();
    this.drawSummaries();
  }

  drawLegend() {
    this.root.querySelector(".compared-runs").innerHTML = this.runs.map((run, i) => `<li data-compared-run="${escapeHTML(run.id)}">
      <span class="swatch" style="background:${RUN_COLOURS[i % RUN_COLOURS.length]}"></span>
      <a href="${escapeHTML(runPath(run.id))}">${escapeHTML(run.name)}</a>
      ${run.deleted ? goneBadge(run) : statusBadge(run.status) + healthBadge(run.health)} <span class="muted">${escapeHTML(run.project)}</span></li>`).join("");
  }

  // Series as rows (every compared run's), runs as columns: each series' last value, with its
  // least and greatest and the step of the last in the cell's title. Updated in place, so that
  // a value selected to copy stays selected while the runs step.
  drawSummaries() {
    this.drawSummaryHead();
    const table = this.root.querySelector("#summary-compare");
    const names = summaryOrder(new Set(this.runs.flatMap((run) => Object.keys(run.metrics ?? {}))));
    const rows = names.map((name) => {
      let row = this.summaryRows.get(name);
      if (!row) {
        row = document.createElement("tr");
        row.dataset.summary = name;
        this.summaryRows.set(name, row);
      }
      syncCells(row, [`<th>${escapeHTML(name)}</th>`, ...this.runs.map((run) => summaryCell(run.metrics?.[name], name))]);
      return row;
    });
    for (const name of this.summaryRows.keys()) if (!names.includes(name)) this.summaryRows.delete(name);
    const body = table.tBodies[0];
    if (rows.length) syncRows(body, rows);
    else body.innerHTML = `<tr><td class="muted" colspan="${this.runs.length + 1}">No points yet.</td></tr>`;
  }

  // The table's column headings: a run renamed or deleted is so in its heading.
  drawSummaryHead() {
    syncCells(this.root.querySelector("#summary-compare").tHead.rows[0], runHeadings("series", this.runs));
  }

  // Every series of every run, downsampled, in the runs' order (the traces' order). A run
  // deleted meanwhile keeps the traces drawn and is marked in the legend.
  async reload() {
    const answers = await Promise.all(this.runs.map((run, r) => (run.deleted ? null : this.unlessGone(r, getSeries(run.id, [], POINTS)))));
    if (this.destroyed) return;
    answers.forEach((answer, r) => {
      for (const [name, data] of Object.entries(answer?.series ?? {})) this.add(r, name, data);
    });
    if (!this.set.charts.size) this.chartsRoot.innerHTML = `<p class="muted">No points yet.</p>`;
  }

  // A read of a compared run's; its 404 (the run deleted) marks the run and answers null.
  async unlessGone(r, read) {
    try {
      return await read;
    } catch (error) {
      if (error.status !== 404) throw error;
      this.markDeleted(r);
      return null;
    }
  }

  markDeleted(r) {
    if (this.destroyed || this.runs[r].deleted) return;
    this.runs[r] = { ...this.runs[r], deleted: true };
    this.stepped.delete(this.runs[r].id);
    this.drawLegend();
    this.drawSummaries();
  }

  // The series' summaries of the runs that stepped (every run's, with its state, after a
  // reconnect), read again and drawn in place.
  async refreshSummaries(whole = false) {
    const indices = [...this.runs.keys()].filter((r) => !this.runs[r].deleted && (whole || this.stepped.has(this.runs[r].id)));
    this.stepped.clear();
    const answers = await Promise.all(indices.map((r) => this.unlessGone(r, getRun(this.runs[r].id))));
    if (this.destroyed) return;
    answers.forEach((run, i) => {
      const r = indices[i];
      if (run) this.runs[r] = whole ? run : { ...this.runs[r], metrics: run.metrics };
    });
    this.drawLegend();
    this.drawSummaries();
  }

  summariesSoon() {
    if (this.summaryDue || document.hidden) return;
    this.summaryDue = setTimeout(() => {
      this.summaryDue = null;
      this.refreshSummaries().catch((error) => console.warn("trainvitals: could not read the runs' summaries:", error));
    }, SUMMARY_REFRESH);
  }

  // The live stream came back: points and states may have been missed meanwhile.
  async onReconnect() {
    await Promise.all([this.reload(), this.refreshSummaries(true)]);
  }

  // One run's series, whole (live: only its new points).
  add(r, name, data, live = false) {
    if (this.set.takes(this.runs[r].id, name, data, live)) return;
    const spec = chartOf(name);
    if (!spec) return;
    const key = `${this.runs[r].id}\n${name}`;
    this.traces.set(key, { r, name });
    const names = this.dashes.get(spec.id) ?? [];
    if (!names.includes(name)) this.dashes.set(spec.id, [...names, name]);
    const chart = this.chartFor(spec);
    if (live) chart.extend(key, data); else chart.setSeries(key, data);
  }

  chartFor(spec) {
    let chart = this.set.charts.get(spec.id);
    if (!chart) {
      const alt = `${spec.title} of ${this.runs.map((run) => run.name).join(", ")}`;
      // A legend under the plot: which run (its colour) and which series (its dash) a line is.
      chart = new Chart(this.chartsRoot, { ...spec, alt, legend: "below" }, {
        ...this.set.chartOptions,
        styleOf: (key) => this.styleOf(key),
        pickLabel: (key) => this.pickLabel(key),
        onTooLong: (key) => this.reloadTrace(key),
        onDownload: (format, source) => this.download(format, source),
      });
      this.set.add(chart);
    }
    return chart;
  }

  // Every point of a chart's series, of every compared run, in one file with each row's run
  // (the zoomed steps only, when zoomed; on a time axis, from the first step any run has in
  // view to the last, since each run's steps meet the view apart).
  download(format, chart) {
    const keys = [...chart.series.keys()];
    const names = [...new Set(keys.map((key) => this.traces.get(key).name))];
    let range = null;
    if (chart.xrange) {
      const ranges = this.runs
        .map((_, r) => chart.stepRange(keys.filter((key) => this.traces.get(key).r === r)))
        .filter(Boolean);
      range = ranges.length
        ? { min: Math.min(...ranges.map((s) => s.min)), max: Math.max(...ranges.map((s) => s.max)) }
        : { min: 1, max: 0 }; // nothing in view: a file of the header alone
    }
    // A run gone from the server has no points to export: the file holds the others'.
    const ids = this.runs.filter((run) => !run.deleted).map((run) => run.id);
    if (!ids.length) return;
    download(exportRunsPath(ids, names, format, range, `compare-${chart.id}`));
  }

  // A trace's run and series, and when that run started: time since start is each run's own.
  seriesOf(key) {
    const { r, name } = this.traces.get(key);
    return { run: this.runs[r].id, name, start: this.runs[r].started_at };
  }

  // Smoothed, the raw trace behind is in its run's colour too. A layer's gradient norm is
  // drawn once chosen in the list under its chart: each run's global norm at first.
  styleOf(key) {
    const { r, name } = this.traces.get(key);
    const run = this.runs[r];
    const spec = chartOf(name);
    // Validation dashed and epoch means dotted, as on a run's page; other series in turn.
    const dash = name.startsWith(VAL_PREFIX) ? "dash" : name.startsWith(EPOCH_PREFIX) ? "dot"
      : DASHES[this.dashes.get(spec.id).filter((other) => !ROLES.test(other)).indexOf(name) % DASHES.length];
    return {
      name: `${run.name} · ${name}`, mode: "lines", legendgroup: run.id,
      line: { width: 1.4, color: RUN_COLOURS[r % RUN_COLOURS.length], dash },
      ...(spec.pick?.(name) != null ? { visible: "legendonly" } : {}),
    };
  }

  pickLabel(key) {
    const { r, name } = this.traces.get(key);
    return `${this.runs[r].name} · ${chartOf(name).pick(name)}`;
  }

  // A trace grew long while streaming: swapped for a downsampled copy.
  async reloadTrace(key) {
    if (this.reloading.has(key)) return;
    this.reloading.add(key);
    const { r, name } = this.traces.get(key);
    try {
      const answer = await this.unlessGone(r, getSeries(this.runs[r].id, [name], POINTS));
      if (answer?.series[name] && !this.destroyed) this.add(r, name, answer.series[name]);
    } finally {
      this.reloading.delete(key);
    }
  }

  // A run the link named before it reached the server (its agent's hello came after the view
  // opened): at its first summary it is read whole and drawn in its place; its live points
  // that come meanwhile are held, and added after its history, as the view's own load does.
  async found(r) {
    const held = [];
    const standIn = this.runs[r];
    this.runs[r] = { ...standIn, held };
    let read;
    try {
      read = await Promise.all([getRun(standIn.id), getSeries(standIn.id, [], POINTS)]);
    } catch (error) {
      this.runs[r] = standIn; // still not found (gone again, or the server away): as it was
      if (error.status !== 404) throw error;
      return;
    }
    if (this.destroyed) return;
    const [run, answer] = read;
    this.runs[r] = run;
    for (const [name, data] of Object.entries(answer.series)) this.add(r, name, data);
    for (const message of held) this.onLive(message);
    this.drawLegend();
    this.drawSummaries();
    this.drawConfig();
  }

  // A compared run's new points, or its summary (status, health) changed.
  onLive(message) {
    const r = this.runs.findIndex((run) => run.id === message.run_id);
    if (r >= 0 && this.runs[r].held) {
      this.runs[r].held.push(message);
      return;
    }
    if (message.type === "points" && r >= 0 && !this.runs[r].missing) {
      for (const [name, data] of Object.entries(message.series)) this.add(r, name, data, true);
    } else if (message.type === "deleted" && r >= 0) {
      this.markDeleted(r);
    } else if (message.type === "runs") {
      let changed = false;
      for (const summary of message.runs) {
        const at = this.runs.findIndex((run) => run.id === summary.id);
        if (at >= 0 && this.runs[at].missing) {
          if (!this.runs[at].held) this.found(at).catch((error) => console.warn("trainvitals: could not read a compared run:", error));
          continue;
        }
        if (at < 0 || this.runs[at].deleted) continue;
        if (summary.last_step != null && summary.last_step !== this.runs[at].last_step) this.stepped.add(summary.id);
        this.runs[at] = withSummary(this.runs[at], summary);
        changed = true;
      }
      if (!changed) return;
      this.drawLegend();
      this.drawSummaryHead();
      if (this.stepped.size) this.summariesSoon();
    }
  }

  destroy() {
    this.destroyed = true;
    clearTimeout(this.summaryDue);
    this.set.destroy();
  }
}

// The runs' columns' headings, each a cell's HTML: each run's swatch and name, and a mark on a
// run deleted.
const runHeadings = (first, runs) => [`<th>${escapeHTML(first)}</th>`, ...runs.map((run, i) =>
  `<th><span class="swatch" style="background:${RUN_COLOURS[i % RUN_COLOURS.length]}"></span>${escapeHTML(run.name)}${run.deleted ? ` ${goneBadge(run)}` : ""}</th>`)];

// A run's series summary as a cell: its last value; its least, greatest and the last's step in
// the title.
function summaryCell(summary, name) {
  if (!summary) return `<td class="num muted">—</td>`;
  const title = `min ${summaryText(summary, "min", name)} · max ${summaryText(summary, "max", name)} · last at step ${summary.step}`;
  return `<td class="num" title="${escapeHTML(title)}">${summaryValue(summary, "last", name)}</td>`;
}

// Keys as rows, runs as columns; a row whose values are not all equal is marked (and the
// others left out when onlyDiffering); how many differ in count.
function drawConfig(table, count, runs, onlyDiffering) {
  const keys = [...new Set(runs.flatMap((run) => Object.keys(run.config ?? {})))].sort();
  const valuesOf = new Map(keys.map((key) => [key, runs.map((run) => shown(run.config?.[key]))]));
  // A run not found has no config to differ by: its "—" marks no key.
  const differs = (values) => new Set(values.filter((value, r) => !runs[r].missing)).size > 1;
  const differing = new Set(keys.filter((key) => differs(valuesOf.get(key))));
  count.textContent = `(${differing.size} of ${keys.length} ${keys.length === 1 ? "key differs" : "keys differ"}, marked)`;
  const head = `<tr>${runHeadings("key", runs).join("")}</tr>`;
  const rows = (onlyDiffering ? [...differing] : keys).map((key) => {
    const values = valuesOf.get(key);
    const differs = differing.has(key);
    return `<tr class="${differs ? "differs" : ""}" data-config-key="${escapeHTML(key)}" data-differs="${differs}">
      <th>${escapeHTML(key)}${differs ? ' <span class="visually-hidden">(differs)</span>' : ""}</th>
      ${values.map((value) => `<td>${escapeHTML(value)}</td>`).join("")}</tr>`;
  });
  const none = keys.length ? "no key differs" : "no config";
  table.innerHTML = head + (rows.join("") || `<tr><td class="muted">${none}</td></tr>`);
}
