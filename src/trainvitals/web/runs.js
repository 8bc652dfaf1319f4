// The runs list: one page of runs, searched, filtered and sorted by the server, with each
// run's health and firing alerts, updated live. The view's state is in the address
// (runs-view.js), so a filtered list can be shared and survives a reload.

import { mostUrgentFirst } from "./alert-feed.js";
import { listRuns } from "./api.js";
import { setBannerScope } from "./banner.js";
import { comparePath } from "./compare.js";
import { escapeHTML, formatAgo, formatDuration, formatTime, healthBadge, runPath, setTitle, statusBadge, summaryValue, tagList, workerOrder } from "./format.js";
import { withSummary } from "./live.js";
import { syncCells, syncRows } from "./rows.js";
import { RUNS_PLOT_PANEL, RunsPlotPanel } from "./runs-plot.js";
import { DEFAULTS, METRIC_ORDER, archivedShown, configKeys, matches, metricColumns, queryOf, requestOf, stateOf } from "./runs-view.js";

const PAGE_SIZE = 50;
const STATUSES = ["running", "stalled", "finished", "crashed", "lost"];
// [sort key, heading, class]: every column the server sorts by. "wide-only" columns give way
// on a phone, so that a run's name, how it ended and its health fit the screen.
const COLUMNS = [
  ["name", "Name", ""], ["project", "Project", "wide-only"], ["status", "Status", ""],
  ["started_at", "Started", "wide-only"], ["last_step", "Last step", "num wide-only"],
  ["last_seen", "Last seen", ""], ["host", "Host", "wide-only"],
];
// How often, at most, metric columns are read again while the runs on the page stream (ms).
const METRIC_REFRESH = 5000;

const LAYOUT = `
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
  ${RUNS_PLOT_PANEL}
  <div class="table-scroll"><table class="runs-table">
    <thead><tr id="runs-head"></tr></thead>
    <tbody id="runs-body"><tr><td class="muted">Loading…</td></tr></tbody>
  </table></div>
  <nav class="pager" aria-label="Pages of runs">
    <button type="button" id="prev-page">← Newer</button>
    <span id="page-range" class="muted"></span>
    <button type="button" id="next-page">Older →</button>
  </nav>`;

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

function metricCell(summary, { stat, name }) {
  if (!summary) return `<td class="num metric-cell muted">—</td>`;
  const shown = summaryValue(summary, stat, name);
  const title = stat === "last" ? `at step ${summary.step}` : `${stat} of the finite values; last step ${summary.step}`;
  return `<td class="num metric-cell" title="${escapeHTML(title)}">${shown}</td>`;
}

// The runs list, live: load() draws it and reads its first page, then follows the websocket
// and the alert feed; destroy() stops.
export class RunsPage {
  // params: the address's query (the view: runs-view.js stateOf).
  constructor(root, live, feed, params = new URLSearchParams()) {
    Object.assign(this, { root, live, feed });
    this.state = stateOf(params); // the view asked for, kept in the address
    // The view the list shows: the last one the server gave (a refused one changes nothing).
    this.shown = { ...this.state };
    this.runs = new Map(); // this page's runs, in the server's order
    this.total = 0;
    this.firing = new Map(); // run id -> its firing alerts
    this.selected = new Set(); // the runs ticked to compare
    // The rows drawn, by key ("run:<id>", "job:<id>", "process:<key>"): updated in place at each push.
    this.drawn = new Map();
    this.loads = 0;
    this.metricsDue = null; // the metric columns' next read, while the runs step
    this.typing = null; // the view typed, applied after a pause
    this.typed = {};
    this.gone = false; // the page was left: nothing more is drawn, nor put in the address
    this.off = [];
    this.ticker = null;
    this.plot = null;
  }

  async load() {
    setTitle("Runs");
    this.root.innerHTML = LAYOUT;
    this.body = this.root.querySelector("#runs-body");
    // A view the server refused (or could not give) is said above the list, which keeps the
    // runs it showed, still live, until a view is given.
    this.failure = this.root.querySelector("#runs-error");
    const form = this.root.querySelector("form");
    for (const key of ["q", "project", "status", "health", "tag", "archived", "cols", "metrics"]) form.elements[key].value = this.state[key];
    this.plot = new RunsPlotPanel(this.root.querySelector("#runs-plot"), this);
    this.listen(form);
    await this.read();
  }

  destroy() {
    for (const off of this.off) off();
    clearInterval(this.ticker);
    clearTimeout(this.typing);
    clearTimeout(this.metricsDue);
    this.gone = true;
    this.plot?.destroy();
  }

  span() { return COLUMNS.length + 3 + configKeys(this.shown).length + metricColumns(this.shown).length; }

  isNewestFirst() { return this.shown.sort === "started_at" && this.shown.order === "desc"; }

  sortHeading(key, label, cls, extra = "") {
    const { shown } = this;
    const sorted = shown.sort === key ? (shown.order === "asc" ? "ascending" : "descending") : "none";
    const arrow = sorted === "ascending" ? " ▲" : sorted === "descending" ? " ▼" : "";
    return `<th class="${cls}" aria-sort="${sorted}"${extra}><button type="button" class="sort" data-sort="${escapeHTML(key)}">${escapeHTML(label)}${arrow}</button></th>`;
  }

  drawHead() {
    const headings = COLUMNS.map(([key, label, cls]) => this.sortHeading(key, label, cls));
    // How long each ran (to its end, or to now), after its last step; the server sorts by none.
    headings.splice(COLUMNS.findIndex(([key]) => key === "last_step") + 1, 0, '<th class="num wide-only">Duration</th>');
    const config = configKeys(this.shown).map((key) => `<th data-config-column="${escapeHTML(key)}">${escapeHTML(key)}</th>`);
    const metrics = metricColumns(this.shown).map(({ stat, name, sort }) =>
      this.sortHeading(sort, stat === "last" ? name : `${name} (${stat})`, "num", ` data-metric-column="${escapeHTML(sort)}"`));
    const head = this.root.querySelector("#runs-head");
    const html = `<th><span class="visually-hidden">Select</span></th>${headings.join("")}${config.join("")}${metrics.join("")}`;
    if (head.drawn !== html) { head.innerHTML = html; head.drawn = html; } // a focused heading stays
  }

  rowFor(key, make) {
    let row = this.drawn.get(key);
    if (!row) { row = make(); this.drawn.set(key, row); }
    return row;
  }

  runCells(run) {
    const worker = run.worker ? ` <span class="worker-tag" data-worker="${escapeHTML(run.worker)}">${escapeHTML(run.worker)}</span>` : "";
    const notes = run.notes ? ` <span class="notes-mark" title="${escapeHTML(run.notes)}" aria-label="has notes">✎</span>` : "";
    const config = configKeys(this.shown).map((key) => `<td class="config-cell" data-config="${escapeHTML(key)}">${escapeHTML(configValue(run.config?.[key]))}</td>`);
    const metrics = metricColumns(this.shown).map((column) => metricCell(run.metrics?.[column.name], column));
    return [
      // Whether it is ticked is the box's own state, kept in step with `selected`.
      `<td><input type="checkbox" class="select-run" aria-label="${escapeHTML(`select ${run.name}`)}"></td>`,
      `<td><a href="${escapeHTML(runPath(run.id))}">${escapeHTML(run.name)}</a>${worker}${notes}${tagList(run.tags)}</td>`,
      `<td class="wide-only">${escapeHTML(run.project)}</td>`,
      `<td>${statusBadge(run.status)}${healthBadge(run.health)}${firingBadge(this.firing.get(run.id))}</td>`,
      `<td class="wide-only">${escapeHTML(formatTime(run.started_at))}</td>`,
      `<td class="num last-step wide-only">${escapeHTML(run.last_step ?? "—")}</td>`,
      `<td class="num duration wide-only">${escapeHTML(formatDuration((run.ended_at ?? run.last_seen) - run.started_at))}</td>`,
      `<td class="ago" data-time="${escapeHTML(run.last_seen)}">${escapeHTML(formatAgo(run.last_seen))}</td>`,
      `<td class="wide-only">${escapeHTML(run.host)}</td>`,
      ...config,
      ...metrics,
    ];
  }

  // `kind`: the kind of group whose heading the row is listed under, if any.
  runRow(run, kind = null) {
    const row = this.rowFor(`run:${run.id}`, () => {
      const made = document.createElement("tr");
      made.dataset.runId = run.id;
      return made;
    });
    row.className = kind ? `run-row group-member ${kind}-member` : "run-row";
    row.classList.toggle("archived", Boolean(run.archived));
    syncCells(row, this.runCells(run));
    const box = row.querySelector(".select-run");
    if (box.checked !== this.selected.has(run.id)) box.checked = this.selected.has(run.id);
    return row;
  }

  // A group's link lists its runs alone (the job= or process= filter), or every run again.
  groupLink(kind, id) {
    const alone = this.shown[kind] === id;
    const query = queryOf({ ...this.shown, job: "", process: "", page: "0", ...(alone ? {} : { [kind]: id }) });
    return `<a class="group-filter" href="#/${query.size ? `?${escapeHTML(query)}` : ""}">${alone ? "every run" : "only these"}</a>`;
  }

  groupRow(group) {
    const row = this.rowFor(`${group.kind}:${group.id}`, () => {
      const made = document.createElement("tr");
      made.className = `group-row ${group.kind}-row`;
      made.dataset[group.kind === "job" ? "jobId" : "processKey"] = group.id;
      return made;
    });
    syncCells(row, groupCells(group, this.groupLink(group.kind, group.id), this.span()));
    return row;
  }

  drawCompare() {
    const button = this.root.querySelector("#compare");
    const { size } = this.selected;
    button.disabled = size < 1;
    button.textContent = size ? `Compare ${size} selected` : "Compare selected";
  }

  // Where the keyboard is in a run's row (its checkbox or its link), to be given back once the
  // rows are in order: a row moved (a new run above it, a job regrouped) loses the focus.
  focusInRow() {
    const at = document.activeElement;
    const row = this.body.contains(at) ? at.closest("tr.run-row") : null;
    return row && { id: row.dataset.runId, control: at.matches(".select-run") ? ".select-run" : "a" };
  }

  redraw() {
    const { body, root, shown, total } = this;
    const focus = this.focusInRow();
    this.firing = new Map();
    for (const alert of this.feed.firing()) this.firing.set(alert.run_id, [...(this.firing.get(alert.run_id) ?? []), alert]);
    const ordered = [...this.runs.values()];
    if (!ordered.length) {
      this.drawn = new Map();
      const looks = { page: "0", sort: DEFAULTS.sort, order: DEFAULTS.order, cols: "", metrics: DEFAULTS.metrics, px: "", py: "", plog: "" };
      const filtered = queryOf({ ...shown, ...looks }).size;
      body.innerHTML = filtered
        ? `<tr><td colspan="${this.span()}" class="empty">No runs match. <a href="#/">Show every run</a></td></tr>`
        : `<tr><td colspan="${this.span()}" class="empty">No runs yet. Add
          <code>trainvitals.VitalsCallback()</code> to <code>model.fit</code>, or run
          <code>trainvitals demo</code>.</td></tr>`;
    } else {
      const rows = this.isNewestFirst()
        ? grouped(ordered).flatMap((group) => [
          ...(group.kind ? [this.groupRow(group)] : []), ...group.members.map((run) => this.runRow(run, group.kind))])
        : ordered.map((run) => this.runRow(run));
      const kept = new Set(rows);
      for (const [key, row] of this.drawn) if (!kept.has(row)) this.drawn.delete(key);
      syncRows(body, rows);
    }
    if (focus) body.querySelector(`tr.run-row[data-run-id="${CSS.escape(focus.id)}"] ${focus.control}`)?.focus();
    const first = Number(shown.page) * PAGE_SIZE;
    root.querySelector("#run-count").textContent = `${total} run${total === 1 ? "" : "s"}`;
    root.querySelector("#run-count").dataset.total = String(total);
    root.querySelector("#page-range").textContent = total ? `${first + 1}–${first + ordered.length} of ${total}` : "";
    root.querySelector("#prev-page").disabled = first === 0;
    root.querySelector("#next-page").disabled = first + ordered.length >= total;
    this.drawCompare();
  }

  // Metric columns are read again, at most every few seconds, while the page's runs step (or
  // a new run comes without them), and not while the tab is hidden.
  refreshMetrics() {
    // Not while a view is refused: that request would be refused again.
    if (this.metricsDue || document.hidden || !this.failure.hidden || !metricColumns(this.shown).length) return;
    this.metricsDue = setTimeout(() => { this.metricsDue = null; this.reread(); }, METRIC_REFRESH);
  }

  // Runs the server pushes: updated in place when on this page; a new run that passes the
  // filters appears at the top of the first page of the newest-first list. An older run not
  // listed that now passes them (renamed, marked lost) has a place, and a count, that only
  // the server knows (it may be counted on a later page already): the page is read again.
  apply(summaries) {
    let stale = false;
    for (const summary of summaries) {
      if (this.runs.has(summary.id)) {
        if (summary.last_step !== this.runs.get(summary.id).last_step) this.refreshMetrics();
        const run = withSummary(this.runs.get(summary.id), summary);
        if (archivedShown(this.shown, run)) this.runs.set(summary.id, run);
        else { this.runs.delete(summary.id); this.selected.delete(summary.id); this.total -= 1; }
      } else if (this.shown.page === "0" && this.isNewestFirst() && matches(this.shown, summary)) {
        const newest = this.runs.values().next().value;
        if (newest && summary.started_at <= newest.started_at) {
          stale = true;
          continue;
        }
        this.refreshMetrics(); // a pushed run has no metrics: they come with the page
        this.runs = new Map([[summary.id, summary], ...this.runs]);
        this.total += 1;
        if (this.runs.size > PAGE_SIZE) this.runs.delete([...this.runs.keys()].pop());
      }
    }
    this.redraw();
    if (stale) this.reread();
  }

  showError(error) {
    this.failure.textContent = `Could not list the runs: ${error.message}`;
    this.failure.hidden = false;
  }

  // The page of the view asked for, from the server, with the summaries pushed meanwhile.
  async read() {
    const current = ++this.loads;
    setBannerScope(this.state.project || null);
    const query = requestOf(this.state, PAGE_SIZE, Number(this.state.page) * PAGE_SIZE || 0);
    let page, since;
    try {
      [page, since] = await this.live.fetchWithRuns(() => listRuns(query));
    } catch (error) {
      if (current === this.loads && !this.gone) throw error;
      return; // a later view is on its way (or the page was left): this one's failure is no news
    }
    if (current !== this.loads || this.gone) return; // a later change of the filters is on its way
    this.failure.hidden = true;
    this.shown = { ...this.state };
    this.plot.refresh();
    this.runs = new Map(page.runs.map((run) => [run.id, run]));
    this.total = page.total;
    this.drawHead();
    // The summaries pushed while the answer came: over the runs in it, and a run begun after
    // the answer was read (its first summary pushed meanwhile, and never again whole) as new.
    const newest = Math.max(-Infinity, ...page.runs.map((run) => run.started_at));
    this.apply(since.filter((summary) => this.runs.has(summary.id) || summary.started_at > newest));
  }

  // read(), its failure said above the list.
  reread() { this.read().catch((error) => this.showError(error)); }

  // The view into the address, without a new history entry per keystroke.
  keepInAddress() {
    const query = queryOf(this.state);
    history.replaceState(null, "", `#/${query.size ? `?${query}` : ""}`);
  }

  // A change of the view: into the address, then the page from the server.
  change(changes) {
    Object.assign(this.state, changes);
    this.keepInAddress();
    this.reread();
  }

  // The filters, headings, pager and rows answer people; the live stream and the alert feed
  // update the rows.
  listen(form) {
    const { root, body, live } = this;
    // Typing waits for a pause; every field changed meanwhile goes with it.
    form.addEventListener("input", (event) => {
      clearTimeout(this.typing);
      const { name, value } = event.target;
      this.typed[name] = value.trim();
      const pause = event.target.tagName === "SELECT" ? 0 : 250;
      this.typing = setTimeout(() => {
        const changes = this.typed;
        this.typed = {};
        // A sort by a metric column that is no longer shown goes back to the default.
        if ("metrics" in changes && this.state.sort.includes(":")
          && !metricColumns({ metrics: changes.metrics }).some(({ sort }) => sort === this.state.sort)) {
          Object.assign(changes, { sort: DEFAULTS.sort, order: DEFAULTS.order });
        }
        this.change({ ...changes, page: "0" });
      }, pause);
    });
    form.addEventListener("submit", (event) => event.preventDefault());
    root.querySelector("#runs-head").addEventListener("click", (event) => {
      const key = event.target.closest("button.sort")?.dataset.sort;
      if (!key) return;
      const first = METRIC_ORDER[key.split(":")[0]] ?? (key === "name" || key === "project" || key === "host" ? "asc" : "desc");
      const order = this.state.sort === key ? (this.state.order === "desc" ? "asc" : "desc") : first;
      this.change({ sort: key, order, page: "0" });
    });
    root.querySelector("#prev-page").addEventListener("click", () => this.change({ page: String(Math.max(0, Number(this.state.page) - 1)) }));
    root.querySelector("#next-page").addEventListener("click", () => this.change({ page: String(Number(this.state.page) + 1) }));
    root.querySelector("#compare").addEventListener("click", () => { location.hash = comparePath([...this.selected]); });
    // Space ticks a checkbox; Enter does here too, as it opens a link beside it.
    body.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && event.target.matches(".select-run")) { event.preventDefault(); event.target.click(); }
    });
    body.addEventListener("change", (event) => {
      if (!event.target.matches(".select-run")) return;
      const id = event.target.closest("tr.run-row").dataset.runId;
      if (event.target.checked) this.selected.add(id); else this.selected.delete(id);
      this.drawCompare();
    });
    body.addEventListener("click", (event) => {
      const row = event.target.closest("tr.run-row");
      if (row && !event.target.closest("input, a, button")) location.hash = runPath(row.dataset.runId);
    });
    this.off.push(live.on((message) => {
      if (message.type === "runs") this.apply(message.runs);
      else if (message.type === "deleted" && this.runs.delete(message.run_id)) {
        this.total -= 1;
        this.selected.delete(message.run_id);
        this.redraw();
      }
    }));
    this.off.push(live.onReconnect(() => this.reread()));
    this.off.push(this.feed.on(() => this.redraw()));
    this.ticker = setInterval(() => {
      for (const cell of body.querySelectorAll("td.ago")) {
        cell.textContent = formatAgo(Number(cell.dataset.time) || null);
      }
    }, 5000);
  }
}
