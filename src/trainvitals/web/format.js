// Small display helpers shared by the views, and the one number format of the dashboard:
// bytes in binary units, numbers far from 1 in scientific notation, ticks that say their value.

import { isBytes } from "./series.js";

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

// Bytes in binary units, as alerts write them (detect/text.py size): "1.5 GiB", "812 MiB".
export const BYTE_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

// The binary unit that bytes up to `top` read best in: [its name, its size in bytes].
export function byteUnit(top) {
  let unit = 0;
  while (Math.abs(top) >= 1024 ** (unit + 1) && unit < BYTE_UNITS.length - 1) unit += 1;
  return [BYTE_UNITS[unit], 1024 ** unit];
}

export function formatBytes(bytes) {
  if (bytes == null || !isFinite(bytes)) return "—";
  const [unit, scale] = byteUnit(bytes);
  const value = Math.abs(bytes) / scale;
  const digits = scale === 1 || value >= 100 ? 0 : value >= 10 ? 1 : 2;
  return `${bytes < 0 ? "-" : ""}${Number(value.toFixed(digits))} ${unit}`;
}

// Numbers as people read them: integers whole, others to `digits` significant digits; far
// from 1 (1e15 and up, under 1e-4) in scientific notation, "1.5e17" (not eighteen digits, nor
// plotly's "150P"), as the alerts write ratios.
export function formatNumber(value, digits = 4) {
  if (!isFinite(value)) return String(value);
  const size = Math.abs(value);
  if (Number.isInteger(value) && size < 1e15) return String(value);
  if (size !== 0 && (size >= 1e15 || size < 1e-4)) return scientific(value, digits);
  return String(Number(value.toPrecision(digits)));
}

function scientific(value, digits) {
  const [mantissa, exponent] = value.toExponential(Math.max(0, digits - 1)).split("e");
  return Number(exponent) ? `${Number(mantissa)}e${Number(exponent)}` : String(Number(mantissa));
}

// An axis' ticks: each value itself, short (0.001, 250000, 1.5e12), never an SI prefix ("1.5T"
// reads as a size, not a loss); all in scientific notation when one needs it (9e-4, 1e-3,
// 1.1e-3, not 9e-4, 0.001, 0.0011).
export function formatTicks(values) {
  const far = values.some((value) => value !== 0 && (Math.abs(value) >= 1e6 || Math.abs(value) < 1e-3));
  return values.map((value) => (far && value !== 0 ? scientific(value, 3) : String(Number(value.toPrecision(6)))));
}

// How many times: "4.2x", "37x"; far from 1, "1.5e17x" (detect/text.py ratio).
export function formatRatio(x) {
  if (!isFinite(x)) return `${x}x`;
  const size = Math.abs(x);
  if (x === 0 || (size >= 0.01 && size < 10000)) return `${x.toFixed(size < 10 ? 1 : 0)}x`;
  return `${scientific(x, 2)}x`;
}

// One statistic of series `name`'s summary ({ step, last, min, max, nonfinite }) as text: a
// number (bytes in binary units), "NaN", "+Inf" or "−Inf" for a last value that is not finite,
// "—" for none.
export function summaryText(summary, stat, name = "") {
  if (stat === "last" && summary?.nonfinite) {
    return { nan: "NaN", inf: "+Inf", "-inf": "−Inf" }[summary.nonfinite] ?? summary.nonfinite;
  }
  const value = summary?.[stat];
  if (value == null) return "—";
  return isBytes(name) ? formatBytes(value) : formatNumber(value);
}

// The same as HTML, a last value that is not finite marked as such.
export function summaryValue(summary, stat, name = "") {
  const text = escapeHTML(summaryText(summary, stat, name));
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
// (docs/contract.md), absent on servers that do not report it. Where the server says none of
// them fires now (a stall that resolved, in a run that then finished), the badge is outlined:
// raised once, over now, not a red alarm.
export function healthBadge(health) {
  if (!health?.worst) return "";
  const rules = health.rules ?? [];
  const more = rules.length > 1 ? ` +${rules.length - 1}` : "";
  const text = rules.length ? `${health.worst}: ${rules[0]}${more}` : health.worst;
  const past = Array.isArray(health.firing) && !health.firing.length;
  const title = `raised: ${rules.join(", ") || health.worst}${past ? " (none firing now)" : ""}`;
  return ` <span class="badge health sev-${escapeHTML(health.worst)}${past ? " past" : ""}" data-health="${escapeHTML(health.worst)}"
    title="${escapeHTML(title)}">${escapeHTML(text)}</span>`;
}

export function tagList(tags) {
  if (!tags?.length) return "";
  return ` <span class="tags">${tags.map((tag) => `<span class="tag" data-tag="${escapeHTML(tag)}">${escapeHTML(tag)}</span>`).join("")}</span>`;
}
