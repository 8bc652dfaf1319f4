// One run: its header, how it ended, its alerts, and a live chart per metric with the alerts
// marked at their steps.

import { AlertList, alertItem } from "./alert-items.js";
import { getRun, getRunAlerts, getSeries } from "./api.js";
import { Chart, alertChartIds, chartOf, chartOrder } from "./charts.js";
import { escapeHTML, formatAgo, formatBytes, formatDuration, formatNumber, formatTime, statusBadge } from "./format.js";
import { JobPanel } from "./job.js";
import { HOST_LIMIT, HOST_RSS, LOSS, isBytes, unitOf } from "./series.js";

export async function renderRun(root, live, feed, runId) {
  root.innerHTML = `<p class="muted">Loading run…</p>`;
  let run;
  try {
    run = await getRun(runId);
  } catch (error) {
    root.innerHTML = `<div class="page-head"><h1>Run not found</h1></div>
      <p class="error">${escapeHTML(error.message)}</p><p><a href="#/">Back to runs</a></p>`;
    return () => {};
  }

  root.innerHTML = `
    <div class="page-head">
      <h1 id="run-name"></h1><span id="run-status"></span>
    </div>
    <dl class="facts" id="run-facts"></dl>
    <section id="run-ending"></section>
    <section class="run-alerts" aria-labelledby="run-alerts-title">
      <h2 id="run-alerts-title">Alerts <span class="muted" id="run-alert-count"></span></h2>
      <div class="alert-list" id="run-alert-list"><p class="muted">Loading alerts…</p></div>
    </section>
    <div class="charts" id="charts"></div>
    <div id="run-job"></div>
    <details class="panel"><summary>Configuration</summary><table class="kv" id="run-config"></table></details>
    <details class="panel"><summary>Environment</summary><table class="kv" id="run-env"></table></details>`;

  const job = run.job ? new JobPanel(root.querySelector("#run-job"), live, run) : null;
  const charts = new Map(); // chart id -> its chart, made when its first series arrives
  const chartsRoot = root.querySelector("#charts");
  let buffered = [];   // live messages that arrive while the history loads
  let loaded = false;

  const drawHeader = () => {
    root.querySelector("#run-name").textContent = run.name;
    root.querySelector("#run-status").innerHTML = statusBadge(run.status);
    const elapsed = (run.ended_at ?? run.last_seen) - run.started_at;
    root.querySelector("#run-facts").innerHTML = [
      ["Project", run.project], ["Started", formatTime(run.started_at)],
      ["Duration", formatDuration(elapsed)], ["Last step", run.last_step ?? "—"],
      ["Last seen", formatAgo(run.last_seen)], ["Host", `${run.host} (pid ${run.pid ?? "?"})`],
      ...(run.worker ? [["Worker", `${run.worker} of ${job?.members.size ?? "?"} in the job`]] : []),
    ].map(([k, v]) => `<div><dt>${k}</dt><dd data-fact="${k}">${escapeHTML(v)}</dd></div>`).join("");
    const ending = root.querySelector("#run-ending");
    if (run.status === "stalled") {
      ending.innerHTML = `<div class="ending stalled" data-panel="stall"><h3>Stalled: where every thread is</h3>
        <pre>${escapeHTML(run.stall_stacks ?? "")}</pre></div>`;
    } else if (run.end_reason && run.status !== "finished") {
      ending.innerHTML = `<div class="ending crashed"><h3>Ended: ${escapeHTML(run.end_reason)}</h3>
        ${run.traceback ? `<pre>${escapeHTML(run.traceback)}</pre>` : ""}
        ${lastReadings(run.last_readings)}</div>`;
    } else if (run.end_reason) {
      ending.innerHTML = `<div class="ending finished">Finished at ${escapeHTML(formatTime(run.ended_at))}</div>`;
    }
  };

  // Each alert on the charts of the series it is about, or on the loss chart when those are
  // not drawn; resolved ones stay, dotted.
  const drawMarkers = () => {
    const byChart = new Map();
    for (const alert of alertList.alerts.values()) {
      const drawn = alertChartIds(alert).filter((id) => charts.has(id));
      for (const id of drawn.length ? drawn : [LOSS]) byChart.set(id, [...(byChart.get(id) ?? []), alert]);
    }
    for (const [id, chart] of charts) chart.setAlerts(byChart.get(id) ?? []);
  };
  const alertList = new AlertList(root.querySelector("#run-alert-list"), {
    template: (alert) => alertItem(alert, { showRun: false }),
    empty: "No alerts.",
    onRender: (shown) => {
      const firing = shown.filter((alert) => alert.state === "firing").length;
      root.querySelector("#run-alert-count").textContent = shown.length ? `${firing} firing, ${shown.length} in all` : "";
      drawMarkers();
    },
  });
  // Alerts merge by version, so live updates and fetched lists can arrive in any order.
  const loadAlerts = async () => {
    const { alerts } = await getRunAlerts(runId);
    for (const alert of alerts) alertList.merge(alert);
    alertList.render();
  };

  const kvRows = (object) => Object.entries(object ?? {}).map(([k, v]) =>
    `<tr><th>${escapeHTML(k)}</th><td>${escapeHTML(typeof v === "object" ? JSON.stringify(v) : v)}</td></tr>`).join("")
    || `<tr><td class="muted">none</td></tr>`;

  // names: the series to (re)load; none means every series of the run.
  const reload = async (names = []) => {
    const { series } = await getSeries(runId, names);
    for (const [name, data] of Object.entries(series)) chartFor(name)?.setSeries(name, data);
  };
  let reloading = null;
  const reloadLater = (name) => {   // a trace grew long: swap it for a downsampled copy
    if (reloading) return;
    reloading = setTimeout(() => { reloading = null; reload([name]); }, 1000);
  };

  const chartFor = (name) => {
    const spec = chartOf(name);
    if (spec == null) return null;
    let chart = charts.get(spec.id);
    if (!chart) {
      chart = new Chart(chartsRoot, spec, { onTooLong: reloadLater });
      charts.set(spec.id, chart);
      const ordered = [...charts.values()].sort((a, b) => chartOrder(a.spec, b.spec));
      chartsRoot.replaceChildren(...ordered.map((c) => c.card));
      drawMarkers();
    }
    return chart;
  };

  const apply = (message) => {
    job?.apply(message);
    if (message.type === "points" && message.run_id === runId) {
      for (const [name, data] of Object.entries(message.series)) chartFor(name)?.extend(name, data);
    } else if (message.type === "runs") {
      const update = message.runs.find((r) => r.id === runId);
      if (update) {
        const changed = update.status !== run.status;
        run = { ...run, ...update };
        drawHeader();
        // The live summary has no stacks or traceback: fetch the run when its state changes.
        if (changed) getRun(runId).then((full) => { run = full; drawHeader(); });
      }
    }
  };

  // Subscribe before fetching history, so nothing falls between the two.
  const offMessage = live.on((message) => (loaded ? apply(message) : buffered.push(message)));
  live.subscribe(runId);
  const offReconnect = live.onReconnect(async () => { run = await getRun(runId); drawHeader(); reload(); job?.load(); });
  // A null update: the feed reloaded after a reconnect, so this run's alerts may have changed too.
  const offAlerts = feed.on((alert) => {
    if (!alert) loadAlerts();
    else if (alert.run_id === runId) alertList.upsert(alert);
  });

  drawHeader();
  root.querySelector("#run-config").innerHTML = kvRows(run.config);
  root.querySelector("#run-env").innerHTML = kvRows(run.env);
  await Promise.all([reload(), loadAlerts(), job?.load()]);
  charts.get("grad_norm")?.showTopVariables();
  loaded = true;
  for (const message of buffered) apply(message);
  buffered = [];
  if (!charts.size) chartsRoot.innerHTML = `<p class="muted" id="no-data">No points yet.</p>`;

  const ticker = setInterval(() => { drawHeader(); drawMarkers(); }, 5000); // markers: a forecast's time left
  return () => {
    offMessage(); offReconnect(); offAlerts(); clearInterval(ticker); alertList.destroy(); job?.destroy();
    live.unsubscribe(runId);
    for (const chart of charts.values()) chart.destroy();
  };
}

// The memory and GPU readings last stored before the run ended: the evidence of how it died.
function reading(name, value) {
  if (isBytes(name)) return formatBytes(value);
  const unit = unitOf(name);
  return formatNumber(value) + (unit ? ` ${unit}` : "");
}

function lastReadings(readings) {
  const names = Object.keys(readings ?? {}).sort();
  if (!names.length) return "";
  const memory = readings[HOST_RSS] != null && readings[HOST_LIMIT] > 0
    ? ` (RSS at ${Math.round((100 * readings[HOST_RSS]) / readings[HOST_LIMIT])}% of the limit)` : "";
  const rows = names.map((name) => `<tr><th>${escapeHTML(name)}</th>
    <td data-reading="${escapeHTML(name)}">${escapeHTML(reading(name, readings[name]))}</td></tr>`).join("");
  return `<details class="last-readings" open><summary>Last readings before the end${memory}</summary>
    <table class="kv">${rows}</table></details>`;
}
