// REST helpers for /api/v1.

export async function getJSON(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail ?? detail; } catch { /* not JSON */ }
    throw new Error(`${response.status}: ${detail}`);
  }
  return response.json();
}

export const listRuns = () => getJSON("/api/v1/runs");
export const getRun = (id) => getJSON(`/api/v1/runs/${encodeURIComponent(id)}`);

export function getSeries(id, names, maxPoints = 2000) {
  const query = new URLSearchParams({ max_points: String(maxPoints) });
  for (const name of names) query.append("name", name);
  return getJSON(`/api/v1/runs/${encodeURIComponent(id)}/series?${query}`);
}
