// REST helpers for /api/v1.

async function request(path, init = {}) {
  const response = await fetch(path, { ...init, headers: { Accept: "application/json", ...init.headers } });
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail ?? detail; } catch { /* not JSON */ }
    // FastAPI's validation errors, made one line as the Python client does: "query.metric.0: ..."
    if (Array.isArray(detail)) detail = detail.map((d) => `${(d?.loc ?? []).join(".")}: ${d?.msg ?? ""}`).join("; ");
    else if (typeof detail !== "string") detail = JSON.stringify(detail);
    const error = new Error(`${response.status}: ${detail}`);
    error.status = response.status;
    throw error;
  }
  return response.json();
}

const getJSON = (path) => request(path);

const sendJSON = (method, path, body) => request(path, {
  method, headers: { "Content-Type": "application/json" }, body: body === undefined ? undefined : JSON.stringify(body),
});

const postJSON = (path, body) => sendJSON("POST", path, body);

// filters: { q, project, status, tag, archived, sort, order, limit, offset, config: [key, ...],
// metric: [series, ...] };
// empty ones are left out. Returns { runs, total }.
export function listRuns(filters = {}) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(filters)) {
    for (const one of Array.isArray(value) ? value : [value]) if (one != null && one !== "") query.append(key, String(one));
  }
  return getJSON(`/api/v1/runs${query.size ? `?${query}` : ""}`);
}

// Every project with a run that the page may see, sorted: { projects: [name, ...] }.
export const listProjects = () => getJSON("/api/v1/projects");

// changes: any of { name, tags, notes, archived }. Returns the run's summary.
export const editRun = (id, changes) => sendJSON("PATCH", `/api/v1/runs/${encodeURIComponent(id)}`, changes);
export const deleteRun = (id) => sendJSON("DELETE", `/api/v1/runs/${encodeURIComponent(id)}`);
export const getRun = (id) => getJSON(`/api/v1/runs/${encodeURIComponent(id)}`);

// The query of a run's series: these names, only the steps of range ({ min, max },
// inclusive) when given, and the other parameters as they are.
function seriesQuery(names, range, params) {
  const query = new URLSearchParams(params);
  for (const name of names) query.append("name", name);
  if (range) {
    query.set("min_step", String(Math.floor(range.min)));
    query.set("max_step", String(Math.ceil(range.max)));
  }
  return query;
}

// range: { min, max } steps (inclusive) to read only those, at full detail up to maxPoints.
export function getSeries(id, names, maxPoints = 2000, range = null) {
  const query = seriesQuery(names, range, { max_points: String(maxPoints) });
  return getJSON(`/api/v1/runs/${encodeURIComponent(id)}/series?${query}`);
}

// The address of every point of these series (of range's steps only, when given) as a file
// the server streams: format "csv" or "jsonl", named filename.<format>. No cap and no
// downsampling; a link to it is followed with the session cookie like any request of the page.
export function exportPath(id, names, format, range = null, filename = null) {
  return `/api/v1/runs/${encodeURIComponent(id)}/export?${exportQuery(names, format, range, filename)}`;
}

// The same for several runs in one file, each row with its run's id and name (a series one
// run lacks is left out of it).
export function exportRunsPath(ids, names, format, range = null, filename = null) {
  const query = exportQuery(names, format, range, filename);
  for (const id of ids) query.append("run", id);
  return `/api/v1/export?${query}`;
}

// Follows an export's address as a download (the server names the file).
export function download(path) {
  const link = document.createElement("a");
  link.href = path;
  link.download = "";
  document.body.appendChild(link);
  link.click();
  link.remove();
}

function exportQuery(names, format, range, filename) {
  const params = { format };
  // The server takes plain ASCII names (it puts them in a header).
  if (filename) params.filename = filename.replace(/[^\w.-]+/g, "_").replace(/^\./, "_").slice(0, 128);
  return seriesQuery(names, range, params);
}

export const getRunAlerts = (id) => getJSON(`/api/v1/runs/${encodeURIComponent(id)}/alerts`);

// filters: { state, severity, project, limit }; empty ones are left out.
export function listAlerts(filters = {}) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(filters)) if (value != null && value !== "") query.set(key, String(value));
  return getJSON(`/api/v1/alerts${query.size ? `?${query}` : ""}`);
}

export const acknowledgeAlert = (id, by = null) =>
  postJSON(`/api/v1/alerts/${encodeURIComponent(id)}/ack`, { by });

// Returns { alert, silence }.
export const silenceAlert = (id, durationS) =>
  postJSON(`/api/v1/alerts/${encodeURIComponent(id)}/silence`, { duration_s: durationS });

// An admin's tokens (never their secrets): { tokens: [{ id, name, project, role, created_at,
// revoked_at, last_used_at, current }], total, live, revoked, tried_after_revoke }, as `query`
// ({ revoked: "hide" | "only", order: "newest" | "revoked", limit, offset }, any of them) asks; a new
// one's answer holds `token`, the only time it is shown.
export const listTokens = (query = {}) => getJSON(`/api/v1/tokens${query && Object.keys(query).length ? `?${new URLSearchParams(query)}` : ""}`);
export const createToken = ({ name, project, role }) => postJSON("/api/v1/tokens", { name, project, role });
export const revokeToken = (id) => sendJSON("DELETE", `/api/v1/tokens/${encodeURIComponent(id)}`);

// Who the page speaks for; a 401 means nobody yet (the server needs a token).
export const whoami = () => getJSON("/api/v1/session");
export const signIn = (token) => postJSON("/api/v1/session", { token });
export const signOut = () => request("/api/v1/session", { method: "DELETE" });
