// The runs list: one page of runs, searched, filtered and sorted by the server, with each
// run's health and firing alerts, updated live. The view's state is in the address
// (#/?q=...&status=...&sort=...), so a filtered list can be shared and survives a reload.

import { mostUrgentFirst } from "./alert-feed.js";
import { listRuns } from "./api.js";
import { setBannerScope } from "./banner.js";
import { comparePath } from "./compare.js";
import { PLOT_RUNS, drawRunsPlot, plotAxis } from "./runs-plot.js";
import { syncCells, syncRows } from "./rows.js";
import { withSummary } from "./live.js";
import { escapeHTML, formatAgo, formatDuration, formatTime, healthBadge, runPath, setTitle, statusBadge, summaryValue, tagList, workerOrder } from "./format.js";

const PAGE_SIZE = 50;
const STATUSES = ["running", "stalled", "finished", "crashed", "lost"];
// [sort key, heading, cell class]: every column the server sorts by.
// [sort key, heading, class]: "wide-only" columns give way on a phone, so that a run's name,
// how it ended and its health fit the screen.
const COLUMNS = [
  ["name", "Name", ""], ["project", "Project", "wide-only"], ["status", "Status", ""],
  ["started_at", "Started", "wide-only"], ["last_step", "Last step", "num wide-only"],
  ["last_seen", "Last seen", ""], ["host", "Host", "wide-only"],
];
// The metric columns shown unless the address says otherwise (metrics= for none): the last
// loss and the best validation loss, as W&B's table opens with the runs' summary metrics.
const DEFAULT_METRICS = "loss, min:val_loss";
const DEFAULTS = { q: "", project: "", job: "", process: "", status: "", health: "", tag: "", archived: "hide", sort: "started_at", order: "desc", page: "0", cols: "", metrics: DEFAULT_METRICS, px: "", py: "", plog: "" };
// How often, at most, an open plot of the runs is read again while they stream (ms).
const PLOT_REFRESH = 15000;
// A series' statistics a metric column shows, each sorted first in the order that puts the
// best runs of a loss (last, min) or of an accuracy (max) on top.
const METRIC_ORDER = { last: "asc", min: "asc", max: "desc" };
// How often, at most, metric columns are read again while the runs on the page stream (ms).
const METRIC_REFRESH = 5000;

// "2 firing" in the colour of the most severe of them.
function firingBadge(alerts) {
  if (!alerts?.length) return "";
  const worst = [...alerts].sort(mostUrgentFirst)[0].severity;
  const n = alerts.length;
  return ` <span class="badge alert-count sev-${escapeHTML(worst)}" data-firing-alerts="${escapeHTML(n)}"
    title="${escapeHTML(`${n} firing alert${n === 1 ? "" : "s"}`)}">${escapeHTML(`${n} firing`)}</span>`;
}

// The group a run is listed in: its job's workers, else the runs its process made (a loop of
// fits), or null.
const groupOf = (run) => (run.job_id ? { kind: "job", id: run.job_id }
  : run.process_key ? { kind: "process", id: run.process_key } : null);

// Runs in the page's order, those of one group together where its first run stands (a job's in
// worker order): [{ kind: "job", "process" or null, id, members: [run, ...] }, ...]. A
// process with one run on the page is no group: its run is listed as any other.
function grouped(runs) {
  const groups = new Map();
  for (const run of runs) {
    const group = groupOf(run);
    const key = group ? `${group.kind}:${group.id}` : `run:${run.id}`;
    if (groups.has(key)) groups.get(key).members.push(run);
    else groups.set(key, { kind: null, id: null, ...group, members: [run] });
  }
  return [...groups.values()].map((group) => {
    if (group.kind === "job") group.members.sort((a, b) => workerOrder(a.worker, b.worker));
    return group.kind === "process" && group.members.length < 2 ? { ...group, kind: null, id: null } : group;
  });
}

// The heading row of a group's one cell: what it is, how many runs (a job's workers), how
// many of them in each state, and `link` (to list the group alone, or every run again).
function groupCells({ kind, id, members }, link, span) {
  const states = new Map();
  for (const run of members) states.set(run.status, (states.get(run.status) ?? 0) + 1);
  const summary = [...states].map(([status, n]) => `${n} ${status}`).join(", ");
  const noun = kind === "job" ? "worker" : "run";
  const count = `${members.length} ${noun}${members.length === 1 ? "" : "s"}`;
  const what = kind === "job" ? `Job <code>${escapeHTML(id)}</code>`
    : `Process <code title="${escapeHTML(id)}">${escapeHTML(`${members[0].host}:${members[0].pid}`)}</code>`;
  return [`<td colspan="${span}">${what} ·
    <span data-${kind}-${noun}s="${escapeHTML(members.length)}">${escapeHTML(count)}</span>
    <span class="muted">(${escapeHTML(summary)})</span> ${link}</td>`];
}

function configValue(value) {
  if (value === undefined) return "—";
  return typeof value === "object" ? JSON.stringify(value) : String(value);
}

// The view's state from the address's query, with the defaults filled in.
function stateOf(params) {
  const state = { ...DEFAULTS };
  for (const key of Object.keys(DEFAULTS)) if (params.get(key) != null) state[key] = params.get(key);
  return state;
}

function queryOf(state) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(state)) if (value !== DEFAULTS[key]) query.set(key, value);
  return query;
}

const listed = (text) => text.split(",").map((key) => key.trim()).filter(Boolean).slice(0, 20);
const configKeys = (state) => listed(state.cols);

// The metric columns of the view: "val_loss" shows a series' last value, "min:val_loss" and
// "max:val_loss" its least and greatest; each is also the server's sort key for it.
function metricColumns(state) {
  return listed(state.metrics).map((text) => {
    const at = text.indexOf(":");
    const stat = at > 0 ? text.slice(0, at) : "";
    return stat in METRIC_ORDER && at < text.length - 1
      ? { stat, name: text.slice(at + 1), sort: text }
      : { stat: "last", name: text, sort: `last:${text}` };
  });
}

function metricCell(summary, { stat, name }) {
  if (!summary) return `<td class="num metric-cell muted">—</td>`;
  const shown = summaryValue(summary, stat, name);
  const title = stat === "last" ? `at step ${summary.step}` : `${stat} of the finite values; last step ${summary.step}`;
  return `<td class="num metric-cell" title="${escapeHTML(title)}">${shown}</td>`;
}

export async function renderRuns(root, live, feed, params = new URLSearchParams()) {
  setTitle("Runs");
  const state = stateOf(params);
  root.innerHTML = `
    <div class="page-head"><h1>Runs</h1><span class="muted" id="run-count"></span>
      <button type="button" id="compare" disabled>Compare selected</button></div>
    <form class="filters runs-filters" role="search">
      <label>Search <input type="search" name="q" placeholder="name" maxlength="200"></label>
      <label>Project <input type="text" name="project" maxlength="200" size="10"></label>
      <label>Status <select name="status"><option value="">any</option>
        ${STATUSES.map((s) => `<option>${escapeHTML(s)}</option>`).join("")}</select></label>
      <label>Health <select name="health" title="the worst alert a run raised, firing or not">
        <option value="">any</option><option value="critical">critical</option>
        <option value="warning">warning</option><option value="healthy">healthy</option></select></label>
      <label>Tag <input type="text" name="tag" maxlength="64" size="8"></label>
      <label>Archived <select name="archived"><option value="hide">hidden</option>
        <option value="only">only</option><option value="include">shown</option></select></label>
      <label>Config columns <input type="text" name="cols" placeholder="lr, batch_size" size="14"></label>
      <label title="a series' last value; min: or max: for its least or greatest">Metric columns
        <input type="text" name="metrics" placeholder="loss, min:val_loss" size="16"></label>
    </form>
    <p id="runs-error" class="error" role="alert" hidden></p>
    <details class="panel runs-plot" id="runs-plot"><summary>Plot the runs <span class="muted">a point a run, every page</span></summary>
      <div class="filters plot-axes"><label>x <select name="px"></select></label>
        <label><input type="checkbox" name="logx"> log</label>
        <label>y <select name="py"></select></label>
        <label><input type="checkbox" name="logy"> log</label>
        <span class="muted" id="runs-plot-note" role="status"></span></div>
      <div class="plot" id="runs-plot-area"></div>
    </details>
    <div class="table-scroll"><table class="runs-table">
      <thead><tr id="runs-head"></tr></thead>
      <tbody id="runs-body"><tr><td class="muted">Loading…</td></tr></tbody>
    </table></div>
    <nav class="pager" aria-label="Pages of runs">
      <button type="button" id="prev-page">← Newer</button>
      <span id="page-range" class="muted"></span>
      <button type="button" id="next-page">Older →</button>
    </nav>`;
  const body = root.querySelector("#runs-body");
  const form = root.querySelector("form");
  // A view the server refused (or could not give) is said above the list, which keeps the
  // runs it showed, still live, until a view is given.
  const failure = root.querySelector("#runs-error");
  for (const key of ["q", "project", "status", "health", "tag", "archived", "cols", "metrics"]) form.elements[key].value = state[key];
  const selected = new Set();
  const plotPanel = root.querySelector("#runs-plot");
  plotPanel.open = Boolean(state.py);
  let runs = new Map(); // this page's runs, in the server's order
  let total = 0;
  let firing = new Map(); // run id -> its firing alerts
  let loads = 0;
  let gone = false; // the page was left: nothing more is drawn, nor put in the address

  // The view the list shows: the last one the server gave (a refused one changes nothing).
  let shown = { ...state };
  const span = () => COLUMNS.length + 3 + configKeys(shown).length + metricColumns(shown).length;
  const isNewestFirst = () => shown.sort === "started_at" && shown.order === "desc";

  const sortHeading = (key, label, cls, extra = "") => {
    const sorted = shown.sort === key ? (shown.order === "asc" ? "ascending" : "descending") : "none";
    const arrow = sorted === "ascending" ? " ▲" : sorted === "descending" ? " ▼" : "";
    return `<th class="${cls}" aria-sort="${sorted}"${extra}><button type="button" class="sort" data-sort="${escapeHTML(key)}">${escapeHTML(label)}${arrow}</button></th>`;
  };
  const drawHead = () => {
    const headings = COLUMNS.map(([key, label, cls]) => sortHeading(key, label, cls));
    // How long each ran (to its end, or to now), after its last step; the server sorts by none.
    headings.splice(COLUMNS.findIndex(([key]) => key === "last_step") + 1, 0, '<th class="num wide-only">Duration</th>');
    const config = configKeys(shown).map((key) => `<th data-config-column="${escapeHTML(key)}">${escapeHTML(key)}</th>`);
    const metrics = metricColumns(shown).map(({ stat, name, sort }) =>
      sortHeading(sort, stat === "last" ? name : `${name} (${stat})`, "num", ` data-metric-column="${escapeHTML(sort)}"`));
    const head = root.querySelector("#runs-head");
    const html = `<th><span class="visually-hidden">Select</span></th>${headings.join("")}${config.join("")}${metrics.join("")}`;
    if (head.drawn !== html) { head.innerHTML = html; head.drawn = html; } // a focused heading stays
  };

  // The rows drawn, by key ("run:<id>", "job:<id>", "process:<key>"): updated in place at each push.
  let drawn = new Map();
  const rowFor = (key, make) => {
    let row = drawn.get(key);
    if (!row) { row = make(); drawn.set(key, row); }
    return row;
  };
  const runCells = (run) => {
    const worker = run.worker ? ` <span class="worker-tag" data-worker="${escapeHTML(run.worker)}">${escapeHTML(run.worker)}</span>` : "";
    const notes = run.notes ? ` <span class="notes-mark" title="${escapeHTML(run.notes)}" aria-label="has notes">✎</span>` : "";
    const config = configKeys(shown).map((key) => `<td class="config-cell" data-config="${escapeHTML(key)}">${escapeHTML(configValue(run.config?.[key]))}</td>`);
    const metrics = metricColumns(shown).map((column) => metricCell(run.metrics?.[column.name], column));
    return [
      // Whether it is ticked is the box's own state, kept in step with `selected`.
      `<td><input type="checkbox" class="select-run" aria-label="${escapeHTML(`select ${run.name}`)}"></td>`,
      `<td><a href="${escapeHTML(runPath(run.id))}">${escapeHTML(run.name)}</a>${worker}${notes}${tagList(run.tags)}</td>`,
      `<td class="wide-only">${escapeHTML(run.project)}</td>`,
      `<td>${statusBadge(run.status)}${healthBadge(run.health)}${firingBadge(firing.get(run.id))}</td>`,
      `<td class="wide-only">${escapeHTML(formatTime(run.started_at))}</td>`,
      `<td class="num last-step wide-only">${escapeHTML(run.last_step ?? "—")}</td>`,
      `<td class="num duration wide-only">${escapeHTML(formatDuration((run.ended_at ?? run.last_seen) - run.started_at))}</td>`,
      `<td class="ago" data-time="${escapeHTML(run.last_seen)}">${escapeHTML(formatAgo(run.last_seen))}</td>`,
      `<td class="wide-only">${escapeHTML(run.host)}</td>`,
      ...config,
      ...metrics,
    ];
  };
  // `kind`: the kind of group whose heading the row is listed under, if any.
  const runRow = (run, kind = null) => {
    const row = rowFor(`run:${run.id}`, () => {
      const made = document.createElement("tr");
      made.dataset.runId = run.id;
      return made;
    });
    row.className = kind ? `run-row group-member ${kind}-member` : "run-row";
    row.classList.toggle("archived", Boolean(run.archived));
    syncCells(row, runCells(run));
    const box = row.querySelector(".select-run");
    if (box.checked !== selected.has(run.id)) box.checked = selected.has(run.id);
    return row;
  };
  // A group's link lists its runs alone (the job= or process= filter), or every run again.
  const groupLink = (kind, id) => {
    const alone = shown[kind] === id;
    const query = queryOf({ ...shown, job: "", process: "", page: "0", ...(alone ? {} : { [kind]: id }) });
    return `<a class="group-filter" href="#/${query.size ? `?${escapeHTML(query)}` : ""}">${alone ? "every run" : "only these"}</a>`;
  };
  const groupRow = (group) => {
    const row = rowFor(`${group.kind}:${group.id}`, () => {
      const made = document.createElement("tr");
      made.className = `group-row ${group.kind}-row`;
      made.dataset[group.kind === "job" ? "jobId" : "processKey"] = group.id;
      return made;
    });
    syncCells(row, groupCells(group, groupLink(group.kind, group.id), span()));
    return row;
  };

  const drawCompare = () => {
    const button = root.querySelector("#compare");
    button.disabled = selected.size < 1;
    button.textContent = selected.size ? `Compare ${selected.size} selected` : "Compare selected";
  };

  // Where the keyboard is in a run's row (its checkbox or its link), to be given back once the
  // rows are in order: a row moved (a new run above it, a job regrouped) loses the focus.
  const focusInRow = () => {
    const at = document.activeElement;
    const row = body.contains(at) ? at.closest("tr.run-row") : null;
    return row && { id: row.dataset.runId, control: at.matches(".select-run") ? ".select-run" : "a" };
  };

  const redraw = () => {
    const focus = focusInRow();
    firing = new Map();
    for (const alert of feed.firing()) firing.set(alert.run_id, [...(firing.get(alert.run_id) ?? []), alert]);
    const ordered = [...runs.values()];
    if (!ordered.length) {
      drawn = new Map();
      const looks = { page: "0", sort: DEFAULTS.sort, order: DEFAULTS.order, cols: "", metrics: DEFAULTS.metrics, px: "", py: "", plog: "" };
      const filtered = queryOf({ ...shown, ...looks }).size;
      body.innerHTML = filtered
        ? `<tr><td colspan="${span()}" class="empty">No runs match. <a href="#/">Show every run</a></td></tr>`
        : `<tr><td colspan="${span()}" class="empty">No runs yet. Add
          <code>trainvitals.VitalsCallback()</code> to <code>model.fit</code>, or run
          <code>trainvitals demo</code>.</td></tr>`;
    } else {
      const rows = isNewestFirst()
        ? grouped(ordered).flatMap((group) => [
          ...(group.kind ? [groupRow(group)] : []), ...group.members.map((run) => runRow(run, group.kind))])
        : ordered.map((run) => runRow(run));
      const kept = new Set(rows);
      for (const [key, row] of drawn) if (!kept.has(row)) drawn.delete(key);
      syncRows(body, rows);
    }
    if (focus) body.querySelector(`tr.run-row[data-run-id="${CSS.escape(focus.id)}"] ${focus.control}`)?.focus();
    const first = Number(shown.page) * PAGE_SIZE;
    root.querySelector("#run-count").textContent = `${total} run${total === 1 ? "" : "s"}`;
    root.querySelector("#run-count").dataset.total = String(total);
    root.querySelector("#page-range").textContent = total ? `${first + 1}–${first + ordered.length} of ${total}` : "";
    root.querySelector("#prev-page").disabled = first === 0;
    root.querySelector("#next-page").disabled = first + ordered.length >= total;
    drawCompare();
  };

  // Whether the archived filter still shows a run of the list (archived or back elsewhere).
  const archivedShown = (run) => shown.archived === "include" || (shown.archived === "only") === Boolean(run.archived);
  // A run the server pushes: updated in place when on this page; a new run that passes the
  // filters appears at the top of the first page of the newest-first list. An older run not
  // listed that now passes them (renamed, marked lost) has a place, and a count, that only
  // the server knows (it may be counted on a later page already): the page is read again.
  const matches = (run) =>
    run.name != null
    && (!shown.q || run.name.toLowerCase().includes(shown.q.toLowerCase()))
    && (!shown.project || run.project === shown.project)
    && (!shown.job || run.job_id === shown.job)
    && (!shown.process || run.process_key === shown.process)
    && (!shown.status || run.status === shown.status)
    && !shown.health // a new run's alerts are not known here
    && (!shown.tag || (run.tags ?? []).includes(shown.tag))
    && shown.archived !== "only" // an old run archived elsewhere: not at the top of the list
    && archivedShown(run);
  // Metric columns are read again, at most every few seconds, while the page's runs step (or
  // a new run comes without them), and not while the tab is hidden.
  let metricsDue = null;
  const refreshMetrics = () => {
    // Not while a view is refused: that request would be refused again.
    if (metricsDue || document.hidden || !failure.hidden || !metricColumns(shown).length) return;
    metricsDue = setTimeout(() => { metricsDue = null; load().catch(showError); }, METRIC_REFRESH);
  };
  const apply = (summaries) => {
    let stale = false;
    for (const summary of summaries) {
      if (runs.has(summary.id)) {
        if (summary.last_step !== runs.get(summary.id).last_step) refreshMetrics();
        const run = withSummary(runs.get(summary.id), summary);
        if (archivedShown(run)) runs.set(summary.id, run);
        else { runs.delete(summary.id); selected.delete(summary.id); total -= 1; }
      } else if (shown.page === "0" && isNewestFirst() && matches(summary)) {
        const newest = runs.values().next().value;
        if (newest && summary.started_at <= newest.started_at) {
          stale = true;
          continue;
        }
        refreshMetrics(); // a pushed run has no metrics: they come with the page
        runs = new Map([[summary.id, summary], ...runs]);
        total += 1;
        if (runs.size > PAGE_SIZE) runs.delete([...runs.keys()].pop());
      }
    }
    redraw();
    if (stale) load().catch(showError);
  };

  const showError = (error) => { failure.textContent = `Could not list the runs: ${error.message}`; failure.hidden = false; };
  // The list request of a view: its filters, sort and columns, `limit` runs from `offset`.
  const requestOf = (view, limit, offset) => ({
    q: view.q, project: view.project, job: view.job, process: view.process, status: view.status, health: view.health, tag: view.tag, archived: view.archived,
    sort: view.sort, order: view.order, limit, offset, config: configKeys(view),
    metric: [...new Set(metricColumns(view).map(({ name }) => name))],
  });

  // The plot of the runs, while its panel is open: its axes are the list's columns (config
  // values and metric columns for x, metric columns for y), its runs every page of the view,
  // read again when the view or an axis changes, and at most every PLOT_REFRESH ms while the
  // runs stream.
  const area = root.querySelector("#runs-plot-area");
  const note = root.querySelector("#runs-plot-note");
  const [xSelect, ySelect] = ["px", "py"].map((name) => plotPanel.querySelector(`[name=${name}]`));
  const [logX, logY] = ["logx", "logy"].map((name) => plotPanel.querySelector(`[name=${name}]`));
  logX.checked = state.plog.includes("x");
  logY.checked = state.plog.includes("y");
  let plotted = { key: null, at: 0 }; // the last plot's request and axes, and when
  let plotting = false; // a plot on its way (another is asked for at its end when due)
  // The axes the controls show, into the view's state.
  const axesChosen = () => Object.assign(state, {
    px: xSelect.value, py: ySelect.value, plog: `${logX.checked ? "x" : ""}${logY.checked ? "y" : ""}`,
  });
  // What a plot of the view shown reads and draws: the same key, the same plot.
  const plotKey = () => JSON.stringify([requestOf(shown, PLOT_RUNS, 0), state.px, state.py, state.plog]);
  const fillAxis = (select, keys, chosen) => {
    const html = keys.map((key) => `<option value="${escapeHTML(key)}">${escapeHTML(plotAxis(key).label)}</option>`).join("");
    if (select.drawn !== html) { select.innerHTML = html; select.drawn = html; } // an open list stays
    if (select.value !== chosen) select.value = keys.includes(chosen) ? chosen : (keys[0] ?? "");
  };
  const drawPlot = async () => {
    if (!plotPanel.open || gone) return;
    const metrics = metricColumns(shown).map(({ sort }) => sort);
    fillAxis(xSelect, [...configKeys(shown).map((key) => `config:${key}`), ...metrics], state.px);
    fillAxis(ySelect, metrics, state.py);
    if (!metrics.length) {
      note.textContent = "Add metric columns (loss, min:val_loss) to plot the runs by them.";
      area.hidden = true;
      return;
    }
    axesChosen();
    keepInAddress();
    const key = plotKey();
    if (plotting || (key === plotted.key && Date.now() - plotted.at < PLOT_REFRESH)) return;
    plotting = true;
    try {
      const page = await listRuns(requestOf(shown, PLOT_RUNS, 0));
      if (gone || !plotPanel.open || plotKey() !== key) return; // another view: asked for below
      plotted = { key, at: Date.now() };
      const { drawn, diverged } = await drawRunsPlot(area, page.runs, plotAxis(xSelect.value), plotAxis(ySelect.value), { x: logX.checked, y: logY.checked });
      if (gone) return;
      area.hidden = false;
      const cut = page.total > PLOT_RUNS ? ` (the first ${PLOT_RUNS})` : "";
      const crossed = diverged ? `, ${diverged} diverged (NaN or Inf: a red cross at the top)` : "";
      note.textContent = `${drawn} of ${page.total} runs${cut}${crossed}${drawn < page.runs.length ? "; the others lack a value" : ""}`;
    } finally {
      plotting = false;
      // The view or an axis changed while it was on its way (or failed): that one now.
      if (!gone && plotKey() !== key) drawPlot().catch(plotError);
    }
  };
  const plotError = (error) => { note.textContent = `Could not plot the runs: ${error.message}`; };
  plotPanel.addEventListener("toggle", () => {
    if (plotPanel.open) drawPlot().catch(plotError);
    else { Object.assign(state, { px: "", py: "", plog: "" }); keepInAddress(); }
  });
  for (const control of [xSelect, ySelect, logX, logY]) {
    control.addEventListener("change", () => {
      axesChosen(); // before drawPlot fills the lists from the state
      drawPlot().catch(plotError);
    });
  }

  const load = async () => {
    const current = ++loads;
    setBannerScope(state.project || null);
    const query = requestOf(state, PAGE_SIZE, Number(state.page) * PAGE_SIZE || 0);
    let page, since;
    try {
      [page, since] = await live.fetchWithRuns(() => listRuns(query));
    } catch (error) {
      if (current === loads && !gone) throw error;
      return; // a later view is on its way (or the page was left): this one's failure is no news
    }
    if (current !== loads || gone) return; // a later change of the filters is on its way
    failure.hidden = true;
    shown = { ...state };
    drawPlot().catch(plotError);
    runs = new Map(page.runs.map((run) => [run.id, run]));
    total = page.total;
    drawHead();
    // The summaries pushed while the answer came: over the runs in it, and a run begun after
    // the answer was read (its first summary pushed meanwhile, and never again whole) as new.
    const newest = Math.max(-Infinity, ...page.runs.map((run) => run.started_at));
    apply(since.filter((summary) => runs.has(summary.id) || summary.started_at > newest));
  };

  // The view into the address, without a new history entry per keystroke.
  const keepInAddress = () => {
    const query = queryOf(state);
    history.replaceState(null, "", `#/${query.size ? `?${query}` : ""}`);
  };
  // A change of the view: into the address, then the page from the server.
  const change = (changes) => {
    Object.assign(state, changes);
    keepInAddress();
    load().catch(showError);
  };
  // Typing waits for a pause; every field changed meanwhile goes with it.
  let typing, typed = {};
  form.addEventListener("input", (event) => {
    clearTimeout(typing);
    const { name, value } = event.target;
    typed[name] = value.trim();
    const pause = event.target.tagName === "SELECT" ? 0 : 250;
    typing = setTimeout(() => {
      const changes = typed;
      typed = {};
      // A sort by a metric column that is no longer shown goes back to the default.
      if ("metrics" in changes && state.sort.includes(":")
        && !metricColumns({ metrics: changes.metrics }).some(({ sort }) => sort === state.sort)) {
        Object.assign(changes, { sort: DEFAULTS.sort, order: DEFAULTS.order });
      }
      change({ ...changes, page: "0" });
    }, pause);
  });
  form.addEventListener("submit", (event) => event.preventDefault());
  root.querySelector("#runs-head").addEventListener("click", (event) => {
    const key = event.target.closest("button.sort")?.dataset.sort;
    if (!key) return;
    const first = METRIC_ORDER[key.split(":")[0]] ?? (key === "name" || key === "project" || key === "host" ? "asc" : "desc");
    const order = state.sort === key ? (state.order === "desc" ? "asc" : "desc") : first;
    change({ sort: key, order, page: "0" });
  });
  root.querySelector("#prev-page").addEventListener("click", () => change({ page: String(Math.max(0, Number(state.page) - 1)) }));
  root.querySelector("#next-page").addEventListener("click", () => change({ page: String(Number(state.page) + 1) }));
  root.querySelector("#compare").addEventListener("click", () => { location.hash = comparePath([...selected]); });
  // Space ticks a checkbox; Enter does here too, as it opens a link beside it.
  body.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && event.target.matches(".select-run")) { event.preventDefault(); event.target.click(); }
  });
  body.addEventListener("change", (event) => {
    if (!event.target.matches(".select-run")) return;
    const id = event.target.closest("tr.run-row").dataset.runId;
    if (event.target.checked) selected.add(id); else selected.delete(id);
    drawCompare();
  });
  body.addEventListener("click", (event) => {
    const row = event.target.closest("tr.run-row");
    if (row && !event.target.closest("input, a, button")) location.hash = runPath(row.dataset.runId);
  });

  const offMessage = live.on((message) => {
    if (message.type === "runs") apply(message.runs);
    else if (message.type === "deleted" && runs.delete(message.run_id)) { total -= 1; selected.delete(message.run_id); redraw(); }
  });
  const offReconnect = live.onReconnect(() => load().catch(showError));
  const offAlerts = feed.on(redraw);
  const ticker = setInterval(() => {
    for (const cell of body.querySelectorAll("td.ago")) {
      cell.textContent = formatAgo(Number(cell.dataset.time) || null);
    }
  }, 5000);

  const cleanup = () => { offMessage(); offReconnect(); offAlerts(); clearInterval(ticker); clearTimeout(typing); clearTimeout(metricsDue);
    gone = true;
    window.Plotly?.purge(area);
  };
  try {
    await load();
  } catch (error) {
    cleanup();
    throw error;
  }
  return cleanup;
}
