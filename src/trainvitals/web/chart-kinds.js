// What the dashboard charts and how: the chart each series is drawn on (its id, title and
// order), the charts an alert is marked on, and how each series' trace looks (its colour,
// dash and markers, and whether smoothing applies to it). Pure functions of series names.

import {
  EPOCH, EPOCH_PREFIX, GPU_CLOCK_SM, GPU_ECC_UNCORRECTED, GPU_MEM_TOTAL, GPU_MEM_USED, GPU_POWER, GPU_TEMP,
  GPU_TF_CURRENT, GPU_TF_PEAK, GPU_THROTTLE, GPU_UTIL, GPU_XID_ERRORS, GRAD_GLOBAL_NORM, GRAD_NORM_PREFIX,
  HOST_AVAILABLE, HOST_CPU_PERCENT, HOST_CPU_TEMP, HOST_DISK_FREE, HOST_LIMIT, HOST_RSS, HOST_RSS_ANON, HOST_RSS_FILE,
  HOST_SWAP_USED, HOST_WORKING_SET, CHANCE_LOSS, LOSS,
  LOSS_SCALE, LR, NONFINITE_PREFIX, STEP_TIME, VAL_PREFIX, gpuParts, isGpuDevice,
} from "./series.js";

// A chart is found by its id, which never changes: the page's data-chart="<id>", the key that
// alerts are marked by. Its title is for people only. Charts sort by rank, then by title.
// System and vitals series share charts by what they measure.
const RANK = { loss: 0, metric: 1, stepTime: 2, grad: 3, nonfinite: 4, host: 5, gpu: 6 };
const HOST_MEMORY = new Set([
  HOST_WORKING_SET, HOST_RSS, HOST_RSS_ANON, HOST_RSS_FILE, HOST_LIMIT, HOST_AVAILABLE, HOST_SWAP_USED,
]);
const GROUPS = [
  {
    id: "grad_norm", title: "gradient norm", rank: RANK.grad, log: true, height: 340, legend: "below",
    holds: (name) => name === GRAD_GLOBAL_NORM || name.startsWith(GRAD_NORM_PREFIX),
    // A model has tens to hundreds of layers: they are chosen in a list under the chart (which
    // Tab reaches), and only those chosen go to plotly, whose legend lists the few drawn.
    pick: (name) => (name.startsWith(GRAD_NORM_PREFIX) ? name.slice(GRAD_NORM_PREFIX.length) : null), pickTitle: "Layers",
  },
  // The optimizer's own state, read in the train step: not a Keras running mean.
  { id: LR, title: "learning rate", rank: RANK.stepTime, log: true, holds: (name) => name === LR },
  { id: LOSS_SCALE, title: "loss scale", rank: RANK.stepTime, log: true, holds: (name) => name === LOSS_SCALE },
  // Counts that stay 0 in a healthy run: said in words, not four flat lines on -1 to 1.
  {
    id: "nonfinite", title: "NaN/Inf count", rank: RANK.nonfinite, holds: (name) => name.startsWith(NONFINITE_PREFIX),
    quiet: "no NaN/Inf so far",
  },
  { id: "host_memory", title: "host memory", rank: RANK.host, bytes: true, holds: (name) => HOST_MEMORY.has(name) },
  { id: "host_cpu", title: "process CPU % (100: one core)", rank: RANK.host, holds: (name) => name === HOST_CPU_PERCENT },
  { id: "host_cpu_temp", title: "host CPU temperature (°C)", rank: RANK.host, holds: (name) => name === HOST_CPU_TEMP },
  { id: "disk_free", title: "disk free", rank: RANK.host, bytes: true, holds: (name) => name === HOST_DISK_FREE },
];
// Each GPU's charts: id "<device>_<kind>" ("gpu0_memory"), title "<device> <title>".
const GPU_GROUPS = [
  { kind: "memory", title: "memory", bytes: true, fields: [GPU_MEM_USED, GPU_MEM_TOTAL, GPU_TF_CURRENT, GPU_TF_PEAK] },
  { kind: "util", title: "utilisation %", fields: [GPU_UTIL] },
  { kind: "temp", title: "temperature (°C)", fields: [GPU_TEMP] },
  { kind: "power", title: "power (W)", fields: [GPU_POWER] },
  { kind: "clock", title: "SM clock (MHz)", fields: [GPU_CLOCK_SM] },
  { kind: "errors", title: "throttle and errors", fields: [GPU_THROTTLE, GPU_ECC_UNCORRECTED, GPU_XID_ERRORS] },
];

function gpuChart(device, kind) {
  const group = GPU_GROUPS.find((g) => g.kind === kind);
  return { id: `${device}_${kind}`, title: `${device} ${group.title}`, rank: RANK.gpu, bytes: Boolean(group.bytes) };
}

// The chart a series is drawn on, as { id, title, rank, log, bytes, height }; null for series
// not charted. A metric's chart holds its per-step, epoch-mean and validation series.
export function chartOf(name) {
  if (name === EPOCH) return null;
  const group = GROUPS.find((g) => g.holds(name));
  if (group) return group;
  const gpu = gpuParts(name);
  const gpuGroup = gpu && GPU_GROUPS.find((g) => g.fields.includes(gpu.field));
  if (gpuGroup) return gpuChart(gpu.device, gpuGroup.kind);
  let base = name;
  if (base.startsWith(VAL_PREFIX)) base = base.slice(VAL_PREFIX.length);
  else if (base.startsWith(EPOCH_PREFIX)) base = base.slice(EPOCH_PREFIX.length);
  if (base === STEP_TIME) return { id: STEP_TIME, title: "step time (s)", rank: RANK.stepTime, log: true };
  // A regression's loss at chance is the loss's reference: drawn on its chart.
  if (base === LOSS || name === CHANCE_LOSS) return { id: LOSS, title: LOSS, rank: RANK.loss };
  // Keras reports its metrics at each batch as the running mean since the epoch began.
  return { id: base, title: base, rank: RANK.metric, note: "per step: Keras's running mean over the epoch" };
}

// The ids of the charts an alert is marked on: the series it is about. The run page puts an
// alert whose charts are not drawn on the loss chart.
export function alertChartIds(alert) {
  const device = isGpuDevice(alert.subject) ? alert.subject : null;
  switch (alert.rule) {
    case "nonfinite": return ["nonfinite", LOSS];
    case "grad_explosion": case "grad_vanishing": return ["grad_norm"];
    case "loss_divergence": return [LOSS];
    case "oom_forecast": case "memory_pressure": {
      const series = alert.evidence?.forecast?.series;
      if (series) return [chartOf(series)?.id ?? LOSS];
      return [device ? gpuChart(device, "memory").id : "host_memory"];
    }
    case "slowdown": return [STEP_TIME];
    case "thermal": return [device ? gpuChart(device, "temp").id : "host_cpu_temp"];
    case "hardware": return device ? [gpuChart(device, "errors").id] : [];
    default: return [LOSS];
  }
}

// Of two charts' specs, the one shown first: loss, then metrics, step time, gradients,
// NaN/Inf, host, then GPUs.
export function chartOrder(a, b) {
  return a.rank - b.rank || a.title.localeCompare(b.title);
}

// The same colour for the same role on every chart: per step, epoch mean, validation.
const PALETTE = ["#2f6fed", "#9333ea", "#0d9488", "#db2777", "#65a30d", "#0891b2", "#ca8a04", "#4b5563"];

// A series' colour follows from its name, never from the order series arrived in: the loss
// is the same blue on every run's page.
export function colourOf(name) {
  if (name === LOSS) return PALETTE[0];
  let hash = 0;
  for (const c of name) hash = (hash * 31 + c.codePointAt(0)) >>> 0;
  return PALETTE[1 + (hash % (PALETTE.length - 1))];
}

// A series' trace attributes as plotly takes them (visible: "legendonly" for those drawn only
// once chosen).
export function traceStyle(name) {
  if (name.startsWith(VAL_PREFIX)) return { mode: "lines+markers", line: { width: 2, color: "#ea580c" }, marker: { size: 6 } };
  if (name.startsWith(EPOCH_PREFIX)) return { mode: "lines+markers", line: { width: 2, dash: "dot", color: "#6b7280" }, marker: { size: 5 } };
  if (name === CHANCE_LOSS) return { mode: "lines", line: { width: 1.5, dash: "dash", color: "#b45309" } };
  if (name === HOST_LIMIT || gpuParts(name)?.field === GPU_MEM_TOTAL) {
    return { mode: "lines", line: { width: 2, dash: "dash", color: "#d64545" } };
  }
  // Counts taken now and then (the weights are checked every few steps): steps, not ramps.
  if (name.startsWith(NONFINITE_PREFIX)) return { mode: "lines+markers", line: { width: 1.2, shape: "hv", color: colourOf(name) }, marker: { size: 4 } };
  if (name.startsWith(GRAD_NORM_PREFIX)) return { mode: "lines", line: { width: 1, color: colourOf(name) }, visible: "legendonly" };
  if (name === HOST_AVAILABLE) return { mode: "lines", line: { width: 1.2, color: colourOf(name) }, visible: "legendonly" };
  if (name === GRAD_GLOBAL_NORM) { // above the layers, in the page's ink: dark on light, light on dark
    const ink = getComputedStyle(document.documentElement).getPropertyValue("--ink").trim();
    return { mode: "lines", line: { width: 2, color: ink || "#1d2330" } };
  }
  return { mode: "lines", line: { width: 1.2, color: colourOf(name) } };
}

// Smoothing is for noisy per-step series; epoch means, validation points, limits and counts
// are drawn as they are.
export function smoothable(name) {
  return !name.startsWith(VAL_PREFIX) && !name.startsWith(EPOCH_PREFIX) && !name.startsWith(NONFINITE_PREFIX)
    && name !== HOST_LIMIT && gpuParts(name)?.field !== GPU_MEM_TOTAL;
}
