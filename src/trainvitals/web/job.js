// The job panel of a run that is one worker of a multi-process job: every worker with its
// state, and its step time, loss and memory side by side, live, so a worker whose loss departs
// from the others' (a bad data shard) or whose memory climbs alone (a leak) stands out.

import { getSeries } from "./api.js";
import { Chart } from "./charts.js";
import { DELETED_BADGE, escapeHTML, formatAgo, runPath, statusBadge, workerOrder } from "./format.js";
import { withSummary } from "./live.js";
import { HOST_RSS, LOSS, STEP_TIME } from "./series.js";

// The series compared, each on its chart (ids apart from the run's own charts on the page).
const COMPARED = [
  { series: STEP_TIME, id: "job_step_time", title: "step time by worker (s)" },
  { series: LOSS, id: "job_loss", title: "loss by worker" },
  { series: HOST_RSS, id: "job_host_rss", title: "host RSS by worker", bytes: true },
];
const MAX_WORKERS_CHARTED = 16; // each charted worker is one more live subscription

export class JobPanel {
  constructor(root, live, run) {
    this.live = live;
    this.runId = run.id;
    this.jobId = run.job.id;
    this.members = new Map(); // run id -> member summary
    this.charted = new Set();
    this.root = root;
    root.innerHTML = `<section class="job-panel panel" data-panel="job" data-job-id="${escapeHTML(this.jobId)}">
      <h2>Job <code>${escapeHTML(this.jobId)}</code> <span class="muted" id="job-count"></span></h2>
      <table class="runs-table job-table"><thead><tr><th>Worker</th><th>Run</th><th>Status</th>
        <th class="num">Last step</th><th>Last seen</th><th>Host</th></tr></thead><tbody></tbody></table>
      <div class="charts job-charts"></div></section>`;
    this.chartsRoot = root.querySelector(".job-charts");
    this.charts = new Map(); // series -> its chart, made when its first points arrive
    for (const member of run.job.runs) this.members.set(member.id, member);
  }

  chartFor(series) {
    let chart = this.charts.get(series);
    if (!chart) {
      const spec = COMPARED.find((compared) => compared.series === series);
      chart = new Chart(this.chartsRoot, spec, { onTooLong: (worker) => this.reloadWorker(worker) });
      this.charts.set(series, chart);
      const rank = (name) => COMPARED.findIndex((compared) => compared.series === name);
      const ordered = [...this.charts].sort(([a], [b]) => rank(a) - rank(b));
      this.chartsRoot.replaceChildren(...ordered.map(([, c]) => c.card));
    }
    return chart;
  }

  // (Re)load the compared series of every charted worker, charting new ones; one after the
  // other in worker order, so that each worker keeps its colour.
  async load() {
    this.draw();
    const ordered = [...this.members.values()].sort((a, b) => workerOrder(a.worker, b.worker));
    for (const member of ordered) {
      await (this.charted.has(member.id) ? this.reload(member) : this.addToCharts(member));
    }
  }

  async addToCharts(member) {
    if (this.charted.has(member.id) || this.charted.size >= MAX_WORKERS_CHARTED) return;
    this.charted.add(member.id);
    if (member.id !== this.runId) this.live.subscribe(member.id);
    await this.reload(member);
  }

  // A worker's compared series, read again. Another worker deleted meanwhile (a 404) is marked
  // so; this run's own 404 is the page's to say.
  async reload(member) {
    if (this.members.get(member.id)?.deleted) return;
    let series;
    try {
      ({ series } = await getSeries(member.id, COMPARED.map((compared) => compared.series)));
    } catch (error) {
      if (error.status !== 404 || member.id === this.runId) throw error;
      this.markDeleted(member.id);
      return;
    }
    for (const [name, data] of Object.entries(series)) {
      if (data.step.length) this.chartFor(name).setSeries(label(member), data);
    }
  }

  reloadWorker(worker) {
    const member = [...this.members.values()].find((m) => label(m) === worker);
    if (member) this.reload(member).catch(warn);
  }

  // Another worker of the job deleted: marked in the table, its traces kept, read no more.
  markDeleted(id) {
    const member = this.members.get(id);
    if (!member || member.deleted || id === this.runId) return;
    this.members.set(id, { ...member, deleted: true });
    this.draw();
  }

  draw() {
    const ordered = [...this.members.values()].sort((a, b) => workerOrder(a.worker, b.worker));
    this.root.querySelector("#job-count").textContent = `${ordered.length} worker${ordered.length === 1 ? "" : "s"}`;
    this.root.querySelector("tbody").innerHTML = ordered.map((m) => `
      <tr data-run-id="${escapeHTML(m.id)}" class="${m.id === this.runId ? "this-run" : ""}">
        <td><span class="worker-tag">${escapeHTML(m.worker ?? "?")}</span></td>
        <td>${m.id === this.runId ? `${escapeHTML(m.name)} <span class="muted">(this run)</span>`
          : `<a href="${escapeHTML(runPath(m.id))}">${escapeHTML(m.name)}</a>`}</td>
        <td>${m.deleted ? DELETED_BADGE : statusBadge(m.status)}</td><td class="num">${escapeHTML(m.last_step ?? "—")}</td>
        <td>${escapeHTML(formatAgo(m.last_seen))}</td><td>${escapeHTML(m.host ?? "")}</td></tr>`).join("");
  }

  // The workers as the server describes them (a worker that changed state or just joined the
  // job), each taken as sent.
  update(summaries) {
    if (!summaries.length) return;
    for (const summary of summaries) {
      const known = this.members.get(summary.id);
      if (known?.deleted) continue; // a summary sent before its deletion
      this.members.set(summary.id, withSummary(known, summary));
      if (!known) this.addToCharts(summary).catch(warn);
    }
    this.draw();
  }

  // A live message: a worker's new points, or run summaries.
  onLive(message) {
    if (message.type === "points") {
      const member = this.members.get(message.run_id);
      if (!member || !this.charted.has(member.id)) return;
      for (const { series } of COMPARED) {
        const data = message.series[series];
        if (data?.step.length) this.chartFor(series).extend(label(member), data);
      }
    } else if (message.type === "runs") {
      this.update(message.runs.filter((summary) => summary.job_id === this.jobId));
    } else if (message.type === "deleted") {
      this.markDeleted(message.run_id);
    }
  }

  destroy() {
    for (const id of this.charted) if (id !== this.runId) this.live.unsubscribe(id);
    for (const chart of this.charts.values()) chart.destroy();
  }
}

const label = (member) => member.worker ?? member.name;
const warn = (error) => console.warn("trainvitals: could not read a worker's series:", error);
