// The process panel of a run made by a training process that made others (a loop of fits:
// folds, trials, curriculum stages): its runs, and its memory across all of them on one chart
// in wall-clock time, so that what the loop keeps between fits shows as the steps it climbs.

import { getSeries, listRuns } from "./api.js";
import { Chart } from "./charts.js";
import { escapeHTML, formatTime, runPath, statusBadge } from "./format.js";
import { HOST_LIMIT, HOST_RSS, HOST_WORKING_SET } from "./series.js";

const MAX_RUNS_CHARTED = 50; // the newest; each is one more request when the page opens
const SPEC = { id: "process_memory", title: "process memory across its runs", bytes: true };

export class ProcessPanel {
  constructor(root, run) {
    Object.assign(this, { root, runId: run.id, key: run.process_key });
    this.chart = null;
  }

  // Shown only when the process made more than this run; each run's memory is read once.
  async load() {
    const { runs } = await listRuns({ process: this.key, limit: MAX_RUNS_CHARTED, archived: "include" });
    if (runs.length < 2 || this.destroyed) return;
    runs.sort((a, b) => a.started_at - b.started_at);
    this.root.innerHTML = `<section class="process-panel panel" data-panel="process">
      <h2>Process <code>${escapeHTML(this.key)}</code> <span class="muted">${runs.length} runs</span></h2>
      <div class="charts process-charts"></div>
      <table class="runs-table job-table"><thead><tr><th>Run</th><th>Status</th><th>Started</th></tr></thead><tbody>
      ${runs.map((r) => `<tr data-run-id="${escapeHTML(r.id)}" class="${r.id === this.runId ? "this-run" : ""}">
        <td>${r.id === this.runId ? `${escapeHTML(r.name)} <span class="muted">(this run)</span>`
          : `<a href="${escapeHTML(runPath(r.id))}">${escapeHTML(r.name)}</a>`}</td>
        <td>${statusBadge(r.status)}</td><td>${escapeHTML(formatTime(r.started_at))}</td></tr>`).join("")}
      </tbody></table></section>`;
    this.chart = new Chart(this.root.querySelector(".process-charts"), SPEC, { view: { xaxis: "wall" } });
    const limit = { step: [], time: [], value: [] }; // one trace across the runs
    for (const run of runs) {
      const { series } = await getSeries(run.id, [HOST_WORKING_SET, HOST_RSS, HOST_LIMIT]);
      if (this.destroyed) return;
      // The kernel's count where the run has one, else the process's RSS.
      const used = series[HOST_WORKING_SET]?.step.length ? series[HOST_WORKING_SET] : series[HOST_RSS];
      if (used?.step.length) this.chart.setSeries(run.name, used);
      for (const field of ["step", "time", "value"]) limit[field].push(...(series[HOST_LIMIT]?.[field] ?? []));
    }
    if (limit.step.length) this.chart.setSeries("limit", limit);
  }

  destroy() {
    this.destroyed = true;
    this.chart?.destroy();
  }
}
