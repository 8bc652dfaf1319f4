// Every series name and prefix the dashboard reads, in one place. trainvitals/series.py holds
// the same names for the agent and the detectors, and a test keeps the two equal: keep one
// plain `export const NAME = "value";` per line. Names are plain strings on the wire, so a
// user's own metrics (every Keras log key as-is) travel beside these unchanged.

// The loss of that very batch, taken inside the train step (not Keras's running mean).
export const LOSS = "loss";
// A regression's loss at chance on the batch of each of a run's first steps.
export const CHANCE_LOSS = "loss_at_chance";
// Seconds per training step.
export const STEP_TIME = "step_time";
// The optimizer's learning rate, when it exposes one.
export const LR = "lr";
// The dynamic loss scale of a LossScaleOptimizer (mixed float16), at that step.
export const LOSS_SCALE = "loss_scale";

export const GRAD_GLOBAL_NORM = "grad/global_norm";
// grad/norm/<variable path>: one variable's gradient norm.
export const GRAD_NORM_PREFIX = "grad/norm/";

// nonfinite/<origin>: counts of NaN/Inf elements.
export const NONFINITE_PREFIX = "nonfinite/";
export const NONFINITE_LOSS = "nonfinite/loss";
export const NONFINITE_GRADS = "nonfinite/grads";
export const NONFINITE_INPUTS = "nonfinite/inputs";
export const NONFINITE_WEIGHTS = "nonfinite/weights";

// Process and host readings (bytes, percent, °C), once a second.
export const HOST_PREFIX = "host/";
export const HOST_RSS = "host/rss";
export const HOST_RSS_ANON = "host/rss_anon";
export const HOST_RSS_FILE = "host/rss_file";
export const HOST_WORKING_SET = "host/working_set";
export const HOST_AVAILABLE = "host/available";
export const HOST_LIMIT = "host/limit";
export const HOST_SWAP_USED = "host/swap_used";
export const HOST_CPU_PERCENT = "host/cpu_percent";
export const HOST_CPU_TEMP = "host/cpu_temp";
export const HOST_DISK_FREE = "host/disk_free";

// gpu<i>/<field>: one device's readings, once a second (see gpuSeries).
export const GPU_PREFIX = "gpu";
export const GPU_MEM_USED = "mem_used";
export const GPU_MEM_TOTAL = "mem_total";
export const GPU_TF_CURRENT = "tf_current";
export const GPU_TF_PEAK = "tf_peak";
export const GPU_UTIL = "util";
export const GPU_TEMP = "temp";
export const GPU_POWER = "power";
export const GPU_CLOCK_SM = "clock_sm";
export const GPU_THROTTLE = "throttle";
export const GPU_ECC_UNCORRECTED = "ecc_uncorrected";
export const GPU_XID_ERRORS = "xid_errors";

// What the Keras callback adds at each epoch's end: the epoch number, the epoch means of the
// training metrics (epoch/<metric>) and the validation metrics as Keras names them (val_<metric>).
export const EPOCH = "epoch";
export const EPOCH_PREFIX = "epoch/";
export const VAL_PREFIX = "val_";

const GPU_DEVICE = new RegExp(`^${GPU_PREFIX}(\\d+)$`);
const GPU_SERIES = new RegExp(`^(${GPU_PREFIX}\\d+)/(.+)$`);

// The series name of one GPU reading: gpuSeries(0, GPU_MEM_USED) === "gpu0/mem_used".
export function gpuSeries(index, field) {
  return `${GPU_PREFIX}${index}/${field}`;
}

// A GPU reading's device and field: gpuParts("gpu1/temp") is { device: "gpu1", field: "temp" };
// null for any other series.
export function gpuParts(name) {
  const match = GPU_SERIES.exec(name);
  return match ? { device: match[1], field: match[2] } : null;
}

// Whether a name is a GPU device's ("gpu0"), as alerts name their subject.
export function isGpuDevice(name) {
  return GPU_DEVICE.test(name ?? "");
}

// Readings in bytes, and the unit of the other system readings, for people to read.
const HOST_BYTES = new Set([
  HOST_RSS, HOST_RSS_ANON, HOST_RSS_FILE, HOST_WORKING_SET, HOST_AVAILABLE, HOST_LIMIT, HOST_SWAP_USED, HOST_DISK_FREE,
]);
const GPU_BYTES = new Set([GPU_MEM_USED, GPU_MEM_TOTAL, GPU_TF_CURRENT, GPU_TF_PEAK]);
const HOST_UNITS = new Map([[HOST_CPU_PERCENT, "%"], [HOST_CPU_TEMP, "°C"]]);
const GPU_UNITS = new Map([[GPU_UTIL, "%"], [GPU_TEMP, "°C"], [GPU_POWER, "W"], [GPU_CLOCK_SM, "MHz"]]);

export function isBytes(name) {
  return HOST_BYTES.has(name) || GPU_BYTES.has(gpuParts(name)?.field);
}

// "%", "°C", "W", "MHz", or "" for a count or a series of no known unit.
export function unitOf(name) {
  return HOST_UNITS.get(name) ?? GPU_UNITS.get(gpuParts(name)?.field) ?? "";
}
