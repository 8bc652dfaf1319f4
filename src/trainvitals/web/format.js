// Small display helpers shared by the views.

export function escapeHTML(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;",
  })[c]);
}

// Text for plotly's labels, titles and hover text, which it reads as a subset of HTML: & < >
// escaped, and quotes as numeric entities (plotly knows no &quot;, and would show it as is).
export function plotText(value) {
  return String(value).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&#34;", "'": "&#39;" }[c]));
}

// The address of a run's page.
export function runPath(runId) {
  return `#/runs/${encodeURIComponent(runId)}`;
}

export function formatTime(seconds) {
  if (seconds == null) return "—";
  return new Date(seconds * 1000).toLocaleString();
}

export function formatAgo(seconds) {
  if (seconds == null) return "—";
  const delta = Math.max(0, Date.now() / 1000 - seconds);
  if (delta < 60) return `${Math.round(delta)} s ago`;
  if (delta < 3600) return `${Math.round(delta / 60)} min ago`;
  if (delta < 86400) return `${Math.round(delta / 3600)} h ago`;
  return `${Math.round(delta / 86400)} d ago`;
}

export function formatDuration(seconds) {
  if (seconds == null || !isFinite(seconds)) return "—";
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  const m = Math.floor(seconds / 60), s = Math.round(seconds % 60);
  if (m < 60) return `${m} min ${s} s`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

// A run deleted while a page showed it (its traces and values kept where they were drawn).
export const DELETED_BADGE = '<span class="badge deleted-badge" data-deleted>deleted</span>';

export function statusBadge(status) {
  return `<span class="badge status-${escapeHTML(status)}" data-status="${escapeHTML(status)}">${escapeHTML(status)}</span>`;
}

export function formatBytes(bytes) {
  if (bytes == null || !isFinite(bytes)) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = Math.abs(bytes), unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  const digits = unit === 0 || value >= 100 ? 0 : 1;
  return `${bytes < 0 ? "-" : ""}${value.toFixed(digits)} ${units[unit]}`;
}

// Numbers as people read them: integers whole (large ones in exponent form), others to
// `digits` significant digits.
export function formatNumber(value, digits = 4) {
  if (!isFinite(value)) return String(value);
  if (Number.isInteger(value) && Math.abs(value) < 1e15) return String(value);
  return String(Number(value.toPrecision(digits)));
}

// One statistic of a series' summary ({ step, last, min, max, nonfinite }) as text: a number,
// "NaN", "+Inf" or "−Inf" for a last value that is not finite, "—" for none.
export function summaryText(summary, stat) {
  if (stat === "last" && summary?.nonfinite) {
    return { nan: "NaN", inf: "+Inf", "-inf": "−Inf" }[summary.nonfinite] ?? summary.nonfinite;
  }
  const value = summary?.[stat];
  return value == null ? "—" : formatNumber(value);
}

// The same as HTML, a last value that is not finite marked as such.
export function summaryValue(summary, stat) {
  const text = escapeHTML(summaryText(summary, stat));
  return stat === "last" && summary?.nonfinite ? `<span class="nonfinite">${text}</span>` : text;
}

// Series names in the order a summary lists them: the model's own metrics (loss, val_loss, ...)
// first, then the vitals (grad/..., host/..., gpu0/...), each alphabetically.
export function summaryOrder(names) {
  return [...names].sort((a, b) => a.includes("/") - b.includes("/") || (a < b ? -1 : a > b ? 1 : 0));
}

// Order of worker names as the server sorts them: chief (or master) first, then by type, then
// by index, so worker:2 comes before worker:10.
export function workerOrder(a, b) {
  const key = (worker) => {
    const text = worker ?? "";
    const at = text.lastIndexOf(":");
    const kind = at < 0 ? text : text.slice(0, at);
    const index = at < 0 ? NaN : Number(text.slice(at + 1));
    return [kind === "chief" || kind === "master" ? 0 : 1, kind, Number.isInteger(index) ? index : -1];
  };
  const [ra, ka, ia] = key(a), [rb, kb, ib] = key(b);
  return ra - rb || ka.localeCompare(kb) || ia - ib || (a ?? "").localeCompare(b ?? "");
}

// The tab's title: the page, then the product.
export function setTitle(page) {
  document.title = page ? `${page} · trainvitals` : "trainvitals";
}

// A run's health (the worst alert it raised, firing or not) beside how it ended, so that a run
// that blew up never looks like a clean finish. health: the server's { worst, rules, firing }
// (docs/contract.md), absent on servers that do not report it.
export function healthBadge(health) {
  if (!health?.worst) return "";
  const rules = health.rules ?? [];
  const more = rules.length > 1 ? ` +${rules.length - 1}` : "";
  const text = rules.length ? `${health.worst}: ${rules[0]}${more}` : health.worst;
  return ` <span class="badge health sev-${escapeHTML(health.worst)}" data-health="${escapeHTML(health.worst)}"
    title="${escapeHTML(`raised: ${rules.join(", ") || health.worst}`)}">${escapeHTML(text)}</span>`;
}

export function tagList(tags) {
  if (!tags?.length) return "";
  return ` <span class="tags">${tags.map((tag) => `<span class="tag" data-tag="${escapeHTML(tag)}">${escapeHTML(tag)}</span>`).join("")}</span>`;
}
