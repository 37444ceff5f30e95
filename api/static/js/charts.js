// Charts drawn as plain SVG and HTML: a line chart for per-step series and
// horizontal bars for comparisons. No library, nothing fetched from outside.

import { esc, isNum } from "./format.js";

const SVG_NS = "http://www.w3.org/2000/svg";

function el(name, attrs, text) {
  const node = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

/** About `count` round tick values covering [lo, hi] (Heckbert's "nice numbers"). */
export function niceTicks(lo, hi, count = 5) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / Math.max(1, count);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const norm = raw / mag;
  const step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
  const ticks = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
    ticks.push(Number(v.toPrecision(12)));
  }
  return ticks;
}

/**
 * Draw series of [x, y] points into `svg`, replacing what was there.
 * options: series [{name, color, points}], refs [{y, label, color}], marks [{x, label}]
 * (vertical markers: a recovery, a re-plan),
 * yFormat (tick text), yZero (start the axis at zero), xLabel (names x in tooltips;
 * the card around the chart says what the axes are), emptyText.
 * The svg gets data-points = number of points of the first series.
 */
export function lineChart(svg, options) {
  const { series = [], refs = [], marks = [], yFormat = (v) => String(v), yZero = false } = options;
  const width = Math.max(200, svg.clientWidth || 520);
  const height = Math.max(120, svg.clientHeight || 230);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.replaceChildren();
  const total = series.length ? series[0].points.length : 0;
  svg.dataset.points = String(total);

  const all = series.flatMap((s) => s.points).filter((p) => isNum(p[0]) && isNum(p[1]));
  if (!all.length) {
    svg.append(el("text", { x: width / 2, y: height / 2, "text-anchor": "middle", class: "empty-text" },
      options.emptyText || "No steps yet"));
    return;
  }
  const refYs = refs.map((r) => r.y).filter(isNum);
  let yLo = Math.min(...all.map((p) => p[1]), ...refYs);
  let yHi = Math.max(...all.map((p) => p[1]), ...refYs);
  if (yZero) yLo = Math.min(0, yLo);
  if (yHi === yLo) { yHi += Math.abs(yHi) * 0.1 || 1; yLo -= yZero ? 0 : Math.abs(yLo) * 0.1 || 1; }
  const pad = (yHi - yLo) * 0.06;
  yHi += pad;
  if (!yZero) yLo -= pad;
  let xLo = Math.min(...all.map((p) => p[0]));
  let xHi = Math.max(...all.map((p) => p[0]));
  if (xHi === xLo) { xLo -= 1; xHi += 1; }

  const yTicks = niceTicks(yLo, yHi, 4).filter((v) => v >= yLo && v <= yHi);
  const left = 12 + 7 * Math.max(...yTicks.map((v) => yFormat(v).length));
  const m = { left, right: 14, top: 10, bottom: 26 };
  const sx = (x) => m.left + ((x - xLo) / (xHi - xLo)) * (width - m.left - m.right);
  const sy = (y) => height - m.bottom - ((y - yLo) / (yHi - yLo)) * (height - m.top - m.bottom);

  for (const v of yTicks) {
    svg.append(el("line", { x1: m.left, x2: width - m.right, y1: sy(v), y2: sy(v), class: "grid-line" }));
    svg.append(el("text", { x: m.left - 6, y: sy(v) + 4, "text-anchor": "end", class: "axis-text" }, yFormat(v)));
  }
  const xTicks = niceTicks(xLo, xHi, 6).filter((v) => Number.isInteger(v) && v >= xLo && v <= xHi);
  for (const v of xTicks) {
    svg.append(el("text", { x: sx(v), y: height - 8, "text-anchor": "middle", class: "axis-text" }, String(v)));
  }

  for (const r of refs) {
    if (!isNum(r.y)) continue;
    svg.append(el("line", { x1: m.left, x2: width - m.right, y1: sy(r.y), y2: sy(r.y),
      class: "ref-line", stroke: r.color }));
    svg.append(el("text", { x: width - m.right - 2, y: sy(r.y) - 4, "text-anchor": "end",
      class: "ref-text", fill: r.color }, r.label));
  }

  for (const k of marks) {
    if (!isNum(k.x) || k.x < xLo || k.x > xHi) continue;
    const line = el("line", { x1: sx(k.x), x2: sx(k.x), y1: m.top, y2: height - m.bottom, class: "mark-line" });
    line.append(el("title", {}, k.title || k.label));
    svg.append(line);
    svg.append(el("text", { x: sx(k.x) + 3, y: m.top + 10, class: "mark-text" }, k.label));
  }

  for (const s of series) {
    const pts = s.points.filter((p) => isNum(p[0]) && isNum(p[1]));
    if (!pts.length) continue;
    const d = pts.map((p, i) => `${i ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join("");
    svg.append(el("path", { d, class: "series", stroke: s.color }));
    const radius = pts.length <= 60 ? 3 : pts.length <= 200 ? 2 : 0;
    if (radius) {
      for (const p of pts) {
        const dot = el("circle", { cx: sx(p[0]), cy: sy(p[1]), r: radius, class: "point", fill: s.color });
        dot.append(el("title", {}, `${options.xLabel || "x"} ${p[0]}: ${yFormat(p[1])}`));
        svg.append(dot);
      }
    }
  }
}

/**
 * Horizontal bars, one row each: {label, sub, segments: [{value, cls}], marker, value, valueSub}.
 * Every row shares the scale `max` (default: the largest row total or marker).
 */
export function hbars(container, rows, { max } = {}) {
  const totals = rows.map((r) => r.segments.reduce((a, s) => a + (isNum(s.value) ? s.value : 0), 0));
  const scale = max ?? Math.max(...totals, ...rows.map((r) => (isNum(r.marker) ? r.marker : 0)), 1e-12);
  container.innerHTML = rows.map((r) => {
    const segs = r.segments.filter((s) => isNum(s.value) && s.value > 0).map((s) =>
      `<div class="hbar-seg ${esc(s.cls)}" style="width:${(100 * s.value / scale).toFixed(2)}%"
        title="${esc(s.title || "")}"></div>`).join("");
    const marker = isNum(r.marker)
      ? `<div class="hbar-marker" style="left:${Math.min(99.6, 100 * r.marker / scale).toFixed(2)}%"
          title="${esc(r.markerTitle || "")}"></div>` : "";
    return `<div class="hbar">
      <div class="hbar-label" title="${esc(r.label)}">${esc(r.label)}${r.sub ? ` <span class="sub">${esc(r.sub)}</span>` : ""}</div>
      <div class="hbar-track">${segs}${marker}</div>
      <div class="hbar-value">${esc(r.value ?? "")}${r.valueSub ? ` <span class="sub">${esc(r.valueSub)}</span>` : ""}</div>
    </div>`;
  }).join("");
}
