// Alerts across the app: every firing alert, loaded once and then kept live from the
// websocket's {"type": "alert"} messages; the Acknowledge and Silence buttons of every view;
// and which alerts need someone's attention now.

import { acknowledgeAlert, listAlerts, silenceAlert } from "./api.js";

export const SILENCE_S = 3600;
export const SEVERITY_COLOURS = { critical: "#d64545", warning: "#c98a00", info: "#2f6fed" };
const SEVERITY_RANK = { critical: 0, warning: 1, info: 2 };
const FIRING_LIMIT = 1000;

const now = () => Date.now() / 1000;

export const isSilenced = (alert, at = now()) => alert.silenced_until != null && alert.silenced_until > at;

// What the banner shows: firing warnings and criticals nobody has acknowledged or silenced.
export function needsAttention(alert, at = now()) {
  return alert.state === "firing" && alert.acknowledged_at == null && !isSilenced(alert, at)
    && (alert.severity === "warning" || alert.severity === "critical");
}

export const newestFirst = (a, b) => (b.time ?? 0) - (a.time ?? 0);
export const mostUrgentFirst = (a, b) =>
  (SEVERITY_RANK[a.severity] ?? 3) - (SEVERITY_RANK[b.severity] ?? 3) || newestFirst(a, b);

// An update can arrive twice, or after a fetched snapshot that already holds it. Of two
// versions of one alert the later has a later event, a higher count or a later silence.
function version(alert) {
  const event = Math.max(alert.updated_time ?? 0, alert.resolved_time ?? 0, alert.acknowledged_at ?? 0);
  return [event, alert.count ?? 0, alert.silenced_until ?? 0];
}

export function isOlder(a, b) {
  const va = version(a), vb = version(b);
  for (let i = 0; i < va.length; i++) if (va[i] !== vb[i]) return va[i] < vb[i];
  return false;
}

export class AlertFeed {
  constructor(live) {
    this.alerts = new Map(); // id -> the latest version seen, firing or not
    this.handlers = new Set();
    this.receivedDuringLoad = null;
    live.on((message) => { if (message.type === "alert") this.receive(message.alert); });
    live.onReconnect(() => this.load().catch((error) => console.warn("trainvitals: could not reload the firing alerts:", error)));
    document.addEventListener("click", (event) => this.act(event));
  }

  // The firing alerts from the server; the websocket keeps them current afterwards.
  async load() {
    const received = new Set();
    this.receivedDuringLoad = received;
    let alerts;
    try {
      ({ alerts } = await listAlerts({ state: "firing", limit: FIRING_LIMIT }));
    } finally {
      if (this.receivedDuringLoad === received) this.receivedDuringLoad = null;
    }
    const fetched = new Set();
    for (const alert of alerts) { fetched.add(alert.id); this.merge(alert); }
    // Firing here but not in the snapshot: it resolved while the socket was down, unless the
    // socket brought it after the snapshot was taken.
    for (const [id, alert] of this.alerts) {
      if (alert.state === "firing" && !fetched.has(id) && !received.has(id)) this.alerts.delete(id);
    }
    this.emit(null);
  }

  receive(alert) {
    this.receivedDuringLoad?.add(alert.id);
    if (this.merge(alert)) this.emit(alert);
  }

  merge(alert) {
    const known = this.alerts.get(alert.id);
    if (known && isOlder(alert, known)) return false;
    this.alerts.set(alert.id, alert);
    return true;
  }

  firing() { return [...this.alerts.values()].filter((alert) => alert.state === "firing"); }

  // handler(alert) for each new version of an alert; handler(null) after a reload, when any
  // firing alert may have changed. Returns a function that removes the handler.
  on(handler) { this.handlers.add(handler); return () => this.handlers.delete(handler); }

  emit(alert) { for (const handler of this.handlers) handler(alert); }

  // One listener serves the buttons of every view: <button data-alert-action="ack|silence">
  // inside an element with data-alert-id.
  async act(event) {
    const button = event.target.closest?.("button[data-alert-action]");
    const item = button?.closest("[data-alert-id]");
    if (!item) return;
    const status = item.querySelector(".alert-status");
    button.disabled = true;
    try {
      const id = item.dataset.alertId;
      if (button.dataset.alertAction === "ack") this.receive(await acknowledgeAlert(id));
      else this.receive((await silenceAlert(id, SILENCE_S)).alert);
    } catch (error) {
      button.disabled = false;
      if (status) status.textContent = `${button.textContent} failed: ${error.message}`;
    }
  }
}
