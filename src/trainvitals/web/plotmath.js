// The arithmetic behind the charts, free of the page: smoothing, a y-range that a blow-up
// cannot flatten, and a zoomed range read again at full detail merged into the whole series.

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

// Where a log axis' labels go: every decade over a few, every few decades over many (an
// explosion spans twenty), so that labels never crowd; within a decade or three, the decades
// and their 2 and 5 (plotly's "D2"), not every digit between. With no power of ten in view
// (0.2 to 0.8), "D2" would label a lone 2 and 5 with nothing to say which (0.2? 2e-5?): there,
// values a round step apart, each labelled in full (plotly's "L" ticks: 0.2, 0.4, 0.6, 0.8).
// range: in decades, either way round.
export function logTicks(range) {
  if (!range) return "D2";
  const low = Math.min(...range), high = Math.max(...range);
  const decades = high - low;
  if (decades > 3) return Math.ceil(decades / 6);
  const span = 10 ** high - 10 ** low;
  if (Math.ceil(low) <= high || !Number.isFinite(span) || !(span > 0)) return "D2";
  return `L${roundStep(span / 3)}`;
}

// The round number (1, 2 or 5 times a power of ten) at or just below step: from 3 to 7 steps
// over the span it was taken from.
function roundStep(step) {
  const power = 10 ** Math.floor(Math.log10(step));
  const digit = [5, 2, 1].find((d) => d * power <= step * (1 + 1e-9)) ?? 1;
  return Number((digit * power).toPrecision(1));
}

// The significant digits that SI labels ("81.3312G") on a linear axis over range need so that
// no two ticks read the same: down to the digit of a tenth of the span, since plotly spaces
// ticks at least that far apart (10 at most on an axis); 4 at least, 15 at most (a double's).
// 81.33G to 81.34G has ticks every 2M: 5 digits (81.332G).
export function siDigits(range) {
  if (!range) return 4;
  const [lo, hi] = range;
  const top = Math.max(Math.abs(lo), Math.abs(hi)), span = hi - lo;
  if (!(span > 0) || !(top > 0) || !Number.isFinite(top)) return 4;
  const digits = Math.floor(Math.log10(top)) - Math.floor(Math.log10(span / 10)) + 1;
  return Math.min(15, Math.max(4, digits));
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
