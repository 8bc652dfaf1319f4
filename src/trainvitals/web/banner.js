// The banner on every page: firing warnings and criticals that nobody has acknowledged or
// silenced, most urgent first, each with its run, what to do, and the two buttons. A few at
// most (fewer on a phone); the rest are a link away on the alerts page. On a page about one
// project (a run's page, the list filtered to a project) it shows that project's alerts, and
// counts those of the others.

import { mostUrgentFirst, needsAttention } from "./alert-feed.js";
import { AlertList, bannerItem } from "./alert-items.js";

const SHOWN = 5;
const SHOWN_ON_A_PHONE = 2;

let scoped = () => {};

// The project of the page in view (null: every project).
export function setBannerScope(project) { scoped(project ?? null); }

export function mountBanner(banner, feed) {
  const more = banner.querySelector(".banner-more");
  const elsewhere = banner.querySelector(".banner-elsewhere");
  let project = null;
  const inView = (alert) => needsAttention(alert) && (project == null || alert.project === project);
  const limit = matchMedia("(max-width: 700px)").matches ? SHOWN_ON_A_PHONE : SHOWN;
  const list = new AlertList(banner.querySelector("ul"), {
    template: bannerItem, filter: inView, order: mostUrgentFirst, limit, empty: null,
    onRender: (shown) => {
      const pending = [...list.alerts.values()].filter(needsAttention);
      const hidden = pending.filter(inView).length - shown.length;
      const others = pending.length - pending.filter(inView).length;
      banner.dataset.count = String(shown.length + hidden);
      banner.dataset.elsewhere = String(others);
      more.hidden = hidden <= 0;
      more.querySelector("a").textContent = `${hidden} more on the alerts page`;
      elsewhere.hidden = others <= 0;
      elsewhere.querySelector("a").textContent =
        `${others} alert${others === 1 ? "" : "s"} in other projects need${others === 1 ? "s" : ""} attention`;
    },
  });
  scoped = (next) => { if (next !== project) { project = next; list.render(); } };
  list.replace(feed.firing());
  feed.on((alert) => (alert ? list.upsert(alert) : list.replace(feed.firing())));
}
