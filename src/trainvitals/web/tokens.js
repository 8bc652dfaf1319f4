// #/tokens: an admin's access tokens: made (shown once), listed, revoked. An admin of one
// project makes tokens of that project only; the server decides what each may do.

import { createToken, listTokens, revokeToken } from "./api.js";
import { escapeHTML, formatAgo, formatTime, setTitle } from "./format.js";

const ROLES = [
  ["ingest", "ingest: agents stream runs"],
  ["read", "read: the dashboard and the API"],
  ["admin", "admin: also acknowledge, edit, and manage tokens"],
];
const METRICS = ["metrics", "metrics: Prometheus scrapes /metrics"];
const REVOKED_PAGE = 50; // revoked tokens listed at first, and added by each "more"

export async function renderTokens(root, identity) {
  setTitle("Tokens");
  const everyProject = identity.project === "*";
  const roles = everyProject ? [...ROLES, METRICS] : ROLES;
  root.innerHTML = `
    <div class="page-head"><h1>Access tokens</h1><span class="muted" id="token-count"></span></div>
    <form class="filters token-form" id="token-form" aria-label="Make a token" autocomplete="off">
      <label>Name <input type="text" name="name" required maxlength="200" placeholder="alice's laptop"></label>
      <label>Project <input type="text" name="project" required maxlength="200" size="12"
        ${everyProject ? `placeholder="* for every project"` : "readonly"}></label>
      <label>Role <select name="role">${roles.map(([value, label]) =>
        `<option value="${escapeHTML(value)}">${escapeHTML(label)}</option>`).join("")}</select></label>
      <button type="submit">Make token</button>
      <p class="error" role="alert"></p>
    </form>
    <section class="new-token" id="new-token" hidden aria-live="polite">
      <p><strong id="new-token-what"></strong>: copy it now, it is shown only this once.</p>
      <p><input type="text" id="new-token-value" readonly aria-label="the new token" size="60">
        <button type="button" id="copy-token">Copy</button>
        <button type="button" id="hide-token">Done</button></p>
      <p class="muted">Agents read it from <code>TRAINVITALS_TOKEN</code>; a browser signs in with it.</p>
    </section>
    <div class="table-scroll"><table class="runs-table tokens-table">
      <thead><tr><th>Name</th><th>Role</th><th>Project</th><th class="wide-only">Made</th><th>Last used</th><th>State</th><th><span class="visually-hidden">Revoke</span></th></tr></thead>
      <tbody id="tokens-body"><tr><td colspan="7" class="muted">Loading…</td></tr></tbody>
    </table></div>
    <p><button type="button" id="more-revoked" hidden></button></p>`;
  const form = root.querySelector("#token-form");
  const body = root.querySelector("#tokens-body");
  const moreButton = root.querySelector("#more-revoked");
  const shown = root.querySelector("#new-token");
  form.elements.project.value = everyProject ? "" : identity.project;

  const row = (token) => {
    const state = token.revoked_at
      ? `<span class="muted" data-token-state="revoked">revoked ${escapeHTML(formatTime(token.revoked_at))}</span>`
      : `<span data-token-state="live">live</span>`;
    const action = token.revoked_at ? ""
      : `<button type="button" class="danger" data-revoke="${escapeHTML(token.id)}" data-name="${escapeHTML(token.name)}"
          aria-label="${escapeHTML(`revoke ${token.name}`)}">Revoke…</button>`;
    const yours = token.current ? ` <span class="badge" title="this page signed in with it">yours</span>` : "";
    return `<tr class="token-row" data-token-id="${escapeHTML(token.id)}">
      <td>${escapeHTML(token.name)}${yours} <code class="muted">${escapeHTML(token.id)}</code></td>
      <td>${escapeHTML(token.role)}</td><td>${escapeHTML(token.project)}</td>
      <td class="wide-only">${escapeHTML(formatTime(token.created_at))}</td>
      ${lastUsed(token)}
      <td>${state}</td><td>${action}</td></tr>`;
  };

  // When the token was last used; a use after its revocation (refused) is marked: a leak, or
  // an agent still holding it, to look into.
  const lastUsed = (token) => {
    const at = token.last_used_at;
    const after = at != null && token.revoked_at != null && at > token.revoked_at;
    const title = at ? `${formatTime(at)}${after ? ": tried after its revocation, and refused" : ""}` : "not used since it was made";
    const text = at ? formatAgo(at) : "never";
    return `<td data-last-used="${escapeHTML(at ?? "")}"${after ? ' class="used-after-revoke" data-after-revoke' : ""} title="${escapeHTML(title)}">${escapeHTML(text)}${after ? " (after revoked)" : ""}</td>`;
  };

  // Live tokens first (a project holds at most 100), newest first; then the revoked ones, the
  // latest revoked first, a page at a time: a team's server makes and revokes tokens for years.
  let listed = { live: [], revoked: [], total: 0 }; // the tokens drawn, and revoked ones in all
  const draw = () => {
    const ordered = [...listed.live, ...listed.revoked];
    body.innerHTML = ordered.length ? ordered.map(row).join("")
      : `<tr><td colspan="7" class="empty">No tokens yet.</td></tr>`;
    const notShown = listed.total - listed.revoked.length;
    moreButton.hidden = notShown <= 0;
    moreButton.textContent = `Show ${Math.min(notShown, REVOKED_PAGE)} more revoked (${notShown} not shown)`;
  };
  // The live tokens are read first, then the revoked: one revoked in between is in both, and
  // drawn once, as revoked (at the top of its list). Read at once, it could be in neither.
  const load = async () => {
    const live = await listTokens({ revoked: "hide", order: "newest" });
    const revoked = await listTokens({ revoked: "only", order: "revoked", limit: REVOKED_PAGE });
    const gone = new Set(revoked.tokens.map((token) => token.id));
    const tried = revoked.tried_after_revoke;
    const count = root.querySelector("#token-count");
    count.textContent = `${revoked.live} live, ${revoked.revoked} revoked`;
    if (tried) {
      const mark = count.appendChild(document.createElement("span"));
      mark.className = "used-after-revoke";
      mark.title = "presented after their revocation, and refused: a leak, or an agent still holding one";
      mark.textContent = `, ${tried} tried after revocation`;
    }
    listed = { live: live.tokens.filter((token) => !gone.has(token.id)), revoked: revoked.tokens, total: revoked.total };
    draw();
  };
  // The next page of revoked tokens, after those drawn (a revoke meanwhile may repeat one).
  const more = async () => {
    const next = await listTokens({ revoked: "only", order: "revoked", limit: REVOKED_PAGE, offset: listed.revoked.length });
    const drawn = new Set(listed.revoked.map((token) => token.id));
    listed = { ...listed, revoked: [...listed.revoked, ...next.tokens.filter((token) => !drawn.has(token.id))], total: next.total };
    draw();
  };

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const error = form.querySelector(".error");
    error.textContent = "";
    try {
      const made = await createToken({
        name: form.elements.name.value.trim(), project: form.elements.project.value.trim(), role: form.elements.role.value,
      });
      root.querySelector("#new-token-what").textContent = `Token "${made.name}" (${made.role} on ${made.project})`;
      root.querySelector("#new-token-value").value = made.token;
      shown.hidden = false;
      root.querySelector("#new-token-value").select();
      form.elements.name.value = "";
      await load();
    } catch (failure) {
      error.textContent = failure.message;
    }
  });
  root.querySelector("#copy-token").addEventListener("click", async () => {
    const value = root.querySelector("#new-token-value");
    value.select();
    try { await navigator.clipboard.writeText(value.value); } catch { document.execCommand("copy"); }
  });
  // Done, or the page left: the token leaves the page.
  const forget = () => {
    root.querySelector("#new-token-value").value = "";
    shown.hidden = true;
  };
  root.querySelector("#hide-token").addEventListener("click", forget);
  body.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-revoke]");
    if (!button) return;
    if (!confirm(`Revoke the token "${button.dataset.name}"? Agents and browsers using it are cut off now.`)) return;
    try {
      const revoked = await revokeToken(button.dataset.revoke);
      if (revoked.current) { location.reload(); return; } // this page's own: signed out
      await load();
    } catch (failure) {
      form.querySelector(".error").textContent = failure.message;
    }
  });

  moreButton.addEventListener("click", async () => {
    moreButton.disabled = true;
    try {
      await more();
    } catch (failure) {
      form.querySelector(".error").textContent = failure.message;
    } finally {
      moreButton.disabled = false;
    }
  });

  await load();
  return forget;
}
