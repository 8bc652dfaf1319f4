// Hash router: #/ is the runs list, #/runs/<id> a run.

import { LiveSocket } from "./live.js";
import { renderRun } from "./run.js";
import { renderRuns } from "./runs.js";

const root = document.getElementById("app");
const live = new LiveSocket(document.getElementById("live-indicator"));
let cleanup = () => {};
let navigation = 0;

async function route() {
  const current = ++navigation;
  cleanup();
  cleanup = () => {};
  const match = location.hash.match(/^#\/runs\/([^/]+)$/);
  const done = match ? await renderRun(root, live, decodeURIComponent(match[1])) : await renderRuns(root, live);
  if (current === navigation) cleanup = done; else done();
}

window.addEventListener("hashchange", route);
route().catch((error) => { root.innerHTML = `<p class="error">${error.message}</p>`; });
