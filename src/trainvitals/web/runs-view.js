// The runs list's view: its state as the address keeps it (#/?q=...&status=...&sort=...), so a
// filtered list can be shared and survives a reload; the config and metric columns it shows;
// the list request it makes of the server; and which pushed runs belong in it.

// The metric columns shown unless the address says otherwise (metrics= for none): the last
// loss and the best validation loss, as W&B's table opens with the runs' summary metrics.
const DEFAULT_METRICS = "loss, min:val_loss";
export const DEFAULTS = { q: "", project: "", job: "", process: "", status: "", health: "", tag: "", archived: "hide", sort: "started_at", order: "desc", page: "0", cols: "", metrics: DEFAULT_METRICS, px: "", py: "", plog: "" };
// A series' statistics a metric column shows, each sorted first in the order that puts the
// best runs of a loss (last, min) or of an accuracy (max) on top.
export const METRIC_ORDER = { last: "asc", min: "asc", max: "desc" };

// The view's state from the address's query, with the defaults filled in.
export function stateOf(params) {
  const state = { ...DEFAULTS };
  for (const key of Object.keys(DEFAULTS)) if (params.get(key) != null) state[key] = params.get(key);
  return state;
}

// The address's query of a state: what differs from the defaults.
export function queryOf(state) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(state)) if (value !== DEFAULTS[key]) query.set(key, value);
  return query;
}

const listed = (text) => text.split(",").map((key) => key.trim()).filter(Boolean).slice(0, 20);
export const configKeys = (state) => listed(state.cols);

// The metric columns of the view: "val_loss" shows a series' last value, "min:val_loss" and
// "max:val_loss" its least and greatest; each is also the server's sort key for it.
export function metricColumns(state) {
  return listed(state.metrics).map((text) => {
    const at = text.indexOf(":");
    const stat = at > 0 ? text.slice(0, at) : "";
    return stat in METRIC_ORDER && at < text.length - 1
      ? { stat, name: text.slice(at + 1), sort: text }
      : { stat: "last", name: text, sort: `last:${text}` };
  });
}

// The list request of a view: its filters, sort and columns, `limit` runs from `offset`.
export function requestOf(view, limit, offset) {
  return {
    q: view.q, project: view.project, job: view.job, process: view.process, status: view.status, health: view.health, tag: view.tag, archived: view.archived,
    sort: view.sort, order: view.order, limit, offset, config: configKeys(view),
    metric: [...new Set(metricColumns(view).map(({ name }) => name))],
  };
}

// Whether the archived filter still shows a run of the list (archived or back elsewhere).
export function archivedShown(view, run) {
  return view.archived === "include" || (view.archived === "only") === Boolean(run.archived);
}

// Whether a run the server pushes, not listed yet, passes the view's filters: a new run that
// does appears at the top of the first page of the newest-first list.
export function matches(view, run) {
  return run.name != null
    && (!view.q || run.name.toLowerCase().includes(view.q.toLowerCase()))
    && (!view.project || run.project === view.project)
    && (!view.job || run.job_id === view.job)
    && (!view.process || run.process_key === view.process)
    && (!view.status || run.status === view.status)
    && !view.health // a new run's alerts are not known here
    && (!view.tag || (run.tags ?? []).includes(view.tag))
    && view.archived !== "only" // an old run archived elsewhere: not at the top of the list
    && archivedShown(view, run);
}
