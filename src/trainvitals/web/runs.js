// The runs list: every run, newest first, with its firing alerts, updated live.

import { mostUrgentFirst } from "./alert-feed.js";
import { listRuns } from "./api.js";
import { escapeHTML, formatAgo, formatTime, runPath, statusBadge, workerOrder } from "./format.js";
import { withSummary } from "./live.js";

// "2 firing" in the colour of the most severe of them.
function firingBadge(alerts) {
  if (!alerts?.length) return "";
  const worst = [...alerts].sort(mostUrgentFirst)[0].severity;
  const n = alerts.length;
  return ` <span class="badge alert-count sev-${escapeHTML(worst)}" data-firing-alerts="${escapeHTML(n)}"
    title="${escapeHTML(`${n} firing alert${n === 1 ? "" : "s"}`)}">${escapeHTML(`${n} firing`)}</span>`;
}

// Runs newest first, the workers of one job together (in worker order) where its newest
// worker would stand: [{ job: id or null, members: [run, ...] }, ...].
function groupedByJob(runs) {
  const groups = new Map();
  for (const run of runs) {
    const key = run.job_id ? `job:${run.job_id}` : `run:${run.id}`;
    if (groups.has(key)) groups.get(key).push(run);
    else groups.set(key, [run]);
  }
  const newest = (members) => Math.max(...members.map((run) => run.started_at));
  return [...groups.values()]
    .map((members) => ({
      job: members[0].job_id ?? null,
      members: members[0].job_id ? members.sort((a, b) => workerOrder(a.worker, b.worker)) : members,
    }))
    .sort((a, b) => newest(b.members) - newest(a.members));
}

// The heading row of a job: how many workers, and how many of them in each state.
function jobRow(job, members) {
  const row = document.createElement("tr");
  row.className = "job-row";
  row.dataset.jobId = job;
  const states = new Map();
  for (const run of members) states.set(run.status, (states.get(run.status) ?? 0) + 1);
  const summary = [...states].map(([status, n]) => `${n} ${status}`).join(", ");
  const workers = `${members.length} worker${members.length === 1 ? "" : "s"}`;
  row.innerHTML = `<td colspan="7">Job <code>${escapeHTML(job)}</code> ·
    <span data-job-workers="${escapeHTML(members.length)}">${escapeHTML(workers)}</span>
    <span class="muted">(${escapeHTML(summary)})</span></td>`;
  return row;
}

export async function renderRuns(root, live, feed) {
  root.innerHTML = `
    <div class="page-head"><h1>Runs</h1><span class="muted" id="run-count"></span></div>
    <table class="runs-table">
      <thead><tr><th>Name</th><th>Project</th><th>Status</th><th>Started</th>
        <th class="num">Last step</th><th>Last seen</th><th>Host</th></tr></thead>
      <tbody id="runs-body"><tr><td colspan="7" class="muted">Loading…</td></tr></tbody>
    </table>`;
  const body = root.querySelector("#runs-body");
  const rows = new Map();
  const runs = new Map();
  let firing = new Map(); // run id -> its firing alerts

  const renderRow = (run) => {
    let row = rows.get(run.id);
    if (!row) {
      row = document.createElement("tr");
      row.className = "run-row";
      row.dataset.runId = run.id;
      row.tabIndex = 0;
      row.addEventListener("click", () => { location.hash = runPath(run.id); });
      row.addEventListener("keydown", (e) => { if (e.key === "Enter") location.hash = runPath(run.id); });
      rows.set(run.id, row);
    }
    row.classList.toggle("job-member", Boolean(run.job_id));
    const worker = run.worker ? ` <span class="worker-tag" data-worker="${escapeHTML(run.worker)}">${escapeHTML(run.worker)}</span>` : "";
    row.innerHTML = `
      <td><a href="${escapeHTML(runPath(run.id))}">${escapeHTML(run.name)}</a>${worker}</td>
      <td>${escapeHTML(run.project)}</td>
      <td>${statusBadge(run.status)}${firingBadge(firing.get(run.id))}</td>
      <td>${escapeHTML(formatTime(run.started_at))}</td>
      <td class="num last-step">${escapeHTML(run.last_step ?? "—")}</td>
      <td class="ago" data-time="${escapeHTML(run.last_seen)}">${escapeHTML(formatAgo(run.last_seen))}</td>
      <td>${escapeHTML(run.host)}</td>`;
    return row;
  };

  const redraw = () => {
    firing = new Map();
    for (const alert of feed.firing()) firing.set(alert.run_id, [...(firing.get(alert.run_id) ?? []), alert]);
    const ordered = [...runs.values()];
    if (!ordered.length) {
      body.innerHTML = `<tr><td colspan="7" class="empty">No runs yet. Add
        <code>trainvitals.VitalsCallback()</code> to <code>model.fit</code>, or run
        <code>trainvitals demo</code>.</td></tr>`;
    } else {
      body.replaceChildren(...groupedByJob(ordered).flatMap(({ job, members }) =>
        job ? [jobRow(job, members), ...members.map(renderRow)] : members.map(renderRow)));
    }
    root.querySelector("#run-count").textContent = `${ordered.length} run${ordered.length === 1 ? "" : "s"}`;
  };

  // Each run as the server last described it, status included, in the order its words came.
  const apply = (summaries) => {
    for (const summary of summaries) runs.set(summary.id, withSummary(runs.get(summary.id), summary));
    redraw();
  };
  const load = async () => {
    const [{ runs: list }, since] = await live.fetchWithRuns(listRuns);
    apply([...list, ...since]);
  };

  const offMessage = live.on((message) => { if (message.type === "runs") apply(message.runs); });
  const offReconnect = live.onReconnect(load);
  const offAlerts = feed.on(redraw);
  const ticker = setInterval(() => {
    for (const cell of body.querySelectorAll("td.ago")) {
      cell.textContent = formatAgo(Number(cell.dataset.time) || null);
    }
  }, 5000);

  const cleanup = () => { offMessage(); offReconnect(); offAlerts(); clearInterval(ticker); };
  try {
    await load();
  } catch (error) {
    cleanup();
    throw error;
  }
  return cleanup;
}
