// One run: its header, how it ended, its alerts, and a live chart per metric with the alerts
// marked at their steps.

import { AlertList, alertItem } from "./alert-items.js";
import { deleteRun, download, editRun, exportPath, getRun, getRunAlerts, getSeries } from "./api.js";
import { setBannerScope } from "./banner.js";
import { alertChartIds, chartOf } from "./chart-kinds.js";
import { CHART_CONTROLS, ChartSet } from "./chart-set.js";
import { Chart } from "./charts.js";
import { escapeHTML, formatAgo, formatDuration, formatTime, healthBadge, setTitle, statusBadge, summaryOrder, summaryValue, tagList } from "./format.js";
import { GradHeatmap, alertLayers } from "./heatmap.js";
import { JobPanel } from "./job.js";
import { ProcessPanel } from "./process.js";
import { withSummary } from "./live.js";
import { plotlyReady } from "./plot.js";
import { syncCells, syncRows } from "./rows.js";
import { kvRows, lastReadings } from "./run-tables.js";
import { GRAD_GLOBAL_NORM, GRAD_NORM_PREFIX, LOSS } from "./series.js";

const LAYOUT = `
  <div class="page-head">
    <h1 id="run-name"></h1><span id="run-status"></span>
  </div>
  <dl class="facts" id="run-facts"></dl>
  <p class="run-notes" id="run-notes" hidden></p>
  <details class="panel run-edit" id="run-edit"><summary>Name, tags, notes</summary>
    <form class="edit-form" autocomplete="off">
      <label>Name <input name="name" required maxlength="200"></label>
      <label>Tags <input name="tags" placeholder="baseline, lr-sweep" maxlength="2200"></label>
      <label class="wide">Notes <textarea name="notes" rows="3" maxlength="10000"></textarea></label>
      <div class="edit-actions">
        <button type="submit">Save</button>
        <button type="button" data-action="archive"></button>
        <button type="button" data-action="delete" class="danger">Delete run…</button>
        <span class="edit-status" role="status"></span>
      </div>
    </form>
  </details>
  <section id="run-ending"></section>
  <section class="run-alerts" aria-labelledby="run-alerts-title">
    <h2 id="run-alerts-title">Alerts <span class="muted" id="run-alert-count"></span></h2>
    <div class="alert-list" id="run-alert-list"><p class="muted">Loading alerts…</p></div>
  </section>
  ${CHART_CONTROLS}
  <div class="charts" id="charts"></div>
  <div id="run-job"></div>
  <div id="run-process"></div>
  <details class="panel" open><summary>Summary <span class="muted">each series' last, least and greatest value</span></summary>
    <div class="table-scroll"><table class="kv summary-table" id="run-summary">
      <thead><tr><th>series</th><th class="num">last</th><th class="num at-step">at step</th><th class="num">min</th><th class="num">max</th></tr></thead>
      <tbody id="run-summary-body"></tbody></table></div></details>
  <details class="panel"><summary>Configuration</summary><table class="kv" id="run-config"></table></details>
  <details class="panel"><summary>Environment</summary><table class="kv" id="run-env"></table></details>`;

const ENDED = new Set(["crashed", "lost"]);
// How often, at most, the run is fetched again for its series' summaries while it steps (ms).
const SUMMARY_REFRESH = 5000;

// The run page, live: load() draws it, onLive(message) follows the websocket, destroy() stops.
export class RunPage {
  // params: the address's query (the charts' view: chart-set.js viewOf).
  constructor(root, live, feed, runId, params = new URLSearchParams()) {
    Object.assign(this, { root, live, feed, runId });
    this.run = null;
    this.job = null;
    this.alertList = null;
    // The page's charts, each made when its first series arrives; the heatmap after the
    // gradient norm chart.
    this.set = new ChartSet({
      seriesOf: (name) => ({ run: runId, name }),
      cardsAfter: (chart) => (chart.id === "grad_norm" && this.heatmap ? [this.heatmap.card] : []),
      params,
    });
    this.chartsRoot = null;
    this.following = null; // the live stream of this run, from before its history loads
    this.refreshes = 0;
    this.refreshing = null; // the latest refresh's answer
    this.reloading = null;
    this.ticker = null;
    this.waiting = null; // stops waiting for a run not there yet (waitForRun)
    this.destroyed = false;
    this.off = [];
  }

  get charts() { return this.set.charts; }

  async load() {
    this.root.innerHTML = `<p class="muted">Loading run…</p>`;
    const ready = plotlyReady(); // meanwhile
    try {
      this.run = await getRun(this.runId);
    } catch (error) {
      if (this.destroyed) return;
      if (error.status === 404) {
        this.waitForRun(error);
        return;
      }
      setTitle("Run not found");
      this.root.innerHTML = `<div class="page-head"><h1>Run not found</h1></div>
        <p class="error">${escapeHTML(error.message)}</p><p><a href="#/">Back to runs</a></p>`;
      return;
    }
    await ready;
    if (this.destroyed) return; // left while it loaded (a load that waitForRun started)
    this.root.innerHTML = LAYOUT;
    this.chartsRoot = this.root.querySelector("#charts");
    this.job = this.run.job ? new JobPanel(this.root.querySelector("#run-job"), this.live, this.run) : null;
    this.process = this.run.process_key ? new ProcessPanel(this.root.querySelector("#run-process"), this.run) : null;
    this.alertList = new AlertList(this.root.querySelector("#run-alert-list"), {
      template: (alert) => alertItem(alert, { showRun: false }),
      empty: "No alerts.",
      onRender: (shown) => {
        const firing = shown.filter((alert) => alert.state === "firing").length;
        this.root.querySelector("#run-alert-count").textContent = shown.length ? `${firing} firing, ${shown.length} in all` : "";
        this.drawMarkers();
      },
    });

    this.following = this.live.follow([this.runId], {
      onMessage: (message) => this.onLive(message), onReconnect: () => this.onReconnect(),
    });
    // A null update: the feed reloaded (after a reconnect, or its first read answered after this
    // page's), so this run's alerts may have changed too; a 404 then is the run deleted meanwhile.
    this.off.push(this.feed.on((alert) => {
      if (!alert) this.unlessGone(this.loadAlerts()).catch((error) => console.warn("trainvitals: could not read the run's alerts again:", error));
      else if (alert.run_id === this.runId) this.alertList.upsert(alert);
    }));

    this.set.view.start = this.run.started_at;
    setBannerScope(this.run.project);
    this.drawHeader();
    this.mountEditor();
    this.set.mount(this.root.querySelector(".chart-controls"), this.chartsRoot);
    this.root.querySelector("#run-config").innerHTML = kvRows(this.run.config);
    this.root.querySelector("#run-env").innerHTML = kvRows(this.run.env);
    this.drawSummary();
    // Deleted while its page loaded (its "deleted" message waits for start() below).
    if (!(await this.unlessGone(Promise.all([this.reload(), this.loadAlerts(), this.job?.load()])))) return;
    this.process?.load().catch((error) => console.warn("trainvitals: could not read the process's runs:", error));
    this.charts.get("grad_norm")?.showTopVariables();
    this.drawMarkers(); // the layers an alert names stay shown, whatever their rank
    this.following.start();
    if (!this.charts.size) this.chartsRoot.innerHTML = `<p class="muted" id="no-data">No points yet.</p>`;
    // Redrawn now and then: "last seen" ages, and a forecast's time left shrinks.
    this.ticker = setInterval(() => { this.drawHeader(); this.drawMarkers(); }, 5000);
  }

  // No such run yet: the page was opened from an address printed or shared before the run's
  // agent reached the server (or the run was deleted). It waits for the run's first summary,
  // which every browser is sent, and then loads; a reconnect looks again.
  waitForRun(error) {
    setTitle("Waiting for run");
    this.root.innerHTML = `<div class="page-head"><h1>Waiting for this run</h1></div>
      <p class="error" id="run-waiting">${escapeHTML(error.message)}</p>
      <p class="muted">This page opens the run as soon as its agent connects to the server.</p>
      <p><a href="#/">Back to runs</a></p>`;
    const retry = () => {
      if (this.waiting !== stop) return; // already retrying, or the page is gone
      stop();
      this.load();
    };
    const offMessage = this.live.on((message) => {
      if (message.type === "runs" && message.runs.some((run) => run.id === this.runId)) retry();
    });
    const offReconnect = this.live.onReconnect(retry);
    const stop = () => { offMessage(); offReconnect(); this.waiting = null; };
    this.waiting = stop;
    // A run that arrived between the answer above and now was pushed before anyone listened.
    getRun(this.runId).then(retry, () => {});
  }

  onLive(message) {
    this.job?.onLive(message);
    if (message.type === "points" && message.run_id === this.runId) {
      for (const [name, data] of Object.entries(message.series)) {
        if (!this.set.takes(this.runId, name, data, true)) this.chartFor(name)?.extend(name, data);
      }
    } else if (message.type === "deleted" && message.run_id === this.runId) {
      this.showDeleted();
    } else if (message.type === "runs") {
      const summary = message.runs.find((r) => r.id === this.runId);
      if (!summary) return;
      // A summary can be the run's health alone (an alert about it changed): no status.
      const changed = summary.status != null && summary.status !== this.run.status;
      const stepped = summary.last_step != null && summary.last_step !== this.run.last_step;
      this.run = withSummary(this.run, summary);
      this.drawHeader();
      // The live summary has no stacks or traceback: fetch the run when its state changes,
      // and every few seconds at most while it steps (its series' summaries).
      if (changed) this.refresh().catch((error) => console.warn("trainvitals: could not read the run again:", error));
      else if (stepped && !this.summaryDue && !document.hidden) {
        this.summaryDue = setTimeout(() => { this.summaryDue = null; this.refresh().catch(() => {}); }, SUMMARY_REFRESH);
      }
    }
  }

  // Each series' last value (at its highest step), least and greatest, as the server keeps them;
  // updated in place while the run steps, so a value selected to copy stays selected.
  drawSummary() {
    const metrics = this.run.metrics ?? {};
    const body = this.root.querySelector("#run-summary-body");
    this.summaryRows ??= new Map();
    const rows = summaryOrder(Object.keys(metrics)).map((name) => {
      let row = this.summaryRows.get(name);
      if (!row) {
        row = document.createElement("tr");
        row.dataset.summary = name;
        this.summaryRows.set(name, row);
      }
      const summary = metrics[name];
      syncCells(row, [`<th>${escapeHTML(name)}</th>`, `<td class="num">${summaryValue(summary, "last", name)}</td>`,
        `<td class="num muted at-step">${escapeHTML(summary.step)}</td>`, `<td class="num">${summaryValue(summary, "min", name)}</td>`,
        `<td class="num">${summaryValue(summary, "max", name)}</td>`]);
      return row;
    });
    if (rows.length) syncRows(body, rows);
    else body.innerHTML = `<tr><td class="muted" colspan="5">No points yet.</td></tr>`;
  }

  showDeleted() {
    this.root.querySelector("#run-ending").innerHTML = `<div class="ending crashed" data-panel="deleted">
      <h3>This run was deleted</h3><p><a href="#/">Back to runs</a></p></div>`;
  }

  // Reads of the run's parts that find it deleted meanwhile (a 404): said as a deletion seen live
  // is, not as a failed page. False when the run is gone.
  async unlessGone(reads) {
    try {
      await reads;
      return true;
    } catch (error) {
      if (error.status === 404 && !(await this.refresh())) return false;
      throw error;
    }
  }

  // The run fetched anew, with the summaries pushed meanwhile over it, so that the status shown
  // is the last the server sent; the job's workers with it. False when the run is gone; a
  // refresh overtaken by a later one answers with the later one's answer.
  refresh() {
    this.refreshing = this.fetchRun(++this.refreshes);
    return this.refreshing;
  }

  async fetchRun(current) {
    let run, since;
    try {
      [run, since] = await this.live.fetchWithRuns(() => getRun(this.runId));
    } catch (error) {
      if (this.destroyed) return false;
      if (error.status !== 404) throw error;
      // Deleted while this page's live stream was away (or not yet open): nobody told it.
      this.showDeleted();
      return false;
    }
    if (this.destroyed) return false; // the page was left meanwhile: it draws nothing more
    if (current !== this.refreshes) return this.refreshing; // a later refresh is on its way
    this.run = since.filter((summary) => summary.id === this.runId).reduce(withSummary, run);
    this.drawHeader();
    this.drawSummary();
    if (this.job) {
      this.job.update(run.job?.runs ?? []);
      this.job.update(since.filter((summary) => summary.job_id === this.job.jobId));
    }
    return true;
  }

  async onReconnect() {
    if (!(await this.refresh())) return; // the run is gone
    await this.unlessGone(Promise.all([this.reload(), this.job?.load()])); // or goes meanwhile
  }

  destroy() {
    this.destroyed = true;
    this.waiting?.();
    for (const off of this.off) off();
    clearInterval(this.ticker);
    clearTimeout(this.summaryDue);
    clearTimeout(this.reloading);
    this.alertList?.destroy();
    this.job?.destroy();
    this.process?.destroy();
    this.following?.stop();
    this.set.destroy();
    this.heatmap?.destroy();
  }

  drawHeader() {
    const run = this.run;
    setTitle(run.name);
    this.root.querySelector("#run-name").textContent = run.name;
    this.root.querySelector("#run-status").innerHTML = statusBadge(run.status) + healthBadge(run.health) + tagList(run.tags)
      + (run.archived ? ' <span class="badge archived-badge">archived</span>' : "");
    const notes = this.root.querySelector("#run-notes");
    notes.textContent = run.notes ?? "";
    notes.hidden = !run.notes;
    const elapsed = (run.ended_at ?? run.last_seen) - run.started_at;
    this.root.querySelector("#run-facts").innerHTML = [
      ["Project", run.project], ["Started", formatTime(run.started_at)],
      ["Duration", formatDuration(elapsed)], ["Last step", run.last_step ?? "—"],
      ["Last seen", formatAgo(run.last_seen)], ["Host", `${run.host} (pid ${run.pid ?? "?"})`],
      ...(run.worker ? [["Worker", `${run.worker} of ${this.job?.members.size ?? "?"} in the job`]] : []),
    ].map(([k, v]) => `<div><dt>${escapeHTML(k)}</dt><dd data-fact="${escapeHTML(k)}">${escapeHTML(v)}</dd></div>`).join("");
    const ending = this.root.querySelector("#run-ending");
    if (run.status === "stalled") {
      ending.innerHTML = `<div class="ending stalled" data-panel="stall"><h3>Stalled: where every thread is</h3>
        <pre>${escapeHTML(run.stall_stacks ?? "")}</pre></div>`;
    } else if (ENDED.has(run.status)) {
      ending.innerHTML = `<div class="ending crashed"><h3>Ended: ${escapeHTML(run.end_reason ?? run.status)}</h3>
        ${run.traceback ? `<pre>${escapeHTML(run.traceback)}</pre>` : ""}
        ${lastReadings(run.last_readings)}</div>`;
    } else if (run.status === "finished") {
      ending.innerHTML = `<div class="ending finished">Finished at ${escapeHTML(formatTime(run.ended_at))}</div>`;
    } else {
      ending.replaceChildren(); // running (again, after a stall)
    }
  }

  // Every layer's gradient norm, under the gradient norm chart, once there are per-layer norms.
  drawHeatmap(gradients) {
    if (!this.heatmap) {
      if ([...gradients.series.keys()].filter((name) => name !== GRAD_GLOBAL_NORM).length < 2) return;
      this.heatmap = new GradHeatmap(this.chartsRoot, gradients.card);
      this.heatmap.setAlerts([...(this.alertList?.alerts.values() ?? [])]);
      this.set.filterSoon(); // the chart filter hides it with its chart (cardsAfter)
    }
    // Its columns on the gradient chart's x-axis, whichever it is.
    const along = gradients.has(GRAD_GLOBAL_NORM) ? GRAD_GLOBAL_NORM : gradients.series.keys().next().value;
    this.heatmap.update(gradients.series, gradients.xrange, {
      title: gradients.xTitle(), key: JSON.stringify(gradients.view.xaxis), x: (step) => gradients.xAtStep(step, along),
    });
  }

  // A chart's series at full resolution (the zoomed steps only, when zoomed), as a file the
  // server streams: nothing capped, nothing held in the page.
  download(format, chart) {
    download(exportPath(this.runId, [...chart.series.keys()], format, chart.stepRange(), `${this.run.name}-${chart.id}`));
  }

  // Rename, tag, note, archive or delete the run (the server asks for the admin role).
  mountEditor() {
    const form = this.root.querySelector(".edit-form");
    const status = form.querySelector(".edit-status");
    const fill = () => {
      form.elements.name.value = this.run.name;
      form.elements.tags.value = (this.run.tags ?? []).join(", ");
      form.elements.notes.value = this.run.notes ?? "";
      form.querySelector('[data-action="archive"]').textContent = this.run.archived ? "Unarchive" : "Archive";
    };
    const save = async (changes, done) => {
      status.textContent = "Saving…";
      try {
        this.run = withSummary(this.run, await editRun(this.runId, changes));
        this.drawHeader();
        fill();
        status.textContent = done;
      } catch (error) {
        status.textContent = error.message;
      }
    };
    fill();
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const tags = form.elements.tags.value.split(",").map((tag) => tag.trim()).filter(Boolean);
      save({ name: form.elements.name.value.trim(), tags, notes: form.elements.notes.value }, "Saved.");
    });
    form.querySelector('[data-action="archive"]').addEventListener("click", () =>
      save({ archived: !this.run.archived }, this.run.archived ? "Back in the list." : "Archived: hidden from the list."));
    form.querySelector('[data-action="delete"]').addEventListener("click", async () => {
      if (!confirm(`Delete the run "${this.run.name}" with all its points and alerts? This cannot be undone.`)) return;
      try {
        await deleteRun(this.runId);
        location.hash = "#/";
      } catch (error) {
        status.textContent = error.message;
      }
    });
  }

  // Each alert on the charts of the series it is about, or on the loss chart when those are
  // not drawn; resolved ones stay, dotted.
  drawMarkers() {
    if (!this.alertList) return;
    const byChart = new Map();
    for (const alert of this.alertList.alerts.values()) {
      const drawn = alertChartIds(alert).filter((id) => this.charts.has(id));
      for (const id of drawn.length ? drawn : [LOSS]) byChart.set(id, [...(byChart.get(id) ?? []), alert]);
    }
    for (const [id, chart] of this.charts) chart.setAlerts(byChart.get(id) ?? []);
    // The layers an alert names are never hidden: shown on the gradient chart, marked on the map.
    const alerts = [...this.alertList.alerts.values()];
    this.charts.get("grad_norm")?.showVariables(alerts.flatMap(alertLayers).map((v) => GRAD_NORM_PREFIX + v));
    this.heatmap?.setAlerts(alerts);
  }

  // Alerts merge by version, so live updates and fetched lists can arrive in any order.
  async loadAlerts() {
    const { alerts } = await getRunAlerts(this.runId);
    for (const alert of alerts) this.alertList.merge(alert);
    this.alertList.render();
  }

  // names: the series to (re)load; none means every series of the run.
  async reload(names = []) {
    const { series } = await getSeries(this.runId, names);
    for (const [name, data] of Object.entries(series)) {
      if (!this.set.takes(this.runId, name, data)) this.chartFor(name)?.setSeries(name, data);
    }
  }

  reloadLater(name) { // a trace grew long: swap it for a downsampled copy
    if (this.reloading) return;
    this.reloading = setTimeout(() => {
      this.reloading = null;
      this.unlessGone(this.reload([name])).catch((error) => console.warn("trainvitals: could not read a long series again:", error));
    }, 1000);
  }

  chartFor(name) {
    const spec = chartOf(name);
    if (spec == null) return null;
    let chart = this.charts.get(spec.id);
    if (!chart) {
      chart = new Chart(this.chartsRoot, spec, {
        ...this.set.chartOptions,
        onTooLong: (trace) => this.reloadLater(trace),
        onDownload: (format, source) => this.download(format, source),
        onDrawn: spec.id === "grad_norm" ? (drawn) => this.drawHeatmap(drawn) : undefined,
      });
      this.set.add(chart);
      this.drawMarkers();
    }
    return chart;
  }
}
