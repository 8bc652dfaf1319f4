// The runs list: every run, newest first, with its firing alerts, updated live.

import { mostUrgentFirst } from "./alert-feed.js";
import { listRuns } from "./api.js";
import { escapeHTML, formatAgo, formatTime, statusBadge } from "./format.js";

// "2 firing" in the colour of the most severe of them.
function firingBadge(alerts) {
  if (!alerts?.length) return "";
  const worst = [...alerts].sort(mostUrgentFirst)[0].severity;
  const n = alerts.length;
  return ` <span class="badge alert-count sev-${escapeHTML(worst)}" data-firing-alerts="${n}"
    title="${n} firing alert${n === 1 ? "" : "s"}">${n} firing</span>`;
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
      row.addEventListener("click", () => { location.hash = `#/runs/${run.id}`; });
      row.addEventListener("keydown", (e) => { if (e.key === "Enter") location.hash = `#/runs/${run.id}`; });
      rows.set(run.id, row);
    }
    row.innerHTML = `
      <td><a href="#/runs/${escapeHTML(run.id)}">${escapeHTML(run.name)}</a></td>
      <td>${escapeHTML(run.project)}</td>
      <td>${statusBadge(run.status)}${firingBadge(firing.get(run.id))}</td>
      <td>${escapeHTML(formatTime(run.started_at))}</td>
      <td class="num last-step">${run.last_step ?? "—"}</td>
      <td class="ago" data-time="${run.last_seen ?? ""}">${escapeHTML(formatAgo(run.last_seen))}</td>
      <td>${escapeHTML(run.host)}</td>`;
    return row;
  };

  const redraw = () => {
    firing = new Map();
    for (const alert of feed.firing()) firing.set(alert.run_id, [...(firing.get(alert.run_id) ?? []), alert]);
    const ordered = [...runs.values()].sort((a, b) => b.started_at - a.started_at);
    if (!ordered.length) {
      body.innerHTML = `<tr><td colspan="7" class="empty">No runs yet. Add
        <code>trainvitals.VitalsCallback()</code> to <code>model.fit</code>, or run
        <code>trainvitals demo</code>.</td></tr>`;
    } else {
      body.replaceChildren(...ordered.map(renderRow));
    }
    root.querySelector("#run-count").textContent = `${ordered.length} run${ordered.length === 1 ? "" : "s"}`;
  };

  const load = async () => {
    const { runs: list } = await listRuns();
    for (const run of list) runs.set(run.id, run);
    redraw();
  };

  const offMessage = live.on((message) => {
    if (message.type !== "runs") return;
    for (const run of message.runs) runs.set(run.id, { ...runs.get(run.id), ...run });
    redraw();
  });
  const offReconnect = live.onReconnect(load);
  const offAlerts = feed.on(redraw);
  const ticker = setInterval(() => {
    for (const cell of body.querySelectorAll("td.ago")) {
      cell.textContent = formatAgo(Number(cell.dataset.time) || null);
    }
  }, 5000);

  await load();
  return () => { offMessage(); offReconnect(); offAlerts(); clearInterval(ticker); };
}
