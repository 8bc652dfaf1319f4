// Hash router: #/ is the runs list, #/runs/<id> a run, #/alerts the alerts across runs,
// #/tokens an admin's access tokens. The alert banner and the header's count of firing alerts
// are on every page.

import { AlertFeed } from "./alert-feed.js";
import { renderCompare } from "./compare.js";
import { renderAlerts } from "./alerts.js";
import { signIn, signOut, whoami } from "./api.js";
import { mountBanner, setBannerScope } from "./banner.js";
import { escapeHTML } from "./format.js";
import { LiveSocket } from "./live.js";
import { RunPage } from "./run.js";
import { RunsPage } from "./runs.js";
import { renderTokens } from "./tokens.js";

const root = document.getElementById("app");
let live;
let feed;
let identity; // who the page speaks for (GET /api/v1/session)
let cleanup = () => {};
let navigation = 0;
const RETRY_FIRST_MS = 500;
const RETRY_MAX_MS = 8000;
let unreachable = 0; // pages in a row that got no answer

// A page object drawn by load() and stopped by destroy(); its cleanup once it has loaded.
async function mount(page) {
  try {
    await page.load();
  } catch (error) {
    page.destroy();
    throw error;
  }
  return () => page.destroy();
}

const VIEWS = [
  [/^#\/runs\/([^/?]+)(?:\?(.*))?$/,
    (match) => mount(new RunPage(root, live, feed, decodeURIComponent(match[1]), new URLSearchParams(match[2] ?? "")))],
  [/^#\/alerts(?:\?(.*))?$/, (match) => renderAlerts(root, feed, new URLSearchParams(match[1] ?? ""))],
  [/^#\/tokens(?:\?.*)?$/, () => renderTokens(root, identity)],
  [/^#\/compare(?:\?(.*))?$/, (match) => renderCompare(root, live, new URLSearchParams(match[1] ?? ""))],
  [/^(?:#\/?(?:\?(.*))?)?/, (match) => mount(new RunsPage(root, live, feed, new URLSearchParams(match[1] ?? "")))],
];

function markCurrentNav() {
  const page = ["#/alerts", "#/tokens"].find((path) => location.hash.startsWith(path)) ?? "#/";
  for (const link of document.querySelectorAll(".topbar nav a")) {
    if (link.getAttribute("href") === page) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

async function route() {
  const current = ++navigation;
  cleanup();
  cleanup = () => {};
  setBannerScope(null); // a page about one project narrows it
  markCurrentNav();
  const [match, render] = VIEWS.map(([pattern, view]) => [location.hash.match(pattern), view]).find(([m]) => m);
  let done;
  try {
    done = await render(match);
  } catch (error) {
    if (current !== navigation) return;
    // The message can repeat what was in the address (a 422 quotes the invalid filter): text.
    root.innerHTML = `<p class="error">${escapeHTML(error.message)}</p>`;
    // No answer at all (the server restarting, a network blip): the page tries again with
    // backoff, as the live socket does, instead of staying on the error until a reload.
    if (error instanceof TypeError && error.status === undefined) {
      const wait = Math.min(RETRY_MAX_MS, RETRY_FIRST_MS * 2 ** unreachable++);
      setTimeout(() => { if (current === navigation) route(); }, wait);
    }
    return;
  }
  unreachable = 0;
  if (current === navigation) cleanup = done; else done();
}


// A server that needs a token asks for one once; the session cookie it sets (HttpOnly) is
// sent with every later request and the live websocket. The page never keeps the token.
function renderSignIn(reason) {
  const indicator = document.getElementById("live-indicator");
  indicator.textContent = "signed out";
  indicator.title = "no live connection until you sign in";
  root.innerHTML = `
    <form class="sign-in" autocomplete="off">
      <h1>Sign in</h1>
      <p>This server needs an access token (<code>trainvitals token create</code>).</p>
      <label>Token <input type="password" name="token" required></label>
      <button type="submit">Sign in</button>
      <p class="error" role="alert"></p>
    </form>`;
  const form = root.querySelector("form");
  form.querySelector(".error").textContent = reason ?? "";
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      await signIn(form.elements.token.value);
      location.reload();
    } catch (error) {
      form.querySelector(".error").textContent = error.status === 401 ? "Unknown or revoked token." : error.message;
    }
  });
}

function start(who) {
  identity = who;
  live = new LiveSocket(document.getElementById("live-indicator"));
  // A token revoked while its page is open (or a session that ended): sign in again. Any
  // other refusal (a role that may not follow runs live): try again, slowly.
  live.onRefused(async (reason) => {
    let signedOut = false;
    try {
      await whoami();
    } catch (error) {
      signedOut = error.status === 401;
    }
    if (!signedOut) { live.retryLater(); return; }
    window.removeEventListener("hashchange", route);
    ++navigation; // a page still loading draws nothing over the form
    cleanup();
    cleanup = () => {};
    renderSignIn(reason === "this token was revoked" ? "Your token was revoked." : "Your session ended.");
  });
  feed = new AlertFeed(live);
  const navCount = document.getElementById("alert-nav-count");
  feed.on(() => {
    const firing = feed.firing().length;
    navCount.textContent = firing ? String(firing) : "";
    navCount.title = `${firing} firing alert${firing === 1 ? "" : "s"}`;
  });
  mountBanner(document.getElementById("alert-banner"), feed);
  feed.load().catch((error) => console.warn("trainvitals: could not load the firing alerts:", error));
  // Tokens are an admin's to manage, on a server that requires them (the server checks both
  // again on each request).
  document.getElementById("tokens-nav").hidden = !identity.auth || identity.role !== "admin";
  if (identity.auth) {
    const who = document.getElementById("who");
    who.hidden = false;
    who.querySelector("span").textContent = `${identity.name} (${identity.role}, ${identity.project})`;
    who.querySelector("button").addEventListener("click", async () => {
      await signOut();
      location.reload();
    });
  }
  window.addEventListener("hashchange", route);
  route();
}

whoami().then(start, (error) => {
  if (error.status === 401) renderSignIn();
  else root.innerHTML = `<p class="error">${escapeHTML(error.message)}</p>`;
});
