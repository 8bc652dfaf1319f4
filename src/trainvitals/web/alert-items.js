// How an alert is drawn: a full item (state, rule, step, time, message, hint, evidence,
// controls) for the alert lists, a compact one for the banner, and AlertList, which keeps a
// list of them current, redrawing only the items that changed.

import { isOlder, isSilenced, newestFirst } from "./alert-feed.js";
import { escapeHTML, formatBytes, formatDuration, formatNumber, formatTime, runPath } from "./format.js";

const MEMORY_RULES = new Set(["oom_forecast", "memory_pressure"]);
const BYTE_KEYS = new Set(["limit", "current", "used", "swap_used", "growth"]);
const MAX_TIMEOUT_MS = 2 ** 31 - 1;
const EVIDENCE_DIGITS = 3; // significant digits of the numbers in evidence

function isPlainList(value) {
  return Array.isArray(value) && value.every((v) => v === null || typeof v !== "object");
}

const isRecord = (value) => value !== null && typeof value === "object" && !Array.isArray(value)
  && Object.values(value).every((v) => v === null || typeof v !== "object");

// A scalar of evidence as text: numbers to EVIDENCE_DIGITS.
const scalar = (value) => (value == null ? "—" : typeof value === "number" ? formatNumber(value, EVIDENCE_DIGITS) : String(value));

// A list of records (the layers whose gradients rose: { variable, norm, rise }) as a small
// table, a column a key.
function recordTable(records) {
  const keys = [...new Set(records.flatMap((record) => Object.keys(record)))];
  const head = keys.map((key) => `<th>${escapeHTML(key)}</th>`).join("");
  const rows = records.map((record) => `<tr>${keys.map((key) =>
    `<td class="${typeof record[key] === "number" ? "num" : ""}">${escapeHTML(scalar(record[key]))}</td>`).join("")}</tr>`).join("");
  return `<table class="evidence-table"><thead><tr>${head}</tr></thead><tbody>${rows}</tbody></table>`;
}

// Known evidence in its units; anything else as it is, nested values as compact JSON.
function evidenceValue(rule, key, value) {
  if (value == null) return "—";
  if (key === "stacks" && typeof value === "string") return `<pre>${escapeHTML(value)}</pre>`;
  if (key === "autopsy" && typeof value === "object") return `<pre>${escapeHTML(JSON.stringify(value, null, 2))}</pre>`;
  if (key === "counts" && typeof value === "object" && !Array.isArray(value)) {
    return escapeHTML(Object.entries(value).map(([name, n]) => `${name}: ${n}`).join(", "));
  }
  if (key === "forecast" && MEMORY_RULES.has(rule) && Array.isArray(value.step)) {
    const [s0, s1] = value.step, [v0, v1] = value.value;
    return escapeHTML(`${value.series}: ${formatBytes(v0)} at step ${s0} → ${formatBytes(v1)} at step ${s1} (on the chart)`);
  }
  if (typeof value === "number") {
    if (key.endsWith("_s")) return escapeHTML(formatDuration(value));
    if (key === "fraction") return escapeHTML(`${(value * 100).toFixed(1)} %`);
    if (MEMORY_RULES.has(rule) && key === "slope") return escapeHTML(`${formatBytes(value * 60)}/min`);
    if (MEMORY_RULES.has(rule) && BYTE_KEYS.has(key)) return escapeHTML(formatBytes(value));
    return escapeHTML(formatNumber(value, EVIDENCE_DIGITS));
  }
  if (isPlainList(value)) return escapeHTML(value.map((v) => (typeof v === "number" ? formatNumber(v, EVIDENCE_DIGITS) : v)).join(", "));
  if (Array.isArray(value) && value.length && value.every(isRecord)) return recordTable(value);
  if (isRecord(value)) return escapeHTML(Object.entries(value).map(([name, v]) => `${name}: ${scalar(v)}`).join(", "));
  if (typeof value === "object") {
    const rounded = JSON.stringify(value, (_, v) => (typeof v === "number" ? Number(formatNumber(v, EVIDENCE_DIGITS)) : v));
    return `<code>${escapeHTML(rounded)}</code>`;
  }
  return escapeHTML(value);
}

function evidenceDetails(alert) {
  const entries = Object.entries(alert.evidence ?? {});
  if (!entries.length) return "";
  const rows = entries.map(([key, value]) =>
    `<tr><th>${escapeHTML(key)}</th><td>${evidenceValue(alert.rule, key, value)}</td></tr>`).join("");
  return `<details class="alert-evidence"><summary>Evidence</summary><table class="kv">${rows}</table></details>`;
}

function runLink(alert) {
  return `<a class="alert-run" href="${escapeHTML(runPath(alert.run_id))}">`
    + `${escapeHTML(alert.project)} / ${escapeHTML(alert.run_name)}</a>`;
}

function ruleLabel(alert) {
  const subject = alert.subject ? ` <span class="alert-subject">${escapeHTML(alert.subject)}</span>` : "";
  return `<span class="alert-rule">${escapeHTML(alert.rule)}</span>${subject}`;
}

// Text with its `code spans` as code; everything escaped first.
function withCode(text) {
  return escapeHTML(text).replace(/`([^`]+)`/g, "<code>$1</code>");
}

function hint(alert) {
  return alert.hint ? `<p class="alert-hint"><span class="label">What to do:</span> ${withCode(alert.hint)}</p>` : "";
}

export const severityBadge = (severity) =>
  `<span class="badge sev-${escapeHTML(severity)}" data-severity="${escapeHTML(severity)}">${escapeHTML(severity)}</span>`;

function controls(alert) {
  if (alert.state !== "firing") return "";
  const what = escapeHTML(`${alert.rule} alert${alert.run_name ? ` on ${alert.run_name}` : ""}`);
  const ack = alert.acknowledged_at == null
    ? `<button type="button" data-alert-action="ack" aria-label="Acknowledge: ${what}">Acknowledge</button>` : "";
  const silence = isSilenced(alert)
    ? "" : `<button type="button" data-alert-action="silence" aria-label="Silence 1h: ${what}">Silence 1h</button>`;
  return `<div class="alert-actions">${ack}${silence}<span class="alert-status" role="status"></span></div>`;
}

// Resolved, closed, acknowledged, silenced: in absolute times, so an item only changes when its
// alert does. Closed: its run ended while it fired, which says nothing of the problem.
function standing(alert) {
  const parts = [];
  if (alert.state === "resolved") parts.push(`Resolved ${formatTime(alert.resolved_time)}`);
  if (alert.state === "closed") parts.push(`Closed at run end ${formatTime(alert.closed_time)}`);
  if (alert.acknowledged_at != null) {
    parts.push(`Acknowledged${alert.acknowledged_by ? ` by ${alert.acknowledged_by}` : ""} ${formatTime(alert.acknowledged_at)}`);
  }
  if (isSilenced(alert)) parts.push(`Silenced until ${formatTime(alert.silenced_until)}`);
  return parts.length ? `<p class="alert-standing">${escapeHTML(parts.join(" · "))}</p>` : "";
}

// The full item of the alerts page and the run page; showRun adds the project / run link.
export function alertItem(alert, { showRun = true } = {}) {
  const severity = escapeHTML(alert.severity), state = escapeHTML(alert.state);
  const facts = [
    alert.step != null ? `step ${alert.step}` : null,
    formatTime(alert.time),
    `fired ${alert.count ?? 1}×`,
  ].filter(Boolean).map(escapeHTML).join(" · ");
  return `<article class="alert-item sev-${severity} state-${state}" data-alert-id="${escapeHTML(alert.id)}"
      data-rule="${escapeHTML(alert.rule)}" data-severity="${severity}" data-state="${state}">
    <div class="alert-head">
      ${severityBadge(alert.severity)}
      <span class="badge alert-state state-${state}">${state}</span>
      ${ruleLabel(alert)}
      ${showRun ? runLink(alert) : ""}
      <span class="alert-facts">${facts}</span>
    </div>
    <p class="alert-message">${withCode(alert.message)}</p>
    ${hint(alert)}
    ${standing(alert)}
    ${evidenceDetails(alert)}
    ${controls(alert)}
  </article>`;
}

// The banner's item: who, what, what to do, and the two buttons.
export function bannerItem(alert) {
  const severity = escapeHTML(alert.severity);
  return `<li class="banner-item sev-${severity}" data-alert-id="${escapeHTML(alert.id)}"
      data-rule="${escapeHTML(alert.rule)}" data-severity="${severity}">
    ${severityBadge(alert.severity)}
    <div class="banner-text">
      <p class="alert-message">${runLink(alert)} ${ruleLabel(alert)} ${escapeHTML(alert.message)}</p>
      ${hint(alert)}
    </div>
    ${controls(alert)}
  </li>`;
}

// A keyed list of alert items. It holds the latest version of every alert it is given and
// shows those that pass `filter`, in `order`, at most `limit`; an item is redrawn only when its
// HTML changes, so an expanded evidence table or a focused button survives updates to other
// alerts. onRender(shown) runs after each drawing; `empty: null` leaves an empty list blank.
export class AlertList {
  constructor(container, {
    template = alertItem, filter = () => true, order = newestFirst, limit = Infinity,
    empty = "No alerts.", onRender = () => {},
  } = {}) {
    Object.assign(this, { container, template, filter, order, limit, empty, onRender });
    this.alerts = new Map();
    this.items = new Map(); // id -> { html, element }
    this.timer = null;
  }

  replace(alerts) {
    this.alerts = new Map();
    for (const alert of alerts) this.merge(alert);
    this.render();
  }

  upsert(alert) { if (this.merge(alert)) this.render(); }

  merge(alert) {
    const known = this.alerts.get(alert.id);
    if (known && isOlder(alert, known)) return false;
    this.alerts.set(alert.id, alert);
    return true;
  }

  shown() {
    return [...this.alerts.values()].filter((alert) => this.filter(alert)).sort(this.order).slice(0, this.limit);
  }

  render() {
    const shown = this.shown();
    const items = new Map();
    for (const alert of shown) {
      const html = this.template(alert);
      let item = this.items.get(alert.id);
      if (!item || item.html !== html) {
        const holder = document.createElement("template");
        holder.innerHTML = html.trim();
        const element = holder.content.firstElementChild;
        if (item?.element.querySelector(".alert-evidence")?.open) element.querySelector(".alert-evidence")?.setAttribute("open", "");
        item = { html, element };
      }
      items.set(alert.id, item);
    }
    this.items = items;
    const elements = [...items.values()].map((item) => item.element);
    if (!elements.length) {
      if (this.empty == null) this.container.replaceChildren();
      else this.container.innerHTML = `<p class="muted alert-empty">${escapeHTML(this.empty)}</p>`;
    } else if (elements.length !== this.container.children.length
        || elements.some((element, i) => this.container.children[i] !== element)) {
      this.container.replaceChildren(...elements);
    }
    this.redrawWhenASilenceEnds();
    this.onRender(shown);
  }

  redrawWhenASilenceEnds() {
    clearTimeout(this.timer);
    const at = Date.now() / 1000;
    const ends = [...this.alerts.values()].map((a) => a.silenced_until).filter((t) => t != null && t > at);
    if (ends.length) this.timer = setTimeout(() => this.render(), Math.min((Math.min(...ends) - at) * 1000 + 50, MAX_TIMEOUT_MS));
  }

  destroy() { clearTimeout(this.timer); }
}
