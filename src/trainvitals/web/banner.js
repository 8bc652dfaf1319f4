// The banner on every page: firing warnings and criticals that nobody has acknowledged or
// silenced, most urgent first, each with its run, what to do, and the two buttons. A few at
// most; the rest are a link away on the alerts page.

import { mostUrgentFirst, needsAttention } from "./alert-feed.js";
import { AlertList, bannerItem } from "./alert-items.js";

const SHOWN = 5;

export function mountBanner(banner, feed) {
  const more = banner.querySelector(".banner-more");
  const list = new AlertList(banner.querySelector("ul"), {
    template: bannerItem, filter: needsAttention, order: mostUrgentFirst, limit: SHOWN, empty: null,
    onRender: (shown) => {
      const hidden = [...list.alerts.values()].filter((alert) => needsAttention(alert)).length - shown.length;
      banner.dataset.count = String(shown.length + hidden);
      more.hidden = hidden <= 0;
      more.querySelector("a").textContent = `${hidden} more on the alerts page`;
    },
  });
  list.replace(feed.firing());
  feed.on((alert) => (alert ? list.upsert(alert) : list.replace(feed.firing())));
}
