// The arithmetic behind the charts, free of the page: smoothing, a y-range that a blow-up
// cannot flatten, and a zoomed range read again at full detail merged into the whole series.

import { byteUnit, formatTicks } from "./format.js";

// TensorBoard's smoothing: an exponential moving average whose start is debiased (divided by
// 1 - weight^n), so the first points are not pulled toward zero. NaN/Inf and nulls pass
// through as gaps and do not enter the average. weight 0 returns the values as they are.
export function debiasedEma(values, weight) {
  if (!(weight > 0)) return values;
  const out = new Array(values.length);
  let last = 0, n = 0;
  for (let i = 0; i < values.length; i++) {
    const value = values[i];
    if (value == null || !Number.isFinite(value)) { out[i] = value; continue; }
    last = last * weight + (1 - weight) * value;
    n += 1;
    out[i] = last / (1 - weight ** n);
  }
  return out;
}

function quantile(sorted, q) {
  const at = (sorted.length - 1) * q;
  const lo = Math.floor(at), hi = Math.ceil(at);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (at - lo);
}

// Percentiles are taken from at most this many values, spread evenly over the series: a
// range needs no more, and sorting every point of every series at each redraw of a live chart
// would cost more than drawing it.
const QUANTILE_SAMPLE = 4096;

// A y-range that the rare far-off values (an explosion to 1e35, one huge spike) cannot
// flatten: values beyond ten times the 5th-95th percentile span from that span are left out;
// the early high loss of a healthy run is not. log: in decades, of the positive values (as
// plotly's log axes take it). Null when nothing is left out (plotly's own range), or too few.
export function clippedRange(values, log = false) {
  const finite = [];
  for (const v of values) if (v != null && Number.isFinite(v) && (!log || v > 0)) finite.push(log ? Math.log10(v) : v);
  if (finite.length < 5) return null;
  const every = Math.ceil(finite.length / QUANTILE_SAMPLE);
  const sample = every > 1 ? finite.filter((_, i) => i % every === 0) : [...finite];
  sample.sort((a, b) => a - b);
  const lo = quantile(sample, 0.05), hi = quantile(sample, 0.95);
  const span = hi - lo || Math.abs(hi) || 1;
  const kept = finite.filter((v) => v >= lo - 10 * span && v <= hi + 10 * span);
  if (kept.length === finite.length) return null;
  return fullRange(kept);
}

// A log axis' ticks, each labelled with its value in full (formatTicks: 0.002, 5e-5), not
// plotly's lone "2" and "5" between decades, whose decade nobody can tell: every decade over a
// few, every few decades over many (an explosion spans twenty), so that labels never crowd;
// within a decade or three, the decades and their 2 and 5 (and 3); with no power of ten in
// view (0.2 to 0.8), values a round step apart (0.2, 0.4, 0.6, 0.8). range: in decades, either
// way round. { tickvals, ticktext }, or null for no range.
export function logTicks(range) {
  if (!range || !range.every(Number.isFinite)) return null;
  const low = Math.min(...range), high = Math.max(...range);
  const decades = high - low;
  let values = [];
  if (decades > 3) {
    const every = Math.ceil(decades / 6);
    for (let k = Math.ceil(low / every) * every; k <= high; k += every) values.push(Number(`1e${k}`));
  } else if (Math.ceil(low) <= high) {
    // With a power of ten in view: 1, 2 and 5 times the decades, or 1, 2, 3 and 5 where that
    // leaves fewer than three (0.023 to 0.17: 0.03, 0.05, 0.1).
    for (const digits of [[1, 2, 5], [1, 2, 3, 5]]) {
      values = [];
      for (let k = Math.floor(low); k <= Math.ceil(high); k++) {
        for (const digit of digits) {
          const value = Number((digit * 10 ** k).toPrecision(1));
          if (Math.log10(value) >= low - 1e-9 && Math.log10(value) <= high + 1e-9) values.push(value);
        }
      }
      if (values.length >= 3) break;
    }
  }
  if (values.length < 3 && decades <= 3) values = linearValues(10 ** low, 10 ** high, 3);
  return values.length ? { tickvals: values, ticktext: formatTicks(values) } : null;
}

// A linear axis of bytes: ticks a round number of one binary unit apart, labelled in it
// ("20 GiB", "81.25 GiB"), as every size on the page is written. range: [lo, hi] in bytes.
export function byteTicks(range) {
  if (!range || !range.every(Number.isFinite)) return null;
  const [lo, hi] = [Math.min(...range), Math.max(...range)];
  const [unit, scale] = byteUnit(Math.max(Math.abs(lo), Math.abs(hi)));
  const values = linearValues(lo / scale, hi / scale, 3);
  const step = values.length > 1 ? values[1] - values[0] : 1;
  const decimals = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  if (!values.length) return null;
  return { tickvals: values.map((value) => value * scale), ticktext: values.map((value) => `${value.toFixed(decimals)} ${unit}`) };
}

// Round values (1, 2 or 5 times a power of ten apart) from lo to hi, about `count` of them.
function linearValues(lo, hi, count) {
  const span = hi - lo;
  if (!(span > 0) || !Number.isFinite(span)) return Number.isFinite(lo) ? [lo] : [];
  const step = roundStep(span / count);
  const values = [];
  for (let i = Math.ceil(lo / step - 1e-9); i * step <= hi + step * 1e-9; i++) values.push(Number((i * step).toPrecision(12)));
  return values;
}

// The round number (1, 2 or 5 times a power of ten) at or just below step.
function roundStep(step) {
  const power = 10 ** Math.floor(Math.log10(step));
  const digit = [5, 2, 1].find((d) => d * power <= step * (1 + 1e-9)) ?? 1;
  return Number((digit * power).toPrecision(1));
}

// A range of bytes at least `floor` of its top wide (and a mebibyte): a disk that loses a few
// kilobytes of its 80 GiB is a flat line, not a cliff.
export function withFloor(range, floor = 0.02) {
  if (!range) return range;
  const [lo, hi] = range;
  const least = Math.max(2 ** 20, floor * Math.max(Math.abs(lo), Math.abs(hi)));
  if (hi - lo >= least) return range;
  const middle = (lo + hi) / 2;
  return [middle - least / 2, middle + least / 2];
}

// The range of every value (in decades on a log axis), a little wider; null for none.
export function fullRange(values, log = false) {
  let min = Infinity, max = -Infinity;
  for (const v of values) {
    if (v == null || !Number.isFinite(v) || (log && v <= 0)) continue;
    const at = log ? Math.log10(v) : v;
    if (at < min) min = at;
    if (at > max) max = at;
  }
  if (min > max) return null;
  const pad = (max - min) * 0.05 || Math.abs(max) * 0.05 || 1;
  return [min - pad, max + pad];
}

// The whole (downsampled) series with the points of [min, max] steps replaced by those read
// again at full detail.
export function withDetail(whole, detail, min, max) {
  if (!detail) return whole;
  const before = whole.step.findIndex((step) => step >= min);
  const head = before < 0 ? whole.step.length : before;
  let tail = whole.step.findIndex((step) => step > max);
  if (tail < 0) tail = whole.step.length;
  const pick = (key) => [...whole[key].slice(0, head), ...detail[key], ...whole[key].slice(tail)];
  return { step: pick("step"), time: pick("time"), value: pick("value") };
}

// The steps of a series whose times lie in [t0, t1] (its times rise with its steps), as
// { min, max }; null when none do.
export function stepsBetween(series, t0, t1) {
  const times = series.time;
  // The first index whose time is after t (at or after it, unless `after`). Not t + epsilon:
  // at Unix times a double's resolution is 2.4e-7 s.
  const first = (t, after = false) => {
    let lo = 0, hi = times.length;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (times[mid] < t || (after && times[mid] === t)) lo = mid + 1; else hi = mid; }
    return lo;
  };
  const a = first(t0), b = first(t1, true) - 1;
  return a <= b ? { min: series.step[a], max: series.step[b] } : null;
}

// The epoch axis: a step as a fractional epoch, from the steps at which each epoch ended
// (the "epoch" series: its value, the 1-based epoch, at the epoch's last step). Epoch 3 ends at
// x = 3; the steps of an epoch not yet ended go on at the last epoch's pace. epochs: { step,
// value }; null when the run has no epochs (a custom loop): there is no epoch axis.
export function epochAxis(epochs) {
  if (!epochs?.step.length) return null;
  const ends = [], marks = [];
  epochs.step.forEach((step, i) => {
    if (!ends.length || step > ends[ends.length - 1]) { ends.push(step); marks.push(epochs.value[i]); }
  });
  const n = ends.length;
  // Before the first end: where that epoch began (step 0 for a first epoch of 1).
  const first = marks[0] === 1 ? 0 : ends[0] - (n > 1 ? ends[1] - ends[0] : ends[0]);
  const steps = [first, ...ends], xs = [marks[0] - 1, ...marks];
  const pace = Math.max(1, steps[n] - steps[n - 1]);
  const at = (values, v) => { // the last index whose value is at or below v
    let lo = 0, hi = values.length - 1;
    while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (values[mid] <= v) lo = mid; else hi = mid - 1; }
    return lo;
  };
  // From one scale to the other (rate: the other's units per one of this, past the last end).
  const between = (from, to, v, rate) => {
    const last = from.length - 1;
    if (v >= from[last]) return to[last] + (v - from[last]) * rate;
    const i = Math.min(at(from, v), last - 1);
    return to[i] + ((v - from[i]) / (from[i + 1] - from[i] || 1)) * (to[i + 1] - to[i]);
  };
  return { x: (step) => between(steps, xs, step, 1 / pace), step: (x) => between(xs, steps, x, pace) };
}

// The time of a step, between the points of a series (its steps and times rise together);
// beyond them, the nearest one's. undefined for a series without points.
export function timeAt(series, step) {
  const { step: steps, time } = series;
  if (!steps.length) return undefined;
  let lo = 0, hi = steps.length - 1;
  if (step <= steps[0]) return time[0];
  if (step >= steps[hi]) return time[hi];
  while (hi - lo > 1) { const mid = (lo + hi) >> 1; if (steps[mid] <= step) lo = mid; else hi = mid; }
  return time[lo] + ((step - steps[lo]) / (steps[hi] - steps[lo])) * (time[hi] - time[lo]);
}
