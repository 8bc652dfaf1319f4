// The browser end of WS /api/v1/live: reconnects with backoff and re-subscribes.

// A run as the server last described it. A "runs" message carries the whole summary of each
// run that changed, or only its id, project and health when an alert about it changed: every
// field in it, the status above all, is taken exactly as sent (the page shows the server's
// status and health and derives neither); the fields it lacks (config, environment, stacks,
// traceback, job, and the rest of a health-only one) are kept.
export function withSummary(run, summary) {
  return { ...run, ...summary };
}

// A live message as its handlers read it. The page asks for points with their clocks
// (?clocks=1): as in the agent's frames, the steps and times that several series share come
// once, in message.clocks, and each of those series names its clock. Each series gets its
// clock's steps and times back here, so that every handler reads {step, time, value}: the
// series of one clock share its arrays (read them, never change them).
export function withClocks(message) {
  if (message.type !== "points" || !message.clocks) return message;
  const series = {};
  for (const [name, data] of Object.entries(message.series)) {
    const clock = data.clock === undefined ? undefined : message.clocks[data.clock];
    series[name] = clock ? { step: clock.step, time: clock.time, value: data.value } : data;
  }
  return { ...message, series };
}

// The longest wait before connecting again, ms.
const MAX_DELAY = 5000;

// Whether this browser's requests are refused for want of a valid token or session.
async function refusedAtUpgrade() {
  try {
    const answer = await fetch("/api/v1/session", { credentials: "same-origin" });
    return answer.status === 401 || answer.status === 403;
  } catch {
    return false; // the server is out of reach: reconnect as usual
  }
}

export class LiveSocket {
  constructor(indicator) {
    this.indicator = indicator;
    this.handlers = new Set();
    this.reconnectHandlers = new Set();
    this.refusedHandlers = new Set();
    this.firstOpenHandlers = new Set();
    this.runs = new Set();
    this.delay = 250;
    this.connected = false;
    this.everConnected = false; // a later open is a reconnect
    this.connect();
  }

  connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}/api/v1/live?clocks=1`);
    this.socket = socket;
    let opened = false;
    socket.onopen = () => {
      opened = true;
      const wasReconnect = this.everConnected;
      this.connected = this.everConnected = true;
      this.delay = 250;
      this.setIndicator("live", "live");
      for (const run of this.runs) this.send({ type: "subscribe", run_id: run });
      if (wasReconnect) for (const handler of this.reconnectHandlers) handler();
      else for (const handler of [...this.firstOpenHandlers]) handler();
      this.firstOpenHandlers.clear();
    };
    socket.onmessage = (event) => {
      const message = withClocks(JSON.parse(event.data));
      for (const handler of this.handlers) handler(message);
    };
    socket.onclose = async (event) => {
      this.connected = false;
      // Refused: the token was revoked, the session ended, or else. A request without a valid
      // token is refused before the upgrade (HTTP 401/403), which a page sees as a 1006 on a
      // socket that never opened: the session route tells that from a server out of reach.
      if (event.code === 1008 || (!opened && await refusedAtUpgrade())) {
        this.setIndicator("offline", "refused");
        if (this.indicator) this.indicator.title = event.reason || "the server refused the live stream";
        if (this.refusedHandlers.size) {
          for (const handler of this.refusedHandlers) handler(event.reason);
        } else {
          this.retryLater();
        }
        return; // a handler says whether to try again (retryLater) or to sign in
      }
      this.setIndicator("offline", "reconnecting");
      this.connectLater();
      this.delay = Math.min(this.delay * 2, MAX_DELAY);
    };
  }

  // Connect again after about this.delay ms (jittered, so that pages do not come back as one).
  connectLater() {
    setTimeout(() => this.connect(), this.delay * (0.5 + Math.random()));
  }

  // Connect again after the longest wait (a refusal that signing in again would not mend).
  retryLater() {
    this.delay = MAX_DELAY;
    this.connectLater();
  }

  setIndicator(state, text) {
    if (!this.indicator) return;
    this.indicator.dataset.state = state;
    this.indicator.textContent = text;
  }

  send(message) {
    if (this.connected) this.socket.send(JSON.stringify(message));
  }

  subscribe(runId) { this.runs.add(runId); this.send({ type: "subscribe", run_id: runId }); }
  unsubscribe(runId) { this.runs.delete(runId); this.send({ type: "unsubscribe", run_id: runId }); }

  // [fetch()'s result, the run summaries pushed while it was on its way]. A fetched snapshot
  // can be older than a summary that arrived before it: apply those summaries over it.
  async fetchWithRuns(fetch) {
    const since = [];
    const off = this.on((message) => { if (message.type === "runs") since.push(...message.runs); });
    try {
      return [await fetch(), since];
    } finally {
      off();
    }
  }

  // Follow runs live while their history loads: subscribed at once, so that no point falls
  // between the history and the stream; the messages that come meanwhile are held until
  // start() (the history drawn), then passed on in order, and every later one at once.
  // onReconnect: the socket came back (points may have been missed: reload), or it opened for
  // the first time after the history was asked for (what happened in between, a point or the
  // run's deletion, was sent to no one: reload too). stop() ends it.
  follow(runIds, { onMessage, onReconnect }) {
    let held = [];
    const offMessage = this.on((message) => (held ? held.push(message) : onMessage(message)));
    const offReconnect = this.onReconnect(onReconnect);
    if (!this.everConnected) this.firstOpenHandlers.add(onReconnect);
    for (const id of runIds) this.subscribe(id);
    return {
      start: () => { const pending = held ?? []; held = null; for (const message of pending) onMessage(message); },
      stop: () => {
        offMessage(); offReconnect(); this.firstOpenHandlers.delete(onReconnect);
        for (const id of runIds) this.unsubscribe(id);
      },
    };
  }

  // Returns a function that removes the handler.
  on(handler) { this.handlers.add(handler); return () => this.handlers.delete(handler); }
  // handler(reason): the server closed the live stream as not this token's (1008).
  onRefused(handler) { this.refusedHandlers.add(handler); return () => this.refusedHandlers.delete(handler); }
  onReconnect(handler) { this.reconnectHandlers.add(handler); return () => this.reconnectHandlers.delete(handler); }
}
