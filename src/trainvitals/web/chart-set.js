// The charts of a page as one set: the controls above them (smoothing, x-axis, outlier
// clipping, zoom out) apply to every chart, and a zoom on one chart zooms them all and reads
// the steps in view again at full detail, run by run. The run page and the compare view each
// hold one.

import { getSeries } from "./api.js";
import { filterOut } from "./chart-interaction.js";
import { chartOrder } from "./chart-kinds.js";
import { DEFAULT_VIEW } from "./charts.js";
import { epochAxis } from "./plotmath.js";
import { EPOCH } from "./series.js";

// The form a page puts above its charts; ChartSet.mount() wires it.
export const CHART_CONTROLS = `
  <form class="chart-controls" aria-label="How the charts draw">
    <label>Smoothing <input type="range" name="smoothing" min="0" max="0.99" step="0.01" value="0">
      <output name="smoothing-value">0</output></label>
    <label>X axis <select name="xaxis"><option value="step">step</option><option value="epoch">epoch</option>
      <option value="relative">time since start</option><option value="wall">wall-clock time</option></select></label>
    <label><input type="checkbox" name="clip" checked> Leave outliers out of the y-range</label>
    <label>Charts <input type="search" name="filter" placeholder="filter: loss|val_" maxlength="200"
      autocomplete="off" spellcheck="false" title="the charts whose name, or a series' name, holds one of these |-separated words (any case)"></label>
    <output name="filter-count"></output>
    <button type="button" name="reset-zoom" hidden>Zoom out</button>
  </form>`;

const SMOOTHING_KEY = "trainvitals.smoothing"; // the weight, remembered across pages and runs
const DETAIL_POINTS = 2000; // per series and run, read again for a zoom
const X_AXES = new Set(["step", "epoch", "relative", "wall"]);

const MAX_SCALED = 100; // charts whose log switch an address keeps
const MAX_ID_LENGTH = 300;
const MAX_FILTER = 200;

// Whether any of names holds one of filter's |-separated words, in any case (TensorBoard's
// "loss|acc" without its regular expressions: a link's filter cannot hang the page on a
// pathological pattern). An empty filter, or one of empty words only, holds every chart.
function chartFilter(filter) {
  const words = filter.toLowerCase().split("|").map((word) => word.trim()).filter(Boolean);
  if (!words.length) return () => true;
  return (names) => names.some((name) => words.some((word) => name.toLowerCase().includes(word)));
}

// The chart ids of an address's log= or lin= list (each encoded, comma-separated); what does
// not decode, or is too long, is left out. An id that names no chart of the page does nothing.
function chartIds(text) {
  return (text ?? "").split(",").slice(0, MAX_SCALED).flatMap((part) => {
    try {
      const id = decodeURIComponent(part);
      return id && id.length <= MAX_ID_LENGTH ? [id] : [];
    } catch {
      return [];
    }
  });
}

// The charts' view as a page's address gives it (?x=relative&smooth=0.6&clip=0&log=loss
// &lin=step_time&filter=loss|val_), so that a link shows them drawn as they were; what it leaves out is the
// default (the smoothing: the weight last chosen; a chart's y-axis: its own, log or linear).
// Anything else in those keys is ignored. scales: chart id -> log (true) or linear (false).
export function viewOf(params) {
  const view = { ...DEFAULT_VIEW, smoothing: Number(localStorage.getItem(SMOOTHING_KEY)) || 0 };
  if (X_AXES.has(params.get("x"))) view.xaxis = params.get("x");
  const smoothing = Number(params.get("smooth") ?? NaN);
  if (Number.isFinite(smoothing)) view.smoothing = Math.min(0.99, Math.max(0, smoothing));
  if (params.get("clip") === "0") view.clip = false;
  view.filter = (params.get("filter") ?? "").slice(0, MAX_FILTER);
  view.scales = new Map([
    ...chartIds(params.get("lin")).map((id) => [id, false]),
    ...chartIds(params.get("log")).map((id) => [id, true]),
  ]);
  return view;
}

function setList(params, key, ids) {
  if (ids.length) params.set(key, ids.map(encodeURIComponent).join(","));
  else params.delete(key);
}

// The page's address with its query changed by update(params), the rest as it was (no new
// history entry: Back still leaves the page).
export function replaceQuery(update) {
  const [path, query = ""] = location.hash.split("?");
  const params = new URLSearchParams(query);
  update(params);
  const kept = params.toString().replaceAll("%2C", ","); // run ids stay readable
  history.replaceState(history.state, "", `${path}${kept ? `?${kept}` : ""}`);
}

// The view into the page's address.
function remember(view) {
  replaceQuery((params) => rememberIn(params, view));
}

function rememberIn(params, view) {
  if (view.xaxis === DEFAULT_VIEW.xaxis) params.delete("x"); else params.set("x", view.xaxis);
  if (view.smoothing) params.set("smooth", view.smoothing.toFixed(2)); else params.delete("smooth");
  if (view.clip) params.delete("clip"); else params.set("clip", "0");
  if (view.filter) params.set("filter", view.filter); else params.delete("filter");
  const scaled = [...view.scales];
  setList(params, "log", scaled.filter(([, log]) => log).map(([id]) => id));
  setList(params, "lin", scaled.filter(([, log]) => !log).map(([id]) => id));
}

// seriesOf(key): the run and series a chart's series key stands for, and when that run
// started, { run, name, start }: the page's charts are given it (Chart's option), and a zoom
// reads each run's series again. cardsAfter(chart): cards the page shows right after a
// chart's (the run page's heatmap). Charts are made by the page with chartOptions and add()ed.
// params: the page address's query (viewOf).
export class ChartSet {
  constructor({ seriesOf, cardsAfter = () => [], params = new URLSearchParams() }) {
    Object.assign(this, { seriesOf, cardsAfter });
    this.charts = new Map(); // chart id -> its chart
    this.epochs = new Map(); // run id -> its "epoch" series ({ step, value }), the epoch axis' marks
    this.axes = new Map(); // run id -> its epoch axis (plotmath.js epochAxis), made when asked
    this.view = viewOf(params);
    this.zoom = null; // the charts' x-range, all zoomed together; null: everything
    this.zooms = 0;
    this.filtering = false;
    this.form = null;
    this.container = null;
  }

  // The page's controls (CHART_CONTROLS) and the element its charts' cards go in.
  mount(form, container) {
    Object.assign(this, { form, container });
    form.elements.smoothing.value = String(this.view.smoothing);
    form.elements["smoothing-value"].value = this.view.smoothing.toFixed(2);
    form.elements.xaxis.value = this.view.xaxis;
    form.elements.clip.checked = this.view.clip;
    form.elements.filter.value = this.view.filter;
    form.addEventListener("submit", (event) => event.preventDefault()); // Enter in the filter
    form.addEventListener("input", (event) => {
      if (event.target === form.elements.filter) {
        this.view = { ...this.view, filter: form.elements.filter.value.slice(0, MAX_FILTER) };
        remember(this.view);
        this.applyFilter();
        return;
      }
      const xaxis = form.elements.xaxis.value;
      if (xaxis !== this.view.xaxis) this.zoomTo(null); // a zoom in steps is no zoom in time
      this.view = { ...this.view, smoothing: Number(form.elements.smoothing.value), xaxis, clip: form.elements.clip.checked };
      form.elements["smoothing-value"].value = this.view.smoothing.toFixed(2);
      localStorage.setItem(SMOOTHING_KEY, String(this.view.smoothing));
      remember(this.view);
      for (const chart of this.charts.values()) chart.setView(this.view);
    });
    form.elements["reset-zoom"].addEventListener("click", () => this.zoomTo(null));
  }

  // What a chart of the set is made with (beside the page's own options).
  get chartOptions() {
    return {
      view: this.view, seriesOf: this.seriesOf, epochsOf: (run) => this.epochsOf(run),
      onZoom: (xrange, source) => this.zoomTo(xrange, source), onLog: (chart) => this.scaleChanged(chart),
      onSeries: () => this.filterSoon(), // a series' name can bring its chart into the filter
    };
  }

  // A series of a run that no chart draws but the x-axis reads: the epoch each epoch's last step
  // ends (live: its new points only). True when it was one.
  takes(run, name, data, live = false) {
    if (name !== EPOCH) return false;
    const held = this.epochs.get(run);
    const last = held?.step.at(-1) ?? -Infinity;
    const fresh = data.step.map((step, i) => [step, data.value[i]]).filter(([step]) => !live || !held || step > last);
    const epochs = live && held ? held : { step: [], value: [] };
    for (const [step, value] of fresh) { epochs.step.push(step); epochs.value.push(value); }
    this.epochs.set(run, epochs);
    this.axes.delete(run);
    if (this.view.xaxis === "epoch") for (const chart of this.charts.values()) chart.schedule();
    return true;
  }

  epochsOf(run) {
    if (!this.axes.has(run)) this.axes.set(run, epochAxis(this.epochs.get(run)));
    return this.axes.get(run);
  }

  // A chart's log switch, kept in the address when it differs from the chart's own default.
  scaleChanged(chart) {
    const scales = new Map(this.view.scales);
    if (chart.log === Boolean(chart.spec.log)) scales.delete(chart.id);
    else scales.set(chart.id, chart.log);
    this.view = { ...this.view, scales };
    remember(this.view);
  }

  // A chart the page made: zoomed as the others are, its card put in the charts' order.
  add(chart) {
    if (this.zoom) chart.setXRange(this.zoom);
    this.charts.set(chart.id, chart);
    this.arrange();
    this.filterSoon();
  }

  // The filter applied once the page has given a chart its new series (their names count).
  filterSoon() {
    if (this.filtering) return;
    this.filtering = true;
    queueMicrotask(() => { this.filtering = false; this.applyFilter(); });
  }

  // The charts the filter holds shown, the others hidden (and not redrawn), with their count.
  applyFilter() {
    const holds = chartFilter(this.view.filter);
    let shown = 0;
    for (const chart of this.charts.values()) {
      const names = [chart.id, chart.spec.title, ...[...chart.series.keys()].map((key) => this.seriesOf(key).name)];
      const on = holds(names);
      chart.setShown(on);
      for (const card of this.cardsAfter(chart)) filterOut(card, !on);
      shown += on ? 1 : 0;
    }
    const count = this.form?.elements["filter-count"];
    if (count) count.value = this.view.filter.trim() ? `${shown} of ${this.charts.size} ${this.charts.size === 1 ? "chart" : "charts"}` : "";
  }

  arrange() {
    const ordered = [...this.charts.values()].sort((a, b) => chartOrder(a.spec, b.spec));
    this.container.replaceChildren(...ordered.flatMap((chart) => [chart.card, ...this.cardsAfter(chart)]));
  }

  // A zoom on one chart (source; none: the controls) zooms them all, and reads each run's
  // series again in the steps in view at full detail (in time, each run's own steps).
  async zoomTo(xrange, source = null) {
    const current = ++this.zooms;
    for (const chart of this.charts.values()) if (chart !== source) chart.setXRange(xrange);
    this.form.elements["reset-zoom"].hidden = !xrange;
    this.zoom = xrange;
    delete this.container.dataset.detail;
    if (!xrange) return;
    const charts = [...new Set([source, ...this.charts.values()])].filter(Boolean);
    const reads = await Promise.all([...this.keysByRun()].map(async ([run, keys]) => {
      // The steps in view, from the zoomed chart when it draws this run.
      const steps = charts.map((chart) => chart.stepRange(keys)).find(Boolean);
      if (!steps) return [];
      const names = keys.map((key) => this.seriesOf(key).name);
      let series;
      try {
        ({ series } = await getSeries(run, names, DETAIL_POINTS, steps));
      } catch (error) { // a run deleted meanwhile, a network blip: the others still get theirs
        console.warn(`trainvitals: no detail for run ${run}:`, error);
        return [];
      }
      return keys.flatMap((key, i) => (series[names[i]] ? [[key, { ...steps, points: series[names[i]] }]] : []));
    }));
    if (current !== this.zooms) return; // zoomed again meanwhile
    const detail = Object.fromEntries(reads.flat());
    for (const chart of this.charts.values()) chart.setDetail(detail);
    const ranges = Object.values(detail);
    if (ranges.length) {
      this.container.dataset.detail = `${Math.min(...ranges.map((r) => r.min))}-${Math.max(...ranges.map((r) => r.max))}`;
    }
  }

  // Every series key of the charts, by the run it reads.
  keysByRun() {
    const byRun = new Map();
    for (const chart of this.charts.values()) {
      for (const key of chart.series.keys()) {
        const { run } = this.seriesOf(key);
        if (!byRun.has(run)) byRun.set(run, []);
        byRun.get(run).push(key);
      }
    }
    return byRun;
  }

  destroy() { for (const chart of this.charts.values()) chart.destroy(); }
}
