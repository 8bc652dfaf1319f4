// What people do to a chart, turned into changes of its state: the log switch and downloads
// on its card, the series chosen in its list or its legend (by mouse, or by keyboard: plotly's
// legend answers the mouse only), a zoom dragged on its plot (which the page spreads to its
// other charts), and the page's chart filter hiding its card.

import { colourOf, traceStyle } from "./chart-kinds.js";
import { escapeHTML } from "./format.js";
import { byteTicks, logTicks } from "./plotmath.js";

// A card hidden by the chart filter, or shown again. A class, not the hidden attribute: a card
// may hide itself for reasons of its own (the heatmap, until it has two layers).
export function filterOut(card, out) { card.classList.toggle("filtered-out", out); }

// Wires a chart's card, and its plot once plotly has made it, to what people do there.
export function listen(chart) {
  const { card, plot } = chart;
  card.querySelector('[data-tool="log"]').addEventListener("click", () => {
    chart.log = !chart.log;
    chart.onLog?.(chart);
    chart.schedule();
  });
  for (const format of ["csv", "jsonl"]) {
    card.querySelector(`[data-tool="${format}"]`)?.addEventListener("click", () => chart.onDownload(format, chart));
  }
  card.querySelector(".picks")?.addEventListener("change", (event) => {
    const name = event.target.dataset?.series;
    if (name == null) return;
    chart.visible.set(name, event.target.checked ? true : "legendonly");
    chart.schedule();
  });
  plot.on("plotly_relayout", (event) => zoomed(chart, event));
  // Once plotly has drawn (its legend too, which can come after react returns).
  if (chart.spec.legend !== false) {
    const legend = {
      has: (name) => chart.has(name),
      shown: (name) => chart.isShown(name),
      toggle: (name) => { chart.visible.set(name, chart.isShown(name) ? "legendonly" : true); chart.schedule(); },
    };
    plot.on("plotly_afterplot", () => legendByKeys(plot, legend));
  }
  plot.on("plotly_restyle", ([update, indices]) => {
    if (!update || !("visible" in update)) return;
    indices.forEach((index, i) => {
      const name = chart.figure.traceNames[index];
      const value = Array.isArray(update.visible) ? update.visible[i] : update.visible;
      if (name != null) chart.visible.set(name, value);
    });
    chart.schedule(); // a series shown from the legend gets its points
  });
}

// The range a plotly relayout event gives an axis ("xaxis", "yaxis"), or null when none.
function rangeIn(event, axis) {
  if (event[`${axis}.range[0]`] != null) return [event[`${axis}.range[0]`], event[`${axis}.range[1]`]];
  return Array.isArray(event[`${axis}.range`]) ? [...event[`${axis}.range`]] : null;
}

function zoomed(chart, event) {
  const zoomedTo = rangeIn(event, "xaxis");
  // The y-axis dragged alone: plotly keeps the range it was dragged to, and a log axis' tick
  // spacing must follow it (a step of 0.2 over ten decades would be thousands of ticks).
  const computed = chart.plot.layout.yaxis.tickmode === "array"; // ticks of ours (log, bytes)
  if (computed && !zoomedTo && !event["xaxis.autorange"]) {
    const yrange = rangeIn(event, "yaxis");
    const ticks = yrange && (chart.plot.layout.yaxis.type === "log" ? logTicks(yrange) : byteTicks(yrange));
    if (ticks) Plotly.relayout(chart.plot, { "yaxis.tickvals": ticks.tickvals, "yaxis.ticktext": ticks.ticktext });
    else if (event["yaxis.autorange"]) chart.schedule(); // back to the data's range and ticks
  }
  let xrange;
  if (event["xaxis.autorange"] || event["autosize"]) xrange = null;
  else if (zoomedTo) xrange = zoomedTo;
  else return; // not a zoom (our own shapes, a resize)
  if (xrange === null && event["autosize"] && chart.xrange) return;
  chart.xrange = xrange;
  if (!xrange) chart.data.detail = null;
  chart.updateCount();
  chart.schedule(); // the y-range follows the zoom
  chart.onZoom?.(xrange, chart);
}

// plotly's legend entries answer the mouse only (its toolbar's are buttons): each entry of a
// series the chart draws is made a checkbox that Tab reaches, named, that Enter and Space
// tick. Called after each plot (plotly keeps the entries' nodes; new ones get the same).
// legend: { has(name), shown(name), toggle(name) }.
function legendByKeys(plot, legend) {
  for (const entry of plot.querySelectorAll(".legend .traces")) {
    const name = entry.querySelector(".legendtext")?.textContent;
    if (name == null || !legend.has(name)) continue;
    entry.dataset.series = name;
    entry.setAttribute("tabindex", "0");
    entry.setAttribute("role", "checkbox");
    entry.setAttribute("aria-checked", String(legend.shown(name)));
    entry.setAttribute("aria-label", `draw ${name}`);
  }
  if (plot.dataset.keyboard) return;
  plot.dataset.keyboard = "true";
  plot.addEventListener("keydown", (event) => {
    const entry = event.target.closest?.(".legend .traces[data-series]");
    if (!entry || (event.key !== "Enter" && event.key !== " ")) return;
    event.preventDefault();
    legend.toggle(entry.dataset.series);
  });
}

// The list of the series to choose from (a chart whose spec has pick), each with its colour,
// those drawn ticked; redrawn only when that changed (chart.picked).
export function drawPicks(chart) {
  const picks = chart.card.querySelector(".picks");
  if (!picks) return;
  const label = (name) => chart.pickLabel?.(name) ?? chart.spec.pick(name);
  const colour = (key) => (chart.styleOf?.(key) ?? traceStyle(key)).line?.color ?? colourOf(key);
  const names = [...chart.series.keys()].filter((name) => chart.picks(name))
    .sort((a, b) => label(a).localeCompare(label(b), undefined, { numeric: true }));
  const shown = names.filter((name) => chart.visible.get(name) === true);
  const key = JSON.stringify([names, shown]);
  if (key === chart.picked) return;
  chart.picked = key;
  chart.card.querySelector(".series-picker summary").textContent = `${chart.spec.pickTitle}: ${shown.length} of ${names.length} drawn`;
  const drawn = new Set(shown);
  picks.innerHTML = names.map((name) => `<label><input type="checkbox" data-series="${escapeHTML(name)}"${drawn.has(name) ? " checked" : ""}>
    <span class="swatch" style="background:${colour(name)}"></span>${escapeHTML(label(name))}</label>`).join("");
}
