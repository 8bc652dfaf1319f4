// The points a chart holds: each series as fetched (possibly downsampled) and then as it
// streams, and the steps of a zoom read again at full detail. A series' arrays grow in place
// and are handed to plotly as they are (no copy per redraw).

import { withDetail } from "./plotmath.js";

const REFETCH_AT = 20000; // points in a series before it is reloaded downsampled from the server

export class ChartData {
  constructor() {
    this.series = new Map(); // series key -> { step, time, value }, as fetched and streamed
    this.detail = null; // { key: { min, max, points } }: a zoom's steps read at full detail
  }

  has(key) { return this.series.has(key); }

  // Replace (or create) a series with a copy of a full, possibly downsampled, one.
  set(key, data) {
    this.series.set(key, { step: [...data.step], time: [...data.time], value: [...data.value] });
  }

  // Append the live points newer than what the series holds; how many there were.
  append(key, data) {
    const series = this.series.get(key);
    const last = series.step.length ? series.step[series.step.length - 1] : -Infinity;
    let added = 0;
    for (let i = 0; i < data.step.length; i++) {
      if (data.step[i] > last) {
        series.step.push(data.step[i]); series.time.push(data.time[i]); series.value.push(data.value[i]);
        added += 1;
      }
    }
    return added;
  }

  // Whether a series grew long enough to be read again downsampled.
  tooLong(key) { return this.series.get(key).step.length > REFETCH_AT; }

  // How many points all the series hold.
  get points() {
    let total = 0;
    for (const series of this.series.values()) total += series.step.length;
    return total;
  }

  // A series as it is drawn: the zoom's steps at full detail where they were read.
  shown(key) {
    const whole = this.series.get(key);
    const detail = this.detail?.[key];
    return detail ? withDetail(whole, detail.points, detail.min, detail.max) : whole;
  }

  // Of these series keys, the one of the series with the most points (null: none held).
  longest(keys) {
    const held = keys.filter((key) => this.series.has(key));
    return held.sort((p, q) => this.series.get(q).step.length - this.series.get(p).step.length)[0] ?? null;
  }

  // The series whose keys start with prefix, by the highest finite value each reached, highest
  // first: [[peak, key], ...].
  peaks(prefix) {
    const peaks = [];
    for (const [key, series] of this.series) {
      if (!key.startsWith(prefix)) continue;
      const ys = series.value.filter((v) => v != null && isFinite(v));
      peaks.push([ys.length ? Math.max(...ys) : -Infinity, key]);
    }
    return peaks.sort((a, b) => b[0] - a[0]);
  }
}
