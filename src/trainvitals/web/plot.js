// plotly.js on the dashboard's pages: loaded once, the first time a page draws a plot; the
// layout and configuration every plot shares, in the page's colours; and redraws spread over
// animation frames so that they never add up to a long task. Charts, the gradient heatmap and
// the runs' plot all draw through it.

// A live redraw waits at least this many times what the last redraw took: a chart slow to
// draw (many series, a slow machine) redraws less often, so live drawing never takes the page over.
const LIVE_REDRAW_COST = 10;

export const PLOT_LAYOUT = {
  margin: { l: 56, r: 16, t: 8, b: 36 },
  height: 260,
  showlegend: true,
  legend: { orientation: "h", y: 1.12, x: 0 },
  xaxis: { title: { text: "step", standoff: 6 }, zeroline: false, automargin: true },
  yaxis: { zeroline: false, automargin: true },
  paper_bgcolor: "rgba(0,0,0,0)",
  plot_bgcolor: "rgba(0,0,0,0)",
  font: { family: "system-ui, sans-serif", size: 12 },
  hovermode: "x unified",
  // Upright at the plot's right: along the top it covered the legend (and, wrapped, the
  // chart's own buttons).
  modebar: { orientation: "v" },
};

// The data of a self-hosted tool never leaves it: no "Share chart" button (recent plotly.js
// shows one by default) nor "Edit in Chart Studio" (older ones), and no server to send to.
export const PLOT_CONFIG = {
  responsive: true, displaylogo: false, showSendToCloud: false, showEditInChartStudio: false, plotlyServerURL: "",
};

// plotly.js, loaded the first time a page draws charts: the runs list opens without parsing
// its 3.5 MB.
let plotly = null;
export function plotlyReady() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  plotly ??= new Promise((resolve, reject) => {
    const script = document.createElement("script");
    script.src = "/static/vendor/plotly.min.js";
    script.onload = () => resolve(window.Plotly);
    script.onerror = () => { plotly = null; reject(new Error("could not load /static/vendor/plotly.min.js")); };
    document.head.appendChild(script);
  });
  return plotly;
}

// The layout in the page's colours (light or dark, as the system prefers).
export function themed(layout) {
  const style = getComputedStyle(document.documentElement);
  const ink = style.getPropertyValue("--ink").trim(), line = style.getPropertyValue("--line").trim();
  if (ink) layout.font = { ...layout.font, color: ink };
  if (line) for (const axis of [layout.xaxis, layout.yaxis]) Object.assign(axis, { gridcolor: line, linecolor: line });
  return layout;
}

// Plots (anything with a draw()) waiting to redraw, drawn in animation frames: as many in one
// frame as fit in FRAME_BUDGET_MS (at least one), the rest in the next, so redraws never add up to a long task.
const pending = new Set();
const FRAME_BUDGET_MS = 12;

export function drawSoon(chart) {
  if (!pending.size) requestAnimationFrame(drawPending);
  pending.add(chart);
}

export function cancelDraw(chart) { pending.delete(chart); }

// How long a live redraw waits: until `every` ms after the last one, and LIVE_REDRAW_COST
// times what that one took (cost, in ms).
export function liveWait(last, cost, every) {
  return last + Math.max(every, LIVE_REDRAW_COST * cost) - performance.now();
}

function drawPending() {
  const start = performance.now();
  for (const chart of pending) {
    pending.delete(chart);
    chart.draw();
    if (performance.now() - start > FRAME_BUDGET_MS) break;
  }
  if (pending.size) requestAnimationFrame(drawPending);
}
