// A run's facts as tables: its configuration and environment (keys and values, nested
// objects as tables of their own, sizes in binary units), and the readings last stored before
// it ended.

import { escapeHTML, formatBytes, formatNumber } from "./format.js";
import { HOST_LIMIT, HOST_RSS, HOST_WORKING_SET, isBytes, unitOf } from "./series.js";

// Keys and values as table rows; a nested object (the environment's host) as a table in its
// cell, and sizes (a key of memory or bytes) in binary units, the bytes in the cell's title.
export function kvRows(object) {
  return Object.entries(object ?? {}).map(([k, v]) => `<tr><th>${escapeHTML(k)}</th>${kvCell(k, v)}</tr>`).join("")
    || `<tr><td class="muted">none</td></tr>`;
}

const SIZE_KEY = /memory|bytes/i;

function kvCell(key, value) {
  if (value && typeof value === "object" && !Array.isArray(value) && Object.keys(value).length) {
    return `<td><table class="kv kv-nested">${kvRows(value)}</table></td>`;
  }
  if (typeof value === "number" && SIZE_KEY.test(key)) {
    return `<td data-bytes="${escapeHTML(value)}" title="${escapeHTML(value)} bytes">${escapeHTML(formatBytes(value))}</td>`;
  }
  // A long list (the model's variable_order: one path a variable) folds behind its count.
  if (Array.isArray(value) && value.length > LONG_LIST) {
    return `<td><details><summary>${value.length} items</summary><code class="kv-list">${escapeHTML(value.join("\n"))}</code></details></td>`;
  }
  return `<td>${escapeHTML(typeof value === "object" ? JSON.stringify(value) : value)}</td>`;
}

const LONG_LIST = 8;

// The memory and GPU readings last stored before the run ended: the evidence of how it died.
function reading(name, value) {
  if (isBytes(name)) return formatBytes(value);
  const unit = unitOf(name);
  return formatNumber(value) + (unit ? ` ${unit}` : "");
}

export function lastReadings(readings) {
  const names = Object.keys(readings ?? {}).sort();
  if (!names.length) return "";
  // The cgroup's working set is what the kernel kills by; the RSS only where there is none.
  const [used, what] = readings[HOST_WORKING_SET] != null ? [HOST_WORKING_SET, "working set"] : [HOST_RSS, "RSS"];
  const memory = readings[used] != null && readings[HOST_LIMIT] > 0
    ? ` (${what} at ${Math.round((100 * readings[used]) / readings[HOST_LIMIT])}% of the limit)` : "";
  const rows = names.map((name) => `<tr><th>${escapeHTML(name)}</th>
    <td data-reading="${escapeHTML(name)}">${escapeHTML(reading(name, readings[name]))}</td></tr>`).join("");
  return `<details class="last-readings" open><summary>Last readings before the end${escapeHTML(memory)}</summary>
    <table class="kv">${rows}</table></details>`;
}
