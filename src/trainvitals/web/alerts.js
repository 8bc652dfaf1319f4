// #/alerts: alerts across runs, newest first, filtered by state, severity and project, live.
// It opens on the recent alerts of every state, each with its state: alerts close when their
// run ends, so "firing" alone said "0 alerts" right after a crash. The filters live in the
// address (#/alerts?state=firing&severity=critical), so a view can be bookmarked or shared.

import { AlertList } from "./alert-items.js";
import { listAlerts, listProjects } from "./api.js";
import { escapeHTML, setTitle } from "./format.js";

const LIMIT = 500;
// What the page shows when the address names no state (`state=` too: links made when it
// opened on the firing ones).
const DEFAULT_STATE = "";
const CHOICES = {
  state: [["", "Any state"], ["firing", "Firing"], ["resolved", "Resolved"], ["closed", "Closed at run end"]],
  severity: [["", "Any severity"], ["critical", "Critical"], ["warning", "Warning"], ["info", "Info"]],
};

const options = (choices, selected) => choices.map(([value, label]) =>
  `<option value="${escapeHTML(value)}"${value === selected ? " selected" : ""}>${escapeHTML(label)}</option>`).join("");

export async function renderAlerts(root, feed, params) {
  setTitle("Alerts");
  const filters = {
    state: params.get("state") ?? DEFAULT_STATE,
    severity: params.get("severity") ?? "",
    project: params.get("project") ?? "",
  };
  root.innerHTML = `
    <div class="page-head"><h1>Alerts</h1><span class="muted" id="alert-count"></span></div>
    <form class="filters" id="alert-filters" aria-label="Filter alerts">
      <label>State <select name="state">${options(CHOICES.state, filters.state)}</select></label>
      <label>Severity <select name="severity">${options(CHOICES.severity, filters.severity)}</select></label>
      <label>Project <select name="project">${options([["", "Any project"]], filters.project)}</select></label>
    </form>
    <p class="error" id="alert-error" role="alert" hidden></p>
    <div class="alert-list" id="alert-list"><p class="muted">Loading…</p></div>`;
  const form = root.querySelector("#alert-filters");

  const matches = (alert) => (!filters.state || alert.state === filters.state)
    && (!filters.severity || alert.severity === filters.severity)
    && (!filters.project || alert.project === filters.project);
  const list = new AlertList(root.querySelector("#alert-list"), {
    filter: matches, limit: LIMIT, empty: "No alerts match these filters.",
    onRender: (shown) => {
      root.querySelector("#alert-count").textContent =
        `${shown.length}${shown.length === LIMIT ? "+" : ""} alert${shown.length === 1 ? "" : "s"}`;
    },
  });

  // Live updates that arrive while a list loads are merged into it by version.
  let loading = 0;
  let received = null;
  const load = async () => {
    const current = ++loading;
    received = [];
    const { alerts } = await listAlerts({ ...filters, limit: LIMIT });
    if (current !== loading) return; // the filters changed meanwhile
    list.replace([...alerts, ...received]);
    received = null;
  };

  const fillProjects = async () => {
    const answer = await listProjects();
    const projects = [...new Set([...answer.projects, filters.project].filter(Boolean))].sort();
    form.elements.project.innerHTML = options([["", "Any project"], ...projects.map((p) => [p, p])], filters.project);
  };

  const error = root.querySelector("#alert-error");
  form.addEventListener("change", () => {
    for (const key of Object.keys(filters)) filters[key] = form.elements[key].value;
    // Every choice but the defaults: a reload or a shared link shows the same list.
    const query = new URLSearchParams(Object.entries(filters).filter(([, value]) => value));
    history.replaceState(null, "", `#/alerts${query.size ? `?${query}` : ""}`); // no hashchange: no re-render
    error.hidden = true;
    load().catch((failure) => {
      error.textContent = `Could not load the alerts: ${failure.message}`;
      error.hidden = false;
    });
  });

  // A null update: the feed reloaded after a reconnect, and so does this list.
  const offAlerts = feed.on((alert) => {
    if (!alert) { load(); return; }
    received?.push(alert);
    list.upsert(alert);
  });

  const cleanup = () => { offAlerts(); list.destroy(); };
  try {
    await Promise.all([load(), fillProjects()]);
  } catch (error) {
    cleanup();
    throw error;
  }
  return cleanup;
}
